//! Node configuration: one typed `Config` with defaults in code, then the TOML file given with
//! `--config`, then `QQ_<KEY>` environment variables ([`env`]), then command-line flags
//! ([`load`]): flag > environment > file > default. `validate()` runs at start and names the
//! field and the reason for every problem.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use qq_raft::network::PeerTls;
use serde::Deserialize;

pub mod env;
mod load;

pub use load::{Args, Command, node_id_from_hostname};

/// Default bound on one message (properties + body), 16 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// Default bound on unconfirmed publishes in flight on one `PublishStream`.
pub const DEFAULT_MAX_INFLIGHT_PUBLISHES: usize = 10_000;
/// Default bound on a consumer's prefetch.
pub const DEFAULT_MAX_PREFETCH: u32 = 65_535;
/// Default unacked deliveries of a consumer that asks for prefetch 0 (unlimited).
pub const DEFAULT_PREFETCH_ZERO_CAP: u32 = 2_000;
/// Default bounds on a message's headers: entries (nested ones included) and nesting depth.
pub const DEFAULT_MAX_HEADERS: usize = 1_024;
pub const DEFAULT_MAX_HEADER_DEPTH: usize = 8;

/// A cluster member: its node id, the client address that status and redirects show, and the
/// cluster address other nodes reach its node-to-node service at.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    pub id: u64,
    pub address: String,
    pub cluster_address: String,
}

