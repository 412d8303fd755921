//! The node's clock: the one way qq-node reads the time, created once when the node starts
//! ([`crate::node::Node::start`]) and handed to what needs it.
//!
//! Two readings:
//! - [`Clock::now_ms`], wall time in milliseconds since the Unix epoch. It is what the leader
//!   actor and the proposing node stamp into the commands they propose (`Enqueue { now_ms }`,
//!   `Expire { now_ms }`, `Checkout`, `Settle`, `StartMove`, ...), and what a leader compares
//!   the state's deadlines with to know when to propose `Expire` or `ExpireQueue`. No state
//!   machine's apply reads it (nor any clock): time enters a queue's log only through commands
//!   stamped before they are proposed, so every replica applies the same time.
//! - [`Clock::now`], a monotonic [`tokio::time::Instant`], for deadlines and timers: the leader
//!   actor's timers, the proposer's retry deadlines, the supervisor's start retry, the sleep
//!   and unload of idle groups, membership changes' deadlines, the liveness handover, the
//!   AMQP refusal delay, the password cache and the management page's sessions and rates.
//!
//! Who holds it: the [`crate::node::Node`] (supervisor, unload sweep, consumer ids), the
//! [`crate::groups::registry::Registry`], the [`crate::proposer::Proposer`] (and through it
//! the enqueue path, consume sessions, dead letters and moves), the leader actors' context
//! ([`crate::leader::LeaderContext`]), the client API, its authentication and the management
//! page (through [`crate::node::Node::clock`]). Where a decision needs only the time (a
//! replica's sleep in [`crate::groups::residency`], the page's rates, the leader's rate-limited
//! drop lines) it takes the time as an argument instead.
//!
//! The real clock ([`Clock::system`]) reads the system's wall clock and tokio's instant. The
//! simulated one ([`Clock::simulated`]) derives wall time from tokio's instant, which a test
//! with `#[tokio::test(start_paused = true)]` (or a simulator driving tokio's clock) moves
//! with `tokio::time::advance`: both readings then advance together and nothing waits.
//!
//! Left out on purpose: durations measured only for a metric or a log line (`let started =
//! std::time::Instant::now(); ... started.elapsed()` in the proposer, the registry's loads, the
//! dead-letter rounds) stay on `std::time::Instant`: they decide nothing. tokio's `sleep`,
//! `interval` and `timeout` read tokio's clock themselves, the same source as [`Clock::now`],
//! so they follow a paused clock too. openraft (and qq-raft beneath it) keeps its own timers,
//! and the leader-lease checks on its `last_quorum_acked` ([`crate::groups::residency::wake_leader`],
//! the registry's leader-only reads) compare with openraft's own instants, on its runtime's
//! clock (tokio's as well).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// The node's clock. Cheap to copy: every task that reads the time holds one.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    source: Source,
}

#[derive(Clone, Copy, Debug)]
enum Source {
    /// The system's wall clock and tokio's instant.
    System,
    /// Wall time as tokio's instant moves: `epoch_ms_at_start + (now - start)`.
    Simulated {
        start: Instant,
        epoch_ms_at_start: u64,
    },
}

impl Clock {
    /// The real clock of a node in production.
    pub fn system() -> Clock {
        Clock {
            source: Source::System,
        }
    }

    /// A clock whose wall time is `epoch_ms_at_start` now and then moves only as tokio's
    /// clock does (paused in a test, driven by a simulator).
    pub fn simulated(epoch_ms_at_start: u64) -> Clock {
        Clock {
            source: Source::Simulated {
                start: Instant::now(),
                epoch_ms_at_start,
            },
        }
    }

    /// Milliseconds since the Unix epoch (0 if the system clock is before it).
    pub fn now_ms(&self) -> u64 {
        match self.source {
            Source::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            Source::Simulated {
                start,
                epoch_ms_at_start,
            } => {
                let since = Instant::now().saturating_duration_since(start);
                epoch_ms_at_start.saturating_add(since.as_millis() as u64)
            }
        }
    }

    /// The monotonic now, for deadlines and timers.
    pub fn now(&self) -> Instant {
        Instant::now()
    }

    /// The instant at which this clock's wall time reads `at_ms` (now if that is past): how a
    /// deadline the state holds in wall milliseconds becomes a timer.
    pub fn instant_at_ms(&self, at_ms: u64) -> Instant {
        let (now, now_ms) = (self.now(), self.now_ms());
        now + Duration::from_millis(at_ms.saturating_sub(now_ms))
    }

    /// How long ago `since` was (zero if it is not past).
    pub fn elapsed(&self, since: Instant) -> Duration {
        self.now().saturating_duration_since(since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_simulated_clock_moves_only_with_tokio_time() {
        let clock = Clock::simulated(1_000_000);
        let start = clock.now();
        assert_eq!(clock.now_ms(), 1_000_000);
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert_eq!(clock.now_ms(), 1_001_500);
        assert_eq!(clock.elapsed(start), Duration::from_millis(1_500));
    }

    #[test]
    fn the_system_clock_reads_wall_time() {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let read = Clock::system().now_ms();
        assert!(read >= wall.as_millis() as u64);
    }
}
