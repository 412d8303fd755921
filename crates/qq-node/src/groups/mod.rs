//! The Raft groups a node hosts.
//!
//! - [`shell`]: the openraft state-machine shell shared by every group.
//! - [`meta_sm`]: the metadata machine (group 0, on every node).
//! - [`queue_sm`]: a queue's machine and its message bodies.
//! - [`registry`]: which groups run here, their leaders and local state.
//! - [`residency`]: a queue replica is Awake, Asleep (no timers, no heartbeats) or Unloaded
//!   (no Raft instance); one pure transition function decides.
//!
//! Nothing here proposes or talks to peers: that is [`crate::proposer`]. Groups are started and
//! stopped by the supervisor in [`crate::node`]; leader-only work is [`crate::leader`].

pub mod meta_sm;
pub mod queue_sm;
pub mod registry;
pub mod residency;
pub mod shell;

#[cfg(test)]
mod untrusted_entries;