/// Everything a node needs to start. See `cluster/node1.toml` for the documented file form.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This node's id: unique in the cluster, stable across restarts, >= 1.
    pub node_id: u64,
    /// Take `node_id` from the hostname instead: the ordinal after its last `-`, plus one (a
    /// StatefulSet's pod `quorumq-0` is node 1). Refused together with `node_id`.
    #[serde(default)]
    pub node_id_from_hostname: bool,
    /// Where the client API (qq.v1.Broker) listens.
    pub listen: SocketAddr,
    /// The client address status and redirects show for this node; defaults to this node's
    /// `address` in `peers` when `listen` is a wildcard (0.0.0.0, ::) or the id comes from the
    /// hostname, else to `listen`.
    #[serde(default)]
    pub advertise: Option<String>,
    /// Where the node-to-node service (qq.internal.v1.Internal) listens: mutual TLS with the
    /// cluster CA unless `insecure_cluster`.
    pub cluster_addr: SocketAddr,
    /// PEM files of cluster TLS: the CA every node certificate chains to, this node's
    /// certificate and its key (see `qq-node certs`). Required unless `insecure_cluster`.
    #[serde(default)]
    pub cluster_ca: Option<PathBuf>,
    #[serde(default)]
    pub cluster_cert: Option<PathBuf>,
    #[serde(default)]
    pub cluster_key: Option<PathBuf>,
    /// Plain-text, unauthenticated cluster traffic (anyone who reaches the cluster port can
    /// act as a node). Only for trusted networks; logged as a warning at start.
    #[serde(default)]
    pub insecure_cluster: bool,
    /// PEM certificate and key of the client port: when set, clients must speak TLS.
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// PEM CA of client certificates: when set, every client must present a certificate from it.
    #[serde(default)]
    pub tls_client_ca: Option<PathBuf>,
    /// Every initial member, this node included. Nodes started with the same list form the
    /// cluster by themselves.
    pub peers: Vec<Peer>,
    /// Directory for the node's RocksDB (created if missing).
    pub data_dir: PathBuf,
    /// Largest accepted message (properties + body), in bytes.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// Largest number of unconfirmed publishes on one PublishStream; the stream is not read
    /// further until confirms come back.
    #[serde(default = "default_max_inflight")]
    pub max_inflight_publishes: usize,
    /// Largest prefetch a consumer may ask for.
    #[serde(default = "default_max_prefetch")]
    pub max_prefetch: u32,
    /// What prefetch 0 ("unlimited") means: at most this many unacked deliveries; beyond them
    /// the consumer gets more only as it settles (and an unread stream backs up through gRPC
    /// flow control instead of growing the node's memory).
    #[serde(default = "default_prefetch_zero_cap")]
    pub prefetch_zero_cap: u32,
    /// Most client connections the node holds at once; a connection beyond it is closed as
    /// soon as it is accepted (logged). RabbitMQ's `connection_max`.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Most Consume and PublishStream calls open at once on one client connection; one more is
    /// RESOURCE_EXHAUSTED. (HTTP/2 itself allows at most `max_streams_per_connection` + 256
    /// concurrent calls per connection; a client past that waits.)
    #[serde(default = "default_max_streams_per_connection")]
    pub max_streams_per_connection: usize,
    /// Most header entries in one message, nested tables' and lists' entries included.
    #[serde(default = "default_max_headers")]
    pub max_headers: usize,
    /// Deepest nesting of tables and lists in a message's headers.
    #[serde(default = "default_max_header_depth")]
    pub max_header_depth: usize,
    /// Memory alarm: resident memory above this fraction of the machine's RAM refuses
    /// publishes until it falls back under (RabbitMQ's vm_memory_high_watermark.relative).
    #[serde(default = "default_memory_high_watermark")]
    pub memory_high_watermark: f64,
    /// The same bound in bytes; when set, it replaces `memory_high_watermark`.
    #[serde(default)]
    pub memory_high_watermark_bytes: Option<u64>,
    /// Disk alarm: less free space than this (bytes) on the data directory's file system
    /// refuses publishes until there is more (RabbitMQ's disk_free_limit).
    #[serde(default = "default_disk_free_limit")]
    pub disk_free_limit: u64,
    /// How often the alarms are checked, in ms.
    #[serde(default = "default_alarm_check_ms")]
    pub alarm_check_ms: u64,
    /// Raft heartbeat interval in ms (every group).
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// Raft election timeout range in ms: failover takes about this long when a leader is cut
    /// off or frozen (a dead process is replaced at once, see [`crate::liveness`]).
    #[serde(default = "default_election_min_ms")]
    pub election_timeout_min_ms: u64,
    #[serde(default = "default_election_max_ms")]
    pub election_timeout_max_ms: u64,
    /// A queue group with nothing applied for this long goes to sleep (no election timer, no
    /// heartbeats) until something wakes it ([`crate::groups::residency`]); 0: never.
    #[serde(default = "default_quiesce_after_ms")]
    pub quiesce_after_ms: u64,
    /// A queue replica that has slept this long lets its Raft instance go (about two thirds
    /// of an idle queue's memory) until something needs it again
    /// ([`crate::groups::registry`]); 0: never.
    #[serde(default = "default_unload_after_ms")]
    pub unload_after_ms: u64,
    /// Snapshot (and compact the log of) a group after this many entries.
    #[serde(default = "default_snapshot_entries")]
    pub snapshot_after_entries: u64,
    /// How often at-least-once dead letters without a route are retried, in ms.
    #[serde(default = "default_dead_letter_retry_ms")]
    pub dead_letter_retry_ms: u64,
    /// The consumer timeout of queues that set none (`x-consumer-timeout` or the policy key
    /// `consumer-timeout`), in ms; 0: none (the default). At most a week.
    #[serde(default)]
    pub consumer_timeout_ms: u64,
    /// Users that may connect only from a loopback address (RabbitMQ's `loopback_users`);
    /// requests without credentials act as `guest`. `[]` lifts the restriction (strongly
    /// discouraged while guest has its default password).
    #[serde(default = "default_loopback_users")]
    pub loopback_users: Vec<String>,
    /// Accept HTTP Basic credentials from non-loopback addresses on a client port without TLS
    /// (they then cross the network in clear). Off by default.
    #[serde(default)]
    pub allow_plaintext_auth: bool,
    /// Where the operator's HTTP endpoint listens (`GET /metrics`, `GET /healthz`; read-only,
    /// no credentials). Unset: no HTTP server.
    #[serde(default)]
    pub http_addr: Option<SocketAddr>,
    /// Where the AMQP 0-9-1 listener accepts plain-TCP clients ([`crate::amqp`]). Unset: none.
    #[serde(default)]
    pub amqp_addr: Option<SocketAddr>,
    /// Where the AMQP 0-9-1 listener accepts TLS clients (amqps), with the client port's
    /// `tls_cert`, `tls_key` and `tls_client_ca` (which then also enables SASL EXTERNAL).
    /// Unset: none.
    #[serde(default)]
    pub amqps_addr: Option<SocketAddr>,
    /// Most channels one AMQP connection may open (offered in connection.tune; RabbitMQ's
    /// default 2047).
    #[serde(default = "default_amqp_channel_max")]
    pub amqp_channel_max: u16,
    /// Largest AMQP frame, in bytes (offered in connection.tune; RabbitMQ's default 131072).
    #[serde(default = "default_amqp_frame_max")]
    pub amqp_frame_max: u32,
    /// AMQP heartbeat interval the node offers, in seconds (RabbitMQ's default 60); the client
    /// may ask for less. A peer silent for two intervals is dropped.
    #[serde(default = "default_amqp_heartbeat_s")]
    pub amqp_heartbeat_s: u16,
    /// Export one series per queue this node leads (`quorumq_queue_*{vhost,queue}`) and per
    /// Raft group it hosts. Off: only per-node sums, so a node with many queues keeps a
    /// bounded number of series.
    #[serde(default = "default_per_queue_metrics")]
    pub per_queue_metrics: bool,
    /// Threads that run the node's tasks (tokio's workers); unset, one per core. Nodes that
    /// share a machine's cores (`make cluster`, the benchmark) may spend less CPU with fewer:
    /// docs/operating.md, "Worker threads".
    #[serde(default)]
    pub worker_threads: Option<usize>,
    /// A definitions document (`qqctl definitions export`) imported once this node has joined
    /// and sees a metadata leader (idempotent, so every node may name it). A file that does
    /// not parse stops the node at start.
    #[serde(default)]
    pub definitions_file: Option<PathBuf>,
    /// `text` (default) or `json`: one JSON object per line on stderr.
    #[serde(default)]
    pub log_format: LogFormat,
}

