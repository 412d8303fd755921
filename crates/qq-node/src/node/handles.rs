//! The narrow handles the node gives its layers: each names what its layer reads of the node,
//! so that only the wiring (`server`) and this module hold the [`Node`] itself.

use super::Node;
use crate::api::serving::Serving;
use crate::observe::observed::Observed;
use crate::peer::peering::Peering;

impl Node {
    /// What the node-to-node side takes of the node.
    pub fn peering(&self) -> Peering {
        Peering {
            id: self.id,
            config: self.config.clone(),
            clock: self.clock,
            peers: self.peers.clone(),
            machines: self.peer_machines().clone(),
            registry: self.registry.clone(),
            view: self.view.clone(),
            proposer: self.proposer.clone(),
            store: self.store.clone(),
            tasks: self.tasks.clone(),
            stopping: self.shutdown.clone(),
            consuming: self.consuming.clone(),
            members: self.members.clone(),
        }
    }

    /// What the client-facing layers take of the node.
    pub fn serving(&self) -> Serving {
        Serving {
            id: self.id,
            config: self.config.clone(),
            clock: self.clock,
            view: self.view.clone(),
            proposer: self.proposer.clone(),
            enqueuer: self.enqueuer.clone(),
            alarms: self.alarms.clone(),
            registry: self.registry.clone(),
            peers: self.peers.clone(),
            tasks: self.tasks.clone(),
            stopping: self.shutdown.clone(),
            meta_synced: self.meta_synced(),
            consuming: self.consuming.clone(),
            members: self.members.clone(),
        }
    }

    /// What the node's observers read of it.
    pub fn observed(&self) -> Observed {
        Observed {
            id: self.id,
            registry: self.registry.clone(),
            view: self.view.clone(),
            alarms: self.alarms.clone(),
            per_queue_metrics: self.config.per_queue_metrics,
            meta_synced: self.meta_synced(),
            stopping: self.shutdown.clone(),
        }
    }
}
