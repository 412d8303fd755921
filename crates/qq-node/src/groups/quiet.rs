//! Quiescent queue groups: an idle group sleeps, and costs nothing per group until it wakes.
//!
//! Every queue is its own Raft group, and an awake group pays for itself even when nothing
//! happens: every replica's Raft ticks its timers, and the leader sends a heartbeat to every
//! follower every `heartbeat_ms`. With a thousand idle queues that was most of a 2-core machine.
//!
//! This module holds a replica's side: whether it sleeps, and the transitions. The messages
//! between replicas (asking followers to sleep, asking a leader to wake) are
//! [`crate::quiesce`]'s; docs/architecture.md ("Idle groups sleep") tells the whole story.
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
//! - on the leader, before any write ([`Quiet::begin_write`]: proposals, membership changes,
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
//! ([`Quiet::asleep_following`]): it is in the state a `SLEEP` would have left it in. If a
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

use std::sync::atomic::{AtomicU64, Ordering};
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

/// Whether one replica of a group sleeps, and the writes that keep it awake.
pub struct Quiet {
    state: Mutex<State>,
    /// Writes begun on this replica (as leader) since it started.
    writes_begun: AtomicU64,
    /// Writes begun and not yet ended.
    writes_in_flight: AtomicU64,
    /// Bumped on every wake, for the leader actor to arm its idle timer again.
    woken: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    asleep: bool,
    /// Since when it sleeps (for the unload of long-sleeping replicas, [`super::registry`]).
    since: Option<Instant>,
    /// As a sleeping follower: what the leader said when it asked to sleep.
    slept_with: Option<SleepRequest>,
    /// The replica's Raft instance while it is loaded (None while it is unloaded, see
    /// [`super::registry::Dormant`]): sleeping and waking turn its timers off and on.
    raft: Option<QueueRaft>,
}

/// Ends a write on drop ([`Quiet::begin_write`]).
pub struct WriteGuard {
    quiet: Arc<Quiet>,
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        self.quiet.writes_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for Quiet {
    fn default() -> Self {
        Quiet {
            state: Mutex::default(),
            writes_begun: AtomicU64::new(0),
            writes_in_flight: AtomicU64::new(0),
            woken: watch::Sender::new(0),
        }
    }
}

impl Quiet {
    /// A replica that starts (the node starts) asleep as a follower of the leader that `req`
    /// describes: its persisted vote is that leader's committed one and its whole log is
    /// committed, as a follower put to sleep by that leader would hold ([`Quiet::sleep_as_follower`]).
    /// Everything that wakes a sleeping follower wakes it: an append with anything new (a
    /// newer leader's vote among them), a vote request, its leader's node lost. Its sleep
    /// counts from `now`.
    pub fn asleep_following(req: SleepRequest, now: Instant) -> Quiet {
        crate::metrics::group_slept();
        let quiet = Quiet::default();
        *quiet.state.lock().unwrap() = State {
            asleep: true,
            since: Some(now),
            slept_with: Some(req),
            raft: None,
        };
        quiet
    }

    pub fn is_asleep(&self) -> bool {
        self.state.lock().unwrap().asleep
    }

    /// How long this replica has slept at `now`, if it sleeps.
    pub fn asleep_for(&self, now: Instant) -> Option<Duration> {
        let state = self.state.lock().unwrap();
        state
            .since
            .filter(|_| state.asleep)
            .map(|t| now.saturating_duration_since(t))
    }

    /// Subscribe to wakes (the leader actor re-arms its idle timer on each).
    pub fn subscribe_woken(&self) -> watch::Receiver<u64> {
        self.woken.subscribe()
    }

    /// Turn this replica's timers back on, if it sleeps. Returns whether it slept. A leader
    /// should then start a heartbeat round ([`wake_leader`] does). On an unloaded replica the
    /// timers go on when its Raft instance is loaded again ([`Quiet::attach`]).
    pub fn wake(&self) -> bool {
        let mut state = self.state.lock().unwrap();
        if !state.asleep {
            return false;
        }
        state.asleep = false;
        state.since = None;
        state.slept_with = None;
        if let Some(raft) = &state.raft {
            let rc = raft.runtime_config();
            rc.heartbeat(true);
            rc.tick(true);
        }
        drop(state);
        crate::metrics::group_woke();
        self.woken.send_modify(|n| *n += 1);
        true
    }

