//! Republishing dead letters through the dead-letter exchange.
//!
//! The copy is made by the pure [`qq_core::deadletter::dead_letter`] (x-death history, keys,
//! expiration removed), routed with the metadata view, and committed into every target queue
//! through the shared [`crate::enqueue`] path, skipping targets that would close a dead-letter
//! cycle. Each copy carries the idempotency key `dl:{source group}:{message id}:{death count}`,
//! so a retried transfer never leaves a duplicate in a target (the target's state machine drops
//! a key it has seen).
//!
//! - at-most-once: the message already left the source's state; the leader that applied the
//!   death tries once ([`DeadLetters::publish_at_most_once`]). No route or a refusing target
//!   drops it.
//! - at-least-once: the message stays held in the source's replicated state; the source's
//!   leader actor ([`crate::leader`]) transfers held dead letters in rounds
//!   ([`DeadLetters::transfer_held`]) and proposes `DeadLetterSettle` for those every target
//!   committed ([`DeadLetters::settle`]). Rounds go one after the other (so each target stores
//!   the copies in death order); a round's settle overlaps the next round.
//!
//! Order: dead letters leave in the order they died; the copies for one target go as one batch
//! entry in that order, so each target sees them in order.
//!
//! Must not: decide when to transfer (the leader actor does) or read a clock for a decision.

use qq_core::deadletter::{dead_letter_with_detail, deaths, is_cycle};
use qq_core::meta::MetaState;
use qq_core::queue::{Command, HeldDeadLetter, MsgHeader, Reply};
use qq_core::{Message, MessageId, QueueConfig, Reason};
use qq_raft::GroupId;
use tracing::debug;

use crate::enqueue::{self, Enqueuer, Routed};
use crate::groups::queue_sm::{DeadLetterJob, QueueMachine, QueueRequest};
use crate::meta_view::MetaView;
use crate::proposer::Proposer;

/// Most held dead letters one transfer round takes, and most bytes of them (a larger dead
/// letter goes alone). A round is one batch entry per target, so a relay that falls behind
/// catches up with larger rounds, not more of them.
pub const TRANSFER_BATCH: usize = 4096;
pub const TRANSFER_BATCH_BYTES: u64 = 4 << 20;

/// Why a transfer did not complete (the dead letter stays held under at-least-once).
#[derive(Debug)]
pub enum TransferError {
    NoRoute(String),
    Refused(String),
    Unavailable(String),
}

/// A dead letter to transfer.
struct Letter {
    id: MessageId,
    reason: Reason,
    died_at_ms: u64,
    /// The consumer's `reason_detail` of a reject.
    detail: Option<String>,
    message: Message,
}

#[derive(Clone)]
pub struct DeadLetters {
    view: MetaView,
    enqueuer: Enqueuer,
    proposer: Proposer,
}

/// What one at-least-once round did.
pub struct Round {
    /// Dead letters every target committed: the source may settle them now.
    pub transferred: Vec<MessageId>,
    /// The last failure, if any; those dead letters stay held.
    pub failure: Option<TransferError>,
}

impl DeadLetters {
    pub fn new(view: MetaView, enqueuer: Enqueuer, proposer: Proposer) -> DeadLetters {
        DeadLetters {
            view,
            enqueuer,
            proposer,
        }
    }

    /// Make the copy of `message` (which died in `config`'s queue) and route it through the DLX
    /// with the metadata `topology`.
    fn prepare(
        &self,
        topology: &MetaState,
        group: GroupId,
        config: &QueueConfig,
        letter: &Letter,
    ) -> Result<Vec<Routed>, TransferError> {
        let Letter {
            id,
            reason,
            died_at_ms,
            detail,
            message,
        } = letter;
        let Some(dlx) = config.dead_letter_exchange.as_deref() else {
            return Err(TransferError::NoRoute(format!(
                "queue '{}' has no dead-letter exchange",
                config.name
            )));
        };
        let (copy, keys) = dead_letter_with_detail(
            message,
            &config.name,
            *reason,
            detail.as_deref(),
            *died_at_ms,
            dlx,
            config.dead_letter_routing_key.as_deref(),
        );
        let targets = topology
            .route(&config.vhost, dlx, &keys, &copy.properties.headers)
            .map_err(|e| TransferError::NoRoute(e.message))?;
        if targets.is_empty() {
            return Err(TransferError::NoRoute(format!(
                "exchange '{dlx}' routes no queue for keys {keys:?}"
            )));
        }
        let encoded = postcard::to_stdvec(&copy)
            .map_err(|e| TransferError::Unavailable(format!("encode: {e}")))?;
        let expiration_ms = if copy.properties.expiration.is_empty() {
            None
        } else {
            expiration_ms(&copy.properties.expiration)
        };
        let count = deaths(&copy).first().map(|d| d.count).unwrap_or(1);
        let header = MsgHeader {
            // As for a publish: properties, headers and body.
            size_bytes: encoded.len() as u64,
            expiration_ms,
        };
        let key = format!("dl:{group}:{id}:{count}");
        // A cycle without a rejection in it: the copy is dropped for that target.
        let routed: Vec<Routed> = targets
            .into_iter()
            .filter(|t| !is_cycle(&copy, &t.name))
            .map(|t| Routed {
                target: t.id,
                name: t.name,
                request: enqueue::request(&header, &encoded, key.clone()),
            })
            .collect();
        // Every target a cycle: no route. At-most-once drops it; at-least-once keeps it held
        // until the topology gives it a target (SEMANTICS.md, routing a dead letter, point 4).
        if routed.is_empty() {
            return Err(TransferError::NoRoute(format!(
                "every queue exchange '{dlx}' routes to for keys {keys:?} is a dead-letter cycle"
            )));
        }
        Ok(routed)
    }

