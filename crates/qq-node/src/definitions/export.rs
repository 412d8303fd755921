//! Export: the whole metadata as a definitions document (the layout is in the module doc of
//! [`super`]).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use qq_core::meta::{Limits, MetaState, Policy, User, Vhost};
use qq_core::{Table, Value};
use serde_json::{Map, Value as J, json};

use super::{HASHING_ALGORITHM, LEGACY_HASHING_ALGORITHM};

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
        Value::Void => J::Null,
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
    let mut per_vhost = VhostArrays::default();
    let names: Vec<String> = state.vhosts().map(str::to_string).collect();
    for name in &names {
        let Some(v) = state.vhost(name) else { continue };
        per_vhost.add(name, v);
    }
    let VhostArrays {
        vhosts,
        permissions,
        exchanges,
        queues,
        bindings,
        policies,
        operator_policies,
    } = per_vhost;
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
        "operator_policies": operator_policies,
        "parameters": [],
        "global_parameters": [],
        "topic_permissions": [],
        "quorumq_vhost_limits": vhost_limits,
        "quorumq_user_limits": user_limits,
    })
}

/// The document's arrays whose items belong to a vhost, filled vhost by vhost.
#[derive(Default)]
struct VhostArrays {
    vhosts: Vec<J>,
    permissions: Vec<J>,
    exchanges: Vec<J>,
    queues: Vec<J>,
    bindings: Vec<J>,
    policies: Vec<J>,
    operator_policies: Vec<J>,
}

impl VhostArrays {
    /// Vhost `name` and everything in it.
    fn add(&mut self, name: &str, v: &Vhost) {
        self.vhosts.push(json!({ "name": name }));
        for (user, p) in &v.permissions {
            self.permissions.push(json!({
                "user": user, "vhost": name,
                "configure": p.configure, "write": p.write, "read": p.read,
            }));
        }
        for x in v.exchanges.values() {
            if x.name.starts_with("amq.") {
                continue; // predeclared in every vhost
            }
            self.exchanges.push(json!({
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
            self.queues.push(json!({
                "name": q.name, "vhost": name, "durable": true, "auto_delete": false,
                "arguments": table_to_json(&arguments),
            }));
        }
        for b in &v.bindings {
            self.bindings.push(json!({
                "source": b.source, "vhost": name, "destination": b.destination,
                "destination_type": "queue", "routing_key": b.routing_key,
                "arguments": table_to_json(&b.arguments),
            }));
        }
        for b in &v.exchange_bindings {
            self.bindings.push(json!({
                "source": b.source, "vhost": name, "destination": b.destination,
                "destination_type": "exchange", "routing_key": b.routing_key,
                "arguments": table_to_json(&b.arguments),
            }));
        }
        let policy = |p: &Policy| {
            json!({
                "vhost": name, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
                "definition": table_to_json(&p.definition), "priority": p.priority,
            })
        };
        self.policies.extend(v.policies.values().map(policy));
        self.operator_policies
            .extend(v.operator_policies.values().map(policy));
    }
}
