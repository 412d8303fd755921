//! The at-least-once relay of a queue's held dead letters: rounds prepared, committed one at
//! a time and settled. [`Relay`] is the sub-machine that decides; the actor runs the rounds
//! and settles it asks for and tells it how they ended.

use std::collections::HashSet;
use std::time::Duration;

use qq_core::queue::HeldDeadLetter;
use qq_core::{MessageId, QueueConfig};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::flight::{InFlight, Prepare};
use super::{QueueLeader, SETTLES_IN_FLIGHT};
use crate::deadletter::{
    PreparedRound, Round, TRANSFER_BATCH, TRANSFER_BATCH_BYTES, TransferError,
};

/// The relay sub-machine: the at-least-once relay of the queue's held dead letters, a
/// pipeline of rounds. One round commits at a time, so every target gets the rounds in death
/// order; the next round is prepared meanwhile (bodies read and copies made on a blocking
/// thread) and is sent as soon as the committing one succeeded. A round that failed, even in
/// part, discards the round prepared after it (sent, it would overtake the failed dead
/// letters), so the retry starts again from the oldest held one, after `retry` or when the
/// topology changes. A round takes its dead letters out of reach of the next ones until it
/// ends; those every target committed stay out of reach while their settle runs (at most
/// [`SETTLES_IN_FLIGHT`] settles; at the bound no round starts). Its deadline is the retry.
pub(super) struct Relay {
    retry: Duration,
    retry_at: Option<Instant>,
    /// Dead letters in a round being prepared, prepared or committing.
    in_rounds: HashSet<MessageId>,
    /// Dead letters every target committed whose `DeadLetterSettle` is in flight.
    settling: HashSet<MessageId>,
    /// Settles in flight.
    settles: usize,
    /// Bumped by every failed round: a preparation started before it is discarded.
    epoch: u64,
    preparing: bool,
    prepared: Option<PreparedRound>,
    committing: bool,
    /// "Held: no route" was logged (once until nothing is held).
    logged_no_route: bool,
}

/// What the relay machine hears.
pub(super) enum RelayEvent {
    /// A turn of the actor's loop: `held` dead letters are held.
    Turn { held: u64 },
    /// The first held dead letters in no round and not settling, read for
    /// [`RelayAction::TakeRound`] (empty: none).
    Taken { ids: Vec<MessageId> },
    /// A preparation begun under `epoch` ended (Err: it failed; its dead letters).
    Prepared {
        epoch: u64,
        round: Result<PreparedRound, Vec<MessageId>>,
    },
    /// The committing round ended.
    Committed(Round),
    /// A settle ended: these may be taken again (if still held).
    Settled(Vec<MessageId>),
    /// The topology changed: held dead letters may have a route now.
    TopologyChanged,
}

/// What the relay machine asks for.
pub(super) enum RelayAction {
    /// Send this prepared round to its targets.
    Commit(PreparedRound),
    /// Read the first held dead letters not taken ([`Relay::is_taken`]) and answer
    /// [`RelayEvent::Taken`].
    TakeRound,
    /// Prepare the round just taken, under this epoch.
    Prepare { epoch: u64 },
    /// Settle these dead letters (every target committed them).
    Settle(Vec<MessageId>),
    /// Say, once, why dead letters are held.
    WarnNoRoute(String),
}

impl Relay {
    pub(super) fn new(retry: Duration) -> Relay {
        Relay {
            retry,
            retry_at: None,
            in_rounds: HashSet::new(),
            settling: HashSet::new(),
            settles: 0,
            epoch: 0,
            preparing: false,
            prepared: None,
            committing: false,
            logged_no_route: false,
        }
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.retry_at
    }

    /// A round is being prepared, prepared or committing, or a settle runs.
    pub(super) fn busy(&self) -> bool {
        self.preparing || self.prepared.is_some() || self.committing || self.settles > 0
    }

    /// Whether a dead letter is in a round or being settled (not to be taken again).
    pub(super) fn is_taken(&self, id: MessageId) -> bool {
        self.in_rounds.contains(&id) || self.settling.contains(&id)
    }

