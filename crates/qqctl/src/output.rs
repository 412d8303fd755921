//! What qqctl prints: left-aligned tables for lists and the JSON document of one queue.

use std::collections::HashMap;

use qq_client::{QueueInfo, Value, display_value, v1};
use serde_json::{Map, Value as Json, json};

/// A header row from string literals.
pub fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|s| s.to_string()).collect()
}

/// Node ids as `1,2,3`.
pub fn join_ids(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// Prints rows as left-aligned columns; the first row is the header.
pub fn print_table(rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if i + 1 == r.len() {
                    s.clone()
                } else {
                    format!("{s:<w$}", w = widths[i])
                }
            })
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    if rows.len() == 1 {
        println!("(none)");
    }
}

fn value_to_json(v: &Value) -> Json {
    use v1::value::Kind;
    match &v.kind {
        None => Json::Null,
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::LongValue(n)) => json!(n),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::DoubleValue(d)) => json!(d),
        Some(Kind::TimestampValue(_)) | Some(Kind::BytesValue(_)) => json!(display_value(v)),
        Some(Kind::ListValue(l)) => Json::Array(l.values.iter().map(value_to_json).collect()),
        Some(Kind::TableValue(t)) => table_to_json(&t.fields),
    }
}

fn table_to_json(t: &HashMap<String, Value>) -> Json {
    let mut keys: Vec<&String> = t.keys().collect();
    keys.sort();
    Json::Object(
        keys.into_iter()
            .map(|k| (k.clone(), value_to_json(&t[k])))
            .collect::<Map<_, _>>(),
    )
}

/// One queue's full state, as `qqctl queue` prints it.
pub fn queue_json(q: &QueueInfo) -> Json {
    let effective = q.effective.as_ref().map(|e| {
        json!({
            "dead_letter_exchange": if e.has_dead_letter_exchange { json!(e.dead_letter_exchange) } else { Json::Null },
            "dead_letter_routing_key": e.dead_letter_routing_key,
            "dead_letter_strategy": e.dead_letter_strategy,
            "overflow": e.overflow,
            "max_length": e.max_length,
            "max_length_bytes": e.max_length_bytes,
            "message_ttl_ms": e.message_ttl_ms,
            "expires_ms": e.expires_ms,
            "delivery_limit": e.delivery_limit,
            "single_active_consumer": e.single_active_consumer,
            "note": e.note,
            "requeue_delays_ms": e.requeue_delays_ms,
        })
    });
    json!({
        "name": q.name,
        "vhost": if q.vhost.is_empty() { "/" } else { &q.vhost },
        "id": q.id,
        "arguments": table_to_json(&q.arguments),
        "policy": if q.policy.is_empty() { Json::Null } else { json!(q.policy) },
        "operator_policy": if q.operator_policy.is_empty() {
            Json::Null
        } else {
            json!(q.operator_policy)
        },
        "effective": effective,
        "messages": q.messages,
        "messages_ready": q.messages_ready,
        "messages_unacked": q.messages_unacked,
        "messages_dead_letter_held": q.messages_dead_letter_held,
        "messages_delayed": q.messages_delayed,
        "oldest_message_age_ms": q.oldest_message_age_ms,
        "consumers": q.consumers,
        "leader": q.leader,
        "members": q.members,
        "raft_term": q.raft_term,
        "commit_index": q.commit_index,
        "last_applied": q.last_applied,
        "state_digest": format!("{:016x}", q.state_digest),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_comma_joined() {
        assert_eq!(join_ids(&[]), "");
        assert_eq!(join_ids(&[1, 2, 3]), "1,2,3");
    }

    #[test]
    fn tables_sort_keys_and_keep_types() {
        use qq_client::ValueExt;
        let mut t = HashMap::new();
        t.insert("b".to_string(), Value::long(5));
        t.insert("a".to_string(), Value::string("x"));
        t.insert("c".to_string(), Value::bool(true));
        let j = table_to_json(&t);
        assert_eq!(j.to_string(), r#"{"a":"x","b":5,"c":true}"#);
    }
}
