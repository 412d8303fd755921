//! Story: dead lettering, end to end, against a real three-node cluster.
//!
//! docs/semantics.md ("Dead-letter triggers", "Routing a dead letter", "The death history",
//! "Strategies and safety", "Configuration") is the authority. Each test starts its own cluster
//! and, to keep the suite's wall time reasonable, tells several closely related sentences on it
//! with independent queue pairs:
//!
//! 1. `rejected`: single and `multiple` rejects through topic exchanges, DLQ order = reject order.
//! 2. `expired`: queue TTL, per-message TTL at the deadline (not only at the head),
//!    `original-expiration`, TTL 0.
//! 3. `maxlen`: drop-head, reject-publish-dlx, reject-publish.
//! 4. `delivery_limit`: `x-delivery-limit` 2 and `x-delivery-count`.
//! 5. routing: dead-letter routing key (CC removed), CC/BCC routing, default exchange, headers
//!    exchange on `x-first-death-reason`.
//! 6. death history: repeat deaths, move-to-front, first-death headers, publisher `x-death`.
//! 7. cycles: expiry loop dropped, rejection loop keeps routing.
//! 8. missing DLX / no route: at-most-once drops, at-least-once holds then delivers.
//! 9. configuration: refused declares, live policies, argument precedence, effective notes.
//! 10. at-least-once under leader kills: 5 000 messages exactly once in the DLQ.
//! 11. Overview counters by reason and strategy.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use qq_client::v1::value::Kind;
use qq_client::{
    Client, Consumer, Delivery, MessageBuilder, PublishOutcome, QueueInfo, SettleOutcome, Value,
    ValueExt, delivery_headers, message, string_list, table,
};
use qq_tests::{TestCluster, eventually, info};
use tracing::warn;

use super::{assert_status, body, delivery_count, drain_exactly};

// ---- helpers ---------------------------------------------------------------------------------

const WAIT: Duration = Duration::from_secs(20);

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

fn no_args() -> HashMap<String, Value> {
    HashMap::new()
}

/// Arguments of a source queue dead-lettering to `dlx`, plus `extra`.
fn dl_args(dlx: &str, extra: Vec<(&str, Value)>) -> HashMap<String, Value> {
    let mut args = table([("x-dead-letter-exchange", Value::string(dlx))]);
    args.extend(extra.into_iter().map(|(k, v)| (k.to_string(), v)));
    args
}

async fn publish_ok(
    c: &Client,
    exchange: &str,
    key: &str,
    m: qq_client::Message,
) -> anyhow::Result<()> {
    let r = c.publish(exchange, key, m).await?;
    ensure!(
        r.outcome == PublishOutcome::Confirmed,
        "publish to {exchange:?}/{key:?}: {r:?}"
    );
    Ok(())
}

async fn publish_bodies(
    c: &Client,
    exchange: &str,
    key: &str,
    bodies: &[&str],
) -> anyhow::Result<()> {
    for b in bodies {
        publish_ok(c, exchange, key, message(b.to_string())).await?;
    }
    Ok(())
}

async fn next(consumer: &mut Consumer) -> anyhow::Result<Delivery> {
    tokio::time::timeout(WAIT, consumer.next())
        .await
        .context("no delivery within 20 s")?
        .context("consume stream ended")?
        .map_err(Into::into)
}

async fn wait_queue(
    c: &Client,
    queue: &str,
    what: &str,
    pred: impl Fn(&QueueInfo) -> bool,
) -> anyhow::Result<QueueInfo> {
    let pred = &pred;
    eventually(&format!("{queue}: {what}"), WAIT, || async move {
        let q = c.get_queue(queue).await?;
        Ok(pred(&q).then_some(q))
    })
    .await
}

/// Waits until `queue` holds exactly `n` messages (all counted in `messages`).
async fn wait_messages(c: &Client, queue: &str, n: u64) -> anyhow::Result<QueueInfo> {
    wait_queue(c, queue, &format!("{n} messages"), |q| q.messages == n).await
}

/// Takes exactly `n` deliveries with auto-ack `Get` (polling while fewer arrived), then checks
/// the queue is empty.
async fn take_exactly(c: &Client, queue: &str, n: usize) -> anyhow::Result<Vec<Delivery>> {
    let mut out: Vec<Delivery> = Vec::new();
    let deadline = Instant::now() + WAIT;
    while out.len() < n {
        match c.get(queue, true, 0).await?.delivery {
            Some(d) => out.push(d),
            None if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            None => bail!(
                "{queue}: got {} of {n} messages: {:?}",
                out.len(),
                out.iter().map(body).collect::<Vec<_>>()
            ),
        }
    }
    if let Some(d) = c.get(queue, true, 0).await?.delivery {
        bail!(
            "{queue}: expected {n} messages, got another: {:?}",
            body(&d)
        );
    }
    Ok(out)
}

/// Takes `n` messages with non-auto-ack `Get` and settles them with one `Settle` in the order
/// given by `order` (indexes into the taken list). Returns the bodies in settle order.
async fn get_and_settle(
    c: &Client,
    queue: &str,
    n: usize,
    order: &[usize],
    outcome: SettleOutcome,
) -> anyhow::Result<Vec<String>> {
    let mut taken = Vec::new();
    let deadline = Instant::now() + WAIT;
    while taken.len() < n {
        match c.get(queue, false, 0).await?.delivery {
            Some(d) => taken.push(d),
            None if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            None => bail!("{queue}: got {} of {n} messages to settle", taken.len()),
        }
    }
    let receipts = order.iter().map(|i| taken[*i].receipt.clone()).collect();
    c.settle(receipts, outcome).await?;
    Ok(order.iter().map(|i| body(&taken[*i])).collect())
}

/// Rejects (Get + Settle REJECT) the next message of `queue`; returns its body.
async fn get_reject(c: &Client, queue: &str) -> anyhow::Result<String> {
    Ok(get_and_settle(c, queue, 1, &[0], SettleOutcome::Reject)
        .await?
        .remove(0))
}

fn header_str(d: &Delivery, key: &str) -> Option<String> {
    delivery_headers(d)
        .get(key)
        .and_then(|v| v.as_str())
        .map(str::to_string)
}

/// The `x-death` entries of a delivery (panics when missing or malformed).
fn x_death(d: &Delivery) -> Vec<HashMap<String, Value>> {
    let headers = delivery_headers(d);
    let list = headers
        .get("x-death")
        .unwrap_or_else(|| panic!("{}: no x-death header in {headers:?}", body(d)))
        .as_list()
        .unwrap_or_else(|| panic!("{}: x-death is not a list", body(d)));
    list.iter()
        .map(|v| {
            v.as_table()
                .unwrap_or_else(|| panic!("{}: x-death entry is not a table: {v:?}", body(d)))
                .clone()
        })
        .collect()
}

/// What one `x-death` entry must say.
struct Death<'a> {
    queue: &'a str,
    reason: &'a str,
    count: i64,
    exchange: &'a str,
    keys: &'a [&'a str],
    original_expiration: Option<&'a str>,
    /// Inclusive range of the `time` timestamp (seconds).
    time: (i64, i64),
}

/// Checks every field of an `x-death` entry (and that it has no others). Returns its `time`.
#[track_caller]
fn check_death(what: &str, entry: &HashMap<String, Value>, want: &Death) -> i64 {
    let s = |k: &str| entry.get(k).and_then(|v| v.as_str()).map(str::to_string);
    assert_eq!(
        s("queue").as_deref(),
        Some(want.queue),
        "{what}: queue in {entry:?}"
    );
    assert_eq!(
        s("reason").as_deref(),
        Some(want.reason),
        "{what}: reason in {entry:?}"
    );
    assert_eq!(
        entry.get("count").and_then(|v| v.as_long()),
        Some(want.count),
        "{what}: count (a long) in {entry:?}"
    );
    assert_eq!(
        s("exchange").as_deref(),
        Some(want.exchange),
        "{what}: exchange in {entry:?}"
    );
    let keys: Option<Vec<String>> = entry
        .get("routing-keys")
        .and_then(|v| v.as_list())
        .map(|l| {
            l.iter()
                .map(|k| k.as_str().unwrap_or("<not a string>").to_string())
                .collect()
        });
    let want_keys: Vec<String> = want.keys.iter().map(|k| k.to_string()).collect();
    assert_eq!(keys, Some(want_keys), "{what}: routing-keys in {entry:?}");
    assert_eq!(
        s("original-expiration").as_deref(),
        want.original_expiration,
        "{what}: original-expiration in {entry:?}"
    );
    let time = match entry.get("time").and_then(|v| v.kind.as_ref()) {
        Some(Kind::TimestampValue(t)) => *t,
        other => panic!("{what}: time must be a timestamp, got {other:?} in {entry:?}"),
    };
    assert!(
        time >= want.time.0 && time <= want.time.1,
        "{what}: time {time} outside [{}, {}] (seconds) in {entry:?}",
        want.time.0,
        want.time.1
    );
    let mut expected_fields = vec![
        "queue",
        "reason",
        "count",
        "time",
        "exchange",
        "routing-keys",
    ];
    if want.original_expiration.is_some() {
        expected_fields.push("original-expiration");
    }
    let fields: BTreeSet<&str> = entry.keys().map(String::as_str).collect();
    assert_eq!(
        fields,
        expected_fields.into_iter().collect::<BTreeSet<_>>(),
        "{what}: x-death entry fields"
    );
    time
}

