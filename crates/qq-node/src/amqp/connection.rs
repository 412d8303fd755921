//! One AMQP connection: protocol header, start/start-ok (PLAIN, AMQPLAIN, EXTERNAL), tune,
//! open with the vhost's permission check, then the read loop that hands frames to
//! [`Channels`], heartbeats both ways, and close from either side.
//!
//! Two tasks: this one reads the socket and runs the methods in order; [`write_loop`] writes
//! what the [`Outbox`] holds, and a heartbeat when nothing else went out for an interval. A
//! peer silent for two heartbeat intervals is dropped (RabbitMQ's rule). A node that has not
//! caught up with the cluster's metadata, or is shutting down, closes with 320
//! CONNECTION_FORCED and the reason.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::{AMQPClass, connection as conn};
use amq_protocol::types::{AMQPValue, FieldTable, LongString};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Ctx;
use super::channel::Channels;
use super::codes::{
    ACCESS_REFUSED, AmqpError, CONNECTION_FORCED, ConnError, NOT_ALLOWED, UNEXPECTED_FRAME,
};
use super::convert::short;
use super::frames::{FrameReader, ReadError, encode};
use super::session::{ClientCaps, OUTBOX_BOUND, Out, Outbox, Session};
use crate::api::auth::Caller;

/// How long the handshake may take from the protocol header to open-ok (RabbitMQ's
/// handshake_timeout: 10 s).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a closing side waits for the other's close-ok.
const CLOSE_OK_WAIT: Duration = Duration::from_secs(3);
const PROTOCOL_HEADER: [u8; 8] = *b"AMQP\x00\x00\x09\x01";
/// Bytes the socket writer gathers before a write (see [`run`]).
const WRITE_BUFFER: usize = 64 * 1024;

/// Serve one accepted connection to its end. `tls`: `Some(certificate common name)` on
/// amqps (empty without a verified client certificate).
pub async fn run<S>(io: S, peer: SocketAddr, tls: Option<String>, ctx: Arc<Ctx>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (rd, wr) = tokio::io::split(io);
    let mut reader = FrameReader::new(rd, ctx.frame_max);
    let (tx, rx) = mpsc::channel(OUTBOX_BOUND);
    let out = Outbox(tx);
    let (heartbeat_tx, heartbeat_rx) = watch::channel(Duration::ZERO);
    // Frames waiting in the outbox are written into one buffer and flushed once (a syscall per
    // batch of deliveries and confirms, not per frame); larger frames go straight through.
    let wr = tokio::io::BufWriter::with_capacity(WRITE_BUFFER, wr);
    let writer = tokio::spawn(write_loop(wr, rx, heartbeat_rx));
    let stopping = ctx.api.node().stopping().clone();
    let handshake = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        handshake(&mut reader, &out, peer, tls, &ctx),
    );
    let opened = tokio::select! {
        h = handshake => h.unwrap_or_else(|_| Err(HandshakeEnd::Drop("handshake timed out".into()))),
        _ = stopping.cancelled() => Err(HandshakeEnd::Drop("node shutting down".into())),
    };
    match opened {
        Ok((caller, vhost, frame_max, heartbeat, caps)) => {
            reader.set_frame_max(frame_max);
            let _ = heartbeat_tx.send(heartbeat);
            debug!(%peer, user = %caller.user, %vhost, "amqp connection open");
            let session = Arc::new(Session {
                ctx,
                caller,
                vhost,
                out: out.clone(),
                frame_max,
                caps,
                done: stopping.child_token(),
            });
            serve(&mut reader, session.clone(), heartbeat, &stopping).await;
            session.done.cancel();
        }
        Err(HandshakeEnd::Close(e)) => {
            info!(%peer, code = e.code, "amqp connection refused: {}", e.text);
            close_and_wait(&mut reader, &out, e).await;
        }
        Err(HandshakeEnd::Silent(why)) => {
            debug!(%peer, "amqp connection refused without a close: {why}");
            silent_close_delay(ctx.api.node().clock().now(), &stopping).await;
        }
        Err(HandshakeEnd::Drop(why)) => debug!(%peer, "amqp connection dropped: {why}"),
    }
    let _ = out.0.send(Out::End).await;
    drop(out);
    let _ = tokio::time::timeout(CLOSE_OK_WAIT, writer).await;
}

