//! basic.cancel over AMQP as RabbitMQ's quorum queues do it: the cancelled consumer takes
//! nothing more, and what it holds stays with its channel until the client settles it (acks,
//! rejects or requeues), or until the channel closes.

use anyhow::{Context, ensure};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Consumer};
use qq_tests::{TestCluster, eventually};

use super::amqp::{WAIT, connect, declare, quorum};
use super::amqp_raw::{Raw, close_args, consume_args, qos, shortstr};

async fn publish(ch: &Channel, queue: &str, body: &str) -> anyhow::Result<()> {
    let confirm = ch
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            body.as_bytes(),
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?
        .await?;
    ensure!(confirm.is_ack(), "publish of {body} not confirmed");
    Ok(())
}

/// A connection to node 1, and a channel of it in confirm mode on which `queue` is declared.
async fn publishing_to(
    cluster: &TestCluster,
    queue: &str,
) -> anyhow::Result<(lapin::Connection, Channel)> {
    let conn = connect(cluster, 1).await?;
    let publisher = conn.create_channel().await?;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    declare(&publisher, queue, quorum()).await?;
    Ok((conn, publisher))
}

/// Consumer "a" on `queue`, with manual acks.
async fn manual_consumer(ch: &Channel, queue: &str) -> anyhow::Result<Consumer> {
    Ok(ch
        .basic_consume(
            queue.into(),
            "a".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?)
}

/// `queue`'s ready messages and consumers, by a passive declare.
async fn counts(ch: &Channel, queue: &str) -> anyhow::Result<(u32, u32)> {
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok((q.message_count(), q.consumer_count()))
}

/// Consumer "b" on `queue`, without acks.
async fn auto_ack_consumer(ch: &Channel, queue: &str) -> anyhow::Result<Consumer> {
    let options = BasicConsumeOptions {
        no_ack: true,
        ..Default::default()
    };
    Ok(ch
        .basic_consume(queue.into(), "b".into(), options, FieldTable::default())
        .await?)
}

/// The next delivery of `consumer`: (delivery tag, body, redelivered).
async fn next(consumer: &mut Consumer) -> anyhow::Result<(u64, String, bool)> {
    let d = tokio::time::timeout(WAIT, consumer.next())
        .await
        .context("no delivery in time")?
        .context("consumer ended")??;
    Ok((
        d.delivery_tag,
        String::from_utf8_lossy(&d.data).into_owned(),
        d.redelivered,
    ))
}

/// Deliveries of `consumer` up to and including the one whose body is `marker`.
async fn until(consumer: &mut Consumer, marker: &str) -> anyhow::Result<Vec<(String, bool)>> {
    let mut got = Vec::new();
    loop {
        let (_, body, redelivered) = next(consumer).await?;
        let done = body == marker;
        got.push((body, redelivered));
        if done {
            return Ok(got);
        }
    }
}

/// Consumer A holds three messages when it is cancelled. A second consumer B gets only what
/// was ready, not A's three; A then acks two and requeues one after its cancel-ok (neither is
/// an unknown delivery tag), B gets the requeued one, and once A's channel closes nothing more
/// comes back. On a node that does not lead the queue (relayed) and on the one that does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_consumer_keeps_what_it_holds_until_it_settles() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    for node in [1, 2] {
        let conn = connect(&cluster, node).await?;
        let queue = format!("cancel-holds-{node}");
        let publisher = conn.create_channel().await?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        declare(&publisher, &queue, quorum()).await?;

        let a = conn.create_channel().await?;
        a.basic_qos(3, BasicQosOptions::default()).await?;
        let mut consumer_a = manual_consumer(&a, &queue).await?;
        for i in 0..5 {
            publish(&publisher, &queue, &format!("m{i}")).await?;
        }
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(next(&mut consumer_a).await?);
        }
        let bodies: Vec<&str> = held.iter().map(|h| h.1.as_str()).collect();
        ensure!(
            bodies == ["m0", "m1", "m2"],
            "node {node}: A got {bodies:?}"
        );
        a.basic_cancel("a".into(), BasicCancelOptions::default())
            .await?;

        // B sees the two that were ready, then a marker published after the cancel: none of
        // A's three went back to the queue.
        let b = conn.create_channel().await?;
        let mut consumer_b = auto_ack_consumer(&b, &queue).await?;
        publish(&publisher, &queue, "marker-1").await?;
        let got = until(&mut consumer_b, "marker-1").await?;
        let expected: Vec<(String, bool)> = ["m3", "m4", "marker-1"]
            .iter()
            .map(|b| (b.to_string(), false))
            .collect();
        ensure!(
            got == expected,
            "node {node}: B got {got:?} while A held three"
        );

        // A settles after its cancel: two acks and a requeue, which B gets redelivered.
        a.basic_ack(held[0].0, BasicAckOptions::default()).await?;
        a.basic_nack(
            held[1].0,
            BasicNackOptions {
                requeue: true,
                ..Default::default()
            },
        )
        .await?;
        a.basic_ack(held[2].0, BasicAckOptions::default()).await?;
        let (_, body, redelivered) = next(&mut consumer_b).await?;
        ensure!(
            body == "m1" && redelivered,
            "node {node}: B got {body} (redelivered {redelivered}) after A's requeue"
        );
        // A's acks took effect while its channel is still open: the queue holds nothing
        // (no unacked left with A), and when the channel closes nothing comes back.
        let grpc = cluster.client(node).await?;
        eventually("A's acks to empty the queue", WAIT, || async {
            let q = grpc.get_queue(&queue).await?;
            Ok((q.messages == 0).then_some(()))
        })
        .await?;
        a.close(200, "done".into()).await?;
        publish(&publisher, &queue, "marker-2").await?;
        let got = until(&mut consumer_b, "marker-2").await?;
        ensure!(
            got == [("marker-2".to_string(), false)],
            "node {node}: after A's channel closed B got {got:?}"
        );
        let (ready, consumers) = counts(&publisher, &queue).await?;
        ensure!(
            ready == 0 && consumers == 1,
            "node {node}: {ready} ready, {consumers} consumers at the end"
        );
        conn.close(200, "done".into()).await?;
    }
    cluster.stop();
    Ok(())
}

