//! A queue replica's residency: **Awake** (its Raft instance runs, timers on), **Asleep** (the
//! instance runs with its timers off: an idle group costs nothing per group until it wakes) or
//! **Unloaded** (no Raft instance at all, see [`super::registry`]).
//!
//! Every queue is its own Raft group, and an awake group pays for itself even when nothing
//! happens: every replica's Raft ticks its timers, and the leader sends a heartbeat to every
//! follower every `heartbeat_ms`. With a thousand idle queues that was most of a 2-core machine.
//!
//! This module holds a replica's side. Its transitions are one pure function, [`machine`]'s
//! [`Residency::step`] (`(state, event) -> (state, actions)`, no IO, no clock: time arrives in
//! events); the replica's [`ResidencyCell`] is the single owner of its state: every change
//! is a step under the cell's lock, whose actions (timers on or off, a heartbeat round, the
//! counters) the cell carries out. Loading and unloading the Raft instance is the registry's
//! ([`super::registry`]), asking the machine first. The messages between replicas (asking
//! followers to sleep, asking a leader to wake) are [`crate::sleep_wake`]'s;
//! docs/architecture.md ("Idle groups sleep") tells the whole story.
//!
//! **Sleeping.** The leader actor of a group ([`crate::leader`]) asks it to sleep when nothing
//! was applied for `quiesce_after_ms`, no write is in flight, and a majority holds the
//! leader's whole log, committed. It sends [`SleepRequest`] (its vote and committed log id)
//! to every follower; a follower that follows exactly that vote and holds exactly that log
//! stops its Raft ticker (no election timer) and answers yes. When every follower said yes,
//! or a majority did and the others did not answer at all (a node down), the leader stops its
//! ticker and heartbeats, unless a write started meanwhile. A follower that slept while its
//! leader stayed awake is harmless: the leader is alive and its appends wake it.
//!
//! **Waking.** A group wakes
//! - on the leader, before any write ([`ResidencyCell::begin_write`]: proposals, membership changes,
//!   leadership transfers) and before a read that needs the leader: heartbeats on, one
//!   heartbeat round at once, and the write waits until a quorum answered it (a sleeping
//!   leader's lease has expired, and openraft refuses writes without it);
//! - on a follower, when an append brings something new (entries, a higher commit, another
//!   leader): its election timer runs again. A bare heartbeat of the same leader does not
//!   wake it (otherwise the leader's last heartbeats before it sleeps would wake followers
//!   that then see no more heartbeats, and elect);
//! - on every node, for every group shared with a peer, when the node-level liveness link to
//!   that peer breaks or falls silent ([`crate::peer::liveness`]: one stream per node pair,
//!   an event every `heartbeat_ms`, silent after `election_timeout_min_ms`). Followers of the
//!   lost leader then elect as after any leader loss; a leader that lost its followers steps
//!   down when its lease expires, as an awake one does;
//! - on a leader, for its loaded groups shared with a peer whose link (re)opens: a restarted
//!   or returning node is brought up to date before its own election timers run out (an
//!   unloaded leader had every member up to date, see [`super::registry`]);
//! - on a sleeping follower asked for a vote: it asks the leader it follows to wake
//!   ([`SleepRequest`]'s counterpart, the `WAKE` Raft message) and refuses this vote only if
//!   that node answers that it leads the group and is heartbeating again; otherwise it wakes
//!   and lets Raft judge the vote. A leadership transfer's vote is never refused.
//!
//! **Starting asleep.** A replica whose node starts, and whose stored vote is committed for
//! another node with its whole log committed, starts asleep as that leader's follower
//! ([`ResidencyCell::asleep_following`]): it is in the state a `SLEEP` would have left it in. If a
//! newer leader was elected meanwhile, that leader holds this member behind, so it is loaded
//! and awake, and its first append (a newer vote) wakes the replica.
//!
//! **Why a sleeping group cannot miss a leader change.** A follower sleeps only while it
//! follows the leader's current vote with the leader's whole log committed. A new leader needs
//! votes from a majority; a sleeping member gives one only after waking, and it wakes (a) when
//! its leader's node is lost, which is when an election is needed, or (b) when the leader it
//! asked does not confirm that it leads. Any new entry, and any new term, reaches a sleeping
//! follower as an append that wakes it. Safety never depends on this module: it only turns
//! timers off and on and refuses votes, and refusing a vote never breaks Raft's safety.

pub mod machine;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ServerState;
use openraft::alias::{LogIdOf, VoteOf};
use openraft::async_runtime::WatchReceiver;
use openraft::raft::AppendEntriesRequest;
use qq_core::NodeId;
use qq_raft::TypeConfig;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

