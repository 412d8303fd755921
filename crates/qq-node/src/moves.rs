//! Move tasks (redrive): one round of a queue's running move task.
//!
//! The task lives in the source queue's replicated state ([`qq_core::queue::MoveTask`]); while
//! it runs the source delivers nothing, so its ready messages stay where they are until they
//! are moved. The source's leader actor ([`crate::leader`]) runs rounds, one after the other,
//! paced by the task's `max_per_second`. A round ([`Mover::round`]):
//! 1. takes the next ready messages of the source in dispatch order (at most [`MOVE_BATCH`],
//!    the rate, and what the task still has to move);
//! 2. commits each into its destination (the task's, or the queue named by the message's
//!    `x-first-death-queue` when the task has none) through the shared [`crate::enqueue`]
//!    path, unchanged (its `x-death` history travels with it), with the idempotency key
//!    `move:{source group}:{task}:{message id}`;
//! 3. proposes `MoveDone` for those every destination committed: only then do they leave the
//!    source.
//!
//! A leader that dies between 2 and 3 leaves the messages ready in the source; the next
//! leader's round takes the same messages again and the destination answers Duplicate for
//! each key it has seen, so nothing is lost or stored twice.
//!
//! A destination that does not exist or refuses a message (a length limit) fails the task:
//! the round answers [`MoveOutcome::Fail`] and the actor proposes `EndMove` as `Failed` with
//! the reason; the messages not moved stay in the source. An unavailable destination is
//! retried.
//!
//! Must not: decide when to run a round (the leader actor does) or read a clock to decide.

use qq_core::deadletter::X_FIRST_DEATH_QUEUE;
use qq_core::queue::{Command, MoveTask, Reply};
use qq_core::{MessageId, Value};
use qq_raft::GroupId;

use crate::enqueue::{Enqueuer, Routed};
use crate::groups::queue_sm::{QueueMachine, QueueRequest};
use crate::meta_view::MetaView;
use crate::proposer::Proposer;

/// Most messages one round moves.
pub const MOVE_BATCH: usize = 128;

/// What a round did.
#[derive(Debug)]
pub enum MoveOutcome {
    /// `n` messages moved (maybe 0: nothing to do, or the task ended meanwhile).
    Moved(usize),
    /// The task cannot go on: end it as Failed with this reason.
    Fail { task: u64, detail: String },
    /// Try again later.
    Retry(String),
}

#[derive(Clone)]
pub struct Mover {
    view: MetaView,
    enqueuer: Enqueuer,
    proposer: Proposer,
}

impl Mover {
    pub fn new(view: MetaView, enqueuer: Enqueuer, proposer: Proposer) -> Mover {
        Mover {
            view,
            enqueuer,
            proposer,
        }
    }

    /// Messages the next round of `task` may take, given its rate.
    pub fn batch_size(task: &MoveTask) -> usize {
        let remaining = usize::try_from(task.remaining()).unwrap_or(usize::MAX);
        let rate = match task.max_per_second {
            0 => MOVE_BATCH,
            r => (r as usize).min(MOVE_BATCH),
        };
        remaining.min(rate)
    }

    /// One round of the running task of `group`, if any.
    pub async fn round(&self, group: GroupId, machine: &QueueMachine) -> MoveOutcome {
        let Some((task, ids, vhost)) = machine.with_state(|s| {
            let t = s.running_move()?.clone();
            let n = Mover::batch_size(&t);
            let ids: Vec<MessageId> = s.first_ready_ids(n);
            Some((t, ids, s.config().vhost.clone()))
        }) else {
            return MoveOutcome::Moved(0);
        };
        if ids.is_empty() {
            return MoveOutcome::Moved(0);
        }
        let meta = self.view.current();
        let mut copies = Vec::with_capacity(ids.len());
        for &id in &ids {
            let message = match machine.read_message(id) {
                Ok(m) => m,
                Err(e) => return MoveOutcome::Retry(format!("read message {id}: {e}")),
            };
            let Some(header) = machine.with_state(|s| s.header(id).cloned()) else {
                return MoveOutcome::Retry(format!("message {id} left the queue meanwhile"));
            };
            let name = if !task.destination.is_empty() {
                task.destination.clone()
            } else {
                match message.properties.headers.get(X_FIRST_DEATH_QUEUE) {
                    Some(Value::String(q)) => q.clone(),
                    _ => {
                        return MoveOutcome::Fail {
                            task: task.task,
                            detail: format!(
                                "message {id} has no {X_FIRST_DEATH_QUEUE} header to move it back by"
                            ),
                        };
                    }
                }
            };
            let Some(dest) = meta.queue(&vhost, &name) else {
                return MoveOutcome::Fail {
                    task: task.task,
                    detail: format!("destination queue '{name}' does not exist"),
                };
            };
            if dest.id == group {
                return MoveOutcome::Fail {
                    task: task.task,
                    detail: format!("message {id} would move to its own queue '{name}'"),
                };
            }
            let encoded = match qq_raft::encoding::to_vec_exact(&message) {
                Ok(b) => b,
                Err(e) => return MoveOutcome::Retry(format!("encode: {e}")),
            };
            let key = format!("move:{group}:{}:{id}", task.task);
            copies.push(vec![Routed {
                target: dest.id,
                name: name.clone(),
                request: self
                    .enqueuer
                    .request(&header, message.properties.priority, encoded, key),
            }]);
        }
        let replies = self.enqueuer.commit(copies).await;
        let mut done = Vec::with_capacity(ids.len());
        let mut outcome = None;
        // In order: a message is moved only when those before it were, so order is kept.
        for (id, targets) in ids.iter().zip(replies) {
            let failed = targets.into_iter().find_map(|t| match t.reply {
                Ok(Reply::Enqueued { .. } | Reply::Duplicate) => None,
                Ok(other) => Some(MoveOutcome::Fail {
                    task: task.task,
                    detail: format!("destination '{}' refused message {id}: {other:?}", t.name),
                }),
                Err(e) => Some(MoveOutcome::Retry(format!("destination '{}': {e}", t.name))),
            });
            match failed {
                None => done.push(*id),
                Some(f) => {
                    outcome = Some(f);
                    break;
                }
            }
        }
        let n = done.len();
        if !done.is_empty() {
            let cmd = Command::MoveDone {
                task: task.task,
                ids: done,
            };
            if let Err(e) = self
                .proposer
                .propose_queue(group, QueueRequest::command(cmd))
                .await
            {
                return MoveOutcome::Retry(format!("move done not applied: {e}"));
            }
        }
        outcome.unwrap_or(MoveOutcome::Moved(n))
    }
}