/// How a handshake that did not open ended. A refusal told by closing the socket (a failed
/// login of a client without `authentication_failure_close`, an unknown mechanism, a response
/// that does not decode) closes it only [`SILENT_CLOSE_DELAY`] after the refusal, as
/// RabbitMQ: a client trying passwords gets one answer per connection per 3 s. The connection
/// holds its place under `max_connections` meanwhile. A refusal told with connection.close
/// closes the socket at the client's close-ok, as RabbitMQ 3.10 does (the differential test's
/// record shows it).
enum HandshakeEnd {
    /// Send connection.close with this, wait for close-ok.
    Close(ConnError),
    /// Send nothing, close after the delay.
    Silent(String),
    /// Just close the socket.
    Drop(String),
}

/// RabbitMQ's SILENT_CLOSE_DELAY (rabbit_reader): how long after a refused handshake the
/// socket closes.
const SILENT_CLOSE_DELAY: Duration = Duration::from_secs(3);

/// Wait until [`SILENT_CLOSE_DELAY`] after `since` (at once when the node stops).
async fn silent_close_delay(since: tokio::time::Instant, stopping: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep_until(since + SILENT_CLOSE_DELAY) => {}
        _ = stopping.cancelled() => {}
    }
}

type Opened = (Caller, String, u32, Duration, ClientCaps);

async fn handshake<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    out: &Outbox,
    peer: SocketAddr,
    tls: Option<String>,
    ctx: &Ctx,
) -> Result<Opened, HandshakeEnd> {
    let Some(header) = reader.protocol_header().await else {
        return Err(HandshakeEnd::Drop(
            "closed before the protocol header".into(),
        ));
    };
    if header != PROTOCOL_HEADER {
        // The specification's answer: the header we speak, then close.
        out.bytes(PROTOCOL_HEADER.to_vec()).await;
        return Err(HandshakeEnd::Drop(format!("protocol header {header:?}")));
    }
    let external = tls.as_deref().is_some_and(|cn| !cn.is_empty());
    out.method(
        0,
        AMQPClass::Connection(conn::AMQPMethod::Start(start(ctx, external))),
    )
    .await;
    let start_ok = match expect_method(reader).await? {
        AMQPClass::Connection(conn::AMQPMethod::StartOk(s)) => s,
        other => return Err(unexpected(&other, "connection.start-ok")),
    };
    let caps = client_caps(&start_ok.client_properties);
    // A refused login is told only to clients that asked (RabbitMQ's
    // authentication_failure_close); others see the socket close.
    let caller = login(ctx, &start_ok, peer, tls)
        .await
        .map_err(|end| match end {
            HandshakeEnd::Close(e)
                if e.code == ACCESS_REFUSED && !caps.authentication_failure_close =>
            {
                HandshakeEnd::Silent(e.text)
            }
            other => other,
        })?;
    out.method(
        0,
        AMQPClass::Connection(conn::AMQPMethod::Tune(conn::Tune {
            channel_max: ctx.channel_max,
            frame_max: ctx.frame_max,
            heartbeat: ctx.heartbeat_s,
        })),
    )
    .await;
    let tune_ok = match expect_method(reader).await? {
        AMQPClass::Connection(conn::AMQPMethod::TuneOk(t)) => t,
        other => return Err(unexpected(&other, "connection.tune-ok")),
    };
    let frame_max = negotiate(ctx, &tune_ok)?;
    let open = match expect_method(reader).await? {
        AMQPClass::Connection(conn::AMQPMethod::Open(o)) => o,
        other => return Err(unexpected(&other, "connection.open")),
    };
    let vhost = open.virtual_host.as_str().to_string();
    ctx.api
        .auth()
        .require_visible(&caller, &vhost)
        .map_err(|s| close(NOT_ALLOWED, s.message()))?;
    out.method(
        0,
        AMQPClass::Connection(conn::AMQPMethod::OpenOk(conn::OpenOk {})),
    )
    .await;
    let heartbeat = Duration::from_secs(tune_ok.heartbeat as u64);
    Ok((caller, vhost, frame_max, heartbeat, caps))
}

