//! Story: an operator grows a running cluster by a fourth node and later retires it, while a
//! client publishes, and nothing confirmed is lost.
//!
//! Node 4 is configured with every node's address (the others know only the three founders)
//! and started empty: it serves nobody until it joined. `qqctl join-node` makes it a member of
//! the metadata group; every node then lists it, also a founder restarted from a config that
//! does not name it. `grow` puts a replica of the busy queue on it, which catches up under
//! load. Refusals: a malformed address (INVALID_ARGUMENT), forgetting a running node or the
//! serving node itself (FAILED_PRECONDITION). Node 4 is stopped and `qqctl forget-node`
//! deletes its replica and drops it from the cluster; the queue keeps every confirmed message.
//! Node 4 then starts again on its old data (a Kubernetes pod scaled down and up with its
//! volume kept) and campaigns in its old groups: while forgotten it counts for nothing.
//! `join-node` makes it a member again, as a new one, and `grow` gives it a replica that
//! catches up. The consumer then reads every confirmed message through node 4.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use qq_client::{Client, Value, ValueExt, table};
use qq_tests::{ClusterOptions, RaftSettings, TestCluster, eventually, info};
use tonic::Code;

use super::membership::{QUEUE, consume_all, members_of, publish_until};
use super::{assert_status, wait_caught_up};

/// The queue's members, sorted (the first member is the initial leader, not the lowest id).
async fn replicas(client: &Client) -> anyhow::Result<Vec<u64>> {
    let mut m = members_of(client, QUEUE).await?;
    m.sort_unstable();
    Ok(m)
}

/// The node ids a node lists in ClusterStatus.
async fn nodes_seen_by(client: &Client) -> anyhow::Result<Vec<u64>> {
    Ok(client
        .cluster_status()
        .await?
        .nodes
        .iter()
        .map(|n| n.id)
        .collect())
}

