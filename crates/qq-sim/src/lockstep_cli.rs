//! `qq-sim --lockstep`: seeds of the lock-step replay ([`crate::replay`]), each in a process of
//! its own, so that the command a seed prints replays it byte for byte.
//!
//! With one `--seed`, this process runs it: the trace goes to `<out>/lockstep-<seed>/trace.txt`
//! and a line says what happened; a passing seed's node directories are deleted, a failing
//! seed's kept beside its trace. With several, this process runs each as `qq-sim --lockstep
//! --seed S` and reports seeds per second, faults per seed and the failed seeds, each with the
//! command that replays it. `--check-replay` runs one seed twice that way and compares the
//! two traces.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::replay::Program;

/// What `qq-sim --lockstep` was asked.
pub struct Args {
    pub seeds: Vec<u64>,
    /// `--seed` (run it here) rather than a list (a process each).
    pub one: bool,
    pub messages: u32,
    /// Run qq-chaos's workload for this many seconds instead of `messages`.
    pub chaos: Option<u64>,
    pub check_replay: bool,
    pub out: PathBuf,
    /// Nodes in the cluster (3 to 5).
    pub nodes: u64,
    /// Keep a passing seed's node directories and log too.
    pub keep: bool,
}

/// Ok(false) when a seed failed (or two runs differed).
pub fn main(args: &Args) -> anyhow::Result<bool> {
    match (args.one, args.check_replay) {
        (true, false) => run_here(args.seeds[0], args),
        (true, true) => check_replay(args.seeds[0], args),
        (false, _) => run_each(args),
    }
}

fn seed_dir(out: &Path, seed: u64) -> PathBuf {
    out.join(format!("lockstep-{seed}"))
}

/// The workload and shape flags of a command line: `--chaos S` or `--messages N`, and
/// `--nodes N`.
fn workload_flag(args: &Args) -> Vec<String> {
    let workload = match args.chaos {
        Some(s) => ["--chaos".to_string(), s.to_string()],
        None => ["--messages".to_string(), args.messages.to_string()],
    };
    let nodes = ["--nodes".to_string(), args.nodes.to_string()];
    let keep = args.keep.then(|| "--keep".to_string());
    workload.into_iter().chain(nodes).chain(keep).collect()
}

/// The command that runs `seed` again, trace and all.
fn command(seed: u64, args: &Args) -> String {
    format!(
        "qq-sim --lockstep --seed {seed} {} --out {}",
        workload_flag(args).join(" "),
        args.out.display()
    )
}

/// Runs `seed` in this process; writes its trace and prints its line.
fn run_here(seed: u64, args: &Args) -> anyhow::Result<bool> {
    let dir = seed_dir(&args.out, seed);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clear {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let started = Instant::now();
    let program = match args.chaos {
        Some(s) => Program::Chaos(Duration::from_secs(s)),
        None => Program::Messages(args.messages),
    };
    let shape = crate::replay::Shape {
        program,
        nodes: args.nodes,
    };
    let run = crate::replay::run(seed, &dir, shape)?;
    let trace = dir.join("trace.txt");
    std::fs::write(&trace, run.trace.join("\n") + "\n")?;
    let ok = run.ok();
    let what = match program {
        Program::Messages(n) => format!(
            "{} of {n} messages back ({} taken twice)",
            run.taken, run.taken_again
        ),
        Program::Chaos(_) => "the chaos workload's checks".into(),
    };
    println!(
        "seed {seed}: {} in {:.0} s: {} faults, {what}, trace {}",
        if ok { "PASS" } else { "FAIL" },
        started.elapsed().as_secs_f64(),
        run.faults,
        trace.display()
    );
    if !run.done {
        println!("  FAILED: the client did not finish within the virtual deadline");
    }
    for line in &run.failed {
        println!("  {}", line.trim_start());
    }
    if ok && !args.keep {
        // The nodes' directories (about 200 MB a seed) go; the trace stays. A failing seed
        // keeps everything.
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path != trace {
                let removed = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                removed.with_context(|| format!("remove {}", path.display()))?;
            }
        }
    }
    if !ok {
        println!(
            "  replay: {} (node logs in {})",
            command(seed, args),
            dir.display()
        );
    }
    Ok(ok)
}

/// Runs `seed` as a child `qq-sim --lockstep --seed`; its exit and the line it printed.
fn child(seed: u64, args: &Args, out: &Path) -> anyhow::Result<(bool, String)> {
    let output = Command::new(std::env::current_exe()?)
        .args(["--lockstep", "--seed", &seed.to_string()])
        .args(workload_flag(args))
        .arg("--out")
        .arg(out)
        .output()
        .context("run qq-sim --lockstep --seed")?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.code() == Some(2) || output.status.code().is_none() {
        anyhow::bail!(
            "seed {seed}: {}\n{stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok((output.status.success(), stdout))
}

/// Every seed in a process of its own; a summary line at the end.
fn run_each(args: &Args) -> anyhow::Result<bool> {
    let started = Instant::now();
    let (mut failed, mut faults) = (Vec::new(), 0usize);
    for seed in &args.seeds {
        let (ok, stdout) = child(*seed, args, &args.out)?;
        print!("{stdout}");
        faults += stdout
            .split(" faults,")
            .next()
            .and_then(|head| head.rsplit(' ').next())
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        if !ok {
            failed.push(*seed);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let n = args.seeds.len();
    println!(
        "{n} seeds in {secs:.0} s ({:.3} seeds/s), {:.1} faults per seed; failed: {failed:?}",
        n as f64 / secs,
        faults as f64 / n.max(1) as f64,
    );
    Ok(failed.is_empty())
}

/// Runs `seed` twice, each in a process of its own, and compares the traces.
fn check_replay(seed: u64, args: &Args) -> anyhow::Result<bool> {
    let mut traces = Vec::new();
    for run in ["first", "second"] {
        let out = args.out.join(format!("replay-{run}"));
        let (ok, stdout) = child(seed, args, &out)?;
        print!("{run} run: {stdout}");
        if !ok {
            return Ok(false);
        }
        let trace = seed_dir(&out, seed).join("trace.txt");
        traces.push(std::fs::read(&trace).with_context(|| format!("read {}", trace.display()))?);
    }
    let same = traces[0] == traces[1];
    println!(
        "seed {seed}: the two traces are {} ({} bytes)",
        if same { "the same" } else { "DIFFERENT" },
        traces[0].len()
    );
    Ok(same)
}
