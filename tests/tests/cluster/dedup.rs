//! Story: a publisher that retries with the same `(publisher_id, publisher_seq)` stores each
//! message once per queue, exactly (a retry that lost its race with a later publish is still
//! stored), on unary and streamed publishes, across a leader kill, for as long as the queue's
//! dedup window lasts; and one user's ids cannot suppress another user's messages.

use std::time::Duration;

use qq_client::{Client, Confirm, PublishRequest, Value, ValueExt, message, table};
use qq_tests::{TestCluster, info};
use tonic::Code;

use super::{assert_status, drain_exactly};

fn req(queue: &str, body: &str, publisher_id: &str, seq: u64) -> PublishRequest {
    PublishRequest {
        routing_key: queue.into(),
        message: Some(message(body.to_string())),
        publisher_id: publisher_id.into(),
        publisher_seq: seq,
        ..Default::default()
    }
}

async fn publish(
    c: &Client,
    queue: &str,
    body: &str,
    id: &str,
    seq: u64,
) -> anyhow::Result<Confirm> {
    let confirm = c.publish_with(req(queue, body, id, seq)).await?;
    assert!(confirm.is_confirmed(), "{body}: {confirm:?}");
    Ok(confirm)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_ids_store_each_message_once() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    c.declare_queue("dd.q", Default::default()).await?;

    info!("--- a repeat is confirmed as a duplicate and not stored; exact, not 'seq <= last'");
    assert_eq!(publish(&c, "dd.q", "a1", "pub-a", 1).await?.detail, "");
    assert_eq!(
        publish(&c, "dd.q", "a1-again", "pub-a", 1).await?.detail,
        "duplicate"
    );
    assert_eq!(publish(&c, "dd.q", "a3", "pub-a", 3).await?.detail, "");
    assert_eq!(publish(&c, "dd.q", "a2", "pub-a", 2).await?.detail, "");
    assert_eq!(
        publish(&c, "dd.q", "a2-again", "pub-a", 2).await?.detail,
        "duplicate"
    );
    // Another publisher id with the same seq is another message.
    assert_eq!(publish(&c, "dd.q", "b1", "pub-b", 1).await?.detail, "");

    info!("--- on a PublishStream too");
    let mut stream = c.publisher(8).await?;
    stream
        .send_request(req("dd.q", "a1-stream", "pub-a", 1))
        .await?;
    stream.send_request(req("dd.q", "a4", "pub-a", 4)).await?;
    let confirms = stream.close().await?;
    let details: Vec<&str> = confirms.iter().map(|c| c.detail.as_str()).collect();
    assert!(confirms.iter().all(Confirm::is_confirmed), "{confirms:?}");
    assert_eq!(details, vec!["duplicate", ""]);

    info!("--- another user's identical publisher id is not a duplicate");
    c.put_user("bob", "bob-pw", vec![]).await?;
    c.set_permissions("bob", "/", ".*", ".*", ".*").await?;
    let bob = c.clone().with_credentials("bob", "bob-pw")?;
    assert_eq!(
        publish(&bob, "dd.q", "bob-a1", "pub-a", 1).await?.detail,
        ""
    );

    info!("--- the window is replicated: a retry after the leader's kill is still a duplicate");
    assert_eq!(publish(&c, "dd.q", "a5", "pub-a", 5).await?.detail, "");
    let leader = cluster.leader_of("dd.q").await?;
    cluster.kill9(leader);
    let other = if leader == 1 { 2 } else { 1 };
    let c2 = cluster.client(other).await?;
    cluster.leader_of_except("dd.q", leader).await?;
    let mut retried = None;
    for _ in 0..50 {
        match c2.publish_with(req("dd.q", "a5-retry", "pub-a", 5)).await {
            Ok(confirm) => {
                retried = Some(confirm);
                break;
            }
            Err(e) if e.code() == Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let retried = retried.ok_or_else(|| anyhow::anyhow!("no leader took the retry"))?;
    assert!(retried.is_confirmed(), "{retried:?}");
    assert_eq!(retried.detail, "duplicate");
    cluster.restart(leader).await?;

    let mut bodies = drain_exactly(&c2, "dd.q", 7).await?;
    bodies.sort();
    assert_eq!(bodies, vec!["a1", "a2", "a3", "a4", "a5", "b1", "bob-a1"]);

    info!("--- bad publisher fields are refused, naming the field");
    let mut no_id = req("dd.q", "x", "", 7);
    no_id.publisher_id.clear();
    assert_status(
        c2.publish_with(no_id).await,
        Code::InvalidArgument,
        "publisher_seq",
    );
    let long = "p".repeat(300);
    assert_status(
        c2.publish_with(req("dd.q", "x", &long, 1)).await,
        Code::InvalidArgument,
        "publisher_id: 300 bytes",
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dedup_window_is_a_queue_argument() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    assert_status(
        c.declare_queue("short.q", table([("x-dedup-window-ms", Value::long(10))]))
            .await,
        Code::InvalidArgument,
        "x-dedup-window-ms",
    );
    c.declare_queue(
        "window.q",
        table([("x-dedup-window-ms", Value::long(1_000))]),
    )
    .await?;
    assert_eq!(publish(&c, "window.q", "w1", "pub-w", 1).await?.detail, "");
    assert_eq!(
        publish(&c, "window.q", "w1-again", "pub-w", 1)
            .await?
            .detail,
        "duplicate"
    );
    // Past the window (leader-stamped command time), the key is forgotten: stored again.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        publish(&c, "window.q", "w1-late", "pub-w", 1).await?.detail,
        ""
    );
    let mut bodies = drain_exactly(&c, "window.q", 2).await?;
    bodies.sort();
    assert_eq!(bodies, vec!["w1", "w1-late"]);
    Ok(())
}
