//! Scenario 12, many queues (issue 14's scale figures): what idle queues cost, how fast a
//! client creates them, and how long failover and a node restart take with thousands of them.
//!
//! The counts come from `--scale-queues` (default `1000,10000`; `--quick` `50,200`): the
//! smallest, A, and the largest, B. Every queue is a three-replica quorum queue named
//! `bench-scale-NNNNN`; RabbitMQ's are declared with `x-queue-leader-locator=balanced` so that
//! their leaders spread over the nodes as quorumq's do. The run, on each system:
//!
//! 1. **Idle, no queues**: after [`Settings::scale_settle`] of quiet, the CPU of the three node
//!    processes together (utime + stime from `/proc/<pid>/stat`, `scale_cpu_samples` samples of
//!    3 s, the median, in % of one core) and the sum of their RSS.
//! 2. **Declare A, one after another**, from one client connection (node 1): rate and time.
//! 3. **Idle with A queues**, as in 1; RSS per idle queue = (RSS_A − RSS_0) / A.
//! 4. **Failover and restart with A queues**: `kill -9` the node that leads the most queues,
//!    time until every queue has a leader on a live node (polled every [`POLL`]); then start
//!    it again and time until it serves (answers a client) and until every one of its replicas
//!    runs, knows a leader and has applied what the leaders had applied when it was started.
//! 5. **Delete the A queues**, `scale_in_flight` in flight: the delete rate.
//! 6. **Declare B, `scale_in_flight` in flight**, on the empty cluster: the rate over the first
//!    A queues done and over all B.
//! 7. **Idle with B queues**, as in 3 (skipped when B = A and 3 was measured).
//! 8. **Failover and restart with B queues**, as in 4.
//! 9. The B queues are deleted (`scale_in_flight` in flight).
//!
//! Every phase has a deadline (`scale_deadline` for declares, deletes and restarts,
//! [`FAILOVER_DEADLINE`] for a failover); a phase that does not finish in time is reported as
//! "not reached in X s" with how far it got, and what depends on it is skipped with a note.
//!
//! "In flight": quorumq's client sends up to that many `DeclareQueue` requests at once over its
//! one HTTP/2 connection; RabbitMQ's connection opens that many channels, each declaring one
//! queue after another (an AMQP channel has one synchronous method outstanding at a time).
//!
//! How "led" and "caught up" are read. quorumq: `ClusterStatus` of each node lists every
//! queue with the leader its replica knows, whether it runs a replica and how far that replica
//! has applied. A queue is led when a live node reports itself as its leader; a restarted
//! node's replica is caught up when the node runs it, knows a leader and has applied at least
//! the highest index the other nodes' replicas had applied when it was started. RabbitMQ: the
//! same from Ra inside the nodes (`ra_state` says which local servers lead; `ra:local_query`
//! gives a server's applied index and known leader), read by one [`ErlLoop`] on a live node.
//!
//! Not in the default set of `make bench` (tens of minutes with 10 000 queues): `--scenarios
//! 12`.
//!
//! The rooms: this file holds the run, step by step, and the idle measurements; `pool` the
//! declares and deletes; `restart` the failover and restart.

mod pool;
mod restart;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use self::pool::{Op, PoolRun, pool, pool_notes};
use self::restart::{failover_and_restart, report_restart};
use crate::System;
use crate::cluster::{Cluster, NODES, rss_kib};
use crate::delayed::idle_cpu_percent;
use crate::scenarios::{Better, Figure, Outcome, Settings};

/// The prefix of the scenario's queue names.
const PREFIX: &str = "bench-scale-";
/// The client's node.
const CLIENT_NODE: usize = 0;
/// How often failover and restart progress is read.
const POLL: Duration = Duration::from_millis(200);
/// A failover not complete by then is reported as not reached.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(120);
/// A RabbitMQ loop line older than this is not used.
const STALE: Duration = Duration::from_secs(5);
/// Errors kept per phase for the notes.
const KEEP_ERRORS: usize = 3;

