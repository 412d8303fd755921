//! The residency machine on its own: no runtime, no Raft instance, time as a value.

use std::time::Duration;

use openraft::alias::{LogIdOf, VoteOf};
use qq_raft::TypeConfig;
use tokio::time::Instant;

use super::SleepRequest;
use super::machine::{Action, Event, Outcome, Residency, State, Timers};

fn log_id(index: u64) -> LogIdOf<TypeConfig> {
    LogIdOf::<TypeConfig>::new(
        openraft::impls::leader_id_adv::LeaderId {
            term: 1,
            node_id: 2,
        },
        index,
    )
}

fn request() -> SleepRequest {
    SleepRequest {
        vote: VoteOf::<TypeConfig>::new_committed(1, 2),
        committed: Some(log_id(7)),
    }
}

/// A replica whose instance 1 runs, awake (loaded at `t0`).
fn awake(t0: Instant) -> Residency {
    let mut r = Residency::awake();
    r.step(Event::Loaded {
        instance: 1,
        now: t0,
    });
    r
}

/// A replica whose instance 1 runs, asleep (as a follower of node 2) since `t0`.
fn asleep(t0: Instant) -> Residency {
    let mut r = awake(t0);
    let (out, _) = r.step(Event::SleepAsFollower {
        req: request(),
        in_step: true,
        now: t0,
    });
    assert_eq!(out, Outcome::Changed(true));
    assert_eq!(r.state(), State::Asleep);
    r
}

fn unload(r: &mut Residency) -> Outcome {
    let (begun, _) = r.writes();
    r.step(Event::Unload { begun, ready: true }).0
}

#[test]
fn a_replica_sleeps_wakes_and_unloads_with_its_timers_following() {
    let t0 = Instant::now();
    let mut r = Residency::awake();
    assert_eq!(r.state(), State::Unloaded);
    let (_, actions) = r.step(Event::Loaded {
        instance: 1,
        now: t0,
    });
    assert_eq!(actions, vec![Action::SetTimers(Timers::On)]);
    assert_eq!(r.state(), State::Awake);
    assert_eq!(
        unload(&mut r),
        Outcome::Changed(false),
        "awake: stays loaded"
    );

    let (_, actions) = r.step(Event::SleepAsFollower {
        req: request(),
        in_step: true,
        now: t0,
    });
    assert_eq!(
        actions,
        vec![Action::Slept, Action::SetTimers(Timers::ElectionOff)]
    );
    assert_eq!(r.asleep_since(), Some(t0));
    assert_eq!(unload(&mut r), Outcome::Changed(true));
    assert_eq!(r.state(), State::Unloaded);
    assert!(r.is_asleep(), "an unloaded replica sleeps on");

    let t1 = t0 + Duration::from_secs(60);
    let (_, actions) = r.step(Event::Loaded {
        instance: 2,
        now: t1,
    });
    assert_eq!(actions, vec![Action::SetTimers(Timers::Off)]);
    assert_eq!(r.state(), State::Asleep);
    assert_eq!(r.asleep_since(), Some(t1), "the sleep counts from the load");

    let (out, actions) = r.step(Event::Wake);
    assert_eq!(out, Outcome::Changed(true));
    assert_eq!(actions, vec![Action::SetTimers(Timers::On), Action::Woke]);
    assert_eq!(r.state(), State::Awake);
    assert_eq!(r.step(Event::Wake), (Outcome::Changed(false), vec![]));
}

#[test]
fn a_follower_out_of_step_or_a_leader_that_moved_does_not_sleep() {
    let t0 = Instant::now();
    let mut r = awake(t0);
    let out = r.step(Event::SleepAsFollower {
        req: request(),
        in_step: false,
        now: t0,
    });
    assert_eq!(out, (Outcome::Changed(false), vec![]));
    let out = r.step(Event::SleepAsLeader {
        begun: 0,
        still_leading: false,
        now: t0,
    });
    assert_eq!(out, (Outcome::Changed(false), vec![]));
    assert_eq!(r.state(), State::Awake);
    let (out, actions) = r.step(Event::SleepAsLeader {
        begun: 0,
        still_leading: true,
        now: t0,
    });
    assert_eq!(out, Outcome::Changed(true));
    assert_eq!(actions, vec![Action::SetTimers(Timers::Off), Action::Slept]);
}

/// Write vs. sleep: a write that began after the leader read its count keeps it awake.
#[test]
fn a_write_begun_while_the_leader_asked_its_followers_keeps_it_awake() {
    let t0 = Instant::now();
    let mut r = awake(t0);
    let (begun, _) = r.writes();
    assert_eq!(
        r.step(Event::BeginWrite { instance: 1 }).0,
        Outcome::Admitted
    );
    r.step(Event::EndWrite);
    let out = r.step(Event::SleepAsLeader {
        begun,
        still_leading: true,
        now: t0,
    });
    assert_eq!(out.0, Outcome::Changed(false));
    assert_eq!(r.state(), State::Awake);
}

/// Write vs. unload, the write first: counted on the running instance, it stops the unload
/// (in flight, or begun and ended since the sweep read the count).
#[test]
fn a_write_counted_before_the_unload_keeps_the_instance() {
    let t0 = Instant::now();
    let mut r = asleep(t0);
    let (begun, _) = r.writes();
    assert_eq!(
        r.step(Event::BeginWrite { instance: 1 }).0,
        Outcome::Admitted
    );
    assert_eq!(unload(&mut r), Outcome::Changed(false), "a write in flight");
    assert_eq!(r.state(), State::Asleep);
    r.step(Event::EndWrite);
    let out = r.step(Event::Unload { begun, ready: true });
    assert_eq!(out.0, Outcome::Changed(false), "a write began since");
    assert_eq!(r.state(), State::Asleep);
    assert_eq!(
        unload(&mut r),
        Outcome::Changed(true),
        "idle again: unloads"
    );
}

