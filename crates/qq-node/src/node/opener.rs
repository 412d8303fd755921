//! What creating a queue replica's Raft instance needs, and nothing else of the node: the
//! [`Opener`]. The supervisor opens replicas with it as the metadata creates them
//! ([`super::replicas`]); the node's loader task ([`serve_loads`]) loads unloaded ones again
//! with it when the registry asks ([`LoadRequest`]). The registry holds only the sending end
//! of that channel: it never calls into the node.

use std::sync::Arc;
use std::time::Duration;

use openraft::Raft;
use qq_core::NodeId;
use qq_core::meta::QueueMeta;
use qq_raft::TypeConfig;
use qq_raft::log_store::LogStore;
use qq_raft::network::{GroupNetwork, Peers};
use qq_raft::store::Store;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info_span};

use crate::clock::Clock;
use crate::groups::queue_sm::QueueMachine;
use crate::groups::registry::{LoadRequest, QueueGroup, UnloadedReplica, next_instance};
use crate::groups::residency::ResidencyCell;
use crate::groups::shell::{AppliedMembership, Machine, Shell};
use crate::leader::{LeaderContext, watch_leadership};

/// How long a load waits for the new instance's core to report its state.
const LOAD_WAIT: Duration = Duration::from_secs(5);

/// Creates queue replicas' Raft instances and starts their tasks (module docs).
#[derive(Clone)]
pub(crate) struct Opener {
    pub id: NodeId,
    pub store: Store,
    pub peers: Peers,
    pub raft_config: Arc<openraft::Config>,
    /// The Raft settings of a queue replica loaded again after an unload: timers off (it
    /// sleeps until something wakes it), and a leader comes back as the leader of its term.
    pub reload_config: Arc<openraft::Config>,
    pub leader_ctx: LeaderContext,
    pub clock: Clock,
    /// The node's shutdown: a replica's tasks stop with it.
    pub shutdown: CancellationToken,
    pub tasks: TaskTracker,
}

impl Opener {
    /// Create a queue replica's Raft instance and start its tasks (the leadership watch).
    /// `reload`: the replica was unloaded (it sleeps; see [`Opener::reload_config`]).
    pub async fn open(
        &self,
        qm: QueueMeta,
        log: LogStore,
        machine: Arc<QueueMachine>,
        residency: Arc<ResidencyCell>,
        membership: AppliedMembership,
        reload: bool,
    ) -> anyhow::Result<QueueGroup> {
        let span = info_span!("queue", node_id = self.id, queue = %qm.name, group = qm.id);
        // A replica started asleep (`follower_asleep_at_start`) starts with its timers off too; the
        // reload settings' leader restore does not apply to it (it follows another node).
        let config = if reload || residency.is_asleep() {
            self.reload_config.clone()
        } else {
            self.raft_config.clone()
        };
        let network = GroupNetwork {
            group: qm.id,
            peers: self.peers.clone(),
        };
        let shell = Shell::resume(machine.clone(), membership.clone());
        let raft = Raft::new(self.id, config, network, log, shell)
            .instrument(span.clone())
            .await?;
        if reload {
            wait_loaded(&raft, &machine).await?;
        }
        let instance = next_instance();
        residency.attach(&raft, instance, self.clock.now());
        let stop = self.shutdown.child_token();
        let group = QueueGroup {
            raft: raft.clone(),
            machine: machine.clone(),
            meta: qm.clone(),
            stop: stop.clone(),
            residency: residency.clone(),
            instance,
            membership,
        };
        // The leadership watch starts with the group, before anything can fail: the group is
        // in the registry (peers reach it) as soon as it is returned, so it may lead whatever
        // happens next.
        let ctx = self.leader_ctx.clone();
        let watch = watch_leadership(
            ctx,
            qm.id,
            raft,
            machine,
            residency,
            stop,
            reload,
            span.clone(),
        );
        self.tasks.spawn(watch.instrument(span));
        Ok(group)
    }

    /// Load an unloaded replica's Raft instance again (from the same storage as at a start).
    pub async fn reload(&self, unloaded: &UnloadedReplica) -> anyhow::Result<QueueGroup> {
        self.open(
            unloaded.meta.clone(),
            LogStore::new(self.store.clone(), unloaded.meta.id),
            unloaded.machine.clone(),
            unloaded.residency.clone(),
            unloaded.membership.clone(),
            true,
        )
        .await
    }
}

/// Spawn the node's loader task ([`serve_loads`]); the token returned stops it.
pub(crate) fn spawn_loader(
    opener: &Opener,
    loads: mpsc::UnboundedReceiver<LoadRequest>,
) -> CancellationToken {
    let stop = CancellationToken::new();
    tokio::spawn(serve_loads(opener.clone(), loads, stop.clone()));
    stop
}

/// The node's loader task: carries out the registry's load requests, each in its own task (the
/// registry asks for up to `LOADS_AT_ONCE` at a time), until `stop` (the end of the node's
/// shutdown, which loads the leaders it hands over) or until the registry is gone. An instance
/// loaded for a request whose asker is gone is shut down again.
async fn serve_loads(
    opener: Opener,
    mut loads: mpsc::UnboundedReceiver<LoadRequest>,
    stop: CancellationToken,
) {
    loop {
        let request = tokio::select! {
            _ = stop.cancelled() => return,
            request = loads.recv() => match request {
                Some(request) => request,
                None => return,
            },
        };
        let opener = opener.clone();
        tokio::spawn(async move {
            let LoadRequest {
                unloaded,
                transition,
                reply,
            } = request;
            let loaded = opener.reload(&unloaded).await;
            // The registry stopped waiting (its caller was dropped): the instance never
            // reaches the registry, so it is shut down before the transition lock is let go
            // (no next load runs beside it).
            if let Err((Ok(orphan), _transition)) = reply.send((loaded, transition)) {
                orphan.stop.cancel();
                let _ = orphan.raft.shutdown().await;
            }
        });
    }
}

/// Wait until a loaded instance's core has started. Until then the instance's metrics are the
/// initial ones (a learner that knows nothing); what the replica is must be known before anyone
/// reads "who leads" or "am I the leader" from it.
async fn wait_loaded(
    raft: &Raft<TypeConfig, Shell<QueueMachine>>,
    machine: &QueueMachine,
) -> anyhow::Result<()> {
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
    Ok(())
}
