//! One seed, end to end: a fresh cluster on a fresh [`SimNet`], the chaos workload (publishers,
//! consumers that ack, reject and requeue, dead lettering by rejection, TTL and delivery limit)
//! through every node's client port, the seed's plan of faults, then heal, drain and check.
//! Writes `trace.jsonl` (the plan, then what struck and healed when) and `report.json` into the
//! seed's directory.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use qq_chaos::checker::{self, Check, Verdict};
use qq_chaos::idle;
use qq_chaos::probes::{current_leader, replica_agreement, retry, wait_formed};
use qq_chaos::session::Session;
use qq_chaos::workload::{self, Protocol, Recorder};
use serde::Serialize;
use tokio::time::sleep;

use crate::churn;
use crate::faults::Cluster;
use crate::host::{Host, NodeSetup};
use crate::net::{Link, NetStats, SimNet};
use crate::operator::Operator;
use crate::schedule::{self, Plan, Target};

/// Publishes in flight per publisher and queue (as the chaos runner).
const PUBLISH_CONCURRENCY: usize = 64;

/// What a run is asked to do.
#[derive(Clone, Debug)]
pub struct Setup {
    pub seed: u64,
    pub nodes: u64,
    pub duration: Duration,
    /// Total publish rate, messages per second.
    pub rate: f64,
    /// What the workload's publishers and consumers speak (the rest of the run: gRPC).
    pub protocol: Protocol,
    pub out: PathBuf,
}

impl Setup {
    /// The seed's plan for this run's shape (what `--plan-only` prints).
    pub fn plan(&self) -> Plan {
        schedule::plan(self.seed, self.nodes, self.duration, workload::QUEUES.len())
    }

    /// Where the seed's trace, report and (on failure) node logs go: `seed-N`, or `seed-N-amqp`.
    pub fn dir(&self) -> PathBuf {
        match self.protocol {
            Protocol::Grpc => self.out.join(format!("seed-{}", self.seed)),
            p => self.out.join(format!("seed-{}-{}", self.seed, p.name())),
        }
    }
}

/// What a run found.
#[derive(Debug, Serialize)]
pub struct Outcome {
    pub seed: u64,
    pub ok: bool,
    pub faults: usize,
    pub seconds: f64,
    pub net: NetStats,
    pub verdict: Verdict,
}

/// The trace of a run: the plan first, then one line per event.
struct Trace {
    file: std::fs::File,
    started: Instant,
}

impl Trace {
    fn create(path: &Path, plan: &Plan) -> anyhow::Result<Trace> {
        let mut file = std::fs::File::create(path)?;
        writeln!(file, "{}", serde_json::to_string(plan)?)?;
        Ok(Trace {
            file,
            started: Instant::now(),
        })
    }

    fn event(&mut self, what: &str, detail: impl Serialize) {
        let t_ms = self.started.elapsed().as_millis() as u64;
        let line = serde_json::json!({ "t_ms": t_ms, "event": what, "detail": detail });
        let _ = writeln!(self.file, "{line}");
        println!(
            "  [{:>6.1}s] {what} {}",
            t_ms as f64 / 1000.0,
            line["detail"]
        );
    }
}

/// Runs one seed; Err only when the run could not be carried out (not for a failed check).
pub async fn run(setup: &Setup) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let dir = setup.dir();
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clear {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    let plan = setup.plan();
    let mut trace = Trace::create(&dir.join("trace.jsonl"), &plan)?;
    let (mut cluster, operator) = start_cluster(setup, &plan, &dir)?;
    let result = exercise(&mut cluster, operator, setup, &plan, &mut trace).await;
    let mut verdict = match result {
        Ok(v) => v,
        Err(e) => {
            let mut v = Verdict::default();
            v.checks.push(Check::new(
                "the run was carried out",
                false,
                format!("{e:#}"),
            ));
            v
        }
    };
    verdict.checks.push(tls_check(&cluster.net.stats()));
    let ok = verdict.ok();
    stop_all(&mut cluster, ok);
    let outcome = Outcome {
        seed: setup.seed,
        ok,
        faults: plan.faults.len(),
        seconds: started.elapsed().as_secs_f64(),
        net: cluster.net.stats(),
        verdict,
    };
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_vec_pretty(&outcome)?,
    )?;
    if ok {
        // The node directories of a passing seed are not needed again.
        for id in 1..=setup.nodes + 1 {
            let _ = std::fs::remove_dir_all(dir.join(format!("node{id}")));
        }
    }
    Ok(outcome)
}

