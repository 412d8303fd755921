//! The replay's nodes on their [`World`] hosts, and a plan's faults struck and healed on them.
//!
//! The links come from [`faults::link`], as in the real-time simulator, so a fault does to the
//! links what it does there; between the nodes only (the client's links stay clean, as its
//! loopback TCP does there). What differs is how a node is stopped: a crash drops the host's
//! runtime ([`World::crash`]) after freezing the node's store, and cuts its WAL back to the
//! freeze once the store has closed; a pause is a host the world skips.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use qq_chaos::membership::Spare;
use tokio::sync::oneshot;

use qq_node::clock::Clock;
use qq_node::node::Seams;
use qq_raft::clock::WallJump;

use crate::faults::{Active, link};
use crate::host::Host;
use crate::lockstep::World;
use crate::net::{Link, SimNet};
use crate::schedule::Fault;

/// Every node's wall clock at its start (ms since the epoch): a fixed moment, not the time of
/// the run, so that message timestamps replay too. The world's thread reads it, plus the
/// world's time, as its system wall clock ([`crate::wall_clock`]).
pub(super) const EPOCH_MS: u64 = 1_790_000_000_000;

/// One node: its files, its host in the world, its clock's jump once started.
struct Node {
    host: Host,
    index: usize,
    jump: Arc<Mutex<Option<WallJump>>>,
    down: bool,
}

pub(super) struct Cluster {
    pub(super) world: World,
    net: SimNet,
    nodes: Vec<Node>,
    weather: Link,
    active: Vec<Active>,
    /// The host of the spare of a membership change, once started.
    spare: Option<usize>,
}

impl Cluster {
    /// Starts `hosts` on hosts of `world` (added in their order), their links `weather`.
    pub(super) fn start(
        mut world: World,
        net: SimNet,
        hosts: Vec<Host>,
        weather: Link,
    ) -> anyhow::Result<Cluster> {
        let mut nodes = Vec::new();
        for host in hosts {
            let index = world.add_host()?;
            let jump = Arc::default();
            nodes.push(Node {
                host,
                index,
                jump,
                down: false,
            });
        }
        let mut cluster = Cluster {
            world,
            net,
            nodes,
            weather,
            active: Vec::new(),
            spare: None,
        };
        for i in 0..cluster.nodes.len() {
            cluster.spawn_node(i)?;
        }
        cluster.apply();
        Ok(cluster)
    }

    /// Runs node `i` on its host.
    fn spawn_node(&mut self, i: usize) -> anyhow::Result<()> {
        spawn(&self.world, &self.net, &self.nodes[i], None)
    }

    /// Starts `host` (the spare of a membership change, empty) on a host of its own; its links
    /// stay clean and no fault strikes it, as in the real-time runs.
    pub(super) fn start_spare(&mut self, host: Host) -> anyhow::Result<SpareStop> {
        let index = self.world.add_host()?;
        let node = Node {
            host,
            index,
            jump: Arc::default(),
            down: false,
        };
        let (stop_tx, stop_rx) = oneshot::channel();
        let (ended_tx, ended_rx) = oneshot::channel();
        spawn(&self.world, &self.net, &node, Some((stop_rx, ended_tx)))?;
        self.spare = Some(index);
        Ok(SpareStop {
            stop: Some(stop_tx),
            ended: Some(ended_rx),
        })
    }

    /// A lost disk: crashes node `id`, deletes its data directory and starts it again empty;
    /// returns its host's index in the world.
    pub(super) fn wipe(&mut self, id: u64) -> anyhow::Result<usize> {
        let i = self.position(id);
        self.crash(id);
        self.nodes[i].host.wipe()?;
        let restarted = self.restart_if_down(id)?;
        anyhow::ensure!(restarted, "node {id} was not restarted after its wipe");
        Ok(self.nodes[i].index)
    }

    /// Ends the spare's host, if it ran (its node has stopped by then, or the run failed).
    pub(super) fn end_spare(&mut self) {
        if let Some(index) = self.spare.take() {
            self.world.crash(index);
        }
    }

    fn position(&self, id: u64) -> usize {
        self.nodes
            .iter()
            .position(|n| n.host.id == id)
            .expect("a node of the cluster")
    }

    /// Links, pauses and clock jumps as the weather and the faults under way make them.
    fn apply(&mut self) {
        let ids: Vec<u64> = self.nodes.iter().map(|n| n.host.id).collect();
        for from in &ids {
            for to in &ids {
                if from != to {
                    let l = link(self.weather, &self.active, *from, *to);
                    self.net.set_link(*from, *to, l);
                }
            }
        }
        for node in &self.nodes {
            let on_it = |f: fn(&Fault) -> bool| {
                self.active
                    .iter()
                    .filter(move |a| a.node == node.host.id && f(&a.fault))
            };
            let paused = on_it(|f| matches!(f, Fault::Pause { .. })).count() > 0;
            self.world.set_paused(node.index, paused);
            let jump_ms = on_it(|f| matches!(f, Fault::ClockJump { .. }))
                .map(|a| match a.fault {
                    Fault::ClockJump { jump_ms, .. } => jump_ms,
                    _ => 0,
                })
                .sum();
            if let Some(jump) = *node.jump.lock().expect("jump") {
                jump.set(jump_ms);
            }
        }
    }

