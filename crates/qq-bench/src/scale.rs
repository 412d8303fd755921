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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::System;
use crate::cluster::{Cluster, NODES, rss_kib};
use crate::delayed::idle_cpu_percent;
use crate::driver::{Conn, QueueSpec, qq_address};
use crate::erl_loop::{ErlLoop, rabbit_node};
use crate::load::Progress;
use crate::scenarios::{Better, Figure, Outcome, Settings};

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

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Declare,
    Delete,
}

/// What a run of declares or deletes did.
struct PoolRun {
    /// Indices done.
    done: Vec<usize>,
    elapsed: Duration,
    /// When `mark` of them were done.
    at_mark: Option<Duration>,
    errors: Vec<String>,
    failures: usize,
}

impl PoolRun {
    fn rate(&self) -> f64 {
        self.done.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A new [`crate::driver::Declarer`] on `conn` (a channel on RabbitMQ), if one opens within
/// 10 s.
async fn declarer(conn: &Conn) -> Option<crate::driver::Declarer> {
    tokio::time::timeout(Duration::from_secs(10), conn.declarer())
        .await
        .ok()?
        .ok()
}

/// Closes a RabbitMQ channel, giving up after 5 s (a broker in trouble may not answer).
async fn close(d: crate::driver::Declarer) {
    let _ = tokio::time::timeout(Duration::from_secs(5), d.close()).await;
}

/// Declares or deletes `names` through one connection to [`CLIENT_NODE`] with up to
/// `in_flight` at once, until all are done or `deadline` passes. A failed operation is
/// retried (after 200 ms, on a new channel for RabbitMQ) until the deadline.
async fn pool(
    system: System,
    names: Arc<Vec<String>>,
    op: Op,
    in_flight: usize,
    deadline: Duration,
    mark: usize,
    label: String,
) -> Result<PoolRun> {
    let conn = tokio::time::timeout(Duration::from_secs(30), Conn::connect(system, CLIENT_NODE))
        .await
        .context("connecting took over 30 s")??;
    let spec = QueueSpec {
        balanced: true,
        ..Default::default()
    };
    let next = Arc::new(AtomicUsize::new(0));
    let count = Arc::new(AtomicUsize::new(0));
    let at_mark: Arc<Mutex<Option<Duration>>> = Arc::default();
    let errors: Arc<Mutex<(Vec<String>, usize)>> = Arc::default();
    let start = Instant::now();
    let until = start + deadline;
    let total = names.len();
    let progress = {
        let count = count.clone();
        let mut last = (0usize, Instant::now());
        Progress::lines(label, move || {
            let c = count.load(Ordering::Relaxed);
            let rate = (c - last.0) as f64 / last.1.elapsed().as_secs_f64().max(1e-3);
            last = (c, Instant::now());
            format!(
                "{c} of {total} {} ({rate:.0}/s now, {:.0}/s avg)",
                if op == Op::Declare {
                    "declared"
                } else {
                    "deleted"
                },
                c as f64 / start.elapsed().as_secs_f64()
            )
        })
    };
    let mut workers = Vec::new();
    for _ in 0..in_flight.max(1) {
        let (conn, spec, names) = (conn.clone(), spec.clone(), names.clone());
        let (next, count, at_mark, errors) =
            (next.clone(), count.clone(), at_mark.clone(), errors.clone());
        workers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut last_done = Duration::ZERO;
            let mut d = declarer(&conn).await;
            'queues: loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(name) = names.get(i) else { break };
                loop {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break 'queues;
                    }
                    let attempt = async {
                        let Some(dec) = d.as_ref() else {
                            bail!("no channel");
                        };
                        match op {
                            Op::Declare => dec.declare(name, &spec).await,
                            Op::Delete => dec.delete(name).await,
                        }
                    };
                    let failed = match tokio::time::timeout(left, attempt).await {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(format!("{e:#}")),
                        Err(_) => break 'queues,
                    };
                    let Some(e) = failed else { break };
                    {
                        let mut errs = errors.lock().unwrap();
                        errs.1 += 1;
                        if errs.0.len() < KEEP_ERRORS {
                            errs.0.push(e);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    // A RabbitMQ channel is closed by the error: open another.
                    if let Some(old) = d.take() {
                        close(old).await;
                    }
                    d = declarer(&conn).await;
                }
                done.push(i);
                last_done = start.elapsed();
                if count.fetch_add(1, Ordering::Relaxed) + 1 == mark {
                    *at_mark.lock().unwrap() = Some(start.elapsed());
                }
            }
            if let Some(dec) = d {
                close(dec).await;
            }
            (done, last_done)
        }));
    }
    let mut done = Vec::new();
    // Until the last one done, or the deadline (closing channels is not timed).
    let mut elapsed = Duration::ZERO;
    for w in workers {
        let (d, last) = w.await.context("declare worker")?;
        done.extend(d);
        elapsed = elapsed.max(last);
    }
    if done.len() < total {
        elapsed = deadline;
    }
    progress.finish().await;
    let (errors, failures) = std::mem::take(&mut *errors.lock().unwrap());
    done.sort_unstable();
    let at_mark = *at_mark.lock().unwrap();
    Ok(PoolRun {
        done,
        elapsed,
        at_mark,
        errors,
        failures,
    })
}

