//! The AMQP 0-9-1 listener: a second protocol adapter over the same broker as `qq.v1.Broker`.
//!
//! Every node with `amqp_addr` (plain TCP) or `amqps_addr` (TLS with the client port's
//! certificate settings) accepts AMQP 0-9-1 clients. A connection authenticates once
//! (PLAIN, AMQPLAIN, or EXTERNAL with a client certificate) through the same [`Auth`] as gRPC,
//! and every method then goes through the gRPC handlers themselves or the functions they use
//! (permissions, validation, limits, routing, confirms, consumer sessions): a message
//! published over AMQP can be consumed over gRPC and the other way round, and a refusal is the
//! same refusal, mapped onto RabbitMQ's reply codes by [`codes`].
//!
//! Layout, each module importing only those above it: [`codes`], [`convert`] and [`frames`]
//! (amq-protocol's codec, bounded by frame_max); [`session`] (an open connection's caller,
//! vhost and outbox); [`topology`] declares and deletes, [`publisher`] the publish pipeline
//! with confirms, [`deliveries`] a channel's delivery tags, basic.get and acks, [`consumer`]
//! basic.consume and basic.cancel; [`channel`] a channel's state, content and dispatch;
//! [`connection`] the handshake, heartbeats and read loop.
//!
//! Bounds: connections count toward `max_connections` and the per-user and per-vhost limits
//! with the gRPC port's (one [`crate::api::conn::Connections`]); `amqp_channel_max` channels per connection;
//! frames of at most `amqp_frame_max` bytes; messages of at most `max_message_bytes` (406 at
//! the content header, before the body is read); at most `max_inflight_publishes` unconfirmed
//! publishes per channel, past which the connection's socket is not read (TCP backpressure);
//! [`session::OUTBOX_BOUND`] frames waiting for the socket, past which consumers wait.
//!
//! Must not: propose anything itself, or decide a permission (the API layer does both).

pub mod channel;
pub mod codes;
pub mod connection;
pub mod consumer;
pub mod convert;
pub mod deliveries;
pub mod frames;
pub mod publisher;
pub mod session;
pub mod topology;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::api::Api;
use crate::config::Config;

/// How long a TLS handshake may take on `amqps_addr`.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// What every AMQP connection of a node shares.
pub struct Ctx {
    pub api: Api,
    pub channel_max: u16,
    pub frame_max: u32,
    pub heartbeat_s: u16,
}

/// Accept AMQP clients on `listener` until `signal` is cancelled; `tls` makes it amqps
/// (`external`: client certificates are verified, so SASL EXTERNAL is offered).
pub async fn serve(
    listener: TcpListener,
    ctx: Arc<Ctx>,
    tls: Option<(TlsAcceptor, bool)>,
    signal: CancellationToken,
) {
    let local = listener
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    info!(addr = %local, tls = tls.is_some(), "amqp listener serving");
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = signal.cancelled() => return,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                warn!("amqp accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let info = tonic::transport::server::Connected::connect_info(&tcp);
        let conn = qq_raft::transport::Conn::new(tcp, info);
        let Some(tracked) = ctx.api.conns().accept(conn) else {
            continue;
        };
        let ctx = ctx.clone();
        let tls = tls.clone();
        ctx.api.node().tasks().clone().spawn(async move {
            match tls {
                None => connection::run(tracked, peer, None, ctx).await,
                Some((acceptor, external)) => {
                    let accepted =
                        tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tracked)).await;
                    match accepted {
                        Ok(Ok(stream)) => {
                            let identity = external
                                .then(|| client_common_name(&stream))
                                .flatten()
                                .unwrap_or_default();
                            connection::run(stream, peer, Some(identity), ctx).await
                        }
                        Ok(Err(e)) => debug!(%peer, "amqps handshake failed: {e}"),
                        Err(_) => debug!(%peer, "amqps handshake timed out"),
                    }
                }
            }
        });
    }
}

/// The common name of the verified client certificate, if there is one.
fn client_common_name<S>(stream: &tokio_rustls::server::TlsStream<S>) -> Option<String> {
    let (_, session) = stream.get_ref();
    let cert = session.peer_certificates()?.first()?;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// Bind `addr` for `field`.
async fn bind(addr: SocketAddr, field: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("{field}: listen on {addr}: {e}"))
}

/// The listeners of `amqp_addr` and `amqps_addr` (with its TLS), bound before the node
/// starts so a taken port stops it at once.
pub struct Listeners(Vec<(TcpListener, Option<(TlsAcceptor, bool)>)>);

impl Listeners {
    pub async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        let mut out = Vec::new();
        if let Some(addr) = config.amqp_addr {
            out.push((bind(addr, "amqp_addr").await?, None));
        }
        if let Some(addr) = config.amqps_addr {
            out.push((bind(addr, "amqps_addr").await?, Some(tls_acceptor(config)?)));
        }
        Ok(Listeners(out))
    }

    /// Serve every listener until `signal`.
    pub fn serve(self, api: Api, signal: CancellationToken) {
        let config = api.node().config();
        let ctx = Arc::new(Ctx {
            channel_max: config.amqp_channel_max,
            frame_max: config.amqp_frame_max,
            heartbeat_s: config.amqp_heartbeat_s,
            api: api.clone(),
        });
        for (listener, tls) in self.0 {
            tokio::spawn(serve(listener, ctx.clone(), tls, signal.clone()));
        }
    }
}

/// amqps: the client port's certificate and key; with `tls_client_ca`, client certificates
/// are required and verified (and EXTERNAL offered).
fn tls_acceptor(config: &Config) -> anyhow::Result<(TlsAcceptor, bool)> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        anyhow::bail!("amqps_addr: needs tls_cert and tls_key");
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("tls_cert: {}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| anyhow::anyhow!("tls_key: {}: {e}", key.display()))?;
    let builder = rustls::ServerConfig::builder();
    let (tls, external) = match &config.tls_client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)
                .map_err(|e| anyhow::anyhow!("tls_client_ca: {}: {e}", ca.display()))?
            {
                let c = c.map_err(|e| anyhow::anyhow!("tls_client_ca: {}: {e}", ca.display()))?;
                roots.add(c)?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder(Arc::new(roots)).build()?;
            (
                builder
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(certs, key)?,
                true,
            )
        }
        None => (
            builder.with_no_client_auth().with_single_cert(certs, key)?,
            false,
        ),
    };
    Ok((TlsAcceptor::from(Arc::new(tls)), external))
}
