//! The load generators every scenario is built from: a windowed (optionally rate-limited)
//! publisher loop, a consumer loop that acknowledges or rejects every message, shared counters,
//! latency samples and the progress line.
//!
//! Each message body carries its id and the time it was sent (nanoseconds since the benchmark
//! started, one clock in one process), so the consumer measures publish→deliver latency without
//! any shared table; the publisher measures publish→confirm from its own send times.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use bytes::Bytes;
use futures::FutureExt;

use crate::driver::{Cons, Pub};

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Nanoseconds since the benchmark started.
pub fn now_ns() -> u64 {
    EPOCH.elapsed().as_nanos() as u64
}

/// The wall-clock time (UTC, `HH:MM:SS.mmm`) of a [`now_ns`] instant, to find it in node logs.
pub fn wall(ns: u64) -> String {
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

/// The id and send time carried in the first 16 bytes of every body.
const HEADER_BYTES: usize = 16;

/// A body of `size` bytes (at least 16) carrying `id` and the current time.
pub fn make_body(id: u64, size: usize) -> Bytes {
    let mut body = vec![0u8; size.max(HEADER_BYTES)];
    body[..8].copy_from_slice(&id.to_le_bytes());
    body[8..16].copy_from_slice(&now_ns().to_le_bytes());
    Bytes::from(body)
}

/// `(id, sent_ns)` of a body made by [`make_body`]; `None` for anything shorter.
pub fn parse_body(body: &[u8]) -> Option<(u64, u64)> {
    if body.len() < HEADER_BYTES {
        return None;
    }
    let id = u64::from_le_bytes(body[..8].try_into().ok()?);
    let sent = u64::from_le_bytes(body[8..16].try_into().ok()?);
    Some((id, sent))
}

/// Running totals of one scenario run, read by the progress line and by the scenario.
#[derive(Default)]
pub struct Counters {
    pub sent: AtomicU64,
    pub confirmed: AtomicU64,
    pub rejected: AtomicU64,
    pub delivered: AtomicU64,
}

impl Counters {
    pub fn confirmed(&self) -> u64 {
        self.confirmed.load(Ordering::Relaxed)
    }
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }
}

/// What a publisher loop does.
#[derive(Clone)]
pub struct PubPlan {
    /// Unconfirmed messages in flight at most.
    pub window: usize,
    /// Messages per second (`None`: as fast as the window allows).
    pub rate: Option<f64>,
    /// Stop after this many messages (`None`: until `stop`).
    pub count: Option<u64>,
    pub stop: Arc<AtomicBool>,
    pub body_bytes: usize,
    /// Ids are `first_id, first_id + 1, …`.
    pub first_id: u64,
    /// Latencies of messages sent before this time (ns, [`now_ns`]) are not recorded (warm-up).
    pub record_from_ns: u64,
}

#[derive(Default)]
pub struct PubOutcome {
    pub sent: u64,
    pub confirmed: u64,
    pub rejected: u64,
    /// publish→confirm latency of each recorded message, in microseconds.
    pub confirm_us: Vec<u32>,
    /// When each message of `confirm_us` was sent ([`now_ns`]), in the same order.
    pub confirm_sent_ns: Vec<u64>,
    /// The longest time, in nanoseconds, during which at least one publish was outstanding and
    /// no confirm (positive or negative) arrived: measured from the previous confirm, or from
    /// the send that ended a period with nothing in flight.
    pub max_confirm_gap_ns: u64,
    /// When that longest wait ended ([`now_ns`]).
    pub max_confirm_gap_end_ns: u64,
}

/// Send times of unconfirmed messages and what their confirms said.
struct Tracker {
    out: PubOutcome,
    sent_at: HashMap<u64, u64>,
    counters: Arc<Counters>,
    record_from_ns: u64,
    /// Since when the publisher has been waiting for its next confirm (see
    /// [`PubOutcome::max_confirm_gap_ns`]).
    waiting_since_ns: u64,
}

impl Tracker {
    fn sent(&mut self, seq: u64) {
        let now = now_ns();
        if self.sent_at.is_empty() {
            self.waiting_since_ns = now;
        }
        self.sent_at.insert(seq, now);
        self.out.sent += 1;
        self.counters.sent.fetch_add(1, Ordering::Relaxed);
    }

