//! A quorumq node: what it owns, and the supervisor that keeps its queue groups in line with
//! the metadata.
//!
//! [`Node::start`] opens the node's RocksDB, starts the metadata group (initialising the
//! cluster if this node has the lowest id and nothing was initialised yet), builds the layers
//! every request uses (the [`Registry`] of groups, the [`MetaView`], the [`Proposer`], the
//! [`Enqueuer`], the [`DeadLetters`] transfer) and spawns the supervisor. The supervisor starts
//! a queue's group when the metadata creates a queue this node is a member of, stops it when
//! the queue is deleted, and tells the queue's leader actor when its configuration changes
//! (the metadata machine's effects); after a metadata snapshot install, an effect that did not
//! fit its channel, or a failed start, it compares every group with the state instead.
//!
//! Every task the node spawns is tracked by one [`TaskTracker`] and stopped by one
//! [`CancellationToken`] ([`Node::shutdown`] waits for them, then stops the Raft groups).
//!
//! Must not: serve clients or peers (that is [`crate::api`] and [`crate::peer`]), or decide
//! anything a queue's leader decides ([`crate::leader`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, Raft, ServerState, SnapshotPolicy};
use qq_core::NodeId;
use qq_core::meta::{MetaEffect, QueueMeta};
use qq_core::queue::MoveState;
use qq_raft::log_store::LogStore;
use qq_raft::network::{GroupNetwork, PeerAddress, Peers};
use qq_raft::store::Store;
use qq_raft::{GroupId, META_GROUP, TypeConfig};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::alarms::{Alarms, Bounds};
use crate::clock::now_ms;
use crate::config::Config;
use crate::deadletter::DeadLetters;
use crate::enqueue::Enqueuer;
use crate::groups::meta_sm::MetaMachine;
use crate::groups::queue_sm::QueueMachine;
use crate::groups::quiet::{Quiet, SleepRequest};
use crate::groups::registry::{
    Dormant, GroupLoader, MetaRaft, QueueGroup, Registry, Replica, holds_whole_log, next_instance,
};
use crate::groups::shell::{AppliedMembership, Machine, Shell};
use crate::leader::{LeaderContext, watch_leadership};
use crate::meta_view::MetaView;
use crate::proposer::Proposer;

/// How long the supervisor waits before it tries again to start a group that failed to start.
const START_RETRY: Duration = Duration::from_secs(2);

/// How long shutdown waits for the node's tasks to finish before it stops the groups anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long a stopping node waits for the leaderships it handed over to leave it. Short: the
/// transfer itself takes milliseconds, but a node whose cluster port already stopped accepting
/// often does not hear of its successor at all (observed: the new leader was elected 10 ms
/// after the transfer, the stopping node never saw it), so the wait mostly lets the
/// TransferLeader requests leave.
const HANDOVER_WAIT: Duration = Duration::from_millis(500);

/// How often the node looks for replicas that have slept for `unload_after_ms`.
const UNLOAD_SWEEP: Duration = Duration::from_secs(1);
/// At most one `malloc_trim` per this long after unloads ([`Node::unload_sleepers`]).
const UNLOAD_TRIM_EVERY: Duration = Duration::from_secs(10);
/// How long a load waits for the new instance's core to report its state.
const LOAD_WAIT: Duration = Duration::from_secs(5);

