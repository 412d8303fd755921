//! A running move task (redrive) carried out in rounds of [`crate::moves`], paced by its
//! `max_per_second`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use qq_core::queue::Command;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{PROPOSAL_RETRY, QueueLeader, Timers};
use crate::moves::MoveOutcome;

pub(super) type MoveRound = Pin<Box<dyn Future<Output = (Instant, MoveOutcome)> + Send>>;

impl QueueLeader {
    /// A round of the running move task, if there is one and its pause is over.
    pub(super) fn next_move(&self, timers: &mut Timers) -> Option<MoveRound> {
        if timers.move_next.is_some_and(|t| t > self.ctx.clock.now()) {
            return None;
        }
        timers.move_next = None;
        self.machine.with_state(|s| s.running_move().map(|_| ()))?;
        let (mover, machine, group) = (self.ctx.mover.clone(), self.machine.clone(), self.group);
        let clock = self.ctx.clock;
        Some(Box::pin(async move {
            let started = clock.now();
            (started, mover.round(group, &machine).await)
        }))
    }

    pub(super) async fn after_move(
        &self,
        started: Instant,
        outcome: MoveOutcome,
        timers: &mut Timers,
    ) {
        match outcome {
            MoveOutcome::Moved(0) => {
                // Nothing taken though a task runs (its end not applied yet): look again later.
                timers.move_next = Some(self.ctx.clock.now() + PROPOSAL_RETRY);
            }
            MoveOutcome::Moved(n) => {
                let rate = self
                    .machine
                    .with_state(|s| s.running_move().map(|t| t.max_per_second))
                    .unwrap_or(0);
                if rate > 0 {
                    let pause = Duration::from_secs_f64(n as f64 / f64::from(rate));
                    timers.move_next = Some(started + pause);
                }
            }
            MoveOutcome::Retry(why) => {
                debug!("move round will be retried: {why}");
                timers.move_next = Some(self.ctx.clock.now() + PROPOSAL_RETRY);
            }
            MoveOutcome::Fail { task, detail } => {
                warn!(task, "move task failed: {detail}");
                let cmd = Command::EndMove {
                    task,
                    state: qq_core::queue::MoveState::Failed,
                    detail,
                };
                if let Err(e) = self.propose(cmd).await {
                    debug!("end move not applied: {e}");
                    timers.move_next = Some(self.ctx.clock.now() + PROPOSAL_RETRY);
                }
            }
        }
    }
}