/// Checks `x-first-death-*` = `first` and `x-last-death-*` = `last` (reason, queue, exchange).
#[track_caller]
fn check_first_last(d: &Delivery, first: (&str, &str, &str), last: (&str, &str, &str)) {
    let what = body(d);
    for (prefix, (reason, queue, exchange)) in [("x-first-death", first), ("x-last-death", last)] {
        assert_eq!(
            header_str(d, &format!("{prefix}-reason")).as_deref(),
            Some(reason),
            "{what}: {prefix}-reason"
        );
        assert_eq!(
            header_str(d, &format!("{prefix}-queue")).as_deref(),
            Some(queue),
            "{what}: {prefix}-queue"
        );
        assert_eq!(
            header_str(d, &format!("{prefix}-exchange")).as_deref(),
            Some(exchange),
            "{what}: {prefix}-exchange"
        );
    }
}

/// A dead letter that died once: one x-death entry and first = last.
#[track_caller]
fn check_single_death(d: &Delivery, want: &Death) {
    let deaths = x_death(d);
    assert_eq!(
        deaths.len(),
        1,
        "{}: one death expected: {deaths:?}",
        body(d)
    );
    check_death(&body(d), &deaths[0], want);
    let t = (want.reason, want.queue, want.exchange);
    check_first_last(d, t, t);
}

fn expiration(d: &Delivery) -> String {
    d.message
        .as_ref()
        .and_then(|m| m.properties.as_ref())
        .map(|p| p.expiration.clone())
        .unwrap_or_default()
}

fn bodies(ds: &[Delivery]) -> Vec<String> {
    ds.iter().map(body).collect()
}

/// The Overview's `messages_dead_lettered_total` as (reason, strategy) → count.
async fn dl_counters(c: &Client) -> anyhow::Result<(BTreeMap<(String, String), u64>, u64)> {
    let o = c.overview().await?;
    let map = o
        .messages_dead_lettered_total
        .iter()
        .map(|x| ((x.reason.clone(), x.strategy.clone()), x.count))
        .collect();
    Ok((map, o.messages_dead_lettered_confirmed_total))
}

async fn dl_counter(c: &Client, reason: &str, strategy: &str) -> anyhow::Result<u64> {
    Ok(dl_counters(c)
        .await?
        .0
        .get(&(reason.to_string(), strategy.to_string()))
        .copied()
        .unwrap_or(0))
}

fn norm_strategy(s: &str) -> String {
    s.replace('-', "_")
}

// ---- 1. rejected -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dl_rejected_single_and_multiple_through_topic_exchanges() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    c.declare_exchange("normal.exchange.test", "topic").await?;
    c.declare_exchange("dl.exchange.test", "topic").await?;
    c.declare_queue("rej.src", dl_args("dl.exchange.test", vec![]))
        .await?;
    c.declare_queue("rej.dlq", no_args()).await?;
    c.bind("rej.src", "normal.exchange.test", "test.#", no_args())
        .await?;
    c.bind("rej.dlq", "dl.exchange.test", "#", no_args())
        .await?;

    info!("--- six messages through normal.exchange.test, consumed on another node");
    let bodies_sent = ["m0", "m1", "m2", "m3", "m4", "m5"];
    publish_bodies(&c, "normal.exchange.test", "test.rejected", &bodies_sent).await?;
    let c2 = cluster.client(2).await?;
    let mut consumer = c2.consume("rej.src", 10).await?;
    let mut ds = Vec::new();
    for _ in 0..6 {
        ds.push(next(&mut consumer).await?);
    }
    assert_eq!(bodies(&ds), bodies_sent);

    info!("--- reject m3, then m1, then multiple up to m5 (m0, m2, m4, m5)");
    let t0 = now_s();
    consumer.reject(ds[3].delivery_tag).await?;
    consumer.reject(ds[1].delivery_tag).await?;
    consumer.nack(ds[5].delivery_tag, true, false).await?;
    wait_messages(&c, "rej.dlq", 6).await?;
    let src = wait_messages(&c, "rej.src", 0).await?;
    assert_eq!(
        (
            src.messages_ready,
            src.messages_unacked,
            src.messages_dead_letter_held
        ),
        (0, 0, 0),
        "{src:?}"
    );

    let dead = take_exactly(&c, "rej.dlq", 6).await?;
    let t1 = now_s();
    assert_eq!(
        bodies(&dead),
        ["m3", "m1", "m0", "m2", "m4", "m5"],
        "DLQ order = the order the consumer rejected"
    );
    for d in &dead {
        assert_eq!(
            d.exchange,
            "dl.exchange.test",
            "{}: a dead letter comes from the DLX",
            body(d)
        );
        assert_eq!(
            d.routing_key,
            "test.rejected",
            "{}: original key kept",
            body(d)
        );
        check_single_death(
            d,
            &Death {
                queue: "rej.src",
                reason: "rejected",
                count: 1,
                exchange: "normal.exchange.test",
                keys: &["test.rejected"],
                original_expiration: None,
                time: (t0, t1),
            },
        );
    }

    info!("--- Get + Settle REJECT with receipts in a chosen order");
    drop(consumer);
    wait_queue(&c, "rej.src", "no consumer", |q| q.consumers == 0).await?;
    publish_bodies(&c, "normal.exchange.test", "test.get", &["g0", "g1", "g2"]).await?;
    let order = get_and_settle(&c, "rej.src", 3, &[2, 0, 1], SettleOutcome::Reject).await?;
    assert_eq!(order, ["g2", "g0", "g1"]);
    wait_messages(&c, "rej.dlq", 3).await?;
    assert_eq!(
        drain_exactly(&c, "rej.dlq", 3).await?,
        ["g2", "g0", "g1"],
        "settle order is kept"
    );
    cluster.stop();
    Ok(())
}

// ---- 2. expired ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dl_expired_queue_ttl_per_message_ttl_and_zero() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    for (dlx, dlq) in [
        ("ttl.dlx", "ttl.dlq"),
        ("pm.dlx", "pm.dlq"),
        ("z.dlx", "z.dlq"),
    ] {
        c.declare_exchange(dlx, "fanout").await?;
        c.declare_queue(dlq, no_args()).await?;
        c.bind(dlq, dlx, "", no_args()).await?;
    }
    c.declare_queue(
        "ttl.src",
        dl_args("ttl.dlx", vec![("x-message-ttl", Value::long(5000))]),
    )
    .await?;
    c.declare_queue(
        "pm.src",
        dl_args("pm.dlx", vec![("x-message-ttl", Value::long(60_000))]),
    )
    .await?;
    c.declare_queue(
        "z.src",
        dl_args("z.dlx", vec![("x-message-ttl", Value::long(0))]),
    )
    .await?;

    info!("--- queue TTL 5000 ms: four messages, the last with a longer per-message TTL");
    let started = Instant::now();
    let t0 = now_s();
    publish_bodies(&c, "", "ttl.src", &["e0", "e1", "e2"]).await?;
    publish_ok(
        &c,
        "",
        "ttl.src",
        MessageBuilder::new("e3").expiration("60000").build(),
    )
    .await?;

    info!("--- per-message TTL: a short one behind a long one expires first; expiration 0 at once");
    publish_ok(
        &c,
        "",
        "pm.src",
        MessageBuilder::new("zero").expiration("0").build(),
    )
    .await?;
    publish_ok(
        &c,
        "",
        "pm.src",
        MessageBuilder::new("long").expiration("20000").build(),
    )
    .await?;
    publish_ok(
        &c,
        "",
        "pm.src",
        MessageBuilder::new("short").expiration("1000").build(),
    )
    .await?;
    info!("--- queue TTL 0 without a consumer");
    publish_ok(&c, "", "z.src", message("z0")).await?;

    wait_messages(&c, "pm.dlq", 2).await?;
    let pm_src = c.get_queue("pm.src").await?;
    assert_eq!(pm_src.messages, 1, "only 'long' is left: {pm_src:?}");
    let pm = take_exactly(&c, "pm.dlq", 2).await?;
    let t1 = now_s();
    assert_eq!(
        bodies(&pm),
        ["zero", "short"],
        "'short' did not wait behind 'long'"
    );
    for (d, exp) in pm.iter().zip(["0", "1000"]) {
        assert_eq!(
            expiration(d),
            "",
            "{}: the expiration property is removed",
            body(d)
        );
        assert_eq!(d.exchange, "pm.dlx");
        assert_eq!(d.routing_key, "pm.src");
        check_single_death(
            d,
            &Death {
                queue: "pm.src",
                reason: "expired",
                count: 1,
                exchange: "",
                keys: &["pm.src"],
                original_expiration: Some(exp),
                time: (t0, t1),
            },
        );
    }
    let z = take_exactly(&c, "z.dlq", 1).await?;
    check_single_death(
        &z[0],
        &Death {
            queue: "z.src",
            reason: "expired",
            count: 1,
            exchange: "",
            keys: &["z.src"],
            original_expiration: None,
            time: (t0, now_s()),
        },
    );
    assert_eq!(c.get_queue("z.src").await?.messages, 0);

    info!("--- the 5 s queue TTL");
    let q = c.get_queue("ttl.src").await?;
    if started.elapsed() < Duration::from_millis(4900) {
        assert_eq!(q.messages, 4, "nothing expires before 5 s: {q:?}");
    }
    wait_messages(&c, "ttl.dlq", 4).await?;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(4900),
        "expired after {elapsed:?}, before the 5 s TTL"
    );
    assert_eq!(c.get_queue("ttl.src").await?.messages, 0);
    let dead = take_exactly(&c, "ttl.dlq", 4).await?;
    let t2 = now_s();
    assert_eq!(
        bodies(&dead),
        ["e0", "e1", "e2", "e3"],
        "expired in queue order"
    );
    for d in &dead {
        assert_eq!(expiration(d), "");
        check_single_death(
            d,
            &Death {
                queue: "ttl.src",
                reason: "expired",
                count: 1,
                exchange: "",
                keys: &["ttl.src"],
                original_expiration: (body(d) == "e3").then_some("60000"),
                time: (t0 + 4, t2),
            },
        );
    }
    cluster.stop();
    Ok(())
}

