//! One node of the simulated cluster: the real `qq_node::server::run`, on its own thread and
//! its own single-threaded tokio runtime, its cluster port on the [`SimNet`], its client port
//! on loopback TCP (the workload's clients are outside the simulated network).
//!
//! What each fault does to it:
//! - **crash** ([`Host::crash`]): the node's store is frozen first ([`Store::freeze`]: from
//!   that moment nothing is synced or acknowledged), then the runtime is dropped with every
//!   task of the node in it, as `kill -9` ends a process: nothing is handed over; the pipes of
//!   its connections close, so its peers see them end. Once the store has closed, its WAL is
//!   cut back to what the disk held at the freeze ([`qq_raft::store::WalCut`]), and the node
//!   starts again from the directory ([`Host::start`]). So what a `kill -9` loses is lost: the
//!   WAL buffer written since the last fsync and the bodies still in a memtable. What the
//!   kernel had been given survives, as the page cache keeps it: a power loss is not
//!   simulated.
//! - **pause** ([`Host::pause`]): a task on the node's runtime blocks its thread, so none of
//!   the node's tasks runs and none of its timers fires until it ends, as `SIGSTOP` does (the
//!   node's fsync thread and RocksDB's own threads keep running).
//! - **graceful stop** ([`Host::stop`]): the shutdown signal `qq-node` gets from SIGTERM.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use qq_node::clock::Clock;
use qq_node::config::{Args, Config};
use qq_node::node::Seams;
use qq_raft::clock::WallJump;
use qq_raft::store::{CutStats, Disk, Store};
use tokio::sync::oneshot;

use crate::net::SimNet;

/// How long a crashed node's runtime may take to drop its blocking tasks.
const CRASH_GRACE: Duration = Duration::from_secs(10);

/// How a running node is asked to end.
enum End {
    Crash,
    Graceful,
}

/// What a plan sets on each node.
#[derive(Clone, Copy, Debug)]
pub struct NodeSetup {
    /// How far this node's wall clock is off the others' (ms).
    pub skew_ms: i64,
    pub snapshot_after_entries: u64,
    /// The AMQP listener's port (loopback).
    pub amqp: SocketAddr,
}

/// One node's identity and files.
pub struct Host {
    pub id: u64,
    /// The client port (loopback TCP).
    pub listen: SocketAddr,
    config_path: PathBuf,
    log_path: PathBuf,
    data_dir: PathBuf,
    /// How far this node's wall clock is off the others' (ms).
    pub skew_ms: i64,
    /// The AMQP port (loopback).
    pub amqp: SocketAddr,
    /// How far its wall clock has jumped now (ms), on top of the skew.
    jump_ms: i64,
    running: Option<Running>,
    /// The store the running node opened (to freeze it at a crash); released before the node
    /// is joined, so that the database closes with it.
    store: Arc<Mutex<Option<Store>>>,
    /// Storage faults the node's store reported (in production each stops the process).
    faults: Arc<Mutex<Vec<String>>>,
}

struct Running {
    end: oneshot::Sender<End>,
    jump: WallJump,
    runtime: tokio::runtime::Handle,
    thread: JoinHandle<anyhow::Result<()>>,
}

/// The cluster address of node `id` on the simulated network (never a socket).
pub fn cluster_addr(id: u64) -> SocketAddr {
    SocketAddr::from(([10, 77, 0, id as u8], 7000))
}

/// Node `id`'s certificate, key and the run's CA (made once per run in `dir/ca`), as
/// `qq-node certs` makes them; in `dir/tls{id}`, apart from the data directory, so a node
/// that loses its disk keeps them, as an operator's configuration does.
fn node_certs(dir: &Path, id: u64) -> anyhow::Result<PathBuf> {
    let out = dir.join(format!("tls{id}"));
    qq_node::certs::write(&qq_node::certs::CertsArgs {
        ca_dir: dir.join("ca"),
        out: out.clone(),
        name: format!("node{id}"),
        dns: Vec::new(),
        hosts: Vec::new(),
        ca_days: qq_node::certs::DEFAULT_CA_DAYS,
        days: qq_node::certs::DEFAULT_NODE_DAYS,
        force: false,
    })
    .with_context(|| format!("certificates of node {id}"))?;
    Ok(out)
}

