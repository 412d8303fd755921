//! Story: every bound on what a client sends is answered with RESOURCE_EXHAUSTED naming the
//! bound, and a consumer that asks for "unlimited" gets the node's cap.
//!
//! - A message's size counts its properties and headers, not only its body: for
//!   `max_message_bytes` and for a queue's `x-max-length-bytes`.
//! - Header entries (`max_headers`, nested ones included) and nesting depth
//!   (`max_header_depth`) are bounded.
//! - Prefetch 0 means at most `prefetch_zero_cap` (default 2 000) unacked deliveries.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use qq_client::{MessageBuilder, PublishOutcome, Value, ValueExt, message, table};
use qq_tests::{TEST_MAX_MESSAGE_BYTES, TestCluster, eventually, info};
use tonic::Code;

use super::assert_status;

/// The node default of `prefetch_zero_cap`, which the test cluster keeps.
const PREFETCH_ZERO_CAP: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounds_on_messages_and_consumers_are_answered_and_named() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    c.declare_queue("limits.q", Default::default()).await?;

    info!("--- a small body with headers over max_message_bytes");
    let big_header = MessageBuilder::new("tiny")
        .header("pad", Value::string("h".repeat(TEST_MAX_MESSAGE_BYTES)))
        .build();
    assert_status(
        c.publish("", "limits.q", big_header).await,
        Code::ResourceExhausted,
        "max_message_bytes",
    );

    info!("--- more header entries than max_headers (1 024), nested ones included");
    let many: HashMap<String, Value> = (0..1_025)
        .map(|i| (format!("h{i}"), Value::long(i)))
        .collect();
    assert_status(
        c.publish(
            "",
            "limits.q",
            MessageBuilder::new("m").headers(many).build(),
        )
        .await,
        Code::ResourceExhausted,
        "max_headers",
    );
    let nested_many = Value::list((0..1_100).map(Value::long).collect());
    assert_status(
        c.publish(
            "",
            "limits.q",
            MessageBuilder::new("m").header("l", nested_many).build(),
        )
        .await,
        Code::ResourceExhausted,
        "max_headers",
    );

    info!("--- headers nested deeper than max_header_depth (8)");
    let mut deep = Value::long(1);
    for _ in 0..9 {
        deep = Value::list(vec![deep]);
    }
    assert_status(
        c.publish(
            "",
            "limits.q",
            MessageBuilder::new("m").header("d", deep).build(),
        )
        .await,
        Code::ResourceExhausted,
        "max_header_depth",
    );
    let mut ok_depth = Value::long(1);
    for _ in 0..6 {
        ok_depth = Value::list(vec![ok_depth]);
    }
    let r = c
        .publish(
            "",
            "limits.q",
            MessageBuilder::new("ok").header("d", ok_depth).build(),
        )
        .await?;
    assert!(r.is_confirmed(), "{r:?}");

    info!("--- x-max-length-bytes counts headers: a 1-byte body with a 2 KiB header is refused");
    let args = table([
        ("x-max-length-bytes", Value::long(1_000)),
        ("x-overflow", Value::string("reject-publish")),
    ]);
    c.declare_queue("bytes.q", args).await?;
    let heavy = MessageBuilder::new("b")
        .header("pad", Value::string("h".repeat(2_048)))
        .build();
    let r = c.publish("", "bytes.q", heavy).await?;
    assert_eq!(r.outcome, PublishOutcome::Rejected, "{r:?}");
    assert!(r.detail.contains("x-max-length-bytes"), "{r:?}");

    info!("--- prefetch 0: at most {PREFETCH_ZERO_CAP} unacked, more only as it settles");
    c.declare_queue("flood.q", Default::default()).await?;
    let total = PREFETCH_ZERO_CAP + 100;
    let mut publisher = c.publisher(1_000).await?;
    for i in 0..total {
        publisher
            .send("", "flood.q", message(format!("f{i}")))
            .await?;
    }
    let confirms = publisher.close().await?;
    assert!(confirms.iter().all(|c| c.is_confirmed()), "all confirmed");
    let mut consumer = c.consume("flood.q", 0).await?;
    let mut tags = Vec::new();
    while tags.len() < PREFETCH_ZERO_CAP {
        let d = consumer
            .next_timeout(Duration::from_secs(30))
            .await?
            .with_context(|| format!("only {} deliveries arrived", tags.len()))?;
        tags.push(d.delivery_tag);
    }
    let want = (PREFETCH_ZERO_CAP as u64, 100u64);
    eventually(
        "flood.q to hold the cap unacked and the rest ready",
        Duration::from_secs(20),
        || {
            let c = c.clone();
            async move {
                let q = c.get_queue("flood.q").await?;
                Ok(((q.messages_unacked, q.messages_ready) == want).then_some(()))
            }
        },
    )
    .await?;
    consumer.ack(tags[0], false).await?;
    let next = consumer
        .next_timeout(Duration::from_secs(30))
        .await?
        .context("a settle makes room for one more delivery")?;
    assert!(!tags.contains(&next.delivery_tag));
    let q = c.get_queue("flood.q").await?;
    assert_eq!(q.messages_unacked, PREFETCH_ZERO_CAP as u64, "{q:?}");
    Ok(())
}
