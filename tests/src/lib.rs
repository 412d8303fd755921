//! # qq-tests: quorumq against real processes
//!
//! The integration tests in `tests/tests/cluster/` start real `qq-node` processes, the same
//! binary `make cluster` runs, and talk to them only through the public gRPC API with
//! `qq-client`. Nothing is mocked: a "crash" is `kill -9`, a "restart" is a new process on the
//! same data directory and port.
//!
//! [`TestCluster::start`] picks free loopback ports, writes one TOML config per node into a
//! temporary directory (data directories and logs live there too), spawns the nodes and waits
//! until every node reports a metadata leader. Nodes talk to each other over mutual TLS on
//! their cluster ports, as in production: the cluster's CA and node certificates are made by
//! `qq-node certs` in the temporary directory ([`TestCluster::tls`] names the files).
//! Every node also serves `GET /metrics` and `/healthz` on its own `http_addr`
//! ([`TestCluster::http_get`]). [`TestCluster::start_client_tls`] also puts the client port
//! behind TLS. Dropping the cluster kills every node with
//! `SIGKILL`. A passing test ends with [`TestCluster::stop`]; a cluster dropped without it (the
//! test panicked or returned an error) keeps its directory and prints the tail of every node's
//! log, so the failure can be read next to what the nodes did.
//!
//! The node binary is found, in order, at `$QQ_NODE_BIN`, next to the test executable's
//! `target/<profile>/` directory, at `$CARGO_TARGET_DIR/debug/qq-node`, and at
//! `<workspace>/target/debug/qq-node`. `make test` builds it first; `cargo test -p qq-tests`
//! alone does not (the test crate cannot depend on a binary), so run `cargo build --workspace --all-targets`
//! before it.
//!
//! Tests never sleep to hide a race: they poll for a condition with a deadline ([`eventually`]).
//! Each cluster has three processes, so clusters run one at a time: [`TestCluster::start`] takes
//! a process-wide lock that the cluster holds until it is dropped. Plain `cargo test --workspace`
//! is therefore safe on a two-core machine, whatever `--test-threads` says.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

pub mod fixture;
pub mod webdriver;

use anyhow::{Context, anyhow, bail, ensure};
use qq_client::{Client, TlsOptions};
use qq_proto::internal::internal_client::InternalClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
pub use tracing::info;

mod tmpfs;
pub use tmpfs::Tmpfs;

/// How long a fresh cluster may take to elect its metadata leader.
pub const FORMATION_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a queue may take to (re-)elect a leader after a crash.
pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest message the test nodes accept (smaller than the node's default, so the
/// oversized-message test stays cheap).
pub const TEST_MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Raft timings of the test nodes: faster failover than the defaults, still loose enough for a
/// debug build on two cores.
const HEARTBEAT_MS: u64 = 200;
const ELECTION_TIMEOUT_MIN_MS: u64 = 800;
const ELECTION_TIMEOUT_MAX_MS: u64 = 1600;
/// Lines of each node's log printed when a test fails.
const LOG_TAIL_LINES: usize = 60;

static TRACING: Once = Once::new();
/// Held by every live [`TestCluster`]: one cluster at a time per test binary.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Logs of the test itself (`info!("--- ...")` phases) go to the test's output; `RUST_LOG`
/// selects, default `info`.
pub fn init_tracing() {
    TRACING.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// The `qq-node` binary to run (see the crate documentation for the search order).
/// The `qqctl` binary next to `qq-node` (QQCTL_BIN overrides).
pub fn qqctl_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("QQCTL_BIN") {
        return Ok(PathBuf::from(p));
    }
    let path = node_binary()?.with_file_name("qqctl");
    anyhow::ensure!(path.is_file(), "qqctl not found at {}", path.display());
    Ok(path)
}

pub fn node_binary() -> anyhow::Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("QQ_NODE_BIN") {
        candidates.push(PathBuf::from(p));
    }
    // <target>/debug/deps/cluster-<hash> → <target>/debug/qq-node
    if let Ok(exe) = std::env::current_exe()
        && let Some(profile_dir) = exe.parent().and_then(Path::parent)
    {
        candidates.push(profile_dir.join("qq-node"));
    }
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(PathBuf::from(dir).join("debug").join("qq-node"));
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/qq-node"));
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        anyhow!(
            "qq-node binary not found (set QQ_NODE_BIN, or run `make build` / \
             `cargo build --workspace --all-targets` with the same CARGO_TARGET_DIR first)"
        )
    })
}

