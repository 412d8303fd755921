//! Story: one message set routed through every exchange type.
//!
//! Four queues are bound to a direct, a fanout, a topic and a headers exchange; each publish
//! below names where it must land. Draining the queues afterwards shows exactly those
//! messages, and nothing else: routing is neither too narrow nor too wide. Sender-selected
//! distribution adds queues with `CC` and `BCC`, and `BCC` never reaches a consumer.

use qq_client::{Client, MessageBuilder, PublishOutcome, Value, ValueExt, string_list, table};
use qq_tests::{TestCluster, info};

async fn publish(
    c: &Client,
    exchange: &str,
    key: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<PublishOutcome> {
    let mut m = MessageBuilder::new(body.to_string());
    for (k, v) in headers {
        m = m.header(*k, Value::string(*v));
    }
    let confirm = c.publish(exchange, key, m.build()).await?;
    Ok(confirm.outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exchange_type_routes_exactly() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(2).await?;

    info!("--- topology: four exchanges, four queues");
    for (name, kind) in [
        ("rt.direct", "direct"),
        ("rt.fanout", "fanout"),
        ("rt.topic", "topic"),
        ("rt.headers", "headers"),
    ] {
        c.declare_exchange(name, kind).await?;
    }
    for q in ["ra", "rb", "rc", "rd"] {
        c.declare_queue(q, Default::default()).await?;
    }
    let none = Default::default;
    c.bind("ra", "rt.direct", "a", none()).await?;
    c.bind("rb", "rt.direct", "b", none()).await?;
    c.bind("rc", "rt.direct", "c", none()).await?;
    c.bind("ra", "rt.fanout", "ignored", none()).await?;
    c.bind("rb", "rt.fanout", "", none()).await?;
    c.bind("ra", "rt.topic", "eu.*", none()).await?;
    c.bind("rb", "rt.topic", "eu.#", none()).await?;
    c.bind("rc", "rt.topic", "#.new", none()).await?;
    let pdf_report = |mode: &str| {
        table([
            ("x-match", Value::string(mode)),
            ("format", Value::string("pdf")),
            ("type", Value::string("report")),
        ])
    };
    c.bind("ra", "rt.headers", "", pdf_report("all")).await?;
    c.bind("rb", "rt.headers", "", pdf_report("any")).await?;

    info!("--- direct: exact key");
    assert_eq!(
        publish(&c, "rt.direct", "a", "d1", &[]).await?,
        PublishOutcome::Confirmed
    );
    assert_eq!(
        publish(&c, "rt.direct", "b", "d2", &[]).await?,
        PublishOutcome::Confirmed
    );

    info!("--- fanout: every bound queue, key ignored");
    assert_eq!(
        publish(&c, "rt.fanout", "whatever", "f1", &[]).await?,
        PublishOutcome::Confirmed
    );

    info!("--- topic: * is one word, # is zero or more");
    publish(&c, "rt.topic", "eu.fr", "t1", &[]).await?; // ra (eu.*), rb (eu.#)
    publish(&c, "rt.topic", "eu.fr.new", "t2", &[]).await?; // rb, rc
    publish(&c, "rt.topic", "eu", "t3", &[]).await?; // rb (# matches zero words)
    publish(&c, "rt.topic", "us.new", "t4", &[]).await?; // rc
    publish(&c, "rt.topic", "new", "t5", &[]).await?; // rc
    publish(&c, "rt.topic", "us.fr", "t6", &[]).await?; // nobody

    info!("--- headers: x-match all / any");
    publish(
        &c,
        "rt.headers",
        "",
        "h1",
        &[("format", "pdf"), ("type", "report")],
    )
    .await?; // ra, rb
    publish(&c, "rt.headers", "", "h2", &[("format", "pdf")]).await?; // rb
    let unrouted = publish(&c, "rt.headers", "", "h3", &[("format", "doc")]).await?;
    assert_eq!(
        unrouted,
        PublishOutcome::Confirmed,
        "an unroutable non-mandatory publish is confirmed"
    );

    info!("--- default exchange: the routing key names the queue");
    publish(&c, "", "rd", "x1", &[]).await?;

    info!("--- CC and BCC add routing keys; BCC is stripped");
    let cc = MessageBuilder::new("cc1")
        .header("CC", string_list(["b"]))
        .header("BCC", string_list(["c"]))
        .build();
    assert_eq!(
        c.publish("rt.direct", "a", cc).await?.outcome,
        PublishOutcome::Confirmed
    );

    info!("--- mandatory: UNROUTABLE when nothing matches, CONFIRMED otherwise");
    let m = c
        .publish_mandatory("rt.direct", "zzz", qq_client::message("m1"))
        .await?;
    assert_eq!(m.outcome, PublishOutcome::Unroutable, "{m:?}");
    let m = c
        .publish_mandatory("rt.topic", "eu", qq_client::message("m2"))
        .await?;
    assert_eq!(m.outcome, PublishOutcome::Confirmed, "{m:?}");
    let m = c
        .publish_mandatory("", "no-such-queue", qq_client::message("m3"))
        .await?;
    assert_eq!(
        m.outcome,
        PublishOutcome::Unroutable,
        "default exchange to a missing queue: {m:?}"
    );

    info!("--- each queue holds exactly its messages");
    super::drain_set(&c, "rc", &["t2", "t4", "t5", "cc1"]).await?;
    super::drain_set(&c, "ra", &["d1", "f1", "t1", "h1", "cc1"]).await?;
    super::drain_set(
        &c,
        "rb",
        &["d2", "f1", "t1", "t2", "t3", "h1", "h2", "cc1", "m2"],
    )
    .await?;
    super::drain_set(&c, "rd", &["x1"]).await?;
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bcc_is_invisible_and_deliveries_carry_their_route() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(3).await?;
    c.declare_exchange("cc.direct", "direct").await?;
    for q in ["cc.a", "cc.b", "cc.c"] {
        c.declare_queue(q, Default::default()).await?;
        c.bind(q, "cc.direct", q, Default::default()).await?;
    }

    info!("--- one publish to cc.a with CC [cc.b] and BCC [cc.c]");
    let msg = MessageBuilder::new("hello")
        .header("CC", string_list(["cc.b"]))
        .header("BCC", string_list(["cc.c"]))
        .header("keep", Value::long(7))
        .build();
    assert_eq!(
        c.publish("cc.direct", "cc.a", msg).await?.outcome,
        PublishOutcome::Confirmed
    );

    for q in ["cc.a", "cc.b", "cc.c"] {
        let d = c
            .get(q, true, 0)
            .await?
            .delivery
            .unwrap_or_else(|| panic!("{q} got the message"));
        let headers = qq_client::delivery_headers(&d);
        assert_eq!(super::body(&d), "hello");
        assert_eq!(d.exchange, "cc.direct", "{q}: delivery names its exchange");
        assert_eq!(
            d.routing_key, "cc.a",
            "{q}: delivery carries the published routing key"
        );
        assert!(!d.redelivered, "{q}: first delivery");
        assert!(
            !headers.contains_key("BCC"),
            "{q}: BCC must be stripped, headers {headers:?}"
        );
        assert!(
            headers.contains_key("CC"),
            "{q}: CC stays visible, headers {headers:?}"
        );
        assert_eq!(
            headers.get("keep").and_then(|v| v.as_long()),
            Some(7),
            "{q}: other headers kept"
        );
        assert!(
            c.get(q, true, 0).await?.delivery.is_none(),
            "{q}: exactly one copy"
        );
    }
    cluster.stop();
    Ok(())
}

/// Alternate exchanges: a message its exchange routes nowhere goes to the exchange's
/// `alternate-exchange` (argument, else an exchange policy), along a chain that ends at a
/// cycle; a mandatory publish is returned only when the whole chain routes it nowhere. Naming
/// an alternate exchange needs write on it and read on the declared one, as RabbitMQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternate_exchanges_catch_what_is_not_routed() -> anyhow::Result<()> {
    use std::collections::HashMap;

    use qq_client::v1;
    use tonic::Code;

    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    let ae = |name: &str| -> HashMap<String, Value> {
        [("alternate-exchange".to_string(), Value::string(name))].into()
    };
    let declare = |name: &str, kind: &str, arguments: HashMap<String, Value>| {
        c.declare_exchange_with(v1::DeclareExchangeRequest {
            name: name.into(),
            r#type: kind.into(),
            durable: true,
            arguments,
            ..Default::default()
        })
    };
    declare("ae.main", "direct", ae("ae.catch")).await?;
    declare("ae.catch", "fanout", HashMap::new()).await?;
    declare("ae.loop1", "direct", ae("ae.loop2")).await?;
    declare("ae.loop2", "direct", ae("ae.loop1")).await?;
    for q in ["ae.routed", "ae.caught"] {
        c.declare_queue(q, HashMap::new()).await?;
    }
    c.bind("ae.routed", "ae.main", "k", HashMap::new()).await?;
    c.bind("ae.caught", "ae.catch", "", HashMap::new()).await?;

    info!("--- routed by the exchange, by its alternate, by a policy's alternate, by nobody");
    let m = |body: &str| MessageBuilder::new(body.to_string()).build();
    c.publish("ae.main", "k", m("routed")).await?;
    let caught = c
        .publish_mandatory("ae.main", "nobody-binds", m("caught"))
        .await?;
    assert_eq!(caught.outcome, PublishOutcome::Confirmed, "{caught:?}");
    let lost = c.publish_mandatory("ae.loop1", "x", m("lost")).await?;
    assert_eq!(
        lost.outcome,
        PublishOutcome::Unroutable,
        "a cycle ends: {lost:?}"
    );
    declare("ae.plain", "topic", HashMap::new()).await?;
    let policy = [("alternate-exchange".to_string(), Value::string("ae.catch"))].into();
    c.set_policy("ae", "^ae\\.plain$", "exchanges", 0, policy)
        .await?;
    c.publish("ae.plain", "a.b", m("by-policy")).await?;
    for (q, want) in [
        ("ae.routed", vec!["routed"]),
        ("ae.caught", vec!["caught", "by-policy"]),
    ] {
        let got = super::drain_exactly(&c, q, want.len()).await?;
        assert_eq!(got, want, "{q}");
    }

    info!("--- naming an alternate exchange needs write on it and read on the declared one");
    c.put_user("ae-user", "ae-user-pass", vec![]).await?;
    c.set_permissions("ae-user", "/", "^ae\\.", "^ae\\.own", "^ae\\.")
        .await?;
    let u = cluster
        .client(2)
        .await?
        .with_credentials("ae-user", "ae-user-pass")?;
    let refused = u
        .declare_exchange_with(v1::DeclareExchangeRequest {
            name: "ae.mine".into(),
            r#type: "direct".into(),
            durable: true,
            arguments: ae("ae.catch"),
            ..Default::default()
        })
        .await;
    super::assert_status(refused, Code::PermissionDenied, "write");
    u.declare_exchange_with(v1::DeclareExchangeRequest {
        name: "ae.mine".into(),
        r#type: "direct".into(),
        durable: true,
        arguments: ae("ae.own"),
        ..Default::default()
    })
    .await?;
    let not_a_name = c
        .declare_exchange_with(v1::DeclareExchangeRequest {
            name: "ae.bad".into(),
            r#type: "direct".into(),
            durable: true,
            arguments: [("alternate-exchange".to_string(), Value::long(1))].into(),
            ..Default::default()
        })
        .await;
    super::assert_status(not_a_name, Code::InvalidArgument, "alternate-exchange");
    cluster.stop();
    Ok(())
}
