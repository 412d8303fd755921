//! The seven scenarios of issue 5, each written once and run against either cluster.
//!
//! Every scenario declares its own queues (quorum queues, three replicas), puts publishers and
//! consumers on the node that leads their queue (unless the scenario is about another node),
//! measures after a warm-up, and deletes its queues afterwards so the next scenario starts from
//! an idle cluster. A scenario returns [`Figure`]s (the table rows) and latency percentiles
//! (the plot).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::System;
use crate::cluster::{Cluster, NODES};
use crate::driver::{Conn, QueueSpec};
use crate::load::{
    ConsOutcome, ConsPlan, Counters, Progress, PubPlan, consume_loop, make_body, now_ns,
    percentile, publish_loop,
};

/// Durations and sizes of a run (`--quick` shrinks them).
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub body_bytes: usize,
    pub window: usize,
    pub prefetch: u16,
    pub warmup_s: f64,
    pub throughput_s: f64,
    pub latency_s: f64,
    /// Fixed rate of scenario 2; `None`: half the lower of the two scenario 1 rates.
    pub latency_rate: Option<f64>,
    pub many_queues: usize,
    pub many_queues_s: f64,
    pub many_queues_window: usize,
    pub dead_letter_s: f64,
    pub failover_before_s: f64,
    pub failover_after_s: f64,
    pub backlog_messages: u64,
    /// Scenario 9: messages in the delayed set.
    pub delayed_messages: u64,
    /// Scenario 9: 3-second CPU samples per measurement.
    pub idle_cpu_samples: usize,
    /// Scenario 10: messages in the backlog that is moved.
    pub move_messages: u64,
    /// Scenario 11: the backlog each catch-up variant is run with.
    pub catchup_backlog: u64,
    /// Scenario 11: the steady publish rate (msg/s) kept up while the follower catches up.
    pub catchup_rate: f64,
    /// Scenario 11: give up on a catch-up after this long.
    pub catchup_deadline: Duration,
    /// Scenario 8 (memory under pressure).
    pub memory: MemorySizes,
    /// Scenario 12: the queue counts (the smallest for the one-after-another declare and the
    /// first failover, the largest for the pipelined declare and the restart).
    pub scale_queues: Vec<usize>,
    /// Scenario 12: declares (and deletes) in flight from the one client when pipelined.
    pub scale_in_flight: usize,
    /// Scenario 12: the deadline of each declare, delete and restart phase.
    pub scale_deadline: Duration,
    /// Scenario 12: quiet time before idle CPU and RSS are read.
    pub scale_settle: Duration,
    /// Scenario 12: 3-second CPU samples per idle measurement.
    pub scale_cpu_samples: usize,
}

/// Sizes of scenario 8's parts ([`crate::memory`]).
#[derive(Debug, Clone, Serialize)]
pub struct MemorySizes {
    pub backlog: u64,
    pub backlog_body: usize,
    pub hold: Duration,
    pub flood: Duration,
    pub flood_body: usize,
    /// How far above the nodes' size the watermark of the first flood is.
    pub headroom_bytes: u64,
}

impl Settings {
    pub fn full() -> Settings {
        Settings {
            body_bytes: 1024,
            window: 1000,
            prefetch: 1000,
            warmup_s: 3.0,
            throughput_s: 30.0,
            latency_s: 20.0,
            latency_rate: None,
            many_queues: 100,
            many_queues_s: 20.0,
            many_queues_window: 100,
            dead_letter_s: 20.0,
            failover_before_s: 5.0,
            failover_after_s: 5.0,
            backlog_messages: 1_000_000,
            delayed_messages: 1_000_000,
            idle_cpu_samples: 20,
            move_messages: 100_000,
            catchup_backlog: 1_000_000,
            catchup_rate: 2000.0,
            catchup_deadline: Duration::from_secs(1800),
            memory: MemorySizes {
                backlog: 50_000,
                backlog_body: 4096,
                hold: Duration::from_secs(10),
                flood: Duration::from_secs(20),
                flood_body: 64 * 1024,
                headroom_bytes: 96 << 20,
            },
            scale_queues: vec![1000, 10_000],
            scale_in_flight: 64,
            scale_deadline: Duration::from_secs(600),
            scale_settle: Duration::from_secs(10),
            scale_cpu_samples: 10,
        }
    }

