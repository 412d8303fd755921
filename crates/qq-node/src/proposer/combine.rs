//! Proposals to one queue group from this node, combined into fewer Raft entries.
//!
//! Every entry costs each replica the same fixed work whatever it carries: a log record, a
//! share of an fsync, a replication frame, a turn of apply. Under load, each of a queue's
//! publishers and consumers proposes entries of its own: one consumer settling with up to
//! [`crate::consume::session::ACKS_IN_FLIGHT`] commands in flight and one publisher made
//! about 750 entries a second in scenario 1 over AMQP, three quarters of them a single
//! settle.
//!
//! So at most [`IN_FLIGHT`] entries of a group are proposed from this node at once. What is
//! submitted meanwhile waits, in order, and goes with the next free slot as one batch entry
//! (at most [`MAX_BATCH`] commands and [`COMBINED_BYTES`], or one submission whatever its
//! size). Nothing waits while a slot is free, so a lone proposal costs one task hop more than
//! before. Each submitter gets its own replies, in its order; an entry that fails fails
//! every submission in it with the same error, as it would have failed each alone. A
//! submission whose caller has gone before its entry is proposed is dropped, as a proposal
//! whose caller went before it reached Raft always was.
//!
//! Only commands every release decodes are combined ([`combinable`]): a replica of release
//! 0.1.0 refuses a whole entry that holds one it cannot decode, which would refuse the others
//! beside it on that replica only. A `Get` goes alone too: its acquired count is only in the
//! reply of a single-command entry.
//!
//! Bounds: the waiting submissions of a group are those of its callers, each of which waits
//! for its reply (publishers and sessions bound what they have in flight); the chains that
//! propose them are at most [`IN_FLIGHT`] per group, and a group without any has no state.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use qq_core::queue::{Command, FIRST_MACHINE_VERSION};
use qq_raft::GroupId;
use tokio::sync::oneshot;

use crate::codec::encode;
use crate::error::NodeError;
use crate::groups::queue_sm::{MAX_BATCH, QueueReplyOut, QueueRequest};

/// What a submitter gets back: a reply per command, in its order, or its entry's error.
pub type Replies = Result<Vec<QueueReplyOut>, NodeError>;

/// Entries of one group this node proposes at once through the combiner.
pub const IN_FLIGHT: usize = 2;

/// The largest combined entry, in bytes of commands (a larger single submission goes alone).
pub const COMBINED_BYTES: usize = 4 << 20;

/// [`crate::groups::queue_sm::QueueEntry::Batch`]'s variant index, postcard's first byte of a
/// batch entry (checked against the encoder in the tests).
const BATCH_VARIANT: u8 = 1;

/// Whether a command may share an entry with others' commands.
pub fn combinable(req: &QueueRequest) -> bool {
    req.cmd.machine_version() == FIRST_MACHINE_VERSION && !matches!(req.cmd, Command::Get { .. })
}

/// What one caller submitted: its commands, encoded, and where their replies go.
pub struct Submission {
    count: usize,
    /// The commands as a sequence: its length, then the commands (from `skip`).
    bytes: Vec<u8>,
    skip: usize,
    reply: oneshot::Sender<Replies>,
}

impl Submission {
    /// `reqs` encoded, and the receiver of their replies.
    pub fn new(
        reqs: &[QueueRequest],
    ) -> Result<(Submission, oneshot::Receiver<Replies>), NodeError> {
        let (reply, rx) = oneshot::channel();
        let submission = Submission {
            count: reqs.len(),
            bytes: encode(&reqs)?,
            skip: encode(&reqs.len())?.len(),
            reply,
        };
        Ok((submission, rx))
    }

    /// The encoded commands, as they follow one another in a batch entry.
    fn commands(&self) -> &[u8] {
        &self.bytes[self.skip..]
    }
}

/// One group's waiting submissions and how many chains propose for it.
#[derive(Default)]
struct Waiting {
    chains: usize,
    queue: VecDeque<Submission>,
}

