//! Commit routed messages into their target queues: the one enqueue path shared by publish
//! (confirms to the client) and the dead-letter transfer (settles the source's held dead
//! letters), and ready for message moves.
//!
//! The caller routes (with the metadata view) and builds one enqueue request per message and
//! target, with its idempotency key; [`Enqueuer::commit`] sends the requests of each target as
//! one ordered batch entry (two when some carry a priority), all targets at once, and hands
//! back every message's reply from every target. A message is stored in a target once its
//! entry is committed, i.e. fsynced on a majority of that queue's members.
//!
//! Must not: decide what a reply means for the caller (a publisher's confirm, a dead letter's
//! settle): that stays with the caller.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::join_all;
use qq_core::NodeId;
use qq_core::queue::{Command, MsgHeader, Reply};
use qq_raft::GroupId;

use crate::error::NodeError;
use crate::groups::queue_sm::{QueueReplyOut, QueueRequest};
use crate::proposer::Proposer;

/// One routed message for one target queue.
pub struct Routed {
    pub target: GroupId,
    /// The queue's name, for error messages.
    pub name: String,
    pub request: QueueRequest,
}

/// What one target answered for one message.
pub struct TargetReply {
    pub name: String,
    pub reply: Result<Reply, NodeError>,
}

/// A message's encoding (postcard of the message) once for each of its targets: copied for
/// every target but the last, which takes it, so a message routed to one queue (the usual
/// case) is not copied at all.
pub fn per_target<T>(targets: Vec<T>, encoded: Vec<u8>) -> impl Iterator<Item = (T, Vec<u8>)> {
    let last = targets.len().saturating_sub(1);
    let mut encoded = Some(encoded);
    targets.into_iter().enumerate().map(move |(i, target)| {
        let copy = if i == last {
            encoded.take()
        } else {
            encoded.clone()
        };
        (
            target,
            copy.expect("only the last target takes the encoding"),
        )
    })
}

/// A message with a priority goes with `EnqueueWithPriority` (machine version 2; see
/// [`Enqueuer::commit`] for a queue not there yet), one without (or 0) with a plain `Enqueue`:
/// the queue decides what the priority means (two levels, or its strict levels under
/// `x-max-priority`). Stamped with `now_ms`. Takes the encoding, so that a caller that holds
/// it for one target moves it in instead of copying it.
fn enqueue(
    header: &MsgHeader,
    priority: u32,
    encoded: Vec<u8>,
    publish_key: Option<String>,
    dedup_key: Option<String>,
    now_ms: u64,
) -> QueueRequest {
    let priority = u8::try_from(priority).unwrap_or(u8::MAX);
    let header = header.clone();
    let cmd = if priority > 0 {
        Command::EnqueueWithPriority {
            now_ms,
            header,
            publish_key,
            dedup_key,
            priority,
        }
    } else {
        Command::Enqueue {
            now_ms,
            header,
            publish_key,
            dedup_key,
        }
    };
    QueueRequest {
        cmd,
        message: Some(encoded),
    }
}

/// Whether `r` is a machine-version-2 enqueue (a message with a priority).
fn is_high(r: &QueueRequest) -> bool {
    matches!(r.cmd, Command::EnqueueWithPriority { .. })
}

/// The plain `Enqueue` of an `EnqueueWithPriority` (same keys and time): what a queue whose
/// machine is still at version 1 stores, at normal priority. None for any other request.
fn without_priority(req: &QueueRequest) -> Option<QueueRequest> {
    let Command::EnqueueWithPriority {
        now_ms,
        header,
        publish_key,
        dedup_key,
        ..
    } = &req.cmd
    else {
        return None;
    };
    Some(QueueRequest {
        cmd: Command::Enqueue {
            now_ms: *now_ms,
            header: header.clone(),
            publish_key: publish_key.clone(),
            dedup_key: dedup_key.clone(),
        },
        message: req.message.clone(),
    })
}

#[derive(Clone)]
pub struct Enqueuer {
    proposer: Proposer,
    node_id: NodeId,
    /// Random per process start, so keys of a restarted node never repeat those of an
    /// earlier run (not from the wall clock, which can go back).
    incarnation: u64,
    key_seq: Arc<AtomicU64>,
}

