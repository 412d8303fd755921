//! # qq-bench: quorumq and RabbitMQ quorum queues, side by side
//!
//! `make bench` builds the release binaries and runs this. It starts two three-node clusters
//! on this machine — quorumq (`qq-node` on 127.0.0.1:7501-7503, spoken to over gRPC with
//! `qq-client`) and RabbitMQ (Debian's rabbitmq-server, `bench/rabbitmq.sh`, AMQP 0-9-1 on
//! 127.0.0.1:5681-5683 with lapin) — and runs the seven scenarios of issue 5 against both (and
//! scenario 8, memory under pressure, against quorumq; scenario 9, idle CPU with a million
//! delayed messages, against quorumq when named; scenario 10, the rate of moving a backlog to
//! another node's queue, a move task against RabbitMQ's shovel; scenario 11, catch-up at scale:
//! a follower stopped or wiped while a million-message backlog builds comes back under load,
//! against both when named; scenario 12, many queues: declare rate, idle CPU and RSS, failover
//! and restart with 1 000 and 10 000 queues, against both when named; scenario 13, priority
//! queues: a backlog of mixed priorities drained in priority order, against both when named),
//! alternating which system goes first. Scenarios 1-4 and 13 also run a third time, against
//! the same quorumq cluster over its AMQP port (127.0.0.1:7801-7803) with lapin, the client
//! RabbitMQ is driven with: the "quorumq/AMQP" column, so the protocol's cost shows beside the
//! gRPC figure (`--no-amqp` leaves it out). It prints one table (each figure for both systems and
//! their ratio, with the targets), and writes a JSON record, a Markdown summary and a
//! PNG of latency percentiles to `bench/results/`.
//!
//! Same durability on both sides: quorum queues with three replicas, publisher confirms that
//! arrive only once a majority has fsynced (quorumq's group-commit fsync; RabbitMQ's Ra WAL),
//! manual consumer acknowledgements, persistent messages (except scenario 13, where RabbitMQ
//! 3.10 has no quorum queue with priorities and gets a classic queue: the notes say so).
//!
//! Layout: [`cluster`] starts, kills and measures the server processes; [`driver`] is one
//! client interface over both brokers; [`load`] holds the publisher and consumer loops;
//! [`scenarios`] the seven scenarios; [`memory`] scenario 8; [`delayed`] scenario 9; [`moves`] scenario 10; [`catchup`] scenario 11; [`scale`] scenario 12 ([`erl_loop`] reads RabbitMQ's
//! state from inside a node); [`priority`] scenario 13 (RabbitMQ's side a classic queue: its
//! quorum queues refuse priorities); [`profile`] samples the quorumq leader with perf;
//! [`report`] the table, files and plot.
//!
//! Deliberately left out: anything that would favour one side. Both clients run in this one
//! process on the same two cores as the six servers; clients connect to the node that leads
//! their queue (except in failover, which publishes through a surviving node on purpose).

mod catchup;
mod cluster;
mod delayed;
mod disk_probe;
mod driver;
mod erl_loop;
mod load;
mod memory;
mod moves;
mod priority;
mod profile;
mod quick;
mod report;
mod scale;
mod scenarios;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use serde::Serialize;

use crate::cluster::{Cluster, QqCluster, RabbitCluster};
use crate::scenarios::{Outcome, Settings};

/// jemalloc, as the node: the client shares the two vCPUs with the brokers it drives. With
/// glibc's malloc, malloc and free took about 3 % of the machine's CPU in the client's threads
/// during an AMQP run; jemalloc's own code takes about 2 points in their place
/// (docs/benchmarks.md, "The allocator's trim threshold, the client's allocator, and an AMQP
/// channel's commit batch"). Both brokers get the same client.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The systems under test, as the scenarios see them: quorumq over gRPC, quorumq over its
/// AMQP port (the same cluster, driven by lapin as RabbitMQ is), and RabbitMQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum System {
    Quorumq,
    QuorumqAmqp,
    Rabbitmq,
}

impl std::fmt::Display for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            System::Quorumq => "quorumq",
            System::QuorumqAmqp => "quorumq/AMQP",
            System::Rabbitmq => "RabbitMQ",
        })
    }
}

