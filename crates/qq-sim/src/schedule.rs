//! A run's plan, made from its seed alone: the network's background weather, each node's clock
//! skew, and the faults with their times, targets and lengths. Pure: the same seed and shape
//! give the same plan, byte for byte in its JSON form (the trace's first lines), whatever
//! happens in the run.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Quiet time before the first fault and after the last.
pub const WARM_UP: Duration = Duration::from_secs(4);
/// Most faults under way at once.
pub const MAX_CONCURRENT: usize = 2;
/// Time between the starts of two faults: from ..= to, in ms.
pub const START_GAP_MS: (u64, u64) = (1_000, 4_000);
/// Length of a fault: from ..= to, in ms.
pub const LENGTH_MS: (u64, u64) = (1_500, 6_000);
/// Largest clock skew between nodes (ms): well within what the leases assume (they read only
/// the monotonic clock; wall time only stamps commands).
pub const MAX_SKEW_MS: i64 = 1_500;

/// Whom a fault strikes: a node by id, or whoever leads one of the workload's queues when it
/// strikes (the trace records which node that was).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    Node(u64),
    LeaderOf(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Fault {
    /// The target cannot reach anyone, nor anyone it.
    Isolate { target: Target },
    /// The target's messages reach nobody; it still hears the others.
    MuteOutgoing { target: Target },
    /// The target hears nobody; its messages still arrive.
    DeafIncoming { target: Target },
    /// Two nodes cannot reach each other; a third still reaches both (a bridge).
    Bridge { a: u64, b: u64 },
    /// Every link of the target is slow and uneven.
    Delay {
        target: Target,
        delay_ms: u64,
        jitter_ms: u64,
    },
    /// Every link of the target loses chunks (each arrives a retransmission late).
    Loss { target: Target, loss_pct: u64 },
    /// Every connection of the target is reset, once, at the start of the window.
    Reset { target: Target },
    /// The target is killed; it starts again from its disk when the window ends.
    Crash { target: Target },
    /// The target is frozen (as by SIGSTOP) for the window.
    Pause { target: Target },
    /// The target's wall clock jumps by `jump_ms` (forward or back) for the window, then back:
    /// what an NTP step does. Its monotonic clock (timers, leases) does not move.
    ClockJump { target: Target, jump_ms: i64 },
}

/// The faults a plan draws from.
pub const KINDS: [&str; 10] = [
    "isolate",
    "mute-outgoing",
    "deaf-incoming",
    "bridge",
    "delay",
    "loss",
    "reset",
    "crash",
    "pause",
    "clock-jump",
];

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Planned {
    pub at_ms: u64,
    pub length_ms: u64,
    pub fault: Fault,
}

/// Background latency on every link for the whole run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Weather {
    pub delay_ms: u64,
    pub jitter_ms: u64,
}

/// An operator's membership change under the faults: a spare node (id `nodes + 1`, empty)
/// starts at `at_ms`, joins and is grown onto every queue; at `at_ms + length_ms` it is shrunk
/// off (or not: forget deletes its replicas), stopped and forgotten (qq-chaos's membership
/// strike, steps and checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Membership {
    pub at_ms: u64,
    pub length_ms: u64,
    pub shrink_first: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub seed: u64,
    pub nodes: u64,
    pub run_ms: u64,
    pub weather: Weather,
    /// Per node (index = id - 1), ms its wall clock is ahead (negative: behind).
    pub skew_ms: Vec<i64>,
    /// Queues declared beside the workload and never touched until the end: their groups
    /// sleep and unload while the faults strike, and must serve after healing.
    pub idle_queues: usize,
    /// The nodes' `snapshot_after_entries`: small, so that snapshots are cut and installed
    /// (on a node that missed entries the leader no longer has) during the run.
    pub snapshot_after_entries: u64,
    /// Half the seeds change the membership once.
    pub membership: Option<Membership>,
    pub faults: Vec<Planned>,
    /// A third of the seeds wipe this node's disk once the faults are healed (drawn from a
    /// stream of its own, so that the rest of a seed's plan is what it was before wipes).
    pub wipe: Option<u64>,
    /// The route of the topology churn's first cycle (`routes::Route::of_cycle`); the cycles
    /// after it take the next routes in turn. Drawn from a stream of its own (the rest of the
    /// plan is unchanged), so that seeds that get through two cycles still cover every route
    /// between them.
    pub first_route: u64,
}

/// The plan of seed `seed` for `nodes` nodes (ids 1..=nodes) and a workload of `run`, over
/// `queues` queues.
pub fn plan(seed: u64, nodes: u64, run: Duration, queues: usize) -> Plan {
    let mut rng = StdRng::seed_from_u64(seed);
    let weather = Weather {
        delay_ms: rng.random_range(0..=3),
        jitter_ms: rng.random_range(0..=3),
    };
    let skew_ms = (0..nodes)
        .map(|_| rng.random_range(-MAX_SKEW_MS..=MAX_SKEW_MS))
        .collect();
    let idle_queues = rng.random_range(5..=40);
    let snapshot_after_entries = rng.random_range(100..=1_000);
    let run_ms = run.as_millis() as u64;
    let membership = rng.random_bool(0.5).then(|| Membership {
        at_ms: rng.random_range(
            WARM_UP.as_millis() as u64..=(run_ms / 3).max(WARM_UP.as_millis() as u64),
        ),
        length_ms: run_ms / 3,
        shrink_first: rng.random_bool(0.5),
    });
    let mut faults = Vec::new();
    let mut at = WARM_UP.as_millis() as u64;
    // When each fault under way ends.
    let mut ends: Vec<u64> = Vec::new();
    loop {
        ends.retain(|end| *end > at);
        if ends.len() >= MAX_CONCURRENT {
            at = *ends.iter().min().expect("not empty");
            continue;
        }
        let length = rng.random_range(LENGTH_MS.0..=LENGTH_MS.1);
        if at + length + WARM_UP.as_millis() as u64 > run_ms {
            break;
        }
        faults.push(Planned {
            at_ms: at,
            length_ms: length,
            fault: fault(&mut rng, nodes, queues),
        });
        ends.push(at + length);
        at += rng.random_range(START_GAP_MS.0..=START_GAP_MS.1);
    }
    Plan {
        seed,
        nodes,
        run_ms,
        weather,
        skew_ms,
        idle_queues,
        snapshot_after_entries,
        membership,
        faults,
        wipe: wipe(seed, nodes),
        first_route: first_route(seed),
    }
}