fn pool_notes(out: &mut Outcome, what: &str, r: &PoolRun, total: usize, deadline: Duration) {
    let mut note = format!(
        "{what}: {} of {total} in {:.1} s ({:.1}/s)",
        r.done.len(),
        r.elapsed.as_secs_f64(),
        r.rate()
    );
    if r.done.len() < total {
        note.push_str(&format!(
            "; NOT reached in {:.0} s (the deadline)",
            deadline.as_secs_f64()
        ));
    }
    if r.failures > 0 {
        note.push_str(&format!(
            "; {} failed attempts were retried, e.g. {}",
            r.failures,
            r.errors.join(" | ")
        ));
    }
    out.notes.push(note);
}

/// quorumq: `ClusterStatus` of node `node`.
async fn qq_status(node: usize) -> Result<qq_client::ClusterStatusResponse> {
    let ask = async {
        let c = qq_client::Client::connect(&qq_address(node)).await?;
        anyhow::Ok(c.cluster_status().await?)
    };
    tokio::time::timeout(Duration::from_secs(5), ask)
        .await
        .context("ClusterStatus timed out")?
}

/// Erlang: `Names`, the Ra cluster names of the scenario's queues (the same on every node).
const RABBIT_NAMES: &str = r#"Names = [element(1, amqqueue:get_pid(Q)) || Q <- rabbit_amqqueue:list(<<"/">>),
    lists:prefix("bench-scale-", binary_to_list(element(4, amqqueue:get_name(Q))))],
Set = sets:from_list(Names),
LedOn = fun(N) ->
    case rpc:call(N, ets, tab2list, [ra_state], 2000) of
        L when is_list(L) -> sets:intersection(Set, sets:from_list([Nm || {Nm, leader} <- L]));
        _ -> sets:new()
    end
end,"#;

fn erl_nodes(nodes: &[usize]) -> String {
    let names: Vec<String> = nodes
        .iter()
        .map(|n| format!("'{}'", rabbit_node(*n)))
        .collect();
    format!("[{}]", names.join(", "))
}

/// Queues each node leads by its own account.
async fn leaders_per_node(cl: &Cluster) -> Result<[usize; NODES]> {
    let mut per = [0usize; NODES];
    match cl.system() {
        System::Quorumq | System::QuorumqAmqp => {
            for (n, count) in per.iter_mut().enumerate() {
                let st = qq_status(n).await?;
                *count = st
                    .queues
                    .iter()
                    .filter(|q| q.name.starts_with(PREFIX) && q.leader == n as u64 + 1)
                    .count();
            }
        }
        System::Rabbitmq => {
            let expr = format!(
                "{RABBIT_NAMES}\nlists:flatten([io_lib:format(\"~b \", [sets:size(LedOn(N))]) || N <- {}]).",
                erl_nodes(&[0, 1, 2])
            );
            let said = cl.rabbitmqctl(0, &["eval", &expr])?;
            let v: Vec<usize> = said
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|x| x.parse().ok())
                .collect();
            if v.len() != NODES {
                bail!("leaders per node: unexpected answer {said}");
            }
            per.copy_from_slice(&v);
        }
    }
    Ok(per)
}

/// What a failover and restart of one node measured.
struct Restart {
    victim: usize,
    led_before: [usize; NODES],
    failover_s: Option<f64>,
    led_at_end: usize,
    serves_s: Option<f64>,
    caught_up_s: Option<f64>,
    caught_up: usize,
    members: usize,
}