/// Write vs. unload, the unload first: a write that holds the instance it read before the
/// unload is sent to load again, and is admitted on the new instance only.
#[test]
fn a_write_after_the_unload_loads_a_new_instance() {
    let t0 = Instant::now();
    let mut r = asleep(t0);
    assert_eq!(unload(&mut r), Outcome::Changed(true));
    assert_eq!(r.step(Event::BeginWrite { instance: 1 }).0, Outcome::Reload);
    assert_eq!(r.writes(), (0, 0), "a refused write is not counted");
    r.step(Event::Loaded {
        instance: 2,
        now: t0,
    });
    assert_eq!(r.step(Event::BeginWrite { instance: 1 }).0, Outcome::Reload);
    assert_eq!(
        r.step(Event::BeginWrite { instance: 2 }).0,
        Outcome::Admitted
    );
    assert_eq!(unload(&mut r), Outcome::Changed(false));
    assert_eq!(r.state(), State::Asleep, "loaded again, asleep");
}

#[test]
fn the_sweep_conditions_and_an_awake_replica_stop_the_unload() {
    let t0 = Instant::now();
    let mut r = asleep(t0);
    let out = r.step(Event::Unload {
        begun: 0,
        ready: false,
    });
    assert_eq!(out.0, Outcome::Changed(false));
    r.step(Event::Wake);
    assert_eq!(unload(&mut r), Outcome::Changed(false));
    assert_eq!(r.state(), State::Awake);
}

fn vote(instance: u64, leading: bool, leader: Option<u64>) -> Event {
    Event::Vote {
        instance,
        transfer: false,
        leading,
        leader,
    }
}

/// Wake vs. vote, unloaded: the vote is sent to load first; a wake that comes meanwhile marks
/// the replica awake, its instance starts with its timers on, and the vote goes to Raft.
#[test]
fn a_vote_for_an_unloaded_replica_woken_while_it_loads_goes_to_raft() {
    let t0 = Instant::now();
    let mut r = asleep(t0);
    assert_eq!(unload(&mut r), Outcome::Changed(true));
    assert_eq!(r.step(vote(1, false, Some(2))).0, Outcome::Reload);
    let (out, actions) = r.step(Event::Wake);
    assert_eq!(out, Outcome::Changed(true));
    assert_eq!(actions, vec![Action::Woke], "no instance: no timers to set");
    assert_eq!(r.state(), State::Unloaded);
    let (_, actions) = r.step(Event::Loaded {
        instance: 2,
        now: t0,
    });
    assert_eq!(actions, vec![Action::SetTimers(Timers::On)]);
    assert_eq!(r.step(vote(2, false, Some(2))), (Outcome::Deliver, vec![]));
}

/// Wake vs. vote, unloaded and not woken: loaded asleep, the vote makes the follower ask its
/// leader, and waits for the answer.
#[test]
fn a_vote_for_an_unloaded_replica_asks_its_leader_once_loaded() {
    let t0 = Instant::now();
    let mut r = asleep(t0);
    unload(&mut r);
    assert_eq!(r.step(vote(1, false, Some(2))).0, Outcome::Reload);
    r.step(Event::Loaded {
        instance: 2,
        now: t0,
    });
    assert_eq!(
        r.step(vote(2, false, Some(2))),
        (Outcome::AskLeader(2), vec![])
    );
    let (out, actions) = r.step(Event::LeaderAnswered { leads: true });
    assert_eq!((out, actions), (Outcome::Refuse, vec![]));
    assert_eq!(r.state(), State::Asleep, "its leader leads: it sleeps on");
}

/// Wake vs. vote, asleep: while the follower asks its leader, an append with news wakes it;
/// the leader does not answer, and the vote goes to Raft (the wake is not counted twice).
#[test]
fn a_vote_for_a_sleeping_follower_woken_while_it_asks_goes_to_raft() {
    let t0 = Instant::now();
    let mut r = asleep(t0);
    assert_eq!(r.step(vote(1, false, Some(2))).0, Outcome::AskLeader(2));
    let req = request();
    assert!(
        !r.append_wakes(false, &req.vote, &req.committed),
        "a bare heartbeat"
    );
    assert!(r.append_wakes(true, &req.vote, &req.committed));
    let (_, actions) = r.step(Event::Wake);
    assert_eq!(actions, vec![Action::SetTimers(Timers::On), Action::Woke]);
    let (out, actions) = r.step(Event::LeaderAnswered { leads: false });
    assert_eq!((out, actions), (Outcome::Deliver, vec![]));
    assert_eq!(r.state(), State::Awake);
}

#[test]
fn a_sleeping_leader_refuses_a_vote_and_heartbeats_and_a_transfer_is_never_refused() {
    let t0 = Instant::now();
    let mut r = awake(t0);
    r.step(Event::SleepAsLeader {
        begun: 0,
        still_leading: true,
        now: t0,
    });
    let (out, actions) = r.step(vote(1, true, Some(1)));
    assert_eq!(out, Outcome::Refuse);
    assert_eq!(
        actions,
        vec![
            Action::SetTimers(Timers::On),
            Action::HeartbeatSoon,
            Action::Woke
        ]
    );
    let mut r = asleep(t0);
    let transfer = Event::Vote {
        instance: 1,
        transfer: true,
        leading: false,
        leader: Some(2),
    };
    let (out, actions) = r.step(transfer);
    assert_eq!(out, Outcome::Deliver);
    assert_eq!(actions, vec![Action::SetTimers(Timers::On), Action::Woke]);
    let (out, _) = r.step(vote(1, false, None));
    assert_eq!(out, Outcome::Deliver, "awake: Raft judges");
}
