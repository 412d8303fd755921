//! Dead-letter copies: the `x-death` history, the routing keys of a dead letter, and cycles.
//!
//! When a message dies in a queue (rejected, expired, maxlen, delivery_limit) and the queue has
//! a dead-letter exchange, the queue's leader (at-most-once) or transfer worker (at-least-once)
//! calls [`dead_letter`] to build the copy it will route through the DLX, routes it with
//! [`crate::meta::MetaState::route`], and drops every target for which [`is_cycle`] says the
//! message is going round a loop without anyone rejecting it. docs/semantics.md ("Routing a dead
//! letter", "The death history") is the authority; RabbitMQ 4.x is the model.
//!
//! # The history
//! `x-death` is a list of tables, most recent first, one per `{queue, reason}`, with `queue`,
//! `reason` (strings), `count` (long), `time` (timestamp, seconds, of the *first* death of the
//! pair), `exchange` (where the message had been published when it died), `routing-keys` (its
//! key plus `CC` keys, never `BCC`) and `original-expiration` when it had a per-message TTL. A
//! repeat death of the same pair adds one to `count` and moves the entry to the front; nothing
//! else in it changes. `x-first-death-{reason,queue,exchange}` are written once;
//! `x-last-death-*` follow the latest death. The `expiration` property is removed so the copy
//! cannot expire again because of its old TTL.
//!
//! # Publisher-supplied history
//! A publisher's `x-death` is not interpreted. quorumq makes that cheap: the node calls
//! [`strip_client_death_headers`] on every client publish before the message is stored, so any
//! `x-death` / `x-first-death-*` / `x-last-death-*` header that [`dead_letter`] finds was written
//! by the broker and can be trusted. (A history that does not parse anyway, which only a bug
//! could produce, is replaced rather than merged.) The consequence, unlike RabbitMQ 4.x: a
//! consumer of a message that was never dead-lettered does not see the publisher's `x-death`.
//!
//! # Routing keys
//! With a dead-letter routing key the copy routes on exactly that key and its `CC` header is
//! removed (docs/semantics.md; RabbitMQ 3.13+ keeps it). Without one it routes on the message's key
//! plus its `CC` and `BCC` keys. `BCC` never survives into the copy. The copy's exchange becomes
//! the DLX and its routing key the first routing key, which is what a consumer of it sees and
//! what a later death records.
//!
//! # Cycles
//! A target T is skipped when the message already died in T and no death from the newest entry
//! up to and including the most recent T entry has reason `rejected`: a message rejected in a
//! loop is re-routed forever (someone keeps deciding), one that expires or overflows round a loop
//! is dropped on its first lap.

use crate::route::{self, BCC_HEADER, CC_HEADER};
use crate::types::{Message, Reason, Table, Value};

/// The header holding the death history.
pub const X_DEATH: &str = "x-death";
pub const X_FIRST_DEATH_REASON: &str = "x-first-death-reason";
pub const X_FIRST_DEATH_QUEUE: &str = "x-first-death-queue";
pub const X_FIRST_DEATH_EXCHANGE: &str = "x-first-death-exchange";
pub const X_LAST_DEATH_REASON: &str = "x-last-death-reason";
pub const X_LAST_DEATH_QUEUE: &str = "x-last-death-queue";
pub const X_LAST_DEATH_EXCHANGE: &str = "x-last-death-exchange";
/// The consumer's `reason_detail` of the latest death, when it gave one.
pub const X_LAST_DEATH_DETAIL: &str = "x-last-death-detail";

/// Every header that belongs to the broker's death history.
pub const DEATH_HEADERS: [&str; 8] = [
    X_DEATH,
    X_FIRST_DEATH_REASON,
    X_FIRST_DEATH_QUEUE,
    X_FIRST_DEATH_EXCHANGE,
    X_LAST_DEATH_REASON,
    X_LAST_DEATH_QUEUE,
    X_LAST_DEATH_EXCHANGE,
    X_LAST_DEATH_DETAIL,
];

