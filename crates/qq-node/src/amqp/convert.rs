//! AMQP field tables and basic properties ↔ the broker's own types (`qq_core::Table`,
//! `qq_core::Properties`).
//!
//! The broker stores header values as string, long, bool, double, bytes, timestamp, list and
//! table. AMQP's integer types (signed and unsigned, 8 to 64 bits) arrive as long and are
//! delivered as long (`l`), floats as double (`d`), short strings and long strings as string
//! (`S`; a long string that is not UTF-8 as a byte array `x`), decimals as their text. Void
//! (`V`) in a message's headers is kept and delivered as void (Celery, through kombu, sends
//! `eta: None` and fails on anything else); in arguments, and in headers while the cluster's
//! metadata machine is below version 2 (a release 0.1.0 node may still be a member), it is
//! an empty byte array ([`arguments_from_amqp`], `api::publish`). docs/amqp.md lists these.

use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use qq_core::{Properties, Table, Value};

/// `s` cut to AMQP's short-string bound (255 bytes) at a character boundary.
pub fn clip(s: &str) -> String {
    if s.len() <= 255 {
        return s.to_string();
    }
    let mut end = 255;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// A short string of `s`, clipped to 255 bytes.
pub fn short(s: &str) -> ShortString {
    ShortString::from(clip(s))
}

pub fn value_from_amqp(v: &AMQPValue) -> Value {
    match v {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(n) => Value::Long(*n as i64),
        AMQPValue::ShortShortUInt(n) => Value::Long(*n as i64),
        AMQPValue::ShortInt(n) => Value::Long(*n as i64),
        AMQPValue::ShortUInt(n) => Value::Long(*n as i64),
        AMQPValue::LongInt(n) => Value::Long(*n as i64),
        AMQPValue::LongUInt(n) => Value::Long(*n as i64),
        AMQPValue::LongLongInt(n) => Value::Long(*n),
        AMQPValue::Float(f) => Value::Double(*f as f64),
        AMQPValue::Double(d) => Value::Double(*d),
        AMQPValue::DecimalValue(d) => Value::String(decimal_text(d.scale, d.value)),
        AMQPValue::ShortString(s) => Value::String(s.as_str().to_string()),
        AMQPValue::LongString(s) => match std::str::from_utf8(s.as_bytes()) {
            Ok(text) => Value::String(text.to_string()),
            Err(_) => Value::Bytes(s.as_bytes().to_vec()),
        },
        AMQPValue::FieldArray(a) => Value::List(a.as_slice().iter().map(value_from_amqp).collect()),
        AMQPValue::Timestamp(t) => Value::Timestamp(*t as i64),
        AMQPValue::FieldTable(t) => Value::Table(table_from_amqp(t)),
        AMQPValue::ByteArray(b) => Value::Bytes(b.as_slice().to_vec()),
        AMQPValue::Void => Value::Void,
    }
}

/// A decimal's text: `value` scaled down by `scale` digits.
fn decimal_text(scale: u8, value: u32) -> String {
    let digits = value.to_string();
    let scale = scale as usize;
    if scale == 0 {
        return digits;
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{int}.{frac}")
}

pub fn table_from_amqp(t: &FieldTable) -> Table {
    t.inner()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), value_from_amqp(v)))
        .collect()
}

/// The arguments of a declare, bind or consume: void as an empty byte array (arguments go
/// into the metadata, which every release must decode).
pub fn arguments_from_amqp(t: &FieldTable) -> Table {
    let mut table = table_from_amqp(t);
    qq_core::voids_as_empty_bytes(&mut table);
    table
}

pub fn value_to_amqp(v: &Value) -> AMQPValue {
    match v {
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
        Value::Long(n) => AMQPValue::LongLongInt(*n),
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Double(d) => AMQPValue::Double(*d),
        Value::Bytes(b) => AMQPValue::ByteArray(b.clone().into()),
        Value::Timestamp(t) => AMQPValue::Timestamp((*t).max(0) as u64),
        Value::List(l) => AMQPValue::FieldArray(FieldArray::from(
            l.iter().map(value_to_amqp).collect::<Vec<_>>(),
        )),
        Value::Table(t) => AMQPValue::FieldTable(table_to_amqp(t)),
        Value::Void => AMQPValue::Void,
    }
}

