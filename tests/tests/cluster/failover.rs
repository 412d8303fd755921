//! Story: confirmed messages survive the crash of their queue's leader.
//!
//! 10 000 messages are published with confirms through `PublishStream`, the queue's leader is
//! killed with SIGKILL, and a consumer on a survivor must receive every one of them (at least
//! once; duplicates are tolerated, losses are not). The killed node then restarts and must
//! catch up: its own replica (reported by its `ClusterStatus`) reaches the leader's applied
//! index with the same state digest. Then the new leader is killed in turn, so the queue can
//! only make progress with the restarted node in its majority.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use qq_client::{Client, MessageBuilder, PublishOutcome};
use qq_tests::{TestCluster, eventually, info};
use tracing::warn;

const MESSAGES: usize = 10_000;
const WINDOW: usize = 500;
const QUEUE: &str = "failover.orders";
/// Publish streams opened before giving up (each after an UNAVAILABLE).
const MAX_PUBLISH_ATTEMPTS: usize = 10;

/// Publishes m-0 .. m-{MESSAGES-1} until every one is confirmed. A stream that fails with
/// UNAVAILABLE ("safe to retry" in docs/api.md) is reopened once the queue has a leader, and the
/// unconfirmed messages are sent again, as a real at-least-once publisher does: the consumer
/// side tolerates the duplicates this may create. Returns how many streams failed.
async fn publish_all_confirmed(cluster: &TestCluster, client: &Client) -> anyhow::Result<usize> {
    let mut unconfirmed: BTreeSet<usize> = (0..MESSAGES).collect();
    let mut failures = 0;
    while !unconfirmed.is_empty() {
        let ids: Vec<usize> = unconfirmed.iter().copied().collect();
        match publish_once(client, &ids, &mut unconfirmed).await {
            Ok(()) => ensure!(
                unconfirmed.is_empty(),
                "stream closed with {} unconfirmed",
                unconfirmed.len()
            ),
            Err(e) if is_unavailable(&e) && failures + 1 < MAX_PUBLISH_ATTEMPTS => {
                failures += 1;
                warn!(error = %e, unconfirmed = unconfirmed.len(), "publish stream failed; re-sending the unconfirmed messages");
                cluster.leader_of(QUEUE).await?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(failures)
}

async fn publish_once(
    client: &Client,
    ids: &[usize],
    unconfirmed: &mut BTreeSet<usize>,
) -> anyhow::Result<()> {
    let mut publisher = client.publisher(WINDOW).await?;
    let mut by_seq: HashMap<u64, usize> = HashMap::new();
    let mut record =
        |c: qq_client::Confirm, by_seq: &mut HashMap<u64, usize>| -> anyhow::Result<()> {
            let Some(id) = by_seq.remove(&c.seq) else {
                bail!("confirm for unknown or already confirmed seq {}", c.seq)
            };
            ensure!(
                c.outcome == PublishOutcome::Confirmed,
                "m-{id} not confirmed: {c:?}"
            );
            unconfirmed.remove(&id);
            Ok(())
        };
    for &i in ids {
        let id = format!("m-{i}");
        let msg = MessageBuilder::new(id.clone()).message_id(id).build();
        let seq = publisher.send("", QUEUE, msg).await?;
        by_seq.insert(seq, i);
        for c in publisher.take_confirms() {
            record(c, &mut by_seq)?;
        }
    }
    for c in publisher.close().await? {
        record(c, &mut by_seq)?;
    }
    ensure!(
        by_seq.is_empty(),
        "{} publishes never confirmed",
        by_seq.len()
    );
    Ok(())
}

fn is_unavailable(e: &anyhow::Error) -> bool {
    e.downcast_ref::<qq_client::Error>()
        .is_some_and(|e| e.code() == tonic::Code::Unavailable)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_messages_survive_leader_crash_and_the_node_catches_up() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start(3).await?;

    info!("--- declare a queue replicated on all three nodes");
    let any = cluster.client(1).await?;
    any.declare_queue(QUEUE, Default::default()).await?;
    let leader = cluster.leader_of(QUEUE).await?;
    let survivor = cluster.others(leader)[0];
    info!(
        leader,
        survivor, "queue leader found; publishing through a follower"
    );
    let client = cluster.client(survivor).await?;

    info!("--- publish {MESSAGES} messages with confirms (window {WINDOW})");
    let resends = publish_all_confirmed(&cluster, &client).await?;
    let before = eventually("all messages counted", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            let q = client.get_queue(QUEUE).await?;
            Ok((q.messages >= MESSAGES as u64).then_some(q))
        }
    })
    .await?;
    if resends == 0 {
        assert_eq!(before.messages, MESSAGES as u64, "one message per confirm");
    }
    info!(
        commit_index = before.commit_index,
        term = before.raft_term,
        "all confirmed and counted"
    );

    info!("--- kill -9 the queue leader (node {leader})");
    cluster.kill9(leader);
    let new_leader = cluster.leader_of_except(QUEUE, leader).await?;
    info!(new_leader, "a survivor took over");

    info!("--- consume everything from a survivor");
    let mut consumer = client.consume(QUEUE, 1000).await?;
    let mut seen = HashSet::new();
    let mut duplicates = 0usize;
    while seen.len() < MESSAGES {
        let d = tokio::time::timeout(Duration::from_secs(60), consumer.next())
            .await
            .with_context(|| {
                format!(
                    "no delivery for 60 s with {} of {MESSAGES} seen",
                    seen.len()
                )
            })?
            .context("consume stream ended early")??;
        if !seen.insert(super::body(&d)) {
            duplicates += 1;
        }
        consumer.ack(d.delivery_tag, false).await?;
    }
    let expected: HashSet<String> = (0..MESSAGES).map(|i| format!("m-{i}")).collect();
    assert_eq!(
        seen, expected,
        "every confirmed message is delivered, nothing else"
    );
    info!(duplicates, "every message received");
    // Duplicates from re-sent publishes may still be queued: keep consuming (and acking) until
    // the queue is empty.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let q = client.get_queue(QUEUE).await?;
        if q.messages == 0 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "queue not empty after the acks: {q:?}"
        );
        if let Some(d) = consumer.next_timeout(Duration::from_millis(500)).await? {
            ensure!(
                seen.contains(&super::body(&d)),
                "unexpected message {:?}",
                super::body(&d)
            );
            duplicates += 1;
            consumer.ack(d.delivery_tag, false).await?;
        }
    }
    if resends == 0 {
        info!(
            duplicates,
            "no publish was re-sent; duplicates are redeliveries after the crash"
        );
    }
    consumer.cancel().await?;
    drop(consumer);

    info!("--- restart node {leader}; it must catch up");
    cluster.restart(leader).await?;
    let restarted = cluster.client(leader).await?;
    let q = restarted.get_queue(QUEUE).await?;
    assert_eq!(
        q.messages, 0,
        "the restarted node serves the current state: {q:?}"
    );
    assert!(
        q.members.contains(&leader),
        "the restarted node is still a member: {q:?}"
    );
    let caught_up = super::wait_caught_up(&restarted, leader, QUEUE).await?;
    info!(
        applied = caught_up.0,
        commit_index = caught_up.1,
        "restarted replica caught up"
    );

    info!(
        "--- kill the current leader (node {new_leader}): the restarted node is now needed for quorum"
    );
    cluster.kill9(new_leader);
    let third = cluster.leader_of_except(QUEUE, new_leader).await?;
    info!(third, "leader after the second crash");
    let after = restarted.get_queue(QUEUE).await?;
    assert_eq!(after.messages, 0, "no acked message came back: {after:?}");
    assert!(
        after.commit_index >= before.commit_index,
        "the log did not go backwards: {} < {}",
        after.commit_index,
        before.commit_index
    );
    for i in 0..10 {
        let c = restarted
            .publish("", QUEUE, qq_client::message(format!("late-{i}")))
            .await?;
        assert_eq!(c.outcome, PublishOutcome::Confirmed, "{c:?}");
    }
    let late = super::drain_exactly(&restarted, QUEUE, 10).await?;
    let want: Vec<String> = (0..10).map(|i| format!("late-{i}")).collect();
    assert_eq!(
        late, want,
        "FIFO order with the restarted node in the majority"
    );
    cluster.stop();
    Ok(())
}

