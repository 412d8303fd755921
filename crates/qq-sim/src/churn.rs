//! Topology under the faults: queues declared, filled, checked and deleted one after another,
//! under a policy that changes with every queue, while the partitions, crashes and pauses
//! strike. It exercises what the steady workload never does: metadata changes (declares,
//! deletes, policies) racing leader changes, new queue groups formed and removed under faults,
//! and the leaders' policy sync.
//!
//! One cycle, on queue `sim.churn.<n>` through node `n mod nodes`:
//! 1. set policy `sim-churn` (pattern `^sim\.churn\.`) to `max-length = 100 000 + n`;
//! 2. declare the queue;
//! 3. publish [`MESSAGES`] messages, each with a publisher id and sequence (a retry after a
//!    lost answer is stored once), mandatory, each until CONFIRMED (UNROUTABLE fails the
//!    cycle: the node that routed it went by a view older than the declare);
//! 4. read the queue until it holds exactly [`MESSAGES`] messages and its effective
//!    `max_length` is the policy's (more is a message stored twice; fewer for good, a lost
//!    confirmed message; another limit, a policy that did not reach the queue's leader);
//! 5. delete it, and read it back as NOT_FOUND.
//!
//! Three cycles in four route through exchanges declared for the cycle (direct, topic, and a
//! fanout bound to the topic one) and take them down again around the queue's delete
//! ([`crate::routes`]).
//!
//! Every step is retried through the next node while the cluster cannot serve it (any error but
//! a refusal that names the request), each try bounded, until the step's limit. A cycle that
//! cannot finish a step fails the seed's "topology changes under faults" check.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use qq_chaos::checker::Check;
use qq_client::{Client, MessageBuilder, PublishOutcome, PublishRequest, Value, ValueExt};
use tokio::time::{Instant, sleep, timeout};
use tonic::Code;

use crate::routes::{self, Route};
use crate::steps::{STEP_LIMIT, TRY_LIMIT, done_if_gone, step, still_there};

/// Messages per queue.
pub const MESSAGES: u64 = 20;

/// Runs cycles until `stop`, then finishes the one under way; returns the check.
pub async fn run(clients: Arc<Vec<Client>>, first_route: u64, stop: Arc<AtomicBool>) -> Check {
    let mut done = Vec::new();
    let mut failures = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let route = Route::of_cycle(first_route + n - 1);
        match cycle(&clients, n, route).await {
            Ok(()) => done.push(format!("{route:?}")),
            Err(e) => failures.push(format!("sim.churn.{n}: {e}")),
        }
        sleep(Duration::from_millis(200)).await;
    }
    Check::all_clear(
        "topology changes under faults (declare, policy, exchanges, bindings, publish, count, delete)",
        failures,
        format!(
            "{} queues declared, filled, checked and deleted (routes: {})",
            done.len(),
            done.join(", ")
        ),
    )
}

async fn cycle(clients: &[Client], n: u64, route: Route) -> Result<(), String> {
    let q = format!("sim.churn.{n}");
    let limit = 100_000 + n;
    let definition = HashMap::from([("max-length".to_string(), Value::long(limit as i64))]);
    step(clients, n, "set policy", |c| {
        let definition = definition.clone();
        async move {
            c.set_policy("sim-churn", "^sim\\.churn\\.", "queues", 0, definition)
                .await
        }
    })
    .await?;
    step(clients, n, "declare", |c| {
        let q = q.clone();
        async move { c.declare_queue(&q, HashMap::new()).await.map(|_| ()) }
    })
    .await?;
    let (exchange, key) = routes::build(clients, n, &q, route).await?;
    fill(clients, n, &q, &exchange, &key).await?;
    count(clients, n, &q, limit).await?;
    routes::before_queue_delete(clients, n, &q, route).await?;
    remove(clients, n, &q).await?;
    routes::after_queue_delete(clients, n, &q, route).await
}

/// Publishes the queue's [`MESSAGES`] to `exchange` with `routing_key`, each confirmed, with
/// one publisher id.
async fn fill(
    clients: &[Client],
    n: u64,
    q: &str,
    exchange: &str,
    routing_key: &str,
) -> Result<(), String> {
    // The same in every run of a seed (the replay compares runs byte for byte); each run
    // starts a cluster of its own, so a publisher id need not differ between runs.
    let publisher_id = format!("sim-churn-{n}");
    for seq in 1..=MESSAGES {
        step(clients, n + seq, "publish", |c| {
            let req = PublishRequest {
                exchange: exchange.to_string(),
                routing_key: routing_key.to_string(),
                // Unroutable is answered as such, never confirmed and dropped.
                mandatory: true,
                message: Some(MessageBuilder::new(format!("{q}:{seq}")).build()),
                publisher_id: publisher_id.clone(),
                publisher_seq: seq,
                ..Default::default()
            };
            async move { confirmed(c.publish_with(req).await) }
        })
        .await?;
    }
    Ok(())
}

/// A publish's answer as a step's result: only CONFIRMED is done. UNROUTABLE (the publishes
/// are mandatory) fails the cycle: the queue was declared before, so a node that finds no
/// route for it routed by a view of the metadata older than the declare (qq-node catches up
/// before it answers so; before it did, seed 2012 dropped every third message). REJECTED and
/// FAILED are errors, retried or not by their code.
fn confirmed(answer: qq_client::Result<qq_client::Confirm>) -> qq_client::Result<()> {
    let c = answer?;
    match c.outcome {
        PublishOutcome::Confirmed => Ok(()),
        PublishOutcome::Unroutable => Err(tonic::Status::not_found(format!(
            "unroutable after its declare: {}",
            c.detail
        ))
        .into()),
        other => {
            let code = if c.code == Code::Ok {
                Code::FailedPrecondition
            } else {
                c.code
            };
            Err(tonic::Status::new(code, format!("{other:?}: {}", c.detail)).into())
        }
    }
}

/// Reads the queue until it holds exactly [`MESSAGES`] and the policy's `limit` is effective.
/// The queue's leader answers GetQueue, so its counts are exact; more is a failure at once.
async fn count(clients: &[Client], n: u64, q: &str, limit: u64) -> Result<(), String> {
    let deadline = Instant::now() + STEP_LIMIT;
    loop {
        let c = &clients[(n as usize) % clients.len()];
        let last = match timeout(TRY_LIMIT, c.get_queue(q)).await {
            Ok(Ok(info)) => {
                let max = info.effective.as_ref().and_then(|e| e.max_length);
                if info.messages > MESSAGES {
                    return Err(format!(
                        "{} messages after {MESSAGES} confirmed",
                        info.messages
                    ));
                }
                if info.messages == MESSAGES && max == Some(limit) {
                    return Ok(());
                }
                format!(
                    "{} messages, max_length {max:?} (policy {limit})",
                    info.messages
                )
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".into(),
        };
        if Instant::now() >= deadline {
            return Err(format!("count: after {STEP_LIMIT:?}: {last}"));
        }
        sleep(Duration::from_millis(300)).await;
    }
}

/// Deletes the queue, then reads it until NOT_FOUND (a node's view of the metadata may trail
/// the delete for a moment; still there after the step's limit is a failure).
async fn remove(clients: &[Client], n: u64, q: &str) -> Result<(), String> {
    // NOT_FOUND: a retry of a delete that went through.
    step(clients, n, "delete", |c| async move {
        done_if_gone(c.delete_queue(q, false, false).await.map(|_| ()))
    })
    .await?;
    step(clients, n, "read back the delete", |c| async move {
        done_if_gone(c.get_queue(q).await.and_then(|_| still_there(true, q)))
    })
    .await
}
