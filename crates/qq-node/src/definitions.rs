//! Definitions: the whole topology of the cluster as one JSON document, in RabbitMQ's layout
//! (`rabbitmqctl export_definitions`) where it fits, and its import.
//!
//! **Layout.** Top-level arrays `users` (`name`, `password_hash`, `hashing_algorithm`, `tags`),
//! `vhosts` (`name`), `permissions` (`user`, `vhost`, `configure`, `write`, `read`),
//! `exchanges` (`name`, `vhost`, `type`, `durable`, `auto_delete`, `internal`, `arguments`),
//! `queues` (`name`, `vhost`, `durable`, `auto_delete`, `arguments`, with `x-queue-type`
//! `quorum`), `bindings` (`source`, `vhost`, `destination`, `destination_type` `queue`,
//! `routing_key`, `arguments`) and `policies` (`vhost`, `name`, `pattern`, `apply-to`,
//! `definition`, `priority`); quorumq's own extras `quorumq_vhost_limits` (`vhost`, `limits`)
//! and `quorumq_user_limits` (`user`, `limits`), limits as in `qqctl set-vhost-limits`
//! (`max-queues`, `max-exchanges`, `max-connections`, `max-consumers`). A password hash is the
//! Argon2id PHC string the node stores ([`HASHING_ALGORITHM`]); records from before Argon2id
//! travel as [`LEGACY_HASHING_ALGORITHM`] (`base64(salt):base64(sha256)`). Argument values map
//! to JSON as strings, integers (long), booleans, floats (double), arrays and objects; bytes,
//! timestamps and non-finite doubles, which JSON lacks, as one-key objects `{"$bytes":
//! base64}`, `{"$timestamp": seconds}`, `{"$double": "NaN" | "inf" | "-inf"}`. The
//! predeclared `amq.*` exchanges are not exported (every vhost has them).
//!
//! **Import** ([`import`]) is all or nothing up front: the document is parsed (every error
//! names its JSON path, e.g. `queues[3].arguments.x-max-length: ...`), then every command is
//! applied to a *copy* of the current metadata, with the same pure [`MetaState::apply`] the
//! metadata group runs, so anything an individual RPC would refuse (an inequivalent queue
//! redeclare, a missing vhost, a bad argument or regex) refuses the document and nothing is
//! proposed. Only then are the commands proposed, one by one, skipping what is already there
//! identically; users, permissions, limits and policies that differ are replaced (as
//! RabbitMQ's import does), queues and exchanges are declared (an inequivalent one is an
//! error). So importing twice, or on every node at boot, is harmless. A metadata change by
//! someone else between the check and the proposals can still refuse a later command: the
//! error then says how many changes were applied before it.
//!
//! Bounds: a document of at most [`MAX_DEFINITIONS_BYTES`] (RESOURCE_EXHAUSTED past it); the
//! core's bounds on names, tables and nesting per command; at most [`MAX_REPORTED_ERRORS`]
//! errors in one refusal.
//!
//! Must not: propose anything before the whole document has been checked.

use std::collections::BTreeMap;
use std::path::Path;

use argon2::{ARGON2ID_IDENT, Params, PasswordHash};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use qq_core::meta::{ErrorKind, Limits, MetaCommand, MetaError, MetaState, Permissions, User};
use qq_core::names::shown;
use qq_core::{NodeId, Table, Value};
use serde_json::{Map, Value as J, json};
use tonic::{Code, Status};
use tracing::info;

use crate::proposer::Proposer;

/// Largest document accepted, in bytes (import RPC and `definitions_file`).
pub const MAX_DEFINITIONS_BYTES: usize = 4 * 1024 * 1024;
/// At most this many errors are listed when a document is refused.
pub const MAX_REPORTED_ERRORS: usize = 10;
/// `hashing_algorithm` of an Argon2id PHC string (what quorumq stores).
pub const HASHING_ALGORITHM: &str = "quorumq_argon2id";
/// `hashing_algorithm` of a record from before Argon2id: `base64(salt):base64(sha256)`.
pub const LEGACY_HASHING_ALGORITHM: &str = "quorumq_legacy_sha256";
/// Bounds on an imported Argon2id hash's parameters, so a hash cannot make every login of
/// its user cost more than this: memory (KiB), passes, lanes.
pub const MAX_ARGON2_M_COST: u32 = 256 * 1024;
pub const MAX_ARGON2_T_COST: u32 = 16;
pub const MAX_ARGON2_P_COST: u32 = 16;

/// Top-level keys of RabbitMQ's files that carry nothing quorumq imports.
const IGNORED_KEYS: &[&str] = &[
    "rabbit_version",
    "rabbitmq_version",
    "product_name",
    "product_version",
    "quorumq_version",
];
/// Top-level keys quorumq has nothing for: accepted only empty.
const UNSUPPORTED_KEYS: &[&str] = &["parameters", "global_parameters", "topic_permissions"];