/// Story: a leader killed with SIGKILL is replaced without waiting out the election timeout.
///
/// The nodes run with election timeouts of 20-40 s, so Raft's timers alone could not elect a
/// new leader within the 10 s this test allows: only the liveness handover can (a survivor sees
/// the dead node's port refuse connections and starts the election at once; see
/// `qq_node::liveness`). The metadata group and the queue group must both move, and a message
/// confirmed before the crash is still there with the one published after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_without_the_election_timeout() -> anyhow::Result<()> {
    const Q: &str = "handover.q";
    const ALLOWED: Duration = Duration::from_secs(10);
    let mut cluster = TestCluster::start_with(
        3,
        qq_tests::RaftSettings {
            heartbeat_ms: 500,
            election_timeout_min_ms: 20_000,
            election_timeout_max_ms: 40_000,
            ..Default::default()
        },
    )
    .await?;
    let any = cluster.client(1).await?;
    any.declare_queue(Q, Default::default()).await?;
    let leader = cluster.leader_of(Q).await?;
    let meta_leader = any.cluster_status().await?.metadata_leader;
    let survivor = cluster.others(leader)[0];
    let client = cluster.client(survivor).await?;
    let before = client.publish("", Q, qq_client::message("before")).await?;
    ensure!(
        before.is_confirmed(),
        "publish before the crash: {before:?}"
    );

    info!(leader, meta_leader, "--- kill -9 the queue leader");
    cluster.kill9(leader);
    let started = tokio::time::Instant::now();
    let new_leader = loop {
        // UNAVAILABLE ("no leader right now") counts as not yet.
        let queue_leader = client.get_queue(Q).await.map(|q| q.leader).unwrap_or(0);
        let meta = client.cluster_status().await?.metadata_leader;
        if queue_leader != 0 && queue_leader != leader && meta != 0 && meta != leader {
            break queue_leader;
        }
        ensure!(
            started.elapsed() < ALLOWED,
            "no new leader {ALLOWED:?} after the kill (election timeout 20 s): queue leader \
             {queue_leader}, metadata leader {meta}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    info!(new_leader, after = ?started.elapsed(), "queue and metadata handed over");
    let after = client.publish("", Q, qq_client::message("after")).await?;
    ensure!(after.is_confirmed(), "publish after the crash: {after:?}");
    ensure!(
        started.elapsed() < ALLOWED,
        "the publish after the crash took until {:?}",
        started.elapsed()
    );
    super::drain_set(&client, Q, &["before", "after"]).await?;
    cluster.stop();
    Ok(())
}

/// Story: the whole cluster crashes at once and every unacked message comes back, body and all.
///
/// Bodies are written to RocksDB without its write-ahead log (they are derived from the Raft
/// log; see `Store::put_bodies`), so a crash loses every body not yet flushed to a table file.
/// They must come back from each node's snapshot (which carries the live bodies) and the log
/// after it. Snapshots every 100 entries, so both paths are used: 300 unary publishes (one
/// entry each), 100 of them taken with auto-ack Gets, then kill -9 of all three nodes and a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_come_back_after_the_whole_cluster_crashes() -> anyhow::Result<()> {
    const Q: &str = "crash.all";
    const PUBLISHED: usize = 300;
    const ACKED: usize = 100;
    let mut cluster = TestCluster::start_with(
        3,
        qq_tests::RaftSettings {
            snapshot_after_entries: 100,
            ..Default::default()
        },
    )
    .await?;
    let client = cluster.client(1).await?;
    client.declare_queue(Q, Default::default()).await?;
    for i in 0..PUBLISHED {
        let c = client
            .publish("", Q, qq_client::message(format!("body-{i}")))
            .await?;
        ensure!(c.is_confirmed(), "publish {i}: {c:?}");
    }
    let acked = super::take(&client, Q, ACKED).await?;
    let want_acked: Vec<String> = (0..ACKED).map(|i| format!("body-{i}")).collect();
    assert_eq!(acked, want_acked, "FIFO before the crash");

    info!("--- kill -9 every node, then start them again");
    for id in cluster.ids() {
        cluster.kill9(id);
    }
    // All together: a node started alone serves nobody until its metadata has caught up
    // with a leader's, and there is no leader before a majority is up.
    cluster.restart_all().await?;
    cluster.leader_of(Q).await?;
    let client = cluster.client(2).await?;
    let rest = super::drain_exactly(&client, Q, PUBLISHED - ACKED).await?;
    let want: Vec<String> = (ACKED..PUBLISHED).map(|i| format!("body-{i}")).collect();
    assert_eq!(rest, want, "every unacked body, in order, nothing acked");
    cluster.stop();
    Ok(())
}

