//! # qq-sim: the cluster in one process, under a seeded plan of faults
//!
//! Three (or five) real quorumq nodes (`qq_node::server::run`, each on its own thread and
//! runtime) whose node-to-node connections all run through one simulated network ([`net`]),
//! the chaos runner's workload and checks (`qq_chaos`), and a plan of faults drawn from a seed
//! ([`schedule`]): partitions (whole, one-way, bridges), delay, jitter and loss on links,
//! connection resets, crashes and restarts, pauses, and clock skew between the nodes.
//! [`run`] carries out one seed; the binary runs many and reports seeds per second.
//!
//! What the seed fixes, and what it does not: the plan (every fault, its time, target and
//! length, the skews and the network's weather) is a pure function of the seed, written as the
//! first line of the trace; replaying a seed replays the same plan. The interleaving inside the
//! cluster is not: the nodes run on real threads with the real clock, openraft draws its
//! election timeouts from the thread's random generator, and RocksDB has threads of its own.
//! So a failing seed replays the same faults, not the same schedule of every task
//! (docs/simulation.md). [`replay`] runs the nodes on one schedule instead ([`lockstep`]: their
//! runtimes stepped on one thread and one virtual clock; [`entropy`]: seeded randomness;
//! [`wall_clock`]: the world's time for libraries that read the system's), under
//! a seed's plan of faults with a narrower workload, and replays byte for byte.

#[cfg(test)]
mod child_process;
pub mod churn;
pub mod entropy;
pub mod faults;
pub mod host;
pub mod lockstep;
pub mod lockstep_cli;
pub mod net;
pub mod operator;
pub mod replay;
pub mod routes;
pub mod run;
pub mod schedule;
pub mod steps;
pub mod wall_clock;
pub mod wipe;