/// Polls `led` (how many of `total` are led, `None` when unreadable) every [`POLL`] until all
/// are or `deadline` passes; the time and the last count.
async fn wait_all(
    label: String,
    deadline: Duration,
    total: usize,
    mut led: impl AsyncFnMut() -> Option<usize>,
) -> (Option<f64>, usize) {
    let start = Instant::now();
    let seen = Arc::new(AtomicUsize::new(0));
    let progress = {
        let seen = seen.clone();
        Progress::lines(label, move || {
            format!("{} of {total}", seen.load(Ordering::Relaxed))
        })
    };
    let mut last = 0;
    let result = loop {
        if let Some(n) = led().await {
            last = n;
            seen.store(n, Ordering::Relaxed);
            if n >= total {
                break Some(start.elapsed().as_secs_f64());
            }
        }
        if start.elapsed() > deadline {
            break None;
        }
        tokio::time::sleep(POLL).await;
    };
    progress.finish().await;
    (result, last)
}

/// `kill -9` the node leading the most of `names`, time the failover, start it again and time
/// until it serves and its replicas have caught up.
async fn failover_and_restart(cl: &mut Cluster, s: &Settings, names: &[String]) -> Result<Restart> {
    let system = cl.system();
    let total = names.len();
    let led_before = leaders_per_node(cl).await?;
    let victim = (0..NODES).max_by_key(|n| led_before[*n]).unwrap_or(0);
    let alive: Vec<usize> = (0..NODES).filter(|n| *n != victim).collect();
    let wanted: HashSet<&str> = names.iter().map(String::as_str).collect();

    // RabbitMQ: the failover loop is running before the kill.
    let mut watch = None;
    if system == System::Rabbitmq {
        let step = format!(
            "begin Led = lists:foldl(fun(N, A) -> sets:union(A, LedOn(N)) end, sets:new(), {}), \
             io_lib:format(\"~b ~b\", [sets:size(Set), sets:size(Led)]) end",
            erl_nodes(&alive)
        );
        let l = ErlLoop::start(
            cl,
            alive[0],
            "scale-failover",
            RABBIT_NAMES,
            &step,
            POLL,
            FAILOVER_DEADLINE + Duration::from_secs(60),
        )?;
        wait_fresh(&l).await?;
        watch = Some(l);
    }

    cl.kill9(victim)?;
    let label = format!(
        "12 failover of {total} queues, node {} {system}",
        victim + 1
    );
    let (failover_s, led_at_end) = match &watch {
        Some(l) => {
            wait_all(label, FAILOVER_DEADLINE, total, async || {
                l.read(STALE).and_then(|v| usize::try_from(*v.get(1)?).ok())
            })
            .await
        }
        None => {
            wait_all(label, FAILOVER_DEADLINE, total, async || {
                let mut led: HashSet<String> = HashSet::new();
                for &n in &alive {
                    let st = qq_status(n).await.ok()?;
                    led.extend(
                        st.queues
                            .into_iter()
                            .filter(|q| {
                                q.leader == n as u64 + 1 && wanted.contains(q.name.as_str())
                            })
                            .map(|q| q.name),
                    );
                }
                Some(led.len())
            })
            .await
        }
    };
    if let Some(l) = watch.take() {
        l.stop();
    }

    // Restart: what the live replicas have applied now is what the restarted ones must reach.
    let mut watch = None;
    let mut targets: HashMap<String, u64> = HashMap::new();
    match system {
        System::Rabbitmq => {
            let prelude = format!(
                r#"{RABBIT_NAMES}
F = fun(_) -> ok end,
Applied = fun(Node) ->
    case rpc:call(Node, erlang, apply, [fun() ->
            [case catch ra:local_query({{Nm, node()}}, F, 2000) of
                 {{ok, {{{{I, _}}, _}}, _}} -> I;
                 _ -> -1
             end || Nm <- Names]
        end, []], 600000) of
        L when is_list(L) -> L;
        _ -> [-1 || _ <- Names]
    end
end,
Targets = maps:from_list(lists:zip(Names, lists:foldl(
    fun(Node, Acc) -> lists:zipwith(fun erlang:max/2, Applied(Node), Acc) end,
    [-1 || _ <- Names], {alive}))),
put(remaining, Names),"#,
                alive = erl_nodes(&alive)
            );
            let step = format!(
                r#"begin
    Rem = get(remaining),
    Up = case rpc:call('{victim}', erlang, apply, [fun() ->
            States = maps:from_list(ets:tab2list(ra_state)),
            [{{Nm, I}} || Nm <- Rem, lists:member(maps:get(Nm, States, none), [leader, follower]),
                        {{ok, {{{{I, _}}, _}}, {{_, _}}}} <- [catch ra:local_query({{Nm, node()}}, F, 1000)]]
        end, []], 60000) of
        U when is_list(U) -> U;
        _ -> []
    end,
    Done = sets:from_list([Nm || {{Nm, I}} <- Up, I >= maps:get(Nm, Targets)]),
    Left = [Nm || Nm <- Rem, not sets:is_element(Nm, Done)],
    put(remaining, Left),
    io_lib:format("~b ~b", [length(Names), length(Names) - length(Left)])
end"#,
                victim = rabbit_node(victim)
            );
            let l = ErlLoop::start(
                cl,
                alive[0],
                "scale-restart",
                &prelude,
                &step,
                Duration::from_millis(500),
                s.scale_deadline + Duration::from_secs(60),
            )?;
            wait_fresh(&l).await?;
            watch = Some(l);
        }
        System::Quorumq | System::QuorumqAmqp => {
            for &n in &alive {
                for q in qq_status(n).await?.queues {
                    if wanted.contains(q.name.as_str()) {
                        let t = targets.entry(q.name).or_default();
                        *t = (*t).max(q.local_last_applied);
                    }
                }
            }
        }
    }
    cl.start_node(victim)?;
    let started = Instant::now();
    let serves_at: Arc<Mutex<Option<f64>>> = Arc::default();
    let label = format!(
        "12 restart of node {} with {total} queues {system}",
        victim + 1
    );
    let (caught_up_s, caught_up) = {
        let cl: &Cluster = cl;
        let serves_at = serves_at.clone();
        let check_serves = async move || {
            let mut at = serves_at.lock().unwrap().is_some();
            if !at && cl.answers(victim).await {
                *serves_at.lock().unwrap() = Some(started.elapsed().as_secs_f64());
                at = true;
            }
            at
        };
        match &watch {
            Some(l) => {
                wait_all(label, s.scale_deadline, total, async || {
                    check_serves().await;
                    l.read(STALE).and_then(|v| usize::try_from(*v.get(1)?).ok())
                })
                .await
            }
            None => {
                wait_all(label, s.scale_deadline, total, async || {
                    if !check_serves().await {
                        return Some(0);
                    }
                    let st = qq_status(victim).await.ok()?;
                    Some(
                        st.queues
                            .iter()
                            .filter(|q| {
                                targets.get(&q.name).is_some_and(|t| {
                                    q.local_member && q.leader != 0 && q.local_last_applied >= *t
                                })
                            })
                            .count(),
                    )
                })
                .await
            }
        }
    };
    if let Some(l) = watch.take() {
        l.stop();
    }
    // The node must serve for what follows, whatever the figures say.
    let waited = cl.wait_serving(victim, s.scale_deadline).await;
    let serves_s = *serves_at.lock().unwrap();
    let serves_s = serves_s.or_else(|| waited.ok().map(|_| started.elapsed().as_secs_f64()));
    Ok(Restart {
        victim,
        led_before,
        failover_s,
        led_at_end,
        serves_s,
        caught_up_s,
        caught_up,
        members: total,
    })
}

