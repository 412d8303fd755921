//! Delivery counting over AMQP as RabbitMQ 4.3: `basic.nack` with requeue hands a message back
//! without counting a failed delivery (only `x-acquired-count` grows), `basic.reject` with
//! requeue counts one (`x-delivery-count` and `x-acquired-count` grow), and only failed
//! deliveries reach the delivery limit.

use std::time::Duration;

use anyhow::{Context, ensure};
use futures::StreamExt;
use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, BasicRejectOptions, ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use qq_tests::{TestCluster, eventually, info};

use super::amqp::{WAIT, connect, declare, quorum};

/// `queue` runs machine version 2 on every node (its leader moves it there once it knows every
/// member runs this release).
async fn wait_machine_version_2(cluster: &TestCluster, queue: &str) -> anyhow::Result<()> {
    let line = format!("quorumq_queue_machine_version{{vhost=\"/\",queue=\"{queue}\"}} 2");
    let what = format!("{queue} at machine version 2");
    cluster.wait_metric_line_everywhere(&line, &what).await
}

/// (redelivered, x-delivery-count, x-acquired-count) of a delivery.
fn counts(d: &Delivery) -> (bool, Option<i64>, Option<i64>) {
    let header = |name: &str| {
        d.properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(name).cloned())
            .map(|v| match v {
                AMQPValue::LongLongInt(n) => n,
                other => panic!("{name}: {other:?}"),
            })
    };
    (
        d.redelivered,
        header("x-delivery-count"),
        header("x-acquired-count"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_is_not_a_failed_delivery_and_a_reject_is() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let conn = connect(&cluster, 2).await?;
    let ch = conn.create_channel().await?;
    let mut args = quorum();
    args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(1));
    declare(&ch, "counted", args).await?;
    wait_machine_version_2(&cluster, "counted").await?;

    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let confirm = ch
        .basic_publish(
            "".into(),
            "counted".into(),
            BasicPublishOptions::default(),
            b"m",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?
        .await?;
    ensure!(confirm.is_ack(), "{confirm:?}");
    ch.basic_qos(1, BasicQosOptions::default()).await?;
    let mut consumer = ch
        .basic_consume(
            "counted".into(),
            "counter".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut next = async || -> anyhow::Result<Delivery> {
        let d = tokio::time::timeout(WAIT, consumer.next())
            .await
            .context("no delivery")?
            .context("the consumer ended")??;
        Ok(d)
    };

    info!("--- the first delivery has neither count");
    let mut d = next().await?;
    ensure!(counts(&d) == (false, None, None), "{:?}", counts(&d));

    info!("--- three nacks with requeue: acquired 1, 2, 3, never failed");
    for n in 1..=3 {
        d.nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await?;
        let again = next().await?;
        ensure!(
            counts(&again) == (true, None, Some(n)),
            "after nack {n}: {:?}",
            counts(&again)
        );
        d = again;
    }

    info!("--- a reject with requeue is a failed delivery");
    d.reject(BasicRejectOptions { requeue: true }).await?;
    let d = next().await?;
    ensure!(counts(&d) == (true, Some(1), Some(4)), "{:?}", counts(&d));

    info!("--- a second failure is past the delivery limit of 1: the message is gone");
    d.reject(BasicRejectOptions { requeue: true }).await?;
    let c = cluster.client(1).await?;
    eventually(
        "the message to be dropped",
        Duration::from_secs(20),
        || async {
            let q = c.get_queue("counted").await?;
            Ok((q.messages_ready == 0 && q.messages_unacked == 0).then_some(()))
        },
    )
    .await?;

    info!("--- basic.get: a nack with requeue is a release there too");
    ch.basic_cancel("counter".into(), BasicCancelOptions::default())
        .await?;
    drop(consumer);
    let confirm = ch
        .basic_publish(
            "".into(),
            "counted".into(),
            BasicPublishOptions::default(),
            b"g",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?
        .await?;
    ensure!(confirm.is_ack(), "{confirm:?}");
    for n in 0..3 {
        let got = ch
            .basic_get("counted".into(), BasicGetOptions { no_ack: false })
            .await?
            .context("the message is there")?;
        let d = &got.delivery;
        // RabbitMQ's quorum queues put x-delivery-count 0 on every basic.get.
        let acquired = (n > 0).then_some(n);
        ensure!(
            counts(d) == (n > 0, Some(0), acquired),
            "get {n}: {:?}",
            counts(d)
        );
        d.nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await?;
    }
    conn.close(200, "bye".into()).await?;
    cluster.stop();
    Ok(())
}

/// The gRPC `RELEASE` outcome, on a Get receipt and on a consume stream: back to the queue
/// without a failed delivery, so a queue with `x-delivery-limit` 1 keeps the message however
/// often it is released (`x-acquired-count` grows, `x-delivery-count` stays absent); then two
/// `REQUEUE`s take its delivery count above the limit and the message is gone. A Get's
/// message carries `x-acquired-count` as a consumer's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_release_is_not_a_failed_delivery() -> anyhow::Result<()> {
    use qq_client::{SettleOutcome, Value, ValueExt, delivery_headers, message, table};

    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    c.declare_queue("released", table([("x-delivery-limit", Value::long(1))]))
        .await?;
    wait_machine_version_2(&cluster, "released").await?;
    let r = c.publish("", "released", message("m")).await?;
    ensure!(r.is_confirmed(), "{r:?}");
    let header = |d: &qq_client::Delivery, name: &str| {
        delivery_headers(d).get(name).and_then(|v| v.as_long())
    };

    info!("--- three Get + RELEASE: the message stays");
    for n in 1..=3i64 {
        let got = c.get("released", false, 30_000).await?;
        let d = got.delivery.context("the message is there")?;
        ensure!(header(&d, "x-delivery-count").is_none(), "get {n}: {d:?}");
        // Each release before was a hand-out too (absent the first time, as on a consumer).
        let acquired = (n > 1).then_some(n - 1);
        ensure!(
            header(&d, "x-acquired-count") == acquired,
            "get {n}: x-acquired-count {:?}",
            header(&d, "x-acquired-count")
        );
        c.settle(vec![d.receipt.clone()], SettleOutcome::Release)
            .await?;
    }

    info!("--- a consumer releases it twice, then requeues it twice: above the limit of 1");
    let mut consumer = c.consume("released", 1).await?;
    for n in 0..4 {
        let d = tokio::time::timeout(WAIT, consumer.next())
            .await
            .context("no delivery")?
            .context("the stream ended")??;
        // Three Get leases and the releases so far were each a hand-out.
        ensure!(
            header(&d, "x-acquired-count") == Some(3 + n),
            "delivery {n}: x-acquired-count {:?}",
            header(&d, "x-acquired-count")
        );
        let failed = (n == 3).then_some(1);
        ensure!(
            header(&d, "x-delivery-count") == failed,
            "delivery {n}: x-delivery-count {:?}",
            header(&d, "x-delivery-count")
        );
        let outcome = if n < 2 {
            SettleOutcome::Release
        } else {
            SettleOutcome::Requeue
        };
        consumer
            .settle_with(vec![d.delivery_tag], false, outcome, None, None)
            .await?;
    }
    eventually(
        "the message gone at its delivery limit",
        Duration::from_secs(20),
        || async { Ok((c.get_queue("released").await?.messages == 0).then_some(())) },
    )
    .await?;
    cluster.stop();
    Ok(())
}