    pub(super) fn on_event(&mut self, now: Instant, event: RelayEvent) -> Vec<RelayAction> {
        match event {
            RelayEvent::Turn { held } => self.turn(now, held),
            RelayEvent::Taken { ids } => {
                if ids.is_empty() {
                    return vec![]; // every held dead letter is taken
                }
                self.retry_at = None;
                self.in_rounds.extend(ids.iter().copied());
                self.preparing = true;
                vec![RelayAction::Prepare { epoch: self.epoch }]
            }
            RelayEvent::Prepared { epoch, round } => {
                self.preparing = false;
                if !self.preparation_ended(epoch, round) {
                    self.retry_at = Some(now + self.retry);
                }
                vec![]
            }
            RelayEvent::Committed(round) => {
                self.committing = false;
                self.round_ended(&round);
                self.after_round(now, round)
            }
            RelayEvent::Settled(ids) => {
                self.settles = self.settles.saturating_sub(1);
                for id in ids {
                    self.settling.remove(&id);
                }
                vec![]
            }
            RelayEvent::TopologyChanged => {
                self.retry_at = None;
                vec![]
            }
        }
    }

    /// Send a prepared round if none is committing; take the next one if any dead letters are
    /// held that are in no round and not being settled, no retry pause is running and fewer
    /// than [`SETTLES_IN_FLIGHT`] settles are.
    fn turn(&mut self, now: Instant, held: u64) -> Vec<RelayAction> {
        if self.retry_at.is_some_and(|t| t <= now) {
            self.retry_at = None; // the pause is over; a past deadline would wake the loop at once
        }
        let mut actions = vec![];
        if !self.committing
            && let Some(round) = self.prepared.take()
        {
            self.committing = true;
            actions.push(RelayAction::Commit(round));
        }
        if self.preparing || self.prepared.is_some() {
            return actions;
        }
        if held == 0 {
            self.logged_no_route = false;
        } else if self.retry_at.is_none()
            && self.settles < SETTLES_IN_FLIGHT
            && self.untaken(held) > 0
        {
            actions.push(RelayAction::TakeRound);
        }
        actions
    }

    /// Dead letters held but in no round and not being settled: none means no round to take.
    fn untaken(&self, held: u64) -> u64 {
        held.saturating_sub((self.in_rounds.len() + self.settling.len()) as u64)
    }

    fn release(&mut self, ids: &[MessageId]) {
        for id in ids {
            self.in_rounds.remove(id);
        }
    }

    /// A preparation ended: keep its round for sending, unless a round failed since it began.
    /// False: the preparation itself failed.
    fn preparation_ended(
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

    /// A round ended: its dead letters leave it; a failure discards the prepared round (a
    /// preparation still running is discarded when it ends).
    fn round_ended(&mut self, round: &Round) {
        self.release(&round.ids);
        if round.failure.is_some() {
            self.epoch += 1;
            if let Some(next) = self.prepared.take() {
                self.release(&next.ids);
            }
        }
    }

    /// Those every target committed go on to be settled; after a failure, the next round
    /// waits for the retry pause.
    fn after_round(&mut self, now: Instant, round: Round) -> Vec<RelayAction> {
        let mut actions = vec![];
        if !round.transferred.is_empty() {
            self.settling.extend(round.transferred.iter().copied());
            self.settles += 1;
            actions.push(RelayAction::Settle(round.transferred));
        }
        let Some(failure) = round.failure else {
            return actions; // more may be held: next round at once
        };
        match failure {
            TransferError::NoRoute(why) if !self.logged_no_route => {
                self.logged_no_route = true;
                actions.push(RelayAction::WarnNoRoute(why));
            }
            e => debug!("dead-letter transfer will be retried: {e:?}"),
        }
        self.retry_at = Some(now + self.retry);
        actions
    }
}

impl QueueLeader {
    /// Carry out what the relay machine asked for at `now`.
    pub(super) fn relay_actions(
        &self,
        relay: &mut Relay,
        flight: &mut InFlight,
        now: Instant,
        actions: Vec<RelayAction>,
    ) {
        for action in actions {
            match action {
                RelayAction::Commit(round) => {
                    let dl = self.ctx.dead_letters.clone();
                    flight.committing = Some(Box::pin(async move { dl.commit_round(round).await }));
                }
                RelayAction::TakeRound => self.take_round(relay, flight, now),
                // Only the answer to `Taken`, which `take_round` carries out.
                RelayAction::Prepare { .. } => {}
                RelayAction::Settle(ids) => {
                    let (dl, group) = (self.ctx.dead_letters.clone(), self.group);
                    flight.settling.push(Box::pin(async move {
                        dl.settle(group, ids.clone()).await;
                        ids
                    }));
                }
                RelayAction::WarnNoRoute(why) => warn!("at-least-once dead letters held: {why}"),
            }
        }
    }