/// Polls `check` every 100 ms until it returns `Ok(Some(value))`, failing after `timeout` with
/// the last error or "still not". Errors from `check` count as "not yet".
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last = String::from("condition never held");
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The DNS name peers check in a node certificate (qq_raft::network::CLUSTER_TLS_NAME).
pub const CLUSTER_TLS_NAME: &str = "qq-node";

/// Where a test cluster's certificates are: `ca_dir` holds the CA (`ca.pem`, `ca.key`), and
/// each node's directory `node.pem`, `node.key` and `ca.pem`.
#[derive(Debug, Clone)]
pub struct ClusterTls {
    pub ca_dir: PathBuf,
    pub node_dirs: Vec<PathBuf>,
}

impl ClusterTls {
    /// The cluster CA certificate.
    pub fn ca_pem(&self) -> PathBuf {
        self.ca_dir.join("ca.pem")
    }
    /// Node `id`'s certificate and key.
    pub fn node_cert(&self, id: u64) -> (PathBuf, PathBuf) {
        let dir = &self.node_dirs[id as usize - 1];
        (dir.join("node.pem"), dir.join("node.key"))
    }
}

/// Runs `qq-node certs`: the CA in `ca_dir` (created when missing) signs a certificate for
/// `name` into `out`.
pub fn make_certs(binary: &Path, ca_dir: &Path, out: &Path, name: &str) -> anyhow::Result<()> {
    let output = Command::new(binary)
        .arg("certs")
        .arg("--ca-dir")
        .arg(ca_dir)
        .arg("--out")
        .arg(out)
        .args(["--name", name])
        .output()
        .with_context(|| format!("run {} certs", binary.display()))?;
    ensure!(
        output.status.success(),
        "qq-node certs failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// A channel to `address` (host:port) over TLS trusting `ca_pem`, presenting `identity`
/// (certificate and key files) when given, checking the cluster name.
pub async fn tls_channel(
    address: &str,
    ca_pem: &Path,
    identity: Option<(&Path, &Path)>,
) -> anyhow::Result<Channel> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca_pem)?))
        .domain_name(CLUSTER_TLS_NAME);
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(cert)?,
            std::fs::read(key)?,
        ));
    }
    Ok(Endpoint::from_shared(format!("https://{address}"))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?)
}

/// One node process.
struct Node {
    id: u64,
    address: String,
    cluster_address: String,
    /// `http_addr`: GET /metrics and /healthz.
    http_address: String,
    /// `amqp_addr`: the AMQP 0-9-1 listener.
    amqp_address: String,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// Another `qq-node` than the cluster's for this node (an earlier release).
    binary: Option<PathBuf>,
}

/// Raft settings written into every node's config (see cluster/node1.toml).
#[derive(Debug, Clone, Copy)]
pub struct RaftSettings {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    pub snapshot_after_entries: u64,
}

impl Default for RaftSettings {
    /// What [`TestCluster::start`] uses: short timeouts, the default snapshot interval.
    fn default() -> Self {
        RaftSettings {
            heartbeat_ms: HEARTBEAT_MS,
            election_timeout_min_ms: ELECTION_TIMEOUT_MIN_MS,
            election_timeout_max_ms: ELECTION_TIMEOUT_MAX_MS,
            snapshot_after_entries: 20_000,
        }
    }
}

