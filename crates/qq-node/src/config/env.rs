//! The environment layer of the node configuration: every key of the file has a variable
//! `QQ_<KEY>` (upper case), e.g. `QQ_AMQP_ADDR`, `QQ_HEARTBEAT_MS`, `QQ_LOOPBACK_USERS`.
//!
//! A variable's text is turned into the TOML value its key needs ([`Kind`]) before the file's
//! table and the flags are merged and deserialized into [`super::Config`]: a value that does not
//! parse stops the node with the variable's name and the reason. Lists are comma separated
//! (`QQ_LOOPBACK_USERS=guest,admin`; empty: no entries), `QQ_PEERS` has the `--peers` form
//! (`1=client-host:port@cluster-host:port,2=...`), and an empty value of an optional key unsets
//! it (so `QQ_AMQP_ADDR=` turns off an AMQP listener the file configures). Variables whose names
//! are not keys (`QQ_CONFIG`, the test harnesses' `QQ_NODE_BIN`, ...) are not read here.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use anyhow::{Context, bail};

/// The TOML value a key takes, and so how its variable is read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Kind {
    /// A whole number from 0 to `max`.
    Int { max: u64 },
    /// A decimal number.
    Float,
    /// `true` or `false`.
    Bool,
    /// An IP socket address (`0.0.0.0:7101`): what the node listens on.
    Addr,
    /// Free text: a file path, a `host:port` a peer is reached at.
    Text,
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// Comma-separated words.
    List,
    /// The `--peers` form: `id=client-host:port@cluster-host:port`, comma separated.
    Peers,
}

const U16: Kind = Kind::Int {
    max: u16::MAX as u64,
};
const U32: Kind = Kind::Int {
    max: u32::MAX as u64,
};
/// u64 and usize keys: TOML integers stop at i64::MAX.
const U64: Kind = Kind::Int {
    max: i64::MAX as u64,
};

/// One key of the configuration: its name in the file, how its variable is read, and whether
/// it may be unset (then an empty variable unsets it).
pub(super) struct Key {
    pub name: &'static str,
    pub kind: Kind,
    pub optional: bool,
}

const fn key(name: &'static str, kind: Kind) -> Key {
    Key {
        name,
        kind,
        optional: false,
    }
}

const fn optional(name: &'static str, kind: Kind) -> Key {
    Key {
        name,
        kind,
        optional: true,
    }
}

/// Every key of [`super::Config`] (a unit test checks the list against the struct).
pub(super) const KEYS: &[Key] = &[
    key("node_id", U64),
    key("node_id_from_hostname", Kind::Bool),
    key("listen", Kind::Addr),
    optional("advertise", Kind::Text),
    key("cluster_addr", Kind::Addr),
    optional("cluster_ca", Kind::Text),
    optional("cluster_cert", Kind::Text),
    optional("cluster_key", Kind::Text),
    key("insecure_cluster", Kind::Bool),
    optional("tls_cert", Kind::Text),
    optional("tls_key", Kind::Text),
    optional("tls_client_ca", Kind::Text),
    key("peers", Kind::Peers),
    key("data_dir", Kind::Text),
    key("max_message_bytes", U64),
    key("max_inflight_publishes", U64),
    key("max_prefetch", U32),
    key("prefetch_zero_cap", U32),
    key("max_connections", U64),
    key("max_streams_per_connection", U64),
    key("max_headers", U64),
    key("max_header_depth", U64),
    key("memory_high_watermark", Kind::Float),
    optional("memory_high_watermark_bytes", U64),
    key("disk_free_limit", U64),
    key("alarm_check_ms", U64),
    key("heartbeat_ms", U64),
    key("election_timeout_min_ms", U64),
    key("election_timeout_max_ms", U64),
    key("quiesce_after_ms", U64),
    key("unload_after_ms", U64),
    key("snapshot_after_entries", U64),
    key("dead_letter_retry_ms", U64),
    key("consumer_timeout_ms", U64),
    key("loopback_users", Kind::List),
    key("allow_plaintext_auth", Kind::Bool),
    optional("http_addr", Kind::Addr),
    optional("amqp_addr", Kind::Addr),
    optional("amqps_addr", Kind::Addr),
    key("amqp_channel_max", U16),
    key("amqp_frame_max", U32),
    key("amqp_heartbeat_s", U16),
    key("per_queue_metrics", Kind::Bool),
    optional("worker_threads", U64),
    optional("definitions_file", Kind::Text),
    key("log_format", Kind::OneOf(&["text", "json"])),
];