// ---- 3. maxlen -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dl_maxlen_drop_head_reject_publish_dlx_and_reject_publish() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(2).await?;
    for p in ["dh", "rpd", "rp"] {
        c.declare_exchange(&format!("{p}.dlx"), "fanout").await?;
        c.declare_queue(&format!("{p}.dlq"), no_args()).await?;
        c.bind(&format!("{p}.dlq"), &format!("{p}.dlx"), "", no_args())
            .await?;
    }
    let limited = |dlx: &str, overflow: &str| {
        dl_args(
            dlx,
            vec![
                ("x-max-length", Value::long(5)),
                ("x-overflow", Value::string(overflow)),
            ],
        )
    };
    c.declare_queue("dh.src", limited("dh.dlx", "drop-head"))
        .await?;
    c.declare_queue("rpd.src", limited("rpd.dlx", "reject-publish-dlx"))
        .await?;
    c.declare_queue("rp.src", limited("rp.dlx", "reject-publish"))
        .await?;
    let t0 = now_s();

    info!("--- reject-publish: the sixth is REJECTED, nothing is dead-lettered");
    publish_bodies(&c, "", "rp.src", &["q0", "q1", "q2", "q3", "q4"]).await?;
    let r = c.publish("", "rp.src", message("q5")).await?;
    assert_eq!(r.outcome, PublishOutcome::Rejected, "{r:?}");
    assert!(r.detail.contains("rp.src"), "detail names the queue: {r:?}");

    info!("--- drop-head: 8 published, the 3 oldest die with reason maxlen");
    let sent = ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"];
    publish_bodies(&c, "", "dh.src", &sent).await?;
    wait_messages(&c, "dh.dlq", 3).await?;
    assert_eq!(c.get_queue("dh.src").await?.messages, 5);

    info!("--- reject-publish-dlx: the sixth is REJECTED and dead-lettered");
    publish_bodies(&c, "", "rpd.src", &["r0", "r1", "r2", "r3", "r4"]).await?;
    let r = c.publish("", "rpd.src", message("r5")).await?;
    assert_eq!(
        r.outcome,
        PublishOutcome::Rejected,
        "the publisher sees REJECTED: {r:?}"
    );
    assert!(
        r.detail.contains("rpd.src"),
        "detail names the queue: {r:?}"
    );
    wait_messages(&c, "rpd.dlq", 1).await?;
    let t1 = now_s();

    let dh = take_exactly(&c, "dh.dlq", 3).await?;
    assert_eq!(bodies(&dh), ["p0", "p1", "p2"], "oldest first");
    for d in &dh {
        check_single_death(
            d,
            &Death {
                queue: "dh.src",
                reason: "maxlen",
                count: 1,
                exchange: "",
                keys: &["dh.src"],
                original_expiration: None,
                time: (t0, t1),
            },
        );
    }
    assert_eq!(
        drain_exactly(&c, "dh.src", 5).await?,
        ["p3", "p4", "p5", "p6", "p7"]
    );

    let rpd = take_exactly(&c, "rpd.dlq", 1).await?;
    assert_eq!(
        body(&rpd[0]),
        "r5",
        "the refused new message is the one dead-lettered"
    );
    check_single_death(
        &rpd[0],
        &Death {
            queue: "rpd.src",
            reason: "maxlen",
            count: 1,
            exchange: "",
            keys: &["rpd.src"],
            original_expiration: None,
            time: (t0, t1),
        },
    );
    assert_eq!(
        drain_exactly(&c, "rpd.src", 5).await?,
        ["r0", "r1", "r2", "r3", "r4"]
    );

    // rp.src was refused before the other two queues' dead letters were observed.
    let rp_dlq = c.get_queue("rp.dlq").await?;
    assert_eq!(
        rp_dlq.messages, 0,
        "reject-publish dead-letters nothing: {rp_dlq:?}"
    );
    assert_eq!(
        drain_exactly(&c, "rp.src", 5).await?,
        ["q0", "q1", "q2", "q3", "q4"]
    );
    assert_eq!(
        dl_counter(&c, "maxlen", "at_most_once").await?,
        4,
        "3 drop-head + 1 reject-publish-dlx"
    );
    cluster.stop();
    Ok(())
}

// ---- 4. delivery_limit -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dl_delivery_limit_after_three_deliveries() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(3).await?;
    c.declare_exchange("dlim.dlx", "fanout").await?;
    c.declare_queue("dlim.dlq", no_args()).await?;
    c.bind("dlim.dlq", "dlim.dlx", "", no_args()).await?;
    c.declare_queue(
        "dlim.src",
        dl_args("dlim.dlx", vec![("x-delivery-limit", Value::long(2))]),
    )
    .await?;
    let t0 = now_s();
    publish_ok(&c, "", "dlim.src", message("poison")).await?;

    info!("--- a consumer that always requeues");
    let mut consumer = c.consume("dlim.src", 1).await?;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let d = next(&mut consumer).await?;
        assert_eq!(body(&d), "poison");
        seen.push((d.redelivered, delivery_count(&d)));
        consumer.nack(d.delivery_tag, false, true).await?;
    }
    assert_eq!(
        seen,
        [(false, None), (true, Some(1)), (true, Some(2))],
        "three deliveries; x-delivery-count on redeliveries (redelivered, x-delivery-count)"
    );
    // After the third requeue it must be dead-lettered, not delivered a fourth time.
    wait_messages(&c, "dlim.dlq", 1).await?;
    wait_messages(&c, "dlim.src", 0).await?;
    let d = take_exactly(&c, "dlim.dlq", 1).await?.remove(0);
    assert_eq!(body(&d), "poison");
    check_single_death(
        &d,
        &Death {
            queue: "dlim.src",
            reason: "delivery_limit",
            count: 1,
            exchange: "",
            keys: &["dlim.src"],
            original_expiration: None,
            time: (t0, now_s()),
        },
    );
    assert_eq!(dl_counter(&c, "delivery_limit", "at_most_once").await?, 1);
    cluster.stop();
    Ok(())
}

