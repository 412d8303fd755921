//! Consumer priorities (`x-priority`) through both protocols: a higher-priority consumer
//! (AMQP basic.consume argument, or gRPC `Subscribe.arguments`) takes every message while it
//! has credit; the lower one gets messages once it has none; a priority that is not a whole
//! number is refused with INVALID_ARGUMENT.

use std::time::Duration;

use anyhow::{Context, ensure};
use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use qq_client::{Subscribe, Value, ValueExt, message, table};
use qq_tests::TestCluster;

use super::amqp::{WAIT, connect};

const QUEUE: &str = "prio";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_higher_priority_consumer_is_served_first() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let grpc = cluster.client(2).await?;
    grpc.declare_queue(QUEUE, Default::default()).await?;
    // A new queue starts at machine version 1 and its leader moves it to 2 once it has heard
    // every member's version (moments after the cluster formed): priorities need 2.
    super::rolling_upgrade::wait_machine_version(&cluster, QUEUE, 2).await?;

    // Low priority (0) over gRPC on node 2, with room for everything.
    let mut low = grpc
        .consume_with(Subscribe {
            queue: QUEUE.into(),
            prefetch_count: 100,
            ..Default::default()
        })
        .await?;
    // High priority (5) over AMQP on node 1, with a prefetch of 3.
    let conn = connect(&cluster, 1).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(3, BasicQosOptions::default()).await?;
    let mut args = FieldTable::default();
    args.insert("x-priority".into(), AMQPValue::LongInt(5));
    let mut high = ch
        .basic_consume(
            QUEUE.into(),
            "high".into(),
            BasicConsumeOptions::default(),
            args,
        )
        .await?;

    for i in 0..5 {
        grpc.publish("", QUEUE, message(format!("m{i}"))).await?;
    }
    // The first three go to the high-priority consumer (its prefetch), the rest to the low one.
    let mut to_high = Vec::new();
    for _ in 0..3 {
        let d = tokio::time::timeout(WAIT, high.next())
            .await
            .context("high: no delivery")?
            .context("high: stream ended")??;
        to_high.push(String::from_utf8(d.data.clone())?);
    }
    let mut to_low = Vec::new();
    for _ in 0..2 {
        let d = low.next_timeout(WAIT).await?.context("low: no delivery")?;
        to_low.push(String::from_utf8(qq_client::delivery_body(&d).to_vec())?);
    }
    ensure!(to_high == ["m0", "m1", "m2"], "high got {to_high:?}");
    ensure!(to_low == ["m3", "m4"], "low got {to_low:?}");
    ensure!(
        tokio::time::timeout(Duration::from_millis(500), high.next())
            .await
            .is_err(),
        "high got a fourth beyond its prefetch"
    );

    // A priority that is not a whole number is refused, naming the field.
    let bad = grpc
        .consume_with(Subscribe {
            queue: QUEUE.into(),
            arguments: table([("x-priority", Value::string("high"))]),
            ..Default::default()
        })
        .await;
    let status = match bad {
        Err(qq_client::Error::Status(s)) => s,
        other => anyhow::bail!("a text x-priority was not refused: {:?}", other.map(|_| ())),
    };
    ensure!(
        status.code() == tonic::Code::InvalidArgument && status.message().contains("x-priority"),
        "{status:?}"
    );
    conn.close(200, "done".into()).await?;
    cluster.stop();
    Ok(())
}
