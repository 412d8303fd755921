//! Consumer timeouts (`x-consumer-timeout`, RabbitMQ 4.3's quorum queues): a consumer that
//! holds a message longer than the queue's timeout is cancelled with a reason naming the
//! timeout (gRPC `cancelled`, AMQP basic.cancel from the server), and what it held goes back
//! to the queue, redelivered to the next consumer (released, not failed: `x-acquired-count` 1
//! and no `x-delivery-count`, as RabbitMQ 4.3).

use std::time::Duration;

use anyhow::{Context, ensure};
use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use qq_client::{Value, ValueExt, message, table};
use qq_tests::{TestCluster, eventually};

use super::amqp::{WAIT, connect};

/// `queue`'s consumer timeout on every node, from the metrics, is `ms`.
async fn wait_timeout_in_effect(cluster: &TestCluster, queue: &str, ms: u64) -> anyhow::Result<()> {
    let line = format!("quorumq_queue_consumer_timeout_ms{{vhost=\"/\",queue=\"{queue}\"}} {ms}");
    let what = format!("the consumer timeout of {queue} applied");
    cluster.wait_metric_line_everywhere(&line, &what).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_holds_a_message_too_long_is_cancelled_and_the_message_returns()
-> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    let args = table([("x-consumer-timeout", Value::long(1_000))]);
    c.declare_queue("slow", args).await?;
    // A timeout that is not a whole number of ms, or is 0, is refused at declare.
    let bad = c
        .declare_queue("bad", table([("x-consumer-timeout", Value::long(0))]))
        .await;
    ensure!(bad.is_err(), "x-consumer-timeout 0 was accepted");
    wait_timeout_in_effect(&cluster, "slow", 1_000).await?;

    info_step("gRPC: the consumer does not ack; it is cancelled after about a second");
    c.publish("", "slow", message("m1")).await?;
    let mut sleepy = c.consume("slow", 1).await?;
    let first = sleepy.next_timeout(WAIT).await?.context("no delivery")?;
    ensure!(!first.redelivered, "{first:?}");
    let started = tokio::time::Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(20), sleepy.next()).await?;
    ensure!(end.is_none(), "expected the stream to end, got {end:?}");
    let reason = sleepy.cancel_reason().unwrap_or_default().to_string();
    ensure!(reason.contains("consumer timeout"), "reason: {reason}");
    ensure!(
        started.elapsed() >= Duration::from_millis(500),
        "cancelled after {:?}, before the timeout",
        started.elapsed()
    );
    let mut next = c.consume("slow", 1).await?;
    let again = next.next_timeout(WAIT).await?.context("not redelivered")?;
    ensure!(
        qq_client::delivery_body(&again).as_ref() == b"m1",
        "{again:?}"
    );
    ensure!(again.redelivered, "{again:?}");
    next.ack(again.delivery_tag, false).await?;
    // The ack travels on the stream: wait until it is applied before the stream closes.
    eventually("m1 acked", Duration::from_secs(20), || async {
        let q = c.get_queue("slow").await?;
        Ok((q.messages_ready == 0 && q.messages_unacked == 0).then_some(()))
    })
    .await?;
    drop(next);

    info_step("AMQP: the server cancels the consumer (basic.cancel)");
    let conn = connect(&cluster, 2).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(1, BasicQosOptions::default()).await?;
    c.publish("", "slow", message("m2")).await?;
    let mut consumer = ch
        .basic_consume(
            "slow".into(),
            "sleepy".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let d = tokio::time::timeout(WAIT, consumer.next())
        .await?
        .context("no delivery")??;
    ensure!(d.data == b"m2");
    // lapin ends the consumer's stream when the server cancels it.
    let ended = tokio::time::timeout(Duration::from_secs(20), consumer.next()).await?;
    ensure!(ended.is_none(), "expected the consumer to be cancelled");
    let mut next = c.consume("slow", 1).await?;
    let again = next
        .next_timeout(WAIT)
        .await?
        .context("m2 not redelivered")?;
    ensure!(
        qq_client::delivery_body(&again).as_ref() == b"m2",
        "{again:?}"
    );
    next.ack(again.delivery_tag, false).await?;
    conn.close(200, "done".into()).await?;
    cluster.stop();
    Ok(())
}

fn info_step(what: &str) {
    qq_tests::info!("--- {what}");
}
