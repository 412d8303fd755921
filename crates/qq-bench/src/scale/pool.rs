//! Declares and deletes many queues from one client connection, several in flight, each
//! retried until a deadline (steps 2, 5, 6 and 9 of scenario 12).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{CLIENT_NODE, KEEP_ERRORS};
use crate::System;
use crate::driver::{Conn, Declarer, QueueSpec};
use crate::load::Progress;
use crate::scenarios::Outcome;

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Op {
    Declare,
    Delete,
}

/// What a run of declares or deletes did.
pub(super) struct PoolRun {
    /// Indices done.
    pub(super) done: Vec<usize>,
    elapsed: Duration,
    /// When `mark` of them were done.
    pub(super) at_mark: Option<Duration>,
    errors: Vec<String>,
    failures: usize,
}

impl PoolRun {
    pub(super) fn rate(&self) -> f64 {
        self.done.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A new [`Declarer`] on `conn` (a channel on RabbitMQ), if one opens within
/// 10 s.
async fn declarer(conn: &Conn) -> Option<Declarer> {
    tokio::time::timeout(Duration::from_secs(10), conn.declarer())
        .await
        .ok()?
        .ok()
}

/// Closes a RabbitMQ channel, giving up after 5 s (a broker in trouble may not answer).
async fn close(d: Declarer) {
    let _ = tokio::time::timeout(Duration::from_secs(5), d.close()).await;
}

/// What the workers of one [`pool`] share.
#[derive(Clone)]
struct Workers {
    conn: Conn,
    spec: QueueSpec,
    names: Arc<Vec<String>>,
    op: Op,
    /// The next index to take.
    next: Arc<AtomicUsize>,
    /// Indices done so far, by all.
    count: Arc<AtomicUsize>,
    mark: usize,
    at_mark: Arc<Mutex<Option<Duration>>>,
    /// The first [`KEEP_ERRORS`] errors, and how many attempts failed.
    errors: Arc<Mutex<(Vec<String>, usize)>>,
    start: Instant,
    until: Instant,
}

impl Workers {
    /// One worker: takes the next index until none is left or the deadline passes; the
    /// indices it did and when it did its last.
    async fn work(self) -> (Vec<usize>, Duration) {
        let mut done = Vec::new();
        let mut last_done = Duration::ZERO;
        let mut d = declarer(&self.conn).await;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(name) = self.names.get(i) else { break };
            if !self.one(name, &mut d).await {
                break;
            }
            done.push(i);
            last_done = self.start.elapsed();
            if self.count.fetch_add(1, Ordering::Relaxed) + 1 == self.mark {
                *self.at_mark.lock().unwrap() = Some(self.start.elapsed());
            }
        }
        if let Some(dec) = d {
            close(dec).await;
        }
        (done, last_done)
    }

    /// Declares or deletes `name` on `d`, retried after each failure (on a new channel for
    /// RabbitMQ); false when the deadline passed first.
    async fn one(&self, name: &str, d: &mut Option<Declarer>) -> bool {
        loop {
            let left = self.until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let attempt = async {
                let Some(dec) = d.as_ref() else {
                    bail!("no channel");
                };
                match self.op {
                    Op::Declare => dec.declare(name, &self.spec).await,
                    Op::Delete => dec.delete(name).await,
                }
            };
            let failed = match tokio::time::timeout(left, attempt).await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("{e:#}")),
                Err(_) => return false,
            };
            let Some(e) = failed else { return true };
            {
                let mut errs = self.errors.lock().unwrap();
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
            *d = declarer(&self.conn).await;
        }
    }

    /// A line every few seconds: how many are done, at what rate.
    fn progress(&self, label: String) -> Progress {
        let (count, start, total, op) = (self.count.clone(), self.start, self.names.len(), self.op);
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
    }
}

/// Declares or deletes `names` through one connection to [`CLIENT_NODE`] with up to
/// `in_flight` at once, until all are done or `deadline` passes. A failed operation is
/// retried (after 200 ms, on a new channel for RabbitMQ) until the deadline.
pub(super) async fn pool(
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
    let start = Instant::now();
    let total = names.len();
    let workers = Workers {
        conn,
        spec: QueueSpec {
            balanced: true,
            ..Default::default()
        },
        names,
        op,
        next: Arc::default(),
        count: Arc::default(),
        mark,
        at_mark: Arc::default(),
        errors: Arc::default(),
        start,
        until: start + deadline,
    };
    let progress = workers.progress(label);
    let running: Vec<_> = (0..in_flight.max(1))
        .map(|_| tokio::spawn(workers.clone().work()))
        .collect();
    let mut done = Vec::new();
    // Until the last one done, or the deadline (closing channels is not timed).
    let mut elapsed = Duration::ZERO;
    for w in running {
        let (d, last) = w.await.context("declare worker")?;
        done.extend(d);
        elapsed = elapsed.max(last);
    }
    if done.len() < total {
        elapsed = deadline;
    }
    progress.finish().await;
    let (errors, failures) = std::mem::take(&mut *workers.errors.lock().unwrap());
    done.sort_unstable();
    let at_mark = *workers.at_mark.lock().unwrap();
    Ok(PoolRun {
        done,
        elapsed,
        at_mark,
        errors,
        failures,
    })
}

pub(super) fn pool_notes(
    out: &mut Outcome,
    what: &str,
    r: &PoolRun,
    total: usize,
    deadline: Duration,
) {
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
