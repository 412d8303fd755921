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
//! The set of cancelled consumers is left out of the state's own encoding (snapshots written
//! before it existed still decode): a snapshot carries it beside the state, see
//! [`QueueState::cancelled`] and [`QueueState::restore_cancelled`].

use imbl::OrdSet;
use serde::{Deserialize, Serialize};

use super::{Effect, GET_CONSUMER, MAX_CONSUMERS, QueueState, Reply};
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
    ) -> Reply {
        if consumer == GET_CONSUMER {
            return Reply::Error {
                detail: format!("consumer id {GET_CONSUMER} is reserved for get"),
            };
        }
        // A cancelled consumer stays cancelled: only its node and prefetch change.
        if let Some(c) = self.consumers.get_mut(&consumer) {
            c.node = node;
            c.prefetch = prefetch;
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
        Reply::Ok
    }

    /// [`super::Command::CancelConsumer`]: no new message for `consumer`; it leaves at once when it
    /// holds nothing, else with its last settle. An unknown consumer is a no-op (its stream
    /// may have closed first).
    pub(super) fn cancel_consumer(&mut self, consumer: ConsumerId) -> Reply {
        match self.consumers.get(&consumer) {
            Some(c) if c.checked_out.is_empty() => {
                self.consumers.remove(&consumer);
                self.cancelled.remove(&consumer);
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
        }
    }

    pub(super) fn consumer_down(&mut self, now: u64, consumer: ConsumerId, fx: &mut Vec<Effect>) {
        self.cancelled.remove(&consumer);
        let Some(c) = self.consumers.remove(&consumer) else {
            return;
        };
        // Returned in id order, as rabbit_fifo does; the consumer record is already gone, so
        // there is nothing to detach from.
        for id in c.checked_out {
            self.return_failed(id, now, Some(0), fx);
        }
    }

    /// The next consumer to serve, if any has credit (single active consumer: only the earliest
    /// attached one that is not cancelled is considered).
    pub(super) fn next_consumer(&self) -> Option<ConsumerId> {
        let live = |(id, _): &(&ConsumerId, &Consumer)| !self.cancelled.contains(*id);
        if self.config.single_active_consumer {
            let (id, c) = self
                .consumers
                .iter()
                .filter(live)
                .min_by_key(|(_, c)| c.attached)?;
            return c.has_credit().then_some(*id);
        }
        self.consumers
            .range(self.cursor..)
            .chain(self.consumers.range(..self.cursor))
            .filter(live)
            .find(|(_, c)| c.has_credit())
            .map(|(id, _)| *id)
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
