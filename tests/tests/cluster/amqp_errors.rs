//! AMQP 0-9-1 refusals: soft errors close the channel with RabbitMQ's code and leave the
//! connection usable, hard ones close the connection, and a peer that does not speak the
//! protocol gets the answer the specification gives, while the node keeps serving.

use anyhow::{Context, bail, ensure};
use futures::StreamExt;
use lapin::BasicProperties;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use qq_tests::{TestCluster, info};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::amqp::{WAIT, connect, declare, durable, quorum, reply_code};

/// A passive queue.declare of `name`.
async fn passive(ch: &lapin::Channel, name: &str) -> Result<(), lapin::Error> {
    let options = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    ch.queue_declare(name.into(), options, FieldTable::default())
        .await
        .map(|_| ())
}

/// Soft errors close the channel and leave the connection usable; hard ones close the
/// connection; a bad protocol header gets ours back; garbage after the handshake is a frame
/// error; the node keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_errors_close_the_channel_or_the_connection() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let conn = connect(&cluster, 1).await?;
    let cases: Vec<(&str, u16)> = vec![
        ("passive declare of a missing queue", 404),
        ("non-durable quorum queue", 406),
        ("publish to a missing exchange", 404),
        ("inequivalent redeclare", 406),
        ("exclusive redeclare of an existing queue", 405),
        ("exclusive declare of a new queue", 406),
        ("unknown delivery tag", 406),
    ];
    let seed = conn.create_channel().await?;
    declare(&seed, "eq", {
        let mut a = quorum();
        a.insert("x-max-length".into(), AMQPValue::LongLongInt(10));
        a
    })
    .await?;
    for (what, want) in cases {
        let ch = conn.create_channel().await?;
        let err = match what {
            "passive declare of a missing queue" => passive(&ch, "nope").await,
            "non-durable quorum queue" => ch
                .queue_declare(
                    "transient".into(),
                    QueueDeclareOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map(|_| ()),
            "publish to a missing exchange" => {
                ch.confirm_select(ConfirmSelectOptions::default()).await?;
                match ch
                    .basic_publish(
                        "no-such-x".into(),
                        "k".into(),
                        BasicPublishOptions::default(),
                        b"x",
                        BasicProperties::default(),
                    )
                    .await
                {
                    Ok(confirm) => confirm.await.map(|_| ()),
                    Err(e) => Err(e),
                }
            }
            "exclusive redeclare of an existing queue" | "exclusive declare of a new queue" => {
                let options = QueueDeclareOptions {
                    exclusive: true,
                    ..durable()
                };
                let name = if what.contains("existing") {
                    "eq"
                } else {
                    "new-x"
                };
                ch.queue_declare(name.into(), options, FieldTable::default())
                    .await
                    .map(|_| ())
            }
            "inequivalent redeclare" => {
                let mut a = quorum();
                a.insert("x-max-length".into(), AMQPValue::LongLongInt(11));
                ch.queue_declare("eq".into(), durable(), a)
                    .await
                    .map(|_| ())
            }
            // The ack has no answer. The channel's close reaches its consumers with the
            // server's reply code, whenever it arrives (a later method could find the
            // channel already closing and carry no code).
            _ => {
                let mut watch = ch
                    .basic_consume(
                        "eq".into(),
                        "watch".into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await?;
                ch.basic_ack(99, BasicAckOptions::default()).await?;
                match tokio::time::timeout(WAIT, watch.next()).await? {
                    Some(Err(e)) => Err(e),
                    Some(Ok(d)) => bail!("{what}: a delivery instead of the close: {d:?}"),
                    None => bail!("{what}: the consumer ended without the close"),
                }
            }
        };
        let e = match err {
            Ok(()) => bail!("{what}: no error"),
            Err(e) => e,
        };
        ensure!(reply_code(&e) == Some(want), "{what}: {e} (wanted {want})");
        ensure!(
            conn.status().connected(),
            "{what}: the connection closed too"
        );
    }
    let ch = conn.create_channel().await?;
    declare(&ch, "still-fine", quorum()).await?;

    info!("--- a user without configure: passive declares answer (as RabbitMQ), others 403");
    let admin = cluster.client(1).await?;
    admin.put_user("noconf", "noconf", vec![]).await?;
    admin.set_permissions("noconf", "/", "", ".*", ".*").await?;
    let url = format!("amqp://noconf:noconf@{}/%2f", cluster.amqp_address(1));
    let limited = lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await?;
    let lch = limited.create_channel().await?;
    passive(&lch, "eq").await.context("passive queue.declare")?;
    let exchange = lapin::options::ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    lch.exchange_declare(
        "amq.direct".into(),
        lapin::ExchangeKind::Direct,
        exchange,
        FieldTable::default(),
    )
    .await
    .context("passive exchange.declare")?;
    let e = lch
        .queue_declare("noconf-new".into(), durable(), quorum())
        .await
        .err()
        .context("a declare without configure was accepted")?;
    ensure!(
        reply_code(&e) == Some(403),
        "declare without configure: {e}"
    );

    info!("--- global qos then consume: 540 NOT_IMPLEMENTED closes the connection");
    ch.basic_qos(5, BasicQosOptions { global: true }).await?;
    let e = ch
        .basic_consume(
            "still-fine".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .err()
        .context("global qos consume accepted")?;
    ensure!(reply_code(&e) == Some(540), "global qos: {e}");

    info!("--- raw socket: a wrong protocol header gets AMQP 0-9-1's back");
    let mut raw = tokio::net::TcpStream::connect(cluster.amqp_address(2)).await?;
    raw.write_all(b"AMQP\x00\x00\x08\x00").await?;
    let mut header = [0u8; 8];
    tokio::time::timeout(WAIT, raw.read_exact(&mut header)).await??;
    ensure!(&header == b"AMQP\x00\x00\x09\x01", "header {header:?}");

    info!("--- raw socket: garbage after the header is a frame error (501)");
    let mut raw = tokio::net::TcpStream::connect(cluster.amqp_address(2)).await?;
    raw.write_all(b"AMQP\x00\x00\x09\x01").await?;
    let mut start = vec![0u8; 4096];
    let n = tokio::time::timeout(WAIT, raw.read(&mut start)).await??;
    ensure!(n > 7 && start[0] == 1, "no connection.start");
    raw.write_all(&[0x41; 64]).await?;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, raw.read_to_end(&mut rest)).await;
    // connection.close (class 10, method 50) with reply code 501.
    ensure!(
        rest.len() > 13 && rest[7..11] == [0, 10, 0, 50],
        "no connection.close: {rest:?}"
    );
    ensure!(
        u16::from_be_bytes([rest[11], rest[12]]) == 501,
        "close code: {rest:?}"
    );

    let conn2 = connect(&cluster, 2).await?;
    let ch2 = conn2.create_channel().await?;
    declare(&ch2, "after-garbage", quorum()).await?;
    cluster.stop();
    Ok(())
}
