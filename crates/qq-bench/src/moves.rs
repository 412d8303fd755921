//! Scenario 10, move rate: moving a backlog from a queue to a queue led by another node, as a
//! dead-letter redrive does. quorumq with a move task (`StartMoveTask`, then `GetMoveTask`
//! until `DONE`), RabbitMQ with a dynamic shovel (`rabbitmq_shovel`, enabled by
//! `bench/rabbitmq.sh`).
//!
//! Both sides start from the same state: a source quorum queue led by node 1 holding
//! `move_messages` persistent messages of `body_bytes` (published with confirms, no consumer),
//! and an empty destination quorum queue led by another node. The clock starts just before the
//! move is asked for (the `StartMoveTask` call; the `rabbitmqctl set_parameter` command) and
//! stops when the move is seen complete: the task reports `DONE` (quorumq), the destination
//! holds every message (RabbitMQ, polled with a passive `queue.declare` on its leader, as the
//! other scenarios count messages). Both are polled every [`POLL`]. Rate = messages / elapsed.
//!
//! The shovel keeps RabbitMQ's safe settings: `ack-mode` `on-confirm` (a message leaves the
//! source only once the destination confirmed it, as a quorumq move commits it in the
//! destination before it leaves the source), `src-delete-after` `queue-length` (the shovel
//! moves the messages there at its start, then deletes itself, as the move task ends), default
//! prefetch (1 000).
//!
//! Afterwards both sides are checked, and the scenario fails rather than report a rate
//! otherwise: the destination holds exactly `move_messages` (none lost, none duplicated) and
//! the source holds none.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::System;
use crate::cluster::Cluster;
use crate::driver::{Conn, QueueSpec, rabbit_port};
use crate::load::{Counters, Progress, PubPlan, publish_loop};
use crate::scenarios::{Better, Outcome, Settings, declare_on, delete_queues};

const SOURCE: &str = "bench-move-src";
const DESTINATION: &str = "bench-move-dst";
/// How often the move's progress is read, on both sides.
const POLL: Duration = Duration::from_millis(100);
/// A move not finished by then fails the scenario.
const MOVE_DEADLINE: Duration = Duration::from_secs(900);
/// After the move reports done, how long the counts may take to settle on the leaders
/// (a destination's count is read from its leader, which applies what it committed).
const SETTLE_DEADLINE: Duration = Duration::from_secs(30);
/// Declarations tried to get a queue led by the wanted node (quorumq rotates initial leaders
/// over the nodes by queue id, so three in a row always cover every node).
const PLACEMENT_TRIES: usize = 6;

/// Declares `queue` through node `on` until its leader satisfies `wanted`; returns the leader.
pub(crate) async fn place(
    cl: &Cluster,
    on: usize,
    queue: &str,
    wanted: impl Fn(usize) -> bool,
) -> Result<usize> {
    for _ in 0..PLACEMENT_TRIES {
        declare_on(cl, on, queue, &QueueSpec::default()).await?;
        // Ask the cluster who leads rather than trusting the placement rule.
        let leader = cl.leader(queue).await?;
        if wanted(leader) {
            return Ok(leader);
        }
    }
    bail!("could not place {queue} on the wanted node in {PLACEMENT_TRIES} declarations")
}

/// The count of `queue` on the node that leads it (quorumq: ready + unacked; RabbitMQ: ready).
async fn count(conn: &Conn, queue: &str) -> Result<u64> {
    conn.message_count(queue)
        .await
        .with_context(|| format!("count {queue}"))
}

/// Polls until `queue` holds `want`; fails at once if it holds more (duplicates).
async fn await_count(conn: &Conn, queue: &str, want: u64, deadline: Duration) -> Result<()> {
    let until = Instant::now() + deadline;
    loop {
        let n = count(conn, queue).await?;
        ensure!(
            n <= want,
            "{queue} holds {n}, more than the {want} expected"
        );
        if n == want {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("{queue} holds {n} after {deadline:?}, expected {want}");
        }
        tokio::time::sleep(POLL).await;
    }
}

