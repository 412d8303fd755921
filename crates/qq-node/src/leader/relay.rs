//! The at-least-once relay of a queue's held dead letters: rounds prepared, committed one at
//! a time and settled (see [`Relay`]), driven by the actor's loop.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;

use futures::stream::FuturesUnordered;
use qq_core::MessageId;
use tracing::{debug, warn};

use super::{QueueLeader, SETTLES_IN_FLIGHT, Timers};
use crate::deadletter::{
    PreparedRound, Round, TRANSFER_BATCH, TRANSFER_BATCH_BYTES, TransferError,
};

pub(super) type Commit = Pin<Box<dyn Future<Output = Round> + Send>>;
/// A preparation's epoch and its round (Err: the preparation failed; its dead letters).
pub(super) type Prepare =
    Pin<Box<dyn Future<Output = (u64, Result<PreparedRound, Vec<MessageId>>)> + Send>>;
pub(super) type Settle = Pin<Box<dyn Future<Output = Vec<MessageId>> + Send>>;

/// Dead letters every target committed whose `DeadLetterSettle` is in flight: not taken into
/// a new round meanwhile.
#[derive(Default)]
pub(super) struct Settling {
    pub(super) ids: HashSet<MessageId>,
    pub(super) running: FuturesUnordered<Settle>,
}

/// The at-least-once relay of the queue's held dead letters, a pipeline of rounds: one round
/// commits at a time, so every target gets the rounds in death order; the next round is
/// prepared meanwhile (bodies read and copies made on a blocking thread) and is sent as soon
/// as the committing one succeeded. A round that failed, even in part, discards the round
/// prepared after it (sent, it would overtake the failed dead letters), so the retry starts
/// again from the oldest held one. A round takes its dead letters out of reach of the next
/// ones until it ends.
#[derive(Default)]
pub(super) struct Relay {
    /// Dead letters in a round being prepared, prepared or committing.
    in_rounds: HashSet<MessageId>,
    /// Bumped by every failed round: a preparation started before it is discarded.
    epoch: u64,
    pub(super) preparing: Option<Prepare>,
    pub(super) prepared: Option<PreparedRound>,
    pub(super) committing: Option<Commit>,
    pub(super) settling: Settling,
}

impl Relay {
    pub(super) fn busy(&self) -> bool {
        self.preparing.is_some()
            || self.prepared.is_some()
            || self.committing.is_some()
            || !self.settling.running.is_empty()
    }

    /// Dead letters held but in no round and not being settled: none means no round to take.
    fn untaken(&self, held: u64) -> u64 {
        held.saturating_sub((self.in_rounds.len() + self.settling.ids.len()) as u64)
    }

    fn release(&mut self, ids: &[MessageId]) {
        for id in ids {
            self.in_rounds.remove(id);
        }
    }

    /// A preparation ended: keep its round for sending, unless a round failed since it began.
    /// False: the preparation itself failed.
    pub(super) fn preparation_ended(
        &mut self,
        epoch: u64,
        round: Result<PreparedRound, Vec<MessageId>>,
    ) -> bool {
        match round {
            Ok(round) if epoch == self.epoch => self.prepared = Some(round),
            Ok(round) => self.release(&round.ids),
            Err(ids) => {
                self.release(&ids);
                return false;
            }
        }
        true
    }

    /// A round ended: its dead letters leave it (those every target committed go on to be
    /// settled, by [`QueueLeader::after_round`]); a failure discards the prepared round (a
    /// preparation still running is discarded when it ends).
    pub(super) fn round_ended(&mut self, round: &Round) {
        self.release(&round.ids);
        if round.failure.is_some() {
            self.epoch += 1;
            if let Some(next) = self.prepared.take() {
                self.release(&next.ids);
            }
        }
    }
}

