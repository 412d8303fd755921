//! The nemesis: which faults exist, the seeded schedule of when each one strikes, and how a
//! fault is applied to the hosts and healed.
//!
//! The schedule is a pure function of the seed, the selected kinds and the run's length
//! ([`schedule`]), so the same seed gives the same faults at the same offsets. What a fault hits
//! can depend on the cluster at that moment (the current leader of the chosen queue); the
//! report records the node it actually hit.
//!
//! One fault is in force at a time. Most are applied at once ([`apply`]) and undone when their
//! window ends ([`heal`]). The rolling restart is a procedure instead ([`rolling_restart`]): it
//! stops and starts the nodes one after the other, each stop guarded by the cluster's
//! QuorumCritical answer, and its window is as long as the procedure takes. The runner awaits
//! it (the workload runs on meanwhile) and starts no other fault until it is over. The
//! membership nemesis only starts its spare node here; the runner joins, grows and retires it
//! (`crate::membership`), and its window lasts until the spare is forgotten.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use qq_client::Client;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::hosts::Hosts;
use crate::workload::Recorder;

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
    /// Every node stopped gracefully (SIGTERM) and started again with its data, one after the
    /// other, as in a rolling upgrade: a node is stopped only once a live node's QuorumCritical
    /// says no queue and not the metadata would lose its majority without it (else it is
    /// skipped), and the next one only once the restarted node serves again. The window lasts
    /// as long as the whole restart.
    RollingRestart,
    /// An operator's membership change: a spare node (a new id each time, on a fourth host,
    /// empty) is started, joins the cluster and is grown onto every queue; when the window
    /// ends it is shrunk off again (or not: forget deletes its replicas), stopped and
    /// forgotten (see `crate::membership`).
    Membership,
}

pub const ALL: [Kind; 12] = [
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
    Kind::RollingRestart,
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
            Kind::RollingRestart => "rolling-restart",
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

/// Time the schedule sets aside for a rolling restart: three graceful stops and restarts of
/// debug builds took 11-12 s on two cores under the workload (each stop about 2.5 s, the
/// proposer's write grace; each start about 2 s). A restart that takes longer delays the
/// faults after it (the runner keeps [`MIN_GAP`] after every fault), it never overlaps them.
pub const ROLLING_RESTART_WINDOW: Duration = Duration::from_secs(25);
/// The shortest quiet gap between two faults.
pub const MIN_GAP: Duration = Duration::from_secs(5);

/// The fault schedule: a quiet warm-up, then faults of the selected kinds (cycled in a seeded
/// order so that every selected kind strikes when the run is long enough) separated by quiet
/// gaps; the last fault ends at least `cool_down` before the end. A fault lasts 6-12 s, a
/// rolling restart [`ROLLING_RESTART_WINDOW`].
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
        let kind = *order.last().expect("refilled above");
        // Drawn for every kind, so that adding a kind does not change the others' schedules.
        let mut length = Duration::from_millis(rng.random_range(6_000..=12_000));
        if kind == Kind::RollingRestart {
            length = ROLLING_RESTART_WINDOW;
        }
        if at + length + COOL_DOWN > run {
            break;
        }
        order.pop();
        plan.push(Planned {
            kind,
            at,
            length,
            node_pick: rng.random_range(1..=nodes),
            queue_pick: rng.random_range(0..queues),
        });
        // At least MIN_GAP.
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
    /// What a procedure did, step by step with its offsets ("12.3 s node 2: ..."), for the
    /// report (rolling-restart; the membership nemesis' steps are `membership::Step`s, kept by
    /// the runner).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub procedure: Vec<String>,
    /// What went wrong in a procedure that the run must fail on (a node that did not exit 0
    /// on SIGTERM in time, or did not serve again after its restart).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<String>,
    /// Nodes a procedure stopped with SIGTERM (rolling-restart).
    pub graceful_stops: usize,
    /// The spare node started by the membership nemesis, and whether it is shrunk off its
    /// queues before it is stopped (else forget deletes its replicas).
    pub spare: Option<u64>,
    pub shrink_first: bool,
}

