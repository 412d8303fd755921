//! Tests of the metadata layer: routing rules (`route`), argument/policy validation and
//! precedence (`policy`), and the metadata state machine (`meta`).

use qq_core::meta::*;
use qq_core::policy::*;
use qq_core::route::*;
use qq_core::types::*;

// ------------------------------------------------------------------ helpers

fn s(v: &str) -> Value {
    Value::String(v.into())
}
fn l(v: i64) -> Value {
    Value::Long(v)
}
fn table(entries: &[(&str, Value)]) -> Table {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}
fn strings(items: &[&str]) -> Value {
    Value::List(items.iter().map(|i| s(i)).collect())
}
fn keys(items: &[&str]) -> Vec<String> {
    items.iter().map(|k| k.to_string()).collect()
}
fn policy(name: &str, pattern: &str, priority: i64, definition: Table) -> Policy {
    Policy {
        name: name.into(),
        pattern: pattern.into(),
        apply_to: "all".into(),
        priority,
        definition,
    }
}

const NODES: [NodeId; 3] = [1, 2, 3];

/// Applies `cmd`, which must succeed; the state keeps its invariants (as the snapshots it is
/// written to check).
fn ok(state: &mut MetaState, cmd: MetaCommand) -> (MetaReply, Vec<MetaEffect>) {
    let (r, e) = state.apply(cmd.clone());
    state.check_invariants().unwrap();
    match r {
        Ok(reply) => (reply, e),
        Err(err) => panic!("{cmd:?} failed: {err:?}"),
    }
}
fn err(state: &mut MetaState, cmd: MetaCommand) -> MetaError {
    let before = state.clone();
    let (r, e) = state.apply(cmd.clone());
    assert!(e.is_empty(), "a failed command has no effects: {e:?}");
    assert_eq!(*state, before, "a failed command changes nothing");
    r.expect_err(&format!("{cmd:?} should fail"))
}
fn declare_queue_cmd(vhost: &str, name: &str, arguments: Table) -> MetaCommand {
    MetaCommand::DeclareQueue {
        vhost: vhost.into(),
        name: name.into(),
        arguments,
        passive: false,
        nodes: NODES.to_vec(),
        owner: None,
        origin: None,
    }
}
fn declare_queue(state: &mut MetaState, name: &str, arguments: Table) -> QueueMeta {
    match ok(state, declare_queue_cmd("/", name, arguments)).0 {
        MetaReply::QueueDeclared { queue, .. } => queue,
        other => panic!("unexpected {other:?}"),
    }
}
fn declare_exchange_cmd(name: &str, kind: &str) -> MetaCommand {
    MetaCommand::DeclareExchange {
        vhost: "/".into(),
        name: name.into(),
        kind: kind.into(),
        durable: true,
        auto_delete: false,
        internal: false,
        arguments: Table::new(),
        passive: false,
        owner: None,
    }
}
fn bind_cmd(queue: &str, exchange: &str, key: &str, arguments: Table) -> MetaCommand {
    MetaCommand::Bind {
        vhost: "/".into(),
        queue: queue.into(),
        exchange: exchange.into(),
        routing_key: key.into(),
        arguments,
    }
}
fn set_policy_cmd(name: &str, pattern: &str, priority: i64, definition: Table) -> MetaCommand {
    MetaCommand::SetPolicy {
        vhost: "/".into(),
        name: name.into(),
        pattern: pattern.into(),
        apply_to: "queues".into(),
        priority,
        definition,
    }
}
fn routed(state: &MetaState, exchange: &str, rks: &[&str], headers: &Table) -> Vec<String> {
    state
        .route("/", exchange, &keys(rks), headers)
        .expect("route")
        .into_iter()
        .map(|q| q.name.clone())
        .collect()
}

// ------------------------------------------------------------------ route.rs

#[test]
fn topic_matching_table() {
    let cases: &[(&str, &str, bool)] = &[
        ("a.b.c", "a.b.c", true),
        ("a.b.c", "a.b", false),
        ("a.b", "a.b.c", false),
        ("a.*.c", "a.b.c", true),
        ("a.*.c", "a.c", false),
        ("a.*.c", "a.b.b.c", false),
        ("*", "a", true),
        ("*", "a.b", false),
        ("*", "", false),
        ("#", "", true),
        ("#", "a", true),
        ("#", "a.b.c", true),
        ("a.#", "a", true),
        ("a.#", "a.b.c", true),
        ("a.#", "b.a", false),
        ("#.c", "a.b.c", true),
        ("#.c", "c", true),
        ("#.c", "c.d", false),
        ("a.#.c", "a.c", true),
        ("a.#.c", "a.b.x.c", true),
        ("a.#.c", "a.b.x.d", false),
        ("#.*", "", false),
        ("#.*", "a", true),
        ("*.#", "a.b", true),
        ("#.#", "a.b", true),
        ("*.*", "a.b", true),
        ("*.*", "a", false),
        ("a.*.#", "a.b", true),
        ("a.*.#", "a", false),
        ("", "", true),
        ("", "a", false),
        ("a..b", "a..b", true),
        ("a.*.b", "a..b", true),
        ("stock.usd.*", "stock.usd.nyse", true),
        ("stock.usd.*", "stock.eur.nyse", false),
        ("*.orange.*", "quick.orange.rabbit", true),
        ("*.*.rabbit", "lazy.orange.elephant", false),
        ("lazy.#", "lazy.orange.male.rabbit", true),
    ];
    for (pattern, key, want) in cases {
        assert_eq!(
            topic_matches(pattern, key),
            *want,
            "pattern {pattern:?} key {key:?}"
        );
    }
}

#[test]
fn exchange_type_parse_round_trips() {
    for name in ["direct", "fanout", "topic", "headers"] {
        assert_eq!(ExchangeType::parse(name).unwrap().as_str(), name);
    }
    assert_eq!(ExchangeType::parse("x-delayed"), None);
    assert_eq!(ExchangeType::parse("Direct"), None);
}

#[test]
fn headers_match_all_and_any() {
    let headers = table(&[("a", s("1")), ("b", l(2)), ("x-tag", s("t"))]);
    // all (default): every non-x- binding argument must match.
    assert!(headers_match(
        &table(&[("a", s("1")), ("b", l(2))]),
        &headers
    ));
    assert!(headers_match(
        &table(&[("x-match", s("all")), ("a", s("1"))]),
        &headers
    ));
    assert!(!headers_match(
        &table(&[("a", s("1")), ("b", l(3))]),
        &headers
    ));
    assert!(!headers_match(
        &table(&[("a", s("1")), ("c", s("1"))]),
        &headers
    ));
    // Same value, different type: no match.
    assert!(!headers_match(&table(&[("b", s("2"))]), &headers));
    // any: one match is enough.
    assert!(headers_match(
        &table(&[("x-match", s("any")), ("a", s("no")), ("b", l(2))]),
        &headers
    ));
    assert!(!headers_match(
        &table(&[("x-match", s("any")), ("a", s("no")), ("c", l(2))]),
        &headers
    ));
}

#[test]
fn headers_match_ignores_x_arguments_unless_with_x() {
    let headers = table(&[("a", s("1")), ("x-first-death-reason", s("expired"))]);
    // all ignores the x- argument, even a mismatching one.
    assert!(headers_match(
        &table(&[("a", s("1")), ("x-first-death-reason", s("rejected"))]),
        &headers
    ));
    // all with only x- arguments: nothing to compare, matches.
    assert!(headers_match(
        &table(&[("x-first-death-reason", s("rejected"))]),
        &headers
    ));
    // any with only x- arguments: nothing to compare, no match.
    assert!(!headers_match(
        &table(&[
            ("x-match", s("any")),
            ("x-first-death-reason", s("expired"))
        ]),
        &headers
    ));
    // with-x variants compare them.
    assert!(headers_match(
        &table(&[
            ("x-match", s("all-with-x")),
            ("a", s("1")),
            ("x-first-death-reason", s("expired"))
        ]),
        &headers
    ));
    assert!(!headers_match(
        &table(&[
            ("x-match", s("all-with-x")),
            ("a", s("1")),
            ("x-first-death-reason", s("rejected"))
        ]),
        &headers
    ));
    assert!(headers_match(
        &table(&[
            ("x-match", s("any-with-x")),
            ("a", s("nope")),
            ("x-first-death-reason", s("expired"))
        ]),
        &headers
    ));
    assert!(!headers_match(
        &table(&[
            ("x-match", s("any-with-x")),
            ("a", s("nope")),
            ("x-first-death-reason", s("rejected"))
        ]),
        &headers
    ));
}

#[test]
fn binding_arguments_validation() {
    assert!(
        validate_binding_arguments(ExchangeType::Headers, &table(&[("x-match", s("any"))])).is_ok()
    );
    let e = validate_binding_arguments(ExchangeType::Headers, &table(&[("x-match", s("some"))]))
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(
        e.message.contains("x-match") && e.message.contains("'some'"),
        "{e}"
    );
    let e = validate_binding_arguments(ExchangeType::Headers, &table(&[("x-match", l(1))]))
        .unwrap_err();
    assert!(
        e.message.contains("x-match") && e.message.contains("long"),
        "{e}"
    );
    // Other exchange types do not interpret x-match.
    assert!(
        validate_binding_arguments(ExchangeType::Direct, &table(&[("x-match", s("some"))])).is_ok()
    );
}

#[test]
fn routing_keys_include_cc_and_bcc() {
    let headers = table(&[("CC", strings(&["c1", "c2"])), ("BCC", strings(&["b1"]))]);
    assert_eq!(
        routing_keys("rk", &headers),
        keys(&["rk", "c1", "c2", "b1"])
    );
    assert_eq!(
        visible_routing_keys("rk", &headers),
        keys(&["rk", "c1", "c2"])
    );
    assert_eq!(routing_keys("rk", &Table::new()), keys(&["rk"]));
    let mut headers = headers;
    strip_bcc(&mut headers);
    assert!(!headers.contains_key("BCC"));
    assert!(headers.contains_key("CC"));
}

