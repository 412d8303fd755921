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

use super::{PROPOSAL_RETRY, QueueLeader};
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

/// The expiry sub-machine: when to look at the state's deadlines and what to propose then.
/// Its deadline is a retry pause after a failed proposal, else the state's earliest deadline.
#[derive(Debug, Default)]
pub(super) struct Expiry {
    /// Not before this is anything proposed again (a proposal failed, or the queue was used).
    retry_at: Option<Instant>,
    /// When the state's earliest deadline falls due, as the last turn saw it.
    wake: Option<Instant>,
}

/// What the expiry machine hears.
#[derive(Debug)]
pub(super) enum ExpiryEvent {
    /// A turn of the actor's loop: the state's deadlines now, and when they fall due.
    Turn {
        now_ms: u64,
        deadlines: Deadlines,
        wake: Option<Instant>,
    },
    /// What it asked for did not happen (a proposal failed, or the queue was used meanwhile):
    /// ask again after [`PROPOSAL_RETRY`].
    Failed,
    /// The state's deadlines moved (after a proposal): they fall due at `wake`.
    Rearmed { wake: Option<Instant> },
}

/// What the expiry machine asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ExpiryAction {
    /// `ExpireQueue`, and the queue's deletion if the state answers expired.
    ExpireQueue { now_ms: u64 },
    /// `Expire`.
    Expire { now_ms: u64 },
}

impl Expiry {
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.retry_at.or(self.wake)
    }

    pub(super) fn on_event(&mut self, now: Instant, event: ExpiryEvent) -> Vec<ExpiryAction> {
        match event {
            ExpiryEvent::Turn {
                now_ms,
                deadlines,
                wake,
            } => {
                self.wake = wake;
                if self.retry_at.is_some_and(|t| t > now) {
                    return vec![];
                }
                self.retry_at = None;
                match deadlines.due(now_ms) {
                    Due::Queue => vec![ExpiryAction::ExpireQueue { now_ms }],
                    Due::Messages => vec![ExpiryAction::Expire { now_ms }],
                    Due::Nothing => vec![],
                }
            }
            ExpiryEvent::Failed => {
                self.retry_at = Some(now + PROPOSAL_RETRY);
                vec![]
            }
            ExpiryEvent::Rearmed { wake } => {
                self.wake = wake;
                vec![]
            }
        }
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

    /// Feed the expiry machine this turn's deadlines and carry out what it asks. Returns true
    /// when the queue expired and its deletion was committed.
    pub(super) async fn expire_due(&self, expiry: &mut Expiry) -> bool {
        let clock = self.ctx.clock;
        let deadlines = self.expiry_deadlines();
        let turn = ExpiryEvent::Turn {
            now_ms: clock.now_ms(),
            deadlines,
            wake: deadlines.wake(clock),
        };
        let actions = expiry.on_event(clock.now(), turn);
        if actions.is_empty() {
            return false;
        }
        for action in actions {
            let done = match action {
                ExpiryAction::ExpireQueue { now_ms } => match self.expire_queue(now_ms).await {
                    QueueExpiry::Deleted => return true,
                    QueueExpiry::Kept => false,
                },
                ExpiryAction::Expire { now_ms } => {
                    match self.propose(Command::Expire { now_ms }).await {
                        Ok(_) => true,
                        Err(e) => {
                            debug!("expire not applied: {e}");
                            false
                        }
                    }
                }
            };
            if !done {
                expiry.on_event(clock.now(), ExpiryEvent::Failed);
            }
        }
        // What was proposed moved the state's deadlines.
        let wake = self.expiry_deadlines().wake(clock);
        expiry.on_event(clock.now(), ExpiryEvent::Rearmed { wake });
        false
    }

    /// `ExpireQueue` at `now_ms`, then the queue's deletion if the state answers that it
    /// expired.
    async fn expire_queue(&self, now_ms: u64) -> QueueExpiry {
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
                    Ok(_) => return QueueExpiry::Deleted,
                    Err(e) => debug!("queue expiry not applied yet: {e}"),
                }
            }
            // Used meanwhile: look again after a pause rather than at once.
            Ok(_) => {}
            Err(e) => debug!("queue expiry check not applied: {e}"),
        }
        QueueExpiry::Kept
    }
}

/// What became of an `ExpireQueue`.
enum QueueExpiry {
    /// Expired, and its deletion committed.
    Deleted,
    /// Used meanwhile, or a proposal failed.
    Kept,
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

    fn turn(now_ms: u64, messages_ms: Option<u64>, wake: Option<Instant>) -> ExpiryEvent {
        ExpiryEvent::Turn {
            now_ms,
            deadlines: Deadlines {
                messages_ms,
                queue_ms: None,
            },
            wake,
        }
    }

    #[test]
    fn the_machine_proposes_what_is_due_and_waits_for_the_state_deadline() {
        let t0 = Instant::now();
        let mut expiry = Expiry::default();
        let wake = t0 + Duration::from_millis(1_500);
        assert_eq!(
            expiry.on_event(t0, turn(1_000, Some(2_500), Some(wake))),
            vec![]
        );
        assert_eq!(expiry.next_deadline(), Some(wake));
        let actions = expiry.on_event(wake, turn(2_500, Some(2_500), Some(wake)));
        assert_eq!(actions, vec![ExpiryAction::Expire { now_ms: 2_500 }]);
        // The expired messages leave no deadline behind.
        expiry.on_event(wake, ExpiryEvent::Rearmed { wake: None });
        assert_eq!(expiry.next_deadline(), None);
    }

    #[test]
    fn a_failed_proposal_is_retried_after_a_pause_not_at_once() {
        let t0 = Instant::now();
        let mut expiry = Expiry::default();
        let due = turn(2_000, Some(1_000), Some(t0));
        assert_eq!(expiry.on_event(t0, due).len(), 1);
        expiry.on_event(t0, ExpiryEvent::Failed);
        // The deadline is still past, but the pause holds the next proposal back.
        assert_eq!(expiry.next_deadline(), Some(t0 + PROPOSAL_RETRY));
        let soon = t0 + PROPOSAL_RETRY - Duration::from_millis(1);
        assert_eq!(
            expiry.on_event(soon, turn(2_499, Some(1_000), Some(t0))),
            vec![]
        );
        let after = t0 + PROPOSAL_RETRY;
        let actions = expiry.on_event(after, turn(2_500, Some(1_000), Some(t0)));
        assert_eq!(actions, vec![ExpiryAction::Expire { now_ms: 2_500 }]);
        assert_eq!(expiry.next_deadline(), Some(t0), "the pause is over");
    }

    #[test]
    fn the_queue_expiry_goes_first() {
        let t0 = Instant::now();
        let mut expiry = Expiry::default();
        let both = ExpiryEvent::Turn {
            now_ms: 5_000,
            deadlines: Deadlines {
                messages_ms: Some(4_000),
                queue_ms: Some(4_500),
            },
            wake: Some(t0),
        };
        let actions = expiry.on_event(t0, both);
        assert_eq!(actions, vec![ExpiryAction::ExpireQueue { now_ms: 5_000 }]);
    }
}
