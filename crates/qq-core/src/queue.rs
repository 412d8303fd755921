//! The queue state machine: one quorum queue, as a pure function of its Raft log.
//!
//! # What it is
//! [`QueueState::apply`] takes a log index and a [`Command`] and returns a [`Reply`] for the
//! proposer plus a list of [`Effect`]s (deliver this message to that consumer, this message died,
//! delete this body). Every replica applies the same log and reaches the same state, byte for
//! byte; only the leader carries out `Deliver` and the republishing half of `DeadLetter`, while
//! every replica carries out body deletion. This is rabbit_fifo's shape (docs/semantics.md, "The queue
//! state machine"; reference §6.4): consumers, their credit and their checked-out messages live in
//! the replicated state, so a new leader knows exactly what is out and with whom
//! ([`QueueState::pending_deliveries`]).
//!
//! # Where a message is
//! A live message is in exactly one place ([`Location`]):
//! - **ready**: waiting for a consumer. Dispatch order is the *returns* queue (messages given back
//!   by a consumer or a lapsed Get lease, in the order they came back) followed by the never
//!   delivered messages in id (= enqueue) order, two high-priority ones for each normal one
//!   while both wait (module `priorities`). Returned messages are served first.
//! - **unacked**: checked out to a consumer, or held by a Get lease (consumer [`GET_CONSUMER`]).
//!   Unacked messages never expire and do not count against length limits.
//! - **held**: dead-lettered under the at-least-once strategy, kept until the transfer to every
//!   target is confirmed by [`Command::DeadLetterSettle`]. Held messages count against length
//!   limits, as in rabbit_fifo's `is_over_limit`.
//!
//! A message leaves the state only with an effect that says so: `DeleteBody` (acked, purged,
//! auto-ack Get, dead letter confirmed) or `DeadLetter` with strategy `Disabled`/`AtMostOnce`.
//!
//! # Time
//! Time enters only as the leader-stamped `now_ms` of commands. The state keeps the largest
//! `now_ms` seen and never lets time go backwards (a new leader's clock may lag; 4.3's rabbit_fifo
//! does the same with `max(last_command_time, system_time)`). Every command first *advances* the
//! clock: it lapses Get leases and expires ready messages whose deadline has passed, so no command
//! ever delivers an already-expired message. `Command::Expire` does only that; the leader proposes
//! it at [`QueueState::next_deadline`]. `Command::ExpireQueue` does the same and also decides the
//! queue's own `x-expires`: the leader proposes it at [`QueueState::queue_expiry_due_ms`] with its
//! clock and the time it became leader, and every replica gives the same answer
//! ([`Reply::QueueExpiry`]) from the state at that point of the log, so a consumer that attached
//! in the meantime keeps the queue alive. Expiry happens at the deadline wherever the message
//! sits (an ordered set of `(deadline, id)` makes it O(k log n)), unlike RabbitMQ, which expires
//! at the head only. The deadline is fixed at enqueue (`now + min(queue TTL, message TTL)`), so a
//! TTL policy change affects only later messages (RabbitMQ does the same). TTL 0 means "deliver
//! in this apply or expire in this apply".
//!
//! # Decisions worth knowing
//! - Round-robin: a cursor over consumer ids; each assignment moves the cursor past the consumer
//!   served, one message at a time (rabbit_fifo's service queue, without consumer priorities).
//! - Length limits are exact and checked at apply time. `reject-publish` refuses a message that
//!   would be ready and take the queue over a limit; a message a waiting consumer takes at once
//!   never counts, so `max-length 0` means "only while a consumer is waiting".
//! - Deduplication is exact within a time window (module [`crate::dedup`]): a publish key or a
//!   transfer key seen within the queue's dedup window is a `Duplicate`. Refused publishes
//!   (`Rejected`, `RejectedDeadLettered`) record no key: the queue did not accept the message,
//!   so a retry is judged again.
//! - A `Settle` naming an id the consumer does not hold is refused as a whole (`Reply::Error`),
//!   with no partial effect. A refused command still carries time: its `now_ms` fires due timers
//!   exactly as an `Expire` would, so what time does never depends on which command carried it.
//! - Leaving at-least-once (policy change) re-emits each held dead letter with the new strategy
//!   (its original reason and death time) and drops it from the state; these are not counted a
//!   second time in [`Stats`]. RabbitMQ deletes them instead; re-emitting loses nothing.
//! - Get on a single-active-consumer queue is refused, as in RabbitMQ.
//! - The collections that grow with the queue are persistent ones (`imbl`'s `OrdMap`,
//!   `OrdSet`, `Vector`): a clone is O(1) and shares every node until one of the two copies
//!   changes it. A snapshot cut clones the state in the state-machine worker and encodes the
//!   copy elsewhere (qq-node's `groups::queue_sm`), so no apply waits for an encode that grows
//!   with the backlog. They encode exactly as `BTreeMap`/`BTreeSet`/`VecDeque` do
//!   (`tests/snapshot_format.rs`). The price, measured with `examples/snapshot_cut.rs` at
//!   1.2 M messages: the state's applies are slower (an enqueue+ack mix about 40 % fewer
//!   commands per CPU second: some 300 000/s against 500 000/s, where a publisher at 31 000
//!   messages/s and its consumer make about 62 000/s)
//!   and its heap 11 % larger (312 bytes a message with its publish key, 281 with std's
//!   B-trees). The clone takes microseconds; a clone of std's collections took longer than the
//!   encode (0.3-1.3 s against 0.3-0.7 s).
//!
//! # Delayed requeue
//! A requeue may name a delay (`SettleOutcome::RequeueAfter`), or the queue's
//! `x-requeue-delays` give one by delivery count. The failed delivery is counted first (the
//! delivery limit applies as for any requeue); then the message waits in the **delayed** set,
//! keyed `(due_ms, seq)` with `due_ms` = the settle's `now_ms` + delay, so the earliest due is
//! O(log n) and equal delays keep their order. Nothing delivers it or returns it to a Get
//! before then. Every command's time advance releases the due ones to the tail of the returns
//! queue, in key order; the leader's one timer ([`QueueState::next_deadline`], which includes
//! the earliest due) proposes an `Expire` for it, so no one polls and a new leader re-arms from
//! the replicated set. A delayed message still expires at its TTL deadline and counts against
//! the length limits (drop-head drops only ready ones); purge removes it. Consumer-down
//! returns and lapsed Get leases are not delayed: only an explicit requeue is.
//!
//! # What it leaves out
//! Bodies (stored by the glue in RocksDB under the message id), routing of dead letters and the
//! `x-death` history (`deadletter`), AMQP 1.0 credit, strict message priorities
//! (`x-max-priority`), and the deletion of a queue whose `x-expires` has passed
//! (decided here by `ExpireQueue`, carried out by the node through the metadata layer; its
//! messages are not dead-lettered).

