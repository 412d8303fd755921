//! One queue group's state machine: the pure [`qq_core::queue::QueueState`] inside the shared
//! [`Shell`](super::shell::Shell), plus the message bodies.
//!
//! What it adds to the pure machine is IO, and only deterministic IO: it stores the body of an
//! accepted message under `(group, message id)` in RocksDB and deletes it when the machine says
//! the message is gone, so the in-memory state holds just headers. Effects that concern clients
//! are carried out only where this node leads the queue: deliveries go to the consumer sessions
//! registered here, at-most-once dead letters to the queue's leader actor
//! ([`crate::leader`]); followers apply the same entries and skip them.
//!
//! Snapshots carry the state plus the bodies of every live message, so a follower that catches
//! up by snapshot can serve them.
//!
//! The rooms: `entry` is what a log entry carries and its checks; `apply` is the [`Machine`]
//! impl: it applies an entry and carries out the effects (deliveries, at-most-once dead
//! letters) on the leader; `bodies` holds the body writes of the entry being applied;
//! `snapshot` writes and installs the queue's snapshots. This file holds the machine itself
//! and what it hands to the tasks of this node (consumer sessions, the leader actor).
//!
//! Must not: read a clock, propose, or wait on anything another task could hold up (every send
//! from here is `try_send` on a bounded channel, and what a full channel means is written at
//! its bound).

mod apply;
mod bodies;
mod entry;
mod snapshot;

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use qq_core::meta::QueueMeta;
use qq_core::queue::{Delivery, QueueState};
use qq_core::{ConsumerId, Message, MessageId, QueueConfig, Reason};
use qq_raft::GroupId;
use qq_raft::store::Store;
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use self::bodies::PendingBodies;
pub use self::entry::{
    MAX_BATCH, QueueEntry, QueueEntryRef, QueueReplyOut, QueueRequest, check_entry, check_message,
    check_requests,
};
pub use self::snapshot::QueueCut;
use super::shell::{LogId, Machine, Refusals};

/// Deliveries buffered for a consumer with no prefetch limit (prefetch 0), at most. A consumer
/// with a limit never has more than `prefetch` deliveries outstanding, so its buffer of
/// `prefetch + 1` never fills. When this one fills, the consumer is dropped: its session ends
/// with UNAVAILABLE once it has sent what is buffered, and its unacked messages return to the
/// queue.
pub const UNLIMITED_PREFETCH_BUFFER: usize = 65_536;

/// At-most-once dead letters waiting for the leader actor, at most. When full, the dead letter
/// is dropped (at-most-once allows it) and the drop is logged.
pub const LEADER_EVENTS_BOUND: usize = 65_536;

/// Sent to a consumer session registered on this (leader) node.
#[derive(Debug)]
pub enum ConsumerEvent {
    Deliver {
        delivery: Delivery,
        /// Returns of any kind so far (`x-acquired-count`).
        acquired_count: u32,
        message: Message,
    },
    /// The stream must end: leadership lost or queue deleted.
    Cancelled { reason: String, unavailable: bool },
}

/// A dead letter the leader must republish (at-most-once): already gone from the state.
#[derive(Debug)]
pub struct DeadLetterJob {
    pub group: GroupId,
    pub config: QueueConfig,
    pub id: MessageId,
    pub reason: Reason,
    pub died_at_ms: u64,
    /// The consumer's `reason_detail` of a reject.
    pub detail: Option<String>,
    pub message: Message,
}

/// What the state machine hands to the queue's leader actor.
#[derive(Debug)]
pub enum LeaderEvent {
    DeadLetter(DeadLetterJob),
    /// The queue's configuration in the metadata changed: bring the queue's own log in line.
    ConfigChanged,
}

/// The queue group's state, shared by the state machine (inside openraft) and the node.
pub struct QueueMachine {
    group: GroupId,
    store: Store,
    state: Mutex<QueueState>,
    last_applied: Mutex<Option<LogId>>,
    consumers: Mutex<HashMap<ConsumerId, mpsc::Sender<ConsumerEvent>>>,
    /// The leader actor's inbox while this node leads the queue; `None` otherwise.
    /// The attached leader actor's inbox, with the number of its attachment.
    leader: Mutex<Option<(u64, mpsc::Sender<LeaderEvent>)>>,
    attachments: std::sync::atomic::AtomicU64,
    /// Bumped after every applied batch (the leader actor and waiters watch it).
    applied: watch::Sender<u64>,
    /// Bodies held back from RocksDB and deletions to write (see `bodies.rs`).
    pending: Mutex<PendingBodies>,
    /// At-most-once dead letters dropped at a full leader inbox (the leader actor logs them).
    dropped_dead_letters: AtomicU64,
    refusals: Refusals,
    /// The queue's top strict priority level (`x-max-priority`, fixed for its lifetime):
    /// given to the state at construction and again after a snapshot install.
    max_priority: Option<u8>,
}