impl Applied {
    fn new(kind: Kind) -> Applied {
        Applied {
            kind,
            target: String::new(),
            killed: None,
            paused: None,
            alone: None,
            disk_full: None,
            procedure: Vec::new(),
            findings: Vec::new(),
            graceful_stops: 0,
            spare: None,
            shrink_first: false,
        }
    }
}

/// Strikes with `fault` now: [`apply`], or for a rolling restart the whole procedure
/// ([`rolling_restart`]), which returns when it is over. `leader` is the current leader of the
/// queue the fault chose (if known).
pub async fn strike(
    hosts: &mut Hosts,
    clients: &[Client],
    rec: &Recorder,
    fault: &Planned,
    leader: Option<u64>,
) -> anyhow::Result<Applied> {
    match fault.kind {
        Kind::RollingRestart => rolling_restart(hosts, clients, rec, fault.node_pick).await,
        Kind::WipeRejoin => {
            // The re-seed procedure's condition: the other nodes hold a majority of every
            // group. The wipe models losing one disk at a time, each node repaired (caught up)
            // before the next loses its disk; two lost before the first caught up is a double
            // fault, beyond what three replicas promise.
            let began = Instant::now();
            match wait_caught_up(clients, CATCH_UP_WAIT).await {
                Ok(()) => {
                    let mut applied = apply(hosts, fault, leader)?;
                    applied.procedure.push(format!(
                        "{:.1} s every replica caught up (waited {:.1} s), then {}",
                        rec.elapsed().as_secs_f64(),
                        began.elapsed().as_secs_f64(),
                        applied.target
                    ));
                    Ok(applied)
                }
                Err(behind) => {
                    let mut applied = Applied::new(Kind::WipeRejoin);
                    applied.target = "nothing wiped".into();
                    applied.findings.push(format!(
                        "{:.1} s: replicas still behind after {CATCH_UP_WAIT:?} ({behind}): \
                         the wipe was skipped",
                        rec.elapsed().as_secs_f64()
                    ));
                    Ok(applied)
                }
            }
        }
        _ => apply(hosts, fault, leader),
    }
}

/// How long a wipe waits for every replica to catch up (and the node wiped before to get
/// every replica back: a re-seed adds them one queue at a time, each caught up first; about a
/// minute for four busy queues on two shared cores) before it strikes.
const CATCH_UP_WAIT: Duration = Duration::from_secs(120);

/// Waits until every queue has a member on every founding node (a node re-seeded after the
/// last wipe gets its replicas back one queue at a time: until then a queue has one copy
/// fewer, and a second wipe would be a double fault) and every replica has applied at least
/// what the most advanced replica of that queue had applied when first asked (ClusterStatus
/// of every node, each reporting its own replicas). A node that does not answer (not serving
/// yet) is waited for. Err: what was still behind at the limit.
async fn wait_caught_up(clients: &[Client], limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let mut target: Option<BTreeMap<String, u64>> = None;
    loop {
        let behind = match crate::replicas::views(clients, STATUS_CALL_TIMEOUT).await {
            Ok(seen) => {
                let goal = target.get_or_insert_with(|| {
                    seen.iter()
                        .map(|(q, v)| {
                            let most = v.replicas.values().map(|(a, _)| *a).max();
                            (q.clone(), most.unwrap_or(0))
                        })
                        .collect()
                });
                seen.iter().find_map(|(q, v)| {
                    let want = goal.get(q).copied().unwrap_or(0);
                    (v.members < clients.len()
                        || v.replicas.len() < v.members
                        || v.replicas.values().any(|(a, _)| *a < want))
                    .then(|| {
                        format!(
                            "{q}: applied {:?}, wanted {want} on {}",
                            v.replicas, v.members
                        )
                    })
                })
            }
            Err(e) => Some(e),
        };
        match behind {
            None => return Ok(()),
            Some(b) if Instant::now() >= deadline => return Err(b),
            Some(_) => tokio::time::sleep(QUORUM_POLL).await,
        }
    }
}

