//! The workload: publishers and consumers on every node, through a client protocol (the gRPC
//! API, [`grpc`], or AMQP 0-9-1, [`amqp`]), recording everything they see into a [`History`]
//! for the checker. Both protocols share the publishers' and consumers' logic here (what to
//! publish, retrying, what to do with a delivery, what to record) through [`Sender`] and
//! [`Subscriber`]; the runner's own queries (topology, queue info, status) are gRPC.
//!
//! Topology (declared once, before any fault):
//! - `chaos.work`: consumers on every node ack most messages, reject some (dead-lettered,
//!   reason `rejected`) and requeue some once; at-least-once dead-lettering.
//! - `chaos.ttl`: no consumer, `x-message-ttl` 2 s: every message expires into the dead-letter
//!   queue (reason `expired`); at-least-once.
//! - `chaos.limit`: `x-delivery-limit` 2 with a consumer that always requeues: every message is
//!   dead-lettered with reason `delivery_limit` after its third delivery; at-least-once.
//! - `chaos.dlq`: the dead-letter queue of all three (exchange `chaos.dlx`), drained at the end.
//!
//! What a consumer of `chaos.work` does with a message depends only on its id ([`decision`]),
//! so a redelivered message gets the same treatment and the checker knows each message's fate.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::future::Future;
use std::pin::Pin;

use qq_client::{Client, Value, ValueExt};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};

pub mod amqp;
pub mod grpc;

pub const WORK: &str = "chaos.work";
pub const TTL: &str = "chaos.ttl";
pub const LIMIT: &str = "chaos.limit";
pub const DLQ: &str = "chaos.dlq";
pub const DLX: &str = "chaos.dlx";
pub const SOURCES: [&str; 3] = [WORK, TTL, LIMIT];
/// Every queue, in declaration order (the nemesis picks "the chosen queue" from these).
pub const QUEUES: [&str; 4] = [DLQ, WORK, TTL, LIMIT];
pub const TTL_MS: i64 = 2_000;
pub const DELIVERY_LIMIT: i64 = 2;

/// How long one RPC may take before the client treats the node as unreachable.
const RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// A consumer that received nothing for this long subscribes again (possibly elsewhere).
const CONSUMER_IDLE: Duration = Duration::from_secs(8);
const PREFETCH: u32 = 20;

/// FNV-1a: a stable hash of a message id (the same on every run and platform).
pub fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What the consumers of `chaos.work` do with a message, decided by its id alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Rejected without requeue: must end up dead-lettered with reason `rejected`.
    Reject,
    /// Requeued on its first delivery, acked when redelivered.
    RequeueOnce,
    Ack,
}

pub fn decision(id: &str) -> Decision {
    match stable_hash(id) % 100 {
        0..10 => Decision::Reject,
        10..20 => Decision::RequeueOnce,
        _ => Decision::Ack,
    }
}