// ---- 5. routing ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dl_routing_keys_cc_bcc_default_and_headers_exchange() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    let t0 = now_s();

    info!("--- (a) x-dead-letter-routing-key replaces the keys, CC removed");
    c.declare_exchange("rk.dlx", "topic").await?;
    c.declare_queue(
        "rk.src",
        dl_args(
            "rk.dlx",
            vec![("x-dead-letter-routing-key", Value::string("dead.rk"))],
        ),
    )
    .await?;
    for (q, key) in [
        ("rk.dlq", "dead.rk"),
        ("rk.cc", "cc.key"),
        ("rk.orig", "rk.src"),
    ] {
        c.declare_queue(q, no_args()).await?;
        c.bind(q, "rk.dlx", key, no_args()).await?;
    }
    publish_ok(
        &c,
        "",
        "rk.src",
        MessageBuilder::new("rk")
            .header("CC", string_list(["cc.key"]))
            .build(),
    )
    .await?;
    get_reject(&c, "rk.src").await?;

    info!("--- (b) without it: original key + CC + BCC route; BCC never visible");
    c.declare_exchange("ok.dlx", "topic").await?;
    c.declare_queue("ok.src", dl_args("ok.dlx", vec![])).await?;
    for (q, key) in [
        ("ok.main", "ok.src"),
        ("ok.ccq", "cc.one"),
        ("ok.bccq", "bcc.one"),
    ] {
        c.declare_queue(q, no_args()).await?;
        c.bind(q, "ok.dlx", key, no_args()).await?;
    }
    publish_ok(
        &c,
        "",
        "ok.src",
        MessageBuilder::new("sel")
            .header("CC", string_list(["cc.one"]))
            .header("BCC", string_list(["bcc.one"]))
            .build(),
    )
    .await?;
    let g = c
        .get("ok.src", false, 0)
        .await?
        .delivery
        .context("ok.src has the message")?;
    let h = delivery_headers(&g);
    assert!(
        !h.contains_key("BCC"),
        "BCC is stripped before consumers see it: {h:?}"
    );
    assert!(h.contains_key("CC"), "CC stays: {h:?}");
    c.settle(vec![g.receipt.clone()], SettleOutcome::Reject)
        .await?;

    info!("--- (c) the default exchange as DLX with a routing key naming the DLQ");
    c.declare_queue("de.dlq", no_args()).await?;
    c.declare_queue(
        "de.src",
        dl_args(
            "",
            vec![("x-dead-letter-routing-key", Value::string("de.dlq"))],
        ),
    )
    .await?;
    publish_ok(&c, "", "de.src", message("de")).await?;
    get_reject(&c, "de.src").await?;

    info!("--- (d) a headers exchange matching x-first-death-reason with all-with-x");
    c.declare_exchange("hx.dlx", "headers").await?;
    c.declare_queue("hx.src", dl_args("hx.dlx", vec![])).await?;
    for (q, reason) in [("hx.rejected", "rejected"), ("hx.expired", "expired")] {
        c.declare_queue(q, no_args()).await?;
        let args = table([
            ("x-match", Value::string("all-with-x")),
            ("x-first-death-reason", Value::string(reason)),
        ]);
        c.bind(q, "hx.dlx", "", args).await?;
    }
    publish_ok(&c, "", "hx.src", message("hx-rej")).await?;
    get_reject(&c, "hx.src").await?;
    publish_ok(
        &c,
        "",
        "hx.src",
        MessageBuilder::new("hx-exp").expiration("100").build(),
    )
    .await?;

    wait_messages(&c, "rk.dlq", 1).await?;
    wait_messages(&c, "ok.main", 1).await?;
    wait_messages(&c, "ok.ccq", 1).await?;
    wait_messages(&c, "ok.bccq", 1).await?;
    wait_messages(&c, "de.dlq", 1).await?;
    wait_messages(&c, "hx.rejected", 1).await?;
    wait_messages(&c, "hx.expired", 1).await?;
    let t1 = now_s();

    // (a)
    let d = take_exactly(&c, "rk.dlq", 1).await?.remove(0);
    assert_eq!(
        (d.exchange.as_str(), d.routing_key.as_str()),
        ("rk.dlx", "dead.rk")
    );
    assert!(
        !delivery_headers(&d).contains_key("CC"),
        "CC removed: {:?}",
        delivery_headers(&d)
    );
    check_single_death(
        &d,
        &Death {
            queue: "rk.src",
            reason: "rejected",
            count: 1,
            exchange: "",
            keys: &["rk.src", "cc.key"],
            original_expiration: None,
            time: (t0, t1),
        },
    );
    for q in ["rk.cc", "rk.orig"] {
        let info = c.get_queue(q).await?;
        assert_eq!(
            info.messages, 0,
            "{q}: only the dead-letter routing key routes: {info:?}"
        );
    }

    // (b)
    for q in ["ok.main", "ok.ccq", "ok.bccq"] {
        let d = take_exactly(&c, q, 1).await?.remove(0);
        assert_eq!(body(&d), "sel");
        let h = delivery_headers(&d);
        assert!(!h.contains_key("BCC"), "{q}: BCC never visible: {h:?}");
        assert_eq!(
            h.get("CC").and_then(|v| v.as_list()).map(|l| l.to_vec()),
            Some(vec![Value::string("cc.one")]),
            "{q}: CC kept without a dead-letter routing key"
        );
        assert_eq!(
            (d.exchange.as_str(), d.routing_key.as_str()),
            ("ok.dlx", "ok.src"),
            "{q}"
        );
        check_single_death(
            &d,
            &Death {
                queue: "ok.src",
                reason: "rejected",
                count: 1,
                exchange: "",
                keys: &["ok.src", "cc.one"],
                original_expiration: None,
                time: (t0, t1),
            },
        );
    }

    // (c)
    let d = take_exactly(&c, "de.dlq", 1).await?.remove(0);
    assert_eq!(
        (
            d.exchange.as_str(),
            d.routing_key.as_str(),
            body(&d).as_str()
        ),
        ("", "de.dlq", "de")
    );
    check_single_death(
        &d,
        &Death {
            queue: "de.src",
            reason: "rejected",
            count: 1,
            exchange: "",
            keys: &["de.src"],
            original_expiration: None,
            time: (t0, t1),
        },
    );

    // (d)
    let rej = take_exactly(&c, "hx.rejected", 1).await?.remove(0);
    let exp = take_exactly(&c, "hx.expired", 1).await?.remove(0);
    assert_eq!(body(&rej), "hx-rej");
    assert_eq!(body(&exp), "hx-exp");
    for (d, reason, oe) in [(&rej, "rejected", None), (&exp, "expired", Some("100"))] {
        check_single_death(
            d,
            &Death {
                queue: "hx.src",
                reason,
                count: 1,
                exchange: "",
                keys: &["hx.src"],
                original_expiration: oe,
                time: (t0, t1),
            },
        );
    }
    cluster.stop();
    Ok(())
}

