//! Where a node's configuration comes from: defaults in code, the TOML file (`--config`,
//! `QQ_CONFIG`), the environment (`QQ_<KEY>`, [`super::env`]) and command-line flags, each
//! layer over the one before: flag > environment > file > default. The node id may instead
//! come from the hostname's ordinal (`node_id_from_hostname`, for a Kubernetes StatefulSet).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{CommandFactory, FromArgMatches, Parser};

use super::{Config, LogFormat, env};

/// Command line. Either `--config FILE`, or the environment, or the flags, or any mix (flag >
/// environment > file > default).
#[derive(Debug, Parser)]
#[command(name = "qq-node", version, about = "A quorumq cluster node")]
pub struct Args {
    /// TOML config file (see cluster/node1.toml).
    #[arg(long, env = "QQ_CONFIG")]
    pub config: Option<PathBuf>,
    /// Node id (>= 1).
    #[arg(long)]
    pub node_id: Option<u64>,
    /// Listen address, e.g. 127.0.0.1:7101.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Advertised client address, host:port (defaults to this node's entry in the peers, or
    /// the listen address).
    #[arg(long)]
    pub advertise: Option<String>,
    /// Cluster (node-to-node) listen address, e.g. 127.0.0.1:7201.
    #[arg(long)]
    pub cluster_addr: Option<SocketAddr>,
    /// Initial members as id=client-host:port@cluster-host:port, comma separated, e.g.
    /// 1=127.0.0.1:7101@127.0.0.1:7201,2=qq-2.example:7101@qq-2.example:7201 (host names
    /// are resolved at every connection attempt).
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<String>,
    /// Data directory.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// HTTP address for /metrics and /healthz, e.g. 127.0.0.1:7301.
    #[arg(long)]
    pub http_addr: Option<SocketAddr>,
    /// Log format: text or json (one JSON object per line); overrides `log_format`.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands; without one, qq-node runs a node.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Create the cluster CA (or reuse it) and a node certificate signed by it.
    Certs(crate::certs::CertsArgs),
}

impl Args {
    /// The command line of this process, with the environment's variables in `--help`.
    pub fn parse_with_env_help() -> Args {
        let matches = Args::command().after_long_help(env::help()).get_matches();
        Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }

    /// The flags given, as keys of the file.
    fn overlay(&self, table: &mut toml::Table) -> anyhow::Result<()> {
        let mut set = |key: &str, value: Option<toml::Value>| {
            if let Some(v) = value {
                table.insert(key.into(), v);
            }
        };
        let text = |s: String| toml::Value::String(s);
        set(
            "node_id",
            self.node_id.map(|id| toml::Value::Integer(id as i64)),
        );
        set("listen", self.listen.map(|a| text(a.to_string())));
        set(
            "cluster_addr",
            self.cluster_addr.map(|a| text(a.to_string())),
        );
        set("http_addr", self.http_addr.map(|a| text(a.to_string())));
        set(
            "log_format",
            self.log_format.map(|f| text(f.as_str().into())),
        );
        set("advertise", self.advertise.clone().map(text));
        set(
            "data_dir",
            self.data_dir
                .as_ref()
                .map(|d| text(d.display().to_string())),
        );
        if !self.peers.is_empty() {
            let peers = env::peers("--peers", self.peers.iter().map(String::as_str))?;
            table.insert("peers".into(), peers);
        }
        Ok(())
    }
}

impl Config {
    /// Load from the file (if any), the process's `QQ_*` variables `vars`
    /// ([`env::process_env`]) and the flags, then validate.
    pub fn load(args: &Args, vars: &BTreeMap<String, String>) -> anyhow::Result<Config> {
        Config::load_from(args, vars, read_hostname)
    }

    /// [`Config::load`] with the environment `vars` and a source of the hostname.
    pub(crate) fn load_from(
        args: &Args,
        vars: &BTreeMap<String, String>,
        hostname: impl FnOnce() -> anyhow::Result<String>,
    ) -> anyhow::Result<Config> {
        let mut table: toml::Table = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("read config file {}", path.display()))?;
                text.parse()
                    .with_context(|| format!("parse config file {}", path.display()))?
            }
            None => toml::Table::new(),
        };
        env::overlay(&mut table, vars)?;
        args.overlay(&mut table)?;
        if table.get("node_id_from_hostname") == Some(&toml::Value::Boolean(true)) {
            if let Some(id) = table.get("node_id") {
                bail!(
                    "node_id_from_hostname: set together with node_id = {id}; remove one \
                     (QQ_NODE_ID_FROM_HOSTNAME, QQ_NODE_ID, --node-id)"
                );
            }
            let id = node_id_from_hostname(&hostname()?)?;
            table.insert("node_id".into(), toml::Value::Integer(id as i64));
        }
        let config: Config = toml::Value::Table(table)
            .try_into()
            .context("invalid configuration (keys of the file, QQ_<KEY> variables or flags)")?;
        config.validate()?;
        Ok(config)
    }
}

/// This machine's hostname (a pod's name in Kubernetes).
fn read_hostname() -> anyhow::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("node_id_from_hostname: read /proc/sys/kernel/hostname")?;
    Ok(name.trim().to_string())
}

