//! [`Serving`]: what the client-facing layers (the gRPC handlers, the AMQP adapter, the
//! management page) take of their node.

use std::sync::Arc;

use qq_core::NodeId;
use qq_raft::network::Peers;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::alarms::Alarms;
use crate::clock::Clock;
use crate::config::Config;
use crate::consume::Consuming;
use crate::enqueue::Enqueuer;
use crate::groups::registry::Registry;
use crate::membership::Members;
use crate::meta_view::MetaView;
use crate::proposer::Proposer;

/// The node as a client sees it through any protocol: its configuration, metadata, proposals
/// and enqueues, alarms, groups (for status), peers, consumer sessions and membership changes,
/// whether its metadata caught up, its clock, and where its tasks are tracked and stopped. Not
/// its store, its Raft instances' opener or its supervisor. Cheap to clone.
#[derive(Clone)]
pub struct Serving {
    pub(crate) id: NodeId,
    pub(crate) config: Arc<Config>,
    pub(crate) clock: Clock,
    pub(crate) view: MetaView,
    pub(crate) proposer: Proposer,
    pub(crate) enqueuer: Enqueuer,
    pub(crate) alarms: Arc<Alarms>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) peers: Peers,
    pub(crate) tasks: TaskTracker,
    pub(crate) stopping: CancellationToken,
    pub(crate) meta_synced: watch::Receiver<bool>,
    pub(crate) consuming: Consuming,
    pub(crate) members: Members,
}

impl Serving {
    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn clock(&self) -> Clock {
        self.clock
    }

    pub fn view(&self) -> &MetaView {
        &self.view
    }

    pub fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    pub fn enqueuer(&self) -> &Enqueuer {
        &self.enqueuer
    }

    /// Memory and disk alarms ([`crate::alarms`]).
    pub fn alarms(&self) -> &Alarms {
        &self.alarms
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Cancelled when the node begins to shut down.
    pub fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }

    /// Whether the node's metadata has caught up ([`crate::node::Node::meta_synced`]).
    pub fn meta_synced(&self) -> watch::Receiver<bool> {
        self.meta_synced.clone()
    }

    pub fn consuming(&self) -> &Consuming {
        &self.consuming
    }

    pub fn members(&self) -> &Members {
        &self.members
    }

    /// The nodes new queues may be placed on ([`Members::placement_nodes`]).
    pub fn placement_nodes(&self) -> Vec<NodeId> {
        self.members.placement_nodes()
    }
}
