//! Where a fixed-rate run's slowest confirms fall in time: bunched into a few moments (one
//! thing stalled everything in flight) or spread over the run (a steady cost on some
//! messages). Scenario 2 prints it as a note beside the percentiles.

use std::collections::BTreeMap;

use crate::load::percentile;

/// The width of the windows the run is cut into, by send time.
pub const WINDOW_NS: u64 = 100_000_000;

/// Confirms slower than the run's p99 (the slowest 1 % at most), by send time.
#[derive(Debug, PartialEq)]
pub struct SlowConfirms {
    /// The run's p99, in microseconds: the bar.
    pub p99_us: u32,
    /// Confirms slower than it.
    pub slow: usize,
    /// Windows of [`WINDOW_NS`] from the first send to the last.
    pub windows: u64,
    /// Windows holding at least one of them.
    pub windows_with_slow: usize,
    /// Slow confirms in the window that held the most.
    pub most_in_one_window: usize,
    /// The windows holding the most of them (at most [`SHOWN`], in time order): the start of
    /// each, in ms from the first send, and how many it held.
    pub busiest: Vec<(u64, usize)>,
    /// The first send ([`crate::load::now_ns`]): where the windows start.
    pub first_sent_ns: u64,
}

/// How many of the busiest windows the note names.
pub const SHOWN: usize = 5;

/// `latency_us[i]` is the confirm latency of the message sent at `sent_ns[i]`. None without
/// samples (or when the two lists do not match).
pub fn slow_confirms(sent_ns: &[u64], latency_us: &[u32]) -> Option<SlowConfirms> {
    if sent_ns.is_empty() || sent_ns.len() != latency_us.len() {
        return None;
    }
    let mut sorted = latency_us.to_vec();
    sorted.sort_unstable();
    let p99_us = percentile(&sorted, 99.0)? as u32;
    let first = *sent_ns.iter().min()?;
    let last = *sent_ns.iter().max()?;
    let mut per_window: BTreeMap<u64, usize> = BTreeMap::new();
    for (sent, us) in sent_ns.iter().zip(latency_us) {
        if *us > p99_us {
            *per_window.entry((sent - first) / WINDOW_NS).or_default() += 1;
        }
    }
    let mut busiest: Vec<(u64, usize)> = per_window.iter().map(|(w, n)| (*w, *n)).collect();
    busiest.sort_by_key(|(w, n)| (std::cmp::Reverse(*n), *w));
    busiest.truncate(SHOWN);
    busiest.sort_unstable();
    let busiest = busiest
        .into_iter()
        .map(|(w, n)| (w * WINDOW_NS / 1_000_000, n))
        .collect();
    Some(SlowConfirms {
        busiest,
        first_sent_ns: first,
        p99_us,
        slow: per_window.values().sum(),
        windows: (last - first) / WINDOW_NS + 1,
        windows_with_slow: per_window.len(),
        most_in_one_window: per_window.values().copied().max().unwrap_or(0),
    })
}

impl SlowConfirms {
    pub fn note(&self) -> String {
        format!(
            "confirms slower than the p99 ({:.2} ms): {} sent in {} of the run's {} windows of {} ms \
             (the busiest held {}; the busiest at {} from the first send, sent at {} UTC): few \
             windows mean the tail is moments that held up everything in flight, many mean it \
             is spread over the run",
            f64::from(self.p99_us) / 1000.0,
            self.slow,
            self.windows_with_slow,
            self.windows,
            WINDOW_NS / 1_000_000,
            self.most_in_one_window,
            self.busiest
                .iter()
                .map(|(at, n)| format!("{:.1} s ({n})", *at as f64 / 1000.0))
                .collect::<Vec<_>>()
                .join(", "),
            crate::load::wall(self.first_sent_ns)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_stall_bunches_the_slow_confirms_into_its_window() {
        // 1 000 messages, one every ms; those sent 500-509 ms in waited 50 ms.
        let sent: Vec<u64> = (0..1000).map(|i| 7 * MS + i * MS).collect();
        let us: Vec<u32> = (0..1000)
            .map(|i| {
                if (500..510).contains(&i) {
                    50_000
                } else {
                    2_000
                }
            })
            .collect();
        let s = slow_confirms(&sent, &us).unwrap();
        assert_eq!(s.p99_us, 2_000);
        assert_eq!(s.slow, 10);
        assert_eq!(s.windows, 10);
        assert_eq!(s.windows_with_slow, 1);
        assert_eq!(s.most_in_one_window, 10);
        assert_eq!(s.busiest, vec![(500, 10)]);
        assert!(s.note().contains("the busiest at 0.5 s (10)"));
    }

    #[test]
    fn a_spread_tail_touches_many_windows() {
        // Every hundredth message is slow: one in each window.
        let sent: Vec<u64> = (0..1000).map(|i| i * MS).collect();
        let us: Vec<u32> = (0..1000)
            .map(|i| if i % 100 == 42 { 9_000 } else { 2_000 })
            .collect();
        let s = slow_confirms(&sent, &us).unwrap();
        assert_eq!(s.p99_us, 2_000);
        assert_eq!(
            (s.slow, s.windows_with_slow, s.most_in_one_window),
            (10, 10, 1)
        );
        assert!(s.note().contains("10 of the run's 10 windows of 100 ms"));
        // Ties: the first five in time.
        assert_eq!(
            s.busiest,
            vec![(0, 1), (100, 1), (200, 1), (300, 1), (400, 1)]
        );
    }

    #[test]
    fn nothing_to_say_without_samples_or_with_lists_that_differ() {
        assert_eq!(slow_confirms(&[], &[]), None);
        assert_eq!(slow_confirms(&[1, 2], &[5]), None);
    }
}