/// Which source queue a message id is published to (70 % work, 15 % ttl, 15 % limit).
pub fn queue_for(id: &str) -> &'static str {
    match (stable_hash(id) >> 8) % 100 {
        0..15 => TTL,
        15..30 => LIMIT,
        _ => WORK,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Ack,
    Reject,
    Requeue,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PublishRecord {
    pub id: String,
    pub queue: String,
    pub start_ms: u64,
    pub attempts: u32,
    /// When the confirm arrived (the message is then durable on a majority).
    pub confirmed_ms: Option<u64>,
    /// Why it was not confirmed: a refusal (`REJECTED: ...`) or `gave up` after retrying.
    pub failure: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeliveryRecord {
    pub t_ms: u64,
    pub queue: String,
    pub id: String,
    pub redelivered: bool,
    pub action: Action,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Death {
    pub queue: String,
    pub reason: String,
    pub count: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeadLetterRecord {
    pub id: String,
    pub redelivered: bool,
    /// The `x-death` entries, most recent first.
    pub deaths: Vec<Death>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Leftover {
    pub queue: String,
    pub id: String,
}

/// The protocol the workload's clients speak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// The gRPC API: every retry carries the publisher id and seq the queues deduplicate by.
    #[default]
    Grpc,
    /// AMQP 0-9-1 through lapin, as RabbitMQ's clients: no publisher dedup, so a message
    /// republished after its connection failed may be stored once per send.
    Amqp,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::Amqp => "amqp",
        }
    }

    /// Whether a retried publish is stored once (publisher dedup) rather than once per send.
    pub fn dedups_retries(self) -> bool {
        self == Protocol::Grpc
    }
}

/// Everything the clients saw. Times are milliseconds since the workload started.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct History {
    pub protocol: Protocol,
    pub publishes: Vec<PublishRecord>,
    pub deliveries: Vec<DeliveryRecord>,
    pub leftovers: Vec<Leftover>,
    pub dead_letters: Vec<DeadLetterRecord>,
    /// Publish attempts that failed, by gRPC code (or TIMEOUT), retried or not.
    pub publish_errors: BTreeMap<String, u64>,
    /// Consume streams that ended or failed to open, by reason.
    pub consumer_interruptions: BTreeMap<String, u64>,
    /// Publisher connections (AMQP; gRPC channels reconnect inside the client library) and
    /// consumer subscriptions opened again after one failed or went idle, by client kind.
    pub reconnects: BTreeMap<String, u64>,
}

pub struct Recorder {
    start: Instant,
    /// Random per run: part of the publisher ids, so two runs never share one.
    run_id: u64,
    history: Mutex<History>,
}

impl Recorder {
    pub fn new(protocol: Protocol) -> Recorder {
        Recorder {
            start: Instant::now(),
            run_id: rand::random(),
            history: Mutex::new(History {
                protocol,
                ..History::default()
            }),
        }
    }

    pub fn run_id(&self) -> String {
        format!("{:016x}", self.run_id)
    }

    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    fn with<T>(&self, f: impl FnOnce(&mut History) -> T) -> T {
        f(&mut self.history.lock().expect("history lock"))
    }

    pub fn take(&self) -> History {
        self.with(|h| {
            let protocol = h.protocol;
            std::mem::replace(
                h,
                History {
                    protocol,
                    ..History::default()
                },
            )
        })
    }

    pub fn confirmed_count(&self) -> usize {
        self.with(|h| {
            h.publishes
                .iter()
                .filter(|p| p.confirmed_ms.is_some())
                .count()
        })
    }

    fn error(&self, map: fn(&mut History) -> &mut BTreeMap<String, u64>, what: String) {
        self.with(|h| *map(h).entry(what).or_default() += 1);
    }
}

fn table(pairs: &[(&str, Value)]) -> HashMap<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Declares the exchange, the four queues and the binding (through node 1).
pub async fn declare(client: &Client) -> qq_client::Result<()> {
    client.declare_exchange(DLX, "direct").await?;
    client.declare_queue(DLQ, HashMap::new()).await?;
    let dl = |extra: &[(&str, Value)]| {
        let mut args = table(&[
            ("x-dead-letter-exchange", Value::string(DLX)),
            ("x-dead-letter-routing-key", Value::string("dead")),
            ("x-dead-letter-strategy", Value::string("at-least-once")),
            ("x-overflow", Value::string("reject-publish")),
        ]);
        args.extend(table(extra));
        args
    };
    client.declare_queue(WORK, dl(&[])).await?;
    client
        .declare_queue(TTL, dl(&[("x-message-ttl", Value::long(TTL_MS))]))
        .await?;
    client
        .declare_queue(
            LIMIT,
            dl(&[("x-delivery-limit", Value::long(DELIVERY_LIMIT))]),
        )
        .await?;
    client.bind(DLQ, DLX, "dead", HashMap::new()).await?;
    Ok(())
}

/// The workload's clients of one run, in the protocol chosen.
#[derive(Clone)]
pub enum Clients {
    Grpc(Arc<Vec<Client>>),
    Amqp(Arc<amqp::Amqp>),
}

/// A workload task, ready to spawn.
pub type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

impl Clients {
    /// `grpc`: one client per node (the runner's own); `amqp_uris`: each node's AMQP URI.
    pub fn new(protocol: Protocol, grpc: Arc<Vec<Client>>, amqp_uris: Vec<String>) -> Clients {
        match protocol {
            Protocol::Grpc => Clients::Grpc(grpc),
            Protocol::Amqp => Clients::Amqp(Arc::new(amqp::Amqp::new(amqp_uris))),
        }
    }

    /// Publisher `p` (see [`publisher`]).
    pub fn publisher(
        &self,
        p: usize,
        rate: f64,
        concurrency: usize,
        rec: Arc<Recorder>,
        control: Arc<Control>,
    ) -> Task {
        match self {
            Clients::Grpc(c) => {
                let sender = Arc::new(grpc::Publisher::new(c.clone(), p, &rec));
                Box::pin(publisher(p, rate, concurrency, sender, rec, control))
            }
            Clients::Amqp(a) => {
                let sender = Arc::new(a.publisher(p, rec.clone()));
                Box::pin(publisher(p, rate, concurrency, sender, rec, control))
            }
        }
    }

    /// Consumer `c` of `queue` (see [`consumer`]).
    pub fn consumer(
        &self,
        c: usize,
        queue: &'static str,
        role: Role,
        rec: Arc<Recorder>,
        control: Arc<Control>,
    ) -> Task {
        match self {
            Clients::Grpc(g) => Box::pin(consumer(c, queue, role, g.clone(), rec, control)),
            Clients::Amqp(a) => Box::pin(consumer(c, queue, role, a.clone(), rec, control)),
        }
    }
}

/// Flags shared by the workload's tasks.
#[derive(Default)]
pub struct Control {
    /// Publishers send no new messages.
    pub stop_publishing: AtomicBool,
    /// Publishes still retrying give up (recorded as not confirmed).
    pub give_up: AtomicBool,
    /// Consumers close their streams and end.
    pub stop_consuming: AtomicBool,
}

/// One message to publish: the same on every attempt.
pub struct Outgoing {
    /// The publisher's number and the message's sequence number in it (from 1).
    pub p: usize,
    pub seq: u64,
    pub id: String,
    pub queue: &'static str,
    pub body: Vec<u8>,
}

/// How one attempt to publish ended.
pub enum Outcome {
    Confirmed,
    /// Refused for good (not retried): the error's code and the whole reason.
    Refused {
        code: String,
        detail: String,
    },
    /// Sent, or perhaps sent, and not confirmed: retried. The code of what went wrong.
    Failed(String),
    /// Not sent at all (no connection to send it on): retried, not counted as an attempt.
    Unsent(String),
}

/// A protocol's publishing side: one attempt at a time, each bounded in time.
pub trait Sender: Send + Sync + 'static {
    /// Publishes `m` (its `attempt`th try, from 1) and waits for its confirm.
    fn send(&self, m: &Outgoing, attempt: u32) -> impl Future<Output = Outcome> + Send;
}

