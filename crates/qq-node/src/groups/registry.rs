//! The Raft groups this node hosts: the metadata group and the queue groups it is a member of.
//!
//! The registry answers "is group G running here, who leads it as far as this node knows, what
//! is its local state". Starting and stopping groups is the supervisor's job
//! ([`crate::node`]); proposing is the proposer's ([`crate::proposer`]).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::{Raft, ServerState};
use qq_core::NodeId;
use qq_core::meta::QueueMeta;
use qq_core::queue::{Browsed, Counts, Stats};
use qq_core::{Message, QueueConfig};
use qq_raft::{GroupId, META_GROUP, TypeConfig};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::meta_sm::MetaMachine;
use super::queue_sm::QueueMachine;
use super::quiet::{self, Quiet};
use super::shell::Shell;

pub type MetaRaft = Raft<TypeConfig, Shell<MetaMachine>>;
pub type QueueRaft = Raft<TypeConfig, Shell<QueueMachine>>;

/// A running queue group on this node.
#[derive(Clone)]
pub struct QueueGroup {
    pub raft: QueueRaft,
    pub machine: Arc<QueueMachine>,
    pub meta: QueueMeta,
    /// Stops the group's tasks (leadership watch, leader actor) when the group stops.
    pub stop: CancellationToken,
    /// Whether this replica sleeps ([`super::quiet`]).
    pub quiet: Arc<Quiet>,
}

/// Live information about a queue, as its leader sees it (counts are only exact there).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueInfoData {
    pub counts: Counts,
    pub stats: Stats,
    pub config: QueueConfig,
    pub leader: NodeId,
    pub term: u64,
    pub commit_index: u64,
    pub last_applied: u64,
    pub digest: u64,
    /// When the oldest ready message was enqueued (leader-stamped ms), if any is ready.
    pub oldest_ready_enqueued_ms: Option<u64>,
    /// The queue's move tasks, by task number (running and recently ended).
    pub moves: Vec<qq_core::queue::MoveTask>,
}

/// Most messages one browse returns (the client API refuses a larger limit; a peer's request
/// is cut to it).
pub const MAX_BROWSE_LIMIT: u32 = 1000;

/// Most bytes of stored messages one browse returns: a page stops before the message that
/// would pass it (but holds at least one message), so an answer stays well within the gRPC
/// message bounds of client and node however large the messages are.
pub const MAX_BROWSE_BYTES: u64 = 16 * 1024 * 1024;

/// Ready messages read on a queue's leader without taking them ([`Registry::local_browse`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BrowseData {
    pub messages: Vec<(Browsed, Message)>,
    /// Ready messages in the queue when it was read.
    pub ready: u64,
}

pub struct Registry {
    id: NodeId,
    /// How recently a quorum must have acknowledged this node's leadership for it to answer a
    /// leader-only read (the election timeout's minimum: no follower elects another leader
    /// sooner after hearing from this one).
    read_lease: Duration,
    meta_raft: MetaRaft,
    meta: Arc<MetaMachine>,
    queues: RwLock<HashMap<GroupId, QueueGroup>>,
    /// Bumped whenever a queue group starts here ([`Registry::queue_when_started`] waits on it).
    started: tokio::sync::watch::Sender<u64>,
}

impl Registry {
    pub fn new(
        id: NodeId,
        read_lease: Duration,
        meta_raft: MetaRaft,
        meta: Arc<MetaMachine>,
    ) -> Registry {
        Registry {
            id,
            read_lease,
            meta_raft,
            meta,
            queues: RwLock::new(HashMap::new()),
            started: tokio::sync::watch::Sender::new(0),
        }
    }

    pub fn node_id(&self) -> NodeId {
        self.id
    }

    pub fn meta_raft(&self) -> &MetaRaft {
        &self.meta_raft
    }

    pub fn meta_machine(&self) -> &Arc<MetaMachine> {
        &self.meta
    }

    pub fn queue(&self, group: GroupId) -> Option<QueueGroup> {
        self.queues.read().unwrap().get(&group).cloned()
    }

