use crate::child_process::printed;

/// Set for the child processes of [`two_runs_of_a_seed_give_the_same_trace`].
const CHILD_SEED: &str = "QQ_SIM_REPLAY_CHILD_SEED";
/// Messages each run publishes and takes back.
const MESSAGES: u32 = 600;

/// In a child process only: runs the cluster for [`CHILD_SEED`] and prints its trace.
#[test]
fn child_run() {
    if let Ok(seed) = std::env::var(CHILD_SEED) {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = super::run(seed.parse().expect("seed"), dir.path(), MESSAGES).expect("run");
        for line in run.trace {
            println!("trace: {line}");
        }
    }
}

fn child_trace(seed: u64) -> Vec<String> {
    printed("replay::tests::child_run", CHILD_SEED, seed, "trace: ")
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
    let taken = first
        .iter()
        .filter(|l| l.contains("get via node 2: b\"m") && !l.ends_with("(again)"))
        .count();
    assert_eq!(taken, MESSAGES as usize, "every message back: {first:#?}");
    let second = child_trace(21);
    assert_eq!(first, second);
    // The seed is an input: its plan of faults and openraft's random timeouts.
    assert_ne!(first, child_trace(22));
}