/// Benchmarks quorumq against RabbitMQ quorum queues (issue 5's seven scenarios).
#[derive(Parser, Debug)]
#[command(name = "qq-bench")]
struct Args {
    /// Short durations and a 20 000-message backlog: a smoke run of a few minutes.
    #[arg(long)]
    quick: bool,
    /// Scenarios to run, e.g. `1,2` (1 throughput, 2 latency, 3 many queues, 4 dead-letter
    /// rate, 5 failover, 6 backlog memory, 7 restart recovery, 8 memory under pressure:
    /// quorumq only, 9 idle CPU with delayed messages: quorumq only, not run unless named,
    /// 10 move rate: a move task against a shovel, 11 catch-up at scale: a stopped and a
    /// wiped follower catch up with a 1 000 000-message backlog, not run unless named,
    /// 12 many queues: declare rate, idle CPU and RSS, failover and restart with
    /// --scale-queues queues, not run unless named, 13 priority queues: a backlog of priorities
    /// 0-10 drained by one consumer, publish and drain rates and out-of-order deliveries, not
    /// run unless named).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,6,7,8,10")]
    scenarios: Vec<u8>,
    /// Run only one side: `quorumq` or `rabbitmq`.
    #[arg(long)]
    only: Option<String>,
    /// Leave out the AMQP side of quorumq (scenarios 1-4 and 13 over its AMQP port with lapin).
    #[arg(long)]
    no_amqp: bool,
    /// qq-node binary (default: $CARGO_TARGET_DIR/release/qq-node).
    #[arg(long)]
    qq_node_bin: Option<PathBuf>,
    /// Script that manages the RabbitMQ nodes.
    #[arg(long, default_value = "bench/rabbitmq.sh")]
    rabbit_script: PathBuf,
    /// Data and logs of both clusters (wiped at start).
    #[arg(long, default_value = "/tmp/qq-bench-run")]
    run_dir: PathBuf,
    /// Where results.json, results.md and latency.png go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Messages in the backlog of scenarios 6 and 7.
    #[arg(long)]
    backlog: Option<u64>,
    /// Delayed messages of scenario 9 (default 1 000 000; --quick 20 000).
    #[arg(long)]
    delayed: Option<u64>,
    /// Messages moved in scenario 10 (default 100 000; --quick 20 000).
    #[arg(long)]
    move_messages: Option<u64>,
    /// Scenario 11: messages in the backlog (default 1 000 000; --quick 20 000).
    #[arg(long)]
    catchup_backlog: Option<u64>,
    /// Scenario 11: the steady publish rate, msg/s, kept up while the follower is down and
    /// catches up (default 2000).
    #[arg(long)]
    catchup_rate: Option<f64>,
    /// Scenario 13: messages in the priority backlog (default 50 000; --quick 10 000).
    #[arg(long)]
    priority_messages: Option<u64>,
    /// Scenario 13: the consumer's prefetch (default 100).
    #[arg(long)]
    priority_prefetch: Option<u16>,
    /// Scenario 3: the number of queues, each with a publisher and a consumer (default 100).
    #[arg(long)]
    many_queues: Option<usize>,
    /// Scenario 12: the queue counts, e.g. `1000,10000` (default; --quick `50,200`). The
    /// smallest is declared one after another and failed over; the largest is declared with
    /// --scale-in-flight declares in flight, measured idle and restarted.
    #[arg(long, value_delimiter = ',')]
    scale_queues: Option<Vec<usize>>,
    /// Scenario 12: declares in flight when pipelined (default 64).
    #[arg(long)]
    scale_in_flight: Option<usize>,
    /// Scenario 12: seconds each declare, delete and restart phase may take before it is
    /// reported as not reached (default 600; --quick 120).
    #[arg(long)]
    scale_deadline: Option<u64>,
    /// Seconds of measurement in scenario 1.
    #[arg(long)]
    throughput_secs: Option<f64>,
    /// Fixed rate of scenario 2 (default: half the lower scenario 1 rate).
    #[arg(long)]
    latency_rate: Option<f64>,
    /// Skip the perf profile of the quorumq leader at the end.
    #[arg(long)]
    no_profile: bool,
    /// A line for every quorumq node's config, e.g. `--qq-set election_timeout_min_ms=400`
    /// (repeatable; the table's numbers use the defaults of cluster/node1.toml, but one
    /// worker thread per node: `worker_threads = 1` unless this sets it).
    #[arg(long = "qq-set", value_name = "KEY=VALUE")]
    qq_set: Vec<String>,
    /// Leave both clusters running at the end.
    #[arg(long)]
    keep: bool,
    /// The quick check before merging a hot-path change (`make bench-quick`): quorumq alone,
    /// scenarios 1 and 2 (at --latency-rate, default 4000 msg/s) --runs times, medians compared
    /// with --baseline.
    #[arg(long)]
    quick_check: bool,
    /// Quick check: how many times each scenario runs.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Quick check: the baseline file (measured on this machine; see --save-baseline).
    #[arg(long, default_value = "bench/results/quick-baseline.json")]
    baseline: PathBuf,
    /// Quick check: store this run as the baseline.
    #[arg(long)]
    save_baseline: bool,
}