pub use self::machine::{Action, Event, Outcome, Residency, State, Timers};
use super::queue_sm::QueueMachine;
use super::shell::Shell;

/// A queue group's Raft (the same type as `registry::QueueRaft`, named here so that this
/// module does not import the registry, which imports it).
type QueueRaft = openraft::Raft<TypeConfig, Shell<QueueMachine>>;

/// What a leader sends its followers when the group may sleep.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SleepRequest {
    /// The leader's vote: the follower must follow exactly this one.
    pub vote: VoteOf<TypeConfig>,
    /// The leader's last log id, committed: the follower must hold and have committed it.
    pub committed: Option<LogIdOf<TypeConfig>>,
}

/// The owner of one replica's [`Residency`]: steps it under its lock and carries out the
/// actions on the running Raft instance. Shared by every instance of the replica (it outlives
/// an unload).
pub struct ResidencyCell {
    inner: Mutex<Inner>,
    /// Bumped on every wake, for the leader actor to arm its idle timer again.
    woken: watch::Sender<u64>,
}

struct Inner {
    residency: Residency,
    /// The running Raft instance (None while unloaded): the actions' target.
    raft: Option<QueueRaft>,
}

/// Ends a write on drop ([`ResidencyCell::begin_write`]).
pub struct WriteGuard {
    cell: Arc<ResidencyCell>,
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        self.cell.step(Event::EndWrite);
    }
}

impl Default for ResidencyCell {
    fn default() -> Self {
        ResidencyCell::new(Residency::awake())
    }
}

impl ResidencyCell {
    fn new(residency: Residency) -> ResidencyCell {
        ResidencyCell {
            inner: Mutex::new(Inner {
                residency,
                raft: None,
            }),
            woken: watch::Sender::new(0),
        }
    }

    /// A replica that starts (the node starts) asleep as a follower of the leader that `req`
    /// describes: its persisted vote is that leader's committed one and its whole log is
    /// committed, as a follower put to sleep by that leader would hold. Everything that wakes
    /// a sleeping follower wakes it: an append with anything new (a newer leader's vote among
    /// them), a vote request, its leader's node lost. Its sleep counts from `now`.
    pub fn asleep_following(req: SleepRequest, now: Instant) -> ResidencyCell {
        crate::metrics::group_slept();
        ResidencyCell::new(Residency::asleep_following(req, now))
    }

    /// One transition, its actions carried out (under the lock: a timer change never
    /// overtakes the next transition's).
    pub fn step(&self, event: Event) -> Outcome {
        let mut inner = self.inner.lock().unwrap();
        let (outcome, actions) = inner.residency.step(event);
        let mut woke = false;
        for action in actions {
            match action {
                Action::SetTimers(timers) => {
                    if let Some(raft) = &inner.raft {
                        set_timers(raft, timers);
                    }
                }
                Action::Slept => crate::metrics::group_slept(),
                Action::Woke => woke = true,
                Action::HeartbeatSoon => {
                    if let Some(raft) = &inner.raft {
                        heartbeat_soon(raft);
                    }
                }
            }
        }
        drop(inner);
        if woke {
            crate::metrics::group_woke();
            self.woken.send_modify(|n| *n += 1);
        }
        outcome
    }

    pub fn state(&self) -> State {
        self.inner.lock().unwrap().residency.state()
    }

    pub fn is_asleep(&self) -> bool {
        self.inner.lock().unwrap().residency.is_asleep()
    }

    /// How long this replica has slept at `now`, if it sleeps.
    pub fn asleep_for(&self, now: Instant) -> Option<Duration> {
        let inner = self.inner.lock().unwrap();
        inner
            .residency
            .asleep_since()
            .map(|t| now.saturating_duration_since(t))
    }

    /// Subscribe to wakes (the leader actor re-arms its idle timer on each).
    pub fn subscribe_woken(&self) -> watch::Receiver<u64> {
        self.woken.subscribe()
    }

    /// Turn this replica's timers back on, if it sleeps. Returns whether it slept. A leader
    /// should then start a heartbeat round ([`ResidencyCell::wake_to_lead`], [`wake_leader`]).
    /// On an unloaded replica the timers go on when its Raft instance is loaded again.
    pub fn wake(&self) -> bool {
        self.step(Event::Wake) == Outcome::Changed(true)
    }

    /// As a leader woken without a write to make: wake, with a heartbeat round at once.
    /// Returns whether it slept.
    pub fn wake_to_lead(&self) -> bool {
        self.step(Event::WakeToLead) == Outcome::Changed(true)
    }