impl Host {
    /// Writes the configuration of node `id` of `ids` under `dir` (not started yet).
    pub fn create(
        dir: &Path,
        id: u64,
        ids: &[u64],
        listens: &[SocketAddr],
        setup: NodeSetup,
    ) -> anyhow::Result<Host> {
        let listen = listens[ids.iter().position(|i| *i == id).expect("id in ids")];
        let peers: Vec<String> = ids
            .iter()
            .zip(listens)
            .map(|(i, l)| {
                format!(
                    "{{ id = {i}, address = \"{l}\", cluster_address = \"{}\" }}",
                    cluster_addr(*i)
                )
            })
            .collect();
        let data = dir.join(format!("node{id}"));
        std::fs::create_dir_all(&data)?;
        let config_path = dir.join(format!("node{id}.toml"));
        let tls = node_certs(dir, id)?;
        // Mutual TLS between the nodes, as in production, over the simulated connections.
        // The memory alarm is off: three nodes share this process's memory.
        let text = format!(
            "node_id = {id}\nlisten = \"{listen}\"\ncluster_addr = \"{}\"\ndata_dir = \"{}\"\n\
             cluster_ca = \"{ca}\"\ncluster_cert = \"{cert}\"\ncluster_key = \"{key}\"\n\
             memory_high_watermark_bytes = {}\n\
             snapshot_after_entries = {}\namqp_addr = \"{}\"\npeers = [{}]\n",
            cluster_addr(id),
            data.display(),
            u64::MAX / 2,
            setup.snapshot_after_entries,
            setup.amqp,
            peers.join(", "),
            ca = tls.join("ca.pem").display(),
            cert = tls.join("node.pem").display(),
            key = tls.join("node.key").display(),
        );
        std::fs::write(&config_path, text)?;
        Ok(Host {
            id,
            listen,
            config_path,
            log_path: dir.join(format!("node{id}.log")),
            data_dir: data.clone(),
            skew_ms: setup.skew_ms,
            amqp: setup.amqp,
            jump_ms: 0,
            running: None,
            store: Arc::default(),
            faults: Arc::default(),
        })
    }

    /// `n` distinct free loopback ports (all held until all are found, so none repeats).
    pub fn free_ports(n: usize) -> anyhow::Result<Vec<SocketAddr>> {
        let held = (0..n)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(held
            .iter()
            .map(|l| l.local_addr())
            .collect::<Result<Vec<_>, _>>()?)
    }

    pub fn is_running(&self) -> bool {
        self.running
            .as_ref()
            .is_some_and(|r| !r.thread.is_finished())
    }

    /// The node's configuration, as `qq-node --config` loads it.
    pub fn config(&self) -> anyhow::Result<Config> {
        let args = Args::try_parse_from([
            "qq-node".as_ref(),
            "--config".as_ref(),
            self.config_path.as_os_str(),
        ])?;
        Config::load(&args, &Default::default())
    }

