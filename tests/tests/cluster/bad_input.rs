//! Story: bad requests get precise answers and change nothing.
//!
//! Each bad request below gets the status docs/api.md gives it, with a message naming the field or
//! the thing concerned. Afterwards the cluster still serves, and the messages confirmed before
//! the barrage are all still there.

use qq_client::{Client, MessageBuilder, PublishOutcome, Value, ValueExt, message, table};
use qq_tests::{TEST_MAX_MESSAGE_BYTES, TestCluster, info};
use tonic::Code;

use super::assert_status;

const SAFE: &str = "safe.q";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_precise_statuses_and_change_nothing() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;

    info!("--- twenty confirmed messages that must survive everything below");
    c.declare_queue(SAFE, Default::default()).await?;
    for i in 0..20 {
        let r = c.publish("", SAFE, message(format!("s{i}"))).await?;
        assert_eq!(r.outcome, PublishOutcome::Confirmed, "{r:?}");
    }

    info!("--- INVALID_ARGUMENT names the field");
    assert_status(
        c.declare_queue("", Default::default()).await,
        Code::InvalidArgument,
        "name",
    );
    let bad_ttl = table([("x-message-ttl", Value::string("soon"))]);
    assert_status(
        c.declare_queue("ttl.q", bad_ttl).await,
        Code::InvalidArgument,
        "x-message-ttl",
    );
    let negative_ttl = table([("x-message-ttl", Value::long(-5))]);
    assert_status(
        c.declare_queue("ttl.q", negative_ttl).await,
        Code::InvalidArgument,
        "x-message-ttl",
    );
    let bad_overflow = table([("x-overflow", Value::string("explode"))]);
    assert_status(
        c.declare_queue("of.q", bad_overflow).await,
        Code::InvalidArgument,
        "x-overflow",
    );
    let bad_expiration = MessageBuilder::new("e").expiration("tomorrow").build();
    assert_status(
        c.publish("", SAFE, bad_expiration).await,
        Code::InvalidArgument,
        "expiration",
    );
    assert_status(
        c.declare_exchange("bad.ex", "bogus").await,
        Code::InvalidArgument,
        "type",
    );

    info!("--- FAILED_PRECONDITION: inequivalent redeclare, if_empty");
    let different = table([("x-max-length", Value::long(3))]);
    assert_status(
        c.declare_queue(SAFE, different).await,
        Code::FailedPrecondition,
        "x-max-length",
    );
    assert_status(
        c.delete_queue(SAFE, false, true).await,
        Code::FailedPrecondition,
        "",
    );

    info!("--- NOT_FOUND: queue, exchange, vhost, passive declare");
    assert_status(
        c.get_queue("no.such.queue").await,
        Code::NotFound,
        "no.such.queue",
    );
    assert_status(
        c.declare_queue_passive("no.such.queue").await,
        Code::NotFound,
        "no.such.queue",
    );
    assert_status(
        c.get("no.such.queue", true, 0).await,
        Code::NotFound,
        "no.such.queue",
    );
    assert_status(
        c.publish("no.such.exchange", "k", message("x")).await,
        Code::NotFound,
        "no.such.exchange",
    );
    assert_status(
        c.bind(SAFE, "no.such.exchange", "k", Default::default())
            .await,
        Code::NotFound,
        "no.such.exchange",
    );
    let elsewhere = c.clone().with_vhost("no-such-vhost");
    assert_status(
        elsewhere.declare_queue("q", Default::default()).await,
        Code::NotFound,
        "no-such-vhost",
    );

    info!("--- UNAUTHENTICATED: wrong password, unknown user");
    let wrong = c.clone().with_credentials("guest", "not-the-password")?;
    assert_status(wrong.list_queues().await, Code::Unauthenticated, "");
    let stranger = c.clone().with_credentials("nobody", "x")?;
    assert_status(
        stranger.publish("", SAFE, message("x")).await,
        Code::Unauthenticated,
        "",
    );

    info!("--- PERMISSION_DENIED: a user whose permissions match nothing here");
    c.put_user("bob", "bobpw", vec![]).await?;
    c.set_permissions("bob", "/", "^bob-only$", "^bob-only$", "^bob-only$")
        .await?;
    let bob = c.clone().with_credentials("bob", "bobpw")?;
    assert_status(
        bob.declare_queue("bob.q", Default::default()).await,
        Code::PermissionDenied,
        "",
    );
    assert_status(
        bob.publish("amq.direct", "k", message("x")).await,
        Code::PermissionDenied,
        "",
    );
    assert_status(bob.get(SAFE, true, 0).await, Code::PermissionDenied, "");
    assert_status(bob.consume(SAFE, 1).await, Code::PermissionDenied, "");
    assert_status(bob.purge_queue(SAFE).await, Code::PermissionDenied, "");

    info!("--- RESOURCE_EXHAUSTED: a message over max_message_bytes");
    // Just over the node's bound, and far over it (where a gRPC-level decoding limit could
    // answer first): both are RESOURCE_EXHAUSTED in docs/api.md.
    let just_over = vec![b'x'; TEST_MAX_MESSAGE_BYTES + 1];
    assert_status(
        c.publish("", SAFE, message(just_over)).await,
        Code::ResourceExhausted,
        "",
    );
    let twice = vec![b'x'; 2 * TEST_MAX_MESSAGE_BYTES];
    assert_status(
        c.publish("", SAFE, message(twice)).await,
        Code::ResourceExhausted,
        "",
    );

    info!("--- the cluster still serves and lost nothing");
    for id in cluster.ids() {
        let other = cluster.client(id).await?;
        let status = other.cluster_status().await?;
        assert_ne!(status.metadata_leader, 0, "node {id}: {status:?}");
    }
    let names: Vec<String> = c.list_queues().await?.into_iter().map(|q| q.name).collect();
    assert_eq!(names, [SAFE], "no bad declare created a queue");
    let q = c.get_queue(SAFE).await?;
    assert!(
        q.arguments.is_empty(),
        "the inequivalent redeclare changed nothing: {q:?}"
    );
    let bodies = super::drain_exactly(&c, SAFE, 20).await?;
    let want: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
    assert_eq!(bodies, want, "every confirmed message, in order");
    let exchanges = c.list_exchanges().await?;
    assert!(
        !exchanges.iter().any(|e| e.name == "bad.ex"),
        "no bad exchange was created"
    );
    cluster.stop();
    Ok(())
}

