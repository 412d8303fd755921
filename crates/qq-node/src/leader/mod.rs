//! The queue leader actor: one task per queue this node leads, owning all leader-only work.
//!
//! [`watch_leadership`] runs for as long as a queue group runs on this node. When the node
//! becomes the group's leader it attaches an inbox to the state machine and starts a
//! [`QueueLeader`]; when leadership ends (or the group stops) it cancels the actor's token,
//! detaches the inbox and ends the consumer sessions served here.
//!
//! The actor is driven by what the state machine hands it (at-most-once dead letters, "the
//! metadata changed the queue's configuration") and by the applied-entry notifications of its
//! queue, and keeps its own timers, armed from the state's deadlines:
//! - message TTLs, Get leases and delayed requeues: propose `Expire { now_ms }` when the
//!   earliest is due (one timer, re-armed from `QueueState::next_deadline` after every
//!   applied entry, so a new leader picks up the replicated delayed set without a scan);
//! - x-expires: propose `ExpireQueue { now_ms, leader_since_ms }` when the queue would be
//!   unused for its expiry; the state machine decides, and if it answers expired the actor
//!   deletes the queue through the metadata (its messages are not dead-lettered);
//! - at-least-once dead letters: transfer held ones in rounds ([`crate::deadletter`]), one
//!   round committing at a time (per-target order) while the next one is prepared (see
//!   [`Relay`]), each round's settle overlapping the next rounds (at most
//!   [`SETTLES_IN_FLIGHT`]; dead letters in a round or being settled are not taken again);
//!   after a failed round, retry on a metadata change or after `dead_letter_retry_ms`;
//! - consumers that no session here serves (their stream ended on an earlier leader, or their
//!   clean-up failed): `ConsumerDown` at election and every [`CONSUMER_RECONCILE`];
//! - the queue's configuration in its own log follows the metadata (`UpdateConfig`);
//! - the queue's machine version follows the releases its members run
//!   (`SetMachineVersion`, module `machine_upgrade`);
//! - a running move task (redrive): rounds of [`crate::moves`], one at a time, the next one
//!   after `moved / max_per_second` seconds; a failed round is retried after a pause, a task
//!   that cannot go on is ended as Failed (`EndMove`). A new leader picks the replicated task
//!   up from the state, so a move survives a leader change.
//!
//! Time enters the queue's log only through commands stamped here (and by the API).
//!
//! The rooms: `watch` follows the group's leadership and starts or stops the actor; `actor`
//! is the actor's loop, one `select!` whose arms are methods; its sub-jobs are `relay`
//! (at-least-once dead letters in rounds), `drops` (rate-limited lines about dropped
//! at-most-once ones), `expiry` (TTLs, leases, x-expires), `move_rounds` (a running move
//! task), `config_sync` (the queue's configuration follows the metadata), `machine_upgrade`
//! (its machine version follows its members' releases) and `consumers`
//! (consumers no session here serves). The sleep of an idle group is `crate::sleep_wake`'s.
//!
//! Must not: carry out deliveries (the state machine does, to registered sessions) or touch
//! another queue's state.

mod actor;
mod config_sync;
mod consumers;
mod drops;
mod expiry;
mod machine_upgrade;
mod move_rounds;
mod relay;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use qq_core::NodeId;
use qq_core::queue::{Command, Reply};
use qq_raft::GroupId;
use qq_raft::network::Peers;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use self::watch::watch_leadership;
use crate::clock::Clock;
use crate::deadletter::DeadLetters;
use crate::groups::queue_sm::{LeaderEvent, QueueMachine, QueueRequest};
use crate::groups::registry::QueueRaft;
use crate::groups::residency::ResidencyCell;
use crate::meta_view::MetaView;
use crate::moves::Mover;
use crate::peer::machines::PeerMachines;
use crate::proposer::Proposer;

/// How often a leader looks for consumers in the queue state that no session of its own serves.
/// Becoming leader is not enough: a `Checkout` proposed just before a leader change can commit
/// and apply after the new leader's first clean-up (its session already gone), and its
/// `ConsumerDown` can fail during the election; such a consumer would hold its unacked
/// messages forever (found by qq-chaos: 20 messages, one prefetch, stuck in a queue).
pub const CONSUMER_RECONCILE: Duration = Duration::from_secs(3);

/// Retry of a failed proposal the actor owes (UpdateConfig, Expire, ExpireQueue).
const PROPOSAL_RETRY: Duration = Duration::from_millis(500);

/// What every leader actor of this node shares.
#[derive(Clone)]
pub struct LeaderContext {
    pub proposer: Proposer,
    pub view: MetaView,
    pub dead_letters: DeadLetters,
    pub dead_letter_retry: Duration,
    pub mover: Mover,
    pub tasks: TaskTracker,
    /// For the sleep of idle groups ([`crate::groups::residency`]).
    pub peers: Peers,
    pub me: NodeId,
    /// A group with nothing applied for this long sleeps; None: never.
    pub sleep_after: Option<Duration>,
    /// Which queue machine version each peer runs (written by the peer watches).
    pub machines: PeerMachines,
    /// The node's `consumer_timeout_ms` (0: none), for queues that set none.
    pub default_consumer_timeout_ms: u64,
    /// The node's clock: the actor's timers and the time it stamps into its commands.
    pub clock: Clock,
}

/// Settles of transferred dead letters in flight at once; at the bound no new round starts.
pub const SETTLES_IN_FLIGHT: usize = 4;

/// The leader-only work of one queue while this node leads it.
pub struct QueueLeader {
    ctx: LeaderContext,
    group: GroupId,
    machine: Arc<QueueMachine>,
    raft: QueueRaft,
    residency: Arc<ResidencyCell>,
    inbox: mpsc::Receiver<LeaderEvent>,
    /// A queue never used since this node became leader counts as used from then (x-expires).
    leader_since_ms: u64,
    cancel: CancellationToken,
}

/// The actor's timers, as instants (None: not armed).
#[derive(Default)]
struct Timers {
    transfer_retry: Option<Instant>,
    config_retry: Option<Instant>,
    expire_retry: Option<Instant>,
    /// The next move round: not before this (rate limit or retry pause).
    move_next: Option<Instant>,
}

impl QueueLeader {
    async fn propose(&self, cmd: Command) -> Result<Reply, crate::error::NodeError> {
        self.ctx
            .proposer
            .propose_queue(self.group, QueueRequest::command(cmd))
            .await
    }
}
