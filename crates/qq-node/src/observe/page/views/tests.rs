use super::*;
use qq_core::Table;

fn queue_meta(name: &str, args: &[(&str, Value)], policy: Option<&Policy>) -> QueueMeta {
    let arguments: Table = args
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    QueueMeta {
        id: 7,
        vhost: "/".into(),
        name: name.into(),
        config: policy::effective_config("/", name, &arguments, policy),
        arguments,
        members: vec![1, 2, 3],
        learners: Vec::new(),
        owner: None,
    }
}

/// The tags' short names, in order.
fn tags(html: &str) -> Vec<String> {
    html.split("<span class=\"tag\"")
        .skip(1)
        .filter_map(|s| Some(s.split_once('>')?.1.split_once("</span>")?.0.to_string()))
        .collect()
}

#[test]
fn features_are_tagged_as_the_management_ui_does() {
    let q = queue_meta(
        "work",
        &[
            ("x-dead-letter-exchange", Value::String("dlx".into())),
            ("x-dead-letter-routing-key", Value::String("dead".into())),
            ("x-message-ttl", Value::Long(60_000)),
            ("x-max-length", Value::Long(1000)),
            ("x-delivery-limit", Value::Long(5)),
            ("x-consumer-timeout", Value::Long(30_000)),
            ("x-max-priority", Value::Long(9)),
        ],
        None,
    );
    assert_eq!(
        tags(&feature_tags(&q, None, None)),
        ["DLX", "DLK", "TTL", "Lim", "D-Lim", "CT", "Pri"]
    );
    // No arguments, no policy: no tags (the default delivery limit is not a feature).
    let plain = queue_meta("plain", &[], None);
    assert!(tags(&feature_tags(&plain, None, None)).is_empty());
    // A policy's settings are tagged, with the policy's name.
    let p = Policy {
        name: "cap".into(),
        pattern: "^capped$".into(),
        apply_to: "queues".into(),
        priority: 0,
        definition: [("max-length".to_string(), Value::Long(50))]
            .into_iter()
            .collect(),
    };
    let capped = queue_meta("capped", &[], Some(&p));
    let html = feature_tags(&capped, Some(&p), None);
    assert_eq!(tags(&html), ["Lim", "Pol cap"]);
    assert!(html.contains("max-length: 50 (policy cap)"), "{html}");
    // An operator policy is tagged with its name and the limits it imposes.
    let op = Policy {
        name: "ops".into(),
        ..p.clone()
    };
    let html = feature_tags(&capped, Some(&p), Some(&op));
    assert_eq!(tags(&html), ["Lim", "Pol cap", "Op ops"]);
    assert!(
        html.contains("operator policy ops: max-length 50"),
        "{html}"
    );
    // A routing key without an exchange has no effect: no DLK tag.
    let odd = queue_meta(
        "odd",
        &[("x-dead-letter-routing-key", Value::String("k".into()))],
        None,
    );
    assert!(tags(&feature_tags(&odd, None, None)).is_empty());
}

#[test]
fn a_hostile_queue_name_is_escaped_in_the_queues_table() {
    let q = queue_meta("<img src=x onerror=alert(1)>", &[], None);
    let html = queues(
        "/",
        &[QueueRow {
            meta: &q,
            policy: None,
            operator: None,
            info: None,
            rate: None,
        }],
    );
    assert!(!html.contains("<img"), "{html}");
    assert!(html.contains("&lt;img src=x onerror=alert(1)&gt;"));
    assert!(html.contains("its leader did not answer"));
}

#[test]
fn an_exchange_binding_names_its_destination_exchange() {
    let b = |destination: &str, kind: &str| pb::BindingInfo {
        vhost: "/".into(),
        exchange: "orders".into(),
        queue: if kind == "queue" {
            destination.into()
        } else {
            String::new()
        },
        routing_key: "#".into(),
        arguments: Default::default(),
        destination_kind: kind.into(),
        destination: destination.into(),
    };
    let html = bindings("/", &[b("audit", "exchange"), b("q1", "queue")], None);
    assert!(
        html.contains("href=\"/bindings?vhost=%2F&amp;exchange=audit\">exchange audit</a>"),
        "{html}"
    );
    assert!(html.contains(">q1</a>"), "{html}");
}
