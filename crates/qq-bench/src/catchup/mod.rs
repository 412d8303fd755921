//! Scenario 11, catch-up at scale (issue 13, "never bricked, never behind"): a follower of a
//! queue with a million-message backlog comes back, (a) after being stopped while the backlog
//! built, (b) with its data directory wiped, and catches up while publishing goes on.
//!
//! One quorum queue with three replicas, led by node 1; the follower taken away is node 3.
//! In both variants a steady publisher sends `catchup_rate` msg/s from [`WARM`] before the
//! kill to the end of the variant, and a second publisher sends as fast as its window allows
//! (confirmed, `window` in flight, no consumer) while node 3 is down. The run, on each system:
//!
//! 1. **(a) stopped**, on an empty queue: `kill -9` node 3, publish the whole backlog
//!    (`catchup_backlog`) while it is down, start it again with its data.
//! 2. **Steady state.** Every node up, the queue holding the backlog (plus what the steady
//!    publisher added), [`SETTLE`] quiet: every node's RSS now is the baseline each peak of
//!    both variants is divided by. It is read after (a) because in (a) the backlog builds
//!    while a node is down: this is the first moment the cluster holds that backlog normally.
//! 3. **(b) wiped**, on the same queue: `kill -9` node 3 and remove its data directory
//!    (RabbitMQ: first `forget_cluster_node`, which also takes it out of the queue's members,
//!    RabbitMQ's procedure for a lost node), publish a tenth of the backlog while it is down,
//!    start it empty. quorumq's node rejoins by itself and its replica is rebuilt from the
//!    leader: from its log while the leader still holds all of it (a 1 000 000 backlog is only
//!    ~7 000 entries, under the default `snapshot_after_entries`), else by a chunked snapshot;
//!    the notes say which (a transfer shows as `recv-*` files). RabbitMQ's node rejoins
//!    the cluster at boot (peer discovery) and is made a member of the queue again with
//!    `rabbit_quorum_queue:add_member` (what `rabbitmq-queues add_member` runs) once it serves.
//! 4. The queue is deleted.
//!
//! What is reported per variant: the publish rate while the follower is down (confirms of
//! both publishers over the time the second one runs); the catch-up time, from starting the
//! node's process until its replica has applied the log index the leader had committed at that
//! moment; the peak RSS of every node, sampled every [`SAMPLE_EVERY`] from before the kill to
//! the end of the variant, and its ratio to the node's steady state; the longest time any
//! publisher waited for a confirm while it had publishes outstanding
//! ([`crate::load::PubOutcome::max_confirm_gap_ns`]).
//!
//! How progress is read without disturbing it. quorumq: `GET /metrics` on the leader
//! (`quorumq_raft_commit_index` of the queue's group) and on node 3
//! (`quorumq_raft_applied_index`), which read Raft's metrics watch (`GetQueue` and
//! `ClusterStatus` would hash the whole million-message state on every poll). RabbitMQ: one
//! `rabbitmqctl eval` on node 1 runs a loop inside the node for the whole variant, reading the
//! leader's `commit_index` and node 3's `last_applied` from their Ra servers
//! (`sys:get_status`, what `rabbitmq-queues quorum_status` reads) every 200 ms into a file
//! this process reads; a `rabbitmqctl` per poll would cost the machine a second of CPU each.
//!
//! Not by default in `make bench` (about 12 minutes for both systems): `--scenarios 11`.
//!
//! The rooms: this file holds the run and its report; `variant` one variant, phase by phase;
//! `progress` how the leader's commit index, the follower's applied index and snapshot
//! transfers are read.

mod progress;
mod variant;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result, bail};

pub(crate) use self::progress::scrape;
use self::variant::variant;
use crate::cluster::{Cluster, NODES};
use crate::driver::Conn;
use crate::load::{Counters, PubOutcome, PubPlan, publish_loop};
use crate::moves::place;
use crate::scenarios::{Better, Outcome, Settings, delete_queues};