#[test]
fn sender_selected_headers_must_be_string_lists() {
    assert!(validate_sender_selected(&table(&[("CC", strings(&["a"]))])).is_ok());
    let e = validate_sender_selected(&table(&[("CC", s("a"))])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.starts_with("CC:"), "{e}");
    let e = validate_sender_selected(&table(&[("BCC", Value::List(vec![l(1)]))])).unwrap_err();
    assert!(
        e.message.starts_with("BCC:") && e.message.contains("long"),
        "{e}"
    );
}

// ------------------------------------------------------------------ policy.rs: validation

#[test]
fn valid_queue_arguments_pass() {
    let args = table(&[
        ("x-dead-letter-exchange", s("dlx")),
        ("x-dead-letter-routing-key", s("dead")),
        ("x-dead-letter-strategy", s("at-least-once")),
        ("x-overflow", s("reject-publish")),
        ("x-message-ttl", l(0)),
        ("x-expires", l(1)),
        ("x-max-length", l(0)),
        ("x-max-length-bytes", l(10)),
        ("x-delivery-limit", l(-1)),
        ("x-quorum-initial-group-size", l(5)),
        ("x-single-active-consumer", Value::Bool(true)),
        ("x-queue-type", s("quorum")),
        ("x-something-unknown", Value::Double(1.5)),
        ("not-an-x-key", s("ignored")),
    ]);
    validate_queue_arguments(&args).unwrap();
}

#[test]
fn invalid_queue_arguments_name_the_argument_and_why() {
    let cases: Vec<(Table, &str, &str)> = vec![
        (
            table(&[("x-message-ttl", s("1000"))]),
            "x-message-ttl:",
            "got string",
        ),
        (
            table(&[("x-message-ttl", l(-1))]),
            "x-message-ttl:",
            "got -1",
        ),
        (
            table(&[("x-message-ttl", l(MAX_TTL_MS + 1))]),
            "x-message-ttl:",
            "non-negative",
        ),
        (
            table(&[("x-expires", l(0))]),
            "x-expires:",
            "between 1 and 315360000000, got 0",
        ),
        (
            table(&[("x-expires", Value::Bool(true))]),
            "x-expires:",
            "got bool",
        ),
        (table(&[("x-max-length", l(-5))]), "x-max-length:", "got -5"),
        (
            table(&[("x-max-length-bytes", Value::Double(1.0))]),
            "x-max-length-bytes:",
            "got double",
        ),
        (
            table(&[("x-overflow", s("drop-tail"))]),
            "x-overflow:",
            "got 'drop-tail'",
        ),
        (
            table(&[("x-delivery-limit", s("5"))]),
            "x-delivery-limit:",
            "got string",
        ),
        (
            table(&[("x-quorum-initial-group-size", l(0))]),
            "x-quorum-initial-group-size:",
            "got 0",
        ),
        (
            table(&[("x-single-active-consumer", s("true"))]),
            "x-single-active-consumer:",
            "got string",
        ),
        (
            table(&[("x-queue-type", s("classic"))]),
            "x-queue-type:",
            "got 'classic'",
        ),
        (
            table(&[("x-dead-letter-exchange", l(1))]),
            "x-dead-letter-exchange:",
            "got long",
        ),
        (
            table(&[
                ("x-dead-letter-exchange", s("d")),
                ("x-dead-letter-strategy", s("exactly-once")),
            ]),
            "x-dead-letter-strategy:",
            "got 'exactly-once'",
        ),
        (
            table(&[("x-dead-letter-routing-key", s("k"))]),
            "x-dead-letter-routing-key:",
            "requires x-dead-letter-exchange",
        ),
        (
            table(&[("x-max-priority", l(32))]),
            "x-max-priority:",
            "between 1 and 31",
        ),
        (
            table(&[("x-queue-mode", s("lazy"))]),
            "x-queue-mode:",
            "not supported",
        ),
    ];
    for (args, prefix, why) in cases {
        let e = validate_queue_arguments(&args).expect_err(&format!("{args:?}"));
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{args:?}");
        assert!(e.message.starts_with(prefix), "{args:?}: {e}");
        assert!(e.message.contains(why), "{args:?}: {e}");
    }
    assert_eq!(
        validate_queue_arguments(&table(&[("x-message-ttl", s("x"))]))
            .unwrap_err()
            .message,
        "x-message-ttl: expected a non-negative long <= 315360000000, got string"
    );
}

#[test]
fn policy_definition_validation() {
    let def = table(&[
        ("dead-letter-exchange", s("dlx")),
        ("dead-letter-routing-key", s("k")),
        ("dead-letter-strategy", s("at-most-once")),
        ("message-ttl", l(5)),
        ("expires", l(5)),
        ("max-length", l(5)),
        ("max-length-bytes", l(5)),
        ("overflow", s("reject-publish-dlx")),
        ("delivery-limit", l(-3)),
    ]);
    validate_policy_definition(&def).unwrap();
    let e = validate_policy_definition(&table(&[("max-age", s("1D"))])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("'max-age'"), "{e}");
    // The x- form is an argument, not a policy key.
    assert!(validate_policy_definition(&table(&[("x-message-ttl", l(5))])).is_err());
    let e = validate_policy_definition(&table(&[("expires", l(0))])).unwrap_err();
    assert!(e.message.starts_with("expires:"), "{e}");
    let e = validate_policy_definition(&table(&[("overflow", l(0))])).unwrap_err();
    assert!(
        e.message.starts_with("overflow:") && e.message.contains("long"),
        "{e}"
    );
}

// ------------------------------------------------------------------ policy.rs: precedence

#[test]
fn no_arguments_no_policy_gives_defaults() {
    let c = effective_config("/", "q", &Table::new(), None);
    assert_eq!(c, QueueConfig::new("/", "q"));
    assert_eq!(c.delivery_limit, Some(DEFAULT_DELIVERY_LIMIT as u64));
}

#[test]
fn numeric_limits_take_the_minimum() {
    for key in ["message-ttl", "expires", "max-length", "max-length-bytes"] {
        let get = |c: &QueueConfig| match key {
            "message-ttl" => c.message_ttl_ms,
            "expires" => c.expires_ms,
            "max-length" => c.max_length,
            _ => c.max_length_bytes,
        };
        let arg = |n| table(&[(&format!("x-{key}") as &str, l(n))]);
        let pol = |n| policy("p", ".*", 0, table(&[(key, l(n))]));
        assert_eq!(
            get(&effective_config("/", "q", &arg(100), None)),
            Some(100),
            "{key}"
        );
        assert_eq!(
            get(&effective_config("/", "q", &Table::new(), Some(&pol(7)))),
            Some(7),
            "{key}"
        );
        assert_eq!(
            get(&effective_config("/", "q", &arg(100), Some(&pol(7)))),
            Some(7),
            "{key}"
        );
        assert_eq!(
            get(&effective_config("/", "q", &arg(5), Some(&pol(70)))),
            Some(5),
            "{key}"
        );
    }
}

#[test]
fn delivery_limit_precedence() {
    let dl = |a: Option<i64>, p: Option<i64>| {
        let args = a
            .map(|n| table(&[("x-delivery-limit", l(n))]))
            .unwrap_or_default();
        let pol = p.map(|n| policy("p", ".*", 0, table(&[("delivery-limit", l(n))])));
        effective_config("/", "q", &args, pol.as_ref()).delivery_limit
    };
    assert_eq!(dl(None, None), Some(20));
    assert_eq!(dl(Some(5), None), Some(5));
    assert_eq!(dl(None, Some(7)), Some(7));
    assert_eq!(dl(Some(5), Some(7)), Some(5));
    assert_eq!(dl(Some(9), Some(7)), Some(7));
    assert_eq!(dl(Some(0), Some(7)), Some(0));
    // One negative: the finite one wins.
    assert_eq!(dl(Some(-1), Some(7)), Some(7));
    assert_eq!(dl(Some(5), Some(-1)), Some(5));
    // Negative alone or both negative: unlimited.
    assert_eq!(dl(Some(-1), None), None);
    assert_eq!(dl(None, Some(-1)), None);
    assert_eq!(dl(Some(-1), Some(-2)), None);
}

#[test]
fn overflow_policy_wins() {
    let args = table(&[("x-overflow", s("reject-publish"))]);
    let pol = policy("p", ".*", 0, table(&[("overflow", s("drop-head"))]));
    assert_eq!(
        effective_config("/", "q", &args, None).overflow,
        Overflow::RejectPublish
    );
    assert_eq!(
        effective_config("/", "q", &args, Some(&pol)).overflow,
        Overflow::DropHead
    );
    let pol = policy(
        "p",
        ".*",
        0,
        table(&[("overflow", s("reject-publish-dlx"))]),
    );
    assert_eq!(
        effective_config("/", "q", &Table::new(), Some(&pol)).overflow,
        Overflow::RejectPublishDlx
    );
}

#[test]
fn dead_letter_keys_argument_wins_each_key_separately() {
    let pol = policy(
        "p",
        ".*",
        0,
        table(&[
            ("dead-letter-exchange", s("pdlx")),
            ("dead-letter-routing-key", s("pkey")),
        ]),
    );
    let c = effective_config(
        "/",
        "q",
        &table(&[("x-dead-letter-exchange", s("adlx"))]),
        Some(&pol),
    );
    assert_eq!(c.dead_letter_exchange.as_deref(), Some("adlx"));
    assert_eq!(c.dead_letter_routing_key.as_deref(), Some("pkey"));
    assert_eq!(c.dead_letter_strategy, Strategy::AtMostOnce);
    assert_eq!(c.policy.as_deref(), Some("p"));
    let c = effective_config("/", "q", &Table::new(), Some(&pol));
    assert_eq!(c.dead_letter_exchange.as_deref(), Some("pdlx"));
    // The default exchange is a valid DLX.
    let c = effective_config("/", "q", &table(&[("x-dead-letter-exchange", s(""))]), None);
    assert_eq!(c.dead_letter_exchange.as_deref(), Some(""));
    assert_eq!(c.dead_letter_strategy, Strategy::AtMostOnce);
}

