//! The residency of one queue replica as a pure transition function: [`Residency::step`] takes
//! the state and an [`Event`] and returns what happened and the [`Action`]s the caller carries
//! out. Nothing here does IO, reads a clock or touches a Raft instance: time arrives in events
//! (`now`), and what the replica's Raft metrics say arrives as facts computed by the caller
//! (`in_step`, `leading`). The cell that owns a replica's residency ([`super::ResidencyCell`])
//! steps it under its lock and carries out the actions.
//!
//! A replica is in one of three [`State`]s:
//! - **Awake**: its Raft instance runs with its timers on;
//! - **Asleep**: its Raft instance runs with its timers off (no election timer; as leader no
//!   heartbeats);
//! - **Unloaded**: it has no Raft instance (the registry keeps its machine, metadata and the
//!   Raft metrics at the unload). It sleeps, unless something woke it since: then the next
//!   instance starts with its timers on.
//!
//! A replica starts Unloaded (awake, or asleep where it starts asleep as its leader's
//! follower) and becomes Awake or Asleep when its first instance runs ([`Event::Loaded`]).

use openraft::alias::{LogIdOf, VoteOf};
use qq_raft::TypeConfig;
use tokio::time::Instant;

use super::SleepRequest;

/// Where a replica is (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Awake,
    Asleep,
    Unloaded,
}

/// What the caller does with a replica's Raft instance timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timers {
    /// Heartbeats and election timer on.
    On,
    /// Heartbeats and election timer off (a sleeping leader, an instance loaded asleep).
    Off,
    /// The election timer off, heartbeats as they were (a sleeping follower: should it become
    /// leader by a transfer, it heartbeats).
    ElectionOff,
}

/// What the caller carries out after a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Set the running instance's timers.
    SetTimers(Timers),
    /// The replica went to sleep (count it).
    Slept,
    /// The replica woke (count it, and tell the leader actor to arm its idle timer).
    Woke,
    /// As the leader: send a heartbeat round now rather than at the next tick.
    HeartbeatSoon,
}

/// What can happen to a replica.
#[derive(Debug, Clone)]
pub enum Event {
    /// Raft instance `instance` runs (created at a start or loaded after an unload).
    Loaded { instance: u64, now: Instant },
    /// Something needs the replica's timers on (an append with news, a lost leader, a write,
    /// a leadership transfer, a shutdown's handover).
    Wake,
    /// As the leader: wake, and send a heartbeat round at once.
    WakeToLead,
    /// A leader asks this follower to sleep; `in_step`: the replica follows exactly `req`'s
    /// vote and holds and committed exactly its log (read from its Raft metrics).
    SleepAsFollower {
        req: SleepRequest,
        in_step: bool,
        now: Instant,
    },
    /// As the leader, enough followers sleep: sleep too, unless a write began since `begun`
    /// was read; `still_leading`: its vote and commit did not move from what it asked with.
    SleepAsLeader {
        begun: u64,
        still_leading: bool,
        now: Instant,
    },
    /// A write is about to use Raft instance `instance` (as read from the registry).
    BeginWrite { instance: u64 },
    /// A write admitted by [`Event::BeginWrite`] ended.
    EndWrite,
    /// The unload sweep: let the instance go if the replica still sleeps and no write began
    /// since `begun` was read; `ready`: the sweep's own conditions hold (`may_unload`).
    Unload { begun: u64, ready: bool },
    /// A peer asks this replica, as Raft instance `instance`, for its (pre-)vote. `transfer`:
    /// a leadership transfer's; `leading`: the replica leads its group; `leader`: the leader
    /// it follows, if another node.
    Vote {
        instance: u64,
        transfer: bool,
        leading: bool,
        leader: Option<u64>,
    },
    /// The answer of the leader a sleeping follower asked to confirm ([`Outcome::AskLeader`]).
    LeaderAnswered { leads: bool },
}

/// What a transition answers its caller (beside its actions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done (or nothing to do).
    Done,
    /// Whether the replica changed as asked (slept, woke, was unloaded).
    Changed(bool),
    /// The write may use its instance: counted in flight until [`Event::EndWrite`].
    Admitted,
    /// The instance the caller holds is not the running one (unloaded, or loaded anew):
    /// load the replica and try again.
    Reload,
    /// Hand the vote to Raft.
    Deliver,
    /// Refuse the vote: the group has a live leader (this replica, or the one it follows).
    Refuse,
    /// Ask this node (the leader the replica follows) whether it leads, then step
    /// [`Event::LeaderAnswered`].
    AskLeader(u64),
}