/// A cancelled consumer's channel closes while it still holds messages: they go back to the
/// queue (redelivered), as when any consumer's channel closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_cancelled_consumer_holds_returns_when_its_channel_closes() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let queue = "cancel-then-close";
    let (conn, publisher) = publishing_to(&cluster, queue).await?;
    let a = conn.create_channel().await?;
    let mut consumer_a = manual_consumer(&a, queue).await?;
    publish(&publisher, queue, "m0").await?;
    next(&mut consumer_a).await?;
    a.basic_cancel("a".into(), BasicCancelOptions::default())
        .await?;
    a.close(200, "done".into()).await?;
    let b = conn.create_channel().await?;
    let mut consumer_b = auto_ack_consumer(&b, queue).await?;
    let (_, body, redelivered) = next(&mut consumer_b).await?;
    ensure!(
        body == "m0" && redelivered,
        "B got {body} (redelivered {redelivered})"
    );
    cluster.stop();
    Ok(())
}

/// Fifty acks sent one by one right before channel.close are all kept: the channel runs its
/// frames in order, so every ack reaches the consumer's session before the close returns what
/// the session still holds. Once the queue has no consumer left, a marker published then is
/// the first thing a new consumer gets (a returned message would come before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_sent_just_before_a_close_are_kept() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let queue = "acks-before-close";
    let (conn, publisher) = publishing_to(&cluster, queue).await?;
    for i in 0..50 {
        publish(&publisher, queue, &format!("m{i}")).await?;
    }
    let a = conn.create_channel().await?;
    a.basic_qos(100, BasicQosOptions::default()).await?;
    let mut consumer = manual_consumer(&a, queue).await?;
    let mut tags = Vec::new();
    for _ in 0..50 {
        tags.push(next(&mut consumer).await?.0);
    }
    for tag in tags {
        a.basic_ack(tag, BasicAckOptions::default()).await?;
    }
    a.close(200, "done".into()).await?;
    // Once the queue has no consumer, whatever A's session held and was not acked is back.
    eventually("A's consumer gone from the queue", WAIT, || async {
        let (ready, consumers) = counts(&publisher, queue).await?;
        Ok((consumers == 0).then_some(ready))
    })
    .await?;
    publish(&publisher, queue, "marker").await?;
    let b = conn.create_channel().await?;
    let mut fresh = auto_ack_consumer(&b, queue).await?;
    let (_, body, redelivered) = next(&mut fresh).await?;
    ensure!(
        body == "marker" && !redelivered,
        "an acked message came back after the close: {body} (redelivered {redelivered})"
    );
    cluster.stop();
    Ok(())
}

/// Nothing of a closed channel's consumer comes after its close-ok: a delivery under way when
/// channel.close arrives goes out before close-ok, later ones not at all (lapin fails a
/// basic.deliver for a channel it closed: "invalid channel state: Closed"). Twenty rounds of
/// closing a channel while its consumer (prefetch 500) receives a backlog of 2 000 messages,
/// on a raw socket so that every frame is seen in order; after each close-ok, channel 2 is
/// opened and closed, and channel 1 opened again, each answer the next frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_of_a_closed_channel_follows_its_close_ok() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let queue = "close-while-delivering";
    let (_conn, publisher) = publishing_to(&cluster, queue).await?;
    let body = vec![b'x'; 1024];
    let mut confirms = Vec::new();
    for _ in 0..2000 {
        let props = BasicProperties::default().with_delivery_mode(2);
        let options = BasicPublishOptions::default();
        confirms.push(
            publisher
                .basic_publish("".into(), queue.into(), options, &body, props)
                .await?,
        );
    }
    for confirm in confirms {
        ensure!(confirm.await?.is_ack(), "a publish was not confirmed");
    }
    let mut raw = Raw::open(cluster.amqp_address(1)).await?;
    let open = shortstr("");
    for round in 0..20 {
        raw.send_method(1, 20, 10, &open, "channel.open").await?;
        raw.expect_method(1, (20, 11), &format!("round {round}: channel.open-ok"))
            .await?;
        raw.send_method(1, 60, 10, &qos(0, 500), "basic.qos")
            .await?;
        raw.expect_method(1, (60, 11), "basic.qos-ok").await?;
        raw.send_method(1, 60, 20, &consume_args(queue), "basic.consume")
            .await?;
        raw.expect_method(1, (60, 21), "basic.consume-ok").await?;
        // The first delivery: more are on their way when the close goes out.
        raw.expect_method(1, (60, 60), "basic.deliver").await?;
        raw.send_method(1, 20, 40, &close_args(), "channel.close")
            .await?;
        raw.skip_to_method(1, (20, 41), "channel.close-ok").await?;
        raw.send_method(2, 20, 10, &open, "channel.open").await?;
        let what = format!("round {round}: channel.open-ok on 2, right after close-ok on 1");
        raw.expect_method(2, (20, 11), &what).await?;
        raw.send_method(2, 20, 40, &close_args(), "channel.close")
            .await?;
        raw.expect_method(2, (20, 41), "channel.close-ok on 2")
            .await?;
    }
    cluster.stop();
    Ok(())
}
