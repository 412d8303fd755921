//! Story: confirmed messages survive the crash of their queue's leader.
//!
//! 10 000 messages are published with confirms through `PublishStream`, the queue's leader is
//! killed with SIGKILL, and a consumer on a survivor must receive every one of them (at least
//! once; duplicates are tolerated, losses are not). The killed node then restarts and must
//! rejoin: with the other survivor's leader killed in turn, the queue can only make progress
//! with the restarted node in its majority, which it can only be once it has caught up.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, ensure};
use qq_client::{MessageBuilder, PublishOutcome};
use qq_tests::{TestCluster, eventually, info};

const MESSAGES: usize = 10_000;
const WINDOW: usize = 500;
const QUEUE: &str = "failover.orders";

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
    let mut publisher = client.publisher(WINDOW).await?;
    let mut confirmed = HashSet::new();
    let mut check = |c: qq_client::Confirm| -> anyhow::Result<()> {
        ensure!(
            c.outcome == PublishOutcome::Confirmed,
            "seq {} not confirmed: {c:?}",
            c.seq
        );
        ensure!(confirmed.insert(c.seq), "seq {} confirmed twice", c.seq);
        Ok(())
    };
    for i in 0..MESSAGES {
        let id = format!("m-{i}");
        let msg = MessageBuilder::new(id.clone()).message_id(id).build();
        publisher.send("", QUEUE, msg).await?;
        for c in publisher.take_confirms() {
            check(c)?;
        }
    }
    for c in publisher.close().await? {
        check(c)?;
    }
    assert_eq!(
        confirmed.len(),
        MESSAGES,
        "every publish gets exactly one confirm"
    );
    let before = eventually("all messages counted", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            let q = client.get_queue(QUEUE).await?;
            Ok((q.messages == MESSAGES as u64).then_some(q))
        }
    })
    .await?;
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
    eventually(
        "the queue to be empty after the acks",
        Duration::from_secs(30),
        || {
            let client = client.clone();
            async move {
                let q = client.get_queue(QUEUE).await?;
                Ok((q.messages == 0).then_some(()))
            }
        },
    )
    .await?;
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
    Ok(())
}
