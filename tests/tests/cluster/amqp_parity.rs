//! AMQP 0-9-1 answers that follow RabbitMQ 3.10 where the differential test
//! (`tests/amqp/diff.py`, `make amqp-diff`) once found quorumq different: an exchange redeclare
//! with another `alternate-exchange` (406), basic.qos with a non-zero `prefetch_size` (540 on
//! the connection), and an unknown SASL mechanism or an undecodable PLAIN response (the
//! socket closes without a connection.close). lapin cannot send the last three, so they go
//! over a raw socket with hand-made frames.

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use lapin::options::ExchangeDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ExchangeKind};
use qq_tests::{TestCluster, info};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::amqp::{WAIT, connect, reply_code};

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

/// The arguments of basic.qos.
fn qos(prefetch_size: u32, prefetch_count: u16) -> Vec<u8> {
    let mut a = prefetch_size.to_be_bytes().to_vec();
    a.extend_from_slice(&prefetch_count.to_be_bytes());
    a.push(0); // global: false
    a
}

fn shortstr(s: &str) -> Vec<u8> {
    let mut out = vec![s.len() as u8];
    out.extend_from_slice(s.as_bytes());
    out
}

fn longstr(b: &[u8]) -> Vec<u8> {
    let mut out = (b.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(b);
    out
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

/// A client that writes frames by hand: for what lapin will not send.
struct Raw {
    io: TcpStream,
}

impl Raw {
    /// Connected, protocol header sent, connection.start read.
    async fn connect(address: &str) -> anyhow::Result<Raw> {
        let mut raw = Raw {
            io: TcpStream::connect(address).await?,
        };
        raw.io.write_all(b"AMQP\x00\x00\x09\x01").await?;
        raw.expect_method(0, (10, 10), "connection.start").await?;
        Ok(raw)
    }

    /// Logged in as guest, tuned with the server's limits and opened on vhost `/`.
    async fn open(address: &str) -> anyhow::Result<Raw> {
        let mut raw = Raw::connect(address).await?;
        raw.start_ok("PLAIN", b"\0guest\0guest").await?;
        let tune = raw.expect_method(0, (10, 30), "connection.tune").await?;
        // tune-ok: the server's channel_max and frame_max, no heartbeat.
        let mut tune_ok = tune.get(..6).context("short connection.tune")?.to_vec();
        tune_ok.extend_from_slice(&0u16.to_be_bytes());
        raw.send_method(0, 10, 31, &tune_ok, "connection.tune-ok")
            .await?;
        let mut open = shortstr("/");
        open.extend_from_slice(&shortstr(""));
        open.push(0);
        raw.send_method(0, 10, 40, &open, "connection.open").await?;
        raw.expect_method(0, (10, 41), "connection.open-ok").await?;
        Ok(raw)
    }

    /// connection.start-ok with `mechanism` and `response`, from a client with the
    /// `authentication_failure_close` capability.
    async fn start_ok(&mut self, mechanism: &str, response: &[u8]) -> anyhow::Result<()> {
        let mut caps = shortstr("authentication_failure_close");
        caps.extend_from_slice(&[b't', 1]);
        let mut props = shortstr("capabilities");
        props.push(b'F');
        props.extend_from_slice(&longstr(&caps));
        let mut args = longstr(&props);
        args.extend_from_slice(&shortstr(mechanism));
        args.extend_from_slice(&longstr(response));
        args.extend_from_slice(&shortstr("en_US"));
        self.send_method(0, 10, 11, &args, "connection.start-ok")
            .await
    }

    async fn send_method(
        &mut self,
        channel: u16,
        class: u16,
        method: u16,
        args: &[u8],
        what: &str,
    ) -> anyhow::Result<()> {
        let mut payload = class.to_be_bytes().to_vec();
        payload.extend_from_slice(&method.to_be_bytes());
        payload.extend_from_slice(args);
        let mut frame = vec![1];
        frame.extend_from_slice(&channel.to_be_bytes());
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        frame.extend_from_slice(&payload);
        frame.push(0xCE);
        self.io
            .write_all(&frame)
            .await
            .with_context(|| format!("sending {what}"))
    }

    /// The next frame (type, channel, payload); `None` when the socket closes first.
    async fn read_frame(&mut self) -> anyhow::Result<Option<(u8, u16, Vec<u8>)>> {
        let read = async {
            let mut header = [0u8; 7];
            match self.io.read_exact(&mut header).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]) as usize;
            let mut payload = vec![0u8; size + 1];
            self.io.read_exact(&mut payload).await?;
            ensure!(payload.pop() == Some(0xCE), "no frame-end octet");
            let channel = u16::from_be_bytes([header[1], header[2]]);
            Ok(Some((header[0], channel, payload)))
        };
        tokio::time::timeout(WAIT, read)
            .await
            .context("no frame and no close within the wait")?
    }

    /// The next frame, which must be method `class_method` on `channel`: its arguments.
    async fn expect_method(
        &mut self,
        channel: u16,
        class_method: (u16, u16),
        what: &str,
    ) -> anyhow::Result<Vec<u8>> {
        let Some((kind, ch, payload)) = self.read_frame().await? else {
            bail!("the socket closed where {what} was expected");
        };
        ensure!(payload.len() >= 4, "{what}: short frame {payload:?}");
        let got = (
            u16::from_be_bytes([payload[0], payload[1]]),
            u16::from_be_bytes([payload[2], payload[3]]),
        );
        ensure!(
            kind == 1 && ch == channel && got == class_method,
            "expected {what} on channel {channel}, got frame type {kind} on channel {ch}: \
             method {got:?} {payload:?}"
        );
        Ok(payload[4..].to_vec())
    }
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
