use super::*;

#[test]
fn same_seed_same_schedule_and_every_kind_strikes() {
    let run = Duration::from_secs(300);
    let a = schedule(7, &ALL, run, 3, 4);
    let b = schedule(7, &ALL, run, 3, 4);
    assert_eq!(a, b);
    assert_ne!(a, schedule(8, &ALL, run, 3, 4));
    for kind in ALL {
        assert!(a.iter().any(|p| p.kind == kind), "{kind} never scheduled");
    }
    for w in a.windows(2) {
        assert!(w[0].at + w[0].length < w[1].at, "faults overlap: {w:?}");
    }
    let last = a.last().unwrap();
    assert!(last.at + last.length <= run);
}

#[test]
fn rolling_restart_gets_its_window_and_a_quiet_gap() {
    let run = Duration::from_secs(90);
    let alone = schedule(7, &[Kind::RollingRestart], run, 3, 4);
    assert!(!alone.is_empty());
    assert!(
        alone.iter().all(|p| p.length == ROLLING_RESTART_WINDOW),
        "{alone:?}"
    );
    for w in alone.windows(2) {
        assert!(
            w[0].at + w[0].length + MIN_GAP <= w[1].at,
            "too close: {w:?}"
        );
    }
    let both = schedule(7, &[Kind::RollingRestart, Kind::KillLeader], run, 3, 4);
    assert!(
        both.iter().any(|p| p.kind == Kind::RollingRestart),
        "{both:?}"
    );
    for w in both.windows(2) {
        assert!(
            w[0].at + w[0].length + MIN_GAP <= w[1].at,
            "too close: {w:?}"
        );
    }
    for p in both.iter().filter(|p| p.kind != Kind::RollingRestart) {
        assert!(p.length <= Duration::from_secs(12), "{p:?}");
    }
}

#[test]
fn restart_order_visits_every_node_once() {
    assert_eq!(restart_order(1, 3), vec![1, 2, 3]);
    assert_eq!(restart_order(2, 3), vec![2, 3, 1]);
    assert_eq!(restart_order(3, 3), vec![3, 1, 2]);
}

#[test]
fn names_round_trip() {
    for kind in ALL {
        assert_eq!(kind.name().parse::<Kind>(), Ok(kind));
    }
    assert_eq!(parse_kinds("all").unwrap().len(), ALL.len());
    // netem removed on a kernel without it can leave nothing: a run without faults.
    assert!(schedule(1, &[], Duration::from_secs(300), 3, 4).is_empty());
    assert!(parse_kinds("partition-halves,nope").is_err());
}

/// The named scenarios (`make test` runs three) schedule every nemesis they name: none of
/// them reports SKIPPED or PARTIAL for want of room in its schedule.
#[test]
fn every_named_scenario_schedules_each_of_its_nemeses() {
    for (name, seed, secs, nemesis, _, _) in crate::args::SCENARIOS {
        let kinds = parse_kinds(nemesis).unwrap();
        let plan = schedule(*seed, &kinds, Duration::from_secs(*secs), 3, 4);
        for kind in kinds {
            assert!(
                plan.iter().any(|p| p.kind == kind),
                "scenario {name}: {kind} never scheduled"
            );
        }
    }
}
