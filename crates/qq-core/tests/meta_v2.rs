//! Metadata machine version 2: the version switch through the log, exchange-to-exchange
//! bindings (routing through them, cycles, alternate exchanges, deletes) and operator
//! policies, and the extras a snapshot carries beside release 0.1.0's encoding.

use qq_core::meta::*;
use qq_core::types::*;

fn table(entries: &[(&str, Value)]) -> Table {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn ok(state: &mut MetaState, cmd: MetaCommand) -> Vec<MetaEffect> {
    let (r, e) = state.apply(cmd.clone());
    r.unwrap_or_else(|err| panic!("{cmd:?} failed: {err:?}"));
    e
}

fn err(state: &mut MetaState, cmd: MetaCommand) -> MetaError {
    let before = state.clone();
    let (r, e) = state.apply(cmd.clone());
    assert!(e.is_empty(), "a failed command has no effects: {e:?}");
    assert_eq!(*state, before, "a failed command changes nothing");
    r.expect_err(&format!("{cmd:?} should fail"))
}

/// A fresh state moved to version 2.
fn v2() -> MetaState {
    let mut state = MetaState::new();
    ok(&mut state, MetaCommand::SetMachineVersion { version: 2 });
    state
}

fn exchange(state: &mut MetaState, name: &str, kind: &str, arguments: Table, auto_delete: bool) {
    ok(
        state,
        MetaCommand::DeclareExchange {
            vhost: "/".into(),
            name: name.into(),
            kind: kind.into(),
            durable: true,
            auto_delete,
            internal: false,
            arguments,
            passive: false,
            owner: None,
        },
    );
}

fn queue(state: &mut MetaState, name: &str, arguments: Table) -> Vec<MetaEffect> {
    ok(
        state,
        MetaCommand::DeclareQueue {
            vhost: "/".into(),
            name: name.into(),
            arguments,
            passive: false,
            nodes: vec![1, 2, 3],
            owner: None,
            origin: None,
        },
    )
}

fn bind_queue(state: &mut MetaState, exchange: &str, queue: &str, key: &str) {
    ok(
        state,
        MetaCommand::Bind {
            vhost: "/".into(),
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: key.into(),
            arguments: Table::new(),
        },
    );
}

fn e2e(source: &str, destination: &str, key: &str, add: bool) -> MetaCommand {
    let (destination, source) = (destination.to_string(), source.to_string());
    MetaCommand::exchange_binding(
        add,
        "/".into(),
        destination,
        source,
        key.into(),
        Table::new(),
    )
}

fn routed(state: &MetaState, exchange: &str, key: &str) -> Vec<String> {
    state
        .route("/", exchange, &[key.to_string()], &Table::new())
        .unwrap()
        .into_iter()
        .map(|q| q.name.clone())
        .collect()
}

fn operator_policy(name: &str, pattern: &str, definition: Table) -> MetaCommand {
    MetaCommand::SetOperatorPolicy {
        vhost: "/".into(),
        name: name.into(),
        pattern: pattern.into(),
        apply_to: "queues".into(),
        priority: 0,
        definition,
    }
}

#[test]
fn version_two_commands_wait_for_the_switch() {
    let mut state = MetaState::new();
    assert_eq!(state.machine_version(), FIRST_META_MACHINE_VERSION);
    exchange(&mut state, "a", "fanout", Table::new(), false);
    exchange(&mut state, "b", "fanout", Table::new(), false);
    let e = err(&mut state, e2e("a", "b", "", true));
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert!(
        e.message.contains("metadata machine version 2"),
        "{}",
        e.message
    );
    let e = err(
        &mut state,
        operator_policy("op", ".*", table(&[("max-length", Value::Long(1))])),
    );
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);

    let e = err(&mut state, MetaCommand::SetMachineVersion { version: 3 });
    assert!(e.message.starts_with("version:"), "{}", e.message);
    ok(&mut state, MetaCommand::SetMachineVersion { version: 2 });
    assert_eq!(state.machine_version(), META_MACHINE_VERSION);
    ok(&mut state, e2e("a", "b", "", true));
    // A version never goes back.
    ok(&mut state, MetaCommand::SetMachineVersion { version: 1 });
    assert_eq!(state.machine_version(), 2);
}