/// Applies `fault` now. `leader` is the current leader of the queue the fault chose (if known).
fn apply(hosts: &mut Hosts, fault: &Planned, leader: Option<u64>) -> anyhow::Result<Applied> {
    let ids = hosts.ids().to_vec();
    let pick = fault.node_pick;
    let others = |n: u64| ids.iter().copied().filter(move |&i| i != n);
    let target_leader = leader.unwrap_or(pick);
    let mut applied = Applied::new(fault.kind);
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
        Kind::RollingRestart => {
            anyhow::bail!("rolling-restart is a procedure: struck by rolling_restart, not apply")
        }
    }
    Ok(applied)
}

/// How long a node may stay quorum critical before the rolling restart skips it.
const QUORUM_CLEAR_WAIT: Duration = Duration::from_secs(30);
/// How often QuorumCritical is asked again while the node is critical.
const QUORUM_POLL: Duration = Duration::from_millis(250);
/// How long one QuorumCritical call may take (it probes the peers for up to 1.5 s).
const QUORUM_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a node may take to exit after SIGTERM before it gets SIGKILL.
const STOP_WAIT: Duration = Duration::from_secs(20);
/// How long a restarted node may take to serve again before the rolling restart is aborted.
const SERVE_WAIT: Duration = Duration::from_secs(60);
/// How often the restarted node is asked whether it serves.
const SERVE_POLL: Duration = Duration::from_millis(250);
/// How long one ClusterStatus call may take.
const STATUS_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The rolling restart: nodes `first`, `first + 1`, ... (wrapping) in turn. For each: wait until
/// a live node's QuorumCritical for it lists no queue and not the metadata (up to
/// [`QUORUM_CLEAR_WAIT`]; a node that stays critical is skipped, not stopped); SIGTERM and wait
/// for the exit (SIGKILL after [`STOP_WAIT`]); start it again on the same data directory; wait
/// until it serves (ClusterStatus through its client port answers and names a metadata leader:
/// a node answers only once its metadata caught up). A node that does not serve within
/// [`SERVE_WAIT`] ends the procedure: the next node is not stopped.
///
/// Every step goes to `steps` (and stdout) with its offset; a graceful stop that did not exit
/// 0 in time and a node that did not come back go to `findings` as well.
pub async fn rolling_restart(
    hosts: &mut Hosts,
    clients: &[Client],
    rec: &Recorder,
    first: u64,
) -> anyhow::Result<Applied> {
    let order = restart_order(first, hosts.ids().len() as u64);
    let mut applied = Applied::new(Kind::RollingRestart);
    let began = Instant::now();
    let step = |applied: &mut Applied, text: String| {
        let line = format!("{:.1} s {text}", rec.elapsed().as_secs_f64());
        println!(
            "[{:>5.1}s] rolling-restart: {text}",
            rec.elapsed().as_secs_f64()
        );
        applied.procedure.push(line);
    };
    let mut restarted = Vec::new();
    let mut skipped = Vec::new();
    let mut aborted = None;
    for &id in &order {
        let asked_at = Instant::now();
        match wait_not_critical(hosts, clients, id).await {
            Ok(asked) => step(
                &mut applied,
                format!(
                    "node {id}: not quorum critical (asked node {asked}, waited {:.1} s)",
                    asked_at.elapsed().as_secs_f64()
                ),
            ),
            Err(last) => {
                step(
                    &mut applied,
                    format!(
                        "node {id}: still quorum critical after {QUORUM_CLEAR_WAIT:?} ({last}): \
                         not stopped"
                    ),
                );
                skipped.push(id);
                continue;
            }
        }
        match hosts.stop_graceful(id, STOP_WAIT).await? {
            None => step(
                &mut applied,
                format!("node {id}: was not running; starting it"),
            ),
            Some(stopped) => {
                applied.graceful_stops += 1;
                let took = stopped.took.as_secs_f64();
                if stopped.killed {
                    let finding = format!(
                        "node {id} still running {STOP_WAIT:?} after SIGTERM: killed with SIGKILL"
                    );
                    applied.findings.push(finding.clone());
                    step(&mut applied, finding);
                } else if !stopped.status.success() {
                    let finding = format!(
                        "node {id} exited with {} {took:.1} s after SIGTERM",
                        stopped.status
                    );
                    applied.findings.push(finding.clone());
                    step(&mut applied, finding);
                } else {
                    step(
                        &mut applied,
                        format!("node {id}: SIGTERM, exited 0 after {took:.1} s"),
                    );
                }
            }
        }
        let started = Instant::now();
        hosts.start(id)?;
        let client = &clients[(id - 1) as usize];
        match wait_serving(hosts, client, id).await {
            Ok(()) => {
                step(
                    &mut applied,
                    format!(
                        "node {id}: started, serving after {:.1} s",
                        started.elapsed().as_secs_f64()
                    ),
                );
                restarted.push(id);
            }
            Err(why) => {
                let finding = format!("node {id} not serving again after its restart: {why}");
                applied.findings.push(finding.clone());
                step(&mut applied, format!("{finding}; rolling restart aborted"));
                if !hosts.is_running(id) {
                    // Exited while starting: started once more, as the runner does with any
                    // node that exits by itself, so the rest of the run has three nodes.
                    hosts.start(id)?;
                    step(&mut applied, format!("node {id}: started again"));
                }
                aborted = Some(id);
                break;
            }
        }
    }
    step(
        &mut applied,
        format!(
            "done in {:.1} s: restarted {restarted:?}, skipped (quorum critical) {skipped:?}",
            began.elapsed().as_secs_f64()
        ),
    );
    let list = |v: &[u64]| {
        v.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    applied.target = format!("nodes {}", list(&restarted));
    if !skipped.is_empty() {
        applied.target += &format!(", {} critical", list(&skipped));
    }
    if let Some(id) = aborted {
        applied.target += &format!(", {id} not back");
    }
    Ok(applied)
}

/// Nodes `first`, `first + 1`, ... of `1..=n`, wrapping: each once.
fn restart_order(first: u64, n: u64) -> Vec<u64> {
    (0..n).map(|i| (first - 1 + i) % n + 1).collect()
}

/// Waits until QuorumCritical for `id`, asked of another running node, lists nothing. Returns
/// the node that said so; after [`QUORUM_CLEAR_WAIT`], the last answer (or error) in words.
async fn wait_not_critical(hosts: &Hosts, clients: &[Client], id: u64) -> Result<u64, String> {
    let deadline = Instant::now() + QUORUM_CLEAR_WAIT;
    let mut last = String::from("no node answered");
    loop {
        let askable = hosts
            .ids()
            .iter()
            .copied()
            .filter(|&o| o != id && hosts.is_running(o));
        for asked in askable {
            let client = &clients[(asked - 1) as usize];
            match tokio::time::timeout(QUORUM_CALL_TIMEOUT, client.quorum_critical(id)).await {
                Ok(Ok(r)) if r.queues.is_empty() && !r.metadata => return Ok(asked),
                Ok(Ok(r)) => {
                    let queues: Vec<String> = r
                        .queues
                        .iter()
                        .map(|q| format!("{} (online {:?})", q.queue, q.online))
                        .collect();
                    last = format!(
                        "node {asked} says: queues [{}]{}",
                        queues.join(", "),
                        if r.metadata { " and the metadata" } else { "" }
                    );
                    // One answer per round: a node that answers knows as much as any.
                    break;
                }
                Ok(Err(e)) => last = format!("node {asked}: {e}"),
                Err(_) => last = format!("node {asked}: timed out"),
            }
        }
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(QUORUM_POLL).await;
    }
}

/// Waits until node `id` serves: ClusterStatus through its client port answers (a node whose
/// metadata has not caught up answers UNAVAILABLE) and names a metadata leader.
async fn wait_serving(hosts: &mut Hosts, client: &Client, id: u64) -> Result<(), String> {
    let deadline = Instant::now() + SERVE_WAIT;
    loop {
        if let Some(status) = hosts.exited(id) {
            return Err(format!("it exited ({status}) while starting"));
        }
        let last = match tokio::time::timeout(STATUS_CALL_TIMEOUT, client.cluster_status()).await {
            Ok(Ok(s)) if s.metadata_leader != 0 => return Ok(()),
            Ok(Ok(_)) => "it sees no metadata leader".to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "ClusterStatus timed out".to_string(),
        };
        if Instant::now() >= deadline {
            return Err(format!("not serving after {SERVE_WAIT:?}: {last}"));
        }
        tokio::time::sleep(SERVE_POLL).await;
    }
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
mod tests;
