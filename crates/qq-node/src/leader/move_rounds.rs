//! A running move task (redrive) carried out in rounds of [`crate::moves`], paced by its
//! `max_per_second`: the [`Moves`] sub-machine decides when a round runs, the actor runs it.

use std::time::Duration;

use qq_core::queue::Command;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::flight::MoveRound;
use super::{PROPOSAL_RETRY, QueueLeader};
use crate::moves::MoveOutcome;

/// The move sub-machine: one round at a time, the next one not before `next_at` (the task's
/// rate limit, or a pause after a round that moved nothing or failed). Its deadline is
/// `next_at`.
#[derive(Debug, Default)]
pub(super) struct Moves {
    next_at: Option<Instant>,
    /// A round is running.
    running: bool,
}

/// What the move machine hears.
#[derive(Debug)]
pub(super) enum MoveEvent {
    /// A turn of the actor's loop; `task_running`: the state has a running move task.
    Turn { task_running: bool },
    /// A round that began at `started` ended; `rate`: the running task's `max_per_second`
    /// now (0: unlimited, or no task any more).
    RoundEnded {
        started: Instant,
        outcome: MoveOutcome,
        rate: u32,
    },
    /// The `EndMove` it asked for was not committed.
    EndFailed,
}

/// What the move machine asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum MoveAction {
    /// Run a round of the running task.
    StartRound,
    /// End the task as Failed (`EndMove`).
    EndMove { task: u64, detail: String },
}

impl Moves {
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.next_at
    }

    /// A round is running.
    pub(super) fn busy(&self) -> bool {
        self.running
    }

    pub(super) fn on_event(&mut self, now: Instant, event: MoveEvent) -> Vec<MoveAction> {
        match event {
            MoveEvent::Turn { task_running } => {
                if self.running || self.next_at.is_some_and(|t| t > now) {
                    return vec![];
                }
                self.next_at = None;
                if !task_running {
                    return vec![];
                }
                self.running = true;
                vec![MoveAction::StartRound]
            }
            MoveEvent::RoundEnded {
                started,
                outcome,
                rate,
            } => {
                self.running = false;
                self.round_ended(now, started, outcome, rate)
            }
            MoveEvent::EndFailed => {
                self.next_at = Some(now + PROPOSAL_RETRY);
                vec![]
            }
        }
    }

    fn round_ended(
        &mut self,
        now: Instant,
        started: Instant,
        outcome: MoveOutcome,
        rate: u32,
    ) -> Vec<MoveAction> {
        match outcome {
            MoveOutcome::Moved(0) => {
                // Nothing taken though a task runs (its end not applied yet): look again later.
                self.next_at = Some(now + PROPOSAL_RETRY);
            }
            MoveOutcome::Moved(n) => {
                if rate > 0 {
                    let pause = Duration::from_secs_f64(n as f64 / f64::from(rate));
                    self.next_at = Some(started + pause);
                }
            }
            MoveOutcome::Retry(why) => {
                debug!("move round will be retried: {why}");
                self.next_at = Some(now + PROPOSAL_RETRY);
            }
            MoveOutcome::Fail { task, detail } => {
                return vec![MoveAction::EndMove { task, detail }];
            }
        }
        vec![]
    }
}

impl QueueLeader {
    /// A round of the running move task, timed from when it begins.
    pub(super) fn move_round(&self) -> MoveRound {
        let (mover, machine, group) = (self.ctx.mover.clone(), self.machine.clone(), self.group);
        let clock = self.ctx.clock;
        Box::pin(async move {
            let started = clock.now();
            (started, mover.round(group, &machine).await)
        })
    }

    /// Whether the state has a running move task, and its rate.
    pub(super) fn move_task(&self) -> Option<u32> {
        self.machine
            .with_state(|s| s.running_move().map(|t| t.max_per_second))
    }

    /// End a move task that cannot go on as Failed. False if that was not committed.
    pub(super) async fn end_move(&self, task: u64, detail: String) -> bool {
        warn!(task, "move task failed: {detail}");
        let cmd = Command::EndMove {
            task,
            state: qq_core::queue::MoveState::Failed,
            detail,
        };
        match self.propose(cmd).await {
            Ok(_) => true,
            Err(e) => {
                debug!("end move not applied: {e}");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(started: Instant, outcome: MoveOutcome, rate: u32) -> MoveEvent {
        MoveEvent::RoundEnded {
            started,
            outcome,
            rate,
        }
    }

    const TASK: MoveEvent = MoveEvent::Turn { task_running: true };

    #[test]
    fn rounds_run_one_at_a_time_at_the_task_rate() {
        let t0 = Instant::now();
        let mut moves = Moves::default();
        assert_eq!(moves.on_event(t0, TASK), vec![MoveAction::StartRound]);
        assert_eq!(moves.on_event(t0, TASK), vec![], "one round at a time");
        assert!(moves.busy());
        // 50 moved at 100 a second: the next round half a second after this one began.
        let end = t0 + Duration::from_millis(200);
        assert_eq!(
            moves.on_event(end, ended(t0, MoveOutcome::Moved(50), 100)),
            vec![]
        );
        assert!(!moves.busy());
        let next = t0 + Duration::from_millis(500);
        assert_eq!(moves.next_deadline(), Some(next));
        assert_eq!(
            moves.on_event(next - Duration::from_millis(1), TASK),
            vec![]
        );
        assert_eq!(moves.on_event(next, TASK), vec![MoveAction::StartRound]);
        assert_eq!(moves.next_deadline(), None);
    }

    #[test]
    fn an_unlimited_task_goes_on_at_once_and_no_task_runs_no_round() {
        let t0 = Instant::now();
        let mut moves = Moves::default();
        assert_eq!(
            moves.on_event(
                t0,
                MoveEvent::Turn {
                    task_running: false
                }
            ),
            vec![]
        );
        assert_eq!(moves.on_event(t0, TASK), vec![MoveAction::StartRound]);
        moves.on_event(t0, ended(t0, MoveOutcome::Moved(1_000), 0));
        assert_eq!(moves.next_deadline(), None);
        assert_eq!(moves.on_event(t0, TASK), vec![MoveAction::StartRound]);
    }

    #[test]
    fn a_round_that_moved_nothing_or_must_be_retried_pauses() {
        let t0 = Instant::now();
        for outcome in [MoveOutcome::Moved(0), MoveOutcome::Retry("busy".into())] {
            let mut moves = Moves::default();
            moves.on_event(t0, TASK);
            let end = t0 + Duration::from_millis(10);
            moves.on_event(end, ended(t0, outcome, 100));
            assert_eq!(moves.next_deadline(), Some(end + PROPOSAL_RETRY));
            assert_eq!(moves.on_event(end, TASK), vec![]);
        }
    }

    #[test]
    fn a_task_that_cannot_go_on_is_ended_and_a_failed_end_is_retried() {
        let t0 = Instant::now();
        let mut moves = Moves::default();
        moves.on_event(t0, TASK);
        let fail = MoveOutcome::Fail {
            task: 7,
            detail: "target gone".into(),
        };
        let actions = moves.on_event(t0, ended(t0, fail, 100));
        let end = MoveAction::EndMove {
            task: 7,
            detail: "target gone".into(),
        };
        assert_eq!(actions, vec![end]);
        moves.on_event(t0, MoveEvent::EndFailed);
        assert_eq!(moves.next_deadline(), Some(t0 + PROPOSAL_RETRY));
        // The task still runs in the state: after the pause, another round finds it failing.
        let later = t0 + PROPOSAL_RETRY;
        assert_eq!(moves.on_event(later, TASK), vec![MoveAction::StartRound]);
    }
}
