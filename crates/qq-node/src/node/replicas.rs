//! Opening and closing a queue's replica on this node: its first start (its Raft instance
//! and leadership watch, by [`super::opener`]), its first initialisation, and stopping it with
//! its data deleted.

use std::collections::BTreeMap;
use std::sync::Arc;

use openraft::BasicNode;
use qq_core::meta::QueueMeta;
use qq_raft::GroupId;
use qq_raft::log_store::LogStore;
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
