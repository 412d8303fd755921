//! Read-only views of a queue's state: counts, timers, browsing, held dead letters, the
//! messages out with consumers, and the Get receipts a snapshot carries.

use super::{
    Browsed, Counts, Delivery, GET_CONSUMER, HeldDeadLetter, Location, MsgHeader, Place,
    QueueState, Receipt, Receipts, Stats,
};
use crate::types::{ConsumerId, MessageId, NodeId, QueueConfig};

impl QueueState {
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The index of the last applied command (0 before any).
    pub fn last_applied(&self) -> u64 {
        self.last_index
    }

    /// When a consumer or a Get last used the queue (0 = never); see
    /// [`QueueState::queue_expiry_due_ms`] for how it decides `x-expires`.
    pub fn last_used_ms(&self) -> u64 {
        self.last_used_ms
    }

    /// The time from which [`Command::ExpireQueue`] answers `expired: true` (its `now_ms` >= this),
    /// if nothing else happens first: `max(last_used_ms, leader_since_ms) + expires_ms`,
    /// saturating. None without `x-expires` or while a consumer is attached (it cannot expire
    /// then). The leader arms one timer for it; a consumer or a Get moves it, so it is asked
    /// again after such commands apply.
    pub fn queue_expiry_due_ms(&self, leader_since_ms: u64) -> Option<u64> {
        let expires_ms = self.config.expires_ms?;
        if !self.consumers.is_empty() {
            return None;
        }
        Some(
            self.last_used_ms
                .max(leader_since_ms)
                .saturating_add(expires_ms),
        )
    }

    /// The largest `now_ms` applied so far: the state machine's clock.
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    pub fn counts(&self) -> Counts {
        Counts {
            ready: self.ready_len(),
            unacked: self.unacked_len(),
            held: self.held.len() as u64,
            consumers: self.live_consumers(),
            ready_bytes: self.ready_bytes,
            held_bytes: self.held_bytes,
            delayed: self.delayed.len() as u64,
            delayed_bytes: self.delayed_bytes,
        }
    }

    /// Earliest ready-message expiry, Get-lease deadline or delayed message's due time: when
    /// the leader should propose Expire (which releases due delayed messages). O(log n).
    pub fn next_deadline(&self) -> Option<u64> {
        let expiry = self.expiries.get_min().map(|(d, _)| *d);
        let lease = self.leases.get_min().map(|(d, _)| *d);
        let delayed = self.delayed.get_min().map(|((due, _), _)| *due);
        let timeout = self.next_consumer_timeout();
        [expiry, lease, delayed, timeout]
            .into_iter()
            .flatten()
            .min()
    }

    /// The delay a `Requeue` without one gives a message that has now failed `delivery_count`
    /// times (>= 1): the `x-requeue-delays` entry for that count, the last one repeating; 0
    /// without the setting.
    pub fn requeue_delay_ms(&self, delivery_count: u32) -> u64 {
        let delays = &self.config.requeue_delays_ms;
        let i = (delivery_count.max(1) as usize - 1).min(delays.len().saturating_sub(1));
        delays.get(i).copied().unwrap_or(0)
    }

    /// The ready messages at positions `offset..offset + limit` in dispatch order, without
    /// taking them, stopping before the message that would take the page's stored size past
    /// `max_bytes` (the first one always comes). O(offset + limit).
    pub fn browse(&self, offset: u64, limit: usize, max_bytes: u64) -> Vec<Browsed> {
        let mut bytes = 0u64;
        self.returns
            .values()
            .copied()
            .chain(self.fresh_in_order())
            .enumerate()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .take(limit)
            .take_while(|(position, id)| {
                bytes = bytes.saturating_add(self.msgs[id].header.size_bytes);
                *position as u64 == offset || bytes <= max_bytes
            })
            .map(|(position, id)| {
                let m = &self.msgs[&id];
                Browsed {
                    position: position as u64,
                    id,
                    delivery_count: m.delivery_count,
                    redelivered: m.delivered,
                    enqueued_ms: m.enqueued_ms,
                }
            })
            .collect()
    }

    /// When the oldest ready message was enqueued (ids grow with enqueue time, so it is the
    /// smallest ready id). O(log n).
    pub fn oldest_ready_enqueued_ms(&self) -> Option<u64> {
        let oldest = match (self.oldest_fresh(), self.returned_ids.get_min().copied()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }?;
        Some(self.msgs[&oldest].enqueued_ms)
    }

    /// Dead letters held for at-least-once transfer, in death order.
    pub fn held_dead_letters(&self) -> Vec<HeldDeadLetter> {
        self.held.values().map(|id| self.held_letter(*id)).collect()
    }

