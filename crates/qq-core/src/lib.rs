//! qq-core: the pure core of quorumq.
//!
//! No IO, no clock, no randomness, no async: every function here is deterministic, so the
//! same log applied on every replica gives the same state. Time enters only as `now_ms`
//! fields of commands stamped by the proposing leader.
//!
//! - [`types`]: ids, values, message properties, effective queue configuration.
//! - [`queue`]: the queue state machine (enqueue, checkout, settle, return, discard, expire...).
//! - [`meta`]: the metadata state machine (vhosts, users, exchanges, queues, bindings, policies).
//! - [`error`]: [`MetaError`](error::MetaError) and its [`ErrorKind`](error::ErrorKind), the
//!   deterministic client-visible errors (re-exported from [`meta`]).
//! - [`names`]: the bound and characters of names, and how client input is shown in a message.
//! - [`route`]: exchange routing (direct, fanout, topic, headers, default; CC/BCC).
//! - [`policy`]: queue-argument validation and argument/policy precedence.
//! - [`deadletter`]: the `x-death` history and dead-letter cycle detection.
//! - [`dedup`]: the time-based idempotency windows of a queue.

pub mod deadletter;
pub mod dedup;
pub mod error;
pub mod limits;
pub mod meta;
pub mod names;
pub mod policy;
pub mod queue;
pub mod route;
pub mod types;

pub use types::*;