/// A user can act within their permissions: the denials above are about what the regexes
/// match, not about non-guest users as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_allow_what_they_match() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let admin = cluster.client(2).await?;
    admin.put_user("carol", "pw", vec![]).await?;
    admin
        .set_permissions("carol", "/", "^carol\\.", "^carol\\.", "^carol\\.")
        .await?;
    let carol: Client = cluster.client(3).await?.with_credentials("carol", "pw")?;
    carol.declare_queue("carol.q", Default::default()).await?;
    assert_status(
        carol.declare_queue("dave.q", Default::default()).await,
        Code::PermissionDenied,
        "",
    );
    carol.declare_exchange("carol.ex", "fanout").await?;
    carol
        .bind("carol.q", "carol.ex", "", Default::default())
        .await?;
    let r = carol.publish("carol.ex", "", message("hi")).await?;
    assert_eq!(r.outcome, PublishOutcome::Confirmed);
    let d = carol
        .get("carol.q", true, 0)
        .await?
        .delivery
        .expect("carol reads her queue");
    assert_eq!(super::body(&d), "hi");

    info!("--- naming a DLX at declare needs write on that exchange (and read on the queue)");
    admin.declare_exchange("dave.dlx", "fanout").await?;
    let dlx = |x: &str| {
        std::collections::HashMap::from([("x-dead-letter-exchange".to_string(), Value::string(x))])
    };
    assert_status(
        carol.declare_queue("carol.dl1", dlx("dave.dlx")).await,
        Code::PermissionDenied,
        "dave.dlx",
    );
    carol.declare_queue("carol.dl2", dlx("carol.ex")).await?;
    cluster.stop();
    Ok(())
}