    /// Transfer dead letters (in the order they died). Returns, per dead letter, whether every
    /// target committed it.
    async fn transfer(
        &self,
        group: GroupId,
        config: &QueueConfig,
        letters: Vec<Letter>,
    ) -> Vec<(MessageId, Result<(), TransferError>)> {
        let mut outcome = Vec::with_capacity(letters.len());
        let mut copies = Vec::with_capacity(letters.len());
        // One topology for the whole round: a binding that appears while the round is being
        // prepared must not route its later dead letters while the earlier ones stay held (they
        // would reach the target after them; found by the 3 000-letter order test).
        let topology = self.view.current();
        for letter in &letters {
            match self.prepare(&topology, group, config, letter) {
                Ok(routed) => {
                    copies.push(routed);
                    outcome.push((letter.id, Ok(())));
                }
                Err(e) => {
                    copies.push(Vec::new());
                    outcome.push((letter.id, Err(e)));
                }
            }
        }
        let replies = self.enqueuer.commit(copies).await;
        for (slot, targets) in outcome.iter_mut().zip(replies) {
            for t in targets {
                let result = match t.reply {
                    Ok(reply) => check_reply(&t.name, &reply),
                    Err(e) => Err(TransferError::Unavailable(format!(
                        "target '{}': {e}",
                        t.name
                    ))),
                };
                if let (Err(e), true) = (result, slot.1.is_ok()) {
                    slot.1 = Err(e);
                }
            }
        }
        outcome
    }

    /// At-most-once: one attempt; a failure means the dead letter is dropped.
    pub async fn publish_at_most_once(&self, job: DeadLetterJob) -> Result<(), String> {
        let letters = vec![Letter {
            id: job.id,
            reason: job.reason,
            died_at_ms: job.died_at_ms,
            detail: job.detail,
            message: job.message,
        }];
        for (id, result) in self.transfer(job.group, &job.config, letters).await {
            if let Err(e) = result {
                return Err(format!(
                    "queue '{}': at-most-once dead letter {id} dropped: {e:?}",
                    job.config.name
                ));
            }
        }
        Ok(())
    }

    /// At-least-once: transfer these held dead letters of the queue (a batch the caller took
    /// with [`qq_core::queue::QueueState::first_held_dead_letters`], in death order) to every
    /// target. The caller settles those every target committed ([`DeadLetters::settle`]).
    pub async fn transfer_held(
        &self,
        group: GroupId,
        machine: &QueueMachine,
        config: &QueueConfig,
        batch: Vec<HeldDeadLetter>,
    ) -> Round {
        let mut failure = None;
        let mut letters = Vec::with_capacity(batch.len());
        for h in batch {
            match machine.read_message(h.id) {
                Ok(message) => letters.push(Letter {
                    id: h.id,
                    reason: h.reason,
                    died_at_ms: h.died_at_ms,
                    detail: h.detail,
                    message,
                }),
                Err(e) => failure = Some(TransferError::Unavailable(e.to_string())),
            }
        }
        let mut transferred = Vec::new();
        for (id, r) in self.transfer(group, config, letters).await {
            match r {
                Ok(()) => transferred.push(id),
                Err(e) => failure = Some(e),
            }
        }
        Round {
            transferred,
            failure,
        }
    }

    /// Forget dead letters every target committed (`DeadLetterSettle`). Not applied (a lost
    /// leadership): they stay held, and the next transfer finds them stored already (their
    /// transfer keys), so no target gets a second copy.
    pub async fn settle(&self, group: GroupId, ids: Vec<MessageId>) {
        let n = ids.len();
        let cmd = Command::DeadLetterSettle { ids };
        match self
            .proposer
            .propose_queue(group, QueueRequest::command(cmd))
            .await
        {
            Ok(_) => debug!(n, "dead letters confirmed by every target"),
            Err(e) => debug!("dead-letter settle not applied: {e}"),
        }
    }
}

/// The copy's `expiration` in ms, as publish validated it (a decimal string of digits).
fn expiration_ms(s: &str) -> Option<u64> {
    if s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

fn check_reply(target: &str, reply: &Reply) -> Result<(), TransferError> {
    match reply {
        Reply::Enqueued { .. } | Reply::Duplicate => Ok(()),
        Reply::Rejected { detail } | Reply::RejectedDeadLettered { detail, .. } => Err(
            TransferError::Refused(format!("target '{target}': {detail}")),
        ),
        other => Err(TransferError::Refused(format!(
            "target '{target}': {other:?}"
        ))),
    }
}