    /// The replica's Raft instance runs (again): its timers follow whether the replica sleeps
    /// (an instance loaded for a sleeping replica is created with them off), and a sleeping
    /// one counts its sleep from `now` for the unload.
    pub fn attach(&self, raft: &QueueRaft, now: Instant) {
        let mut state = self.state.lock().unwrap();
        let rc = raft.runtime_config();
        rc.heartbeat(!state.asleep);
        rc.tick(!state.asleep);
        state.raft = Some(raft.clone());
        // The unload clock starts again: a replica loaded to be woken must not be unloaded
        // before its turn comes (a reopened link wakes the groups it loaded 128 at a time).
        if state.asleep {
            state.since = Some(now);
        }
    }

    /// Let the replica's Raft instance go (it is being unloaded), if the replica still sleeps
    /// and no write began since `begun` was read. From here a wake only marks the replica
    /// awake; [`Quiet::attach`] turns the timers of the next instance on.
    pub fn detach_if_asleep(&self, begun: u64) -> bool {
        let mut state = self.state.lock().unwrap();
        if !state.asleep || self.writes() != (begun, 0) {
            return false;
        }
        state.raft = None;
        true
    }

    /// Count a write (and wake the group first if it sleeps). Returns the guard that ends the
    /// write, and whether the group slept: then wait for [`wake_leader`] before writing.
    pub fn begin_write(self: &Arc<Self>) -> WriteGuard {
        self.writes_begun.fetch_add(1, Ordering::SeqCst);
        self.writes_in_flight.fetch_add(1, Ordering::SeqCst);
        WriteGuard {
            quiet: self.clone(),
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
        let mut state = self.state.lock().unwrap();
        let ok = {
            let m = raft.metrics();
            let m = m.borrow_watched();
            m.state == ServerState::Follower
                && m.current_leader != Some(me)
                && m.vote == req.vote
                && m.last_log_index == req.committed.as_ref().map(|l| l.index)
                && m.local_committed == req.committed
        };
        if ok {
            if !state.asleep {
                crate::metrics::group_slept();
                state.since = Some(now);
            }
            state.asleep = true;
            state.slept_with = Some(req);
            if let Some(raft) = &state.raft {
                raft.runtime_config().tick(false);
            }
        }
        ok
    }

    /// Writes begun so far and writes in flight ([`Quiet::begin_write`]).
    pub fn writes(&self) -> (u64, u64) {
        (
            self.writes_begun.load(Ordering::SeqCst),
            self.writes_in_flight.load(Ordering::SeqCst),
        )
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
        let mut state = self.state.lock().unwrap();
        if self.writes() != (begun, 0) {
            return false; // a write started meanwhile: its append wakes the followers
        }
        let still = {
            let m = raft.metrics();
            let m = m.borrow_watched();
            m.state == ServerState::Leader
                && m.vote == req.vote
                && m.local_committed == req.committed
        };
        if !still || state.asleep {
            return false;
        }
        state.asleep = true;
        state.since = Some(now);
        state.slept_with = None;
        if let Some(raft) = &state.raft {
            let rc = raft.runtime_config();
            rc.heartbeat(false);
            rc.tick(false);
        }
        crate::metrics::group_slept();
        true
    }

    /// As a follower: whether this append brings anything a sleeping replica must wake for
    /// (entries, a commit it has not seen, another leader's vote). A bare heartbeat of the
    /// leader it slept with does not.
    pub fn append_wakes(&self, req: &AppendEntriesRequest<TypeConfig>) -> bool {
        let state = self.state.lock().unwrap();
        match (&state.asleep, &state.slept_with) {
            (false, _) => false,
            (true, None) => true,
            (true, Some(slept)) => {
                !req.entries.is_empty()
                    || req.vote != slept.vote
                    || req.leader_commit != slept.committed
            }
        }
    }
}

/// As the leader: wake the group if it sleeps, and wait (up to `wait`) until a quorum answered
/// a heartbeat, so that a write or a leader-only read that follows is accepted.
pub async fn wake_leader(raft: &QueueRaft, quiet: &Quiet, lease: Duration, wait: Duration) {
    if !quiet.wake() {
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
