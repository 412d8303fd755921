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
//! The rooms: this file holds [`Node`], its start and the few accessors the wiring
//! (`server`) uses; `handles` gives each layer its narrow handle ([`Seams`] are what the node
//! takes in); `supervisor` keeps the groups and peers in line with the metadata; `opener`
//! creates a queue replica's Raft instance (at its start, and for the registry's loads, in the
//! node's loader task); `replicas` starts and stops a queue's replica; `unload` unloads the
//! Raft instances of long sleepers; `shutdown` stops the node; `raft` holds the openraft
//! settings and helpers that need no node state.
//!
//! Must not: serve clients or peers (that is [`crate::api`] and [`crate::peer`]), or decide
//! anything a queue's leader decides ([`crate::leader`]).

mod handles;
mod incarnation;
mod meta_upgrade;
mod opener;
mod raft;
mod replicas;
mod shutdown;
mod supervisor;
mod unload;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use openraft::Raft;
use openraft::async_runtime::WatchReceiver;
use qq_core::NodeId;
use qq_core::meta::MetaEffect;
use qq_raft::META_GROUP;
use qq_raft::log_store::LogStore;
use qq_raft::network::{GroupNetwork, PeerAddress, Peers};
use qq_raft::store::{Disk, Store, StoreError};
use qq_raft::transport::Transport;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info;

use self::opener::{Opener, spawn_loader};
use self::raft::{initialise_if_first, raft_config, reload_config};
use crate::alarms::{Alarms, Bounds};
use crate::clock::Clock;
use crate::config::Config;
use crate::consume::Consuming;
use crate::deadletter::DeadLetters;
use crate::enqueue::Enqueuer;
use crate::groups::meta_sm::MetaMachine;
use crate::groups::registry::{MetaRaft, Registry};
use crate::groups::shell::Shell;
use crate::leader::LeaderContext;
use crate::membership::Members;
use crate::meta_view::MetaView;
use crate::peer::machines::PeerMachines;
use crate::proposer::Proposer;

pub struct Node {
    id: NodeId,
    config: Arc<Config>,
    store: Store,
    peers: Peers,
    /// Creates queue replicas' Raft instances (at their start; loads go through the registry
    /// to the node's loader task, which holds a clone).
    opener: Opener,
    registry: Arc<Registry>,
    view: MetaView,
    proposer: Proposer,
    enqueuer: Enqueuer,
    /// The node's one clock ([`crate::clock`]), handed in at start.
    clock: Clock,
    /// What consumer sessions take of the node ([`crate::consume`]).
    consuming: Consuming,
    /// What membership changes take of it ([`crate::membership`]).
    members: Members,
    alarms: Arc<Alarms>,
    /// Latched true once this node's metadata has caught up with the cluster's (see
    /// [`Node::meta_synced`]).
    meta_synced: watch::Sender<bool>,
    shutdown: CancellationToken,
    /// Stops the loader task ((`opener::serve_loads`)) at the very end of the shutdown, after
    /// the leaderships were handed over (which loads the unloaded leaders).
    loads_stop: CancellationToken,
    tasks: TaskTracker,
}

