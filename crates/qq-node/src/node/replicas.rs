//! Opening and closing a queue's replica on this node: its Raft instance, its leadership
//! watch (which runs the queue's leader actor), its first initialisation, loading it again
//! after an unload, and stopping it with its data deleted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use openraft::{BasicNode, Raft};
use qq_core::meta::QueueMeta;
use qq_raft::log_store::LogStore;
use qq_raft::network::GroupNetwork;
use qq_raft::{GroupId, TypeConfig};
use tracing::{Instrument, info, info_span, warn};

use super::Node;
use super::raft::{follower_at_rest, initialize_unless_joined};
use crate::groups::queue_sm::QueueMachine;
use crate::groups::registry::{GroupLoader, QueueGroup, Replica, UnloadedReplica, next_instance};
use crate::groups::residency::ResidencyCell;
use crate::groups::shell::{AppliedMembership, Machine, Shell};
use crate::leader::watch_leadership;

/// How long a load waits for the new instance's core to report its state.
const LOAD_WAIT: Duration = Duration::from_secs(5);

impl Node {
    pub(super) async fn start_queue_group(&self, qm: QueueMeta) -> bool {
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
        residency: Arc<ResidencyCell>,
        membership: AppliedMembership,
        reload: bool,
    ) -> anyhow::Result<QueueGroup> {
        let span = info_span!("queue", node_id = self.id, queue = %qm.name, group = qm.id);
        // A replica started asleep ([`follower_at_rest`]) starts with its timers off too; the
        // reload settings' leader restore does not apply to it (it follows another node).
        let config = if reload || residency.is_asleep() {
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
        self.tasks.spawn(
            watch_leadership(
                self.leader_ctx.clone(),
                qm.id,
                raft,
                machine,
                residency,
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
        let machine = QueueMachine::for_queue(self.store.clone(), &qm);
        // One log store for the check and the instance: the vote it read stays cached.
        let log = LogStore::new(self.store.clone(), qm.id);
        let residency = Arc::new(match follower_at_rest(log.clone(), self.id).await {
            Some(req) => ResidencyCell::asleep_following(req, self.clock.now()),
            None => ResidencyCell::default(),
        });
        let group = self
            .open_queue_group(
                qm.clone(),
                log,
                machine,
                residency,
                Default::default(),
                false,
            )
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

    pub(super) async fn stop_queue_group(&self, group: GroupId) {
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

impl GroupLoader for Node {
    fn load<'a>(
        &'a self,
        unloaded: &'a UnloadedReplica,
    ) -> BoxFuture<'a, anyhow::Result<QueueGroup>> {
        Box::pin(self.open_queue_group(
            unloaded.meta.clone(),
            LogStore::new(self.store.clone(), unloaded.meta.id),
            unloaded.machine.clone(),
            unloaded.residency.clone(),
            unloaded.membership.clone(),
            true,
        ))
    }
}
