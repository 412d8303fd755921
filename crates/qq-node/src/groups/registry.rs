//! The Raft groups this node hosts: the metadata group and the queue groups it is a member of.
//!
//! The registry answers "is group G running here, who leads it as far as this node knows, what
//! is its local state". Starting and stopping groups is the supervisor's job
//! ([`crate::node`]); proposing is the proposer's ([`crate::proposer`]).
//!
//! **Unloaded replicas.** A queue replica that has slept for `unload_after_ms` lets its Raft
//! instance go ([`Registry::unload`]; the residency machine, [`super::residency`], decides
//! whether it may): openraft reserves per instance, as constants, queues and buffers whose
//! pages a working group touches and keeps (about 330 KiB of a 500 KiB idle queue across three
//! nodes). What stays is an [`UnloadedReplica`]: the state machine (in memory, as before), the
//! metadata, the residency and the Raft metrics at the unload (vote, leader, log and
//! membership do not move while nothing runs). Whatever needs the Raft instance loads it again
//! first ([`Registry::load`]: a proposal, a leader-only read, a peer's Raft message, a lost or
//! reopened node link, a membership change). The registry does not create it: it sends a
//! [`LoadRequest`] to the node's loader task, which creates it from the same storage as at a
//! restart, with its timers off (the replica still sleeps until something wakes it) and, where
//! this replica led, as the leader of the same term (openraft's `enable_leader_restore`: its
//! vote is committed, so no other node can lead that term).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use openraft::async_runtime::WatchReceiver;
use openraft::{Raft, RaftMetrics, ServerState};
use qq_core::NodeId;
use qq_core::meta::QueueMeta;
use qq_core::queue::{Browsed, Counts, Stats};
use qq_core::{Message, QueueConfig};
use qq_raft::{GroupId, META_GROUP, TypeConfig};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::meta_sm::MetaMachine;
use super::queue_sm::QueueMachine;
use super::residency::{self, ResidencyCell};
use super::shell::{AppliedMembership, Shell};
use crate::clock::Clock;

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
    /// Whether this replica sleeps ([`super::residency`]).
    pub residency: Arc<ResidencyCell>,
    /// Which Raft instance of the replica this is (a fresh one per load, [`next_instance`]).
    pub instance: u64,
    /// The membership the machine has applied (kept across an unload, [`Shell::resume`]).
    pub membership: AppliedMembership,
}

/// As seen by a leader (its metrics, current or as at an unload): whether `member` holds its
/// whole log.
pub fn holds_whole_log(m: &RaftMetrics<TypeConfig>, member: NodeId) -> bool {
    m.replication
        .as_ref()
        .and_then(|r| r.get(&member))
        .is_some_and(|matched| matched.as_ref().map(|l| l.index) == m.last_log_index)
}

/// Loads [`Registry::load_where`] runs at once: one after another, the 3 333 followers of a
/// dead node's groups (10 000 queues) took seconds before the first campaign.
pub const LOADS_AT_ONCE: usize = 64;

/// A number for a new Raft instance of a queue replica ([`QueueGroup::instance`]).
pub fn next_instance() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A queue replica whose Raft instance is unloaded (module docs). It sleeps.
#[derive(Clone)]
pub struct UnloadedReplica {
    pub machine: Arc<QueueMachine>,
    pub meta: QueueMeta,
    pub residency: Arc<ResidencyCell>,
    pub membership: AppliedMembership,
    /// The replica's Raft metrics at the unload.
    pub metrics: Arc<RaftMetrics<TypeConfig>>,
}

/// A queue replica hosted here: loaded (its Raft runs) or unloaded.
#[derive(Clone)]
pub enum Replica {
    Loaded(QueueGroup),
    Unloaded(UnloadedReplica),
}

impl Replica {
    pub fn machine(&self) -> &Arc<QueueMachine> {
        match self {
            Replica::Loaded(g) => &g.machine,
            Replica::Unloaded(d) => &d.machine,
        }
    }

    pub fn meta(&self) -> &QueueMeta {
        match self {
            Replica::Loaded(g) => &g.meta,
            Replica::Unloaded(d) => &d.meta,
        }
    }

    pub fn residency(&self) -> &Arc<ResidencyCell> {
        match self {
            Replica::Loaded(g) => &g.residency,
            Replica::Unloaded(d) => &d.residency,
        }
    }

    /// The Raft metrics: current where loaded, as at the unload otherwise.
    pub fn metrics(&self) -> Arc<RaftMetrics<TypeConfig>> {
        match self {
            Replica::Loaded(g) => Arc::new(g.raft.metrics().borrow_watched().clone()),
            Replica::Unloaded(d) => d.metrics.clone(),
        }
    }