#[test]
fn strategy_rules() {
    let dlx = ("x-dead-letter-exchange", s("dlx"));
    // No DLX: disabled.
    assert_eq!(
        effective_config("/", "q", &Table::new(), None).dead_letter_strategy,
        Strategy::Disabled
    );
    // at-least-once with reject-publish: honoured, no note.
    let c = effective_config(
        "/",
        "q",
        &table(&[
            dlx.clone(),
            ("x-dead-letter-strategy", s("at-least-once")),
            ("x-overflow", s("reject-publish")),
        ]),
        None,
    );
    assert_eq!(c.dead_letter_strategy, Strategy::AtLeastOnce);
    assert_eq!(c.note, None);
    // Arguments at-least-once + reject-publish, policy switches overflow to drop-head: the
    // queue falls back and says why.
    let pol = policy("p", ".*", 0, table(&[("overflow", s("drop-head"))]));
    let c = effective_config(
        "/",
        "q",
        &table(&[
            dlx.clone(),
            ("x-dead-letter-strategy", s("at-least-once")),
            ("x-overflow", s("reject-publish")),
        ]),
        Some(&pol),
    );
    assert_eq!(c.dead_letter_strategy, Strategy::AtMostOnce);
    let note = c.note.expect("a note");
    assert!(
        note.contains("at-least-once")
            && note.contains("drop-head")
            && note.contains("at-most-once"),
        "{note}"
    );
    // Strategy from the policy, overflow from the argument (default).
    let pol = policy(
        "p",
        ".*",
        0,
        table(&[("dead-letter-strategy", s("at-least-once"))]),
    );
    let c = effective_config("/", "q", &table(std::slice::from_ref(&dlx)), Some(&pol));
    assert_eq!(c.dead_letter_strategy, Strategy::AtMostOnce);
    assert!(c.note.is_some());
    // Argument strategy beats the policy's.
    let pol = policy(
        "p",
        ".*",
        0,
        table(&[
            ("dead-letter-strategy", s("at-least-once")),
            ("overflow", s("reject-publish")),
        ]),
    );
    let c = effective_config(
        "/",
        "q",
        &table(&[dlx, ("x-dead-letter-strategy", s("at-most-once"))]),
        Some(&pol),
    );
    assert_eq!(c.dead_letter_strategy, Strategy::AtMostOnce);
    assert_eq!(c.note, None);
    // A routing key from a policy without any DLX: disabled, with a note.
    let pol = policy("p", ".*", 0, table(&[("dead-letter-routing-key", s("k"))]));
    let c = effective_config("/", "q", &Table::new(), Some(&pol));
    assert_eq!(c.dead_letter_strategy, Strategy::Disabled);
    assert_eq!(c.dead_letter_routing_key, None);
    assert!(c.note.unwrap().contains("dead-letter-routing-key"));
}

#[test]
fn single_active_consumer_comes_from_the_argument() {
    assert!(
        effective_config(
            "/",
            "q",
            &table(&[("x-single-active-consumer", Value::Bool(true))]),
            None
        )
        .single_active_consumer
    );
    assert!(
        !effective_config(
            "/",
            "q",
            &table(&[("x-single-active-consumer", Value::Bool(false))]),
            None
        )
        .single_active_consumer
    );
}

#[test]
fn matching_policy_picks_highest_priority_unanchored() {
    let mut queues_only = policy("only-exchanges", ".*", 100, Table::new());
    queues_only.apply_to = "exchanges".into();
    let policies = [
        policy("low", "^orders", 1, Table::new()),
        policy("high", "ders", 5, Table::new()),
        policy("other", "^invoices$", 50, Table::new()),
        queues_only,
    ];
    assert_eq!(
        matching_policy(policies.iter(), "orders.eu").unwrap().name,
        "high"
    );
    assert_eq!(
        matching_policy(policies.iter(), "my-orders-x")
            .unwrap()
            .name,
        "high"
    );
    assert_eq!(
        matching_policy(policies.iter(), "invoices").unwrap().name,
        "other"
    );
    assert!(matching_policy(policies.iter(), "invoices2").is_none());
    // Ties: smallest name wins, whatever the iteration order.
    let tied = [
        policy("b", "q", 3, Table::new()),
        policy("a", "q", 3, Table::new()),
    ];
    assert_eq!(matching_policy(tied.iter(), "q").unwrap().name, "a");
    assert_eq!(matching_policy(tied.iter().rev(), "q").unwrap().name, "a");
}

// ------------------------------------------------------------------ meta.rs: fresh state