/// The variable of `key`: `QQ_` and the key in upper case.
pub fn var_name(key: &str) -> String {
    format!("QQ_{}", key.to_ascii_uppercase())
}

/// The `QQ_*` variables of this process. A variable whose value is not UTF-8 is an error if it
/// names a key (and ignored otherwise).
pub fn process_env() -> anyhow::Result<BTreeMap<String, String>> {
    let mut vars = BTreeMap::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str().filter(|n| n.starts_with("QQ_")) else {
            continue;
        };
        match value.into_string() {
            Ok(v) => {
                vars.insert(name.to_string(), v);
            }
            Err(_) if KEYS.iter().any(|k| var_name(k.name) == name) => {
                bail!("{name}: the value is not UTF-8")
            }
            Err(_) => {}
        }
    }
    Ok(vars)
}

/// The `QQ_*` variables of `env` that name no key (a typo, or another program's variable such
/// as a Kubernetes service link of a service called `qq`): the node warns about them at start
/// and otherwise ignores them.
pub fn unknown_vars(env: &BTreeMap<String, String>) -> Vec<&str> {
    env.keys()
        .map(String::as_str)
        .filter(|name| !KEYS.iter().any(|k| var_name(k.name) == *name))
        .collect()
}

/// Sets (or, for an empty optional one, removes) every key of `table` that has a variable in
/// `env`. Returns the keys set, for the caller's messages.
pub(super) fn overlay(
    table: &mut toml::Table,
    env: &BTreeMap<String, String>,
) -> anyhow::Result<Vec<&'static str>> {
    let mut set = Vec::new();
    for k in KEYS {
        let var = var_name(k.name);
        let Some(text) = env.get(&var) else {
            continue;
        };
        if k.optional && text.trim().is_empty() {
            table.remove(k.name);
        } else {
            table.insert(k.name.to_string(), value(&var, k.kind, text)?);
        }
        set.push(k.name);
    }
    Ok(set)
}

/// The TOML value of variable `var` of kind `kind`; the error names the variable.
fn value(var: &str, kind: Kind, text: &str) -> anyhow::Result<toml::Value> {
    let t = text.trim();
    Ok(match kind {
        Kind::Int { max } => {
            let n: u64 = t
                .parse()
                .with_context(|| format!("{var}: '{t}' is not a whole number >= 0"))?;
            if n > max {
                bail!("{var}: {n} is too large (at most {max})");
            }
            toml::Value::Integer(n as i64)
        }
        Kind::Float => toml::Value::Float(
            t.parse()
                .with_context(|| format!("{var}: '{t}' is not a number"))?,
        ),
        Kind::Bool => match t {
            "true" => toml::Value::Boolean(true),
            "false" => toml::Value::Boolean(false),
            _ => bail!("{var}: '{t}' is not true or false"),
        },
        Kind::Addr => {
            t.parse::<SocketAddr>().with_context(|| {
                format!("{var}: '{t}' is not an IP address and port (e.g. 0.0.0.0:7101)")
            })?;
            toml::Value::String(t.to_string())
        }
        Kind::Text if t.is_empty() => bail!("{var}: empty"),
        Kind::Text => toml::Value::String(t.to_string()),
        Kind::OneOf(words) if words.contains(&t) => toml::Value::String(t.to_string()),
        Kind::OneOf(words) => bail!("{var}: '{t}' is not one of {}", words.join(", ")),
        Kind::List => toml::Value::Array(
            t.split(',')
                .map(str::trim)
                .filter(|w| !w.is_empty())
                .map(|w| toml::Value::String(w.to_string()))
                .collect(),
        ),
        Kind::Peers => peers(var, t.split(',').filter(|p| !p.trim().is_empty()))?,
    })
}

