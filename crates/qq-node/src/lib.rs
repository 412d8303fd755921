//! qq-node: a quorumq cluster node.
//!
//! Reading order: [`config`] (what a node needs) → [`node`] (groups, proposing, forwarding) →
//! [`meta_sm`] and [`queue_sm`] (state-machine shells around the pure core) → [`leader`]
//! (leader-only timers) → [`liveness`] (fast
//! handover when a peer's process dies) → [`broker`] (the client API) → [`consume`] and [`relay`] (consumer
//! sessions on the leader, relayed from other nodes) → [`internal`] (node-to-node service) →
//! [`server`] (wiring and graceful shutdown).

pub mod broker;
pub mod config;
pub mod consume;
pub mod convert;
pub mod deadletter;
pub mod info;
pub mod internal;
pub mod leader;
pub mod liveness;
pub mod meta_sm;
pub mod node;
pub mod queue_sm;
pub mod relay;
pub mod server;
