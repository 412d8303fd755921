//! Expiry on the leader: `Expire` when a message deadline (TTL, Get lease, delayed requeue) is
//! due, `ExpireQueue` when the queue may be unused for its `x-expires`, and then its deletion.
//!
//! The decision is [`Deadlines`]: when its timer wakes ([`Deadlines::wake`]) and what is due
//! at a wall time ([`Deadlines::due`]), both read from the node's clock, so that the timer and
//! the wall time stamped into `Expire` agree (a paused or simulated clock moves both).

use qq_core::meta::MetaCommand;
use qq_core::queue::{Command, Reply};
use tokio::time::Instant;
use tracing::{debug, info};

use super::{PROPOSAL_RETRY, QueueLeader, Timers};
use crate::clock::Clock;

/// The queue state's expiry deadlines, in wall milliseconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadlines {
    /// The earliest message deadline (TTL, Get lease, delayed requeue).
    pub(super) messages_ms: Option<u64>,
    /// When the queue may be unused for its `x-expires`.
    pub(super) queue_ms: Option<u64>,
}

/// What is due at a wall time.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Due {
    /// Ask the state whether the queue expired (`ExpireQueue`); first, as it may delete it.
    Queue,
    /// Expire messages (`Expire`).
    Messages,
    Nothing,
}

impl Deadlines {
    /// What is due at `now_ms`.
    pub(super) fn due(&self, now_ms: u64) -> Due {
        if self.queue_ms.is_some_and(|d| d <= now_ms) {
            Due::Queue
        } else if self.messages_ms.is_some_and(|d| d <= now_ms) {
            Due::Messages
        } else {
            Due::Nothing
        }
    }

    /// When the earliest deadline falls due by `clock`.
    pub(super) fn wake(&self, clock: Clock) -> Option<Instant> {
        [self.messages_ms, self.queue_ms]
            .into_iter()
            .flatten()
            .min()
            .map(|ms| clock.instant_at_ms(ms))
    }
}

impl QueueLeader {
    /// The state's expiry deadlines as this leader sees them.
    pub(super) fn expiry_deadlines(&self) -> Deadlines {
        self.machine.with_state(|s| Deadlines {
            messages_ms: s.next_deadline(),
            queue_ms: s.queue_expiry_due_ms(self.leader_since_ms),
        })
    }

    /// Propose Expire / ExpireQueue if due. Returns true when the queue expired and its
    /// deletion was committed.
    pub(super) async fn expire_due(&self, timers: &mut Timers) -> bool {
        let clock = self.ctx.clock;
        if timers.expire_retry.is_some_and(|t| t > clock.now()) {
            return false;
        }
        timers.expire_retry = None;
        let now = clock.now_ms();
        match self.expiry_deadlines().due(now) {
            Due::Queue => {
                if self.expire_queue(now).await {
                    return true;
                }
                timers.expire_retry = Some(clock.now() + PROPOSAL_RETRY);
            }
            Due::Messages => {
                if let Err(e) = self.propose(Command::Expire { now_ms: now }).await {
                    debug!("expire not applied: {e}");
                    timers.expire_retry = Some(clock.now() + PROPOSAL_RETRY);
                }
            }
            Due::Nothing => {}
        }
        false
    }

    /// `ExpireQueue` at `now_ms`, then the queue's deletion if the state answers that it
    /// expired. True when the deletion was committed.
    async fn expire_queue(&self, now_ms: u64) -> bool {
        let cmd = Command::ExpireQueue {
            now_ms,
            leader_since_ms: self.leader_since_ms,
        };
        match self.propose(cmd).await {
            Ok(Reply::QueueExpiry { expired: true }) => {
                // Unused for x-expires: the queue is deleted, its messages are not
                // dead-lettered.
                info!("queue unused for x-expires: deleting it");
                let (vhost, name) = self
                    .machine
                    .with_state(|s| (s.config().vhost.clone(), s.config().name.clone()));
                match self
                    .ctx
                    .proposer
                    .propose_meta(MetaCommand::DeleteQueue { vhost, name })
                    .await
                {
                    Ok(_) => return true,
                    Err(e) => debug!("queue expiry not applied yet: {e}"),
                }
            }
            // Used meanwhile: look again after a pause rather than at once.
            Ok(_) => {}
            Err(e) => debug!("queue expiry check not applied: {e}"),
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The leader's expiry timer and the wall time it stamps come from one clock: under
    /// tokio's paused clock, a deadline 1.5 s ahead is not due before its timer fires, and is
    /// due when it fires. With the wall time read from the system, as before `Clock`, the
    /// timer fired and nothing was due yet: the actor proposed nothing and woke again at once.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_is_due_when_its_timer_fires_and_not_before() {
        let clock = Clock::simulated(1_700_000_000_000);
        let start = clock.now_ms();
        let deadlines = Deadlines {
            messages_ms: Some(start + 1_500),
            queue_ms: Some(start + 4_000),
        };
        let wake = deadlines.wake(clock).expect("a deadline arms the timer");
        assert_eq!(deadlines.due(clock.now_ms()), Due::Nothing);
        tokio::time::advance(Duration::from_millis(1_499)).await;
        assert!(clock.now() < wake, "the timer has not fired yet");
        assert_eq!(deadlines.due(clock.now_ms()), Due::Nothing);
        tokio::time::advance(wake - clock.now()).await; // the timer fires
        assert_eq!(clock.now_ms(), start + 1_500);
        assert_eq!(deadlines.due(clock.now_ms()), Due::Messages);
        // Once the messages expired, the queue's own expiry is the next wake.
        let queue_only = Deadlines {
            messages_ms: None,
            ..deadlines
        };
        let wake = queue_only.wake(clock).expect("x-expires arms the timer");
        tokio::time::advance(wake - clock.now()).await;
        assert_eq!(clock.now_ms(), start + 4_000);
        assert_eq!(queue_only.due(clock.now_ms()), Due::Queue);
    }
}
