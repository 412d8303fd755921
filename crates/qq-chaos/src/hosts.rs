//! The hosts: network namespaces made by `cluster/netns.sh`, one `qq-node` process in each,
//! and the faults the nemesis puts between them (iptables rules inside the namespaces,
//! signals to the processes, `tc netem` qdiscs, graceful stops). Clients run on the host side
//! of the bridge and always reach every node; faults only ever cut node-to-node traffic.
//!
//! The founding nodes 1..=n run on hosts 1..=n (host number = node id). One more host,
//! [`SPARE_HOST`], is kept for the membership nemesis: it starts a *spare* node there that
//! joins the running cluster and is forgotten again. A forgotten id never joins again, so each
//! spare gets a new id (n+1, n+2, ...) on the same host, with its data directory wiped.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Namespaces `qqx1..4` on 10.78.0.1..4 (the runner's own, so a cluster started by hand with
/// `cluster/netns.sh start` on qqc/10.77.0 is left alone). Two runs at once on one machine
/// need their own: `QQ_CHAOS_NETNS_PREFIX` and `QQ_CHAOS_SUBNET` (e.g. `qqy`, `10.79.0`).
pub const PREFIX: &str = "qqx";
pub const SUBNET: &str = "10.78.0";

fn from_env(var: &str, default: &'static str) -> &'static str {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Box::leak(v.into_boxed_str()),
        _ => default,
    }
}

/// The namespace prefix of this run ([`PREFIX`] unless `QQ_CHAOS_NETNS_PREFIX` says).
pub fn prefix() -> &'static str {
    static P: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    P.get_or_init(|| from_env("QQ_CHAOS_NETNS_PREFIX", PREFIX))
}

/// The /24 of this run ([`SUBNET`] unless `QQ_CHAOS_SUBNET` says).
pub fn subnet() -> &'static str {
    static S: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    S.get_or_init(|| from_env("QQ_CHAOS_SUBNET", SUBNET))
}
pub const PORT: u16 = 7101;
/// The AMQP 0-9-1 port (`--protocol amqp`).
pub const AMQP_PORT: u16 = 5672;
/// Node-to-node (mutual TLS) port. The iptables faults drop by source address, so they cut
/// both ports alike.
pub const CLUSTER_PORT: u16 = 7201;
/// The host (namespace `qqx4`, 10.78.0.4) of the membership nemesis' spare nodes. Created with
/// the founders' hosts in every run; idle unless the membership nemesis strikes.
pub const SPARE_HOST: u64 = 4;
/// How long a spare node may take to stop after SIGTERM before it is killed.
const SPARE_STOP_LIMIT: Duration = Duration::from_secs(30);

/// The spare node currently configured on [`SPARE_HOST`] (running or stopped).
struct Spare {
    id: u64,
    proc: Option<Child>,
}

pub struct Hosts {
    script: PathBuf,
    node_bin: PathBuf,
    /// The binary a node runs until its first graceful stop (a rolling restart then upgrades
    /// it to `node_bin`); None: `node_bin` throughout.
    start_bin: Option<PathBuf>,
    /// Nodes stopped gracefully at least once: they run `node_bin` from then on.
    upgraded: std::collections::BTreeSet<u64>,
    dir: PathBuf,
    ids: Vec<u64>,
    procs: Vec<Option<Child>>,
    paused: Vec<bool>,
    /// Each node's data directory is a tmpfs of this many MiB (for the disk-full fault).
    small_disks: Option<u64>,
    spare: Option<Spare>,
    /// The id the next spare node gets (ids are never reused).
    next_spare_id: u64,
}

/// How often [`Hosts::stop_graceful`] looks whether the node has exited.
const EXIT_POLL: Duration = Duration::from_millis(50);

/// How a graceful stop ended.
#[derive(Debug)]
pub struct Stopped {
    pub status: std::process::ExitStatus,
    /// From SIGTERM to the exit.
    pub took: Duration,
    /// It had not exited in time and was killed with SIGKILL.
    pub killed: bool,
}

/// Exit code of a node stopped by a storage fault (`qq_raft::store::STORAGE_FAULT_EXIT_CODE`).
pub const STORAGE_FAULT_EXIT_CODE: i32 = 74;

/// The client address on `host` (for a founding node: its id).
pub fn address(host: u64) -> String {
    format!("{}.{host}:{PORT}", subnet())
}

