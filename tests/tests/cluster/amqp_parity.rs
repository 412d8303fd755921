//! AMQP 0-9-1 answers that follow RabbitMQ 3.10 where the differential test
//! (`tests/amqp/diff.py`, `make amqp-diff`) once found quorumq different: an exchange redeclare
//! with another `alternate-exchange` (406), basic.qos with a non-zero `prefetch_size` (540 on
//! the connection), and an unknown SASL mechanism or an undecodable PLAIN response (the
//! socket closes without a connection.close). lapin cannot send the last three, so they go
//! over a raw socket with hand-made frames.

use std::time::Duration;

use super::amqp::{WAIT, connect, reply_code};
use super::amqp_raw::{Raw, qos, shortstr};
use anyhow::{Context, bail, ensure};
use lapin::options::ExchangeDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ExchangeKind};
use qq_tests::{TestCluster, info};

/// A durable direct exchange.declare of `name` with `alternate-exchange` set to `ae` (none
/// for `None`), on a fresh channel of `conn`.
async fn declare_with_ae(
    conn: &Connection,
    name: &str,
    ae: Option<&str>,
) -> Result<(), lapin::Error> {
    let ch = conn.create_channel().await?;
    let mut args = FieldTable::default();
    if let Some(ae) = ae {
        args.insert(
            "alternate-exchange".into(),
            AMQPValue::LongString(ae.into()),
        );
    }
    let options = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.exchange_declare(name.into(), ExchangeKind::Direct, options, args)
        .await
}

/// An exchange redeclare is compared on `alternate-exchange` as RabbitMQ's
/// `rabbit_exchange:assert_args_equivalence` does: a different value, or one present on one
/// side only, is 406 on the channel; the same value is equivalent. basic.qos with a
/// non-zero `prefetch_size` closes the connection with 540. An unknown SASL mechanism and an
/// undecodable PLAIN response close the socket without a connection.close, even for a client
/// with the `authentication_failure_close` capability (a wrong password still gets 403).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_answers_as_rabbitmq_3_10() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let conn = connect(&cluster, 1).await?;

    info!("--- exchange redeclare: alternate-exchange is compared");
    declare_with_ae(&conn, "plain-x", None).await?;
    declare_with_ae(&conn, "ae-x", Some("one")).await?;
    declare_with_ae(&conn, "ae-x", Some("one"))
        .await
        .context("an equivalent redeclare with the same alternate-exchange")?;
    declare_with_ae(&conn, "plain-x", None)
        .await
        .context("an equivalent redeclare without arguments")?;
    for (what, name, ae) in [
        ("an added alternate-exchange", "plain-x", Some("elsewhere")),
        ("another alternate-exchange", "ae-x", Some("two")),
        ("a removed alternate-exchange", "ae-x", None),
    ] {
        let e = match declare_with_ae(&conn, name, ae).await {
            Ok(()) => bail!("{what}: the redeclare was accepted"),
            Err(e) => e,
        };
        ensure!(reply_code(&e) == Some(406), "{what}: {e} (wanted 406)");
        ensure!(
            e.to_string()
                .contains("inequivalent arg 'alternate-exchange'"),
            "{what}: {e}"
        );
        ensure!(conn.status().connected(), "{what}: the connection closed");
    }

    let address = cluster.amqp_address(2);
    info!("--- basic.qos: prefetch_size 0 is fine, prefetch_size 1000 is 540");
    let mut raw = Raw::open(address).await?;
    raw.send_method(1, 20, 10, &shortstr(""), "channel.open")
        .await?;
    raw.expect_method(1, (20, 11), "channel.open-ok").await?;
    raw.send_method(1, 60, 10, &qos(0, 10), "basic.qos").await?;
    raw.expect_method(1, (60, 11), "basic.qos-ok").await?;
    raw.send_method(1, 60, 10, &qos(1000, 10), "basic.qos")
        .await?;
    let close = raw.expect_method(0, (10, 50), "connection.close").await?;
    let (code, text, class_method) = close_fields(&close)?;
    ensure!(code == 540, "prefetch_size: code {code} ({text})");
    ensure!(
        text == "NOT_IMPLEMENTED - prefetch_size!=0 (1000)",
        "prefetch_size: text {text:?}"
    );
    ensure!(class_method == (60, 10), "prefetch_size: {class_method:?}");

    info!("--- SASL: a wrong password is 403; an unknown mechanism and bad PLAIN drop the socket");
    info!("    (a silent refusal closes the socket 3 s after it, RabbitMQ's SILENT_CLOSE_DELAY)");
    let mut raw = Raw::connect(address).await?;
    raw.start_ok("PLAIN", b"\0guest\0wrong").await?;
    let close = raw.expect_method(0, (10, 50), "connection.close").await?;
    ensure!(close_fields(&close)?.0 == 403, "wrong password: {close:?}");
    // close-ok: the socket closes (as RabbitMQ 3.10, without its silent delay).
    raw.send_method(0, 10, 51, &[], "connection.close-ok")
        .await?;
    ensure!(
        raw.read_frame().await?.is_none(),
        "wrong password: a frame after connection.close"
    );
    for (what, mechanism, response) in [
        ("unknown mechanism", "X-UNKNOWN", &b"\0guest\0guest"[..]),
        ("EXTERNAL without a certificate", "EXTERNAL", &b""[..]),
        ("malformed PLAIN response", "PLAIN", &b"garbage"[..]),
        ("malformed AMQPLAIN response", "AMQPLAIN", &b"garbage"[..]),
    ] {
        let mut raw = Raw::connect(address).await?;
        let sent = std::time::Instant::now();
        raw.start_ok(mechanism, response).await?;
        match raw.read_frame().await? {
            None => {}
            Some(frame) => bail!("{what}: a frame instead of the socket closing: {frame:?}"),
        }
        ensure!(
            sent.elapsed() >= Duration::from_secs(3),
            "{what}: the socket closed {:?} after start-ok, before RabbitMQ's 3 s",
            sent.elapsed()
        );
    }

    let after = connect(&cluster, 2).await?;
    after.create_channel().await?;
    cluster.stop();
    Ok(())
}