/// One entry of `x-death`, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Death {
    pub queue: String,
    /// The wire name of a [`Reason`].
    pub reason: String,
    pub count: i64,
    /// Seconds since the epoch of the first death of this `{queue, reason}`.
    pub time_s: i64,
    pub exchange: String,
    pub routing_keys: Vec<String>,
    pub original_expiration: Option<String>,
    /// `reason-detail`: the latest `reason_detail` a consumer gave for this `{queue, reason}`.
    pub reason_detail: Option<String>,
}

impl Death {
    /// The `x-death` table of this entry.
    pub fn to_value(&self) -> Value {
        let mut t = Table::new();
        t.insert("queue".into(), Value::String(self.queue.clone()));
        t.insert("reason".into(), Value::String(self.reason.clone()));
        t.insert("count".into(), Value::Long(self.count));
        t.insert("time".into(), Value::Timestamp(self.time_s));
        t.insert("exchange".into(), Value::String(self.exchange.clone()));
        t.insert(
            "routing-keys".into(),
            Value::List(
                self.routing_keys
                    .iter()
                    .map(|k| Value::String(k.clone()))
                    .collect(),
            ),
        );
        if let Some(e) = &self.original_expiration {
            t.insert("original-expiration".into(), Value::String(e.clone()));
        }
        if let Some(d) = &self.reason_detail {
            t.insert("reason-detail".into(), Value::String(d.clone()));
        }
        Value::Table(t)
    }

    /// Parses an `x-death` table; `None` if a field is missing or of the wrong type.
    pub fn from_value(value: &Value) -> Option<Death> {
        let Value::Table(t) = value else { return None };
        let string = |k: &str| t.get(k).and_then(Value::as_str).map(str::to_string);
        let routing_keys = match t.get("routing-keys")? {
            Value::List(items) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()?,
            _ => return None,
        };
        let time_s = match t.get("time")? {
            Value::Timestamp(s) => *s,
            _ => return None,
        };
        let optional = |k: &str| match t.get(k) {
            None => Some(None),
            Some(Value::String(s)) => Some(Some(s.clone())),
            Some(_) => None,
        };
        let original_expiration = optional("original-expiration")?;
        let reason_detail = optional("reason-detail")?;
        Some(Death {
            queue: string("queue")?,
            reason: string("reason")?,
            count: t.get("count").and_then(Value::as_i64)?,
            time_s,
            exchange: string("exchange")?,
            routing_keys,
            original_expiration,
            reason_detail,
        })
    }
}

/// The death history of a message, most recent first; empty if it has none (or none that
/// parses).
pub fn deaths(msg: &Message) -> Vec<Death> {
    parse_deaths(&msg.properties.headers).unwrap_or_default()
}

fn parse_deaths(headers: &Table) -> Option<Vec<Death>> {
    match headers.get(X_DEATH)? {
        Value::List(items) => items.iter().map(Death::from_value).collect(),
        _ => None,
    }
}

/// Removes the death-history headers from a client publish, so that the broker never
/// interprets a history it did not write. The node calls this before storing a publish.
pub fn strip_client_death_headers(headers: &mut Table) {
    for h in DEATH_HEADERS {
        headers.remove(h);
    }
}

/// Turns `msg`, as it sat in queue `queue`, into its dead-letter copy for `dlx`: records the
/// death (at `died_at_ms`, stamped by the leader), removes `expiration`, picks the routing keys
/// (`dl_routing_key`, or the message's key + CC + BCC), strips BCC (and CC when
/// `dl_routing_key` is set), and points the copy at `dlx` with the first routing key.
/// Returns the copy and the keys to route it with through `dlx`.
pub fn dead_letter(
    msg: &Message,
    queue: &str,
    reason: Reason,
    died_at_ms: u64,
    dlx: &str,
    dl_routing_key: Option<&str>,
) -> (Message, Vec<String>) {
    dead_letter_with_detail(msg, queue, reason, None, died_at_ms, dlx, dl_routing_key)
}