    /// Read the round the relay asked to take and start preparing it on a blocking thread.
    fn take_round(&self, relay: &mut Relay, flight: &mut InFlight, now: Instant) {
        let (batch, config) = self.machine.with_state(|s| {
            let batch = s.first_held_dead_letters(TRANSFER_BATCH, TRANSFER_BATCH_BYTES, |id| {
                relay.is_taken(id)
            });
            (batch, s.config().clone())
        });
        let ids: Vec<MessageId> = batch.iter().map(|h| h.id).collect();
        if let Some(first) = ids.first() {
            debug!(
                first,
                n = ids.len(),
                in_rounds = relay.in_rounds.len(),
                settling = relay.settling.len(),
                "dead-letter transfer round"
            );
        }
        let taken = relay.on_event(now, RelayEvent::Taken { ids: ids.clone() });
        for action in taken {
            if let RelayAction::Prepare { epoch } = action {
                flight.preparing = Some(self.prepare(epoch, batch, config, ids));
                return;
            }
        }
    }

    fn prepare(
        &self,
        epoch: u64,
        batch: Vec<HeldDeadLetter>,
        config: QueueConfig,
        ids: Vec<MessageId>,
    ) -> Prepare {
        let (dl, machine, group) = (
            self.ctx.dead_letters.clone(),
            self.machine.clone(),
            self.group,
        );
        let preparation = qq_raft::lockstep::spawn_blocking(move || {
            dl.prepare_round(group, &machine, &config, batch)
        });
        Box::pin(async move {
            match preparation.await {
                Ok(round) => (epoch, Ok(round)),
                Err(e) => {
                    warn!("dead-letter round preparation failed: {e}");
                    (epoch, Err(ids))
                }
            }
        })
    }
}

#[cfg(test)]
mod relay_tests {
    use super::*;

    const RETRY: Duration = Duration::from_secs(2);

    /// A relay with round `committing` sent and round `next` prepared.
    fn relay_with(committing: &[MessageId], next: &[MessageId]) -> Relay {
        let mut relay = Relay::new(RETRY);
        relay
            .in_rounds
            .extend(committing.iter().chain(next).copied());
        relay.committing = true;
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

    /// The names of the actions, in order.
    fn names(actions: &[RelayAction]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                RelayAction::Commit(r) => format!("commit {:?}", r.ids),
                RelayAction::TakeRound => "take".into(),
                RelayAction::Prepare { epoch } => format!("prepare @{epoch}"),
                RelayAction::Settle(ids) => format!("settle {ids:?}"),
                RelayAction::WarnNoRoute(why) => format!("warn {why}"),
            })
            .collect()
    }

    /// Take and prepare a round of `ids` at `now` (a preparation that succeeds).
    fn take(relay: &mut Relay, now: Instant, ids: &[MessageId]) {
        let taken = relay.on_event(now, RelayEvent::Taken { ids: ids.to_vec() });
        let RelayAction::Prepare { epoch } = taken[0] else {
            panic!("a taken round is prepared");
        };
        let round = Ok(PreparedRound::without_copies(ids.to_vec()));
        relay.on_event(now, RelayEvent::Prepared { epoch, round });
    }

    #[test]
    fn a_round_that_succeeded_lets_the_prepared_one_go() {
        let t0 = Instant::now();
        let mut relay = relay_with(&[1, 2], &[3, 4]);
        let turn = relay.on_event(t0, RelayEvent::Turn { held: 4 });
        assert!(names(&turn).is_empty(), "one round commits at a time");
        let ended = relay.on_event(t0, RelayEvent::Committed(round(&[1, 2], &[1, 2], false)));
        assert_eq!(names(&ended), ["settle [1, 2]"]);
        assert_eq!(relay.in_rounds, HashSet::from([3, 4]));
        let turn = relay.on_event(t0, RelayEvent::Turn { held: 4 });
        assert_eq!(
            names(&turn),
            ["commit [3, 4]"],
            "1 and 2 are settling: none to take"
        );
        assert_eq!(relay.next_deadline(), None);
    }

    #[test]
    fn a_failed_round_discards_the_round_prepared_after_it_and_pauses() {
        // Dead letter 2 failed: sending 3 and 4 now would put them before 2 in the target.
        let t0 = Instant::now();
        let mut relay = relay_with(&[1, 2], &[3, 4]);
        let ended = relay.on_event(t0, RelayEvent::Committed(round(&[1, 2], &[1], true)));
        assert_eq!(names(&ended), ["settle [1]"]);
        assert!(relay.prepared.is_none());
        assert!(relay.in_rounds.is_empty(), "all of them can be taken again");
        assert_eq!(relay.untaken(4), 3, "1 is settling");
        assert_eq!(relay.next_deadline(), Some(t0 + RETRY));
        let early = t0 + RETRY - Duration::from_millis(1);
        assert!(names(&relay.on_event(early, RelayEvent::Turn { held: 4 })).is_empty());
        let turn = relay.on_event(t0 + RETRY, RelayEvent::Turn { held: 4 });
        assert_eq!(names(&turn), ["take"]);
        assert_eq!(relay.next_deadline(), None);
        assert!(relay.is_taken(1) && !relay.is_taken(2));
    }

