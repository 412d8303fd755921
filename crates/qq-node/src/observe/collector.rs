//! What `GET /metrics` reads from the node at scrape time: queue depths and consumers of the
//! queues this node leads, the Raft state of every group it hosts, memory, alarms, health.
//!
//! Nothing here is updated per command: each scrape walks the registry of groups once, reading
//! each group's Raft metrics watch and, for a queue this node leads, its counts under the
//! state's short lock. A queue is reported only by its leader, so it appears once in the
//! cluster; with `per_queue_metrics = false` only per-node sums are exported, so the number
//! of series stays bounded whatever the number of queues.
//!
//! Must not: hold a lock of the node while encoding, or change anything.

use std::fmt;

use openraft::async_runtime::WatchReceiver;
use openraft::{RaftMetrics, ServerState};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use qq_core::queue::Counts;
use qq_raft::TypeConfig;
use tokio::sync::watch;

use super::Observed;
use crate::alarms::rss_bytes;
use crate::groups::registry::Replica;

/// The alarms a node can raise, each exported as 0 or 1.
const ALARM_KINDS: [&str; 2] = ["memory", "disk"];

/// Raft roles a group on this node can be in, each exported with its count of groups.
const RAFT_STATES: [(ServerState, &str); 5] = [
    (ServerState::Leader, "leader"),
    (ServerState::Follower, "follower"),
    (ServerState::Candidate, "candidate"),
    (ServerState::Learner, "learner"),
    (ServerState::Shutdown, "shutdown"),
];

/// The scrape-time collector of one node.
pub struct NodeCollector {
    node: Observed,
    serving: watch::Receiver<bool>,
}

impl fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeCollector")
            .field("node", &self.node.id())
            .finish()
    }
}

impl NodeCollector {
    pub fn new(node: Observed, serving: watch::Receiver<bool>) -> NodeCollector {
        NodeCollector { node, serving }
    }
}

/// One Raft group's state as this node sees it.
struct GroupRow {
    vhost: String,
    queue: String,
    state: ServerState,
    term: u64,
    committed: u64,
    applied: u64,
    /// Last log index removed from this node's log by compaction (0: none yet).
    purged: u64,
    /// The replica sleeps (an idle queue group: no election timer, no heartbeats).
    asleep: bool,
    /// The replica's Raft instance is unloaded (it slept for `unload_after_ms`).
    unloaded: bool,
    /// Only for a queue this node leads (counts are exact there).
    counts: Option<Counts>,
    /// The machine version of the queue's state here (`qq_core::queue`'s module `machine`).
    machine_version: u32,
    /// The queue's consumer timeout in its state here (0: none).
    consumer_timeout_ms: u64,
    /// Ready high-priority messages in its state here (never delivered ones).
    high_priority_ready: u64,
    /// A queue with strict levels (`x-max-priority`): the ready messages of each level that
    /// holds some, in its state here.
    strict_levels: Vec<(u8, u64)>,
}

impl GroupRow {
    /// A group's Raft state from its metrics; awake, no counts (the caller adds them).
    fn of(m: &RaftMetrics<TypeConfig>, vhost: String, queue: String) -> GroupRow {
        let index = |l: Option<&openraft::alias::LogIdOf<TypeConfig>>| l.map_or(0, |l| l.index);
        GroupRow {
            vhost,
            queue,
            state: m.state,
            term: m.current_term,
            committed: index(m.local_committed.as_ref()),
            applied: index(m.last_applied.as_ref()),
            purged: index(m.purged.as_ref()),
            asleep: false,
            unloaded: false,
            counts: None,
            machine_version: 0,
            consumer_timeout_ms: 0,
            high_priority_ready: 0,
            strict_levels: Vec::new(),
        }
    }
}

/// A label value a client chose (a vhost or queue name), escaped as the Prometheus text
/// format requires: backslash, double quote and line feed. prometheus-client writes label
/// values as they are, so every client-chosen label value goes through this encoder.
struct Escaped<'a>(&'a str);

impl EncodeLabelValue for Escaped<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        use std::fmt::Write;
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// The labels of a queue's series.
fn queue_labels(g: &GroupRow) -> [(&'static str, Escaped<'_>); 2] {
    [("vhost", Escaped(&g.vhost)), ("queue", Escaped(&g.queue))]
}

/// Everything one scrape reports, read before anything is encoded.
struct Scrape {
    groups: Vec<GroupRow>,
    meta: GroupRow,
}