fn now_utc() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let mut settings = if args.quick {
        Settings::quick()
    } else {
        Settings::full()
    };
    if let Some(n) = args.backlog {
        settings.backlog_messages = n;
    }
    if let Some(n) = args.delayed {
        settings.delayed_messages = n;
    }
    if let Some(n) = args.move_messages {
        settings.move_messages = n;
    }
    if let Some(n) = args.catchup_backlog {
        settings.catchup_backlog = n;
    }
    if let Some(r) = args.catchup_rate {
        settings.catchup_rate = r;
    }
    if let Some(n) = args.many_queues {
        settings.many_queues = n;
    }
    if let Some(v) = &args.scale_queues {
        settings.scale_queues = v.clone();
    }
    if let Some(n) = args.scale_in_flight {
        settings.scale_in_flight = n;
    }
    if let Some(secs) = args.scale_deadline {
        settings.scale_deadline = Duration::from_secs(secs);
    }
    if let Some(s) = args.throughput_secs {
        settings.throughput_s = s;
    }
    settings.latency_rate = args.latency_rate;
    let mut priority_settings = if args.quick {
        priority::PrioritySettings::quick()
    } else {
        priority::PrioritySettings::full()
    };
    if let Some(n) = args.priority_messages {
        priority_settings.messages = n;
    }
    if let Some(n) = args.priority_prefetch {
        priority_settings.prefetch = n;
    }
    let mut wanted: Vec<u8> = args
        .scenarios
        .iter()
        .copied()
        .filter(|n| (1..=13).contains(n))
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    let systems: Vec<System> = match args.only.as_deref().map(str::to_ascii_lowercase) {
        _ if args.quick_check => vec![System::Quorumq],
        None => vec![System::Quorumq, System::Rabbitmq],
        Some(s) if s.starts_with("q") => vec![System::Quorumq],
        Some(_) => vec![System::Rabbitmq],
    };
    let started = now_utc();
    let bin = args.qq_node_bin.clone().unwrap_or_else(|| {
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| {
            format!(
                "{}/.cache/quorumq/target",
                std::env::var("HOME").unwrap_or_default()
            )
        });
        PathBuf::from(target).join("release/qq-node")
    });
    std::fs::create_dir_all(&args.run_dir)?;

    let mut clusters: Vec<Cluster> = Vec::new();
    for system in &systems {
        let t = Instant::now();
        eprintln!("starting the {system} cluster...");
        let mut c = match system {
            System::Quorumq | System::QuorumqAmqp => {
                let extra: Vec<String> = args
                    .qq_set
                    .iter()
                    .map(|kv| match kv.split_once('=') {
                        Some((k, v)) => format!("{} = {}", k.trim(), v.trim()),
                        None => kv.clone(),
                    })
                    .collect();
                Cluster::Qq(QqCluster::start(&bin, &args.run_dir, &extra)?)
            }
            System::Rabbitmq => {
                Cluster::Rabbit(RabbitCluster::start(&args.rabbit_script, &args.run_dir)?)
            }
        };
        c.ensure_up(Duration::from_secs(120)).await?;
        eprintln!("{system} cluster up in {:.1} s", t.elapsed().as_secs_f64());
        clusters.push(c);
    }

    if args.quick_check {
        let result = quick_check(&args, &mut clusters[0], &settings, started).await;
        for c in &mut clusters {
            c.shutdown();
        }
        return result;
    }
    let run = run_all(
        &mut clusters,
        &settings,
        &priority_settings,
        &wanted,
        !args.no_amqp,
    );
    let (outcomes, errors) = tokio::select! {
        r = run => r,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("interrupted: stopping the clusters");
            for c in &mut clusters { c.shutdown(); }
            std::process::exit(130);
        }
    };

    let profile = if !args.no_profile
        && let Some(qq) = clusters.iter_mut().find(|c| c.system() == System::Quorumq)
    {
        match profile::profile_leader(qq, &settings).await {
            Ok(p) => Some(p),
            Err(e) => Some(format!("profile not taken: {e:#}")),
        }
    } else {
        None
    };

    let rows = report::rows(&outcomes);
    let report = report::Report {
        started,
        settings: settings.clone(),
        scenarios: wanted.clone(),
        rows,
        outcomes,
        errors,
        profile,
    };
    println!();
    println!("{}", report::text_table(&report.rows));
    for v in report::verdicts(&report.rows) {
        println!("{v}");
    }
    for e in &report.errors {
        println!("error: {e}");
    }
    for (system, outcomes) in &report.outcomes {
        for (n, o) in outcomes {
            for note in &o.notes {
                println!("note: {system}, scenario {n}: {note}");
            }
        }
    }
    if let Some(p) = &report.profile {
        println!("\nprofile of the quorumq leader under scenario 1 load (perf, top symbols):\n{p}");
    }
    std::fs::create_dir_all(&args.out)?;
    let json = args.out.join("results.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("write {}", json.display()))?;
    let md = args.out.join("results.md");
    std::fs::write(&md, report::markdown(&report))
        .with_context(|| format!("write {}", md.display()))?;
    let png = args.out.join("latency.png");
    if let Err(e) = report::plot(&report, &png) {
        eprintln!("plot not written: {e:#}");
    }
    println!(
        "\nwritten: {}, {}, {}",
        json.display(),
        md.display(),
        png.display()
    );
    if args.keep {
        // Leave the servers running: forget the handles without stopping them.
        for c in clusters {
            std::mem::forget(c);
        }
        eprintln!("clusters left running (--keep)");
    } else {
        for c in &mut clusters {
            c.shutdown();
        }
    }
    Ok(())
}