/// The waiting submissions of every group with a chain running.
#[derive(Default)]
pub struct Combiner {
    groups: Mutex<HashMap<GroupId, Waiting>>,
}

impl Combiner {
    /// Queue a submission; `true` when the caller must start a chain for the group (one is
    /// counted for it already).
    pub fn submit(&self, group: GroupId, s: Submission) -> bool {
        let mut groups = self.groups.lock().unwrap();
        let w = groups.entry(group).or_default();
        w.queue.push_back(s);
        let start = w.chains < IN_FLIGHT;
        if start {
            w.chains += 1;
        }
        start
    }

    /// The next entry's submissions for a chain of `group`, in order; `None` when nothing
    /// waits, and the chain ends (the group's state goes with its last chain).
    pub fn next_batch(&self, group: GroupId) -> Option<Vec<Submission>> {
        let mut groups = self.groups.lock().unwrap();
        let w = groups.get_mut(&group)?;
        let (mut count, mut bytes) = (0usize, 0usize);
        let mut batch = Vec::new();
        while let Some(s) = w.queue.front() {
            if s.reply.is_closed() {
                w.queue.pop_front();
                continue;
            }
            let size = s.commands().len();
            let fits = count + s.count <= MAX_BATCH && bytes + size <= COMBINED_BYTES;
            if !batch.is_empty() && !fits {
                break;
            }
            count += s.count;
            bytes += size;
            batch.extend(w.queue.pop_front());
        }
        if batch.is_empty() {
            w.chains -= 1;
            if w.chains == 0 && w.queue.is_empty() {
                groups.remove(&group);
            }
            return None;
        }
        Some(batch)
    }
}

/// The batch entry of `batch`'s commands, in order.
pub fn payload(batch: &[Submission]) -> Result<Vec<u8>, NodeError> {
    let count = encode(&batch.iter().map(|s| s.count).sum::<usize>())?;
    let size: usize = batch.iter().map(|s| s.commands().len()).sum();
    let mut out = Vec::with_capacity(1 + count.len() + size);
    out.push(BATCH_VARIANT);
    out.extend_from_slice(&count);
    for s in batch {
        out.extend_from_slice(s.commands());
    }
    Ok(out)
}

