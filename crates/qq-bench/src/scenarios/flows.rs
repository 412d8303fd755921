//! Publishers and consumers side by side for a measured while: a publisher and a consumer per
//! queue, each on the node given with its queue, counted after a warm-up. Scenarios 1-4 run on
//! it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::task::JoinHandle;

use super::{Better, Latency, Outcome, secs};
use crate::System;
use crate::cluster::NODES;
use crate::driver::{Conn, Cons, Pub};
use crate::load::{
    ConsOutcome, ConsPlan, Counters, Progress, PubOutcome, PubPlan, consume_loop, now_ns,
    publish_loop,
};

/// One connection per node for publishers and another for consumers (as applications do).
struct Conns {
    /// Per node, enough connections for its streams (see [`STREAMS_PER_CONN`]).
    publish: Vec<Vec<Conn>>,
    consume: Vec<Vec<Conn>>,
}

/// Streams a run puts on one connection: below quorumq's default `max_streams_per_connection`
/// (128), beyond which a node refuses more streams on that connection. Scenario 3 with 1 000
/// queues needs several connections per node.
const STREAMS_PER_CONN: usize = 100;

impl Conns {
    /// Connections for `streams[node]` publishers and as many consumers on each node.
    async fn open(system: System, streams: &[usize]) -> Result<Conns> {
        let mut publish = Vec::new();
        let mut consume = Vec::new();
        for node in 0..NODES {
            let n = streams
                .get(node)
                .copied()
                .unwrap_or(0)
                .div_ceil(STREAMS_PER_CONN)
                .max(1);
            let mut p = Vec::new();
            let mut c = Vec::new();
            for _ in 0..n {
                p.push(Conn::connect(system, node).await?);
                c.push(Conn::connect(system, node).await?);
            }
            publish.push(p);
            consume.push(c);
        }
        Ok(Conns { publish, consume })
    }

    /// The connection of the `k`-th stream on `node`.
    fn pick(conns: &[Vec<Conn>], node: usize, k: usize) -> &Conn {
        &conns[node][(k / STREAMS_PER_CONN) % conns[node].len()]
    }
}

/// A publisher and a consumer per queue, each on the node given with the queue.
pub(super) struct Flows {
    pub(super) queues: Vec<(String, usize)>,
    pub(super) window: usize,
    pub(super) prefetch: u16,
    /// Per publisher.
    pub(super) rate: Option<f64>,
    pub(super) reject: bool,
    pub(super) warmup_s: f64,
    pub(super) measure_s: f64,
    pub(super) body_bytes: usize,
}

pub(super) struct FlowResult {
    pub(super) confirmed_per_s: f64,
    pub(super) delivered_per_s: f64,
    pub(super) confirm_us: Vec<u32>,
    /// When each message of `confirm_us` was sent, in the same order.
    pub(super) confirm_sent_ns: Vec<u64>,
    pub(super) deliver_us: Vec<u32>,
    pub(super) rejected: u64,
    pub(super) errors: Vec<String>,
}

/// The streams of a run, opened before any starts: the connections (kept until the run ends),
/// a subscription and a publisher per queue.
struct Opened {
    _conns: Conns,
    subscriptions: Vec<Cons>,
    publishers: Vec<Pub>,
}

impl Opened {
    /// Every subscription and publisher first, so that the warm-up (and the rate) starts with
    /// all of them running: opening a hundred takes a while.
    async fn open(system: System, f: &Flows) -> Result<Opened> {
        let queues = &f.queues;
        let mut streams = vec![0usize; NODES];
        let mut nth = Vec::with_capacity(queues.len());
        for (_, node) in queues {
            nth.push(streams[*node]);
            streams[*node] += 1;
        }
        let conns = Conns::open(system, &streams).await?;
        let mut subscriptions = Vec::new();
        for ((q, node), k) in queues.iter().zip(&nth) {
            let conn = Conns::pick(&conns.consume, *node, *k);
            subscriptions.push(conn.consumer(q, f.prefetch).await?);
        }
        let mut publishers = Vec::new();
        for ((q, node), k) in queues.iter().zip(&nth) {
            let conn = Conns::pick(&conns.publish, *node, *k);
            publishers.push(conn.publisher(q, f.window).await?);
        }
        Ok(Opened {
            _conns: conns,
            subscriptions,
            publishers,
        })
    }
}

/// The consume and publish loops of a run, started.
struct Loops {
    consumers: Vec<JoinHandle<Result<ConsOutcome>>>,
    publishers: Vec<JoinHandle<Result<PubOutcome>>>,
}