/// Story: queues declared while one node is down serve at once, including those whose first
/// member (the node that initialises a new group) is the dead node.
///
/// New queues are placed on every node in turn as their first member, down or not. That member
/// initialises the group; when it is down, the other members initialise it themselves after a
/// few seconds (`Node::initialise_unless_heard`). Before that, such a queue had no leader until
/// its first member came back: its declare timed out, and a node retired meanwhile could not
/// be forgotten from it (found by the simulator, seed 2009).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_declared_while_a_node_is_down_all_serve() -> anyhow::Result<()> {
    const DOWN: u64 = 1;
    let mut cluster = TestCluster::start(3).await?;
    info!("--- kill -9 node {DOWN}, then declare three queues through node 2");
    cluster.kill9(DOWN);
    let client = cluster.client(2).await?;
    let names: Vec<String> = (0..3).map(|i| format!("down.q{i}")).collect();
    for name in &names {
        eventually(&format!("declare {name}"), Duration::from_secs(60), || {
            let (client, name) = (client.clone(), name.clone());
            async move {
                client.declare_queue(&name, Default::default()).await?;
                Ok(Some(()))
            }
        })
        .await?;
        let c = client
            .publish("", name, qq_client::message(name.clone()))
            .await?;
        ensure!(c.is_confirmed(), "publish to {name}: {c:?}");
    }
    let first_members: Vec<(String, u64)> = client
        .list_queues()
        .await?
        .into_iter()
        .filter(|q| names.contains(&q.name))
        .map(|q| (q.name, q.members.first().copied().unwrap_or(0)))
        .collect();
    ensure!(
        first_members.iter().any(|(_, first)| *first == DOWN),
        "no queue was placed on node {DOWN} first, so the case was not tried: {first_members:?}"
    );
    for name in &names {
        super::drain_set(&client, name, &[name.as_str()]).await?;
    }
    cluster.stop();
    Ok(())
}
