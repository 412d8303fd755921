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

use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::System;
use crate::cluster::{Cluster, NODES};
use crate::driver::{Conn, qq_http_address};
use crate::erl_loop::{ErlLoop, child_output, rabbit_node};
use crate::load::{Counters, Progress, PubOutcome, PubPlan, now_ns, publish_loop};
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

/// `GET /metrics` of quorumq node `node` (also read by scenario 13, module `priority`).
pub(crate) async fn scrape(node: usize) -> Result<String> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(qq_http_address(node)).await?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        anyhow::Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .context("metrics timed out")??;
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP body")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("GET /metrics: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_string())
}

/// The value of `metric` for `queue` in a Prometheus text page.
fn metric_of(page: &str, metric: &str, queue: &str) -> Option<u64> {
    let label = format!("queue=\"{queue}\"");
    page.lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with('{'))
        .find(|l| l.contains(&label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

async fn qq_index(node: usize, metric: &str, queue: &str) -> Option<u64> {
    scrape(node)
        .await
        .ok()
        .and_then(|page| metric_of(&page, metric, queue))
}

/// quorumq: the snapshot files in a node's snapshot directory (`<data_dir>/db/snapshots`), as
/// `(name, bytes)`; `recv-*` are transfers being received.
fn qq_snapshot_files(cl: &Cluster, node: usize) -> Vec<(String, u64)> {
    let dir = cl.data_dir(node).join("db").join("snapshots");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let len = e.metadata().ok()?.len();
            Some((e.file_name().to_string_lossy().into_owned(), len))
        })
        .collect()
}