    pub fn state(&self) -> ServerState {
        match self {
            Replica::Loaded(g) => g.raft.metrics().borrow_watched().state,
            Replica::Unloaded(d) => d.metrics.state,
        }
    }

    pub fn current_leader(&self) -> Option<NodeId> {
        match self {
            Replica::Loaded(g) => g.raft.metrics().borrow_watched().current_leader,
            Replica::Unloaded(d) => d.metrics.current_leader,
        }
    }
}

/// A request to load an unloaded replica's Raft instance. The registry sends it to whoever
/// holds what creating an instance needs (the node's loader task, `node::opener`), and never
/// calls into the node itself; the group's tasks start again as at a start, with the
/// replica's timers off. The replica's transition lock travels with the request and comes
/// back with the answer: no other load, unload or removal of the replica starts before the
/// registry has recorded the instance (or the loader has shut down one nobody waits for).
pub struct LoadRequest {
    pub unloaded: UnloadedReplica,
    pub transition: tokio::sync::OwnedMutexGuard<()>,
    pub reply: tokio::sync::oneshot::Sender<Loaded>,
}

/// The answer to a [`LoadRequest`]: the instance, and the transition lock given back.
pub type Loaded = (anyhow::Result<QueueGroup>, tokio::sync::OwnedMutexGuard<()>);

struct Hosted {
    replica: Replica,
    /// Held while the replica is loaded, unloaded or removed: one transition at a time.
    transition: Arc<tokio::sync::Mutex<()>>,
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
    queues: RwLock<HashMap<GroupId, Hosted>>,
    /// Bumped whenever a queue group starts here ([`Registry::queue_when_started`] waits on it).
    started: tokio::sync::watch::Sender<u64>,
    /// Where loads are sent ([`LoadRequest`]).
    loads: tokio::sync::mpsc::UnboundedSender<LoadRequest>,
    clock: Clock,
}

impl Registry {
    pub fn new(
        id: NodeId,
        read_lease: Duration,
        meta_raft: MetaRaft,
        meta: Arc<MetaMachine>,
        loads: tokio::sync::mpsc::UnboundedSender<LoadRequest>,
        clock: Clock,
    ) -> Registry {
        Registry {
            id,
            read_lease,
            meta_raft,
            meta,
            queues: RwLock::new(HashMap::new()),
            started: tokio::sync::watch::Sender::new(0),
            loads,
            clock,
        }
    }

    pub fn node_id(&self) -> NodeId {
        self.id
    }

    pub fn meta_raft(&self) -> &MetaRaft {
        &self.meta_raft
    }