// ---- 6. death history ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dl_death_history_repeat_move_to_front_and_publisher_x_death() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(2).await?;
    c.declare_exchange("h.in", "direct").await?;
    c.declare_exchange("h.dlx", "direct").await?;
    c.declare_queue(
        "h.a",
        dl_args(
            "h.dlx",
            vec![("x-dead-letter-routing-key", Value::string("to.b"))],
        ),
    )
    .await?;
    c.declare_queue(
        "h.b",
        dl_args(
            "h.dlx",
            vec![("x-dead-letter-routing-key", Value::string("to.a"))],
        ),
    )
    .await?;
    c.bind("h.a", "h.in", "start", no_args()).await?;
    c.bind("h.b", "h.dlx", "to.b", no_args()).await?;
    c.bind("h.a", "h.dlx", "to.a", no_args()).await?;

    info!("--- a publisher-supplied x-death and x-first-death-* are not interpreted");
    let fake = Value::list(vec![Value::table(table([
        ("queue", Value::string("fake")),
        ("reason", Value::string("expired")),
        ("count", Value::long(99)),
        ("time", Value::timestamp(1)),
        ("exchange", Value::string("fake.x")),
        ("routing-keys", string_list(["fake"])),
    ]))]);
    let t0 = now_s();
    publish_ok(
        &c,
        "h.in",
        "start",
        MessageBuilder::new("hist")
            .header("x-death", fake)
            .header("x-first-death-reason", Value::string("bogus"))
            .header("x-first-death-queue", Value::string("fake"))
            .build(),
    )
    .await?;

    info!("--- reject in h.a → h.b");
    assert_eq!(get_reject(&c, "h.a").await?, "hist");
    wait_messages(&c, "h.b", 1).await?;
    let g = c
        .get("h.b", false, 0)
        .await?
        .delivery
        .context("h.b has it")?;
    let t1 = now_s();
    let deaths = x_death(&g);
    assert_eq!(
        deaths.len(),
        1,
        "the broker's history replaced the publisher's: {deaths:?}"
    );
    let a_time = check_death(
        "1st death",
        &deaths[0],
        &Death {
            queue: "h.a",
            reason: "rejected",
            count: 1,
            exchange: "h.in",
            keys: &["start"],
            original_expiration: None,
            time: (t0, t1),
        },
    );
    check_first_last(&g, ("rejected", "h.a", "h.in"), ("rejected", "h.a", "h.in"));
    assert_eq!(
        (g.exchange.as_str(), g.routing_key.as_str()),
        ("h.dlx", "to.b")
    );

    info!("--- reject in h.b → h.a (a rejection in the loop: keeps routing)");
    c.settle(vec![g.receipt.clone()], SettleOutcome::Reject)
        .await?;
    wait_messages(&c, "h.a", 1).await?;
    let g = c
        .get("h.a", false, 0)
        .await?
        .delivery
        .context("h.a has it again")?;
    let t2 = now_s();
    let deaths = x_death(&g);
    assert_eq!(deaths.len(), 2, "{deaths:?}");
    let b_time = check_death(
        "2nd death",
        &deaths[0],
        &Death {
            queue: "h.b",
            reason: "rejected",
            count: 1,
            exchange: "h.dlx",
            keys: &["to.b"],
            original_expiration: None,
            time: (t1, t2),
        },
    );
    check_death(
        "2nd death, older entry",
        &deaths[1],
        &Death {
            queue: "h.a",
            reason: "rejected",
            count: 1,
            exchange: "h.in",
            keys: &["start"],
            original_expiration: None,
            time: (a_time, a_time),
        },
    );
    check_first_last(
        &g,
        ("rejected", "h.a", "h.in"),
        ("rejected", "h.b", "h.dlx"),
    );

    info!("--- reject in h.a again: count 2, entry moved to the front, nothing else changes");
    c.settle(vec![g.receipt.clone()], SettleOutcome::Reject)
        .await?;
    wait_messages(&c, "h.b", 1).await?;
    let g = take_exactly(&c, "h.b", 1).await?.remove(0);
    let deaths = x_death(&g);
    assert_eq!(deaths.len(), 2, "{deaths:?}");
    check_death(
        "3rd death (repeat of h.a/rejected)",
        &deaths[0],
        &Death {
            queue: "h.a",
            reason: "rejected",
            count: 2,
            exchange: "h.in",
            keys: &["start"],
            original_expiration: None,
            time: (a_time, a_time),
        },
    );
    check_death(
        "3rd death, older entry",
        &deaths[1],
        &Death {
            queue: "h.b",
            reason: "rejected",
            count: 1,
            exchange: "h.dlx",
            keys: &["to.b"],
            original_expiration: None,
            time: (b_time, b_time),
        },
    );
    check_first_last(
        &g,
        ("rejected", "h.a", "h.in"),
        ("rejected", "h.a", "h.dlx"),
    );
    assert_eq!(c.get_queue("h.a").await?.messages, 0);
    cluster.stop();
    Ok(())
}

// ---- 7. cycles -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dl_cycles_expiry_loop_dropped_rejection_loop_routes() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(3).await?;
    let ttl = |to: &str| {
        dl_args(
            "",
            vec![
                ("x-dead-letter-routing-key", Value::string(to)),
                ("x-message-ttl", Value::long(200)),
            ],
        )
    };
    info!("--- expiry loop c.a (ttl) → c.b (ttl) → c.a");
    c.declare_queue("c.a", ttl("c.b")).await?;
    c.declare_queue("c.b", ttl("c.a")).await?;
    info!("--- rejection loop r.a (reject) → r.b (ttl) → r.a");
    c.declare_queue(
        "r.a",
        dl_args(
            "",
            vec![("x-dead-letter-routing-key", Value::string("r.b"))],
        ),
    )
    .await?;
    c.declare_queue("r.b", ttl("r.a")).await?;

    let t0 = now_s();
    publish_ok(&c, "", "c.a", message("loop")).await?;
    publish_ok(&c, "", "r.a", message("spin")).await?;
    for lap in 1..=3u64 {
        assert_eq!(get_reject(&c, "r.a").await?, "spin", "lap {lap}");
        eventually(
            &format!("lap {lap}: the rejection applied"),
            WAIT,
            || async {
                Ok((dl_counter(&c, "rejected", "at_most_once").await? == lap).then_some(()))
            },
        )
        .await?;
        // It expires in r.b and comes back to r.a: the rejection keeps it routing.
        let back = wait_messages(&c, "r.a", 1)
            .await
            .with_context(|| format!("lap {lap}: back in r.a"))?;
        assert_eq!(back.messages_ready, 1);
    }
    let d = take_exactly(&c, "r.a", 1).await?.remove(0);
    let t1 = now_s();
    let deaths = x_death(&d);
    assert_eq!(deaths.len(), 2, "{deaths:?}");
    check_death(
        "r.b expired x3",
        &deaths[0],
        &Death {
            queue: "r.b",
            reason: "expired",
            count: 3,
            exchange: "",
            keys: &["r.b"],
            original_expiration: None,
            time: (t0, t1),
        },
    );
    check_death(
        "r.a rejected x3",
        &deaths[1],
        &Death {
            queue: "r.a",
            reason: "rejected",
            count: 3,
            exchange: "",
            keys: &["r.a"],
            original_expiration: None,
            time: (t0, t1),
        },
    );
    check_first_last(&d, ("rejected", "r.a", ""), ("expired", "r.b", ""));

    info!("--- the expiry loop dropped its message after one lap (2 deaths)");
    for q in ["c.a", "c.b"] {
        let info = c.get_queue(q).await?;
        assert_eq!(info.messages, 0, "{q}: {info:?}");
    }
    // 3 expiries in r.b, 2 in the c loop (c.a, then c.b; the copy back to c.a is dropped).
    let expired = dl_counter(&c, "expired", "at_most_once").await?;
    assert_eq!(
        expired, 5,
        "expired dead-letterings: 3 (r.b) + 2 (c loop, then dropped)"
    );
    assert_eq!(dl_counter(&c, "rejected", "at_most_once").await?, 3);

    info!("--- at-least-once into itself: held (never dropped) until a policy gives a target");
    c.declare_queue("cyc.dlq", Default::default()).await?;
    c.declare_queue(
        "cyc",
        dl_args(
            "",
            vec![
                ("x-dead-letter-strategy", Value::string("at-least-once")),
                ("x-overflow", Value::string("reject-publish")),
                ("x-message-ttl", Value::long(200)),
            ],
        ),
    )
    .await?;
    publish_ok(&c, "", "cyc", message("self")).await?;
    wait_queue(&c, "cyc", "the expired message held", |q| {
        q.messages_dead_letter_held == 1 && q.messages_ready == 0
    })
    .await?;
    // Retries (dead_letter_retry_ms, 3 s) find only the cycle: it stays held.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let q = c.get_queue("cyc").await?;
        assert_eq!(
            q.messages_dead_letter_held, 1,
            "a held dead letter was dropped: {q:?}"
        );
    }
    let mut def = HashMap::new();
    def.insert(
        "dead-letter-routing-key".to_string(),
        Value::string("cyc.dlq"),
    );
    c.set_policy("cyc-out", "^cyc$", "queues", 0, def).await?;
    wait_queue(&c, "cyc", "the held dead letter transferred", |q| {
        q.messages == 0 && q.messages_dead_letter_held == 0
    })
    .await?;
    let d = take_exactly(&c, "cyc.dlq", 1).await?.remove(0);
    assert_eq!(body(&d), "self");
    cluster.stop();
    Ok(())
}