/// The node id of a StatefulSet pod: the ordinal after the last `-` of the hostname's first
/// label, plus one (ids start at 1, ordinals at 0): `quorumq-0` is node 1.
pub fn node_id_from_hostname(hostname: &str) -> anyhow::Result<u64> {
    let label = hostname.split('.').next().unwrap_or_default();
    let ordinal = label
        .rsplit_once('-')
        .and_then(|(name, n)| (!name.is_empty()).then_some(n))
        .and_then(|n| n.parse::<u64>().ok());
    match ordinal.and_then(|n| n.checked_add(1)) {
        Some(id) if id <= i64::MAX as u64 => Ok(id),
        _ => bail!(
            "node_id_from_hostname: hostname '{hostname}' has no ordinal (expected NAME-N, as \
             a StatefulSet names its pods: quorumq-0 is node 1); set node_id instead"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(argv: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("qq-node").chain(argv.iter().copied())).unwrap()
    }

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// What a StatefulSet's manifest sets (deploy/): enough to start without a file.
    fn pod_env() -> Vec<(&'static str, &'static str)> {
        vec![
            ("QQ_NODE_ID_FROM_HOSTNAME", "true"),
            ("QQ_LISTEN", "0.0.0.0:7101"),
            ("QQ_CLUSTER_ADDR", "0.0.0.0:7201"),
            ("QQ_HTTP_ADDR", "0.0.0.0:7301"),
            ("QQ_AMQP_ADDR", "0.0.0.0:5672"),
            (
                "QQ_PEERS",
                "1=quorumq-0.quorumq-headless:7101@quorumq-0.quorumq-headless:7201,\
                 2=quorumq-1.quorumq-headless:7101@quorumq-1.quorumq-headless:7201,\
                 3=quorumq-2.quorumq-headless:7101@quorumq-2.quorumq-headless:7201",
            ),
            ("QQ_DATA_DIR", "/var/lib/quorumq"),
            ("QQ_INSECURE_CLUSTER", "true"),
            ("QQ_LOOPBACK_USERS", ""),
        ]
    }

    fn load(argv: &[&str], env: &[(&str, &str)], host: &str) -> anyhow::Result<Config> {
        let host = host.to_string();
        Config::load_from(&args(argv), &vars(env), move || Ok(host))
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn a_pod_starts_from_the_environment_alone() {
        let c = load(&[], &pod_env(), "quorumq-1").unwrap();
        assert_eq!(c.node_id, 2);
        assert_eq!(c.listen, "0.0.0.0:7101".parse().unwrap());
        assert_eq!(c.amqp_addr, Some("0.0.0.0:5672".parse().unwrap()));
        assert!(c.loopback_users.is_empty());
        assert_eq!(
            c.peers[2].cluster_address,
            "quorumq-2.quorumq-headless:7201"
        );
        // Listening on every address: the advertised address is the node's own peer entry.
        assert_eq!(c.advertised(), "quorumq-1.quorumq-headless:7101");
    }

    #[test]
    fn flag_beats_environment_beats_file_beats_default() {
        let f = file(
            "node_id = 1\nlisten = \"127.0.0.1:7101\"\ncluster_addr = \"127.0.0.1:7201\"\n\
             data_dir = \"/tmp/file\"\ninsecure_cluster = true\nheartbeat_ms = 100\n\
             election_timeout_min_ms = 900\n\
             peers = [{ id = 1, address = \"127.0.0.1:7101\", cluster_address = \"127.0.0.1:7201\" }]\n",
        );
        let path = f.path().to_str().unwrap();
        let env = [("QQ_HEARTBEAT_MS", "150"), ("QQ_DATA_DIR", "/tmp/env")];
        let c = load(&["--config", path], &env, "h").unwrap();
        assert_eq!(c.heartbeat_ms, 150, "environment over file");
        assert_eq!(c.election_timeout_min_ms, 900, "file over default");
        assert_eq!(c.election_timeout_max_ms, 2000, "default");
        assert_eq!(c.data_dir, PathBuf::from("/tmp/env"));
        let c = load(&["--config", path, "--data-dir", "/tmp/flag"], &env, "h").unwrap();
        assert_eq!(
            c.data_dir,
            PathBuf::from("/tmp/flag"),
            "flag over environment"
        );
        assert_eq!(c.advertised(), "127.0.0.1:7101");
    }

    #[test]
    fn node_id_from_the_pod_ordinal() {
        assert_eq!(node_id_from_hostname("quorumq-0").unwrap(), 1);
        assert_eq!(node_id_from_hostname("my-broker-12.svc.local").unwrap(), 13);
        for bad in ["quorumq", "quorumq-", "quorumq-x", "-3", ""] {
            let e = format!("{:#}", node_id_from_hostname(bad).unwrap_err());
            assert!(
                e.starts_with(&format!(
                    "node_id_from_hostname: hostname '{bad}' has no ordinal"
                )),
                "{e}"
            );
        }
        let e = format!("{:#}", load(&[], &pod_env(), "laptop").unwrap_err());
        assert!(e.contains("hostname 'laptop' has no ordinal"), "{e}");
        let mut env = pod_env();
        env.push(("QQ_NODE_ID", "2"));
        let e = format!("{:#}", load(&[], &env, "quorumq-1").unwrap_err());
        assert!(
            e.starts_with("node_id_from_hostname: set together with node_id"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_variable_or_the_missing_key() {
        let mut env = pod_env();
        env.push(("QQ_HEARTBEAT_MS", "soon"));
        let e = format!("{:#}", load(&[], &env, "quorumq-0").unwrap_err());
        assert!(e.starts_with("QQ_HEARTBEAT_MS: 'soon' is not"), "{e}");
        let env: Vec<_> = pod_env()
            .into_iter()
            .filter(|(k, _)| *k != "QQ_DATA_DIR")
            .collect();
        let e = format!("{:#}", load(&[], &env, "quorumq-0").unwrap_err());
        assert!(e.contains("missing field `data_dir`"), "{e}");
        let e = format!(
            "{:#}",
            load(&["--peers", "1=a:1"], &pod_env(), "q-0").unwrap_err()
        );
        assert!(e.starts_with("--peers: '1=a:1' has no @"), "{e}");
    }
}
