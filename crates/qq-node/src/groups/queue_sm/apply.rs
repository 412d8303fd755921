//! Applying a committed entry: every command through the pure machine, its reply out, and its
//! effects carried out (bodies on every member; deliveries and at-most-once dead letters only
//! where this node leads).

use std::io;
use std::sync::atomic::Ordering;

use qq_core::queue::{Delivery, Effect, Reply};
use qq_core::{ConsumerId, MessageId, Reason, Strategy};
use qq_raft::GroupId;
use qq_raft::snapshot::{SnapshotReader, SnapshotWriter};
use qq_raft::store::Store;
use tokio::sync::mpsc;
use tracing::warn;

use super::entry::{BATCH_SHIFT, QueueEntry, QueueReplyOut, QueueRequest, check_entry};
use super::snapshot::QueueCut;
use super::{
    ConsumerEvent, DeadLetterJob, LeaderEvent, QueueMachine, UNLIMITED_PREFETCH_BUFFER, io_encode,
};
use crate::groups::shell::{LogId, Machine};
use crate::metrics;

impl QueueMachine {
    /// Apply one command at sub-index `index` (raft index << 16 | position in the entry).
    fn apply_one(&self, index: u64, req: QueueRequest) -> io::Result<QueueReplyOut> {
        let QueueRequest { cmd, message: body } = req;
        let leader = self.is_leader();
        let (reply, effects, acquired) = {
            let mut state = self.state.lock().unwrap();
            let (reply, effects) = state.apply(index, cmd);
            // The leader sends `x-acquired-count` with each delivery, read while it holds the
            // state (a checked-out message's counts do not change until it comes back).
            let acquired: Vec<u32> = match leader {
                true => effects
                    .iter()
                    .filter_map(|e| match e {
                        Effect::Deliver(d) => {
                            Some(d.delivery_count.saturating_add(state.releases_of(d.id)))
                        }
                        _ => None,
                    })
                    .collect(),
                false => Vec::new(),
            };
            (reply, effects, acquired)
        };
        let got_acquired = effects.iter().find_map(|e| match e {
            Effect::Got { acquired_count, .. } => Some(*acquired_count),
            _ => None,
        });
        // A Get's message is read before effects run (auto-ack deletes its body).
        let message = match &reply {
            Reply::Got {
                delivery: Some(d), ..
            } => Some(self.read_message(d.id)?),
            _ => None,
        };
        match &reply {
            Reply::Enqueued { id } | Reply::RejectedDeadLettered { id, .. } => {
                self.put_body(*id, body.unwrap_or_default());
            }
            _ => {}
        }
        self.carry_out(effects, leader, acquired);
        Ok(QueueReplyOut {
            reply,
            message,
            acquired_count: got_acquired,
        })
    }

    /// Carries out the effects of one command; body writes are collected for the entry.
    /// `acquired`: the acquired count of each delivery among them, in order (leader only).
    fn carry_out(&self, effects: Vec<Effect>, leader: bool, acquired: Vec<u32>) {
        let mut acquired = acquired.into_iter();
        for effect in effects {
            if leader
                && let Effect::DeadLetter {
                    reason, strategy, ..
                } = &effect
            {
                metrics::dead_lettered(*reason, *strategy);
            }
            match effect {
                Effect::Deliver(delivery) if leader => {
                    self.deliver(delivery, acquired.next().unwrap_or(0))
                }
                Effect::Deliver(_) => {}
                Effect::DeleteBody { id } => self.delete_body(id),
                // Read by apply_one for the Get's answer.
                Effect::Got { .. } => {}
                Effect::ConsumerTimedOut {
                    consumer,
                    id,
                    timeout_ms,
                } => {
                    if leader {
                        self.end_timed_out(consumer, id, timeout_ms);
                    }
                }
                Effect::DeadLetter {
                    id,
                    reason,
                    strategy,
                    died_at_ms,
                    detail,
                } => match strategy {
                    Strategy::AtLeastOnce => {} // held in the state until DeadLetterSettle
                    Strategy::Disabled => self.delete_body(id),
                    Strategy::AtMostOnce => {
                        if leader {
                            self.hand_dead_letter(id, reason, died_at_ms, detail);
                        }
                        self.delete_body(id);
                    }
                },
            }
        }
    }

