//! Consumers of a queue: attaching one (Checkout), cancelling one, a consumer going down, and
//! which consumer the next ready message goes to.
//!
//! A **cancelled** consumer (an AMQP `basic.cancel`) takes no new message but keeps what it
//! holds until its client settles it, as RabbitMQ's quorum queues keep a cancelled consumer's
//! messages with its channel. It no longer counts as a consumer of the queue
//! ([`QueueState::counts`]) nor as the single active one; it leaves the state with its last
//! settle, or with [`super::Command::ConsumerDown`] (its stream closed), which returns what it still
//! holds. Until then it keeps the queue from expiring (`x-expires`), as an attached consumer
//! does.
//!
//! **Consumer priorities** (`x-priority`, [`super::Command::CheckoutWithPriority`], machine
//! version 2), as RabbitMQ's quorum queues: a ready message goes to a consumer of the highest
//! priority that has credit (round-robin among equals); a lower one gets messages only while
//! every higher one is at its prefetch. With single active consumer the active one is the
//! consumer that holds unacked messages, if one does; otherwise the highest priority (the
//! earliest attached among equals) becomes active. A higher-priority consumer that attaches
//! takes over once the active one has settled what it holds; meanwhile the active one takes
//! nothing new (RabbitMQ 4.0's quiescing). Without
//! priorities (all 0) both rules are exactly the earlier ones.
//!
//! The set of cancelled consumers and the priorities are left out of the state's own encoding
//! (snapshots written before they existed still decode): a snapshot carries them beside the
//! state, see [`QueueState::cancelled`], [`QueueState::priorities`] and their `restore_`.

use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Serialize};

use super::{Effect, GET_CONSUMER, MAX_CONSUMERS, QueueState, Reply, Return};
use crate::types::{ConsumerId, MessageId, NodeId};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Consumer {
    pub(super) node: NodeId,
    pub(super) prefetch: u32,
    /// Order of attachment (for single active consumer).
    pub(super) attached: u64,
    pub(super) checked_out: OrdSet<MessageId>,
}

impl Consumer {
    fn has_credit(&self) -> bool {
        self.prefetch == 0 || (self.checked_out.len() as u64) < u64::from(self.prefetch)
    }
}

impl QueueState {
    pub(super) fn checkout_cmd(
        &mut self,
        consumer: ConsumerId,
        node: NodeId,
        prefetch: u32,
        priority: Option<i32>,
    ) -> Reply {
        if consumer == GET_CONSUMER {
            return Reply::Error {
                detail: format!("consumer id {GET_CONSUMER} is reserved for get"),
            };
        }
        // A cancelled consumer stays cancelled: only its node, prefetch and priority (when
        // given) change.
        if let Some(c) = self.consumers.get_mut(&consumer) {
            c.node = node;
            c.prefetch = prefetch;
            if let Some(p) = priority {
                self.set_priority(consumer, p);
            }
            return Reply::Ok;
        }
        if self.consumers.len() >= MAX_CONSUMERS {
            return Reply::Error {
                detail: format!(
                    "queue '{}' has too many consumers (at most {MAX_CONSUMERS})",
                    self.config.name
                ),
            };
        }
        let attached = self.next_seq();
        self.consumers.insert(
            consumer,
            Consumer {
                node,
                prefetch,
                attached,
                checked_out: OrdSet::new(),
            },
        );
        self.set_priority(consumer, priority.unwrap_or(0));
        Reply::Ok
    }

    /// Only non-zero priorities are kept.
    fn set_priority(&mut self, consumer: ConsumerId, priority: i32) {
        if priority == 0 {
            self.priorities.remove(&consumer);
        } else {
            self.priorities.insert(consumer, priority);
        }
    }

    fn priority(&self, consumer: ConsumerId) -> i32 {
        self.priorities.get(&consumer).copied().unwrap_or(0)
    }

    /// [`super::Command::CancelConsumer`]: no new message for `consumer`; it leaves at once when it
    /// holds nothing, else with its last settle. An unknown consumer is a no-op (its stream
    /// may have closed first).
    pub(super) fn cancel_consumer(&mut self, consumer: ConsumerId) -> Reply {
        match self.consumers.get(&consumer) {
            Some(c) if c.checked_out.is_empty() => {
                self.consumers.remove(&consumer);
                self.cancelled.remove(&consumer);
                self.priorities.remove(&consumer);
            }
            Some(_) => {
                self.cancelled.insert(consumer);
            }
            None => {}
        }
        Reply::Ok
    }

    /// After a settle by `consumer`: a cancelled consumer that holds nothing more leaves.
    pub(super) fn release_if_drained(&mut self, consumer: ConsumerId) {
        if self.cancelled.contains(&consumer)
            && self
                .consumers
                .get(&consumer)
                .is_none_or(|c| c.checked_out.is_empty())
        {
            self.consumers.remove(&consumer);
            self.cancelled.remove(&consumer);
            self.priorities.remove(&consumer);
        }
    }

