//! Consumer timeouts (`x-consumer-timeout`, RabbitMQ 4.3's quorum queues enforce them in the
//! queue): a message checked out to a consumer and not settled within the queue's timeout ends
//! that consumer. Its unacked messages return to the queue, released rather than failed (as
//! RabbitMQ 4.3: a timeout does not count towards the delivery limit; module `counts`), and [`Effect::ConsumerTimedOut`] tells the leader to cancel its session with
//! a reason the client sees. Get leases have their own deadline and are not concerned.
//!
//! The timeout is set by [`super::Command::SetConsumerTimeout`] (machine version 2), which the
//! leader proposes from the queue's argument, policy or node default; it applies to messages
//! checked out afterwards. Time is the commands' `now_ms`, as for every deadline here: a
//! message checked out at `now` times out at the first command with `now_ms >= now + timeout`
//! (the leader proposes `Expire` at [`QueueState::next_deadline`]).
//!
//! Both the timeout and the deadlines are left out of the state's own encoding, as
//! `receipts`: a snapshot carries them beside it ([`QueueState::consumer_timeouts`],
//! [`QueueState::restore_consumer_timeouts`]).

use super::{Effect, GET_CONSUMER, Place, QueueState, Reply, Return};
use crate::types::{ConsumerId, MessageId};

/// The longest consumer timeout a queue takes (RabbitMQ caps its own at about 24 days, the
/// largest Erlang timer; a week here, as `x-requeue-delays`).
pub const MAX_CONSUMER_TIMEOUT_MS: u64 = 7 * 24 * 3600 * 1000;

impl QueueState {
    /// The queue's consumer timeout (None: none).
    pub fn consumer_timeout_ms(&self) -> Option<u64> {
        self.consumer_timeout_ms
    }

    /// The deadlines of checked-out messages, for a snapshot to carry beside the state.
    pub fn consumer_timeouts(&self) -> (Option<u64>, Vec<(MessageId, u64)>) {
        let deadlines = self
            .unacked_deadlines
            .iter()
            .map(|(id, d)| (*id, *d))
            .collect();
        (self.consumer_timeout_ms, deadlines)
    }

    /// Puts back what [`QueueState::consumer_timeouts`] gave (deadlines of messages that are not
    /// checked out to a consumer are dropped).
    pub fn restore_consumer_timeouts(
        &mut self,
        timeout_ms: Option<u64>,
        deadlines: impl IntoIterator<Item = (MessageId, u64)>,
    ) {
        self.consumer_timeout_ms = timeout_ms;
        self.unacked_deadlines = imbl::OrdMap::new();
        self.timeouts = imbl::OrdSet::new();
        for (id, d) in deadlines {
            let checked_out = self.msgs.get(&id).is_some_and(
                |m| matches!(m.place, Place::Unacked { consumer, .. } if consumer != GET_CONSUMER),
            );
            if checked_out {
                self.unacked_deadlines.insert(id, d);
                self.timeouts.insert((d, id));
            }
        }
    }

    pub(super) fn set_consumer_timeout(&mut self, timeout_ms: Option<u64>) -> Reply {
        self.consumer_timeout_ms = timeout_ms;
        Reply::Ok
    }

    /// A message was just checked out to a consumer at the state's time.
    pub(super) fn start_timeout(&mut self, id: MessageId) {
        if let Some(t) = self.consumer_timeout_ms {
            let deadline = self.clock_ms.saturating_add(t);
            self.unacked_deadlines.insert(id, deadline);
            self.timeouts.insert((deadline, id));
        }
    }

    /// A checked-out message was settled, returned or taken away with its consumer.
    pub(super) fn stop_timeout(&mut self, id: MessageId) {
        if let Some(d) = self.unacked_deadlines.remove(&id) {
            self.timeouts.remove(&(d, id));
        }
    }

    /// The earliest deadline of a checked-out message.
    pub(super) fn next_consumer_timeout(&self) -> Option<u64> {
        self.timeouts.get_min().map(|(d, _)| *d)
    }

    /// Ends every consumer holding a message past its deadline: its messages return released,
    /// and the leader is told to cancel its session.
    pub(super) fn time_out_consumers(&mut self, now: u64, fx: &mut Vec<Effect>) {
        while let Some(&(deadline, id)) = self.timeouts.get_min() {
            if deadline > now {
                break;
            }
            let consumer = match self.msgs.get(&id).map(|m| &m.place) {
                Some(Place::Unacked { consumer, .. }) => *consumer,
                _ => unreachable!("timed-out message {id} is checked out"),
            };
            fx.push(Effect::ConsumerTimedOut {
                consumer,
                id,
                timeout_ms: self.consumer_timeout_ms.unwrap_or_default(),
            });
            self.consumer_down(now, consumer, Return::Released, fx);
            // A consumer leaving is a use of the queue (x-expires), as with ConsumerDown.
            self.last_used_ms = now;
        }
    }

    /// The invariants: exactly the checked-out messages with a deadline are in both indexes.
    pub(super) fn check_timeouts(&self) -> Result<(), String> {
        if self.unacked_deadlines.len() != self.timeouts.len() {
            return Err("consumer timeout indexes differ in size".into());
        }
        for (id, d) in &self.unacked_deadlines {
            if !self.timeouts.contains(&(*d, *id)) {
                return Err(format!("deadline of {id} missing from the timeout order"));
            }
            let holder: Option<ConsumerId> = match self.msgs.get(id).map(|m| &m.place) {
                Some(Place::Unacked { consumer, .. }) if *consumer != GET_CONSUMER => {
                    Some(*consumer)
                }
                _ => None,
            };
            if holder.is_none() {
                return Err(format!(
                    "message {id} has a consumer deadline but is not checked out"
                ));
            }
        }
        Ok(())
    }
}