// ---- 8. missing DLX / no route ---------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dl_missing_dlx_at_most_once_drops_at_least_once_holds() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    info!("--- at-most-once to a missing DLX: dropped and counted");
    c.declare_queue("amo.src", dl_args("amo.missing", vec![]))
        .await?;
    publish_bodies(&c, "", "amo.src", &["x0", "x1"]).await?;
    get_reject(&c, "amo.src").await?;
    get_reject(&c, "amo.src").await?;
    wait_messages(&c, "amo.src", 0).await?;
    eventually(
        "2 rejected at-most-once dead letters counted",
        WAIT,
        || async { Ok((dl_counter(&c, "rejected", "at_most_once").await? == 2).then_some(())) },
    )
    .await?;

    info!("--- at-least-once to a missing DLX: held in the source");
    c.declare_queue(
        "alo.src",
        dl_args(
            "alo.dlx",
            vec![
                ("x-dead-letter-strategy", Value::string("at-least-once")),
                ("x-overflow", Value::string("reject-publish")),
                ("x-max-length", Value::long(5)),
            ],
        ),
    )
    .await?;
    let eff = c.get_queue("alo.src").await?.effective.unwrap_or_default();
    assert_eq!(
        norm_strategy(&eff.dead_letter_strategy),
        "at_least_once",
        "{eff:?}"
    );
    let sent = ["a0", "a1", "a2", "a3", "a4"];
    publish_bodies(&c, "", "alo.src", &sent).await?;
    let mut consumer = c.consume("alo.src", 10).await?;
    for want in sent {
        let d = next(&mut consumer).await?;
        assert_eq!(body(&d), want);
        consumer.reject(d.delivery_tag).await?;
    }
    let q = wait_queue(&c, "alo.src", "5 held", |q| {
        q.messages_dead_letter_held == 5
    })
    .await?;
    assert_eq!(
        (q.messages, q.messages_ready, q.messages_unacked),
        (5, 0, 0),
        "held dead letters count in messages: {q:?}"
    );
    // No consumer waiting: a message a waiting consumer takes at once is never "ready".
    drop(consumer);
    wait_queue(&c, "alo.src", "no consumer", |q| q.consumers == 0).await?;
    let r = c.publish("", "alo.src", message("a5")).await?;
    assert_eq!(
        r.outcome,
        PublishOutcome::Rejected,
        "held dead letters count against x-max-length 5: {r:?}"
    );

    info!("--- the DLX alone (no binding) still routes nothing");
    c.declare_exchange("alo.dlx", "fanout").await?;
    c.declare_queue("alo.dlq", no_args()).await?;
    // Also declare the at-most-once source's DLX now: its dropped letters must not come back.
    c.declare_exchange("amo.missing", "fanout").await?;
    c.declare_queue("amo.late", no_args()).await?;
    c.bind("amo.late", "amo.missing", "", no_args()).await?;
    let q = c.get_queue("alo.src").await?;
    assert_eq!(q.messages_dead_letter_held, 5, "{q:?}");

    info!("--- binding the DLQ delivers the held letters at once (before the 3 s retry)");
    let bound = Instant::now();
    c.bind("alo.dlq", "alo.dlx", "", no_args()).await?;
    let q = wait_queue(&c, "alo.src", "nothing held", |q| {
        q.messages == 0 && q.messages_dead_letter_held == 0
    })
    .await?;
    let took = bound.elapsed();
    wait_messages(&c, "alo.dlq", 5).await?;
    let dead = take_exactly(&c, "alo.dlq", 5).await?;
    let got: BTreeSet<String> = bodies(&dead).into_iter().collect();
    assert_eq!(
        got,
        sent.iter().map(|s| s.to_string()).collect(),
        "every held letter delivered once"
    );
    for d in &dead {
        let deaths = x_death(d);
        assert_eq!(deaths.len(), 1);
        assert_eq!(
            deaths[0].get("reason").and_then(|v| v.as_str()),
            Some("rejected")
        );
        assert_eq!(
            deaths[0].get("queue").and_then(|v| v.as_str()),
            Some("alo.src")
        );
    }
    assert_eq!(
        c.get_queue("amo.late").await?.messages,
        0,
        "at-most-once drops are final"
    );
    assert_eq!(q.messages_dead_letter_held, 0);
    let (counters, confirmed) = dl_counters(&c).await?;
    assert_eq!(
        counters.get(&("rejected".into(), "at_least_once".into())),
        Some(&5),
        "{counters:?}"
    );
    assert_eq!(confirmed, 5, "5 at-least-once transfers confirmed");
    assert!(
        took < Duration::from_millis(2500),
        "held letters delivered {took:?} after the binding appeared; expected at once on the topology change"
    );
    assert_eq!(
        bodies(&dead),
        sent,
        "at-least-once retries keep the order in which they died"
    );

    info!(
        "--- {HELD_MANY} held dead letters: several transfer rounds, settles overlapping, in order"
    );
    c.declare_queue(
        "alo.many",
        dl_args(
            "alo.many.dlx",
            vec![
                ("x-dead-letter-strategy", Value::string("at-least-once")),
                ("x-overflow", Value::string("reject-publish")),
            ],
        ),
    )
    .await?;
    publish_confirmed(
        &c,
        "alo.many",
        (0..HELD_MANY).map(|i| message(format!("m{i:05}"))),
    )
    .await?;
    let mut consumer = c.consume("alo.many", HELD_MANY as u32).await?;
    let mut died = Vec::with_capacity(HELD_MANY);
    let mut last_tag = 0;
    while died.len() < HELD_MANY {
        let d = next(&mut consumer).await?;
        last_tag = d.delivery_tag;
        died.push(body(&d));
    }
    // One multiple reject: they die in delivery order.
    consumer.nack(last_tag, true, false).await?;
    wait_queue(&c, "alo.many", "all held", |q| {
        q.messages_dead_letter_held == HELD_MANY as u64
    })
    .await?;
    drop(consumer);
    c.declare_exchange("alo.many.dlx", "fanout").await?;
    c.declare_queue("alo.many.dlq", no_args()).await?;
    c.bind("alo.many.dlq", "alo.many.dlx", "", no_args())
        .await?;
    wait_queue(&c, "alo.many", "nothing held", |q| {
        q.messages == 0 && q.messages_dead_letter_held == 0
    })
    .await?;
    let dlq = wait_messages(&c, "alo.many.dlq", HELD_MANY as u64).await?;
    assert_eq!(dlq.messages, HELD_MANY as u64, "exactly once: {dlq:?}");
    let mut consumer = c.consume("alo.many.dlq", 1000).await?;
    let mut arrived = Vec::with_capacity(HELD_MANY);
    while arrived.len() < HELD_MANY {
        let d = next(&mut consumer).await?;
        arrived.push(body(&d));
        consumer.ack(d.delivery_tag, false).await?;
    }
    if let Some(at) = arrived.iter().zip(&died).position(|(a, b)| a != b) {
        let around = at.saturating_sub(3)..(at + 5).min(HELD_MANY);
        panic!(
            "the DLQ holds them in the order they died: first difference at {at}: arrived {:?}, died {:?}",
            &arrived[around.clone()],
            &died[around]
        );
    }
    cluster.stop();
    Ok(())
}

/// More held dead letters than one transfer round takes (qq-node's `TRANSFER_BATCH` is 4 096).
const HELD_MANY: usize = 9000;