pub async fn move_rate(cl: &mut Cluster, s: &Settings) -> Result<Outcome> {
    let system = cl.system();
    let n = s.move_messages;
    ensure!(n > 0, "--move-messages must be at least 1");
    let src_leader = place(cl, 0, SOURCE, |l| l == 0).await?;
    let dst_leader = match place(cl, 1, DESTINATION, |l| l != src_leader).await {
        Ok(l) => l,
        Err(e) => {
            delete_queues(cl, &[SOURCE.to_string()]).await;
            return Err(e);
        }
    };
    let result = measure(cl, s, src_leader, dst_leader).await;
    if system == System::Rabbitmq {
        // The shovel deletes itself when done (src-delete-after); one left by a failed run
        // must not go on moving into the next run's queues.
        let params = cl.rabbitmqctl(0, &["list_parameters", "-q", "--no-table-headers"]);
        if params.is_ok_and(|p| {
            p.lines()
                .any(|l| l.split_whitespace().nth(1) == Some(SOURCE))
        }) && let Err(e) = cl.rabbitmqctl(0, &["clear_parameter", "shovel", SOURCE])
        {
            eprintln!("  clear the shovel {SOURCE}: {e:#}");
        }
    }
    delete_queues(cl, &[SOURCE.to_string(), DESTINATION.to_string()]).await;
    let mut out = result?;
    out.notes.push(format!(
        "{n} × {} B from {SOURCE} (led by node {}) to {DESTINATION} (led by node {})",
        s.body_bytes,
        src_leader + 1,
        dst_leader + 1
    ));
    Ok(out)
}

/// RabbitMQ's own totals (ready + unacknowledged) of the source and the destination.
fn rabbit_totals(cl: &Cluster) -> Result<(u64, u64)> {
    let listing = cl.rabbitmqctl(
        0,
        &[
            "list_queues",
            "-q",
            "--no-table-headers",
            "name",
            "messages",
        ],
    )?;
    let total = |queue: &str| -> Result<u64> {
        listing
            .lines()
            .filter_map(|l| l.split_once(char::is_whitespace))
            .find(|(name, _)| *name == queue)
            .with_context(|| format!("{queue} not in rabbitmqctl list_queues"))?
            .1
            .trim()
            .parse()
            .with_context(|| format!("the message total of {queue}"))
    };
    Ok((total(SOURCE)?, total(DESTINATION)?))
}