/// The kinds of item, in the order they are applied.
const KINDS: [&str; 9] = [
    "vhosts",
    "users",
    "permissions",
    "quorumq_vhost_limits",
    "quorumq_user_limits",
    "policies",
    "exchanges",
    "queues",
    "bindings",
];

/// One item of the document as the command that puts it in place.
#[derive(Debug, Clone)]
pub struct Item {
    /// Its JSON path, e.g. `queues[3]`.
    pub path: String,
    /// Index into [`KINDS`].
    kind: usize,
    pub cmd: MetaCommand,
}

/// A parsed document: its items in the order they are applied.
#[derive(Debug, Clone, Default)]
pub struct Document {
    pub items: Vec<Item>,
}

/// What an import did, per kind: (kind, created, updated, unchanged).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub counts: Vec<(String, u64, u64, u64)>,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .counts
            .iter()
            .map(|(k, c, u, n)| format!("{k}: {c} created, {u} updated, {n} unchanged"))
            .collect();
        f.write_str(&parts.join("; "))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Created,
    Updated,
    Unchanged,
}

fn invalid(path: &str, reason: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{path}: {reason}"))
}

// ------------------------------------------------------------------------------ export

/// An argument or definition value as JSON (see the module doc for the types JSON lacks).
pub fn value_to_json(v: &Value) -> J {
    match v {
        Value::String(s) => J::String(s.clone()),
        Value::Long(n) => json!(n),
        Value::Bool(b) => J::Bool(*b),
        Value::Double(d) if d.is_finite() => json!(d),
        Value::Double(d) => {
            let shown = if d.is_nan() {
                "NaN"
            } else if *d > 0.0 {
                "inf"
            } else {
                "-inf"
            };
            json!({ "$double": shown })
        }
        Value::Bytes(b) => json!({ "$bytes": B64.encode(b) }),
        Value::Timestamp(t) => json!({ "$timestamp": t }),
        Value::List(l) => J::Array(l.iter().map(value_to_json).collect()),
        Value::Table(t) => table_to_json(t),
    }
}

