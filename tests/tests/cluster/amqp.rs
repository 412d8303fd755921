//! AMQP 0-9-1 with a real client (lapin, the Rust client RabbitMQ's users run): RabbitMQ's
//! tutorial flows against a three-node cluster, publisher confirms and returns, messages
//! crossing between AMQP and gRPC, dead letters read back with their `x-death`, a consumer
//! cancelled by a queue delete, channel and connection errors with RabbitMQ's codes, bad
//! frames on a raw socket, and a client that reconnects to another node after its node is
//! killed without losing a confirmed message.

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use qq_tests::{TestCluster, eventually, info};

pub(crate) const WAIT: Duration = Duration::from_secs(20);

pub(crate) async fn connect(cluster: &TestCluster, node: u64) -> anyhow::Result<Connection> {
    Connection::connect(&cluster.amqp_url(node), ConnectionProperties::default())
        .await
        .with_context(|| format!("amqp connect to node {node}"))
}

pub(crate) fn quorum() -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    t
}

pub(crate) fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

pub(crate) async fn declare(ch: &Channel, name: &str, args: FieldTable) -> anyhow::Result<()> {
    ch.queue_declare(name.into(), durable(), args).await?;
    Ok(())
}

/// Publish with confirms on `ch` (in confirm mode) and wait for the ack.
async fn publish(ch: &Channel, exchange: &str, key: &str, body: &[u8]) -> anyhow::Result<()> {
    let confirm = ch
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?
        .await?;
    ensure!(
        confirm.is_ack(),
        "publish to {exchange}/{key} not acked: {confirm:?}"
    );
    Ok(())
}

async fn get_body(ch: &Channel, queue: &str) -> anyhow::Result<Option<Vec<u8>>> {
    let got = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await?;
    Ok(got.map(|m| m.delivery.data))
}

/// The reply code of a lapin error that came from the broker.
pub(crate) fn reply_code(e: &lapin::Error) -> Option<u16> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => Some(amqp.get_id()),
        _ => None,
    }
}

/// Tutorials 1-5 (hello world, work queues, publish/subscribe, routing, topics), confirms,
/// a mandatory return, every basic property carried, and messages crossing protocols.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_tutorials_confirms_and_cross_protocol() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let conn1 = connect(&cluster, 1).await?;
    let conn2 = connect(&cluster, 2).await?;
    let ch = conn1.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let ch2 = conn2.create_channel().await?;
    let c = Clients {
        cluster: &cluster,
        conn1: &conn1,
        ch: &ch,
        ch2: &ch2,
    };
    hello_world(&c).await?;
    fire_and_forget_then_close(&c).await?;
    work_queue(&c).await?;
    publish_subscribe(&c).await?;
    routing_and_topics(&c).await?;
    mandatory_return(&c).await?;
    properties_across_protocols(&c).await?;
    get_returns_when_its_channel_closes(&c).await?;
    conn1.close(200, "bye".into()).await?;
    conn2.close(200, "bye".into()).await?;
    cluster.stop();
    Ok(())
}

/// What the tutorial stories share: node 1's connection with a confirm-mode channel, and a
/// channel on node 2.
struct Clients<'a> {
    cluster: &'a TestCluster,
    conn1: &'a Connection,
    ch: &'a Channel,
    ch2: &'a Channel,
}