#[test]
fn a_publish_follows_exchange_bindings_and_a_cycle_ends() {
    let mut state = v2();
    exchange(&mut state, "x1", "direct", Table::new(), false);
    exchange(&mut state, "x2", "fanout", Table::new(), false);
    exchange(&mut state, "x3", "topic", Table::new(), false);
    for q in ["q1", "q2", "q3"] {
        queue(&mut state, q, Table::new());
    }
    bind_queue(&mut state, "x1", "q1", "a");
    ok(&mut state, e2e("x1", "x2", "a", true));
    bind_queue(&mut state, "x2", "q2", "");
    ok(&mut state, e2e("x2", "x3", "", true));
    bind_queue(&mut state, "x3", "q3", "a.#");
    // The cycle back to x1, and x3 to itself.
    ok(&mut state, e2e("x3", "x1", "#", true));
    ok(&mut state, e2e("x3", "x3", "#", true));

    assert_eq!(routed(&state, "x1", "a"), ["q1", "q2", "q3"]);
    assert_eq!(routed(&state, "x1", "b"), Vec::<String>::new());
    // From x2 the walk reaches x1 through x3; x1 matches key "a" only.
    assert_eq!(routed(&state, "x2", "a.b"), ["q2", "q3"]);
    assert_eq!(routed(&state, "x2", "a"), ["q1", "q2", "q3"]);

    ok(&mut state, e2e("x1", "x2", "a", false));
    assert_eq!(routed(&state, "x1", "a"), ["q1"]);
    // Unbinding what is not bound succeeds, as RabbitMQ's exchange.unbind.
    ok(&mut state, e2e("x1", "x2", "a", false));
}

#[test]
fn the_alternate_exchange_is_used_only_where_no_binding_matches() {
    let mut state = v2();
    let ae = |name: &str| table(&[("alternate-exchange", Value::String(name.into()))]);
    exchange(&mut state, "ae1", "fanout", Table::new(), false);
    exchange(&mut state, "ae2", "fanout", Table::new(), false);
    exchange(&mut state, "x1", "direct", ae("ae1"), false);
    exchange(&mut state, "x2", "direct", ae("ae2"), false);
    for q in ["q", "caught1", "caught2"] {
        queue(&mut state, q, Table::new());
    }
    bind_queue(&mut state, "ae1", "caught1", "");
    bind_queue(&mut state, "ae2", "caught2", "");
    ok(&mut state, e2e("x1", "x2", "k", true));
    bind_queue(&mut state, "x2", "q", "k");
    assert_eq!(routed(&state, "x1", "k"), ["q"]);
    // x1 matches nothing: its alternate.
    assert_eq!(routed(&state, "x1", "other"), ["caught1"]);
    ok(
        &mut state,
        MetaCommand::Unbind {
            vhost: "/".into(),
            queue: "q".into(),
            exchange: "x2".into(),
            routing_key: "k".into(),
            arguments: Table::new(),
        },
    );
    // x1's binding to x2 still matches, so x1's alternate is not used; x2 matches nothing.
    assert_eq!(routed(&state, "x1", "k"), ["caught2"]);
}

#[test]
fn deletes_take_exchange_bindings_with_them() {
    let mut state = v2();
    exchange(&mut state, "src", "fanout", Table::new(), true);
    exchange(&mut state, "dst", "fanout", Table::new(), false);
    queue(&mut state, "q", Table::new());
    bind_queue(&mut state, "dst", "q", "");
    ok(&mut state, e2e("src", "dst", "", true));
    let e = err(
        &mut state,
        MetaCommand::DeleteExchange {
            vhost: "/".into(),
            name: "src".into(),
            if_unused: true,
        },
    );
    assert!(e.message.contains("in use"), "{}", e.message);
    ok(
        &mut state,
        MetaCommand::DeleteExchange {
            vhost: "/".into(),
            name: "dst".into(),
            if_unused: false,
        },
    );
    let v = state.vhost("/").unwrap();
    assert!(v.exchange_bindings.is_empty());
    assert!(
        state.exchange("/", "src").is_none(),
        "the auto-delete source lost its last binding"
    );
}

#[test]
fn bad_exchange_bindings_are_refused_by_name() {
    let mut state = v2();
    exchange(&mut state, "a", "headers", Table::new(), false);
    let e = err(&mut state, e2e("a", "missing", "", true));
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert_eq!(e.message, "no exchange 'missing' in vhost '/'");
    let e = err(&mut state, e2e("missing", "a", "", true));
    assert_eq!(e.message, "no exchange 'missing' in vhost '/'");
    let e = err(&mut state, e2e("", "a", "", true));
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    let e = err(&mut state, e2e("a", "amq.default", "", true));
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    let mut bad = e2e("a", "amq.direct", "", true);
    if let MetaCommand::BindExchange { arguments, .. } = &mut bad {
        arguments.insert("x-match".into(), Value::String("some".into()));
    }
    assert_eq!(err(&mut state, bad).kind, ErrorKind::InvalidArgument);
}