/// Every node-to-node connection opened with a TLS handshake (the nodes run mutual TLS over
/// the simulated network, as in production), and there were some.
fn tls_check(net: &NetStats) -> Check {
    Check::new(
        "node-to-node connections spoke TLS",
        net.tls_connections > 0 && net.plain_connections == 0,
        format!(
            "{} opened with a TLS handshake, {} without",
            net.tls_connections, net.plain_connections
        ),
    )
}

/// The plan's nodes, started on a new network with the plan's weather, and the operator of
/// its membership change (its spare not started yet).
fn start_cluster(
    setup: &Setup,
    plan: &Plan,
    dir: &Path,
) -> anyhow::Result<(Cluster, Option<Operator>)> {
    let net = SimNet::new(setup.seed);
    let ids: Vec<u64> = (1..=setup.nodes).collect();
    // One more id and port for the spare of a membership change.
    let all: Vec<u64> = (1..=setup.nodes + 1).collect();
    let mut ports = Host::free_ports(2 * all.len())?;
    let amqp = ports.split_off(all.len());
    let listens = ports;
    let node_setup = |skew_ms, i: usize| NodeSetup {
        skew_ms,
        snapshot_after_entries: plan.snapshot_after_entries,
        amqp: amqp[i],
    };
    let mut hosts = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let node = node_setup(plan.skew_ms[i], i);
        hosts.push(Host::create(dir, *id, &ids, &listens, node)?);
    }
    let operator = match plan.membership {
        Some(m) => {
            let spare = Host::create(
                dir,
                setup.nodes + 1,
                &all,
                &listens,
                node_setup(0, ids.len()),
            )?;
            Some(Operator::new(m, spare))
        }
        None => None,
    };
    let weather = Link {
        delay_ms: plan.weather.delay_ms,
        jitter_ms: plan.weather.jitter_ms,
        ..Link::default()
    };
    let mut cluster = Cluster::new(net.clone(), hosts, weather);
    for h in &mut cluster.hosts {
        h.start(&net)?;
    }
    Ok((cluster, operator))
}

/// Stops every node gracefully; when the seed failed, prints the end of each one's log first.
fn stop_all(cluster: &mut Cluster, ok: bool) {
    if !ok {
        for h in &cluster.hosts {
            eprintln!("===== node {} log tail\n{}", h.id, h.log_tail(25));
        }
    }
    for h in &mut cluster.hosts {
        let id = h.id;
        if let Err(e) = tokio::task::block_in_place(|| h.stop()) {
            eprintln!("node {id} did not stop cleanly: {e:#}");
        }
    }
}