/// Waits until each node of `on` lists exactly `want` in ClusterStatus.
async fn wait_nodes_listed(cluster: &TestCluster, on: &[u64], want: &[u64]) -> anyhow::Result<()> {
    for id in on {
        let client = cluster.client(*id).await?;
        eventually(
            &format!("node {id} to list nodes {want:?}"),
            Duration::from_secs(30),
            || {
                let client = client.clone();
                async move { Ok((nodes_seen_by(&client).await? == want).then_some(())) }
            },
        )
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_node_joins_takes_a_replica_and_is_forgotten_under_load() -> anyhow::Result<()> {
    let options = ClusterOptions {
        joiners: vec![4],
        ..Default::default()
    };
    let mut cluster = TestCluster::start_with_options(4, RaftSettings::default(), options).await?;
    let admin = cluster.client(1).await?;
    admin
        .declare_queue(
            QUEUE,
            table([("x-quorum-initial-group-size", Value::long(3))]),
        )
        .await?;
    let before = replicas(&admin).await?;
    assert_eq!(before, vec![1, 2, 3], "only the founders hold replicas");
    assert_eq!(nodes_seen_by(&admin).await?, vec![1, 2, 3]);

    info!("--- publish under load while node 4 joins and takes a replica");
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(publish_until(cluster.client(3).await?, stop.clone(), 2000));
    cluster.start_node(4)?;
    let qqctl = qq_tests::qqctl_binary()?;
    let node1 = cluster.address(1).to_string();
    let qqctl_run = |args: &[&str]| {
        std::process::Command::new(&qqctl)
            .arg("--node")
            .arg(&node1)
            .args(args)
            .output()
    };
    let (addr4, cluster_addr4) = (
        cluster.address(4).to_string(),
        cluster.cluster_address(4).to_string(),
    );
    let out = qqctl_run(&["join-node", "4", &addr4, &cluster_addr4])?;
    ensure!(out.status.success(), "qqctl join-node: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("node 4 joined"),
        "{out:?}"
    );
    wait_nodes_listed(&cluster, &[1, 2, 3, 4], &[1, 2, 3, 4]).await?;
    let again = admin.join_node(4, &addr4, &cluster_addr4).await?;
    assert!(again.contains("already a voter"), "{again}");
    assert_status(
        admin.join_node(5, "no-port", &cluster_addr4).await,
        Code::InvalidArgument,
        "address: 'no-port' is not host:port",
    );

    let grown = admin.grow_queues(4, "^members\\.", "").await?;
    assert_eq!(grown.len(), 1, "{grown:?}");
    assert_eq!(grown[0].outcome, "added", "{grown:?}");
    assert_eq!(replicas(&admin).await?, vec![1, 2, 3, 4]);
    wait_caught_up(&cluster.client(4).await?, 4, QUEUE).await?;

    info!("--- a founder restarted from a config without node 4 still knows it");
    cluster.terminate(2, Duration::from_secs(20)).await?;
    cluster.restart(2).await?;
    wait_nodes_listed(&cluster, &[2], &[1, 2, 3, 4]).await?;

    info!("--- refusals to forget");
    assert_status(
        admin.forget_node(4).await,
        Code::FailedPrecondition,
        "node 4 is still running",
    );
    assert_status(
        admin.forget_node(1).await,
        Code::FailedPrecondition,
        "forget it from another node",
    );
    assert_status(admin.forget_node(9).await, Code::NotFound, "9");

    info!("--- node 4 stopped and forgotten, still under load");
    cluster.terminate(4, Duration::from_secs(20)).await?;
    let out = qqctl_run(&["forget-node", "4"])?;
    ensure!(out.status.success(), "qqctl forget-node: {out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(QUEUE) && stdout.contains("deleted"),
        "{stdout}"
    );
    assert_eq!(replicas(&admin).await?, vec![1, 2, 3]);
    wait_nodes_listed(&cluster, &[1, 2, 3], &[1, 2, 3]).await?;

    info!("--- node 4 comes back on its old data while forgotten: the others do not count it");
    let log4 = cluster.log_path(4).to_path_buf();
    let logged_before = qq_tests::log_len(&log4);
    cluster.start_node(4)?;
    let before = members_of(&admin, QUEUE).await?;
    // It campaigns in its old groups (it missed its removal from them); the others must not
    // count it, and the publisher must not notice.
    eventually(
        "node 4, forgotten, to campaign in its old groups",
        Duration::from_secs(30),
        || {
            let log4 = log4.clone();
            async move {
                let since = qq_tests::log_since(&log4, logged_before);
                Ok(since.contains("trigger pre-vote").then_some(()))
            }
        },
    )
    .await?;
    wait_nodes_listed(&cluster, &[1, 2, 3], &[1, 2, 3]).await?;
    ensure!(
        !load.is_finished(),
        "the publisher stopped while node 4 was forgotten"
    );

    info!("--- the forgotten id joins again, as a new member, and takes a replica again");
    let out = qqctl_run(&["join-node", "4", &addr4, &cluster_addr4])?;
    ensure!(
        out.status.success(),
        "qqctl join-node after forget: {out:?}"
    );
    wait_nodes_listed(&cluster, &[1, 2, 3, 4], &[1, 2, 3, 4]).await?;
    let grown = admin.grow_queues(4, "^members\\.", "").await?;
    assert_eq!(grown.len(), 1, "{grown:?}");
    assert_eq!(grown[0].outcome, "added", "{grown:?}");
    assert_eq!(replicas(&admin).await?, vec![1, 2, 3, 4], "was {before:?}");

    // Caught up once the load stops: under it, a replica a few entries behind a busy leader
    // rarely shows the very same index and digest at the moment both are asked.
    stop.store(true, Ordering::Relaxed);
    let (confirmed, published) = load.await??;
    info!(confirmed = confirmed.len(), published, "publisher stopped");
    wait_caught_up(&cluster.client(4).await?, 4, QUEUE).await?;
    ensure!(
        confirmed.len() >= 2000,
        "too few confirmed: {}",
        confirmed.len()
    );
    let received = consume_all(&cluster.client(4).await?, &confirmed, published).await?;
    info!(
        received,
        "every confirmed message received after the forget"
    );
    let queue = admin.get_queue(QUEUE).await.context("queue")?;
    ensure!(queue.members.len() == 4, "{queue:?}");
    cluster.stop();
    Ok(())
}
