//! Scenario 13, priority queues: a backlog of messages of mixed priorities, drained by one
//! consumer, on quorumq's strict priority levels and on RabbitMQ's priority queue. Run only
//! when named (`--scenarios 13`; `--priority-messages N`, `--priority-prefetch P`).
//!
//! What: one publisher puts `messages` persistent messages of `body_bytes` into one queue with
//! confirms (window `window`), each with a `priority` property drawn uniformly from 0..=10 by a
//! seeded generator (the same sequence for every system); only once every one is confirmed and
//! counted in the queue does one consumer (prefetch `prefetch`, manual acks, one at a time)
//! drain it. Figures: the publish rate into the backlog, the drain rate (from the subscribe to
//! the last ack sent), and the out-of-order deliveries.
//!
//! Why: priority queues trade FIFO for "the most urgent first", and the one promise worth
//! checking is the order. With the whole backlog in the queue before the consumer starts and
//! nothing published meanwhile, a strict priority queue has exactly one right order: priority
//! descending, publish order within a priority, whatever the prefetch (the first `prefetch`
//! deliveries are already the highest). Each body carries its publish sequence number and its
//! priority, so the check needs no shared table. A delivery is *out of order* when it should
//! have come before the delivery just before it (a higher priority, or the same priority and
//! published earlier); the notes add the pairs delivered lower-before-higher, the FIFO breaks
//! within a level and the deliveries not at their place in the one right order. The run fails
//! rather than report figures if a message is missing, duplicated or carries another priority
//! than the one it was published with.
//!
//! The queues: quorumq, a quorum queue with three replicas declared with `x-max-priority` 10
//! (strict levels 0..=10 as RabbitMQ 4.3's quorum queues: a message's level is its priority
//! capped at 10, the highest non-empty level goes first, FIFO within a level), driven over gRPC
//! with qq-client and, as the quorumq/AMQP column, over its AMQP port with lapin. The declare
//! needs the metadata machine at version 2 (a fresh cluster moves there within seconds:
//! `quorumq_metadata_machine_version` on `/metrics` is awaited, then the declare is retried
//! for up to 30 s) and the queue's own machine at version 2 before a priority is stored (until
//! then every message is level 0), so `quorumq_queue_machine_version` of the queue is awaited
//! on every node before the first publish. RabbitMQ: 3.10 refuses `x-max-priority` on a quorum
//! queue, which the scenario first tries and records; it then uses a durable *classic* queue
//! with `x-max-priority` 10 (persistent messages, confirms after the message store's fsync), on
//! one node and not replicated, so the comparison favours RabbitMQ on durability. Should a
//! RabbitMQ accept the quorum queue, that queue is used and the notes say so.
//!
//! Clients and placement as elsewhere: a publisher connection and a consumer connection on the
//! node that leads the queue (RabbitMQ: node 1, where the queue was declared).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use qq_client::{MessageBuilder, PublishOutcome, Value, ValueExt};

use crate::System;
use crate::cluster::{Cluster, NODES};
use crate::driver::Conn;
use crate::load::{Counters, Progress, now_ns, parse_body};
use crate::scenarios::{Better, Outcome, Settings, delete_queues};

const QUEUE: &str = "bench-priority";
/// `x-max-priority` of the queue: levels 0..=10, and the priorities drawn.
pub const MAX_PRIORITY: u8 = 10;
/// The seed of the priority sequence (the same for every system and every run).
const SEED: u64 = 13;
/// The body's byte after the id and send time of [`crate::load::make_body`]: the priority.
const PRIORITY_BYTE: usize = 16;
/// How long the metadata machine, a declare and the queue's machine version may take.
const VERSION_DEADLINE: Duration = Duration::from_secs(30);
/// A drain that receives nothing for this long fails.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// Sizes of scenario 13 (`--priority-messages`, `--priority-prefetch`).
#[derive(Debug, Clone)]
pub struct PrioritySettings {
    /// Messages in the backlog.
    pub messages: u64,
    /// The consumer's prefetch.
    pub prefetch: u16,
}