    /// Raft instance `instance` of the replica runs: its timers follow whether the replica
    /// sleeps (an instance loaded for a sleeping replica is created with them off).
    pub fn attach(&self, raft: &QueueRaft, instance: u64, now: Instant) {
        self.inner.lock().unwrap().raft = Some(raft.clone());
        self.step(Event::Loaded { instance, now });
    }

    /// Let the replica's Raft instance go (it is being unloaded), if the machine agrees: the
    /// replica still sleeps, `ready`, and no write began since `begun` was read. From here a
    /// wake only marks the replica awake; the next instance starts with its timers on.
    pub fn detach(&self, begun: u64, ready: bool) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let (outcome, _) = inner.residency.step(Event::Unload { begun, ready });
        let detached = outcome == Outcome::Changed(true);
        if detached {
            inner.raft = None;
        }
        detached
    }

    /// Count a write on Raft instance `instance` (the group's as the caller read it from the
    /// registry). None when that is not the running instance (unloaded meanwhile): load the
    /// group again and retry. The guard ends the write.
    pub fn begin_write(self: &Arc<Self>, instance: u64) -> Option<WriteGuard> {
        match self.step(Event::BeginWrite { instance }) {
            Outcome::Admitted => Some(WriteGuard { cell: self.clone() }),
            _ => None,
        }
    }

    /// As a follower: sleep if `req` describes exactly this replica's state (it follows that
    /// vote, holds that log and committed it). Returns whether it sleeps now (its sleep counts
    /// from `now`).
    pub fn sleep_as_follower(
        &self,
        raft: &QueueRaft,
        me: NodeId,
        req: SleepRequest,
        now: Instant,
    ) -> bool {
        let in_step = {
            let m = raft.metrics();
            let m = m.borrow_watched();
            m.state == ServerState::Follower
                && m.current_leader != Some(me)
                && m.vote == req.vote
                && m.last_log_index == req.committed.as_ref().map(|l| l.index)
                && m.local_committed == req.committed
        };
        let event = Event::SleepAsFollower { req, in_step, now };
        self.step(event) == Outcome::Changed(true)
    }

    /// Writes begun so far and writes in flight ([`ResidencyCell::begin_write`]).
    pub fn writes(&self) -> (u64, u64) {
        self.inner.lock().unwrap().residency.writes()
    }

    /// As the leader, once enough followers sleep: sleep too, unless a write began since
    /// `begun` was read or the leader's vote or commit moved from `req`'s. Returns whether it
    /// sleeps now (its sleep counts from `now`).
    pub fn sleep_as_leader(
        &self,
        raft: &QueueRaft,
        begun: u64,
        req: &SleepRequest,
        now: Instant,
    ) -> bool {
        let still_leading = {
            let m = raft.metrics();
            let m = m.borrow_watched();
            m.state == ServerState::Leader
                && m.vote == req.vote
                && m.local_committed == req.committed
        };
        let event = Event::SleepAsLeader {
            begun,
            still_leading,
            now,
        };
        self.step(event) == Outcome::Changed(true)
    }

    /// As a follower: whether this append brings anything a sleeping replica must wake for
    /// ([`Residency::append_wakes`]).
    pub fn append_wakes(&self, req: &AppendEntriesRequest<TypeConfig>) -> bool {
        let inner = self.inner.lock().unwrap();
        inner
            .residency
            .append_wakes(!req.entries.is_empty(), &req.vote, &req.leader_commit)
    }
}

fn set_timers(raft: &QueueRaft, timers: Timers) {
    let rc = raft.runtime_config();
    match timers {
        Timers::On => {
            rc.heartbeat(true);
            rc.tick(true);
        }
        Timers::Off => {
            rc.heartbeat(false);
            rc.tick(false);
        }
        Timers::ElectionOff => rc.tick(false),
    }
}

/// As the leader: wake the group if it sleeps, and wait (up to `wait`) until a quorum answered
/// a heartbeat, so that a write or a leader-only read that follows is accepted.
pub async fn wake_leader(raft: &QueueRaft, cell: &ResidencyCell, lease: Duration, wait: Duration) {
    if !cell.wake() {
        return;
    }
    if raft.trigger().heartbeat().await.is_err() {
        return;
    }
    let _ = raft
        .wait(Some(wait))
        .metrics(
            |m| {
                m.state != ServerState::Leader
                    || m.last_quorum_acked
                        .as_ref()
                        .is_some_and(|t| openraft::Instant::elapsed(&**t) < lease)
            },
            "a quorum answered the waking heartbeat",
        )
        .await;
}

/// As a leader just woken without a write to make: send a heartbeat round now (in the
/// background) rather than at the next tick.
pub fn heartbeat_soon(raft: &QueueRaft) {
    let raft = raft.clone();
    tokio::spawn(async move {
        let _ = raft.trigger().heartbeat().await;
    });
}
