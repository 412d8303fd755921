//! # qq-chaos: quorumq under network partitions, crashes and pauses
//!
//! Starts a three-node cluster in network namespaces (`cluster/netns.sh`), runs a workload of
//! publishers and consumers on every node through the public gRPC API (or AMQP 0-9-1 with
//! `--protocol amqp`), lets a seeded nemesis
//! cut, kill, pause and restart nodes or change the cluster's membership, then heals
//! everything, drains every queue and checks the history: nothing confirmed lost, nothing
//! unexpected, dead letters where and as the spec says, nothing held, every replica in the same
//! state. Writes `report.json`, `history.json` and
//! `timeline.png` into the output directory. Exits 0 on PASS, 1 when a check fails (FAIL), 2
//! when the run could not be carried out, 3 when nothing failed but a nemesis asked for
//! injected no fault (SKIPPED or PARTIAL: module `outcome`).
//!
//! ```text
//! sudo qq-chaos --seed 7 --duration 180 --nemesis partition-halves,kill-leader
//! sudo qq-chaos --scenario short          # the run `make test` does
//! sudo qq-chaos --matrix --nemesis partition-halves,kill-leader --protocol amqp
//! ```

mod args;
mod hosts;
mod nemesis;
mod outcome;
mod report;

use qq_chaos::{checker, idle, membership, probes, replicas, workload};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use qq_client::Client;
use tokio::time::sleep;

use args::{Args, SCENARIOS};
use checker::Check;
use hosts::Hosts;
use nemesis::Kind;
use outcome::Outcome;
use probes::{current_leader, replica_agreement, retry, term_inflation, wait_formed};
use qq_chaos::session::Session;
use report::{Report, Window};
use workload::Protocol;

/// Publishes in flight per publisher and queue. Large enough that publishes stuck on a cut-off
/// node (until the client's 5 s timeout) do not stop new ones from reaching the new leader:
/// the confirm gaps then measure the cluster's failover, not the client's window.
const PUBLISH_CONCURRENCY: usize = 128;
/// Size of each node's data filesystem (a tmpfs) in runs with the disk-full fault.
const SMALL_DISK_MIB: u64 = 256;

fn default_node_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("QQ_NODE_BIN") {
        return p.into();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/quorumq/target")
        });
    target.join("debug/qq-node")
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

#[tokio::main]
async fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // lapin logs every connection the faults break at ERROR; the report counts them.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,lapin=off"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    match run(Args::parse()).await {
        Ok(Outcome::Pass) => {}
        Ok(outcome) => std::process::exit(outcome.exit_code()),
        Err(e) => {
            eprintln!("qq-chaos: {e:#}");
            std::process::exit(2);
        }
    }
}