impl PrioritySettings {
    pub fn full() -> PrioritySettings {
        PrioritySettings {
            messages: 50_000,
            prefetch: 100,
        }
    }

    pub fn quick() -> PrioritySettings {
        PrioritySettings {
            messages: 10_000,
            ..PrioritySettings::full()
        }
    }
}

/// The priority of each of `n` messages, uniform in 0..=[`MAX_PRIORITY`] (splitmix64 from
/// `seed`; the modulo's bias is below 1e-18).
pub fn priorities(n: u64, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z % (u64::from(MAX_PRIORITY) + 1)) as u8
        })
        .collect()
}

/// A body of `size` bytes (at least 17) carrying `seq`, the send time and `priority`.
fn make_body(seq: u64, priority: u8, size: usize) -> Bytes {
    let mut body = vec![0u8; size.max(PRIORITY_BYTE + 1)];
    body[..8].copy_from_slice(&seq.to_le_bytes());
    body[8..16].copy_from_slice(&now_ns().to_le_bytes());
    body[PRIORITY_BYTE] = priority;
    Bytes::from(body)
}

/// `(seq, priority)` of a body made by [`make_body`].
fn read_body(body: &[u8]) -> Option<(u64, u8)> {
    let (seq, _) = parse_body(body)?;
    Some((seq, *body.get(PRIORITY_BYTE)?))
}

/// How a delivered sequence compares with the one right order of a fully published backlog.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OrderCheck {
    /// Deliveries that should have come before the delivery just before them.
    pub out_of_order: u64,
    /// Pairs where a lower priority was delivered before a higher one.
    pub inversions: u64,
    /// Deliveries of a level published before the previous delivery of that level.
    pub fifo_breaks: u64,
    /// Positions whose delivery is not the one the right order puts there.
    pub misplaced: u64,
    /// The first out-of-order position (0-based), if any.
    pub first_out_of_order: Option<usize>,
    /// Sequence numbers never delivered.
    pub missing: u64,
    /// Deliveries of a sequence number already delivered, or not published.
    pub duplicates: u64,
    /// Deliveries whose body's priority is not the one published.
    pub wrong_priority: u64,
}

/// Checks `delivered` (`(seq, priority)` in delivery order) against `published` (the priority
/// of each seq): the right order is priority descending, seq ascending within a priority.
pub fn check_order(delivered: &[(u64, u8)], published: &[u8]) -> OrderCheck {
    let mut c = OrderCheck::default();
    let mut seen = vec![false; published.len()];
    let mut by_level = [0u64; 256];
    let mut last_of_level: [Option<u64>; 256] = [None; 256];
    for (i, &(seq, p)) in delivered.iter().enumerate() {
        match usize::try_from(seq).ok().filter(|&s| s < published.len()) {
            Some(s) if !seen[s] => {
                seen[s] = true;
                if published[s] != p {
                    c.wrong_priority += 1;
                }
            }
            _ => c.duplicates += 1,
        }
        if i > 0 {
            let (prev_seq, prev_p) = delivered[i - 1];
            if p > prev_p || (p == prev_p && seq < prev_seq) {
                c.out_of_order += 1;
                c.first_out_of_order.get_or_insert(i);
            }
        }
        c.inversions += by_level[..usize::from(p)].iter().sum::<u64>();
        by_level[usize::from(p)] += 1;
        let last = &mut last_of_level[usize::from(p)];
        if last.is_some_and(|l| seq < l) {
            c.fifo_breaks += 1;
        }
        *last = Some(seq);
    }
    c.missing = seen.iter().filter(|s| !**s).count() as u64;
    let mut right: Vec<(u64, u8)> = published
        .iter()
        .enumerate()
        .map(|(s, &p)| (s as u64, p))
        .collect();
    right.sort_by_key(|&(s, p)| (std::cmp::Reverse(p), s));
    c.misplaced = delivered
        .iter()
        .zip(&right)
        .filter(|(d, r)| d.0 != r.0)
        .count() as u64
        + right.len().abs_diff(delivered.len()) as u64;
    c
}