/// [`dead_letter`] for a death with the consumer's `reason_detail`: the `{queue, reason}`
/// entry of `x-death` takes it as `reason-detail` (a later death of the pair with a detail
/// replaces it, one without leaves it), and `x-last-death-detail` is set to it. A death
/// without a detail removes `x-last-death-detail`, which follows the latest death as the
/// other `x-last-death-*` headers do.
pub fn dead_letter_with_detail(
    msg: &Message,
    queue: &str,
    reason: Reason,
    detail: Option<&str>,
    died_at_ms: u64,
    dlx: &str,
    dl_routing_key: Option<&str>,
) -> (Message, Vec<String>) {
    let mut copy = msg.clone();
    let headers = &mut copy.properties.headers;

    // Keys as they were when it died, before anything below edits the headers.
    let keys = match dl_routing_key {
        Some(key) => vec![key.to_string()],
        // BCC keys were moved out of the headers into `msg.bcc` when the message was stored.
        None => {
            let mut keys = route::routing_keys(&msg.routing_key, &msg.properties.headers);
            keys.extend(msg.bcc.iter().cloned());
            keys
        }
    };

    let mut history = parse_deaths(headers).unwrap_or_default();
    let reason_name = reason.as_str();
    match history
        .iter()
        .position(|d| d.queue == queue && d.reason == reason_name)
    {
        Some(i) => {
            let mut death = history.remove(i);
            death.count += 1;
            if let Some(d) = detail {
                death.reason_detail = Some(d.to_string());
            }
            history.insert(0, death);
        }
        None => history.insert(
            0,
            Death {
                queue: queue.to_string(),
                reason: reason_name.to_string(),
                count: 1,
                time_s: i64::try_from(died_at_ms / 1000).unwrap_or(i64::MAX),
                exchange: msg.exchange.clone(),
                routing_keys: route::visible_routing_keys(
                    &msg.routing_key,
                    &msg.properties.headers,
                ),
                original_expiration: (!msg.properties.expiration.is_empty())
                    .then(|| msg.properties.expiration.clone()),
                reason_detail: detail.map(str::to_string),
            },
        ),
    }
    headers.insert(
        X_DEATH.into(),
        Value::List(history.iter().map(Death::to_value).collect()),
    );

    let this_death = [
        (reason_name, X_FIRST_DEATH_REASON, X_LAST_DEATH_REASON),
        (queue, X_FIRST_DEATH_QUEUE, X_LAST_DEATH_QUEUE),
        (
            msg.exchange.as_str(),
            X_FIRST_DEATH_EXCHANGE,
            X_LAST_DEATH_EXCHANGE,
        ),
    ];
    let first_known = headers.contains_key(X_FIRST_DEATH_REASON);
    for (value, first, last) in this_death {
        if !first_known {
            headers.insert(first.into(), Value::String(value.to_string()));
        }
        headers.insert(last.into(), Value::String(value.to_string()));
    }

    match detail {
        Some(d) => headers.insert(X_LAST_DEATH_DETAIL.into(), Value::String(d.to_string())),
        None => headers.remove(X_LAST_DEATH_DETAIL),
    };

    if dl_routing_key.is_some() {
        headers.remove(CC_HEADER);
    }
    headers.remove(BCC_HEADER);
    copy.bcc.clear();
    copy.properties.expiration.clear();
    copy.exchange = dlx.to_string();
    copy.routing_key = keys[0].clone();
    (copy, keys)
}

/// Would delivering `dead_lettered` (a copy made by [`dead_letter`]) to `target_queue` close a
/// dead-letter cycle? True when the history has an entry for `target_queue` and no entry from
/// the newest up to and including the most recent one for `target_queue` has reason `rejected`.
pub fn is_cycle(dead_lettered: &Message, target_queue: &str) -> bool {
    let rejected = Reason::Rejected.as_str();
    for death in deaths(dead_lettered) {
        if death.reason == rejected {
            return false;
        }
        if death.queue == target_queue {
            return true;
        }
    }
    false
}