use std::collections::BTreeMap;

use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Serialize};

use crate::dedup::KeyWindow;
use crate::types::{ConsumerId, MessageId, Overflow, QueueConfig, Reason, Strategy};

mod command;
mod consumers;
mod counts;
mod detach;
mod digest;
mod handlers;
mod invariants;
mod lengths;
mod machine;
mod moves;
mod priorities;
mod queries;
mod reply;
mod strict_priorities;
mod timeouts;

pub use command::{
    Command, MAX_DEDUP_KEY_BYTES, MAX_IDS_PER_COMMAND, MAX_REASON_DETAIL_BYTES,
    MAX_REQUEUE_DELAY_MS, MAX_REQUEUE_DELAYS, MsgHeader, Receipt, Receipts, SettleOutcome,
    check_requeue_delays,
};
use consumers::Consumer;
use counts::Return;
pub use machine::{FIRST_MACHINE_VERSION, MACHINE_VERSION};
pub use moves::{MAX_ENDED_MOVES, MAX_MOVE_DESTINATION_BYTES, MoveState, MoveTask};
pub use priorities::{HIGH_PRIORITY_FROM, is_high as is_high_priority};
pub use reply::{Browsed, Counts, Delivery, Effect, HeldDeadLetter, Location, Reply, Stats};
pub use strict_priorities::MAX_PRIORITY;
pub use timeouts::MAX_CONSUMER_TIMEOUT_MS;

/// Consumer id used for messages taken with Get (leases). Real consumers use ids != 0.
pub const GET_CONSUMER: ConsumerId = 0;

