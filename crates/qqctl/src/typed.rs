//! Typed values from the command line: `key=value` pairs (`--arg`, `--header`) and the JSON of
//! `set-policy --definition`, turned into `qq.v1.Value`s.

use std::collections::HashMap;

use anyhow::{Context, bail};
use qq_client::{Value, ValueExt};
use serde_json::Value as Json;

/// `key=value` pairs into a typed table: integer → long, true/false → bool, a JSON array in
/// brackets → list (`x-requeue-delays=[1000,60000]`), else string.
pub fn parse_pairs(pairs: &[String]) -> anyhow::Result<HashMap<String, Value>> {
    pairs
        .iter()
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .with_context(|| format!("'{p}' is not key=value"))?;
            if k.is_empty() {
                bail!("'{p}': empty key");
            }
            Ok((k.to_string(), typed_value(v)))
        })
        .collect()
}

fn typed_value(v: &str) -> Value {
    if let Ok(n) = v.parse::<i64>() {
        Value::long(n)
    } else if v == "true" || v == "false" {
        Value::bool(v == "true")
    } else if let Some(list) = v
        .starts_with('[')
        .then(|| serde_json::from_str::<Json>(v).ok())
        .flatten()
        .filter(Json::is_array)
    {
        json_to_value(list)
    } else if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
        Value::string(&v[1..v.len() - 1])
    } else {
        Value::string(v)
    }
}

/// JSON into a value: integers → long, other numbers → double, arrays → list, objects → table.
pub fn json_to_value(j: Json) -> Value {
    match j {
        Json::Null => Value { kind: None },
        Json::Bool(b) => Value::bool(b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::long(i),
            None => Value::double(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::string(s),
        Json::Array(a) => Value::list(a.into_iter().map(json_to_value).collect()),
        Json::Object(o) => {
            Value::table(o.into_iter().map(|(k, v)| (k, json_to_value(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_values_are_typed() {
        let t = parse_pairs(&[
            "a=5".into(),
            "b=true".into(),
            "c=reject-publish".into(),
            "d=\"7\"".into(),
        ])
        .unwrap();
        assert_eq!(t["a"].as_long(), Some(5));
        assert_eq!(t["b"].as_bool(), Some(true));
        assert_eq!(t["c"].as_str(), Some("reject-publish"));
        assert_eq!(t["d"].as_str(), Some("7"));
        assert!(parse_pairs(&["novalue".into()]).is_err());
        let t = parse_pairs(&["l=[1000,60000]".into(), "m=[oops".into()]).unwrap();
        assert_eq!(
            t["l"],
            Value::list(vec![Value::long(1000), Value::long(60000)])
        );
        assert_eq!(t["m"].as_str(), Some("[oops"));
    }

    #[test]
    fn pair_errors_name_the_pair() {
        let e = parse_pairs(&["novalue".into()]).unwrap_err();
        assert_eq!(format!("{e:#}"), "'novalue' is not key=value");
        let e = parse_pairs(&["=5".into()]).unwrap_err();
        assert_eq!(format!("{e:#}"), "'=5': empty key");
    }

    #[test]
    fn json_values_are_typed() {
        let j: Json = serde_json::from_str(r#"{"n": 5, "x": 1.5, "s": "a", "b": false}"#).unwrap();
        let Json::Object(map) = j else { unreachable!() };
        let t: HashMap<String, Value> = map
            .into_iter()
            .map(|(k, v)| (k, json_to_value(v)))
            .collect();
        assert_eq!(t["n"].as_long(), Some(5));
        assert_eq!(t["s"].as_str(), Some("a"));
        assert_eq!(t["b"].as_bool(), Some(false));
        assert!(t["x"].as_long().is_none());
    }
}
