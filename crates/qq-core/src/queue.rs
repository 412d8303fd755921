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
//!   delivered messages in id (= enqueue) order. Returned messages are served first.
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
//! `x-death` history (`deadletter`), consumer priorities, AMQP 1.0 credit, consumer timeouts,
//! message priorities, and the deletion of a queue whose `x-expires` has passed
//! (decided here by `ExpireQueue`, carried out by the node through the metadata layer; its
//! messages are not dead-lettered).

use std::collections::{BTreeMap, BTreeSet};

use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Serialize};

use crate::dedup::{KeyWindow, key_id};
use crate::types::{ConsumerId, MessageId, NodeId, Overflow, QueueConfig, Reason, Strategy};

mod consumers;
mod digest;

use consumers::Consumer;

/// Consumer id used for messages taken with Get (leases). Real consumers use ids != 0.
pub const GET_CONSUMER: ConsumerId = 0;

/// Most consumers attached to one queue at once.
pub const MAX_CONSUMERS: usize = 10_000;

/// The part of a message the state machine needs; the body lives outside.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MsgHeader {
    pub size_bytes: u64,
    /// Per-message TTL already parsed from `properties.expiration`.
    pub expiration_ms: Option<u64>,
}

/// How a consumer settles a message. Variants are only ever added last: postcard encodes the
/// variant index, and committed logs hold them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SettleOutcome {
    Ack,
    /// Back to the queue; when the queue has `x-requeue-delays`, after the delay its list
    /// gives for the message's delivery count.
    Requeue,
    /// Dead-letter with reason `rejected`.
    Reject,
    /// Back to the queue, but not deliverable before `delay_ms` (0: at once) after the
    /// settle's `now_ms`, whatever `x-requeue-delays` says.
    RequeueAfter {
        delay_ms: u64,
    },
    /// As `Reject`, and the death records `detail` (`reason-detail`, `x-last-death-detail`).
    RejectWithDetail {
        detail: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// publish_key = Some(k): a publish's idempotency key (the client's publisher id and seq,
    /// or the node's own); dedup_key = Some(k): the idempotency key of a dead-letter copy or a
    /// moved message. A key of either kind already stored within the queue's dedup window is
    /// a Duplicate (module [`crate::dedup`]; the two kinds are kept apart).
    Enqueue {
        now_ms: u64,
        header: MsgHeader,
        publish_key: Option<String>,
        dedup_key: Option<String>,
    },
    /// Attach a consumer or change its prefetch (0 = unlimited). `node` holds its stream.
    Checkout {
        now_ms: u64,
        consumer: ConsumerId,
        node: NodeId,
        prefetch: u32,
    },
    /// Settle messages held by `consumer` ([`GET_CONSUMER`] for Get receipts), in the order given.
    Settle {
        now_ms: u64,
        consumer: ConsumerId,
        ids: Vec<MessageId>,
        outcome: SettleOutcome,
    },
    /// Consumer stream closed/cancelled: its unacked messages are returned as failed deliveries
    /// (in id order) and the consumer is removed.
    ConsumerDown {
        now_ms: u64,
        consumer: ConsumerId,
    },
    /// Every consumer on that node is down.
    NodeDown {
        now_ms: u64,
        node: NodeId,
    },
    /// Take the head ready message under a lease of `lease_ms` (auto_ack: removed at once). A
    /// lease of 0 lapses at the next command.
    Get {
        now_ms: u64,
        lease_ms: u64,
        auto_ack: bool,
    },
    /// Expire ready messages whose deadline <= now_ms and lapse Get leases whose deadline <= now_ms.
    Expire {
        now_ms: u64,
    },
    /// The at-least-once transfer of these held dead letters is confirmed: forget them.
    DeadLetterSettle {
        ids: Vec<MessageId>,
    },
    /// Remove every ready message (not dead-lettered).
    Purge,
    UpdateConfig {
        now_ms: u64,
        config: QueueConfig,
    },
    /// Everything [`Command::Expire`] does, plus the `x-expires` decision for the queue as a
    /// whole, answered with [`Reply::QueueExpiry`]: expired when the configuration has
    /// `expires_ms` = e, no consumer is attached and `now_ms >= max(last_used_ms,
    /// leader_since_ms) + e`. `leader_since_ms` is when the proposing node became the queue's
    /// leader, so a queue never used counts as used when its leader started. The rule compares
    /// the command's own `now_ms` (not the state's clock), both times being the proposer's.
    /// It does not mark the queue used and deletes nothing: when expired, the node deletes the
    /// queue through the metadata layer. Added last: postcard encodes variant indexes.
    ExpireQueue {
        now_ms: u64,
        leader_since_ms: u64,
    },
    /// A Get under a lease (as [`Command::Get`] without auto-ack) whose lease is bound to
    /// `receipt`: 128 random bits drawn by the proposing node, and the user who took it. Only
    /// [`Command::SettleReceipts`] with the same token and user settles it. Added last: postcard
    /// encodes variant indexes.
    GetWithReceipt {
        now_ms: u64,
        lease_ms: u64,
        receipt: Receipt,
    },
    /// Settle Get leases by their receipts, in the order given; all or nothing. A message not
    /// under a Get lease, a wrong token or another user's receipt refuses the whole settle
    /// ([`Reply::Error`]). Added last: postcard encodes variant indexes.
    SettleReceipts {
        now_ms: u64,
        receipts: Vec<(MessageId, Receipt)>,
        outcome: SettleOutcome,
    },
    /// Start a move task (redrive) out of this queue: up to `max_messages` (0: every) of the
    /// messages ready now, in dispatch order, to `destination` (empty: each to its
    /// `x-first-death-queue`), at most `max_per_second` (0: no limit). Answered with
    /// [`Reply::MoveStarted`]; its task number is this entry's index. Refused while another
    /// task runs. While a task runs the queue delivers nothing (to consumers or Get), so the
    /// messages it takes stay ready until [`Command::MoveDone`]. Added last: postcard encodes
    /// variant indexes.
    StartMove {
        now_ms: u64,
        destination: String,
        max_messages: u64,
        max_per_second: u32,
    },
    /// These messages of the task are committed in their destination: the ready ones leave
    /// the queue (also after the task was cancelled: their copies exist). Added last.
    MoveDone {
        task: u64,
        ids: Vec<MessageId>,
    },
    /// End a running task: `Cancelled` (by a client) or `Failed` (by the leader, with why).
    /// Added last.
    EndMove {
        task: u64,
        state: MoveState,
        detail: String,
    },
    /// The consumer is cancelled (AMQP basic.cancel): it takes no new message and keeps what
    /// it holds until it settles it; it leaves with its last settle (at once when it holds
    /// nothing), or with ConsumerDown, which returns the rest. Module `consumers`. Added last.
    CancelConsumer {
        now_ms: u64,
        consumer: ConsumerId,
    },
}