    /// Starts the node on its own thread; its log goes to `node<id>.log`.
    pub fn start(&mut self, net: &SimNet) -> anyhow::Result<()> {
        anyhow::ensure!(self.running.is_none(), "node {} is running", self.id);
        let config = self.config()?;
        let disk = self.disk();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64;
        let skew = self.skew_ms;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("open {}", self.log_path.display()))?;
        let (clock, jump) = Clock::jumpable((wall + skew).max(0) as u64);
        jump.set(self.jump_ms);
        let seams = Seams {
            clock,
            transport: net.transport(self.id),
            clients: Arc::new(qq_raft::transport::TcpTransport),
            disk,
        };
        let (end_tx, end_rx) = oneshot::channel();
        let (handle_tx, handle_rx) = std_mpsc::channel();
        let id = self.id;
        let thread = std::thread::Builder::new()
            .name(format!("qq-sim-node{id}"))
            .spawn(move || -> anyhow::Result<()> {
                let subscriber = tracing_subscriber::fmt()
                    .with_env_filter(
                        tracing_subscriber::EnvFilter::try_from_env("QQ_SIM_NODE_LOG")
                            .unwrap_or_else(|_| "info,openraft=error".into()),
                    )
                    .with_ansi(false)
                    .with_writer(std::sync::Mutex::new(log))
                    .finish();
                let _logs = tracing::subscriber::set_default(subscriber);
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let _ = handle_tx.send(runtime.handle().clone());
                let (graceful_tx, graceful_rx) = oneshot::channel::<()>();
                let ended = runtime.block_on(async move {
                    let node = qq_node::server::run(config, seams, async move {
                        let _ = graceful_rx.await;
                    });
                    tokio::pin!(node);
                    tokio::select! {
                        r = &mut node => return r,
                        end = end_rx => match end {
                            Ok(End::Graceful) => {
                                let _ = graceful_tx.send(());
                            }
                            // Crash (or the host dropped).
                            _ => return Ok(()),
                        }
                    }
                    node.await
                });
                runtime.shutdown_timeout(CRASH_GRACE);
                ended
            })?;
        let runtime = handle_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("node {id}: its runtime did not start"))?;
        self.running = Some(Running {
            end: end_tx,
            jump,
            runtime,
            thread,
        });
        Ok(())
    }

    /// The disk the node's store is opened on: its store is kept for [`Host::crash`], and a
    /// storage fault is noted ([`Host::storage_faults`]) instead of ending the process.
    pub(crate) fn disk(&self) -> Disk {
        let (store, faults, id) = (self.store.clone(), self.faults.clone(), self.id);
        Disk::simulated(
            Arc::new(move |fault: &str| {
                tracing::error!(node = id, fault, "storage fault");
                faults.lock().expect("faults lock").push(fault.to_string());
            }),
            move |opened: &Store| *store.lock().expect("store lock") = Some(opened.clone()),
        )
    }

    /// Ends the node as `kill -9` would (module docs), waits until its files are closed, and
    /// cuts its WAL back to what the disk held at the kill; returns what was cut.
    pub fn crash(&mut self) -> anyhow::Result<CutStats> {
        let frozen = match self.store.lock().expect("store lock").take() {
            Some(store) if self.running.is_some() => Some(store.freeze()),
            _ => None,
        };
        // Ended even when the freeze failed: a crash must not leave the node running.
        let ended = self.end(End::Crash);
        let cut = match frozen {
            // The node's thread has ended, and its runtime waited for its blocking tasks.
            Some(Ok(cut)) => cut
                .apply()
                .with_context(|| format!("cut the WAL of crashed node {}", self.id))?,
            Some(Err(e)) => {
                return Err(e).with_context(|| format!("freeze the store of node {}", self.id));
            }
            None => CutStats::default(),
        };
        // A crashed node's own result is whatever the kill interrupted.
        if let Err(e) = ended {
            tracing::debug!(node = self.id, "crashed while ending with: {e:#}");
        }
        Ok(cut)
    }

    /// Stops the node as SIGTERM does (graceful handover) and waits for it.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.end(End::Graceful)
    }

    fn end(&mut self, how: End) -> anyhow::Result<()> {
        // Released first: the database closes with the node's last handle.
        drop(self.store.lock().expect("store lock").take());
        let Some(r) = self.running.take() else {
            return Ok(());
        };
        let _ = r.end.send(how);
        match r.thread.join() {
            Ok(result) => result.with_context(|| format!("node {}", self.id)),
            Err(_) => anyhow::bail!("node {} panicked", self.id),
        }
    }

    /// The storage faults its store reported so far.
    pub fn storage_faults(&self) -> Vec<String> {
        self.faults.lock().expect("faults lock").clone()
    }

    /// The store the running node opened, taken (to freeze it at a crash).
    pub(crate) fn take_store(&self) -> Option<Store> {
        self.store.lock().expect("store lock").take()
    }

    /// Deletes the data directory of the stopped node: a lost disk. It starts again empty.
    pub fn wipe(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.is_running(), "node {}: wiped while running", self.id);
        std::fs::remove_dir_all(&self.data_dir)
            .with_context(|| format!("wipe {}", self.data_dir.display()))?;
        std::fs::create_dir_all(&self.data_dir)?;
        Ok(())
    }

    /// How long its log is now, in bytes (for [`Host::log_after`]).
    pub fn log_len(&self) -> usize {
        std::fs::metadata(&self.log_path).map_or(0, |m| m.len() as usize)
    }

    /// What its log holds after its first `from` bytes.
    pub fn log_after(&self, from: usize) -> String {
        read_after(&self.log_path, from)
    }

    /// Freezes every task of the node for `length` (from now; returns at once).
    pub fn pause(&self, length: Duration) {
        if let Some(r) = &self.running {
            // The fault itself, not a wait: blocking the node's only worker thread stops
            // every task and timer of the node, as SIGSTOP stops a process.
            r.runtime.spawn(async move { std::thread::sleep(length) });
        }
    }

    /// Moves its wall clock `ms` away from where it would be (0: back), now and after a
    /// restart.
    pub fn set_jump(&mut self, ms: i64) {
        self.jump_ms = ms;
        if let Some(r) = &self.running {
            r.jump.set(ms);
        }
    }

    /// Whether the node ended by itself (an error or a panic), with what.
    pub fn ended_by_itself(&mut self) -> Option<String> {
        if !self.running.as_ref()?.thread.is_finished() {
            return None;
        }
        drop(self.store.lock().expect("store lock").take());
        let r = self.running.take()?;
        Some(match r.thread.join() {
            Ok(Ok(())) => "returned".to_string(),
            Ok(Err(e)) => format!("{e:#}"),
            Err(_) => "panicked".to_string(),
        })
    }

    /// The last `lines` of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.crash();
    }
}

/// The text of the file at `path` after its first `from` bytes (empty if it cannot be read):
/// only that part is read.
pub(crate) fn read_after(path: &Path, from: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut text = Vec::new();
    let read = std::fs::File::open(path).and_then(|mut f| {
        f.seek(SeekFrom::Start(from as u64))?;
        f.read_to_end(&mut text)
    });
    match read {
        Ok(_) => String::from_utf8_lossy(&text).into_owned(),
        Err(_) => String::new(),
    }
}
