//! Consumer sessions: [`session`] runs one on the queue's leader; [`relay`] connects a client
//! attached to any node to the session on the leader. [`Consuming`] is what they take of
//! their node.

pub mod relay;
pub mod session;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use qq_core::NodeId;
use qq_raft::network::Peers;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::groups::registry::Registry;
use crate::peer::machines::PeerMachines;
use crate::proposer::Proposer;

/// What a consumer session needs of its node, and no more: its groups, its proposals, its
/// peers (to reach a leader elsewhere and know which machine version it runs), its clock,
/// consumer ids, and where its tasks are tracked and stopped. Cheap to clone.
#[derive(Clone)]
pub struct Consuming {
    pub(crate) id: NodeId,
    pub(crate) clock: Clock,
    pub(crate) registry: Arc<Registry>,
    pub(crate) proposer: Proposer,
    pub(crate) peers: Peers,
    pub(crate) machines: PeerMachines,
    pub(crate) tasks: TaskTracker,
    pub(crate) stopping: CancellationToken,
    /// The next consumer id's low bits ([`Consuming::next_consumer_id`]).
    pub(crate) consumer_seq: Arc<AtomicU64>,
}

impl Consuming {
    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn clock(&self) -> Clock {
        self.clock
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    /// Which queue machine version each peer runs, as its watch says.
    pub fn peer_machines(&self) -> &PeerMachines {
        &self.machines
    }

    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Cancelled when the node begins to shut down.
    pub fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }

    /// A consumer id unique within any queue: node id in the top byte.
    pub fn next_consumer_id(&self) -> u64 {
        (self.id << 56) | (self.consumer_seq.fetch_add(1, Ordering::Relaxed) & ((1 << 56) - 1))
    }
}