/// Where a move task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveState {
    Running,
    Done,
    Cancelled,
    Failed,
}

/// A move task (redrive) out of a queue, kept in the queue's replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveTask {
    /// The log index of its `StartMove`.
    pub task: u64,
    /// Empty: each message to the queue named by its `x-first-death-queue` header.
    pub destination: String,
    /// 0: no limit.
    pub max_per_second: u32,
    /// How many messages it moves: `max_messages` (0: all), at most what was ready at start.
    pub total: u64,
    pub moved: u64,
    pub state: MoveState,
    /// Why it failed or was cancelled; empty otherwise.
    pub detail: String,
    pub started_ms: u64,
}

impl MoveTask {
    /// Messages still to move (0 once it ended).
    pub fn remaining(&self) -> u64 {
        if self.state == MoveState::Running {
            self.total.saturating_sub(self.moved)
        } else {
            0
        }
    }
}

/// Ended move tasks a queue remembers (the oldest is forgotten first).
pub const MAX_ENDED_MOVES: usize = 16;
/// Longest move destination name, in bytes (a queue name's bound).
pub const MAX_MOVE_DESTINATION_BYTES: usize = 255;

/// What binds a Get lease to whoever took it: a random token and the authenticated user.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub token: [u8; 16],
    pub user: String,
}

/// The receipts of a queue's Get leases by message id ([`QueueState::receipts`]). Encoded as
/// a map (a length, then the pairs in key order), the same bytes as a `BTreeMap` of them.
pub type Receipts = OrdMap<MessageId, Receipt>;

/// Most message ids one Settle or DeadLetterSettle may name.
pub const MAX_IDS_PER_COMMAND: usize = 1 << 16;
/// Longest `reason_detail` of a reject, in bytes of UTF-8.
pub const MAX_REASON_DETAIL_BYTES: usize = 1024;
/// Longest requeue delay, of a settle or of one `x-requeue-delays` entry: 7 days.
pub const MAX_REQUEUE_DELAY_MS: u64 = 7 * 24 * 3600 * 1000;
/// Most entries of `x-requeue-delays`.
pub const MAX_REQUEUE_DELAYS: usize = 32;
/// Longest idempotency key of an Enqueue.
pub const MAX_DEDUP_KEY_BYTES: usize = 1024;

