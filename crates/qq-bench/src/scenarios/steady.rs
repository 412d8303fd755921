//! Scenarios 1-4: steady flows. Throughput of one queue, latency at a fixed rate, many
//! queues at once, and the rate of dead letters between two nodes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use tokio::task::JoinHandle;

use super::flows::{Flows, add_flow_notes, rate_outcome, run_flows};
use super::{Better, Latency, Outcome, Settings, declare_on, delete_queues, secs};
use crate::cluster::{Cluster, NODES};
use crate::disk_probe::{DiskProbe, ProbeSummary};
use crate::driver::{Conn, QueueSpec};

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
    let probe = DiskProbe::start(cl.run_dir(), Instant::now() + secs(s.warmup_s))?;
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
    .await;
    let probed = probe.finish();
    let r = r?;
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
    add_probe(&mut out, probed);
    if let Some(slow) = super::tail::slow_confirms(&r.confirm_sent_ns, &r.confirm_us) {
        out.notes.push(slow.note());
    }
    add_flow_notes(&mut out, &r);
    Ok(out)
}

/// The disk probe's rounds beside the latencies ([`crate::disk_probe`]).
fn add_probe(out: &mut Outcome, probed: std::io::Result<Option<ProbeSummary>>) {
    match probed {
        Ok(Some(p)) => {
            out.figure(2, "disk probe fdatasync p99", "ms", Better::Lower, p.p99_ms);
            out.figure(2, "disk probe fdatasync max", "ms", Better::Lower, p.max_ms);
            out.notes.push(format!(
                "disk probe: {} rounds of a 4 KiB write and fdatasync, {} of them 50 ms or more",
                p.rounds, p.over_50ms
            ));
        }
        Ok(None) => out.notes.push("disk probe: no round was counted".into()),
        Err(e) => out.notes.push(format!("disk probe failed: {e}")),
    }
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

/// Where scenario 4's queues landed: the source, and a target led by another node.
struct Placed {
    /// Every queue declared (the targets tried and the source), to delete at the end.
    declared: Vec<String>,
    target: String,
    target_leader: usize,
    source_leader: usize,
}

/// Declares a dead-letter target on node 2 and the source on node 1 until their leaders differ
/// (six tries).
async fn place_dead_letter(cl: &Cluster, src: &str) -> Result<Placed> {
    let mut declared = Vec::new();
    for attempt in 0..6 {
        let t = format!("bench-dlx-target-{attempt}");
        let l = declare_on(cl, 1, &t, &QueueSpec::default()).await?;
        declared.push(t.clone());
        let spec = QueueSpec {
            dead_letter_target: Some(t.clone()),
            ..Default::default()
        };
        let sl = declare_on(cl, 0, src, &spec).await?;
        if sl != l {
            return Ok(Placed {
                declared,
                target: t,
                target_leader: l,
                source_leader: sl,
            });
        }
        Conn::connect(cl.system(), 0)
            .await?
            .delete_queue(src)
            .await?;
    }
    delete_queues(cl, &declared).await;
    bail!("could not place the dead-letter target on another node than the source");
}

/// A queue's length, read every 250 ms while a run goes on.
struct LengthSampler {
    samples: Arc<std::sync::Mutex<Vec<(Instant, u64)>>>,
    sampling: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl LengthSampler {
    async fn start(cl: &Cluster, node: usize, queue: &str) -> Result<LengthSampler> {
        let samples = Arc::new(std::sync::Mutex::new(Vec::<(Instant, u64)>::new()));
        let sampling = Arc::new(AtomicBool::new(true));
        let conn = Conn::connect(cl.system(), node).await?;
        let (into, running, queue) = (samples.clone(), sampling.clone(), queue.to_string());
        let task = tokio::spawn(async move {
            while running.load(Ordering::Relaxed) {
                if let Ok(n) = conn.message_count(&queue).await {
                    into.lock().unwrap().push((Instant::now(), n));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Ok(LengthSampler {
            samples,
            sampling,
            task,
        })
    }

    /// Stops sampling; the rate at which the length grew between `from` and `until`.
    async fn growth(self, from: Instant, until: Instant) -> Option<f64> {
        self.sampling.store(false, Ordering::Relaxed);
        let _ = self.task.await;
        let samples = self.samples.lock().unwrap().clone();
        let window: Vec<&(Instant, u64)> = samples
            .iter()
            .filter(|(t, _)| *t >= from && *t <= until)
            .collect();
        match (window.first(), window.last()) {
            (Some(first), Some(last)) if last.0 > first.0 => {
                Some((last.1.saturating_sub(first.1)) as f64 / (last.0 - first.0).as_secs_f64())
            }
            _ => None,
        }
    }
}

/// 4. Dead-letter rate: a consumer rejects everything; at-least-once dead letters go to a queue
/// led by another node; dead letters per second arriving there.
pub async fn dead_letter(cl: &mut Cluster, s: &Settings) -> Result<Outcome> {
    let src = "bench-dlx-source".to_string();
    // The target is declared first, on node 2; the source must be led by another node.
    let Placed {
        mut declared,
        target,
        target_leader,
        source_leader,
    } = place_dead_letter(cl, &src).await?;
    // Sample the target's length while the flow runs.
    let sampler = LengthSampler::start(cl, target_leader, &target).await?;
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
    let from = start + secs(s.warmup_s);
    let until = from + secs(s.dead_letter_s);
    let mut out = Outcome::default();
    match sampler.growth(from, until).await {
        Some(rate) => out.figure(4, "dead letters arriving", "msg/s", Better::Higher, rate),
        None => out
            .notes
            .push("the target's length could not be sampled during the run".into()),
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
