//! Story: a node whose disk (or memory) is past its bound refuses publishes, names the alarm,
//! and keeps its consumers draining; `ClusterStatus` shows the alarm.
//!
//! The disk alarm is set deterministically with a `disk_free_limit` larger than any disk on
//! node 3 only; nodes 1 and 2 keep the default.

use qq_client::message;
use qq_tests::{ClusterOptions, RaftSettings, TestCluster, info};
use tonic::Code;

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
