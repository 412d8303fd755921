//! The nemesis: which faults exist, the seeded schedule of when each one strikes, and how a
//! fault is applied to the hosts and healed.
//!
//! The schedule is a pure function of the seed, the selected kinds and the run's length
//! ([`schedule`]), so the same seed gives the same faults at the same offsets. What a fault hits
//! can depend on the cluster at that moment (the current leader of the chosen queue); the
//! report records the node it actually hit.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::hosts::Hosts;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A random node alone on one side, the other two on the other.
    PartitionHalves,
    /// The leader of the chosen queue cut off from both other nodes.
    IsolateLeader,
    /// Each node hears exactly one other node: every node sees a different majority.
    MajoritiesRing,
    /// Two nodes cut apart; the third (the bridge) sees both.
    Bridge,
    /// kill -9 of the chosen queue's leader; started again when the window ends.
    KillLeader,
    /// kill -9 of a random node; started again when the window ends.
    KillRandom,
    /// SIGSTOP of the chosen queue's leader for the window (long enough to lose leadership).
    Pause,
    /// Delay (50 ms ± 25) and 10 % packet loss on everything one node sends.
    Netem,
    /// kill -9 of a random node and its data directory deleted; started again, empty, when
    /// the window ends (the re-seed procedure): it must catch up from the others.
    WipeRejoin,
    /// A random node's data filesystem (a small tmpfs) filled up with a ballast file: the node
    /// raises its disk alarm and refuses publishes, and stops fail-stop (exit 74) when a write
    /// fails; the ballast is removed and the node started again when the window ends.
    DiskFull,
    /// An operator's membership change: a spare node (a new id each time, on a fourth host,
    /// empty) is started, joins the cluster and is grown onto every queue; when the window
    /// ends it is shrunk off again (or not: forget deletes its replicas), stopped and
    /// forgotten (see `crate::membership`).
    Membership,
}

pub const ALL: [Kind; 11] = [
    Kind::PartitionHalves,
    Kind::IsolateLeader,
    Kind::MajoritiesRing,
    Kind::Bridge,
    Kind::KillLeader,
    Kind::KillRandom,
    Kind::Pause,
    Kind::Netem,
    Kind::WipeRejoin,
    Kind::DiskFull,
    Kind::Membership,
];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::PartitionHalves => "partition-halves",
            Kind::IsolateLeader => "isolate-leader",
            Kind::MajoritiesRing => "majorities-ring",
            Kind::Bridge => "bridge",
            Kind::KillLeader => "kill-leader",
            Kind::KillRandom => "kill-random",
            Kind::Pause => "pause",
            Kind::Netem => "netem",
            Kind::WipeRejoin => "wipe-rejoin",
            Kind::DiskFull => "disk-full",
            Kind::Membership => "membership",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Kind, String> {
        ALL.iter().copied().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<&str> = ALL.iter().map(|k| k.name()).collect();
            format!("unknown nemesis '{s}'; one of: {}, all", names.join(", "))
        })
    }
}

/// Parses `partition-halves,kill-leader` or `all`.
pub fn parse_kinds(list: &str) -> Result<Vec<Kind>, String> {
    if list.trim() == "all" {
        return Ok(ALL.to_vec());
    }
    let kinds = list
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<Vec<Kind>, String>>()?;
    if kinds.is_empty() {
        return Err("no nemesis given".into());
    }
    Ok(kinds)
}

/// One planned fault: what, when (offset from the start of the workload), for how long, and
/// the seeded choices it needs (a node number 1..=3 and a queue index).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Planned {
    pub kind: Kind,
    pub at: Duration,
    pub length: Duration,
    pub node_pick: u64,
    pub queue_pick: usize,
}

/// The fault schedule: a quiet warm-up, then faults of the selected kinds (cycled in a seeded
/// order so that every selected kind strikes when the run is long enough) separated by quiet
/// gaps; the last fault ends at least `cool_down` before the end.
pub fn schedule(
    seed: u64,
    kinds: &[Kind],
    run: Duration,
    nodes: u64,
    queues: usize,
) -> Vec<Planned> {
    const WARM_UP: Duration = Duration::from_secs(8);
    const COOL_DOWN: Duration = Duration::from_secs(6);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut plan = Vec::new();
    if kinds.is_empty() {
        return plan;
    }
    let mut at = WARM_UP;
    let mut order: Vec<Kind> = Vec::new();
    loop {
        if order.is_empty() {
            order = kinds.to_vec();
            // Fisher-Yates with the seeded generator.
            for i in (1..order.len()).rev() {
                let j = rng.random_range(0..=i);
                order.swap(i, j);
            }
        }
        let length = Duration::from_millis(rng.random_range(6_000..=12_000));
        if at + length + COOL_DOWN > run {
            break;
        }
        let kind = order.pop().expect("refilled above");
        plan.push(Planned {
            kind,
            at,
            length,
            node_pick: rng.random_range(1..=nodes),
            queue_pick: rng.random_range(0..queues),
        });
        at += length + Duration::from_millis(rng.random_range(5_000..=9_000));
    }
    plan
}