/// Node settings beyond Raft's, for tests that need them ([`TestCluster::start_with_options`]).
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Listen on every address (`0.0.0.0`) instead of 127.0.0.1; peers still reach each other
    /// at 127.0.0.1, and a client can connect through a non-loopback address of this host
    /// ([`non_loopback_ip`]), so the node sees it as a remote peer.
    pub listen_on_all_addresses: bool,
    /// Extra TOML lines appended to every node's config (e.g. `allow_plaintext_auth = true`).
    pub extra_config: Vec<String>,
    /// Extra TOML lines for one node's config only: (node id, line).
    pub extra_config_for: Vec<(u64, String)>,
    /// Serve the client ports over TLS (each node's certificate as `tls_cert`).
    pub client_tls: bool,
    /// With `client_tls`: require client certificates from the cluster CA (`tls_client_ca`);
    /// [`TestCluster::client`] then presents node 1's certificate.
    pub require_client_certs: bool,
    /// A node's data directory somewhere else than the cluster's temp dir: (node id, path).
    pub data_dir_for: Vec<(u64, PathBuf)>,
    /// Nodes configured but not started (start them with [`TestCluster::start_node`]). When
    /// not empty, `start_with_options` does not wait for the cluster to form.
    pub not_started: Vec<u64>,
    /// Nodes that join the running cluster later (JoinNode): configured and not started; the
    /// other nodes' configs do not list them, their own lists every node.
    pub joiners: Vec<u64>,
    /// Another `qq-node` binary for a node (an earlier release): (node id, path). Change it
    /// between runs with [`TestCluster::set_binary`].
    pub binary_for: Vec<(u64, PathBuf)>,
}

/// An IPv4 address of this host that is not loopback, for tests of what a node allows remote
/// peers: the first global address of an interface that is up, else one on a dummy interface
/// `qqtest0` created for the purpose (needs root, as in CI). Fails, never skips, when neither
/// is possible.
pub fn non_loopback_ip() -> anyhow::Result<std::net::IpAddr> {
    fn global_ipv4() -> anyhow::Result<Option<std::net::IpAddr>> {
        let out = Command::new("ip")
            .args(["-o", "-4", "addr", "show", "scope", "global", "up"])
            .output()
            .context("run `ip -o -4 addr show scope global up`")?;
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next()?.parse().ok()
        }))
    }
    if let Some(ip) = global_ipv4()? {
        return Ok(ip);
    }
    let steps: [&[&str]; 3] = [
        &["link", "add", "qqtest0", "type", "dummy"],
        &["addr", "add", "198.51.100.7/32", "dev", "qqtest0"],
        &["link", "set", "qqtest0", "up"],
    ];
    for args in steps {
        let status = Command::new("ip").args(args).status().context("run ip")?;
        ensure!(
            status.success(),
            "no non-loopback address on this host and `ip {}` failed ({status}): \
             run the tests as root or give the host a non-loopback address",
            args.join(" ")
        );
    }
    global_ipv4()?.context("dummy interface qqtest0 was created but shows no global address")
}

/// N `qq-node` processes on loopback, killed on drop. End a passing test with
/// [`TestCluster::stop`]; otherwise the files are kept for the post-mortem.
pub struct TestCluster {
    dir: Option<tempfile::TempDir>,
    binary: PathBuf,
    nodes: Vec<Node>,
    tls: ClusterTls,
    /// Set when the client ports serve TLS: how clients connect.
    client_tls: Option<TlsOptions>,
    /// Set by [`TestCluster::stop`]; a cluster dropped without it belongs to a failed test.
    stopped: bool,
    /// Declared last: released after the nodes are killed in `drop`.
    _serial: MutexGuard<'static, ()>,
}

impl TestCluster {
    /// Starts `n` nodes (ids 1..=n) and waits until every one reports a metadata leader.
    pub async fn start(n: usize) -> anyhow::Result<TestCluster> {
        Self::start_with(n, RaftSettings::default()).await
    }

    /// Like [`TestCluster::start`], with other Raft settings in every node's config.
    pub async fn start_with(n: usize, settings: RaftSettings) -> anyhow::Result<TestCluster> {
        Self::start_with_options(n, settings, ClusterOptions::default()).await
    }

    /// Like [`TestCluster::start`], with the client ports behind TLS (each node's certificate
    /// from the cluster CA as `tls_cert`); [`TestCluster::client`] then speaks TLS.
    pub async fn start_client_tls(n: usize) -> anyhow::Result<TestCluster> {
        let options = ClusterOptions {
            client_tls: true,
            ..Default::default()
        };
        Self::start_with_options(n, RaftSettings::default(), options).await
    }

