//! qq-node: a quorumq cluster node.
//!
//! The layers, each importing only the ones below it (docs/architecture.md draws them):
//!
//! - [`server`]: wiring and shutdown. Above everything.
//! - [`observe`]: gRPC health and reflection, `GET /metrics` and `GET /healthz` (reads the node,
//!   never changes it).
//! - [`amqp`]: the AMQP 0-9-1 listener, a second adapter over the same handlers as [`api`].
//! - [`api`]: the client gRPC service as thin adapters (auth, publish, consume, admin,
//!   status). [`peer`]: the node-to-node service and liveness.
//! - [`consume`]: consumer sessions on the queue's leader, and their relay from other nodes.
//! - [`membership`]: queue members added, deleted, leaders moved (through each queue's Raft
//!   group first, then recorded in the metadata); QuorumCritical.
//! - [`node`]: what a node owns (private), and the supervisor that starts and stops queue
//!   groups as the metadata says.
//! - [`leader`]: one actor per queue this node leads: all leader-only work.
//! - [`moves`]: one round of a queue's move task (redrive), committed through [`enqueue`].
//! - [`deadletter`]: republishing dead letters, through [`enqueue`]: committing routed
//!   messages to every target queue (shared by publish and dead lettering).
//! - [`definitions`]: the topology as one JSON document (export, checked import).
//! - [`proposer`]: the one path to a group's leader, local or forwarded.
//! - [`sleep_wake`]: the SLEEP and WAKE messages that put an idle queue group to sleep and
//!   wake its leader.
//! - [`meta_view`]: the read-only, versioned view of the metadata.
//! - [`groups`]: the Raft groups hosted here: state-machine shell, metadata and queue machines,
//!   registry, and whether each replica sleeps.
//! - [`alarms`]: memory and disk alarms that refuse publishes.
//! - [`metrics`]: event counters and the commit latency histogram (a leaf the layers update).
//! - [`certs`]: the `qq-node certs` subcommand (cluster CA and node certificates).
//! - [`config`], [`error`], [`codec`], [`clock`]: leaves.

/// This binary's release, as `qq-node --version` prints it and `ClusterStatus` reports it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub mod alarms;
pub mod amqp;
pub mod api;
pub mod certs;
pub mod clock;
pub mod codec;
pub mod config;
pub mod consume;
pub mod deadletter;
pub mod definitions;
pub mod enqueue;
pub mod error;
pub mod groups;
pub mod leader;
pub mod membership;
pub mod meta_view;
pub mod metrics;
pub mod moves;
pub mod node;
pub mod observe;
pub mod peer;
pub mod proposer;
pub mod server;
pub mod sleep_wake;
