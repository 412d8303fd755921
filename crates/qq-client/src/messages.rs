//! Messages and deliveries: [`MessageBuilder`], [`message`], and the readers of a delivery's
//! headers, body and `x-death` history.

use std::collections::HashMap;

use bytes::Bytes;

use qq_proto::v1::{Delivery, Message, Properties, Value, value};

use crate::values::ValueExt;

/// Builds a [`Message`]: `MessageBuilder::new("body").header("k", Value::long(1)).build()`.
#[derive(Debug, Clone, Default)]
pub struct MessageBuilder {
    message: Message,
}

impl MessageBuilder {
    pub fn new(body: impl Into<Bytes>) -> Self {
        MessageBuilder {
            message: Message {
                properties: Some(Properties::default()),
                body: body.into(),
            },
        }
    }

    fn props(&mut self) -> &mut Properties {
        self.message
            .properties
            .get_or_insert_with(Properties::default)
    }

    pub fn header(mut self, key: impl Into<String>, value: Value) -> Self {
        self.props().headers.insert(key.into(), value);
        self
    }

    pub fn headers(mut self, headers: HashMap<String, Value>) -> Self {
        self.props().headers.extend(headers);
        self
    }

    /// Per-message TTL: a decimal string of milliseconds (passed through unchecked, so tests can
    /// send malformed ones).
    pub fn expiration(mut self, expiration: impl Into<String>) -> Self {
        self.props().expiration = expiration.into();
        self
    }

    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.props().message_id = id.into();
        self
    }

    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.props().content_type = content_type.into();
        self
    }

    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.props().correlation_id = id.into();
        self
    }

    /// 2 = persistent (every quorumq message is replicated either way).
    pub fn delivery_mode(mut self, mode: u32) -> Self {
        self.props().delivery_mode = mode;
        self
    }

    pub fn priority(mut self, priority: u32) -> Self {
        self.props().priority = priority;
        self
    }

    /// The publishing user; when set, the node requires it to be the authenticated user.
    pub fn user_id(mut self, user: impl Into<String>) -> Self {
        self.props().user_id = user.into();
        self
    }

    pub fn build(self) -> Message {
        self.message
    }
}

/// A message with just a body.
pub fn message(body: impl Into<Bytes>) -> Message {
    MessageBuilder::new(body).build()
}

/// The headers of a delivery (empty when it has none).
pub fn delivery_headers(d: &Delivery) -> HashMap<String, Value> {
    d.message
        .as_ref()
        .and_then(|m| m.properties.as_ref())
        .map(|p| p.headers.clone())
        .unwrap_or_default()
}

/// One `x-death` entry, as far as people read it: queue, reason, count and the consumer's
/// reason detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeathSummary {
    pub queue: String,
    pub reason: String,
    pub count: i64,
    pub reason_detail: Option<String>,
}

/// The `x-death` history in `headers`, most recent first (empty without one).
pub fn death_summary(headers: &HashMap<String, Value>) -> Vec<DeathSummary> {
    let Some(list) = headers.get("x-death").and_then(|v| match &v.kind {
        Some(value::Kind::ListValue(l)) => Some(&l.values),
        _ => None,
    }) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|entry| match &entry.kind {
            Some(value::Kind::TableValue(t)) => Some(&t.fields),
            _ => None,
        })
        .map(|t| {
            let text = |k: &str| t.get(k).and_then(|v| v.as_str()).map(str::to_string);
            DeathSummary {
                queue: text("queue").unwrap_or_default(),
                reason: text("reason").unwrap_or_default(),
                count: t.get("count").and_then(|v| v.as_long()).unwrap_or(0),
                reason_detail: text("reason-detail"),
            }
        })
        .collect()
}

/// The body of a delivery (empty when it has no message).
pub fn delivery_body(d: &Delivery) -> Bytes {
    d.message
        .as_ref()
        .map(|m| m.body.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::table;

    #[test]
    fn death_summary_reads_x_death_most_recent_first() {
        let entry = |queue: &str, reason: &str, count: i64, detail: Option<&str>| {
            let mut t = table([
                ("queue", Value::string(queue)),
                ("reason", Value::string(reason)),
                ("count", Value::long(count)),
            ]);
            if let Some(d) = detail {
                t.insert("reason-detail".into(), Value::string(d));
            }
            Value::table(t)
        };
        let headers = table([(
            "x-death",
            Value::list(vec![
                entry("q1", "rejected", 2, Some("bad id")),
                entry("q0", "expired", 1, None),
            ]),
        )]);
        let d = death_summary(&headers);
        assert_eq!(d.len(), 2);
        assert_eq!(
            (d[0].queue.as_str(), d[0].reason.as_str(), d[0].count),
            ("q1", "rejected", 2)
        );
        assert_eq!(d[0].reason_detail.as_deref(), Some("bad id"));
        assert_eq!(d[1].reason_detail, None);
        assert!(death_summary(&HashMap::new()).is_empty());
        assert!(death_summary(&table([("x-death", Value::long(1))])).is_empty());
    }
}
