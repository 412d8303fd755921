//! Story: a node whose disk (or memory) is past its bound refuses publishes, names the alarm,
//! and keeps its consumers draining; `ClusterStatus` shows the alarm.
//!
//! The disk alarm is set deterministically with a `disk_free_limit` larger than any disk on
//! node 3 only; nodes 1 and 2 keep the default. Over AMQP, the alarm comes and goes on a
//! small tmpfs the test fills and frees.

use anyhow::{Context, ensure};
use futures::StreamExt;
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use qq_client::message;
use qq_tests::{ClusterOptions, RaftSettings, TestCluster, Tmpfs, eventually, info};
use tonic::Code;

use super::amqp::{WAIT, connect, durable, quorum};
use super::{assert_status, drain_exactly};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_in_alarm_refuses_publishes_and_keeps_delivering() -> anyhow::Result<()> {
    let options = ClusterOptions {
        extra_config_for: vec![(3, "disk_free_limit = 1000000000000000000".into())],
        ..Default::default()
    };
    let cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
    let ok = cluster.client(1).await?;
    let alarmed = cluster.client(3).await?;
    ok.declare_queue("alarm.q", Default::default()).await?;
    for i in 0..3 {
        assert!(
            ok.publish("", "alarm.q", message(format!("m{i}")))
                .await?
                .is_confirmed()
        );
    }

    info!("--- node 3 is in disk alarm: publishes through it are refused, naming the alarm");
    let status = alarmed.cluster_status().await?;
    assert_eq!(status.alarms, vec!["disk"], "{status:?}");
    assert!(ok.cluster_status().await?.alarms.is_empty());
    assert_status(
        alarmed.publish("", "alarm.q", message("refused")).await,
        Code::ResourceExhausted,
        "disk_free_limit",
    );

    info!("--- consumers keep draining through the node in alarm");
    assert_eq!(
        drain_exactly(&alarmed, "alarm.q", 3).await?,
        vec!["m0", "m1", "m2"]
    );
    cluster.stop();
    Ok(())
}

/// Story: an AMQP publisher on a node whose disk crosses `disk_free_limit` is told
/// connection.blocked (with the alarm as the reason) and is not read while the alarm lasts: its
/// publish is not enqueued. When the disk frees up it gets connection.unblocked and the held
/// publish is confirmed. The disk is a small tmpfs (root), filled and freed by the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amqp_publisher_is_blocked_while_the_disk_alarm_lasts() -> anyhow::Result<()> {
    const LIMIT: u64 = 16 << 20;
    let disk = Tmpfs::mount(64)?;
    let options = ClusterOptions {
        data_dir_for: vec![(3, disk.path().join("node3"))],
        extra_config_for: vec![(
            3,
            format!("disk_free_limit = {LIMIT}\nalarm_check_ms = 100"),
        )],
        ..Default::default()
    };
    let cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
    let grpc = cluster.client(3).await?;
    let conn = connect(&cluster, 3).await?;
    let mut events = Box::pin(conn.events_listener());
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    ch.queue_declare("blocked.q".into(), durable(), quorum())
        .await?;
    let publish = |body: &'static [u8]| {
        let ch = ch.clone();
        async move {
            ch.basic_publish(
                "".into(),
                "blocked.q".into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
        }
    };
    ensure!(publish(b"before").await?.await?.is_ack(), "first publish");

    info!("--- fill node 3's disk below disk_free_limit: the disk alarm goes on");
    let filler = disk.path().join("filler");
    let fill = disk.free_bytes()?.saturating_sub(LIMIT) + (4 << 20);
    std::fs::write(&filler, vec![0u8; fill as usize])?;
    eventually("node 3's disk alarm", WAIT, || async {
        Ok(grpc
            .cluster_status()
            .await?
            .alarms
            .contains(&"disk".to_string())
            .then_some(()))
    })
    .await?;

    info!("--- a publish now: connection.blocked naming the alarm, nothing enqueued");
    let held = publish(b"during").await?;
    let reason = tokio::time::timeout(WAIT, async {
        while let Some(event) = events.next().await {
            if let lapin::Event::ConnectionBlocked(reason) = event {
                return Some(reason);
            }
        }
        None
    })
    .await?
    .context("events ended without connection.blocked")?;
    ensure!(reason.contains("disk alarm"), "blocked reason: {reason}");
    ensure!(conn.status().blocked(), "lapin does not see the block");
    let queued = |q: Vec<qq_client::QueueInfo>| {
        q.into_iter()
            .find(|q| q.name == "blocked.q")
            .map_or(0, |q| q.messages)
    };
    ensure!(
        queued(grpc.list_queues().await?) == 1,
        "the publish sent while blocked was enqueued"
    );

    info!("--- free the disk: connection.unblocked, and the held publish is confirmed");
    std::fs::remove_file(&filler)?;
    tokio::time::timeout(WAIT, async {
        while let Some(event) = events.next().await {
            if matches!(event, lapin::Event::ConnectionUnblocked) {
                return Some(());
            }
        }
        None
    })
    .await?
    .context("events ended without connection.unblocked")?;
    ensure!(held.await?.is_ack(), "the held publish was not confirmed");
    assert_eq!(
        drain_exactly(&grpc, "blocked.q", 2).await?,
        vec!["before", "during"]
    );
    cluster.stop();
    Ok(())
}