/// Keys over 255 bytes (possible from gRPC publishers) are clipped.
pub fn table_to_amqp(t: &Table) -> FieldTable {
    let mut out = FieldTable::default();
    for (k, v) in t {
        out.insert(short(k), value_to_amqp(v));
    }
    out
}

fn text(s: &Option<ShortString>) -> String {
    s.as_ref()
        .map(|s| s.as_str().to_string())
        .unwrap_or_default()
}

/// The broker's properties of a published message's content header. AMQP's `cluster-id` is
/// deprecated and dropped, as RabbitMQ does.
pub fn properties_from_amqp(p: &BasicProperties) -> Properties {
    Properties {
        content_type: text(p.content_type()),
        content_encoding: text(p.content_encoding()),
        headers: p
            .headers()
            .as_ref()
            .map(table_from_amqp)
            .unwrap_or_default(),
        delivery_mode: p.delivery_mode().unwrap_or(0) as u32,
        priority: p.priority().unwrap_or(0) as u32,
        correlation_id: text(p.correlation_id()),
        reply_to: text(p.reply_to()),
        expiration: text(p.expiration()),
        message_id: text(p.message_id()),
        timestamp: p.timestamp().unwrap_or(0).min(i64::MAX as u64) as i64,
        r#type: text(p.kind()),
        user_id: text(p.user_id()),
        app_id: text(p.app_id()),
    }
}

/// The content header properties of a delivery: a property the publisher left unset (empty,
/// zero) stays unset.
pub fn properties_to_amqp(p: &Properties) -> BasicProperties {
    let mut out = BasicProperties::default();
    let set = |s: &str| (!s.is_empty()).then(|| short(s));
    if let Some(v) = set(&p.content_type) {
        out = out.with_content_type(v);
    }
    if let Some(v) = set(&p.content_encoding) {
        out = out.with_content_encoding(v);
    }
    if !p.headers.is_empty() {
        out = out.with_headers(table_to_amqp(&p.headers));
    }
    if p.delivery_mode != 0 {
        out = out.with_delivery_mode(p.delivery_mode.min(255) as u8);
    }
    if p.priority != 0 {
        out = out.with_priority(p.priority.min(255) as u8);
    }
    if let Some(v) = set(&p.correlation_id) {
        out = out.with_correlation_id(v);
    }
    if let Some(v) = set(&p.reply_to) {
        out = out.with_reply_to(v);
    }
    if let Some(v) = set(&p.expiration) {
        out = out.with_expiration(v);
    }
    if let Some(v) = set(&p.message_id) {
        out = out.with_message_id(v);
    }
    if p.timestamp != 0 {
        out = out.with_timestamp(p.timestamp.max(0) as u64);
    }
    if let Some(v) = set(&p.r#type) {
        out = out.with_type(v);
    }
    if let Some(v) = set(&p.user_id) {
        out = out.with_user_id(v);
    }
    if let Some(v) = set(&p.app_id) {
        out = out.with_app_id(v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_keep_their_digits() {
        assert_eq!(decimal_text(2, 12345), "123.45");
        assert_eq!(decimal_text(3, 5), "0.005");
        assert_eq!(decimal_text(0, 7), "7");
    }

    #[test]
    fn properties_round_trip() {
        let mut headers = Table::new();
        headers.insert("n".into(), Value::Long(-3));
        headers.insert(
            "nested".into(),
            Value::Table(Table::from([("t".into(), Value::Timestamp(1_700_000_000))])),
        );
        headers.insert("raw".into(), Value::Bytes(vec![0xff, 0]));
        let p = Properties {
            content_type: "text/plain".into(),
            content_encoding: "gzip".into(),
            headers,
            delivery_mode: 2,
            priority: 5,
            correlation_id: "c".into(),
            reply_to: "r".into(),
            expiration: "60000".into(),
            message_id: "m".into(),
            timestamp: 1_700_000_000,
            r#type: "t".into(),
            user_id: "guest".into(),
            app_id: "a".into(),
        };
        assert_eq!(properties_from_amqp(&properties_to_amqp(&p)), p);
        assert_eq!(clip(&"é".repeat(200)).len(), 254);
    }
}