impl Node {
    /// Open storage, start the metadata group and the supervisor. Time, the network and the
    /// disk are the caller's ([`Seams`]).
    pub async fn start(config: Config, seams: Seams) -> anyhow::Result<Arc<Node>> {
        let Seams {
            clock,
            transport,
            disk,
            clients: _,
        } = seams;
        let (store, peers) = open_store_and_peers(&config, clock, transport, &disk)?;
        let raft_config = raft_config(&config)?;
        let reload_config = reload_config(&raft_config);
        let (meta, effects) = MetaMachine::new(store.clone());
        let meta_raft = start_meta_raft(&config, &raft_config, &store, &peers, &meta).await?;
        let id = config.node_id;
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let read_lease = Duration::from_millis(config.election_timeout_min_ms);
        // Unbounded by type, bounded by the replicas: a request carries its replica's
        // transition lock, so at most one per hosted group waits here.
        let (loads, load_requests) = mpsc::unbounded_channel();
        let registry = Arc::new(Registry::new(
            id,
            read_lease,
            meta_raft,
            meta.clone(),
            loads,
            clock,
        ));
        let view = MetaView::new(meta);
        let proposer = Proposer::new(
            id,
            peers.clone(),
            registry.clone(),
            view.clone(),
            shutdown.clone(),
            clock,
        );
        let enqueuer = Enqueuer::new(proposer.clone(), id);
        let leader_ctx = leader_context(&config, &proposer, &view, &enqueuer, &tasks, &peers);
        // Measured once before serving, so a node started over its bounds refuses at once.
        let bounds = Bounds::from_config(&config)?;
        let alarms = Arc::new(Alarms::default());
        alarms.check(&bounds);
        let opener = Opener {
            id,
            store: store.clone(),
            peers: peers.clone(),
            raft_config,
            reload_config,
            leader_ctx,
            clock,
            shutdown: shutdown.clone(),
            tasks: tasks.clone(),
        };
        let loads_stop = spawn_loader(&opener, load_requests);
        let consuming = Consuming {
            id,
            clock,
            registry: registry.clone(),
            proposer: proposer.clone(),
            peers: peers.clone(),
            machines: opener.leader_ctx.machines.clone(),
            tasks: tasks.clone(),
            stopping: shutdown.clone(),
            // From the start time in ms times 1000: a restarted node does not hand out the
            // ids of its previous run.
            consumer_seq: Arc::new(AtomicU64::new(clock.now_ms() * 1000)),
        };
        let members = Members {
            id,
            clock,
            peers: peers.clone(),
            view: view.clone(),
            proposer: proposer.clone(),
            registry: registry.clone(),
            stopping: shutdown.clone(),
            founding: config.peers.clone().into(),
        };
        let node = Arc::new(Node {
            id,
            config: Arc::new(config),
            store,
            peers,
            opener,
            registry,
            view,
            proposer,
            enqueuer,
            clock,
            consuming,
            members,
            alarms: alarms.clone(),
            meta_synced: watch::Sender::new(false),
            shutdown,
            loads_stop,
            tasks,
        });
        node.spawn_tasks(effects, alarms, bounds);
        Ok(node)
    }

