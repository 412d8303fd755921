//! The openraft type configuration shared by every group on a node (metadata and queues).
//!
//! Log payloads are opaque bytes at this layer: the node encodes metadata and queue commands
//! with postcard before proposing and decodes them in the state machines. That keeps the
//! storage and network layers independent of the command types.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A Raft group: 0 is the metadata group, every queue has its own id.
pub type GroupId = u64;

/// The metadata group, replicated on every node.
pub const META_GROUP: GroupId = 0;

/// An encoded command proposed to a group.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Request({} bytes)", self.payload.len())
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// An encoded reply from a state machine's apply.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}

impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Response({} bytes)", self.payload.len())
    }
}

openraft::declare_raft_types!(
    /// quorumq's Raft types: u64 node ids, `BasicNode` addresses, opaque payloads.
    pub TypeConfig:
        D = Request,
        R = Response,
);
