//! The parts of the chaos runner that do not care where the nodes run: the workload of
//! publishers and consumers ([`workload`]), the history checker ([`checker`]), the probes of a
//! running cluster ([`probes`], [`replicas`]), and the workload's life in a run ([`session`]).
//!
//! Two runners share them: `qq-chaos` (this crate's binary: real `qq-node` processes in network
//! namespaces, faults from iptables, signals and tc) and `qq-sim` (`crates/qq-sim`: nodes in one
//! process on a fault-injecting in-memory network).

pub mod checker;
pub mod idle;
pub mod membership;
pub mod probes;
pub mod replicas;
pub mod session;
pub mod workload;