/// Waits until every quorumq node's `/metrics` has the line `line`; how long it took.
async fn await_metric_everywhere(line: &str, deadline: Duration) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let mut all = true;
        for node in 0..NODES {
            let has = crate::catchup::scrape(node)
                .await
                .is_ok_and(|page| page.lines().any(|l| l.trim() == line));
            all &= has;
        }
        if all {
            return Ok(start.elapsed());
        }
        if start.elapsed() > deadline {
            bail!("not every node shows `{line}` after {deadline:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the queue is, for the notes.
enum Kind {
    /// quorumq or RabbitMQ: a three-replica quorum queue with `x-max-priority`.
    Quorum,
    /// RabbitMQ: a durable classic queue with `x-max-priority`; why the quorum one was not used.
    Classic { refusal: String },
}

/// The AMQP declare arguments: a quorum queue with three replicas, or a classic queue; both
/// with `x-max-priority` [`MAX_PRIORITY`].
fn amqp_args(quorum: bool) -> FieldTable {
    let mut args = FieldTable::default();
    let kind = if quorum { "quorum" } else { "classic" };
    args.insert("x-queue-type".into(), AMQPValue::LongString(kind.into()));
    if quorum {
        args.insert("x-quorum-initial-group-size".into(), AMQPValue::LongInt(3));
    }
    args.insert(
        "x-max-priority".into(),
        AMQPValue::LongLongInt(i64::from(MAX_PRIORITY)),
    );
    args
}

/// One durable declare over AMQP on a channel of its own.
async fn amqp_declare(conn: &lapin::Connection, quorum: bool) -> Result<()> {
    let ch = conn.create_channel().await?;
    let r = ch
        .queue_declare(
            QUEUE.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            amqp_args(quorum),
        )
        .await;
    if r.is_ok() {
        let _ = ch.close(200, "declared".into()).await;
    }
    r.map(|_| ()).map_err(|e| anyhow!("declare {QUEUE}: {e}"))
}

/// quorumq (either protocol): declares the queue through node 1, retrying while the metadata
/// machine is not at version 2 yet (or the new group has no leader yet).
async fn declare_qq(system: System) -> Result<()> {
    let conn = Conn::connect(system, 0).await?;
    conn.delete_queue(QUEUE).await?;
    let start = Instant::now();
    loop {
        let r = match &conn {
            Conn::Qq(c) => {
                let args = HashMap::from([
                    ("x-quorum-initial-group-size".to_string(), Value::long(3)),
                    (
                        "x-max-priority".to_string(),
                        Value::long(i64::from(MAX_PRIORITY)),
                    ),
                ]);
                c.declare_queue(QUEUE, args)
                    .await
                    .map(|_| ())
                    .map_err(|e| anyhow!("declare {QUEUE}: {e}"))
            }
            Conn::Amqp(c) => amqp_declare(c, true).await,
        };
        match r {
            Ok(()) => return Ok(()),
            Err(e) if start.elapsed() > VERSION_DEADLINE => return Err(e),
            Err(e) => {
                eprintln!("  declare refused, retrying: {e:#}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// RabbitMQ: declares a quorum queue with `x-max-priority` through node 1 if RabbitMQ takes
/// one, else a durable classic queue with it.
async fn declare_rabbit(cl: &Cluster) -> Result<Kind> {
    let Conn::Amqp(conn) = Conn::connect(System::Rabbitmq, 0).await? else {
        bail!("a RabbitMQ connection that is not AMQP");
    };
    Conn::Amqp(conn.clone()).delete_queue(QUEUE).await?;
    match amqp_declare(&conn, true).await {
        Ok(()) => Ok(Kind::Quorum),
        Err(e) => {
            let refusal = format!("{e:#}");
            amqp_declare(&conn, false).await?;
            let listing = cl
                .rabbitmqctl(
                    0,
                    &[
                        "list_queues",
                        "-q",
                        "--no-table-headers",
                        "name",
                        "type",
                        "durable",
                        "arguments",
                        "pid",
                    ],
                )
                .unwrap_or_default();
            let line = listing
                .lines()
                .find(|l| l.split_whitespace().next() == Some(QUEUE))
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|| "(not listed by rabbitmqctl)".into());
            Ok(Kind::Classic {
                refusal: format!("{refusal}; rabbitmqctl list_queues: {line}"),
            })
        }
    }
}

type AmqpConfirm = BoxFuture<'static, lapin::Result<lapin::Confirmation>>;

/// Publishes message `seq` with `priorities[seq]` for every seq, at most `window` unconfirmed;
/// fails on any publish not confirmed.
async fn publish_all(
    conn: &Conn,
    priorities: &[u8],
    window: usize,
    body_bytes: usize,
    counters: &Counters,
) -> Result<()> {
    match conn {
        Conn::Qq(client) => {
            let mut publisher = client.publisher(window).await?;
            let check = |confirms: Vec<qq_client::Confirm>| -> Result<()> {
                for c in confirms {
                    ensure!(c.outcome == PublishOutcome::Confirmed, "publish: {c:?}");
                    counters.confirmed.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            };
            for (seq, &p) in priorities.iter().enumerate() {
                let message = MessageBuilder::new(make_body(seq as u64, p, body_bytes))
                    .delivery_mode(2)
                    .priority(u32::from(p))
                    .build();
                publisher.send("", QUEUE, message).await?;
                counters.sent.fetch_add(1, Ordering::Relaxed);
                check(publisher.take_confirms())?;
            }
            check(publisher.close().await?)?;
        }
        Conn::Amqp(conn) => {
            let channel = conn.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            let mut pending: FuturesUnordered<AmqpConfirm> = FuturesUnordered::new();
            let settle = |c: Option<lapin::Result<lapin::Confirmation>>| -> Result<()> {
                match c {
                    Some(Ok(c)) if c.is_ack() => {
                        counters.confirmed.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }
                    Some(Ok(c)) => bail!("publish not confirmed: {c:?}"),
                    Some(Err(e)) => bail!("publisher confirm: {e}"),
                    None => Ok(()),
                }
            };
            for (seq, &p) in priorities.iter().enumerate() {
                while pending.len() >= window {
                    settle(pending.next().await)?;
                }
                let confirm = channel
                    .basic_publish(
                        "".into(),
                        QUEUE.into(),
                        BasicPublishOptions::default(),
                        &make_body(seq as u64, p, body_bytes),
                        lapin::BasicProperties::default()
                            .with_delivery_mode(2)
                            .with_priority(p),
                    )
                    .await?;
                pending.push(Box::pin(confirm));
                counters.sent.fetch_add(1, Ordering::Relaxed);
            }
            while !pending.is_empty() {
                settle(pending.next().await)?;
            }
            let _ = channel.close(200, "published".into()).await;
        }
    }
    Ok(())
}

/// Polls the queue's count on `conn` until it is `want` (at most `deadline`).
async fn await_count(conn: &Conn, want: u64, deadline: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let n = conn.message_count(QUEUE).await?;
        if n == want {
            return Ok(());
        }
        if start.elapsed() > deadline {
            bail!("{QUEUE} holds {n} after {deadline:?}, expected {want}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Scenario 13 on the system `cl` is driven over.
pub async fn priority_order(
    cl: &mut Cluster,
    s: &Settings,
    p: &PrioritySettings,
) -> Result<Outcome> {
    let system = cl.system();
    ensure!(p.messages > 0, "--priority-messages must be at least 1");
    let mut notes = Vec::new();
    let (node, kind) = match system {
        System::Quorumq | System::QuorumqAmqp => {
            match await_metric_everywhere("quorumq_metadata_machine_version 2", VERSION_DEADLINE)
                .await
            {
                Ok(t) => notes.push(format!(
                    "metadata machine at version 2 on every node {:.1} s after the scenario \
                     started",
                    t.as_secs_f64()
                )),
                Err(e) => eprintln!("  {e:#}; declaring anyway"),
            }
            declare_qq(system).await?;
            let line = format!("quorumq_queue_machine_version{{vhost=\"/\",queue=\"{QUEUE}\"}} 2");
            let waited = await_metric_everywhere(&line, VERSION_DEADLINE)
                .await
                .context("the queue's machine version (priorities would be stored at level 0)")?;
            let leader = cl.leader(QUEUE).await?;
            notes.push(format!(
                "quorum queue, 3 replicas, x-max-priority {MAX_PRIORITY}, led by node {}; at \
                 queue machine version 2 on every node {:.1} s after the declare",
                leader + 1,
                waited.as_secs_f64()
            ));
            (leader, Kind::Quorum)
        }
        System::Rabbitmq => (0, declare_rabbit(cl).await?),
    };
    match &kind {
        Kind::Quorum if system == System::Rabbitmq => notes.push(format!(
            "RabbitMQ took a quorum queue with x-max-priority {MAX_PRIORITY}: used it (3 \
             replicas, declared through node 1)"
        )),
        Kind::Quorum => {}
        Kind::Classic { refusal } => notes.push(format!(
            "a durable CLASSIC queue with x-max-priority {MAX_PRIORITY} on node 1, not \
             replicated: the comparison favours RabbitMQ on durability. Its quorum queue with \
             x-max-priority was refused: {refusal}"
        )),
    }
    let result = measure(system, node, s, p).await;
    delete_queues(cl, &[QUEUE.to_string()]).await;
    let mut out = result?;
    notes.append(&mut out.notes);
    out.notes = notes;
    Ok(out)
}

async fn measure(
    system: System,
    node: usize,
    s: &Settings,
    p: &PrioritySettings,
) -> Result<Outcome> {
    let n = p.messages;
    let published = priorities(n, SEED);
    let mut per_level = [0u64; MAX_PRIORITY as usize + 1];
    for &pr in &published {
        per_level[usize::from(pr)] += 1;
    }
    let pub_conn = Conn::connect(system, node).await?;
    let cons_conn = Conn::connect(system, node).await?;
    let counters = Arc::new(Counters::default());
    let progress = Progress::start(format!("13 priority {system}"), counters.clone());

    let t = Instant::now();
    publish_all(&pub_conn, &published, s.window, s.body_bytes, &counters).await?;
    let publish_s = t.elapsed().as_secs_f64();
    await_count(&cons_conn, n, Duration::from_secs(30)).await?;

    let t = Instant::now();
    let mut consumer = cons_conn.consumer(QUEUE, p.prefetch).await?;
    let mut delivered: Vec<(u64, u8)> = Vec::with_capacity(n as usize);
    while (delivered.len() as u64) < n {
        let msg = tokio::time::timeout(DELIVERY_TIMEOUT, consumer.next())
            .await
            .with_context(|| {
                format!(
                    "no delivery for {DELIVERY_TIMEOUT:?} after {} of {n}",
                    delivered.len()
                )
            })??
            .with_context(|| format!("the subscription ended after {} of {n}", delivered.len()))?;
        let (seq, priority) = read_body(&msg.body).context("a body not made by the scenario")?;
        delivered.push((seq, priority));
        consumer.ack(&msg).await?;
        counters.delivered.fetch_add(1, Ordering::Relaxed);
    }
    let drain_s = t.elapsed().as_secs_f64();
    consumer.close().await;
    progress.finish().await;

    let c = check_order(&delivered, &published);
    ensure!(
        c.missing == 0 && c.duplicates == 0 && c.wrong_priority == 0,
        "delivered {} for {n} published: {} missing, {} duplicated or unknown, {} with another \
         priority than published",
        delivered.len(),
        c.missing,
        c.duplicates,
        c.wrong_priority
    );
    let mut out = Outcome::default();
    out.figure(
        13,
        "publish into backlog",
        "msg/s",
        Better::Higher,
        n as f64 / publish_s,
    );
    out.figure(
        13,
        "drain rate",
        "msg/s",
        Better::Higher,
        n as f64 / drain_s,
    );
    out.figure(
        13,
        "out-of-order deliveries",
        "msgs",
        Better::Zero,
        c.out_of_order as f64,
    );
    out.notes.push(format!(
        "{n} × {} B persistent, priority uniform in 0..={MAX_PRIORITY} (splitmix64, seed \
         {SEED}; per level 0..={MAX_PRIORITY}: {}), window {}: published and confirmed in \
         {publish_s:.2} s; then drained by one consumer (prefetch {}, manual ack each) in \
         {drain_s:.2} s",
        s.body_bytes,
        per_level.map(|c| c.to_string()).join("/"),
        s.window,
        p.prefetch
    ));
    out.notes.push(format!(
        "order of the {n} deliveries: {} out of order (should have come before the one just \
         before){}, {} pairs delivered lower priority before higher, {} FIFO breaks within a \
         level, {} not at their place in the strict order; none missing, duplicated or with \
         another priority",
        c.out_of_order,
        c.first_out_of_order.map_or(String::new(), |i| format!(
            ", the first at delivery {}",
            i + 1
        )),
        c.inversions,
        c.fifo_breaks,
        c.misplaced
    ));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_are_seeded_and_cover_every_level() {
        let a = priorities(11_000, SEED);
        assert_eq!(a, priorities(11_000, SEED));
        assert_ne!(a, priorities(11_000, SEED + 1));
        let mut per_level = [0u32; MAX_PRIORITY as usize + 1];
        for &p in &a {
            per_level[usize::from(p)] += 1;
        }
        // Uniform: each of the 11 levels near 1 000.
        assert!(
            per_level.iter().all(|&c| (850..1150).contains(&c)),
            "{per_level:?}"
        );
    }

    #[test]
    fn body_carries_seq_and_priority() {
        let b = make_body(42, 7, 1024);
        assert_eq!(b.len(), 1024);
        assert_eq!(read_body(&b), Some((42, 7)));
        assert_eq!(make_body(1, 3, 4).len(), PRIORITY_BYTE + 1);
    }

    #[test]
    fn the_strict_order_has_nothing_out_of_order() {
        let published = [2, 0, 5, 2, 5, 0];
        let strict = [(2, 5), (4, 5), (0, 2), (3, 2), (1, 0), (5, 0)];
        assert_eq!(check_order(&strict, &published), OrderCheck::default());
    }

    #[test]
    fn out_of_order_deliveries_are_counted() {
        let published = [2, 0, 5, 2, 5, 0];
        // FIFO order, as a queue without priorities delivers.
        let fifo: Vec<(u64, u8)> = published
            .iter()
            .enumerate()
            .map(|(s, &p)| (s as u64, p))
            .collect();
        let c = check_order(&fifo, &published);
        // Seq 2 (priority 5) after seq 1 (0) and seq 4 (5) after seq 3 (2).
        assert_eq!(c.out_of_order, 2);
        assert_eq!(c.first_out_of_order, Some(2));
        // Lower before higher: 2 and 0 before seq 2, 0 before seq 3, 2, 0 and 2 before seq 4.
        assert_eq!(c.inversions, 6);
        assert_eq!(c.fifo_breaks, 0);
        // The strict order is seqs 2 4 0 3 1 5: only positions 4 and 6 hold the right one.
        assert_eq!(c.misplaced, 4);
        // Within a level, a later seq before an earlier one.
        let swapped = [(4, 5), (2, 5), (0, 2), (3, 2), (1, 0), (5, 0)];
        let c = check_order(&swapped, &published);
        assert_eq!((c.out_of_order, c.fifo_breaks, c.inversions), (1, 1, 0));
        assert_eq!(c.first_out_of_order, Some(1));
    }

    #[test]
    fn lost_duplicated_and_altered_messages_are_found() {
        let published = [1, 1, 0];
        let c = check_order(&[(0, 1), (0, 1), (2, 3)], &published);
        assert_eq!((c.missing, c.duplicates, c.wrong_priority), (1, 1, 1));
    }
}