fn table_to_json(t: &Table) -> J {
    J::Object(
        t.iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn limits_to_json(l: &Limits) -> J {
    let mut m = Map::new();
    for (key, value) in [
        ("max-queues", l.max_queues),
        ("max-exchanges", l.max_exchanges),
        ("max-connections", l.max_connections),
        ("max-consumers", l.max_consumers),
    ] {
        if let Some(v) = value {
            m.insert(key.into(), json!(v));
        }
    }
    J::Object(m)
}

fn user_to_json(u: &User) -> J {
    let (hash, algorithm) = if u.is_legacy_hash() {
        (
            format!("{}:{}", B64.encode(&u.salt), B64.encode(&u.password_hash)),
            LEGACY_HASHING_ALGORITHM,
        )
    } else {
        (
            String::from_utf8_lossy(&u.password_hash).into_owned(),
            HASHING_ALGORITHM,
        )
    };
    json!({
        "name": u.name,
        "password_hash": hash,
        "hashing_algorithm": algorithm,
        "tags": u.tags,
    })
}

/// The whole metadata as a definitions document.
pub fn export(state: &MetaState) -> J {
    let users: Vec<J> = state.users().map(user_to_json).collect();
    let mut vhosts = Vec::new();
    let mut permissions = Vec::new();
    let mut exchanges = Vec::new();
    let mut queues = Vec::new();
    let mut bindings = Vec::new();
    let mut policies = Vec::new();
    let names: Vec<String> = state.vhosts().map(str::to_string).collect();
    for name in &names {
        let Some(v) = state.vhost(name) else { continue };
        vhosts.push(json!({ "name": name }));
        for (user, p) in &v.permissions {
            permissions.push(json!({
                "user": user, "vhost": name,
                "configure": p.configure, "write": p.write, "read": p.read,
            }));
        }
        for x in v.exchanges.values() {
            if x.name.starts_with("amq.") {
                continue; // predeclared in every vhost
            }
            exchanges.push(json!({
                "name": x.name, "vhost": name, "type": x.kind.as_str(),
                "durable": x.durable, "auto_delete": x.auto_delete, "internal": x.internal,
                "arguments": table_to_json(&x.arguments),
            }));
        }
        for q in v.queues.values() {
            let mut arguments = q.arguments.clone();
            arguments
                .entry("x-queue-type".to_string())
                .or_insert_with(|| Value::String("quorum".into()));
            queues.push(json!({
                "name": q.name, "vhost": name, "durable": true, "auto_delete": false,
                "arguments": table_to_json(&arguments),
            }));
        }
        for b in &v.bindings {
            bindings.push(json!({
                "source": b.source, "vhost": name, "destination": b.destination,
                "destination_type": "queue", "routing_key": b.routing_key,
                "arguments": table_to_json(&b.arguments),
            }));
        }
        for p in v.policies.values() {
            policies.push(json!({
                "vhost": name, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
                "definition": table_to_json(&p.definition), "priority": p.priority,
            }));
        }
    }
    let vhost_limits: Vec<J> = state
        .all_vhost_limits()
        .map(|(v, l)| json!({ "vhost": v, "limits": limits_to_json(l) }))
        .collect();
    let user_limits: Vec<J> = state
        .all_user_limits()
        .map(|(u, l)| json!({ "user": u, "limits": limits_to_json(l) }))
        .collect();
    json!({
        "quorumq_version": env!("CARGO_PKG_VERSION"),
        "users": users,
        "vhosts": vhosts,
        "permissions": permissions,
        "exchanges": exchanges,
        "queues": queues,
        "bindings": bindings,
        "policies": policies,
        "parameters": [],
        "global_parameters": [],
        "topic_permissions": [],
        "quorumq_vhost_limits": vhost_limits,
        "quorumq_user_limits": user_limits,
    })
}

// ------------------------------------------------------------------------------ parse

/// A JSON value as an argument value, `path` naming it in errors.
pub fn value_from_json(path: &str, v: &J) -> Result<Value, Status> {
    Ok(match v {
        J::Null => return Err(invalid(path, "null is not a value")),
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Long(i)
            } else if n.is_u64() {
                return Err(invalid(
                    path,
                    format!("{n} does not fit a signed 64-bit long"),
                ));
            } else {
                Value::Double(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        J::String(s) => Value::String(s.clone()),
        J::Array(a) => Value::List(
            a.iter()
                .enumerate()
                .map(|(i, x)| value_from_json(&format!("{path}[{i}]"), x))
                .collect::<Result<_, _>>()?,
        ),
        J::Object(o) => {
            if o.len() == 1 {
                let (k, x) = o.iter().next().expect("one entry");
                let at = format!("{path}.{k}");
                match k.as_str() {
                    "$bytes" => {
                        let s = x
                            .as_str()
                            .ok_or_else(|| invalid(&at, "must be base64 text"))?;
                        let b = B64
                            .decode(s)
                            .map_err(|e| invalid(&at, format!("not base64: {e}")))?;
                        return Ok(Value::Bytes(b));
                    }
                    "$timestamp" => {
                        let t = x
                            .as_i64()
                            .ok_or_else(|| invalid(&at, "must be an integer (seconds)"))?;
                        return Ok(Value::Timestamp(t));
                    }
                    "$double" => {
                        let d = match x.as_str() {
                            Some("NaN") => f64::NAN,
                            Some("inf") => f64::INFINITY,
                            Some("-inf") => f64::NEG_INFINITY,
                            _ => return Err(invalid(&at, "must be \"NaN\", \"inf\" or \"-inf\"")),
                        };
                        return Ok(Value::Double(d));
                    }
                    _ => {}
                }
            }
            Value::Table(table_from_map(path, o)?)
        }
    })
}

fn table_from_map(path: &str, o: &Map<String, J>) -> Result<Table, Status> {
    o.iter()
        .map(|(k, v)| Ok((k.clone(), value_from_json(&format!("{path}.{k}"), v)?)))
        .collect()
}

/// One object of the document, for typed reads of its fields.
struct At<'a> {
    path: String,
    obj: &'a Map<String, J>,
}

impl<'a> At<'a> {
    fn new(path: String, v: &'a J) -> Result<At<'a>, Status> {
        match v {
            J::Object(obj) => Ok(At { path, obj }),
            _ => Err(invalid(&path, "must be an object")),
        }
    }
    fn field(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }
    fn str(&self, key: &str) -> Result<String, Status> {
        match self.obj.get(key) {
            Some(J::String(s)) => Ok(s.clone()),
            Some(_) => Err(invalid(&self.field(key), "must be a string")),
            None => Err(invalid(&self.field(key), "is required")),
        }
    }
    fn str_or(&self, key: &str, default: &str) -> Result<String, Status> {
        match self.obj.get(key) {
            None | Some(J::Null) => Ok(default.to_string()),
            Some(_) => self.str(key),
        }
    }
    fn bool_or(&self, key: &str, default: bool) -> Result<bool, Status> {
        match self.obj.get(key) {
            None | Some(J::Null) => Ok(default),
            Some(J::Bool(b)) => Ok(*b),
            Some(_) => Err(invalid(&self.field(key), "must be true or false")),
        }
    }
    fn i64_or(&self, key: &str, default: i64) -> Result<i64, Status> {
        match self.obj.get(key) {
            None | Some(J::Null) => Ok(default),
            Some(v) => v
                .as_i64()
                .ok_or_else(|| invalid(&self.field(key), "must be an integer")),
        }
    }
    fn table(&self, key: &str) -> Result<Table, Status> {
        match self.obj.get(key) {
            None | Some(J::Null) => Ok(Table::new()),
            Some(J::Object(o)) => table_from_map(&self.field(key), o),
            Some(_) => Err(invalid(&self.field(key), "must be an object")),
        }
    }
    /// `vhost`, `/` when absent.
    fn vhost(&self) -> Result<String, Status> {
        let v = self.str_or("vhost", "/")?;
        Ok(if v.is_empty() { "/".into() } else { v })
    }
}

fn limits_from_json(path: &str, v: Option<&J>) -> Result<Limits, Status> {
    let mut limits = Limits::default();
    let Some(v) = v else {
        return Err(invalid(path, "is required"));
    };
    let J::Object(o) = v else {
        return Err(invalid(path, "must be an object"));
    };
    for (k, x) in o {
        let at = format!("{path}.{k}");
        let slot = match k.as_str() {
            "max-queues" => &mut limits.max_queues,
            "max-exchanges" => &mut limits.max_exchanges,
            "max-connections" => &mut limits.max_connections,
            "max-consumers" => &mut limits.max_consumers,
            _ => {
                return Err(invalid(
                    &at,
                    "unknown limit (max-queues, max-exchanges, max-connections, max-consumers)",
                ));
            }
        };
        *slot = Some(
            x.as_u64()
                .ok_or_else(|| invalid(&at, "must be a non-negative integer"))?,
        );
    }
    Ok(limits)
}

/// Checks an Argon2id PHC string before it is proposed: it must parse, name `argon2id`,
/// carry a salt and an output, and have parameters argon2 accepts, within the bounds above.
pub fn validate_phc(field: &str, phc: &str) -> Result<(), Status> {
    let hash =
        PasswordHash::new(phc).map_err(|e| invalid(field, format!("not a PHC string: {e}")))?;
    if hash.algorithm != ARGON2ID_IDENT {
        return Err(invalid(
            field,
            format!(
                "algorithm '{}' is not argon2id",
                shown(hash.algorithm.as_str())
            ),
        ));
    }
    if hash.salt.is_none() || hash.hash.is_none() {
        return Err(invalid(field, "a PHC string needs a salt and a hash"));
    }
    let params =
        Params::try_from(&hash).map_err(|e| invalid(field, format!("bad parameters: {e}")))?;
    if params.m_cost() > MAX_ARGON2_M_COST
        || params.t_cost() > MAX_ARGON2_T_COST
        || params.p_cost() > MAX_ARGON2_P_COST
    {
        return Err(invalid(
            field,
            format!(
                "parameters m={}, t={}, p={} exceed m={MAX_ARGON2_M_COST}, \
                 t={MAX_ARGON2_T_COST}, p={MAX_ARGON2_P_COST}",
                params.m_cost(),
                params.t_cost(),
                params.p_cost()
            ),
        ));
    }
    Ok(())
}

/// The `PutUser` command of a user with a given hash (`hashing_algorithm` as in the module
/// doc), validated.
pub fn put_user_with_hash(
    field: &str,
    name: String,
    hash: &str,
    algorithm: &str,
    tags: Vec<String>,
) -> Result<MetaCommand, Status> {
    let (password_hash, salt) = match algorithm {
        HASHING_ALGORITHM => {
            validate_phc(field, hash)?;
            (hash.as_bytes().to_vec(), Vec::new())
        }
        LEGACY_HASHING_ALGORITHM => {
            let (salt, digest) = hash
                .split_once(':')
                .ok_or_else(|| invalid(field, "must be base64(salt):base64(sha256)"))?;
            let salt = B64
                .decode(salt)
                .map_err(|e| invalid(field, format!("salt is not base64: {e}")))?;
            let digest = B64
                .decode(digest)
                .map_err(|e| invalid(field, format!("hash is not base64: {e}")))?;
            if digest.len() != 32 || digest.starts_with(b"$argon2") {
                return Err(invalid(field, "a legacy hash is 32 bytes of SHA-256"));
            }
            (digest, salt)
        }
        other => {
            return Err(invalid(
                field,
                format!(
                    "hashing_algorithm '{}' cannot be verified by quorumq (only \
                     {HASHING_ALGORITHM} and {LEGACY_HASHING_ALGORITHM}); set the password \
                     with qqctl put-user instead",
                    shown(other)
                ),
            ));
        }
    };
    Ok(MetaCommand::PutUser {
        name,
        password_hash,
        salt,
        tags,
    })
}

fn tags_from_json(path: &str, v: Option<&J>) -> Result<Vec<String>, Status> {
    match v {
        None | Some(J::Null) => Ok(Vec::new()),
        // RabbitMQ before 3.10 writes tags as one comma-separated string.
        Some(J::String(s)) => Ok(s
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect()),
        Some(J::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| invalid(&format!("{path}[{i}]"), "must be a string"))
            })
            .collect(),
        Some(_) => Err(invalid(path, "must be a list of strings")),
    }
}

impl Document {
    /// Parses a document (bounded by [`MAX_DEFINITIONS_BYTES`]). Every error names the JSON
    /// path of what is wrong.
    pub fn parse(text: &[u8]) -> Result<Document, Status> {
        if text.len() > MAX_DEFINITIONS_BYTES {
            return Err(Status::resource_exhausted(format!(
                "definitions_json: {} bytes, more than the bound of {MAX_DEFINITIONS_BYTES}",
                text.len()
            )));
        }
        let root: J = serde_json::from_slice(text)
            .map_err(|e| Status::invalid_argument(format!("definitions_json: not JSON: {e}")))?;
        let J::Object(top) = &root else {
            return Err(Status::invalid_argument(
                "definitions_json: must be a JSON object",
            ));
        };
        for (key, value) in top {
            if KINDS.contains(&key.as_str()) || IGNORED_KEYS.contains(&key.as_str()) {
                continue;
            }
            if UNSUPPORTED_KEYS.contains(&key.as_str()) {
                if value.as_array().is_some_and(|a| a.is_empty()) {
                    continue;
                }
                return Err(invalid(key, "not supported by quorumq (must be empty)"));
            }
            return Err(invalid(
                key,
                format!("unknown key (known: {})", KINDS.join(", ")),
            ));
        }
        let mut items = Vec::new();
        for (kind, name) in KINDS.iter().enumerate() {
            let Some(list) = top.get(*name) else { continue };
            let J::Array(list) = list else {
                return Err(invalid(name, "must be an array"));
            };
            for (i, v) in list.iter().enumerate() {
                let at = At::new(format!("{name}[{i}]"), v)?;
                let cmd = parse_item(kind, &at)?;
                items.push(Item {
                    path: at.path.clone(),
                    kind,
                    cmd,
                });
            }
        }
        Ok(Document { items })
    }

    /// Reads and parses a `definitions_file`; errors name the file.
    pub fn load_file(path: &Path) -> anyhow::Result<Document> {
        let meta = std::fs::metadata(path)
            .map_err(|e| anyhow::anyhow!("definitions_file {}: {e}", path.display()))?;
        if meta.len() > MAX_DEFINITIONS_BYTES as u64 {
            anyhow::bail!(
                "definitions_file {}: {} bytes, more than the bound of {MAX_DEFINITIONS_BYTES}",
                path.display(),
                meta.len()
            );
        }
        let text = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("definitions_file {}: {e}", path.display()))?;
        Document::parse(&text)
            .map_err(|s| anyhow::anyhow!("definitions_file {}: {}", path.display(), s.message()))
    }
}

