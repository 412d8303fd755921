use super::*;

fn policy(definition: &[(&str, Value)]) -> Policy {
    Policy {
        name: "p".into(),
        pattern: ".*".into(),
        apply_to: "queues".into(),
        priority: 0,
        definition: definition
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    }
}

fn source_of(args: &Table, policy: Option<&Policy>, key: &str) -> SettingSource {
    setting_sources(args, policy)
        .into_iter()
        .find(|(k, _)| *k == key)
        .map(|(_, s)| s)
        .unwrap()
}

#[test]
fn sources_follow_the_precedence_of_effective_config() {
    let args: Table = [
        ("x-dead-letter-exchange", Value::String("dlx".into())),
        ("x-max-length", Value::Long(10)),
        ("x-message-ttl", Value::Long(5_000)),
        ("x-delivery-limit", Value::Long(3)),
        ("x-overflow", Value::String("drop-head".into())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let p = policy(&[
        ("dead-letter-exchange", Value::String("other".into())),
        ("dead-letter-routing-key", Value::String("k".into())),
        ("max-length", Value::Long(5)),
        ("message-ttl", Value::Long(5_000)),
        ("delivery-limit", Value::Long(-1)),
        ("overflow", Value::String("reject-publish".into())),
    ]);
    let c = effective_config("/", "q", &args, Some(&p));
    use SettingSource::*;
    // Argument wins for the exchange; the key only the policy gives.
    assert_eq!(c.dead_letter_exchange.as_deref(), Some("dlx"));
    assert_eq!(source_of(&args, Some(&p), "dead-letter-exchange"), Argument);
    assert_eq!(c.dead_letter_routing_key.as_deref(), Some("k"));
    assert_eq!(
        source_of(&args, Some(&p), "dead-letter-routing-key"),
        Policy
    );
    assert_eq!(source_of(&args, Some(&p), "dead-letter-strategy"), Default);
    // The minimum: the policy's 5; equal TTLs: both.
    assert_eq!(c.max_length, Some(5));
    assert_eq!(source_of(&args, Some(&p), "max-length"), Policy);
    assert_eq!(source_of(&args, Some(&p), "message-ttl"), Both);
    // A negative (unlimited) delivery limit: the finite argument wins.
    assert_eq!(c.delivery_limit, Some(3));
    assert_eq!(source_of(&args, Some(&p), "delivery-limit"), Argument);
    // Overflow: the policy.
    assert_eq!(source_of(&args, Some(&p), "overflow"), Policy);
    assert_eq!(source_of(&args, Some(&p), "expires"), Default);
    // Without the policy every set key is the argument's.
    assert_eq!(source_of(&args, None, "max-length"), Argument);
    assert_eq!(source_of(&args, None, "overflow"), Argument);
    assert_eq!(source_of(&args, None, "dead-letter-routing-key"), Default);
    assert_eq!(
        setting_sources(&args, None).len(),
        SETTING_KEYS.len(),
        "one source per key"
    );
}
