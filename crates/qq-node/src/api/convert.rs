//! Conversions between the wire types of `qq.v1` and the pure core's types, and the mapping of
//! the core's errors onto gRPC statuses (docs/api.md "Errors"); the node's own errors map in
//! [`crate::error`].

use std::collections::HashMap;

use qq_core::meta::{ErrorKind, MetaError};
use qq_core::names::check_bound;
use qq_core::names::shown;
use qq_core::queue::SettleOutcome;
use qq_core::{Message, Properties, Table, Value};
use qq_proto::v1 as pb;
use tonic::{Code, Status};

/// A value a client sent: one with no kind is INVALID_ARGUMENT.
pub fn value_from_pb(field: &str, v: &pb::Value) -> Result<Value, Status> {
    value_from_pb_with(field, v, Void::Refused)
}

/// Whether a value with no kind is [`Value::Void`] (a header of a stored message that an
/// AMQP publisher set to void) or refused (anything a client sends).
#[derive(Clone, Copy, PartialEq)]
enum Void {
    Refused,
    Read,
}

fn value_from_pb_with(field: &str, v: &pb::Value, void: Void) -> Result<Value, Status> {
    use pb::value::Kind;
    Ok(match &v.kind {
        None if void == Void::Read => Value::Void,
        None => {
            return Err(Status::invalid_argument(format!(
                "{field}: value has no type set"
            )));
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::LongValue(n)) => Value::Long(*n),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::DoubleValue(d)) => Value::Double(*d),
        Some(Kind::BytesValue(b)) => Value::Bytes(b.to_vec()),
        Some(Kind::TimestampValue(t)) => Value::Timestamp(*t),
        Some(Kind::ListValue(l)) => Value::List(
            l.values
                .iter()
                .enumerate()
                .map(|(i, x)| value_from_pb_with(&format!("{field}[{i}]"), x, void))
                .collect::<Result<_, _>>()?,
        ),
        Some(Kind::TableValue(t)) => Value::Table(table_from_pb_with(field, &t.fields, void)?),
    })
}

pub fn table_from_pb(field: &str, map: &HashMap<String, pb::Value>) -> Result<Table, Status> {
    table_from_pb_with(field, map, Void::Refused)
}

fn table_from_pb_with(
    field: &str,
    map: &HashMap<String, pb::Value>,
    void: Void,
) -> Result<Table, Status> {
    map.iter()
        .map(|(k, v)| {
            let value = value_from_pb_with(&format!("{field}.{k}"), v, void)?;
            Ok((k.clone(), value))
        })
        .collect()
}

pub fn value_to_pb(v: &Value) -> pb::Value {
    use pb::value::Kind;
    let kind = match v {
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Long(n) => Kind::LongValue(*n),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Double(d) => Kind::DoubleValue(*d),
        Value::Bytes(b) => Kind::BytesValue(b.clone().into()),
        Value::Timestamp(t) => Kind::TimestampValue(*t),
        Value::List(l) => Kind::ListValue(pb::ValueList {
            values: l.iter().map(value_to_pb).collect(),
        }),
        Value::Table(t) => Kind::TableValue(pb::ValueTable {
            fields: table_to_pb(t),
        }),
        // AMQP's void: a Value with no kind (docs/api.md); a publish may not send one.
        Value::Void => return pb::Value { kind: None },
    };
    pb::Value { kind: Some(kind) }
}

pub fn table_to_pb(t: &Table) -> HashMap<String, pb::Value> {
    t.iter().map(|(k, v)| (k.clone(), value_to_pb(v))).collect()
}

/// Decode a published message; the per-message TTL must be a decimal number of milliseconds.
pub fn message_from_pb(m: Option<&pb::Message>) -> Result<(Properties, Vec<u8>), Status> {
    message_from_pb_with(m, Void::Refused)
}

/// Decode a message the broker delivers (basic.get over AMQP): as [`message_from_pb`], and a
/// header value with no kind is void.
pub fn delivered_message_from_pb(m: &pb::Message) -> Result<(Properties, Vec<u8>), Status> {
    message_from_pb_with(Some(m), Void::Read)
}

fn message_from_pb_with(
    m: Option<&pb::Message>,
    void: Void,
) -> Result<(Properties, Vec<u8>), Status> {
    let Some(m) = m else {
        return Err(Status::invalid_argument("message: required"));
    };
    let p = m.properties.clone().unwrap_or_default();
    if !p.expiration.is_empty() {
        parse_expiration(&p.expiration)?;
    }
    if p.delivery_mode > 2 {
        return Err(Status::invalid_argument(format!(
            "message.properties.delivery_mode: must be 0, 1 or 2, got {}",
            p.delivery_mode
        )));
    }
    if p.priority > 255 {
        return Err(Status::invalid_argument(format!(
            "message.properties.priority: must be 0..=255, got {}",
            p.priority
        )));
    }
    let props = Properties {
        content_type: p.content_type,
        content_encoding: p.content_encoding,
        headers: table_from_pb_with("message.properties.headers", &p.headers, void)?,
        delivery_mode: p.delivery_mode,
        priority: p.priority,
        correlation_id: p.correlation_id,
        reply_to: p.reply_to,
        expiration: p.expiration,
        message_id: p.message_id,
        timestamp: p.timestamp,
        r#type: p.r#type,
        user_id: p.user_id,
        app_id: p.app_id,
    };
    Ok((props, m.body.to_vec()))
}