#[test]
fn fresh_state_has_default_vhost_exchanges_and_guest() {
    let state = MetaState::new();
    assert!(state.vhost_exists("/"));
    let names: Vec<&str> = state.exchanges("/").map(|x| x.name.as_str()).collect();
    assert_eq!(
        names,
        ["amq.direct", "amq.fanout", "amq.headers", "amq.topic"]
    );
    assert_eq!(
        state.exchange("/", "amq.topic").unwrap().kind,
        ExchangeType::Topic
    );
    assert!(state.user("guest").is_some() && state.user("nobody").is_none());
    for perm in [Perm::Configure, Perm::Write, Perm::Read] {
        state
            .check_permission("guest", "/", perm, "anything")
            .unwrap();
    }
    // The guest record is a fixed Argon2id PHC string (a fresh state is deterministic).
    let guest = state.user("guest").unwrap();
    assert_eq!(guest.password_hash, GUEST_PASSWORD_HASH.as_bytes());
    assert!(GUEST_PASSWORD_HASH.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"));
    assert!(!guest.is_legacy_hash());
}

#[test]
fn state_survives_serialization() {
    let mut state = MetaState::new();
    declare_queue(&mut state, "q", table(&[("x-max-length", l(3))]));
    ok(&mut state, declare_exchange_cmd("h", "headers"));
    ok(
        &mut state,
        bind_cmd(
            "q",
            "h",
            "",
            table(&[("x-match", s("any")), ("d", Value::Double(1.5))]),
        ),
    );
    ok(
        &mut state,
        set_policy_cmd("p", "q", 0, table(&[("message-ttl", l(5))])),
    );
    let bytes = postcard::to_allocvec(&state).unwrap();
    let back: MetaState = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(back, state);
}

// ------------------------------------------------------------------ meta.rs: exchanges

#[test]
fn exchange_declare_and_redeclare() {
    let mut state = MetaState::new();
    ok(&mut state, declare_exchange_cmd("e", "direct"));
    // Same again: fine.
    ok(&mut state, declare_exchange_cmd("e", "direct"));
    let e = err(&mut state, declare_exchange_cmd("e", "fanout"));
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert_eq!(
        e.message,
        "inequivalent arg 'type' for exchange 'e' in vhost '/': received 'fanout' but current is 'direct'"
    );
    let mut cmd = declare_exchange_cmd("e", "direct");
    if let MetaCommand::DeclareExchange { durable, .. } = &mut cmd {
        *durable = false;
    }
    let e = err(&mut state, cmd);
    assert_eq!(
        e.message,
        "inequivalent arg 'durable' for exchange 'e' in vhost '/': received 'false' but current is 'true'"
    );
    let e = err(&mut state, declare_exchange_cmd("f", "x-consistent-hash"));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert_eq!(e.message, "type: unknown exchange type 'x-consistent-hash'");
    // Existing amq.* may be redeclared equivalently; a new amq.* may not be declared.
    ok(&mut state, declare_exchange_cmd("amq.direct", "direct"));
    let e = err(&mut state, declare_exchange_cmd("amq.mine", "direct"));
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert!(e.message.contains("amq."), "{e}");
    // The default exchange cannot be declared (but passive is fine).
    assert_eq!(
        err(&mut state, declare_exchange_cmd("", "direct")).kind,
        ErrorKind::PermissionDenied
    );
    let long = "x".repeat(256);
    assert_eq!(
        err(&mut state, declare_exchange_cmd(&long, "direct")).kind,
        ErrorKind::InvalidArgument
    );
    ok(&mut state, declare_exchange_cmd(&"x".repeat(255), "direct"));
}

/// Of an exchange's arguments a redeclare is compared on `alternate-exchange` only, as
/// RabbitMQ's `rabbit_exchange:assert_args_equivalence`.
#[test]
fn exchange_redeclare_compares_alternate_exchange() {
    let with_args = |name: &str, args: &[(&str, &str)]| {
        let mut cmd = declare_exchange_cmd(name, "direct");
        if let MetaCommand::DeclareExchange { arguments, .. } = &mut cmd {
            for (k, v) in args {
                arguments.insert(k.to_string(), Value::String(v.to_string()));
            }
        }
        cmd
    };
    let mut state = MetaState::new();
    ok(&mut state, with_args("e", &[]));
    ok(
        &mut state,
        with_args("ae", &[("alternate-exchange", "one")]),
    );
    ok(
        &mut state,
        with_args("ae", &[("alternate-exchange", "one")]),
    );
    // Other arguments are not compared.
    ok(&mut state, with_args("e", &[("x-whatever", "1")]));
    let e = err(
        &mut state,
        with_args("e", &[("alternate-exchange", "elsewhere")]),
    );
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert_eq!(
        e.message,
        "inequivalent arg 'alternate-exchange' for exchange 'e' in vhost '/': received the \
         value 'elsewhere' of type 'string' but current is none"
    );
    let e = err(
        &mut state,
        with_args("ae", &[("alternate-exchange", "two")]),
    );
    assert_eq!(
        e.message,
        "inequivalent arg 'alternate-exchange' for exchange 'ae' in vhost '/': received the \
         value 'two' of type 'string' but current is the value 'one' of type 'string'"
    );
    let e = err(&mut state, with_args("ae", &[]));
    assert_eq!(
        e.message,
        "inequivalent arg 'alternate-exchange' for exchange 'ae' in vhost '/': received none \
         but current is the value 'one' of type 'string'"
    );
    // A refused redeclare changes nothing.
    let current = state.exchange("/", "ae").expect("declared");
    assert_eq!(
        current.arguments.get("alternate-exchange"),
        Some(&Value::String("one".into()))
    );
}

#[test]
fn passive_exchange_declare() {
    let mut state = MetaState::new();
    let passive = |name: &str| MetaCommand::DeclareExchange {
        vhost: "/".into(),
        name: name.into(),
        kind: String::new(),
        durable: false,
        auto_delete: false,
        internal: false,
        arguments: Table::new(),
        passive: true,
        owner: None,
    };
    let e = err(&mut state, passive("nope"));
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert_eq!(e.message, "no exchange 'nope' in vhost '/'");
    ok(&mut state, passive("amq.fanout"));
    ok(&mut state, passive(""));
}

#[test]
fn exchange_delete_rules() {
    let mut state = MetaState::new();
    declare_queue(&mut state, "q", Table::new());
    ok(&mut state, declare_exchange_cmd("e", "direct"));
    ok(&mut state, bind_cmd("q", "e", "k", Table::new()));
    let del = |name: &str, if_unused| MetaCommand::DeleteExchange {
        vhost: "/".into(),
        name: name.into(),
        if_unused,
    };
    assert_eq!(
        err(&mut state, del("e", true)).kind,
        ErrorKind::FailedPrecondition
    );
    assert_eq!(
        err(&mut state, del("amq.direct", false)).kind,
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        err(&mut state, del("", false)).kind,
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        err(&mut state, del("missing", false)).kind,
        ErrorKind::NotFound
    );
    ok(&mut state, del("e", false));
    assert!(state.exchange("/", "e").is_none());
    assert_eq!(
        state.bindings("/").count(),
        0,
        "bindings of a deleted exchange go"
    );
}

#[test]
fn auto_delete_exchange_goes_with_its_last_binding() {
    let mut state = MetaState::new();
    declare_queue(&mut state, "q1", Table::new());
    declare_queue(&mut state, "q2", Table::new());
    let mut cmd = declare_exchange_cmd("auto", "fanout");
    if let MetaCommand::DeclareExchange { auto_delete, .. } = &mut cmd {
        *auto_delete = true;
    }
    ok(&mut state, cmd);
    ok(&mut state, bind_cmd("q1", "auto", "", Table::new()));
    ok(&mut state, bind_cmd("q2", "auto", "", Table::new()));
    ok(
        &mut state,
        MetaCommand::Unbind {
            vhost: "/".into(),
            queue: "q1".into(),
            exchange: "auto".into(),
            routing_key: "".into(),
            arguments: Table::new(),
        },
    );
    assert!(state.exchange("/", "auto").is_some());
    ok(
        &mut state,
        MetaCommand::DeleteQueue {
            vhost: "/".into(),
            name: "q2".into(),
        },
    );
    assert!(state.exchange("/", "auto").is_none());
}

// ------------------------------------------------------------------ meta.rs: queues

#[test]
fn queue_declare_creates_with_id_members_and_config() {
    let mut state = MetaState::new();
    let (reply, effects) = ok(
        &mut state,
        declare_queue_cmd("/", "q1", table(&[("x-max-length", l(10))])),
    );
    let MetaReply::QueueDeclared { queue, created } = reply else {
        panic!()
    };
    assert!(created);
    assert_eq!(queue.id, 1);
    assert_eq!(queue.members.len(), 3);
    assert_eq!(queue.config.max_length, Some(10));
    assert_eq!(effects, vec![MetaEffect::QueueCreated(queue.clone())]);
    assert_eq!(state.queue("/", "q1"), Some(&queue));
    assert_eq!(state.queue_by_id(1), Some(&queue));
    // Redeclare: same queue, not created, no effect.
    let (reply, effects) = ok(
        &mut state,
        declare_queue_cmd("/", "q1", table(&[("x-max-length", l(10))])),
    );
    assert_eq!(
        reply,
        MetaReply::QueueDeclared {
            queue: queue.clone(),
            created: false
        }
    );
    assert!(effects.is_empty());
    // Passive.
    let mut passive = declare_queue_cmd("/", "q1", Table::new());
    if let MetaCommand::DeclareQueue { passive: p, .. } = &mut passive {
        *p = true;
    }
    assert_eq!(
        ok(&mut state, passive).0,
        MetaReply::QueueDeclared {
            queue,
            created: false
        }
    );
    let mut passive = declare_queue_cmd("/", "nope", Table::new());
    if let MetaCommand::DeclareQueue { passive: p, .. } = &mut passive {
        *p = true;
    }
    let e = err(&mut state, passive);
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::NotFound, "no queue 'nope' in vhost '/'")
    );
}

#[test]
fn members_are_spread_and_sized() {
    let mut state = MetaState::new();
    let leaders: Vec<NodeId> = (1..=6)
        .map(|i| declare_queue(&mut state, &format!("q{i}"), Table::new()).members[0])
        .collect();
    // Ids 1..6 over nodes [1, 2, 3]: start = id % 3.
    assert_eq!(leaders, [2, 3, 1, 2, 3, 1]);
    let q = declare_queue(
        &mut state,
        "one",
        table(&[("x-quorum-initial-group-size", l(1))]),
    );
    assert_eq!(q.members.len(), 1);
    let q = declare_queue(
        &mut state,
        "many",
        table(&[("x-quorum-initial-group-size", l(7))]),
    );
    let mut m = q.members.clone();
    m.sort();
    assert_eq!(m, [1, 2, 3], "clipped to the cluster");
    // Node order in the command does not matter.
    let mut a = MetaState::new();
    let mut b = MetaState::new();
    let cmd = |nodes: Vec<NodeId>| MetaCommand::DeclareQueue {
        vhost: "/".into(),
        name: "q".into(),
        arguments: Table::new(),
        passive: false,
        nodes,
        owner: None,
        origin: None,
    };
    assert_eq!(a.apply(cmd(vec![3, 1, 2])), b.apply(cmd(vec![1, 2, 3])));
    // A single-node cluster.
    let q = match ok(
        &mut a,
        MetaCommand::DeclareQueue {
            vhost: "/".into(),
            name: "solo".into(),
            arguments: Table::new(),
            passive: false,
            nodes: vec![7],
            owner: None,
            origin: None,
        },
    )
    .0
    {
        MetaReply::QueueDeclared { queue, .. } => queue,
        _ => panic!(),
    };
    assert_eq!(q.members, [7]);
    assert_eq!(
        err(
            &mut a,
            MetaCommand::DeclareQueue {
                vhost: "/".into(),
                name: "none".into(),
                arguments: Table::new(),
                passive: false,
                nodes: vec![],
                owner: None,
                origin: None,
            }
        )
        .kind,
        ErrorKind::FailedPrecondition
    );
}

#[test]
fn queue_redeclare_with_different_arguments_is_inequivalent() {
    let mut state = MetaState::new();
    declare_queue(&mut state, "q", table(&[("x-message-ttl", l(1000))]));
    let e = err(
        &mut state,
        declare_queue_cmd("/", "q", table(&[("x-message-ttl", l(2000))])),
    );
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert_eq!(
        e.message,
        "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value '2000' of type 'long' but current is the value '1000' of type 'long'"
    );
    let e = err(&mut state, declare_queue_cmd("/", "q", Table::new()));
    assert!(
        e.message
            .contains("received none but current is the value '1000'"),
        "{e}"
    );
    let e = err(
        &mut state,
        declare_queue_cmd(
            "/",
            "q",
            table(&[
                ("x-message-ttl", l(1000)),
                ("x-overflow", s("reject-publish")),
            ]),
        ),
    );
    assert!(
        e.message.starts_with("inequivalent arg 'x-overflow'"),
        "{e}"
    );
    // Unknown arguments and an explicit x-queue-type quorum do not matter.
    ok(
        &mut state,
        declare_queue_cmd(
            "/",
            "q",
            table(&[
                ("x-message-ttl", l(1000)),
                ("x-queue-type", s("quorum")),
                ("x-custom", l(1)),
            ]),
        ),
    );
}

#[test]
fn queue_declare_errors() {
    let mut state = MetaState::new();
    let e = err(&mut state, declare_queue_cmd("/", "", Table::new()));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.starts_with("name:"), "{e}");
    assert_eq!(
        err(
            &mut state,
            declare_queue_cmd("/", &"q".repeat(256), Table::new())
        )
        .kind,
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        err(&mut state, declare_queue_cmd("/", "amq.q", Table::new())).kind,
        ErrorKind::PermissionDenied
    );
    let e = err(
        &mut state,
        declare_queue_cmd("/", "q", table(&[("x-expires", l(0))])),
    );
    assert!(e.message.starts_with("x-expires:"), "{e}");
    let e = err(&mut state, declare_queue_cmd("nope", "q", Table::new()));
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::NotFound, "vhost 'nope' not found")
    );
    assert_eq!(state.next_queue_id(), 1, "failed declares do not use ids");
}