/// How the node writes its log lines (stderr).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

fn default_max_message_bytes() -> usize {
    DEFAULT_MAX_MESSAGE_BYTES
}
fn default_max_inflight() -> usize {
    DEFAULT_MAX_INFLIGHT_PUBLISHES
}
fn default_max_prefetch() -> u32 {
    DEFAULT_MAX_PREFETCH
}
fn default_max_connections() -> usize {
    4096
}
fn default_max_streams_per_connection() -> usize {
    128
}
fn default_prefetch_zero_cap() -> u32 {
    DEFAULT_PREFETCH_ZERO_CAP
}
fn default_max_headers() -> usize {
    DEFAULT_MAX_HEADERS
}
fn default_max_header_depth() -> usize {
    DEFAULT_MAX_HEADER_DEPTH
}
fn default_memory_high_watermark() -> f64 {
    0.6
}
fn default_disk_free_limit() -> u64 {
    50_000_000
}
fn default_alarm_check_ms() -> u64 {
    1_000
}
fn default_heartbeat_ms() -> u64 {
    250
}
fn default_election_min_ms() -> u64 {
    1000
}
fn default_election_max_ms() -> u64 {
    2000
}
fn default_quiesce_after_ms() -> u64 {
    2000
}
fn default_unload_after_ms() -> u64 {
    10_000
}
fn default_snapshot_entries() -> u64 {
    20_000
}
fn default_dead_letter_retry_ms() -> u64 {
    3000
}
fn default_amqp_channel_max() -> u16 {
    2047
}
fn default_amqp_frame_max() -> u32 {
    131_072
}
fn default_amqp_heartbeat_s() -> u16 {
    60
}
/// Most `worker_threads` a node starts.
pub const MAX_WORKER_THREADS: usize = 1024;

