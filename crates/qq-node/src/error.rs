//! The node's typed errors: why a command did not reach, or did not come back from, its group.
//!
//! Deterministic refusals (a bad argument, a full queue) are not errors here: they are applied
//! results, returned by the state machines as replies. What is left is what a client may retry
//! (no quorum, shutting down) and what is a bug or corruption (a payload that does not decode).
//! The API maps each kind to one gRPC status in one place ([`From<NodeError> for Status`]).

use tonic::Status;

#[derive(Debug, Clone, thiserror::Error)]
pub enum NodeError {
    /// No leader or no quorum for a group right now; the message says which and why. Safe to
    /// retry.
    #[error("{0}")]
    Unavailable(String),
    /// The node is stopping: the request was not carried out here.
    #[error("node is shutting down; retry on another node")]
    ShuttingDown,
    /// A payload of our own did not encode or decode: a bug or corrupt data.
    #[error("{0}")]
    Internal(String),
    /// A command outside the bounds every command must respect; not proposed.
    #[error("{0}")]
    InvalidArgument(String),
}

impl From<NodeError> for Status {
    fn from(e: NodeError) -> Status {
        match e {
            NodeError::Unavailable(m) => Status::unavailable(m),
            NodeError::ShuttingDown => Status::unavailable(e.to_string()),
            NodeError::Internal(m) => Status::internal(m),
            NodeError::InvalidArgument(m) => Status::invalid_argument(m),
        }
    }
}