#[test]
fn at_least_once_needs_reject_publish_at_declare() {
    let mut state = MetaState::new();
    let base = [
        ("x-dead-letter-exchange", s("dlx")),
        ("x-dead-letter-strategy", s("at-least-once")),
    ];
    // Default overflow (drop-head).
    let e = err(&mut state, declare_queue_cmd("/", "q", table(&base)));
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert!(
        e.message.contains("at-least-once")
            && e.message.contains("reject-publish")
            && e.message.contains("drop-head"),
        "{e}"
    );
    let mut args = table(&base);
    args.insert("x-overflow".into(), s("reject-publish-dlx"));
    assert_eq!(
        err(&mut state, declare_queue_cmd("/", "q", args)).kind,
        ErrorKind::FailedPrecondition
    );
    let mut args = table(&base);
    args.insert("x-overflow".into(), s("reject-publish"));
    let q = declare_queue(&mut state, "q", args);
    assert_eq!(q.config.dead_letter_strategy, Strategy::AtLeastOnce);
    // A policy that provides reject-publish makes the declare acceptable.
    ok(
        &mut state,
        set_policy_cmd("rp", "^p", 0, table(&[("overflow", s("reject-publish"))])),
    );
    let q = declare_queue(&mut state, "p1", table(&base));
    assert_eq!(q.config.dead_letter_strategy, Strategy::AtLeastOnce);
}

#[test]
fn delete_queue_removes_its_bindings() {
    let mut state = MetaState::new();
    let q = declare_queue(&mut state, "q", Table::new());
    declare_queue(&mut state, "other", Table::new());
    ok(&mut state, bind_cmd("q", "amq.direct", "k", Table::new()));
    ok(
        &mut state,
        bind_cmd("other", "amq.direct", "k", Table::new()),
    );
    let (reply, effects) = ok(
        &mut state,
        MetaCommand::DeleteQueue {
            vhost: "/".into(),
            name: "q".into(),
        },
    );
    assert_eq!(reply, MetaReply::QueueDeleted { queue: q.clone() });
    assert_eq!(effects, vec![MetaEffect::QueueDeleted(q)]);
    assert!(state.queue("/", "q").is_none());
    assert!(state.queue_by_id(1).is_none());
    let dests: Vec<&str> = state
        .bindings("/")
        .map(|b| b.destination.as_str())
        .collect();
    assert_eq!(dests, ["other"]);
    assert_eq!(
        err(
            &mut state,
            MetaCommand::DeleteQueue {
                vhost: "/".into(),
                name: "q".into()
            }
        )
        .kind,
        ErrorKind::NotFound
    );
    // Ids are never reused.
    assert_eq!(declare_queue(&mut state, "q", Table::new()).id, 3);
}

// ------------------------------------------------------------------ meta.rs: bindings, routing

#[test]
fn bind_needs_queue_and_exchange() {
    let mut state = MetaState::new();
    declare_queue(&mut state, "q", Table::new());
    let e = err(&mut state, bind_cmd("q", "nope", "k", Table::new()));
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::NotFound, "no exchange 'nope' in vhost '/'")
    );
    let e = err(
        &mut state,
        bind_cmd("nope", "amq.direct", "k", Table::new()),
    );
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::NotFound, "no queue 'nope' in vhost '/'")
    );
    assert_eq!(
        err(&mut state, bind_cmd("q", "", "q", Table::new())).kind,
        ErrorKind::PermissionDenied
    );
    let e = err(
        &mut state,
        bind_cmd("q", "amq.headers", "", table(&[("x-match", s("most"))])),
    );
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    // Binding twice is one binding.
    ok(&mut state, bind_cmd("q", "amq.direct", "k", Table::new()));
    ok(&mut state, bind_cmd("q", "amq.direct", "k", Table::new()));
    assert_eq!(state.bindings("/").count(), 1);
    ok(
        &mut state,
        MetaCommand::Unbind {
            vhost: "/".into(),
            queue: "q".into(),
            exchange: "amq.direct".into(),
            routing_key: "k".into(),
            arguments: Table::new(),
        },
    );
    assert_eq!(state.bindings("/").count(), 0);
}

#[test]
fn routing_through_each_exchange_type() {
    let mut state = MetaState::new();
    for q in ["a", "b", "c"] {
        declare_queue(&mut state, q, Table::new());
    }
    ok(&mut state, bind_cmd("a", "amq.direct", "red", Table::new()));
    ok(
        &mut state,
        bind_cmd("b", "amq.direct", "green", Table::new()),
    );
    ok(&mut state, bind_cmd("c", "amq.direct", "red", Table::new()));
    ok(
        &mut state,
        bind_cmd("a", "amq.topic", "logs.*", Table::new()),
    );
    ok(
        &mut state,
        bind_cmd("b", "amq.topic", "logs.#", Table::new()),
    );
    ok(
        &mut state,
        bind_cmd("b", "amq.fanout", "ignored", Table::new()),
    );
    ok(&mut state, bind_cmd("c", "amq.fanout", "", Table::new()));
    ok(
        &mut state,
        bind_cmd(
            "a",
            "amq.headers",
            "",
            table(&[("x-match", s("any")), ("k", s("v"))]),
        ),
    );
    let none = Table::new();
    assert_eq!(routed(&state, "amq.direct", &["red"], &none), ["a", "c"]);
    assert_eq!(
        routed(&state, "amq.direct", &["blue"], &none),
        Vec::<String>::new()
    );
    assert_eq!(
        routed(&state, "amq.topic", &["logs.error"], &none),
        ["a", "b"]
    );
    assert_eq!(
        routed(&state, "amq.topic", &["logs.error.db"], &none),
        ["b"]
    );
    assert_eq!(
        routed(&state, "amq.fanout", &["whatever"], &none),
        ["b", "c"]
    );
    assert_eq!(
        routed(&state, "amq.headers", &[""], &table(&[("k", s("v"))])),
        ["a"]
    );
    assert_eq!(
        routed(&state, "amq.headers", &[""], &table(&[("k", s("w"))])),
        Vec::<String>::new()
    );
    let e = state
        .route("/", "missing", &keys(&["k"]), &none)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert_eq!(
        state
            .route("nope", "", &keys(&["a"]), &none)
            .unwrap_err()
            .kind,
        ErrorKind::NotFound
    );
}

#[test]
fn routing_with_cc_and_bcc_keys_is_distinct_and_sorted() {
    let mut state = MetaState::new();
    for q in ["q1", "q2", "q3"] {
        declare_queue(&mut state, q, Table::new());
    }
    ok(&mut state, bind_cmd("q3", "amq.direct", "k3", Table::new()));
    ok(&mut state, bind_cmd("q1", "amq.direct", "k1", Table::new()));
    ok(&mut state, bind_cmd("q2", "amq.direct", "k2", Table::new()));
    ok(&mut state, bind_cmd("q1", "amq.direct", "k2", Table::new()));
    let headers = table(&[("CC", strings(&["k2"])), ("BCC", strings(&["k3"]))]);
    let rks = routing_keys("k1", &headers);
    let got: Vec<String> = state
        .route("/", "amq.direct", &rks, &headers)
        .unwrap()
        .into_iter()
        .map(|q| q.name.clone())
        .collect();
    assert_eq!(got, ["q1", "q2", "q3"]);
}

#[test]
fn default_exchange_routes_by_queue_name() {
    let mut state = MetaState::new();
    declare_queue(&mut state, "q1", Table::new());
    declare_queue(&mut state, "q2", Table::new());
    let none = Table::new();
    assert_eq!(routed(&state, "", &["q1"], &none), ["q1"]);
    assert_eq!(routed(&state, "amq.default", &["q2"], &none), ["q2"]);
    assert_eq!(
        routed(&state, "", &["missing"], &none),
        Vec::<String>::new()
    );
    assert_eq!(routed(&state, "", &["q2", "q1", "q2"], &none), ["q1", "q2"]);
}

// ------------------------------------------------------------------ meta.rs: policies

