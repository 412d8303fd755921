//! Node to node: [`service`] serves the internal gRPC service (Raft traffic, forwarded
//! proposals, relayed consumers, liveness watch); [`liveness`] watches every peer and hands
//! over the groups of a peer whose process is gone, and [`machines`] keeps which queue
//! machine version each peer runs. The client side of Raft traffic is
//! `qq_raft::network`; proposals are forwarded by [`crate::proposer`].

pub mod incarnation;
pub mod liveness;
pub mod machines;
pub mod peering;
pub mod service;
