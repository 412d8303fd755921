//! Story: limits change a live queue without redeclaring it.
//!
//! A `max-length` policy applied to a queue holding ten messages trims it to the limit from the
//! head (overflow `drop-head`, the default), keeps trimming later publishes, and clearing the
//! policy lifts the limit. A queue declared with `x-overflow = reject-publish` refuses the
//! publish past its limit with `REJECTED`, naming the queue, and never overshoots.

use std::time::Duration;

use qq_client::{Client, PublishOutcome, QueueInfo, Value, ValueExt, message, table};
use qq_tests::{TestCluster, eventually, info};

async fn publish_n(c: &Client, queue: &str, prefix: &str, n: usize) -> anyhow::Result<()> {
    for i in 0..n {
        let r = c
            .publish("", queue, message(format!("{prefix}{i}")))
            .await?;
        assert_eq!(r.outcome, PublishOutcome::Confirmed, "{r:?}");
    }
    Ok(())
}

async fn wait_queue(
    c: &Client,
    queue: &str,
    what: &str,
    pred: impl Fn(&QueueInfo) -> bool,
) -> anyhow::Result<QueueInfo> {
    let pred = &pred;
    eventually(what, Duration::from_secs(20), || async move {
        let q = c.get_queue(queue).await?;
        Ok(pred(&q).then_some(q))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_length_policy_trims_live_queue_and_clearing_lifts_it() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    c.declare_queue("pol.jobs", Default::default()).await?;
    c.declare_queue("other", Default::default()).await?;
    publish_n(&c, "pol.jobs", "a", 10).await?;
    publish_n(&c, "other", "o", 10).await?;

    info!("--- policy max-length 5 on ^pol\\.");
    c.set_policy(
        "limit",
        r"^pol\.",
        "queues",
        0,
        table([("max-length", Value::long(5))]),
    )
    .await?;
    let policies = c.list_policies().await?;
    assert!(
        policies
            .iter()
            .any(|p| p.name == "limit" && p.pattern == r"^pol\."),
        "{policies:?}"
    );
    let q = wait_queue(&c, "pol.jobs", "the policy to trim pol.jobs to 5", |q| {
        q.messages == 5
    })
    .await?;
    assert_eq!(q.policy, "limit", "{q:?}");
    let eff = q.effective.clone().unwrap_or_default();
    assert_eq!(
        eff.max_length,
        Some(5),
        "effective config shows the limit: {eff:?}"
    );
    assert_eq!(
        c.get_queue("other").await?.messages,
        10,
        "a queue the pattern misses is untouched"
    );

    info!("--- drop-head kept the newest five");
    let kept = super::drain_exactly(&c, "pol.jobs", 5).await?;
    assert_eq!(kept, ["a5", "a6", "a7", "a8", "a9"]);

    info!("--- the limit holds for new publishes");
    publish_n(&c, "pol.jobs", "b", 8).await?;
    let q = c.get_queue("pol.jobs").await?;
    assert_eq!(q.messages, 5, "never above the limit: {q:?}");

    info!("--- clearing the policy lifts the limit");
    c.clear_policy("limit").await?;
    let q = wait_queue(&c, "pol.jobs", "the policy to be gone", |q| {
        q.policy.is_empty() && q.effective.as_ref().is_some_and(|e| e.max_length.is_none())
    })
    .await?;
    assert_eq!(q.messages, 5);
    publish_n(&c, "pol.jobs", "c", 10).await?;
    wait_queue(&c, "pol.jobs", "15 messages without a limit", |q| {
        q.messages == 15
    })
    .await?;
    let all = super::drain_exactly(&c, "pol.jobs", 15).await?;
    let mut want: Vec<String> = (3..8).map(|i| format!("b{i}")).collect();
    want.extend((0..10).map(|i| format!("c{i}")));
    assert_eq!(all, want);
    super::assert_status(
        c.clear_policy("limit").await,
        tonic::Code::NotFound,
        "limit",
    );
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_publish_overflow_refuses_with_detail() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(2).await?;
    let args = table([
        ("x-max-length", Value::long(2)),
        ("x-overflow", Value::string("reject-publish")),
    ]);
    c.declare_queue("rp.q", args).await?;

    info!("--- two fit, the third is REJECTED");
    publish_n(&c, "rp.q", "r", 2).await?;
    let third = c.publish("", "rp.q", message("r2")).await?;
    assert_eq!(third.outcome, PublishOutcome::Rejected, "{third:?}");
    assert!(
        third.detail.contains("rp.q"),
        "the detail names the queue: {:?}",
        third.detail
    );

    info!("--- the stream publisher sees the same outcome per seq");
    let mut publisher = c.publisher(8).await?;
    let s1 = publisher.send("", "rp.q", message("r3")).await?;
    let confirms = publisher.close().await?;
    assert_eq!(confirms.len(), 1);
    assert_eq!(confirms[0].seq, s1);
    assert_eq!(confirms[0].outcome, PublishOutcome::Rejected);

    info!("--- after a consume frees room, publishing works again");
    assert_eq!(c.get_queue("rp.q").await?.messages, 2, "never overshoots");
    let got = c.get("rp.q", true, 0).await?.delivery.expect("a message");
    assert_eq!(super::body(&got), "r0");
    let again = c.publish("", "rp.q", message("r4")).await?;
    assert_eq!(again.outcome, PublishOutcome::Confirmed, "{again:?}");
    assert_eq!(super::drain_exactly(&c, "rp.q", 2).await?, ["r1", "r4"]);
    cluster.stop();
    Ok(())
}

/// `x-expires`: a queue unused (no consumer, no Get) for its expiry is deleted, and its messages
/// are not dead-lettered; a queue with a consumer attached does not expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_queue_expires_without_dead_lettering() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    c.declare_exchange("exp.dlx", "fanout").await?;
    c.declare_queue("exp.dlq", Default::default()).await?;
    c.bind("exp.dlq", "exp.dlx", "", Default::default()).await?;
    let args = |ms: i64| {
        table([
            ("x-expires", Value::long(ms)),
            ("x-dead-letter-exchange", Value::string("exp.dlx")),
        ])
    };
    c.declare_queue("exp.idle", args(1500)).await?;
    c.declare_queue("exp.busy", args(1500)).await?;
    publish_n(&c, "exp.idle", "i", 2).await?;
    let consumer = cluster.client(2).await?.consume("exp.busy", 1).await?;

    info!("--- the unused queue disappears after its expiry");
    eventually("exp.idle deleted", Duration::from_secs(20), || async {
        match c.get_queue("exp.idle").await {
            Err(e) if e.code() == tonic::Code::NotFound => Ok(Some(())),
            Err(e) => Err(e.into()),
            Ok(q) => {
                info!("exp.idle still there: {} messages", q.messages);
                Ok(None)
            }
        }
    })
    .await?;
    let dlq = c.get_queue("exp.dlq").await?;
    assert_eq!(
        dlq.messages, 0,
        "an expiring queue does not dead-letter its messages"
    );

    info!(
        "--- the queue with a consumer is still there, past its expiry (declared before exp.idle expired)"
    );
    let busy = c.get_queue("exp.busy").await?;
    assert_eq!(busy.consumers, 1, "{busy:?}");
    consumer.cancel().await?;
    eventually(
        "exp.busy deleted once its consumer left",
        Duration::from_secs(20),
        || async {
            match c.get_queue("exp.busy").await {
                Err(e) if e.code() == tonic::Code::NotFound => Ok(Some(())),
                Err(e) => Err(e.into()),
                Ok(_) => Ok(None),
            }
        },
    )
    .await?;
    cluster.stop();
    Ok(())
}