    /// The consumer leaves; what it holds comes back `how` (a consumer timeout: released, not
    /// failed).
    pub(super) fn consumer_down(
        &mut self,
        now: u64,
        consumer: ConsumerId,
        how: Return,
        fx: &mut Vec<Effect>,
    ) {
        self.cancelled.remove(&consumer);
        self.priorities.remove(&consumer);
        let Some(c) = self.consumers.remove(&consumer) else {
            return;
        };
        // Returned in id order, as rabbit_fifo does; the consumer record is already gone, so
        // there is nothing to detach from but the timeouts.
        for id in c.checked_out {
            self.stop_timeout(id);
            self.return_message(id, now, how, fx);
        }
    }

    /// The next consumer to serve, if any has credit (module doc: the highest priority first;
    /// single active consumer: only the active one is considered).
    pub(super) fn next_consumer(&self) -> Option<ConsumerId> {
        let live = |(id, _): &(&ConsumerId, &Consumer)| !self.cancelled.contains(*id);
        if self.config.single_active_consumer {
            let (id, c) = self.active_consumer()?;
            return (c.has_credit() && !self.outranked(id)).then_some(id);
        }
        let ring = || {
            self.consumers
                .range(self.cursor..)
                .chain(self.consumers.range(..self.cursor))
                .filter(live)
                .filter(|(_, c)| c.has_credit())
        };
        if self.priorities.is_empty() {
            return ring().next().map(|(id, _)| *id);
        }
        let top = ring().map(|(id, _)| self.priority(*id)).max()?;
        ring()
            .find(|(id, _)| self.priority(**id) == top)
            .map(|(id, _)| *id)
    }

    /// Single active consumer: a live consumer of a higher priority than the active one waits
    /// for it to settle what it holds; meanwhile the active one takes nothing new.
    fn outranked(&self, active: ConsumerId) -> bool {
        let mine = self.priority(active);
        !self.priorities.is_empty()
            && self
                .consumers
                .keys()
                .any(|id| !self.cancelled.contains(id) && self.priority(*id) > mine)
    }

    /// The single active consumer: the live one holding unacked messages, else the highest
    /// priority, earliest attached among equals (without priorities: the earliest attached).
    fn active_consumer(&self) -> Option<(ConsumerId, &Consumer)> {
        let mut live = self
            .consumers
            .iter()
            .filter(|(id, _)| !self.cancelled.contains(*id));
        if self.priorities.is_empty() {
            return live.min_by_key(|(_, c)| c.attached).map(|(id, c)| (*id, c));
        }
        let all: Vec<(&ConsumerId, &Consumer)> = live.by_ref().collect();
        let holder = all
            .iter()
            .filter(|(_, c)| !c.checked_out.is_empty())
            .min_by_key(|(_, c)| c.attached);
        holder
            .or_else(|| {
                all.iter()
                    .min_by_key(|(id, c)| (std::cmp::Reverse(self.priority(**id)), c.attached))
            })
            .map(|(id, c)| (**id, *c))
    }

    /// Consumers attached and not cancelled.
    pub(super) fn live_consumers(&self) -> u64 {
        (self.consumers.len() - self.cancelled.len()) as u64
    }

    /// The cancelled consumers that still hold messages, for a snapshot to carry beside the
    /// serialized state.
    pub fn cancelled(&self) -> &OrdSet<ConsumerId> {
        &self.cancelled
    }

    /// Puts back the cancelled consumers a snapshot carried (those no longer attached or
    /// holding nothing are dropped, so the state stays consistent whatever the snapshot held).
    pub fn restore_cancelled(&mut self, cancelled: impl IntoIterator<Item = ConsumerId>) {
        self.cancelled = cancelled
            .into_iter()
            .filter(|id| {
                self.consumers
                    .get(id)
                    .is_some_and(|c| !c.checked_out.is_empty())
            })
            .collect();
    }

    /// The non-zero consumer priorities, for a snapshot to carry beside the serialized state.
    pub fn priorities(&self) -> &OrdMap<ConsumerId, i32> {
        &self.priorities
    }

    /// Puts back the priorities a snapshot carried (of attached consumers, non-zero only).
    pub fn restore_priorities(&mut self, priorities: impl IntoIterator<Item = (ConsumerId, i32)>) {
        self.priorities = priorities
            .into_iter()
            .filter(|(id, p)| *p != 0 && self.consumers.contains_key(id))
            .collect();
    }

    /// The invariants of the priorities: each of an attached consumer, none zero.
    pub(super) fn check_priorities(&self) -> Result<(), String> {
        for (id, p) in &self.priorities {
            if !self.consumers.contains_key(id) {
                return Err(format!("priority of consumer {id}, which is not attached"));
            }
            if *p == 0 {
                return Err(format!("priority 0 of consumer {id} is kept"));
            }
        }
        Ok(())
    }

    /// The invariants of the cancelled set: each is attached and holds something.
    pub(super) fn check_cancelled(&self) -> Result<(), String> {
        for id in &self.cancelled {
            match self.consumers.get(id) {
                None => return Err(format!("cancelled consumer {id} is not attached")),
                Some(c) if c.checked_out.is_empty() => {
                    return Err(format!("cancelled consumer {id} holds nothing"));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}