    /// Strikes `fault` on `node` until `until`; returns what it did, for the trace.
    pub(super) fn strike(&mut self, fault: Fault, node: u64, until: Duration) -> String {
        let what = match fault {
            Fault::Reset { .. } => {
                let others: Vec<u64> = self.nodes.iter().map(|n| n.host.id).collect();
                let cut: usize = others
                    .into_iter()
                    .filter(|o| *o != node)
                    .map(|o| self.net.cut(node, o))
                    .sum();
                format!("{cut} connections reset")
            }
            Fault::Crash { .. } => self.crash(node),
            Fault::Pause { .. } => "paused".into(),
            Fault::ClockJump { jump_ms, .. } => format!("wall clock {jump_ms:+} ms"),
            _ => "links changed".into(),
        };
        self.active.push(Active { fault, node, until });
        self.apply();
        what
    }

    /// Freezes the node's store, drops its runtime, and cuts its WAL back to the freeze.
    fn crash(&mut self, id: u64) -> String {
        let i = self.position(id);
        if self.nodes[i].down {
            return "already down".into();
        }
        let frozen = self.nodes[i].host.take_store().map(|s| s.freeze());
        self.world.crash(self.nodes[i].index);
        self.nodes[i].down = true;
        *self.nodes[i].jump.lock().expect("jump") = None;
        match frozen.map(|f| f.and_then(|cut| cut.apply())) {
            Some(Ok(cut)) => format!(
                "crashed; {} unsynced WAL bytes lost from {} files",
                cut.bytes, cut.files
            ),
            Some(Err(e)) => format!("crashed (WAL not cut: {e})"),
            None => "crashed before its store opened".into(),
        }
    }

    /// Heals what is due at `now`; returns it, with a restart noted for a crashed node.
    pub(super) fn heal_due(&mut self, now: Duration) -> anyhow::Result<Vec<String>> {
        let (due, kept): (Vec<Active>, Vec<Active>) =
            self.active.drain(..).partition(|a| a.until <= now);
        self.active = kept;
        self.apply();
        let mut healed = Vec::new();
        for a in due {
            let mut what = format!("heal {:?} on node {}", a.fault, a.node);
            if self.restart_if_down(a.node)? {
                what.push_str(": restarted");
            }
            healed.push(what);
        }
        Ok(healed)
    }

    /// Heals everything still under way.
    pub(super) fn heal_all(&mut self) -> anyhow::Result<Vec<String>> {
        let all = self.active.iter().map(|a| a.until).max();
        match all {
            Some(until) => self.heal_due(until),
            None => Ok(Vec::new()),
        }
    }

    /// Starts a crashed node again once no crash under way holds it down.
    fn restart_if_down(&mut self, id: u64) -> anyhow::Result<bool> {
        // A bridge's node is 0: it names its two nodes itself and crashes none.
        let Some(i) = self.nodes.iter().position(|n| n.host.id == id) else {
            return Ok(false);
        };
        let held = self
            .active
            .iter()
            .any(|a| a.node == id && matches!(a.fault, Fault::Crash { .. }));
        if !self.nodes[i].down || held {
            return Ok(false);
        }
        self.world.restart(self.nodes[i].index)?;
        self.nodes[i].down = false;
        self.spawn_node(i)?;
        Ok(true)
    }
}

/// Runs `node` on its host, its wall clock at the world's time plus its skew. With `stop`, a
/// graceful stop ends it (as SIGTERM does) and its end is reported; without, only a crash.
fn spawn(
    world: &World,
    net: &SimNet,
    node: &Node,
    stop: Option<(oneshot::Receiver<()>, oneshot::Sender<anyhow::Result<()>>)>,
) -> anyhow::Result<()> {
    let (config, disk, id) = (node.host.config()?, node.host.disk(), node.host.id);
    let (transport, clients) = (net.transport(id), net.transport(id));
    let jump_slot = node.jump.clone();
    let epoch = EPOCH_MS as i64 + world.elapsed().as_millis() as i64 + node.host.skew_ms;
    world.spawn(node.index, async move {
        // Made on the host's runtime, so the clock counts the host's virtual time.
        let (clock, jump) = Clock::jumpable(epoch.max(0) as u64);
        *jump_slot.lock().expect("jump") = Some(jump);
        let seams = Seams {
            clock,
            transport,
            clients,
            disk,
        };
        let (stopped, report) = stop.unzip();
        let shutdown = async move {
            match stopped {
                Some(stop) => {
                    let _ = stop.await;
                }
                None => std::future::pending().await,
            }
        };
        let ended = qq_node::server::run(config, seams, shutdown).await;
        match report {
            Some(report) => {
                let _ = report.send(ended);
            }
            None => tracing::error!(node = id, "node ended: {ended:?}"),
        }
    });
    Ok(())
}

/// The spare as its membership change stops it: a graceful stop, then its end awaited.
pub(super) struct SpareStop {
    stop: Option<oneshot::Sender<()>>,
    ended: Option<oneshot::Receiver<anyhow::Result<()>>>,
}

impl Spare for SpareStop {
    async fn stop_spare(&mut self, id: u64) -> anyhow::Result<String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let ended = self.ended.take().context("stopped already")?;
        ended
            .await
            .map_err(|_| anyhow::anyhow!("node {id}'s host ended before the node"))?
            .with_context(|| format!("node {id} ended"))?;
        Ok(format!("node {id} stopped gracefully"))
    }
}