// ---- 9. configuration ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dl_config_validation_policies_and_precedence() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(2).await?;

    info!("--- refused declares");
    assert_status(
        c.declare_queue(
            "bad.rk",
            table([("x-dead-letter-routing-key", Value::string("k"))]),
        )
        .await,
        tonic::Code::InvalidArgument,
        "x-dead-letter-routing-key",
    );
    assert_status(
        c.declare_queue(
            "bad.alo",
            dl_args(
                "some.dlx",
                vec![
                    ("x-dead-letter-strategy", Value::string("at-least-once")),
                    ("x-overflow", Value::string("drop-head")),
                ],
            ),
        )
        .await,
        tonic::Code::FailedPrecondition,
        "at-least-once",
    );
    assert_status(
        c.declare_queue(
            "bad.alo2",
            dl_args(
                "some.dlx",
                vec![("x-dead-letter-strategy", Value::string("at-least-once"))],
            ),
        )
        .await,
        tonic::Code::FailedPrecondition,
        "at-least-once",
    );
    for q in ["bad.rk", "bad.alo", "bad.alo2"] {
        assert!(c.get_queue(q).await.is_err(), "{q} was not created");
    }

    info!("--- a policy sets dead-letter-exchange live; the argument wins for dead-letter keys");
    for (x, q) in [("pol.dlx", "pol.dlq"), ("arg.dlx", "arg.dlq")] {
        c.declare_exchange(x, "fanout").await?;
        c.declare_queue(q, no_args()).await?;
        c.bind(q, x, "", no_args()).await?;
    }
    c.declare_queue("pol.src", no_args()).await?;
    c.declare_queue(
        "pol.arg",
        dl_args(
            "arg.dlx",
            vec![("x-dead-letter-routing-key", Value::string("arg.rk"))],
        ),
    )
    .await?;
    publish_bodies(&c, "", "pol.src", &["ps"]).await?;
    publish_bodies(&c, "", "pol.arg", &["pa"]).await?;
    c.set_policy(
        "dlx",
        r"^pol\.",
        "queues",
        0,
        table([
            ("dead-letter-exchange", Value::string("pol.dlx")),
            ("dead-letter-routing-key", Value::string("policy.rk")),
        ]),
    )
    .await?;
    let q = wait_queue(&c, "pol.src", "the policy's DLX in effect", |q| {
        q.effective
            .as_ref()
            .is_some_and(|e| e.dead_letter_exchange == "pol.dlx")
    })
    .await?;
    assert_eq!(q.policy, "dlx");
    let eff = q.effective.unwrap_or_default();
    assert_eq!(eff.dead_letter_routing_key, "policy.rk", "{eff:?}");
    assert_eq!(
        norm_strategy(&eff.dead_letter_strategy),
        "at_most_once",
        "{eff:?}"
    );
    let q = wait_queue(&c, "pol.arg", "the policy applied", |q| q.policy == "dlx").await?;
    let eff = q.effective.unwrap_or_default();
    assert_eq!(
        (
            eff.dead_letter_exchange.as_str(),
            eff.dead_letter_routing_key.as_str()
        ),
        ("arg.dlx", "arg.rk"),
        "arguments win for dead-letter keys: {eff:?}"
    );
    get_reject(&c, "pol.src").await?;
    get_reject(&c, "pol.arg").await?;
    wait_messages(&c, "pol.dlq", 1).await?;
    wait_messages(&c, "arg.dlq", 1).await?;
    let d = take_exactly(&c, "pol.dlq", 1).await?.remove(0);
    assert_eq!(
        (
            body(&d).as_str(),
            d.exchange.as_str(),
            d.routing_key.as_str()
        ),
        ("ps", "pol.dlx", "policy.rk")
    );
    let d = take_exactly(&c, "arg.dlq", 1).await?.remove(0);
    assert_eq!(
        (
            body(&d).as_str(),
            d.exchange.as_str(),
            d.routing_key.as_str()
        ),
        ("pa", "arg.dlx", "arg.rk")
    );

    info!("--- at-least-once from a policy on a drop-head queue: effective strategy with a note");
    c.declare_queue("alo.q", no_args()).await?;
    c.set_policy(
        "alo",
        r"^alo\.",
        "queues",
        0,
        table([
            ("dead-letter-exchange", Value::string("pol.dlx")),
            ("dead-letter-strategy", Value::string("at-least-once")),
        ]),
    )
    .await?;
    let q = wait_queue(&c, "alo.q", "the alo policy applied", |q| q.policy == "alo").await?;
    let eff = q.effective.unwrap_or_default();
    assert_eq!(eff.dead_letter_exchange, "pol.dlx");
    assert_eq!(eff.overflow, "drop-head", "{eff:?}");
    assert_eq!(
        norm_strategy(&eff.dead_letter_strategy),
        "at_most_once",
        "the effective strategy: {eff:?}"
    );
    assert!(
        eff.note.contains("at-least-once") && eff.note.contains("reject-publish"),
        "a note says why: {eff:?}"
    );
    info!("--- the same policy plus overflow reject-publish gives at-least-once, no note");
    c.set_policy(
        "alo",
        r"^alo\.",
        "queues",
        0,
        table([
            ("dead-letter-exchange", Value::string("pol.dlx")),
            ("dead-letter-strategy", Value::string("at-least-once")),
            ("overflow", Value::string("reject-publish")),
        ]),
    )
    .await?;
    let q = wait_queue(&c, "alo.q", "overflow reject-publish in effect", |q| {
        q.effective
            .as_ref()
            .is_some_and(|e| e.overflow == "reject-publish")
    })
    .await?;
    let eff = q.effective.unwrap_or_default();
    assert_eq!(
        norm_strategy(&eff.dead_letter_strategy),
        "at_least_once",
        "{eff:?}"
    );
    assert_eq!(eff.note, "", "{eff:?}");
    cluster.stop();
    Ok(())
}

// ---- 10. at-least-once under leader kills ----------------------------------------------------

const HA_MESSAGES: usize = 5000;
const HA_SRC: &str = "ha.src";

fn ha_body(i: usize) -> String {
    format!("ha-{i:05}")
}

/// Publishes every message with confirms through one stream (no node is killed yet).
async fn ha_publish(c: &Client) -> anyhow::Result<()> {
    publish_confirmed(
        c,
        HA_SRC,
        (0..HA_MESSAGES).map(|i| {
            MessageBuilder::new(ha_body(i))
                .message_id(ha_body(i))
                .build()
        }),
    )
    .await
}

/// Publishes `messages` to `queue` through the default exchange on one stream (window 256)
/// and checks that every one was confirmed.
async fn publish_confirmed(
    c: &Client,
    queue: &str,
    messages: impl IntoIterator<Item = qq_client::Message>,
) -> anyhow::Result<()> {
    let mut publisher = c.publisher(256).await?;
    let mut sent = 0;
    for m in messages {
        publisher.send("", queue, m).await?;
        sent += 1;
    }
    let confirms = publisher.close().await?;
    ensure!(
        confirms.len() == sent,
        "{} confirms of {sent}",
        confirms.len()
    );
    if let Some(bad) = confirms.iter().find(|c| !c.is_confirmed()) {
        bail!("not confirmed: {bad:?}");
    }
    Ok(())
}

