//! `move`, `move-status`, `list-moves`, `cancel-move`: move tasks (redrive). `move` starts a
//! task and, unless `--detach`, follows it: a progress bar on stderr when that is a terminal
//! (indicatif), and the task's final line on stdout when it ends.

use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use qq_client::Client;
use qq_proto::v1::MoveTask;

// No doc comment on the `Args` structs: clap would take it for the verb's help text.

#[derive(Debug, Args)]
pub struct MoveArgs {
    /// The queue to move messages out of (e.g. a dead-letter queue).
    source: String,
    /// The queue to move them to; without it each goes back to its x-first-death-queue.
    #[arg(long)]
    to: Option<String>,
    /// Move at most this many messages (default: every message ready now).
    #[arg(long, default_value_t = 0)]
    max: u64,
    /// At most this many messages per second (default: no limit).
    #[arg(long, default_value_t = 0)]
    rate: u32,
    /// Print the task id and return without following the task.
    #[arg(long)]
    detach: bool,
}

#[derive(Debug, Args)]
pub struct TaskArgs {
    task_id: String,
}

/// How often `move` asks for progress.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

pub async fn start(client: &Client, a: MoveArgs) -> anyhow::Result<()> {
    let to = a.to.unwrap_or_default();
    let task_id = client
        .start_move_task(&a.source, &to, a.max, a.rate)
        .await?;
    println!("move task {task_id} started");
    if a.detach {
        return Ok(());
    }
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template(
            "{spinner} {prefix} [{bar:40}] {pos}/{len} moved ({per_sec}, eta {eta})",
        )?
        .progress_chars("=> "),
    );
    bar.set_prefix(format!("{} -> {}", a.source, dest(&to)));
    loop {
        let t = client.get_move_task(&task_id).await?;
        // The bar's length is moved + remaining as the task reports them now.
        bar.set_length(t.moved + t.remaining);
        bar.set_position(t.moved);
        if t.state != "RUNNING" {
            bar.finish_and_clear();
            println!("{}", line(&t));
            if t.state == "DONE" || t.state == "CANCELLED" {
                return Ok(());
            }
            anyhow::bail!("move task {task_id} {}: {}", t.state, t.detail);
        }
        if bar.is_hidden() {
            println!("{}", line(&t));
        }
        tokio::time::sleep(PROGRESS_EVERY).await;
    }
}

pub async fn status(client: &Client, a: TaskArgs) -> anyhow::Result<()> {
    println!("{}", line(&client.get_move_task(&a.task_id).await?));
    Ok(())
}

pub async fn list(client: &Client) -> anyhow::Result<()> {
    for t in client.list_move_tasks().await? {
        println!("{}", line(&t));
    }
    Ok(())
}

pub async fn cancel(client: &Client, a: TaskArgs) -> anyhow::Result<()> {
    client.cancel_move_task(&a.task_id).await?;
    println!("move task {} cancelled", a.task_id);
    Ok(())
}

fn dest(destination: &str) -> &str {
    if destination.is_empty() {
        "(x-first-death-queue)"
    } else {
        destination
    }
}

fn line(t: &MoveTask) -> String {
    let mut s = format!(
        "{} {} -> {}: {} moved={} remaining={}",
        t.task_id,
        t.source,
        dest(&t.destination),
        t.state,
        t.moved,
        t.remaining
    );
    if !t.detail.is_empty() {
        s.push_str(&format!(" ({})", t.detail));
    }
    s
}