/// The route of seed `seed`'s first churn cycle.
fn first_route(seed: u64) -> u64 {
    StdRng::seed_from_u64(seed ^ 0x524f_5554).random_range(0..4)
}

/// The node seed `seed` wipes after the faults, if any.
fn wipe(seed: u64, nodes: u64) -> Option<u64> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5749_5045);
    rng.random_bool(1.0 / 3.0)
        .then(|| rng.random_range(1..=nodes))
}

fn fault(rng: &mut StdRng, nodes: u64, queues: usize) -> Fault {
    let target = if rng.random_bool(0.5) {
        Target::LeaderOf(rng.random_range(0..queues))
    } else {
        Target::Node(rng.random_range(1..=nodes))
    };
    match rng.random_range(0..KINDS.len()) {
        0 => Fault::Isolate { target },
        1 => Fault::MuteOutgoing { target },
        2 => Fault::DeafIncoming { target },
        3 => {
            let a = rng.random_range(1..=nodes);
            let b = (a + rng.random_range(1..nodes)) % nodes;
            Fault::Bridge {
                a,
                b: if b == 0 { nodes } else { b },
            }
        }
        4 => Fault::Delay {
            target,
            delay_ms: rng.random_range(20..=300),
            jitter_ms: rng.random_range(0..=100),
        },
        5 => Fault::Loss {
            target,
            loss_pct: rng.random_range(5..=30),
        },
        6 => Fault::Reset { target },
        7 => Fault::Crash { target },
        8 => Fault::Pause { target },
        _ => {
            let ms = rng.random_range(1_000..=10_000);
            Fault::ClockJump {
                target,
                jump_ms: if rng.random_bool(0.5) { ms } else { -ms },
            }
        }
    }
}

impl Fault {
    pub fn name(&self) -> &'static str {
        match self {
            Fault::Isolate { .. } => "isolate",
            Fault::MuteOutgoing { .. } => "mute-outgoing",
            Fault::DeafIncoming { .. } => "deaf-incoming",
            Fault::Bridge { .. } => "bridge",
            Fault::Delay { .. } => "delay",
            Fault::Loss { .. } => "loss",
            Fault::Reset { .. } => "reset",
            Fault::Crash { .. } => "crash",
            Fault::Pause { .. } => "pause",
            Fault::ClockJump { .. } => "clock-jump",
        }
    }

    /// The node-or-leader this fault strikes, if it has one target.
    pub fn target(&self) -> Option<Target> {
        match *self {
            Fault::Isolate { target }
            | Fault::MuteOutgoing { target }
            | Fault::DeafIncoming { target }
            | Fault::Delay { target, .. }
            | Fault::Loss { target, .. }
            | Fault::Reset { target }
            | Fault::Crash { target }
            | Fault::Pause { target }
            | Fault::ClockJump { target, .. } => Some(target),
            Fault::Bridge { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_plan_byte_for_byte() {
        for seed in 0..50 {
            let a = serde_json::to_vec(&plan(seed, 3, Duration::from_secs(60), 4)).unwrap();
            let b = serde_json::to_vec(&plan(seed, 3, Duration::from_secs(60), 4)).unwrap();
            assert_eq!(a, b, "seed {seed}");
        }
        let one = plan(1, 3, Duration::from_secs(60), 4);
        let two = plan(2, 3, Duration::from_secs(60), 4);
        assert_ne!(one, two, "different seeds, different plans");
    }

    #[test]
    fn at_most_two_faults_at_once_all_healed_before_the_run_ends() {
        for seed in 0..200 {
            let p = plan(seed, 3, Duration::from_secs(40), 4);
            assert!(p.faults.len() >= 5, "seed {seed}: a 40 s run has faults");
            assert!(p.faults.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
            for f in &p.faults {
                let under_way = p
                    .faults
                    .iter()
                    .filter(|g| g.at_ms <= f.at_ms && f.at_ms < g.at_ms + g.length_ms)
                    .count();
                assert!(
                    under_way <= MAX_CONCURRENT,
                    "seed {seed}: {under_way} at {}",
                    f.at_ms
                );
                assert!(f.at_ms >= WARM_UP.as_millis() as u64);
                assert!(f.at_ms + f.length_ms + WARM_UP.as_millis() as u64 <= p.run_ms);
                if let Fault::Bridge { a, b } = f.fault {
                    assert!(
                        a != b && (1..=3).contains(&a) && (1..=3).contains(&b),
                        "{f:?}"
                    );
                }
                if let Some(Target::Node(n)) = f.fault.target() {
                    assert!((1..=3).contains(&n));
                }
            }
            assert!(p.skew_ms.iter().all(|s| s.abs() <= MAX_SKEW_MS));
        }
    }

    #[test]
    fn every_kind_is_drawn() {
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..100 {
            for f in plan(seed, 3, Duration::from_secs(60), 4).faults {
                seen.insert(f.fault.name());
            }
        }
        assert_eq!(seen.len(), KINDS.len(), "{seen:?}");
    }
}
