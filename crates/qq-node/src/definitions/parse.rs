//! Parsing: a definitions document into the commands that put its items in place, every
//! error naming the JSON path of what is wrong. Nothing here looks at the metadata.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use qq_core::meta::{Limits, MetaCommand};
use qq_core::names::shown;
use qq_core::{Table, Value};
use serde_json::{Map, Value as J};

use super::error::DefinitionsError;
use super::hashes::{HashFields, put_user_with_hash};
use super::{
    Document, HASHING_ALGORITHM, IGNORED_KEYS, Item, KINDS, MAX_DEFINITIONS_BYTES,
    UNSUPPORTED_KEYS, invalid,
};

/// A JSON value as an argument value, `path` naming it in errors.
pub fn value_from_json(path: &str, v: &J) -> Result<Value, DefinitionsError> {
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

fn table_from_map(path: &str, o: &Map<String, J>) -> Result<Table, DefinitionsError> {
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
    fn new(path: String, v: &'a J) -> Result<At<'a>, DefinitionsError> {
        match v {
            J::Object(obj) => Ok(At { path, obj }),
            _ => Err(invalid(&path, "must be an object")),
        }
    }
    fn field(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }
    fn str(&self, key: &str) -> Result<String, DefinitionsError> {
        match self.obj.get(key) {
            Some(J::String(s)) => Ok(s.clone()),
            Some(_) => Err(invalid(&self.field(key), "must be a string")),
            None => Err(invalid(&self.field(key), "is required")),
        }
    }
    fn str_or(&self, key: &str, default: &str) -> Result<String, DefinitionsError> {
        match self.obj.get(key) {
            None | Some(J::Null) => Ok(default.to_string()),
            Some(_) => self.str(key),
        }
    }
    fn bool_or(&self, key: &str, default: bool) -> Result<bool, DefinitionsError> {
        match self.obj.get(key) {
            None | Some(J::Null) => Ok(default),
            Some(J::Bool(b)) => Ok(*b),
            Some(_) => Err(invalid(&self.field(key), "must be true or false")),
        }
    }
    fn i64_or(&self, key: &str, default: i64) -> Result<i64, DefinitionsError> {
        match self.obj.get(key) {
            None | Some(J::Null) => Ok(default),
            Some(v) => v
                .as_i64()
                .ok_or_else(|| invalid(&self.field(key), "must be an integer")),
        }
    }
    fn table(&self, key: &str) -> Result<Table, DefinitionsError> {
        match self.obj.get(key) {
            None | Some(J::Null) => Ok(Table::new()),
            Some(J::Object(o)) => table_from_map(&self.field(key), o),
            Some(_) => Err(invalid(&self.field(key), "must be an object")),
        }
    }
    /// `vhost`, `/` when absent.
    fn vhost(&self) -> Result<String, DefinitionsError> {
        let v = self.str_or("vhost", "/")?;
        Ok(if v.is_empty() { "/".into() } else { v })
    }
}

fn limits_from_json(path: &str, v: Option<&J>) -> Result<Limits, DefinitionsError> {
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

fn tags_from_json(path: &str, v: Option<&J>) -> Result<Vec<String>, DefinitionsError> {
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
    pub fn parse(text: &[u8]) -> Result<Document, DefinitionsError> {
        if text.len() > MAX_DEFINITIONS_BYTES {
            return Err(DefinitionsError::TooLarge { bytes: text.len() });
        }
        let root: J = serde_json::from_slice(text)
            .map_err(|e| invalid("definitions_json", format!("not JSON: {e}")))?;
        let J::Object(top) = &root else {
            return Err(invalid("definitions_json", "must be a JSON object"));
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
            .map_err(|s| anyhow::anyhow!("definitions_file {}: {}", path.display(), s))
    }
}

fn parse_item(kind: usize, at: &At<'_>) -> Result<MetaCommand, DefinitionsError> {
    Ok(match KINDS[kind] {
        "vhosts" => MetaCommand::PutVhost {
            name: at.str("name")?,
        },
        "users" => parse_user(at)?,
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
        "operator_policies" => MetaCommand::SetOperatorPolicy {
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
        "queues" => parse_queue(at)?,
        "bindings" => parse_binding(at)?,
        other => unreachable!("kind {other} has no parser"),
    })
}

/// A `users` item: `PutUser` with its hash checked.
fn parse_user(at: &At<'_>) -> Result<MetaCommand, DefinitionsError> {
    let algorithm = at.str_or("hashing_algorithm", HASHING_ALGORITHM)?;
    put_user_with_hash(
        HashFields {
            hash: &at.field("password_hash"),
            algorithm: &at.field("hashing_algorithm"),
        },
        at.str("name")?,
        &at.str("password_hash")?,
        &algorithm,
        tags_from_json(&at.field("tags"), at.obj.get("tags"))?,
    )
}

/// A `queues` item: `DeclareQueue`, refusing what a quorum queue cannot be.
fn parse_queue(at: &At<'_>) -> Result<MetaCommand, DefinitionsError> {
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
    Ok(MetaCommand::DeclareQueue {
        vhost: at.vhost()?,
        name: at.str("name")?,
        arguments: at.table("arguments")?,
        passive: false,
        nodes: Vec::new(),
        owner: None,
        // An imported queue is placed as if declared with no client-local node.
        origin: None,
    })
}

/// A `bindings` item: `Bind` of a queue to an exchange, or `BindExchange` of an exchange to
/// an exchange (`destination_type` `exchange`).
fn parse_binding(at: &At<'_>) -> Result<MetaCommand, DefinitionsError> {
    let destination_type = at.str_or("destination_type", "queue")?;
    let (vhost, destination, source) = (at.vhost()?, at.str("destination")?, at.str("source")?);
    let (routing_key, arguments) = (at.str_or("routing_key", "")?, at.table("arguments")?);
    match destination_type.as_str() {
        "queue" => Ok(MetaCommand::Bind {
            vhost,
            queue: destination,
            exchange: source,
            routing_key,
            arguments,
        }),
        "exchange" => Ok(MetaCommand::BindExchange {
            vhost,
            destination,
            source,
            routing_key,
            arguments,
        }),
        other => Err(invalid(
            &at.field("destination_type"),
            format!("'{}': expected queue or exchange", shown(other)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::definitions::value_to_json;

    fn doc(j: J) -> Result<Document, DefinitionsError> {
        Document::parse(j.to_string().as_bytes())
    }

    #[test]
    fn structural_errors_name_the_path() {
        let e = doc(json!({"users": [{"name": "u", "password_hash": "x"}]})).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("users[0].password_hash: not a PHC string"),
            "{}",
            e.to_string()
        );
        let e = doc(json!({"users": [{"name": "u", "password_hash": "x",
            "hashing_algorithm": "rabbit_password_hashing_sha256"}]}))
        .unwrap_err();
        assert!(
            e.to_string().starts_with("users[0].hashing_algorithm: "),
            "{}",
            e.to_string()
        );
        let e = doc(json!({"bindings": [{"source": "x", "destination": "y",
            "destination_type": "stream"}]}))
        .unwrap_err();
        assert!(
            e.to_string().starts_with("bindings[0].destination_type: "),
            "{}",
            e.to_string()
        );
        let e = doc(json!({"qeues": []})).unwrap_err();
        assert!(
            e.to_string().starts_with("qeues: unknown key"),
            "{}",
            e.to_string()
        );
        let e = doc(json!({"parameters": [{"component": "shovel"}]})).unwrap_err();
        assert!(
            e.to_string().starts_with("parameters: not supported"),
            "{}",
            e.to_string()
        );
        let e = Document::parse(&vec![b' '; MAX_DEFINITIONS_BYTES + 1]).unwrap_err();
        assert!(matches!(e, DefinitionsError::TooLarge { .. }), "{e}");
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
    fn tags_as_one_comma_separated_string() {
        // Tags as one comma-separated string (RabbitMQ before 3.10).
        let tags = tags_from_json("t", Some(&json!("administrator, monitoring"))).unwrap();
        assert_eq!(tags, vec!["administrator", "monitoring"]);
    }
}
