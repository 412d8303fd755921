//! The two three-node clusters under test, as processes on this machine.
//!
//! quorumq: three `qq-node` processes started here, one generated config each, on
//! 127.0.0.1:7501-7503 (`GET /metrics` on 7701-7703, AMQP on 7801-7803) with their data under
//! `<run dir>/quorumq/nodeN`. RabbitMQ: three
//! `beam.smp` nodes managed by `bench/rabbitmq.sh` (AMQP on 127.0.0.1:5681-5683, data under
//! `<run dir>/rabbitmq`). Both start from empty data directories on every run.
//!
//! Scenarios need four things from a cluster: the OS pid of each node (for resident memory and
//! for `kill -9`), killing a node, starting it again, and waiting until it serves. Everything
//! else goes through the client [`crate::driver`], which also owns the node addresses
//! ([`qq_address`], [`crate::driver::rabbit_port`]).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::System;
use crate::driver::{Conn, qq_address, qq_amqp_port, qq_cluster_address, qq_http_address};

pub const NODES: usize = 3;

/// Resident memory of a process in KiB (`VmRSS` of `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn alive(pid: u32) -> bool {
    // A killed child stays a zombie until reaped; a zombie has no VmRSS.
    rss_kib(pid).is_some()
}

fn kill9(pid: u32) -> Result<()> {
    let status = Command::new("kill")
        .arg("-9")
        .arg(pid.to_string())
        .status()?;
    if !status.success() {
        bail!("kill -9 {pid} failed");
    }
    Ok(())
}

/// One of the two clusters.
pub enum Cluster {
    Qq(QqCluster),
    Rabbit(RabbitCluster),
}

impl Cluster {
    /// The system the scenarios drive: RabbitMQ, or quorumq through the client protocol last
    /// chosen with [`Cluster::drive_over`].
    pub fn system(&self) -> System {
        match self {
            Cluster::Qq(c) => c.client,
            Cluster::Rabbit(_) => System::Rabbitmq,
        }
    }

    /// Makes the scenarios drive quorumq over gRPC ([`System::Quorumq`]) or over its AMQP
    /// port ([`System::QuorumqAmqp`]); RabbitMQ is always AMQP.
    pub fn drive_over(&mut self, system: System) {
        if let Cluster::Qq(c) = self
            && system != System::Rabbitmq
        {
            c.client = system;
        }
    }

    /// OS pid of node `node`, if it runs.
    pub fn pid(&self, node: usize) -> Option<u32> {
        match self {
            Cluster::Qq(c) => c.pid(node),
            Cluster::Rabbit(c) => c.pid(node),
        }
    }

    /// Resident memory of every node in KiB (`None` for a node that does not run).
    pub fn rss_kib(&self) -> Vec<Option<u64>> {
        (0..NODES).map(|n| self.pid(n).and_then(rss_kib)).collect()
    }

