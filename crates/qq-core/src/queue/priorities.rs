//! Message priorities as RabbitMQ 4.0's quorum queues have them: two levels, no queue argument.
//!
//! - A message whose `priority` property is [`HIGH_PRIORITY_FROM`] (5) or more is **high**;
//!   every other message (no priority, or 0-4) is **normal**. Each level is FIFO.
//! - **Returned messages come first**, whatever their priority (the returns queue is served
//!   before both levels, as rabbit_fifo serves its returns before its message queue).
//! - Between the levels, **two to one**: a counter runs 0, 1, 2, 0, ... over the messages taken
//!   from the levels (delivered, taken by a Get, dropped by drop-head) while high-priority
//!   messages wait (rabbit_fifo counts every take; counting only these keeps the state of a
//!   queue without high-priority messages that of release 0.1.0). While both levels hold
//!   messages, the high level is served, except when the counter is at 2: then the older of the
//!   two heads (the smaller id) goes. So a backlog of both gives at most two high messages for
//!   each normal one, and a normal message never waits behind an unbounded stream of high ones.
//!   This is rabbit_fifo_q's rule (its `?WEIGHT` of 2), counter and tie-break alike.
//!
//! A high message enters with [`Command::EnqueueWithPriority`](super::Command), a machine
//! version 2 command; a message of priority 0-4 needs nothing new and comes with a plain
//! `Enqueue`. The high level and the counter are left out of the state's own encoding (so a
//! snapshot of release 0.1.0 still decodes; `fresh` keeps only the normal level) and a
//! snapshot carries them beside the state ([`QueueState::high_priority`],
//! [`QueueState::restore_high_priority`]).
//!
//! Not here: RabbitMQ 4.3's strict levels under `x-max-priority` (module
//! `strict_priorities`), which a queue with that argument uses instead.

use imbl::OrdSet;

use super::{Place, QueueState};
use crate::types::MessageId;

/// Messages of this priority or more are high-priority.
pub const HIGH_PRIORITY_FROM: u8 = 5;

/// The counter's top: at this value the older head goes (rabbit_fifo_q's `?WEIGHT`).
const WEIGHT: u8 = 2;

/// Whether a message of `priority` is high-priority.
pub fn is_high(priority: u8) -> bool {
    priority >= HIGH_PRIORITY_FROM
}

/// Which level the next fresh message comes from, given the heads of both and the counter.
fn pick(high: Option<MessageId>, normal: Option<MessageId>, counter: u8) -> Option<MessageId> {
    match (high, normal) {
        (Some(h), Some(n)) if counter == WEIGHT => Some(h.min(n)),
        (Some(h), _) => Some(h),
        (None, n) => n,
    }
}

fn advance(counter: u8) -> u8 {
    if counter >= WEIGHT { 0 } else { counter + 1 }
}

type Levels<'a> = imbl::ordset::Iter<'a, MessageId, imbl::shared_ptr::DefaultSharedPtr>;

/// The fresh messages of both levels in the order they would be taken, from the counter's
/// present value, if nothing else arrived.
pub(super) struct FreshOrder<'a> {
    high: std::iter::Peekable<Levels<'a>>,
    normal: std::iter::Peekable<Levels<'a>>,
    counter: u8,
}

impl Iterator for FreshOrder<'_> {
    type Item = MessageId;

    fn next(&mut self) -> Option<MessageId> {
        let h = self.high.peek().map(|id| **id);
        let n = self.normal.peek().map(|id| **id);
        let id = pick(h, n, self.counter)?;
        if Some(id) == h {
            self.high.next();
        } else {
            self.normal.next();
        }
        self.counter = advance(self.counter);
        Some(id)
    }
}

impl QueueState {
    /// The next ready message to hand out: the oldest returned one, else the next fresh one.
    pub(super) fn ready_head(&self) -> Option<MessageId> {
        self.returns
            .get_min()
            .map(|(_, id)| *id)
            .or_else(|| self.fresh_head())
    }

    /// The next fresh (never returned) ready message: of the strict levels (module
    /// `strict_priorities`) if any holds one, else of either of the two levels.
    pub(super) fn fresh_head(&self) -> Option<MessageId> {
        self.strict_head().or_else(|| {
            pick(
                self.high.get_min().copied(),
                self.fresh.get_min().copied(),
                self.dequeue_counter,
            )
        })
    }