/// Most consumers attached to one queue at once.
pub const MAX_CONSUMERS: usize = 10_000;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Place {
    /// `returned`: position in the returns queue, or None for a never-returned message (ordered
    /// by id in `fresh`).
    Ready { returned: Option<u64> },
    Unacked {
        consumer: ConsumerId,
        redelivered: bool,
        lease_deadline_ms: Option<u64>,
    },
    Held {
        seq: u64,
        reason: Reason,
        died_at_ms: u64,
        detail: Option<String>,
    },
    /// Requeued with a delay; `(due_ms, seq)` is its key in `delayed`.
    Delayed { due_ms: u64, seq: u64 },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Msg {
    header: MsgHeader,
    deadline_ms: Option<u64>,
    delivery_count: u32,
    /// Delivered at least once (to a consumer or a Get).
    delivered: bool,
    /// The (state) time of the enqueue; ids and enqueue times grow together.
    enqueued_ms: u64,
    place: Place,
}

/// The state of one queue. See the module documentation.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueState {
    config: QueueConfig,
    last_index: u64,
    /// Largest `now_ms` applied so far.
    clock_ms: u64,
    /// When the queue was last used by a consumer or a Get (for `x-expires`): set by Checkout,
    /// Get, and when a consumer leaves. 0 = never.
    last_used_ms: u64,
    /// Shared counter for return order, death order and attach order.
    seq: u64,
    /// Every live message.
    msgs: OrdMap<MessageId, Msg>,
    /// Ready, returned: return seq -> id. Served first.
    returns: OrdMap<u64, MessageId>,
    /// Ready, never returned, in id order.
    fresh: OrdSet<MessageId>,
    /// The ids of `returns` (so the oldest ready message is found in O(log n)).
    returned_ids: OrdSet<MessageId>,
    ready_bytes: u64,
    /// Requeued with a delay: (due, seq) -> id. Released to the tail of `returns` in this
    /// order when due, so equal delays keep their order.
    delayed: OrdMap<(u64, u64), MessageId>,
    delayed_bytes: u64,
    /// (deadline, id) of every ready or delayed message with a deadline.
    expiries: OrdSet<(u64, MessageId)>,
    consumers: OrdMap<ConsumerId, Consumer>,
    /// Round-robin: the next consumer to serve is the first with credit at or after this id.
    cursor: ConsumerId,
    /// (deadline, id) of every Get lease.
    leases: OrdSet<(u64, MessageId)>,
    /// Held dead letters: death seq -> id.
    held: OrdMap<u64, MessageId>,
    held_bytes: u64,
    /// Publish keys stored within the dedup window.
    publish_keys: KeyWindow,
    /// Dead-letter and move idempotency keys stored within the dedup window.
    transfer_keys: KeyWindow,
    stats: Stats,
    /// The receipt of every Get lease taken with [`Command::GetWithReceipt`]; removed with the
    /// lease. Not serialized with the rest (so snapshots written before receipts existed still
    /// decode): a snapshot carries it separately, see [`QueueState::receipts`] and
    /// [`QueueState::restore_receipts`].
    #[serde(skip)]
    receipts: Receipts,
    /// Move tasks by task number: the running one (at most one) and the last
    /// [`MAX_ENDED_MOVES`] ended ones. Not serialized with the rest, as `receipts`: see
    /// [`QueueState::moves`] and [`QueueState::restore_moves`].
    #[serde(skip)]
    moves: BTreeMap<u64, MoveTask>,
    /// Cancelled consumers that still hold messages (module `consumers`). Not serialized with
    /// the rest, as `receipts`: see [`QueueState::cancelled`] and
    /// [`QueueState::restore_cancelled`].
    #[serde(skip)]
    cancelled: OrdSet<ConsumerId>,
    /// Which commands the log may carry (module `machine`). Not serialized with the rest, as
    /// `receipts`: a state decoded without it runs [`FIRST_MACHINE_VERSION`].
    #[serde(skip, default = "machine::first")]
    machine_version: u32,
    /// Non-zero consumer priorities (module `consumers`). Not serialized with the rest, as
    /// `receipts`: see [`QueueState::priorities`] and [`QueueState::restore_priorities`].
    #[serde(skip)]
    priorities: OrdMap<ConsumerId, i32>,
    /// The consumer timeout and the deadline of every message checked out under it, by id and
    /// in deadline order (module `timeouts`). Not serialized with the rest, as `receipts`.
    #[serde(skip)]
    consumer_timeout_ms: Option<u64>,
    #[serde(skip)]
    unacked_deadlines: OrdMap<MessageId, u64>,
    #[serde(skip)]
    timeouts: OrdSet<(u64, MessageId)>,
    /// Releases per message, for those released at least once (module `counts`). Not
    /// serialized with the rest, as `receipts`.
    #[serde(skip)]
    releases: OrdMap<MessageId, u32>,
    /// Ready, never returned, high priority, in id order (module `priorities`; `fresh` holds
    /// the normal level). Not serialized with the rest, as `receipts`.
    #[serde(skip)]
    high: OrdSet<MessageId>,
    /// Where the two-to-one cycle between the levels stands (module `priorities`).
    #[serde(skip)]
    dequeue_counter: u8,
    /// The top strict level under `x-max-priority` (module `strict_priorities`), set by the
    /// node from the queue's arguments; None: the two levels of module `priorities`.
    #[serde(skip)]
    max_priority: Option<u8>,
    /// Ready, never returned messages per strict level (only non-empty levels).
    #[serde(skip)]
    levels: OrdMap<u8, OrdSet<MessageId>>,
}