    pub fn queues(&self) -> Vec<QueueGroup> {
        self.queues.read().unwrap().values().cloned().collect()
    }

    pub fn running(&self) -> Vec<GroupId> {
        self.queues.read().unwrap().keys().copied().collect()
    }

    pub fn insert(&self, group: QueueGroup) {
        self.queues.write().unwrap().insert(group.meta.id, group);
        self.started.send_modify(|n| *n += 1);
    }

    /// The queue group, waiting up to `wait` for it to start here. For a peer's Raft message
    /// to a group that the metadata entry creating it has committed but this node has not
    /// applied yet: answering "not running" would fail the new group's first election round
    /// and cost an election timeout on every declare.
    pub async fn queue_when_started(&self, group: GroupId, wait: Duration) -> Option<QueueGroup> {
        let mut started = self.started.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(g) = self.queue(group) {
                return Some(g);
            }
            match tokio::time::timeout_at(deadline, started.changed()).await {
                Ok(Ok(())) => continue,
                _ => return self.queue(group),
            }
        }
    }

    pub fn remove(&self, group: GroupId) -> Option<QueueGroup> {
        self.queues.write().unwrap().remove(&group)
    }

    /// Record the queue's latest metadata (its members and configuration).
    pub fn update_meta(&self, meta: QueueMeta) {
        if let Some(g) = self.queues.write().unwrap().get_mut(&meta.id) {
            g.meta = meta;
        }
    }

    /// The leader of a group as this node knows it (own metrics if a member).
    pub fn known_leader(&self, group: GroupId) -> Option<NodeId> {
        if group == META_GROUP {
            return self.meta_raft.metrics().borrow_watched().current_leader;
        }
        self.queue(group)
            .and_then(|g| g.raft.metrics().borrow_watched().current_leader)
    }

    pub fn is_queue_leader(&self, group: GroupId) -> bool {
        self.queue(group)
            .map(|g| g.raft.metrics().borrow_watched().state == ServerState::Leader)
            .unwrap_or(false)
    }

    /// Before a write or a leader-only read on a queue group this node leads: wake it if it
    /// sleeps, and wait (up to twice the read lease) until a quorum answered a heartbeat.
    pub async fn wake_to_lead(&self, group: GroupId) {
        if let Some(g) = self.queue(group)
            && g.quiet.is_asleep()
            && g.raft.metrics().borrow_watched().state == ServerState::Leader
        {
            quiet::wake_leader(&g.raft, &g.quiet, self.read_lease, 2 * self.read_lease).await;
        }
    }

    /// The sleeping queue groups here whose leader is `peer`.
    pub fn asleep_led_by(&self, peer: NodeId) -> Vec<GroupId> {
        self.queues()
            .into_iter()
            .filter(|g| {
                g.quiet.is_asleep()
                    && g.raft.metrics().borrow_watched().current_leader == Some(peer)
            })
            .map(|g| g.meta.id)
            .collect()
    }

    /// Wake these queue groups (followers whose leader is gone: their election timers run).
    pub fn wake_groups(&self, groups: &[GroupId]) -> usize {
        groups
            .iter()
            .filter_map(|id| self.queue(*id))
            .filter(|g| g.quiet.wake(&g.raft))
            .count()
    }

    /// Of `groups`, wake those this node leads (a heartbeat round at once) and return them:
    /// the answer to sleeping followers that ask (`WAKE`).
    pub fn wake_led(&self, groups: &[GroupId]) -> Vec<GroupId> {
        groups
            .iter()
            .filter_map(|id| self.queue(*id))
            .filter(|g| g.raft.metrics().borrow_watched().state == ServerState::Leader)
            .map(|g| {
                if g.quiet.wake(&g.raft) {
                    quiet::heartbeat_soon(&g.raft);
                }
                g.meta.id
            })
            .collect()
    }

    /// Wait (up to `wait`) until this node's replica of a new group knows a leader that can
    /// answer reads: another node, or this node with a fresh quorum acknowledgement. Lets a
    /// declare answer as soon as its queue is usable instead of polling for a leader. Returns
    /// at once where the group does not run here (the read that follows asks the members).
    pub async fn wait_for_leader(&self, group: GroupId, wait: Duration) {
        let Some(g) = self.queue_when_started(group, wait).await else {
            return;
        };
        let _ = g
            .raft
            .wait(Some(wait))
            .metrics(
                |m| m.current_leader.is_some_and(|l| l != self.id) || self.leads_now(m),
                "a leader that can answer reads",
            )
            .await;
    }

    /// Whether this node may answer a leader-only read of a group with these metrics: it leads,
    /// and a quorum acknowledged its leadership within the read lease (or it is the group's
    /// only voter). A node restarted after a crash can believe itself the leader of its old
    /// term until a heartbeat of the new leader reaches it; without the lease it answered
    /// GetQueue from its pre-crash state (found by the failover test).
    fn leads_now(&self, m: &openraft::RaftMetrics<TypeConfig>) -> bool {
        if m.state != ServerState::Leader || m.current_leader != Some(self.id) {
            return false;
        }
        let alone = m
            .membership_config
            .membership()
            .voter_ids()
            .all(|v| v == self.id);
        alone
            || m.last_quorum_acked
                .as_ref()
                .is_some_and(|t| openraft::Instant::elapsed(&**t) < self.read_lease)
    }

    /// The info as this node sees it, if it runs the group. `require_leader`: only answer as
    /// leader. `with_digest`: also hash the whole state (linear in the queue's size: a
    /// 100 000-message queue polled by a move task spent a third of its leader's CPU here);
    /// otherwise `digest` is 0. The hash runs on a clone of the state taken under its lock (the
    /// state's collections are persistent: the clone shares them), not under the lock: a
    /// `GetQueue` of a large queue used to stop that replica's applies for as long as it hashed
    /// (found in scenario 4: the dead-letter target's leader, polled every 250 ms for its
    /// length, spent 19 % of its CPU hashing, with its applies waiting).
    pub fn local_queue_info(
        &self,
        group: GroupId,
        require_leader: bool,
        with_digest: bool,
    ) -> Option<QueueInfoData> {
        let g = self.queue(group)?;
        let m = g.raft.metrics().borrow_watched().clone();
        if require_leader && !self.leads_now(&m) {
            return None;
        }
        let (mut info, whole) = g.machine.with_state(|state| {
            let info = QueueInfoData {
                counts: state.counts(),
                stats: state.stats().clone(),
                config: state.config().clone(),
                leader: m.current_leader.unwrap_or(0),
                term: m.current_term,
                commit_index: m.local_committed.map(|l| l.index).unwrap_or(0),
                last_applied: m.last_applied.map(|l| l.index).unwrap_or(0),
                digest: 0,
                oldest_ready_enqueued_ms: state.oldest_ready_enqueued_ms(),
                moves: state.moves().values().cloned().collect(),
            };
            (info, with_digest.then(|| state.clone()))
        });
        if let Some(state) = whole {
            info.digest = state.digest();
        }
        Some(info)
    }

    /// The ready messages at positions `offset..offset + limit`, if this node leads the queue,
    /// cut at [`MAX_BROWSE_BYTES`]. Positions are read under the state's lock, bodies after
    /// it: a message taken in between has no body any more and is left out.
    pub fn local_browse(&self, group: GroupId, offset: u64, limit: usize) -> Option<BrowseData> {
        let g = self.queue(group)?;
        if !self.leads_now(&g.raft.metrics().borrow_watched()) {
            return None;
        }
        let limit = limit.min(MAX_BROWSE_LIMIT as usize);
        let (browsed, ready) = g.machine.with_state(|state| {
            (
                state.browse(offset, limit, MAX_BROWSE_BYTES),
                state.counts().ready,
            )
        });
        let messages = browsed
            .into_iter()
            .filter_map(|b| g.machine.read_message(b.id).ok().map(|m| (b, m)))
            .collect();
        Some(BrowseData { messages, ready })
    }
}