fn queue_name(i: usize) -> String {
    format!("{PREFIX}{i:05}")
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn missing(out: &mut Outcome, name: String, unit: &'static str, better: Better) {
    out.figures.push(Figure {
        scenario: 12,
        name,
        unit,
        better,
        value: None,
    });
}

/// CPU and memory of the idle cluster.
struct Idle {
    cpu: f64,
    samples: Vec<f64>,
    rss_kib: Vec<u64>,
}

impl Idle {
    fn total_kib(&self) -> u64 {
        self.rss_kib.iter().sum()
    }
}

async fn idle(cl: &Cluster, s: &Settings, queues: usize) -> Result<Idle> {
    eprintln!(
        "  [12 idle with {queues} queues {}] {:.0} s settle, then {} CPU samples of 3 s",
        cl.system(),
        s.scale_settle.as_secs_f64(),
        s.scale_cpu_samples
    );
    tokio::time::sleep(s.scale_settle).await;
    let pids: Vec<u32> = (0..NODES)
        .map(|n| {
            cl.pid(n)
                .with_context(|| format!("node {} is not running", n + 1))
        })
        .collect::<Result<_>>()?;
    let (cpu, samples) = idle_cpu_percent(&pids, s.scale_cpu_samples).await?;
    let rss_kib = pids.iter().map(|p| rss_kib(*p).unwrap_or(0)).collect();
    Ok(Idle {
        cpu,
        samples,
        rss_kib,
    })
}

fn report_idle(out: &mut Outcome, n: usize, it: &Idle, base: Option<&Idle>) {
    out.figure(
        12,
        &format!("CPU, {n} idle queues"),
        "% core",
        Better::Lower,
        it.cpu,
    );
    out.figure(
        12,
        &format!("RSS, {n} idle queues"),
        "MiB",
        Better::Lower,
        mib(it.total_kib()),
    );
    if let Some(b) = base
        && n > 0
    {
        let per = (it.total_kib() as f64 - b.total_kib() as f64) / n as f64;
        out.figure(
            12,
            &format!("RSS per idle queue, {n}"),
            "KiB",
            Better::Lower,
            per,
        );
    }
    out.notes.push(format!(
        "{n} idle queues: CPU samples (% core, 3 nodes) {}; RSS MiB per node {}",
        it.samples
            .iter()
            .map(|v| format!("{v:.1}"))
            .collect::<Vec<_>>()
            .join(" "),
        it.rss_kib
            .iter()
            .map(|k| format!("{:.0}", mib(*k)))
            .collect::<Vec<_>>()
            .join("/")
    ));
}

/// Prints what was added to `out` since the last call (`shown`: figures and notes printed so
/// far), so that a run interrupted later still shows what was measured.
fn show(out: &Outcome, system: System, shown: &mut (usize, usize)) {
    for f in &out.figures[shown.0..] {
        let v = f.value.map_or("n/a".into(), |v| format!("{v:.2}"));
        eprintln!("  measured: {system} 12 {}: {v} {}", f.name, f.unit);
    }
    for n in &out.notes[shown.1..] {
        eprintln!("  measured: {system} note: {n}");
    }
    *shown = (out.figures.len(), out.notes.len());
}

/// One declare or delete phase through [`pool`], reported: its note, and its rate as the
/// figure `name` (queues/s) when `figure`.
#[allow(clippy::too_many_arguments)]
async fn phase(
    out: &mut Outcome,
    system: System,
    names: &Arc<Vec<String>>,
    op: Op,
    in_flight: usize,
    s: &Settings,
    mark: usize,
    name: &str,
    figure: bool,
) -> Result<PoolRun> {
    let r = pool(
        system,
        names.clone(),
        op,
        in_flight,
        s.scale_deadline,
        mark,
        format!("12 {name} {system}"),
    )
    .await?;
    pool_notes(out, name, &r, names.len(), s.scale_deadline);
    if figure {
        out.figure(12, name, "queues/s", Better::Higher, r.rate());
    }
    Ok(r)
}

/// With `names` declared: idle CPU and RSS (when `measure_idle`), then failover and restart.
async fn loaded(
    cl: &mut Cluster,
    s: &Settings,
    out: &mut Outcome,
    names: &[String],
    base: &Idle,
    measure_idle: bool,
) -> Result<()> {
    let n = names.len();
    if measure_idle {
        let it = idle(cl, s, n).await?;
        report_idle(out, n, &it, Some(base));
    }
    match failover_and_restart(cl, s, names).await {
        Ok(r) => report_restart(out, n, &r, s),
        Err(e) => out
            .notes
            .push(format!("failed: failover and restart with {n}: {e:#}")),
    }
    Ok(())
}

/// The counts and names of a run, and what it has reported so far.
struct Run {
    system: System,
    out: Outcome,
    /// Figures and notes printed so far ([`show`]).
    shown: (usize, usize),
    /// The smallest and the largest count, and the declares or deletes in flight.
    a: usize,
    b: usize,
    k: usize,
    names_a: Arc<Vec<String>>,
    names_b: Arc<Vec<String>>,
}

pub async fn many_idle_queues(cl: &mut Cluster, s: &Settings) -> Result<Outcome> {
    let mut counts = s.scale_queues.clone();
    counts.sort_unstable();
    counts.dedup();
    counts.retain(|n| *n > 0);
    let (Some(&a), Some(&b)) = (counts.first(), counts.last()) else {
        bail!("--scale-queues names no count");
    };
    let names_b: Arc<Vec<String>> = Arc::new((0..b).map(queue_name).collect());
    let mut run = Run {
        system: cl.system(),
        out: Outcome::default(),
        shown: (0, 0),
        a,
        b,
        k: s.scale_in_flight.max(1),
        names_a: Arc::new(names_b[..a].to_vec()),
        names_b,
    };

    // 1. Idle, no queues.
    let base = idle(cl, s, 0).await?;
    report_idle(&mut run.out, 0, &base, None);
    run.show();
    // 2., 3. and 4.
    let idle_a = run.serial(cl, s, &base).await?;
    // 5.
    run.delete_a(cl, s).await?;
    // 6., 7. and 8.
    run.pipelined(cl, s, &base, idle_a).await?;
    // 9.
    run.clean_up(cl, s).await;
    Ok(run.out)
}

impl Run {
    fn show(&mut self) {
        show(&self.out, self.system, &mut self.shown);
    }

    /// 2. Declare A one after another; 3. and 4. with them. Whether idle with A was measured
    /// (else it is after the pipelined declare: this one fell short).
    async fn serial(&mut self, cl: &mut Cluster, s: &Settings, base: &Idle) -> Result<bool> {
        let a = self.a;
        let serial = format!("declare {a}, one after another");
        let names = self.names_a.clone();
        let serial = phase(
            &mut self.out,
            self.system,
            &names,
            Op::Declare,
            1,
            s,
            a,
            &serial,
            true,
        )
        .await?;
        self.show();
        let idle_a = serial.done.len() == a;
        if idle_a {
            loaded(cl, s, &mut self.out, &names, base, true).await?;
            self.show();
        } else {
            self.out.notes.push(format!(
                "idle, failover and restart with {a} queues skipped: not all were declared"
            ));
        }
        Ok(idle_a)
    }

    /// 5. Delete the A queues (every name: one cut off by the deadline may exist).
    async fn delete_a(&mut self, cl: &mut Cluster, s: &Settings) -> Result<()> {
        let (a, k) = (self.a, self.k);
        cl.ensure_up(s.scale_deadline).await?;
        let del = format!("delete {a}, {k} in flight");
        let names = self.names_a.clone();
        let deleted = phase(
            &mut self.out,
            self.system,
            &names,
            Op::Delete,
            k,
            s,
            a,
            &del,
            true,
        )
        .await?;
        self.show();
        if deleted.done.len() < a {
            bail!("the {a} queues could not all be deleted; stopping here");
        }
        Ok(())
    }

    /// 6. Declare B pipelined, on the empty cluster; the rate of the first A too. Then 7. and
    /// 8. with them.
    async fn pipelined(
        &mut self,
        cl: &mut Cluster,
        s: &Settings,
        base: &Idle,
        idle_a: bool,
    ) -> Result<()> {
        let (a, b, k) = (self.a, self.b, self.k);
        let piped = format!("declare {b}, {k} in flight");
        let names = self.names_b.clone();
        let piped = phase(
            &mut self.out,
            self.system,
            &names,
            Op::Declare,
            k,
            s,
            a,
            &piped,
            b > a,
        )
        .await?;
        let first = format!("declare {a}, {k} in flight");
        match piped.at_mark {
            Some(t) => self.out.figure(
                12,
                &first,
                "queues/s",
                Better::Higher,
                a as f64 / t.as_secs_f64(),
            ),
            None => missing(&mut self.out, first, "queues/s", Better::Higher),
        }
        self.show();
        if piped.done.len() == b {
            loaded(cl, s, &mut self.out, &names, base, b > a || !idle_a).await?;
            self.show();
        } else {
            self.out.notes.push(format!(
                "idle, failover and restart with {b} queues skipped: {} of {b} declared in {:.0} s",
                piped.done.len(),
                s.scale_deadline.as_secs_f64()
            ));
            self.partial_idle(cl, s, base, piped.done.len()).await?;
        }
        Ok(())
    }

    /// What the `n` queues that were declared cost, as notes (no row: the count differs).
    async fn partial_idle(
        &mut self,
        cl: &Cluster,
        s: &Settings,
        base: &Idle,
        n: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let part = idle(cl, s, n).await?;
        let mut partial = Outcome::default();
        report_idle(&mut partial, n, &part, Some(base));
        for f in partial.figures {
            self.out.notes.push(format!(
                "with the {n} declared: {} {:.1} {}",
                f.name,
                f.value.unwrap_or(f64::NAN),
                f.unit
            ));
        }
        self.out.notes.extend(partial.notes);
        self.show();
        Ok(())
    }

    /// 9. Clean up. Nothing is measured here, so a cluster that cannot be cleaned up (RabbitMQ
    /// with 7 743 queues at 115 % of a core: its node 1 did not answer for 300 s) is a note,
    /// and the figures above are kept; the next scenario starts on fresh clusters.
    async fn clean_up(&mut self, cl: &mut Cluster, s: &Settings) {
        let (b, k) = (self.b, self.k);
        let clean = format!("clean-up: delete {b}, {k} in flight");
        let names = self.names_b.clone();
        let cleaned = async {
            cl.ensure_up(s.scale_deadline).await?;
            phase(
                &mut self.out,
                self.system,
                &names,
                Op::Delete,
                k,
                s,
                b,
                &clean,
                false,
            )
            .await
        }
        .await;
        if let Err(e) = cleaned {
            self.out
                .notes
                .push(format!("clean-up failed (nothing measured there): {e:#}"));
        }
    }
}
