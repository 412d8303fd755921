//! Integration tests: each module is one story told against a real three-node cluster
//! (`qq_tests::TestCluster`). One test binary, so the suite links once. Every test starts its own
//! cluster; `TestCluster` runs them one at a time.

mod alarms;
mod amqp;
mod amqp_cancel;
mod amqp_errors;
mod amqp_parity;
mod amqp_raw;
mod amqp_tls;
mod bad_entries;
mod bad_input;
mod catch_up;
mod cluster_nodes;
mod consumer_priorities;
mod consumer_timeouts;
mod consumers;
mod deadletter;
mod dedup;
mod definitions;
mod delivery_counts;
mod dlx_workflows;
mod exchange_bindings;
mod failover;
mod hostile_input;
mod limits;
mod membership;
mod message_priorities;
mod move_tasks;
mod names;
mod observe;
mod page;
mod policies;
mod protocol_versions;
mod quiesce;
mod refusals;
mod reseed;
mod rolling_upgrade;
mod routing;
mod security_auth;
mod security_tls;
mod shutdown;
mod storage_faults;
mod upgrade;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, bail};
use qq_client::{Client, Delivery, Error, ValueExt, delivery_body};

/// The body of a delivery as text.
pub fn body(d: &Delivery) -> String {
    String::from_utf8_lossy(&delivery_body(d)).into_owned()
}

/// Takes (auto-ack `Get`) exactly `expected` messages from `queue`, polling while fewer have
/// arrived, then checks that the queue is empty. Returns the bodies in the order received.
pub async fn drain_exactly(
    client: &Client,
    queue: &str,
    expected: usize,
) -> anyhow::Result<Vec<String>> {
    let bodies = take(client, queue, expected).await?;
    let r = client.get(queue, true, 0).await?;
    if let Some(d) = r.delivery {
        bail!(
            "{queue}: expected {expected} messages, got another: {:?} (after {bodies:?})",
            body(&d)
        );
    }
    Ok(bodies)
}

/// Takes (auto-ack `Get`) `count` messages from `queue`, polling while fewer have arrived.
/// Returns the bodies in the order received.
pub async fn take(client: &Client, queue: &str, count: usize) -> anyhow::Result<Vec<String>> {
    let mut bodies = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while bodies.len() < count {
        let r = client
            .get(queue, true, 0)
            .await
            .with_context(|| format!("get from {queue}"))?;
        match r.delivery {
            Some(d) => bodies.push(body(&d)),
            None if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            None => bail!(
                "{queue}: got {} of {count} messages: {bodies:?}",
                bodies.len()
            ),
        }
    }
    Ok(bodies)
}

/// Same as [`drain_exactly`], as a set.
pub async fn drain_set(client: &Client, queue: &str, expected: &[&str]) -> anyhow::Result<()> {
    let got: BTreeSet<String> = drain_exactly(client, queue, expected.len())
        .await?
        .into_iter()
        .collect();
    let want: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
    if got != want {
        bail!("{queue}: received {got:?}, expected {want:?}");
    }
    Ok(())
}

/// Asserts that `result` failed with gRPC `code` and a message containing `needle`
/// (case-insensitive).
#[track_caller]
pub fn assert_status<T: std::fmt::Debug>(
    result: Result<T, Error>,
    code: tonic::Code,
    needle: &str,
) {
    match result {
        Ok(v) => panic!("expected {code:?} mentioning {needle:?}, got success: {v:?}"),
        Err(e) => {
            let status = e
                .status()
                .unwrap_or_else(|| panic!("expected a gRPC status {code:?}, got {e}"));
            assert_eq!(status.code(), code, "wrong status code: {e}");
            assert!(
                status
                    .message()
                    .to_lowercase()
                    .contains(&needle.to_lowercase()),
                "status message {:?} does not mention {needle:?}",
                status.message()
            );
        }
    }
}

/// The `x-delivery-count` header of a delivery, if any.
pub fn delivery_count(d: &Delivery) -> Option<i64> {
    qq_client::delivery_headers(d)
        .get("x-delivery-count")
        .and_then(|v| v.as_long())
}

/// Waits until node `node`'s own replica of `queue` (its `ClusterStatus`) reaches the queue
/// leader's applied index with the same state digest. Returns (applied index, commit index).
pub async fn wait_caught_up(client: &Client, node: u64, queue: &str) -> anyhow::Result<(u64, u64)> {
    qq_tests::eventually(
        &format!("node {node}'s replica of {queue} to reach the leader's index and digest"),
        Duration::from_secs(60),
        || {
            let client = client.clone();
            async move {
                let leader_view = client.get_queue(queue).await?;
                let status = client.cluster_status().await?;
                let Some(local) = status.queues.iter().find(|q| q.name == queue) else {
                    bail!("ClusterStatus of node {node} does not list {queue}");
                };
                anyhow::ensure!(
                    local.local_member,
                    "node {node} is not a member of {queue}: {local:?}"
                );
                let same = local.local_last_applied == leader_view.last_applied
                    && local.local_state_digest == leader_view.state_digest;
                Ok(same.then_some((local.local_last_applied, leader_view.commit_index)))
            }
        },
    )
    .await
}
