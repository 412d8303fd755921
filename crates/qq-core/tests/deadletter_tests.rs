//! Tests of dead-letter copies: the x-death history, routing keys of a dead letter, cycles.

use qq_core::deadletter::*;
use qq_core::meta::{MetaCommand, MetaReply, MetaState};
use qq_core::route::routing_keys;
use qq_core::types::*;

fn s(v: &str) -> Value {
    Value::String(v.into())
}
fn strings(items: &[&str]) -> Value {
    Value::List(items.iter().map(|i| s(i)).collect())
}
fn keys(items: &[&str]) -> Vec<String> {
    items.iter().map(|k| k.to_string()).collect()
}

/// A message published to `exchange` with `routing_key`, CC [c1, c2], BCC [b1], a header and
/// a per-message TTL.
fn published() -> Message {
    let mut msg = Message {
        exchange: "orders".into(),
        routing_key: "rk".into(),
        body: b"hello".to_vec(),
        ..Default::default()
    };
    msg.properties.expiration = "5000".into();
    msg.properties.message_id = "m1".into();
    let h = &mut msg.properties.headers;
    h.insert("CC".into(), strings(&["c1", "c2"]));
    h.insert("BCC".into(), strings(&["b1"]));
    h.insert("app".into(), s("kept"));
    msg
}

fn header<'a>(msg: &'a Message, name: &str) -> Option<&'a Value> {
    msg.properties.headers.get(name)
}

#[test]
fn first_death_records_everything() {
    let msg = published();
    let (copy, rks) = dead_letter(&msg, "q1", Reason::Expired, 1_700_000_123_456, "dlx", None);

    // Routed on the key plus CC plus BCC; the copy points at the DLX with the first key.
    assert_eq!(rks, keys(&["rk", "c1", "c2", "b1"]));
    assert_eq!(copy.exchange, "dlx");
    assert_eq!(copy.routing_key, "rk");
    // BCC stripped, CC kept, other headers and body untouched, expiration removed.
    assert!(header(&copy, "BCC").is_none());
    assert_eq!(header(&copy, "CC"), Some(&strings(&["c1", "c2"])));
    assert_eq!(header(&copy, "app"), Some(&s("kept")));
    assert_eq!(copy.body, msg.body);
    assert_eq!(copy.properties.message_id, "m1");
    assert_eq!(copy.properties.expiration, "");

    // The x-death entry, field by field with wire types.
    let Some(Value::List(entries)) = header(&copy, "x-death") else {
        panic!("x-death missing: {:?}", copy.properties.headers)
    };
    assert_eq!(entries.len(), 1);
    let Value::Table(t) = &entries[0] else {
        panic!()
    };
    assert_eq!(t.get("queue"), Some(&s("q1")));
    assert_eq!(t.get("reason"), Some(&s("expired")));
    assert_eq!(t.get("count"), Some(&Value::Long(1)));
    assert_eq!(t.get("time"), Some(&Value::Timestamp(1_700_000_123)));
    assert_eq!(t.get("exchange"), Some(&s("orders")));
    assert_eq!(t.get("routing-keys"), Some(&strings(&["rk", "c1", "c2"])));
    assert_eq!(t.get("original-expiration"), Some(&s("5000")));
    assert_eq!(t.len(), 7);

    for (name, value) in [
        ("x-first-death-reason", "expired"),
        ("x-first-death-queue", "q1"),
        ("x-first-death-exchange", "orders"),
        ("x-last-death-reason", "expired"),
        ("x-last-death-queue", "q1"),
        ("x-last-death-exchange", "orders"),
    ] {
        assert_eq!(header(&copy, name), Some(&s(value)), "{name}");
    }
}

#[test]
fn no_original_expiration_without_per_message_ttl() {
    let mut msg = published();
    msg.properties.expiration.clear();
    let (copy, _) = dead_letter(&msg, "q1", Reason::Expired, 0, "dlx", None);
    let d = &deaths(&copy)[0];
    assert_eq!(d.original_expiration, None);
    let Some(Value::List(entries)) = header(&copy, "x-death") else {
        panic!()
    };
    let Value::Table(t) = &entries[0] else {
        panic!()
    };
    assert!(!t.contains_key("original-expiration"));
}

