//! The three hosts: network namespaces made by `cluster/netns.sh`, one `qq-node` process in
//! each, and the faults the nemesis puts between them (iptables rules inside the namespaces,
//! signals to the processes, `tc netem` qdiscs). Clients run on the host side of the bridge and
//! always reach every node; faults only ever cut node-to-node traffic.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

/// Namespaces `qqx1..3` on 10.78.0.1..3 (the runner's own, so a cluster started by hand with
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
/// Node-to-node (mutual TLS) port. The iptables faults drop by source address, so they cut
/// both ports alike.
pub const CLUSTER_PORT: u16 = 7201;

pub struct Hosts {
    script: PathBuf,
    node_bin: PathBuf,
    dir: PathBuf,
    ids: Vec<u64>,
    procs: Vec<Option<Child>>,
    paused: Vec<bool>,
    /// Each node's data directory is a tmpfs of this many MiB (for the disk-full fault).
    small_disks: Option<u64>,
}

/// Exit code of a node stopped by a storage fault (`qq_raft::store::STORAGE_FAULT_EXIT_CODE`).
pub const STORAGE_FAULT_EXIT_CODE: i32 = 74;

pub fn address(id: u64) -> String {
    format!("{}.{id}:{PORT}", subnet())
}

pub fn cluster_address(id: u64) -> String {
    format!("{}.{id}:{CLUSTER_PORT}", subnet())
}

fn ns(id: u64) -> String {
    format!("{}{id}", prefix())
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
    /// Creates the namespaces (afresh) and writes one config per node into `dir`.
    pub fn create(script: &Path, node_bin: &Path, dir: &Path, n: usize) -> anyhow::Result<Hosts> {
        let hosts = Hosts {
            script: script.to_path_buf(),
            node_bin: node_bin.to_path_buf(),
            dir: dir.to_path_buf(),
            ids: (1..=n as u64).collect(),
            procs: (0..n).map(|_| None).collect(),
            paused: vec![false; n],
            small_disks: None,
        };
        hosts.netns("down")?;
        hosts.netns("up")?;
        std::fs::create_dir_all(dir)?;
        let peers: Vec<String> = hosts
            .ids
            .iter()
            .map(|id| {
                format!(
                    "{{ id = {id}, address = \"{}\", cluster_address = \"{}\" }}",
                    address(*id),
                    cluster_address(*id)
                )
            })
            .collect();
        for id in &hosts.ids {
            // Mutual TLS between the nodes, as in production: `qq-node certs` makes the CA once
            // (in dir/ca) and a certificate per node.
            let tls = dir.join(format!("tls{id}"));
            run(Command::new(node_bin)
                .arg("certs")
                .arg("--ca-dir")
                .arg(dir.join("ca"))
                .arg("--out")
                .arg(&tls)
                .args(["--name", &format!("node{id}"), "--host"])
                .arg(format!("{}.{id}", subnet())))?;
            // Debug builds on two cores: the test nodes' timings (fast failover, still loose).
            // The workload connects as guest from the host, which is remote to the nodes'
            // namespaces: lift `loopback_users` on this private, throw-away network.
            let config = format!(
                "cluster_addr = \"{}\"\ncluster_ca = \"{}\"\ncluster_cert = \"{}\"\n\
                 cluster_key = \"{}\"\n\
                 node_id = {id}\nlisten = \"{}\"\npeers = [{}]\ndata_dir = \"{}\"\n\
                 heartbeat_ms = 200\nelection_timeout_min_ms = 800\nelection_timeout_max_ms = 1600\n\
                 dead_letter_retry_ms = 1000\nloopback_users = []\n",
                cluster_address(*id),
                tls.join("ca.pem").display(),
                tls.join("node.pem").display(),
                tls.join("node.key").display(),
                address(*id),
                peers.join(", "),
                dir.join(format!("node{id}")).display()
            );
            std::fs::write(dir.join(format!("node{id}.toml")), config)?;
        }
        Ok(hosts)
    }

    fn netns(&self, cmd: &str) -> anyhow::Result<String> {
        run(Command::new("bash")
            .arg(&self.script)
            .arg(cmd)
            .env("QQ_NETNS_PREFIX", prefix())
            .env("QQ_NETNS_SUBNET", subnet())
            .env("QQ_NETNS_NODES", self.ids.len().to_string()))
    }

    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    fn slot(&self, id: u64) -> usize {
        (id - 1) as usize
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.procs[self.slot(id)].is_some()
    }

    pub fn start(&mut self, id: u64) -> anyhow::Result<()> {
        let slot = self.slot(id);
        if self.procs[slot].is_some() {
            return Ok(());
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("node{id}.log")))?;
        // `ip netns exec` execs the node, so the child's pid is the node's pid.
        let child = Command::new("ip")
            .args(["netns", "exec", &ns(id)])
            .arg(&self.node_bin)
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
        self.procs[slot] = Some(child);
        self.paused[slot] = false;
        Ok(())
    }

    fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node{id}"))
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
        let slot = self.slot(id);
        if let Some(mut child) = self.procs[slot].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused[slot] = false;
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
