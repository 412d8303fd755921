use crate::child_process::{printed, printed_with};

/// Set for the child processes of the tests below: the seed, and (for the chaos workload) its
/// length in seconds.
const CHILD_SEED: &str = "QQ_SIM_REPLAY_CHILD_SEED";
const CHILD_CHAOS: &str = "QQ_SIM_REPLAY_CHILD_CHAOS";
/// Nodes in the child's cluster (3 when unset).
const CHILD_NODES: &str = "QQ_SIM_REPLAY_CHILD_NODES";
/// Messages each run of [`super::Program::Messages`] publishes and takes back.
const MESSAGES: u32 = 600;

/// In a child process only: runs the cluster for [`CHILD_SEED`] and prints its trace.
#[test]
fn child_run() {
    if let Ok(seed) = std::env::var(CHILD_SEED) {
        let program = match std::env::var(CHILD_CHAOS) {
            Ok(s) => super::Program::Chaos(std::time::Duration::from_secs(s.parse().expect("s"))),
            Err(_) => super::Program::Messages(MESSAGES),
        };
        let nodes = std::env::var(CHILD_NODES).map_or(3, |n| n.parse().expect("nodes"));
        let dir = tempfile::tempdir().expect("tempdir");
        let shape = super::Shape { program, nodes };
        let run = super::run(seed.parse().expect("seed"), dir.path(), shape).expect("run");
        for line in run.trace {
            println!("trace: {line}");
        }
    }
}

fn child_trace(seed: u64) -> Vec<String> {
    printed("replay::tests::child_run", CHILD_SEED, seed, "trace: ")
}

/// Every check line passed, and there were some.
fn checks_pass(trace: &[String]) {
    let checks: Vec<_> = trace.iter().filter(|l| l.contains(" check ")).collect();
    assert!(!checks.is_empty(), "no check ran: {trace:#?}");
    let failed: Vec<_> = checks.iter().filter(|l| l.contains(": FAILED")).collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn two_runs_of_a_seed_give_the_same_trace() {
    // Seed 21 crashes node 1 twice and node 2 once, mutes, delays and deafens links; before
    // the proposer's fix it never finished (a spin in which virtual time stood still).
    let first = child_trace(21);
    assert!(
        first.iter().any(|l| l.contains("strike Crash")),
        "{first:#?}"
    );
    checks_pass(&first);
    let taken = first
        .iter()
        .filter(|l| l.contains("get via node 2: b\"m") && !l.ends_with("(again)"))
        .count();
    assert_eq!(taken, MESSAGES as usize, "every message back: {first:#?}");
    let second = child_trace(21);
    assert_eq!(first, second);
    // The seed is an input: its plan of faults and openraft's random timeouts. Seed 22 on five
    // nodes (each with its plan's clock skew, as every run) passes too.
    let envs = [
        (CHILD_SEED, "22".to_string()),
        (CHILD_NODES, "5".to_string()),
    ];
    let five = printed_with("replay::tests::child_run", &envs, "trace: ");
    assert!(five[0].contains("\"nodes\":5"), "{}", five[0]);
    checks_pass(&five);
    assert_ne!(first, five);
}

/// The chaos workload (publishers, consumers that ack, reject and requeue, dead lettering,
/// topology churn, idle queues) under seed 37's eight faults (two crashes, an isolation,
/// bridges, loss, delay), with its membership change (node 4 joins, is grown onto every queue,
/// shrunk, stopped and forgotten) and its wiped disk (node 2 loses its directory after the
/// faults and is re-seeded): every check of the real-time runs passes, and a second process
/// gives the same trace, counts and replica digests included.
#[test]
fn the_chaos_workload_replays_byte_for_byte() {
    let chaos = || {
        let envs = [
            (CHILD_SEED, "37".to_string()),
            (CHILD_CHAOS, "30".to_string()),
        ];
        printed_with("replay::tests::child_run", &envs, "trace: ")
    };
    let first = chaos();
    checks_pass(&first);
    for check in [
        "check replicas agree: ok",
        "check membership change carried out: ok",
        "check wipe: node 2 lost its disk and was re-seeded as a new member: ok",
    ] {
        assert!(
            first.iter().any(|l| l.contains(check)),
            "{check}: {first:#?}"
        );
    }
    assert_eq!(first, chaos());
}
