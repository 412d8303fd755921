//! A read-only, versioned view of the metadata (vhosts, users, exchanges, bindings, queues,
//! policies) for the API and routing.
//!
//! [`MetaView::current`] returns an immutable snapshot (`Arc<MetaState>`) of this node's
//! replica as of its last applied entry: a reader holds no lock while it routes, checks
//! permissions or lists, and the metadata machine replaces the state copy-on-write. The version
//! counts applied batches on this node; caches keyed by it (permission grants) drop on change.
//!
//! Must not: write. Changes go through [`crate::proposer::Proposer::propose_meta`].

use std::sync::Arc;

use qq_core::NodeId;
use qq_core::meta::{MetaState, QueueMeta};
use qq_raft::GroupId;
use tokio::sync::watch;

use crate::groups::meta_sm::MetaMachine;

#[derive(Clone)]
pub struct MetaView {
    machine: Arc<MetaMachine>,
}

impl MetaView {
    pub fn new(machine: Arc<MetaMachine>) -> MetaView {
        MetaView { machine }
    }

    /// The metadata as of the last entry applied here.
    pub fn current(&self) -> Arc<MetaState> {
        self.machine.state()
    }

    /// Bumped after every applied batch of metadata entries.
    pub fn version(&self) -> u64 {
        self.machine.version()
    }

    /// Resolves on every change of [`MetaView::version`].
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.machine.subscribe()
    }

    /// The metadata log index applied on this node.
    pub fn applied_index(&self) -> u64 {
        self.machine.applied_index()
    }

    pub fn queue_by_id(&self, group: GroupId) -> Option<QueueMeta> {
        self.current().queue_by_id(group).cloned()
    }

    /// The members of a queue group by the metadata (empty if it does not exist).
    pub fn queue_members(&self, group: GroupId) -> Vec<NodeId> {
        self.current()
            .queue_by_id(group)
            .map(|q| q.members.clone())
            .unwrap_or_default()
    }
}
