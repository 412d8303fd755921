//! A follower that missed more than the leader's log still holds catches up by snapshot, and
//! the snapshot travels as a file in bounded chunks.

use std::time::Duration;

use anyhow::ensure;
use qq_tests::{TestCluster, eventually};
use tracing::info;

const Q: &str = "catch.up";
const MESSAGES: usize = 1_500;
const BODY_BYTES: usize = 32 * 1024;
const SNAPSHOT_AFTER_ENTRIES: usize = 100;

fn body(i: usize) -> String {
    let mut b = format!("{i:06}-");
    b.extend(std::iter::repeat_n('x', BODY_BYTES - b.len()));
    b
}

/// `quorumq_<name>` for a label set on node `id`'s `/metrics` (0 when absent).
async fn metric(cluster: &TestCluster, id: u64, series: &str) -> anyhow::Result<f64> {
    let (status, text) = cluster.http_get(id, "/metrics").await?;
    ensure!(status == 200, "GET /metrics on node {id}: {status}");
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0))
}

/// Story: a follower is killed; while it is down the queue takes 1 500 messages of 32 KiB
/// (48 MiB, one log entry each) and the leader snapshots every 100 entries and compacts its
/// log, so the follower's next entry is gone and only a snapshot can bring it back. Restarted,
/// it receives the snapshot in chunks of at most 4 MiB (the node counts the bytes and the
/// install), applies up to the leader, and then, as the queue's only member, serves every
/// body in order: the snapshot carried them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_follower_catches_up_by_a_chunked_snapshot_and_serves_every_body()
-> anyhow::Result<()> {
    let mut cluster = TestCluster::start_with(
        3,
        qq_tests::RaftSettings {
            snapshot_after_entries: SNAPSHOT_AFTER_ENTRIES as u64,
            ..Default::default()
        },
    )
    .await?;
    let client = cluster.client(1).await?;
    client.declare_queue(Q, Default::default()).await?;
    let leader = cluster.leader_of(Q).await?;
    let follower = cluster.others(leader)[0];
    let client = cluster.client(leader).await?;
    // The follower's log ends at most here when it is killed.
    let at_kill = client.get_queue(Q).await?.last_applied;
    info!(
        leader,
        follower, at_kill, "--- kill -9 the follower, then publish"
    );
    cluster.kill9(follower);
    for i in 0..MESSAGES {
        let c = client.publish("", Q, qq_client::message(body(i))).await?;
        ensure!(c.is_confirmed(), "publish {i}: {c:?}");
    }
    let leader_applied = client.get_queue(Q).await?.last_applied;
    // The story needs the follower's next entry gone from the leader's log. The leader
    // compacts after a snapshot build, and under load (a full `make test`) the last build
    // can end only after the follower is back, which then catches up by appends: wait for it.
    let purged = format!("quorumq_raft_log_purged_index{{vhost=\"/\",queue=\"{Q}\"}}");
    eventually(
        "the leader's log compacted past the follower's next entry",
        Duration::from_secs(60),
        || async {
            let n = metric(&cluster, leader, &purged).await?;
            Ok((n > at_kill as f64).then_some(()))
        },
    )
    .await?;

    info!("--- restart the follower: it must catch up by snapshot");
    cluster.start_node(follower)?;
    let installed = "quorumq_snapshots_installed_total{kind=\"queue\"}";
    eventually(
        "the follower installs a queue snapshot and applies up to the leader",
        Duration::from_secs(120),
        || async {
            let status = cluster.client(follower).await?.cluster_status().await?;
            let applied = status
                .queues
                .iter()
                .find(|q| q.name == Q)
                .map_or(0, |q| q.local_last_applied);
            let n = metric(&cluster, follower, installed).await?;
            Ok((n >= 1.0 && applied >= leader_applied).then_some(()))
        },
    )
    .await?;
    // The snapshot the leader sends is its latest complete one, which may lag its log by the
    // entries since the build before (one interval, plus one while a build runs, plus slack
    // for a slow build): those last bodies come by replication. Every body is checked below.
    let received = metric(&cluster, follower, "quorumq_snapshot_received_bytes_total").await?;
    let by_snapshot = MESSAGES - 3 * SNAPSHOT_AFTER_ENTRIES;
    ensure!(
        received >= (by_snapshot * BODY_BYTES) as f64,
        "the snapshot carried the bodies of at least the first {by_snapshot} messages: \
         {received} bytes received"
    );

    info!("--- shrink the queue to the follower alone and drain it there");
    for other in cluster.others(follower) {
        client.delete_member(Q, other).await?;
    }
    let alone = cluster.client(follower).await?;
    let q = alone.get_queue(Q).await?;
    ensure!(q.members == vec![follower], "members: {:?}", q.members);
    let got = super::drain_exactly(&alone, Q, MESSAGES).await?;
    for (i, b) in got.iter().enumerate() {
        ensure!(
            *b == body(i),
            "message {i}: body {:?}...",
            &b[..16.min(b.len())]
        );
    }
    cluster.stop();
    Ok(())
}