    fn confirmed(&mut self, seq: u64, ok: bool) {
        let now = now_ns();
        let gap = now.saturating_sub(self.waiting_since_ns);
        if gap > self.out.max_confirm_gap_ns {
            self.out.max_confirm_gap_ns = gap;
            self.out.max_confirm_gap_end_ns = now;
        }
        self.waiting_since_ns = now;
        let sent = self.sent_at.remove(&seq).unwrap_or(0);
        if ok {
            self.out.confirmed += 1;
            self.counters.confirmed.fetch_add(1, Ordering::Relaxed);
            if sent >= self.record_from_ns && sent > 0 {
                self.out.confirm_us.push(micros_since(sent));
                self.out.confirm_sent_ns.push(sent);
            }
        } else {
            self.out.rejected += 1;
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Microseconds from `sent_ns` to now, saturated into a u32 sample.
fn micros_since(sent_ns: u64) -> u32 {
    (now_ns().saturating_sub(sent_ns) / 1000).min(u64::from(u32::MAX)) as u32
}

/// Publishes until the plan says stop, then waits for every outstanding confirm.
pub async fn publish_loop(
    mut p: Pub,
    plan: PubPlan,
    counters: Arc<Counters>,
) -> Result<PubOutcome> {
    let mut t = Tracker {
        out: PubOutcome::default(),
        sent_at: HashMap::new(),
        counters,
        record_from_ns: plan.record_from_ns,
        waiting_since_ns: now_ns(),
    };
    let interval = plan.rate.map(|r| Duration::from_secs_f64(1.0 / r.max(1.0)));
    let mut next_send = tokio::time::Instant::now();
    loop {
        let done = plan.stop.load(Ordering::Relaxed) || plan.count.is_some_and(|c| t.out.sent >= c);
        if done {
            if p.in_flight() == 0 {
                break;
            }
            if let Some((seq, ok)) = p.next_confirm().await? {
                t.confirmed(seq, ok);
            }
            continue;
        }
        let slot_open = interval.is_none() || tokio::time::Instant::now() >= next_send;
        if p.in_flight() < plan.window && slot_open {
            let body = make_body(plan.first_id + t.out.sent, plan.body_bytes);
            let seq = p.send(body).await?;
            t.sent(seq);
            if let Some(iv) = interval {
                next_send += iv;
            }
            // Take the confirms that already arrived, so their latency is not inflated by us.
            while p.in_flight() > 0 {
                match p.next_confirm().now_or_never() {
                    Some(Ok(Some((seq, ok)))) => t.confirmed(seq, ok),
                    Some(Err(e)) => return Err(e),
                    _ => break,
                }
            }
            continue;
        }
        if p.in_flight() == 0 {
            tokio::time::sleep_until(next_send).await;
            continue;
        }
        // Wait for a confirm, or for the next send slot when one can be sent.
        let slot = if interval.is_some() && p.in_flight() < plan.window {
            next_send
        } else {
            tokio::time::Instant::now() + Duration::from_millis(50)
        };
        tokio::select! {
            c = p.next_confirm() => if let Some((seq, ok)) = c? { t.confirmed(seq, ok) },
            _ = tokio::time::sleep_until(slot) => {}
        }
    }
    Ok(t.out)
}

/// What a consumer loop does with each message and when it stops.
#[derive(Clone)]
pub struct ConsPlan {
    /// Reject (dead-letter) instead of acknowledging.
    pub reject: bool,
    pub stop: Arc<AtomicBool>,
    /// Stop after this many messages.
    pub count: Option<u64>,
    /// Stop when nothing arrived for this long.
    pub idle_timeout: Option<Duration>,
    /// Keep the id of every message received.
    pub collect_ids: bool,
    /// As in [`PubPlan::record_from_ns`].
    pub record_from_ns: u64,
}

#[derive(Default)]
pub struct ConsOutcome {
    pub received: u64,
    /// publish→deliver latency of each recorded message, in microseconds.
    pub deliver_us: Vec<u32>,
    pub ids: Vec<u64>,
    /// When the last message arrived.
    pub last_at: Option<Instant>,
    /// Why the subscription ended, when the server ended it.
    pub ended: Option<String>,
}

/// Consumes and settles one message at a time until the plan says stop.
pub async fn consume_loop(
    mut c: Cons,
    plan: ConsPlan,
    counters: Arc<Counters>,
) -> Result<ConsOutcome> {
    let mut out = ConsOutcome::default();
    let mut last = Instant::now();
    loop {
        if plan.stop.load(Ordering::Relaxed) || plan.count.is_some_and(|n| out.received >= n) {
            break;
        }
        let msg = match tokio::time::timeout(Duration::from_millis(100), c.next()).await {
            Err(_) => {
                if plan.idle_timeout.is_some_and(|t| last.elapsed() >= t) {
                    break;
                }
                continue;
            }
            Ok(Err(e)) => {
                out.ended = Some(e.to_string());
                break;
            }
            Ok(Ok(None)) => {
                out.ended = Some("subscription ended".into());
                break;
            }
            Ok(Ok(Some(m))) => m,
        };
        last = Instant::now();
        out.last_at = Some(last);
        if let Some((id, sent)) = parse_body(&msg.body) {
            if sent >= plan.record_from_ns && sent > 0 {
                out.deliver_us.push(micros_since(sent));
            }
            if plan.collect_ids {
                out.ids.push(id);
            }
        }
        if plan.reject {
            c.reject(&msg).await?;
        } else {
            c.ack(&msg).await?;
        }
        out.received += 1;
        counters.delivered.fetch_add(1, Ordering::Relaxed);
    }
    c.close().await;
    Ok(out)
}

/// Percentile `p` (0..=100) of sorted samples.
pub fn percentile(sorted: &[u32], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    // Nearest rank; the epsilon keeps 99.9% of 1000 at rank 999 despite floating point.
    let rank = ((p / 100.0) * sorted.len() as f64 - 1e-9).ceil() as usize;
    Some(f64::from(sorted[rank.clamp(1, sorted.len()) - 1]))
}

/// The progress line: scenario, elapsed time, counts and rates so far, redrawn every second on
/// a terminal (one line every five seconds otherwise). Stops when dropped.
pub struct Progress {
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    /// Confirms and deliveries of `counters`: totals, the rate since the last line, the
    /// average rate.
    pub fn start(label: String, counters: Arc<Counters>) -> Progress {
        let mut last = (0u64, 0u64, Instant::now());
        let start = Instant::now();
        Progress::lines(label, move || {
            let (c, d) = (counters.confirmed(), counters.delivered());
            let dt = last.2.elapsed().as_secs_f64().max(1e-3);
            let line = format!(
                "confirmed {c} ({:.0}/s now, {:.0}/s avg)  delivered {d} ({:.0}/s now)",
                (c - last.0) as f64 / dt,
                c as f64 / start.elapsed().as_secs_f64(),
                (d - last.1) as f64 / dt,
            );
            last = (c, d, Instant::now());
            line
        })
    }

    /// `[label] <seconds since the start>s <line()>`, the line made anew at every tick.
    pub fn lines(label: String, mut line: impl FnMut() -> String + Send + 'static) -> Progress {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let tty = std::io::stderr().is_terminal();
            let start = Instant::now();
            let period = if tty { 1 } else { 5 };
            let mut tick = tokio::time::interval(Duration::from_secs(period));
            tick.tick().await;
            loop {
                tick.tick().await;
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                let line = format!(
                    "  [{label}] {:6.1}s  {}",
                    start.elapsed().as_secs_f64(),
                    line()
                );
                let mut err = std::io::stderr();
                if tty {
                    let _ = write!(err, "\r{line}\x1b[K");
                } else {
                    let _ = writeln!(err, "{line}");
                }
                let _ = err.flush();
            }
            if tty {
                let _ = write!(std::io::stderr(), "\r\x1b[K");
            }
        });
        Progress {
            stop,
            task: Some(task),
        }
    }

    pub async fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
        if std::io::stderr().is_terminal() {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_carries_id_and_time() {
        let before = now_ns();
        let body = make_body(42, 1024);
        assert_eq!(body.len(), 1024);
        let (id, sent) = parse_body(&body).unwrap();
        assert_eq!(id, 42);
        assert!(sent >= before);
        assert_eq!(parse_body(b"short"), None);
        assert_eq!(make_body(1, 4).len(), HEADER_BYTES);
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<u32> = (1..=1000).collect();
        assert_eq!(percentile(&v, 50.0), Some(500.0));
        assert_eq!(percentile(&v, 99.0), Some(990.0));
        assert_eq!(percentile(&v, 99.9), Some(999.0));
        assert_eq!(percentile(&v, 100.0), Some(1000.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7], 0.0), Some(7.0));
    }
}
