//! Story: the dead-letter workflows of issue 16 against a real three-node cluster: a consumer
//! rejects with a reason and the dead letter says why; a consumer requeues with a delay and the
//! message waits; a queue's `x-requeue-delays` back off by delivery count until the delivery
//! limit dead-letters the message; an operator browses a dead-letter queue without taking
//! anything; bad inputs are refused naming the field; and delayed messages survive the kill of
//! their queue's leader, whose successor re-arms the timer from the replicated state.
//!
//! Time: every assertion about a delay is a lower bound (a message never comes back before its
//! delay, measured from before the settle was sent) or an order; upper bounds are only the
//! generous waits of a test that would otherwise hang.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use qq_client::{
    Client, Consumer, Delivery, PublishOutcome, SettleOutcome, Value, ValueExt, death_summary,
    delivery_headers, message, table,
};
use qq_tests::{TestCluster, eventually, info};

use super::{assert_status, body, delivery_count};

const WAIT: Duration = Duration::from_secs(30);

async fn publish(c: &Client, queue: &str, text: &str) -> anyhow::Result<()> {
    let r = c.publish("", queue, message(text.to_string())).await?;
    ensure!(r.outcome == PublishOutcome::Confirmed, "{queue}: {r:?}");
    Ok(())
}

async fn next(consumer: &mut Consumer) -> anyhow::Result<Delivery> {
    tokio::time::timeout(WAIT, consumer.next())
        .await
        .context("no delivery within the wait")?
        .context("consume stream ended")?
        .map_err(Into::into)
}

/// Ends a subscription the way a careful client does: cancel, then read until the server
/// ends the stream, so every settle sent before is applied (dropping a consumer resets the
/// stream, and settles still in its send buffer are lost).
async fn close(mut consumer: Consumer) -> anyhow::Result<()> {
    consumer.cancel().await?;
    while let Some(d) = tokio::time::timeout(WAIT, consumer.next())
        .await
        .context("the stream did not end after cancel")?
    {
        d?;
    }
    Ok(())
}

/// A source queue dead-lettering through the default exchange to `dlq`, plus `extra`.
fn to_dlq(dlq: &str, extra: Vec<(&str, Value)>) -> HashMap<String, Value> {
    let mut args = table([
        ("x-dead-letter-exchange", Value::string("")),
        ("x-dead-letter-routing-key", Value::string(dlq)),
    ]);
    args.extend(extra.into_iter().map(|(k, v)| (k.to_string(), v)));
    args
}

fn header_str(d: &Delivery, name: &str) -> Option<String> {
    delivery_headers(d)
        .get(name)
        .and_then(|v| v.as_str())
        .map(str::to_string)
}

