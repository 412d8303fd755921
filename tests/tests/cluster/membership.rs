//! Story: an operator changes a queue's replicas while clients publish, and nothing confirmed
//! is lost.
//!
//! A queue on two of three nodes is quorum critical on both (QuorumCritical names it); the
//! third node is added with AddMember while a publisher streams confirmed messages, and the
//! queue is no longer critical. Then the queue's leader is deleted from its members, still
//! under load: its replica stops, the new member has caught up, and a consumer receives every
//! confirmed message. Refusals: a node outside the cluster (NOT_FOUND), the last member
//! (FAILED_PRECONDITION). Then many queues at once (GrowQueues by pattern, ShrinkQueues),
//! RebalanceLeaders after every queue was placed on one node with `x-queue-leader-locator`
//! `client-local`, and the locator's refusal of an unknown value.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use qq_client::{Client, MessageBuilder, PublishOutcome, Value, ValueExt, message, table};
use qq_tests::{TestCluster, eventually, info};
use tonic::Code;

use super::{assert_status, body, wait_caught_up};

pub(super) const QUEUE: &str = "members.orders";
/// Unconfirmed publishes in flight on the publisher's stream.
const WINDOW: usize = 100;

/// The queue's members as the metadata records them (ClusterStatus of any node).
pub(super) async fn members_of(client: &Client, queue: &str) -> anyhow::Result<Vec<u64>> {
    let status = client.cluster_status().await?;
    status
        .queues
        .iter()
        .find(|q| q.name == queue)
        .map(|q| q.members.clone())
        .with_context(|| format!("{queue} not in ClusterStatus"))
}