fn parse_item(kind: usize, at: &At<'_>) -> Result<MetaCommand, Status> {
    Ok(match KINDS[kind] {
        "vhosts" => MetaCommand::PutVhost {
            name: at.str("name")?,
        },
        "users" => {
            let algorithm = at.str_or("hashing_algorithm", HASHING_ALGORITHM)?;
            put_user_with_hash(
                &at.field("password_hash"),
                at.str("name")?,
                &at.str("password_hash")?,
                &algorithm,
                tags_from_json(&at.field("tags"), at.obj.get("tags"))?,
            )
            .map_err(|s| {
                // An unknown algorithm is the fault of hashing_algorithm, not of the hash.
                if s.message().contains("hashing_algorithm '") {
                    Status::invalid_argument(
                        s.message()
                            .replace(&at.field("password_hash"), &at.field("hashing_algorithm")),
                    )
                } else {
                    s
                }
            })?
        }
        "permissions" => MetaCommand::SetPermissions {
            user: at.str("user")?,
            vhost: at.vhost()?,
            configure: at.str("configure")?,
            write: at.str("write")?,
            read: at.str("read")?,
        },
        "quorumq_vhost_limits" => MetaCommand::SetVhostLimits {
            vhost: at.vhost()?,
            limits: limits_from_json(&at.field("limits"), at.obj.get("limits"))?,
        },
        "quorumq_user_limits" => MetaCommand::SetUserLimits {
            user: at.str("user")?,
            limits: limits_from_json(&at.field("limits"), at.obj.get("limits"))?,
        },
        "policies" => MetaCommand::SetPolicy {
            vhost: at.vhost()?,
            name: at.str("name")?,
            pattern: at.str("pattern")?,
            apply_to: at.str_or("apply-to", "all")?,
            priority: at.i64_or("priority", 0)?,
            definition: at.table("definition")?,
        },
        "exchanges" => MetaCommand::DeclareExchange {
            vhost: at.vhost()?,
            name: at.str("name")?,
            kind: at.str("type")?,
            durable: at.bool_or("durable", true)?,
            auto_delete: at.bool_or("auto_delete", false)?,
            internal: at.bool_or("internal", false)?,
            arguments: at.table("arguments")?,
            passive: false,
            owner: None,
        },
        "queues" => {
            if !at.bool_or("durable", true)? {
                return Err(invalid(
                    &at.field("durable"),
                    "quorum queues are always durable",
                ));
            }
            if at.bool_or("auto_delete", false)? {
                return Err(invalid(
                    &at.field("auto_delete"),
                    "quorum queues cannot be auto-delete",
                ));
            }
            MetaCommand::DeclareQueue {
                vhost: at.vhost()?,
                name: at.str("name")?,
                arguments: at.table("arguments")?,
                passive: false,
                nodes: Vec::new(),
                owner: None,
                // An imported queue is placed as if declared with no client-local node.
                origin: None,
            }
        }
        "bindings" => {
            let destination_type = at.str_or("destination_type", "queue")?;
            if destination_type != "queue" {
                return Err(invalid(
                    &at.field("destination_type"),
                    format!(
                        "'{}': only queues can be bound (no exchange-to-exchange bindings)",
                        shown(&destination_type)
                    ),
                ));
            }
            MetaCommand::Bind {
                vhost: at.vhost()?,
                queue: at.str("destination")?,
                exchange: at.str("source")?,
                routing_key: at.str_or("routing_key", "")?,
                arguments: at.table("arguments")?,
            }
        }
        other => unreachable!("kind {other} has no parser"),
    })
}

