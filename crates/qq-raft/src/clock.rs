//! The clock of a node: the one way qq-raft and qq-node read the time, handed in when the node
//! starts (real in production, [`Clock::system`]; simulated in tests and the simulator,
//! [`Clock::simulated`]).
//!
//! It lives here, in the lowest crate that reads the time, so that qq-raft's own reads (the
//! batched streams' pauses in [`crate::mux`]) and qq-node's go through the same clock; qq-node
//! re-exports it as `qq_node::clock::Clock`, whose module documentation says who holds it and
//! what stays outside it.

use std::sync::atomic::{AtomicI64, Ordering};
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
    /// Wall time as tokio's instant moves: `epoch_ms_at_start + (now - start)`, plus the
    /// jump a simulator set (if it holds one: [`Clock::jumpable`]).
    Simulated {
        start: Instant,
        epoch_ms_at_start: u64,
        jump_ms: Option<&'static AtomicI64>,
    },
}

/// The simulator's hold on a node's wall clock: [`WallJump::set`] moves it (forward or back)
/// by that many milliseconds from where it would be, until set again. The monotonic reading
/// ([`Clock::now`]) never jumps, as a real system's does not.
#[derive(Clone, Copy, Debug)]
pub struct WallJump(&'static AtomicI64);

impl WallJump {
    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::Relaxed);
    }
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
                jump_ms: None,
            },
        }
    }

    /// A simulated clock (as [`Clock::simulated`]) whose wall time the returned [`WallJump`]
    /// can move. For the cluster simulator: each call keeps a few bytes for the life of the
    /// process (the clock is `Copy`, so the jump it reads is `'static`).
    pub fn jumpable(epoch_ms_at_start: u64) -> (Clock, WallJump) {
        let jump: &'static AtomicI64 = Box::leak(Box::new(AtomicI64::new(0)));
        let clock = Clock {
            source: Source::Simulated {
                start: Instant::now(),
                epoch_ms_at_start,
                jump_ms: Some(jump),
            },
        };
        (clock, WallJump(jump))
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
                jump_ms,
            } => {
                let since = Instant::now().saturating_duration_since(start);
                let ms = epoch_ms_at_start.saturating_add(since.as_millis() as u64);
                let jump = jump_ms.map_or(0, |j| j.load(Ordering::Relaxed));
                ms.saturating_add_signed(jump)
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

    #[tokio::test(start_paused = true)]
    async fn a_jump_moves_wall_time_only() {
        let (clock, jump) = Clock::jumpable(1_000_000);
        let start = clock.now();
        jump.set(-5_000);
        assert_eq!(clock.now_ms(), 995_000);
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(clock.now_ms(), 995_100);
        assert_eq!(
            clock.elapsed(start),
            Duration::from_millis(100),
            "monotonic: no jump"
        );
        jump.set(2_000);
        assert_eq!(clock.now_ms(), 1_002_100);
        jump.set(0);
        assert_eq!(clock.now_ms(), 1_000_100);
    }

    #[test]
    fn the_system_clock_reads_wall_time() {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let read = Clock::system().now_ms();
        assert!(read >= wall.as_millis() as u64);
    }
}