fn io_encode<T: Serialize>(v: &T) -> io::Result<Vec<u8>> {
    qq_raft::encoding::to_vec_exact(v).map_err(|e| io::Error::other(format!("encode: {e}")))
}

impl QueueMachine {
    pub fn new(group: GroupId, store: Store, config: QueueConfig) -> Arc<QueueMachine> {
        Self::with_max_priority(group, store, config, None)
    }

    /// The machine of queue `qm` (its configuration and its strict priority levels).
    pub fn for_queue(store: Store, qm: &QueueMeta) -> Arc<QueueMachine> {
        let max_priority = qq_core::policy::max_priority(&qm.arguments);
        Self::with_max_priority(qm.id, store, qm.config.clone(), max_priority)
    }

    fn with_max_priority(
        group: GroupId,
        store: Store,
        config: QueueConfig,
        max_priority: Option<u8>,
    ) -> Arc<QueueMachine> {
        let mut state = QueueState::new(config);
        state.set_max_priority(max_priority);
        let pending = Mutex::new(PendingBodies::new(&store));
        Arc::new(QueueMachine {
            group,
            store,
            state: Mutex::new(state),
            last_applied: Mutex::new(None),
            consumers: Mutex::new(HashMap::new()),
            leader: Mutex::new(None),
            attachments: std::sync::atomic::AtomicU64::new(0),
            applied: watch::channel(0).0,
            pending,
            dropped_dead_letters: AtomicU64::new(0),
            refusals: Refusals::default(),
            max_priority,
        })
    }

    /// Committed entries this replica refused as no-ops since it started.
    pub fn refusals(&self) -> u64 {
        self.refusals.count()
    }

    /// Read the pure state (a short lock; do not hold it across an await).
    pub fn with_state<R>(&self, f: impl FnOnce(&QueueState) -> R) -> R {
        f(&self.state.lock().unwrap())
    }

    pub fn subscribe_applied(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    pub fn last_applied_index(&self) -> u64 {
        self.last_applied().map(|l| l.index).unwrap_or(0)
    }

    /// Register a consumer session's inbox (this node leads the queue). The buffer holds every
    /// delivery the prefetch allows (see [`UNLIMITED_PREFETCH_BUFFER`]).
    pub fn register_consumer(
        &self,
        consumer: ConsumerId,
        prefetch: u32,
    ) -> mpsc::Receiver<ConsumerEvent> {
        let capacity = if prefetch == 0 {
            UNLIMITED_PREFETCH_BUFFER
        } else {
            prefetch as usize + 1
        };
        let (tx, rx) = mpsc::channel(capacity);
        self.consumers.lock().unwrap().insert(consumer, tx);
        rx
    }

    pub fn unregister_consumer(&self, consumer: ConsumerId) {
        self.consumers.lock().unwrap().remove(&consumer);
    }

    pub fn local_consumers(&self) -> Vec<ConsumerId> {
        self.consumers.lock().unwrap().keys().copied().collect()
    }

    /// Tell every local consumer session to end.
    pub fn cancel_consumers(&self, reason: &str, unavailable: bool) {
        let mut consumers = self.consumers.lock().unwrap();
        for (_, tx) in consumers.drain() {
            // A full inbox ends its session anyway (the sender is dropped here).
            let _ = tx.try_send(ConsumerEvent::Cancelled {
                reason: reason.to_string(),
                unavailable,
            });
        }
    }

    /// The leader actor starts: it receives the leader-only effects from now on. Returns the
    /// attachment's number (for [`QueueMachine::detach_leader`]) and the inbox.
    pub fn attach_leader(&self) -> (u64, mpsc::Receiver<LeaderEvent>) {
        let (tx, rx) = mpsc::channel(LEADER_EVENTS_BOUND);
        let n = self
            .attachments
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *self.leader.lock().unwrap() = Some((n, tx));
        (n, rx)
    }

    /// The actor of attachment `n` ended. A later attachment stays: the machine outlives a
    /// replica's Raft instance (unloaded and loaded again), and the watcher of the old instance
    /// may end after the new one attached its actor.
    pub fn detach_leader(&self, n: u64) {
        let mut leader = self.leader.lock().unwrap();
        if leader.as_ref().is_some_and(|(current, _)| *current == n) {
            *leader = None;
        }
    }

    /// Tell the leader actor, if any, that the metadata changed the queue's configuration.
    pub fn notify_config_changed(&self) {
        if let Some((_, tx)) = self.leader.lock().unwrap().as_ref() {
            // Full: the actor is busy; it compares configurations again on its retry timer.
            let _ = tx.try_send(LeaderEvent::ConfigChanged);
        }
    }

    fn is_leader(&self) -> bool {
        self.leader.lock().unwrap().is_some()
    }

    /// At-most-once dead letters dropped so far because the leader actor's inbox was full
    /// ([`LEADER_EVENTS_BOUND`]); a running count since this machine started.
    pub fn dropped_dead_letters(&self) -> u64 {
        self.dropped_dead_letters.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
