//! The command line: its options, and the named scenarios `--scenario` picks.

use std::path::PathBuf;

use clap::Parser;

use crate::workload::Protocol;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Chaos test of a three-node quorumq cluster in network namespaces (needs root)"
)]
pub struct Args {
    /// Seed of the fault schedule (printed first; the same seed gives the same schedule).
    /// Default: derived from the clock.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seconds of workload under faults (healing, draining and checking come after).
    #[arg(long, default_value_t = 120)]
    pub duration: u64,
    /// Comma-separated faults: partition-halves, isolate-leader, majorities-ring, bridge,
    /// kill-leader, kill-random, pause, netem, wipe-rejoin, disk-full, rolling-restart,
    /// membership; or `all`.
    #[arg(long, default_value = "all")]
    pub nemesis: String,
    /// A named scenario (sets seed, duration and nemesis): see `--list-scenarios`.
    #[arg(long)]
    pub scenario: Option<String>,
    /// The workload's client protocol: the gRPC API, or AMQP 0-9-1 (lapin, reconnecting and
    /// republishing as RabbitMQ's clients do). Default: grpc, or the scenario's.
    #[arg(long, value_enum)]
    pub protocol: Option<Protocol>,
    /// Print the named scenarios and exit.
    #[arg(long)]
    pub list_scenarios: bool,
    /// Run every selected nemesis alone (`--duration` each), then all of them together, and
    /// print one table (also matrix.md and matrix.json in the output directory).
    #[arg(long)]
    pub matrix: bool,
    /// Total publish rate of the workload, messages per second (over three publishers).
    #[arg(long, default_value_t = 150.0)]
    pub rate: f64,
    /// Where the report, history, timeline and node logs go.
    /// Default: .qq-chaos/<scenario or seed> under the current directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The qq-node binary. Default: $QQ_NODE_BIN, else $CARGO_TARGET_DIR/debug/qq-node
    /// (CARGO_TARGET_DIR defaulting to ~/.cache/quorumq/target).
    #[arg(long)]
    pub node_bin: Option<PathBuf>,
    /// Start the nodes with this qq-node binary instead (e.g. the previous release's, from
    /// `make previous-release`): each runs `--node-bin` from its first graceful stop on, so
    /// the rolling-restart nemesis upgrades the cluster one node at a time under the load.
    #[arg(long)]
    pub start_bin: Option<PathBuf>,
    /// The namespace script. Default: cluster/netns.sh under the current directory.
    #[arg(long)]
    pub netns_script: Option<PathBuf>,
    /// Idle queues declared besides the workload's (their groups sleep while the faults run);
    /// after healing each must take a publish and give it back.
    #[arg(long, default_value_t = 0)]
    pub idle_queues: usize,
    /// When a run fails, keep its cluster up this many seconds before tearing it down, to look
    /// at it (`qqctl --node 10.78.0.N:7101 --user '' ...`: no credentials, acting as guest).
    #[arg(long, default_value_t = 0)]
    pub hold_on_failure: u64,
}

/// Named scenarios: the short run of `make test`, and every anomaly chaos runs found, kept as a
/// regression (see docs/chaos.md).
pub const SCENARIOS: &[(&str, u64, u64, &str, Protocol, &str)] = &[
    (
        "short",
        1,
        60,
        "partition-halves,kill-leader",
        Protocol::Grpc,
        "the run of `make test`: partitions plus a leader kill, one minute",
    ),
    (
        "short-amqp",
        1,
        60,
        "partition-halves,kill-leader",
        Protocol::Amqp,
        "`short` over AMQP 0-9-1 (reconnects, republishes, resubscribes), also in `make test`",
    ),
    (
        "upgrade",
        7,
        90,
        "rolling-restart",
        Protocol::Grpc,
        "a rolling upgrade under load: with --start-bin (the previous release), each rolling \
         restart moves a node to --node-bin; also in `make test` (`make chaos-upgrade`)",
    ),
    (
        "partition-heal",
        42,
        60,
        "partition-halves",
        Protocol::Grpc,
        "found: a node back from a partition deposed every leader (fixed by Pre-Vote; the \
         term check fails without it: cut-off node at term 7-11, the others at 1-2), and \
         forwarded proposals starved replication between the majority's nodes (a queue confirmed nothing for 14 s; fixed by a separate Raft \
         connection, unit test in qq-raft)",
    ),
];