fn default_per_queue_metrics() -> bool {
    true
}
fn default_loopback_users() -> Vec<String> {
    vec!["guest".to_string()]
}

impl Config {
    /// Check every field; the message names the field and the reason.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.node_id == 0 {
            bail!("node_id: must be >= 1");
        }
        if self.peers.is_empty() {
            bail!("peers: at least one peer (this node) is required");
        }
        if let Some(n) = self.worker_threads
            && !(1..=MAX_WORKER_THREADS).contains(&n)
        {
            bail!("worker_threads: {n} is not between 1 and {MAX_WORKER_THREADS}");
        }
        if self.consumer_timeout_ms > qq_core::queue::MAX_CONSUMER_TIMEOUT_MS {
            bail!(
                "consumer_timeout_ms: {} exceeds {} (a week)",
                self.consumer_timeout_ms,
                qq_core::queue::MAX_CONSUMER_TIMEOUT_MS
            );
        }
        let mut seen = BTreeMap::new();
        for p in &self.peers {
            if p.id == 0 {
                bail!("peers: node id 0 is not allowed (ids start at 1)");
            }
            if seen.insert(p.id, &p.address).is_some() {
                bail!("peers: node id {} is listed twice", p.id);
            }
            for (field, value) in [
                ("address", &p.address),
                ("cluster_address", &p.cluster_address),
            ] {
                if value.parse::<SocketAddr>().is_err() && !value.contains(':') {
                    bail!("peers: {field} '{value}' of node {} is not host:port", p.id);
                }
            }
            if p.address == p.cluster_address {
                bail!(
                    "peers: node {} has the same address and cluster_address '{}' (the client \
                     and cluster services need their own ports)",
                    p.id,
                    p.address
                );
            }
        }
        if self.cluster_addr == self.listen {
            bail!(
                "cluster_addr: must differ from listen ({}): clients and nodes use separate ports",
                self.listen
            );
        }
        if let Some(http) = self.http_addr
            && (http == self.listen || http == self.cluster_addr)
        {
            bail!("http_addr: must differ from listen and cluster_addr ({http})");
        }
        self.validate_amqp()?;
        self.validate_tls()?;
        if !seen.contains_key(&self.node_id) {
            bail!(
                "peers: this node's id {} is not in the peer list",
                self.node_id
            );
        }
        if self.max_message_bytes == 0 || self.max_message_bytes > 512 * 1024 * 1024 {
            bail!("max_message_bytes: must be between 1 and 536870912");
        }
        if self.max_inflight_publishes == 0 {
            bail!("max_inflight_publishes: must be >= 1");
        }
        if self.max_prefetch == 0 {
            bail!("max_prefetch: must be >= 1");
        }
        if self.max_connections == 0 {
            bail!("max_connections: must be >= 1");
        }
        if self.max_streams_per_connection == 0 || self.max_streams_per_connection > 65_536 {
            bail!("max_streams_per_connection: must be between 1 and 65536");
        }
        if self.prefetch_zero_cap == 0 || self.prefetch_zero_cap > self.max_prefetch {
            bail!(
                "prefetch_zero_cap: must be between 1 and max_prefetch ({})",
                self.max_prefetch
            );
        }
        if self.max_header_depth == 0 || self.max_header_depth > qq_core::meta::MAX_VALUE_DEPTH {
            bail!(
                "max_header_depth: must be between 1 and {}",
                qq_core::meta::MAX_VALUE_DEPTH
            );
        }
        if !(self.memory_high_watermark > 0.0 && self.memory_high_watermark <= 1.0) {
            bail!("memory_high_watermark: must be a fraction of RAM in (0, 1]");
        }
        if self.alarm_check_ms == 0 {
            bail!("alarm_check_ms: must be >= 1");
        }
        if self.heartbeat_ms == 0 {
            bail!("heartbeat_ms: must be >= 1");
        }
        if self.election_timeout_min_ms <= self.heartbeat_ms {
            bail!(
                "election_timeout_min_ms: must be greater than heartbeat_ms ({})",
                self.heartbeat_ms
            );
        }
        if self.election_timeout_max_ms <= self.election_timeout_min_ms {
            bail!("election_timeout_max_ms: must be greater than election_timeout_min_ms");
        }
        if self.snapshot_after_entries < 100 {
            bail!("snapshot_after_entries: must be >= 100");
        }
        Ok(())
    }

    /// The AMQP listeners: each on its own port, amqps only with the client port's TLS
    /// files, and tune values RabbitMQ's clients accept.
    fn validate_amqp(&self) -> anyhow::Result<()> {
        let others = [Some(self.listen), Some(self.cluster_addr), self.http_addr];
        for (field, addr) in [
            ("amqp_addr", self.amqp_addr),
            ("amqps_addr", self.amqps_addr),
        ] {
            if let Some(a) = addr
                && others.contains(&Some(a))
            {
                bail!("{field}: must differ from listen, cluster_addr and http_addr ({a})");
            }
        }
        if self.amqp_addr.is_some() && self.amqp_addr == self.amqps_addr {
            bail!("amqps_addr: must differ from amqp_addr");
        }
        if self.amqps_addr.is_some() && self.tls_cert.is_none() {
            bail!("amqps_addr: needs tls_cert and tls_key (the client port's certificate)");
        }
        if self.amqp_frame_max < 4096 {
            bail!("amqp_frame_max: must be at least 4096 (AMQP's frame-min-size)");
        }
        if self.amqp_channel_max == 0 {
            bail!("amqp_channel_max: must be at least 1");
        }
        Ok(())
    }

    /// Cluster and client TLS files: set together, present, and cluster TLS unless
    /// `insecure_cluster`.
    fn validate_tls(&self) -> anyhow::Result<()> {
        let cluster = [
            ("cluster_ca", &self.cluster_ca),
            ("cluster_cert", &self.cluster_cert),
            ("cluster_key", &self.cluster_key),
        ];
        if self.insecure_cluster {
            if let Some((field, _)) = cluster.iter().find(|(_, v)| v.is_some()) {
                bail!(
                    "{field}: set together with insecure_cluster = true; remove one (TLS files \
                     would be ignored)"
                );
            }
        } else {
            for (field, value) in cluster {
                match value {
                    None => bail!(
                        "{field}: not set; cluster traffic needs mutual TLS (create the files with \
                         `qq-node certs`), or set insecure_cluster = true on a trusted network"
                    ),
                    Some(path) => check_file(field, path)?,
                }
            }
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                check_file("tls_cert", cert)?;
                check_file("tls_key", key)?;
            }
            (Some(_), None) => bail!("tls_key: not set, but tls_cert is (set both or neither)"),
            (None, Some(_)) => bail!("tls_cert: not set, but tls_key is (set both or neither)"),
            (None, None) => {}
        }
        if let Some(ca) = &self.tls_client_ca {
            if self.tls_cert.is_none() {
                bail!(
                    "tls_client_ca: client certificates need client TLS (set tls_cert and tls_key)"
                );
            }
            check_file("tls_client_ca", ca)?;
        }
        Ok(())
    }

    /// This node's cluster TLS identity read from the PEM files (`None` with
    /// `insecure_cluster`).
    pub fn cluster_tls(&self) -> anyhow::Result<Option<PeerTls>> {
        if self.insecure_cluster {
            return Ok(None);
        }
        let read = |field: &str, path: &Option<PathBuf>| -> anyhow::Result<Vec<u8>> {
            let path = path.as_ref().with_context(|| format!("{field}: not set"))?;
            std::fs::read(path).with_context(|| format!("{field}: read {}", path.display()))
        };
        Ok(Some(PeerTls {
            ca_pem: read("cluster_ca", &self.cluster_ca)?,
            cert_pem: read("cluster_cert", &self.cluster_cert)?,
            key_pem: read("cluster_key", &self.cluster_key)?,
        }))
    }

    /// The address other nodes reach this node at.
    pub fn advertised(&self) -> String {
        if let Some(a) = &self.advertise {
            return a.clone();
        }
        let own = self.peers.iter().find(|p| p.id == self.node_id);
        match own {
            Some(p) if self.listen.ip().is_unspecified() || self.node_id_from_hostname => {
                p.address.clone()
            }
            _ => self.listen.to_string(),
        }
    }

    /// Sorted ids of every initial member.
    pub fn node_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.peers.iter().map(|p| p.id).collect();
        ids.sort_unstable();
        ids
    }
}