    /// Spawn the node's own tasks: the supervisor, the metadata sync latch, the unload sweep
    /// (when sleepers unload) and the alarms' watch.
    fn spawn_tasks(
        self: &Arc<Self>,
        effects: mpsc::Receiver<MetaEffect>,
        alarms: Arc<Alarms>,
        bounds: Bounds,
    ) {
        self.tasks.spawn(self.clone().supervise(effects));
        self.tasks.spawn(self.clone().follow_meta_sync());
        self.tasks.spawn(self.clone().upgrade_meta_machine());
        self.tasks.spawn(self.clone().settle_incarnation());
        if self.config.unload_after_ms > 0 && self.config.quiesce_after_ms > 0 {
            let after = Duration::from_millis(self.config.unload_after_ms);
            self.tasks.spawn(self.clone().unload_sleepers(after));
        }
        let stop = self.shutdown.clone();
        self.tasks
            .spawn(async move { alarms.watch(bounds, stop).await });
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    fn peers(&self) -> &Peers {
        &self.peers
    }

    /// Which queue machine version each peer runs, as its watch says.
    fn peer_machines(&self) -> &PeerMachines {
        &self.opener.leader_ctx.machines
    }

    fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The node's RocksDB and snapshot directory.
    fn store(&self) -> &Store {
        &self.store
    }

    pub fn view(&self) -> &MetaView {
        &self.view
    }

    pub fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    /// Every task of the node is spawned here, so shutdown can wait for it.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
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

    /// The nodes new queues may be placed on ([`Members::placement_nodes`]).
    pub fn placement_nodes(&self) -> Vec<NodeId> {
        self.members.placement_nodes()
    }
}

/// What to do when the data directory cannot be opened (said in the node's refusal).
fn reseed_advice(data_dir: &std::path::Path) -> String {
    let dir = data_dir.display();
    format!(
        "The data directory {dir} cannot be opened: it may be corrupt or truncated (a disk \
         fault, a partial copy, files removed by hand). To re-seed this node from its peers: \
         keep it stopped, move {dir} aside (keep it to investigate), and start the node again \
         with the same configuration and an empty data directory. It holds its votes, is \
         re-seeded by a peer as a new member (forgotten, joined again, a replica of each of \
         its queues added back) and catches up from the other nodes (by snapshot where their \
         logs were compacted), replica by replica. Do this only while the other nodes are up \
         and hold a majority of every queue (`qqctl status`); re-seeding a node that other \
         nodes depend on for a majority loses what only it held."
    )
}

/// What a node takes from outside instead of reaching for it: every clock read goes through
/// `clock` ([`crate::clock`]), every connection to a peer through `transport`
/// ([`qq_raft::transport`]), the gRPC client port listens through `clients`, its store is
/// opened on `disk` ([`qq_raft::store::Disk`]). `main` hands in [`Clock::system`],
/// [`qq_raft::transport::TcpTransport`] (for both) and [`Disk::real`]; the simulator its own.
pub struct Seams {
    pub clock: Clock,
    pub transport: Arc<dyn Transport>,
    pub clients: Arc<dyn Transport>,
    pub disk: Disk,
}

/// The node's data directory and store (with advice on re-seeding when it cannot be opened),
/// and its peers as the configuration names them, reached through `transport`.
fn open_store_and_peers(
    config: &Config,
    clock: Clock,
    transport: Arc<dyn Transport>,
    disk: &Disk,
) -> anyhow::Result<(Store, Peers)> {
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| anyhow::anyhow!("create data_dir {}: {e}", config.data_dir.display()))?;
    let store = disk
        .open(&config.data_dir.join("db"))
        .map_err(|e| match e {
            // Not damaged: written by a newer release.
            StoreError::NewerLayout { .. } => anyhow::anyhow!("{e}"),
            e => anyhow::anyhow!("{e}\n\n{}", reseed_advice(&config.data_dir)),
        })?;
    let incarnation = store.incarnation();
    let peers = Peers::new(
        config.peers.iter().map(|p| PeerAddress {
            id: p.id,
            address: p.address.clone(),
            cluster_address: p.cluster_address.clone(),
        }),
        config.cluster_tls()?.as_ref(),
        transport,
        clock,
    )?;
    // A new directory votes only once the cluster accepted it (module `incarnation`); a node
    // alone in its configuration has nobody to ask.
    if incarnation.new && config.peers.iter().any(|p| p.id != config.node_id) {
        peers.hold_votes(true);
    }
    Ok((store, peers))
}

/// The metadata group's Raft instance, the cluster initialised if this node is the first.
async fn start_meta_raft(
    config: &Config,
    raft_config: &Arc<openraft::Config>,
    store: &Store,
    peers: &Peers,
    meta: &Arc<MetaMachine>,
) -> anyhow::Result<MetaRaft> {
    let network = GroupNetwork {
        group: META_GROUP,
        peers: peers.clone(),
    };
    let log = LogStore::new(store.clone(), META_GROUP);
    let raft = Raft::new(
        config.node_id,
        raft_config.clone(),
        network,
        log,
        Shell::new(meta.clone()),
    )
    .await?;
    initialise_if_first(&raft, config).await?;
    Ok(raft)
}

/// What every leader actor of this node shares.
fn leader_context(
    config: &Config,
    proposer: &Proposer,
    view: &MetaView,
    enqueuer: &Enqueuer,
    tasks: &TaskTracker,
    peers: &Peers,
) -> LeaderContext {
    LeaderContext {
        proposer: proposer.clone(),
        view: view.clone(),
        dead_letters: DeadLetters::new(view.clone(), enqueuer.clone(), proposer.clone()),
        dead_letter_retry: Duration::from_millis(config.dead_letter_retry_ms),
        mover: crate::moves::Mover::new(view.clone(), enqueuer.clone(), proposer.clone()),
        tasks: tasks.clone(),
        peers: peers.clone(),
        me: config.node_id,
        sleep_after: (config.quiesce_after_ms > 0)
            .then(|| Duration::from_millis(config.quiesce_after_ms)),
        machines: PeerMachines::default(),
        default_consumer_timeout_ms: config.consumer_timeout_ms,
        clock: proposer.clock(),
    }
}