/// The workload under the plan's faults, then the checks.
async fn exercise(
    cluster: &mut Cluster,
    mut operator: Option<Operator>,
    setup: &Setup,
    plan: &Plan,
    trace: &mut Trace,
) -> anyhow::Result<Verdict> {
    let addresses: Vec<String> = cluster.hosts.iter().map(|h| h.listen.to_string()).collect();
    let clients = workload::grpc::clients(&addresses)?;
    wait_formed(&clients, Duration::from_secs(60)).await?;
    retry("declare the topology", || workload::declare(&clients[0])).await?;
    idle::declare(&clients, plan.idle_queues).await?;
    trace.event("formed", &addresses);

    let amqp = cluster.hosts.iter().map(|h| h.amqp.to_string()).collect();
    let mut session = Session::start(
        setup.protocol,
        clients.clone(),
        amqp,
        setup.rate,
        PUBLISH_CONCURRENCY,
    );
    let rec = session.rec.clone();
    let churn_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = tokio::spawn(churn::run(
        clients.clone(),
        plan.first_route,
        churn_stop.clone(),
    ));

    let mut findings =
        under_faults(cluster, operator.as_mut(), plan, &clients, &rec, trace).await?;
    session.stop_publishing();
    churn_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    cluster.heal_all()?;
    trace.event("healed everything", ());
    let mut checks = vec![session.healthy().await];
    checks.push(idle::check(&clients, plan.idle_queues).await);
    checks.push(churn.await?);
    if let Some(operator) = operator {
        checks.push(operator.finish(&clients, &rec).await);
        trace.event("membership change over", ());
    }
    if let Some(node) = plan.wipe {
        trace.event("wipe", node);
        checks.push(crate::wipe::wipe_and_reseed(cluster, node, &clients).await);
        trace.event("wipe over", node);
    }
    session.finish_publishers().await;
    trace.event("publishers done", rec.confirmed_count());
    checks.extend(session.drain().await);
    checks.push(replica_agreement(&clients, Duration::from_secs(30)).await);
    for h in &mut cluster.hosts {
        if let Some(how) = h.ended_by_itself() {
            findings.push(format!("node {} ended by itself: {how}", h.id));
        }
    }
    checks.push(Check::all_clear(
        "no node ended by itself",
        findings,
        "none",
    ));
    let faults: Vec<String> = cluster
        .hosts
        .iter()
        .flat_map(|h| {
            h.storage_faults()
                .into_iter()
                .map(|f| format!("node {}: {f}", h.id))
                .collect::<Vec<_>>()
        })
        .collect();
    checks.push(Check::all_clear("no storage fault", faults, "none"));
    trace.event("checked", ());
    let mut verdict = checker::check(&rec.take());
    verdict.checks.extend(checks);
    Ok(verdict)
}

/// The plan's faults, each struck when its time comes and healed when its window ends, while
/// the workload runs; returns the nodes that ended by themselves meanwhile.
async fn under_faults(
    cluster: &mut Cluster,
    mut operator: Option<&mut Operator>,
    plan: &Plan,
    clients: &Arc<Vec<qq_client::Client>>,
    rec: &Arc<Recorder>,
    trace: &mut Trace,
) -> anyhow::Result<Vec<String>> {
    let mut findings = Vec::new();
    let mut next = plan.faults.iter().peekable();
    let run = Duration::from_millis(plan.run_ms);
    while rec.elapsed() < run {
        for h in &mut cluster.hosts {
            if let Some(how) = h.ended_by_itself() {
                let msg = format!("node {} ended by itself: {how}", h.id);
                trace.event("ended by itself", &msg);
                findings.push(msg);
            }
        }
        for healed in cluster.heal_due(rec.elapsed())? {
            trace.event(
                "heal",
                serde_json::json!({ "fault": healed.fault, "node": healed.node }),
            );
        }
        let now = rec.elapsed();
        if let Some(op) = operator.as_deref_mut()
            && let Some(did) = op.tick(now, &cluster.net, clients, rec)?
        {
            trace.event("membership", did);
        }
        while let Some(p) = next.next_if(|p| now >= Duration::from_millis(p.at_ms)) {
            let node = match p.fault.target() {
                Some(Target::Node(n)) => n,
                // A founder: a queue led by the spare (or by nobody now) strikes node 1.
                // Asked for at most a second: the loop must not hold other faults' heals up.
                Some(Target::LeaderOf(q)) => tokio::time::timeout(
                    Duration::from_secs(1),
                    current_leader(clients, workload::QUEUES[q]),
                )
                .await
                .ok()
                .flatten()
                .filter(|l| cluster.ids().contains(l))
                .unwrap_or(1),
                None => 0,
            };
            let until = Duration::from_millis(p.at_ms + p.length_ms);
            let did = cluster.strike(p.fault, node, now, until);
            trace.event(
                "strike",
                serde_json::json!({ "fault": p.fault, "node": node, "length_ms": p.length_ms, "did": did }),
            );
        }
        sleep(Duration::from_millis(50)).await;
    }
    Ok(findings)
}
