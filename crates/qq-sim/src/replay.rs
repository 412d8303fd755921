//! Three real nodes and a client on one [`World`]: the first run of the cluster that replays
//! byte for byte.
//!
//! [`run`] starts three `qq_node::server::run` nodes, each on a host of a [`World`], their
//! cluster ports and their gRPC client ports on one [`SimNet`] (mutual TLS between the nodes, as
//! in production), and a client on a fourth host that declares a queue, publishes to it through
//! every node in turn with confirms, and takes every message back through one node. Every
//! operation the client makes goes into the trace with its result and the client's virtual time,
//! and at the end each node's view of the queue (leader, term, commit index, counts).
//!
//! The thread that runs it seeds its entropy ([`crate::entropy`]) and does its own blocking work
//! ([`qq_raft::lockstep`]), and every node's clock starts at the same fixed epoch, so two runs of
//! one seed (two processes) give the same trace: `replay_tests` checks it.
//!
//! Not in it yet: faults (the liveness probe of a lost peer still dials TCP), the chaos
//! workload, AMQP.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qq_client::{Client, Message};
use qq_node::clock::Clock;
use qq_node::node::Seams;
use tokio::time::Instant;

use crate::entropy::seed_this_thread;
use crate::host::{Host, NodeSetup};
use crate::lockstep::World;
use crate::net::SimNet;

/// Every node's wall clock at its start (ms since the epoch): a fixed moment, not the time of
/// the run, so that message timestamps replay too.
const EPOCH_MS: u64 = 1_790_000_000_000;
/// The client's id on the simulated network.
const CLIENT: u64 = 100;
/// The queue the client uses.
const QUEUE: &str = "replay.q";
/// Give up after this much virtual time.
const DEADLINE: Duration = Duration::from_secs(120);

type Trace = Arc<Mutex<Vec<String>>>;

/// The gRPC client address of node `id` on the simulated network (never a socket).
fn client_addr(id: u64) -> SocketAddr {
    SocketAddr::from(([10, 77, 1, id as u8], 5000))
}

/// Runs seed `seed` with `messages` messages in `dir` (which must not hold a run already), on a
/// thread of its own, and returns the trace.
pub fn run(seed: u64, dir: &Path, messages: u32) -> anyhow::Result<Vec<String>> {
    let dir = dir.to_path_buf();
    std::thread::Builder::new()
        .name("qq-sim-world".into())
        .spawn(move || {
            seed_this_thread(seed);
            qq_raft::lockstep::mark_this_thread();
            let log = std::fs::File::create(dir.join("nodes.log"))?;
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("QQ_SIM_NODE_LOG")
                        .unwrap_or_else(|_| "info,openraft=error".into()),
                )
                .with_ansi(false)
                .with_writer(Mutex::new(log))
                .finish();
            let _logs = tracing::subscriber::set_default(subscriber);
            run_on_this_thread(seed, &dir, messages)
        })?
        .join()
        .map_err(|_| anyhow::anyhow!("the world's thread panicked"))?
}

fn run_on_this_thread(seed: u64, dir: &Path, messages: u32) -> anyhow::Result<Vec<String>> {
    let ids = [1u64, 2, 3];
    let listens: Vec<SocketAddr> = ids.iter().map(|id| client_addr(*id)).collect();
    let net = SimNet::new(seed);
    let mut world = World::new(Duration::from_millis(1));
    let trace: Trace = Arc::default();
    for id in ids {
        let setup = NodeSetup {
            skew_ms: 0,
            snapshot_after_entries: 1_000,
            amqp: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let host = Host::create(dir, id, &ids, &listens, setup)?;
        let (config, disk) = (host.config()?, host.disk());
        let h = world.add_host()?;
        let (transport, clients) = (net.transport(id), net.transport(id));
        world.spawn(h, async move {
            // Made on the host's runtime, so the clock counts the host's virtual time.
            let (clock, _jump) = Clock::jumpable(EPOCH_MS);
            let seams = Seams {
                clock,
                transport,
                clients,
                disk,
            };
            let ended = qq_node::server::run(config, seams, std::future::pending()).await;
            tracing::error!(node = id, "node ended: {ended:?}");
        });
    }
    let done = Arc::new(AtomicBool::new(false));
    let client = world.add_host()?;
    world.spawn(client, {
        let (net, trace, done) = (net.clone(), trace.clone(), done.clone());
        async move {
            workload(net, listens, trace, messages).await;
            done.store(true, Ordering::Relaxed);
        }
    });
    while !done.load(Ordering::Relaxed) && world.elapsed() < DEADLINE {
        world.run_for(Duration::from_millis(10));
    }
    let mut trace = trace.lock().expect("trace").clone();
    if !done.load(Ordering::Relaxed) {
        trace.push(format!("not done after {DEADLINE:?} of virtual time"));
    }
    Ok(trace)
}

/// The client's work (module doc); every step noted with the client's virtual time.
async fn workload(net: SimNet, listens: Vec<SocketAddr>, trace: Trace, messages: u32) {
    let start = Instant::now();
    let note = |what: String| {
        let at = start.elapsed().as_millis();
        trace.lock().expect("trace").push(format!("{at:>6} {what}"));
    };
    let clients: Vec<Client> = listens
        .iter()
        .map(|a| {
            Client::connect_lazy_via(&a.to_string(), None, |endpoint| {
                net.transport(CLIENT).channel(endpoint)
            })
            .expect("a valid address")
        })
        .collect();
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
    for i in 0..messages {
        let via = i as usize % clients.len();
        let message = Message {
            body: format!("m{i}").into(),
            ..Default::default()
        };
        loop {
            let confirm = clients[via].publish("", QUEUE, message.clone()).await;
            note(format!("publish m{i} via node {}: {confirm:?}", via + 1));
            if confirm.is_ok() {
                break;
            }
            retry().await;
        }
    }
    let mut taken = 0;
    while taken < messages {
        match clients[1].get(QUEUE, true, 0).await {
            Ok(got) => match got.delivery.and_then(|d| d.message) {
                Some(m) => {
                    taken += 1;
                    note(format!("get via node 2: {:?}", m.body));
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
    for (i, c) in clients.iter().enumerate() {
        let seen = c.get_queue(QUEUE).await.map(|q| {
            let messages = q.messages;
            (q.leader, q.raft_term, q.commit_index, messages)
        });
        note(format!(
            "node {}: (leader, term, commit index, messages) {seen:?}",
            i + 1
        ));
    }
}

#[cfg(test)]
mod tests;