#[test]
fn dead_letter_routing_key_replaces_keys_and_removes_cc() {
    let msg = published();
    let (copy, rks) = dead_letter(&msg, "q1", Reason::Rejected, 0, "dlx", Some("dead"));
    assert_eq!(rks, keys(&["dead"]));
    assert_eq!(copy.routing_key, "dead");
    assert!(header(&copy, "CC").is_none());
    assert!(header(&copy, "BCC").is_none());
    // The history still records the keys the message had when it died.
    assert_eq!(deaths(&copy)[0].routing_keys, keys(&["rk", "c1", "c2"]));
}

#[test]
fn default_exchange_as_dlx_routes_back_on_the_original_key() {
    let mut msg = published();
    msg.exchange = String::new();
    msg.properties.headers.clear();
    let (copy, rks) = dead_letter(&msg, "rk", Reason::Maxlen, 0, "", None);
    assert_eq!(rks, keys(&["rk"]));
    assert_eq!(copy.exchange, "");
    assert_eq!(deaths(&copy)[0].exchange, "");
    assert_eq!(header(&copy, "x-first-death-exchange"), Some(&s("")));
}

#[test]
fn repeat_death_merges_and_moves_to_front() {
    let msg = published();
    // q1 expired → q2 rejected → q1 expired again.
    let (m1, _) = dead_letter(&msg, "q1", Reason::Expired, 10_000, "dlx1", None);
    let (m2, _) = dead_letter(&m1, "q2", Reason::Rejected, 20_000, "dlx2", Some("k2"));
    let h = deaths(&m2);
    assert_eq!(h.len(), 2);
    assert_eq!(
        (h[0].queue.as_str(), h[0].reason.as_str()),
        ("q2", "rejected")
    );
    assert_eq!(
        h[0].exchange, "dlx1",
        "exchange at the time of death: the previous DLX"
    );
    assert_eq!(h[0].routing_keys, keys(&["rk", "c1", "c2"]));
    assert_eq!(
        h[0].original_expiration, None,
        "expiration was removed by the first death"
    );
    assert_eq!(h[0].time_s, 20);

    let (m3, rks) = dead_letter(&m2, "q1", Reason::Expired, 30_000, "dlx3", None);
    assert_eq!(
        rks,
        keys(&["k2"]),
        "CC was removed with the DLRK; the key is now k2"
    );
    let h = deaths(&m3);
    assert_eq!(h.len(), 2);
    // The q1/expired entry moved to the front with count 2 and nothing else changed.
    assert_eq!(
        h[0],
        Death {
            queue: "q1".into(),
            reason: "expired".into(),
            count: 2,
            time_s: 10,
            exchange: "orders".into(),
            routing_keys: keys(&["rk", "c1", "c2"]),
            original_expiration: Some("5000".into()),
            reason_detail: None,
        }
    );
    assert_eq!((h[1].queue.as_str(), h[1].count), ("q2", 1));

    // First death never changes; last death follows.
    assert_eq!(header(&m3, "x-first-death-reason"), Some(&s("expired")));
    assert_eq!(header(&m3, "x-first-death-queue"), Some(&s("q1")));
    assert_eq!(header(&m3, "x-first-death-exchange"), Some(&s("orders")));
    assert_eq!(header(&m2, "x-last-death-reason"), Some(&s("rejected")));
    assert_eq!(header(&m2, "x-last-death-queue"), Some(&s("q2")));
    assert_eq!(header(&m2, "x-last-death-exchange"), Some(&s("dlx1")));
    assert_eq!(header(&m3, "x-last-death-reason"), Some(&s("expired")));
    assert_eq!(header(&m3, "x-last-death-queue"), Some(&s("q1")));
    assert_eq!(header(&m3, "x-last-death-exchange"), Some(&s("dlx2")));
}

#[test]
fn same_queue_different_reason_is_a_new_entry() {
    let msg = published();
    let (m1, _) = dead_letter(&msg, "q", Reason::Rejected, 0, "dlx", None);
    let (m2, _) = dead_letter(&m1, "q", Reason::DeliveryLimit, 0, "dlx", None);
    let h = deaths(&m2);
    assert_eq!(
        h.iter()
            .map(|d| (d.reason.as_str(), d.count))
            .collect::<Vec<_>>(),
        [("delivery_limit", 1), ("rejected", 1)]
    );
}

