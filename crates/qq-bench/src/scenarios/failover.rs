//! Scenario 5: failover. The leader of a queue is killed (kill -9) under publish load; how long
//! until publishes are confirmed again, and whether a confirmed message was lost. The publisher
//! reconnects and resends as an application would.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{Better, Outcome, Settings, consumer_with_retry, declare_on, delete_queues, secs};
use crate::System;
use crate::cluster::{Cluster, NODES};
use crate::driver::{Conn, Pub, QueueSpec};
use crate::load::{ConsOutcome, ConsPlan, Counters, Progress, consume_loop, make_body, now_ns};

/// 5. Failover: kill -9 the leader of a queue under publish load; time until publishes are
/// confirmed again; confirmed messages lost.
pub async fn failover(cl: &mut Cluster, s: &Settings) -> Result<Outcome> {
    let q = "bench-failover".to_string();
    let leader = declare_on(cl, 0, &q, &QueueSpec::default()).await?;
    let via = (leader + 1) % NODES;
    let system = cl.system();
    let (report, times) = kill_under_load(cl, s, &q, leader, via).await?;
    let mut out = Outcome::default();
    match Some(times.recovered_at_ns.load(Ordering::SeqCst)).filter(|t| *t != u64::MAX) {
        Some(t) => out.figure(
            5,
            "kill -9 leader → confirms again",
            "s",
            Better::Lower,
            t.saturating_sub(times.killed_at_ns.load(Ordering::SeqCst)) as f64 / 1e9,
        ),
        None => out
            .notes
            .push("no publish was confirmed after the kill within 60 s".into()),
    }
    // Everything confirmed must be in the queue: drain it through the surviving node.
    let drained = drain_through(system, via, &q, s.prefetch).await?;
    let received: HashSet<u64> = drained.ids.iter().copied().collect();
    let lost = report
        .confirmed_ids
        .iter()
        .filter(|id| !received.contains(id))
        .count();
    out.figure(
        5,
        "confirmed messages lost",
        "msgs",
        Better::Zero,
        lost as f64,
    );
    out.notes.push(format!(
        "killed node {} (leader), published via node {}; {} confirmed, {} received ({} distinct), {} reconnects{}",
        leader + 1,
        via + 1,
        report.confirmed_ids.len(),
        drained.received,
        received.len(),
        report.reconnects,
        drained
            .ended
            .map(|e| format!("; drain ended: {e}"))
            .unwrap_or_default()
    ));
    // Bring the killed node back for the next scenarios.
    cl.start_node(leader)?;
    cl.wait_serving(leader, Duration::from_secs(120)).await?;
    delete_queues(cl, &[q]).await;
    Ok(out)
}

