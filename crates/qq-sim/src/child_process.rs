//! Tests that compare whole processes: the test binary runs one of its own tests again in a
//! child process with a seed in the environment, and reads what it printed.
//!
//! A process, because tokio counts the runtimes a process builds and mixes the count into each
//! runtime's seed: two runs of a seed compare equal as two processes that do the same things,
//! as two runs of the simulator are (`entropy`'s module doc).

/// The lines starting with `prefix` that the test `test` (its full path) printed when run alone
/// in a child process with `env` set to `seed`; the child must succeed.
pub(crate) fn printed(test: &str, env: &str, seed: u64, prefix: &str) -> Vec<String> {
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture"])
        .env(env, seed.to_string())
        .output()
        .expect("run the child");
    assert!(out.status.success(), "child failed: {out:?}");
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect()
}
