//! Building and reading `Value`s: [`ValueExt`], [`table`], [`string_list`], and the
//! readable renderings [`display_value`] and [`display_table`].

use std::collections::HashMap;

use bytes::Bytes;

use qq_proto::v1::{self, Value, value};

/// Constructors and readers for [`Value`]; bring it into scope to write `Value::string("x")`.
pub trait ValueExt: Sized {
    fn string(s: impl Into<String>) -> Self;
    fn long(n: i64) -> Self;
    fn bool(b: bool) -> Self;
    fn double(d: f64) -> Self;
    fn bytes(b: impl Into<Bytes>) -> Self;
    fn timestamp(seconds: i64) -> Self;
    fn list(values: Vec<Value>) -> Self;
    fn table(fields: HashMap<String, Value>) -> Self;
    fn as_str(&self) -> Option<&str>;
    fn as_long(&self) -> Option<i64>;
    fn as_bool(&self) -> Option<bool>;
    fn as_list(&self) -> Option<&[Value]>;
    fn as_table(&self) -> Option<&HashMap<String, Value>>;
}

impl ValueExt for Value {
    fn string(s: impl Into<String>) -> Self {
        Value {
            kind: Some(value::Kind::StringValue(s.into())),
        }
    }
    fn long(n: i64) -> Self {
        Value {
            kind: Some(value::Kind::LongValue(n)),
        }
    }
    fn bool(b: bool) -> Self {
        Value {
            kind: Some(value::Kind::BoolValue(b)),
        }
    }
    fn double(d: f64) -> Self {
        Value {
            kind: Some(value::Kind::DoubleValue(d)),
        }
    }
    fn bytes(b: impl Into<Bytes>) -> Self {
        Value {
            kind: Some(value::Kind::BytesValue(b.into())),
        }
    }
    fn timestamp(seconds: i64) -> Self {
        Value {
            kind: Some(value::Kind::TimestampValue(seconds)),
        }
    }
    fn list(values: Vec<Value>) -> Self {
        Value {
            kind: Some(value::Kind::ListValue(v1::ValueList { values })),
        }
    }
    fn table(fields: HashMap<String, Value>) -> Self {
        Value {
            kind: Some(value::Kind::TableValue(v1::ValueTable { fields })),
        }
    }
    fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Some(value::Kind::StringValue(s)) => Some(s),
            _ => None,
        }
    }
    fn as_long(&self) -> Option<i64> {
        match &self.kind {
            Some(value::Kind::LongValue(n)) => Some(*n),
            _ => None,
        }
    }
    fn as_bool(&self) -> Option<bool> {
        match &self.kind {
            Some(value::Kind::BoolValue(b)) => Some(*b),
            _ => None,
        }
    }
    fn as_list(&self) -> Option<&[Value]> {
        match &self.kind {
            Some(value::Kind::ListValue(l)) => Some(&l.values),
            _ => None,
        }
    }
    fn as_table(&self) -> Option<&HashMap<String, Value>> {
        match &self.kind {
            Some(value::Kind::TableValue(t)) => Some(&t.fields),
            _ => None,
        }
    }
}

/// A `map<string, Value>` from pairs: `table([("x-max-length", Value::long(5))])`.
pub fn table<K: Into<String>>(
    pairs: impl IntoIterator<Item = (K, Value)>,
) -> HashMap<String, Value> {
    pairs.into_iter().map(|(k, v)| (k.into(), v)).collect()
}

/// A list of strings as a `Value` (for `CC` / `BCC` headers).
pub fn string_list<S: Into<String>>(items: impl IntoIterator<Item = S>) -> Value {
    Value::list(items.into_iter().map(Value::string).collect())
}

/// A readable rendering of a value: strings quoted, lists in `[..]`, tables in `{..}` with
/// sorted keys, bytes as hex, timestamps as `@seconds`.
pub fn display_value(v: &Value) -> String {
    match &v.kind {
        None => "null".into(),
        Some(value::Kind::StringValue(s)) => format!("{s:?}"),
        Some(value::Kind::LongValue(n)) => n.to_string(),
        Some(value::Kind::BoolValue(b)) => b.to_string(),
        Some(value::Kind::DoubleValue(d)) => d.to_string(),
        Some(value::Kind::BytesValue(b)) => {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            format!("0x{hex}")
        }
        Some(value::Kind::TimestampValue(t)) => format!("@{t}"),
        Some(value::Kind::ListValue(l)) => {
            let items: Vec<String> = l.values.iter().map(display_value).collect();
            format!("[{}]", items.join(", "))
        }
        Some(value::Kind::TableValue(t)) => display_table(&t.fields),
    }
}

/// A readable rendering of a table, keys sorted: `{a: 1, b: "x"}`.
pub fn display_table(t: &HashMap<String, Value>) -> String {
    let mut keys: Vec<&String> = t.keys().collect();
    keys.sort();
    let items: Vec<String> = keys
        .iter()
        .map(|k| format!("{k}: {}", display_value(&t[*k])))
        .collect();
    format!("{{{}}}", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_display() {
        assert_eq!(Value::long(5).as_long(), Some(5));
        assert_eq!(Value::string("x").as_str(), Some("x"));
        let t = table([("b", Value::bool(true)), ("a", string_list(["k1", "k2"]))]);
        assert_eq!(display_table(&t), r#"{a: ["k1", "k2"], b: true}"#);
    }
}