#[test]
fn client_death_headers_are_stripped() {
    let mut headers = Table::new();
    for h in DEATH_HEADERS {
        headers.insert(h.into(), s("forged"));
    }
    headers.insert("x-other".into(), s("kept"));
    headers.insert("CC".into(), strings(&["a"]));
    strip_client_death_headers(&mut headers);
    assert_eq!(headers.keys().collect::<Vec<_>>(), ["CC", "x-other"]);
}

#[test]
fn republished_message_starts_a_fresh_history() {
    // A consumer received a dead letter and republishes it; the node strips the history.
    let (dead, _) = dead_letter(&published(), "q1", Reason::Rejected, 0, "dlx", None);
    let mut republished = dead.clone();
    strip_client_death_headers(&mut republished.properties.headers);
    republished.exchange = "again".into();
    let (copy, _) = dead_letter(&republished, "q2", Reason::Expired, 0, "dlx", None);
    let h = deaths(&copy);
    assert_eq!(h.len(), 1);
    assert_eq!(
        (h[0].queue.as_str(), h[0].reason.as_str(), h[0].count),
        ("q2", "expired", 1)
    );
    assert_eq!(header(&copy, "x-first-death-queue"), Some(&s("q2")));
    assert_eq!(header(&copy, "x-first-death-exchange"), Some(&s("again")));
}

#[test]
fn unparseable_history_is_replaced() {
    let mut msg = published();
    msg.properties
        .headers
        .insert("x-death".into(), s("garbage"));
    let (copy, _) = dead_letter(&msg, "q", Reason::Rejected, 0, "dlx", None);
    assert_eq!(deaths(&copy).len(), 1);
    assert_eq!(deaths(&copy)[0].count, 1);
}

#[test]
fn death_value_round_trips() {
    let d = Death {
        queue: "q".into(),
        reason: "maxlen".into(),
        count: 3,
        time_s: 99,
        exchange: "e".into(),
        routing_keys: keys(&["a", "b"]),
        original_expiration: Some("10".into()),
        reason_detail: None,
    };
    assert_eq!(Death::from_value(&d.to_value()), Some(d.clone()));
    let mut no_ttl = d;
    no_ttl.original_expiration = None;
    assert_eq!(Death::from_value(&no_ttl.to_value()), Some(no_ttl));
    assert_eq!(Death::from_value(&s("x")), None);
}

// ------------------------------------------------------------------ cycles

/// Applies a chain of deaths `(queue, reason)` to a fresh message, oldest first.
fn died(chain: &[(&str, Reason)]) -> Message {
    let mut msg = published();
    for (i, (queue, reason)) in chain.iter().enumerate() {
        msg = dead_letter(&msg, queue, *reason, i as u64 * 1000, "dlx", None).0;
    }
    msg
}

