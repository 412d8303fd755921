//! The seven scenarios of issue 5, each written once and run against either cluster.
//!
//! Every scenario declares its own queues (quorum queues, three replicas), puts publishers and
//! consumers on the node that leads their queue (unless the scenario is about another node),
//! measures after a warm-up, and deletes its queues afterwards so the next scenario starts from
//! an idle cluster. A scenario returns [`Figure`]s (the table rows) and latency percentiles
//! (the plot).
//!
//! The rooms: this file holds what every scenario shares (the settings, the figures and
//! latencies a scenario returns, declaring and deleting queues); `flows` runs publishers and
//! consumers side by side for a measured while (scenarios 1-4 are built on it); `steady` holds
//! scenarios 1-4; `failover` scenario 5 with its reconnecting publisher; `backlog` scenarios 6
//! and 7.

mod backlog;
mod failover;
mod flows;
mod steady;
mod tail;

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

pub use self::backlog::backlog;
pub use self::failover::failover;
pub use self::steady::{dead_letter, latency, many_queues, throughput};
use crate::System;
use crate::cluster::{Cluster, NODES};
use crate::driver::{Conn, QueueSpec};
use crate::load::percentile;

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

/// A subscription to `queue` on `conn`, retried for 30 s (a queue just after a leader change
/// can refuse it for a moment).
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