// ------------------------------------------------------------------------------ import

/// Whether `cmd` would change `state`, and how.
fn outcome(state: &MetaState, cmd: &MetaCommand) -> Outcome {
    let exists = |there: bool, same: bool| match (there, same) {
        (false, _) => Outcome::Created,
        (true, true) => Outcome::Unchanged,
        (true, false) => Outcome::Updated,
    };
    match cmd {
        MetaCommand::PutVhost { name } => exists(state.vhost_exists(name), true),
        MetaCommand::PutUser {
            name,
            password_hash,
            salt,
            tags,
        } => match state.user(name) {
            None => Outcome::Created,
            Some(u) => exists(
                true,
                &u.password_hash == password_hash && &u.salt == salt && &u.tags == tags,
            ),
        },
        MetaCommand::SetPermissions {
            user,
            vhost,
            configure,
            write,
            read,
        } => match state.permissions(user, vhost) {
            None => Outcome::Created,
            Some(p) => exists(
                true,
                *p == Permissions {
                    configure: configure.clone(),
                    write: write.clone(),
                    read: read.clone(),
                },
            ),
        },
        MetaCommand::SetVhostLimits { vhost, limits } => {
            let current = state.vhost_limits(vhost);
            exists(current != Limits::default(), current == *limits)
        }
        MetaCommand::SetUserLimits { user, limits } => {
            let current = state.user_limits(user);
            exists(current != Limits::default(), current == *limits)
        }
        MetaCommand::SetPolicy {
            vhost,
            name,
            pattern,
            apply_to,
            priority,
            definition,
        } => match state.policies(vhost).find(|p| &p.name == name) {
            None => Outcome::Created,
            Some(p) => exists(
                true,
                &p.pattern == pattern
                    && &p.apply_to == apply_to
                    && p.priority == *priority
                    && &p.definition == definition,
            ),
        },
        // Equivalence of an existing exchange or queue is apply's to judge (an inequivalent
        // one is refused there); an equivalent one is left alone.
        MetaCommand::DeclareExchange { vhost, name, .. } => {
            exists(state.exchange(vhost, name).is_some(), true)
        }
        MetaCommand::DeclareQueue { vhost, name, .. } => {
            exists(state.queue(vhost, name).is_some(), true)
        }
        MetaCommand::Bind {
            vhost,
            queue,
            exchange,
            routing_key,
            arguments,
        } => exists(
            state.bindings(vhost).any(|b| {
                &b.source == exchange
                    && &b.destination == queue
                    && &b.routing_key == routing_key
                    && &b.arguments == arguments
            }),
            true,
        ),
        _ => Outcome::Created,
    }
}

