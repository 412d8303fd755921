//! Story: a request the queue cannot honour is refused with the status that says why, and
//! loses nothing. Each case was once answered wrongly (issue 16's five bugs): `Get` on a
//! single-active-consumer queue said INTERNAL; an unknown settle outcome silently cancelled the
//! consume stream; a passive declare of the default exchange said NOT_FOUND; `DeleteQueue`
//! with `if_empty` deleted a queue whose leader could not say whether it was empty; a
//! `PublishStream` entry for a missing exchange came back REJECTED instead of NOT_FOUND.

use std::time::Duration;

use qq_client::{PublishOutcome, Value, ValueExt, message, table};
use qq_proto::v1 as pb;
use qq_tests::{TestCluster, info};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use super::{assert_status, body, drain_exactly};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_the_reason_and_lose_nothing() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;

    info!("--- Get on a single-active-consumer queue: FAILED_PRECONDITION, message stays");
    let sac = table([("x-single-active-consumer", Value::bool(true))]);
    c.declare_queue("sac.q", sac).await?;
    assert!(c.publish("", "sac.q", message("s1")).await?.is_confirmed());
    assert_status(
        c.get("sac.q", true, 0).await,
        Code::FailedPrecondition,
        "single active consumer",
    );
    let mut consumer = c.consume("sac.q", 10).await?;
    let d = consumer
        .next_timeout(Duration::from_secs(10))
        .await?
        .ok_or_else(|| anyhow::anyhow!("sac.q: no delivery to its consumer"))?;
    assert_eq!(body(&d), "s1");
    consumer.ack(d.delivery_tag, false).await?;
    drop(consumer);

    info!("--- settle with an unknown outcome: the stream ends INVALID_ARGUMENT, message returns");
    c.declare_queue("settle.q", Default::default()).await?;
    assert!(
        c.publish("", "settle.q", message("m1"))
            .await?
            .is_confirmed()
    );
    let (tx, rx) = mpsc::channel(8);
    tx.send(pb::ConsumeRequest {
        request: Some(pb::consume_request::Request::Subscribe(pb::Subscribe {
            vhost: "/".into(),
            queue: "settle.q".into(),
            prefetch_count: 10,
            ..Default::default()
        })),
    })
    .await?;
    let mut responses = c.raw().consume(ReceiverStream::new(rx)).await?.into_inner();
    let mut tag = None;
    while tag.is_none() {
        let r = responses
            .message()
            .await?
            .ok_or_else(|| anyhow::anyhow!("consume stream ended before a delivery"))?;
        if let Some(pb::consume_response::Response::Delivery(d)) = r.response {
            tag = Some(d.delivery_tag);
        }
    }
    tx.send(pb::ConsumeRequest {
        request: Some(pb::consume_request::Request::Settle(pb::ConsumeSettle {
            delivery_tags: vec![tag.unwrap_or_default()],
            multiple: false,
            outcome: 99,
            ..Default::default()
        })),
    })
    .await?;
    let status = loop {
        match responses.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => anyhow::bail!("consume stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("settle.outcome") && status.message().contains("99"),
        "the message names the field and the value: {status:?}"
    );
    drop(tx);
    assert_eq!(drain_exactly(&c, "settle.q", 1).await?, vec!["m1"]);

    info!("--- passive declare of the default exchange: it exists");
    c.declare_exchange_with(pb::DeclareExchangeRequest {
        name: String::new(),
        passive: true,
        ..Default::default()
    })
    .await?;
    assert_status(
        c.declare_exchange_with(pb::DeclareExchangeRequest {
            name: "no.such.exchange".into(),
            passive: true,
            ..Default::default()
        })
        .await,
        Code::NotFound,
        "no.such.exchange",
    );

    info!("--- PublishStream to a missing exchange: FAILED with NOT_FOUND naming it");
    let mut publisher = c.publisher(4).await?;
    publisher
        .send_request(pb::PublishRequest {
            exchange: "missing.x".into(),
            routing_key: "k".into(),
            message: Some(message("lost?")),
            ..Default::default()
        })
        .await?;
    publisher
        .send_request(pb::PublishRequest {
            exchange: String::new(),
            routing_key: "settle.q".into(),
            message: Some(message("after")),
            ..Default::default()
        })
        .await?;
    let confirms = publisher.close().await?;
    assert_eq!(confirms.len(), 2, "{confirms:?}");
    assert_eq!(confirms[0].outcome, PublishOutcome::Failed, "{confirms:?}");
    assert_eq!(confirms[0].code, Code::NotFound, "{confirms:?}");
    assert!(confirms[0].detail.contains("missing.x"), "{confirms:?}");
    assert!(
        confirms[1].is_confirmed(),
        "the stream goes on: {confirms:?}"
    );
    assert_eq!(drain_exactly(&c, "settle.q", 1).await?, vec!["after"]);

    info!("--- DeleteQueue if_empty with no leader: UNAVAILABLE, the queue stays");
    let one = table([("x-quorum-initial-group-size", Value::long(1))]);
    c.declare_queue("lonely.q", one).await?;
    assert!(
        c.publish("", "lonely.q", message("keep"))
            .await?
            .is_confirmed()
    );
    let members = c.get_queue("lonely.q").await?.members;
    anyhow::ensure!(members.len() == 1, "lonely.q members: {members:?}");
    let host = members[0];
    let other = cluster.others(host)[0];
    cluster.kill9(host);
    let survivor = cluster.client(other).await?;
    assert_status(
        survivor.delete_queue("lonely.q", false, true).await,
        Code::Unavailable,
        "if_empty",
    );
    cluster.restart(host).await?;
    let c = cluster.client(other).await?;
    assert_eq!(drain_exactly(&c, "lonely.q", 1).await?, vec!["keep"]);
    Ok(())
}
