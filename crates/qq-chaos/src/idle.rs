//! Idle queues beside the workload (`--idle-queues N`, issue 14: "a few busy, most idle").
//!
//! They are declared before the faults start and nobody touches them while the faults run, so
//! their Raft groups sleep (qq-node's `groups::residency`) and must still follow every leader
//! change the faults cause. After healing, each must take a publish (confirmed) and give the
//! same message back through a Get: a sleeping group that missed a leader change, or cannot
//! wake, fails this check.

use std::collections::HashMap;
use std::time::Duration;

use qq_client::{Client, delivery_body, message};
use tokio::time::{Instant, sleep, timeout};

use crate::checker::Check;

/// Declares, publishes or gets in flight at once.
const CONCURRENCY: usize = 16;
/// How long one idle queue may take to answer after healing (elections included).
const PER_QUEUE_DEADLINE: Duration = Duration::from_secs(60);

pub fn name(i: usize) -> String {
    format!("chaos.idle.{i:05}")
}

/// Declares `n` idle queues (through the nodes in turn), retrying through elections.
pub async fn declare(clients: &[Client], n: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let failures = each_queue(clients, n, |c, q| async move {
        until_ok(|| c.declare_queue(&q, HashMap::new())).await
    })
    .await;
    if let Some(first) = failures.first() {
        anyhow::bail!("declare {first}");
    }
    println!(
        "declared {n} idle queues in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// After healing: every idle queue takes a publish and gives it back.
pub async fn check(clients: &[Client], n: usize) -> Check {
    let started = Instant::now();
    let failures = each_queue(clients, n, |c, q| async move { round_trip(&c, &q).await }).await;
    let detail = if failures.is_empty() {
        format!(
            "{n} of {n} took a publish and gave it back ({:.1} s)",
            started.elapsed().as_secs_f64()
        )
    } else {
        format!(
            "{} of {n} failed, e.g. {}",
            failures.len(),
            failures[..failures.len().min(3)].join("; ")
        )
    };
    Check::new(
        "every idle queue serves after healing",
        failures.is_empty(),
        detail,
    )
}

/// Runs `op` on each of the `n` idle queues (through the nodes in turn), [`CONCURRENCY`] at a
/// time; returns the failures, each naming its queue.
async fn each_queue<F, Fut, T>(clients: &[Client], n: usize, op: F) -> Vec<String>
where
    F: Fn(Client, String) -> Fut,
    Fut: Future<Output = anyhow::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let mut failures = Vec::new();
    let mut next = 0;
    let mut running = tokio::task::JoinSet::new();
    while next < n || !running.is_empty() {
        while next < n && running.len() < CONCURRENCY {
            let q = name(next);
            let run = op(clients[next % clients.len()].clone(), q.clone());
            running.spawn(async move { run.await.map(|_| ()).map_err(|e| format!("{q}: {e}")) });
            next += 1;
        }
        if let Some(done) = running.join_next().await {
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failures.push(e),
                Err(e) => failures.push(format!("task: {e}")),
            }
        }
    }
    failures
}

/// Publish one message to `q` (confirmed), then Get it back (acknowledged) and compare.
async fn round_trip(c: &Client, q: &str) -> anyhow::Result<()> {
    let text = format!("idle:{q}");
    until_ok(|| c.publish("", q, message(text.clone()))).await?;
    let got = until_ok(|| c.get(q, true, 0)).await?;
    let d = got
        .delivery
        .ok_or_else(|| anyhow::anyhow!("empty after a confirmed publish"))?;
    let body = delivery_body(&d);
    anyhow::ensure!(
        body == text.as_bytes(),
        "got {:?}, published {text:?}",
        String::from_utf8_lossy(&body)
    );
    Ok(())
}

/// Retry `f` (each try at most 5 s) until it succeeds or [`PER_QUEUE_DEADLINE`] passes.
async fn until_ok<T, F, Fut>(mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = qq_client::Result<T>>,
{
    let deadline = Instant::now() + PER_QUEUE_DEADLINE;
    loop {
        match timeout(Duration::from_secs(5), f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if Instant::now() >= deadline => anyhow::bail!("{e}"),
            Err(_) if Instant::now() >= deadline => anyhow::bail!("timed out"),
            _ => sleep(Duration::from_millis(300)).await,
        }
    }
}