async fn wait_counts(
    c: &Client,
    queue: &str,
    what: &str,
    pred: impl Fn(&qq_client::QueueInfo) -> bool,
) -> anyhow::Result<qq_client::QueueInfo> {
    let pred = &pred;
    eventually(&format!("{queue}: {what}"), WAIT, || async move {
        let q = c.get_queue(queue).await?;
        Ok(pred(&q).then_some(q))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reject_reasons_delayed_requeues_and_browse() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    // Another node than the one most leaders may sit on: forwarding is part of the story.
    let c2 = cluster.client(2).await?;

    info!("--- a consumer rejects with a reason: the dead letter carries it");
    c.declare_queue("wf.dlq", HashMap::new()).await?;
    c.declare_queue("wf.orders", to_dlq("wf.dlq", vec![]))
        .await?;
    publish(&c, "wf.orders", "order-1").await?;
    publish(&c, "wf.orders", "order-2").await?;
    let mut consumer = c2.consume("wf.orders", 1).await?;
    let d = next(&mut consumer).await?;
    ensure!(body(&d) == "order-1");
    consumer
        .reject_with_reason(d.delivery_tag, "missing customer id")
        .await?;
    let d = next(&mut consumer).await?;
    ensure!(body(&d) == "order-2");
    consumer.ack(d.delivery_tag, false).await?;
    close(consumer).await?;
    wait_counts(&c, "wf.dlq", "the dead letter", |q| q.messages_ready == 1).await?;

    info!("--- browse shows the dead letter and its x-death without taking it");
    for _ in 0..2 {
        let b = c2.browse("wf.dlq", 0, 10).await?;
        ensure!(b.message_count == 1 && b.messages.len() == 1, "{b:?}");
        let m = &b.messages[0];
        ensure!(m.position == 0 && !m.redelivered, "{m:?}");
        let headers = m
            .message
            .as_ref()
            .and_then(|m| m.properties.as_ref())
            .map(|p| p.headers.clone())
            .unwrap_or_default();
        let deaths = death_summary(&headers);
        ensure!(deaths.len() == 1, "{deaths:?}");
        ensure!(
            (
                deaths[0].queue.as_str(),
                deaths[0].reason.as_str(),
                deaths[0].count
            ) == ("wf.orders", "rejected", 1),
            "{deaths:?}"
        );
        ensure!(deaths[0].reason_detail.as_deref() == Some("missing customer id"));
    }
    let q = c.get_queue("wf.dlq").await?;
    ensure!(q.messages_ready == 1, "browse took nothing: {q:?}");

    let got = c
        .get("wf.dlq", true, 0)
        .await?
        .delivery
        .context("dead letter")?;
    ensure!(body(&got) == "order-1");
    ensure!(
        header_str(&got, "x-last-death-detail").as_deref() == Some("missing customer id"),
        "{:?}",
        delivery_headers(&got)
    );
    ensure!(header_str(&got, "x-last-death-reason").as_deref() == Some("rejected"));

    info!("--- a Get receipt rejected with a reason over the unary Settle");
    publish(&c, "wf.orders", "order-3").await?;
    let r = c2.get("wf.orders", false, 60_000).await?;
    let d = r.delivery.context("order-3")?;
    c2.settle_with(
        vec![d.receipt.clone()],
        SettleOutcome::Reject,
        Some("ünïcode détail".into()),
        None,
    )
    .await?;
    let got = eventually("order-3 dead-lettered", WAIT, || async {
        Ok(c.get("wf.dlq", true, 0).await?.delivery)
    })
    .await?;
    ensure!(body(&got) == "order-3");
    ensure!(header_str(&got, "x-last-death-detail").as_deref() == Some("ünïcode détail"));

    info!("--- requeue with a delay: a later message overtakes it, it comes back after");
    c.declare_queue("wf.delay", HashMap::new()).await?;
    publish(&c, "wf.delay", "slow").await?;
    let mut consumer = c2.consume("wf.delay", 10).await?;
    let d = next(&mut consumer).await?;
    ensure!(body(&d) == "slow");
    let sent = Instant::now();
    consumer.requeue_after(d.delivery_tag, 3_000).await?;
    wait_counts(&c, "wf.delay", "one delayed message", |q| {
        q.messages_delayed == 1 && q.messages_ready == 0 && q.messages == 1
    })
    .await?;
    publish(&c, "wf.delay", "fast").await?;
    let d = next(&mut consumer).await?;
    ensure!(body(&d) == "fast", "the delayed message came back first");
    consumer.ack(d.delivery_tag, false).await?;
    let d = next(&mut consumer).await?;
    let waited = sent.elapsed();
    ensure!(body(&d) == "slow");
    ensure!(
        waited >= Duration::from_millis(3_000),
        "redelivered after {waited:?}, before its 3 s delay"
    );
    ensure!(d.redelivered && delivery_count(&d) == Some(1), "{d:?}");
    consumer.ack(d.delivery_tag, false).await?;
    close(consumer).await?;

    info!("--- x-requeue-delays back off by delivery count; the delivery limit dead-letters");
    c.declare_queue("wf.retry.dlq", HashMap::new()).await?;
    let delays = Value::list(vec![Value::long(500), Value::long(1_500)]);
    c.declare_queue(
        "wf.retry",
        to_dlq(
            "wf.retry.dlq",
            vec![
                ("x-requeue-delays", delays),
                ("x-delivery-limit", Value::long(2)),
            ],
        ),
    )
    .await?;
    let q = c.get_queue("wf.retry").await?;
    ensure!(
        q.effective.as_ref().map(|e| e.requeue_delays_ms.clone()) == Some(vec![500, 1_500]),
        "{q:?}"
    );
    publish(&c, "wf.retry", "job").await?;
    let mut consumer = c2.consume("wf.retry", 1).await?;
    let mut d = next(&mut consumer).await?;
    for (count, delay_ms) in [(1, 500), (2, 1_500)] {
        let sent = Instant::now();
        consumer.nack(d.delivery_tag, false, true).await?;
        d = next(&mut consumer).await?;
        let waited = sent.elapsed();
        ensure!(
            body(&d) == "job" && delivery_count(&d) == Some(count),
            "{d:?}"
        );
        ensure!(
            waited >= Duration::from_millis(delay_ms),
            "failed delivery {count} came back after {waited:?}, before {delay_ms} ms"
        );
    }
    // The third failed delivery is past x-delivery-limit 2.
    consumer.nack(d.delivery_tag, false, true).await?;
    let dead = eventually("job dead-lettered", WAIT, || async {
        Ok(c.get("wf.retry.dlq", true, 0).await?.delivery)
    })
    .await?;
    ensure!(header_str(&dead, "x-first-death-reason").as_deref() == Some("delivery_limit"));
    close(consumer).await?;

    info!("--- browse pages through a queue in order; the oldest message's age shows");
    c.declare_queue("wf.browse", HashMap::new()).await?;
    for i in 0..5 {
        publish(&c, "wf.browse", &format!("b{i}")).await?;
    }
    let confirmed = Instant::now();
    let b = c2.browse("wf.browse", 1, 2).await?;
    let seen: Vec<(u64, String)> = b
        .messages
        .iter()
        .map(|m| {
            let text = m
                .message
                .as_ref()
                .map(|m| String::from_utf8_lossy(&m.body).into_owned())
                .unwrap_or_default();
            (m.position, text)
        })
        .collect();
    ensure!(
        seen == vec![(1, "b1".to_string()), (2, "b2".to_string())],
        "{seen:?}"
    );
    ensure!(b.message_count == 5);
    ensure!(c.browse("wf.browse", 5, 10).await?.messages.is_empty());
    let q = c.get_queue("wf.browse").await?;
    let at_least = confirmed.elapsed().as_millis() as u64;
    ensure!(q.messages_ready == 5, "{q:?}");
    ensure!(
        q.oldest_message_age_ms >= at_least,
        "age {} ms, but b0 was enqueued more than {at_least} ms ago",
        q.oldest_message_age_ms
    );
    ensure!(c.get_queue("wf.delay").await?.oldest_message_age_ms == 0);

    info!("--- bad inputs are refused naming the field");
    publish(&c, "wf.browse", "b5").await?;
    let r = c.get("wf.browse", false, 60_000).await?;
    let receipt = r.delivery.context("b0")?.receipt;
    assert_status(
        c.settle_with(
            vec![receipt.clone()],
            SettleOutcome::Reject,
            Some("x".repeat(1_025)),
            None,
        )
        .await,
        tonic::Code::InvalidArgument,
        "reason_detail",
    );
    assert_status(
        c.settle_with(
            vec![receipt.clone()],
            SettleOutcome::Requeue,
            None,
            Some(8 * 24 * 3600 * 1000),
        )
        .await,
        tonic::Code::InvalidArgument,
        "delay_ms",
    );
    assert_status(
        c.settle_with(
            vec![receipt.clone()],
            SettleOutcome::Ack,
            Some("why".into()),
            None,
        )
        .await,
        tonic::Code::InvalidArgument,
        "reason_detail",
    );
    assert_status(
        c.settle_with(vec![receipt.clone()], SettleOutcome::Reject, None, Some(5))
            .await,
        tonic::Code::InvalidArgument,
        "delay_ms",
    );
    // Nothing was applied: the lease still holds the message and settles normally.
    c.settle(vec![receipt], SettleOutcome::Ack).await?;
    assert_status(
        c.browse("wf.browse", 0, 5_000).await,
        tonic::Code::InvalidArgument,
        "limit",
    );
    // Browse needs read on the queue, as Get does.
    c.put_user("wf-writer", "wf-pw", vec![]).await?;
    c.set_permissions("wf-writer", "/", ".*", ".*", "^$")
        .await?;
    let writer = cluster
        .client(2)
        .await?
        .with_credentials("wf-writer", "wf-pw")?;
    assert_status(
        writer.browse("wf.browse", 0, 5).await,
        tonic::Code::PermissionDenied,
        "no read permission on 'wf.browse'",
    );
    for (value, why) in [
        (Value::string("500,1000"), "x-requeue-delays"),
        (Value::list(vec![Value::long(-1)]), "entry 0 is -1"),
        (Value::list(vec![Value::long(1); 33]), "33 delays"),
        (
            Value::list(vec![Value::long(8 * 24 * 3600 * 1000)]),
            "x-requeue-delays",
        ),
    ] {
        assert_status(
            c.declare_queue("wf.bad", table([("x-requeue-delays", value)]))
                .await,
            tonic::Code::InvalidArgument,
            why,
        );
    }
    assert_status(
        c.set_policy(
            "bad",
            "^wf\\.",
            "queues",
            0,
            table([("requeue-delays", Value::long(5))]),
        )
        .await,
        tonic::Code::InvalidArgument,
        "requeue-delays",
    );
    // On a consume stream, a bad option ends the stream with INVALID_ARGUMENT.
    let mut consumer = c2.consume("wf.browse", 1).await?;
    let d = next(&mut consumer).await?;
    consumer
        .settle_with(
            vec![d.delivery_tag],
            false,
            SettleOutcome::Reject,
            Some("y".repeat(2_000)),
            None,
        )
        .await?;
    let end = tokio::time::timeout(WAIT, consumer.next())
        .await
        .context("the stream did not end")?
        .context("the stream ended without a status")?;
    assert_status(end, tonic::Code::InvalidArgument, "settle.reason_detail");
    // The refused settle did nothing: the message went back when the stream ended.
    wait_counts(&c, "wf.browse", "the message back", |q| {
        q.messages_ready == 5 && q.messages_unacked == 0
    })
    .await?;

    info!("--- a policy sets requeue-delays on existing queues, shown as effective");
    c.set_policy(
        "retry",
        "^wf\\.delay$",
        "queues",
        0,
        table([("requeue-delays", Value::list(vec![Value::long(250)]))]),
    )
    .await?;
    wait_counts(&c, "wf.delay", "the policy's delays", |q| {
        q.effective.as_ref().map(|e| e.requeue_delays_ms.clone()) == Some(vec![250])
    })
    .await?;
    // ... and a plain requeue now waits for them.
    publish(&c, "wf.delay", "retried").await?;
    let mut consumer = c2.consume("wf.delay", 1).await?;
    let d = next(&mut consumer).await?;
    let sent = Instant::now();
    consumer.nack(d.delivery_tag, false, true).await?;
    let d = next(&mut consumer).await?;
    let waited = sent.elapsed();
    ensure!(
        body(&d) == "retried" && delivery_count(&d) == Some(1),
        "{d:?}"
    );
    ensure!(
        waited >= Duration::from_millis(250),
        "came back after {waited:?}, before the policy's 250 ms"
    );
    consumer.ack(d.delivery_tag, false).await?;
    close(consumer).await?;
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delayed_messages_survive_a_leader_kill() -> anyhow::Result<()> {
    const DELAY_MS: u64 = 10_000;
    let mut cluster = TestCluster::start(3).await?;
    let queue = "wf.failover";
    let c = cluster.client(1).await?;
    c.declare_queue(queue, HashMap::new()).await?;
    publish(&c, queue, "f1").await?;
    publish(&c, queue, "f2").await?;

    info!("--- f1 is requeued with a {DELAY_MS} ms delay");
    let d = c.get(queue, false, 60_000).await?.delivery.context("f1")?;
    ensure!(body(&d) == "f1");
    let sent = Instant::now();
    c.settle_with(
        vec![d.receipt],
        SettleOutcome::Requeue,
        None,
        Some(DELAY_MS),
    )
    .await?;
    let q = c.get_queue(queue).await?;
    ensure!(q.messages_delayed == 1 && q.messages_ready == 1, "{q:?}");

    info!("--- the queue's leader is killed");
    let old = cluster.leader_of(queue).await?;
    cluster.kill9(old);
    let new = cluster.leader_of_except(queue, old).await?;
    info!(old, new, "--- new leader");
    let survivor = cluster.others(old)[0];
    let c = cluster.client(survivor).await?;
    // The delayed message is replicated state: both are still in the queue.
    wait_counts(&c, queue, "both messages on the new leader", |q| {
        q.leader == new && q.messages == 2
    })
    .await?;

    info!("--- a consumer gets f2 at once and f1 only after its delay (the new leader's timer)");
    let mut consumer = c.consume(queue, 10).await?;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let d = next(&mut consumer).await?;
        let at = sent.elapsed();
        consumer.ack(d.delivery_tag, false).await?;
        if body(&d) == "f1" {
            ensure!(
                at >= Duration::from_millis(DELAY_MS),
                "f1 delivered {at:?} after its requeue, before the {DELAY_MS} ms delay"
            );
            ensure!(d.redelivered && delivery_count(&d) == Some(1), "{d:?}");
        }
        seen.push(body(&d));
    }
    seen.sort();
    ensure!(seen == ["f1", "f2"], "{seen:?}");
    wait_counts(&c, queue, "empty", |q| q.messages == 0).await?;
    cluster.stop();
    Ok(())
}
