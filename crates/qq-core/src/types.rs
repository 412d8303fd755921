//! Shared vocabulary of the pure core: identifiers, AMQP-style values and message properties,
//! and the effective configuration of a queue.
//!
//! Everything here is plain data with serde, ordered collections only (`BTreeMap`), so that a
//! serialized state is byte-for-byte the same on every replica.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A cluster node. Node ids are chosen by the operator and are stable across restarts.
pub type NodeId = u64;

/// The Raft group of one queue. Group 0 is the metadata group; queues get 1, 2, ...
pub type QueueId = u64;

/// The id of a message inside its queue: the Raft log index of the entry that enqueued it.
/// Unique within the queue's group forever, and the same on every replica.
pub type MessageId = u64;

/// A consumer attachment inside one queue. Chosen by the node that proposes the checkout;
/// unique within the queue (nodes put their node id in the high 16 bits).
pub type ConsumerId = u64;

/// Typed field-table value (AMQP 0-9-1 field table, as carried by the gRPC `Value`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Value {
    String(String),
    Long(i64),
    Bool(bool),
    Double(f64),
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Seconds since the Unix epoch.
    Timestamp(i64),
    List(Vec<Value>),
    Table(Table),
    /// AMQP's void (`V`, Python's `None`): no value. Only in message headers, and only once
    /// the metadata machine runs version 2 (every node decodes it; release 0.1.0 does not):
    /// before that, and in arguments and policies, it is stored as an empty byte array
    /// ([`voids_as_empty_bytes`]). Last, so the variants before it keep their encoding.
    Void,
}

/// A field table: headers, queue arguments, policy definitions.
pub type Table = BTreeMap<String, Value>;

/// Every [`Value::Void`] in `table` (nested lists and tables included) replaced by an empty
/// byte array, as a release without `Void` stores it.
pub fn voids_as_empty_bytes(table: &mut Table) {
    fn walk(v: &mut Value) {
        match v {
            Value::Void => *v = Value::Bytes(Vec::new()),
            Value::List(items) => items.iter_mut().for_each(walk),
            Value::Table(t) => t.values_mut().for_each(walk),
            _ => {}
        }
    }
    table.values_mut().for_each(walk);
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Long(n) => Some(*n),
            _ => None,
        }
    }
    /// The name of the value's type, for error messages ("expected long, got string").
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::String(_) => "string",
            Value::Long(_) => "long",
            Value::Bool(_) => "bool",
            Value::Double(_) => "double",
            Value::Bytes(_) => "bytes",
            Value::Timestamp(_) => "timestamp",
            Value::List(_) => "list",
            Value::Table(_) => "table",
            Value::Void => "void",
        }
    }
}

/// AMQP 0-9-1 basic properties. Empty strings and zeros mean "not set".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Properties {
    pub content_type: String,
    pub content_encoding: String,
    pub headers: Table,
    pub delivery_mode: u32,
    pub priority: u32,
    pub correlation_id: String,
    pub reply_to: String,
    /// Per-message TTL: a decimal string of milliseconds; empty = none.
    pub expiration: String,
    pub message_id: String,
    pub timestamp: i64,
    pub r#type: String,
    pub user_id: String,
    pub app_id: String,
}

/// A message as stored: properties, body, and where it was published to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub properties: Properties,
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    /// The exchange it was last published to (for dead letters: the DLX).
    pub exchange: String,
    /// The routing key it was last published with.
    pub routing_key: String,
    /// `BCC` keys of the publish: stripped from the headers before storing (no consumer sees
    /// them) but kept here, because a dead letter without a dead-letter routing key routes on
    /// them too (docs/semantics.md "Routing a dead letter").
    #[serde(default)]
    pub bcc: Vec<String>,
}

/// What happens when a queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Overflow {
    /// Dead-letter (or drop) the oldest ready messages.
    #[default]
    DropHead,
    /// Refuse the new message; the publisher's confirm says rejected.
    RejectPublish,
    /// Refuse the new message and dead-letter it with reason `maxlen`.
    RejectPublishDlx,
}