/// A refusal of `path` by the metadata's own rules, naming the path. What is missing (a
/// vhost, user, exchange or queue the document neither has nor finds) is the document's
/// fault: INVALID_ARGUMENT. Argument errors name the argument under `arguments`.
fn refusal(path: &str, e: &MetaError) -> (Code, String) {
    let code = match e.kind {
        ErrorKind::InvalidArgument | ErrorKind::NotFound => Code::InvalidArgument,
        ErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::ResourceExhausted => Code::ResourceExhausted,
    };
    let message = if e.message.starts_with("x-") {
        format!("{path}.arguments.{}", e.message)
    } else {
        format!("{path}: {}", e.message)
    };
    (code, message)
}

/// The commands of `doc` for this cluster (`nodes`, `owner`), checked against a copy of
/// `state`: each with what it will do, or every refusal (the first one's status code).
fn plan(
    state: &MetaState,
    doc: &Document,
    nodes: &[NodeId],
    owner: Option<&str>,
) -> Result<Vec<(Item, Outcome)>, Status> {
    let mut sim = state.clone();
    let mut steps = Vec::new();
    let mut errors: Vec<(Code, String)> = Vec::new();
    for item in &doc.items {
        let mut item = item.clone();
        match &mut item.cmd {
            MetaCommand::DeclareQueue {
                nodes: n, owner: o, ..
            } => {
                *n = nodes.to_vec();
                *o = owner.map(str::to_string);
            }
            MetaCommand::DeclareExchange { owner: o, .. } => *o = owner.map(str::to_string),
            _ => {}
        }
        let outcome = outcome(&sim, &item.cmd);
        let (result, _effects) = sim.apply(item.cmd.clone());
        if let Err(e) = result {
            errors.push(refusal(&item.path, &e));
            continue;
        }
        steps.push((item, outcome));
    }
    if let Some((code, _)) = errors.first() {
        let shown: Vec<&str> = errors
            .iter()
            .take(MAX_REPORTED_ERRORS)
            .map(|(_, m)| m.as_str())
            .collect();
        let mut message = shown.join("; ");
        if errors.len() > MAX_REPORTED_ERRORS {
            message.push_str(&format!(
                "; and {} more",
                errors.len() - MAX_REPORTED_ERRORS
            ));
        }
        return Err(Status::new(
            *code,
            format!("definitions refused, nothing imported: {message}"),
        ));
    }
    Ok(steps)
}

