//! Story: every bound on what a client sends is answered with RESOURCE_EXHAUSTED naming the
//! bound, and a consumer that asks for "unlimited" gets the node's cap.
//!
//! - A message's size counts its properties and headers, not only its body: for
//!   `max_message_bytes` and for a queue's `x-max-length-bytes`.
//! - Header entries (`max_headers`, nested ones included) and nesting depth
//!   (`max_header_depth`) are bounded.
//! - Prefetch 0 means at most `prefetch_zero_cap` (default 2 000) unacked deliveries.
//! - Vhost and user limits (queues, exchanges, connections, consumers) and streams per
//!   connection.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use qq_client::{MessageBuilder, PublishOutcome, Value, ValueExt, message, table, v1};
use qq_tests::{
    ClusterOptions, RaftSettings, TEST_MAX_MESSAGE_BYTES, TestCluster, eventually, info,
};
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

fn limits(
    queues: Option<u64>,
    exchanges: Option<u64>,
    conns: Option<u64>,
    consumers: Option<u64>,
) -> v1::Limits {
    v1::Limits {
        max_queues: queues,
        max_exchanges: exchanges,
        max_connections: conns,
        max_consumers: consumers,
    }
}

/// Story: an administrator caps what one vhost and one user may hold; each cap is answered
/// with RESOURCE_EXHAUSTED naming the limit, frees up when the resource goes, and nobody but an
/// administrator can change them. Streams per connection are bounded by the node config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vhost_and_user_limits_are_answered_and_named() -> anyhow::Result<()> {
    let options = ClusterOptions {
        extra_config: vec!["max_streams_per_connection = 2".into()],
        ..Default::default()
    };
    let cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
    let admin = cluster.client(1).await?;
    admin.put_vhost("lim").await?;
    admin.put_user("bob", "pw", vec![]).await?;
    admin
        .set_permissions("bob", "lim", ".*", ".*", ".*")
        .await?;
    admin
        .set_vhost_limits("lim", limits(Some(2), Some(1), Some(2), Some(1)))
        .await?;
    let listed = admin.list_limits().await?;
    assert_eq!(listed.vhosts.len(), 1);
    assert_eq!(listed.vhosts[0].vhost, "lim");
    assert_eq!(
        listed.vhosts[0].limits,
        Some(limits(Some(2), Some(1), Some(2), Some(1)))
    );

    let bob = |id| {
        let cluster = &cluster;
        async move {
            anyhow::Ok(
                cluster
                    .client(id)
                    .await?
                    .with_credentials("bob", "pw")?
                    .with_vhost("lim"),
            )
        }
    };
    let b1 = bob(1).await?;
    info!("--- a non-administrator cannot change limits");
    assert_status(
        b1.set_vhost_limits("lim", limits(None, None, None, None))
            .await,
        Code::PermissionDenied,
        "not an administrator",
    );

    info!("--- max-queues and max-exchanges of the vhost, counted cluster-wide");
    b1.declare_queue("q1", Default::default()).await?;
    bob(2)
        .await?
        .declare_queue("q2", Default::default())
        .await?;
    assert_status(
        b1.declare_queue("q3", Default::default()).await,
        Code::ResourceExhausted,
        "queue limit (max-queues) in vhost 'lim' (2) is reached",
    );
    // A redeclare of an existing queue at the limit is still answered.
    b1.declare_queue("q1", Default::default()).await?;
    b1.declare_exchange("x1", "direct").await?;
    assert_status(
        b1.declare_exchange("x2", "direct").await,
        Code::ResourceExhausted,
        "max-exchanges",
    );
    b1.delete_queue("q2", false, false).await?;
    b1.declare_queue("q3", Default::default()).await?;

    info!("--- max-consumers of the vhost, freed when a consumer ends");
    let first = b1.consume("q1", 10).await?;
    assert_status(
        b1.consume("q3", 10).await,
        Code::ResourceExhausted,
        "consumer limit (max-consumers) in vhost 'lim' (1) is reached",
    );
    drop(first);
    let second = eventually(
        "the consumer count to drop",
        Duration::from_secs(10),
        || async {
            b1.consume("q3", 10)
                .await
                .map(Some)
                .map_err(anyhow::Error::from)
        },
    )
    .await?;
    drop(second);

    info!("--- max-connections of the vhost (per node), freed when a connection closes");
    // b1 is one connection on node 1; another makes two.
    let b1_again = bob(1).await?;
    b1_again.declare_queue("q1", Default::default()).await?;
    let third = bob(1).await?;
    assert_status(
        third.declare_queue("q1", Default::default()).await,
        Code::ResourceExhausted,
        "connection limit (max-connections) in vhost 'lim' (2) is reached",
    );
    // Node 2 counts its own connections.
    bob(2)
        .await?
        .declare_queue("q1", Default::default())
        .await?;
    drop(b1_again);
    eventually(
        "a connection slot to free",
        Duration::from_secs(10),
        || async {
            third
                .declare_queue("q1", Default::default())
                .await
                .map(Some)
                .map_err(anyhow::Error::from)
        },
    )
    .await?;

    info!("--- user limits: max-connections, max-queues, max-consumers of carol");
    admin.put_user("carol", "pw", vec![]).await?;
    admin
        .set_permissions("carol", "/", ".*", ".*", ".*")
        .await?;
    admin
        .set_user_limits("carol", limits(Some(1), Some(0), Some(1), Some(1)))
        .await?;
    let carol = cluster.client(3).await?.with_credentials("carol", "pw")?;
    carol.declare_queue("carol.q", Default::default()).await?;
    assert_status(
        carol.declare_queue("carol.q2", Default::default()).await,
        Code::ResourceExhausted,
        "queue limit (max-queues) of user 'carol' (1) is reached",
    );
    assert_status(
        carol.declare_exchange("carol.x", "fanout").await,
        Code::ResourceExhausted,
        "exchange limit (max-exchanges) of user 'carol' (0) is reached",
    );
    let carol_consumer = carol.consume("carol.q", 1).await?;
    assert_status(
        carol.consume("carol.q", 1).await,
        Code::ResourceExhausted,
        "consumer limit (max-consumers) of user 'carol' (1) is reached",
    );
    drop(carol_consumer);
    let carol_elsewhere = cluster.client(3).await?.with_credentials("carol", "pw")?;
    assert_status(
        carol_elsewhere.list_queues().await,
        Code::ResourceExhausted,
        "connection limit (max-connections) of user 'carol' (1) is reached",
    );
    // Clearing lifts them.
    admin
        .set_user_limits("carol", limits(None, None, None, None))
        .await?;
    carol_elsewhere.list_queues().await?;
    carol.declare_queue("carol.q2", Default::default()).await?;
    assert!(admin.list_limits().await?.users.is_empty());

    info!("--- streams per connection (node config: 2)");
    let g = cluster.client(2).await?;
    g.declare_queue("streams.q", Default::default()).await?;
    let s1 = g.consume("streams.q", 1).await?;
    // A publish stream counts once its call is open: after its first confirm.
    let mut s2 = g.publisher(8).await?;
    s2.send("", "streams.q", message("m")).await?;
    assert!(
        s2.flush()
            .await?
            .iter()
            .all(|c| c.outcome == PublishOutcome::Confirmed)
    );
    assert_status(
        g.consume("streams.q", 1).await,
        Code::ResourceExhausted,
        "max_streams_per_connection",
    );
    // Unary calls on the same connection still work, and another connection has its own.
    g.declare_queue("streams.q", Default::default()).await?;
    let other = cluster.client(2).await?;
    drop(other.consume("streams.q", 1).await?);
    drop(s1);
    drop(s2);
    eventually("a stream slot to free", Duration::from_secs(10), || async {
        g.consume("streams.q", 1)
            .await
            .map(Some)
            .map_err(anyhow::Error::from)
    })
    .await?;

    cluster.stop();
    Ok(())
}