/// `--quick-check`: measures, prints the table against the baseline, writes
/// `<out>/quick.json` (and the baseline with `--save-baseline`).
async fn quick_check(
    args: &Args,
    cl: &mut Cluster,
    settings: &Settings,
    started: String,
) -> Result<()> {
    let rate = settings.latency_rate.unwrap_or(4000.0);
    let baseline = quick::read(&args.baseline)?;
    let now = quick::measure(cl, settings, args.runs.max(1), rate, started).await?;
    println!("\n{}", quick::table(&now, baseline.as_ref()));
    quick::write(&args.out.join("quick.json"), &now)?;
    if args.save_baseline {
        quick::write(&args.baseline, &now)?;
        println!("baseline written: {}", args.baseline.display());
    } else if baseline.is_none() {
        println!(
            "no baseline at {}: run with --save-baseline (make bench-quick-baseline) first",
            args.baseline.display()
        );
    }
    Ok(())
}

type Outcomes = BTreeMap<String, BTreeMap<u8, Outcome>>;

/// Scenarios also run over quorumq's AMQP port (with lapin, the client RabbitMQ gets), so the
/// protocol's cost shows beside the gRPC figure.
const AMQP_SCENARIOS: [u8; 5] = [1, 2, 3, 4, 13];

/// Who runs scenario `n`, as (cluster index, system): every cluster, and the quorumq cluster a
/// second time over AMQP for [`AMQP_SCENARIOS`] (unless `amqp` is off); the order alternates
/// from one scenario to the next, so neither side always goes first.
fn sides(clusters: &[Cluster], n: u8, i: usize, amqp: bool) -> Vec<(usize, System)> {
    let mut sides = Vec::new();
    for (idx, cl) in clusters.iter().enumerate() {
        match cl {
            Cluster::Qq(_) => {
                sides.push((idx, System::Quorumq));
                if amqp && AMQP_SCENARIOS.contains(&n) {
                    sides.push((idx, System::QuorumqAmqp));
                }
            }
            Cluster::Rabbit(_) => sides.push((idx, System::Rabbitmq)),
        }
    }
    if i % 2 == 1 {
        sides.reverse();
    }
    sides
}