#[test]
fn policy_applies_to_existing_and_new_queues_and_changes_and_clears() {
    let mut state = MetaState::new();
    declare_queue(&mut state, "orders", table(&[("x-max-length", l(100))]));
    declare_queue(&mut state, "invoices", Table::new());

    // Set: only the matching queue changes; one effect carrying the new config.
    let (_, effects) = ok(
        &mut state,
        set_policy_cmd(
            "limits",
            "^ord",
            0,
            table(&[("max-length", l(10)), ("message-ttl", l(500))]),
        ),
    );
    assert_eq!(effects.len(), 1);
    let MetaEffect::QueueConfigChanged(q) = &effects[0] else {
        panic!("{effects:?}")
    };
    assert_eq!(q.name, "orders");
    assert_eq!(q.config.max_length, Some(10));
    assert_eq!(q.config.message_ttl_ms, Some(500));
    assert_eq!(q.config.policy.as_deref(), Some("limits"));
    assert_eq!(state.queue("/", "orders").unwrap().config, q.config);
    assert_eq!(state.queue("/", "invoices").unwrap().config.policy, None);

    // New queue picks it up at declare.
    let q = declare_queue(&mut state, "orders2", Table::new());
    assert_eq!(q.config.max_length, Some(10));

    // Setting the same policy again changes nothing: no effects.
    let (_, effects) = ok(
        &mut state,
        set_policy_cmd(
            "limits",
            "^ord",
            0,
            table(&[("max-length", l(10)), ("message-ttl", l(500))]),
        ),
    );
    assert!(effects.is_empty(), "{effects:?}");

    // A higher-priority policy takes over.
    let (_, effects) = ok(
        &mut state,
        set_policy_cmd("vip", "orders$", 10, table(&[("max-length", l(1000))])),
    );
    assert_eq!(effects.len(), 1);
    let q = state.queue("/", "orders").unwrap();
    assert_eq!(q.config.policy.as_deref(), Some("vip"));
    assert_eq!(q.config.max_length, Some(100), "argument 100 < policy 1000");
    assert_eq!(q.config.message_ttl_ms, None, "only one policy applies");

    // Clear: back to the lower policy, then to arguments only.
    let (_, effects) = ok(
        &mut state,
        MetaCommand::ClearPolicy {
            vhost: "/".into(),
            name: "vip".into(),
        },
    );
    assert_eq!(effects.len(), 1);
    assert_eq!(
        state.queue("/", "orders").unwrap().config.policy.as_deref(),
        Some("limits")
    );
    let (_, effects) = ok(
        &mut state,
        MetaCommand::ClearPolicy {
            vhost: "/".into(),
            name: "limits".into(),
        },
    );
    let mut changed: Vec<String> = effects
        .iter()
        .map(|e| match e {
            MetaEffect::QueueConfigChanged(q) => q.name.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    changed.sort();
    assert_eq!(changed, ["orders", "orders2"]);
    let q = state.queue("/", "orders").unwrap();
    assert_eq!(
        q.config,
        effective_config("/", "orders", &q.arguments, None)
    );
    let e = err(
        &mut state,
        MetaCommand::ClearPolicy {
            vhost: "/".into(),
            name: "limits".into(),
        },
    );
    assert_eq!(e.kind, ErrorKind::NotFound);
}

#[test]
fn policy_that_breaks_at_least_once_reports_fallback() {
    let mut state = MetaState::new();
    declare_queue(
        &mut state,
        "q",
        table(&[
            ("x-dead-letter-exchange", s("dlx")),
            ("x-dead-letter-strategy", s("at-least-once")),
            ("x-overflow", s("reject-publish")),
        ]),
    );
    let (_, effects) = ok(
        &mut state,
        set_policy_cmd("p", "q", 0, table(&[("overflow", s("drop-head"))])),
    );
    assert_eq!(effects.len(), 1);
    let c = &state.queue("/", "q").unwrap().config;
    assert_eq!(c.dead_letter_strategy, Strategy::AtMostOnce);
    assert!(c.note.as_deref().unwrap().contains("at-least-once"));
    ok(
        &mut state,
        MetaCommand::ClearPolicy {
            vhost: "/".into(),
            name: "p".into(),
        },
    );
    let c = &state.queue("/", "q").unwrap().config;
    assert_eq!(c.dead_letter_strategy, Strategy::AtLeastOnce);
    assert_eq!(c.note, None);
}

#[test]
fn policy_validation_errors() {
    let mut state = MetaState::new();
    let e = err(&mut state, set_policy_cmd("p", "(", 0, Table::new()));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.starts_with("pattern:"), "{e}");
    let e = err(
        &mut state,
        set_policy_cmd("p", ".*", 0, table(&[("queue-mode", s("lazy"))])),
    );
    assert!(e.message.contains("queue-mode"), "{e}");
    let e = err(
        &mut state,
        set_policy_cmd("p", ".*", 0, table(&[("max-length", l(-1))])),
    );
    assert!(e.message.starts_with("max-length:"), "{e}");
    let mut cmd = set_policy_cmd("p", ".*", 0, Table::new());
    if let MetaCommand::SetPolicy { apply_to, .. } = &mut cmd {
        *apply_to = "streams-only".into();
    }
    assert!(err(&mut state, cmd).message.starts_with("apply_to:"));
}

#[test]
fn exchange_only_policy_does_not_touch_queues() {
    let mut state = MetaState::new();
    declare_queue(&mut state, "q", Table::new());
    let mut cmd = set_policy_cmd("p", ".*", 0, table(&[("max-length", l(1))]));
    if let MetaCommand::SetPolicy { apply_to, .. } = &mut cmd {
        *apply_to = "exchanges".into();
    }
    let (_, effects) = ok(&mut state, cmd);
    assert!(effects.is_empty());
    assert_eq!(state.queue("/", "q").unwrap().config.max_length, None);
}

// ------------------------------------------------------------------ meta.rs: vhosts, users, permissions

#[test]
fn vhost_lifecycle() {
    let mut state = MetaState::new();
    ok(&mut state, MetaCommand::PutVhost { name: "v".into() });
    assert!(state.vhost_exists("v"));
    assert_eq!(state.exchanges("v").count(), 4);
    ok(&mut state, MetaCommand::PutVhost { name: "v".into() });
    let q = match ok(&mut state, declare_queue_cmd("v", "q", Table::new())).0 {
        MetaReply::QueueDeclared { queue, .. } => queue,
        _ => panic!(),
    };
    ok(
        &mut state,
        MetaCommand::SetPermissions {
            user: "guest".into(),
            vhost: "v".into(),
            configure: ".*".into(),
            write: ".*".into(),
            read: ".*".into(),
        },
    );
    let (_, effects) = ok(&mut state, MetaCommand::DeleteVhost { name: "v".into() });
    assert_eq!(effects, vec![MetaEffect::QueueDeleted(q.clone())]);
    assert!(!state.vhost_exists("v"));
    assert!(state.queue_by_id(q.id).is_none());
    assert!(state.permissions("guest", "v").is_none());
    assert_eq!(
        err(&mut state, MetaCommand::DeleteVhost { name: "v".into() }).message,
        "vhost 'v' not found"
    );
    assert_eq!(
        state
            .check_permission("guest", "v", Perm::Read, "q")
            .unwrap_err()
            .kind,
        ErrorKind::NotFound
    );
}

#[test]
fn users_and_permissions() {
    let mut state = MetaState::new();
    let salt = b"salt".to_vec();
    ok(
        &mut state,
        MetaCommand::PutUser {
            name: "bob".into(),
            password_hash: b"$argon2id$stored-as-given".to_vec(),
            salt,
            tags: vec![],
        },
    );
    // The record is stored as proposed (the node verifies passwords, not the state).
    assert_eq!(
        state.user("bob").unwrap().password_hash,
        b"$argon2id$stored-as-given"
    );
    // No permissions on "/" yet.
    let e = state
        .check_permission("bob", "/", Perm::Read, "q")
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert!(
        e.message.contains("bob") && e.message.contains("'/'"),
        "{e}"
    );
    ok(
        &mut state,
        MetaCommand::SetPermissions {
            user: "bob".into(),
            vhost: "/".into(),
            configure: "^bob-".into(),
            write: "amq.default|^logs".into(),
            read: "".into(),
        },
    );
    state
        .check_permission("bob", "/", Perm::Configure, "bob-q")
        .unwrap();
    let e = state
        .check_permission("bob", "/", Perm::Configure, "alice-q")
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert_eq!(
        e.message,
        "user 'bob' has no configure permission on 'alice-q' in vhost '/'"
    );
    // Unanchored: "^logs" matches "logs.x"; the default exchange is "amq.default".
    state
        .check_permission("bob", "/", Perm::Write, "logs.x")
        .unwrap();
    state.check_permission("bob", "/", Perm::Write, "").unwrap();
    assert!(
        state
            .check_permission("bob", "/", Perm::Write, "metrics")
            .is_err()
    );
    // Empty regex grants nothing.
    let e = state
        .check_permission("bob", "/", Perm::Read, "bob-q")
        .unwrap_err();
    assert!(e.message.contains("read"), "{e}");
    assert_eq!(
        err(
            &mut state,
            MetaCommand::SetPermissions {
                user: "bob".into(),
                vhost: "/".into(),
                configure: "(".into(),
                write: "".into(),
                read: "".into()
            }
        )
        .kind,
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        err(
            &mut state,
            MetaCommand::SetPermissions {
                user: "eve".into(),
                vhost: "/".into(),
                configure: "".into(),
                write: "".into(),
                read: "".into()
            }
        )
        .kind,
        ErrorKind::NotFound
    );
    assert_eq!(
        err(
            &mut state,
            MetaCommand::SetPermissions {
                user: "bob".into(),
                vhost: "nope".into(),
                configure: "".into(),
                write: "".into(),
                read: "".into()
            }
        )
        .kind,
        ErrorKind::NotFound
    );
    ok(&mut state, MetaCommand::DeleteUser { name: "bob".into() });
    assert!(state.permissions("bob", "/").is_none());
    assert!(state.user("bob").is_none());
    assert_eq!(
        err(&mut state, MetaCommand::DeleteUser { name: "bob".into() }).kind,
        ErrorKind::NotFound
    );
}

#[test]
fn binding_order_is_total_and_consistent() {
    let b = |src: &str, dst: &str, key: &str, args: Table| Binding {
        source: src.into(),
        destination: dst.into(),
        routing_key: key.into(),
        arguments: args,
    };
    let x = b("e", "q", "k", table(&[("d", Value::Double(1.0))]));
    let y = b("e", "q", "k", table(&[("d", Value::Double(2.0))]));
    assert!(x < y);
    assert_eq!(x, x.clone());
    assert!(b("a", "z", "z", Table::new()) < b("b", "a", "a", Table::new()));
    assert!(b("a", "q", "k", Table::new()) < b("a", "q", "k", table(&[("a", l(1))])));
}

fn owned_queue(vhost: &str, name: &str, owner: &str) -> MetaCommand {
    match declare_queue_cmd(vhost, name, Table::new()) {
        MetaCommand::DeclareQueue {
            vhost,
            name,
            arguments,
            passive,
            nodes,
            ..
        } => MetaCommand::DeclareQueue {
            vhost,
            name,
            arguments,
            passive,
            nodes,
            owner: Some(owner.into()),
            origin: None,
        },
        _ => unreachable!(),
    }
}
fn owned_exchange(vhost: &str, name: &str, owner: &str) -> MetaCommand {
    MetaCommand::DeclareExchange {
        vhost: vhost.into(),
        name: name.into(),
        kind: "direct".into(),
        durable: true,
        auto_delete: false,
        internal: false,
        arguments: Table::new(),
        passive: false,
        owner: Some(owner.into()),
    }
}

#[test]
fn vhost_limits_cap_queues_and_exchanges_cluster_wide() {
    let mut state = MetaState::new();
    let limits = Limits {
        max_queues: Some(2),
        max_exchanges: Some(1),
        ..Limits::default()
    };
    ok(
        &mut state,
        MetaCommand::SetVhostLimits {
            vhost: "/".into(),
            limits,
        },
    );
    assert_eq!(state.vhost_limits("/"), limits);
    ok(&mut state, owned_queue("/", "q1", "guest"));
    ok(&mut state, owned_queue("/", "q2", "guest"));
    let e = err(&mut state, owned_queue("/", "q3", "guest"));
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    assert_eq!(
        e.message,
        "cannot declare queue 'q3': queue limit (max-queues) in vhost '/' (2) is reached"
    );
    // At the limit, redeclaring an existing queue and a passive declare still answer.
    ok(&mut state, owned_queue("/", "q1", "guest"));
    // Internal declares (no owner) count against the vhost too.
    let e = err(&mut state, declare_queue_cmd("/", "q3", Table::new()));
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    ok(
        &mut state,
        MetaCommand::DeleteQueue {
            vhost: "/".into(),
            name: "q2".into(),
        },
    );
    ok(&mut state, owned_queue("/", "q3", "guest"));

    // The amq.* exchanges do not count.
    ok(&mut state, owned_exchange("/", "x1", "guest"));
    let e = err(&mut state, owned_exchange("/", "x2", "guest"));
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    assert_eq!(
        e.message,
        "exchange limit (max-exchanges) in vhost '/' (1) is reached"
    );
    ok(&mut state, owned_exchange("/", "x1", "guest"));

    // Clearing, and unknown vhosts.
    ok(
        &mut state,
        MetaCommand::SetVhostLimits {
            vhost: "/".into(),
            limits: Limits::default(),
        },
    );
    ok(&mut state, owned_queue("/", "q4", "guest"));
    assert_eq!(state.all_vhost_limits().count(), 0);
    let e = err(
        &mut state,
        MetaCommand::SetVhostLimits {
            vhost: "nope".into(),
            limits,
        },
    );
    assert_eq!(e.kind, ErrorKind::NotFound);
}

#[test]
fn user_limits_count_what_the_user_declared_in_every_vhost() {
    let mut state = MetaState::new();
    ok(&mut state, MetaCommand::PutVhost { name: "b".into() });
    ok(
        &mut state,
        MetaCommand::PutUser {
            name: "bob".into(),
            password_hash: b"x".to_vec(),
            salt: Vec::new(),
            tags: Vec::new(),
        },
    );
    ok(
        &mut state,
        MetaCommand::SetUserLimits {
            user: "bob".into(),
            limits: Limits {
                max_queues: Some(2),
                max_exchanges: Some(0),
                ..Limits::default()
            },
        },
    );
    ok(&mut state, owned_queue("/", "q1", "bob"));
    ok(&mut state, owned_queue("b", "q1", "bob"));
    let e = err(&mut state, owned_queue("b", "q2", "bob"));
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    assert_eq!(
        e.message,
        "cannot declare queue 'q2': queue limit (max-queues) of user 'bob' (2) is reached"
    );
    // Another user is not limited by bob's queues.
    ok(&mut state, owned_queue("b", "q2", "guest"));
    let e = err(&mut state, owned_exchange("b", "x", "bob"));
    assert_eq!(
        e.message,
        "exchange limit (max-exchanges) of user 'bob' (0) is reached"
    );
    // A re-put of the user keeps its limits; deleting it drops them.
    ok(
        &mut state,
        MetaCommand::PutUser {
            name: "bob".into(),
            password_hash: b"y".to_vec(),
            salt: Vec::new(),
            tags: Vec::new(),
        },
    );
    assert_eq!(state.user_limits("bob").max_queues, Some(2));
    ok(&mut state, MetaCommand::DeleteUser { name: "bob".into() });
    assert!(state.user_limits("bob").is_unlimited());
    let e = err(
        &mut state,
        MetaCommand::SetUserLimits {
            user: "bob".into(),
            limits: Limits::default(),
        },
    );
    assert_eq!(e.kind, ErrorKind::NotFound);
}

// ------------------------------------------------------------------ requeue delays

fn longs(items: &[i64]) -> Value {
    Value::List(items.iter().map(|n| l(*n)).collect())
}

#[test]
fn requeue_delays_are_validated_as_argument_and_policy_key() {
    validate_queue_arguments(&table(&[(
        "x-requeue-delays",
        longs(&[0, 1000, 604_800_000]),
    )]))
    .unwrap();
    validate_queue_arguments(&table(&[("x-requeue-delays", longs(&[]))])).unwrap();
    validate_policy_definition(&table(&[("requeue-delays", longs(&[5000]))])).unwrap();
    let cases: Vec<(Value, &str)> = vec![
        (l(1000), "got long"),
        (s("1000,2000"), "got string"),
        (longs(&[1000, -1]), "entry 1 is -1"),
        (longs(&[604_800_001]), "entry 0 is 604800001"),
        (Value::List(vec![s("1")]), "entry 0 is '1'"),
        (longs(&[1; 33]), "33 delays, at most 32"),
    ];
    for (value, why) in cases {
        let e = validate_queue_arguments(&table(&[("x-requeue-delays", value.clone())]))
            .expect_err(&format!("{value:?}"));
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.starts_with("x-requeue-delays: "), "{e}");
        assert!(e.message.contains(why), "{value:?}: {e}");
        let e = validate_policy_definition(&table(&[("requeue-delays", value.clone())]))
            .expect_err(&format!("{value:?}"));
        assert!(e.message.starts_with("requeue-delays: "), "{e}");
        assert!(e.message.contains(why), "{value:?}: {e}");
    }
}