    #[test]
    fn a_topology_change_ends_the_retry_pause() {
        let t0 = Instant::now();
        let mut relay = Relay::new(RETRY);
        let why = TransferError::NoRoute("no such exchange".into());
        take(&mut relay, t0, &[1]);
        let turn = relay.on_event(t0, RelayEvent::Turn { held: 1 });
        assert_eq!(names(&turn), ["commit [1]"]);
        let failed = Round {
            ids: vec![1],
            transferred: vec![],
            failure: Some(why),
        };
        let ended = relay.on_event(t0, RelayEvent::Committed(failed));
        assert_eq!(names(&ended), ["warn no such exchange"]);
        assert!(names(&relay.on_event(t0, RelayEvent::Turn { held: 1 })).is_empty());
        relay.on_event(t0, RelayEvent::TopologyChanged);
        assert_eq!(relay.next_deadline(), None);
        assert_eq!(
            names(&relay.on_event(t0, RelayEvent::Turn { held: 1 })),
            ["take"]
        );
    }

    #[test]
    fn no_route_is_said_once_until_nothing_is_held() {
        let t0 = Instant::now();
        let mut relay = Relay::new(RETRY);
        let no_route = |relay: &mut Relay| {
            take(relay, t0, &[1]);
            relay.on_event(t0, RelayEvent::Turn { held: 1 });
            let failed = Round {
                ids: vec![1],
                transferred: vec![],
                failure: Some(TransferError::NoRoute("none".into())),
            };
            names(&relay.on_event(t0, RelayEvent::Committed(failed)))
        };
        assert_eq!(no_route(&mut relay), ["warn none"]);
        assert!(no_route(&mut relay).is_empty());
        relay.on_event(t0, RelayEvent::Turn { held: 0 });
        assert_eq!(no_route(&mut relay), ["warn none"]);
    }

    #[test]
    fn no_round_is_taken_at_the_bound_of_settles_in_flight() {
        let t0 = Instant::now();
        let mut relay = Relay::new(RETRY);
        let held = 100;
        for id in 0..SETTLES_IN_FLIGHT as u64 {
            take(&mut relay, t0, &[id]);
            relay.on_event(t0, RelayEvent::Turn { held });
            let done = relay.on_event(t0, RelayEvent::Committed(round(&[id], &[id], false)));
            assert_eq!(names(&done), [format!("settle [{id}]")]);
        }
        assert!(relay.busy());
        assert!(names(&relay.on_event(t0, RelayEvent::Turn { held })).is_empty());
        relay.on_event(t0, RelayEvent::Settled(vec![0]));
        assert!(!relay.is_taken(0));
        assert_eq!(
            names(&relay.on_event(t0, RelayEvent::Turn { held })),
            ["take"]
        );
    }

    #[test]
    fn a_passed_retry_is_no_deadline_once_nothing_is_held() {
        // A past deadline would make the actor's loop wake again at once, forever.
        let t0 = Instant::now();
        let mut relay = Relay::new(RETRY);
        relay.on_event(
            t0,
            RelayEvent::Prepared {
                epoch: 0,
                round: Err(vec![]),
            },
        );
        assert_eq!(relay.next_deadline(), Some(t0 + RETRY));
        relay.on_event(t0 + RETRY, RelayEvent::Turn { held: 0 });
        assert_eq!(relay.next_deadline(), None);
    }

    #[test]
    fn a_preparation_begun_before_a_failure_is_discarded_when_it_ends() {
        let mut relay = Relay::new(RETRY);
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
    fn a_failed_preparation_releases_its_dead_letters_and_pauses() {
        let t0 = Instant::now();
        let mut relay = Relay::new(RETRY);
        let taken = relay.on_event(t0, RelayEvent::Taken { ids: vec![1, 2] });
        assert_eq!(names(&taken), ["prepare @0"]);
        assert!(relay.busy());
        relay.on_event(
            t0,
            RelayEvent::Prepared {
                epoch: 0,
                round: Err(vec![1, 2]),
            },
        );
        assert!(relay.in_rounds.is_empty());
        assert!(!relay.busy());
        assert_eq!(relay.next_deadline(), Some(t0 + RETRY));
    }
}