impl QueueLeader {
    /// Start preparing a round of held at-least-once dead letters, if any are held that are in
    /// no round and not being settled, no retry pause is running and fewer than
    /// [`SETTLES_IN_FLIGHT`] settles are.
    pub(super) fn next_round(
        &self,
        timers: &mut Timers,
        logged_no_route: &mut bool,
        relay: &mut Relay,
    ) -> Option<Prepare> {
        let held = self.machine.with_state(|s| s.counts().held);
        if held == 0 {
            *logged_no_route = false;
            return None;
        }
        // Every held one taken: nothing to take (or a round or settle just ended, and that
        // wakes the loop again). Saves walking the taken ids on every applied entry.
        if timers
            .transfer_retry
            .is_some_and(|t| t > self.ctx.clock.now())
            || relay.settling.running.len() >= SETTLES_IN_FLIGHT
            || relay.untaken(held) == 0
        {
            return None;
        }
        let (batch, config) = self.machine.with_state(|s| {
            let batch = s.first_held_dead_letters(TRANSFER_BATCH, TRANSFER_BATCH_BYTES, |id| {
                relay.in_rounds.contains(&id) || relay.settling.ids.contains(&id)
            });
            (batch, s.config().clone())
        });
        if batch.is_empty() {
            return None; // every held dead letter is taken
        }
        debug!(
            first = batch[0].id,
            n = batch.len(),
            in_rounds = relay.in_rounds.len(),
            settling = relay.settling.ids.len(),
            "dead-letter transfer round"
        );
        timers.transfer_retry = None;
        let ids: Vec<MessageId> = batch.iter().map(|h| h.id).collect();
        relay.in_rounds.extend(ids.iter().copied());
        let (dl, machine, group, epoch) = (
            self.ctx.dead_letters.clone(),
            self.machine.clone(),
            self.group,
            relay.epoch,
        );
        let preparation =
            tokio::task::spawn_blocking(move || dl.prepare_round(group, &machine, &config, batch));
        Some(Box::pin(async move {
            match preparation.await {
                Ok(round) => (epoch, Ok(round)),
                Err(e) => {
                    warn!("dead-letter round preparation failed: {e}");
                    (epoch, Err(ids))
                }
            }
        }))
    }

    pub(super) fn after_round(
        &self,
        round: Round,
        timers: &mut Timers,
        logged_no_route: &mut bool,
        settling: &mut Settling,
    ) {
        if !round.transferred.is_empty() {
            let ids = round.transferred;
            settling.ids.extend(ids.iter().copied());
            let (dl, group) = (self.ctx.dead_letters.clone(), self.group);
            settling.running.push(Box::pin(async move {
                dl.settle(group, ids.clone()).await;
                ids
            }));
        }
        let Some(failure) = round.failure else {
            return; // more may be held: next round at once
        };
        match failure {
            TransferError::NoRoute(why) if !*logged_no_route => {
                warn!("at-least-once dead letters held: {why}");
                *logged_no_route = true;
            }
            e => debug!("dead-letter transfer will be retried: {e:?}"),
        }
        timers.transfer_retry = Some(self.ctx.clock.now() + self.ctx.dead_letter_retry);
    }
}

#[cfg(test)]
mod relay_tests {
    use super::*;

    /// A relay with round `committing` sent and round `next` prepared.
    fn relay_with(committing: &[MessageId], next: &[MessageId]) -> Relay {
        let mut relay = Relay::default();
        relay
            .in_rounds
            .extend(committing.iter().chain(next).copied());
        assert!(relay.preparation_ended(0, Ok(PreparedRound::without_copies(next.to_vec()))));
        relay
    }

    fn round(ids: &[MessageId], transferred: &[MessageId], failed: bool) -> Round {
        Round {
            ids: ids.to_vec(),
            transferred: transferred.to_vec(),
            failure: failed.then(|| TransferError::Unavailable("target down".into())),
        }
    }

    #[test]
    fn a_round_that_succeeded_lets_the_prepared_one_go() {
        let mut relay = relay_with(&[1, 2], &[3, 4]);
        relay.round_ended(&round(&[1, 2], &[1, 2], false));
        let next = relay.prepared.as_ref().expect("the prepared round is kept");
        assert_eq!(next.ids, vec![3, 4]);
        assert_eq!(relay.in_rounds, HashSet::from([3, 4]));
    }

    #[test]
    fn a_failed_round_discards_the_round_prepared_after_it() {
        // Dead letter 2 failed: sending 3 and 4 now would put them before 2 in the target.
        let mut relay = relay_with(&[1, 2], &[3, 4]);
        relay.round_ended(&round(&[1, 2], &[1], true));
        assert!(relay.prepared.is_none());
        assert!(relay.in_rounds.is_empty(), "all of them can be taken again");
        assert_eq!(relay.untaken(4), 4);
    }

    #[test]
    fn a_preparation_begun_before_a_failure_is_discarded_when_it_ends() {
        let mut relay = Relay::default();
        relay.in_rounds.extend([1, 2, 3, 4]);
        let epoch = relay.epoch; // round 3-4 starts preparing while 1-2 commits
        relay.round_ended(&round(&[1, 2], &[], true));
        assert!(relay.preparation_ended(epoch, Ok(PreparedRound::without_copies(vec![3, 4]))));
        assert!(relay.prepared.is_none());
        assert!(relay.in_rounds.is_empty());
        // A preparation begun after the failure is kept.
        relay.in_rounds.extend([1, 2]);
        assert!(
            relay.preparation_ended(relay.epoch, Ok(PreparedRound::without_copies(vec![1, 2])))
        );
        assert!(relay.prepared.is_some());
    }

    #[test]
    fn a_failed_preparation_releases_its_dead_letters() {
        let mut relay = Relay::default();
        relay.in_rounds.extend([1, 2]);
        assert!(!relay.preparation_ended(0, Err(vec![1, 2])));
        assert!(relay.in_rounds.is_empty());
    }
}