async fn run(mut args: Args) -> anyhow::Result<Outcome> {
    if args.list_scenarios {
        for (name, seed, secs, nemesis, protocol, what) in SCENARIOS {
            let protocol = protocol.name();
            println!("{name:<15} seed {seed:<3} {secs:>4} s  {protocol:<4} {nemesis:<30} {what}");
        }
        return Ok(Outcome::Pass);
    }
    let mut label = None;
    if let Some(name) = &args.scenario {
        let Some((_, seed, secs, nemesis, protocol, _)) = SCENARIOS.iter().find(|s| s.0 == name)
        else {
            bail!("unknown scenario '{name}' (see --list-scenarios)");
        };
        args.seed = Some(*seed);
        args.duration = *secs;
        args.nemesis = nemesis.to_string();
        args.protocol = args.protocol.or(Some(*protocol));
        label = Some(name.clone());
        if name == "upgrade" && args.start_bin.is_none() {
            bail!("scenario 'upgrade' needs --start-bin (`make previous-release` prints one)");
        }
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    });
    println!("seed: {seed}");
    let kinds = nemesis::parse_kinds(&args.nemesis).map_err(anyhow::Error::msg)?;
    if !is_root() {
        bail!("needs root: network namespaces and iptables (run with sudo)");
    }
    if args.rate <= 0.0 {
        bail!("--rate must be positive");
    }
    let node_bin = args.node_bin.clone().unwrap_or_else(default_node_bin);
    if !node_bin.exists() {
        bail!("{} not found: run `make build` first", node_bin.display());
    }
    let script = args
        .netns_script
        .clone()
        .unwrap_or_else(|| PathBuf::from("cluster/netns.sh"));
    if !script.exists() {
        bail!(
            "{} not found: run from the repository root or pass --netns-script",
            script.display()
        );
    }
    let protocol = args.protocol.unwrap_or_default();
    let base = args.out.clone().unwrap_or_else(|| {
        let mut name = label.clone().unwrap_or_else(|| {
            if args.matrix {
                format!("matrix-seed-{seed}")
            } else {
                format!("seed-{seed}")
            }
        });
        // Runs over AMQP keep their own directory (a gRPC run's is named as before).
        if protocol != Protocol::Grpc && !name.ends_with(protocol.name()) {
            name = format!("{name}-{}", protocol.name());
        }
        PathBuf::from(".qq-chaos").join(name)
    });
    if base.exists() {
        std::fs::remove_dir_all(&base).with_context(|| format!("clear {}", base.display()))?;
    }
    if let Some(b) = &args.start_bin
        && !b.exists()
    {
        bail!("--start-bin {} not found", b.display());
    }
    let setup = Setup {
        seed,
        script,
        node_bin,
        start_bin: args.start_bin.clone(),
        rate: args.rate,
        duration: args.duration,
        idle_queues: args.idle_queues,
        hold_on_failure: args.hold_on_failure,
        protocol,
    };
    if !args.matrix {
        let report = run_one(&setup, &kinds, &base).await?;
        return Ok(report.result());
    }
    // The matrix: every selected nemesis alone, then all of them together.
    let mut runs: Vec<(String, Vec<Kind>)> = kinds
        .iter()
        .map(|k| (k.name().to_string(), vec![*k]))
        .collect();
    if kinds.len() > 1 {
        runs.push(("combined".into(), kinds.clone()));
    }
    let mut rows = Vec::new();
    for (name, set) in runs {
        println!("\n######## matrix: {name} ########");
        let report = run_one(&setup, &set, &base.join(&name)).await?;
        rows.push((name, report));
    }
    report::write_matrix(&base, &rows)?;
    let outcome = Outcome::of_all(rows.iter().map(|(_, r)| r.result()));
    println!("MATRIX RESULT: {}", outcome.name());
    Ok(outcome)
}

/// What every run of one invocation shares.
struct Setup {
    seed: u64,
    script: PathBuf,
    node_bin: PathBuf,
    start_bin: Option<PathBuf>,
    rate: f64,
    duration: u64,
    idle_queues: usize,
    hold_on_failure: u64,
    protocol: Protocol,
}

/// One run: fresh namespaces and nodes, the workload under `kinds`, the check. Output in `out`.
async fn run_one(setup: &Setup, kinds: &[Kind], out: &std::path::Path) -> anyhow::Result<Report> {
    std::fs::create_dir_all(out)?;
    let mut hosts = Hosts::create(&setup.script, &setup.node_bin, &out.join("run"), 3)?;
    hosts.set_start_bin(setup.start_bin.clone());
    let mut notes = Vec::new();
    let requested = kinds.to_vec();
    let mut kinds = kinds.to_vec();
    if kinds.contains(&Kind::DiskFull) {
        hosts.use_small_disks(SMALL_DISK_MIB)?;
    }
    if kinds.contains(&Kind::Netem) && !hosts.netem_available() {
        let note =
            "tc netem is not available in this kernel: the netem fault is skipped".to_string();
        println!("note: {note}");
        notes.push(note);
        kinds.retain(|k| *k != Kind::Netem);
    }
    let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    println!(
        "nemeses: {}   workload: {} s over {}   output: {}",
        names.join(","),
        setup.duration,
        setup.protocol.name(),
        out.display()
    );
    // Interrupted (Ctrl-C, SIGTERM): the run is dropped and the hosts are still torn down.
    let faults = Nemeses {
        requested: &requested,
        injected: &kinds,
    };
    let result = tokio::select! {
        r = chaos(&mut hosts, setup, faults, notes, out) => r,
        signal = interrupted() => Err(anyhow::anyhow!("interrupted by {signal}")),
    };
    if result.as_ref().map_or(true, |r| !r.verdict.ok()) {
        for id in hosts.ids().iter().copied().chain(hosts.spare_ids()) {
            eprintln!("===== node {id} log tail\n{}", hosts.log_tail(id, 30));
        }
        if setup.hold_on_failure > 0 {
            println!(
                "holding the failed run's cluster for {} s (client ports: {}); Ctrl-C ends it",
                setup.hold_on_failure,
                hosts
                    .ids()
                    .iter()
                    .map(|id| hosts::address(*id))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(setup.hold_on_failure)) => {}
                _ = interrupted() => {}
            }
        }
    }
    hosts.destroy();
    result
}