#[test]
fn cycle_table() {
    use Reason::*;
    type Chain<'a> = &'a [(&'a str, Reason)];
    let cases: &[(Chain, &str, bool)] = &[
        // Expired in q, routed back to q: dropped.
        (&[("q", Expired)], "q", true),
        (&[("q", Maxlen)], "q", true),
        (&[("q", DeliveryLimit)], "q", true),
        // Rejected in q, routed back to q: allowed, forever.
        (&[("q", Rejected)], "q", false),
        (
            &[("q", Rejected), ("q", Rejected), ("q", Rejected)],
            "q",
            false,
        ),
        // Not a target it died in.
        (&[("q", Expired)], "other", false),
        // q1 -expired-> q2 -expired-> q1: cycle.
        (&[("q1", Expired), ("q2", Expired)], "q1", true),
        // q1 -rejected-> q2 -expired-> q3 -expired-> q1: the rejected q1 record is in the span.
        (
            &[("q1", Rejected), ("q2", Expired), ("q3", Expired)],
            "q1",
            false,
        ),
        // A rejection older than the most recent death in the target does not help.
        (
            &[("q3", Rejected), ("q1", Expired), ("q2", Expired)],
            "q1",
            true,
        ),
        // A rejection after the death in the target breaks the cycle.
        (&[("q1", Expired), ("q2", Rejected)], "q1", false),
        // Merged entries move to the front: q1 expired, q2 rejected, q1 expired again (moves
        // q1/expired in front of q2/rejected) → cycle back to q1.
        (
            &[("q1", Expired), ("q2", Rejected), ("q1", Expired)],
            "q1",
            true,
        ),
        // ... but towards q2 the span includes q2's rejected entry.
        (
            &[("q1", Expired), ("q2", Rejected), ("q1", Expired)],
            "q2",
            false,
        ),
    ];
    for (chain, target, want) in cases {
        assert_eq!(
            is_cycle(&died(chain), target),
            *want,
            "{chain:?} -> {target}"
        );
    }
    // A message that never died has no cycle.
    assert!(!is_cycle(&published(), "q"));
}

/// The whole path with real routing: a queue whose DLX is the default exchange and whose
/// messages were published through the default exchange dead-letters back to itself.
#[test]
fn self_loop_through_the_default_exchange() {
    let mut state = MetaState::new();
    let (reply, _) = state.apply(MetaCommand::DeclareQueue {
        vhost: "/".into(),
        name: "loop".into(),
        arguments: [("x-dead-letter-exchange".to_string(), s(""))].into(),
        passive: false,
        nodes: vec![1],
        owner: None,
        origin: None,
    });
    assert!(matches!(
        reply,
        Ok(MetaReply::QueueDeclared { created: true, .. })
    ));
    let msg = Message {
        exchange: String::new(),
        routing_key: "loop".into(),
        ..Default::default()
    };
    let dlx = state
        .queue("/", "loop")
        .unwrap()
        .config
        .dead_letter_exchange
        .clone()
        .unwrap();

    for (reason, dropped) in [(Reason::Expired, true), (Reason::Rejected, false)] {
        let (copy, rks) = dead_letter(&msg, "loop", reason, 0, &dlx, None);
        let targets: Vec<String> = state
            .route("/", &copy.exchange, &rks, &copy.properties.headers)
            .unwrap()
            .into_iter()
            .filter(|q| !is_cycle(&copy, &q.name))
            .map(|q| q.name.clone())
            .collect();
        let want: Vec<String> = if dropped { vec![] } else { keys(&["loop"]) };
        assert_eq!(targets, want, "{reason:?}");
    }
}

#[test]
fn dead_letter_keys_match_route_keys_of_the_publish() {
    let msg = published();
    let (_, rks) = dead_letter(&msg, "q", Reason::Rejected, 0, "dlx", None);
    assert_eq!(rks, routing_keys(&msg.routing_key, &msg.properties.headers));
}

// ----- reason detail of a reject -----

#[test]
fn reject_detail_goes_into_the_death_record_and_last_death_header() {
    let m = published();
    let (copy, _) = dead_letter_with_detail(
        &m,
        "q1",
        Reason::Rejected,
        Some("missing customer id"),
        5_000,
        "dlx",
        None,
    );
    let h = deaths(&copy);
    assert_eq!(h[0].reason_detail.as_deref(), Some("missing customer id"));
    assert_eq!(
        copy.properties.headers.get(X_LAST_DEATH_DETAIL),
        Some(&Value::String("missing customer id".into()))
    );
    // A repeat rejection with another detail replaces it; one without keeps the entry's but
    // the last-death header follows the latest death.
    let (again, _) = dead_letter_with_detail(
        &copy,
        "q1",
        Reason::Rejected,
        Some("still missing"),
        6_000,
        "dlx",
        None,
    );
    let h = deaths(&again);
    assert_eq!((h.len(), h[0].count), (1, 2));
    assert_eq!(h[0].reason_detail.as_deref(), Some("still missing"));
    let (third, _) = dead_letter(&again, "q1", Reason::Rejected, 7_000, "dlx", None);
    let h = deaths(&third);
    assert_eq!(h[0].count, 3);
    assert_eq!(h[0].reason_detail.as_deref(), Some("still missing"));
    assert_eq!(third.properties.headers.get(X_LAST_DEATH_DETAIL), None);
    // Another {queue, reason} pair has its own (no) detail.
    let (other, _) = dead_letter(&again, "q2", Reason::Expired, 7_000, "dlx", None);
    let h = deaths(&other);
    assert_eq!(
        (h[0].queue.as_str(), h[0].reason_detail.as_deref()),
        ("q2", None)
    );
    assert_eq!(h[1].reason_detail.as_deref(), Some("still missing"));
}

#[test]
fn a_publishers_last_death_detail_is_stripped() {
    let mut headers = Table::new();
    headers.insert(X_LAST_DEATH_DETAIL.into(), Value::String("forged".into()));
    strip_client_death_headers(&mut headers);
    assert!(headers.is_empty());
}
