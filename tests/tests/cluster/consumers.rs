//! Story: a consumer attached to a follower gets its deliveries relayed from the leader, and
//! every way of settling behaves as docs/api.md and docs/semantics.md say: ack removes, requeue returns
//! the message to the head marked `redelivered` with `x-delivery-count`, reject removes it (no
//! dead-letter exchange here), `multiple` covers every earlier tag, and a closed stream returns
//! what it held.

use std::time::Duration;

use anyhow::Context;
use qq_client::{Consumer, Delivery, PublishOutcome, SettleOutcome, message};
use qq_tests::{TestCluster, eventually, info};

use super::{body, delivery_count};

async fn next(consumer: &mut Consumer) -> anyhow::Result<Delivery> {
    tokio::time::timeout(Duration::from_secs(20), consumer.next())
        .await
        .context("no delivery within 20 s")?
        .context("consume stream ended")?
        .map_err(Into::into)
}

/// Waits until the queue's counts are (ready, unacked).
async fn counts(
    c: &qq_client::Client,
    queue: &str,
    ready: u64,
    unacked: u64,
) -> anyhow::Result<()> {
    eventually(
        &format!("{queue} to have {ready} ready and {unacked} unacked"),
        Duration::from_secs(20),
        || async move {
            let q = c.get_queue(queue).await?;
            Ok((q.messages_ready == ready && q.messages_unacked == unacked).then_some(()))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_consumer_ack_requeue_reject() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let setup = cluster.client(1).await?;
    setup.declare_queue("work", Default::default()).await?;
    let leader = cluster.leader_of("work").await?;
    let follower = cluster.others(leader)[0];
    info!(
        leader,
        follower, "--- consumer on follower node {follower}, leader is node {leader}"
    );
    let on_follower = cluster.client(follower).await?;
    let mut consumer = on_follower.consume("work", 10).await?;
    assert!(
        !consumer.consumer_tag().is_empty(),
        "the server names the consumer"
    );

    info!("--- publish five messages through the leader");
    let on_leader = cluster.client(leader).await?;
    for i in 0..5 {
        let c = on_leader
            .publish("", "work", message(format!("w{i}")))
            .await?;
        assert_eq!(c.outcome, PublishOutcome::Confirmed);
    }
    let mut ds = Vec::new();
    for _ in 0..5 {
        ds.push(next(&mut consumer).await?);
    }
    let bodies: Vec<String> = ds.iter().map(body).collect();
    assert_eq!(
        bodies,
        ["w0", "w1", "w2", "w3", "w4"],
        "FIFO to a single consumer"
    );
    for d in &ds {
        assert!(
            !d.redelivered,
            "first delivery of {} is not redelivered",
            body(d)
        );
        assert_eq!(
            delivery_count(d).unwrap_or(0),
            0,
            "no failed deliveries yet for {}",
            body(d)
        );
        assert_eq!(d.routing_key, "work");
    }
    counts(&setup, "work", 0, 5).await?;

    info!("--- ack w0, requeue w1, reject w2");
    consumer.ack(ds[0].delivery_tag, false).await?;
    consumer.nack(ds[1].delivery_tag, false, true).await?;
    consumer.reject(ds[2].delivery_tag).await?;
    let again = next(&mut consumer).await?;
    assert_eq!(body(&again), "w1", "the requeued message comes back");
    assert!(again.redelivered, "a requeued message is redelivered");
    assert_eq!(
        delivery_count(&again),
        Some(1),
        "x-delivery-count counts the failed delivery"
    );
    assert_ne!(
        again.delivery_tag, ds[1].delivery_tag,
        "a redelivery gets a new tag"
    );

    info!("--- ack w3 and w4 with one multiple ack, then w1");
    consumer.ack(ds[4].delivery_tag, true).await?;
    consumer.ack(again.delivery_tag, false).await?;
    counts(&setup, "work", 0, 0).await?;
    let q = setup.get_queue("work").await?;
    assert_eq!(q.messages, 0, "reject removed w2 (no DLX): {q:?}");
    assert_eq!(q.consumers, 1, "{q:?}");

    info!("--- closing the stream returns unsettled deliveries");
    for i in 0..3 {
        on_leader
            .publish("", "work", message(format!("c{i}")))
            .await?;
    }
    for _ in 0..3 {
        next(&mut consumer).await?;
    }
    counts(&setup, "work", 0, 3).await?;
    drop(consumer);
    counts(&setup, "work", 3, 0).await?;
    let back = setup
        .get("work", false, 0)
        .await?
        .delivery
        .context("returned message")?;
    assert_eq!(body(&back), "c0", "returned messages keep their order");
    assert!(
        back.redelivered,
        "a message returned by a closed consumer is redelivered"
    );
    assert_eq!(delivery_count(&back), Some(1));

    info!("--- get + settle: requeue then ack by receipt");
    setup
        .settle(vec![back.receipt.clone()], SettleOutcome::Requeue)
        .await?;
    let back2 = setup
        .get("work", false, 0)
        .await?
        .delivery
        .context("requeued message")?;
    // Returned messages are served before fresh ones, in the order they were returned
    // (docs/semantics.md, as rabbit_fifo's returns queue): c1 and c2 came back before c0 did.
    assert_eq!(body(&back2), "c1", "earlier returns are served first");
    assert_eq!(delivery_count(&back2), Some(1));
    setup
        .settle(vec![back2.receipt], SettleOutcome::Ack)
        .await?;
    let rest = super::drain_exactly(&setup, "work", 2).await?;
    assert_eq!(rest, ["c2", "c0"], "then c2, then c0 (requeued last)");
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_bounds_unacked_deliveries() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    c.declare_queue("pf", Default::default()).await?;
    let leader = cluster.leader_of("pf").await?;
    let follower = cluster.others(leader)[0];
    let mut consumer = cluster.client(follower).await?.consume("pf", 2).await?;
    for i in 0..5 {
        c.publish("", "pf", message(format!("p{i}"))).await?;
    }

    info!("--- prefetch 2: two out, three ready");
    let a = next(&mut consumer).await?;
    let b = next(&mut consumer).await?;
    assert_eq!((body(&a).as_str(), body(&b).as_str()), ("p0", "p1"));
    counts(&c, "pf", 3, 2).await?;

    info!("--- each ack lets exactly one more through");
    consumer.ack(a.delivery_tag, false).await?;
    let d = next(&mut consumer).await?;
    assert_eq!(body(&d), "p2");
    counts(&c, "pf", 2, 2).await?;
    consumer.ack(d.delivery_tag, true).await?;
    let e = next(&mut consumer).await?;
    let f = next(&mut consumer).await?;
    assert_eq!((body(&e).as_str(), body(&f).as_str()), ("p3", "p4"));
    consumer.ack(f.delivery_tag, true).await?;
    counts(&c, "pf", 0, 0).await?;

    info!("--- deleting the queue cancels the consumer");
    c.delete_queue("pf", false, false).await?;
    let end = tokio::time::timeout(Duration::from_secs(20), consumer.next())
        .await
        .context("no cancel within 20 s")?;
    assert!(
        end.is_none(),
        "the stream ends after the queue is deleted: {end:?}"
    );
    assert!(
        consumer.cancel_reason().is_some(),
        "the server said why it cancelled"
    );
    cluster.stop();
    Ok(())
}

/// One publisher stream into one queue keeps its order, as one AMQP channel does: pipelining
/// (many publishes in flight) must not reorder the enqueues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_stream_keeps_its_order() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    c.declare_queue("ordered", Default::default()).await?;
    let leader = cluster.leader_of("ordered").await?;
    let via = cluster.client(cluster.others(leader)[0]).await?;

    info!("--- 300 messages through one stream with 64 in flight, via a follower");
    let mut publisher = via.publisher(64).await?;
    for i in 0..300 {
        publisher
            .send("", "ordered", message(format!("o{i:03}")))
            .await?;
    }
    let confirms = publisher.close().await?;
    assert_eq!(confirms.len(), 300);
    assert!(
        confirms
            .iter()
            .all(|c| c.outcome == PublishOutcome::Confirmed)
    );

    let mut consumer = c.consume("ordered", 100).await?;
    let mut got = Vec::new();
    while got.len() < 300 {
        let d = next(&mut consumer).await?;
        got.push(body(&d));
        consumer.ack(d.delivery_tag, false).await?;
    }
    let want: Vec<String> = (0..300).map(|i| format!("o{i:03}")).collect();
    assert_eq!(got, want, "delivered in publish order");
    cluster.stop();
    Ok(())
}
