//! Publish and deliver rates for the queues page, from the counters each queue's leader already
//! keeps (`Stats::enqueued_total`, `Stats::delivered_total`, replicated state, so a leader
//! change does not reset them), between two page views kept in memory.
//!
//! A rate is the difference of two samples at least [`MIN_INTERVAL`] apart, over their time
//! apart; until a queue has two such samples (its first view, or a view within
//! `MIN_INTERVAL` of the first) there is no rate, and the page says so. At most
//! [`MAX_TRACKED`] queues are tracked; at the bound the table is emptied and rates start over.
//!
//! Must not: invent a number: no rate without two real samples.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Queues whose samples are kept, at most.
pub const MAX_TRACKED: usize = 10_000;
/// Two samples closer than this are not used for a rate (the newer one is not kept either).
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    enqueued: u64,
    delivered: u64,
}

/// Messages per second into and out of a queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub publish: f64,
    pub deliver: f64,
}

#[derive(Default)]
struct Track {
    previous: Option<Sample>,
    last: Option<Sample>,
}

#[derive(Default)]
pub struct Rates {
    queues: Mutex<HashMap<u64, Track>>,
}

impl Rates {
    /// Records the counters of queue `id` at `at` (the node's clock) and returns its rate, if
    /// two samples exist.
    pub fn observe(&self, id: u64, enqueued: u64, delivered: u64, at: Instant) -> Option<Rate> {
        let mut queues = self.queues.lock().unwrap();
        if queues.len() >= MAX_TRACKED && !queues.contains_key(&id) {
            queues.clear();
        }
        let track = queues.entry(id).or_default();
        let now = Sample {
            at,
            enqueued,
            delivered,
        };
        match track.last {
            Some(last) if at.saturating_duration_since(last.at) >= MIN_INTERVAL => {
                track.previous = Some(last);
                track.last = Some(now);
            }
            Some(_) => {}
            None => track.last = Some(now),
        }
        let (Some(a), Some(b)) = (track.previous, track.last) else {
            return None;
        };
        let seconds = b.at.saturating_duration_since(a.at).as_secs_f64();
        (seconds > 0.0).then(|| Rate {
            publish: b.enqueued.saturating_sub(a.enqueued) as f64 / seconds,
            deliver: b.delivered.saturating_sub(a.delivered) as f64 / seconds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_needs_two_samples_apart() {
        let rates = Rates::default();
        let t0 = Instant::now();
        assert_eq!(rates.observe(1, 100, 10, t0), None);
        // Too soon: no rate, and the sample is not kept.
        assert_eq!(
            rates.observe(1, 150, 10, t0 + Duration::from_millis(10)),
            None
        );
        let r = rates
            .observe(1, 300, 60, t0 + Duration::from_secs(2))
            .unwrap();
        assert_eq!(
            r,
            Rate {
                publish: 100.0,
                deliver: 25.0
            }
        );
        // A view soon after shows the same rate.
        let again = rates
            .observe(1, 310, 60, t0 + Duration::from_millis(2100))
            .unwrap();
        assert_eq!(again, r);
        // Another queue starts with nothing.
        assert_eq!(rates.observe(2, 5, 5, t0 + Duration::from_secs(2)), None);
    }
}