    /// The voters of the metadata group as this node knows them.
    pub fn meta_voters(&self) -> std::collections::BTreeSet<NodeId> {
        self.meta_raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    pub fn meta_machine(&self) -> &Arc<MetaMachine> {
        &self.meta
    }

    /// The queue group if its replica here is loaded ([`Registry::load`] loads it).
    pub fn queue(&self, group: GroupId) -> Option<QueueGroup> {
        match self.queues.read().unwrap().get(&group) {
            Some(Hosted {
                replica: Replica::Loaded(g),
                ..
            }) => Some(g.clone()),
            _ => None,
        }
    }

    /// The loaded queue groups.
    pub fn queues(&self) -> Vec<QueueGroup> {
        self.queues
            .read()
            .unwrap()
            .values()
            .filter_map(|h| match &h.replica {
                Replica::Loaded(g) => Some(g.clone()),
                Replica::Unloaded(_) => None,
            })
            .collect()
    }

    /// Every queue replica hosted here, loaded or not.
    pub fn replicas(&self) -> Vec<Replica> {
        self.queues
            .read()
            .unwrap()
            .values()
            .map(|h| h.replica.clone())
            .collect()
    }

    pub fn replica(&self, group: GroupId) -> Option<Replica> {
        self.queues
            .read()
            .unwrap()
            .get(&group)
            .map(|h| h.replica.clone())
    }

    /// The groups hosted here, loaded or not.
    pub fn running(&self) -> Vec<GroupId> {
        self.queues.read().unwrap().keys().copied().collect()
    }

    /// The lock of the group's transitions (load, unload, removal), if it is hosted here.
    fn transition(&self, group: GroupId) -> Option<Arc<tokio::sync::Mutex<()>>> {
        self.queues
            .read()
            .unwrap()
            .get(&group)
            .map(|h| h.transition.clone())
    }

    /// Whether this node hosts a replica of the group (loaded or not).
    pub fn hosts(&self, group: GroupId) -> bool {
        self.queues.read().unwrap().contains_key(&group)
    }

    pub fn insert(&self, group: QueueGroup) {
        self.queues.write().unwrap().insert(
            group.meta.id,
            Hosted {
                replica: Replica::Loaded(group),
                transition: Arc::default(),
            },
        );
        self.started.send_modify(|n| *n += 1);
    }

    /// The queue group with its Raft instance, loading it if it is unloaded. None if the
    /// group is not hosted here (or its instance cannot be created: logged).
    pub async fn load(&self, group: GroupId) -> Option<QueueGroup> {
        if let Some(g) = self.queue(group) {
            return Some(g);
        }
        let transition = self.transition(group)?.lock_owned().await;
        let unloaded = match self.replica(group)? {
            Replica::Loaded(g) => return Some(g),
            Replica::Unloaded(d) => d,
        };
        let (reply, loaded) = tokio::sync::oneshot::channel();
        let request = LoadRequest {
            unloaded,
            transition,
            reply,
        };
        // Refused or unanswered: the node is stopping.
        self.loads.send(request).ok()?;
        let (loaded, _transition) = loaded.await.ok()?;
        match loaded {
            Ok(g) => {
                if let Some(h) = self.queues.write().unwrap().get_mut(&group) {
                    h.replica = Replica::Loaded(g.clone());
                }
                crate::metrics::group_loaded();
                Some(g)
            }
            Err(e) => {
                warn!(
                    group,
                    "cannot load the Raft instance of an unloaded replica: {e:#}"
                );
                None
            }
        }
    }

    /// Load every unloaded replica that `wanted` picks, [`LOADS_AT_ONCE`] at a time; returns
    /// how many.
    pub async fn load_where(&self, wanted: impl Fn(&UnloadedReplica) -> bool) -> usize {
        let picked: Vec<GroupId> = self
            .replicas()
            .into_iter()
            .filter_map(|r| match r {
                Replica::Unloaded(d) if wanted(&d) => Some(d.meta.id),
                _ => None,
            })
            .collect();
        let started = std::time::Instant::now();
        let n = futures::stream::iter(picked)
            .map(|group| self.load(group))
            .buffer_unordered(LOADS_AT_ONCE)
            .filter(|g| std::future::ready(g.is_some()))
            .count()
            .await;
        if n > 0 {
            info!(
                replicas = n,
                ms = started.elapsed().as_millis() as u64,
                "loaded unloaded replicas"
            );
        }
        n
    }

    /// The group for a write, loaded, with the write counted on its running instance
    /// ([`ResidencyCell::begin_write`]): the residency machine decides the race with an unload
    /// (the write counted first stops the unload; one that comes after it loads the replica
    /// anew).
    pub async fn for_write(&self, group: GroupId) -> Option<(QueueGroup, residency::WriteGuard)> {
        loop {
            let g = self.load(group).await?;
            if let Some(guard) = g.residency.begin_write(g.instance) {
                return Some((g, guard));
            }
        }
    }

    /// Unload the replica's Raft instance if the residency machine agrees: it still sleeps,
    /// `ready` judged it unloadable and nothing began since (module docs). Returns whether it
    /// did.
    pub async fn unload(&self, group: GroupId, ready: impl Fn(&QueueGroup) -> bool) -> bool {
        let Some(transition) = self.transition(group) else {
            return false;
        };
        let _transition = transition.lock().await;
        let Some(g) = self.queue(group) else {
            return false;
        };
        let (begun, in_flight) = g.residency.writes();
        // What the machine would refuse anyway, without swapping the registry's entry to and
        // fro (readers would miss the group meanwhile).
        let ready = in_flight == 0 && g.residency.is_asleep() && ready(&g);
        if !ready {
            return false;
        }
        let unloaded = UnloadedReplica {
            machine: g.machine.clone(),
            meta: g.meta.clone(),
            residency: g.residency.clone(),
            membership: g.membership.clone(),
            metrics: Arc::new(g.raft.metrics().borrow_watched().clone()),
        };
        if let Some(h) = self.queues.write().unwrap().get_mut(&group) {
            h.replica = Replica::Unloaded(unloaded);
        }
        // After the swap: a write that reads the registry from here on loads a new instance
        // ([`Registry::for_write`] waits for this transition); one counted on this instance
        // before the machine's step stops the unload here.
        if !g.residency.detach(begun, ready) {
            if let Some(h) = self.queues.write().unwrap().get_mut(&group) {
                h.replica = Replica::Loaded(g);
            }
            return false;
        }
        g.stop.cancel();
        let _ = g.raft.shutdown().await;
        crate::metrics::group_unloaded();
        true
    }

    /// The queue group, waiting up to `wait` for it to start here. For a peer's Raft message
    /// to a group that the metadata entry creating it has committed but this node has not
    /// applied yet: answering "not running" would fail the new group's first election round
    /// and cost an election timeout on every declare.
    pub async fn queue_when_started(&self, group: GroupId, wait: Duration) -> Option<QueueGroup> {
        let mut started = self.started.subscribe();
        let deadline = self.clock.now() + wait;
        loop {
            if self.hosts(group) {
                return self.load(group).await;
            }
            match tokio::time::timeout_at(deadline, started.changed()).await {
                Ok(Ok(())) => continue,
                _ => return self.load(group).await,
            }
        }
    }

    /// Take the replica out of the registry (after any load or unload in progress).
    pub async fn remove(&self, group: GroupId) -> Option<Replica> {
        let transition = self.transition(group)?;
        let _transition = transition.lock().await;
        self.queues
            .write()
            .unwrap()
            .remove(&group)
            .map(|h| h.replica)
    }

    /// Record the queue's latest metadata (its members and configuration).
    pub fn update_meta(&self, meta: QueueMeta) {
        if let Some(h) = self.queues.write().unwrap().get_mut(&meta.id) {
            match &mut h.replica {
                Replica::Loaded(g) => g.meta = meta,
                Replica::Unloaded(d) => d.meta = meta,
            }
        }
    }

    /// The leader of a group as this node knows it (own metrics if a member).
    pub fn known_leader(&self, group: GroupId) -> Option<NodeId> {
        if group == META_GROUP {
            return self.meta_raft.metrics().borrow_watched().current_leader;
        }
        self.replica(group).and_then(|r| r.current_leader())
    }

    pub fn is_queue_leader(&self, group: GroupId) -> bool {
        self.replica(group)
            .is_some_and(|r| r.state() == ServerState::Leader)
    }

    /// Before a write or a leader-only read on a queue group this node leads: load and wake it
    /// if it sleeps, and wait (up to twice the read lease) until a quorum answered a heartbeat.
    pub async fn wake_to_lead(&self, group: GroupId) {
        if !self.is_queue_leader(group) {
            return;
        }
        if let Some(g) = self.load(group).await
            && g.residency.is_asleep()
            && g.raft.metrics().borrow_watched().state == ServerState::Leader
        {
            residency::wake_leader(&g.raft, &g.residency, self.read_lease, 2 * self.read_lease)
                .await;
        }
    }

    /// The sleeping queue groups here whose leader is `peer` (loaded or not).
    pub fn asleep_led_by(&self, peer: NodeId) -> Vec<GroupId> {
        self.replicas()
            .into_iter()
            .filter(|r| r.residency().is_asleep() && r.current_leader() == Some(peer))
            .map(|r| r.meta().id)
            .collect()
    }

    /// Wake these queue groups (followers whose leader is gone: their election timers run),
    /// loading those that are unloaded.
    pub async fn wake_groups(&self, groups: &[GroupId]) -> usize {
        let mut n = 0;
        for id in groups {
            if let Some(g) = self.load(*id).await {
                n += usize::from(g.residency.wake());
            }
        }
        n
    }

    /// Of `groups`, wake those this node leads (a heartbeat round at once, loading those that
    /// are unloaded) and return them: the answer to sleeping followers that ask (`WAKE`).
    pub async fn wake_led(&self, groups: &[GroupId]) -> Vec<GroupId> {
        let mut led = Vec::new();
        for id in groups {
            if !self.is_queue_leader(*id) {
                continue;
            }
            let Some(g) = self.load(*id).await else {
                continue;
            };
            if g.raft.metrics().borrow_watched().state != ServerState::Leader {
                continue;
            }
            g.residency.wake_to_lead();
            led.push(g.meta.id);
        }
        led
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
        let r = self.replica(group)?;
        let m = r.metrics();
        if require_leader && !self.leads_now(&m) {
            return None;
        }
        let (mut info, whole) = r.machine().with_state(|state| {
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

    /// Whether this node's replica of `group` keeps the queue state's invariants (None when it
    /// has no loaded replica). Linear in the messages: for the operator's `ClusterStatus`.
    pub fn local_invariants(&self, group: GroupId) -> Option<Result<(), String>> {
        let state = self.replica(group)?.machine().with_state(|s| s.clone());
        Some(state.check_invariants())
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