/// A TLS file named by `field` must be a readable file.
fn check_file(field: &str, path: &std::path::Path) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => bail!("{field}: {} is not a file", path.display()),
        Err(e) => bail!("{field}: cannot read {}: {e}", path.display()),
    }
}

#[cfg(test)]
impl Config {
    /// A validated one-node configuration with `extra` lines, for this crate's tests.
    pub(crate) fn for_tests(extra: &str) -> anyhow::Result<Config> {
        let text = format!(
            "node_id = 1\nlisten = \"127.0.0.1:7101\"\ncluster_addr = \"127.0.0.1:7201\"\n\
             data_dir = \"/tmp/x\"\n{extra}\npeers = [{{ id = 1, address = \"127.0.0.1:7101\", \
             cluster_address = \"127.0.0.1:7201\" }}]\n"
        );
        let config: Config = toml::from_str(&text)?;
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(extra: &str) -> String {
        format!("{:#}", Config::for_tests(extra).expect_err(extra))
    }

    #[test]
    fn cluster_tls_is_required_unless_insecure() {
        assert!(err("").starts_with("cluster_ca: not set"), "{}", err(""));
        assert!(Config::for_tests("insecure_cluster = true").is_ok());
        let missing = "cluster_ca = \"/nonexistent/ca.pem\"\ncluster_cert = \"/nonexistent/c\"\n\
                       cluster_key = \"/nonexistent/k\"";
        assert!(
            err(missing).starts_with("cluster_ca: cannot read"),
            "{}",
            err(missing)
        );
        let both = "insecure_cluster = true\ncluster_cert = \"/x\"";
        assert!(
            err(both).starts_with("cluster_cert: set together"),
            "{}",
            err(both)
        );
    }

    #[test]
    fn worker_threads_are_bounded() {
        let e = err("insecure_cluster = true\nworker_threads = 0");
        assert!(
            e.starts_with("worker_threads: 0 is not between 1 and"),
            "{e}"
        );
        let config = Config::for_tests("insecure_cluster = true\nworker_threads = 1").unwrap();
        assert_eq!(config.worker_threads, Some(1));
        let config = Config::for_tests("insecure_cluster = true").unwrap();
        assert_eq!(config.worker_threads, None, "unset: one per core");
    }

    #[test]
    fn client_tls_files_come_in_pairs() {
        let e = err("insecure_cluster = true\ntls_cert = \"/x\"");
        assert!(e.starts_with("tls_key: not set"), "{e}");
        let e = err("insecure_cluster = true\ntls_client_ca = \"/x\"");
        assert!(
            e.starts_with("tls_client_ca: client certificates need"),
            "{e}"
        );
    }

    #[test]
    fn cluster_port_differs_from_client_port() {
        let text = "node_id = 1\nlisten = \"127.0.0.1:7101\"\ncluster_addr = \"127.0.0.1:7101\"\n\
                    data_dir = \"/tmp/x\"\ninsecure_cluster = true\npeers = [{ id = 1, address = \
                    \"127.0.0.1:7101\", cluster_address = \"127.0.0.1:7201\" }]\n";
        let config: Config = toml::from_str(text).unwrap();
        let e = format!("{:#}", config.validate().unwrap_err());
        assert!(e.starts_with("cluster_addr: must differ"), "{e}");
    }
}