/// The queue of both variants.
const QUEUE: &str = "bench-catchup";
/// The leader (node 1) and the follower taken away (node 3), 0-based.
const LEADER: usize = 0;
const FOLLOWER: usize = 2;
/// How often RSS and catch-up progress are read.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Quiet time before the steady-state RSS is read (flushes, compaction, GC).
const SETTLE: Duration = Duration::from_secs(5);
/// The steady publisher runs this long before the follower is killed.
const WARM: Duration = Duration::from_secs(2);
/// Publishing goes on this long after the follower has caught up.
const AFTER: Duration = Duration::from_secs(2);
/// A progress line of the RabbitMQ reporter older than this is not used.
const STALE: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Stopped,
    Wiped,
}

impl Variant {
    fn tag(self) -> &'static str {
        match self {
            Variant::Stopped => "(a)",
            Variant::Wiped => "(b)",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Variant::Stopped => "stopped follower",
            Variant::Wiped => "wiped follower",
        }
    }
}

/// Peak RSS per node (KiB) over a variant.
#[derive(Default)]
struct Peaks {
    kib: [u64; NODES],
}

impl Peaks {
    fn sample(&mut self, cl: &Cluster) {
        for (peak, rss) in self.kib.iter_mut().zip(cl.rss_kib()) {
            if let Some(k) = rss {
                *peak = (*peak).max(k);
            }
        }
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Runs `fut` to completion while sampling RSS every [`SAMPLE_EVERY`].
async fn sampling<F: std::future::Future>(cl: &Cluster, peaks: &mut Peaks, fut: F) -> F::Output {
    tokio::pin!(fut);
    loop {
        peaks.sample(cl);
        tokio::select! {
            r = &mut fut => return r,
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
}

/// A publisher task on `conn` (see [`PubPlan`]); its outcome comes from the join handle.
fn spawn_publisher(
    conn: &Conn,
    queue: &str,
    s: &Settings,
    rate: Option<f64>,
    count: Option<u64>,
    stop: Arc<AtomicBool>,
    first_id: u64,
    counters: Arc<Counters>,
) -> tokio::task::JoinHandle<Result<PubOutcome>> {
    let conn = conn.clone();
    let queue = queue.to_string();
    let plan = PubPlan {
        window: s.window,
        rate,
        count,
        stop,
        body_bytes: s.body_bytes,
        first_id,
        record_from_ns: u64::MAX,
    };
    tokio::spawn(async move {
        let p = conn.publisher(&queue, plan.window).await?;
        publish_loop(p, plan, counters).await
    })
}

fn joined(
    r: std::result::Result<Result<PubOutcome>, tokio::task::JoinError>,
) -> Result<PubOutcome> {
    r.context("publisher task")?
}

/// What one variant measured.
struct Measured {
    variant: Variant,
    down_rate: f64,
    catchup_s: Option<f64>,
    peaks: Peaks,
    max_gap_s: f64,
    catchup_confirm_rate: f64,
    notes: Vec<String>,
}

pub async fn catch_up(cl: &mut Cluster, s: &Settings) -> Result<Outcome> {
    let mut out = Outcome::default();
    place(cl, LEADER, QUEUE, |l| l == LEADER).await?;
    let result = run(cl, s, &mut out).await;
    delete_queues(cl, &[QUEUE.to_string()]).await;
    result?;
    Ok(out)
}

/// (a), the steady state, (b), on [`QUEUE`]; the figures go to `out` as they are known.
async fn run(cl: &mut Cluster, s: &Settings, out: &mut Outcome) -> Result<()> {
    // 1. (a): the whole backlog is published while node 3 is down.
    let stopped = variant(cl, s, Variant::Stopped, QUEUE, s.catchup_backlog).await;
    if let Err(e) = &stopped {
        out.notes
            .push(format!("failed: (a) {}: {e:#}", Variant::Stopped.what()));
    }
    cl.ensure_up(Duration::from_secs(300)).await?;

    // 2. The steady state: every node up with the backlog, quiet.
    tokio::time::sleep(SETTLE).await;
    let steady: Vec<u64> = cl
        .rss_kib()
        .into_iter()
        .enumerate()
        .map(|(n, r)| r.with_context(|| format!("node {} is not running", n + 1)))
        .collect::<Result<_>>()?;
    let held = Conn::connect(cl.system(), LEADER)
        .await?
        .message_count(QUEUE)
        .await?;
    out.notes.push(format!(
        "steady state: {held} messages in {QUEUE}, every node up, {} s after (a) ended; RSS \
         MiB per node: {}",
        SETTLE.as_secs(),
        steady
            .iter()
            .map(|k| format!("{:.0}", mib(*k)))
            .collect::<Vec<_>>()
            .join("/")
    ));
    for (n, k) in steady.iter().enumerate() {
        out.figure(
            11,
            &format!("steady RSS node {}", n + 1),
            "MiB",
            Better::Lower,
            mib(*k),
        );
    }
    if let Ok(m) = &stopped {
        report(out, m, &steady);
    }

    // 3. (b): on the same queue and backlog, node 3 wiped; a tenth of the backlog while down.
    let wiped = variant(cl, s, Variant::Wiped, QUEUE, s.catchup_backlog / 10).await;
    match &wiped {
        Ok(m) => report(out, m, &steady),
        Err(e) => out
            .notes
            .push(format!("failed: (b) {}: {e:#}", Variant::Wiped.what())),
    }
    match (stopped, wiped) {
        (Err(a), Err(b)) => bail!("(a): {a:#}; (b): {b:#}"),
        _ => Ok(()),
    }
}

fn report(out: &mut Outcome, m: &Measured, steady: &[u64]) {
    let t = m.variant.tag();
    out.figure(
        11,
        &format!("{t} publish while follower down"),
        "msg/s",
        Better::Higher,
        m.down_rate,
    );
    match m.catchup_s {
        Some(c) => out.figure(11, &format!("{t} catch-up time"), "s", Better::Lower, c),
        None => out.figures.push(crate::scenarios::Figure {
            scenario: 11,
            name: format!("{t} catch-up time"),
            unit: "s",
            better: Better::Lower,
            value: None,
        }),
    }
    out.figure(
        11,
        &format!("{t} confirmed during catch-up"),
        "msg/s",
        Better::Higher,
        m.catchup_confirm_rate,
    );
    report_peaks(out, m, steady);
    out.figure(
        11,
        &format!("{t} longest confirm gap"),
        "s",
        Better::Lower,
        m.max_gap_s,
    );
    for n in &m.notes {
        out.notes.push(format!("{t} {n}"));
    }
}

/// Each node's peak RSS over the variant, and the worst ratio to its steady state.
fn report_peaks(out: &mut Outcome, m: &Measured, steady: &[u64]) {
    let t = m.variant.tag();
    let mut worst = 0.0f64;
    for (n, (peak, base)) in m.peaks.kib.iter().zip(steady).enumerate() {
        out.figure(
            11,
            &format!("{t} peak RSS node {}", n + 1),
            "MiB",
            Better::Lower,
            mib(*peak),
        );
        if *base > 0 {
            worst = worst.max(*peak as f64 / *base as f64);
        }
    }
    out.figure(
        11,
        &format!("{t} peak/steady RSS, worst node"),
        "x",
        Better::Lower,
        worst,
    );
    let ratios: Vec<String> = m
        .peaks
        .kib
        .iter()
        .zip(steady)
        .map(|(p, b)| {
            format!(
                "{:.0} MiB ({:.2}x)",
                mib(*p),
                *p as f64 / (*b).max(1) as f64
            )
        })
        .collect();
    out.notes.push(format!(
        "{t} {}: peak RSS per node vs its steady state: {}",
        m.variant.what(),
        ratios.join(", ")
    ));
}