async fn measure(
    cl: &Cluster,
    s: &Settings,
    src_leader: usize,
    dst_leader: usize,
) -> Result<Outcome> {
    let system = cl.system();
    let n = s.move_messages;
    let src = Conn::connect(system, src_leader).await?;
    let dst = Conn::connect(system, dst_leader).await?;
    let mut out = Outcome::default();

    // The backlog.
    let counters = Arc::new(Counters::default());
    let progress = Progress::start(format!("10 backlog of {n} {system}"), counters.clone());
    let t = Instant::now();
    let published = publish_loop(
        src.publisher(SOURCE, s.window).await?,
        PubPlan {
            window: s.window,
            rate: None,
            count: Some(n),
            stop: Arc::new(AtomicBool::new(false)),
            body_bytes: s.body_bytes,
            first_id: 0,
            record_from_ns: u64::MAX,
        },
        counters,
    )
    .await?;
    progress.finish().await;
    ensure!(
        published.confirmed == n,
        "backlog: {} of {n} publishes confirmed ({} rejected)",
        published.confirmed,
        published.rejected
    );
    let publish_s = t.elapsed().as_secs_f64();
    let before = (count(&src, SOURCE).await?, count(&dst, DESTINATION).await?);
    ensure!(
        before == (n, 0),
        "before the move: source holds {}, destination {}; expected {n} and 0",
        before.0,
        before.1
    );

    // The move.
    let (elapsed, how) = match (&src, system) {
        (Conn::Qq(client), System::Quorumq) => {
            let start = Instant::now();
            let task_id = client
                .start_move_task(SOURCE, DESTINATION, 0, 0)
                .await
                .context("StartMoveTask")?;
            let task = loop {
                let t = client
                    .get_move_task(&task_id)
                    .await
                    .context("GetMoveTask")?;
                if t.state != "RUNNING" {
                    break t;
                }
                if start.elapsed() > MOVE_DEADLINE {
                    bail!(
                        "move task {task_id} still RUNNING after {MOVE_DEADLINE:?}: moved {}, \
                         remaining {}",
                        t.moved,
                        t.remaining
                    );
                }
                tokio::time::sleep(POLL).await;
            };
            let elapsed = start.elapsed();
            ensure!(
                task.state == "DONE",
                "move task {task_id} ended {}: {} (moved {}, remaining {})",
                task.state,
                task.detail,
                task.moved,
                task.remaining
            );
            ensure!(
                task.moved == n && task.remaining == 0,
                "move task {task_id} DONE with moved {} and remaining {}, expected {n} and 0",
                task.moved,
                task.remaining
            );
            (
                elapsed,
                format!("move task {task_id}, no rate limit, DONE with moved = {n}"),
            )
        }
        (Conn::Amqp(_), System::Rabbitmq) => {
            let uri = |node: usize| format!("amqp://guest:guest@127.0.0.1:{}", rabbit_port(node));
            let definition = serde_json::json!({
                "src-protocol": "amqp091",
                "src-uri": uri(src_leader),
                "src-queue": SOURCE,
                "src-delete-after": "queue-length",
                "dest-protocol": "amqp091",
                "dest-uri": uri(dst_leader),
                "dest-queue": DESTINATION,
                "ack-mode": "on-confirm",
            })
            .to_string();
            let start = Instant::now();
            cl.rabbitmqctl(0, &["set_parameter", "shovel", SOURCE, &definition])
                .context("rabbitmqctl set_parameter shovel")?;
            let cli = start.elapsed();
            let until = start + MOVE_DEADLINE;
            loop {
                let d = count(&dst, DESTINATION).await?;
                ensure!(d <= n, "{DESTINATION} holds {d}, more than the {n} moved");
                if d == n {
                    break;
                }
                if Instant::now() > until {
                    bail!("the shovel moved {d} of {n} in {MOVE_DEADLINE:?}");
                }
                tokio::time::sleep(POLL).await;
            }
            let elapsed = start.elapsed();
            (
                elapsed,
                format!(
                    "dynamic shovel (amqp091, ack-mode on-confirm, src-delete-after \
                     queue-length, prefetch 1000) set on node 1; the clock includes the \
                     rabbitmqctl command, which took {:.2} s (rate from its return: {:.0} msg/s)",
                    cli.as_secs_f64(),
                    n as f64 / (elapsed - cli).as_secs_f64().max(1e-9)
                ),
            )
        }
        _ => bail!("a {system} connection of the wrong kind"),
    };

    // Nothing lost, nothing duplicated, nothing left behind.
    await_count(&dst, DESTINATION, n, SETTLE_DEADLINE).await?;
    await_count(&src, SOURCE, 0, SETTLE_DEADLINE).await?;
    if system == System::Rabbitmq {
        // A passive declare counts ready messages only: wait until the shovel has acked
        // (and so removed) every message it took, by RabbitMQ's own total of each queue.
        let until = Instant::now() + SETTLE_DEADLINE;
        loop {
            let totals = rabbit_totals(cl)?;
            if totals == (0, n) {
                break;
            }
            ensure!(
                totals.1 <= n,
                "{DESTINATION} holds {} messages, more than the {n} moved",
                totals.1
            );
            if Instant::now() > until {
                bail!(
                    "after the shovel: {SOURCE} holds {} messages (ready + unacked), \
                     {DESTINATION} {}; expected 0 and {n}",
                    totals.0,
                    totals.1
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }
    // Still exact after settling (a late duplicate would show here).
    let after = (count(&src, SOURCE).await?, count(&dst, DESTINATION).await?);
    ensure!(
        after == (0, n),
        "after the move: source holds {}, destination {}; expected 0 and {n}",
        after.0,
        after.1
    );

    let secs = elapsed.as_secs_f64();
    out.figure(10, "move rate", "msg/s", Better::Higher, n as f64 / secs);
    out.figure(10, "move time", "s", Better::Lower, secs);
    out.notes.push(format!(
        "{how}; backlog published in {publish_s:.1} s; afterwards the source held 0 and the \
         destination {n}"
    ));
    Ok(out)
}