/// What a fault did, for healing it and for the report.
#[derive(Clone, Debug, Serialize)]
pub struct Applied {
    pub kind: Kind,
    /// The node(s) it hit, in words ("node 2 alone", "1 | 2,3"...).
    pub target: String,
    pub killed: Option<u64>,
    pub paused: Option<u64>,
    /// The node cut off alone from the other two (partition-halves, isolate-leader).
    pub alone: Option<u64>,
    /// The node whose disk is full (it may stop with a storage fault meanwhile).
    pub disk_full: Option<u64>,
    /// The spare node started by the membership nemesis, and whether it is shrunk off its
    /// queues before it is stopped (else forget deletes its replicas).
    pub spare: Option<u64>,
    pub shrink_first: bool,
}

/// Applies `fault` now. `leader` is the current leader of the queue the fault chose (if known).
pub fn apply(hosts: &mut Hosts, fault: &Planned, leader: Option<u64>) -> anyhow::Result<Applied> {
    let ids = hosts.ids().to_vec();
    let pick = fault.node_pick;
    let others = |n: u64| ids.iter().copied().filter(move |&i| i != n);
    let target_leader = leader.unwrap_or(pick);
    let mut applied = Applied {
        kind: fault.kind,
        target: String::new(),
        killed: None,
        paused: None,
        alone: None,
        disk_full: None,
        spare: None,
        shrink_first: false,
    };
    match fault.kind {
        Kind::PartitionHalves | Kind::IsolateLeader => {
            let alone = if fault.kind == Kind::PartitionHalves {
                pick
            } else {
                target_leader
            };
            for other in others(alone) {
                hosts.cut(alone, other)?;
            }
            applied.alone = Some(alone);
            let rest: Vec<String> = others(alone).map(|i| i.to_string()).collect();
            applied.target = format!("{alone} | {}", rest.join(","));
        }
        Kind::MajoritiesRing => {
            // Node i hears only its successor (or, by the seed, its predecessor) on the ring:
            // each sees itself and one other, a majority of three, and no two nodes see the
            // same majority.
            let n = ids.len() as u64;
            for &i in &ids {
                let hears = if pick % 2 == 1 {
                    i % n + 1
                } else {
                    (i + n - 2) % n + 1
                };
                for other in others(i).filter(|&o| o != hears) {
                    hosts.drop_from(i, other)?;
                }
            }
            applied.target = "ring".into();
        }
        Kind::Bridge => {
            let bridge = pick;
            let sides: Vec<u64> = others(bridge).collect();
            for (i, &a) in sides.iter().enumerate() {
                for &b in &sides[i + 1..] {
                    hosts.cut(a, b)?;
                }
            }
            applied.target = format!("bridge {bridge}");
        }
        Kind::KillLeader | Kind::KillRandom => {
            let victim = if fault.kind == Kind::KillLeader {
                target_leader
            } else {
                pick
            };
            hosts.kill9(victim);
            applied.killed = Some(victim);
            applied.target = format!("node {victim}");
        }
        Kind::DiskFull => {
            hosts.fill_disk(pick)?;
            applied.disk_full = Some(pick);
            applied.target = format!("node {pick} disk full");
        }
        Kind::WipeRejoin => {
            hosts.kill9(pick);
            hosts.wipe(pick)?;
            applied.killed = Some(pick);
            applied.target = format!("node {pick} wiped");
        }
        Kind::Pause => {
            hosts.pause(target_leader)?;
            applied.paused = Some(target_leader);
            applied.target = format!("node {target_leader}");
        }
        Kind::Netem => {
            hosts.netem(pick, 50, 10)?;
            applied.target = format!("node {pick}");
        }
        Kind::Membership => {
            // Only started here: joining, growing and retiring it are RPCs, which the runner
            // carries out (`crate::membership`); the seed decides how it leaves.
            let id = hosts.start_spare()?;
            applied.spare = Some(id);
            applied.shrink_first = pick % 2 == 1;
            applied.target = format!("node {id}");
        }
    }
    Ok(applied)
}

/// Undoes `applied`: network faults removed, a paused node resumed, a killed node started.
/// (A spare node of the membership nemesis is retired by the runner before this.)
pub fn heal(hosts: &mut Hosts, applied: &Applied) -> anyhow::Result<()> {
    hosts.heal_network()?;
    if let Some(id) = applied.paused {
        hosts.resume(id)?;
    }
    if let Some(id) = applied.killed {
        hosts.start(id)?;
    }
    if let Some(id) = applied.disk_full {
        hosts.free_disk(id)?;
        // Started again if it stopped on the full disk (a no-op if it still runs).
        hosts.start(id)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_schedule_and_every_kind_strikes() {
        let run = Duration::from_secs(300);
        let a = schedule(7, &ALL, run, 3, 4);
        let b = schedule(7, &ALL, run, 3, 4);
        assert_eq!(a, b);
        assert_ne!(a, schedule(8, &ALL, run, 3, 4));
        for kind in ALL {
            assert!(a.iter().any(|p| p.kind == kind), "{kind} never scheduled");
        }
        for w in a.windows(2) {
            assert!(w[0].at + w[0].length < w[1].at, "faults overlap: {w:?}");
        }
        let last = a.last().unwrap();
        assert!(last.at + last.length <= run);
    }

    #[test]
    fn names_round_trip() {
        for kind in ALL {
            assert_eq!(kind.name().parse::<Kind>(), Ok(kind));
        }
        assert_eq!(parse_kinds("all").unwrap().len(), ALL.len());
        // netem removed on a kernel without it can leave nothing: a run without faults.
        assert!(schedule(1, &[], Duration::from_secs(300), 3, 4).is_empty());
        assert!(parse_kinds("partition-halves,nope").is_err());
    }
}