async fn hello_world(c: &Clients<'_>) -> anyhow::Result<()> {
    let Clients { ch, ch2, .. } = c;
    info!("--- tutorial 1: hello world (published on node 1, consumed on node 2)");
    declare(&ch, "hello", quorum()).await?;
    publish(&ch, "", "hello", b"Hello World!").await?;
    let mut consumer = ch2
        .basic_consume(
            "hello".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let d = tokio::time::timeout(WAIT, consumer.next())
        .await
        .context("hello: no delivery")?
        .context("hello: consumer ended")??;
    ensure!(d.data == b"Hello World!" && !d.redelivered, "hello: {d:?}");
    d.acker.ack(BasicAckOptions::default()).await?;
    Ok(())
}

async fn fire_and_forget_then_close(c: &Clients<'_>) -> anyhow::Result<()> {
    let Clients { cluster, ch, .. } = c;
    info!("--- publishes without confirms, then close at once: every one is still stored");
    declare(&ch, "fire", quorum()).await?;
    let quick = connect(&cluster, 3).await?;
    let qch = quick.create_channel().await?;
    for i in 0..20 {
        qch.basic_publish(
            "".into(),
            "fire".into(),
            BasicPublishOptions::default(),
            format!("fire {i}").as_bytes(),
            BasicProperties::default(),
        )
        .await?;
    }
    quick.close(200, "bye".into()).await?;
    for i in 0..20 {
        let got = get_body(&ch, "fire").await?;
        ensure!(
            got == Some(format!("fire {i}").into_bytes()),
            "fire-and-forget {i}: {got:?}"
        );
    }
    Ok(())
}

async fn work_queue(c: &Clients<'_>) -> anyhow::Result<()> {
    let Clients { conn1, ch, ch2, .. } = c;
    info!("--- tutorial 2: work queue, prefetch 1, manual acks, 50 tasks on two workers");
    declare(&ch, "task_queue", quorum()).await?;
    for i in 0..50 {
        publish(&ch, "", "task_queue", format!("task {i}").as_bytes()).await?;
    }
    let mut seen = std::collections::BTreeSet::new();
    let w1 = conn1.create_channel().await?;
    w1.basic_qos(1, BasicQosOptions::default()).await?;
    let mut c1 = w1
        .basic_consume(
            "task_queue".into(),
            "w1".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    ch2.basic_qos(1, BasicQosOptions::default()).await?;
    let mut c2 = ch2
        .basic_consume(
            "task_queue".into(),
            "w2".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while seen.len() < 50 {
        let d = tokio::select! {
            d = c1.next() => d,
            d = c2.next() => d,
            _ = tokio::time::sleep(WAIT) => bail!("work queue: {} of 50 tasks after {WAIT:?}", seen.len()),
        }
        .context("work queue: consumer ended")??;
        seen.insert(String::from_utf8(d.data.clone())?);
        d.acker.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

async fn publish_subscribe(c: &Clients<'_>) -> anyhow::Result<()> {
    let Clients { ch, .. } = c;
    info!("--- tutorial 3: publish/subscribe on a fanout exchange");
    ch.exchange_declare(
        "logs".into(),
        ExchangeKind::Fanout,
        ExchangeDeclareOptions::default(),
        FieldTable::default(),
    )
    .await?;
    for q in ["logs-a", "logs-b"] {
        declare(&ch, q, quorum()).await?;
        ch.queue_bind(
            q.into(),
            "logs".into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    }
    publish(&ch, "logs", "", b"info: hello").await?;
    for q in ["logs-a", "logs-b"] {
        ensure!(
            get_body(&ch, q).await?.as_deref() == Some(&b"info: hello"[..]),
            "fanout to {q}"
        );
    }
    Ok(())
}

async fn routing_and_topics(c: &Clients<'_>) -> anyhow::Result<()> {
    let Clients { ch, .. } = c;
    info!("--- tutorials 4 and 5: routing (direct) and topics");
    ch.exchange_declare(
        "direct_logs".into(),
        ExchangeKind::Direct,
        ExchangeDeclareOptions::default(),
        FieldTable::default(),
    )
    .await?;
    declare(&ch, "errors-only", quorum()).await?;
    ch.queue_bind(
        "errors-only".into(),
        "direct_logs".into(),
        "error".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    publish(&ch, "direct_logs", "info", b"not for errors-only").await?;
    publish(&ch, "direct_logs", "error", b"disk full").await?;
    ensure!(get_body(&ch, "errors-only").await?.as_deref() == Some(&b"disk full"[..]));
    ensure!(
        get_body(&ch, "errors-only").await?.is_none(),
        "direct routed 'info'"
    );
    ch.exchange_declare(
        "topic_logs".into(),
        ExchangeKind::Topic,
        ExchangeDeclareOptions::default(),
        FieldTable::default(),
    )
    .await?;
    declare(&ch, "kern-all", quorum()).await?;
    ch.queue_bind(
        "kern-all".into(),
        "topic_logs".into(),
        "kern.#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    publish(
        &ch,
        "topic_logs",
        "kern.critical",
        b"A critical kernel error",
    )
    .await?;
    publish(&ch, "topic_logs", "user.info", b"unrelated").await?;
    ensure!(get_body(&ch, "kern-all").await?.as_deref() == Some(&b"A critical kernel error"[..]));
    ensure!(
        get_body(&ch, "kern-all").await?.is_none(),
        "topic routed 'user.info'"
    );
    Ok(())
}

async fn mandatory_return(c: &Clients<'_>) -> anyhow::Result<()> {
    let Clients { ch, .. } = c;
    info!("--- mandatory unroutable: returned with 312 NO_ROUTE, then acked");
    let confirm = ch
        .basic_publish(
            "direct_logs".into(),
            "nobody".into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            b"lost?",
            BasicProperties::default(),
        )
        .await?
        .await?;
    let returned = confirm
        .take_message()
        .context("mandatory unroutable: nothing returned")?;
    ensure!(
        returned.reply_code == 312,
        "return code {}",
        returned.reply_code
    );
    ensure!(returned.delivery.data == b"lost?");
    Ok(())
}

async fn properties_across_protocols(c: &Clients<'_>) -> anyhow::Result<()> {
    let Clients {
        cluster, ch, ch2, ..
    } = c;
    info!("--- every basic property and header type, AMQP → gRPC and gRPC → AMQP");
    declare(&ch, "props", quorum()).await?;
    let mut headers = FieldTable::default();
    headers.insert("s".into(), AMQPValue::LongString(LongString::from("text")));
    headers.insert("n".into(), AMQPValue::LongLongInt(-42));
    headers.insert("b".into(), AMQPValue::Boolean(true));
    headers.insert("d".into(), AMQPValue::Double(1.5));
    headers.insert("t".into(), AMQPValue::Timestamp(1_700_000_000));
    headers.insert("x".into(), AMQPValue::ByteArray(vec![0, 255].into()));
    headers.insert(
        "a".into(),
        AMQPValue::FieldArray(vec![AMQPValue::LongLongInt(1)].into()),
    );
    let props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_content_encoding("identity".into())
        .with_headers(headers.clone())
        .with_delivery_mode(2)
        .with_priority(3)
        .with_correlation_id("corr".into())
        .with_reply_to("replies".into())
        .with_expiration("600000".into())
        .with_message_id("m-1".into())
        .with_timestamp(1_700_000_001)
        .with_type("order".into())
        .with_user_id("guest".into())
        .with_app_id("tests".into());
    let c = ch
        .basic_publish(
            "".into(),
            "props".into(),
            BasicPublishOptions::default(),
            b"{}",
            props.clone(),
        )
        .await?
        .await?;
    ensure!(c.is_ack());
    let got = ch
        .basic_get("props".into(), BasicGetOptions { no_ack: true })
        .await?
        .context("props: nothing to get")?;
    // basic.get adds x-delivery-count 0, as RabbitMQ's quorum queues do.
    let mut with_count = headers.clone();
    with_count.insert("x-delivery-count".into(), AMQPValue::LongLongInt(0));
    ensure!(
        got.delivery.properties == props.clone().with_headers(with_count),
        "properties changed: {:?}",
        got.delivery.properties
    );
    let grpc = cluster.client(3).await?;
    grpc.publish("", "props", qq_client::message("from gRPC"))
        .await?;
    ensure!(
        get_body(&ch2, "props").await?.as_deref() == Some(&b"from gRPC"[..]),
        "gRPC → AMQP"
    );
    publish(&ch, "", "props", b"from AMQP").await?;
    let r = grpc.get("props", true, 0).await?;
    let body = r.delivery.and_then(|d| d.message).map(|m| m.body.to_vec());
    ensure!(
        body.as_deref() == Some(&b"from AMQP"[..]),
        "AMQP → gRPC: {body:?}"
    );
    Ok(())
}

async fn get_returns_when_its_channel_closes(c: &Clients<'_>) -> anyhow::Result<()> {
    let Clients { conn1, ch, .. } = c;
    info!("--- an unacked basic.get returns to the queue when its channel closes");
    declare(&ch, "held", quorum()).await?;
    publish(&ch, "", "held", b"held once").await?;
    let gch = conn1.create_channel().await?;
    let held = gch
        .basic_get("held".into(), BasicGetOptions { no_ack: false })
        .await?
        .context("held: nothing to get")?;
    ensure!(!held.delivery.redelivered);
    gch.close(200, "done".into()).await?;
    let again = ch
        .basic_get("held".into(), BasicGetOptions { no_ack: true })
        .await?
        .context("the unacked get did not return to the queue when its channel closed")?;
    ensure!(again.delivery.data == b"held once" && again.delivery.redelivered);
    Ok(())
}

/// A rejected message's dead letter carries RabbitMQ's `x-death`; a queue deleted under its
/// consumer cancels it with basic.cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_dead_letters_and_cancel_on_delete() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let conn = connect(&cluster, 2).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    declare(&ch, "dlq", quorum()).await?;
    let mut args = quorum();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString("dlq".into()),
    );
    declare(&ch, "work", args).await?;
    publish(&ch, "", "work", b"poison").await?;
    let got = ch
        .basic_get("work".into(), BasicGetOptions { no_ack: false })
        .await?
        .context("work: nothing to get")?;
    ch.basic_reject(
        got.delivery.delivery_tag,
        BasicRejectOptions { requeue: false },
    )
    .await?;
    let dead = eventually("the dead letter in dlq", WAIT, || async {
        Ok(ch
            .basic_get("dlq".into(), BasicGetOptions { no_ack: true })
            .await?)
    })
    .await?;
    ensure!(dead.delivery.data == b"poison");
    let headers = dead
        .delivery
        .properties
        .headers()
        .clone()
        .context("no headers")?;
    let h = headers.inner();
    let Some(AMQPValue::FieldArray(deaths)) = h.get("x-death") else {
        bail!("x-death is not an array: {h:?}");
    };
    let [AMQPValue::FieldTable(death)] = deaths.as_slice() else {
        bail!("x-death has {} entries", deaths.as_slice().len());
    };
    let d = death.inner();
    let text = |k: &str| match d.get(k) {
        Some(AMQPValue::LongString(s)) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => None,
    };
    ensure!(
        matches!(d.get("count"), Some(AMQPValue::LongLongInt(1))),
        "count: {:?}",
        d.get("count")
    );
    ensure!(
        text("reason").as_deref() == Some("rejected"),
        "reason: {:?}",
        d.get("reason")
    );
    ensure!(text("queue").as_deref() == Some("work"));
    ensure!(text("exchange").as_deref() == Some(""));
    ensure!(
        matches!(d.get("time"), Some(AMQPValue::Timestamp(_))),
        "time: {:?}",
        d.get("time")
    );
    let Some(AMQPValue::FieldArray(keys)) = d.get("routing-keys") else {
        bail!("routing-keys: {:?}", d.get("routing-keys"));
    };
    ensure!(
        keys.as_slice() == [AMQPValue::LongString("work".into())],
        "routing-keys {keys:?}"
    );
    for (k, v) in [
        ("x-first-death-reason", "rejected"),
        ("x-first-death-queue", "work"),
        ("x-first-death-exchange", ""),
    ] {
        let got = match h.get(k) {
            Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            other => bail!("{k}: {other:?}"),
        };
        ensure!(got == v, "{k}: {got}");
    }

    info!("--- a queue deleted under its consumer cancels it");
    declare(&ch, "doomed", quorum()).await?;
    let cch = conn.create_channel().await?;
    let mut consumer = cch
        .basic_consume(
            "doomed".into(),
            "watcher".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let other = connect(&cluster, 3).await?;
    let och = other.create_channel().await?;
    och.queue_delete("doomed".into(), QueueDeleteOptions::default())
        .await?;
    let end = tokio::time::timeout(WAIT, consumer.next())
        .await
        .context("consumer not cancelled after its queue was deleted")?;
    ensure!(end.is_none(), "expected the consumer to end, got {end:?}");
    ensure!(
        cch.status().connected(),
        "the channel stays open after a server cancel"
    );
    conn.close(200, "bye".into()).await?;
    other.close(200, "bye".into()).await?;
    cluster.stop();
    Ok(())
}

/// A client publishing with confirms to node 1 reconnects to node 2 after node 1 is killed:
/// every confirmed message is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_client_reconnects_after_its_node_is_killed() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start(3).await?;
    let conn = connect(&cluster, 1).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    declare(&ch, "survives", quorum()).await?;
    for i in 0..200 {
        publish(&ch, "", "survives", format!("m{i}").as_bytes()).await?;
    }
    cluster.kill9(1);
    // Drain from node 2 as a client does: a refusal while the queue fails over closes the
    // connection (541), and the client connects again.
    let mut bodies = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    'drain: while tokio::time::Instant::now() < deadline {
        let Ok(conn2) = connect(&cluster, 2).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let ch2 = conn2.create_channel().await?;
        loop {
            match ch2
                .basic_get("survives".into(), BasicGetOptions { no_ack: true })
                .await
            {
                Ok(Some(m)) => {
                    bodies.insert(String::from_utf8(m.delivery.data)?);
                }
                Ok(None) => break 'drain,
                Err(e) => {
                    info!("get on node 2 refused ({e}); reconnecting");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue 'drain;
                }
            }
        }
    }
    for i in 0..200 {
        ensure!(
            bodies.contains(&format!("m{i}")),
            "confirmed m{i} lost ({} found)",
            bodies.len()
        );
    }
    cluster.stop();
    Ok(())
}

/// pika, the Python client, runs RabbitMQ's tutorials 1-5, confirms, dead letters, redelivery
/// counts and a server cancel against the cluster (`tests/amqp/clients.py`, whose checks were
/// written against RabbitMQ 3.10 and pass there). pika is installed by the script's own
/// set-up when missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_pika_clients_pass() -> anyhow::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("amqp");
    let setup = tokio::process::Command::new("bash")
        .arg(dir.join("setup.sh"))
        .status()
        .await
        .context("run tests/amqp/setup.sh")?;
    ensure!(
        setup.success(),
        "tests/amqp/setup.sh failed (pika not installed)"
    );
    let cluster = TestCluster::start(3).await?;
    let run = tokio::process::Command::new("python3")
        .arg(dir.join("clients.py"))
        .arg(cluster.amqp_url(1))
        .arg(cluster.amqp_url(2))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .context("clients.py did not finish in 300 s")??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    info!(
        "clients.py:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(out.status.success(), "pika checks failed:\n{stdout}");
    cluster.stop();
    Ok(())
}