impl Command {
    /// Bounds checked before a command is proposed (by the proposing node, and by a leader
    /// for a forwarded proposal) and again at apply, where a command outside them is refused
    /// without being applied. Whatever depends on the state is left to apply.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Command::Settle { ids, .. }
            | Command::DeadLetterSettle { ids }
            | Command::MoveDone { ids, .. }
                if ids.len() > MAX_IDS_PER_COMMAND =>
            {
                Err(format!(
                    "ids: {} message ids, more than {MAX_IDS_PER_COMMAND}",
                    ids.len()
                ))
            }
            Command::Enqueue {
                dedup_key: Some(k), ..
            } if k.len() > MAX_DEDUP_KEY_BYTES => Err(format!(
                "dedup_key: {} bytes, more than {MAX_DEDUP_KEY_BYTES}",
                k.len()
            )),
            Command::Enqueue {
                publish_key: Some(k),
                ..
            } if k.len() > MAX_DEDUP_KEY_BYTES => Err(format!(
                "publish_key: {} bytes, more than {MAX_DEDUP_KEY_BYTES}",
                k.len()
            )),
            Command::Checkout { consumer, .. } | Command::CancelConsumer { consumer, .. }
                if *consumer == GET_CONSUMER =>
            {
                Err(format!("consumer: id {GET_CONSUMER} is reserved for get"))
            }
            Command::Settle { outcome, .. } | Command::SettleReceipts { outcome, .. } => {
                outcome.validate()
            }
            Command::UpdateConfig { config, .. } => check_requeue_delays(&config.requeue_delays_ms),
            Command::StartMove { destination, .. }
                if destination.len() > MAX_MOVE_DESTINATION_BYTES =>
            {
                Err(format!(
                    "destination: {} bytes, more than {MAX_MOVE_DESTINATION_BYTES}",
                    destination.len()
                ))
            }
            Command::EndMove { detail, .. } if detail.len() > MAX_REASON_DETAIL_BYTES => {
                Err(format!(
                    "detail: {} bytes, more than {MAX_REASON_DETAIL_BYTES}",
                    detail.len()
                ))
            }
            _ => Ok(()),
        }
    }
}

impl SettleOutcome {
    /// The bounds of a settle's options: `reason_detail` at most [`MAX_REASON_DETAIL_BYTES`],
    /// `delay_ms` at most [`MAX_REQUEUE_DELAY_MS`].
    pub fn validate(&self) -> Result<(), String> {
        match self {
            SettleOutcome::RejectWithDetail { detail }
                if detail.len() > MAX_REASON_DETAIL_BYTES =>
            {
                Err(format!(
                    "reason_detail: {} bytes, more than {MAX_REASON_DETAIL_BYTES}",
                    detail.len()
                ))
            }
            SettleOutcome::RequeueAfter { delay_ms } if *delay_ms > MAX_REQUEUE_DELAY_MS => Err(
                format!("delay_ms: {delay_ms} ms, more than {MAX_REQUEUE_DELAY_MS} (7 days)"),
            ),
            _ => Ok(()),
        }
    }
}