/// connection.close's reply code, reply text and class and method ids.
fn close_fields(args: &[u8]) -> anyhow::Result<(u16, String, (u16, u16))> {
    let bad = || anyhow::anyhow!("connection.close does not decode: {args:?}");
    let code = u16::from_be_bytes(args.get(..2).ok_or_else(bad)?.try_into()?);
    let len = *args.get(2).ok_or_else(bad)? as usize;
    let text = String::from_utf8(args.get(3..3 + len).ok_or_else(bad)?.to_vec())?;
    let ids = args.get(3 + len..7 + len).ok_or_else(bad)?;
    let class_method = (
        u16::from_be_bytes([ids[0], ids[1]]),
        u16::from_be_bytes([ids[2], ids[3]]),
    );
    Ok((code, text, class_method))
}

/// basic.cancel-ok comes once the consumer has left the queue, as RabbitMQ's: a message
/// published after it never goes to the cancelled consumer (it would come back redelivered,
/// with a delivery counted). Twenty rounds, on a node that does not lead the queue and on one
/// that does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_after_cancel_ok_is_fresh() -> anyhow::Result<()> {
    use lapin::BasicProperties;
    use lapin::options::{
        BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions,
        ConfirmSelectOptions,
    };

    let cluster = TestCluster::start(3).await?;
    for node in [1, 2] {
        let conn = connect(&cluster, node).await?;
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        let queue = format!("after-cancel-{node}");
        super::amqp::declare(&ch, &queue, super::amqp::quorum()).await?;
        for round in 0..20 {
            let tag = format!("c{round}");
            let _consumer = ch
                .basic_consume(
                    queue.as_str().into(),
                    tag.as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            ch.basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
                .await?;
            let body = format!("m{round}");
            ch.basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default(),
            )
            .await?
            .await?;
            let got = tokio::time::timeout(
                WAIT,
                ch.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true }),
            )
            .await??
            .with_context(|| format!("node {node} round {round}: the queue is empty"))?;
            let count = got
                .delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("x-delivery-count").cloned());
            ensure!(
                got.delivery.data == body.as_bytes()
                    && !got.delivery.redelivered
                    && matches!(count, None | Some(AMQPValue::LongLongInt(0))),
                "node {node} round {round}: {body} came back redelivered {} with \
                 x-delivery-count {count:?}",
                got.delivery.redelivered
            );
        }
    }
    cluster.stop();
    Ok(())
}