/// Publisher `p`: `rate` messages per second to the source queues through the default
/// exchange, each with its own id, at most `concurrency` in flight per queue, retried with the
/// same id until confirmed or told to give up.
pub async fn publisher<S: Sender>(
    p: usize,
    rate: f64,
    concurrency: usize,
    sender: Arc<S>,
    rec: Arc<Recorder>,
    control: Arc<Control>,
) {
    // Permits per queue: publishes stuck on one queue's failover do not hold up the others.
    let permits: HashMap<&str, Arc<tokio::sync::Semaphore>> = SOURCES
        .iter()
        .map(|q| (*q, Arc::new(tokio::sync::Semaphore::new(concurrency))))
        .collect();
    let mut tasks = JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    while !control.stop_publishing.load(Ordering::Relaxed) {
        tick.tick().await;
        seq += 1;
        let id = format!("p{p}-{seq}");
        // A queue with `concurrency` publishes in flight (stuck in a failover) skips this
        // message rather than holding up the others; the id is simply never used.
        let Ok(permit) = permits[queue_for(&id)].clone().try_acquire_owned() else {
            continue;
        };
        let (sender, rec, control) = (sender.clone(), rec.clone(), control.clone());
        tasks.spawn(async move {
            publish_one(p, seq, id, &*sender, &rec, &control).await;
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// One publish, retried with the same id (and, over gRPC, the same publisher id and seq, so
/// that the queue stores it once however many attempts reach it).
async fn publish_one(
    p: usize,
    seq: u64,
    id: String,
    sender: &impl Sender,
    rec: &Recorder,
    control: &Control,
) {
    let queue = queue_for(&id);
    let start_ms = rec.now_ms();
    let mut body = format!("{id} ").into_bytes();
    body.resize(256, b'.');
    let m = Outgoing {
        p,
        seq,
        id,
        queue,
        body,
    };
    // `attempts` counts the tries that may have reached a broker; `tries` every try.
    let (mut attempts, mut tries) = (0u32, 0u64);
    let (confirmed_ms, failure) = loop {
        tries += 1;
        let outcome = sender.send(&m, attempts + 1).await;
        if !matches!(outcome, Outcome::Unsent(_)) {
            attempts += 1;
        }
        match outcome {
            Outcome::Confirmed => break (Some(rec.now_ms()), None),
            Outcome::Refused { code, detail } => {
                rec.error(|h| &mut h.publish_errors, code);
                break (None, Some(detail));
            }
            Outcome::Failed(code) | Outcome::Unsent(code) => {
                rec.error(|h| &mut h.publish_errors, code)
            }
        }
        if control.give_up.load(Ordering::Relaxed) {
            break (None, Some(format!("gave up after {attempts} attempts")));
        }
        let backoff = Duration::from_millis((100 * tries).min(1_000));
        tokio::time::sleep(backoff).await;
    };
    rec.with(|h| {
        h.publishes.push(PublishRecord {
            id: m.id,
            queue: queue.to_string(),
            start_ms,
            attempts,
            confirmed_ms,
            failure,
        })
    });
}

/// What a consumer does with every delivery.
#[derive(Clone, Copy, Debug)]
pub enum Role {
    /// `chaos.work`: ack, reject or requeue by [`decision`].
    Work,
    /// `chaos.limit`: always requeue (the delivery limit dead-letters the message).
    AlwaysRequeue,
    /// End of the run: ack everything and record it as left over in its queue.
    DrainLeftovers,
    /// End of the run: ack everything from the dead-letter queue and record its `x-death`.
    DrainDeadLetters,
}

/// A delivery as the checker sees it.
pub struct Seen {
    pub id: String,
    pub redelivered: bool,
    /// Its `x-death` entries, most recent first (empty when absent or malformed).
    pub deaths: Vec<Death>,
}

/// A protocol's consuming side: subscribes to a queue through one node.
pub trait Subscriber: Send + Sync + 'static {
    type Sub: Subscription;
    fn subscribe(
        &self,
        node: usize,
        queue: &'static str,
    ) -> impl Future<Output = Result<Self::Sub, String>> + Send;
}

/// One subscription. Errors are short reasons (recorded as consumer interruptions).
pub trait Subscription: Send + 'static {
    /// What settles one delivery.
    type Tag: Send;
    /// The next delivery; `None` when the subscription ended. Cancel-safe.
    fn next(&mut self) -> impl Future<Output = Result<Option<(Seen, Self::Tag)>, String>> + Send;
    fn settle(
        &mut self,
        tag: Self::Tag,
        action: Action,
    ) -> impl Future<Output = Result<(), String>> + Send;
    /// Ends the subscription; the queue takes back what is unsettled.
    fn close(self) -> impl Future<Output = ()> + Send;
}

/// Consumer `c` of `queue`: subscribes through node `c`, and through the next node each time
/// its subscription ends, fails or stays idle, until told to stop.
pub async fn consumer<S: Subscriber>(
    c: usize,
    queue: &'static str,
    role: Role,
    subscriber: Arc<S>,
    rec: Arc<Recorder>,
    control: Arc<Control>,
) {
    let mut attempt = 0usize;
    while !control.stop_consuming.load(Ordering::Relaxed) {
        let node = c + attempt;
        if attempt > 0 {
            rec.error(|h| &mut h.reconnects, "consumer".into());
        }
        attempt += 1;
        let mut sub = match timeout(RPC_TIMEOUT, subscriber.subscribe(node, queue)).await {
            Ok(Ok(sub)) => sub,
            Ok(Err(e)) => {
                rec.error(|h| &mut h.consumer_interruptions, format!("subscribe {e}"));
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
            Err(_) => {
                rec.error(
                    |h| &mut h.consumer_interruptions,
                    "subscribe TIMEOUT".into(),
                );
                continue;
            }
        };
        let why = consume(queue, role, &mut sub, &rec, &control).await;
        if let Some(why) = why {
            rec.error(|h| &mut h.consumer_interruptions, why);
        }
        sub.close().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Handles deliveries until the subscription fails (why) or the consumers stop (None).
async fn consume(
    queue: &str,
    role: Role,
    sub: &mut impl Subscription,
    rec: &Recorder,
    control: &Control,
) -> Option<String> {
    let mut idle = Duration::ZERO;
    loop {
        if control.stop_consuming.load(Ordering::Relaxed) {
            return None;
        }
        // Wake up every second to see the stop flag; give up on the subscription when idle.
        let (seen, tag) = match timeout(Duration::from_secs(1), sub.next()).await {
            Err(_) => {
                idle += Duration::from_secs(1);
                if idle >= CONSUMER_IDLE {
                    return Some("idle".to_string());
                }
                continue;
            }
            Ok(Ok(None)) => return Some("stream ended".to_string()),
            Ok(Err(e)) => return Some(format!("stream {e}")),
            Ok(Ok(Some(d))) => d,
        };
        idle = Duration::ZERO;
        let action = record(queue, role, seen, rec);
        match timeout(RPC_TIMEOUT, sub.settle(tag, action)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Some(format!("settle {e}")),
            Err(_) => return Some("settle TIMEOUT".to_string()),
        }
    }
}

/// What `role` does with a delivery, recorded before the settle is sent: "seen and acked by a
/// consumer" is the consumer's act; if the ack is lost the message comes back and is seen
/// again (a duplicate, not a loss).
fn record(queue: &str, role: Role, seen: Seen, rec: &Recorder) -> Action {
    let action = match role {
        Role::Work => match decision(&seen.id) {
            Decision::Reject => Action::Reject,
            Decision::RequeueOnce if !seen.redelivered => Action::Requeue,
            _ => Action::Ack,
        },
        Role::AlwaysRequeue => Action::Requeue,
        Role::DrainLeftovers | Role::DrainDeadLetters => Action::Ack,
    };
    let t_ms = rec.now_ms();
    rec.with(|h| match role {
        Role::Work | Role::AlwaysRequeue => h.deliveries.push(DeliveryRecord {
            t_ms,
            queue: queue.to_string(),
            id: seen.id,
            redelivered: seen.redelivered,
            action,
        }),
        Role::DrainLeftovers => h.leftovers.push(Leftover {
            queue: queue.to_string(),
            id: seen.id,
        }),
        Role::DrainDeadLetters => h.dead_letters.push(DeadLetterRecord {
            id: seen.id,
            redelivered: seen.redelivered,
            deaths: seen.deaths,
        }),
    });
    action
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_and_queues_are_stable_and_mixed() {
        let ids: Vec<String> = (0..10_000).map(|i| format!("p1-{i}")).collect();
        let count = |f: &dyn Fn(&str) -> bool| ids.iter().filter(|id| f(id)).count();
        let rejects = count(&|id| decision(id) == Decision::Reject);
        let requeues = count(&|id| decision(id) == Decision::RequeueOnce);
        let ttl = count(&|id| queue_for(id) == TTL);
        let limit = count(&|id| queue_for(id) == LIMIT);
        // Roughly the intended mix (10 %, 10 %, 15 %, 15 %), and the same answer every time.
        for (n, want) in [
            (rejects, 1000),
            (requeues, 1000),
            (ttl, 1500),
            (limit, 1500),
        ] {
            assert!(n.abs_diff(want) < 300, "{n} vs {want}");
        }
        assert_eq!(stable_hash("p1-1"), stable_hash("p1-1"));
        assert_eq!(stable_hash(""), 0xcbf2_9ce4_8422_2325);
    }
}