impl NodeCollector {
    fn read(&self) -> Scrape {
        let registry = self.node.registry();
        let groups = registry
            .replicas()
            .into_iter()
            .map(|r| {
                let meta = r.meta();
                let mut row = GroupRow::of(&r.metrics(), meta.vhost.clone(), meta.name.clone());
                row.asleep = r.residency().is_asleep();
                row.unloaded = matches!(r, Replica::Unloaded(_));
                row.counts = (row.state == ServerState::Leader)
                    .then(|| r.machine().with_state(|s| s.counts()));
                (
                    row.machine_version,
                    row.consumer_timeout_ms,
                    row.high_priority_ready,
                    row.strict_levels,
                ) = r.machine().with_state(|s| {
                    (
                        s.machine_version(),
                        s.consumer_timeout_ms().unwrap_or(0),
                        s.high_priority_ready(),
                        s.strict_level_counts(),
                    )
                });
                row
            })
            .collect();
        let metrics = registry.meta_raft().metrics();
        let mut meta = GroupRow::of(&metrics.borrow_watched(), String::new(), String::new());
        meta.machine_version = self.node.view().current().machine_version();
        Scrape { groups, meta }
    }
}

/// Encodes one gauge family: `name` with `help`, one sample per `(labels, value)`.
fn gauges<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, i64)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A gauge without labels.
fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64) -> fmt::Result {
    let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(value).encode(family)
}

