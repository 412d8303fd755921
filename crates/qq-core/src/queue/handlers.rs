//! What each command does to the state (its handler), called by [`QueueState::apply`] between
//! the time advance and the assignment of ready messages to consumers.

use std::collections::BTreeSet;

use super::{
    Delivery, Effect, GET_CONSUMER, Msg, MsgHeader, Place, QueueState, Receipt, Reply, Return,
    SettleOutcome,
};
use crate::dedup::key_id;
use crate::types::{ConsumerId, MessageId, Overflow, QueueConfig, Reason, Strategy};

impl QueueState {
    pub(super) fn enqueue(
        &mut self,
        index: u64,
        now: u64,
        header: MsgHeader,
        (publish_key, dedup_key): (Option<String>, Option<String>),
        priority: u8,
        fx: &mut Vec<Effect>,
    ) -> Reply {
        let window = self.config.dedup_window_ms;
        self.publish_keys.forget_expired(self.clock_ms, window);
        self.transfer_keys.forget_expired(self.clock_ms, window);
        let publish_id = publish_key.as_deref().map(key_id);
        let transfer_id = dedup_key.as_deref().map(key_id);
        if publish_id.is_some_and(|k| self.publish_keys.contains(k))
            || transfer_id.is_some_and(|k| self.transfer_keys.contains(k))
        {
            self.stats.duplicates_total += 1;
            return Reply::Duplicate;
        }
        let ttl = match (self.config.message_ttl_ms, header.expiration_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let deadline_ms = ttl.map(|t| now.saturating_add(t));
        let size = header.size_bytes;
        let msg = Msg {
            header,
            deadline_ms,
            delivery_count: 0,
            delivered: false,
            enqueued_ms: now,
            place: Place::Ready { returned: None },
        };

        // Exact limits for the reject overflows: refuse a message that would be ready and would
        // take the queue over a limit. One a waiting consumer takes at once never counts (and
        // none is taken while a move task holds deliveries).
        if self.config.overflow != Overflow::DropHead {
            let taken_at_once = self.ready_len() == 0
                && self.next_consumer().is_some()
                && self.running_move().is_none();
            if !taken_at_once && let Some(detail) = self.would_exceed(size) {
                self.stats.rejected_publishes_total += 1;
                if self.config.overflow == Overflow::RejectPublish {
                    return Reply::Rejected { detail };
                }
                self.stats.enqueued_total += 1;
                self.msgs.insert(index, msg);
                self.kill(index, Reason::Maxlen, None, now, fx);
                return Reply::RejectedDeadLettered { id: index, detail };
            }
        }

        if let Some(k) = publish_id {
            self.publish_keys.remember(self.clock_ms, k);
        }
        if let Some(k) = transfer_id {
            self.transfer_keys.remember(self.clock_ms, k);
        }
        self.stats.enqueued_total += 1;
        self.msgs.insert(index, msg);
        if !self.add_strict(index, priority) {
            self.add_fresh(index, super::priorities::is_high(priority));
        }
        self.ready_bytes += size;
        if let Some(d) = deadline_ms {
            self.expiries.insert((d, index));
        }
        Reply::Enqueued { id: index }
    }

    pub(super) fn settle(
        &mut self,
        now: u64,
        consumer: ConsumerId,
        ids: &[MessageId],
        outcome: SettleOutcome,
        fx: &mut Vec<Effect>,
    ) -> Reply {
        // All or nothing: refuse the whole settle if any id is not held by this consumer.
        let mut seen = BTreeSet::new();
        for id in ids {
            let held = matches!(
                self.msgs.get(id).map(|m| &m.place),
                Some(Place::Unacked { consumer: c, .. }) if *c == consumer
            );
            // A lease bound to a receipt is settled only with it (SettleReceipts).
            let bound = self.receipts.contains_key(id);
            if !held || bound || !seen.insert(*id) {
                return Reply::Error {
                    detail: format!("unknown delivery tag {id}"),
                };
            }
        }
        for id in ids {
            self.detach_unacked(*id);
            match &outcome {
                SettleOutcome::Ack => {
                    self.forget(id);
                    self.stats.acked_total += 1;
                    fx.push(Effect::DeleteBody { id: *id });
                }
                SettleOutcome::Requeue => {
                    self.return_message(*id, now, Return::Failed { delay_ms: None }, fx)
                }
                SettleOutcome::RequeueAfter { delay_ms } => {
                    let how = Return::Failed {
                        delay_ms: Some(*delay_ms),
                    };
                    self.return_message(*id, now, how, fx)
                }
                SettleOutcome::Release => self.return_message(*id, now, Return::Released, fx),
                SettleOutcome::Reject => self.kill(*id, Reason::Rejected, None, now, fx),
                SettleOutcome::RejectWithDetail { detail } => {
                    self.kill(*id, Reason::Rejected, Some(detail.clone()), now, fx)
                }
            }
        }
        self.release_if_drained(consumer);
        Reply::Ok
    }

    /// Settle Get leases named by their receipts: every (id, receipt) must name a lease taken
    /// with that exact receipt (token and user), else nothing is settled.
    pub(super) fn settle_receipts(
        &mut self,
        now: u64,
        receipts: &[(MessageId, Receipt)],
        outcome: SettleOutcome,
        fx: &mut Vec<Effect>,
    ) -> Reply {
        for (id, receipt) in receipts {
            match self.receipts.get(id) {
                Some(r) if r.token == receipt.token && r.user == receipt.user => {}
                Some(r) if r.token == receipt.token => {
                    return Reply::Error {
                        detail: format!("receipt of message {id} belongs to another user"),
                    };
                }
                _ => {
                    return Reply::Error {
                        detail: format!("unknown or expired receipt for message {id}"),
                    };
                }
            }
        }
        let ids: Vec<MessageId> = receipts.iter().map(|(id, _)| *id).collect();
        let mut seen = BTreeSet::new();
        if !ids.iter().all(|id| seen.insert(*id)) {
            return Reply::Error {
                detail: "a receipt is named twice".into(),
            };
        }
        for id in &ids {
            self.receipts.remove(id);
        }
        let reply = self.settle(now, GET_CONSUMER, &ids, outcome, fx);
        debug_assert!(matches!(reply, Reply::Ok), "receipts name Get leases");
        reply
    }

    pub(super) fn get(
        &mut self,
        now: u64,
        lease_ms: u64,
        auto_ack: bool,
        fx: &mut Vec<Effect>,
    ) -> Reply {
        if self.config.single_active_consumer {
            return Reply::Error {
                detail: format!(
                    "get is not supported on queue '{}' with single active consumer",
                    self.config.name
                ),
            };
        }
        if self.running_move().is_some() {
            return Reply::Got {
                delivery: None,
                message_count: self.ready_len(),
            };
        }
        let Some(id) = self.ready_head() else {
            return Reply::Got {
                delivery: None,
                message_count: 0,
            };
        };
        self.take_ready(id);
        self.stats.delivered_total += 1;
        let lease_deadline_ms = if auto_ack {
            None
        } else {
            Some(now.saturating_add(lease_ms))
        };
        let acquired_count = self.acquired_count(id).unwrap_or(0);
        fx.push(Effect::Got { id, acquired_count });
        let m = self.msgs.get_mut(&id).expect("ready message exists");
        let delivery = Delivery {
            consumer: GET_CONSUMER,
            id,
            delivery_count: m.delivery_count,
            redelivered: m.delivered,
            lease_deadline_ms,
        };
        if auto_ack {
            self.forget(&id);
            self.stats.acked_total += 1;
            fx.push(Effect::DeleteBody { id });
        } else if let Some(deadline) = lease_deadline_ms {
            m.place = Place::Unacked {
                consumer: GET_CONSUMER,
                redelivered: m.delivered,
                lease_deadline_ms,
            };
            m.delivered = true;
            self.leases.insert((deadline, id));
        }
        Reply::Got {
            delivery: Some(delivery),
            message_count: self.ready_len(),
        }
    }

    pub(super) fn dead_letter_settle(&mut self, id: MessageId, fx: &mut Vec<Effect>) {
        let Some(Msg {
            place: Place::Held { seq, .. },
            ..
        }) = self.msgs.get(&id)
        else {
            return; // unknown or not held: already settled (a retried confirmation)
        };
        let seq = *seq;
        let m = self.forget(&id).expect("held message exists");
        self.held.remove(&seq);
        self.held_bytes -= m.header.size_bytes;
        self.stats.dead_lettered_confirmed += 1;
        fx.push(Effect::DeleteBody { id });
    }

    /// Ready and delayed messages go (delayed ones are ready messages that wait).
    pub(super) fn purge(&mut self, fx: &mut Vec<Effect>) -> Reply {
        let mut ids = self.ready_ids();
        ids.extend(self.delayed.values().copied());
        for id in &ids {
            self.detach_waiting(*id);
            self.forget(id);
            fx.push(Effect::DeleteBody { id: *id });
        }
        self.stats.purged_total += ids.len() as u64;
        Reply::Purged {
            count: ids.len() as u64,
        }
    }

    pub(super) fn update_config(&mut self, config: QueueConfig, fx: &mut Vec<Effect>) {
        let was = self.config.dead_letter_strategy;
        self.config = config;
        let now_strategy = self.config.dead_letter_strategy;
        if was == Strategy::AtLeastOnce && now_strategy != Strategy::AtLeastOnce {
            // Release the held dead letters under the new strategy, in death order.
            let held = std::mem::take(&mut self.held);
            self.held_bytes = 0;
            for (_, id) in held {
                let m = self.forget(&id).expect("held message exists");
                let Place::Held {
                    reason,
                    died_at_ms,
                    detail,
                    ..
                } = m.place
                else {
                    unreachable!("held index names message {id} that is not held")
                };
                fx.push(Effect::DeadLetter {
                    id,
                    reason,
                    strategy: now_strategy,
                    died_at_ms,
                    detail,
                });
            }
        }
    }
}