/// Imports `doc`: checks all of it against the current metadata, then proposes what is not
/// already there. `owner`: the importing user (counted for user limits), `None` at boot.
pub async fn import(
    proposer: &Proposer,
    state: &MetaState,
    doc: &Document,
    nodes: &[NodeId],
    owner: Option<&str>,
) -> Result<Summary, Status> {
    let steps = plan(state, doc, nodes, owner)?;
    let mut counts: BTreeMap<usize, (u64, u64, u64)> = BTreeMap::new();
    let mut applied = 0usize;
    for (item, outcome) in steps {
        let c = counts.entry(item.kind).or_default();
        match outcome {
            Outcome::Unchanged => {
                c.2 += 1;
                continue;
            }
            Outcome::Created => c.0 += 1,
            Outcome::Updated => c.1 += 1,
        }
        let result = proposer.propose_meta(item.cmd).await;
        let failed = match result {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(refusal(&item.path, &e)),
            Err(e) => {
                let s = Status::from(e);
                Some((s.code(), format!("{}: {}", item.path, s.message())))
            }
        };
        if let Some((code, message)) = failed {
            return Err(Status::new(
                code,
                format!("{message} (after {applied} changes of this import were applied)"),
            ));
        }
        applied += 1;
    }
    let summary = Summary {
        counts: counts
            .into_iter()
            .map(|(k, (c, u, n))| (KINDS[k].to_string(), c, u, n))
            .collect(),
    };
    info!(changes = applied, summary = %summary, "definitions imported");
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(j: J) -> Result<Document, Status> {
        Document::parse(j.to_string().as_bytes())
    }

    #[test]
    fn export_then_parse_and_plan_round_trips() {
        let mut state = MetaState::new();
        let cmds = [
            MetaCommand::PutVhost {
                name: "shop".into(),
            },
            MetaCommand::DeclareQueue {
                vhost: "shop".into(),
                name: "q".into(),
                arguments: Table::from([("x-max-length".to_string(), Value::Long(5))]),
                passive: false,
                nodes: vec![1, 2, 3],
                owner: None,
                origin: None,
            },
        ];
        for c in cmds {
            state.apply(c).0.unwrap();
        }
        let exported = export(&state);
        let parsed = doc(exported.clone()).unwrap();
        // Everything is already there: nothing to do.
        let steps = plan(&state, &parsed, &[1, 2, 3], None).unwrap();
        assert!(
            steps.iter().all(|(_, o)| *o == Outcome::Unchanged),
            "{steps:?}"
        );
        // Into a fresh state: the result exports the same.
        let mut fresh = MetaState::new();
        for (item, _) in plan(&fresh.clone(), &parsed, &[1, 2, 3], None).unwrap() {
            fresh.apply(item.cmd).0.unwrap();
        }
        assert_eq!(export(&fresh), exported);
    }

    #[test]
    fn bad_argument_names_its_path() {
        let e = doc(json!({"queues": [{"name": "a"}, {"name": "b", "vhost": "/",
            "arguments": {"x-max-length": "lots"}}]}))
        .and_then(|d| plan(&MetaState::new(), &d, &[1], None))
        .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().contains("queues[1].arguments.x-max-length: "),
            "{}",
            e.message()
        );
    }

    #[test]
    fn structural_errors_name_the_path() {
        let e = doc(json!({"users": [{"name": "u", "password_hash": "x"}]})).unwrap_err();
        assert!(
            e.message()
                .starts_with("users[0].password_hash: not a PHC string"),
            "{}",
            e.message()
        );
        let e = doc(json!({"users": [{"name": "u", "password_hash": "x",
            "hashing_algorithm": "rabbit_password_hashing_sha256"}]}))
        .unwrap_err();
        assert!(
            e.message().starts_with("users[0].hashing_algorithm: "),
            "{}",
            e.message()
        );
        let e = doc(json!({"bindings": [{"source": "x", "destination": "y",
            "destination_type": "exchange"}]}))
        .unwrap_err();
        assert!(
            e.message().starts_with("bindings[0].destination_type: "),
            "{}",
            e.message()
        );
        let e = doc(json!({"qeues": []})).unwrap_err();
        assert!(
            e.message().starts_with("qeues: unknown key"),
            "{}",
            e.message()
        );
        let e = doc(json!({"parameters": [{"component": "shovel"}]})).unwrap_err();
        assert!(
            e.message().starts_with("parameters: not supported"),
            "{}",
            e.message()
        );
        let e = Document::parse(&vec![b' '; MAX_DEFINITIONS_BYTES + 1]).unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted);
    }

    #[test]
    fn phc_validation() {
        use qq_core::meta::GUEST_PASSWORD_HASH;
        validate_phc("h", GUEST_PASSWORD_HASH).unwrap();
        let argon2i = GUEST_PASSWORD_HASH.replace("$argon2id$", "$argon2i$");
        assert!(
            validate_phc("h", &argon2i)
                .unwrap_err()
                .message()
                .contains("not argon2id")
        );
        let huge = GUEST_PASSWORD_HASH.replace("m=19456", "m=4000000");
        assert!(
            validate_phc("h", &huge)
                .unwrap_err()
                .message()
                .contains("exceed")
        );
    }

    #[test]
    fn values_round_trip_through_json() {
        let v = Value::List(vec![
            Value::Long(-3),
            Value::Double(1.5),
            Value::Double(2.0),
            Value::Double(f64::INFINITY),
            Value::Bytes(vec![0, 255]),
            Value::Timestamp(17),
            Value::Bool(true),
            Value::Table(Table::from([("k".to_string(), Value::String("v".into()))])),
        ]);
        let back = value_from_json("v", &value_to_json(&v)).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn an_inequivalent_queue_is_named() {
        let mut state = MetaState::new();
        state
            .apply(MetaCommand::DeclareQueue {
                vhost: "/".into(),
                name: "q".into(),
                arguments: Table::new(),
                passive: false,
                nodes: vec![1],
                owner: None,
                origin: None,
            })
            .0
            .unwrap();
        let d = doc(json!({"queues": [{"name": "q", "arguments": {"x-max-length": 3}}]})).unwrap();
        let e = plan(&state, &d, &[1], None).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("queues[0]"), "{}", e.message());
        assert!(e.message().contains("'q'"), "{}", e.message());
    }

    #[test]
    fn a_rabbitmq_export_imports_where_it_fits() {
        // The shape of `rabbitmqctl export_definitions` (3.12), without its users.
        let d = doc(json!({
            "rabbit_version": "3.12.1", "rabbitmq_version": "3.12.1",
            "product_name": "RabbitMQ", "product_version": "3.12.1",
            "vhosts": [{"name": "shop", "limits": [], "metadata": {"description": "", "tags": []}}],
            "permissions": [{"user": "guest", "vhost": "shop",
                             "configure": ".*", "write": ".*", "read": ".*"}],
            "topic_permissions": [], "parameters": [], "global_parameters": [],
            "policies": [{"vhost": "shop", "name": "dlx", "pattern": "^jobs$",
                          "apply-to": "queues", "definition": {"dead-letter-exchange": "dead"},
                          "priority": 0}],
            "queues": [{"name": "jobs", "vhost": "shop", "durable": true, "auto_delete": false,
                        "type": "quorum", "arguments": {"x-queue-type": "quorum",
                        "x-delivery-limit": 5}}],
            "exchanges": [{"name": "dead", "vhost": "shop", "type": "fanout", "durable": true,
                           "auto_delete": false, "internal": false, "arguments": {}}],
            "bindings": [{"source": "dead", "vhost": "shop", "destination": "jobs",
                          "destination_type": "queue", "routing_key": "", "arguments": {}}],
        }))
        .unwrap();
        let mut state = MetaState::new();
        for (item, outcome) in plan(&state.clone(), &d, &[1, 2, 3], None).unwrap() {
            assert_ne!(outcome, Outcome::Unchanged, "{}", item.path);
            state.apply(item.cmd).0.unwrap();
        }
        assert!(state.queue("shop", "jobs").is_some());
        // A classic queue is refused, naming it.
        let classic = doc(json!({"queues": [{"name": "c", "vhost": "/",
            "arguments": {"x-queue-type": "classic"}}]}))
        .unwrap();
        let e = plan(&MetaState::new(), &classic, &[1], None).unwrap_err();
        assert!(e.message().contains("queues[0]"), "{}", e.message());
        // Tags as one comma-separated string (RabbitMQ before 3.10).
        let tags = tags_from_json("t", Some(&json!("administrator, monitoring"))).unwrap();
        assert_eq!(tags, vec!["administrator", "monitoring"]);
    }
}