impl QueueState {
    pub fn new(config: QueueConfig) -> Self {
        QueueState {
            config,
            last_index: 0,
            clock_ms: 0,
            last_used_ms: 0,
            seq: 0,
            msgs: OrdMap::new(),
            returns: OrdMap::new(),
            fresh: OrdSet::new(),
            returned_ids: OrdSet::new(),
            ready_bytes: 0,
            delayed: OrdMap::new(),
            delayed_bytes: 0,
            expiries: OrdSet::new(),
            consumers: OrdMap::new(),
            cursor: 0,
            leases: OrdSet::new(),
            held: OrdMap::new(),
            held_bytes: 0,
            publish_keys: KeyWindow::default(),
            transfer_keys: KeyWindow::default(),
            stats: Stats::default(),
            receipts: OrdMap::new(),
            moves: BTreeMap::new(),
            cancelled: OrdSet::new(),
            machine_version: FIRST_MACHINE_VERSION,
            priorities: OrdMap::new(),
            consumer_timeout_ms: None,
            unacked_deadlines: OrdMap::new(),
            timeouts: OrdSet::new(),
            releases: OrdMap::new(),
            high: OrdSet::new(),
            dequeue_counter: 0,
            max_priority: None,
            levels: OrdMap::new(),
        }
    }