/// Publishes m-0, m-1, … on streams (reopened after a failure, as a real publisher does) until
/// `stop`, then returns the ids confirmed. At least `min` messages are published.
pub(super) async fn publish_until(
    client: Client,
    stop: Arc<AtomicBool>,
    min: usize,
) -> anyhow::Result<(BTreeSet<usize>, usize)> {
    let mut confirmed = BTreeSet::new();
    let mut next = 0usize;
    let mut failures = 0usize;
    while !stop.load(Ordering::Relaxed) || next < min {
        let mut publisher = match client.publisher(WINDOW).await {
            Ok(p) => p,
            Err(e) => {
                failures += 1;
                ensure!(failures < 50, "publisher keeps failing: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut by_seq = BTreeMap::new();
        let mut record = |c: qq_client::Confirm, by_seq: &mut BTreeMap<u64, usize>| {
            if let Some(id) = by_seq.remove(&c.seq)
                && c.outcome == PublishOutcome::Confirmed
            {
                confirmed.insert(id);
            }
        };
        let result: anyhow::Result<()> = async {
            for _ in 0..500 {
                let id = format!("m-{next}");
                let msg = MessageBuilder::new(id.clone()).message_id(id).build();
                let seq = publisher.send("", QUEUE, msg).await?;
                by_seq.insert(seq, next);
                next += 1;
                for c in publisher.take_confirms() {
                    record(c, &mut by_seq);
                }
            }
            for c in publisher.close().await? {
                record(c, &mut by_seq);
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            failures += 1;
            ensure!(failures < 50, "publisher keeps failing: {e}");
            info!("publish stream failed (re-opening): {e}");
        }
    }
    Ok((confirmed, next))
}

/// Consumes QUEUE until every `confirmed` message was received (each body `m-<id>` with an id
/// below `published`); returns how many distinct messages arrived.
pub(super) async fn consume_all(
    client: &Client,
    confirmed: &BTreeSet<usize>,
    published: usize,
) -> anyhow::Result<usize> {
    let mut consumer = client.consume(QUEUE, 1000).await?;
    let mut seen = HashSet::new();
    let want: HashSet<String> = confirmed.iter().map(|i| format!("m-{i}")).collect();
    while !want.is_subset(&seen) {
        let d = consumer
            .next_timeout(Duration::from_secs(30))
            .await?
            .with_context(|| {
                format!(
                    "no delivery for 30 s; missing {} confirmed messages",
                    want.difference(&seen).count()
                )
            })?;
        let b = body(&d);
        let id: usize = b.trim_start_matches("m-").parse()?;
        ensure!(id < published, "a message never published: {b}");
        seen.insert(b);
        consumer.ack(d.delivery_tag, false).await?;
    }
    Ok(seen.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_and_delete_member_under_load_lose_no_confirmed_message() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let admin = cluster.client(1).await?;
    admin
        .declare_queue(
            QUEUE,
            table([("x-quorum-initial-group-size", Value::long(2))]),
        )
        .await?;
    let members = members_of(&admin, QUEUE).await?;
    assert_eq!(members.len(), 2, "declared on two nodes: {members:?}");
    let outsider = *cluster
        .ids()
        .iter()
        .find(|n| !members.contains(n))
        .expect("a third node");
    cluster.leader_of(QUEUE).await?;

    info!("--- a two-member queue is quorum critical on each member, not on the outsider");
    for m in &members {
        let crit = admin.quorum_critical(*m).await?;
        assert!(
            crit.queues.iter().any(|q| q.queue == QUEUE),
            "node {m} should be critical for {QUEUE}: {crit:?}"
        );
        assert!(!crit.metadata, "three metadata voters survive one stop");
    }
    let crit = admin.quorum_critical(outsider).await?;
    assert!(crit.queues.iter().all(|q| q.queue != QUEUE), "{crit:?}");

    info!("--- refusals");
    assert_status(
        admin.add_member(QUEUE, 9).await,
        Code::NotFound,
        "node: 9 is not a node of the cluster",
    );
    assert_status(
        admin.add_member("members.missing", outsider).await,
        Code::NotFound,
        "members.missing",
    );
    assert_status(
        admin.delete_member(QUEUE, 0).await,
        Code::InvalidArgument,
        "node",
    );
    assert_status(
        admin.quorum_critical(9).await,
        Code::NotFound,
        "not a node of the cluster",
    );

    info!("--- publish under load while node {outsider} is added");
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(publish_until(
        cluster.client(outsider).await?,
        stop.clone(),
        2000,
    ));
    eventually(
        "the publisher to get going",
        Duration::from_secs(30),
        || {
            let admin = admin.clone();
            async move { Ok((admin.get_queue(QUEUE).await?.messages >= 300).then_some(())) }
        },
    )
    .await?;
    let added = admin.add_member(QUEUE, outsider).await?;
    assert_eq!(added.outcome, "added", "{added:?}");
    assert_eq!(added.members.len(), 3, "{added:?}");
    assert!(added.members.contains(&outsider));
    assert_eq!(members_of(&admin, QUEUE).await?, added.members);
    let again = admin.add_member(QUEUE, outsider).await?;
    assert_eq!(again.outcome, "unchanged", "{again:?}");
    for m in &members {
        let crit = admin.quorum_critical(*m).await?;
        assert!(
            crit.queues.iter().all(|q| q.queue != QUEUE),
            "three members: node {m} is not critical any more: {crit:?}"
        );
    }

    info!("--- delete the queue's leader from its members, still under load");
    let leader = cluster.leader_of(QUEUE).await?;
    let deleted = admin.delete_member(QUEUE, leader).await?;
    assert_eq!(deleted.outcome, "deleted", "{deleted:?}");
    assert_eq!(deleted.members.len(), 2);
    assert!(!deleted.members.contains(&leader));
    let new_leader = cluster.leader_of_except(QUEUE, leader).await?;
    info!(
        leader,
        new_leader, "leadership moved off the deleted member"
    );
    stop.store(true, Ordering::Relaxed);
    let (confirmed, published) = load.await??;
    info!(confirmed = confirmed.len(), published, "publisher stopped");
    ensure!(
        confirmed.len() >= 2000,
        "too few confirmed: {}",
        confirmed.len()
    );

    info!("--- the deleted member's replica stops; the added one has caught up");
    let on_deleted = cluster.client(leader).await?;
    eventually(
        "the deleted member to stop its replica",
        Duration::from_secs(30),
        || {
            let c = on_deleted.clone();
            async move {
                let s = c.cluster_status().await?;
                let q = s
                    .queues
                    .iter()
                    .find(|q| q.name == QUEUE)
                    .context("listed")?;
                Ok((!q.local_member).then_some(()))
            }
        },
    )
    .await?;
    wait_caught_up(&cluster.client(outsider).await?, outsider, QUEUE).await?;

    info!("--- every confirmed message is delivered");
    let received = consume_all(&cluster.client(outsider).await?, &confirmed, published).await?;
    info!(received, "every confirmed message received");

    info!("--- qqctl check-quorum-critical: non-zero for a member of a two-member queue");
    let qqctl = qq_tests::qqctl_binary()?;
    let qqctl_run = |args: &[&str]| {
        std::process::Command::new(&qqctl)
            .arg("--node")
            .arg(cluster.address(1))
            .args(args)
            .output()
    };
    let critical_node = deleted.members[0].to_string();
    let out = qqctl_run(&["check-quorum-critical", &critical_node])?;
    assert!(
        !out.status.success(),
        "a member of a two-member queue is critical: {out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(QUEUE),
        "{out:?}"
    );
    let out = qqctl_run(&["add-member", QUEUE, &leader.to_string()])?;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("added"),
        "{out:?}"
    );
    let out = qqctl_run(&["check-quorum-critical", &critical_node])?;
    assert!(
        out.status.success(),
        "three members again: not critical: {out:?}"
    );

    info!("--- the last member cannot be deleted");
    admin
        .declare_queue(
            "members.single",
            table([("x-quorum-initial-group-size", Value::long(1))]),
        )
        .await?;
    let single = members_of(&admin, "members.single").await?;
    assert_eq!(single.len(), 1);
    assert_status(
        admin.delete_member("members.single", single[0]).await,
        Code::FailedPrecondition,
        "last member",
    );
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_and_shrink_by_pattern() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let admin = cluster.client(1).await?;
    let one = table([("x-quorum-initial-group-size", Value::long(1))]);
    for name in ["grow.a", "grow.b", "grow.c", "other.d"] {
        admin.declare_queue(name, one.clone()).await?;
        admin
            .publish("", name, message(format!("in {name}")))
            .await?;
    }
    let node = 2;

    info!("--- grow node {node} onto every queue matching ^grow\\.");
    let changes = admin.grow_queues(node, r"^grow\.", "").await?;
    let names: BTreeSet<&str> = changes.iter().map(|c| c.queue.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["grow.a", "grow.b", "grow.c"]),
        "{changes:?}"
    );
    for c in &changes {
        assert!(c.outcome == "added" || c.outcome == "unchanged", "{c:?}");
        assert!(c.members.contains(&node), "{c:?}");
        assert_eq!(members_of(&admin, &c.queue).await?, c.members);
    }
    let other = members_of(&admin, "other.d").await?;
    assert_eq!(other.len(), 1, "other.d is not matched: {other:?}");
    assert_status(
        admin.grow_queues(node, "(unclosed", "").await,
        Code::InvalidArgument,
        "pattern",
    );
    assert_status(
        admin.grow_queues(node, &"a".repeat(2000), "").await,
        Code::InvalidArgument,
        "pattern",
    );

    info!("--- shrink node {node} off every queue where it is not the last member");
    let changes = admin.shrink_queues(node).await?;
    for c in &changes {
        let before_single = c.detail.contains("last member");
        if before_single {
            assert_eq!(c.outcome, "unchanged", "{c:?}");
            assert_eq!(c.members, vec![node]);
        } else {
            assert_eq!(c.outcome, "deleted", "{c:?}");
            assert!(!c.members.contains(&node), "{c:?}");
        }
    }
    for name in ["grow.a", "grow.b", "grow.c", "other.d"] {
        let m = members_of(&admin, name).await?;
        assert_eq!(m.len(), 1, "{name}: {m:?}");
        // The message is still there, on whichever node holds the queue now.
        super::drain_set(&admin, name, &[&format!("in {name}")]).await?;
    }
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_locator_and_rebalance() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let on3 = cluster.client(3).await?;
    let local = table([("x-queue-leader-locator", Value::string("client-local"))]);
    let queues: Vec<String> = (0..6).map(|i| format!("placed.{i}")).collect();

    info!("--- client-local: every queue declared on node 3 starts with node 3 first");
    for q in &queues {
        on3.declare_queue(q, local.clone()).await?;
        assert_eq!(members_of(&on3, q).await?[0], 3, "{q}");
    }
    let mut leaders = BTreeMap::new();
    for q in &queues {
        leaders.insert(q.clone(), cluster.leader_of(q).await?);
    }
    info!(?leaders, "leaders after client-local placement");
    assert_status(
        on3.declare_queue(
            "placed.bad",
            table([("x-queue-leader-locator", Value::string("random"))]),
        )
        .await,
        Code::InvalidArgument,
        "x-queue-leader-locator",
    );

    info!("--- rebalance: each node ends up leading two of the six");
    let r = on3.rebalance_leaders().await?;
    info!(?r, "rebalance answered");
    for m in &r.moves {
        assert!(m.detail.is_empty(), "a move failed: {m:?}");
    }
    let per_node = eventually("leaders to be balanced", Duration::from_secs(30), || {
        let cluster = &cluster;
        let queues = queues.clone();
        async move {
            let mut count: BTreeMap<u64, usize> = BTreeMap::new();
            for q in &queues {
                *count.entry(cluster.leader_of(q).await?).or_default() += 1;
            }
            let balanced = count.len() == 3 && count.values().all(|n| *n == 2);
            Ok(balanced.then_some(count))
        }
    })
    .await?;
    info!(?per_node, "balanced");
    let again = on3.rebalance_leaders().await?;
    assert!(again.moves.is_empty(), "nothing left to move: {again:?}");

    info!("--- balanced: a new queue goes to a node leading fewest (all lead two: node 1)");
    let balanced = table([("x-queue-leader-locator", Value::string("balanced"))]);
    on3.declare_queue("placed.balanced", balanced).await?;
    assert_eq!(members_of(&on3, "placed.balanced").await?[0], 1);

    info!("--- policy key queue-leader-locator places queues; the argument wins over it");
    let on2 = cluster.client(2).await?;
    assert_status(
        on2.set_policy(
            "bad-locator",
            "^local\\.",
            "queues",
            0,
            table([("queue-leader-locator", Value::string("random"))]),
        )
        .await,
        Code::InvalidArgument,
        "queue-leader-locator",
    );
    on2.set_policy(
        "locate-local",
        "^local\\.",
        "queues",
        0,
        table([("queue-leader-locator", Value::string("client-local"))]),
    )
    .await?;
    for i in 0..3 {
        let q = format!("local.{i}");
        on2.declare_queue(&q, table::<&str>([])).await?;
        assert_eq!(
            members_of(&on2, &q).await?[0],
            2,
            "{q} placed by the policy"
        );
    }
    on2.declare_queue(
        "local.balanced",
        table([("x-queue-leader-locator", Value::string("balanced"))]),
    )
    .await?;
    assert_ne!(
        members_of(&on2, "local.balanced").await?[0],
        2,
        "the argument (balanced) wins over the policy (client-local): node 2 leads the most"
    );
    cluster.stop();
    Ok(())
}
