//! [`Peering`]: what the node-to-node side (the internal service, the peer watches, the
//! incarnation checks) takes of its node.

use std::collections::BTreeSet;
use std::sync::Arc;

use qq_core::NodeId;
use qq_raft::GroupId;
use qq_raft::network::Peers;
use qq_raft::store::Store;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::machines::PeerMachines;
use crate::clock::Clock;
use crate::config::Config;
use crate::consume::Consuming;
use crate::groups::registry::Registry;
use crate::membership::Members;
use crate::meta_view::MetaView;
use crate::proposer::Proposer;

/// The node as its peers reach it: its groups and store (Raft RPCs, snapshots), its peers and
/// what machine version each runs, its metadata and proposals (forwarded ones, the metadata's
/// catch-up), relayed consumer sessions and membership operations, its settings and clock,
/// and where its tasks are tracked and stopped. Not its enqueuer, its alarms or its
/// supervisor. Cheap to clone.
#[derive(Clone)]
pub struct Peering {
    pub(crate) id: NodeId,
    pub(crate) config: Arc<Config>,
    pub(crate) clock: Clock,
    pub(crate) peers: Peers,
    pub(crate) machines: PeerMachines,
    pub(crate) registry: Arc<Registry>,
    pub(crate) view: MetaView,
    pub(crate) proposer: Proposer,
    pub(crate) store: Store,
    pub(crate) tasks: TaskTracker,
    pub(crate) stopping: CancellationToken,
    pub(crate) consuming: Consuming,
    pub(crate) members: Members,
}

impl Peering {
    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn clock(&self) -> Clock {
        self.clock
    }

    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    /// Which queue machine version each peer runs, as its watch says.
    pub fn peer_machines(&self) -> &PeerMachines {
        &self.machines
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn view(&self) -> &MetaView {
        &self.view
    }

    pub fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    /// The node's RocksDB and snapshot directory.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Cancelled when the node begins to shut down.
    pub fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }

    pub fn consuming(&self) -> &Consuming {
        &self.consuming
    }

    pub fn members(&self) -> &Members {
        &self.members
    }

    /// The voters of the metadata group as this node knows them.
    pub fn meta_voters(&self) -> BTreeSet<NodeId> {
        self.registry.meta_voters()
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
}