/// The bounds of a queue's requeue delays (see [`QueueConfig::requeue_delays_ms`]).
pub fn check_requeue_delays(delays: &[u64]) -> Result<(), String> {
    if delays.len() > MAX_REQUEUE_DELAYS {
        return Err(format!(
            "requeue-delays: {} delays, more than {MAX_REQUEUE_DELAYS}",
            delays.len()
        ));
    }
    if let Some(d) = delays.iter().find(|d| **d > MAX_REQUEUE_DELAY_MS) {
        return Err(format!(
            "requeue-delays: {d} ms, more than {MAX_REQUEUE_DELAY_MS} (7 days)"
        ));
    }
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Ok,
    /// Accepted: the glue stores the body under `id`.
    Enqueued {
        id: MessageId,
    },
    /// Publisher seq or dedup key already seen: confirm, store nothing.
    Duplicate,
    /// reject-publish limit hit: nothing stored.
    Rejected {
        detail: String,
    },
    /// reject-publish-dlx: refused (publisher sees REJECTED) and dead-lettered with reason maxlen;
    /// the glue stores the body under `id` because the DeadLetter effect needs it.
    RejectedDeadLettered {
        id: MessageId,
        detail: String,
    },
    /// Get result. With `auto_ack`, the glue reads the body for the reply before it carries out
    /// the `DeleteBody` effect of the same apply.
    Got {
        delivery: Option<Delivery>,
        message_count: u64,
    },
    Purged {
        count: u64,
    },
    /// Deterministic refusal (e.g. a Settle naming an id the consumer does not hold: `unknown
    /// delivery tag N`). The command did nothing, but the time it carries still advanced the
    /// queue's clock exactly as an Expire would (leases lapse, due messages expire).
    Error {
        detail: String,
    },
    /// Answer to [`Command::ExpireQueue`]: whether the queue's `x-expires` has passed, so the
    /// node must delete the queue. Added last: postcard encodes variant indexes.
    QueueExpiry {
        expired: bool,
    },
    /// Answer to [`Command::StartMove`]: the task's number. Added last.
    MoveStarted {
        task: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    pub consumer: ConsumerId,
    pub id: MessageId,
    /// Failed deliveries so far (`x-delivery-count`).
    pub delivery_count: u32,
    pub redelivered: bool,
    /// Get leases only: when the lease lapses.
    pub lease_deadline_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Effect {
    /// Leader sends message `id` to the consumer's stream.
    Deliver(Delivery),
    /// Message `id` died. Disabled/AtMostOnce: it has already left the state (the leader
    /// republishes a copy if AtMostOnce, then every replica deletes the body). AtLeastOnce: it is
    /// now held in the state until DeadLetterSettle.
    DeadLetter {
        id: MessageId,
        reason: Reason,
        strategy: Strategy,
        died_at_ms: u64,
        /// The consumer's `reason_detail` of a reject.
        detail: Option<String>,
    },
    /// Message gone for good: every replica deletes the body.
    DeleteBody { id: MessageId },
}

#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Counts {
    pub ready: u64,
    /// Checked out to consumers plus held by Get leases.
    pub unacked: u64,
    /// Dead letters held for at-least-once transfer.
    pub held: u64,
    pub consumers: u64,
    pub ready_bytes: u64,
    pub held_bytes: u64,
    /// Requeued with a delay that has not passed yet: in the queue, not deliverable.
    pub delayed: u64,
    pub delayed_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldDeadLetter {
    pub id: MessageId,
    pub reason: Reason,
    pub died_at_ms: u64,
    pub size_bytes: u64,
    /// The consumer's `reason_detail` of a reject.
    pub detail: Option<String>,
}

/// A ready message as [`QueueState::browse`] shows it, without taking it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Browsed {
    /// 0-based position among the ready messages, in dispatch order.
    pub position: u64,
    pub id: MessageId,
    pub delivery_count: u32,
    /// Delivered at least once before.
    pub redelivered: bool,
    /// The `now_ms` of the command that enqueued it.
    pub enqueued_ms: u64,
}

/// Where a live message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Location {
    Ready,
    /// Checked out to `consumer` ([`GET_CONSUMER`] for a Get lease).
    Unacked {
        consumer: ConsumerId,
    },
    Held,
    /// Requeued with a delay: deliverable from `due_ms` on.
    Delayed {
        due_ms: u64,
    },
}

/// Cumulative counters; part of the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Stats {
    /// Indexed `[reason][strategy]` (see [`Stats::dead_lettered`]); `Strategy` has no `Ord`, so a
    /// fixed table stands in for a map.
    dead_lettered: [[u64; 3]; 4],
    /// Held dead letters whose transfer was confirmed.
    pub dead_lettered_confirmed: u64,
    /// Messages accepted (including reject-publish-dlx ones, which are accepted only to die).
    pub enqueued_total: u64,
    /// Deliveries to consumers and Get results.
    pub delivered_total: u64,
    pub acked_total: u64,
    /// Failed deliveries (requeue, consumer down, lapsed lease), including those that died.
    pub returned_total: u64,
    /// Publishes refused by a length limit (reject-publish and reject-publish-dlx).
    pub rejected_publishes_total: u64,
    pub duplicates_total: u64,
    pub purged_total: u64,
}

fn reason_index(reason: Reason) -> usize {
    match reason {
        Reason::Rejected => 0,
        Reason::Expired => 1,
        Reason::Maxlen => 2,
        Reason::DeliveryLimit => 3,
    }
}

const STRATEGIES: [Strategy; 3] = [
    Strategy::Disabled,
    Strategy::AtMostOnce,
    Strategy::AtLeastOnce,
];

fn strategy_index(strategy: Strategy) -> usize {
    match strategy {
        Strategy::Disabled => 0,
        Strategy::AtMostOnce => 1,
        Strategy::AtLeastOnce => 2,
    }
}

impl Stats {
    /// How many messages died for `reason` under `strategy`.
    pub fn dead_lettered(&self, reason: Reason, strategy: Strategy) -> u64 {
        self.dead_lettered[reason_index(reason)][strategy_index(strategy)]
    }

    /// Every (reason, strategy, count), including zeros, in a fixed order.
    pub fn dead_lettered_all(&self) -> Vec<(Reason, Strategy, u64)> {
        let mut out = Vec::with_capacity(12);
        for reason in Reason::ALL {
            for strategy in STRATEGIES {
                out.push((reason, strategy, self.dead_lettered(reason, strategy)));
            }
        }
        out
    }

    /// Total dead-letterings, all reasons and strategies.
    pub fn dead_lettered_total(&self) -> u64 {
        self.dead_lettered.iter().flatten().sum()
    }