/// Waits until an [`ErlLoop`] has written its first line (its prelude is done).
async fn wait_fresh(l: &ErlLoop) -> Result<()> {
    let start = Instant::now();
    while l.read(STALE).is_none() {
        if start.elapsed() > Duration::from_secs(120) {
            bail!("the RabbitMQ loop wrote nothing in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn report_restart(out: &mut Outcome, n: usize, r: &Restart, s: &Settings) {
    let victim = r.victim + 1;
    match r.failover_s {
        Some(t) => out.figure(
            12,
            &format!("failover, {n} queues: all led elsewhere"),
            "s",
            Better::Lower,
            t,
        ),
        None => missing(
            out,
            format!("failover, {n} queues: all led elsewhere"),
            "s",
            Better::Lower,
        ),
    }
    out.notes.push(format!(
        "{n} queues: killed node {victim} (kill -9), which led {} (leaders per node before: {}); \
         {}",
        r.led_before[r.victim],
        r.led_before.map(|c| c.to_string()).join("/"),
        match r.failover_s {
            Some(t) => format!("every queue had a leader on a live node {t:.2} s later"),
            None => format!(
                "NOT reached in {:.0} s: {} of {n} led on a live node at the end",
                FAILOVER_DEADLINE.as_secs_f64(),
                r.led_at_end
            ),
        }
    ));
    for (what, v) in [
        ("serves again", r.serves_s),
        ("every replica caught up", r.caught_up_s),
    ] {
        let name = format!("restart, {n} queues: {what}");
        match v {
            Some(t) => out.figure(12, &name, "s", Better::Lower, t),
            None => missing(out, name, "s", Better::Lower),
        }
    }
    out.notes.push(format!(
        "{n} queues: node {victim} started again; {}; {}",
        r.serves_s
            .map_or("it did not answer a client".into(), |t| format!(
                "answered a client {t:.1} s after its start"
            )),
        match r.caught_up_s {
            Some(t) => format!("all {} of its replicas caught up at {t:.1} s", r.members),
            None => format!(
                "NOT reached in {:.0} s: {} of its {} replicas caught up",
                s.scale_deadline.as_secs_f64(),
                r.caught_up,
                r.members
            ),
        }
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

pub async fn many_idle_queues(cl: &mut Cluster, s: &Settings) -> Result<Outcome> {
    let mut counts = s.scale_queues.clone();
    counts.sort_unstable();
    counts.dedup();
    counts.retain(|n| *n > 0);
    let (Some(&a), Some(&b)) = (counts.first(), counts.last()) else {
        bail!("--scale-queues names no count");
    };
    let mut out = Outcome::default();
    let mut shown = (0, 0);
    let system = cl.system();
    let k = s.scale_in_flight.max(1);
    let names_b: Arc<Vec<String>> = Arc::new((0..b).map(queue_name).collect());
    let names_a: Arc<Vec<String>> = Arc::new(names_b[..a].to_vec());

    // 1. Idle, no queues.
    let base = idle(cl, s, 0).await?;
    report_idle(&mut out, 0, &base, None);
    show(&out, system, &mut shown);

    // 2. Declare A one after another; 3. and 4.
    let serial = format!("declare {a}, one after another");
    let serial = phase(
        &mut out,
        system,
        &names_a,
        Op::Declare,
        1,
        s,
        a,
        &serial,
        true,
    )
    .await?;
    show(&out, system, &mut shown);
    // Idle with A is measured here, or after the pipelined declare when this one fell short.
    let idle_a = serial.done.len() == a;
    if idle_a {
        loaded(cl, s, &mut out, &names_a, &base, true).await?;
        show(&out, system, &mut shown);
    } else {
        out.notes.push(format!(
            "idle, failover and restart with {a} queues skipped: not all were declared"
        ));
    }

    // 5. Delete the A queues (every name: one cut off by the deadline may exist).
    cl.ensure_up(s.scale_deadline).await?;
    let del = format!("delete {a}, {k} in flight");
    let deleted = phase(&mut out, system, &names_a, Op::Delete, k, s, a, &del, true).await?;
    show(&out, system, &mut shown);
    if deleted.done.len() < a {
        bail!("the {a} queues could not all be deleted; stopping here");
    }

    // 6. Declare B pipelined, on the empty cluster; the rate of the first A too.
    let piped = format!("declare {b}, {k} in flight");
    let piped = phase(
        &mut out,
        system,
        &names_b,
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
        Some(t) => out.figure(
            12,
            &first,
            "queues/s",
            Better::Higher,
            a as f64 / t.as_secs_f64(),
        ),
        None => missing(&mut out, first, "queues/s", Better::Higher),
    }
    show(&out, system, &mut shown);
    if piped.done.len() == b {
        // 7. and 8.
        loaded(cl, s, &mut out, &names_b, &base, b > a || !idle_a).await?;
        show(&out, system, &mut shown);
    } else {
        out.notes.push(format!(
            "idle, failover and restart with {b} queues skipped: {} of {b} declared in {:.0} s",
            piped.done.len(),
            s.scale_deadline.as_secs_f64()
        ));
        // What the queues that were declared cost, as a note (no row: the count differs).
        let n = piped.done.len();
        if n > 0 {
            let part = idle(cl, s, n).await?;
            let mut partial = Outcome::default();
            report_idle(&mut partial, n, &part, Some(&base));
            for f in partial.figures {
                out.notes.push(format!(
                    "with the {n} declared: {} {:.1} {}",
                    f.name,
                    f.value.unwrap_or(f64::NAN),
                    f.unit
                ));
            }
            out.notes.extend(partial.notes);
            show(&out, system, &mut shown);
        }
    }

    // 9. Clean up. Nothing is measured here, so a cluster that cannot be cleaned up (RabbitMQ
    // with 7 743 queues at 115 % of a core: its node 1 did not answer for 300 s) is a note,
    // and the figures above are kept; the next scenario starts on fresh clusters.
    let clean = format!("clean-up: delete {b}, {k} in flight");
    let cleaned = async {
        cl.ensure_up(s.scale_deadline).await?;
        phase(
            &mut out,
            system,
            &names_b,
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
        out.notes
            .push(format!("clean-up failed (nothing measured there): {e:#}"));
    }
    Ok(out)
}