    /// Like [`TestCluster::start_with`], with the node settings of `options` too.
    pub async fn start_with_options(
        n: usize,
        settings: RaftSettings,
        options: ClusterOptions,
    ) -> anyhow::Result<TestCluster> {
        let RaftSettings {
            heartbeat_ms,
            election_timeout_min_ms,
            election_timeout_max_ms,
            snapshot_after_entries,
        } = settings;
        init_tracing();
        assert!(n >= 1, "a cluster needs a node");
        // A test that failed while holding the lock poisons it; its cluster is gone all the same.
        let serial = ONE_CLUSTER_AT_A_TIME
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let binary = node_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("qq-cluster-")
            .tempdir()
            .context("create temp dir")?;
        let ports = free_ports(4 * n)?;
        let addresses: Vec<String> = ports[..n]
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let cluster_addresses: Vec<String> = ports[n..2 * n]
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let peers: Vec<(u64, String)> = addresses
            .iter()
            .zip(&cluster_addresses)
            .enumerate()
            .map(|(i, (a, c))| {
                let id = i as u64 + 1;
                (
                    id,
                    format!("    {{ id = {id}, address = \"{a}\", cluster_address = \"{c}\" }},"),
                )
            })
            .collect();
        let peers_of = |id: u64| -> String {
            peers
                .iter()
                .filter(|(p, _)| options.joiners.contains(&id) || !options.joiners.contains(p))
                .map(|(_, line)| line.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        };
        let tls = ClusterTls {
            ca_dir: dir.path().join("ca"),
            node_dirs: (1..=n)
                .map(|id| dir.path().join(format!("tls{id}")))
                .collect(),
        };
        for (i, out) in tls.node_dirs.iter().enumerate() {
            make_certs(&binary, &tls.ca_dir, out, &format!("node{}", i + 1))?;
        }
        let mut nodes = Vec::new();
        for (i, address) in addresses.iter().enumerate() {
            let id = i as u64 + 1;
            let data_dir = options
                .data_dir_for
                .iter()
                .find(|(node, _)| *node == id)
                .map_or_else(|| dir.path().join(format!("node{id}")), |(_, p)| p.clone());
            let config = dir.path().join(format!("node{id}.toml"));
            let listen = if options.listen_on_all_addresses {
                format!("0.0.0.0:{}", ports[i])
            } else {
                address.clone()
            };
            let (cert, key) = tls.node_cert(id);
            let http_port = ports[2 * n + i];
            let amqp_port = ports[3 * n + i];
            let cluster_tls = format!(
                "cluster_addr = \"{}\"\ncluster_ca = \"{}\"\ncluster_cert = \"{}\"\n\
                 cluster_key = \"{}\"\n",
                cluster_addresses[i],
                tls.node_dirs[i].join("ca.pem").display(),
                cert.display(),
                key.display()
            );
            let client_tls_lines = if options.client_tls {
                let mut lines = format!(
                    "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
                    cert.display(),
                    key.display()
                );
                if options.require_client_certs {
                    lines.push_str(&format!(
                        "tls_client_ca = \"{}\"\n",
                        tls.node_dirs[i].join("ca.pem").display()
                    ));
                }
                lines
            } else {
                String::new()
            };
            let mut text = format!(
                "{cluster_tls}{client_tls_lines}\
                 node_id = {id}\nhttp_addr = \"127.0.0.1:{http_port}\"\namqp_addr = \"127.0.0.1:{amqp_port}\"\nlisten = \"{listen}\"\nadvertise = \"{address}\"\npeers = [\n{}\n]\ndata_dir = \"{}\"\n\
                 max_message_bytes = {TEST_MAX_MESSAGE_BYTES}\nheartbeat_ms = {heartbeat_ms}\n\
                 election_timeout_min_ms = {election_timeout_min_ms}\n\
                 election_timeout_max_ms = {election_timeout_max_ms}\n\
                 snapshot_after_entries = {snapshot_after_entries}\n",
                peers_of(id),
                data_dir.display()
            );
            let only_here = options
                .extra_config_for
                .iter()
                .filter(|(node, _)| *node == id)
                .map(|(_, line)| line);
            for line in options.extra_config.iter().chain(only_here) {
                text.push_str(line);
                text.push('\n');
            }
            std::fs::write(&config, text).with_context(|| format!("write {}", config.display()))?;
            nodes.push(Node {
                id,
                address: address.clone(),
                cluster_address: cluster_addresses[i].clone(),
                http_address: format!("127.0.0.1:{http_port}"),
                amqp_address: format!("127.0.0.1:{amqp_port}"),
                config,
                log: dir.path().join(format!("node{id}.log")),
                child: None,
                binary: options
                    .binary_for
                    .iter()
                    .find(|(n, _)| *n == id)
                    .map(|(_, b)| b.clone()),
            });
        }
        let mut cluster = TestCluster {
            dir: Some(dir),
            binary,
            nodes,
            client_tls: options.client_tls.then(|| TlsOptions {
                ca_pem: std::fs::read(tls.ca_pem()).ok(),
                identity: options.require_client_certs.then(|| {
                    let (cert, key) = tls.node_cert(1);
                    (
                        std::fs::read(cert).unwrap_or_default(),
                        std::fs::read(key).unwrap_or_default(),
                    )
                }),
                domain_name: None,
            }),
            tls,
            stopped: false,
            _serial: serial,
        };
        info!(dir = %cluster.path().display(), nodes = n, "--- starting a {n}-node cluster");
        for id in 1..=n as u64 {
            if !options.not_started.contains(&id) && !options.joiners.contains(&id) {
                cluster.spawn(id)?;
            }
        }
        if options.not_started.is_empty() {
            cluster.wait_formed().await?;
            // A cluster of today's binary moves its metadata machine to today's version by
            // itself (node::meta_upgrade); tests start from there, as an operator's cluster
            // runs once it has.
            if options.binary_for.is_empty() && options.joiners.is_empty() {
                cluster
                    .wait_metric_line_everywhere(
                        // qq_core::meta::META_MACHINE_VERSION
                        "quorumq_metadata_machine_version 2",
                        "the metadata machine at this release's version",
                    )
                    .await?;
            }
            info!("--- cluster formed");
        }
        Ok(cluster)
    }

    /// The temporary directory holding configs, data and logs.
    pub fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .map(|d| d.path())
            .expect("temp dir present until drop")
    }

