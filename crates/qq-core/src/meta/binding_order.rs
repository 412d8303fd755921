//! The order of bindings: by source, destination, routing key, then arguments (doubles by
//! their total order), so that a vhost's bindings form a set and every replica iterates them
//! alike.

use std::cmp::Ordering;

use super::Binding;
use crate::types::{Table, Value};

fn cmp_value(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::String(_) => 0,
            Value::Long(_) => 1,
            Value::Bool(_) => 2,
            Value::Double(_) => 3,
            Value::Bytes(_) => 4,
            Value::Timestamp(_) => 5,
            Value::List(_) => 6,
            Value::Table(_) => 7,
            Value::Void => 8,
        }
    }
    match (a, b) {
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Long(x), Value::Long(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Double(x), Value::Double(y)) => x.total_cmp(y),
        (Value::Bytes(x), Value::Bytes(y)) => x.cmp(y),
        (Value::Timestamp(x), Value::Timestamp(y)) => x.cmp(y),
        (Value::List(x), Value::List(y)) => x
            .iter()
            .zip(y)
            .map(|(x, y)| cmp_value(x, y))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        (Value::Table(x), Value::Table(y)) => cmp_table(x, y),
        _ => rank(a).cmp(&rank(b)),
    }
}

fn cmp_table(a: &Table, b: &Table) -> Ordering {
    a.iter()
        .zip(b)
        .map(|((ka, va), (kb, vb))| ka.cmp(kb).then_with(|| cmp_value(va, vb)))
        .find(|o| o.is_ne())
        .unwrap_or_else(|| a.len().cmp(&b.len()))
}

impl Ord for Binding {
    fn cmp(&self, other: &Self) -> Ordering {
        self.source
            .cmp(&other.source)
            .then_with(|| self.destination.cmp(&other.destination))
            .then_with(|| self.routing_key.cmp(&other.routing_key))
            .then_with(|| cmp_table(&self.arguments, &other.arguments))
    }
}
impl PartialOrd for Binding {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Binding {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for Binding {}
