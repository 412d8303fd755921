//! Three real nodes and a client on one [`World`], under a seed's plan of faults: the run of
//! the cluster that replays byte for byte (docs/simulation.md, "One schedule").
//!
//! [`run`] starts three `qq_node::server::run` nodes, each on a host of a [`World`], their
//! cluster ports and their gRPC client ports on one [`SimNet`] (mutual TLS between the nodes, as
//! in production), and a client on a fourth host. The client declares a queue, publishes to it
//! through every node in turn with confirms, and takes every message back through one node.
//! Meanwhile the seed's plan of faults strikes (`replay/cluster.rs`). Every operation the client makes
//! goes into the trace with its result and the client's virtual time, beside every fault struck
//! and healed, and at the end each node's view of the queue (leader, term, commit index, count).
//!
//! The thread that runs it seeds its entropy ([`crate::entropy`]) and does its own blocking work
//! ([`qq_raft::lockstep`]), and every node's clock starts at the same fixed epoch, so two runs of
//! one seed (two processes) give the same trace: `replay::tests` checks it.
//!
//! The client runs a [`Program`]: 600 messages through one queue, or qq-chaos's workload with
//! its checks, the plan's membership change (a spare node joins, is grown onto every queue,
//! shrunk, stopped and forgotten) and its wiped disk (`replay/operator.rs`). Three to five
//! nodes ([`Shape`]), each with its plan's clock skew. Not in it yet: AMQP.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qq_client::{Client, Message};
use tokio::time::Instant;

use crate::entropy::seed_this_thread;
use crate::host::{Host, NodeSetup};
use crate::lockstep::World;
use crate::net::{Link, SimNet};
use crate::schedule::{self, Fault, Plan, Target};
use crate::wall_clock;
use cluster::Cluster;

mod chaos;
mod cluster;
mod log;
mod operator;

/// Time between two publishes: the run (and its plan of faults) lasts this times the messages.
const PACE: Duration = Duration::from_millis(50);
/// The client's id on the simulated network.
const CLIENT: u64 = 100;
/// The queue the client uses.
const QUEUE: &str = "replay.q";
/// Give up this much virtual time after the run's length.
const AFTER_THE_RUN: Duration = Duration::from_secs(240);

type Trace = Arc<Mutex<Vec<String>>>;
/// The last leader seen of each queue a fault may target.
type Leaders = Arc<Vec<AtomicU64>>;

/// The gRPC client address of node `id` on the simulated network (never a socket).
fn client_addr(id: u64) -> SocketAddr {
    SocketAddr::from(([10, 77, 1, id as u8], 5000))
}

/// What the client does while the faults strike.
#[derive(Clone, Copy, Debug)]
pub enum Program {
    /// Publishes this many messages through `replay.q`, one every 50 ms, and takes them
    /// all back (the run lasts that long).
    Messages(u32),
    /// qq-chaos's workload (publishers, consumers that ack, reject and requeue, dead lettering,
    /// TTL, delivery limit) and qq-sim's topology churn for this long, then its checks.
    Chaos(Duration),
}

impl Program {
    fn run_length(self) -> Duration {
        match self {
            Program::Messages(n) => PACE * n,
            Program::Chaos(length) => length,
        }
    }

    /// The queues whose leaders a "leader of" fault may strike.
    fn queues(self) -> Vec<String> {
        match self {
            Program::Messages(_) => vec![QUEUE.to_string()],
            Program::Chaos(_) => qq_chaos::workload::QUEUES
                .iter()
                .map(|q| q.to_string())
                .collect(),
        }
    }
}

/// A run's shape: what the client does, on how many nodes (3 to 5).
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub program: Program,
    pub nodes: u64,
}

/// What a run did, read from its trace: its faults, messages taken back, and every check
/// (a line `check <name>: ok|FAILED <detail>`).
#[derive(Debug)]
pub struct Replayed {
    pub trace: Vec<String>,
    /// Faults struck.
    pub faults: usize,
    /// Distinct messages taken back ([`Program::Messages`]), and takes of one already taken.
    pub taken: usize,
    pub taken_again: usize,
    /// Whether the client finished within the virtual deadline.
    pub done: bool,
    /// The checks that failed, as their trace lines.
    pub failed: Vec<String>,
}