    /// Node ids, 1..=n.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// Ids of the nodes currently running.
    pub fn live_ids(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.id)
            .collect()
    }

    /// The gRPC address of node `id`.
    pub fn address(&self, id: u64) -> &str {
        &self.node(id).address
    }

    /// The AMQP 0-9-1 address (`amqp_addr`) of node `id`.
    pub fn amqp_address(&self, id: u64) -> &str {
        &self.node(id).amqp_address
    }

    /// An `amqp://` URL for node `id` as `guest` on the default vhost (`/`).
    pub fn amqp_url(&self, id: u64) -> String {
        format!("amqp://guest:guest@{}/%2f", self.amqp_address(id))
    }

    /// The HTTP address (`http_addr`: GET /metrics, /healthz) of node `id`.
    pub fn http_address(&self, id: u64) -> &str {
        &self.node(id).http_address
    }

    /// `GET path` on node `id`'s HTTP address: (status code, body).
    pub async fn http_get(&self, id: u64, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(self.http_address(id), path).await
    }

    /// The value of the sample `name` (no labels, or the exact `name{labels}`) on node `id`'s
    /// `/metrics`.
    pub async fn metric(&self, id: u64, name: &str) -> anyhow::Result<f64> {
        let (status, page) = self.http_get(id, "/metrics").await?;
        anyhow::ensure!(status == 200, "GET /metrics on node {id}: {status}");
        sample(&page, name).with_context(|| format!("node {id}: no sample {name}"))
    }

    /// Waits (up to 30 s) until every node's `/metrics` has the line `line` exactly: `what`
    /// names it in the error.
    pub async fn wait_metric_line_everywhere(&self, line: &str, what: &str) -> anyhow::Result<()> {
        for id in self.ids() {
            eventually(
                &format!("node {id}: {what}"),
                Duration::from_secs(30),
                || async move {
                    let (_, text) = self.http_get(id, "/metrics").await?;
                    Ok(text.lines().any(|l| l == line).then_some(()))
                },
            )
            .await?;
        }
        Ok(())
    }

    /// The cluster (node-to-node) address of node `id`.
    pub fn cluster_address(&self, id: u64) -> &str {
        &self.node(id).cluster_address
    }

    /// Where the cluster's CA and node certificates are.
    pub fn tls(&self) -> &ClusterTls {
        &self.tls
    }

    /// How clients reach the client ports: `Some` when they serve TLS.
    pub fn client_tls(&self) -> Option<&TlsOptions> {
        self.client_tls.as_ref()
    }

    /// A client of node `id`'s internal service on its cluster port, authenticated with a
    /// valid node certificate (node 1's): for tests of authenticated but forged peer traffic.
    pub async fn internal_client(&self, id: u64) -> anyhow::Result<InternalClient<Channel>> {
        let (cert, key) = self.tls.node_cert(1);
        let channel = tls_channel(
            self.cluster_address(id),
            &self.tls.ca_pem(),
            Some((&cert, &key)),
        )
        .await
        .with_context(|| format!("connect to node {id}'s cluster port"))?;
        Ok(InternalClient::new(channel))
    }

    fn node(&self, id: u64) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    fn node_mut(&mut self, id: u64) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let default = self.binary.clone();
        let node = self.node_mut(id);
        let binary = node.binary.clone().unwrap_or(default);
        assert!(node.child.is_none(), "node {id} is already running");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .with_context(|| format!("open {}", node.log.display()))?;
        let child = Command::new(&binary)
            .arg("--config")
            .arg(&node.config)
            .env(
                "RUST_LOG",
                std::env::var("QQ_TEST_NODE_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {} for node {id}", binary.display()))?;
        info!(node = id, pid = child.id(), address = %node.address, "node started");
        node.child = Some(child);
        Ok(())
    }

    /// A client connected to node `id` as guest.
    pub async fn client(&self, id: u64) -> anyhow::Result<Client> {
        Client::connect_with(self.address(id), self.client_tls.as_ref())
            .await
            .with_context(|| format!("connect to node {id} at {}", self.address(id)))
    }

    /// The binary node `id` runs from its next start on (None: the cluster's).
    pub fn set_binary(&mut self, id: u64, binary: Option<PathBuf>) {
        self.node_mut(id).binary = binary;
    }

    /// Starts node `id` (not running) without waiting for anything.
    pub fn start_node(&mut self, id: u64) -> anyhow::Result<()> {
        self.spawn(id)
    }

    /// Kills node `id` with SIGKILL (no shutdown, no flush) and reaps it.
    pub fn kill9(&mut self, id: u64) {
        let node = self.node_mut(id);
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            info!(node = id, "node killed with SIGKILL");
        }
    }

    /// Freezes node `id` with SIGSTOP (its ports still accept connections, nothing answers:
    /// a paused VM or a stuck process), or thaws it with SIGCONT (`frozen = false`).
    pub fn freeze(&mut self, id: u64, frozen: bool) -> anyhow::Result<()> {
        let node = self.node_mut(id);
        let child = node
            .child
            .as_ref()
            .with_context(|| format!("node {id} is not running"))?;
        let pid = child.id().to_string();
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let sent = Command::new("kill").args([signal, &pid]).status()?;
        ensure!(sent.success(), "kill {signal} {pid} failed: {sent}");
        info!(node = id, frozen, "node frozen or thawed");
        Ok(())
    }

    /// Sends SIGTERM to node `id` and waits (at most `timeout`) for it to exit; returns its
    /// exit status. The node is not running afterwards, whatever the outcome.
    pub async fn terminate(
        &mut self,
        id: u64,
        timeout: Duration,
    ) -> anyhow::Result<std::process::ExitStatus> {
        let node = self.node_mut(id);
        let mut child = node
            .child
            .take()
            .with_context(|| format!("node {id} is not running"))?;
        let pid = child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status()?;
        ensure!(sent.success(), "kill -TERM {pid} failed: {sent}");
        info!(node = id, "SIGTERM sent");
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if tokio::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("node {id} did not exit within {timeout:?} of SIGTERM (killed)");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The path of node `id`'s log file.
    pub fn log_path(&self, id: u64) -> &Path {
        &self.node(id).log
    }

    /// Starts node `id` again on its data directory and port, and waits until it answers
    /// `ClusterStatus` with a metadata leader.
    pub async fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        self.spawn(id)?;
        let address = self.address(id).to_string();
        let tls = self.client_tls.clone();
        eventually(
            &format!("restarted node {id} to see a metadata leader"),
            FORMATION_TIMEOUT,
            || {
                let address = address.clone();
                let tls = tls.clone();
                async move {
                    let c = Client::connect_with(&address, tls.as_ref()).await?;
                    let s = c.cluster_status().await?;
                    Ok((s.metadata_leader != 0).then_some(()))
                }
            },
        )
        .await?;
        self.check_alive()?;
        Ok(())
    }

    /// Starts every stopped node again (together: a majority must be up to elect a metadata
    /// leader) and waits until each reports one.
    pub async fn restart_all(&mut self) -> anyhow::Result<()> {
        let stopped: Vec<u64> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_none())
            .map(|n| n.id)
            .collect();
        for id in stopped {
            self.spawn(id)?;
        }
        self.wait_formed().await
    }

    /// Waits up to `timeout` for node `id` to exit by itself; its exit code (`None`: killed by
    /// a signal), or an error if it still runs.
    pub async fn wait_exit(&mut self, id: u64, timeout: Duration) -> anyhow::Result<Option<i32>> {
        let deadline = Instant::now() + timeout;
        loop {
            let node = self.node_mut(id);
            let child = node
                .child
                .as_mut()
                .with_context(|| format!("node {id} is not running"))?;
            if let Some(status) = child.try_wait()? {
                node.child = None;
                return Ok(status.code());
            }
            if Instant::now() >= deadline {
                bail!("node {id} still runs after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails if a node that should be running has exited (with the tail of its log).
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for node in &mut self.nodes {
            if let Some(child) = &mut node.child
                && let Ok(Some(status)) = child.try_wait()
            {
                node.child = None;
                bail!(
                    "node {} exited ({status}); log tail:\n{}",
                    node.id,
                    tail(&node.log, LOG_TAIL_LINES)
                );
            }
        }
        Ok(())
    }

    async fn wait_formed(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + FORMATION_TIMEOUT;
        for id in self.live_ids() {
            let address = self.address(id).to_string();
            loop {
                self.check_alive()?;
                let tls = self.client_tls.clone();
                let status = async {
                    let c = Client::connect_with(&address, tls.as_ref()).await?;
                    anyhow::Ok(c.cluster_status().await?)
                }
                .await;
                match status {
                    Ok(s) if s.metadata_leader != 0 => break,
                    Ok(_) | Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Ok(s) => bail!(
                        "node {id} sees no metadata leader after {FORMATION_TIMEOUT:?}: {s:?}"
                    ),
                    Err(e) => bail!("node {id} never answered ClusterStatus: {e:#}"),
                }
            }
        }
        Ok(())
    }

    /// The current leader of `queue` (in vhost `/`), as reported by a running node, once it is
    /// a running node. Waits through elections up to [`FAILOVER_TIMEOUT`].
    pub async fn leader_of(&self, queue: &str) -> anyhow::Result<u64> {
        self.leader_of_except(queue, 0).await
    }

    /// Like [`TestCluster::leader_of`], but waits until the leader is not `old` (0: any).
    pub async fn leader_of_except(&self, queue: &str, old: u64) -> anyhow::Result<u64> {
        let live = self.live_ids();
        let addresses: Vec<String> = live
            .iter()
            .map(|id| self.address(*id).to_string())
            .collect();
        let tls = self.client_tls.clone();
        eventually(
            &format!("a live leader of queue {queue} other than {old}"),
            FAILOVER_TIMEOUT,
            || {
                let addresses = addresses.clone();
                let live = live.clone();
                let tls = tls.clone();
                async move {
                    let mut last = None;
                    for address in &addresses {
                        let reply = async {
                            let c = Client::connect_with(address, tls.as_ref()).await?;
                            anyhow::Ok(c.get_queue(queue).await?)
                        }
                        .await;
                        match reply {
                            Ok(q)
                                if q.leader != 0 && q.leader != old && live.contains(&q.leader) =>
                            {
                                return Ok(Some(q.leader));
                            }
                            Ok(q) => last = Some(anyhow!("leader reported: {}", q.leader)),
                            Err(e) => last = Some(e),
                        }
                    }
                    match last {
                        Some(e) => Err(e),
                        None => Ok(None),
                    }
                }
            },
        )
        .await
    }

    /// The end of a passing test: kills the nodes and deletes the files. A cluster dropped
    /// without `stop` (the test failed, by panic or by returning an error) keeps its directory
    /// and prints the tail of every node's log.
    pub fn stop(mut self) {
        self.stopped = true;
    }

    /// The ids of the running nodes other than `id`.
    pub fn others(&self, id: u64) -> Vec<u64> {
        self.live_ids().into_iter().filter(|n| *n != id).collect()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Not stopped: the test failed (a panic, or an error returned with `?`). Keep the files
        // and show what the nodes did.
        if !self.stopped
            && let Some(dir) = self.dir.take()
        {
            let path = dir.keep();
            eprintln!("test failed: cluster files kept in {}", path.display());
            for node in &self.nodes {
                eprintln!(
                    "===== node {} log ({}), last {LOG_TAIL_LINES} lines",
                    node.id,
                    node.log.display()
                );
                eprintln!("{}", tail(&node.log, LOG_TAIL_LINES));
            }
        }
    }
}

/// A plain HTTP/1.0 `GET path` to `address` (the server closes the connection after the
/// answer): (status code, body). Bounded by a 10 s timeout.
/// The value of the sample `name` (no labels, or the exact `name{labels}`) in a metrics page.
pub fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(name)?
            .strip_prefix(' ')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

pub async fn http_get(address: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .with_context(|| format!("connect to {address}"))?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
            .await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        anyhow::Ok(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .with_context(|| format!("GET {path} on {address}: no answer in 10 s"))??;
    let text = String::from_utf8(raw).context("HTTP answer is not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("GET {path} on {address}: no header end in {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("GET {path} on {address}: bad status line in {head:?}"))?;
    Ok((status, body.to_string()))
}

/// `n` distinct free loopback ports (each checked by binding it, then released).
///
/// They come from the 12 000 ports just below the kernel's ephemeral range
/// (`ip_local_port_range`, 32768 by default), never from inside it: a port the kernel hands out
/// for outgoing connections (the nodes' own, the clients') could be taken between this check
/// and the node's bind, and the node then failed to start with "Address already in use" (seen
/// in `make test`). Each test process starts at its own place in that range and goes on from
/// there, so consecutive clusters do not reuse ports still in TIME_WAIT.
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    const SPAN: u32 = 12_000;
    let ephemeral_low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    ensure!(
        ephemeral_low > SPAN + 1024,
        "ip_local_port_range starts at {ephemeral_low}: too low"
    );
    let low = ephemeral_low - SPAN;
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id() % SPAN,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    let mut ports = Vec::with_capacity(n);
    for _ in 0..SPAN {
        if ports.len() == n {
            break;
        }
        let port = (low + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    ensure!(
        ports.len() == n,
        "fewer than {n} free ports in {low}..{ephemeral_low}"
    );
    Ok(ports)
}

/// How long a node's log is now, in bytes: where [`log_since`] starts (a restarted node
/// appends to the log of its earlier runs).
pub fn log_len(path: &Path) -> usize {
    std::fs::metadata(path).map_or(0, |m| m.len() as usize)
}

/// What a log gained after its first `from` bytes ([`log_len`]); empty if it has none.
pub fn log_since(path: &Path, from: usize) -> String {
    let log = std::fs::read(path).unwrap_or_default();
    String::from_utf8_lossy(log.get(from..).unwrap_or_default()).into_owned()
}

/// The last `lines` lines of a file (reads at most the last 64 KiB).
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
