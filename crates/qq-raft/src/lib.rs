//! qq-raft: openraft glue for quorumq.
//!
//! - [`types`]: the `TypeConfig` every group uses (opaque byte payloads).
//! - [`encoding`]: postcard into a buffer of the exact size.
//! - [`store`]: one RocksDB per node shared by all groups, with a single fsync thread
//!   (group commit across groups).
//! - [`log_record`]: one log entry as stored, with its record format.
//! - [`log_store`]: openraft's `RaftLogStorage` for one group on top of [`store`].
//! - [`log_tail`]: the newest entries of a group's log, kept in memory for the reads that
//!   follow an append.
//! - [`protocol`]: the node-to-node protocol's version, stamped on and checked for every
//!   request between nodes.
//! - [`snapshot`]: snapshot files, streamed to disk, read back and sent in chunks.
//! - [`transport`]: the seam every node-to-node connection goes through (TCP in production,
//!   in-memory pipes in tests), handed in at start.
//! - [`clock`]: the node's clock, handed in at start; qq-node re-exports it.

pub mod clock;
pub mod encoding;
pub mod incarnation;
pub mod layout;
pub mod lockstep;
pub mod log_record;
pub mod log_store;
pub mod log_tail;
pub mod mux;
pub mod network;
pub mod protocol;
pub mod snapshot;
pub mod store;
pub mod transport;
pub mod types;

pub use types::{GroupId, META_GROUP, Request, Response, TypeConfig};
