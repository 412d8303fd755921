//! Tests that compare whole processes: the test binary runs one of its own tests again in a
//! child process with a seed in the environment, and reads what it printed.
//!
//! A process, because tokio counts the runtimes a process builds and mixes the count into each
//! runtime's seed: two runs of a seed compare equal as two processes that do the same things,
//! as two runs of the simulator are (`entropy`'s module doc).

use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

/// How long a child may run before it is taken for hung and killed: a spin inside one step of
/// a lock-step world holds virtual time still, so its own deadline never comes.
const HUNG_AFTER: Duration = Duration::from_secs(600);

/// The lines starting with `prefix` that the test `test` (its full path) printed when run alone
/// in a child process with `env` set to `seed`; the child must succeed within [`HUNG_AFTER`].
pub(crate) fn printed(test: &str, env: &str, seed: u64, prefix: &str) -> Vec<String> {
    printed_with(test, &[(env, seed.to_string())], prefix)
}

/// [`printed`] with the child's environment given as pairs.
pub(crate) fn printed_with(test: &str, envs: &[(&str, String)], prefix: &str) -> Vec<String> {
    let seed = envs.first().map_or("", |(_, v)| v.as_str());
    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture"])
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the child");
    // Read on threads, so a child that prints much never blocks on a full pipe.
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            pipe.read_to_string(&mut text).map(|_| text)
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("stdout")));
    let stderr = read(Box::new(child.stderr.take().expect("stderr")));
    // A waiting thread owns the child and reports its exit; past the bound, it is killed by
    // its pid (which stays the child's until that thread reaps it).
    let pid = child.id() as libc::pid_t;
    let (exited, exit) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = exited.send(child.wait());
    });
    let status = match exit.recv_timeout(HUNG_AFTER) {
        Ok(status) => status.expect("wait for the child"),
        Err(_) => {
            // SAFETY: a plain kill(2) of the child this test spawned and has not reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{test} (seed {seed}) still running after {HUNG_AFTER:?}: hung");
        }
    };
    let stdout = stdout.join().expect("stdout reader").expect("stdout");
    let stderr = stderr.join().expect("stderr reader").expect("stderr");
    assert!(
        status.success(),
        "child failed: {status}\n{stdout}\n{stderr}"
    );
    stdout
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect()
}