    /// Apply the command of log entry `index`. Indexes must strictly increase; the index of an
    /// accepted Enqueue becomes the message's id.
    pub fn apply(&mut self, index: u64, cmd: Command) -> (Reply, Vec<Effect>) {
        // A committed command outside the bounds (only a faulty proposer makes one) changes
        // nothing, on every replica alike.
        if let Err(detail) = cmd.validate() {
            return (Reply::Error { detail }, Vec::new());
        }
        if let Err(detail) = self.admits(&cmd) {
            return (Reply::Error { detail }, Vec::new());
        }
        assert!(
            index > self.last_index,
            "queue apply: index {index} not after last applied {}",
            self.last_index
        );
        self.last_index = index;
        let now = cmd.now_ms().map_or(self.clock_ms, |t| t.max(self.clock_ms));
        self.clock_ms = now;
        let uses_queue = cmd.uses_queue();
        // Every command runs in four phases: timers due by `now` fire; the command acts;
        // ready messages go to consumers with credit; then what is still ready and due (TTL 0)
        // expires and drop-head trims the queue back within its limits.
        let mut fx = Vec::new();
        self.advance(now, &mut fx);
        let reply = match cmd {
            Command::Enqueue {
                header,
                publish_key,
                dedup_key,
                ..
            } => self.enqueue(index, now, header, (publish_key, dedup_key), 0, &mut fx),
            Command::EnqueueWithPriority {
                header,
                publish_key,
                dedup_key,
                priority,
                ..
            } => self.enqueue(
                index,
                now,
                header,
                (publish_key, dedup_key),
                priority,
                &mut fx,
            ),
            Command::Checkout {
                consumer,
                node,
                prefetch,
                ..
            } => self.checkout_cmd(consumer, node, prefetch, None),
            Command::CheckoutWithPriority {
                consumer,
                node,
                prefetch,
                priority,
                ..
            } => self.checkout_cmd(consumer, node, prefetch, Some(priority)),
            Command::Settle {
                consumer,
                ids,
                outcome,
                ..
            } => self.settle(now, consumer, &ids, outcome, &mut fx),
            Command::ConsumerDown { consumer, .. } => {
                if consumer == GET_CONSUMER {
                    Reply::Error {
                        detail: format!("consumer id {GET_CONSUMER} is reserved for get"),
                    }
                } else {
                    self.consumer_down(now, consumer, Return::FAILED_AT_ONCE, &mut fx);
                    Reply::Ok
                }
            }
            Command::NodeDown { node, .. } => {
                let down: Vec<ConsumerId> = self
                    .consumers
                    .iter()
                    .filter(|(_, c)| c.node == node)
                    .map(|(id, _)| *id)
                    .collect();
                for consumer in down {
                    self.consumer_down(now, consumer, Return::FAILED_AT_ONCE, &mut fx);
                }
                Reply::Ok
            }
            Command::Get {
                lease_ms, auto_ack, ..
            } => self.get(now, lease_ms, auto_ack, &mut fx),
            Command::GetWithReceipt {
                lease_ms, receipt, ..
            } => {
                let reply = self.get(now, lease_ms, false, &mut fx);
                if let Reply::Got {
                    delivery: Some(d), ..
                } = &reply
                {
                    self.receipts.insert(d.id, receipt);
                }
                reply
            }
            Command::SettleReceipts {
                receipts, outcome, ..
            } => self.settle_receipts(now, &receipts, outcome, &mut fx),
            Command::Expire { .. } => Reply::Ok,
            Command::DeadLetterSettle { ids } => {
                for id in ids {
                    self.dead_letter_settle(id, &mut fx);
                }
                Reply::Ok
            }
            Command::Purge => self.purge(&mut fx),
            Command::UpdateConfig { config, .. } => {
                self.update_config(config, &mut fx);
                Reply::Ok
            }
            // Firing timers changes no consumer except one that times out, which leaves with
            // `last_used_ms = now`: this is the answer the state before the command gives.
            Command::ExpireQueue {
                now_ms,
                leader_since_ms,
            } => Reply::QueueExpiry {
                expired: self
                    .queue_expiry_due_ms(leader_since_ms)
                    .is_some_and(|due_ms| now_ms >= due_ms),
            },
            Command::StartMove {
                destination,
                max_messages,
                max_per_second,
                ..
            } => self.start_move(index, now, destination, max_messages, max_per_second),
            Command::MoveDone { task, ids } => self.move_done(task, &ids, &mut fx),
            Command::EndMove {
                task,
                state,
                detail,
            } => self.end_move(task, state, detail),
            Command::CancelConsumer { consumer, .. } => self.cancel_consumer(consumer),
            Command::SetMachineVersion { version } => self.set_machine_version(version),
            Command::SetConsumerTimeout { timeout_ms } => self.set_consumer_timeout(timeout_ms),
        };
        // A refused command changes nothing but time (it acts as an Expire at `now`).
        if uses_queue && !matches!(reply, Reply::Error { .. }) {
            self.last_used_ms = now;
        }
        // A move task that this command ended or completed gives the queue back to its
        // consumers in this same apply.
        self.finish_moves();
        self.assign(&mut fx);
        // TTL 0 (deadline == now): whatever no consumer took in this apply expires now.
        self.expire_ready(now, &mut fx);
        self.trim(now, &mut fx);
        self.finish_moves();
        (reply, fx)
    }

    // ----- the machinery every command shares -----

    /// Lapse due Get leases and expire due ready messages.
    fn advance(&mut self, now: u64, fx: &mut Vec<Effect>) {
        while let Some(&(deadline, id)) = self.leases.get_min() {
            if deadline > now {
                break;
            }
            self.detach_unacked(id);
            self.return_message(id, now, Return::FAILED_AT_ONCE, fx);
        }
        self.time_out_consumers(now, fx);
        // Delayed messages whose time has come join the tail of the returns queue, in
        // (due, requeue) order.
        while let Some(&((due_ms, seq), id)) = self.delayed.get_min() {
            if due_ms > now {
                break;
            }
            self.delayed.remove(&(due_ms, seq));
            let pos = self.next_seq();
            let m = self.msgs.get_mut(&id).expect("delayed message exists");
            m.place = Place::Ready {
                returned: Some(pos),
            };
            self.delayed_bytes -= m.header.size_bytes;
            self.ready_bytes += m.header.size_bytes;
            self.returns.insert(pos, id);
            self.returned_ids.insert(id);
        }
        self.expire_ready(now, fx);
    }