/// Publishes to `queue` through node `via`, kills `leader` after the warm-up, publishes until
/// confirms flow again and then some more (60 s at most), and waits for every confirm.
async fn kill_under_load(
    cl: &mut Cluster,
    s: &Settings,
    queue: &str,
    leader: usize,
    via: usize,
) -> Result<(FailoverReport, KillTimes)> {
    let system = cl.system();
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let times = KillTimes {
        killed_at_ns: Arc::new(AtomicU64::new(u64::MAX)),
        recovered_at_ns: Arc::new(AtomicU64::new(u64::MAX)),
    };
    let publisher = tokio::spawn(resilient_publisher(
        system,
        via,
        queue.to_string(),
        s.window,
        s.body_bytes,
        stop.clone(),
        times.clone(),
        counters.clone(),
    ));
    let progress = Progress::start(format!("5 failover {system}"), counters.clone());
    tokio::time::sleep(secs(s.failover_before_s)).await;
    times.killed_at_ns.store(now_ns(), Ordering::SeqCst);
    let kill_result = cl.kill9(leader);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && times.recovered_at_ns.load(Ordering::SeqCst) == u64::MAX {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(secs(s.failover_after_s)).await;
    stop.store(true, Ordering::Relaxed);
    progress.finish().await;
    kill_result?;
    let report = tokio::time::timeout(Duration::from_secs(90), publisher)
        .await
        .context("the failover publisher did not finish")??;
    Ok((report?, times))
}

/// Consumes everything in `queue` through `node`, keeping the ids, until 5 s pass idle.
async fn drain_through(
    system: System,
    node: usize,
    queue: &str,
    prefetch: u16,
) -> Result<ConsOutcome> {
    let conn = Conn::connect(system, node).await?;
    let cons = consumer_with_retry(&conn, queue, prefetch).await?;
    consume_loop(
        cons,
        ConsPlan {
            reject: false,
            stop: Arc::new(AtomicBool::new(false)),
            count: None,
            idle_timeout: Some(Duration::from_secs(5)),
            collect_ids: true,
            record_from_ns: u64::MAX,
        },
        Arc::new(Counters::default()),
    )
    .await
}

/// When the leader was killed and when publishing was confirmed again (ns, `u64::MAX` = not
/// yet).
#[derive(Clone)]
struct KillTimes {
    killed_at_ns: Arc<AtomicU64>,
    recovered_at_ns: Arc<AtomicU64>,
}

struct FailoverReport {
    confirmed_ids: Vec<u64>,
    reconnects: u32,
}

/// Publishes unique ids through `node`, keeping `window` in flight; on any error (a broken
/// stream, UNAVAILABLE during the election, a negative confirm) it backs off, opens a new
/// publisher and sends every unconfirmed id again. Stops when told and everything is confirmed.
#[allow(clippy::too_many_arguments)]
async fn resilient_publisher(
    system: System,
    node: usize,
    queue: String,
    window: usize,
    body_bytes: usize,
    stop: Arc<AtomicBool>,
    times: KillTimes,
    counters: Arc<Counters>,
) -> Result<FailoverReport> {
    let mut r = Resilient {
        report: FailoverReport {
            confirmed_ids: Vec::new(),
            reconnects: 0,
        },
        next_id: 0,
        backoff: Duration::from_millis(20),
        unconfirmed: BTreeSet::new(),
        stopping_since: None,
        stop,
        counters,
        times,
        window,
        body_bytes,
    };
    let give_up = Duration::from_secs(60);
    loop {
        if r.stop.load(Ordering::Relaxed) && r.unconfirmed.is_empty() {
            break;
        }
        if r.stopping_since.is_some_and(|t| t.elapsed() > give_up) {
            bail!(
                "{} ids still unconfirmed 60 s after the end",
                r.unconfirmed.len()
            );
        }
        let opened = async {
            let conn = Conn::connect(system, node).await?;
            conn.publisher(&queue, window).await
        };
        let mut p = match opened.await {
            Ok(p) => p,
            Err(_) => {
                r.back_off().await;
                continue;
            }
        };
        if let Ended::AllConfirmed = r.publish_on(&mut p).await {
            break;
        }
        r.report.reconnects += 1;
        r.back_off().await;
    }
    Ok(r.report)
}

/// What the failover publisher carries from one publisher (stream) to the next.
struct Resilient {
    report: FailoverReport,
    next_id: u64,
    backoff: Duration,
    /// Ids sent and not confirmed, to send again on a new publisher.
    unconfirmed: BTreeSet<u64>,
    stopping_since: Option<Instant>,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    times: KillTimes,
    window: usize,
    body_bytes: usize,
}

/// How one publisher's turn ended.
enum Ended {
    /// Told to stop, and every id is confirmed.
    AllConfirmed,
    /// A send, a confirm or the stream failed, or a confirm was negative: open a new one.
    Broken,
}

impl Resilient {
    async fn back_off(&mut self) {
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(Duration::from_millis(400));
    }

    /// Sends (the unconfirmed ids first) and settles on `p` until it breaks, or until told to
    /// stop and everything is confirmed.
    async fn publish_on(&mut self, p: &mut Pub) -> Ended {
        // seq of this publisher -> (id, send time)
        let mut in_flight: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut resend: Vec<u64> = self.unconfirmed.iter().copied().collect();
        resend.reverse();
        loop {
            let stopping = self.stop.load(Ordering::Relaxed);
            if stopping && self.stopping_since.is_none() {
                self.stopping_since = Some(Instant::now());
            }
            if stopping && self.unconfirmed.is_empty() {
                return Ended::AllConfirmed;
            }
            let can_send = p.in_flight() < self.window && (!resend.is_empty() || !stopping);
            let sent = if can_send {
                let id = resend.pop().unwrap_or_else(|| {
                    self.next_id += 1;
                    self.next_id
                });
                match p.send(make_body(id, self.body_bytes)).await {
                    Ok(seq) => {
                        in_flight.insert(seq, (id, now_ns()));
                        self.unconfirmed.insert(id);
                        self.counters.sent.fetch_add(1, Ordering::Relaxed);
                        true
                    }
                    Err(_) => {
                        self.unconfirmed.insert(id);
                        return Ended::Broken;
                    }
                }
            } else {
                false
            };
            let got = match next_confirm(p, sent && p.in_flight() < self.window).await {
                None => continue,
                Some(got) => got,
            };
            match got {
                Ok(None) => continue,
                Err(_) => return Ended::Broken,
                Ok(Some((seq, ok))) => {
                    let settled = settle(
                        &mut in_flight,
                        &mut self.unconfirmed,
                        &mut self.report,
                        &self.counters,
                        &self.times,
                        seq,
                        ok,
                    );
                    if !settled {
                        return Ended::Broken;
                    }
                    self.backoff = Duration::from_millis(20);
                }
            }
        }
    }
}

/// The next confirm of `p`: after a send with room left only one that is already there,
/// otherwise one within 200 ms. None: none came.
async fn next_confirm(p: &mut Pub, just_sent: bool) -> Option<Result<Option<(u64, bool)>>> {
    if just_sent {
        use futures::FutureExt;
        p.next_confirm().now_or_never()
    } else {
        tokio::time::timeout(Duration::from_millis(200), p.next_confirm())
            .await
            .ok()
    }
}

/// Records one confirm of the failover publisher; false when it was negative (reconnect).
fn settle(
    in_flight: &mut HashMap<u64, (u64, u64)>,
    unconfirmed: &mut BTreeSet<u64>,
    report: &mut FailoverReport,
    counters: &Counters,
    times: &KillTimes,
    seq: u64,
    ok: bool,
) -> bool {
    let Some((id, sent_ns)) = in_flight.remove(&seq) else {
        return true;
    };
    if !ok {
        return false;
    }
    if unconfirmed.remove(&id) {
        report.confirmed_ids.push(id);
        counters.confirmed.fetch_add(1, Ordering::Relaxed);
    }
    // The first confirm of a message sent after the kill: publishing works again.
    if sent_ns > times.killed_at_ns.load(Ordering::SeqCst) {
        let _ = times.recovered_at_ns.compare_exchange(
            u64::MAX,
            now_ns(),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }
    true
}