impl Replayed {
    fn of(trace: Vec<String>) -> Replayed {
        let count = |f: &dyn Fn(&str) -> bool| trace.iter().filter(|l| f(l)).count();
        let taken_line = |l: &str| l.contains("get via node 2: b\"m");
        Replayed {
            faults: count(&|l| l.contains(" strike ")),
            taken: count(&|l| taken_line(l) && !l.ends_with("(again)")),
            taken_again: count(&|l| taken_line(l) && l.ends_with("(again)")),
            done: count(&|l| l.starts_with("not done")) == 0,
            failed: trace
                .iter()
                .filter(|l| l.contains(" check ") && l.contains(": FAILED"))
                .cloned()
                .collect(),
            trace,
        }
    }

    /// The client finished and every check passed.
    pub fn ok(&self) -> bool {
        self.done && self.failed.is_empty()
    }
}

/// Runs seed `seed` with `messages` messages in `dir` (which must not hold a run already), on a
/// thread of its own. Two runs of a seed give the same trace only as two processes that did the
/// same before (module doc of [`crate::entropy`]): run each seed in a process of its own.
pub fn run(seed: u64, dir: &Path, shape: Shape) -> anyhow::Result<Replayed> {
    anyhow::ensure!((3..=5).contains(&shape.nodes), "nodes: 3 to 5");
    let dir = dir.to_path_buf();
    std::thread::Builder::new()
        .name("qq-sim-world".into())
        .spawn(move || {
            seed_this_thread(seed);
            qq_raft::lockstep::mark_this_thread();
            wall_clock::follow_world(Duration::from_millis(cluster::EPOCH_MS));
            let log = std::fs::File::create(dir.join("nodes.log"))?;
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("QQ_SIM_NODE_LOG")
                        .unwrap_or_else(|_| "info,openraft=error".into()),
                )
                .with_ansi(false)
                .without_time()
                .with_writer(log::HostLog::new(log))
                .finish();
            let _logs = tracing::subscriber::set_default(subscriber);
            run_on_this_thread(seed, &dir, shape).map(Replayed::of)
        })?
        .join()
        .map_err(|_| anyhow::anyhow!("the world's thread panicked"))?
}

/// What the client's host and the world's loop share: the trace, whether the client is done,
/// and each queue's last leader seen.
#[derive(Clone)]
struct Shared {
    trace: Trace,
    done: Arc<AtomicBool>,
    leaders: Leaders,
}

fn run_on_this_thread(seed: u64, dir: &Path, shape: Shape) -> anyhow::Result<Vec<String>> {
    let program = shape.program;
    let queues = program.queues();
    let plan = schedule::plan(seed, shape.nodes, program.run_length(), queues.len());
    let shared = Shared {
        trace: Arc::new(Mutex::new(vec![format!(
            "plan {}",
            serde_json::to_string(&plan)?
        )])),
        done: Arc::new(AtomicBool::new(false)),
        leaders: Arc::new(queues.iter().map(|_| AtomicU64::new(1)).collect()),
    };
    let chaos = matches!(program, Program::Chaos(_));
    let (hosts, spare) = hosts(dir, &plan, chaos)?;
    let net = SimNet::new(seed);
    let weather = Link {
        delay_ms: plan.weather.delay_ms,
        jitter_ms: plan.weather.jitter_ms,
        ..Link::default()
    };
    let world = World::new(Duration::from_millis(1));
    let mut cluster = Cluster::start(world, net.clone(), hosts, weather)?;
    let requests = operator::Requests::default();
    let operator = operator::Operator {
        requests: requests.clone(),
        membership: plan.membership.filter(|_| chaos),
        spare: plan.nodes + 1,
        net: net.clone(),
        wipe: plan.wipe.filter(|_| chaos),
        log: dir.join("nodes.log"),
    };
    start_client(&mut cluster, &net, &plan, program, &shared, operator)?;
    let deadline = program.run_length() + AFTER_THE_RUN;
    drive(&mut cluster, &plan, deadline, &shared, &requests, spare)?;
    let mut trace = shared.trace.lock().expect("trace").clone();
    if !shared.done.load(Ordering::Relaxed) {
        trace.push(format!("not done after {deadline:?} of virtual time"));
    }
    Ok(trace)
}