/// The nemeses of a run: those asked for, and those this machine can inject.
#[derive(Clone, Copy)]
struct Nemeses<'a> {
    requested: &'a [Kind],
    injected: &'a [Kind],
}

async fn chaos(
    hosts: &mut Hosts,
    setup: &Setup,
    nemeses: Nemeses<'_>,
    notes: Vec<String>,
    out: &std::path::Path,
) -> anyhow::Result<Report> {
    let kinds = nemeses.injected;
    let seed = setup.seed;
    let addresses: Vec<String> = hosts.ids().iter().map(|id| hosts::address(*id)).collect();
    for id in hosts.ids().to_vec() {
        hosts.start(id)?;
    }
    let clients = workload::grpc::clients(&addresses)?;
    wait_formed(&clients, Duration::from_secs(60)).await?;
    retry("declare the topology", || workload::declare(&clients[0])).await?;
    if setup.idle_queues > 0 {
        idle::declare(&clients, setup.idle_queues).await?;
    }
    let mut leaders_at_start = BTreeMap::new();
    for q in workload::QUEUES {
        let info = retry("queue info", || clients[0].get_queue(q)).await?;
        leaders_at_start.insert(q.to_string(), info.leader);
    }
    println!("cluster formed; leaders: {leaders_at_start:?}");

    // ---- workload + nemesis ----------------------------------------------------------------
    let amqp: Vec<String> = hosts
        .ids()
        .iter()
        .map(|id| hosts::amqp_address(*id))
        .collect();
    let mut session = Session::start(
        setup.protocol,
        clients.clone(),
        amqp,
        setup.rate,
        PUBLISH_CONCURRENCY,
    );
    let rec = session.rec.clone();

    let run = Duration::from_secs(setup.duration);
    let plan = nemesis::schedule(
        seed,
        kinds,
        run,
        hosts.ids().len() as u64,
        workload::QUEUES.len(),
    );
    let mut windows: Vec<Window> = Vec::new();
    let mut crashes: Vec<String> = Vec::new();
    let mut next_progress = Duration::from_secs(5);
    let mut step = plan.iter().peekable();
    let mut active: Option<(nemesis::Applied, Duration, u64)> = None;
    // The membership nemesis' strike under way (its spare joins and grows meanwhile).
    let mut strike: Option<membership::Strike> = None;
    let mut membership_steps: Vec<membership::Step> = Vec::new();
    // A membership strike lasts as long as its steps take, often past its planned window: the
    // rest of the schedule is then shifted by that overrun, so that the quiet gaps after it
    // keep their planned lengths (other faults heal on time and shift nothing).
    let mut behind = Duration::ZERO;
    // No fault starts before this: MIN_GAP after the last one healed (a rolling restart can
    // outlast the window the schedule gave it; the faults after it are delayed, never
    // overlapped).
    let mut quiet_until = Duration::ZERO;
    let mut rolling_stops = 0;
    let mut rolling_findings: Vec<String> = Vec::new();
    let mut wipe_findings: Vec<String> = Vec::new();
    let mut term_checks: Vec<Option<Vec<String>>> = Vec::new();
    while rec.elapsed() < run {
        if let Some((id, status)) = hosts.find_crashed() {
            let full = active
                .as_ref()
                .is_some_and(|(a, _, _)| a.disk_full == Some(id));
            if full && status.code() == Some(hosts::STORAGE_FAULT_EXIT_CODE) {
                // Fail-stop on its full disk: expected; started again when the disk is freed.
                println!(
                    "[{:>5.1}s] node {id} stopped on its full disk (exit {})",
                    rec.elapsed().as_secs_f64(),
                    hosts::STORAGE_FAULT_EXIT_CODE
                );
            } else {
                let msg = format!(
                    "node {id} exited by itself ({status}) at {:?}",
                    rec.elapsed()
                );
                println!("!! {msg}");
                crashes.push(msg);
                hosts.start(id)?;
            }
        }
        let now = rec.elapsed();
        if let Some((applied, until, start_ms)) = &active
            && now >= *until
        {
            // Pre-Vote: a node cut off from the majority must not have raised its term (it
            // would depose the majority's leaders when the cut heals). Read before healing.
            if let Some(alone) = applied.alone {
                let fault = format!("{} {}", applied.kind, applied.target);
                term_checks.push(term_inflation(&clients, alone, &fault).await);
            }
            let steps = match strike.take() {
                Some(s) => s.finish(hosts, &clients, &rec).await,
                None => Vec::new(),
            };
            nemesis::heal(hosts, applied)?;
            println!(
                "[{:>5.1}s] healed {} {}",
                rec.elapsed().as_secs_f64(),
                applied.kind,
                applied.target
            );
            if !steps.is_empty() {
                behind += rec.elapsed().saturating_sub(*until);
            }
            membership_steps.extend(steps.iter().cloned());
            windows.push(Window {
                kind: applied.kind,
                target: applied.target.clone(),
                start_ms: *start_ms,
                end_ms: rec.now_ms(),
                steps,
                procedure: applied.procedure.clone(),
            });
            active = None;
            quiet_until = rec.elapsed() + nemesis::MIN_GAP;
        }
        let now = rec.elapsed();
        if active.is_none()
            && now >= quiet_until
            && let Some(fault) = step.next_if(|f| now >= f.at + behind)
        {
            let queue = workload::QUEUES[fault.queue_pick];
            let leader = current_leader(&clients, queue).await;
            let start_ms = rec.now_ms();
            if fault.kind == Kind::RollingRestart {
                println!(
                    "[{:>5.1}s] {} from node {}",
                    now.as_secs_f64(),
                    fault.kind,
                    fault.node_pick
                );
            }
            let applied = nemesis::strike(hosts, &clients, &rec, fault, leader).await?;
            // A procedure (the rolling restart) is over when strike returns: healed at once.
            // A wipe may first wait for every replica to catch up: its window starts when
            // it struck.
            let struck = rec.elapsed();
            let until = if fault.kind == Kind::RollingRestart {
                rolling_stops += applied.graceful_stops;
                rolling_findings.extend(applied.findings.iter().cloned());
                struck
            } else {
                wipe_findings.extend(applied.findings.iter().cloned());
                println!(
                    "[{:>5.1}s] {} {} (queue {queue} leader {leader:?}) for {:.1} s",
                    struck.as_secs_f64(),
                    applied.kind,
                    applied.target,
                    fault.length.as_secs_f64()
                );
                struck + fault.length
            };
            if let Some(id) = applied.spare {
                let at = membership::SpareAt {
                    address: hosts::address(hosts::SPARE_HOST),
                    cluster_address: hosts::cluster_address(hosts::SPARE_HOST),
                    client: None,
                };
                strike = Some(membership::Strike::begin(
                    clients.clone(),
                    rec.clone(),
                    id,
                    at,
                    applied.shrink_first,
                    start_ms,
                ));
            }
            active = Some((applied, until, start_ms));
        }
        if now >= next_progress {
            println!(
                "[{:>5.1}s] confirmed {}",
                now.as_secs_f64(),
                rec.confirmed_count()
            );
            // The next multiple of 5 s (a rolling restart holds the loop up for a while).
            next_progress = Duration::from_secs(now.as_secs() / 5 * 5 + 5);
        }
        sleep(Duration::from_millis(100)).await;
    }
    if let Some((applied, _, start_ms)) = active.take() {
        let steps = match strike.take() {
            Some(s) => s.finish(hosts, &clients, &rec).await,
            None => Vec::new(),
        };
        nemesis::heal(hosts, &applied)?;
        membership_steps.extend(steps.iter().cloned());
        windows.push(Window {
            kind: applied.kind,
            target: applied.target.clone(),
            start_ms,
            end_ms: rec.now_ms(),
            steps,
            procedure: applied.procedure.clone(),
        });
    }

    // ---- heal, finish, drain ------------------------------------------------------------------
    session.stop_publishing();
    let publish_end_ms = rec.now_ms();
    hosts.heal_all()?;
    println!(
        "[{:>5.1}s] healed everything; finishing publishes",
        rec.elapsed().as_secs_f64()
    );
    let mut checks = vec![session.healthy().await];
    if setup.idle_queues > 0 {
        checks.push(idle::check(&clients, setup.idle_queues).await);
    }
    session.finish_publishers().await;
    println!(
        "[{:>5.1}s] publishers done; waiting for the source queues to drain",
        rec.elapsed().as_secs_f64()
    );
    checks.extend(session.drain().await);
    let end_ms = rec.now_ms();
    println!(
        "[{:>5.1}s] drained; checking replicas",
        rec.elapsed().as_secs_f64()
    );
    // The replicas of every node that is a member at the end: the founders, and a spare only
    // if one still runs (a strike that could not retire it).
    let mut members_at_end: Vec<Client> = clients.to_vec();
    if let Some(id) = hosts.running_spare() {
        println!("note: spare node {id} still runs; its replicas are compared too");
        members_at_end.push(Client::connect_lazy(&hosts::address(hosts::SPARE_HOST))?);
    }
    checks.push(replica_agreement(&members_at_end, Duration::from_secs(30)).await);
    if kinds.contains(&Kind::Membership) {
        let failed: Vec<String> = membership_steps
            .iter()
            .filter(|s| !s.ok)
            .map(|s| format!("{} node {}: {}", s.step, s.node, s.detail))
            .collect();
        let strikes = membership_steps
            .iter()
            .filter(|s| s.step == "start")
            .count();
        checks.push(Check::all_clear(
            "membership changes carried out (join, grow, caught up, shrink, stop, forget)",
            failed,
            format!("{strikes} spare nodes joined, grew onto every queue and were forgotten"),
        ));
    }
    let checked = term_checks.iter().flatten().count();
    let inflated: Vec<String> = term_checks.into_iter().flatten().flatten().collect();
    checks.push(Check::all_clear(
        "a node cut off from the majority does not raise its term",
        inflated,
        if checked == 0 {
            "no node was cut off alone in this run (or no answer at a heal)".into()
        } else {
            format!("{checked} heals: the cut-off node's term never passed the majority's")
        },
    ));
    while let Some((id, status)) = hosts.find_crashed() {
        crashes.push(format!("node {id} exited by itself ({status})"));
    }
    checks.push(Check::all_clear(
        "no node crashed by itself",
        crashes,
        "none",
    ));
    if kinds.contains(&Kind::WipeRejoin) {
        checks.push(Check::all_clear(
            "wipes: every replica caught up before each wipe",
            wipe_findings,
            "each wipe struck once the other nodes held every replica's data",
        ));
    }
    if kinds.contains(&Kind::RollingRestart) {
        checks.push(Check::all_clear(
            "rolling restarts: each node exits 0 on SIGTERM in time and serves again",
            rolling_findings,
            format!("{rolling_stops} graceful stops, each exited 0 and its node served again"),
        ));
    }
    if let Some(start) = &setup.start_bin {
        let missed: Vec<String> = hosts
            .ids()
            .iter()
            .filter(|id| hosts.binary_of(**id) == start.as_path())
            .map(|id| format!("node {id} still runs {}", start.display()))
            .collect();
        checks.push(Check::all_clear(
            "upgrade: every node runs --node-bin by the end",
            missed,
            format!("every node moved from {} on its restart", start.display()),
        ));
    }

    // ---- check and report ---------------------------------------------------------------------
    let history = rec.take();
    let mut verdict = checker::check(&history);
    verdict.checks.extend(checks);
    let report = Report {
        seed,
        protocol: setup.protocol,
        nemeses: kinds.to_vec(),
        requested: nemeses.requested.to_vec(),
        workload_s: publish_end_ms as f64 / 1000.0,
        notes,
        leaders_at_start,
        faults: report::fault_reports(&history, &windows, publish_end_ms),
        throughput: report::throughput(&history, &windows, publish_end_ms),
        latency: report::latency(&history),
        publish_errors: history.publish_errors.clone(),
        consumer_interruptions: history.consumer_interruptions.clone(),
        reconnects: history.reconnects.clone(),
        verdict,
    };
    std::fs::write(
        out.join("report.json"),
        serde_json::to_vec_pretty(&report.to_json()?)?,
    )?;
    std::fs::write(out.join("history.json"), serde_json::to_vec(&history)?)?;
    let png = out.join("timeline.png");
    if let Err(e) = report::plot(
        &history,
        &windows,
        end_ms.min(publish_end_ms + 15_000),
        &png,
    ) {
        println!("timeline not drawn: {e:#}");
    }
    print!("{}", report::summary(&report));
    println!(
        "report: {}  timeline: {}",
        out.join("report.json").display(),
        png.display()
    );
    Ok(report)
}

async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}