    /// `kill -9` node `node` and wait until the process is gone.
    pub fn kill9(&mut self, node: usize) -> Result<()> {
        let pid = self
            .pid(node)
            .with_context(|| format!("node {} is not running", node + 1))?;
        kill9(pid)?;
        if let Cluster::Qq(c) = self {
            c.reap(node);
        }
        // A RabbitMQ node is not our child (no wait()): poll /proc until it is gone, and say so
        // if it never goes instead of timing a failover from a node still running.
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) {
            if Instant::now() >= deadline {
                bail!(
                    "node {} (pid {pid}) still alive 10 s after kill -9",
                    node + 1
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Starts node `node` again (returns once the process is spawned, not when it serves).
    pub fn start_node(&mut self, node: usize) -> Result<()> {
        match self {
            Cluster::Qq(c) => c.start_node(node),
            Cluster::Rabbit(c) => c.start_node(node),
        }
    }

    /// The node (0-based) leading `queue`.
    pub async fn leader(&self, queue: &str) -> Result<usize> {
        match self {
            Cluster::Qq(_) => {
                for node in 0..NODES {
                    if let Ok(Conn::Qq(c)) = Conn::connect(System::Quorumq, node).await
                        && let Ok(info) = c.get_queue(queue).await
                        && info.leader >= 1
                    {
                        return Ok(info.leader as usize - 1);
                    }
                }
                bail!("no quorumq node knows the leader of {queue}")
            }
            Cluster::Rabbit(c) => c.leader(queue),
        }
    }

    /// `rabbitmqctl` against RabbitMQ node `node` (0-based); its standard output.
    pub fn rabbitmqctl(&self, node: usize, args: &[&str]) -> Result<String> {
        match self {
            Cluster::Qq(_) => bail!("rabbitmqctl asked of the quorumq cluster"),
            Cluster::Rabbit(c) => c.script(&ctl_args(&(node + 1).to_string(), args)),
        }
    }

    /// `rabbitmqctl` against RabbitMQ node `node` (0-based), started in the background: the
    /// caller polls the child (its standard output is piped, standard error inherited).
    pub fn rabbitmqctl_spawn(&self, node: usize, args: &[&str]) -> Result<Child> {
        match self {
            Cluster::Qq(_) => bail!("rabbitmqctl asked of the quorumq cluster"),
            Cluster::Rabbit(c) => c.spawn_script(&ctl_args(&(node + 1).to_string(), args)),
        }
    }

    /// A directory of this run on the brokers' filesystem, for the disk probe's file.
    pub fn run_dir(&self) -> &Path {
        match self {
            Cluster::Qq(c) => &c.dir,
            Cluster::Rabbit(c) => &c.run_dir,
        }
    }

    /// The data directory of node `node`: quorumq's `data_dir`; RabbitMQ's mnesia directory
    /// (its database, its Ra logs, its node identity; not its logs).
    pub fn data_dir(&self, node: usize) -> PathBuf {
        match self {
            Cluster::Qq(c) => c.dir.join(format!("node{}", node + 1)),
            Cluster::Rabbit(c) => c
                .run_dir
                .join("rabbitmq")
                .join(format!("node{}", node + 1))
                .join("mnesia"),
        }
    }

    /// Removes the data directory ([`Cluster::data_dir`]) of node `node`, which must be down:
    /// the node then starts empty, as after an operator moved a damaged directory aside.
    pub fn wipe_data(&mut self, node: usize) -> Result<PathBuf> {
        if self.pid(node).is_some() {
            bail!("node {} runs: stop it before wiping its data", node + 1);
        }
        let dir = self.data_dir(node);
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
        }
        fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(dir)
    }

    /// Waits until every node runs and answers (starting any node that is down).
    pub async fn ensure_up(&mut self, timeout: Duration) -> Result<()> {
        for node in 0..NODES {
            if self.pid(node).is_none() {
                eprintln!("{}: node {} is down, starting it", self.system(), node + 1);
                self.start_node(node)?;
            }
        }
        for node in 0..NODES {
            self.wait_serving(node, timeout).await?;
        }
        Ok(())
    }

    /// Waits until node `node` accepts a client connection and answers a request.
    pub async fn wait_serving(&self, node: usize, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if self.answers(node).await {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!(
                    "{} node {} does not answer after {:?}",
                    self.system(),
                    node + 1,
                    timeout
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether node `node` accepts a client connection and answers a request now (within
    /// 10 s: a broker in trouble may accept a connection and never answer on it).
    pub(crate) async fn answers(&self, node: usize) -> bool {
        let probe = async {
            let Ok(conn) = Conn::connect(self.system(), node).await else {
                return false;
            };
            match &conn {
                Conn::Qq(c) => match c.cluster_status().await {
                    Ok(s) => s.metadata_leader != 0,
                    Err(_) => false,
                },
                Conn::Amqp(c) => {
                    let ok = c.create_channel().await.is_ok();
                    let _ = c.close(200, "probe".into()).await;
                    ok
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), probe)
            .await
            .unwrap_or(false)
    }

    /// Stops every node (by pid).
    pub fn shutdown(&mut self) {
        match self {
            Cluster::Qq(c) => c.shutdown(),
            Cluster::Rabbit(c) => c.shutdown(),
        }
    }
}

/// Three `qq-node` processes started by this benchmark.
pub struct QqCluster {
    bin: PathBuf,
    dir: PathBuf,
    children: Vec<Option<Child>>,
    /// How the scenarios speak to it (see [`Cluster::drive_over`]).
    client: System,
}

impl QqCluster {
    /// Writes the three configs into `<run_dir>/quorumq` (data wiped) and starts the nodes.
    /// `extra` are TOML lines (`key = value`) appended to every node's config.
    pub fn start(bin: &Path, run_dir: &Path, extra: &[String]) -> Result<QqCluster> {
        if !bin.exists() {
            bail!(
                "{} not found: build with `cargo build --workspace --release --bins`",
                bin.display()
            );
        }
        let dir = run_dir.join("quorumq");
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
        }
        fs::create_dir_all(&dir)?;
        let peers: Vec<String> = (0..NODES)
            .map(|n| {
                format!(
                    "    {{ id = {}, address = \"{}\", cluster_address = \"{}\" }},",
                    n + 1,
                    qq_address(n),
                    qq_cluster_address(n)
                )
            })
            .collect();
        for n in 0..NODES {
            // Mutual TLS between the nodes, as in production (the CA once, a cert per node).
            let tls = dir.join(format!("tls{}", n + 1));
            let made = std::process::Command::new(bin)
                .arg("certs")
                .arg("--ca-dir")
                .arg(dir.join("ca"))
                .arg("--out")
                .arg(&tls)
                .output()
                .with_context(|| format!("run {} certs", bin.display()))?;
            if !made.status.success() {
                bail!(
                    "qq-node certs failed: {}",
                    String::from_utf8_lossy(&made.stderr)
                );
            }
            // Every field at its default (cluster/node1.toml) except addresses, paths,
            // worker_threads and what --qq-set names.
            let mut config = format!(
                "node_id = {id}\nlisten = \"{addr}\"\npeers = [\n{peers}\n]\ndata_dir = \"{data}\"\n\
                 cluster_addr = \"{cluster}\"\ncluster_ca = \"{ca}\"\ncluster_cert = \"{cert}\"\n\
                 cluster_key = \"{key}\"\nhttp_addr = \"{http}\"\n\
                 amqp_addr = \"127.0.0.1:{amqp}\"\n",
                id = n + 1,
                amqp = qq_amqp_port(n),
                addr = qq_address(n),
                cluster = qq_cluster_address(n),
                http = qq_http_address(n),
                ca = tls.join("ca.pem").display(),
                cert = tls.join("node.pem").display(),
                key = tls.join("node.key").display(),
                peers = peers.join("\n"),
                data = dir.join(format!("node{}", n + 1)).display(),
            );
            // Three nodes and the client share this machine's cores: one worker thread per
            // node (docs/benchmarks.md, "Method"), unless --qq-set says otherwise.
            if !extra
                .iter()
                .any(|l| l.trim_start().starts_with("worker_threads"))
            {
                config.push_str("worker_threads = 1\n");
            }
            for line in extra {
                config.push_str(line);
                config.push('\n');
            }
            fs::write(dir.join(format!("node{}.toml", n + 1)), config)?;
        }
        let mut cluster = QqCluster {
            bin: bin.to_path_buf(),
            dir,
            children: (0..NODES).map(|_| None).collect(),
            client: System::Quorumq,
        };
        for n in 0..NODES {
            cluster.start_node(n)?;
        }
        Ok(cluster)
    }

    /// Restarts every node with `lines` as the scenario's own config lines (replacing those of
    /// an earlier call; `&[]` restores the usual config). Data is kept.
    pub fn restart_with(&mut self, lines: &[String]) -> Result<()> {
        const MARK: &str = "# set by a scenario";
        self.shutdown();
        for n in 0..NODES {
            let path = self.dir.join(format!("node{}.toml", n + 1));
            let config = fs::read_to_string(&path)?;
            let mut kept: String = config
                .lines()
                .filter(|l| !l.ends_with(MARK))
                .map(|l| format!("{l}\n"))
                .collect();
            for line in lines {
                kept.push_str(&format!("{line} {MARK}\n"));
            }
            fs::write(&path, kept)?;
        }
        for n in 0..NODES {
            self.start_node(n)?;
        }
        Ok(())
    }

    fn start_node(&mut self, node: usize) -> Result<()> {
        let log_path = self.dir.join(format!("node{}.log", node + 1));
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let child = Command::new(&self.bin)
            .arg("--config")
            .arg(self.dir.join(format!("node{}.toml", node + 1)))
            .env(
                "RUST_LOG",
                std::env::var("QQ_BENCH_NODE_LOG").unwrap_or_else(|_| "warn,openraft=error".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", self.bin.display()))?;
        self.children[node] = Some(child);
        Ok(())
    }

    fn pid(&self, node: usize) -> Option<u32> {
        let child = self.children.get(node)?.as_ref()?;
        let pid = child.id();
        alive(pid).then_some(pid)
    }

    fn reap(&mut self, node: usize) {
        if let Some(mut child) = self.children[node].take() {
            let _ = child.wait();
        }
    }

    fn shutdown(&mut self) {
        for node in 0..NODES {
            if let Some(child) = self.children[node].as_mut() {
                let _ = child.kill();
            }
            self.reap(node);
        }
    }
}

impl Drop for QqCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// `bench/rabbitmq.sh ctl N ARGS...`: rabbitmqctl against node N (1-based).
fn ctl_args<'a>(node: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["ctl", node];
    all.extend_from_slice(args);
    all
}

/// Three RabbitMQ nodes driven through `bench/rabbitmq.sh`.
pub struct RabbitCluster {
    script: PathBuf,
    run_dir: PathBuf,
}

impl RabbitCluster {
    /// Stops a previous benchmark cluster, wipes its data, starts and clusters three nodes.
    pub fn start(script: &Path, run_dir: &Path) -> Result<RabbitCluster> {
        let cluster = RabbitCluster {
            script: script.to_path_buf(),
            run_dir: run_dir.to_path_buf(),
        };
        cluster.script(&["down"])?;
        let dir = run_dir.join("rabbitmq");
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
        }
        cluster.script(&["up"])?;
        Ok(cluster)
    }

    fn script(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.script)
            .args(args)
            .env("QQ_BENCH_RUN_DIR", &self.run_dir)
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("run {}", self.script.display()))?;
        if !out.status.success() {
            bail!("{} {} failed", self.script.display(), args.join(" "));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn spawn_script(&self, args: &[&str]) -> Result<Child> {
        Command::new(&self.script)
            .args(args)
            .env("QQ_BENCH_RUN_DIR", &self.run_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("run {}", self.script.display()))
    }

    fn pid(&self, node: usize) -> Option<u32> {
        let file = self
            .run_dir
            .join("rabbitmq")
            .join(format!("node{}", node + 1))
            .join("mnesia")
            .join(format!("bench{}@localhost.pid", node + 1));
        let pid: u32 = fs::read_to_string(file).ok()?.trim().parse().ok()?;
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm.trim() == "beam.smp" && alive(pid)).then_some(pid)
    }

    fn start_node(&mut self, node: usize) -> Result<()> {
        self.script(&["start-node", &(node + 1).to_string()])?;
        Ok(())
    }

    fn leader(&self, queue: &str) -> Result<usize> {
        let n: usize = self
            .script(&["leader", queue])?
            .parse()
            .context("leader number")?;
        Ok(n - 1)
    }

    fn shutdown(&mut self) {
        let _ = self.script(&["down"]);
    }
}