    /// The first held dead letters in death order that `skip` does not name, up to `max` of
    /// them and `max_bytes` of their sizes (always at least one if any is left), without
    /// walking the rest: a transfer round's batch.
    pub fn first_held_dead_letters(
        &self,
        max: usize,
        max_bytes: u64,
        skip: impl Fn(MessageId) -> bool,
    ) -> Vec<HeldDeadLetter> {
        let mut out = Vec::new();
        let mut bytes = 0u64;
        for id in self.held.values().copied().filter(|id| !skip(*id)) {
            let size = self.msgs[&id].header.size_bytes;
            if out.len() == max || (!out.is_empty() && bytes + size > max_bytes) {
                break;
            }
            bytes += size;
            out.push(self.held_letter(id));
        }
        out
    }

    pub(super) fn held_letter(&self, id: MessageId) -> HeldDeadLetter {
        let m = &self.msgs[&id];
        let Place::Held {
            reason,
            died_at_ms,
            ref detail,
            ..
        } = m.place
        else {
            unreachable!("held index names message {id} that is not held")
        };
        HeldDeadLetter {
            id,
            reason,
            died_at_ms,
            size_bytes: m.header.size_bytes,
            detail: detail.clone(),
        }
    }

    /// (consumer, node, prefetch, unacked) of every attached consumer, by consumer id.
    pub fn consumers(&self) -> Vec<(ConsumerId, NodeId, u32, u32)> {
        self.consumers
            .iter()
            .map(|(id, c)| (*id, c.node, c.prefetch, c.checked_out.len() as u32))
            .collect()
    }

    /// Every live id (ready, unacked, held), ascending: the bodies a snapshot must carry.
    pub fn message_ids(&self) -> Vec<MessageId> {
        self.live_ids().collect()
    }

    /// Every live message id, in id order, without collecting them.
    pub fn live_ids(&self) -> impl Iterator<Item = MessageId> + '_ {
        self.msgs.keys().copied()
    }

    /// Ready ids in dispatch order (returns first, then never-returned by id).
    pub fn ready_ids(&self) -> Vec<MessageId> {
        self.first_ready_ids(usize::MAX)
    }

    /// The first `n` ready messages in dispatch order, without walking the rest.
    pub fn first_ready_ids(&self, n: usize) -> Vec<MessageId> {
        self.returns
            .values()
            .copied()
            .chain(self.fresh_in_order())
            .take(n)
            .collect()
    }

    /// Where a live message is; None if it is not (or no longer) in the queue.
    pub fn location(&self, id: MessageId) -> Option<Location> {
        self.msgs.get(&id).map(|m| match m.place {
            Place::Ready { .. } => Location::Ready,
            Place::Unacked { consumer, .. } => Location::Unacked { consumer },
            Place::Held { .. } => Location::Held,
            Place::Delayed { due_ms, .. } => Location::Delayed { due_ms },
        })
    }

    /// Header of a live message.
    pub fn header(&self, id: MessageId) -> Option<&MsgHeader> {
        self.msgs.get(&id).map(|m| &m.header)
    }

    /// Every message checked out to a consumer (not Get leases), as the Delivery that sent it:
    /// what a new leader re-sends (consumers de-duplicate by id). By consumer, then id.
    pub fn pending_deliveries(&self) -> Vec<Delivery> {
        let mut out = Vec::new();
        for (cid, c) in &self.consumers {
            for id in &c.checked_out {
                let m = &self.msgs[id];
                if let Place::Unacked { redelivered, .. } = m.place {
                    out.push(Delivery {
                        consumer: *cid,
                        id: *id,
                        delivery_count: m.delivery_count,
                        redelivered,
                        lease_deadline_ms: None,
                    });
                }
            }
        }
        out
    }

    /// The receipts of the Get leases, for a snapshot to carry beside the serialized state.
    pub fn receipts(&self) -> &Receipts {
        &self.receipts
    }

    /// Puts back the receipts a snapshot carried (those of messages no longer under a Get
    /// lease are dropped, so the state stays consistent whatever the snapshot held).
    pub fn restore_receipts(&mut self, receipts: impl IntoIterator<Item = (MessageId, Receipt)>) {
        self.receipts = receipts
            .into_iter()
            .filter(|(id, _)| {
                matches!(
                    self.msgs.get(id).map(|m| &m.place),
                    Some(Place::Unacked { consumer, .. }) if *consumer == GET_CONSUMER
                )
            })
            .collect();
    }
}