/// Scenario 2's fixed rate: the one given, else half the lower scenario 1 rate of quorumq over
/// gRPC and RabbitMQ (the AMQP side is left out, so the rate stays comparable across runs).
fn latency_rate(settings: &Settings, outcomes: &Outcomes) -> f64 {
    settings.latency_rate.unwrap_or_else(|| {
        let rates: Vec<f64> = [System::Quorumq, System::Rabbitmq]
            .iter()
            .filter_map(|s| outcomes.get(&s.to_string()))
            .filter_map(|o| o.get(&1).and_then(|o| o.value("delivered+acked")))
            .collect();
        if rates.is_empty() {
            5000.0
        } else {
            rates.iter().copied().fold(f64::MAX, f64::min) / 2.0
        }
    })
}

/// Runs scenario `n` on one cluster.
async fn run_one(
    cl: &mut Cluster,
    settings: &Settings,
    priority_settings: &priority::PrioritySettings,
    wanted: &[u8],
    n: u8,
    rate: f64,
) -> Result<Outcome> {
    match n {
        1 => scenarios::throughput(cl, settings).await,
        2 => scenarios::latency(cl, settings, rate).await,
        3 => scenarios::many_queues(cl, settings).await,
        4 => scenarios::dead_letter(cl, settings).await,
        5 => scenarios::failover(cl, settings).await,
        8 => memory::memory_bounds(cl, settings).await,
        9 => delayed::delayed_idle_cpu(cl, settings).await,
        10 => moves::move_rate(cl, settings).await,
        11 => catchup::catch_up(cl, settings).await,
        12 => scale::many_idle_queues(cl, settings).await,
        13 => priority::priority_order(cl, settings, priority_settings).await,
        _ => scenarios::backlog(cl, settings, wanted.contains(&6), wanted.contains(&7)).await,
    }
}

/// Runs every wanted scenario on every side (see [`sides`]).
async fn run_all(
    clusters: &mut [Cluster],
    settings: &Settings,
    priority_settings: &priority::PrioritySettings,
    wanted: &[u8],
    amqp: bool,
) -> (Outcomes, Vec<String>) {
    let mut outcomes: Outcomes = BTreeMap::new();
    let mut errors = Vec::new();
    let mut backlog_done = false;
    for (i, &n) in wanted.iter().enumerate() {
        if (n == 6 || n == 7) && backlog_done {
            continue;
        }
        let rate = latency_rate(settings, &outcomes);
        for (idx, system) in sides(clusters, n, i, amqp) {
            let cl = &mut clusters[idx];
            cl.drive_over(system);
            eprintln!(
                "--- scenario {n} ({}) on {system}",
                report::scenario_name(n)
            );
            if let Err(e) = cl.ensure_up(Duration::from_secs(180)).await {
                errors.push(format!("{system}, scenario {n}: cluster not up: {e:#}"));
                cl.drive_over(System::Quorumq);
                continue;
            }
            let t = Instant::now();
            let result = run_one(cl, settings, priority_settings, wanted, n, rate).await;
            cl.drive_over(System::Quorumq);
            match result {
                Ok(o) => {
                    for f in &o.figures {
                        eprintln!(
                            "  {system} {} {}: {} {}",
                            f.scenario,
                            f.name,
                            f.value.map_or("n/a".into(), |v| format!("{v:.2}")),
                            f.unit
                        );
                    }
                    for note in &o.notes {
                        eprintln!("  note: {note}");
                    }
                    outcomes.entry(system.to_string()).or_default().insert(n, o);
                }
                Err(e) => {
                    eprintln!("  {system} scenario {n} failed: {e:#}");
                    errors.push(format!("{system}, scenario {n}: {e:#}"));
                }
            }
            eprintln!("  ({:.0} s)", t.elapsed().as_secs_f64());
        }
        if n == 6 || n == 7 {
            backlog_done = true;
        }
    }
    (outcomes, errors)
}