#[test]
fn requeue_delays_argument_wins_over_policy() {
    let p = policy("p", ".*", 0, table(&[("requeue-delays", longs(&[10, 20]))]));
    let c = effective_config("/", "q", &Table::new(), Some(&p));
    assert_eq!(c.requeue_delays_ms, vec![10, 20]);
    let args = table(&[("x-requeue-delays", longs(&[5]))]);
    let c = effective_config("/", "q", &args, Some(&p));
    assert_eq!(c.requeue_delays_ms, vec![5]);
    let c = effective_config("/", "q", &Table::new(), None);
    assert!(c.requeue_delays_ms.is_empty());
}

// ------------------------------------------------------------------ membership

fn set_members(
    q: &QueueMeta,
    expected: &[NodeId],
    members: &[NodeId],
    learners: &[NodeId],
) -> MetaCommand {
    MetaCommand::SetQueueMembers {
        vhost: q.vhost.clone(),
        name: q.name.clone(),
        id: q.id,
        expected: expected.to_vec(),
        members: members.to_vec(),
        learners: learners.to_vec(),
    }
}

#[test]
fn set_queue_members_records_learners_then_members() {
    let mut state = MetaState::new();
    let q = declare_queue(
        &mut state,
        "q",
        table(&[("x-quorum-initial-group-size", l(2))]),
    );
    assert_eq!(q.members.len(), 2);
    assert!(q.learners.is_empty());
    let extra = *NODES.iter().find(|n| !q.members.contains(n)).unwrap();
    let (_, effects) = ok(
        &mut state,
        set_members(&q, &q.members, &q.members, &[extra]),
    );
    let now = state.queue("/", "q").unwrap().clone();
    assert_eq!(now.learners, vec![extra]);
    assert_eq!(effects, vec![MetaEffect::QueueMembersChanged(now.clone())]);
    assert_eq!(now.replicas().count(), 3);
    let mut grown = q.members.clone();
    grown.push(extra);
    ok(&mut state, set_members(&now, &q.members, &grown, &[]));
    let now = state.queue("/", "q").unwrap().clone();
    assert_eq!(now.members, grown);
    assert!(now.learners.is_empty());
}

#[test]
fn set_queue_members_refuses_stale_last_and_duplicate() {
    let mut state = MetaState::new();
    let q = declare_queue(&mut state, "q", Table::new());
    // Stale expectation: another change came first.
    let e = err(&mut state, set_members(&q, &[9], &[1], &[]));
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert!(e.message.contains("members changed"), "{}", e.message);
    // The last member cannot go.
    let e = err(&mut state, set_members(&q, &q.members, &[], &[]));
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert!(e.message.contains("last member"), "{}", e.message);
    // A node both member and learner.
    let e = err(&mut state, set_members(&q, &q.members, &[1], &[1]));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    // Wrong id: not found.
    let mut other = q.clone();
    other.id += 100;
    let e = err(&mut state, set_members(&other, &q.members, &[1], &[]));
    assert_eq!(e.kind, ErrorKind::NotFound);
}

#[test]
fn leader_locator_places_the_first_member() {
    let mut state = MetaState::new();
    for (i, origin) in [3, 2, 1, 3].into_iter().enumerate() {
        let cmd = MetaCommand::DeclareQueue {
            vhost: "/".into(),
            name: format!("local{i}"),
            arguments: table(&[("x-queue-leader-locator", s("client-local"))]),
            passive: false,
            nodes: NODES.to_vec(),
            owner: None,
            origin: Some(origin),
        };
        match ok(&mut state, cmd).0 {
            MetaReply::QueueDeclared { queue, .. } => assert_eq!(queue.members[0], origin),
            other => panic!("unexpected {other:?}"),
        }
    }
    // Node 3 is first of two queues, 2 and 1 of one each: balanced picks 1 (lowest id on a
    // tie), then 2, then 1, 2, 3 evenly.
    let mut firsts = Vec::new();
    for i in 0..5 {
        let q = declare_queue(
            &mut state,
            &format!("bal{i}"),
            table(&[("x-queue-leader-locator", s("balanced"))]),
        );
        firsts.push(q.members[0]);
    }
    assert_eq!(firsts, vec![1, 2, 1, 2, 3]);
    let e = err(
        &mut state,
        declare_queue_cmd(
            "/",
            "bad",
            table(&[("x-queue-leader-locator", s("random"))]),
        ),
    );
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(
        e.message.contains("x-queue-leader-locator"),
        "{}",
        e.message
    );
}