fn close(code: u16, text: &str) -> HandshakeEnd {
    HandshakeEnd::Close(ConnError::new(code, text))
}

fn unexpected(got: &AMQPClass, wanted: &str) -> HandshakeEnd {
    close(
        UNEXPECTED_FRAME,
        &format!(
            "expected {wanted}, got method {}.{}",
            got.get_amqp_class_id(),
            got.get_amqp_method_id()
        ),
    )
}

/// The next method on channel 0 during the handshake.
async fn expect_method<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
) -> Result<AMQPClass, HandshakeEnd> {
    loop {
        // A refused argument does not matter here: no method that has one is expected.
        let frame = match reader.next().await {
            Ok(frame) | Err(ReadError::Refused(frame, _)) => frame,
            Err(ReadError::Closed) => return Err(HandshakeEnd::Drop("closed".into())),
            Err(ReadError::Bad(e)) => return Err(HandshakeEnd::Close(e)),
        };
        match frame {
            AMQPFrame::Method(0, m) => return Ok(m),
            AMQPFrame::Heartbeat => continue,
            other => {
                return Err(close(
                    UNEXPECTED_FRAME,
                    &format!("expected a method on channel 0 during the handshake, got {other}"),
                ));
            }
        }
    }
}

/// connection.start: RabbitMQ's server properties and capability flags.
fn start(ctx: &Ctx, external: bool) -> conn::Start {
    let mut caps = FieldTable::default();
    for cap in [
        "publisher_confirms",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "authentication_failure_close",
        "per_consumer_qos",
        "consumer_priorities",
        "exchange_exchange_bindings",
    ] {
        caps.insert(cap.into(), AMQPValue::Boolean(true));
    }
    // Direct reply-to is not supported: said so, as RabbitMQ clients read these flags.
    caps.insert("direct_reply_to".into(), AMQPValue::Boolean(false));
    let text = |s: &str| AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()));
    let mut props = FieldTable::default();
    props.insert("product".into(), text("quorumq"));
    props.insert("version".into(), text(env!("CARGO_PKG_VERSION")));
    props.insert("platform".into(), text("Rust"));
    props.insert(
        "cluster_name".into(),
        text(&format!("quorumq@node{}", ctx.api.node().id())),
    );
    props.insert("capabilities".into(), AMQPValue::FieldTable(caps));
    let mechanisms = if external {
        "EXTERNAL AMQPLAIN PLAIN"
    } else {
        "AMQPLAIN PLAIN"
    };
    conn::Start {
        version_major: 0,
        version_minor: 9,
        server_properties: props,
        mechanisms: LongString::from(mechanisms.as_bytes().to_vec()),
        locales: LongString::from(b"en_US".to_vec()),
    }
}

fn client_caps(props: &FieldTable) -> ClientCaps {
    let Some(AMQPValue::FieldTable(caps)) = props.inner().get("capabilities") else {
        return ClientCaps::default();
    };
    let flag = |name: &str| matches!(caps.inner().get(name), Some(AMQPValue::Boolean(true)));
    ClientCaps {
        consumer_cancel_notify: flag("consumer_cancel_notify"),
        connection_blocked: flag("connection.blocked"),
        authentication_failure_close: flag("authentication_failure_close"),
    }
}

/// The caller of start-ok's mechanism and response; a refusal is 403 ACCESS_REFUSED (530
/// NOT_ALLOWED for a connection limit, 320 while the node catches up). A mechanism not
/// offered and a response that does not decode close the socket without connection.close:
/// RabbitMQ 3.10 answers them with COMMAND_INVALID and SYNTAX_ERROR, which before the
/// connection is tuned it does not send (rabbit_reader's handle_exception).
async fn login(
    ctx: &Ctx,
    s: &conn::StartOk,
    peer: SocketAddr,
    tls: Option<String>,
) -> Result<Caller, HandshakeEnd> {
    let mechanism = s.mechanism.as_str();
    let auth = ctx.api.auth();
    let silently = |why: String| {
        warn!(%peer, via = "amqp", "login refused: {why}");
        HandshakeEnd::Silent(why)
    };
    let result = match mechanism {
        "PLAIN" | "AMQPLAIN" => {
            let Some((user, password)) = credentials(mechanism, s.response.as_bytes()) else {
                return Err(silently(format!("{mechanism} response does not decode")));
            };
            auth.login_amqp(user, password, Some(peer), tls.is_some())
                .await
        }
        "EXTERNAL" if tls.as_deref().is_some_and(|cn| !cn.is_empty()) => {
            auth.login_amqp_external(tls.unwrap_or_default(), Some(peer))
        }
        other => {
            return Err(silently(format!(
                "authentication mechanism {other:?} is not offered"
            )));
        }
    };
    result.map_err(|status| {
        let code = match status.code() {
            tonic::Code::Unavailable => CONNECTION_FORCED,
            tonic::Code::ResourceExhausted => NOT_ALLOWED,
            _ => ACCESS_REFUSED,
        };
        let e = AmqpError::new(code, status.message());
        close(code, &e.reply_text())
    })
}