/// Hands each submission its replies (or everyone the entry's error).
pub fn answer(batch: Vec<Submission>, replies: Replies) {
    let count: usize = batch.iter().map(|s| s.count).sum();
    let replies = replies.and_then(|r| match r.len() == count {
        true => Ok(r),
        false => Err(NodeError::Internal(format!(
            "a combined entry of {count} commands got {} replies",
            r.len()
        ))),
    });
    match replies {
        Ok(replies) => {
            let mut replies = replies.into_iter();
            for s in batch {
                let mine = replies.by_ref().take(s.count).collect();
                let _ = s.reply.send(Ok(mine));
            }
        }
        Err(e) => {
            for s in batch {
                let _ = s.reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::groups::queue_sm::QueueEntryRef;
    use qq_core::queue::{Command, SettleOutcome};

    fn settle(id: u64) -> QueueRequest {
        QueueRequest::command(Command::Settle {
            now_ms: 7,
            consumer: 3,
            ids: vec![id],
            outcome: SettleOutcome::Ack,
        })
    }

    #[test]
    fn combined_payload_is_the_batch_entry_of_all_commands() {
        let a = vec![settle(1), settle(2)];
        let b = vec![settle(3)];
        let (sa, _ra) = Submission::new(&a).unwrap();
        let (sb, _rb) = Submission::new(&b).unwrap();
        let all: Vec<QueueRequest> = a.iter().chain(&b).cloned().collect();
        let expected = postcard::to_stdvec(&QueueEntryRef::Batch(&all)).unwrap();
        assert_eq!(payload(&[sa, sb]).unwrap(), expected);
    }

    #[test]
    fn chains_are_bounded_and_end_when_nothing_waits() {
        let c = Combiner::default();
        let mut receivers = Vec::new();
        let mut started = 0;
        for id in 0..5 {
            let (s, r) = Submission::new(&[settle(id)]).unwrap();
            receivers.push(r);
            started += usize::from(c.submit(9, s));
        }
        assert_eq!(started, IN_FLIGHT);
        // The first chain takes everything waiting, in order; then both chains end.
        let batch = c.next_batch(9).unwrap();
        assert_eq!(batch.len(), 5);
        assert!(c.next_batch(9).is_none());
        assert!(c.next_batch(9).is_none());
        assert!(c.groups.lock().unwrap().is_empty());
    }

    #[test]
    fn replies_are_split_in_order_and_a_gone_caller_is_not_proposed() {
        let c = Combiner::default();
        let (s1, r1) = Submission::new(&[settle(1), settle(2)]).unwrap();
        let (s2, r2) = Submission::new(&[settle(3)]).unwrap();
        let (s3, mut r3) = Submission::new(&[settle(4)]).unwrap();
        assert!(c.submit(1, s1));
        drop(r2);
        assert!(c.submit(1, s2));
        assert!(!c.submit(1, s3));
        let batch = c.next_batch(1).unwrap();
        assert_eq!(batch.iter().map(|s| s.count).sum::<usize>(), 3);
        let reply = |n: u64| QueueReplyOut {
            reply: qq_core::queue::Reply::Purged { count: n },
            message: None,
            acquired_count: None,
        };
        answer(batch, Ok(vec![reply(1), reply(2), reply(4)]));
        let mine = r1.blocking_recv().unwrap().unwrap();
        assert_eq!(mine.len(), 2);
        assert!(matches!(
            mine[1].reply,
            qq_core::queue::Reply::Purged { count: 2 }
        ));
        let theirs = r3.try_recv().unwrap().unwrap();
        assert!(matches!(
            theirs[0].reply,
            qq_core::queue::Reply::Purged { count: 4 }
        ));
    }

    #[test]
    fn only_commands_every_release_decodes_are_combined_and_never_a_get() {
        assert!(combinable(&settle(1)));
        let release = QueueRequest::command(Command::Settle {
            now_ms: 7,
            consumer: 3,
            ids: vec![1],
            outcome: SettleOutcome::Release,
        });
        assert!(!combinable(&release));
        let get = QueueRequest::command(Command::Get {
            now_ms: 7,
            lease_ms: 1000,
            auto_ack: false,
        });
        assert!(!combinable(&get));
    }

    #[test]
    fn an_entry_stops_at_max_batch_commands() {
        let c = Combiner::default();
        let big: Vec<QueueRequest> = (0..MAX_BATCH as u64 - 1).map(settle).collect();
        let mut receivers = Vec::new();
        for reqs in [big, vec![settle(1), settle(2)], vec![settle(3)]] {
            let (s, r) = Submission::new(&reqs).unwrap();
            receivers.push(r);
            c.submit(4, s);
        }
        // The second submission would pass MAX_BATCH: it starts the next entry, in order.
        let first = c.next_batch(4).unwrap();
        assert_eq!(
            first.iter().map(|s| s.count).collect::<Vec<_>>(),
            [MAX_BATCH - 1]
        );
        let second = c.next_batch(4).unwrap();
        assert_eq!(second.iter().map(|s| s.count).collect::<Vec<_>>(), [2, 1]);
    }

    #[test]
    fn a_wrong_number_of_replies_fails_every_submission() {
        let (s1, mut r1) = Submission::new(&[settle(1)]).unwrap();
        let (s2, mut r2) = Submission::new(&[settle(2)]).unwrap();
        answer(vec![s1, s2], Ok(Vec::new()));
        assert!(r1.try_recv().unwrap().is_err());
        assert!(r2.try_recv().unwrap().is_err());
    }
}
