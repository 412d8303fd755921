//! Operator policies: limits an operator imposes over the users' policies and arguments, as
//! RabbitMQ's. Five keys, each a limit where the stricter of the user's value and the
//! operator's wins (RabbitMQ merges these keys the same way).

use super::{Policy, QueueConfig, SHARED_KEYS, check, valid_apply_to};
use crate::error::MetaError;
use crate::types::Value;

/// The keys an operator policy may set.
pub const OPERATOR_POLICY_KEYS: [&str; 5] = [
    "max-length",
    "max-length-bytes",
    "message-ttl",
    "delivery-limit",
    "expires",
];

/// An operator policy applies to queues (`apply_to` `all`, empty, `queues` or
/// `quorum_queues`); its definition holds only [`OPERATOR_POLICY_KEYS`], each with the range
/// a user's policy has, and `delivery-limit` not negative (an operator limit is a limit).
pub fn validate_operator_policy(policy: &Policy) -> Result<(), MetaError> {
    if !valid_apply_to(&policy.apply_to) || policy.apply_to == "exchanges" {
        return Err(MetaError::invalid(format!(
            "apply_to: an operator policy applies to queues (all, queues or quorum_queues), \
             got '{}'",
            policy.apply_to
        )));
    }
    for (key, value) in &policy.definition {
        let rule = SHARED_KEYS
            .iter()
            .find(|(name, _)| name == key && OPERATOR_POLICY_KEYS.contains(name))
            .map(|(_, rule)| *rule)
            .ok_or_else(|| {
                MetaError::invalid(format!(
                    "definition: '{key}' is not an operator policy setting (known: {})",
                    OPERATOR_POLICY_KEYS.join(", ")
                ))
            })?;
        check(key, rule, value)?;
        if key == "delivery-limit" && value.as_i64().is_some_and(|n| n < 0) {
            return Err(MetaError::invalid(
                "delivery-limit: an operator policy's delivery limit must be 0 or more",
            ));
        }
    }
    Ok(())
}

/// Lowers `config`'s limits to the operator policy's where the operator's is stricter (a
/// smaller number; any number is stricter than none). Inputs are assumed validated.
pub fn apply_operator_policy(config: &mut QueueConfig, operator: Option<&Policy>) {
    let Some(operator) = operator else { return };
    let limit = |key: &str| {
        operator
            .definition
            .get(key)
            .and_then(Value::as_i64)
            .and_then(|n| u64::try_from(n).ok())
    };
    for (key, field) in [
        ("max-length", &mut config.max_length),
        ("max-length-bytes", &mut config.max_length_bytes),
        ("message-ttl", &mut config.message_ttl_ms),
        ("delivery-limit", &mut config.delivery_limit),
        ("expires", &mut config.expires_ms),
    ] {
        if let Some(op) = limit(key) {
            *field = Some(field.map_or(op, |user| user.min(op)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::effective_config;
    use crate::types::Table;

    fn operator(definition: &[(&str, i64)]) -> Policy {
        Policy {
            name: "op".into(),
            pattern: ".*".into(),
            apply_to: "queues".into(),
            priority: 0,
            definition: definition
                .iter()
                .map(|(k, v)| (k.to_string(), Value::Long(*v)))
                .collect(),
        }
    }

    #[test]
    fn the_stricter_of_user_and_operator_wins() {
        let args: Table = [
            ("x-max-length".to_string(), Value::Long(100)),
            ("x-message-ttl".to_string(), Value::Long(5_000)),
            ("x-delivery-limit".to_string(), Value::Long(-1)),
        ]
        .into_iter()
        .collect();
        let mut c = effective_config("/", "q", &args, None);
        assert_eq!(c.delivery_limit, None, "-1: unlimited before the operator");
        apply_operator_policy(
            &mut c,
            Some(&operator(&[
                ("max-length", 10),
                ("message-ttl", 60_000),
                ("delivery-limit", 3),
                ("expires", 1_000),
            ])),
        );
        assert_eq!(c.max_length, Some(10), "operator's 10 < user's 100");
        assert_eq!(
            c.message_ttl_ms,
            Some(5_000),
            "user's 5 s < operator's 60 s"
        );
        assert_eq!(c.delivery_limit, Some(3), "a limit is stricter than none");
        assert_eq!(c.expires_ms, Some(1_000), "the user set none");
        assert_eq!(c.max_length_bytes, None, "neither sets it");
    }

    #[test]
    fn only_the_five_keys_on_queues_are_accepted() {
        assert!(validate_operator_policy(&operator(&[("max-length", 1)])).is_ok());
        let mut p = operator(&[]);
        p.definition
            .insert("overflow".into(), Value::String("reject-publish".into()));
        let e = validate_operator_policy(&p).unwrap_err();
        assert!(
            e.message
                .contains("'overflow' is not an operator policy setting")
        );
        let e = validate_operator_policy(&operator(&[("delivery-limit", -1)])).unwrap_err();
        assert!(e.message.starts_with("delivery-limit:"), "{}", e.message);
        let e = validate_operator_policy(&operator(&[("max-length", -5)])).unwrap_err();
        assert!(e.message.starts_with("max-length:"), "{}", e.message);
        let mut p = operator(&[]);
        p.apply_to = "exchanges".into();
        assert!(validate_operator_policy(&p).is_err());
    }
}