impl Enqueuer {
    pub fn new(proposer: Proposer, node_id: NodeId) -> Enqueuer {
        Enqueuer {
            proposer,
            node_id,
            incarnation: rand::random(),
            key_seq: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The enqueue command for a dead-letter copy or a moved message (`encoded`: this target's
    /// copy of its encoding, [`per_target`]) under its transfer key `dedup_key`, stamped with
    /// the node's clock.
    pub fn request(
        &self,
        header: &MsgHeader,
        priority: u32,
        encoded: Vec<u8>,
        dedup_key: String,
    ) -> QueueRequest {
        enqueue(
            header,
            priority,
            encoded,
            None,
            Some(dedup_key),
            self.proposer.clock().now_ms(),
        )
    }

    /// The enqueue command for a published message (`encoded`: this target's copy of its
    /// encoding, [`per_target`]) under its publish key, stamped with the node's clock.
    pub fn publish_request(
        &self,
        header: &MsgHeader,
        priority: u32,
        encoded: Vec<u8>,
        publish_key: String,
    ) -> QueueRequest {
        enqueue(
            header,
            priority,
            encoded,
            Some(publish_key),
            None,
            self.proposer.clock().now_ms(),
        )
    }

    /// An idempotency key for one publish to one queue when the client gave no publisher id:
    /// the node's own retries of that proposal reuse it, so the queue stores the message once.
    pub fn next_publish_key(&self) -> String {
        format!(
            "n{}.{:x}.{}",
            self.node_id,
            self.incarnation,
            self.key_seq.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Commit `messages` (each: the list of its routed copies) and return, per message, what
    /// each of its targets answered. The copies for one target go as one batch entry in the
    /// order of `messages`, so each target stores them in that order (those with a priority
    /// as a second entry after the others: [`Enqueuer::propose_by_kind`]).
    pub async fn commit(&self, messages: Vec<Vec<Routed>>) -> Vec<Vec<TargetReply>> {
        let mut per_target: BTreeMap<GroupId, (String, Vec<(usize, QueueRequest)>)> =
            BTreeMap::new();
        let mut out: Vec<Vec<TargetReply>> = Vec::with_capacity(messages.len());
        for (i, copies) in messages.into_iter().enumerate() {
            out.push(Vec::with_capacity(copies.len()));
            for copy in copies {
                per_target
                    .entry(copy.target)
                    .or_insert_with(|| (copy.name, Vec::new()))
                    .1
                    .push((i, copy.request));
            }
        }
        let results = join_all(
            per_target
                .into_iter()
                .map(|(target, (name, items))| async move {
                    (name, self.propose_by_kind(target, items).await)
                }),
        )
        .await;
        for (name, replies) in results {
            for (i, reply) in replies {
                out[i].push(TargetReply {
                    name: name.clone(),
                    reply,
                });
            }
        }
        out
    }

    /// Proposes one target's requests (each with its message's position): the plain ones as
    /// one entry, then those of a machine-version-2 command (a priority) as another, each in
    /// their order. Kept apart because a replica of release 0.1.0 refuses a whole entry it
    /// cannot decode, while this release refuses only the version-2 commands of an entry on
    /// a queue still at version 1: in one entry, the plain enqueues beside them would be
    /// stored on some replicas and not on others. Apart, every replica refuses the
    /// version-2 entry whole or applies it whole. A message's reply, or the error of its
    /// entry.
    async fn propose_by_kind(
        &self,
        target: GroupId,
        items: Vec<(usize, QueueRequest)>,
    ) -> Vec<(usize, Result<Reply, NodeError>)> {
        let (high, plain): (Vec<_>, Vec<_>) = items.into_iter().partition(|(_, r)| is_high(r));
        let mut out = Vec::new();
        for part in [plain, high] {
            if part.is_empty() {
                continue;
            }
            let (positions, reqs): (Vec<usize>, Vec<QueueRequest>) = part.into_iter().unzip();
            match self.propose_target(target, &reqs).await {
                Ok(replies) => out.extend(
                    positions
                        .into_iter()
                        .zip(replies.into_iter().map(|r| Ok(r.reply))),
                ),
                Err(e) => out.extend(positions.into_iter().map(|i| (i, Err(e.clone())))),
            }
        }
        out
    }

    /// Proposes one target's batch of one kind ([`Enqueuer::propose_by_kind`]). A queue whose
    /// machine is still at version 1 refuses a high-priority enqueue (every replica alike,
    /// `Reply::Error`), and a leader of release 0.1.0 cannot decode a batch holding one: those
    /// messages are proposed again as plain enqueues, at normal priority, as release 0.1.0
    /// stores every message. A queue moves to version 2 once every member runs this release.
    /// Copies are made only for such a retry.
    async fn propose_target(
        &self,
        target: GroupId,
        reqs: &[QueueRequest],
    ) -> Result<Vec<QueueReplyOut>, NodeError> {
        let first = self.proposer.propose_queue_batch(target, reqs).await;
        if !reqs.iter().any(is_high) {
            return first;
        }
        // A batch that failed as a whole goes again plain: a 0.1.0 leader may refuse it as
        // invalid, or commit it and answer in a form this node does not read. Anything else
        // that failed fails again the same way, and a batch that was stored after all is
        // stored once: the retry carries the same publish and transfer keys.
        let Ok(mut replies) = first else {
            let plain: Vec<QueueRequest> = reqs
                .iter()
                .map(|r| without_priority(r).unwrap_or_else(|| r.clone()))
                .collect();
            return self.proposer.propose_queue_batch(target, &plain).await;
        };
        let (positions, retry): (Vec<usize>, Vec<QueueRequest>) = replies
            .iter()
            .zip(reqs)
            .enumerate()
            .filter_map(|(i, (r, req))| match r.reply {
                Reply::Error { .. } => Some((i, without_priority(req)?)),
                _ => None,
            })
            .unzip();
        if retry.is_empty() {
            return Ok(replies);
        }
        let retried = self.proposer.propose_queue_batch(target, &retry).await?;
        for (i, r) in positions.into_iter().zip(retried) {
            replies[i] = r;
        }
        Ok(replies)
    }
}

#[cfg(test)]
mod tests {
    use super::per_target;

    #[test]
    fn each_target_gets_the_encoding_and_the_last_takes_the_original() {
        let encoded = vec![7u8; 1000];
        let original = encoded.as_ptr();
        let out: Vec<(char, Vec<u8>)> = per_target(vec!['a', 'b', 'c'], encoded).collect();
        assert_eq!(out.iter().map(|(t, _)| *t).collect::<String>(), "abc");
        assert!(out.iter().all(|(_, e)| *e == vec![7u8; 1000]));
        assert_ne!(out[0].1.as_ptr(), original, "a copy for the first");
        assert_ne!(out[1].1.as_ptr(), original, "a copy for the second");
        assert_eq!(out[2].1.as_ptr(), original, "the last takes it");

        let one = vec![1u8; 10];
        let ptr = one.as_ptr();
        let out: Vec<(u8, Vec<u8>)> = per_target(vec![0], one).collect();
        assert_eq!(out[0].1.as_ptr(), ptr, "one target: no copy at all");
        assert_eq!(per_target(Vec::<u8>::new(), vec![1]).count(), 0);
    }
}
