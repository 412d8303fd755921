//! Deterministic, client-visible errors of the pure core.
//!
//! A [`MetaError`] is an *applied result*, not a failure of the replica: a bad argument, a
//! missing exchange or a refused permission changes nothing, is replicated like any other reply
//! and is returned to the client. Its [`ErrorKind`] maps one-to-one to a gRPC status, so the node
//! translates it without looking at the message; the message itself names what was wrong in
//! RabbitMQ's words, e.g. `x-message-ttl: expected a non-negative long, got string`.
//!
//! The type lives in its own module, below [`crate::meta`], [`crate::policy`] and
//! [`crate::route`], so that all three can return it while imports run one way
//! (meta → policy/route → error/types). [`crate::meta`] re-exports both types, the path
//! downstream crates use.
//!
//! What it leaves out: non-deterministic errors (IO, corrupt data). Those never reach the pure
//! core; the storage and node crates stop the group loudly instead.

use serde::{Deserialize, Serialize};

/// The kind of a failed command; maps one-to-one to a gRPC status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    InvalidArgument,
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    AlreadyExists,
    /// A limit or bound was reached (vhost and user limits).
    ResourceExhausted,
}

/// A deterministic, client-visible error: applied, not fatal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct MetaError {
    pub kind: ErrorKind,
    pub message: String,
}

impl MetaError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        MetaError {
            kind,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn failed_precondition(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::FailedPrecondition, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unauthenticated, message)
    }
    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::AlreadyExists, message)
    }
    pub fn resource_exhausted(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::ResourceExhausted, message)
    }
}