    /// Every fresh message in the order it would be taken.
    pub(super) fn fresh_in_order(&self) -> impl Iterator<Item = MessageId> + '_ {
        self.strict_in_order().chain(FreshOrder {
            high: self.high.iter().peekable(),
            normal: self.fresh.iter().peekable(),
            counter: self.dequeue_counter,
        })
    }

    /// Puts a new ready message on its level.
    pub(super) fn add_fresh(&mut self, id: MessageId, high: bool) {
        if high {
            self.high.insert(id);
        } else {
            self.fresh.insert(id);
        }
    }

    /// Takes a fresh message off its level (whichever holds it).
    pub(super) fn remove_fresh(&mut self, id: MessageId) {
        if self.fresh.remove(&id).is_none() && self.high.remove(&id).is_none() {
            self.remove_strict(id);
        }
    }

    /// Fresh messages of every level.
    pub(super) fn fresh_len(&self) -> usize {
        self.fresh.len() + self.high.len() + self.strict_len()
    }

    /// The oldest fresh message of any level.
    pub(super) fn oldest_fresh(&self) -> Option<MessageId> {
        [
            self.fresh.get_min().copied(),
            self.high.get_min().copied(),
            self.strict_oldest(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Takes `id`, the ready head, off the ready messages (to deliver, get or drop it): a
    /// fresh one moves the counter on while high-priority messages wait. (Only then: a queue
    /// that never had one keeps the counter at 0, and the state of release 0.1.0.)
    pub(super) fn take_ready(&mut self, id: MessageId) {
        if !self.high.is_empty() && matches!(self.msgs[&id].place, Place::Ready { returned: None })
        {
            self.dequeue_counter = advance(self.dequeue_counter);
        }
        self.detach_ready(id);
    }

    /// Ready high-priority messages that were never delivered (the high level).
    pub fn high_priority_ready(&self) -> u64 {
        self.high.len() as u64
    }

    /// The high-priority fresh messages and the counter, for a snapshot.
    pub fn high_priority(&self) -> (Vec<MessageId>, u8) {
        (self.high.iter().copied().collect(), self.dequeue_counter)
    }

    /// Puts back what [`QueueState::high_priority`] gave. Ids that are not fresh ready
    /// messages, or that the normal level holds, are dropped.
    pub fn restore_high_priority(&mut self, ids: impl IntoIterator<Item = MessageId>, counter: u8) {
        let high: OrdSet<MessageId> = ids
            .into_iter()
            .filter(|id| {
                !self.fresh.contains(id)
                    && self
                        .msgs
                        .get(id)
                        .is_some_and(|m| m.place == Place::Ready { returned: None })
            })
            .collect();
        self.high = high;
        self.dequeue_counter = counter.min(WEIGHT);
    }

    /// The invariant: the levels do not overlap, and the counter is within its cycle.
    pub(super) fn check_message_priorities(&self) -> Result<(), String> {
        if let Some(id) = self.high.iter().find(|id| self.fresh.contains(*id)) {
            return Err(format!("message {id} is on both priority levels"));
        }
        if self.dequeue_counter > WEIGHT {
            return Err(format!(
                "dequeue counter {} > {WEIGHT}",
                self.dequeue_counter
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_follows_the_two_to_one_rule() {
        assert_eq!(pick(Some(10), Some(1), 0), Some(10));
        assert_eq!(pick(Some(10), Some(1), 1), Some(10));
        assert_eq!(
            pick(Some(10), Some(1), 2),
            Some(1),
            "older head at the weight"
        );
        assert_eq!(
            pick(Some(1), Some(10), 2),
            Some(1),
            "a high head older still goes"
        );
        assert_eq!(pick(None, Some(3), 0), Some(3));
        assert_eq!(pick(Some(3), None, 2), Some(3));
        assert_eq!(pick(None, None, 1), None);
        assert_eq!((advance(0), advance(1), advance(2)), (1, 2, 0));
        assert!(!is_high(4) && is_high(5) && is_high(255));
    }
}
