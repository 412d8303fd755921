//! Metadata machine version 2 on a real cluster (a fresh cluster moves there by itself:
//! `TestCluster::start` waits for `quorumq_metadata_machine_version 2` on every node):
//! exchange-to-exchange bindings route over gRPC and over AMQP (lapin's `exchange_bind`),
//! across a cycle, and show in `ListBindings`; and an operator policy caps a queue whose own
//! argument asks for more, until it is cleared.

use std::time::Duration;

use lapin::options::{ExchangeBindOptions, ExchangeDeclareOptions, ExchangeUnbindOptions};
use lapin::types::FieldTable;
use qq_client::{Client, PublishOutcome, Value, ValueExt, message, table};
use qq_tests::{TestCluster, eventually, info};

use super::amqp::connect;

/// The queues a publish to `exchange` with `key` lands in, by their message counts (each
/// queue is drained after the check).
async fn landed(
    c: &Client,
    exchange: &str,
    key: &str,
    queues: &[&str],
) -> anyhow::Result<Vec<String>> {
    let r = c.publish(exchange, key, message("m")).await?;
    let mut hit = Vec::new();
    if r.outcome != PublishOutcome::Confirmed {
        return Ok(hit);
    }
    for q in queues {
        let n = c.get_queue(q).await?.messages;
        if n > 0 {
            hit.push(q.to_string());
            super::drain_exactly(c, q, n as usize).await?;
        }
    }
    Ok(hit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchange_bindings_route_over_grpc_and_amqp() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    let none = Default::default;

    info!("--- orders (topic) -> audit (fanout) -> q.audit; orders -> q.eu directly");
    c.declare_exchange("orders", "topic").await?;
    c.declare_exchange("audit", "fanout").await?;
    for q in ["q.eu", "q.audit"] {
        c.declare_queue(q, Default::default()).await?;
    }
    c.bind("q.eu", "orders", "eu.#", none()).await?;
    c.bind("q.audit", "audit", "", none()).await?;
    c.bind_exchange("audit", "orders", "#.new", none()).await?;
    let queues = ["q.eu", "q.audit"];
    assert_eq!(landed(&c, "orders", "eu.fr.new", &queues).await?, queues);
    assert_eq!(landed(&c, "orders", "eu.fr", &queues).await?, ["q.eu"]);
    assert_eq!(landed(&c, "orders", "us.new", &queues).await?, ["q.audit"]);

    info!("--- a cycle back to orders ends: each exchange is visited once");
    c.bind_exchange("orders", "audit", "", none()).await?;
    assert_eq!(landed(&c, "audit", "eu.x", &queues).await?, queues);

    let bindings = c.list_bindings().await?;
    let e2e: Vec<(String, String)> = bindings
        .iter()
        .filter(|b| b.destination_kind == "exchange")
        .map(|b| (b.exchange.clone(), b.destination.clone()))
        .collect();
    assert_eq!(
        e2e,
        [
            ("audit".to_string(), "orders".to_string()),
            ("orders".to_string(), "audit".to_string())
        ],
        "{bindings:?}"
    );
    let e = c
        .bind_exchange("audit", "missing", "", none())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");

    info!("--- AMQP: exchange.bind and exchange.unbind from lapin, seen over gRPC");
    let conn = connect(&cluster, 2).await?;
    let ch = conn.create_channel().await?;
    ch.exchange_declare(
        "amqp.src".into(),
        lapin::ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await?;
    ch.exchange_bind(
        "audit".into(),
        "amqp.src".into(),
        "k".into(),
        ExchangeBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    // audit passes key "k" on to orders too, whose eu.# does not match it.
    assert_eq!(landed(&c, "amqp.src", "k", &queues).await?, ["q.audit"]);
    ch.exchange_unbind(
        "audit".into(),
        "amqp.src".into(),
        "k".into(),
        ExchangeUnbindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    assert!(landed(&c, "amqp.src", "k", &queues).await?.is_empty());
    // A missing source is 404 on the channel, as RabbitMQ.
    let e = ch
        .exchange_bind(
            "audit".into(),
            "nowhere".into(),
            "".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(super::amqp::reply_code(&e), Some(404), "{e}");
    conn.close(200, "bye".into()).await?;
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_policy_caps_a_queue_over_its_own_argument() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(2).await?;
    c.declare_queue("capped", table([("x-max-length", Value::long(100))]))
        .await?;
    for i in 0..10 {
        let r = c.publish("", "capped", message(format!("m{i}"))).await?;
        assert_eq!(r.outcome, PublishOutcome::Confirmed, "{r:?}");
    }

    info!("--- operator policy max-length 3: stricter than the queue's 100, so it wins");
    c.set_operator_policy(
        "ops-cap",
        "^capped$",
        "queues",
        0,
        table([("max-length", Value::long(3))]),
    )
    .await?;
    let listed = c.list_operator_policies().await?;
    assert!(listed.iter().any(|p| p.name == "ops-cap"), "{listed:?}");
    let q = eventually(
        "the queue trimmed to 3",
        Duration::from_secs(20),
        || async {
            let q = c.get_queue("capped").await?;
            Ok((q.messages == 3).then_some(q))
        },
    )
    .await?;
    assert_eq!(q.operator_policy, "ops-cap", "{q:?}");
    assert_eq!(q.effective.and_then(|e| e.max_length), Some(3));

    info!("--- a key an operator policy does not have is refused, naming it");
    let e = c
        .set_operator_policy(
            "bad",
            ".*",
            "queues",
            0,
            table([("dead-letter-exchange", Value::string("x"))]),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.to_string().contains("'dead-letter-exchange'"), "{e}");

    info!("--- cleared: the queue's own 100 again");
    c.clear_operator_policy("ops-cap").await?;
    eventually("the limit back to 100", Duration::from_secs(20), || async {
        let q = c.get_queue("capped").await?;
        let max = q.effective.and_then(|e| e.max_length);
        Ok((max == Some(100) && q.operator_policy.is_empty()).then_some(()))
    })
    .await?;
    cluster.stop();
    Ok(())
}
