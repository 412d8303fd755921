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
    id: NodeId,
    clock: Clock,
    registry: Arc<Registry>,
    proposer: Proposer,
    peers: Peers,
    machines: PeerMachines,
    tasks: TaskTracker,
    stopping: CancellationToken,
    consumer_seq: Arc<AtomicU64>,
}

/// The node's parts a [`Consuming`] is made of.
pub struct ConsumingParts {
    pub clock: Clock,
    pub registry: Arc<Registry>,
    pub proposer: Proposer,
    pub peers: Peers,
    pub machines: PeerMachines,
    pub tasks: TaskTracker,
    pub stopping: CancellationToken,
}

impl Consuming {
    /// Consumer ids start at the start time in ms times 1000, so that a restarted node does
    /// not hand out the ids of its previous run.
    pub fn new(id: NodeId, parts: ConsumingParts) -> Consuming {
        let ConsumingParts {
            clock,
            registry,
            proposer,
            peers,
            machines,
            tasks,
            stopping,
        } = parts;
        Consuming {
            id,
            clock,
            registry,
            proposer,
            peers,
            machines,
            tasks,
            stopping,
            consumer_seq: Arc::new(AtomicU64::new(clock.now_ms() * 1000)),
        }
    }

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