    fn count_dead_letter(&mut self, reason: Reason, strategy: Strategy) {
        self.dead_lettered[reason_index(reason)][strategy_index(strategy)] += 1;
    }
}

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
        assert!(
            index > self.last_index,
            "queue apply: index {index} not after last applied {}",
            self.last_index
        );
        self.last_index = index;
        let now = match &cmd {
            Command::Enqueue { now_ms, .. }
            | Command::Checkout { now_ms, .. }
            | Command::Settle { now_ms, .. }
            | Command::ConsumerDown { now_ms, .. }
            | Command::NodeDown { now_ms, .. }
            | Command::Get { now_ms, .. }
            | Command::Expire { now_ms }
            | Command::UpdateConfig { now_ms, .. }
            | Command::ExpireQueue { now_ms, .. }
            | Command::GetWithReceipt { now_ms, .. }
            | Command::SettleReceipts { now_ms, .. }
            | Command::StartMove { now_ms, .. }
            | Command::CancelConsumer { now_ms, .. } => (*now_ms).max(self.clock_ms),
            Command::DeadLetterSettle { .. }
            | Command::Purge
            | Command::MoveDone { .. }
            | Command::EndMove { .. } => self.clock_ms,
        };
        self.clock_ms = now;
        let uses_queue = matches!(
            cmd,
            Command::Checkout { .. }
                | Command::Get { .. }
                | Command::GetWithReceipt { .. }
                | Command::ConsumerDown { .. }
                | Command::CancelConsumer { .. }
                | Command::NodeDown { .. }
        );
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
            } => self.enqueue(index, now, header, publish_key, dedup_key, &mut fx),
            Command::Checkout {
                consumer,
                node,
                prefetch,
                ..
            } => self.checkout_cmd(consumer, node, prefetch),
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
                    self.consumer_down(now, consumer, &mut fx);
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
                    self.consumer_down(now, consumer, &mut fx);
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
            // Firing timers changes neither the consumers nor `last_used_ms`, so this is the
            // answer the state before the command gives.
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
        [expiry, lease, delayed].into_iter().flatten().min()
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
            .chain(self.fresh.iter())
            .enumerate()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .take(limit)
            .take_while(|(position, id)| {
                bytes = bytes.saturating_add(self.msgs[*id].header.size_bytes);
                *position as u64 == offset || bytes <= max_bytes
            })
            .map(|(position, id)| {
                let m = &self.msgs[id];
                Browsed {
                    position: position as u64,
                    id: *id,
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
        let oldest = match (self.fresh.get_min(), self.returned_ids.get_min()) {
            (Some(a), Some(b)) => Some(*a.min(b)),
            (a, b) => a.or(b).copied(),
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

    fn held_letter(&self, id: MessageId) -> HeldDeadLetter {
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
            .chain(self.fresh.iter())
            .take(n)
            .copied()
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

    /// Every move task the queue remembers, by task number.
    pub fn moves(&self) -> &BTreeMap<u64, MoveTask> {
        &self.moves
    }

    /// The running move task, if any.
    pub fn running_move(&self) -> Option<&MoveTask> {
        self.moves.values().find(|t| t.state == MoveState::Running)
    }

    /// Puts back the move tasks a snapshot carried.
    pub fn restore_moves(&mut self, moves: BTreeMap<u64, MoveTask>) {
        self.moves = moves;
    }

    /// Full consistency check of the internal indexes (for tests and after loading a snapshot).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut ready = 0u64;
        let mut ready_bytes = 0u64;
        let mut held_bytes = 0u64;
        let mut expiries = BTreeSet::new();
        let mut leases = BTreeSet::new();
        let mut unacked: BTreeMap<ConsumerId, BTreeSet<MessageId>> = BTreeMap::new();
        let mut held = BTreeMap::new();
        let mut returns = BTreeMap::new();
        let mut delayed = BTreeMap::new();
        let mut delayed_bytes = 0u64;
        for (id, m) in &self.msgs {
            if *id > self.last_index {
                return Err(format!(
                    "message {id} is after last index {}",
                    self.last_index
                ));
            }
            match m.place {
                Place::Ready { returned } => {
                    ready += 1;
                    ready_bytes += m.header.size_bytes;
                    if let Some(d) = m.deadline_ms {
                        expiries.insert((d, *id));
                    }
                    match returned {
                        Some(r) => {
                            returns.insert(r, *id);
                        }
                        None => {
                            if !self.fresh.contains(id) {
                                return Err(format!("ready message {id} not in fresh"));
                            }
                        }
                    }
                }
                Place::Unacked {
                    consumer,
                    lease_deadline_ms,
                    ..
                } => {
                    if !m.delivered {
                        return Err(format!("unacked message {id} never delivered"));
                    }
                    unacked.entry(consumer).or_default().insert(*id);
                    match (consumer == GET_CONSUMER, lease_deadline_ms) {
                        (true, Some(d)) => {
                            leases.insert((d, *id));
                        }
                        (false, None) => {}
                        _ => return Err(format!("message {id}: lease does not match holder")),
                    }
                }
                Place::Held { seq, .. } => {
                    held_bytes += m.header.size_bytes;
                    held.insert(seq, *id);
                }
                Place::Delayed { due_ms, seq } => {
                    delayed_bytes += m.header.size_bytes;
                    delayed.insert((due_ms, seq), *id);
                    if let Some(d) = m.deadline_ms {
                        expiries.insert((d, *id));
                    }
                }
            }
        }
        if !delayed.iter().eq(self.delayed.iter()) || delayed_bytes != self.delayed_bytes {
            return Err("delayed index disagrees with messages".into());
        }
        if !self
            .returned_ids
            .iter()
            .eq(returns.values().copied().collect::<BTreeSet<_>>().iter())
        {
            return Err("returned ids disagree with the returns queue".into());
        }
        if ready != self.ready_len() || ready_bytes != self.ready_bytes {
            return Err(format!(
                "ready {ready}/{ready_bytes}B but indexes say {}/{}B",
                self.ready_len(),
                self.ready_bytes
            ));
        }
        if !returns.iter().eq(self.returns.iter()) {
            return Err("returns index disagrees with messages".into());
        }
        if !expiries.iter().eq(self.expiries.iter()) {
            return Err("expiry index disagrees with ready and delayed messages".into());
        }
        if !leases.iter().eq(self.leases.iter()) {
            return Err("lease index disagrees with messages".into());
        }
        if !held.iter().eq(self.held.iter()) || held_bytes != self.held_bytes {
            return Err("held index disagrees with messages".into());
        }
        let gets = unacked.remove(&GET_CONSUMER).unwrap_or_default();
        if gets.len() != self.leases.len() {
            return Err("get leases disagree".into());
        }
        if let Some(id) = self.receipts.keys().find(|id| !gets.contains(id)) {
            return Err(format!("receipt of message {id} without a Get lease"));
        }
        for (cid, c) in &self.consumers {
            let mine = unacked.remove(cid).unwrap_or_default();
            if !mine.iter().eq(c.checked_out.iter()) {
                return Err(format!("consumer {cid} checked-out set disagrees"));
            }
        }
        if let Some((cid, _)) = unacked.first_key_value() {
            return Err(format!("messages held by unknown consumer {cid}"));
        }
        // (A running move task holds the ready messages.)
        if self.ready_len() > 0 && self.next_consumer().is_some() && self.running_move().is_none() {
            return Err("a consumer has credit while messages are ready".into());
        }
        self.check_cancelled()?;
        self.publish_keys.check()?;
        self.transfer_keys.check()?;
        Ok(())
    }

    // ----- commands -----

    fn enqueue(
        &mut self,
        index: u64,
        now: u64,
        header: MsgHeader,
        publish_key: Option<String>,
        dedup_key: Option<String>,
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
        self.fresh.insert(index);
        self.ready_bytes += size;
        if let Some(d) = deadline_ms {
            self.expiries.insert((d, index));
        }
        Reply::Enqueued { id: index }
    }

    fn settle(
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
                    self.msgs.remove(id);
                    self.stats.acked_total += 1;
                    fx.push(Effect::DeleteBody { id: *id });
                }
                SettleOutcome::Requeue => self.return_failed(*id, now, None, fx),
                SettleOutcome::RequeueAfter { delay_ms } => {
                    self.return_failed(*id, now, Some(*delay_ms), fx)
                }
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
    fn settle_receipts(
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

    fn get(&mut self, now: u64, lease_ms: u64, auto_ack: bool, fx: &mut Vec<Effect>) -> Reply {
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
        self.detach_ready(id);
        self.stats.delivered_total += 1;
        let lease_deadline_ms = if auto_ack {
            None
        } else {
            Some(now.saturating_add(lease_ms))
        };
        let m = self.msgs.get_mut(&id).expect("ready message exists");
        let delivery = Delivery {
            consumer: GET_CONSUMER,
            id,
            delivery_count: m.delivery_count,
            redelivered: m.delivered,
            lease_deadline_ms,
        };
        if auto_ack {
            self.msgs.remove(&id);
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

    fn dead_letter_settle(&mut self, id: MessageId, fx: &mut Vec<Effect>) {
        let Some(Msg {
            place: Place::Held { seq, .. },
            ..
        }) = self.msgs.get(&id)
        else {
            return; // unknown or not held: already settled (a retried confirmation)
        };
        let seq = *seq;
        let m = self.msgs.remove(&id).expect("held message exists");
        self.held.remove(&seq);
        self.held_bytes -= m.header.size_bytes;
        self.stats.dead_lettered_confirmed += 1;
        fx.push(Effect::DeleteBody { id });
    }

    /// Ready and delayed messages go (delayed ones are ready messages that wait).
    fn purge(&mut self, fx: &mut Vec<Effect>) -> Reply {
        let mut ids = self.ready_ids();
        ids.extend(self.delayed.values().copied());
        for id in &ids {
            self.detach_waiting(*id);
            self.msgs.remove(id);
            fx.push(Effect::DeleteBody { id: *id });
        }
        self.stats.purged_total += ids.len() as u64;
        Reply::Purged {
            count: ids.len() as u64,
        }
    }

    fn update_config(&mut self, config: QueueConfig, fx: &mut Vec<Effect>) {
        let was = self.config.dead_letter_strategy;
        self.config = config;
        let now_strategy = self.config.dead_letter_strategy;
        if was == Strategy::AtLeastOnce && now_strategy != Strategy::AtLeastOnce {
            // Release the held dead letters under the new strategy, in death order.
            let held = std::mem::take(&mut self.held);
            self.held_bytes = 0;
            for (_, id) in held {
                let m = self.msgs.remove(&id).expect("held message exists");
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

    fn start_move(
        &mut self,
        index: u64,
        now: u64,
        destination: String,
        max_messages: u64,
        max_per_second: u32,
    ) -> Reply {
        if let Some(t) = self.running_move() {
            return Reply::Error {
                detail: format!(
                    "queue '{}' already has a running move task ({})",
                    self.config.name, t.task
                ),
            };
        }
        let ready = self.ready_len();
        let total = if max_messages == 0 {
            ready
        } else {
            max_messages.min(ready)
        };
        self.moves.insert(
            index,
            MoveTask {
                task: index,
                destination,
                max_per_second,
                total,
                moved: 0,
                state: MoveState::Running,
                detail: String::new(),
                started_ms: now,
            },
        );
        Reply::MoveStarted { task: index }
    }

    /// Ready messages named leave (their copies are committed in the destination); the rest
    /// (already gone, or taken after a cancel) are left alone.
    fn move_done(&mut self, task: u64, ids: &[MessageId], fx: &mut Vec<Effect>) -> Reply {
        if !self.moves.contains_key(&task) {
            return Reply::Error {
                detail: format!("no move task {task}"),
            };
        }
        let mut moved = 0u64;
        for &id in ids {
            if matches!(
                self.msgs.get(&id).map(|m| &m.place),
                Some(Place::Ready { .. })
            ) {
                self.detach_ready(id);
                self.msgs.remove(&id);
                fx.push(Effect::DeleteBody { id });
                moved += 1;
            }
        }
        let t = self.moves.get_mut(&task).expect("task exists");
        t.moved += moved;
        Reply::Ok
    }

    fn end_move(&mut self, task: u64, state: MoveState, detail: String) -> Reply {
        let Some(t) = self.moves.get_mut(&task) else {
            return Reply::Error {
                detail: format!("no move task {task}"),
            };
        };
        if matches!(state, MoveState::Running | MoveState::Done) {
            return Reply::Error {
                detail: format!("a move task cannot be ended as {state:?}"),
            };
        }
        if t.state == MoveState::Running {
            t.state = state;
            t.detail = detail;
        }
        Reply::Ok
    }

    /// A running task is done once it moved its total or nothing is ready any more; only the
    /// last [`MAX_ENDED_MOVES`] ended tasks are kept.
    fn finish_moves(&mut self) {
        let ready = self.ready_len();
        for t in self.moves.values_mut() {
            if t.state == MoveState::Running && (t.moved >= t.total || ready == 0) {
                t.state = MoveState::Done;
            }
        }
        while self
            .moves
            .values()
            .filter(|t| t.state != MoveState::Running)
            .count()
            > MAX_ENDED_MOVES
        {
            let oldest = self
                .moves
                .values()
                .find(|t| t.state != MoveState::Running)
                .map(|t| t.task)
                .expect("an ended task exists");
            self.moves.remove(&oldest);
        }
    }

    // ----- the machinery every command shares -----

    /// Lapse due Get leases and expire due ready messages.
    fn advance(&mut self, now: u64, fx: &mut Vec<Effect>) {
        while let Some(&(deadline, id)) = self.leases.get_min() {
            if deadline > now {
                break;
            }
            self.detach_unacked(id);
            self.return_failed(id, now, Some(0), fx);
        }
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
            self.detach_ready(id);
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
            self.detach_ready(id);
            self.kill(id, Reason::Maxlen, None, now, fx);
        }
    }

    /// A failed delivery comes back: count it; past the delivery limit it dies, past its
    /// deadline it expires, otherwise it joins the tail of the returns queue, or waits
    /// `delay_ms` in the delayed set first (None: the queue's `x-requeue-delays` decide).
    /// The message must already be detached from its holder.
    fn return_failed(
        &mut self,
        id: MessageId,
        now: u64,
        delay_ms: Option<u64>,
        fx: &mut Vec<Effect>,
    ) {
        self.stats.returned_total += 1;
        let m = self.msgs.get_mut(&id).expect("returned message exists");
        m.delivery_count = m.delivery_count.saturating_add(1);
        let over_limit = self
            .config
            .delivery_limit
            .is_some_and(|limit| u64::from(m.delivery_count) > limit);
        if over_limit {
            self.kill(id, Reason::DeliveryLimit, None, now, fx);
            return;
        }
        if m.deadline_ms.is_some_and(|d| d <= now) {
            self.kill(id, Reason::Expired, None, now, fx);
            return;
        }
        let delivery_count = m.delivery_count;
        let delay_ms = delay_ms.unwrap_or_else(|| self.requeue_delay_ms(delivery_count));
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
            self.msgs.remove(&id);
        }
    }

    fn detach_ready(&mut self, id: MessageId) {
        let m = &self.msgs[&id];
        let Place::Ready { returned } = m.place else {
            unreachable!("message {id} is not ready")
        };
        match returned {
            Some(pos) => {
                self.returns.remove(&pos);
                self.returned_ids.remove(&id);
            }
            None => {
                self.fresh.remove(&id);
            }
        }
        if let Some(d) = m.deadline_ms {
            self.expiries.remove(&(d, id));
        }
        self.ready_bytes -= m.header.size_bytes;
    }

    fn detach_delayed(&mut self, id: MessageId) {
        let m = &self.msgs[&id];
        let Place::Delayed { due_ms, seq } = m.place else {
            unreachable!("message {id} is not delayed")
        };
        self.delayed.remove(&(due_ms, seq));
        if let Some(d) = m.deadline_ms {
            self.expiries.remove(&(d, id));
        }
        self.delayed_bytes -= m.header.size_bytes;
    }

    /// Detach a message that waits in the queue: ready or delayed.
    fn detach_waiting(&mut self, id: MessageId) {
        if matches!(self.msgs[&id].place, Place::Delayed { .. }) {
            self.detach_delayed(id);
        } else {
            self.detach_ready(id);
        }
    }

    fn detach_unacked(&mut self, id: MessageId) {
        let m = &self.msgs[&id];
        let Place::Unacked {
            consumer,
            lease_deadline_ms,
            ..
        } = m.place
        else {
            unreachable!("message {id} is not unacked")
        };
        if consumer == GET_CONSUMER {
            let d = lease_deadline_ms.expect("get lease has a deadline");
            self.leases.remove(&(d, id));
            self.receipts.remove(&id);
        } else {
            self.consumers
                .get_mut(&consumer)
                .expect("holder exists")
                .checked_out
                .remove(&id);
        }
    }

    fn ready_head(&self) -> Option<MessageId> {
        self.returns
            .get_min()
            .map(|(_, id)| *id)
            .or_else(|| self.fresh.get_min().copied())
    }

    /// Sort key of a ready message in dispatch order.
    fn queue_pos(&self, id: MessageId) -> (u8, u64) {
        match self.msgs[&id].place {
            Place::Ready {
                returned: Some(pos),
            } => (0, pos),
            Place::Delayed { seq, .. } => (2, seq),
            _ => (1, id),
        }
    }

    fn ready_len(&self) -> u64 {
        (self.returns.len() + self.fresh.len()) as u64
    }

    fn unacked_len(&self) -> u64 {
        self.leases.len() as u64
            + self
                .consumers
                .values()
                .map(|c| c.checked_out.len() as u64)
                .sum::<u64>()
    }

    /// Ready, delayed and held messages count against the length limits.
    fn is_over_limit(&self) -> bool {
        let count = self.ready_len() + self.held.len() as u64 + self.delayed.len() as u64;
        let bytes = self.ready_bytes + self.held_bytes + self.delayed_bytes;
        self.config.max_length.is_some_and(|l| count > l)
            || self.config.max_length_bytes.is_some_and(|l| bytes > l)
    }

    /// Which limit one more ready message of `size` bytes would break, as a refusal detail.
    fn would_exceed(&self, size: u64) -> Option<String> {
        let count = self.ready_len() + self.held.len() as u64 + self.delayed.len() as u64 + 1;
        let bytes = self.ready_bytes + self.held_bytes + self.delayed_bytes + size;
        let name = &self.config.name;
        if let Some(l) = self.config.max_length
            && count > l
        {
            return Some(format!("queue '{name}' is full (x-max-length {l})"));
        }
        if let Some(l) = self.config.max_length_bytes
            && bytes > l
        {
            return Some(format!("queue '{name}' is full (x-max-length-bytes {l})"));
        }
        None
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}