/// While a replica sleeps: since when, and what its leader asked it to sleep with (None for a
/// sleeping leader).
#[derive(Debug, Clone)]
struct Sleep {
    since: Instant,
    slept_with: Option<SleepRequest>,
}

/// One replica's residency (module docs).
#[derive(Debug, Clone, Default)]
pub struct Residency {
    /// The running Raft instance (None: unloaded).
    instance: Option<u64>,
    /// Some while the replica sleeps (loaded or not).
    sleep: Option<Sleep>,
    /// Writes begun on this replica since it started.
    writes_begun: u64,
    /// Writes begun and not yet ended.
    writes_in_flight: u64,
}

impl Residency {
    /// A replica that has no instance yet and is awake (it starts awake).
    pub fn awake() -> Residency {
        Residency::default()
    }

    /// A replica that has no instance yet and sleeps as the follower of the leader `req`
    /// describes, since `now` (it starts asleep).
    pub fn asleep_following(req: SleepRequest, now: Instant) -> Residency {
        Residency {
            sleep: Some(Sleep {
                since: now,
                slept_with: Some(req),
            }),
            ..Residency::default()
        }
    }

    pub fn state(&self) -> State {
        match (self.instance, &self.sleep) {
            (None, _) => State::Unloaded,
            (Some(_), None) => State::Awake,
            (Some(_), Some(_)) => State::Asleep,
        }
    }

    /// Whether it sleeps (Asleep, or Unloaded and not woken since).
    pub fn is_asleep(&self) -> bool {
        self.sleep.is_some()
    }

    /// Since when it sleeps, if it does.
    pub fn asleep_since(&self) -> Option<Instant> {
        self.sleep.as_ref().map(|s| s.since)
    }

    /// Writes begun so far and writes in flight.
    pub fn writes(&self) -> (u64, u64) {
        (self.writes_begun, self.writes_in_flight)
    }

    /// As a follower: whether an append with these contents must wake the replica (entries, a
    /// commit it has not seen, another leader's vote). A bare heartbeat of the leader it slept
    /// with does not.
    pub fn append_wakes(
        &self,
        has_entries: bool,
        vote: &VoteOf<TypeConfig>,
        leader_commit: &Option<LogIdOf<TypeConfig>>,
    ) -> bool {
        match &self.sleep {
            None => false,
            Some(Sleep {
                slept_with: None, ..
            }) => true,
            Some(Sleep {
                slept_with: Some(slept),
                ..
            }) => has_entries || *vote != slept.vote || *leader_commit != slept.committed,
        }
    }

    /// The transition function: the new state is `self` after the call.
    pub fn step(&mut self, event: Event) -> (Outcome, Vec<Action>) {
        match event {
            Event::Loaded { instance, now } => self.loaded(instance, now),
            Event::Wake => self.wake(false),
            Event::WakeToLead => self.wake(true),
            Event::SleepAsFollower { req, in_step, now } => self.sleep_following(req, in_step, now),
            Event::SleepAsLeader {
                begun,
                still_leading,
                now,
            } => self.sleep_leading(begun, still_leading, now),
            Event::BeginWrite { instance } => self.begin_write(instance),
            Event::EndWrite => {
                self.writes_in_flight = self.writes_in_flight.saturating_sub(1);
                (Outcome::Done, vec![])
            }
            Event::Unload { begun, ready } => self.unload(begun, ready),
            Event::Vote {
                instance,
                transfer,
                leading,
                leader,
            } => {
                if self.instance != Some(instance) {
                    return (Outcome::Reload, vec![]);
                }
                self.vote(transfer, leading, leader)
            }
            Event::LeaderAnswered { leads: true } => (Outcome::Refuse, vec![]),
            Event::LeaderAnswered { leads: false } => {
                let (_, actions) = self.wake(false);
                (Outcome::Deliver, actions)
            }
        }
    }

