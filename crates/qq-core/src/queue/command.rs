//! What a queue's log holds: [`Command`], its arguments ([`MsgHeader`], [`SettleOutcome`],
//! [`Receipt`]) and the bounds every command is checked against before it is proposed and
//! again at apply ([`Command::validate`]). The encoding is positional (postcard): a variant or
//! a field is only ever added last.

use imbl::OrdMap;
use serde::{Deserialize, Serialize};

use super::timeouts::MAX_CONSUMER_TIMEOUT_MS;
use super::{GET_CONSUMER, MAX_MOVE_DESTINATION_BYTES, MoveState};
use crate::types::{ConsumerId, MessageId, NodeId, QueueConfig};

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
    /// Back to the queue at once without counting a failed delivery: only the acquired count
    /// grows, and the delivery limit does not see it (AMQP `basic.nack` with requeue, as
    /// RabbitMQ 4.3; module `counts`). Machine version 2. Added last.
    Release,
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
    /// The queue's machine moves to `version` (module `machine`): the leader proposes it once
    /// every member runs a release that has that version. Added last.
    SetMachineVersion {
        version: u32,
    },
    /// [`Command::Checkout`] with a consumer priority (`x-priority`; 0 is the default): module
    /// `consumers`. Machine version 2. Added last.
    CheckoutWithPriority {
        now_ms: u64,
        consumer: ConsumerId,
        node: NodeId,
        prefetch: u32,
        priority: i32,
    },
    /// The queue's consumer timeout (None: none; at most [`MAX_CONSUMER_TIMEOUT_MS`], not 0):
    /// module `timeouts`. Machine version 2. Added last.
    SetConsumerTimeout {
        timeout_ms: Option<u64>,
    },
    /// [`Command::Enqueue`] of a message with a priority (`properties.priority`): from
    /// [`super::HIGH_PRIORITY_FROM`] up it is a high-priority message (module `priorities`).
    /// Machine version 2. Added last.
    EnqueueWithPriority {
        now_ms: u64,
        header: MsgHeader,
        publish_key: Option<String>,
        dedup_key: Option<String>,
        priority: u8,
    },
}

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
    /// Whether the command stores a message (its entry carries the body).
    pub fn is_enqueue(&self) -> bool {
        matches!(
            self,
            Command::Enqueue { .. } | Command::EnqueueWithPriority { .. }
        )
    }

    /// The leader's time stamped into the command (None: a command without one runs at the
    /// state's clock).
    pub fn now_ms(&self) -> Option<u64> {
        match self {
            Command::Enqueue { now_ms, .. }
            | Command::EnqueueWithPriority { now_ms, .. }
            | Command::Checkout { now_ms, .. }
            | Command::CheckoutWithPriority { now_ms, .. }
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
            | Command::CancelConsumer { now_ms, .. } => Some(*now_ms),
            Command::DeadLetterSettle { .. }
            | Command::SetMachineVersion { .. }
            | Command::SetConsumerTimeout { .. }
            | Command::Purge
            | Command::MoveDone { .. }
            | Command::EndMove { .. } => None,
        }
    }

    /// Whether the command uses the queue for `x-expires` (a consumer or a Get), once accepted.
    pub(super) fn uses_queue(&self) -> bool {
        matches!(
            self,
            Command::Checkout { .. }
                | Command::CheckoutWithPriority { .. }
                | Command::Get { .. }
                | Command::GetWithReceipt { .. }
                | Command::ConsumerDown { .. }
                | Command::CancelConsumer { .. }
                | Command::NodeDown { .. }
        )
    }

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
                publish_key,
                dedup_key,
                ..
            }
            | Command::EnqueueWithPriority {
                publish_key,
                dedup_key,
                ..
            } => check_keys(publish_key, dedup_key),
            Command::Checkout { consumer, .. }
            | Command::CheckoutWithPriority { consumer, .. }
            | Command::CancelConsumer { consumer, .. }
                if *consumer == GET_CONSUMER =>
            {
                Err(format!("consumer: id {GET_CONSUMER} is reserved for get"))
            }
            Command::Settle { outcome, .. } | Command::SettleReceipts { outcome, .. } => {
                outcome.validate()
            }
            Command::UpdateConfig { config, .. } => check_requeue_delays(&config.requeue_delays_ms),
            Command::SetConsumerTimeout {
                timeout_ms: Some(t),
            } if *t == 0 || *t > MAX_CONSUMER_TIMEOUT_MS => Err(format!(
                "timeout_ms: {t}, not within 1..={MAX_CONSUMER_TIMEOUT_MS}"
            )),
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

/// The bounds of an enqueue's idempotency keys.
fn check_keys(publish_key: &Option<String>, dedup_key: &Option<String>) -> Result<(), String> {
    for (name, key) in [("dedup_key", dedup_key), ("publish_key", publish_key)] {
        if let Some(k) = key
            && k.len() > MAX_DEDUP_KEY_BYTES
        {
            return Err(format!(
                "{name}: {} bytes, more than {MAX_DEDUP_KEY_BYTES}",
                k.len()
            ));
        }
    }
    Ok(())
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
