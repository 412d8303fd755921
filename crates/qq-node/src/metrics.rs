//! The node's event instruments: counters and histograms that the layers below the server
//! update as things happen (a proposal commits, a queue this node leads dead-letters a message,
//! a group elects this node, a consume stream opens or closes).
//!
//! Everything that is a *state* (queue depths, consumers, Raft terms and indexes, alarms,
//! memory) is not here: [`crate::observe`] reads it from the node at scrape time, so nothing is
//! updated per command for it.
//!
//! The instruments are process-wide (one node per process, like a default registry): an
//! update is an atomic add, needs no handle threaded through the layers, and never blocks.
//! [`crate::observe`] registers them for `GET /metrics`.
//!
//! Must not: import other modules of the node (it is a leaf), or be read to decide anything.

use std::sync::LazyLock;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use qq_core::{Reason, Strategy};

/// Commit latency buckets: 0.5 ms doubling 16 times, up to about 16 s (a proposal retries
/// through elections for at most 8 s).
const COMMIT_BUCKET_START_S: f64 = 0.000_5;
const COMMIT_BUCKET_FACTOR: f64 = 2.0;
const COMMIT_BUCKETS: u16 = 16;

/// Which kind of Raft group: the cluster's metadata group or a queue's group.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupKind {
    pub kind: &'static str,
}

pub const META: GroupKind = GroupKind { kind: "metadata" };
pub const QUEUE: GroupKind = GroupKind { kind: "queue" };

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeadLetterLabels {
    pub reason: &'static str,
    pub strategy: &'static str,
}

type HistogramFamily = Family<GroupKind, Histogram, fn() -> Histogram>;

/// The instruments; [`instruments`] is the one instance.
pub struct Instruments {
    /// Time from a local proposal (`client_write` on this node, the leader) to its commit and
    /// apply, as the proposer sees it.
    pub commit_latency: HistogramFamily,
    /// Messages that died in queues this node leads, by reason and strategy (counted by the
    /// leader as it applies the entry, so once per cluster).
    pub dead_lettered: Family<DeadLetterLabels, Counter>,
    /// Times this node became the leader of a group.
    pub leader_changes: Family<GroupKind, Counter>,
    /// Client consume streams open on this node.
    pub consume_streams: Gauge<i64, AtomicI64>,
    /// Snapshot bytes this node received from leaders (chunks written to its snapshot dir).
    pub snapshot_bytes_received: Counter,
    /// Snapshots received from a leader and installed here, by group kind.
    pub snapshots_installed: Family<GroupKind, Counter>,
    /// Times a queue replica here went from Awake to Asleep (idle: timers off).
    pub group_sleeps: Counter,
    /// Times a sleeping queue replica here (Asleep or Unloaded) was woken.
    pub group_wakes: Counter,
    /// Times a queue replica here went from Asleep to Unloaded, and had its Raft instance
    /// loaded again.
    pub group_unloads: Counter,
    pub group_loads: Counter,
}

fn commit_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        COMMIT_BUCKET_START_S,
        COMMIT_BUCKET_FACTOR,
        COMMIT_BUCKETS,
    ))
}

static INSTRUMENTS: LazyLock<Instruments> = LazyLock::new(|| Instruments {
    commit_latency: Family::new_with_constructor(commit_histogram),
    dead_lettered: Family::default(),
    leader_changes: Family::default(),
    consume_streams: Gauge::default(),
    snapshot_bytes_received: Counter::default(),
    snapshots_installed: Family::default(),
    group_sleeps: Counter::default(),
    group_wakes: Counter::default(),
    group_unloads: Counter::default(),
    group_loads: Counter::default(),
});

pub fn instruments() -> &'static Instruments {
    &INSTRUMENTS
}

/// A local proposal to a group of `kind` committed and applied after `took`.
pub fn committed(kind: GroupKind, took: Duration) {
    INSTRUMENTS
        .commit_latency
        .get_or_create(&kind)
        .observe(took.as_secs_f64());
}

/// A message died in a queue this node leads.
pub fn dead_lettered(reason: Reason, strategy: Strategy) {
    INSTRUMENTS
        .dead_lettered
        .get_or_create(&DeadLetterLabels {
            reason: reason.as_str(),
            strategy: strategy.as_str(),
        })
        .inc();
}

/// This node became the leader of a group of `kind`.
pub fn became_leader(kind: GroupKind) {
    INSTRUMENTS.leader_changes.get_or_create(&kind).inc();
}

/// A queue group's replica here went to sleep ([`crate::groups::residency`]).
pub fn group_slept() {
    INSTRUMENTS.group_sleeps.inc();
}

/// A sleeping queue group's replica here woke.
pub fn group_woke() {
    INSTRUMENTS.group_wakes.inc();
}

/// A sleeping replica here let its Raft instance go ([`crate::groups::registry`]).
pub fn group_unloaded() {
    INSTRUMENTS.group_unloads.inc();
}

/// An unloaded replica here had its Raft instance loaded again.
pub fn group_loaded() {
    INSTRUMENTS.group_loads.inc();
}

/// A snapshot chunk of `bytes` was written here.
pub fn snapshot_chunk_received(bytes: usize) {
    INSTRUMENTS.snapshot_bytes_received.inc_by(bytes as u64);
}

/// A snapshot from a leader was installed in a group of `kind`.
pub fn snapshot_installed(kind: GroupKind) {
    INSTRUMENTS.snapshots_installed.get_or_create(&kind).inc();
}

/// Counts one open consume stream for as long as it lives.
pub struct ConsumeStreamGuard(());

impl ConsumeStreamGuard {
    pub fn open() -> ConsumeStreamGuard {
        INSTRUMENTS.consume_streams.inc();
        ConsumeStreamGuard(())
    }
}

impl Drop for ConsumeStreamGuard {
    fn drop(&mut self) {
        INSTRUMENTS.consume_streams.dec();
    }
}
