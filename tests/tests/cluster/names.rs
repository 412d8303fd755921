//! Story: nodes that know each other only by host names, on separate network hosts, survive a
//! node coming back with another IP address under its name, and take a node joined by name.
//!
//! Four network namespaces (`qqdns1..4` on 10.213.47.0/24, made by `cluster/netns.sh` as the chaos
//! harness makes its hosts) each run one `qq-node` configured from the environment alone
//! (`QQ_NODE_ID`, `QQ_LISTEN=0.0.0.0:7101`, `QQ_PEERS=1=node1.quorumq.test:7101@...`: the names a
//! Kubernetes manifest gives). Names resolve through each namespace's own `/etc/hosts`: `ip
//! netns exec` binds `/etc/netns/<ns>/hosts` over it, and the test rewrites that file in place
//! (the machine's `/etc/hosts` is never touched). While a publisher streams confirmed
//! messages into a queue on nodes 1-3, node 3 is stopped, its namespace gets another address,
//! the name is pointed there, and it is started again on its data: its replica must reach the
//! leader's index and digest. Then node 4 joins by name (`qqctl join-node`), gets a replica,
//! catches up, and is moved the same way. At the end every confirmed message is consumed.
//!
//! Fails if a node resolved its peers' names once and kept the address: the survivors would
//! keep dialling the old address and the moved node's replica would never catch up. Needs root
//! (namespaces): skipped, with a line saying so, otherwise; `make test` runs as root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use qq_client::{Client, Value, ValueExt, table};
use qq_tests::{eventually, info};

use super::membership::{QUEUE, consume_all, publish_until};
use super::wait_caught_up;

const PREFIX: &str = "qqdns";
/// Apart from the chaos harness (10.78.0) and `cluster/netns.sh` (10.77.0); checked free at start.
const SUBNET: &str = "10.213.47";
const HOSTS: u64 = 4;
const PORT: u16 = 7101;
const CLUSTER_PORT: u16 = 7201;

/// The host name of node `id` (one node per namespace: namespace `qqdns<id>`).
fn name(id: u64) -> String {
    format!("node{id}.quorumq.test")
}

fn ns(id: u64) -> String {
    format!("{PREFIX}{id}")
}

fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("run {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            == Some("0")
    })
}

/// The namespaces, their hosts files and the node processes; all removed on drop (a failed
/// test keeps the temporary directory with the nodes' logs).
struct NamedHosts {
    /// Taken (and kept on disk) by a failed test's drop.
    dir: Option<tempfile::TempDir>,
    node_bin: PathBuf,
    /// Each node's current address (last octet).
    ips: BTreeMap<u64, u8>,
    procs: BTreeMap<u64, Child>,
    passed: bool,
}

impl NamedHosts {
    fn create() -> anyhow::Result<NamedHosts> {
        let hosts = NamedHosts {
            dir: Some(tempfile::Builder::new().prefix("qq-names-").tempdir()?),
            node_bin: qq_tests::node_binary()?,
            ips: (1..=HOSTS).map(|id| (id, id as u8)).collect(),
            procs: BTreeMap::new(),
            passed: false,
        };
        hosts.netns("down")?;
        // Another network on this /24 would take the test's connections (a route on another
        // bridge): refuse rather than talk to someone else's nodes.
        let taken = run(Command::new("ip").args(["route", "show", &format!("{SUBNET}.0/24")]))?;
        ensure!(
            taken.trim().is_empty(),
            "{SUBNET}.0/24 is already routed on this machine ({}); free it first",
            taken.trim()
        );
        hosts.netns("up")?;
        hosts.write_hosts_files()?;
        let ca = hosts.dir().join("ca");
        for id in 1..=HOSTS {
            let out = hosts.dir().join(format!("tls{id}"));
            qq_tests::make_certs(&hosts.node_bin, &ca, &out, &format!("node{id}"))?;
        }
        Ok(hosts)
    }

    fn dir(&self) -> &Path {
        self.dir.as_ref().expect("present until drop").path()
    }

