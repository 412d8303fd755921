//! Opening and closing a queue's replica on this node: its first start (its Raft instance
//! and leadership watch, by [`super::opener`]), its first initialisation, and stopping it with
//! its data deleted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use qq_core::NodeId;
use qq_core::meta::QueueMeta;
use qq_raft::GroupId;
use qq_raft::log_store::LogStore;
use qq_raft::network::Peers;
use tracing::{info, info_span, warn};

use super::Node;
use super::raft::{follower_asleep_at_start, initialize_unless_joined};
use crate::groups::queue_sm::QueueMachine;
use crate::groups::registry::Replica;
use crate::groups::residency::ResidencyCell;

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

    async fn try_start_queue_group(
        &self,
        qm: QueueMeta,
        span: tracing::Span,
    ) -> anyhow::Result<()> {
        let machine = QueueMachine::for_queue(self.store.clone(), &qm);
        // One log store for the check and the instance: the vote it read stays cached.
        let log = LogStore::new(self.store.clone(), qm.id);
        let residency = Arc::new(match follower_asleep_at_start(log.clone(), self.id).await {
            Some(req) => ResidencyCell::asleep_following(req, self.clock.now()),
            None => ResidencyCell::default(),
        });
        let group = self
            .opener
            .open(
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
            let members = voters(&self.peers, &qm.members);
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

    /// A new queue's group is initialised by its first member. Should that member never do it
    /// (it was stopped for good, or is down, as the queue was declared), the group would have
    /// no leader until it came back, and a node retired meanwhile could not even be forgotten
    /// from it. So every other member of the group as it was created initialises it too, with
    /// the same members, when its replica has heard nothing for [`INIT_FALLBACK`]: openraft
    /// allows any number of nodes to initialise with one identical membership (the entry at
    /// index 0 is the same everywhere; the vote elects one leader), and refuses, harmlessly,
    /// on a replica that has begun. Found by the simulator (seed 2009: a queue declared while
    /// the spare node it was placed on first was being retired).
    pub(super) fn initialise_unless_heard(&self, created: QueueMeta) {
        if created.members.first() == Some(&self.id) || !created.members.contains(&self.id) {
            return;
        }
        let (registry, peers) = (self.registry.clone(), self.peers.clone());
        let stopping = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stopping.cancelled() => return,
                // tokio's clock, the one `Clock::now` reads.
                _ = tokio::time::sleep(INIT_FALLBACK) => {}
            }
            let Some(Replica::Loaded(g)) = registry.replica(created.id) else {
                return;
            };
            let span = info_span!("queue", queue = %created.name, group = created.id);
            let members = voters(&peers, &created.members);
            if let Err(e) = initialize_unless_joined(&g.raft, members, &span).await {
                span.in_scope(|| warn!("initialise in place of the first member: {e:#}"));
            }
        });
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

/// How long a member other than the first waits to hear from a new group before it
/// initialises the group itself ([`Node::initialise_unless_heard`]).
const INIT_FALLBACK: Duration = Duration::from_secs(5);

/// `members` as openraft's voters, each with its client address.
fn voters(peers: &Peers, members: &[NodeId]) -> BTreeMap<u64, BasicNode> {
    members
        .iter()
        .map(|id| {
            let addr = peers.address(*id).unwrap_or_default();
            (*id, BasicNode { addr })
        })
        .collect()
}