impl Loops {
    fn start(
        subscriptions: Vec<Cons>,
        publishers: Vec<Pub>,
        f: &Flows,
        stop: &Arc<AtomicBool>,
        counters: &Arc<Counters>,
        record_from_ns: u64,
    ) -> Loops {
        let mut consumers = Vec::new();
        for c in subscriptions {
            let plan = ConsPlan {
                reject: f.reject,
                stop: stop.clone(),
                count: None,
                idle_timeout: None,
                collect_ids: false,
                record_from_ns,
            };
            consumers.push(tokio::spawn(consume_loop(c, plan, counters.clone())));
        }
        let mut started = Vec::new();
        for (i, p) in publishers.into_iter().enumerate() {
            let plan = PubPlan {
                window: f.window,
                rate: f.rate,
                count: None,
                stop: stop.clone(),
                body_bytes: f.body_bytes,
                first_id: (i as u64) << 40,
                record_from_ns,
            };
            started.push(tokio::spawn(publish_loop(p, plan, counters.clone())));
        }
        Loops {
            consumers,
            publishers: started,
        }
    }

    /// Waits for every loop (30 s each at most) and adds what it saw to `result`.
    async fn collect(self, result: &mut FlowResult) {
        for p in self.publishers {
            match tokio::time::timeout(Duration::from_secs(30), p).await {
                Ok(Ok(Ok(o))) => {
                    result.confirm_us.extend(o.confirm_us);
                    result.confirm_sent_ns.extend(o.confirm_sent_ns);
                    result.rejected += o.rejected;
                }
                Ok(Ok(Err(e))) => result.errors.push(format!("publisher: {e:#}")),
                Ok(Err(e)) => result.errors.push(format!("publisher task: {e}")),
                Err(_) => result
                    .errors
                    .push("publisher: confirms still missing 30 s after the end".into()),
            }
        }
        for c in self.consumers {
            match tokio::time::timeout(Duration::from_secs(30), c).await {
                Ok(Ok(Ok(o))) => result.deliver_us.extend(o.deliver_us),
                Ok(Ok(Err(e))) => result.errors.push(format!("consumer: {e:#}")),
                Ok(Err(e)) => result.errors.push(format!("consumer task: {e}")),
                Err(_) => result.errors.push("consumer did not stop".into()),
            }
        }
    }
}

pub(super) async fn run_flows(system: System, label: String, f: Flows) -> Result<FlowResult> {
    let opened = Opened::open(system, &f).await?;
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let record_from_ns = now_ns() + secs(f.warmup_s).as_nanos() as u64;
    let progress = Progress::start(label, counters.clone());
    let Opened {
        _conns,
        subscriptions,
        publishers,
    } = opened;
    let loops = Loops::start(
        subscriptions,
        publishers,
        &f,
        &stop,
        &counters,
        record_from_ns,
    );
    tokio::time::sleep(secs(f.warmup_s)).await;
    let (c0, d0, t0) = (counters.confirmed(), counters.delivered(), Instant::now());
    tokio::time::sleep(secs(f.measure_s)).await;
    let (c1, d1, dt) = (
        counters.confirmed(),
        counters.delivered(),
        t0.elapsed().as_secs_f64(),
    );
    stop.store(true, Ordering::Relaxed);
    progress.finish().await;
    let mut result = FlowResult {
        confirmed_per_s: (c1 - c0) as f64 / dt,
        delivered_per_s: (d1 - d0) as f64 / dt,
        confirm_us: Vec::new(),
        confirm_sent_ns: Vec::new(),
        deliver_us: Vec::new(),
        rejected: 0,
        errors: Vec::new(),
    };
    loops.collect(&mut result).await;
    Ok(result)
}

/// The figures of a throughput run: both rates and both latency distributions.
pub(super) fn rate_outcome(scenario: u8, r: &FlowResult) -> Outcome {
    let mut out = Outcome::default();
    let rates = [
        ("delivered+acked", r.delivered_per_s),
        ("confirmed", r.confirmed_per_s),
    ];
    for (name, v) in rates {
        out.figure(scenario, name, "msg/s", Better::Higher, v);
    }
    let samples = [
        ("publish→confirm", &r.confirm_us),
        ("publish→deliver", &r.deliver_us),
    ];
    for (kind, us) in samples {
        out.latencies
            .push(Latency::from_samples(scenario, kind, us.clone()));
    }
    out
}

pub(super) fn add_flow_notes(out: &mut Outcome, r: &FlowResult) {
    for e in r.errors.iter().take(5) {
        out.notes.push(e.clone());
    }
    if r.rejected > 0 {
        out.notes.push(format!(
            "{} publishes were negatively confirmed",
            r.rejected
        ));
    }
}