/// A counter without labels, read at scrape time.
fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    ConstCounter::new(value).encode(family)
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let scrape = self.read();
        let led: Vec<(&GroupRow, &Counts)> = scrape
            .groups
            .iter()
            .filter_map(|g| g.counts.as_ref().map(|c| (g, c)))
            .collect();
        let sum = |f: fn(&Counts) -> u64| int(led.iter().map(|(_, c)| f(c)).sum());

        // Per node: always, bounded.
        gauge(
            &mut encoder,
            "node_serving",
            "1 when this node has joined and sees a metadata leader (health SERVING)",
            i64::from(*self.serving.borrow()),
        )?;
        gauge(
            &mut encoder,
            "queues_led",
            "Queues this node leads",
            int(led.len() as u64),
        )?;
        gauge(
            &mut encoder,
            "messages_ready",
            "Ready messages, summed over the queues this node leads",
            sum(|c| c.ready),
        )?;
        gauge(
            &mut encoder,
            "messages_unacked",
            "Unacknowledged deliveries (and Get leases), summed over the queues this node leads",
            sum(|c| c.unacked),
        )?;
        gauge(
            &mut encoder,
            "messages_dead_letter_held",
            "Dead letters held for at-least-once transfer, summed over the queues this node leads",
            sum(|c| c.held),
        )?;
        gauge(
            &mut encoder,
            "consumers",
            "Consumers attached, summed over the queues this node leads",
            sum(|c| c.consumers),
        )?;
        gauges(
            &mut encoder,
            "raft_groups",
            "Raft groups hosted on this node (queues and metadata), by this node's role in them",
            RAFT_STATES.iter().map(|(state, name)| {
                let n = scrape
                    .groups
                    .iter()
                    .chain(std::iter::once(&scrape.meta))
                    .filter(|g| g.state == *state)
                    .count();
                ([("state", *name)], int(n as u64))
            }),
        )?;
        gauge(
            &mut encoder,
            "metadata_machine_version",
            "The metadata machine version this node's replica runs (see Upgrades)",
            i64::from(scrape.meta.machine_version),
        )?;
        gauge(
            &mut encoder,
            "raft_groups_asleep",
            "Queue groups whose replica on this node sleeps, Asleep or Unloaded (no election timer, no heartbeats)",
            int(scrape.groups.iter().filter(|g| g.asleep).count() as u64),
        )?;
        gauge(
            &mut encoder,
            "raft_groups_unloaded",
            "Queue groups whose replica on this node is Unloaded (no Raft instance)",
            int(scrape.groups.iter().filter(|g| g.unloaded).count() as u64),
        )?;
        let (calls, messages) = qq_raft::mux::sent();
        counter(
            &mut encoder,
            "peer_raft_calls_batched",
            "Raft requests this node sent batched on its per-peer streams (any group)",
            calls,
        )?;
        counter(
            &mut encoder,
            "peer_raft_batches",
            "Messages those batched requests travelled in (calls / batches: requests per message)",
            messages,
        )?;
        counter(
            &mut encoder,
            "peer_protocol_refusals",
            "Node-to-node requests this node refused because the sender's protocol version and its own cannot read each other",
            qq_raft::protocol::refused(),
        )?;
        gauge(
            &mut encoder,
            "raft_apply_lag_entries",
            "Committed but not yet applied entries, summed over the groups hosted on this node",
            int(scrape
                .groups
                .iter()
                .chain(std::iter::once(&scrape.meta))
                .map(|g| g.committed.saturating_sub(g.applied))
                .sum()),
        )?;
        gauge(
            &mut encoder,
            "raft_metadata_term",
            "Raft term of the metadata group on this node",
            int(scrape.meta.term),
        )?;
        gauge(
            &mut encoder,
            "raft_metadata_commit_index",
            "Last committed log index of the metadata group known to this node",
            int(scrape.meta.committed),
        )?;
        gauge(
            &mut encoder,
            "raft_metadata_applied_index",
            "Last log index of the metadata group applied on this node",
            int(scrape.meta.applied),
        )?;
        gauge(
            &mut encoder,
            "raft_metadata_leader",
            "1 when this node leads the metadata group",
            i64::from(scrape.meta.state == ServerState::Leader),
        )?;
        match rss_bytes() {
            Ok(rss) => gauge(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory of this node's process",
                int(rss),
            )?,
            Err(e) => tracing::debug!("metrics: cannot read RSS: {e}"),
        }
        let active = self.node.alarms().active();
        gauges(
            &mut encoder,
            "alarm",
            "1 while the alarm is set on this node (publishes are refused), else 0",
            ALARM_KINDS.iter().map(|kind| {
                (
                    [("kind", *kind)],
                    i64::from(active.iter().any(|a| a == kind)),
                )
            }),
        )?;

        if !self.node.per_queue_metrics() {
            return Ok(());
        }
        // Per queue this node leads.
        let per_queue: [(&str, &str, fn(&Counts) -> u64); 4] = [
            (
                "queue_messages_ready",
                "Ready messages in the queue (reported by its leader)",
                |c| c.ready,
            ),
            (
                "queue_messages_unacked",
                "Unacknowledged deliveries and Get leases of the queue (reported by its leader)",
                |c| c.unacked,
            ),
            (
                "queue_messages_dead_letter_held",
                "Dead letters the queue holds for at-least-once transfer (reported by its leader)",
                |c| c.held,
            ),
            (
                "queue_consumers",
                "Consumers attached to the queue (reported by its leader)",
                |c| c.consumers,
            ),
        ];
        for (name, help, value) in per_queue {
            gauges(
                &mut encoder,
                name,
                help,
                led.iter().map(|(g, c)| (queue_labels(g), int(value(c)))),
            )?;
        }
        // Per Raft group hosted here (leaders and followers: lag shows between them).
        let per_group: [(&str, &str, fn(&GroupRow) -> u64); 8] = [
            (
                "raft_term",
                "Raft term of the queue's group on this node",
                |g| g.term,
            ),
            (
                "raft_commit_index",
                "Last committed log index of the queue's group known to this node",
                |g| g.committed,
            ),
            (
                "raft_applied_index",
                "Last log index of the queue's group applied on this node",
                |g| g.applied,
            ),
            (
                "raft_log_purged_index",
                "Last log index of the queue's group removed from this node's log by compaction \
                 (0: none); a follower whose next entry is at or below the leader's catches up \
                 by snapshot",
                |g| g.purged,
            ),
            (
                "raft_leader",
                "1 when this node leads the queue's group",
                |g| u64::from(g.state == ServerState::Leader),
            ),
            (
                "queue_machine_version",
                "Machine version of the queue's state on this node: the queue uses a newer \
                 release's commands once every member runs that release (docs/operating.md, \
                 Upgrades)",
                |g| u64::from(g.machine_version),
            ),
            (
                "queue_consumer_timeout_ms",
                "Consumer timeout of the queue in its state on this node, in ms (0: none)",
                |g| g.consumer_timeout_ms,
            ),
            (
                "queue_messages_ready_high_priority",
                "Ready high-priority messages (priority 5 and up, not delivered yet) in the \
                 queue's state on this node (docs/semantics.md, Message priorities)",
                |g| g.high_priority_ready,
            ),
        ];
        for (name, help, value) in per_group {
            gauges(
                &mut encoder,
                name,
                help,
                scrape
                    .groups
                    .iter()
                    .map(|g| (queue_labels(g), int(value(g)))),
            )?;
        }
        // Queues with strict levels: one series per level that holds a ready message.
        let levels: Vec<(&GroupRow, String, u64)> = scrape
            .groups
            .iter()
            .flat_map(|g| {
                g.strict_levels
                    .iter()
                    .map(move |(level, n)| (g, level.to_string(), *n))
            })
            .collect();
        gauges(
            &mut encoder,
            "queue_messages_ready_by_priority",
            "Ready messages per priority level of a queue with x-max-priority, in its state on \
             this node (levels holding none are left out; docs/semantics.md, Message priorities)",
            levels.iter().map(|(g, level, n)| {
                let [vhost, queue] = queue_labels(g);
                ([vhost, queue, ("priority", Escaped(level))], int(*n))
            }),
        )?;
        Ok(())
    }
}
