//! The work in flight the actor polls for its sub-machines: futures only, their machines
//! know what runs.

use std::future::Future;
use std::pin::Pin;

use futures::stream::FuturesUnordered;
use qq_core::MessageId;
use tokio::time::Instant;

use crate::deadletter::{PreparedRound, Round};
use crate::moves::MoveOutcome;

/// A relay round being committed.
pub(super) type Commit = Pin<Box<dyn Future<Output = Round> + Send>>;
/// A preparation's epoch and its round (Err: the preparation failed; its dead letters).
pub(super) type Prepare =
    Pin<Box<dyn Future<Output = (u64, Result<PreparedRound, Vec<MessageId>>)> + Send>>;
/// A settle of transferred dead letters; it answers their ids.
pub(super) type Settle = Pin<Box<dyn Future<Output = Vec<MessageId>> + Send>>;
/// A move round and when it began.
pub(super) type MoveRound = Pin<Box<dyn Future<Output = (Instant, MoveOutcome)> + Send>>;
/// The republish of an at-most-once dead letter.
pub(super) type Publish = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// The futures the actor polls for its machines.
#[derive(Default)]
pub(super) struct InFlight {
    pub(super) preparing: Option<Prepare>,
    pub(super) committing: Option<Commit>,
    pub(super) settling: FuturesUnordered<Settle>,
    pub(super) moving: Option<MoveRound>,
    /// The at-most-once dead letter being republished (one at a time: the inbox waits).
    pub(super) publish: Option<Publish>,
}
