//! Story: idle queues sleep, and wake when needed (issue 14; docs/architecture.md, "Idle
//! groups sleep").
//!
//! 1. Twenty idle queues on three nodes: every replica of every group falls asleep (the
//!    `quorumq_raft_groups_asleep` gauge of every node reaches 20), and then lets its Raft
//!    instance go (`quorumq_raft_groups_unloaded` reaches 20: after `unload_after_ms`, 10 s by
//!    default). Every step below starts from unloaded replicas, so each path that needs a
//!    Raft instance loads it again: reads, writes, a peer's messages, the liveness link.
//! 2. Reads and writes wake them without an election: GetQueue on every queue, then a confirmed
//!    publish and a Get on one of them; no node becomes the leader of a queue meanwhile
//!    (`quorumq_raft_leader_changes_total{kind="queue"}` summed over the nodes is unchanged),
//!    and afterwards they sleep again.
//! 3. A sleeping leader's node freezes (SIGSTOP: its port still accepts, nothing answers, so
//!    only the node-level liveness link can notice): every queue it led gets a leader on the
//!    other nodes, and publishing to them works. Thawed, it rejoins, and every group sleeps
//!    again on all three nodes.
//! 4. A sleeping leader's node is killed (SIGKILL) and restarted: its queues are led
//!    elsewhere, the restarted node catches up, and the groups sleep again everywhere.

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use qq_client::{Client, message};
use qq_tests::{FAILOVER_TIMEOUT, TestCluster, eventually, info};

use crate::body;

const QUEUES: usize = 20;
/// Default `quiesce_after_ms` is 2 s; sleeping needs that after the last entry plus a round,
/// and unloading `unload_after_ms` (10 s) more plus a sweep (1 s).
const SLEEP_WAIT: Duration = Duration::from_secs(30);

fn queue(i: usize) -> String {
    format!("idle.q{i:02}")
}

/// Waits until every running node reports all [`QUEUES`] groups asleep.
async fn all_asleep(cluster: &TestCluster, when: &str) -> anyhow::Result<()> {
    all_counted(cluster, "quorumq_raft_groups_asleep", "asleep", when).await
}

/// Waits until every running node reports all [`QUEUES`] replicas unloaded.
async fn all_unloaded(cluster: &TestCluster, when: &str) -> anyhow::Result<()> {
    all_counted(cluster, "quorumq_raft_groups_unloaded", "unloaded", when).await
}

async fn all_counted(
    cluster: &TestCluster,
    gauge: &str,
    what: &str,
    when: &str,
) -> anyhow::Result<()> {
    eventually(
        &format!("every group {what} on every node ({when})"),
        SLEEP_WAIT,
        || async move {
            for id in cluster.live_ids() {
                let n = cluster.metric(id, gauge).await?;
                if n as usize != QUEUES {
                    bail!("node {id}: {n} of {QUEUES} {what}");
                }
            }
            Ok(Some(()))
        },
    )
    .await
}

/// Times a node became the leader of a queue, summed over the running nodes.
async fn queue_leaderships(cluster: &TestCluster) -> anyhow::Result<f64> {
    let mut sum = 0.0;
    for id in cluster.live_ids() {
        sum += cluster
            .metric(id, "quorumq_raft_leader_changes_total{kind=\"queue\"}")
            .await?;
    }
    Ok(sum)
}

/// Publishes `text` to `q` through `client` until it is confirmed (a publish during an
/// election may fail with UNAVAILABLE, safe to retry), then takes it back with a Get.
async fn publish_and_get(client: &Client, q: &str, text: &str) -> anyhow::Result<()> {
    eventually(
        &format!("a confirmed publish to {q}"),
        FAILOVER_TIMEOUT,
        || async move {
            client.publish("", q, message(text.to_string())).await?;
            Ok(Some(()))
        },
    )
    .await?;
    let got = client.get(q, true, 0).await?;
    let d = got
        .delivery
        .with_context(|| format!("{q}: empty after a confirmed publish"))?;
    ensure!(
        body(&d) == text,
        "{q}: got {:?}, published {text:?}",
        body(&d)
    );
    Ok(())
}