    fn deliver(&self, delivery: Delivery, acquired_count: u32) {
        let consumer = delivery.consumer;
        let mut consumers = self.consumers.lock().unwrap();
        let Some(tx) = consumers.get(&consumer) else {
            return;
        };
        let message = match self.read_message(delivery.id) {
            Ok(m) => m,
            Err(e) => {
                warn!(group = self.group, "cannot deliver: {e}");
                return;
            }
        };
        if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(ConsumerEvent::Deliver {
            delivery,
            acquired_count,
            message,
        }) {
            // See UNLIMITED_PREFETCH_BUFFER: the session ends, the new leader-side clean-up
            // returns what it held.
            warn!(
                group = self.group,
                "consumer's delivery buffer is full ({UNLIMITED_PREFETCH_BUFFER}): dropping the consumer"
            );
            consumers.remove(&consumer);
        }
    }

    /// The queue ended a consumer for its timeout: its session here ends with the reason (a
    /// gRPC `cancelled`, an AMQP basic.cancel from the server).
    fn end_timed_out(&self, consumer: ConsumerId, id: MessageId, timeout_ms: u64) {
        if let Some(tx) = self.consumers.lock().unwrap().remove(&consumer) {
            let reason = format!(
                "consumer timeout: message {id} was not acknowledged within {timeout_ms} ms \
                 (x-consumer-timeout); what the consumer held went back to the queue"
            );
            // A full inbox ends its session anyway (the sender is dropped here).
            let _ = tx.try_send(ConsumerEvent::Cancelled {
                reason,
                unavailable: false,
            });
        }
    }

    fn hand_dead_letter(
        &self,
        id: MessageId,
        reason: Reason,
        died_at_ms: u64,
        detail: Option<String>,
    ) {
        let message = match self.read_message(id) {
            Ok(m) => m,
            Err(e) => {
                warn!(group = self.group, "dead letter {id} lost its body: {e}");
                return;
            }
        };
        let config = self.state.lock().unwrap().config().clone();
        let job = DeadLetterJob {
            group: self.group,
            config,
            id,
            reason,
            died_at_ms,
            detail,
            message,
        };
        if let Some((_, tx)) = self.leader.lock().unwrap().as_ref() {
            if tx.try_send(LeaderEvent::DeadLetter(job)).is_err() {
                // Counted here; the leader actor logs the count, rate-limited (no clock here).
                self.dropped_dead_letters.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Machine for QueueMachine {
    /// The state as of the snapshot's index, and a pinned view of the bodies at that moment
    /// (a consistent cut: bodies removed by later entries are still in it).
    type Cut = QueueCut;

    fn group(&self) -> GroupId {
        self.group
    }

    fn store(&self) -> &Store {
        &self.store
    }

    fn apply_payload(&self, index: u64, payload: &[u8]) -> io::Result<Vec<u8>> {
        let decoded = match check_entry(payload) {
            Ok(entry) => entry,
            Err(why) => {
                let why = format!("entry {index}: {why}");
                self.refusals.record(self.group, index, &why);
                return io_encode(&QueueReplyOut {
                    reply: Reply::Error { detail: why },
                    message: None,
                    acquired_count: None,
                });
            }
        };
        let reply = match decoded {
            QueueEntry::One(req) => self
                .apply_one(index << BATCH_SHIFT, req)?
                .encode()
                .map_err(|e| io::Error::other(format!("encode: {e}")))?,
            QueueEntry::Batch(reqs) => {
                let mut replies = Vec::with_capacity(reqs.len());
                for (k, req) in reqs.into_iter().enumerate() {
                    replies.push(self.apply_one((index << BATCH_SHIFT) | k as u64, req)?);
                }
                io_encode(&replies)?
            }
        };
        self.flush_bodies()?;
        Ok(reply)
    }

    fn applied_batch(&self) {
        self.applied.send_modify(|n| *n += 1);
    }

    fn last_applied(&self) -> Option<LogId> {
        *self.last_applied.lock().unwrap()
    }

    fn set_last_applied(&self, log_id: Option<LogId>) {
        *self.last_applied.lock().unwrap() = log_id;
    }

    fn cut(&self) -> QueueCut {
        self.take_cut()
    }

    fn write_cut(&self, cut: QueueCut, out: &mut SnapshotWriter) -> io::Result<()> {
        self.write_snapshot(cut, out)
    }

    fn install(&self, snapshot: &mut SnapshotReader) -> io::Result<()> {
        self.install_snapshot(snapshot)
    }
}