#[test]
fn an_operator_policy_lowers_limits_and_clearing_it_restores_them() {
    let mut state = v2();
    queue(
        &mut state,
        "orders",
        table(&[("x-max-length", Value::Long(100))]),
    );
    queue(&mut state, "other", Table::new());
    let effects = ok(
        &mut state,
        operator_policy(
            "cap",
            "^orders$",
            table(&[
                ("max-length", Value::Long(10)),
                ("message-ttl", Value::Long(60_000)),
            ]),
        ),
    );
    let [MetaEffect::QueueConfigChanged(q)] = effects.as_slice() else {
        panic!("one queue's configuration changes: {effects:?}");
    };
    assert_eq!((q.name.as_str(), q.config.max_length), ("orders", Some(10)));
    assert_eq!(q.config.message_ttl_ms, Some(60_000));
    let orders = state.queue("/", "orders").unwrap().clone();
    assert_eq!(state.operator_policy_of(&orders).unwrap().name, "cap");
    // A queue declared later gets it at once.
    let effects = queue(&mut state, "orders2", Table::new());
    let Some(MetaEffect::QueueCreated(q)) = effects.first() else {
        panic!("{effects:?}")
    };
    assert_eq!(q.config.max_length, None, "the pattern is anchored");

    let e = err(
        &mut state,
        operator_policy(
            "bad",
            ".*",
            table(&[("overflow", Value::String("x".into()))]),
        ),
    );
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    ok(
        &mut state,
        MetaCommand::ClearOperatorPolicy {
            vhost: "/".into(),
            name: "cap".into(),
        },
    );
    assert_eq!(
        state.queue("/", "orders").unwrap().config.max_length,
        Some(100)
    );
    let e = err(
        &mut state,
        MetaCommand::ClearOperatorPolicy {
            vhost: "/".into(),
            name: "cap".into(),
        },
    );
    assert_eq!(e.kind, ErrorKind::NotFound);
}

#[test]
fn extras_carry_what_the_old_encoding_leaves_out() {
    let mut state = v2();
    exchange(&mut state, "a", "fanout", Table::new(), false);
    exchange(&mut state, "b", "fanout", Table::new(), false);
    ok(&mut state, e2e("a", "b", "", true));
    ok(
        &mut state,
        operator_policy("cap", ".*", table(&[("max-length", Value::Long(5))])),
    );
    // The state's own encoding is release 0.1.0's: without the extras it reads as version 1.
    let bytes = postcard::to_stdvec(&state).unwrap();
    let mut decoded: MetaState = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(decoded.machine_version(), FIRST_META_MACHINE_VERSION);
    assert!(decoded.vhost("/").unwrap().exchange_bindings.is_empty());
    let extras: MetaExtras =
        postcard::from_bytes(&postcard::to_stdvec(&state.extras()).unwrap()).unwrap();
    decoded.restore_extras(extras);
    assert_eq!(decoded, state);
}

#[test]
fn x_max_priority_is_accepted_from_version_2_and_compared_on_redeclare() {
    let args = |n: i64| table(&[("x-max-priority", Value::Long(n))]);
    let declare = |n: i64| MetaCommand::DeclareQueue {
        vhost: "/".into(),
        name: "prio".into(),
        arguments: args(n),
        passive: false,
        nodes: vec![1, 2, 3],
        owner: None,
        origin: None,
    };
    let mut old = MetaState::new();
    let e = err(&mut old, declare(10));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.starts_with("x-max-priority:"), "{}", e.message);

    let mut state = v2();
    ok(&mut state, declare(10));
    let q = state.queue("/", "prio").unwrap();
    assert_eq!(qq_core::policy::max_priority(&q.arguments), Some(10));
    ok(&mut state, declare(10));
    let e = err(&mut state, declare(5));
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert!(
        e.message
            .starts_with("inequivalent arg 'x-max-priority' for queue 'prio'"),
        "{}",
        e.message
    );
}

#[test]
fn an_alternate_exchange_policy_key_waits_for_version_2() {
    let policy = MetaCommand::SetPolicy {
        vhost: "/".into(),
        name: "ae".into(),
        pattern: ".*".into(),
        apply_to: "exchanges".into(),
        priority: 0,
        definition: table(&[("alternate-exchange", Value::String("caught".into()))]),
    };
    let mut old = MetaState::new();
    let e = err(&mut old, policy.clone());
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(
        e.message.contains("metadata machine version 2"),
        "{}",
        e.message
    );
    ok(&mut v2(), policy);
}