/// The queues `id` leads now.
async fn led_by(cluster: &TestCluster, id: u64) -> anyhow::Result<Vec<String>> {
    let mut led = Vec::new();
    for i in 0..QUEUES {
        if cluster.leader_of(&queue(i)).await? == id {
            led.push(queue(i));
        }
    }
    Ok(led)
}

#[tokio::test]
async fn idle_queues_sleep_and_wake_for_reads_writes_and_lost_leaders() -> anyhow::Result<()> {
    qq_tests::init_tracing();
    let mut cluster = TestCluster::start(3).await?;
    let c1 = cluster.client(1).await?;
    for i in 0..QUEUES {
        c1.declare_queue(&queue(i), Default::default()).await?;
    }

    // 1. Idle: everything sleeps.
    all_asleep(&cluster, "after the declares").await?;
    info!("all {QUEUES} groups asleep on every node");
    all_unloaded(&cluster, "after the declares").await?;
    info!("all {QUEUES} replicas unloaded on every node");

    // 2. Reads and a write wake without an election.
    let leaderships = queue_leaderships(&cluster).await?;
    for i in 0..QUEUES {
        let q = c1.get_queue(&queue(i)).await?;
        ensure!(q.leader != 0, "{}: no leader reported", queue(i));
    }
    publish_and_get(&c1, &queue(3), "woken").await?;
    let c3 = cluster.client(3).await?;
    publish_and_get(&c3, &queue(4), "woken through node 3").await?;
    ensure!(
        queue_leaderships(&cluster).await? == leaderships,
        "a read or a write of a sleeping queue caused an election"
    );
    all_asleep(&cluster, "after reads and writes").await?;
    all_unloaded(&cluster, "after reads and writes").await?;

    // 3. A frozen leader: only the node-level link notices.
    let frozen = cluster.leader_of(&queue(5)).await?;
    let led = led_by(&cluster, frozen).await?;
    info!(
        frozen,
        queues = led.len(),
        "freezing a leader of sleeping queues"
    );
    cluster.freeze(frozen, true)?;
    let other = cluster.others(frozen)[0];
    let client = cluster.client(other).await?;
    for q in &led {
        let leader = {
            // leader_of asks every live node, the frozen one included: ask the others.
            let client = &client;
            eventually(
                &format!("{q} led by a node other than {frozen}"),
                FAILOVER_TIMEOUT,
                || async move {
                    let l = client.get_queue(q).await?.leader;
                    if l == 0 || l == frozen {
                        bail!("{q}: leader {l}");
                    }
                    Ok(Some(l))
                },
            )
            .await?
        };
        info!(queue = %q, leader, "led elsewhere while the old leader is frozen");
    }
    publish_and_get(&client, &led[0], "after the freeze").await?;
    cluster.freeze(frozen, false)?;
    all_asleep(&cluster, "after the thaw").await?;
    all_unloaded(&cluster, "after the thaw").await?;

    // 4. A killed leader, restarted.
    let killed = cluster.leader_of(&queue(6)).await?;
    let led = led_by(&cluster, killed).await?;
    cluster.kill9(killed);
    let survivor = cluster.others(killed)[0];
    let client = cluster.client(survivor).await?;
    for q in &led {
        cluster.leader_of_except(q, killed).await?;
    }
    publish_and_get(&client, &led[0], "after the kill").await?;
    cluster.restart(killed).await?;
    all_asleep(&cluster, "after the restart").await?;
    all_unloaded(&cluster, "after the restart").await?;
    // The restarted node serves a queue it may now lead, woken by the request.
    let c = cluster.client(killed).await?;
    publish_and_get(&c, &queue(7), "through the restarted node").await?;

    cluster.stop();
    Ok(())
}
