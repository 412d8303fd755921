//! qq-sim: runs seeds of the cluster simulator and reports each.
//!
//! ```text
//! qq-sim --seed 7                    # one seed
//! qq-sim --seeds 20 --first-seed 100 # seeds 100..119
//! qq-sim --seed-list 3,11,19         # the regression seeds (make test)
//! qq-sim --lockstep --seeds 20       # on one schedule: each seed replays byte for byte
//! qq-sim --lockstep --seed 21 --check-replay   # run it twice, compare the traces
//! qq-sim --lockstep --seed 21 --chaos 30       # the chaos workload on one schedule
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use qq_chaos::workload::Protocol;
use qq_sim::run::{self, Setup};

#[derive(Parser, Debug)]
#[command(about = "quorumq nodes in one process under a seeded plan of faults, checked")]
struct Args {
    /// Run this one seed.
    #[arg(long, conflicts_with_all = ["seeds", "seed_list"])]
    seed: Option<u64>,
    /// Run this many seeds, from --first-seed.
    #[arg(long)]
    seeds: Option<u64>,
    /// The first of --seeds (default: from the time).
    #[arg(long)]
    first_seed: Option<u64>,
    /// Run these seeds, comma separated.
    #[arg(long, value_delimiter = ',')]
    seed_list: Vec<u64>,
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Seconds of workload under faults, per seed.
    #[arg(long, default_value_t = 30)]
    duration: u64,
    /// Publish rate over all publishers, messages per second.
    #[arg(long, default_value_t = 150.0)]
    rate: f64,
    /// What the workload's publishers and consumers speak: grpc, or amqp (lapin clients that
    /// reconnect and republish, as RabbitMQ's do).
    #[arg(long, value_enum, default_value = "grpc")]
    protocol: Protocol,
    /// Print each seed's plan (the trace's first line) and run nothing.
    #[arg(long)]
    plan_only: bool,
    /// Where each seed's trace, report and (on failure) node logs go.
    #[arg(long, default_value = ".qq-sim")]
    out: PathBuf,
    /// Run on one schedule (docs/simulation.md, "One schedule"): every node on one thread and
    /// one virtual clock, so a seed's run replays byte for byte; a narrower workload
    /// (--messages through one queue) under the seed's plan of faults, over gRPC.
    #[arg(long, conflicts_with_all = ["protocol", "plan_only"])]
    lockstep: bool,
    /// --lockstep: messages published (one every 50 ms: the run and its plan last that long).
    #[arg(long, default_value_t = 600, requires = "lockstep")]
    messages: u32,
    /// --lockstep: run qq-chaos's workload (and the topology churn) for this many seconds
    /// instead of --messages, with its checks.
    #[arg(long, requires = "lockstep")]
    chaos: Option<u64>,
    /// --lockstep --seed: run the seed twice, each in a process of its own, and compare the
    /// traces byte for byte.
    #[arg(long, requires_all = ["lockstep", "seed"])]
    check_replay: bool,
    /// --lockstep: keep a passing seed's node directories and log (a failing seed's are kept
    /// anyway).
    #[arg(long, requires = "lockstep")]
    keep: bool,
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // lapin logs every connection the faults break at ERROR; the report counts them.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,lapin=off"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let args = Args::parse();
    if args.lockstep {
        match qq_sim::lockstep_cli::main(&args.lockstep_args()) {
            Ok(true) => return,
            Ok(false) => std::process::exit(1),
            Err(e) => {
                eprintln!("qq-sim: {e:#}");
                std::process::exit(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("the runner's runtime");
    match runtime.block_on(seeds(args)) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("qq-sim: {e:#}");
            std::process::exit(2);
        }
    }
}

impl Args {
    /// The seeds asked for: --seed, --seed-list, or --seeds from --first-seed (default: the
    /// time).
    fn seed_list(&self) -> Vec<u64> {
        if let Some(s) = self.seed {
            vec![s]
        } else if !self.seed_list.is_empty() {
            self.seed_list.clone()
        } else {
            let first = self.first_seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0)
            });
            (first..first + self.seeds.unwrap_or(1)).collect()
        }
    }

    fn lockstep_args(&self) -> qq_sim::lockstep_cli::Args {
        qq_sim::lockstep_cli::Args {
            seeds: self.seed_list(),
            one: self.seed.is_some(),
            messages: self.messages,
            chaos: self.chaos,
            check_replay: self.check_replay,
            out: self.out.clone(),
            nodes: self.nodes,
            keep: self.keep,
        }
    }
}

/// Runs every seed asked for; Ok(false) when one failed its checks.
async fn seeds(args: Args) -> anyhow::Result<bool> {
    anyhow::ensure!((3..=5).contains(&args.nodes), "--nodes: 3 to 5");
    anyhow::ensure!(args.rate > 0.0, "--rate must be positive");
    let list = args.seed_list();
    let setup_of = |seed: u64| Setup {
        seed,
        nodes: args.nodes,
        duration: Duration::from_secs(args.duration),
        rate: args.rate,
        protocol: args.protocol,
        out: args.out.clone(),
    };
    if args.plan_only {
        for seed in &list {
            println!("{}", serde_json::to_string(&setup_of(*seed).plan())?);
        }
        return Ok(true);
    }
    let started = Instant::now();
    let (mut failed, mut faults) = (Vec::new(), 0);
    for seed in &list {
        println!(
            "seed {seed}: {} nodes, {} s of faults",
            args.nodes, args.duration
        );
        let setup = setup_of(*seed);
        let o = run::run(&setup).await?;
        faults += o.faults;
        print_outcome(&o, &args, &setup.dir());
        if !o.ok {
            failed.push(*seed);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{} seeds in {secs:.0} s ({:.3} seeds/s), {:.1} faults per seed; failed: {:?}",
        list.len(),
        list.len() as f64 / secs,
        faults as f64 / list.len().max(1) as f64,
        failed
    );
    Ok(failed.is_empty())
}

/// One seed's line, its failed checks, and on failure the command that replays it.
fn print_outcome(o: &run::Outcome, args: &Args, dir: &std::path::Path) {
    let c = &o.verdict.counts;
    println!(
        "seed {}: {} in {:.0} s: {} faults, {} confirmed, {} lost, {} unexpected, \
         {} dead-lettered; network: {} chunks delayed, {} lost, {} connections cut, {} dials refused",
        o.seed,
        if o.ok { "PASS" } else { "FAIL" },
        o.seconds,
        o.faults,
        c.confirmed,
        c.lost,
        c.unexpected,
        c.dead_lettered,
        o.net.delayed_chunks,
        o.net.lost_chunks,
        o.net.cut_connections,
        o.net.refused_dials,
    );
    for check in o.verdict.checks.iter().filter(|c| !c.ok) {
        println!("  FAILED {}: {}", check.name, check.detail);
    }
    if !o.ok {
        println!(
            "  replay: qq-sim --seed {} --protocol {} --nodes {} --duration {} --rate {} \
             (trace and node logs in {})",
            o.seed,
            args.protocol.name(),
            args.nodes,
            args.duration,
            args.rate,
            dir.display()
        );
    }
}