/// The plan's nodes (ids 1..=nodes, each with its skew), and the spare of its membership
/// change (the chaos workload's only), configured with every founder and itself.
fn hosts(dir: &Path, plan: &Plan, chaos: bool) -> anyhow::Result<(Vec<Host>, Option<Host>)> {
    let setup = |skew_ms| NodeSetup {
        skew_ms,
        snapshot_after_entries: plan.snapshot_after_entries,
        amqp: SocketAddr::from(([127, 0, 0, 1], 0)),
    };
    let ids: Vec<u64> = (1..=plan.nodes).collect();
    let listens: Vec<SocketAddr> = ids.iter().map(|id| client_addr(*id)).collect();
    let mut hosts = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        hosts.push(Host::create(
            dir,
            *id,
            &ids,
            &listens,
            setup(plan.skew_ms[i]),
        )?);
    }
    let spare = match plan.membership {
        Some(_) if chaos => {
            let spare = plan.nodes + 1;
            let all: Vec<u64> = (1..=spare).collect();
            let at: Vec<SocketAddr> = all.iter().map(|id| client_addr(*id)).collect();
            Some(Host::create(dir, spare, &all, &at, setup(0))?)
        }
        _ => None,
    };
    Ok((hosts, spare))
}

/// The client's host: the leader watcher and the program.
fn start_client(
    cluster: &mut Cluster,
    net: &SimNet,
    plan: &Plan,
    program: Program,
    shared: &Shared,
    operator: operator::Operator,
) -> anyhow::Result<()> {
    let listens: Vec<SocketAddr> = (1..=plan.nodes).map(client_addr).collect();
    let client = cluster.world.add_host()?;
    // Clients are made on the client's host: a channel needs its runtime.
    cluster.world.spawn(client, {
        let (net, listens, leaders) = (net.clone(), listens.clone(), shared.leaders.clone());
        let queues = program.queues();
        async move { watch_leaders(clients(&net, &listens), queues, leaders).await }
    });
    let (idle, first_route) = (plan.idle_queues, plan.first_route);
    let (trace, done, net) = (shared.trace.clone(), shared.done.clone(), net.clone());
    cluster.world.spawn(client, async move {
        let clients = clients(&net, &listens);
        match program {
            Program::Messages(n) => workload(clients, trace, n, idle).await,
            Program::Chaos(length) => {
                let run = chaos::Run {
                    idle,
                    first_route,
                    length,
                    operator,
                };
                chaos::client(clients, trace, run).await
            }
        }
        done.store(true, Ordering::Relaxed);
    });
    Ok(())
}

/// The world's loop: steps the world 10 ms at a time until the client is done or `deadline`,
/// striking and healing the plan's faults and serving the client's requests between steps.
fn drive(
    cluster: &mut Cluster,
    plan: &Plan,
    deadline: Duration,
    shared: &Shared,
    requests: &operator::Requests,
    mut spare: Option<Host>,
) -> anyhow::Result<()> {
    let note = |what: String, at: Duration| {
        let at = at.as_millis();
        shared
            .trace
            .lock()
            .expect("trace")
            .push(format!("{at:>6} {what}"));
    };
    let mut planned = plan.faults.iter().peekable();
    while !shared.done.load(Ordering::Relaxed) && cluster.world.elapsed() < deadline {
        cluster.world.run_for(Duration::from_millis(10));
        let now = cluster.world.elapsed();
        for healed in cluster.heal_due(now)? {
            note(healed, now);
        }
        while let Some(p) = planned.next_if(|p| Duration::from_millis(p.at_ms) <= now) {
            let node = target_node(&p.fault, &shared.leaders);
            let until = now + Duration::from_millis(p.length_ms);
            let what = cluster.strike(p.fault, node, until);
            note(format!("strike {:?} on node {node}: {what}", p.fault), now);
        }
        for request in requests.take() {
            note(serve(cluster, &mut spare, request), now);
        }
    }
    for healed in cluster.heal_all()? {
        note(healed, cluster.world.elapsed());
    }
    cluster.end_spare();
    Ok(())
}

/// Does what the client asked of the cluster; returns it, for the trace.
fn serve(cluster: &mut Cluster, spare: &mut Option<Host>, request: operator::Request) -> String {
    match request {
        operator::Request::StartSpare(reply) => {
            let started = match spare.take() {
                Some(host) => cluster.start_spare(host),
                None => Err(anyhow::anyhow!("no spare to start")),
            };
            let what = format!("start the spare: {:?}", started.as_ref().map(|_| ()));
            let _ = reply.send(started);
            what
        }
        operator::Request::Wipe(node, reply) => {
            let wiped = cluster.wipe(node);
            let what = format!("wipe node {node}: {:?}", wiped.as_ref().map(|_| ()));
            let _ = reply.send(wiped);
            what
        }
    }
}

/// The node a fault strikes: a "leader of" target is the queue's leader as last seen.
fn target_node(fault: &Fault, leaders: &Leaders) -> u64 {
    match fault.target() {
        Some(Target::Node(id)) => id,
        Some(Target::LeaderOf(q)) => leaders[q % leaders.len()].load(Ordering::Relaxed),
        // A bridge names its two nodes itself (faults::link); 0, as the real-time run notes it.
        None => 0,
    }
}

