//! The workload: publishers and consumers on every node, through the public gRPC API only,
//! recording everything they see into a [`History`] for the checker.
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
use std::time::{Duration, Instant};

use qq_client::{
    Client, Delivery, MessageBuilder, PublishRequest, Value, ValueExt, code_name, delivery_headers,
};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio::time::timeout;

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

/// Everything the clients saw. Times are milliseconds since the workload started.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct History {
    pub publishes: Vec<PublishRecord>,
    pub deliveries: Vec<DeliveryRecord>,
    pub leftovers: Vec<Leftover>,
    pub dead_letters: Vec<DeadLetterRecord>,
    /// Publish attempts that failed, by gRPC code (or TIMEOUT), retried or not.
    pub publish_errors: BTreeMap<String, u64>,
    /// Consume streams that ended or failed to open, by reason.
    pub consumer_interruptions: BTreeMap<String, u64>,
}

pub struct Recorder {
    start: Instant,
    /// Random per run: part of the publisher ids, so two runs never share one.
    run_id: u64,
    history: Mutex<History>,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            start: Instant::now(),
            run_id: rand::random(),
            history: Mutex::new(History::default()),
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
        self.with(std::mem::take)
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

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

/// One client per node, connected lazily (a node that is down now may be up later).
pub fn clients(addresses: &[String]) -> anyhow::Result<Arc<Vec<Client>>> {
    let clients = addresses
        .iter()
        .map(|a| Client::connect_lazy(a))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(clients))
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

fn retryable(code: tonic::Code) -> bool {
    use tonic::Code::*;
    !matches!(
        code,
        InvalidArgument | NotFound | PermissionDenied | FailedPrecondition | ResourceExhausted
    )
}

/// Publisher `p`: `rate` messages per second to the source queues through the default
/// exchange, each a unary publish with its own id, at most `concurrency` in flight per queue, retried
/// with the same id on any node until confirmed or told to give up.
pub async fn publisher(
    p: usize,
    rate: f64,
    concurrency: usize,
    clients: Arc<Vec<Client>>,
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
        let (clients, rec, control) = (clients.clone(), rec.clone(), control.clone());
        tasks.spawn(async move {
            publish_one(p, seq, id, &clients, &rec, &control).await;
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// One publish, retried with the same publisher id and seq (`chaos-p<p>-<run>`, `seq`): the
/// queue stores it once however many attempts reach it, which the checker verifies.
async fn publish_one(
    p: usize,
    seq: u64,
    id: String,
    clients: &[Client],
    rec: &Recorder,
    control: &Control,
) {
    let queue = queue_for(&id);
    let start_ms = rec.now_ms();
    let mut body = format!("{id} ").into_bytes();
    body.resize(256, b'.');
    let mut attempts: u32 = 0;
    let (confirmed_ms, failure) = loop {
        let client = &clients[(p + attempts as usize) % clients.len()];
        attempts += 1;
        let message = MessageBuilder::new(body.clone())
            .message_id(id.clone())
            .build();
        let req = PublishRequest {
            exchange: String::new(),
            routing_key: queue.to_string(),
            message: Some(message),
            publisher_id: format!("chaos-p{p}-{}", rec.run_id()),
            publisher_seq: seq,
            ..Default::default()
        };
        match timeout(RPC_TIMEOUT, client.publish_with(req)).await {
            Ok(Ok(confirm)) if confirm.is_confirmed() => break (Some(rec.now_ms()), None),
            Ok(Ok(confirm)) => {
                let outcome = format!("{:?}: {}", confirm.outcome, confirm.detail);
                rec.error(|h| &mut h.publish_errors, format!("{:?}", confirm.outcome));
                break (None, Some(outcome));
            }
            Ok(Err(e)) => {
                rec.error(|h| &mut h.publish_errors, code_name(e.code()).to_string());
                if !retryable(e.code()) {
                    break (None, Some(e.to_string()));
                }
            }
            Err(_) => rec.error(|h| &mut h.publish_errors, "TIMEOUT".into()),
        }
        if control.give_up.load(Ordering::Relaxed) {
            break (None, Some(format!("gave up after {attempts} attempts")));
        }
        let backoff = Duration::from_millis((100 * u64::from(attempts)).min(1_000));
        tokio::time::sleep(backoff).await;
    };
    rec.with(|h| {
        h.publishes.push(PublishRecord {
            id,
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

pub fn message_id(d: &Delivery) -> String {
    d.message
        .as_ref()
        .and_then(|m| m.properties.as_ref())
        .map(|p| p.message_id.clone())
        .unwrap_or_default()
}

/// The `x-death` entries of a delivery, most recent first (empty when absent or malformed).
pub fn deaths(d: &Delivery) -> Vec<Death> {
    let headers = delivery_headers(d);
    let Some(list) = headers.get("x-death").and_then(|v| v.as_list()) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|v| v.as_table())
        .map(|t| Death {
            queue: t
                .get("queue")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string(),
            reason: t
                .get("reason")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string(),
            count: t.get("count").and_then(|v| v.as_long()).unwrap_or(0),
        })
        .collect()
}

/// Consumer `c` of `queue`: subscribes through node `c`, and through the next node each time
/// its stream ends, fails or stays idle, until told to stop.
pub async fn consumer(
    c: usize,
    queue: &'static str,
    role: Role,
    clients: Arc<Vec<Client>>,
    rec: Arc<Recorder>,
    control: Arc<Control>,
) {
    let mut attempt = 0usize;
    while !control.stop_consuming.load(Ordering::Relaxed) {
        let client = &clients[(c + attempt) % clients.len()];
        attempt += 1;
        let mut consumer = match timeout(RPC_TIMEOUT, client.consume(queue, PREFETCH)).await {
            Ok(Ok(consumer)) => consumer,
            Ok(Err(e)) => {
                rec.error(
                    |h| &mut h.consumer_interruptions,
                    format!("subscribe {}", code_name(e.code())),
                );
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
        let mut idle = Duration::ZERO;
        let why = loop {
            if control.stop_consuming.load(Ordering::Relaxed) {
                break None;
            }
            // Wake up every second to see the stop flag; give up on the stream when idle.
            let d = match timeout(Duration::from_secs(1), consumer.next()).await {
                Err(_) => {
                    idle += Duration::from_secs(1);
                    if idle >= CONSUMER_IDLE {
                        break Some("idle".to_string());
                    }
                    continue;
                }
                Ok(None) => break Some("stream ended".to_string()),
                Ok(Some(Err(e))) => break Some(format!("stream {}", code_name(e.code()))),
                Ok(Some(Ok(d))) => d,
            };
            idle = Duration::ZERO;
            if let Err(e) = handle(queue, role, &consumer, &d, &rec).await {
                break Some(format!("settle {}", code_name(e.code())));
            }
        };
        if let Some(why) = why {
            rec.error(|h| &mut h.consumer_interruptions, why);
        }
        // Dropping the consumer closes the stream; the queue takes back what is unsettled.
        drop(consumer);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn handle(
    queue: &str,
    role: Role,
    consumer: &qq_client::Consumer,
    d: &Delivery,
    rec: &Recorder,
) -> qq_client::Result<()> {
    let id = message_id(d);
    let tag = d.delivery_tag;
    let action = match role {
        Role::Work => match decision(&id) {
            Decision::Reject => Action::Reject,
            Decision::RequeueOnce if !d.redelivered => Action::Requeue,
            _ => Action::Ack,
        },
        Role::AlwaysRequeue => Action::Requeue,
        Role::DrainLeftovers | Role::DrainDeadLetters => Action::Ack,
    };
    // Recorded before the settle is sent: "seen and acked by a consumer" is the consumer's act;
    // if the ack is lost the message comes back and is seen again (a duplicate, not a loss).
    let t_ms = rec.now_ms();
    rec.with(|h| match role {
        Role::Work | Role::AlwaysRequeue => h.deliveries.push(DeliveryRecord {
            t_ms,
            queue: queue.to_string(),
            id: id.clone(),
            redelivered: d.redelivered,
            action,
        }),
        Role::DrainLeftovers => h.leftovers.push(Leftover {
            queue: queue.to_string(),
            id: id.clone(),
        }),
        Role::DrainDeadLetters => h.dead_letters.push(DeadLetterRecord {
            id: id.clone(),
            redelivered: d.redelivered,
            deaths: deaths(d),
        }),
    });
    match action {
        Action::Ack => consumer.ack(tag, false).await,
        Action::Reject => consumer.reject(tag).await,
        Action::Requeue => consumer.nack(tag, false, true).await,
    }
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