/// The AMQP address on `host`.
pub fn amqp_address(host: u64) -> String {
    format!("{}.{host}:{AMQP_PORT}", subnet())
}

/// The node-to-node address on `host`.
pub fn cluster_address(host: u64) -> String {
    format!("{}.{host}:{CLUSTER_PORT}", subnet())
}

fn ns(host: u64) -> String {
    format!("{}{host}", prefix())
}

/// A `peers` entry of a node config: node `id` on `host`.
fn peer_toml(id: u64, host: u64) -> String {
    format!(
        "{{ id = {id}, address = \"{}\", cluster_address = \"{}\" }}",
        address(host),
        cluster_address(host)
    )
}

fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Hosts {
    /// Creates the namespaces (afresh: the founders' hosts and the spare host) and writes one
    /// config per founding node into `dir`.
    pub fn create(script: &Path, node_bin: &Path, dir: &Path, n: usize) -> anyhow::Result<Hosts> {
        anyhow::ensure!(
            n as u64 + 1 == SPARE_HOST,
            "{n} founding nodes: the spare host is {SPARE_HOST}"
        );
        let hosts = Hosts {
            script: script.to_path_buf(),
            node_bin: node_bin.to_path_buf(),
            start_bin: None,
            upgraded: Default::default(),
            dir: dir.to_path_buf(),
            ids: (1..=n as u64).collect(),
            procs: (0..n).map(|_| None).collect(),
            paused: vec![false; n],
            small_disks: None,
            spare: None,
            next_spare_id: n as u64 + 1,
        };
        hosts.netns("down")?;
        hosts.netns("up")?;
        std::fs::create_dir_all(dir)?;
        let peers: Vec<String> = hosts.ids.iter().map(|id| peer_toml(*id, *id)).collect();
        for id in &hosts.ids {
            hosts.write_config(*id, *id, &peers)?;
        }
        Ok(hosts)
    }

    /// Certificate and config of node `id` on `host`, listing `peers`.
    fn write_config(&self, id: u64, host: u64, peers: &[String]) -> anyhow::Result<()> {
        let dir = &self.dir;
        // Mutual TLS between the nodes, as in production: `qq-node certs` makes the CA once
        // (in dir/ca) and a certificate per node.
        let tls = dir.join(format!("tls{id}"));
        run(Command::new(&self.node_bin)
            .arg("certs")
            .arg("--ca-dir")
            .arg(dir.join("ca"))
            .arg("--out")
            .arg(&tls)
            .args(["--name", &format!("node{id}"), "--host"])
            .arg(format!("{}.{host}", subnet())))?;
        // Debug builds on two cores: the test nodes' timings (fast failover, still loose).
        // The workload connects as guest from the host, which is remote to the nodes'
        // namespaces: lift `loopback_users` on this private, throw-away network, and let AMQP
        // clients log in with guest's password over plain TCP (`allow_plaintext_auth`).
        let config = format!(
            "cluster_addr = \"{}\"\ncluster_ca = \"{}\"\ncluster_cert = \"{}\"\n\
             cluster_key = \"{}\"\n\
             node_id = {id}\nlisten = \"{}\"\namqp_addr = \"{}\"\npeers = [{}]\n\
             data_dir = \"{}\"\nallow_plaintext_auth = true\n\
             heartbeat_ms = 200\nelection_timeout_min_ms = 800\nelection_timeout_max_ms = 1600\n\
             dead_letter_retry_ms = 1000\nloopback_users = []\n",
            cluster_address(host),
            tls.join("ca.pem").display(),
            tls.join("node.pem").display(),
            tls.join("node.key").display(),
            address(host),
            amqp_address(host),
            peers.join(", "),
            self.data_dir(id).display()
        );
        std::fs::write(dir.join(format!("node{id}.toml")), config)?;
        Ok(())
    }

    fn netns(&self, cmd: &str) -> anyhow::Result<String> {
        run(Command::new("bash")
            .arg(&self.script)
            .arg(cmd)
            .env("QQ_NETNS_PREFIX", prefix())
            .env("QQ_NETNS_SUBNET", subnet())
            .env("QQ_NETNS_NODES", SPARE_HOST.to_string()))
    }

    /// The founding nodes (the faults other than membership pick among them).
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    fn slot(&self, id: u64) -> usize {
        (id - 1) as usize
    }

    fn is_founder(&self, id: u64) -> bool {
        self.ids.contains(&id)
    }

    /// The process slot of node `id`: a founder's, or the spare's if `id` is the spare.
    fn proc_mut(&mut self, id: u64) -> Option<&mut Option<Child>> {
        if self.is_founder(id) {
            let slot = self.slot(id);
            return Some(&mut self.procs[slot]);
        }
        self.spare
            .as_mut()
            .filter(|s| s.id == id)
            .map(|s| &mut s.proc)
    }

    pub fn is_running(&self, id: u64) -> bool {
        if self.is_founder(id) {
            return self.procs[self.slot(id)].is_some();
        }
        self.spare
            .as_ref()
            .is_some_and(|s| s.id == id && s.proc.is_some())
    }

    /// Nodes run `start_bin` until their first graceful stop, then the harness's binary: a
    /// rolling restart becomes a rolling upgrade.
    pub fn set_start_bin(&mut self, start_bin: Option<PathBuf>) {
        self.start_bin = start_bin;
    }

    /// The binary node `id` runs when it is next started.
    pub fn binary_of(&self, id: u64) -> &Path {
        match &self.start_bin {
            Some(b) if !self.upgraded.contains(&id) => b,
            _ => &self.node_bin,
        }
    }

    /// Starts node `id` (a founder, or the current spare) if it is not running.
    pub fn start(&mut self, id: u64) -> anyhow::Result<()> {
        let host = if self.is_founder(id) {
            id
        } else {
            anyhow::ensure!(
                self.spare.as_ref().is_some_and(|s| s.id == id),
                "start: node {id} is neither a founder nor the current spare"
            );
            SPARE_HOST
        };
        if self.is_running(id) {
            return Ok(());
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("node{id}.log")))?;
        // `ip netns exec` execs the node, so the child's pid is the node's pid.
        let child = Command::new("ip")
            .args(["netns", "exec", &ns(host)])
            .arg(self.binary_of(id))
            .arg("--config")
            .arg(self.dir.join(format!("node{id}.toml")))
            .env(
                "RUST_LOG",
                std::env::var("QQ_CHAOS_NODE_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn qq-node")?;
        *self.proc_mut(id).expect("founder or spare, checked above") = Some(child);
        if self.is_founder(id) {
            let slot = self.slot(id);
            self.paused[slot] = false;
        }
        Ok(())
    }

    /// A founder's data directory, or the spare host's (one for every spare: wiped before
    /// each spare starts).
    fn data_dir(&self, id: u64) -> PathBuf {
        if id > self.ids.len() as u64 {
            return self.dir.join("spare");
        }
        self.dir.join(format!("node{id}"))
    }

    /// Starts a new spare node on [`SPARE_HOST`] with the next unused id: its certificate from
    /// the run's CA, a config listing the founders and itself, an empty data directory. It
    /// serves nothing until it has joined. Returns its id.
    pub fn start_spare(&mut self) -> anyhow::Result<u64> {
        if let Some(old) = &self.spare {
            anyhow::ensure!(
                old.proc.is_none(),
                "start_spare: spare node {} still runs",
                old.id
            );
        }
        let id = self.next_spare_id;
        self.next_spare_id += 1;
        let data = self.data_dir(id);
        if data.exists() {
            std::fs::remove_dir_all(&data).with_context(|| format!("wipe {}", data.display()))?;
        }
        let mut peers: Vec<String> = self.ids.iter().map(|f| peer_toml(*f, *f)).collect();
        peers.push(peer_toml(id, SPARE_HOST));
        self.write_config(id, SPARE_HOST, &peers)?;
        self.spare = Some(Spare { id, proc: None });
        self.start(id)?;
        Ok(id)
    }

    /// The spare node's id, if one was started and is still running.
    pub fn running_spare(&self) -> Option<u64> {
        self.spare
            .as_ref()
            .filter(|s| s.proc.is_some())
            .map(|s| s.id)
    }

    /// Every spare id handed out so far (their logs are `node<id>.log`).
    pub fn spare_ids(&self) -> Vec<u64> {
        (self.ids.len() as u64 + 1..self.next_spare_id).collect()
    }

    /// Stops the spare node `id` as an operator would: SIGTERM, then waits for it to exit
    /// (kill -9 after [`SPARE_STOP_LIMIT`]). Returns how it ended, in words; an error if it had
    /// to be killed.
    pub async fn stop_spare(&mut self, id: u64) -> anyhow::Result<String> {
        let Some(mut child) = self.proc_mut(id).and_then(|p| p.take()) else {
            return Ok(format!("node {id} was not running"));
        };
        run(Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string()))?;
        let deadline = tokio::time::Instant::now() + SPARE_STOP_LIMIT;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(format!("exited ({status})"));
            }
            if tokio::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "node {id} did not stop within {}s of SIGTERM: killed",
                    SPARE_STOP_LIMIT.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Deletes node `id`'s data (the node must be stopped).
    pub fn wipe(&mut self, id: u64) -> anyhow::Result<()> {
        anyhow::ensure!(!self.is_running(id), "wipe: node {id} is running");
        let data = self.data_dir(id);
        if !data.exists() {
            return Ok(());
        }
        if self.small_disks.is_some() {
            // A mount point: empty it, keep it.
            for entry in std::fs::read_dir(&data)? {
                let path = entry?.path();
                if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                }
                .with_context(|| format!("wipe {}", path.display()))?;
            }
        } else {
            std::fs::remove_dir_all(&data).with_context(|| format!("wipe {}", data.display()))?;
        }
        Ok(())
    }

    /// Puts every node's data directory on a tmpfs of `mib` MiB (before the nodes start), so
    /// that [`Hosts::fill_disk`] can fill it.
    pub fn use_small_disks(&mut self, mib: u64) -> anyhow::Result<()> {
        for id in self.ids.clone() {
            let data = self.data_dir(id);
            std::fs::create_dir_all(&data)?;
            run(Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
                .arg(&data))?;
        }
        self.small_disks = Some(mib);
        Ok(())
    }

    /// Fills node `id`'s small disk with a ballast file, leaving 64 KiB.
    pub fn fill_disk(&mut self, id: u64) -> anyhow::Result<()> {
        anyhow::ensure!(self.small_disks.is_some(), "fill_disk: no small disks");
        let data = self.data_dir(id);
        let out = run(Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&data))?;
        let avail: u64 = out
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .with_context(|| format!("df of {}: {out}", data.display()))?;
        let size = avail.saturating_sub(64 * 1024).max(1);
        run(Command::new("fallocate")
            .args(["-l", &size.to_string()])
            .arg(data.join("ballast")))?;
        Ok(())
    }

    /// Removes node `id`'s ballast file.
    pub fn free_disk(&mut self, id: u64) -> anyhow::Result<()> {
        let ballast = self.data_dir(id).join("ballast");
        if ballast.exists() {
            std::fs::remove_file(&ballast)?;
        }
        Ok(())
    }

    pub fn pid(&self, id: u64) -> Option<u32> {
        self.procs[self.slot(id)].as_ref().map(|c| c.id())
    }

    pub fn kill9(&mut self, id: u64) {
        if let Some(mut child) = self.proc_mut(id).and_then(|p| p.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
        if self.is_founder(id) {
            let slot = self.slot(id);
            self.paused[slot] = false;
        }
    }

    /// Stops node `id` as an operator does: SIGTERM (the node drains and exits 0), then waits
    /// up to `limit` for it to exit; a node still running then gets SIGKILL. `None` when the
    /// node was not running.
    pub async fn stop_graceful(
        &mut self,
        id: u64,
        limit: Duration,
    ) -> anyhow::Result<Option<Stopped>> {
        // Started again after this (running or not), it runs the harness's binary.
        self.upgraded.insert(id);
        let slot = self.slot(id);
        let Some(child) = self.procs[slot].as_mut() else {
            return Ok(None);
        };
        let pid = child.id();
        let began = Instant::now();
        run(Command::new("kill").arg("-TERM").arg(pid.to_string()))?;
        let stopped = loop {
            if let Some(status) = child.try_wait().context("wait for qq-node")? {
                break Stopped {
                    status,
                    took: began.elapsed(),
                    killed: false,
                };
            }
            if began.elapsed() >= limit {
                let _ = child.kill();
                let status = child.wait().context("wait for qq-node after SIGKILL")?;
                break Stopped {
                    status,
                    took: began.elapsed(),
                    killed: true,
                };
            }
            tokio::time::sleep(EXIT_POLL).await;
        };
        self.procs[slot] = None;
        self.paused[slot] = false;
        Ok(Some(stopped))
    }

    /// Node `id`'s exit status if its process has exited by itself (it is then no longer
    /// counted as running); `None` while it runs or when it was not started.
    pub fn exited(&mut self, id: u64) -> Option<std::process::ExitStatus> {
        let slot = self.slot(id);
        let status = self.procs[slot].as_mut()?.try_wait().ok()??;
        self.procs[slot] = None;
        Some(status)
    }

    fn signal(&self, id: u64, sig: &str) -> anyhow::Result<()> {
        if let Some(pid) = self.pid(id) {
            run(Command::new("kill").arg(sig).arg(pid.to_string()))?;
        }
        Ok(())
    }

    pub fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        self.signal(id, "-STOP")?;
        let slot = self.slot(id);
        self.paused[slot] = true;
        Ok(())
    }

    pub fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        self.signal(id, "-CONT")?;
        let slot = self.slot(id);
        self.paused[slot] = false;
        Ok(())
    }

    /// A node process that exited by itself (not killed by us): its id and exit status.
    pub fn find_crashed(&mut self) -> Option<(u64, std::process::ExitStatus)> {
        for (slot, proc) in self.procs.iter_mut().enumerate() {
            if let Some(child) = proc
                && let Ok(Some(status)) = child.try_wait()
            {
                *proc = None;
                return Some((slot as u64 + 1, status));
            }
        }
        if let Some(spare) = &mut self.spare
            && let Some(child) = &mut spare.proc
            && let Ok(Some(status)) = child.try_wait()
        {
            spare.proc = None;
            return Some((spare.id, status));
        }
        None
    }

    /// Drops every packet `to` receives from `from` (one direction).
    pub fn drop_from(&self, to: u64, from: u64) -> anyhow::Result<()> {
        run(Command::new("ip").args([
            "netns",
            "exec",
            &ns(to),
            "iptables",
            "-A",
            "INPUT",
            "-s",
            &format!("{}.{from}", subnet()),
            "-j",
            "DROP",
        ]))?;
        Ok(())
    }

    /// Cuts `a` and `b` apart in both directions.
    pub fn cut(&self, a: u64, b: u64) -> anyhow::Result<()> {
        self.drop_from(a, b)?;
        self.drop_from(b, a)
    }

    fn netem_args(id: u64) -> Vec<String> {
        ["netns", "exec", &ns(id), "tc", "qdisc", "replace", "dev"]
            .iter()
            .map(|s| s.to_string())
            .chain([format!("{}-n", ns(id)), "root".into(), "netem".into()])
            .collect()
    }

    /// Whether the kernel offers `tc netem` (tried on node 1's interface, then removed).
    pub fn netem_available(&self) -> bool {
        let ok = Command::new("ip")
            .args(Self::netem_args(1))
            .args(["delay", "1ms"])
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            let _ = self.netns("heal");
        }
        ok
    }

    /// Packet loss and delay on every packet `id` sends.
    pub fn netem(&self, id: u64, delay_ms: u64, loss_pct: u64) -> anyhow::Result<()> {
        run(Command::new("ip").args(Self::netem_args(id)).args([
            "delay",
            &format!("{delay_ms}ms"),
            &format!("{}ms", delay_ms / 2),
            "loss",
            &format!("{loss_pct}%"),
        ]))?;
        Ok(())
    }

    /// Removes every network fault (firewall rules and qdiscs in all namespaces).
    pub fn heal_network(&self) -> anyhow::Result<()> {
        self.netns("heal").map(|_| ())
    }

    /// Heals everything: network, paused nodes resumed, stopped nodes started again.
    pub fn heal_all(&mut self) -> anyhow::Result<()> {
        self.heal_network()?;
        for id in self.ids.clone() {
            if self.paused[self.slot(id)] {
                self.resume(id)?;
            }
            if !self.is_running(id) {
                self.start(id)?;
            }
        }
        Ok(())
    }

    /// Kills every node and removes the namespaces.
    pub fn destroy(&mut self) {
        if let Some(id) = self.running_spare() {
            self.kill9(id);
        }
        for id in self.ids.clone() {
            if self.paused[self.slot(id)] {
                let _ = self.resume(id);
            }
            self.kill9(id);
        }
        if self.small_disks.take().is_some() {
            for id in self.ids.clone() {
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(self.data_dir(id))
                    .status();
            }
        }
        let _ = self.netns("down");
    }

    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let text =
            std::fs::read_to_string(self.dir.join(format!("node{id}.log"))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.destroy();
    }
}

impl qq_chaos::membership::Spare for Hosts {
    fn stop_spare(&mut self, id: u64) -> impl Future<Output = anyhow::Result<String>> + Send {
        Hosts::stop_spare(self, id)
    }
}
