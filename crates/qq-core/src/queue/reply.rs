//! What applying a command gives back: the [`Reply`] for its proposer, the [`Effect`]s the
//! node carries out, and the views of the state the node reads ([`Counts`], [`Stats`],
//! [`HeldDeadLetter`], [`Browsed`], [`Location`]).

use serde::{Deserialize, Serialize};

use crate::types::{ConsumerId, MessageId, Reason, Strategy};

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
    /// `consumer` held message `id` past the queue's consumer timeout (`timeout_ms`): it is
    /// gone and its messages returned; the leader cancels its session, naming the timeout.
    ConsumerTimedOut {
        consumer: ConsumerId,
        id: MessageId,
        timeout_ms: u64,
    },
    /// A Get handed message `id` out, which had been handed out and returned `acquired_count`
    /// times before (`x-acquired-count`; module `counts`). Nothing to carry out: the node
    /// puts the count in the Get's answer. Read here because an auto-ack Get forgets the
    /// message, with its release count, in the same apply.
    Got { id: MessageId, acquired_count: u32 },
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

    pub(super) fn count_dead_letter(&mut self, reason: Reason, strategy: Strategy) {
        self.dead_lettered[reason_index(reason)][strategy_index(strategy)] += 1;
    }
}