/// `expiration` is a decimal string of milliseconds (AMQP 0-9-1 shortstr).
pub fn parse_expiration(s: &str) -> Result<u64, Status> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Status::invalid_argument(format!(
            "message.properties.expiration: must be a non-negative decimal number of milliseconds, got '{}'",
            shown(s)
        )));
    }
    s.parse::<u64>().map_err(|_| {
        Status::invalid_argument(format!(
            "message.properties.expiration: '{}' is out of range",
            shown(s)
        ))
    })
}

pub fn properties_to_pb(p: &Properties) -> pb::Properties {
    pb::Properties {
        content_type: p.content_type.clone(),
        content_encoding: p.content_encoding.clone(),
        headers: table_to_pb(&p.headers),
        delivery_mode: p.delivery_mode,
        priority: p.priority,
        correlation_id: p.correlation_id.clone(),
        reply_to: p.reply_to.clone(),
        expiration: p.expiration.clone(),
        message_id: p.message_id.clone(),
        timestamp: p.timestamp,
        r#type: p.r#type.clone(),
        user_id: p.user_id.clone(),
        app_id: p.app_id.clone(),
    }
}

/// Takes the message, so that its body moves into the reply instead of being copied.
pub fn message_to_pb(m: Message) -> pb::Message {
    pb::Message {
        properties: Some(properties_to_pb(&m.properties)),
        body: m.body.into(),
    }
}

pub fn meta_error_to_status(e: &MetaError) -> Status {
    Status::new(kind_code(e.kind), e.message.clone())
}

/// The gRPC code of a metadata refusal's kind.
pub fn kind_code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::ResourceExhausted => Code::ResourceExhausted,
    }
}

/// `""` means the default vhost `/`.
pub fn vhost(v: &str) -> String {
    if v.is_empty() {
        "/".to_string()
    } else {
        v.to_string()
    }
}

/// The settle outcome named by a request's `field`.
pub fn settle_outcome(v: i32, field: &str) -> Result<SettleOutcome, Status> {
    match pb::SettleOutcome::try_from(v) {
        Ok(pb::SettleOutcome::Ack) => Ok(SettleOutcome::Ack),
        Ok(pb::SettleOutcome::Requeue) => Ok(SettleOutcome::Requeue),
        Ok(pb::SettleOutcome::Reject) => Ok(SettleOutcome::Reject),
        Ok(pb::SettleOutcome::Release) => Ok(SettleOutcome::Release),
        _ => Err(Status::invalid_argument(format!(
            "{field}: {v} is not a settle outcome (ACK, REQUEUE, REJECT or RELEASE)"
        ))),
    }
}

/// The settle outcome of a request with its options: `reason_detail` only with REJECT,
/// `delay_ms` only with REQUEUE, each within [`SettleOutcome::validate`]'s bounds
/// (INVALID_ARGUMENT naming the field otherwise). `prefix` names the message holding them
/// (`""` or `"settle."`).
pub fn settle_outcome_with(
    v: i32,
    prefix: &str,
    reason_detail: Option<String>,
    delay_ms: Option<u64>,
) -> Result<SettleOutcome, Status> {
    let outcome = match (
        settle_outcome(v, &format!("{prefix}outcome"))?,
        reason_detail,
        delay_ms,
    ) {
        (o, None, None) => o,
        (SettleOutcome::Reject, Some(detail), None) => SettleOutcome::RejectWithDetail { detail },
        (SettleOutcome::Requeue, None, Some(delay_ms)) => SettleOutcome::RequeueAfter { delay_ms },
        (_, Some(_), _) => {
            return Err(Status::invalid_argument(format!(
                "{prefix}reason_detail: only a REJECT takes a reason detail"
            )));
        }
        (_, None, Some(_)) => {
            return Err(Status::invalid_argument(format!(
                "{prefix}delay_ms: only a REQUEUE takes a delay"
            )));
        }
    };
    outcome
        .validate()
        .map_err(|why| Status::invalid_argument(format!("{prefix}{why}")))?;
    Ok(outcome)
}

pub fn delivery_pb(tag: u64, receipt: String, redelivered: bool, mut m: Message) -> pb::Delivery {
    pb::Delivery {
        delivery_tag: tag,
        receipt,
        redelivered,
        exchange: std::mem::take(&mut m.exchange),
        routing_key: std::mem::take(&mut m.routing_key),
        message: Some(message_to_pb(m)),
    }
}

/// Every `(field, name)` within the name bound: INVALID_ARGUMENT naming the first that is not.
pub fn bounded(names: &[(&str, &str)]) -> Result<(), Status> {
    names
        .iter()
        .try_for_each(|(field, name)| check_bound(field, name))
        .map_err(|e| meta_error_to_status(&e))
}
