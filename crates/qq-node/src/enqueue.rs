//! Commit routed messages into their target queues: the one enqueue path shared by publish
//! (confirms to the client) and the dead-letter transfer (settles the source's held dead
//! letters), and ready for message moves.
//!
//! The caller routes (with the metadata view) and builds one enqueue request per message and
//! target, with its idempotency key; [`Enqueuer::commit`] sends the requests of each target as
//! one ordered batch entry, all targets at once, and hands back every message's reply from
//! every target. A message is stored in a target once its entry is committed, i.e. fsynced on a
//! majority of that queue's members.
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

use crate::clock::now_ms;
use crate::error::NodeError;
use crate::groups::queue_sm::QueueRequest;
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

/// The enqueue command for a dead-letter copy or a moved message (`encoded`: postcard of the
/// message) under its transfer key `dedup_key`.
pub fn request(header: &MsgHeader, encoded: &[u8], dedup_key: String) -> QueueRequest {
    enqueue(header, encoded, None, Some(dedup_key))
}

/// The enqueue command for a published message under its publish key.
pub fn publish_request(header: &MsgHeader, encoded: &[u8], publish_key: String) -> QueueRequest {
    enqueue(header, encoded, Some(publish_key), None)
}

fn enqueue(
    header: &MsgHeader,
    encoded: &[u8],
    publish_key: Option<String>,
    dedup_key: Option<String>,
) -> QueueRequest {
    QueueRequest {
        cmd: Command::Enqueue {
            now_ms: now_ms(),
            header: header.clone(),
            publish_key,
            dedup_key,
        },
        message: Some(encoded.to_vec()),
    }
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
    /// order of `messages`, so each target stores them in that order.
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
                    let (positions, reqs): (Vec<usize>, Vec<QueueRequest>) =
                        items.into_iter().unzip();
                    let result = self.proposer.propose_queue_batch(target, reqs).await;
                    (name, positions, result)
                }),
        )
        .await;
        for (name, positions, result) in results {
            match result {
                Ok(replies) => {
                    for (i, r) in positions.into_iter().zip(replies) {
                        out[i].push(TargetReply {
                            name: name.clone(),
                            reply: Ok(r.reply),
                        });
                    }
                }
                Err(e) => {
                    for i in positions {
                        out[i].push(TargetReply {
                            name: name.clone(),
                            reply: Err(e.clone()),
                        });
                    }
                }
            }
        }
        out
    }
}