#[test]
fn leader_locator_policy_key_and_the_argument_wins() {
    let mut state = MetaState::new();
    ok(
        &mut state,
        MetaCommand::SetPolicy {
            vhost: "/".into(),
            name: "local".into(),
            pattern: "^loc".into(),
            apply_to: "queues".into(),
            priority: 0,
            definition: table(&[("queue-leader-locator", s("client-local"))]),
        },
    );
    let declare = |name: &str, arguments: Table, origin: NodeId| MetaCommand::DeclareQueue {
        vhost: "/".into(),
        name: name.into(),
        arguments,
        passive: false,
        nodes: NODES.to_vec(),
        owner: None,
        origin: Some(origin),
    };
    for (i, origin) in [2, 3, 2].into_iter().enumerate() {
        match ok(
            &mut state,
            declare(&format!("loc{i}"), Table::new(), origin),
        )
        .0
        {
            MetaReply::QueueDeclared { queue, .. } => assert_eq!(queue.members[0], origin),
            other => panic!("unexpected {other:?}"),
        }
    }
    // Node 2 leads two, node 3 one, node 1 none: balanced (the argument) picks node 1.
    let args = table(&[("x-queue-leader-locator", s("balanced"))]);
    match ok(&mut state, declare("loc-balanced", args, 2)).0 {
        MetaReply::QueueDeclared { queue, .. } => assert_eq!(queue.members[0], 1),
        other => panic!("unexpected {other:?}"),
    }
    let e = err(
        &mut state,
        MetaCommand::SetPolicy {
            vhost: "/".into(),
            name: "bad".into(),
            pattern: ".*".into(),
            apply_to: "queues".into(),
            priority: 0,
            definition: table(&[("queue-leader-locator", s("random"))]),
        },
    );
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("queue-leader-locator"), "{}", e.message);
}

#[test]
fn nodes_join_and_are_forgotten_for_good() {
    let mut state = MetaState::new();
    let join = |id: NodeId, address: &str| MetaCommand::JoinNode {
        id,
        address: address.into(),
        cluster_address: format!("{address}0"),
    };
    let (_, effects) = ok(&mut state, join(4, "h:7104"));
    assert_eq!(effects, vec![MetaEffect::NodesChanged]);
    assert_eq!(state.joined_nodes()[&4].address, "h:7104");
    // The same join again changes nothing; other addresses for the id are refused.
    let (_, effects) = ok(&mut state, join(4, "h:7104"));
    assert!(effects.is_empty());
    assert_eq!(
        err(&mut state, join(4, "h:9")).kind,
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        err(&mut state, join(0, "h:9")).kind,
        ErrorKind::InvalidArgument
    );

    // A node holding a replica cannot be forgotten.
    let cmd = MetaCommand::DeclareQueue {
        vhost: "/".into(),
        name: "on4".into(),
        arguments: table(&[("x-quorum-initial-group-size", l(1))]),
        passive: false,
        nodes: vec![4],
        owner: None,
        origin: None,
    };
    let q = match ok(&mut state, cmd).0 {
        MetaReply::QueueDeclared { queue, .. } => queue,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(q.members, vec![4]);
    let e = err(&mut state, MetaCommand::ForgetNode { id: 4 });
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert!(e.message.contains("/on4"), "{}", e.message);
    ok(&mut state, delete_queue_cmd("on4"));

    let (_, effects) = ok(&mut state, MetaCommand::ForgetNode { id: 4 });
    assert_eq!(effects, vec![MetaEffect::NodesChanged]);
    assert!(state.joined_nodes().is_empty());
    assert!(state.forgotten_nodes().contains(&4));
    // A founding node (never joined) can be forgotten too. Under metadata machine version 1
    // (release 0.1.0) a forgotten id never rejoins; every replica refuses alike.
    ok(&mut state, MetaCommand::ForgetNode { id: 3 });
    let e = err(&mut state, join(4, "h:7104"));
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert!(e.message.contains("forgotten"), "{}", e.message);
    assert!(state.forgotten_nodes().contains(&4));

    // From version 2 on it joins again, as a new member: no longer forgotten, joined with
    // the addresses it gives now (a founding node's too).
    ok(&mut state, MetaCommand::SetMachineVersion { version: 2 });
    let (_, effects) = ok(&mut state, join(4, "h2:7104"));
    assert_eq!(effects, vec![MetaEffect::NodesChanged]);
    assert!(!state.forgotten_nodes().contains(&4));
    assert_eq!(state.joined_nodes()[&4].address, "h2:7104");
    ok(&mut state, join(3, "h3:7103"));
    assert!(state.forgotten_nodes().is_empty());
    assert_eq!(state.joined_nodes().len(), 2);
    // And can be forgotten again.
    ok(&mut state, MetaCommand::ForgetNode { id: 4 });
    assert_eq!(state.forgotten_nodes().len(), 1);
}

fn delete_queue_cmd(name: &str) -> MetaCommand {
    MetaCommand::DeleteQueue {
        vhost: "/".into(),
        name: name.into(),
    }
}

fn declare_exchange_with_ae(name: &str, kind: &str, ae: &str) -> MetaCommand {
    let mut cmd = declare_exchange_cmd(name, kind);
    if let MetaCommand::DeclareExchange { arguments, .. } = &mut cmd {
        *arguments = table(&[("alternate-exchange", s(ae))]);
    }
    cmd
}

/// Policy `ae` for `apply_to`, naming alternate exchange `ae` for exchanges plain and argued.
fn ae_policy(apply_to: &str, ae: &str) -> MetaCommand {
    let definition = table(&[("alternate-exchange", s(ae))]);
    let mut cmd = set_policy_cmd("ae", "^(plain|argued)$", 0, definition);
    if let MetaCommand::SetPolicy { apply_to: a, .. } = &mut cmd {
        *a = apply_to.into();
    }
    cmd
}

#[test]
fn an_unroutable_message_goes_to_the_alternate_exchange_chain() {
    let mut state = MetaState::new();
    let none = Table::new();
    for q in ["routed", "caught", "last"] {
        declare_queue(&mut state, q, Table::new());
    }
    ok(
        &mut state,
        declare_exchange_with_ae("main", "direct", "ae1"),
    );
    ok(&mut state, declare_exchange_with_ae("ae1", "direct", "ae2"));
    ok(&mut state, declare_exchange_cmd("ae2", "fanout"));
    ok(&mut state, bind_cmd("routed", "main", "k", Table::new()));
    ok(&mut state, bind_cmd("caught", "ae1", "other", Table::new()));
    ok(&mut state, bind_cmd("last", "ae2", "", Table::new()));
    // Routed by main: the alternate exchanges are not consulted.
    assert_eq!(routed(&state, "main", &["k"], &none), ["routed"]);
    // Not by main, by its alternate exchange.
    assert_eq!(routed(&state, "main", &["other"], &none), ["caught"]);
    // Neither: down the chain to ae2 (a fanout).
    assert_eq!(routed(&state, "main", &["x"], &none), ["last"]);
    // A missing alternate exchange ends the chain: routed nowhere, no error.
    ok(
        &mut state,
        declare_exchange_with_ae("lost", "direct", "no-such"),
    );
    assert_eq!(routed(&state, "lost", &["x"], &none), Vec::<String>::new());
}

#[test]
fn an_alternate_exchange_cycle_ends() {
    let mut state = MetaState::new();
    let none = Table::new();
    declare_queue(&mut state, "q", Table::new());
    ok(&mut state, declare_exchange_with_ae("a", "direct", "b"));
    ok(&mut state, declare_exchange_with_ae("b", "direct", "a"));
    ok(&mut state, bind_cmd("q", "b", "kb", Table::new()));
    assert_eq!(
        routed(&state, "a", &["nothing"], &none),
        Vec::<String>::new()
    );
    assert_eq!(routed(&state, "a", &["kb"], &none), ["q"]);
    ok(
        &mut state,
        declare_exchange_with_ae("self", "direct", "self"),
    );
    assert_eq!(routed(&state, "self", &["x"], &none), Vec::<String>::new());
}

#[test]
fn a_policy_gives_an_alternate_exchange_and_the_argument_wins() {
    let mut state = MetaState::new();
    // The policy key needs metadata machine version 2 (tests/meta_v2.rs).
    ok(&mut state, MetaCommand::SetMachineVersion { version: 2 });
    let none = Table::new();
    declare_queue(&mut state, "from-policy", Table::new());
    declare_queue(&mut state, "from-argument", Table::new());
    ok(&mut state, declare_exchange_cmd("by-policy", "fanout"));
    ok(&mut state, declare_exchange_cmd("by-argument", "fanout"));
    ok(
        &mut state,
        bind_cmd("from-policy", "by-policy", "", Table::new()),
    );
    ok(
        &mut state,
        bind_cmd("from-argument", "by-argument", "", Table::new()),
    );
    ok(&mut state, declare_exchange_cmd("plain", "direct"));
    ok(
        &mut state,
        declare_exchange_with_ae("argued", "direct", "by-argument"),
    );
    ok(&mut state, ae_policy("queues", "by-policy"));
    // A policy for queues does not apply to exchanges.
    assert_eq!(routed(&state, "plain", &["x"], &none), Vec::<String>::new());
    ok(&mut state, ae_policy("exchanges", "by-policy"));
    assert_eq!(routed(&state, "plain", &["x"], &none), ["from-policy"]);
    assert_eq!(routed(&state, "argued", &["x"], &none), ["from-argument"]);
    // The key is validated as a string.
    let bad = set_policy_cmd("bad", ".*", 0, table(&[("alternate-exchange", l(1))]));
    assert_eq!(err(&mut state, bad).kind, ErrorKind::InvalidArgument);
}