    pub fn quick() -> Settings {
        Settings {
            warmup_s: 1.0,
            throughput_s: 5.0,
            latency_s: 5.0,
            many_queues_s: 5.0,
            dead_letter_s: 5.0,
            failover_before_s: 2.0,
            failover_after_s: 2.0,
            backlog_messages: 20_000,
            delayed_messages: 20_000,
            idle_cpu_samples: 5,
            move_messages: 20_000,
            catchup_backlog: 20_000,
            catchup_deadline: Duration::from_secs(300),
            memory: MemorySizes {
                backlog: 10_000,
                hold: Duration::from_secs(4),
                flood: Duration::from_secs(8),
                headroom_bytes: 48 << 20,
                ..Settings::full().memory
            },
            scale_queues: vec![50, 200],
            scale_deadline: Duration::from_secs(120),
            scale_settle: Duration::from_secs(3),
            scale_cpu_samples: 3,
            ..Settings::full()
        }
    }
}

/// Which way a figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Better {
    Higher,
    Lower,
    /// Must be zero (lost messages).
    Zero,
}

/// One measured number of one scenario on one system.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub scenario: u8,
    pub name: String,
    pub unit: &'static str,
    pub better: Better,
    pub value: Option<f64>,
}

/// Latency percentiles of one kind (publish→confirm or publish→deliver) in one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub scenario: u8,
    pub kind: &'static str,
    pub samples: usize,
    /// `(percentile, milliseconds)`.
    pub percentiles: Vec<(f64, f64)>,
}

pub const PLOT_PERCENTILES: [f64; 6] = [50.0, 75.0, 90.0, 99.0, 99.9, 100.0];

impl Latency {
    fn from_samples(scenario: u8, kind: &'static str, mut us: Vec<u32>) -> Latency {
        us.sort_unstable();
        let percentiles = PLOT_PERCENTILES
            .iter()
            .filter_map(|&p| percentile(&us, p).map(|v| (p, v / 1000.0)))
            .collect();
        Latency {
            scenario,
            kind,
            samples: us.len(),
            percentiles,
        }
    }

    pub fn at(&self, p: f64) -> Option<f64> {
        self.percentiles
            .iter()
            .find(|(q, _)| (*q - p).abs() < 1e-9)
            .map(|(_, v)| *v)
    }
}

/// What one scenario measured on one system.
#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub figures: Vec<Figure>,
    pub latencies: Vec<Latency>,
    /// Observations worth reading next to the numbers (per-node memory, errors, …).
    pub notes: Vec<String>,
}

impl Outcome {
    pub(crate) fn figure(
        &mut self,
        scenario: u8,
        name: &str,
        unit: &'static str,
        better: Better,
        v: f64,
    ) {
        self.figures.push(Figure {
            scenario,
            name: name.to_string(),
            unit,
            better,
            value: Some(v),
        });
    }