/// Peers in the `--peers` form (`id=client-host:port@cluster-host:port`) as the file's `peers`
/// array; `source` (the flag or the variable) starts every error.
pub(super) fn peers<'a>(
    source: &str,
    items: impl IntoIterator<Item = &'a str>,
) -> anyhow::Result<toml::Value> {
    let mut peers = Vec::new();
    for p in items {
        let p = p.trim();
        let (id, addrs) = p
            .split_once('=')
            .with_context(|| format!("{source}: '{p}' is not id=host:port@cluster-host:port"))?;
        let (addr, cluster) = addrs
            .split_once('@')
            .with_context(|| format!("{source}: '{p}' has no @cluster-host:port"))?;
        let id: i64 = id
            .trim()
            .parse()
            .with_context(|| format!("{source}: '{id}' is not a node id"))?;
        let mut t = toml::Table::new();
        t.insert("id".into(), toml::Value::Integer(id));
        t.insert("address".into(), addr.trim().into());
        t.insert("cluster_address".into(), cluster.trim().into());
        peers.push(toml::Value::Table(t));
    }
    Ok(toml::Value::Array(peers))
}

/// The `--help` text on the environment: precedence and every variable.
pub fn help() -> String {
    let lines: Vec<String> = KEYS
        .chunks(4)
        .map(|keys| {
            let names: Vec<String> = keys.iter().map(|k| var_name(k.name)).collect();
            format!("  {}", names.join("  "))
        })
        .collect();
    format!(
        "Configuration: each key of the file (see cluster/node1.toml) can also be set by an \
         environment variable QQ_<KEY>. Precedence: command-line flag > environment > file \
         (--config, QQ_CONFIG) > default. A node may start from the environment alone. Lists \
         are comma separated (QQ_LOOPBACK_USERS=guest,admin; empty: none), QQ_PEERS has the \
         --peers form, an empty value unsets an optional key. QQ_NODE_ID_FROM_HOSTNAME=true \
         takes the node id from the hostname's ordinal plus one (pod quorumq-0: node 1).\n\n\
         Variables:\n{}",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn overlay_err(pairs: &[(&str, &str)]) -> String {
        let mut table = toml::Table::new();
        format!("{:#}", overlay(&mut table, &env(pairs)).unwrap_err())
    }

    /// The serde field names of `Config`, from its deny_unknown_fields message.
    fn config_fields() -> Vec<String> {
        let table: toml::Table = "no_such_key = 1".parse().unwrap();
        let e = toml::Value::Table(table)
            .try_into::<super::super::Config>()
            .unwrap_err()
            .to_string();
        let list = e.split_once("expected one of").expect(&e).1;
        list.split(',')
            .map(|f| {
                f.trim()
                    .trim_matches(|c: char| c == '`' || c.is_whitespace())
            })
            .map(|f| f.lines().next().unwrap_or(f).trim_matches('`').to_string())
            .collect()
    }

    #[test]
    fn unknown_variables_are_named() {
        let vars = env(&[
            ("QQ_LISTEN", "127.0.0.1:1"),
            ("QQ_LSITEN", "x"),
            ("QQ_PORT", "1"),
        ]);
        assert_eq!(unknown_vars(&vars), ["QQ_LSITEN", "QQ_PORT"]);
    }

    #[test]
    fn every_key_of_the_config_has_a_variable() {
        let fields = config_fields();
        let keys: Vec<String> = KEYS.iter().map(|k| k.name.to_string()).collect();
        assert_eq!(fields, keys, "KEYS must list Config's fields in order");
    }

    #[test]
    fn values_take_their_key_types() {
        let mut table = toml::Table::new();
        let vars = env(&[
            ("QQ_HEARTBEAT_MS", " 300 "),
            ("QQ_MEMORY_HIGH_WATERMARK", "0.5"),
            ("QQ_INSECURE_CLUSTER", "true"),
            ("QQ_LISTEN", "0.0.0.0:7101"),
            ("QQ_LOOPBACK_USERS", "guest, admin,"),
            (
                "QQ_PEERS",
                "1=a.example:7101@a.example:7201,2=b:7102@b:7202",
            ),
            ("QQ_LOG_FORMAT", "json"),
            ("QQ_NOT_A_KEY", "ignored"),
        ]);
        let set = overlay(&mut table, &vars).unwrap();
        assert_eq!(set.len(), 7, "{set:?}");
        assert_eq!(table["heartbeat_ms"], toml::Value::Integer(300));
        assert_eq!(table["memory_high_watermark"], toml::Value::Float(0.5));
        assert_eq!(table["insecure_cluster"], toml::Value::Boolean(true));
        assert_eq!(table["listen"], toml::Value::from("0.0.0.0:7101"));
        assert_eq!(
            table["loopback_users"],
            toml::Value::Array(vec!["guest".into(), "admin".into()])
        );
        let peers = table["peers"].as_array().unwrap();
        assert_eq!(peers.len(), 2);
        assert_eq!(peers[0]["cluster_address"], "a.example:7201".into());
        assert_eq!(peers[1]["id"], toml::Value::Integer(2));
        assert_eq!(table["log_format"], "json".into());
        assert!(!table.contains_key("not_a_key"));
    }

    #[test]
    fn empty_values_unset_optional_keys_and_empty_lists() {
        let mut table: toml::Table = "amqp_addr = \"127.0.0.1:5672\"\nloopback_users = [\"guest\"]"
            .parse()
            .unwrap();
        overlay(
            &mut table,
            &env(&[("QQ_AMQP_ADDR", ""), ("QQ_LOOPBACK_USERS", "")]),
        )
        .unwrap();
        assert!(!table.contains_key("amqp_addr"), "{table:?}");
        assert_eq!(table["loopback_users"], toml::Value::Array(vec![]));
        assert_eq!(overlay_err(&[("QQ_DATA_DIR", " ")]), "QQ_DATA_DIR: empty");
    }

    #[test]
    fn bad_values_name_the_variable_and_the_reason() {
        let cases = [
            (
                ("QQ_HEARTBEAT_MS", "fast"),
                "QQ_HEARTBEAT_MS: 'fast' is not a whole number >= 0",
            ),
            (
                ("QQ_AMQP_HEARTBEAT_S", "70000"),
                "QQ_AMQP_HEARTBEAT_S: 70000 is too large (at most 65535)",
            ),
            (
                ("QQ_NODE_ID", "-1"),
                "QQ_NODE_ID: '-1' is not a whole number >= 0",
            ),
            (
                ("QQ_INSECURE_CLUSTER", "yes"),
                "QQ_INSECURE_CLUSTER: 'yes' is not true or false",
            ),
            (
                ("QQ_LISTEN", "quorumq-0:7101"),
                "QQ_LISTEN: 'quorumq-0:7101' is not an IP address and port",
            ),
            (
                ("QQ_MEMORY_HIGH_WATERMARK", "60%"),
                "QQ_MEMORY_HIGH_WATERMARK: '60%' is not a number",
            ),
            (
                ("QQ_LOG_FORMAT", "xml"),
                "QQ_LOG_FORMAT: 'xml' is not one of text, json",
            ),
            (
                ("QQ_PEERS", "1=a:1@a:2,b:1@b:2"),
                "QQ_PEERS: 'b:1@b:2' is not id=host:port@cluster-host:port",
            ),
            (
                ("QQ_PEERS", "1=a:1"),
                "QQ_PEERS: '1=a:1' has no @cluster-host:port",
            ),
            (("QQ_PEERS", "x=a:1@a:2"), "QQ_PEERS: 'x' is not a node id"),
        ];
        for ((var, value), want) in cases {
            let e = overlay_err(&[(var, value)]);
            assert!(e.starts_with(want), "{var}={value}: {e}");
        }
    }

    #[test]
    fn node1_toml_documents_every_key() {
        let doc = include_str!("../../../../cluster/node1.toml");
        for k in KEYS {
            let set = format!("\n{} = ", k.name);
            let commented = format!("\n# {} = ", k.name);
            assert!(
                doc.contains(&set) || doc.contains(&commented),
                "cluster/node1.toml does not show {}",
                k.name
            );
        }
    }

    #[test]
    fn help_lists_every_variable() {
        let text = help();
        for k in KEYS {
            assert!(text.contains(&var_name(k.name)), "{}", k.name);
        }
        assert!(text.contains("flag > environment > file"));
    }
}