    /// Dead-letter (reason expired) every ready or delayed message whose deadline <= now, in
    /// queue order (delayed ones last, in their order).
    fn expire_ready(&mut self, now: u64, fx: &mut Vec<Effect>) {
        let due: Vec<MessageId> = self
            .expiries
            .range(..=(now, MessageId::MAX))
            .map(|(_, id)| *id)
            .collect();
        if due.is_empty() {
            return;
        }
        let mut due: Vec<((u8, u64), MessageId)> =
            due.into_iter().map(|id| (self.queue_pos(id), id)).collect();
        due.sort_unstable();
        for (_, id) in due {
            self.detach_waiting(id);
            self.kill(id, Reason::Expired, None, now, fx);
        }
    }

    /// Give ready messages to consumers with credit, round-robin, one at a time, in FIFO order.
    fn assign(&mut self, fx: &mut Vec<Effect>) {
        if self.running_move().is_some() {
            return; // a move task takes the ready messages
        }
        while let Some(id) = self.ready_head() {
            let Some(cid) = self.next_consumer() else {
                break;
            };
            self.take_ready(id);
            let m = self.msgs.get_mut(&id).expect("ready message exists");
            let redelivered = m.delivered;
            m.delivered = true;
            m.place = Place::Unacked {
                consumer: cid,
                redelivered,
                lease_deadline_ms: None,
            };
            let delivery_count = m.delivery_count;
            self.consumers
                .get_mut(&cid)
                .expect("consumer exists")
                .checked_out
                .insert(id);
            self.start_timeout(id);
            self.cursor = cid.wrapping_add(1);
            self.stats.delivered_total += 1;
            fx.push(Effect::Deliver(Delivery {
                consumer: cid,
                id,
                delivery_count,
                redelivered,
                lease_deadline_ms: None,
            }));
        }
    }

    /// drop-head: while over a limit, dead-letter the oldest ready messages (reason maxlen).
    fn trim(&mut self, now: u64, fx: &mut Vec<Effect>) {
        if self.config.overflow != Overflow::DropHead {
            return;
        }
        while self.is_over_limit() {
            let Some(id) = self.ready_head() else {
                break; // only held dead letters left over the limit: nothing drop-head can drop
            };
            self.take_ready(id);
            self.kill(id, Reason::Maxlen, None, now, fx);
        }
    }

    /// Puts a returned message (counted by [`QueueState::return_message`]) back: past its
    /// deadline it expires, otherwise it joins the tail of the returns queue, or waits
    /// `delay_ms` in the delayed set first.
    fn requeue(&mut self, id: MessageId, now: u64, delay_ms: u64, fx: &mut Vec<Effect>) {
        let m = self.msgs.get_mut(&id).expect("returned message exists");
        if m.deadline_ms.is_some_and(|d| d <= now) {
            self.kill(id, Reason::Expired, None, now, fx);
            return;
        }
        if delay_ms > 0 {
            let due_ms = now.saturating_add(delay_ms);
            let seq = self.next_seq();
            let m = self.msgs.get_mut(&id).expect("returned message exists");
            m.place = Place::Delayed { due_ms, seq };
            self.delayed_bytes += m.header.size_bytes;
            if let Some(d) = m.deadline_ms {
                self.expiries.insert((d, id));
            }
            self.delayed.insert((due_ms, seq), id);
            return;
        }
        let pos = self.next_seq();
        let m = self.msgs.get_mut(&id).expect("returned message exists");
        m.place = Place::Ready {
            returned: Some(pos),
        };
        self.ready_bytes += m.header.size_bytes;
        if let Some(d) = m.deadline_ms {
            self.expiries.insert((d, id));
        }
        self.returns.insert(pos, id);
        self.returned_ids.insert(id);
    }

    /// A message dies. It must already be detached (or never placed). Disabled/AtMostOnce: it
    /// leaves the state; AtLeastOnce: it is held.
    fn kill(
        &mut self,
        id: MessageId,
        reason: Reason,
        detail: Option<String>,
        now: u64,
        fx: &mut Vec<Effect>,
    ) {
        let strategy = self.config.dead_letter_strategy;
        self.stats.count_dead_letter(reason, strategy);
        fx.push(Effect::DeadLetter {
            id,
            reason,
            strategy,
            died_at_ms: now,
            detail: detail.clone(),
        });
        if strategy == Strategy::AtLeastOnce {
            let seq = self.next_seq();
            let m = self.msgs.get_mut(&id).expect("dying message exists");
            m.place = Place::Held {
                seq,
                reason,
                died_at_ms: now,
                detail,
            };
            self.held_bytes += m.header.size_bytes;
            self.held.insert(seq, id);
        } else {
            self.forget(&id);
        }
    }
}