    /// The value of a figure by name, if measured.
    pub fn value(&self, name: &str) -> Option<f64> {
        self.figures
            .iter()
            .find(|f| f.name == name)
            .and_then(|f| f.value)
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Declares `queue` through node `node`; returns the node that leads it.
pub(crate) async fn declare_on(
    cl: &Cluster,
    node: usize,
    queue: &str,
    spec: &QueueSpec,
) -> Result<usize> {
    let conn = Conn::connect(cl.system(), node).await?;
    conn.delete_queue(queue).await?;
    // The declare waits for the new queue's group to elect a leader; just after nodes
    // (re)start that can answer UNAVAILABLE (safe to retry).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match conn.declare_queue(queue, spec).await {
            Ok(()) => break,
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    match cl.system() {
        // The metadata picks the members and the first leader; ask who leads.
        System::Quorumq | System::QuorumqAmqp => {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match cl.leader(queue).await {
                    Ok(l) => return Ok(l),
                    Err(e) if Instant::now() > deadline => return Err(e),
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
        // Declared with x-queue-leader-locator=client-local.
        System::Rabbitmq => Ok(node),
    }
}

pub(crate) async fn delete_queues(cl: &Cluster, queues: &[String]) {
    for node in 0..NODES {
        if let Ok(conn) = Conn::connect(cl.system(), node).await {
            for q in queues {
                if let Err(e) = conn.delete_queue(q).await {
                    eprintln!("  delete {q}: {e:#}");
                }
            }
            return;
        }
    }
}

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
struct Flows {
    queues: Vec<(String, usize)>,
    window: usize,
    prefetch: u16,
    /// Per publisher.
    rate: Option<f64>,
    reject: bool,
    warmup_s: f64,
    measure_s: f64,
    body_bytes: usize,
}

struct FlowResult {
    confirmed_per_s: f64,
    delivered_per_s: f64,
    confirm_us: Vec<u32>,
    deliver_us: Vec<u32>,
    rejected: u64,
    errors: Vec<String>,
}

async fn run_flows(system: System, label: String, f: Flows) -> Result<FlowResult> {
    let mut streams = vec![0usize; NODES];
    let mut nth = Vec::with_capacity(f.queues.len());
    for (_, node) in &f.queues {
        nth.push(streams[*node]);
        streams[*node] += 1;
    }
    let conns = Conns::open(system, &streams).await?;
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    // Open every subscription and publisher first, so that the warm-up (and the rate) starts
    // with all of them running: opening a hundred takes a while.
    let mut subscriptions = Vec::new();
    for ((q, node), k) in f.queues.iter().zip(&nth) {
        let conn = Conns::pick(&conns.consume, *node, *k);
        subscriptions.push(conn.consumer(q, f.prefetch).await?);
    }
    let mut pubs = Vec::new();
    for ((q, node), k) in f.queues.iter().zip(&nth) {
        let conn = Conns::pick(&conns.publish, *node, *k);
        pubs.push(conn.publisher(q, f.window).await?);
    }
    let record_from_ns = now_ns() + secs(f.warmup_s).as_nanos() as u64;
    let progress = Progress::start(label, counters.clone());
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
    let mut publishers = Vec::new();
    for (i, p) in pubs.into_iter().enumerate() {
        let plan = PubPlan {
            window: f.window,
            rate: f.rate,
            count: None,
            stop: stop.clone(),
            body_bytes: f.body_bytes,
            first_id: (i as u64) << 40,
            record_from_ns,
        };
        publishers.push(tokio::spawn(publish_loop(p, plan, counters.clone())));
    }
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
        deliver_us: Vec::new(),
        rejected: 0,
        errors: Vec::new(),
    };
    for p in publishers {
        match tokio::time::timeout(Duration::from_secs(30), p).await {
            Ok(Ok(Ok(o))) => {
                result.confirm_us.extend(o.confirm_us);
                result.rejected += o.rejected;
            }
            Ok(Ok(Err(e))) => result.errors.push(format!("publisher: {e:#}")),
            Ok(Err(e)) => result.errors.push(format!("publisher task: {e}")),
            Err(_) => result
                .errors
                .push("publisher: confirms still missing 30 s after the end".into()),
        }
    }
    for c in consumers {
        match tokio::time::timeout(Duration::from_secs(30), c).await {
            Ok(Ok(Ok(o))) => result.deliver_us.extend(o.deliver_us),
            Ok(Ok(Err(e))) => result.errors.push(format!("consumer: {e:#}")),
            Ok(Err(e)) => result.errors.push(format!("consumer task: {e}")),
            Err(_) => result.errors.push("consumer did not stop".into()),
        }
    }
    Ok(result)
}

/// The figures of a throughput run: both rates and both latency distributions.
fn rate_outcome(scenario: u8, r: &FlowResult) -> Outcome {
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

fn add_flow_notes(out: &mut Outcome, r: &FlowResult) {
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

/// 1. One queue, one publisher (window 1000), one consumer (prefetch 1000, ack each).
pub async fn throughput(cl: &mut Cluster, s: &Settings) -> Result<Outcome> {
    let q = "bench-throughput".to_string();
    let leader = declare_on(cl, 0, &q, &QueueSpec::default()).await?;
    let r = run_flows(
        cl.system(),
        format!("1 throughput {}", cl.system()),
        Flows {
            queues: vec![(q.clone(), leader)],
            window: s.window,
            prefetch: s.prefetch,
            rate: None,
            reject: false,
            warmup_s: s.warmup_s,
            measure_s: s.throughput_s,
            body_bytes: s.body_bytes,
        },
    )
    .await?;
    delete_queues(cl, &[q]).await;
    let mut out = rate_outcome(1, &r);
    add_flow_notes(&mut out, &r);
    Ok(out)
}

/// 2. Latency at a fixed rate: publish→confirm and publish→deliver percentiles.
pub async fn latency(cl: &mut Cluster, s: &Settings, rate: f64) -> Result<Outcome> {
    let q = "bench-latency".to_string();
    let leader = declare_on(cl, 0, &q, &QueueSpec::default()).await?;
    let r = run_flows(
        cl.system(),
        format!("2 latency @{rate:.0}/s {}", cl.system()),
        Flows {
            queues: vec![(q.clone(), leader)],
            // Open loop: the window only bounds memory, the rate sets the pace.
            window: 10 * s.window,
            prefetch: s.prefetch,
            rate: Some(rate),
            reject: false,
            warmup_s: s.warmup_s,
            measure_s: s.latency_s,
            body_bytes: s.body_bytes,
        },
    )
    .await?;
    delete_queues(cl, &[q]).await;
    let mut out = Outcome::default();
    let confirm = Latency::from_samples(2, "publish→confirm", r.confirm_us.clone());
    let deliver = Latency::from_samples(2, "publish→deliver", r.deliver_us.clone());
    for (lat, what) in [(&confirm, "confirm"), (&deliver, "deliver")] {
        for (p, name) in [(50.0, "p50"), (99.0, "p99"), (99.9, "p99.9")] {
            if let Some(v) = lat.at(p) {
                out.figure(2, &format!("{what} {name}"), "ms", Better::Lower, v);
            }
        }
    }
    out.figure(
        2,
        "rate achieved",
        "msg/s",
        Better::Higher,
        r.confirmed_per_s,
    );
    out.latencies.push(confirm);
    out.latencies.push(deliver);
    add_flow_notes(&mut out, &r);
    Ok(out)
}

/// 3. Many queues: a publisher and a consumer on each, aggregate rate.
pub async fn many_queues(cl: &mut Cluster, s: &Settings) -> Result<Outcome> {
    let mut queues = Vec::new();
    for i in 0..s.many_queues {
        let q = format!("bench-many-{i:03}");
        let leader = declare_on(cl, i % NODES, &q, &QueueSpec::default()).await?;
        queues.push((q, leader));
    }
    let mut leaders = [0usize; NODES];
    for (_, l) in &queues {
        leaders[*l] += 1;
    }
    let r = run_flows(
        cl.system(),
        format!("3 {} queues {}", s.many_queues, cl.system()),
        Flows {
            queues: queues.clone(),
            window: s.many_queues_window,
            prefetch: s.many_queues_window as u16,
            rate: None,
            reject: false,
            warmup_s: s.warmup_s,
            measure_s: s.many_queues_s,
            body_bytes: s.body_bytes,
        },
    )
    .await?;
    let names: Vec<String> = queues.into_iter().map(|(q, _)| q).collect();
    delete_queues(cl, &names).await;
    let mut out = rate_outcome(3, &r);
    out.notes.push(format!(
        "leaders per node: {}",
        leaders.map(|n| n.to_string()).join("/")
    ));
    add_flow_notes(&mut out, &r);
    Ok(out)
}

/// 4. Dead-letter rate: a consumer rejects everything; at-least-once dead letters go to a queue
/// led by another node; dead letters per second arriving there.
pub async fn dead_letter(cl: &mut Cluster, s: &Settings) -> Result<Outcome> {
    let src = "bench-dlx-source".to_string();
    // The target is declared first, on node 2; the source must be led by another node.
    let mut target = String::new();
    let mut target_leader = 0;
    let mut declared = Vec::new();
    let mut source_leader = None;
    for attempt in 0..6 {
        let t = format!("bench-dlx-target-{attempt}");
        let l = declare_on(cl, 1, &t, &QueueSpec::default()).await?;
        declared.push(t.clone());
        let spec = QueueSpec {
            dead_letter_target: Some(t.clone()),
            ..Default::default()
        };
        let sl = declare_on(cl, 0, &src, &spec).await?;
        if sl != l {
            target = t;
            target_leader = l;
            source_leader = Some(sl);
            break;
        }
        Conn::connect(cl.system(), 0)
            .await?
            .delete_queue(&src)
            .await?;
    }
    let Some(source_leader) = source_leader else {
        delete_queues(cl, &declared).await;
        bail!("could not place the dead-letter target on another node than the source");
    };
    // Sample the target's length while the flow runs.
    let samples = Arc::new(std::sync::Mutex::new(Vec::<(Instant, u64)>::new()));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (samples, sampling, target) = (samples.clone(), sampling.clone(), target.clone());
        let conn = Conn::connect(cl.system(), target_leader).await?;
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                if let Ok(n) = conn.message_count(&target).await {
                    samples.lock().unwrap().push((Instant::now(), n));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let start = Instant::now();
    let r = run_flows(
        cl.system(),
        format!("4 dead-letter {}", cl.system()),
        Flows {
            queues: vec![(src.clone(), source_leader)],
            window: s.window,
            prefetch: s.prefetch,
            rate: None,
            reject: true,
            warmup_s: s.warmup_s,
            measure_s: s.dead_letter_s,
            body_bytes: s.body_bytes,
        },
    )
    .await?;
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.await;
    let samples = samples.lock().unwrap().clone();
    let from = start + secs(s.warmup_s);
    let until = from + secs(s.dead_letter_s);
    let window: Vec<&(Instant, u64)> = samples
        .iter()
        .filter(|(t, _)| *t >= from && *t <= until)
        .collect();
    let mut out = Outcome::default();
    if let (Some(first), Some(last)) = (window.first(), window.last())
        && last.0 > first.0
    {
        let rate = (last.1.saturating_sub(first.1)) as f64 / (last.0 - first.0).as_secs_f64();
        out.figure(4, "dead letters arriving", "msg/s", Better::Higher, rate);
    } else {
        out.notes
            .push("the target's length could not be sampled during the run".into());
    }
    out.figure(
        4,
        "rejected by consumer",
        "msg/s",
        Better::Higher,
        r.delivered_per_s,
    );
    out.notes.push(format!(
        "source led by node {}, target by node {}",
        source_leader + 1,
        target_leader + 1
    ));
    add_flow_notes(&mut out, &r);
    declared.push(src);
    delete_queues(cl, &declared).await;
    Ok(out)
}

/// 5. Failover: kill -9 the leader of a queue under publish load; time until publishes are
/// confirmed again; confirmed messages lost.
pub async fn failover(cl: &mut Cluster, s: &Settings) -> Result<Outcome> {
    let q = "bench-failover".to_string();
    let leader = declare_on(cl, 0, &q, &QueueSpec::default()).await?;
    let via = (leader + 1) % NODES;
    let system = cl.system();
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let killed_at_ns = Arc::new(AtomicU64::new(u64::MAX));
    let recovered_at_ns = Arc::new(AtomicU64::new(u64::MAX));
    let publisher = tokio::spawn(resilient_publisher(
        system,
        via,
        q.clone(),
        s.window,
        s.body_bytes,
        stop.clone(),
        [killed_at_ns.clone(), recovered_at_ns.clone()],
        counters.clone(),
    ));
    let progress = Progress::start(format!("5 failover {system}"), counters.clone());
    tokio::time::sleep(secs(s.failover_before_s)).await;
    killed_at_ns.store(now_ns(), Ordering::SeqCst);
    let kill_result = cl.kill9(leader);
    // Publish until confirms flow again and then some more, at most 60 s.
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && recovered_at_ns.load(Ordering::SeqCst) == u64::MAX {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(secs(s.failover_after_s)).await;
    stop.store(true, Ordering::Relaxed);
    progress.finish().await;
    kill_result?;
    let report = tokio::time::timeout(Duration::from_secs(90), publisher)
        .await
        .context("the failover publisher did not finish")??;
    let report = report?;
    let mut out = Outcome::default();
    match Some(recovered_at_ns.load(Ordering::SeqCst)).filter(|t| *t != u64::MAX) {
        Some(t) => out.figure(
            5,
            "kill -9 leader → confirms again",
            "s",
            Better::Lower,
            t.saturating_sub(killed_at_ns.load(Ordering::SeqCst)) as f64 / 1e9,
        ),
        None => out
            .notes
            .push("no publish was confirmed after the kill within 60 s".into()),
    }
    // Everything confirmed must be in the queue: drain it through the surviving node.
    let conn = Conn::connect(system, via).await?;
    let expected = report.confirmed_ids.len() as u64;
    let cons = consumer_with_retry(&conn, &q, s.prefetch).await?;
    let drained = consume_loop(
        cons,
        ConsPlan {
            reject: false,
            stop: Arc::new(AtomicBool::new(false)),
            count: None,
            idle_timeout: Some(Duration::from_secs(5)),
            collect_ids: true,
            record_from_ns: u64::MAX,
        },
        Arc::new(Counters::default()),
    )
    .await?;
    let received: HashSet<u64> = drained.ids.iter().copied().collect();
    let lost = report
        .confirmed_ids
        .iter()
        .filter(|id| !received.contains(id))
        .count();
    out.figure(
        5,
        "confirmed messages lost",
        "msgs",
        Better::Zero,
        lost as f64,
    );
    out.notes.push(format!(
        "killed node {} (leader), published via node {}; {} confirmed, {} received ({} distinct), {} reconnects{}",
        leader + 1,
        via + 1,
        expected,
        drained.received,
        received.len(),
        report.reconnects,
        drained
            .ended
            .map(|e| format!("; drain ended: {e}"))
            .unwrap_or_default()
    ));
    // Bring the killed node back for the next scenarios.
    cl.start_node(leader)?;
    cl.wait_serving(leader, Duration::from_secs(120)).await?;
    delete_queues(cl, &[q]).await;
    Ok(out)
}

/// When the leader was killed and when publishing was confirmed again (ns, `u64::MAX` = not
/// yet).
struct KillTimes {
    killed_at_ns: Arc<AtomicU64>,
    recovered_at_ns: Arc<AtomicU64>,
}

struct FailoverReport {
    confirmed_ids: Vec<u64>,
    reconnects: u32,
}

/// Publishes unique ids through `node`, keeping `window` in flight; on any error (a broken
/// stream, UNAVAILABLE during the election, a negative confirm) it backs off, opens a new
/// publisher and sends every unconfirmed id again. Stops when told and everything is confirmed.
#[allow(clippy::too_many_arguments)]
async fn resilient_publisher(
    system: System,
    node: usize,
    queue: String,
    window: usize,
    body_bytes: usize,
    stop: Arc<AtomicBool>,
    [killed_at_ns, recovered_at_ns]: [Arc<AtomicU64>; 2],
    counters: Arc<Counters>,
) -> Result<FailoverReport> {
    let times = KillTimes {
        killed_at_ns,
        recovered_at_ns,
    };
    use std::collections::{BTreeSet, HashMap};
    let mut report = FailoverReport {
        confirmed_ids: Vec::new(),
        reconnects: 0,
    };
    let mut next_id = 0u64;
    let mut backoff = Duration::from_millis(20);
    // Ids sent and not confirmed, to send again on a new publisher.
    let mut unconfirmed: BTreeSet<u64> = BTreeSet::new();
    let give_up = Duration::from_secs(60);
    let mut stopping_since: Option<Instant> = None;
    'reconnect: loop {
        if stop.load(Ordering::Relaxed) && unconfirmed.is_empty() {
            break;
        }
        if stopping_since.is_some_and(|t| t.elapsed() > give_up) {
            bail!(
                "{} ids still unconfirmed 60 s after the end",
                unconfirmed.len()
            );
        }
        let opened = async {
            let conn = Conn::connect(system, node).await?;
            conn.publisher(&queue, window).await
        };
        let mut p = match opened.await {
            Ok(p) => p,
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(400));
                continue;
            }
        };
        // seq of this publisher -> (id, send time)
        let mut in_flight: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut resend: Vec<u64> = unconfirmed.iter().copied().collect();
        resend.reverse();
        loop {
            let stopping = stop.load(Ordering::Relaxed);
            if stopping && stopping_since.is_none() {
                stopping_since = Some(Instant::now());
            }
            if stopping && unconfirmed.is_empty() {
                break 'reconnect;
            }
            let can_send = p.in_flight() < window && (!resend.is_empty() || !stopping);
            let sent = if can_send {
                let id = resend.pop().unwrap_or_else(|| {
                    next_id += 1;
                    next_id
                });
                match p.send(make_body(id, body_bytes)).await {
                    Ok(seq) => {
                        in_flight.insert(seq, (id, now_ns()));
                        unconfirmed.insert(id);
                        counters.sent.fetch_add(1, Ordering::Relaxed);
                        true
                    }
                    Err(_) => {
                        unconfirmed.insert(id);
                        break;
                    }
                }
            } else {
                false
            };
            // After a send only take a confirm that is already there; otherwise wait a little.
            let got = if sent && p.in_flight() < window {
                use futures::FutureExt;
                match p.next_confirm().now_or_never() {
                    None => continue,
                    Some(r) => r,
                }
            } else {
                match tokio::time::timeout(Duration::from_millis(200), p.next_confirm()).await {
                    Err(_) => continue,
                    Ok(r) => r,
                }
            };
            match got {
                Ok(None) => continue,
                Err(_) => break,
                Ok(Some((seq, ok))) => {
                    let settled = settle(
                        &mut in_flight,
                        &mut unconfirmed,
                        &mut report,
                        &counters,
                        &times,
                        seq,
                        ok,
                    );
                    if !settled {
                        break;
                    }
                    backoff = Duration::from_millis(20);
                }
            }
        }
        report.reconnects += 1;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(400));
    }
    Ok(report)
}

/// Records one confirm of the failover publisher; false when it was negative (reconnect).
fn settle(
    in_flight: &mut std::collections::HashMap<u64, (u64, u64)>,
    unconfirmed: &mut std::collections::BTreeSet<u64>,
    report: &mut FailoverReport,
    counters: &Counters,
    times: &KillTimes,
    seq: u64,
    ok: bool,
) -> bool {
    let Some((id, sent_ns)) = in_flight.remove(&seq) else {
        return true;
    };
    if !ok {
        return false;
    }
    if unconfirmed.remove(&id) {
        report.confirmed_ids.push(id);
        counters.confirmed.fetch_add(1, Ordering::Relaxed);
    }
    // The first confirm of a message sent after the kill: publishing works again.
    if sent_ns > times.killed_at_ns.load(Ordering::SeqCst) {
        let _ = times.recovered_at_ns.compare_exchange(
            u64::MAX,
            now_ns(),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }
    true
}

async fn consumer_with_retry(
    conn: &Conn,
    queue: &str,
    prefetch: u16,
) -> Result<crate::driver::Cons> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match conn.consumer(queue, prefetch).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// 6 and 7. Publish a backlog with no consumer; resident memory of each node; optionally
/// restart (kill -9, start) the node leading it and time until it serves again; then time to
/// drain the backlog.
pub async fn backlog(
    cl: &mut Cluster,
    s: &Settings,
    memory: bool,
    restart: bool,
) -> Result<Outcome> {
    let q = "bench-backlog".to_string();
    let system = cl.system();
    let leader = declare_on(cl, 0, &q, &QueueSpec::default()).await?;
    let mut out = Outcome::default();
    let before = cl.rss_kib();
    // Publish the backlog.
    let counters = Arc::new(Counters::default());
    let conn = Conn::connect(system, leader).await?;
    let p = conn.publisher(&q, s.window).await?;
    let progress = Progress::start(
        format!("6 backlog of {} {system}", s.backlog_messages),
        counters.clone(),
    );
    let start = Instant::now();
    let published = publish_loop(
        p,
        PubPlan {
            window: s.window,
            rate: None,
            count: Some(s.backlog_messages),
            stop: Arc::new(AtomicBool::new(false)),
            body_bytes: s.body_bytes,
            first_id: 0,
            record_from_ns: u64::MAX,
        },
        counters.clone(),
    )
    .await?;
    let publish_s = start.elapsed().as_secs_f64();
    progress.finish().await;
    let count = conn.message_count(&q).await?;
    out.notes.push(format!(
        "{} confirmed of {} sent in {publish_s:.1} s; the queue holds {count}",
        published.confirmed, published.sent
    ));
    if memory {
        out.figure(
            6,
            "publish into backlog",
            "msg/s",
            Better::Higher,
            published.confirmed as f64 / publish_s,
        );
        // Let background work (flushes, compaction, GC) settle before reading RSS.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let after = cl.rss_kib();
        let mib = |v: &[Option<u64>]| -> Vec<String> {
            v.iter()
                .map(|x| x.map_or("-".into(), |k| format!("{:.0}", k as f64 / 1024.0)))
                .collect()
        };
        out.notes.push(format!(
            "RSS MiB per node before: {}, with the backlog: {} (leader: node {})",
            mib(&before).join("/"),
            mib(&after).join("/"),
            leader + 1
        ));
        let max = after.iter().flatten().max().copied().unwrap_or(0) as f64 / 1024.0;
        let total = after.iter().flatten().sum::<u64>() as f64 / 1024.0;
        out.figure(6, "max node RSS with backlog", "MiB", Better::Lower, max);
        out.figure(6, "total RSS, 3 nodes", "MiB", Better::Lower, total);
    }
    if restart {
        cl.kill9(leader)?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Instant::now();
        cl.start_node(leader)?;
        let probe = make_body(u64::MAX, s.body_bytes);
        let served = loop {
            let attempt = async {
                let c = Conn::connect(system, leader).await?;
                let n = c.message_count(&q).await?;
                c.publish_one(&q, probe.clone()).await?;
                anyhow::Ok(n)
            };
            match tokio::time::timeout(Duration::from_secs(5), attempt).await {
                Ok(Ok(n)) => break Some(n),
                _ if started.elapsed() > Duration::from_secs(300) => break None,
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        match served {
            Some(n) => {
                out.figure(
                    7,
                    "restart → serves again",
                    "s",
                    Better::Lower,
                    started.elapsed().as_secs_f64(),
                );
                out.notes.push(format!(
                    "restarted node {} (the leader) with kill -9; it answered with {n} messages and confirmed a publish",
                    leader + 1
                ));
            }
            None => out
                .notes
                .push("the restarted node did not serve within 300 s".into()),
        }
        let rss = cl.rss_kib();
        if let Some(Some(k)) = rss.get(leader) {
            out.notes.push(format!(
                "RSS of the restarted node once serving: {:.0} MiB",
                *k as f64 / 1024.0
            ));
        }
    }
    // Drain through the node that leads the queue (found again whenever a subscription ends).
    let total = Conn::connect(system, leader)
        .await?
        .message_count(&q)
        .await?;
    let counters = Arc::new(Counters::default());
    let progress = Progress::start(format!("6 drain {total} {system}"), counters.clone());
    let start = Instant::now();
    let drained = drain(cl, &q, s.prefetch, total, counters).await?;
    progress.finish().await;
    if let Some(last) = drained.last_at {
        let t = (last - start).as_secs_f64();
        if memory {
            out.figure(6, "drain time", "s", Better::Lower, t);
            out.figure(
                6,
                "drain rate",
                "msg/s",
                Better::Higher,
                drained.received as f64 / t,
            );
        }
    }
    if drained.received < total {
        out.notes.push(format!(
            "drained {} of {total}{}",
            drained.received,
            drained
                .ended
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        ));
    }
    delete_queues(cl, &[q]).await;
    Ok(out)
}

/// Consumes `total` messages, acking each. A subscription that ends (a leader change ends
/// quorumq's consume streams) is opened again on the node that leads the queue then; the drain
/// gives up after twenty failed subscriptions in a row, two idle periods or 15 minutes.
async fn drain(
    cl: &Cluster,
    queue: &str,
    prefetch: u16,
    total: u64,
    counters: Arc<Counters>,
) -> Result<ConsOutcome> {
    let mut all = ConsOutcome::default();
    let deadline = Instant::now() + Duration::from_secs(900);
    let (mut failures, mut idle) = (0, 0);
    while all.received < total && Instant::now() < deadline && failures < 20 && idle < 2 {
        let node = cl.leader(queue).await.unwrap_or(0);
        let subscribed = async {
            let conn = Conn::connect(cl.system(), node).await?;
            consumer_with_retry(&conn, queue, prefetch).await
        };
        let c = match subscribed.await {
            Ok(c) => c,
            Err(e) => {
                failures += 1;
                all.ended = Some(format!("{e:#}"));
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
        };
        let o = consume_loop(
            c,
            ConsPlan {
                reject: false,
                stop: Arc::new(AtomicBool::new(false)),
                count: Some(total - all.received),
                idle_timeout: Some(Duration::from_secs(10)),
                collect_ids: false,
                record_from_ns: u64::MAX,
            },
            counters.clone(),
        )
        .await?;
        all.received += o.received;
        all.last_at = o.last_at.or(all.last_at);
        if o.ended.is_some() {
            all.ended = o.ended;
            if o.received == 0 {
                failures += 1;
            } else {
                failures = 0;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        } else if o.received == 0 {
            idle += 1;
        }
    }
    Ok(all)
}