/// PLAIN: `\0user\0password`; AMQPLAIN: a field table (without its length) holding LOGIN and
/// PASSWORD.
fn credentials(mechanism: &str, response: &[u8]) -> Option<(String, String)> {
    if mechanism == "PLAIN" {
        let mut parts = response.split(|b| *b == 0);
        let _authzid = parts.next()?;
        let user = String::from_utf8(parts.next()?.to_vec()).ok()?;
        let password = String::from_utf8(parts.next()?.to_vec()).ok()?;
        return parts.next().is_none().then_some((user, password));
    }
    let mut framed = (response.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(response);
    let (_, table) = amq_protocol::types::parsing::parse_field_table(framed.as_slice()).ok()?;
    let text = |key: &str| match table.inner().get(key)? {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok(),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    };
    Some((text("LOGIN")?, text("PASSWORD")?))
}

/// The frame_max both sides use; 530 NOT_ALLOWED past the node's bounds, as RabbitMQ.
fn negotiate(ctx: &Ctx, t: &conn::TuneOk) -> Result<u32, HandshakeEnd> {
    if t.channel_max > ctx.channel_max {
        return Err(close(
            NOT_ALLOWED,
            &format!(
                "NOT_ALLOWED - channel_max={} > {} max size",
                t.channel_max, ctx.channel_max
            ),
        ));
    }
    match t.frame_max {
        0 => Ok(ctx.frame_max),
        f if f < 4096 => Err(close(
            NOT_ALLOWED,
            &format!("NOT_ALLOWED - frame_max={f} < 4096 min size"),
        )),
        f if f > ctx.frame_max => Err(close(
            NOT_ALLOWED,
            &format!("NOT_ALLOWED - frame_max={f} > {} max size", ctx.frame_max),
        )),
        f => Ok(f),
    }
}

/// The read loop of an open connection, until either side closes it.
async fn serve<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    session: Arc<Session>,
    heartbeat: Duration,
    stopping: &CancellationToken,
) {
    let mut channels = Channels::new(session.clone());
    // Two missed intervals and the peer is gone; no heartbeat: no deadline.
    let silence = if heartbeat.is_zero() {
        Duration::from_secs(u64::MAX / 4)
    } else {
        heartbeat * 2
    };
    let end = loop {
        // A pipelining client leaves many frames in one read: those are taken without a
        // timer or a wait (the peer was not silent; a node stopping ends the loop at the
        // next wait, at most one read's worth of frames later).
        let read = match reader.buffered() {
            Ok(Some(frame)) => Ok(Ok(frame)),
            Err(e) => Ok(Err(e)),
            Ok(None) => tokio::select! {
                r = tokio::time::timeout(silence, reader.next()) => r,
                _ = stopping.cancelled() => {
                    break Some(ConnError::new(CONNECTION_FORCED, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"));
                }
            },
        };
        let (frame, refusal) = match read {
            Err(_) => {
                info!(user = %session.caller.user, "amqp: missed heartbeats from the client, closing");
                break None;
            }
            Ok(Err(ReadError::Closed)) => break None,
            Ok(Err(ReadError::Bad(e))) => break Some(with_name(e)),
            Ok(Err(ReadError::Refused(f, e))) => (f, Some(e)),
            Ok(Ok(f)) => (f, None),
        };
        match frame {
            AMQPFrame::Heartbeat => {}
            AMQPFrame::Method(0, AMQPClass::Connection(conn::AMQPMethod::Close(_))) => {
                // What the client published before its close is committed before close-ok.
                channels.close_all().await;
                let ok = AMQPClass::Connection(conn::AMQPMethod::CloseOk(conn::CloseOk {}));
                session.out.method(0, ok).await;
                break None;
            }
            AMQPFrame::Method(0, AMQPClass::Connection(conn::AMQPMethod::CloseOk(_))) => {
                break None;
            }
            other => {
                if let Err(e) = channels.handle(other, refusal).await {
                    break Some(with_name(e));
                }
            }
        }
    };
    channels.close_all().await;
    if let Some(e) = end {
        close_and_wait(reader, &session.out, e).await;
    }
}

/// A connection error's text with RabbitMQ's `NAME - ` prefix (once).
fn with_name(e: ConnError) -> ConnError {
    if e.text.starts_with(super::codes::name(e.code)) {
        return e;
    }
    let text = AmqpError::new(e.code, e.text.clone()).reply_text();
    ConnError { text, ..e }
}

/// connection.close with `e`, then wait a moment for close-ok (frames before it are
/// discarded, as the specification says).
async fn close_and_wait<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    out: &Outbox,
    e: ConnError,
) {
    let e = with_name(e);
    let close = conn::Close {
        reply_code: e.code,
        reply_text: short(&e.text),
        class_id: e.class_method.0,
        method_id: e.class_method.1,
    };
    if !out
        .method(0, AMQPClass::Connection(conn::AMQPMethod::Close(close)))
        .await
    {
        return;
    }
    let wait = async {
        loop {
            match reader.next().await {
                Ok(AMQPFrame::Method(0, AMQPClass::Connection(conn::AMQPMethod::CloseOk(_))))
                | Err(_) => return,
                Ok(_) => continue,
            }
        }
    };
    let _ = tokio::time::timeout(CLOSE_OK_WAIT, wait).await;
}

/// Writes the outbox to the socket, and a heartbeat frame whenever nothing else went out for
/// the negotiated interval.
async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::Receiver<Out>,
    heartbeat: watch::Receiver<Duration>,
) {
    let mut beat = Vec::new();
    encode(&AMQPFrame::Heartbeat, &mut beat);
    loop {
        let interval = *heartbeat.borrow();
        let next = if interval.is_zero() {
            rx.recv().await
        } else {
            match tokio::time::timeout(interval, rx.recv()).await {
                Ok(next) => next,
                Err(_) => {
                    if wr.write_all(&beat).await.is_err() || wr.flush().await.is_err() {
                        return;
                    }
                    continue;
                }
            }
        };
        match next {
            Some(Out::Bytes(bytes)) => {
                if wr.write_all(&bytes).await.is_err() {
                    return;
                }
                // Write what else is waiting before flushing once.
                while let Ok(more) = rx.try_recv() {
                    match more {
                        Out::Bytes(b) => {
                            if wr.write_all(&b).await.is_err() {
                                return;
                            }
                        }
                        Out::End => {
                            let _ = wr.flush().await;
                            let _ = wr.shutdown().await;
                            return;
                        }
                    }
                }
                if wr.flush().await.is_err() {
                    return;
                }
            }
            Some(Out::End) | None => {
                let _ = wr.flush().await;
                let _ = wr.shutdown().await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_amqplain_credentials_decode() {
        assert_eq!(
            credentials("PLAIN", b"\0bob\0s3cret"),
            Some(("bob".into(), "s3cret".into()))
        );
        assert_eq!(credentials("PLAIN", b"bob:s3cret"), None);
        // AMQPLAIN: LOGIN (longstr "bob"), PASSWORD (longstr "pw"), without the table length.
        let mut t = Vec::new();
        for (k, v) in [("LOGIN", "bob"), ("PASSWORD", "pw")] {
            t.push(k.len() as u8);
            t.extend_from_slice(k.as_bytes());
            t.push(b'S');
            t.extend_from_slice(&(v.len() as u32).to_be_bytes());
            t.extend_from_slice(v.as_bytes());
        }
        assert_eq!(
            credentials("AMQPLAIN", &t),
            Some(("bob".into(), "pw".into()))
        );
        assert_eq!(credentials("AMQPLAIN", &t[..5]), None);
    }
}
