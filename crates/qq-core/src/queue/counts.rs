//! Delivery counting as RabbitMQ 4.3's quorum queues count (its docs, "When is delivery count
//! incremented?").
//!
//! - A message's **delivery count** (`x-delivery-count`) counts its *failed* deliveries: a
//!   requeue (`SettleOutcome::Requeue`, `RequeueAfter`: gRPC REQUEUE, AMQP `basic.reject` with
//!   requeue), its consumer's stream or channel ending with it unacked, a Get lease lapsing. The
//!   delivery limit and `x-requeue-delays` go by it.
//! - A **release** (`SettleOutcome::Release`, AMQP `basic.nack` with requeue; machine version 2)
//!   and a **consumer timeout** return the message without counting a failure: a client that
//!   hands a message back on purpose, or a consumer too slow, does not use up its delivery limit.
//! - The **acquired count** (`x-acquired-count`) counts every return, of either kind: the delivery
//!   count plus the releases.
//!
//! Releases are counted in a side map, with an entry only for a message released at least once.
//! Like `receipts`, the map is left out of the state's own encoding (so a snapshot of release
//! 0.1.0 still decodes) and a snapshot carries it beside the state ([`QueueState::releases`],
//! [`QueueState::restore_releases`]). Every message leaves the state through
//! [`QueueState::forget`], which drops its entry too.

use super::{Effect, Msg, QueueState, Reason};
use crate::types::MessageId;

/// How a checked-out message comes back to the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Return {
    /// A failed delivery: the delivery count grows, the delivery limit may kill it, and it waits
    /// `delay_ms` (None: as `x-requeue-delays` says for its count).
    Failed { delay_ms: Option<u64> },
    /// Handed back without failing: counted only in the acquired count, back at once.
    Released,
}

impl Return {
    /// A failed delivery back at once, whatever `x-requeue-delays` says: what a consumer that
    /// leaves, or a Get lease that lapses, held.
    pub(super) const FAILED_AT_ONCE: Return = Return::Failed { delay_ms: Some(0) };
}

impl QueueState {
    /// Every message's releases so far (only those released at least once), for a snapshot.
    pub fn releases(&self) -> Vec<(MessageId, u32)> {
        self.releases.iter().map(|(id, n)| (*id, *n)).collect()
    }

    /// Puts back what [`QueueState::releases`] gave; ids no longer in the queue are dropped.
    pub fn restore_releases(&mut self, releases: impl IntoIterator<Item = (MessageId, u32)>) {
        self.releases = releases
            .into_iter()
            .filter(|(id, n)| *n > 0 && self.msgs.contains_key(id))
            .collect();
    }

    /// Returns of any kind so far of message `id` (`x-acquired-count`): failed deliveries plus
    /// releases. None: not in the queue. The leader reads it when it sends a delivery (a
    /// checked-out message's counts do not change until it comes back), so `Delivery`, which
    /// crosses nodes in Get replies, keeps the shape release 0.1.0 decodes.
    pub fn acquired_count(&self, id: MessageId) -> Option<u32> {
        let m = self.msgs.get(&id)?;
        Some(m.delivery_count.saturating_add(self.releases_of(id)))
    }

    /// Releases so far of message `id` (0 for most): what a delivery's `delivery_count` lacks
    /// to be its acquired count.
    pub fn releases_of(&self, id: MessageId) -> u32 {
        self.releases.get(&id).copied().unwrap_or(0)
    }

    /// The message leaves the state, with its release count.
    pub(super) fn forget(&mut self, id: &MessageId) -> Option<Msg> {
        self.releases.remove(id);
        self.msgs.remove(id)
    }

    /// A checked-out message comes back (see [`Return`]); it must already be detached from its
    /// holder. Past the delivery limit it dies, past its deadline it expires, otherwise it joins
    /// the tail of the returns queue, or first waits in the delayed set.
    pub(super) fn return_message(
        &mut self,
        id: MessageId,
        now: u64,
        how: Return,
        fx: &mut Vec<Effect>,
    ) {
        self.stats.returned_total += 1;
        let delay_ms = match how {
            Return::Failed { delay_ms } => {
                let m = self.msgs.get_mut(&id).expect("returned message exists");
                m.delivery_count = m.delivery_count.saturating_add(1);
                let count = m.delivery_count;
                let over_limit = self
                    .config
                    .delivery_limit
                    .is_some_and(|limit| u64::from(count) > limit);
                if over_limit {
                    self.kill(id, Reason::DeliveryLimit, None, now, fx);
                    return;
                }
                delay_ms.unwrap_or_else(|| self.requeue_delay_ms(count))
            }
            Return::Released => {
                let n = self.releases.entry(id).or_insert(0);
                *n = n.saturating_add(1);
                0
            }
        };
        self.requeue(id, now, delay_ms, fx);
    }

    /// The invariant: only messages in the queue have a release count, and none is zero.
    pub(super) fn check_releases(&self) -> Result<(), String> {
        match self
            .releases
            .iter()
            .find(|(id, n)| **n == 0 || !self.msgs.contains_key(*id))
        {
            Some((id, n)) => Err(format!(
                "release count {n} of message {id} not in the queue"
            )),
            None => Ok(()),
        }
    }
}
