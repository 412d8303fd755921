//! The openraft type configuration shared by every group on a node (metadata and queues).
//!
//! Log payloads are opaque bytes at this layer: the node encodes metadata and queue commands
//! with postcard before proposing and decodes them in the state machines. That keeps the
//! storage and network layers independent of the command types.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A Raft group: 0 is the metadata group, every queue has its own id.
pub type GroupId = u64;

/// The metadata group, replicated on every node.
pub const META_GROUP: GroupId = 0;

/// An encoded command proposed to a group.
///
/// `Bytes`, so that the entries handed out again from a group's in-memory tail (to each
/// follower's replication and to apply) share one buffer instead of copying it: with
/// `Vec<u8>` every such read copied the whole batch. Its encoding is postcard's byte string,
/// as `serde_bytes` wrote it for `Vec<u8>` (`request_encoding_is_unchanged`).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub payload: Bytes,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The form `Request` had before its payload became `Bytes`.
    #[derive(Serialize, Deserialize)]
    struct RequestAsVec {
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
    }

    #[test]
    fn request_encoding_is_unchanged() {
        for len in [0usize, 1, 127, 128, 3000] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let old = postcard::to_stdvec(&RequestAsVec {
                payload: payload.clone(),
            })
            .unwrap();
            let new = postcard::to_stdvec(&Request {
                payload: payload.clone().into(),
            })
            .unwrap();
            assert_eq!(new, old, "{len} bytes");
            let back: Request = postcard::from_bytes(&old).unwrap();
            assert_eq!(back.payload, payload);
        }
    }
}