/// A client of every node, over the simulated network.
fn clients(net: &SimNet, listens: &[SocketAddr]) -> Vec<Client> {
    listens.iter().map(|a| client_of(net, *a)).collect()
}

/// A client of the node listening at `address`, over the simulated network.
fn client_of(net: &SimNet, address: SocketAddr) -> Client {
    Client::connect_lazy_via(&address.to_string(), None, |endpoint| {
        net.transport(CLIENT).channel(endpoint)
    })
    .expect("a valid address")
}

/// Keeps each of `leaders` at its queue's leader, as the first node that answers says, every
/// 500 ms.
async fn watch_leaders(clients: Vec<Client>, queues: Vec<String>, leaders: Leaders) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (queue, leader) in queues.iter().zip(leaders.iter()) {
            for c in &clients {
                if let Ok(q) = c.get_queue(queue).await
                    && q.leader != 0
                {
                    leader.store(q.leader, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
}

/// A check's line in the trace (what [`Replayed`] reads).
fn check_line(name: &str, ok: bool, detail: &str) -> String {
    format!(
        "check {name}: {} {detail}",
        if ok { "ok" } else { "FAILED" }
    )
}

/// The client's work (module doc); every step noted with the client's virtual time.
async fn workload(clients: Vec<Client>, trace: Trace, messages: u32, idle: usize) {
    let start = Instant::now();
    let note = |what: String| {
        let at = start.elapsed().as_millis();
        trace.lock().expect("trace").push(format!("{at:>6} {what}"));
    };
    let retry = || tokio::time::sleep(Duration::from_millis(200));
    loop {
        match clients[0].declare_queue(QUEUE, HashMap::new()).await {
            Ok(r) => {
                note(format!("declare {QUEUE} via node 1: {r:?}"));
                break;
            }
            Err(e) => note(format!("declare {QUEUE} via node 1: {e}")),
        }
        retry().await;
    }
    // Queues nobody touches until the end: their groups sleep (and may unload) under the faults.
    let declared = qq_chaos::idle::declare(&clients, idle).await;
    note(format!("declare {idle} idle queues: {declared:?}"));
    for i in 0..messages {
        tokio::time::sleep(PACE).await;
        // Through every node in turn; a refused publish is tried again through the next.
        for attempt in 0.. {
            let via = (i as usize + attempt) % clients.len();
            let message = Message {
                body: format!("m{i}").into(),
                ..Default::default()
            };
            // Outcomes and messages only: a status's metadata holds the HTTP date header, the
            // real time.
            let confirmed = match clients[via].publish("", QUEUE, message).await {
                Ok(c) => Ok(format!("{:?} {}", c.outcome, c.detail)),
                Err(e) => Err(e.to_string()),
            };
            note(format!("publish m{i} via node {}: {confirmed:?}", via + 1));
            if confirmed.is_ok() {
                break;
            }
            retry().await;
        }
    }
    // Taken back through node 2 until every message has come (a publish tried again after its
    // confirm was lost may be stored twice: noted, not an error).
    let mut taken = std::collections::BTreeSet::new();
    while taken.len() < messages as usize {
        match clients[1].get(QUEUE, true, 0).await {
            Ok(got) => match got.delivery.and_then(|d| d.message) {
                Some(m) => {
                    let again = !taken.insert(m.body.clone());
                    let again = if again { " (again)" } else { "" };
                    note(format!("get via node 2: {:?}{again}", m.body));
                }
                None => {
                    note("get via node 2: empty".into());
                    retry().await;
                }
            },
            Err(e) => {
                note(format!("get via node 2: {e}"));
                retry().await;
            }
        }
    }
    let back = taken.len() == messages as usize;
    let detail = format!("{} of {messages}", taken.len());
    note(check_line("every message back", back, &detail));
    let idle = qq_chaos::idle::check(&clients, idle).await;
    note(check_line(&idle.name, idle.ok, &idle.detail));
    for (i, c) in clients.iter().enumerate() {
        let seen = match c.get_queue(QUEUE).await {
            Ok(q) => Ok((q.leader, q.raft_term, q.commit_index, q.messages)),
            Err(e) => Err(e.to_string()),
        };
        note(format!(
            "node {}: (leader, term, commit index, messages) {seen:?}",
            i + 1
        ));
    }
}

#[cfg(test)]
mod tests;