    fn loaded(&mut self, instance: u64, now: Instant) -> (Outcome, Vec<Action>) {
        self.instance = Some(instance);
        match &mut self.sleep {
            // The sleep counts again from the load: a replica loaded to be woken must not be
            // unloaded before its turn comes (a reopened link wakes the groups it loaded 128
            // at a time).
            Some(sleep) => {
                sleep.since = now;
                (Outcome::Done, vec![Action::SetTimers(Timers::Off)])
            }
            None => (Outcome::Done, vec![Action::SetTimers(Timers::On)]),
        }
    }

    /// Wake if it sleeps. Unloaded, it is only marked awake: its next instance starts with its
    /// timers on.
    fn wake(&mut self, lead: bool) -> (Outcome, Vec<Action>) {
        if self.sleep.take().is_none() {
            return (Outcome::Changed(false), vec![]);
        }
        let mut actions = vec![];
        if self.instance.is_some() {
            actions.push(Action::SetTimers(Timers::On));
            if lead {
                actions.push(Action::HeartbeatSoon);
            }
        }
        actions.push(Action::Woke);
        (Outcome::Changed(true), actions)
    }

    fn sleep_following(
        &mut self,
        req: SleepRequest,
        in_step: bool,
        now: Instant,
    ) -> (Outcome, Vec<Action>) {
        if !in_step {
            return (Outcome::Changed(false), vec![]);
        }
        let mut actions = vec![];
        match &mut self.sleep {
            Some(sleep) => sleep.slept_with = Some(req),
            None => {
                actions.push(Action::Slept);
                self.sleep = Some(Sleep {
                    since: now,
                    slept_with: Some(req),
                });
            }
        }
        if self.instance.is_some() {
            actions.push(Action::SetTimers(Timers::ElectionOff));
        }
        (Outcome::Changed(true), actions)
    }

    fn sleep_leading(
        &mut self,
        begun: u64,
        still_leading: bool,
        now: Instant,
    ) -> (Outcome, Vec<Action>) {
        // A write that began meanwhile keeps it awake: its append wakes the followers.
        if self.writes() != (begun, 0) || !still_leading || self.sleep.is_some() {
            return (Outcome::Changed(false), vec![]);
        }
        self.sleep = Some(Sleep {
            since: now,
            slept_with: None,
        });
        let mut actions = vec![];
        if self.instance.is_some() {
            actions.push(Action::SetTimers(Timers::Off));
        }
        actions.push(Action::Slept);
        (Outcome::Changed(true), actions)
    }

    /// The write-vs-unload race is decided here: a write counted on the running instance
    /// stops any unload until it ends ([`Residency::unload`]); a write that comes after the
    /// unload (or holds an older instance) is told to load the replica and try again.
    fn begin_write(&mut self, instance: u64) -> (Outcome, Vec<Action>) {
        if self.instance != Some(instance) {
            return (Outcome::Reload, vec![]);
        }
        self.writes_begun += 1;
        self.writes_in_flight += 1;
        (Outcome::Admitted, vec![])
    }

    fn unload(&mut self, begun: u64, ready: bool) -> (Outcome, Vec<Action>) {
        let idle = self.writes() == (begun, 0);
        if self.instance.is_none() || self.sleep.is_none() || !idle || !ready {
            return (Outcome::Changed(false), vec![]);
        }
        self.instance = None;
        (Outcome::Changed(true), vec![])
    }

    /// A sleeping replica asked for a vote (not a leadership transfer's). As the leader: wake,
    /// send heartbeats, and refuse (if it has lost its quorum it steps down when its lease
    /// runs out, and the next round goes to Raft). As a follower: ask the leader it follows to
    /// wake; if that node answers that it leads the group, refuse; otherwise wake here and let
    /// Raft judge the vote. An awake replica hands every vote to Raft; an unloaded one (or one
    /// asked through an older instance) must be loaded first.
    fn vote(
        &mut self,
        transfer: bool,
        leading: bool,
        leader: Option<u64>,
    ) -> (Outcome, Vec<Action>) {
        match self.state() {
            State::Unloaded => (Outcome::Reload, vec![]),
            State::Awake => (Outcome::Deliver, vec![]),
            State::Asleep if transfer => (Outcome::Deliver, self.wake(false).1),
            State::Asleep if leading => (Outcome::Refuse, self.wake(true).1),
            State::Asleep => match leader {
                Some(leader) => (Outcome::AskLeader(leader), vec![]),
                None => (Outcome::Deliver, self.wake(false).1),
            },
        }
    }
}