/// Rejects everything it receives (multiple rejects every 100 deliveries, or when idle), and
/// reconnects (rotating over the nodes) when the stream breaks.
async fn ha_rejector(
    addresses: Vec<String>,
    stop: Arc<AtomicBool>,
    rejected_batches: Arc<AtomicUsize>,
) {
    let mut attempt = 0usize;
    while !stop.load(Ordering::Acquire) {
        let address = &addresses[attempt % addresses.len()];
        attempt += 1;
        let consumer = async {
            let c = Client::connect(address).await?;
            anyhow::Ok(c.consume(HA_SRC, 500).await?)
        }
        .await;
        let mut consumer = match consumer {
            Ok(c) => c,
            Err(e) => {
                warn!(%address, "rejector: cannot subscribe: {e:#}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut last_tag = None;
        let mut pending = 0usize;
        let mut idle = 0;
        loop {
            if stop.load(Ordering::Acquire) {
                return;
            }
            match tokio::time::timeout(Duration::from_millis(500), consumer.next()).await {
                Ok(Some(Ok(d))) => {
                    idle = 0;
                    last_tag = Some(d.delivery_tag);
                    pending += 1;
                    if pending >= 100 {
                        if consumer.nack(d.delivery_tag, true, false).await.is_err() {
                            break;
                        }
                        rejected_batches.fetch_add(1, Ordering::Relaxed);
                        pending = 0;
                    }
                }
                Ok(Some(Err(e))) => {
                    warn!(%address, "rejector: stream error: {e}");
                    break;
                }
                Ok(None) => {
                    warn!(%address, "rejector: stream ended");
                    break;
                }
                Err(_) => {
                    if pending > 0 {
                        if let Some(tag) = last_tag
                            && consumer.nack(tag, true, false).await.is_err()
                        {
                            break;
                        }
                        rejected_batches.fetch_add(1, Ordering::Relaxed);
                        pending = 0;
                    }
                    idle += 1;
                    // A relay that silently stopped: resubscribe after 6 s without deliveries.
                    if idle >= 12 {
                        break;
                    }
                }
            }
        }
    }
}

/// `GetQueue` through any live node.
async fn ha_queue(cluster: &TestCluster, queue: &str) -> anyhow::Result<QueueInfo> {
    let mut last = None;
    for id in cluster.live_ids() {
        match async { anyhow::Ok(cluster.client(id).await?.get_queue(queue).await?) }.await {
            Ok(q) => return Ok(q),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no live node")))
}

async fn ha_wait(
    cluster: &TestCluster,
    queue: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&QueueInfo) -> bool,
) -> anyhow::Result<QueueInfo> {
    let pred = &pred;
    eventually(&format!("{queue}: {what}"), timeout, || async move {
        let q = ha_queue(cluster, queue).await?;
        Ok(pred(&q).then_some(q))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dl_at_least_once_exactly_once_through_leader_kills() -> anyhow::Result<()> {
    let started = Instant::now();
    let mut cluster = TestCluster::start(3).await?;
    let setup = cluster.client(1).await?;
    setup.declare_exchange("ha.dlx", "fanout").await?;
    setup
        .declare_queue(
            HA_SRC,
            dl_args(
                "ha.dlx",
                vec![
                    ("x-dead-letter-strategy", Value::string("at-least-once")),
                    ("x-overflow", Value::string("reject-publish")),
                ],
            ),
        )
        .await?;
    let src_leader = cluster.leader_of(HA_SRC).await?;
    // A target led by another node (leaders are spread; try a few names).
    let mut dlq = None;
    for i in 0..6 {
        let name = format!("ha.dlq{i}");
        setup.declare_queue(&name, no_args()).await?;
        if cluster.leader_of(&name).await? != src_leader {
            dlq = Some(name);
            break;
        }
        setup.delete_queue(&name, false, false).await?;
    }
    let dlq = dlq.context("no DLQ candidate got a leader other than the source's")?;
    setup.bind(&dlq, "ha.dlx", "", no_args()).await?;
    let dlq_leader = cluster.leader_of(&dlq).await?;
    info!(src_leader, dlq_leader, dlq = %dlq, "--- source and target led by different nodes");

    info!("--- publish {HA_MESSAGES} messages");
    let t_pub = Instant::now();
    ha_publish(&setup).await?;
    info!(elapsed = ?t_pub.elapsed(), "--- published");

    info!("--- a consumer rejects everything (multiple rejects, prefetch 500)");
    let stop = Arc::new(AtomicBool::new(false));
    let batches = Arc::new(AtomicUsize::new(0));
    let addresses: Vec<String> = cluster
        .others(src_leader)
        .into_iter()
        .chain([src_leader])
        .map(|id| cluster.address(id).to_string())
        .collect();
    let rejector = tokio::spawn(ha_rejector(addresses, stop.clone(), batches.clone()));
    let t_rej = Instant::now();

    let result: anyhow::Result<()> = async {
        ha_wait(
            &cluster,
            &dlq,
            "1000 dead letters arrived",
            Duration::from_secs(120),
            |q| q.messages >= 1000,
        )
        .await?;
        let leader = cluster.leader_of(HA_SRC).await?;
        info!(leader, "--- kill -9 the source queue's leader");
        cluster.kill9(leader);
        let new_leader = cluster.leader_of_except(HA_SRC, leader).await?;
        info!(new_leader, "--- source re-elected; restart the killed node");
        cluster.restart(leader).await?;

        let q = ha_wait(
            &cluster,
            &dlq,
            "3000 dead letters arrived",
            Duration::from_secs(120),
            |q| q.messages >= 3000,
        )
        .await?;
        info!(
            dlq_messages = q.messages,
            "--- kill -9 the target queue's leader"
        );
        let target_leader = cluster.leader_of(&dlq).await?;
        cluster.kill9(target_leader);
        cluster.leader_of_except(&dlq, target_leader).await?;
        cluster.restart(target_leader).await?;

        info!("--- wait until everything is dead-lettered and nothing is held");
        let src = ha_wait(
            &cluster,
            HA_SRC,
            "empty, nothing held",
            Duration::from_secs(180),
            |q| q.messages == 0 && q.messages_dead_letter_held == 0,
        )
        .await?;
        info!(elapsed = ?t_rej.elapsed(), "--- source drained");
        ensure!(src.messages_dead_letter_held == 0, "{src:?}");
        Ok(())
    }
    .await;
    stop.store(true, Ordering::Release);
    let _ = rejector.await;
    result?;

    let q = ha_wait(
        &cluster,
        &dlq,
        &format!("{HA_MESSAGES} dead letters"),
        Duration::from_secs(30),
        |q| q.messages >= HA_MESSAGES as u64,
    )
    .await?;
    assert_eq!(
        q.messages, HA_MESSAGES as u64,
        "exactly once in the DLQ (no duplicates): {q:?}"
    );

    info!("--- drain the DLQ and compare ids");
    let node = cluster.live_ids()[0];
    let c = cluster.client(node).await?;
    let mut consumer = c.consume(&dlq, 1000).await?;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut received = 0;
    while received < HA_MESSAGES {
        let d = next(&mut consumer).await?;
        received += 1;
        let id = d
            .message
            .as_ref()
            .and_then(|m| m.properties.as_ref())
            .map(|p| p.message_id.clone())
            .unwrap_or_default();
        assert_eq!(id, body(&d), "message id travels with the dead letter");
        *seen.entry(body(&d)).or_default() += 1;
        if received % 500 == 0 {
            consumer.ack(d.delivery_tag, true).await?;
        }
    }
    let dups: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    let want: BTreeSet<String> = (0..HA_MESSAGES).map(ha_body).collect();
    let missing: Vec<_> = want
        .iter()
        .filter(|b| !seen.contains_key(*b))
        .take(10)
        .collect();
    assert!(
        dups.is_empty(),
        "duplicates in the DLQ: {} (first: {:?})",
        dups.len(),
        dups.iter().take(10).collect::<Vec<_>>()
    );
    assert!(missing.is_empty(), "missing from the DLQ: {missing:?}");
    assert_eq!(seen.len(), HA_MESSAGES);
    wait_queue(&c, &dlq, "drained", |q| q.messages == 0).await?;
    let src = c.get_queue(HA_SRC).await?;
    assert_eq!(
        (src.messages, src.messages_dead_letter_held),
        (0, 0),
        "{src:?}"
    );
    let (counters, confirmed) = dl_counters(&c).await?;
    assert_eq!(
        counters.get(&("rejected".into(), "at_least_once".into())),
        Some(&(HA_MESSAGES as u64)),
        "each message died once: {counters:?}"
    );
    assert_eq!(
        confirmed, HA_MESSAGES as u64,
        "each transfer confirmed once"
    );
    let took = started.elapsed();
    info!(
        ?took,
        reject_batches = batches.load(Ordering::Relaxed),
        "--- at-least-once under leader kills done"
    );
    println!(
        "dl_at_least_once_exactly_once_through_leader_kills: {HA_MESSAGES} messages in {took:?}"
    );
    cluster.stop();
    Ok(())
}

// ---- 11. Overview counters -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dl_overview_counters_by_reason_and_strategy() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    let (before, confirmed_before) = dl_counters(&c).await?;
    assert_eq!(
        before.len(),
        12,
        "4 reasons x 3 strategies, zeros included: {before:?}"
    );
    assert!(
        before.values().all(|n| *n == 0) && confirmed_before == 0,
        "{before:?}"
    );

    c.declare_exchange("ov.dlx", "fanout").await?;
    c.declare_queue("ov.dlq", no_args()).await?;
    c.bind("ov.dlq", "ov.dlx", "", no_args()).await?;
    c.declare_queue("ov.none", no_args()).await?;
    c.declare_queue("ov.amo", dl_args("ov.dlx", vec![])).await?;
    c.declare_queue(
        "ov.ttl",
        dl_args("ov.dlx", vec![("x-message-ttl", Value::long(100))]),
    )
    .await?;
    c.declare_queue(
        "ov.len",
        dl_args("ov.dlx", vec![("x-max-length", Value::long(1))]),
    )
    .await?;
    c.declare_queue(
        "ov.lim",
        dl_args("ov.dlx", vec![("x-delivery-limit", Value::long(0))]),
    )
    .await?;
    c.declare_queue(
        "ov.alo",
        dl_args(
            "ov.dlx",
            vec![
                ("x-dead-letter-strategy", Value::string("at-least-once")),
                ("x-overflow", Value::string("reject-publish")),
            ],
        ),
    )
    .await?;

    publish_bodies(&c, "", "ov.none", &["n0"]).await?;
    get_reject(&c, "ov.none").await?; // rejected / disabled
    publish_bodies(&c, "", "ov.amo", &["a0", "a1"]).await?;
    get_and_settle(&c, "ov.amo", 2, &[0, 1], SettleOutcome::Reject).await?; // rejected / at_most_once x2
    publish_bodies(&c, "", "ov.ttl", &["t0"]).await?; // expired / at_most_once
    publish_bodies(&c, "", "ov.len", &["l0", "l1"]).await?; // maxlen / at_most_once
    publish_bodies(&c, "", "ov.lim", &["d0"]).await?;
    get_and_settle(&c, "ov.lim", 1, &[0], SettleOutcome::Requeue).await?; // delivery_limit / at_most_once
    publish_bodies(&c, "", "ov.alo", &["s0", "s1", "s2"]).await?;
    get_and_settle(&c, "ov.alo", 3, &[0, 1, 2], SettleOutcome::Reject).await?; // rejected / at_least_once x3

    wait_messages(&c, "ov.dlq", 8).await?;
    wait_queue(&c, "ov.alo", "transfers confirmed", |q| {
        q.messages == 0 && q.messages_dead_letter_held == 0
    })
    .await?;
    let mut want: BTreeMap<(String, String), u64> = BTreeMap::new();
    for r in ["rejected", "expired", "maxlen", "delivery_limit"] {
        for s in ["disabled", "at_most_once", "at_least_once"] {
            want.insert((r.into(), s.into()), 0);
        }
    }
    for ((r, s), n) in [
        (("rejected", "disabled"), 1),
        (("rejected", "at_most_once"), 2),
        (("expired", "at_most_once"), 1),
        (("maxlen", "at_most_once"), 1),
        (("delivery_limit", "at_most_once"), 1),
        (("rejected", "at_least_once"), 3),
    ] {
        want.insert((r.into(), s.into()), n);
    }
    for id in cluster.ids() {
        let node = cluster.client(id).await?;
        let (got, confirmed) =
            eventually(&format!("node {id}: the expected counters"), WAIT, || {
                let node = node.clone();
                let want = want.clone();
                async move {
                    let (got, confirmed) = dl_counters(&node).await?;
                    if got == want && confirmed == 3 {
                        Ok(Some((got, confirmed)))
                    } else {
                        bail!("got {got:?}, confirmed {confirmed}")
                    }
                }
            })
            .await?;
        assert_eq!(got, want);
        assert_eq!(confirmed, 3, "only at-least-once transfers are confirmed");
    }
    cluster.stop();
    Ok(())
}