/// Dead-letter strategy in effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Strategy {
    /// No dead-letter exchange: dead messages are dropped (and counted).
    #[default]
    Disabled,
    AtMostOnce,
    AtLeastOnce,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Disabled => "disabled",
            Strategy::AtMostOnce => "at_most_once",
            Strategy::AtLeastOnce => "at_least_once",
        }
    }
}

/// Why a message died.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Reason {
    Rejected,
    Expired,
    Maxlen,
    DeliveryLimit,
}

impl Reason {
    /// The wire name used in `x-death` and counters.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Rejected => "rejected",
            Reason::Expired => "expired",
            Reason::Maxlen => "maxlen",
            Reason::DeliveryLimit => "delivery_limit",
        }
    }
    pub const ALL: [Reason; 4] = [
        Reason::Rejected,
        Reason::Expired,
        Reason::Maxlen,
        Reason::DeliveryLimit,
    ];
}

/// Default `x-delivery-limit` (docs/semantics.md).
pub const DEFAULT_DELIVERY_LIMIT: i64 = 20;

/// The resolved configuration of a queue: arguments merged with the applied policy.
/// Computed by the metadata layer (`policy::effective_config`) and carried into the queue's
/// own log by `Command::UpdateConfig`, so every replica of the queue sees the same one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueConfig {
    pub vhost: String,
    pub name: String,
    pub dead_letter_exchange: Option<String>,
    pub dead_letter_routing_key: Option<String>,
    /// Effective strategy (Disabled when there is no DLX).
    pub dead_letter_strategy: Strategy,
    pub message_ttl_ms: Option<u64>,
    pub expires_ms: Option<u64>,
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub overflow: Overflow,
    /// None = unlimited (a negative limit was given).
    pub delivery_limit: Option<u64>,
    pub single_active_consumer: bool,
    /// Name of the policy that applies, if any.
    pub policy: Option<String>,
    /// Why a requested setting could not take effect (e.g. at-least-once with drop-head).
    pub note: Option<String>,
    /// `x-requeue-delays` / policy `requeue-delays`: the delay of a requeue that names none,
    /// by delivery count (entry n-1 after the n-th failed delivery, the last one repeating).
    /// Empty: requeue at once.
    pub requeue_delays_ms: Vec<u64>,
    /// `x-dedup-window-ms` / policy `dedup-window-ms`: how long publish and transfer keys are
    /// remembered (module [`crate::dedup`]).
    pub dedup_window_ms: u64,
}

impl QueueConfig {
    /// A queue with no arguments and no policy.
    pub fn new(vhost: &str, name: &str) -> Self {
        QueueConfig {
            vhost: vhost.to_string(),
            name: name.to_string(),
            dead_letter_exchange: None,
            dead_letter_routing_key: None,
            dead_letter_strategy: Strategy::Disabled,
            message_ttl_ms: None,
            expires_ms: None,
            max_length: None,
            max_length_bytes: None,
            overflow: Overflow::DropHead,
            delivery_limit: Some(DEFAULT_DELIVERY_LIMIT as u64),
            single_active_consumer: false,
            policy: None,
            note: None,
            requeue_delays_ms: Vec::new(),
            dedup_window_ms: crate::dedup::DEFAULT_DEDUP_WINDOW_MS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voids_become_empty_byte_arrays_at_every_depth() {
        let mut nested = Table::new();
        nested.insert("k".into(), Value::Void);
        let mut table = Table::new();
        table.insert("top".into(), Value::Void);
        table.insert(
            "list".into(),
            Value::List(vec![Value::Void, Value::Long(1)]),
        );
        table.insert("table".into(), Value::Table(nested));
        voids_as_empty_bytes(&mut table);
        let empty = || Value::Bytes(Vec::new());
        assert_eq!(table["top"], empty());
        assert_eq!(table["list"], Value::List(vec![empty(), Value::Long(1)]));
        assert_eq!(
            table["table"],
            Value::Table(Table::from([("k".into(), empty())]))
        );
    }
}