    fn netns(&self, cmd: &str) -> anyhow::Result<String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cluster/netns.sh");
        run(Command::new("bash")
            .arg(script)
            .arg(cmd)
            .env("QQ_NETNS_PREFIX", PREFIX)
            .env("QQ_NETNS_SUBNET", SUBNET)
            .env("QQ_NETNS_NODES", HOSTS.to_string()))
    }

    fn ip(&self, id: u64) -> String {
        format!("{SUBNET}.{}", self.ips[&id])
    }

    /// The client address the test (on the host side of the bridge) uses for node `id`.
    fn address(&self, id: u64) -> String {
        format!("{}:{PORT}", self.ip(id))
    }

    fn client(&self, id: u64) -> anyhow::Result<Client> {
        Ok(Client::connect_lazy(&self.address(id))?)
    }

    /// Every namespace's /etc/hosts: every node's name at its current address. Written in
    /// place: a running node's mount of the file follows its inode.
    fn write_hosts_files(&self) -> anyhow::Result<()> {
        let mut text = String::from("127.0.0.1 localhost\n");
        for id in self.ips.keys() {
            text.push_str(&format!("{} {}\n", self.ip(*id), name(*id)));
        }
        for id in 1..=HOSTS {
            let dir = PathBuf::from("/etc/netns").join(ns(id));
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("hosts"), &text)?;
        }
        Ok(())
    }

    /// Starts node `id` in its namespace, configured by the environment only.
    fn start(&mut self, id: u64, peers: &[u64]) -> anyhow::Result<()> {
        let dir = self.dir();
        let tls = dir.join(format!("tls{id}"));
        let peers: Vec<String> = peers
            .iter()
            .map(|p| format!("{p}={n}:{PORT}@{n}:{CLUSTER_PORT}", n = name(*p)))
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("node{id}.log")))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &ns(id)])
            .arg(&self.node_bin)
            .env("QQ_NODE_ID", id.to_string())
            .env("QQ_LISTEN", format!("0.0.0.0:{PORT}"))
            .env("QQ_CLUSTER_ADDR", format!("0.0.0.0:{CLUSTER_PORT}"))
            .env("QQ_PEERS", peers.join(","))
            .env("QQ_DATA_DIR", dir.join(format!("node{id}")))
            .env("QQ_CLUSTER_CA", tls.join("ca.pem"))
            .env("QQ_CLUSTER_CERT", tls.join("node.pem"))
            .env("QQ_CLUSTER_KEY", tls.join("node.key"))
            // A private throw-away network: guest from the host side, and qqctl's default
            // credentials over plain text.
            .env("QQ_LOOPBACK_USERS", "")
            .env("QQ_ALLOW_PLAINTEXT_AUTH", "true")
            .env("QQ_HEARTBEAT_MS", "200")
            .env("QQ_ELECTION_TIMEOUT_MIN_MS", "800")
            .env("QQ_ELECTION_TIMEOUT_MAX_MS", "1600")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn qq-node")?;
        self.procs.insert(id, child);
        Ok(())
    }

    /// SIGTERM, then waits (at most 30 s) for the node to exit.
    async fn stop(&mut self, id: u64) -> anyhow::Result<()> {
        let mut child = self.procs.remove(&id).context("node not running")?;
        run(Command::new("kill").args(["-TERM", &child.id().to_string()]))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait()?.is_none() {
            if Instant::now() >= deadline {
                let _ = child.kill();
                bail!("node {id} did not stop within 30 s of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Node `id`'s namespace gets address `octet` instead of its current one, and its name
    /// follows in every hosts file.
    fn readdress(&mut self, id: u64, octet: u8) -> anyhow::Result<()> {
        let dev = format!("{}-n", ns(id));
        let ip = |o: u8| format!("{SUBNET}.{o}/24");
        let exec = |args: &[&str]| {
            run(Command::new("ip")
                .args(["netns", "exec", &ns(id)])
                .args(args))
        };
        exec(&["ip", "addr", "del", &ip(self.ips[&id]), "dev", &dev])?;
        exec(&["ip", "addr", "add", &ip(octet), "dev", &dev])?;
        self.ips.insert(id, octet);
        self.write_hosts_files()
    }

    /// Moves node `id` to address `octet` under its name, with its data, while the cluster
    /// runs: stop, readdress, start. Returns how long its replica of the queue took to catch
    /// up after the start.
    async fn move_node(&mut self, id: u64, octet: u8, peers: &[u64]) -> anyhow::Result<Duration> {
        info!(
            "--- node {id}: stop, move to {SUBNET}.{octet} under {}, start",
            name(id)
        );
        self.stop(id).await?;
        self.readdress(id, octet)?;
        self.start(id, peers)?;
        let began = Instant::now();
        let moved = self.client(id)?;
        let (applied, commit) = wait_caught_up(&moved, id, QUEUE).await?;
        let took = began.elapsed();
        info!(
            applied,
            commit,
            ?took,
            "node {id} caught up at its new address"
        );
        Ok(took)
    }

    fn log_tails(&self) {
        for id in 1..=HOSTS {
            let log = self.dir().join(format!("node{id}.log"));
            if log.exists() {
                eprintln!("--- node {id} log:\n{}", qq_tests::tail(&log, 40));
            }
        }
    }
}

impl Drop for NamedHosts {
    fn drop(&mut self) {
        for child in self.procs.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if !self.passed {
            self.log_tails();
            if let Some(dir) = self.dir.take() {
                eprintln!("files kept in {}", dir.keep().display());
            }
        }
        for id in 1..=HOSTS {
            let _ = std::fs::remove_dir_all(PathBuf::from("/etc/netns").join(ns(id)));
        }
        let _ = self.netns("down");
    }
}

/// Waits until node `id` answers and sees a metadata leader.
async fn wait_formed(hosts: &NamedHosts, id: u64) -> anyhow::Result<()> {
    let client = hosts.client(id)?;
    eventually(
        &format!("node {id} to see a metadata leader"),
        qq_tests::FORMATION_TIMEOUT,
        || {
            let client = client.clone();
            async move { Ok((client.cluster_status().await?.metadata_leader != 0).then_some(())) }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_found_by_name_rejoin_under_a_new_address_and_join_by_name() -> anyhow::Result<()> {
    qq_tests::init_tracing();
    if !is_root() {
        eprintln!("skipped: network namespaces need root (make test runs as root)");
        return Ok(());
    }
    let mut hosts = NamedHosts::create()?;
    let founders = [1, 2, 3];
    for id in founders {
        hosts.start(id, &founders)?;
    }
    for id in founders {
        wait_formed(&hosts, id).await?;
    }
    let admin = hosts.client(1)?;
    admin
        .declare_queue(
            QUEUE,
            table([("x-quorum-initial-group-size", Value::long(3))]),
        )
        .await?;

    info!("--- publish with confirms before, during and after the moves");
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(publish_until(hosts.client(1)?, stop.clone(), 3000));
    let published_some =
        |n: u64| {
            let admin = admin.clone();
            async move {
                eventually("the publisher to get going", Duration::from_secs(30), || {
                let admin = admin.clone();
                async move { Ok((admin.get_queue(QUEUE).await?.messages >= n).then_some(())) }
            })
            .await
            }
        };
    published_some(300).await?;
    let founder_took = hosts.move_node(3, 13, &founders).await?;

    info!("--- node 4 joins by name");
    let all = [1, 2, 3, 4];
    hosts.start(4, &all)?;
    let joined = run(Command::new(qq_tests::qqctl_binary()?).args([
        "--node",
        &hosts.address(2),
        "join-node",
        "4",
        &format!("{}:{PORT}", name(4)),
        &format!("{}:{CLUSTER_PORT}", name(4)),
    ]))?;
    info!("qqctl join-node: {}", joined.trim());
    wait_formed(&hosts, 4).await?;
    let added = admin.add_member(QUEUE, 4).await?;
    assert_eq!(added.outcome, "added", "{added:?}");
    wait_caught_up(&hosts.client(4)?, 4, QUEUE).await?;
    let messages = admin.get_queue(QUEUE).await?.messages;
    published_some(messages + 300).await?;
    let joiner_took = hosts.move_node(4, 14, &all).await?;
    published_some(admin.get_queue(QUEUE).await?.messages + 300).await?;

    stop.store(true, Ordering::Relaxed);
    let (confirmed, published) = load.await??;
    let received = consume_all(&hosts.client(2)?, &confirmed, published).await?;
    info!(
        published,
        confirmed = confirmed.len(),
        received,
        ?founder_took,
        ?joiner_took,
        "every confirmed message consumed after both moves"
    );
    hosts.passed = true;
    Ok(())
}
