//! The queue leader actor: one task per queue this node leads, owning all leader-only work.
//!
//! [`watch_leadership`] runs for as long as a queue group runs on this node. When the node
//! becomes the group's leader it attaches an inbox to the state machine and starts a
//! [`QueueLeader`]; when leadership ends (or the group stops) it cancels the actor's token,
//! detaches the inbox and ends the consumer sessions served here.
//!
//! The actor is driven by what the state machine hands it (at-most-once dead letters, "the
//! metadata changed the queue's configuration"), by the applied-entry notifications of its
//! queue, by the group's wakes and by topology changes. Each job is a sub-machine: a plain
//! struct with `next_deadline()` and `on_event(now, event) -> actions`, no async, no IO and
//! no clock of its own (`now` comes from the node's clock, `LeaderContext::clock`). The loop
//! (`actor`) waits for the earliest deadline of the machines or for the next thing to
//! happen, turns it into events, carries out the actions (proposals, rounds, RPCs) and feeds
//! their results back as events. Time enters the queue's log only through commands stamped
//! here (and by the API).
//!
//! The sub-machines (state; events; actions; deadline):
//! - `expiry::Expiry`, message TTLs, Get leases, delayed requeues and x-expires. State: a
//!   retry pause and the state's earliest deadline. Events: a loop turn with the state's
//!   deadlines (`QueueState::next_deadline`, so a new leader picks up the replicated delayed
//!   set without a scan), a failed proposal, deadlines moved. Actions: `ExpireQueue { now_ms,
//!   leader_since_ms }` (first: if the state answers expired the actor deletes the queue
//!   through the metadata, its messages not dead-lettered), `Expire { now_ms }`. Deadline:
//!   the retry pause ([`PROPOSAL_RETRY`]), else the earliest state deadline.
//! - `relay::Relay`, at-least-once dead letters in rounds ([`crate::deadletter`]): one round
//!   committing at a time (per-target order) while the next one is prepared, each round's
//!   settle overlapping the next rounds (at most [`SETTLES_IN_FLIGHT`]). State: the ids in
//!   rounds and settling, the epoch, what is preparing, prepared, committing, the retry.
//!   Events: a turn with the held count, a round taken, prepared, committed, a settle ended,
//!   a topology change. Actions: take a round, prepare it, commit it, settle, warn of no
//!   route. Deadline: `dead_letter_retry_ms` after a failed round or preparation (a topology
//!   change ends the pause).
//! - `move_rounds::Moves`, a running move task (redrive): rounds of [`crate::moves`], one at
//!   a time, the next one `moved / max_per_second` seconds after the last began. Events: a
//!   turn (is a task running), a round ended (its outcome and the task's rate), a failed
//!   `EndMove`. Actions: start a round, end the task as Failed. Deadline: the next round
//!   (rate, or a pause after a round that moved nothing or failed). A new leader picks the
//!   replicated task up from the state, so a move survives a leader change.
//! - `config_sync::ConfigSync`, the queue's configuration and consumer timeout follow the
//!   metadata (`UpdateConfig`, `SetConsumerTimeout`). Events: changed (start, metadata,
//!   machine upgrade), timer, failed. Action: sync, whose proposals are `config_sync::plan`,
//!   a pure function of the metadata and the state read when it runs. Deadline: the retry
//!   after a failure.
//! - `machine_upgrade::Upgrade`, the queue's machine version follows the releases its members
//!   run (`SetMachineVersion`). Events: started or woken, applied, a look ended. Actions:
//!   look (and upgrade), sync the config after an upgrade. No deadline: a lagging queue
//!   looks again on an applied entry after a pause, an idle one keeps no timer.
//! - `consumers::Reconcile`, consumers no session here serves (their stream ended on an
//!   earlier leader, or their clean-up failed): `ConsumerDown` at election and
//!   [`CONSUMER_RECONCILE`] after activity, again while it finds work. Events: applied, timer,
//!   done. Action: clean up (and log dropped at-most-once dead letters, `drops`). Deadline:
//!   the next clean-up.
//! - `sleep::Sleep`, the idle group's sleep (`sleep_wake::try_sleep`, which steps the
//!   residency machine in `groups::residency`). Events: active (applied, woken), timer (with
//!   whether work is in flight), stayed awake. Action: try to sleep. Deadline: `sleep_after`
//!   after the last activity; not taken while a round, a move or a republish is in flight.
//!
//! At-most-once dead letters are republished one at a time by the loop itself (the inbox
//! waits meanwhile); their drops are counted and logged rate-limited (`drops`).
//!
//! The rooms: `watch` follows the group's leadership and starts or stops the actor; `actor`
//! is the loop; `flight` holds the futures it polls for the machines (rounds, settles, a
//! republish); one room per sub-machine, each with the actor methods that carry out its
//! actions.
//!
//! Must not: carry out deliveries (the state machine does, to registered sessions) or touch
//! another queue's state.

mod actor;
mod config_sync;
mod consumers;
mod drops;
mod expiry;
mod flight;
mod machine_upgrade;
mod move_rounds;
mod relay;
mod sleep;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use qq_core::NodeId;
use qq_core::queue::{Command, Reply};
use qq_raft::GroupId;
use qq_raft::network::Peers;
use tokio::sync::mpsc;
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

impl QueueLeader {
    async fn propose(&self, cmd: Command) -> Result<Reply, crate::error::NodeError> {
        self.ctx
            .proposer
            .propose_queue(self.group, QueueRequest::command(cmd))
            .await
    }
}
