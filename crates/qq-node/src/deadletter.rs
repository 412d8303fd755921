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
//!   leader actor ([`crate::leader`]) transfers held dead letters in rounds, each prepared
//!   ([`DeadLetters::prepare_round`]: bodies read, copies made) then committed
//!   ([`DeadLetters::commit_round`]), and proposes `DeadLetterSettle` for those every target
//!   committed ([`DeadLetters::settle`]). Rounds are committed one after the other (so each
//!   target stores the copies in death order); the next round is prepared while one commits,
//!   and a round's settle overlaps the next rounds.
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

/// The copies of a round's dead letters, ready to commit.
struct Copies {
    /// Per dead letter (in death order), its copy for every target.
    routed: Vec<Vec<Routed>>,
    /// Per dead letter: Err if it could not be copied or routed.
    outcome: Vec<(MessageId, Result<(), TransferError>)>,
}

/// An at-least-once round read and copied, not yet sent.
pub struct PreparedRound {
    /// Every dead letter the round took, in death order.
    pub ids: Vec<MessageId>,
    copies: Copies,
    /// A body that could not be read (that dead letter is not in the round; it stays held).
    read_failure: Option<TransferError>,
}

#[cfg(test)]
impl PreparedRound {
    /// A round of these dead letters with no copies (for the relay's bookkeeping tests).
    pub fn without_copies(ids: Vec<MessageId>) -> PreparedRound {
        PreparedRound {
            ids,
            copies: Copies {
                routed: Vec::new(),
                outcome: Vec::new(),
            },
            read_failure: None,
        }
    }
}

/// What one at-least-once round did.
pub struct Round {
    /// Every dead letter the round took.
    pub ids: Vec<MessageId>,
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
        let encoded = qq_raft::encoding::to_vec_exact(&copy)
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
        let targets: Vec<_> = targets
            .into_iter()
            .filter(|t| !is_cycle(&copy, &t.name))
            .collect();
        let priority = copy.properties.priority;
        let routed: Vec<Routed> = enqueue::per_target(targets, encoded)
            .map(|(t, encoded)| Routed {
                target: t.id,
                name: t.name.clone(),
                request: self
                    .enqueuer
                    .request(&header, priority, encoded, key.clone()),
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

    /// Copy and route dead letters (in the order they died), all with one topology: a binding
    /// that appears while the round is being prepared must not route its later dead letters
    /// while the earlier ones stay held (they would reach the target after them; found by the
    /// 3 000-letter order test).
    fn prepare_letters(&self, group: GroupId, config: &QueueConfig, letters: &[Letter]) -> Copies {
        let topology = self.view.current();
        let mut copies = Copies {
            routed: Vec::with_capacity(letters.len()),
            outcome: Vec::with_capacity(letters.len()),
        };
        for letter in letters {
            match self.prepare(&topology, group, config, letter) {
                Ok(routed) => {
                    copies.routed.push(routed);
                    copies.outcome.push((letter.id, Ok(())));
                }
                Err(e) => {
                    copies.routed.push(Vec::new());
                    copies.outcome.push((letter.id, Err(e)));
                }
            }
        }
        copies
    }

    /// Commit prepared copies into their targets. Returns, per dead letter, whether every
    /// target committed it.
    async fn commit(&self, copies: Copies) -> Vec<(MessageId, Result<(), TransferError>)> {
        let Copies {
            routed,
            mut outcome,
        } = copies;
        let replies = self.enqueuer.commit(routed).await;
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
        let copies = self.prepare_letters(job.group, &job.config, &letters);
        for (id, result) in self.commit(copies).await {
            if let Err(e) = result {
                return Err(format!(
                    "queue '{}': at-most-once dead letter {id} dropped: {e:?}",
                    job.config.name
                ));
            }
        }
        Ok(())
    }

    /// At-least-once, first half of a round: read these held dead letters of the queue (a
    /// batch the caller took with [`qq_core::queue::QueueState::first_held_dead_letters`], in
    /// death order) and make their copies. Blocking (RocksDB reads): run it off the async
    /// workers. Nothing is sent yet: the caller sends the round with [`DeadLetters::commit_round`]
    /// when the rounds before it have succeeded, so every target gets them in death order.
    pub fn prepare_round(
        &self,
        group: GroupId,
        machine: &QueueMachine,
        config: &QueueConfig,
        batch: Vec<HeldDeadLetter>,
    ) -> PreparedRound {
        let started = std::time::Instant::now();
        let ids = batch.iter().map(|h| h.id).collect();
        let mut read_failure = None;
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
                Err(e) => read_failure = Some(TransferError::Unavailable(e.to_string())),
            }
        }
        let copies = self.prepare_letters(group, config, &letters);
        debug!(
            n = letters.len(),
            ms = started.elapsed().as_millis() as u64,
            "dead-letter round prepared"
        );
        PreparedRound {
            ids,
            copies,
            read_failure,
        }
    }

    /// At-least-once, second half of a round: commit its copies into every target. The caller
    /// settles those every target committed ([`DeadLetters::settle`]).
    pub async fn commit_round(&self, round: PreparedRound) -> Round {
        let started = std::time::Instant::now();
        let n = round.copies.outcome.len();
        let mut failure = round.read_failure;
        let mut transferred = Vec::new();
        for (id, r) in self.commit(round.copies).await {
            match r {
                Ok(()) => transferred.push(id),
                Err(e) => failure = Some(e),
            }
        }
        debug!(
            n,
            ms = started.elapsed().as_millis() as u64,
            "dead-letter round committed"
        );
        Round {
            ids: round.ids,
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