/// The wall-clock time (UTC, `HH:MM:SS.mmm`) of a [`now_ns`] instant, to find it in node logs.
fn wall(ns: u64) -> String {
    let ago = Duration::from_nanos(now_ns().saturating_sub(ns));
    let at = SystemTime::now()
        .checked_sub(ago)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .unwrap_or_default();
    let ms = at.as_millis() % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// The RabbitMQ progress reporter: an [`ErlLoop`] inside node 1 that reads the leader's
/// `commit_index` and node 3's `last_applied` every 200 ms (-1 for what cannot be read, e.g.
/// the follower while it is down).
struct Reporter(ErlLoop);

impl Reporter {
    fn start(cl: &Cluster, queue: &str, deadline: Duration) -> Result<Reporter> {
        let prelude = format!(
            r#"{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"{queue}">>)),
{{Name, _}} = amqqueue:get_pid(Q),
Get = fun(Node, Key) ->
    case catch sys:get_status({{Name, Node}}, 1000) of
        {{status, _, _, [_, _, _, _, Misc]}} ->
            case lists:keyfind(ra_server_state, 1, Misc) of
                {{_, #{{Key := V}}}} -> V;
                _ -> -1
            end;
        _ -> -1
    end
end,"#
        );
        let step = format!(
            "io_lib:format(\"~b ~b\", [Get('{}', commit_index), Get('{}', last_applied)])",
            rabbit_node(LEADER),
            rabbit_node(FOLLOWER)
        );
        Ok(Reporter(ErlLoop::start(
            cl,
            LEADER,
            "catchup",
            &prelude,
            &step,
            Duration::from_millis(200),
            deadline,
        )?))
    }

    /// The latest `(leader commit index, follower last applied)`, if fresh; -1 is `None`.
    fn read(&self) -> Option<(Option<u64>, Option<u64>)> {
        let v = self.0.read(STALE)?;
        let [commit, applied] = v[..] else {
            return None;
        };
        let known = |x: i64| u64::try_from(x).ok();
        Some((known(commit), known(applied)))
    }

    fn ended(&mut self) -> Option<String> {
        self.0.ended()
    }

    fn stop(self) {
        self.0.stop()
    }
}

/// Where catch-up progress is read from.
enum Watch {
    Qq,
    Rabbit(Reporter),
}

impl Watch {
    async fn leader_commit(&self, queue: &str) -> Option<u64> {
        match self {
            Watch::Qq => qq_index(LEADER, "quorumq_raft_commit_index", queue).await,
            Watch::Rabbit(r) => r.read().and_then(|(c, _)| c),
        }
    }

    async fn follower_applied(&self, queue: &str) -> Option<u64> {
        match self {
            Watch::Qq => qq_index(FOLLOWER, "quorumq_raft_applied_index", queue).await,
            Watch::Rabbit(r) => r.read().and_then(|(_, a)| a),
        }
    }
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
    out.figure(
        11,
        &format!("{t} longest confirm gap"),
        "s",
        Better::Lower,
        m.max_gap_s,
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
    for n in &m.notes {
        out.notes.push(format!("{t} {n}"));
    }
}

/// One variant on `queue` (led by node 1): kill node 3 (and wipe it), publish `down_messages`
/// while it is down, start it, wait for its catch-up; a steady publisher throughout.
async fn variant(
    cl: &mut Cluster,
    s: &Settings,
    v: Variant,
    queue: &str,
    down_messages: u64,
) -> Result<Measured> {
    let system = cl.system();
    let mut notes = Vec::new();
    let mut peaks = Peaks::default();
    peaks.sample(cl);
    notes.push(format!(
        "RSS MiB per node at the start: {}",
        cl.rss_kib()
            .iter()
            .map(|r| r.map_or("-".into(), |k| format!("{:.0}", mib(k))))
            .collect::<Vec<_>>()
            .join("/")
    ));
    let conn = Conn::connect(system, LEADER).await?;
    let steady_counters = Arc::new(Counters::default());
    let stop_steady = Arc::new(AtomicBool::new(false));
    let steady = spawn_publisher(
        &conn,
        queue,
        s,
        Some(s.catchup_rate),
        None,
        stop_steady.clone(),
        1 << 40,
        steady_counters.clone(),
    );
    let result = async {
        sampling(cl, &mut peaks, tokio::time::sleep(WARM)).await;

        // Take the follower away.
        cl.kill9(FOLLOWER)?;
        let killed = Instant::now();
        let killed_ns = now_ns();
        if v == Variant::Wiped {
            if system == System::Rabbitmq {
                let t = Instant::now();
                cl.rabbitmqctl(LEADER, &["forget_cluster_node", &rabbit_node(FOLLOWER)])?;
                notes.push(format!(
                    "forget_cluster_node {} took {:.1} s (node down, before the publishing)",
                    rabbit_node(FOLLOWER),
                    t.elapsed().as_secs_f64()
                ));
            }
            let dir = cl.wipe_data(FOLLOWER)?;
            notes.push(format!("node 3's data directory {} removed", dir.display()));
        }

        // Publish while it is down.
        let down_counters = Arc::new(Counters::default());
        let progress = Progress::start(
            format!(
                "11 {} {down_messages} while node 3 is down {system}",
                v.tag()
            ),
            down_counters.clone(),
        );
        let (c0, t0) = (steady_counters.confirmed(), Instant::now());
        let down = spawn_publisher(
            &conn,
            queue,
            s,
            None,
            Some(down_messages),
            Arc::new(AtomicBool::new(false)),
            0,
            down_counters.clone(),
        );
        let down = joined(sampling(cl, &mut peaks, down).await)?;
        progress.finish().await;
        let down_s = t0.elapsed().as_secs_f64();
        let steady_down = steady_counters.confirmed() - c0;
        let down_rate = (down.confirmed + steady_down) as f64 / down_s;
        notes.push(format!(
            "while node 3 was down: {} confirmed at full speed and {steady_down} at the steady \
             rate in {down_s:.1} s; {} refused",
            down.confirmed, down.rejected
        ));

        // Bring it back and watch it catch up.
        let mut watch = match system {
            System::Quorumq | System::QuorumqAmqp => Watch::Qq,
            System::Rabbitmq => Watch::Rabbit(Reporter::start(
                cl,
                queue,
                s.catchup_deadline + Duration::from_secs(120),
            )?),
        };
        let wait_target = Instant::now();
        let target = loop {
            if let Some(c) = watch.leader_commit(queue).await {
                break c;
            }
            if let Watch::Rabbit(r) = &mut watch
                && let Some(e) = r.ended()
            {
                bail!("the RabbitMQ progress reporter ended: {e}");
            }
            if wait_target.elapsed() > Duration::from_secs(60) {
                bail!("could not read the leader's commit index of {queue}");
            }
            sampling(
                cl,
                &mut peaks,
                tokio::time::sleep(Duration::from_millis(100)),
            )
            .await;
        };
        cl.start_node(FOLLOWER)?;
        let restarted = Instant::now();
        let restarted_ns = now_ns();
        notes.push(format!(
            "node 3 down for {:.1} s; restarted with the leader's commit index at {target}",
            (restarted - killed).as_secs_f64()
        ));
        let (cc0, ct0) = (steady_counters.confirmed(), Instant::now());
        let mut add_member: Option<Child> = None;
        let mut member_added = v != Variant::Wiped || system != System::Rabbitmq;
        let mut first_progress: Option<f64> = None;
        let mut last_applied = None;
        let mut catchup_s = None;
        // quorumq: how node 3 caught up; a snapshot transfer shows as a `recv-*` file.
        let mut received_max = 0u64;
        let mut receive_seen_at: Option<f64> = None;
        while restarted.elapsed() < s.catchup_deadline {
            peaks.sample(cl);
            if system == System::Quorumq {
                for (name, len) in qq_snapshot_files(cl, FOLLOWER) {
                    if name.starts_with("recv-") {
                        receive_seen_at.get_or_insert(restarted.elapsed().as_secs_f64());
                        received_max = received_max.max(len);
                    }
                }
            }
            if !member_added {
                if let Some(child) = add_member.as_mut() {
                    if let Some(status) = child.try_wait()? {
                        let said = child_output(child);
                        notes.push(format!(
                            "add_member answered {said} ({status}) {:.1} s after the start",
                            restarted.elapsed().as_secs_f64()
                        ));
                        if !status.success() || said != "ok" {
                            bail!("add_member of node 3 to {queue} failed: {said}");
                        }
                        member_added = true;
                    }
                } else if cl.pid(FOLLOWER).is_some() && cl.answers(FOLLOWER).await {
                    notes.push(format!(
                        "node 3 serves AMQP {:.1} s after its start; adding it to {queue}",
                        restarted.elapsed().as_secs_f64()
                    ));
                    let expr = format!(
                        "rabbit_quorum_queue:add_member(<<\"/\">>, <<\"{queue}\">>, '{}', 120000).",
                        rabbit_node(FOLLOWER)
                    );
                    add_member = Some(cl.rabbitmqctl_spawn(LEADER, &["eval", &expr])?);
                }
            }
            if let Some(a) = watch.follower_applied(queue).await {
                first_progress.get_or_insert(restarted.elapsed().as_secs_f64());
                last_applied = Some(a);
                if a >= target {
                    catchup_s = Some(restarted.elapsed().as_secs_f64());
                    break;
                }
            }
            if let Watch::Rabbit(r) = &mut watch
                && let Some(e) = r.ended()
            {
                bail!("the RabbitMQ progress reporter ended: {e}");
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        let catchup_confirm_rate =
            (steady_counters.confirmed() - cc0) as f64 / ct0.elapsed().as_secs_f64();
        match catchup_s {
            Some(c) => notes.push(format!(
                "node 3 applied {} ≥ {target} {c:.1} s after its start (first progress read at \
                 {:.1} s); {catchup_confirm_rate:.0} msg/s confirmed meanwhile at a steady \
                 {:.0} msg/s",
                last_applied.unwrap_or(0),
                first_progress.unwrap_or(0.0),
                s.catchup_rate
            )),
            None => notes.push(format!(
                "NOT caught up within {:.0} s: node 3 applied {} of the {target} to reach",
                s.catchup_deadline.as_secs_f64(),
                last_applied.map_or("nothing readable".into(), |a| a.to_string())
            )),
        }
        if system == System::Quorumq {
            let leader_snaps: Vec<String> = qq_snapshot_files(cl, LEADER)
                .into_iter()
                .map(|(n, l)| format!("{n} ({:.0} MiB)", l as f64 / 1048576.0))
                .collect();
            notes.push(match receive_seen_at {
                Some(at) => format!(
                    "node 3 was seen receiving a snapshot from {at:.1} s after its start, up to \
                     {:.0} MiB received at one sample; snapshot files on node 1 now: {}",
                    received_max as f64 / 1048576.0,
                    leader_snaps.join(", ")
                ),
                None => format!(
                    "no snapshot transfer to node 3 was seen (it caught up from the leader's \
                     log); snapshot files on node 1 now: {}",
                    if leader_snaps.is_empty() {
                        "none".to_string()
                    } else {
                        leader_snaps.join(", ")
                    }
                ),
            });
        }
        sampling(cl, &mut peaks, tokio::time::sleep(AFTER)).await;
        if let Watch::Rabbit(r) = watch {
            r.stop();
        }
        if let Some(mut c) = add_member {
            let _ = c.kill();
            let _ = c.wait();
        }
        let gap_at = move |end: u64| {
            let rel = |t: u64| end as f64 / 1e9 - t as f64 / 1e9;
            format!(
                "ended {} UTC, {:+.1} s from the kill, {:+.1} s from the restart",
                wall(end),
                rel(killed_ns),
                rel(restarted_ns)
            )
        };
        notes.push(format!(
            "the full-speed publisher's longest confirm gap {}",
            gap_at(down.max_confirm_gap_end_ns)
        ));
        anyhow::Ok((
            down_rate,
            down.max_confirm_gap_ns,
            catchup_s,
            catchup_confirm_rate,
            gap_at,
        ))
    }
    .await;
    stop_steady.store(true, Ordering::Relaxed);
    let steady = sampling(cl, &mut peaks, steady).await;
    let (down_rate, down_gap_ns, catchup_s, catchup_confirm_rate, gap_at) = result?;
    let steady = joined(steady)?;
    let gap = |ns: u64| ns as f64 / 1e9;
    notes.push(format!(
        "longest confirm gap: {:.3} s for the steady publisher ({} confirmed over the variant; \
         {}), {:.3} s for the one while down",
        gap(steady.max_confirm_gap_ns),
        steady.confirmed,
        gap_at(steady.max_confirm_gap_end_ns),
        gap(down_gap_ns)
    ));
    let leader_now = cl.leader(queue).await.ok();
    if leader_now != Some(LEADER) {
        notes.push(format!(
            "the queue's leader changed during the variant: now {}",
            leader_now.map_or("unknown".into(), |l| format!("node {}", l + 1))
        ));
    }
    Ok(Measured {
        variant: v,
        down_rate,
        catchup_s,
        peaks,
        max_gap_s: gap(steady.max_confirm_gap_ns.max(down_gap_ns)),
        catchup_confirm_rate,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_read_by_queue_label() {
        let page = "# HELP quorumq_raft_applied_index x\n\
                    quorumq_raft_applied_index{vhost=\"/\",queue=\"other\"} 7\n\
                    quorumq_raft_applied_index{vhost=\"/\",queue=\"q\"} 12345\n\
                    quorumq_raft_applied_index_x{vhost=\"/\",queue=\"q\"} 1\n";
        assert_eq!(
            metric_of(page, "quorumq_raft_applied_index", "q"),
            Some(12345)
        );
        assert_eq!(metric_of(page, "quorumq_raft_applied_index", "none"), None);
        assert_eq!(metric_of(page, "quorumq_raft_commit_index", "q"), None);
    }
}