pub struct Node {
    id: NodeId,
    config: Config,
    store: Store,
    peers: Peers,
    raft_config: Arc<openraft::Config>,
    /// The Raft settings of a queue replica loaded again after an unload: timers off (it
    /// sleeps until something wakes it), and a leader comes back as the leader of its term.
    reload_config: Arc<openraft::Config>,
    registry: Arc<Registry>,
    view: MetaView,
    proposer: Proposer,
    enqueuer: Enqueuer,
    leader_ctx: LeaderContext,
    consumer_seq: AtomicU64,
    alarms: Arc<Alarms>,
    /// Latched true once this node's metadata has caught up with the cluster's (see
    /// [`Node::meta_synced`]).
    meta_synced: watch::Sender<bool>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Node {
    /// Open storage, start the metadata group and the supervisor.
    pub async fn start(config: Config) -> anyhow::Result<Arc<Node>> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| anyhow::anyhow!("create data_dir {}: {e}", config.data_dir.display()))?;
        let store = Store::open(&config.data_dir.join("db"))
            .map_err(|e| anyhow::anyhow!("{e}\n\n{}", reseed_advice(&config.data_dir)))?;
        let peers = Peers::new(
            config.peers.iter().map(|p| PeerAddress {
                id: p.id,
                address: p.address.clone(),
                cluster_address: p.cluster_address.clone(),
            }),
            config.cluster_tls()?.as_ref(),
        )?;
        let raft_config = raft_config(&config)?;
        let reload_config = reload_config(&raft_config);
        let (meta, effects) = MetaMachine::new(store.clone());
        let meta_raft = Raft::new(
            config.node_id,
            raft_config.clone(),
            GroupNetwork {
                group: META_GROUP,
                peers: peers.clone(),
            },
            LogStore::new(store.clone(), META_GROUP),
            Shell::new(meta.clone()),
        )
        .await?;
        initialise_if_first(&meta_raft, &config).await?;
        let id = config.node_id;
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let read_lease = Duration::from_millis(config.election_timeout_min_ms);
        let registry = Arc::new(Registry::new(id, read_lease, meta_raft, meta.clone()));
        let view = MetaView::new(meta);
        let proposer = Proposer::new(
            id,
            peers.clone(),
            registry.clone(),
            view.clone(),
            shutdown.clone(),
        );
        let enqueuer = Enqueuer::new(proposer.clone(), id);
        let leader_ctx = LeaderContext {
            proposer: proposer.clone(),
            view: view.clone(),
            dead_letters: DeadLetters::new(view.clone(), enqueuer.clone(), proposer.clone()),
            dead_letter_retry: Duration::from_millis(config.dead_letter_retry_ms),
            mover: crate::moves::Mover::new(view.clone(), enqueuer.clone(), proposer.clone()),
            tasks: tasks.clone(),
            peers: peers.clone(),
            me: id,
            quiesce_after: (config.quiesce_after_ms > 0)
                .then(|| Duration::from_millis(config.quiesce_after_ms)),
        };
        // Measured once before serving, so a node started over its bounds refuses at once.
        let bounds = Bounds::from_config(&config)?;
        let alarms = Arc::new(Alarms::default());
        alarms.check(&bounds);
        let node = Arc::new(Node {
            id,
            config,
            store,
            peers,
            raft_config,
            reload_config,
            registry,
            view,
            proposer,
            enqueuer,
            leader_ctx,
            consumer_seq: AtomicU64::new(now_ms() * 1000),
            alarms: alarms.clone(),
            meta_synced: watch::Sender::new(false),
            shutdown,
            tasks,
        });
        let loader: Weak<dyn GroupLoader> = Arc::downgrade(&node) as Weak<Node>;
        node.registry.set_loader(loader);
        node.tasks.spawn(node.clone().supervise(effects));
        node.tasks.spawn(node.clone().follow_meta_sync());
        if node.config.unload_after_ms > 0 && node.config.quiesce_after_ms > 0 {
            let after = Duration::from_millis(node.config.unload_after_ms);
            node.tasks.spawn(node.clone().unload_sleepers(after));
        }
        let stop = node.shutdown.clone();
        node.tasks
            .spawn(async move { alarms.watch(bounds, stop).await });
        Ok(node)
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The node's RocksDB and snapshot directory.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn view(&self) -> &MetaView {
        &self.view
    }

    /// Whether queue group `group`, not running here, may start here soon: its id is newer
    /// than any this node's metadata has allocated (the entry that creates it has not applied
    /// here yet), or the metadata places a replica here that has not started yet.
    pub fn may_start_group(&self, group: GroupId) -> bool {
        let view = self.view.current();
        group >= view.next_queue_id()
            || view
                .queue_by_id(group)
                .is_some_and(|q| q.replicas().any(|n| n == self.id))
    }

    pub fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    pub fn enqueuer(&self) -> &Enqueuer {
        &self.enqueuer
    }

    /// Every task of the node is spawned here, so shutdown can wait for it.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Cancelled when the node begins to shut down.
    /// Memory and disk alarms ([`crate::alarms`]).
    pub fn alarms(&self) -> &Alarms {
        &self.alarms
    }

    pub fn stopping(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Whether this node's metadata has caught up with the cluster's since it started: true
    /// once it has applied everything the metadata leader had committed when this node heard
    /// from it, and true from then on. Until then the node does not serve clients (a node that
    /// starts with an empty or old data directory would otherwise route with what it knows:
    /// found by qq-chaos's wipe-rejoin, a re-seeded node answered publishes to a queue it did
    /// not know yet as unroutable, CONFIRMED and dropped). Followers may lag by the usual
    /// milliseconds afterwards, as before.
    pub fn meta_synced(&self) -> watch::Receiver<bool> {
        self.meta_synced.subscribe()
    }

    /// Latch [`Node::meta_synced`] (no polling: wakes on the metadata group's metrics).
    async fn follow_meta_sync(self: Arc<Self>) {
        let mut metrics = self.registry.meta_raft().metrics();
        loop {
            let synced = {
                let m = metrics.borrow_watched();
                m.current_leader.is_some()
                    && match (&m.cluster_committed, &m.last_applied) {
                        (Some(committed), Some(applied)) => applied.index >= committed.index,
                        _ => false,
                    }
            };
            if synced {
                info!("metadata caught up with the cluster: serving clients");
                self.meta_synced.send_replace(true);
                return;
            }
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// A consumer id unique within any queue: node id in the top byte.
    pub fn next_consumer_id(&self) -> u64 {
        (self.id << 56) | (self.consumer_seq.fetch_add(1, Ordering::Relaxed) & ((1 << 56) - 1))
    }

    /// Stop the node's work: cancel every task (consumer sessions end with UNAVAILABLE,
    /// proposals stop retrying), wait for them (at most [`SHUTDOWN_GRACE`]), stop the Raft
    /// groups, then flush the store. Call after the servers stopped accepting.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, self.tasks.wait())
            .await
            .is_err()
        {
            warn!(
                left = self.tasks.len(),
                "tasks still running after the shutdown grace period"
            );
        }
        self.hand_over_leaderships().await;
        for g in self.registry.queues() {
            let _ = g.raft.shutdown().await;
        }
        let _ = self.registry.meta_raft().shutdown().await;
        if let Err(e) = self.store.sync().await {
            warn!("final fsync: {e}");
        }
        info!("node stopped");
    }

    /// Before the groups stop: hand the leadership of every group this node leads to the voter
    /// that replicated most of its log, so clients wait for a leadership transfer (a few ms)
    /// rather than an election timeout, as RabbitMQ's quorum queues do on a graceful stop.
    /// Waits at most [`HANDOVER_WAIT`] for leadership to leave; a transfer that did not reach
    /// its target is made up for by an election, as after a crash.
    async fn hand_over_leaderships(&self) {
        let me = self.id;
        let mut handed: Vec<watch::Receiver<bool>> = Vec::new();
        if let Some(rx) = transfer_away(self.registry.meta_raft(), me).await {
            handed.push(rx);
        }
        // Unloaded leaders too: their followers hear the successor's term at once instead of
        // electing after the liveness link breaks.
        self.registry
            .load_where(|d| d.metrics.state == ServerState::Leader)
            .await;
        for g in self.registry.queues() {
            // A sleeping leader's heartbeats and timers back on first: the successor's term
            // must reach the followers as it does from an awake group.
            g.quiet.wake();
            if let Some(rx) = transfer_away(&g.raft, me).await {
                handed.push(rx);
            }
        }
        if handed.is_empty() {
            return;
        }
        let n = handed.len();
        let gone = tokio::time::timeout(HANDOVER_WAIT, async {
            for mut rx in handed {
                let _ = rx.wait_for(|still_leader| !*still_leader).await;
            }
        })
        .await
        .is_ok();
        info!(
            groups = n,
            seen_to_leave = gone,
            "leadership transfers sent before stopping"
        );
    }

    /// Keep the running queue groups in line with the metadata until shutdown.
    async fn supervise(self: Arc<Self>, mut effects: mpsc::Receiver<MetaEffect>) {
        let mut resync = self.registry.meta_machine().subscribe_resync();
        let mut retry: Option<tokio::time::Instant> = None;
        if !self.reconcile().await {
            retry = Some(tokio::time::Instant::now() + START_RETRY);
        }
        loop {
            let retry_at = retry;
            let ok = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                effect = effects.recv() => match effect {
                    Some(effect) => self.on_effect(effect).await,
                    None => return,
                },
                r = resync.changed() => {
                    if r.is_err() { return }
                    self.reconcile().await
                }
                _ = sleep_until(retry_at) => {
                    retry = None;
                    self.reconcile().await
                }
            };
            if !ok && retry.is_none() {
                retry = Some(tokio::time::Instant::now() + START_RETRY);
            }
        }
    }

    /// Act on one metadata effect, checked against the current state (effects of a log being
    /// replayed at start may be stale). False if a group failed to start.
    async fn on_effect(&self, effect: MetaEffect) -> bool {
        let current = self.view.current();
        match effect {
            MetaEffect::QueueCreated(qm) => {
                let Some(qm) = current.queue_by_id(qm.id).cloned() else {
                    return true;
                };
                if qm.members.contains(&self.id) && !self.registry.hosts(qm.id) {
                    return self.start_queue_group(qm).await;
                }
            }
            MetaEffect::QueueDeleted(qm) => {
                if current.queue_by_id(qm.id).is_none() {
                    self.stop_queue_group(qm.id).await;
                }
            }
            MetaEffect::QueueConfigChanged(qm) => {
                if self.registry.hosts(qm.id) {
                    let id = qm.id;
                    self.registry.update_meta(qm);
                    self.config_changed(id).await;
                }
            }
            MetaEffect::QueueMembersChanged(qm) => {
                let Some(qm) = current.queue_by_id(qm.id).cloned() else {
                    return true;
                };
                let mine = qm.replicas().any(|n| n == self.id);
                match (mine, self.registry.hosts(qm.id)) {
                    (true, false) => return self.start_queue_group(qm).await,
                    (false, true) => self.stop_queue_group(qm.id).await,
                    (true, true) => self.registry.update_meta(qm),
                    (false, false) => {}
                }
            }
            MetaEffect::NodesChanged => self.sync_peers(),
        }
        true
    }

    /// The nodes new queues may be placed on: the metadata group's voters that are peers (a
    /// node whose join was recorded but never completed is a peer and not a voter), sorted.
    pub fn placement_nodes(&self) -> Vec<NodeId> {
        let voters: Vec<NodeId> = self
            .meta_voters()
            .into_iter()
            .filter(|id| self.peers.contains(*id))
            .collect();
        if voters.is_empty() {
            return self.peers.ids();
        }
        voters
    }

    /// The voters of the metadata group as this node knows them.
    pub fn meta_voters(&self) -> BTreeSet<NodeId> {
        self.registry
            .meta_raft()
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    /// Bring the peer set in line with the metadata: the founding nodes of this node's
    /// configuration, less those forgotten, plus those that joined since.
    pub fn sync_peers(&self) {
        let state = self.view.current();
        let forgotten = state.forgotten_nodes();
        let joined = state.joined_nodes();
        let founding = self
            .config
            .peers
            .iter()
            .filter(|p| !forgotten.contains(&p.id) && !joined.contains_key(&p.id))
            .map(|p| PeerAddress {
                id: p.id,
                address: p.address.clone(),
                cluster_address: p.cluster_address.clone(),
            });
        let later = joined.iter().map(|(id, a)| PeerAddress {
            id: *id,
            address: a.address.clone(),
            cluster_address: a.cluster_address.clone(),
        });
        match self.peers.set(founding.chain(later).collect::<Vec<_>>()) {
            Ok(true) => info!(peers = ?self.peers.ids(), "cluster nodes changed"),
            Ok(false) => {}
            Err(e) => warn!("cluster nodes: {e}"),
        }
    }

    /// Make the peers and the running queue groups match the metadata. False if a group
    /// failed to start.
    async fn reconcile(&self) -> bool {
        self.sync_peers();
        let wanted: Vec<QueueMeta> = self
            .view
            .current()
            .queues()
            .filter(|q| q.replicas().any(|n| n == self.id))
            .cloned()
            .collect();
        let wanted_ids: std::collections::HashSet<GroupId> = wanted.iter().map(|q| q.id).collect();
        for group in self.registry.running() {
            if !wanted_ids.contains(&group) {
                self.stop_queue_group(group).await;
            }
        }
        let mut ok = true;
        for qm in wanted {
            match self.registry.replica(qm.id) {
                None => ok &= self.start_queue_group(qm).await,
                Some(r) => {
                    let id = qm.id;
                    let changed = r.meta().config != qm.config;
                    self.registry.update_meta(qm);
                    if changed {
                        self.config_changed(id).await;
                    }
                }
            }
        }
        ok
    }

    /// A hosted queue's configuration changed in the metadata: its leader actor brings the
    /// queue's own log in line. An unloaded replica that leads is loaded for it (its actor
    /// syncs the configuration as it starts).
    async fn config_changed(&self, group: GroupId) {
        match self.registry.replica(group) {
            Some(Replica::Loaded(g)) => g.machine.notify_config_changed(),
            Some(Replica::Dormant(_)) if self.registry.is_queue_leader(group) => {
                self.registry.load(group).await;
            }
            _ => {}
        }
    }

    /// Unload the Raft instance of every replica that has slept for `after` (and, where it
    /// leads, whose leader actor has nothing to wait for): see [`crate::groups::registry`].
    async fn unload_sleepers(self: Arc<Self>, after: Duration) {
        let mut sweep = tokio::time::interval(UNLOAD_SWEEP);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut untrimmed = 0usize;
        let mut trimmed_at = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = sweep.tick() => {}
            }
            let mut unloaded = 0;
            for g in self.registry.queues() {
                if self.shutdown.is_cancelled() {
                    return;
                }
                if g.quiet.asleep_for().is_some_and(|d| d >= after)
                    && self.registry.unload(g.meta.id, may_unload).await
                {
                    unloaded += 1;
                }
            }
            // glibc keeps what the instances freed resident (in the middle of its arenas)
            // until asked; without this an unload saved nothing (measured: 1 000 queues,
            // 656 MB across three nodes either way, 337 MB after a trim). A trim walks every
            // arena under its lock, so at most one per UNLOAD_TRIM_EVERY.
            untrimmed += unloaded;
            if untrimmed > 0 && trimmed_at.elapsed() >= UNLOAD_TRIM_EVERY {
                let _ = tokio::task::spawn_blocking(crate::alarms::release_free_heap).await;
                untrimmed = 0;
                trimmed_at = tokio::time::Instant::now();
            }
        }
    }

    async fn start_queue_group(&self, qm: QueueMeta) -> bool {
        let span = info_span!("queue", node_id = self.id, queue = %qm.name, group = qm.id);
        match self.try_start_queue_group(qm.clone(), span).await {
            Ok(()) => true,
            Err(e) => {
                warn!(queue = %qm.name, group = qm.id, "cannot start queue group: {e:#}");
                false
            }
        }
    }

    /// Create a queue replica's Raft instance and start its tasks (the leadership watch).
    /// `reload`: the replica was unloaded (it sleeps; see [`Node::reload_config`]).
    async fn open_queue_group(
        &self,
        qm: QueueMeta,
        log: LogStore,
        machine: Arc<QueueMachine>,
        quiet: Arc<Quiet>,
        membership: AppliedMembership,
        reload: bool,
    ) -> anyhow::Result<QueueGroup> {
        let span = info_span!("queue", node_id = self.id, queue = %qm.name, group = qm.id);
        // A replica started asleep ([`follower_at_rest`]) starts with its timers off too; the
        // reload settings' leader restore does not apply to it (it follows another node).
        let config = if reload || quiet.is_asleep() {
            self.reload_config.clone()
        } else {
            self.raft_config.clone()
        };
        let raft = Raft::new(
            self.id,
            config,
            GroupNetwork {
                group: qm.id,
                peers: self.peers.clone(),
            },
            log,
            Shell::resume(machine.clone(), membership.clone()),
        )
        .instrument(span.clone())
        .await?;
        if reload {
            // Until its core has started, the instance's metrics are the initial ones (a
            // learner that knows nothing); what the replica is must be known before anyone
            // reads "who leads" or "am I the leader" from it.
            let applied = machine.last_applied();
            if let Err(e) = raft
                .wait(Some(LOAD_WAIT))
                .metrics(|m| m.last_applied == applied, "the loaded instance started")
                .await
            {
                // Not left running beside the next attempt's instance.
                let _ = raft.shutdown().await;
                return Err(e.into());
            }
        }
        quiet.attach(&raft);
        let stop = self.shutdown.child_token();
        let group = QueueGroup {
            raft: raft.clone(),
            machine: machine.clone(),
            meta: qm.clone(),
            stop: stop.clone(),
            quiet: quiet.clone(),
            instance: next_instance(),
            membership,
        };
        // The leadership watch starts with the group, before anything can fail: the group is
        // in the registry (peers reach it) as soon as it is returned, so it may lead whatever
        // happens next.
        self.tasks.spawn(
            watch_leadership(
                self.leader_ctx.clone(),
                qm.id,
                raft,
                machine,
                quiet,
                stop,
                reload,
                span.clone(),
            )
            .instrument(span),
        );
        Ok(group)
    }

    async fn try_start_queue_group(
        &self,
        qm: QueueMeta,
        span: tracing::Span,
    ) -> anyhow::Result<()> {
        let machine = QueueMachine::new(qm.id, self.store.clone(), qm.config.clone());
        // One log store for the check and the instance: the vote it read stays cached.
        let log = LogStore::new(self.store.clone(), qm.id);
        let quiet = Arc::new(match follower_at_rest(log.clone(), self.id).await {
            Some(req) => Quiet::asleep_following(req),
            None => Quiet::default(),
        });
        let group = self
            .open_queue_group(qm.clone(), log, machine, quiet, Default::default(), false)
            .await?;
        let raft = group.raft.clone();
        self.registry.insert(group);
        if qm.members.first() == Some(&self.id) {
            let members: BTreeMap<u64, BasicNode> = qm
                .members
                .iter()
                .map(|id| {
                    (
                        *id,
                        BasicNode {
                            addr: self.peers.address(*id).unwrap_or_default(),
                        },
                    )
                })
                .collect();
            if let Err(e) = initialize_unless_joined(&raft, members, &span).await {
                // Taken out again, so that the next reconcile starts it afresh.
                if let Some(Replica::Loaded(g)) = self.registry.remove(qm.id).await {
                    g.stop.cancel();
                    let _ = g.raft.shutdown().await;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    async fn stop_queue_group(&self, group: GroupId) {
        if let Some(r) = self.registry.remove(group).await {
            info!(group, queue = %r.meta().name, "queue deleted or replica removed here: stopping its group, deleting its data");
            r.machine().cancel_consumers("queue deleted", false);
            if let Replica::Loaded(g) = r {
                g.stop.cancel();
                let _ = g.raft.shutdown().await;
            }
            if let Err(e) = self.store.delete_group(group) {
                warn!(group, "delete data of queue group: {e}");
            }
        }
    }
}

impl GroupLoader for Node {
    fn load<'a>(&'a self, dormant: &'a Dormant) -> BoxFuture<'a, anyhow::Result<QueueGroup>> {
        Box::pin(self.open_queue_group(
            dormant.meta.clone(),
            LogStore::new(self.store.clone(), dormant.meta.id),
            dormant.machine.clone(),
            dormant.quiet.clone(),
            dormant.membership.clone(),
            true,
        ))
    }
}

/// Whether a sleeping replica's Raft instance may be unloaded: where it leads, every member
/// holds its whole log, and its leader actor has nothing to wait for: no message deadline (TTL,
/// Get lease, delayed requeue), no `x-expires` to watch, no dead letters held for transfer, no
/// move task running. Any of them keeps the group loaded (asleep) until it is done.
///
/// A leader with a member behind (a node down, which a leader may sleep through) stays loaded:
/// that member's return must find it ready to catch it up. Unloaded, the survivors of a node
/// lost with 10 000 queues had to load every such leader at once when it came back, and its
/// restart did not finish in 150 s (59 s with every replica loaded).
fn may_unload(g: &QueueGroup) -> bool {
    let m = g.raft.metrics();
    {
        let m = m.borrow_watched();
        if m.state != ServerState::Leader {
            return true;
        }
        // The leader replicates to every other member (voter or learner).
        let Some(replication) = &m.replication else {
            return false;
        };
        if !replication.keys().all(|id| holds_whole_log(&m, *id)) {
            return false;
        }
    }
    g.machine.with_state(|s| {
        let counts = s.counts();
        s.next_deadline().is_none()
            && counts.held == 0
            && (s.config().expires_ms.is_none() || counts.consumers > 0)
            && s.moves().values().all(|m| m.state != MoveState::Running)
    })
}

/// The Raft settings of every group on this node.
fn raft_config(config: &Config) -> anyhow::Result<Arc<openraft::Config>> {
    let raft = openraft::Config {
        cluster_name: "quorumq".into(),
        heartbeat_interval: config.heartbeat_ms,
        election_timeout_min: config.election_timeout_min_ms,
        election_timeout_max: config.election_timeout_max_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_after_entries),
        max_in_snapshot_log_to_keep: 1000,
        // A node back from a partition must not depose healthy leaders (found by
        // qq-chaos: every group stalled for seconds after each heal without it).
        enable_pre_vote: Some(true),
        // A node re-seeded with an empty data directory (the procedure its refusal to start
        // on a damaged directory gives) comes back with an empty log. Without this, every
        // leader that had replicated to it panics its group's Raft core when it sees the
        // follower's log behind what it had acknowledged (found by tests/cluster/reseed.rs),
        // making the group unavailable on that node. With it, the leader starts that
        // follower's replication over (by snapshot where its log is compacted). The leader
        // still holds every committed entry, so this loses nothing; the caveat is the one the
        // procedure states: the wiped node forgot its votes and its acknowledgements, so it
        // must rejoin only while the other nodes hold a majority of every group.
        allow_log_reversion: Some(true),
        // openraft allocates its per-entry latency ring buffers (7 of this many slots, about
        // 148 KiB per group at the default 1024) whether or not its `runtime-stats` feature,
        // the only user, is on; it is off here. Every group on the node pays it, idle or not.
        log_stage_capacity: Some(1),
        ..Default::default()
    };
    Ok(Arc::new(raft.validate()?))
}

/// The Raft settings of a queue replica loaded again after an unload: the node's, with the
/// timers off (it still sleeps) and a leader restored as the leader of its term.
fn reload_config(raft_config: &openraft::Config) -> Arc<openraft::Config> {
    Arc::new(openraft::Config {
        enable_tick: false,
        enable_heartbeat: false,
        enable_leader_restore: Some(true),
        ..raft_config.clone()
    })
}

/// What to do when the data directory cannot be opened (said in the node's refusal).
fn reseed_advice(data_dir: &std::path::Path) -> String {
    let dir = data_dir.display();
    format!(
        "The data directory {dir} cannot be opened: it may be corrupt or truncated (a disk \
         fault, a partial copy, files removed by hand). To re-seed this node from its peers: \
         keep it stopped, move {dir} aside (keep it to investigate), and start the node again \
         with the same configuration and an empty data directory. It rejoins the cluster and \
         catches up from the other nodes (by snapshot where their logs were compacted), \
         replica by replica. Do this only while the other nodes are up and hold a majority of \
         every queue (`qqctl status`); re-seeding a node that other nodes depend on for a \
         majority loses what only it held."
    )
}

/// Initialise the cluster's metadata group if this node has the lowest id and nothing was
/// initialised yet.
async fn initialise_if_first(meta_raft: &MetaRaft, config: &Config) -> anyhow::Result<()> {
    let lowest = *config
        .node_ids()
        .first()
        .expect("validated: peers not empty");
    if lowest != config.node_id || meta_raft.is_initialized().await? {
        return Ok(());
    }
    let members: BTreeMap<u64, BasicNode> = config
        .peers
        .iter()
        .map(|p| {
            let addr = p.address.clone();
            (p.id, BasicNode { addr })
        })
        .collect();
    initialize_unless_joined(
        meta_raft,
        members,
        &info_span!("metadata", node_id = config.node_id),
    )
    .await
}

/// Initialise a group with `members` unless its replica here already takes part in one: a
/// member that was re-seeded (started with an empty data directory) or started its group late
/// can hear the leader (a vote or an append) between its Raft starting and this call, and
/// openraft then refuses to initialise; that replica is in the group already, and catches up
/// from its leader. Found by qq-chaos `wipe-rejoin`: the refusal used to end the group's
/// start-up before its leadership watch ran, so when that replica later led the queue, no
/// leader actor ran (held dead letters never moved, the queue stopped draining).
async fn initialize_unless_joined<SM>(
    raft: &Raft<TypeConfig, SM>,
    members: BTreeMap<u64, BasicNode>,
    span: &tracing::Span,
) -> anyhow::Result<()>
where
    SM: openraft::storage::RaftStateMachine<TypeConfig>,
{
    // openraft checks and initialises in one step on its core: checking first here would leave
    // the window open.
    match raft.initialize(members.clone()).await {
        Ok(()) => {
            span.in_scope(|| info!(?members, "initialised the group"));
            Ok(())
        }
        Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
            span.in_scope(|| debug!("not initialised: the group has begun here already ({e})"));
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// A replica starting here (the node starts) that may start asleep: what its leader would
/// have asked it to sleep with. That is when its persisted vote is committed and names another
/// node, and its whole log is committed: it followed that leader with nothing pending, as a
/// sleeping follower does ([`crate::groups::quiet`]). Started awake instead, the replicas of a
/// restarted node hosting thousands of queues all ran their election timers before their
/// leaders (themselves asleep and unloaded) could reach them, and their pre-votes made every
/// peer load the replicas they asked.
///
/// A vote that is stale (another leader was elected while this node was down) is safe: that
/// leader's first append carries its newer vote and wakes the replica, and a leader with a
/// member behind is woken when that member's link opens ([`crate::peer::liveness`]).
async fn follower_at_rest(mut log: LogStore, me: NodeId) -> Option<SleepRequest> {
    use openraft::storage::{RaftLogReader, RaftLogStorage};
    let vote = log.read_vote().await.ok()??;
    let committed = log.read_committed().await.ok()?;
    let last = log.get_log_state().await.ok()?.last_log_id;
    let leader = vote.leader_id().node_id;
    (vote.is_committed() && leader != me && committed.is_some() && committed == last)
        .then_some(SleepRequest { vote, committed })
}

/// If `raft` leads its group, ask the voter with the most replicated log to take over; a
/// receiver that turns false once this node no longer leads.
async fn transfer_away<SM>(raft: &Raft<TypeConfig, SM>, me: NodeId) -> Option<watch::Receiver<bool>>
where
    SM: openraft::storage::RaftStateMachine<TypeConfig>,
{
    let m = raft.metrics().borrow_watched().clone();
    if m.state != openraft::ServerState::Leader {
        return None;
    }
    let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
    let matched = |id: &NodeId| {
        m.replication
            .as_ref()
            .and_then(|r| r.get(id).cloned().flatten())
            .map(|l| l.index)
    };
    let to = voters
        .iter()
        .copied()
        .filter(|v| *v != me)
        .max_by_key(|v| (matched(v), std::cmp::Reverse(*v)))?;
    raft.trigger().transfer_leader(to).await.ok()?;
    let (tx, rx) = watch::channel(true);
    let mut metrics = raft.metrics();
    tokio::spawn(async move {
        loop {
            if metrics.borrow_watched().state != openraft::ServerState::Leader {
                let _ = tx.send(false);
                return;
            }
            if metrics.changed().await.is_err() {
                let _ = tx.send(false);
                return;
            }
        }
    });
    Some(rx)
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorage;
    use qq_core::QueueConfig;

    use super::*;
    use crate::groups::queue_sm::QueueMachine;
    use crate::groups::shell::Shell;

    const GROUP: GroupId = 7;

    async fn queue_raft(store: &Store) -> Raft<TypeConfig, Shell<QueueMachine>> {
        let config = Config::for_tests("insecure_cluster = true").unwrap();
        Raft::new(
            1,
            raft_config(&config).unwrap(),
            GroupNetwork {
                group: GROUP,
                peers: Peers::new(Vec::new(), None).unwrap(),
            },
            LogStore::new(store.clone(), GROUP),
            Shell::new(QueueMachine::new(
                GROUP,
                store.clone(),
                QueueConfig::new("/", "q"),
            )),
        )
        .await
        .unwrap()
    }

    fn members() -> BTreeMap<u64, BasicNode> {
        (1..=3).map(|id| (id, BasicNode::default())).collect()
    }

    /// The replica heard its leader (here: a vote stored before its Raft started, as a vote
    /// request or an append between the start and the initialisation leaves it) and openraft
    /// refuses to initialise: that is a replica in its group already, not a failed start.
    #[tokio::test]
    async fn a_replica_that_heard_its_leader_first_starts_without_initialising() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let vote = openraft::alias::VoteOf::<TypeConfig>::new_committed(4, 2);
        LogStore::new(store.clone(), GROUP)
            .save_vote(&vote)
            .await
            .unwrap();
        let raft = queue_raft(&store).await;
        let refused = raft.initialize(members()).await;
        assert!(
            matches!(
                refused,
                Err(RaftError::APIError(InitializeError::NotAllowed(_)))
            ),
            "openraft refuses to initialise over a vote: {refused:?}"
        );
        initialize_unless_joined(&raft, members(), &tracing::Span::none())
            .await
            .expect("a replica that heard its leader is started, not failed");
        assert_eq!(raft.metrics().borrow_watched().vote, vote);
        raft.shutdown().await.unwrap();
    }

    /// A replica that followed another node's leader with its whole log committed starts
    /// asleep (its node restarted); one with an uncommitted tail, or whose vote names itself,
    /// starts awake.
    #[tokio::test]
    async fn a_follower_at_rest_is_known_from_its_stored_state() {
        use openraft::entry::RaftEntry;
        use openraft::raft::AppendEntriesRequest;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let raft = queue_raft(&store).await;
        let vote = openraft::alias::VoteOf::<TypeConfig>::new_committed(1, 2);
        let log_id = |index| {
            openraft::alias::LogIdOf::<TypeConfig>::new(
                openraft::impls::leader_id_adv::LeaderId {
                    term: 1,
                    node_id: 2,
                },
                index,
            )
        };
        let voters: BTreeSet<u64> = (1..=3).collect();
        let membership = openraft::Membership::new_with_defaults(vec![voters], []);
        let append = |prev, entries, commit| AppendEntriesRequest::<TypeConfig> {
            vote: vote.clone(),
            prev_log_id: prev,
            entries,
            leader_commit: Some(log_id(commit)),
        };
        let reply = raft
            .append_entries(append(
                None,
                vec![
                    openraft::alias::EntryOf::<TypeConfig>::new_membership(log_id(0), membership),
                    openraft::alias::EntryOf::<TypeConfig>::new_blank(log_id(1)),
                ],
                1,
            ))
            .await
            .unwrap();
        assert!(reply.is_success(), "{reply:?}");
        raft.wait(Some(Duration::from_secs(5)))
            .metrics(|m| m.last_applied == Some(log_id(1)), "the entries applied")
            .await
            .unwrap();

        let log = || LogStore::new(store.clone(), GROUP);
        let at_rest = follower_at_rest(log(), 1).await;
        let req = at_rest.expect("a follower of node 2 with its whole log committed");
        assert_eq!(req.vote, vote);
        assert_eq!(req.committed, Some(log_id(1)));
        assert!(
            follower_at_rest(log(), 2).await.is_none(),
            "the vote names the node itself: it led, so it starts awake"
        );

        // An entry beyond the commit: not at rest.
        let reply = raft
            .append_entries(append(
                Some(log_id(1)),
                vec![openraft::alias::EntryOf::<TypeConfig>::new_blank(log_id(2))],
                1,
            ))
            .await
            .unwrap();
        assert!(reply.is_success(), "{reply:?}");
        assert!(follower_at_rest(log(), 1).await.is_none());
        raft.shutdown().await.unwrap();
    }

    /// The metrics of a started instance over an applied machine (before its core started, an
    /// instance reports the initial ones: a learner that knows nothing).
    async fn first_metrics(
        raft: &Raft<TypeConfig, Shell<QueueMachine>>,
    ) -> openraft::RaftMetrics<TypeConfig> {
        raft.wait(Some(Duration::from_secs(5)))
            .metrics(|m| m.last_applied.is_some(), "the instance's first metrics")
            .await
            .unwrap()
    }

    /// An unloaded replica loaded again (the unload's shutdown, then a new instance with the
    /// reload settings around the same machine and applied membership) is what it was: here
    /// the leader of a one-voter group, of the same term, with the same voters, without an
    /// election. Without the applied membership it would come back as a learner (found when
    /// the first unloaded group was read: it had no leader any more).
    #[tokio::test]
    async fn a_reloaded_leader_is_the_leader_of_its_term_with_its_membership() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let config = Config::for_tests("insecure_cluster = true").unwrap();
        let machine = QueueMachine::new(GROUP, store.clone(), QueueConfig::new("/", "q"));
        let open = |raft_config: Arc<openraft::Config>, shell: Shell<QueueMachine>| {
            let store = store.clone();
            async move {
                Raft::new(
                    1,
                    raft_config,
                    GroupNetwork {
                        group: GROUP,
                        peers: Peers::new(Vec::new(), None).unwrap(),
                    },
                    LogStore::new(store, GROUP),
                    shell,
                )
                .await
                .unwrap()
            }
        };
        let shell = Shell::new(machine.clone());
        let membership = shell.applied_membership();
        let raft = open(raft_config(&config).unwrap(), shell).await;
        let one: BTreeMap<u64, BasicNode> = [(1, BasicNode::default())].into();
        raft.initialize(one).await.unwrap();
        let before = raft
            .wait(Some(Duration::from_secs(5)))
            .metrics(
                |m| m.state == ServerState::Leader && m.last_applied.is_some(),
                "leader with its first entry applied",
            )
            .await
            .unwrap();
        raft.shutdown().await.unwrap();

        let reload = reload_config(&raft_config(&config).unwrap());
        let raft = open(reload.clone(), Shell::resume(machine.clone(), membership)).await;
        let after = first_metrics(&raft).await;
        assert_eq!(after.state, ServerState::Leader);
        assert_eq!(after.current_term, before.current_term);
        assert_eq!(after.vote, before.vote);
        let voters: Vec<u64> = after.membership_config.voter_ids().collect();
        assert_eq!(voters, vec![1]);
        assert_eq!(after.last_applied, before.last_applied);
        raft.shutdown().await.unwrap();

        // The same without the applied membership: not a voter any more.
        let raft = open(reload, Shell::new(machine)).await;
        let lost = first_metrics(&raft).await;
        assert_eq!(lost.state, ServerState::Learner);
        raft.shutdown().await.unwrap();
    }

    /// A pristine replica is initialised; any other failure is still an error.
    #[tokio::test]
    async fn a_pristine_replica_is_initialised() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let raft = queue_raft(&store).await;
        initialize_unless_joined(&raft, members(), &tracing::Span::none())
            .await
            .unwrap();
        assert!(raft.is_initialized().await.unwrap());
        let voters: Vec<u64> = raft
            .metrics()
            .borrow_watched()
            .membership_config
            .voter_ids()
            .collect();
        assert_eq!(voters, vec![1, 2, 3]);
        raft.shutdown().await.unwrap();
    }
}
