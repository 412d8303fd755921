//! Wiring: start the node, serve the client API and the node-to-node service on their own
//! listeners, and shut down in order.
//!
//! Two servers: `listen` serves `qq.v1.Broker` (server TLS when `tls_cert` is set, client
//! certificates required when `tls_client_ca` is), `cluster_addr` serves only
//! `qq.internal.v1.Internal` over mutual TLS: a peer must present a certificate from the
//! cluster CA, or the handshake fails before any request is read (plain text only with
//! `insecure_cluster`). The cluster server's connections are the ones the node's transport
//! accepts ([`qq_raft::transport`], TCP in production), like those it dials to its peers.
//! Nothing of the internal service is reachable on the client port. Beside the broker, the
//! client port serves gRPC health and reflection, and `http_addr` (when set) the operator's
//! `GET /metrics` and `GET /healthz` and the management page ([`crate::observe`]).
//!
//! Shutdown (SIGTERM or Ctrl-C, see `main.rs`): both listeners stop accepting; the node's token
//! is cancelled, so consumer sessions and publish streams end with UNAVAILABLE, proposals stop
//! retrying and the leader actors stop; requests already in flight finish (or fail with
//! UNAVAILABLE: a write inside Raft gets [`crate::proposer`]'s short grace, since peers may no
//! longer reach this node to commit it); the drain is bounded by [`DRAIN_GRACE`]; then the
//! node waits for its tasks, stops its Raft groups and flushes RocksDB ([`Node::shutdown`]).

use std::time::Duration;

use qq_proto::internal::internal_server::InternalServer;
use qq_proto::v1::broker_server::BrokerServer;
use qq_raft::network::{HTTP2_CONNECTION_WINDOW, HTTP2_STREAM_WINDOW, MAX_INTERNAL_MESSAGE_BYTES};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tracing::{error, info, warn};

use tokio_util::sync::CancellationToken;

use futures::StreamExt;

use crate::api::BrokerService;
use crate::api::conn::Connections;
use crate::config::Config;
use crate::definitions::{self, Document};
use crate::node::{Node, Seams};
use crate::observe::Observability;
use crate::peer::liveness::spawn_peer_watches;
use crate::peer::service::InternalService;

/// Streams a peer may reset before the cluster server accepted them (see `run`).
const CLUSTER_MAX_PENDING_RESETS: usize = 1024;

/// How long the server waits for open requests once shutdown begins.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// How long a TLS handshake may take on either port (a client that opens a connection and says
/// nothing does not hold it longer).
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Run a node until `shutdown` resolves, on `clock`, its peers' connections made and accepted
/// by `transport` (`main`: [`Clock::system`] and [`qq_raft::transport::TcpTransport`]).
pub async fn run(
    config: Config,
    seams: Seams,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let probes = seams.clients.clone();
    let incoming = seams
        .clients
        .listen(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("listen: listen on {}: {e}", config.listen))?;
    let cluster_incoming = seams
        .transport
        .listen(config.cluster_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cluster_addr: listen on {}: {e}", config.cluster_addr))?;
    let http_listener = match config.http_addr {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("http_addr: listen on {addr}: {e}"))?,
        ),
        None => None,
    };
    let amqp_listeners = crate::amqp::Listeners::bind(&config).await?;
    let client_tls = client_tls(&config)?;
    // A definitions file that does not parse stops the node here, naming the file.
    let boot_definitions = match &config.definitions_file {
        Some(path) => Some((path.clone(), Document::load_file(path)?)),
        None => None,
    };
    let cluster_tls = match config.cluster_tls()? {
        Some(t) => Some(
            ServerTlsConfig::new()
                .identity(Identity::from_pem(&t.cert_pem, &t.key_pem))
                .client_ca_root(Certificate::from_pem(&t.ca_pem))
                .timeout(TLS_HANDSHAKE_TIMEOUT),
        ),
        None => {
            warn!(
                cluster_addr = %config.cluster_addr,
                "insecure_cluster = true: node-to-node traffic is plain text and unauthenticated; \
                 anyone who reaches the cluster port can act as a node"
            );
            None
        }
    };
    // Decode somewhat larger messages than allowed, so the node itself refuses them with
    // RESOURCE_EXHAUSTED naming the limit (tonic would answer OUT_OF_RANGE).
    let max_client = (config.max_message_bytes.saturating_mul(4))
        .saturating_add(1024 * 1024)
        .min(1 << 30);
    let listen = config.listen;
    let cluster_addr = config.cluster_addr;
    let client_tls_on = client_tls.is_some();
    // Starting the groups does not wait for peers: Raft RPCs to nodes not yet up are retried.
    let node = Node::start(config, seams).await?;
    let peer_links = spawn_peer_watches(node.peering(), probes);
    let observe = Observability::start(node.observed(), node.tasks(), peer_links).await;
    if let Some((path, doc)) = boot_definitions {
        spawn_boot_import(node.clone(), path, doc, observe.serving());
    }
    let conns = Connections::new(
        node.config().max_connections,
        node.config().max_streams_per_connection,
    );
    let max_h2_streams = node.config().max_streams_per_connection as u32 + 256;
    // AMQP listeners stop accepting with the gRPC ones; their connections end with the node's
    // stopping token.
    let signal_for_amqp = CancellationToken::new();
    // Every accepted client connection is counted while open; past max_connections it is
    // closed at once.
    let incoming = {
        let conns = conns.clone();
        incoming.filter_map(move |accepted| {
            std::future::ready(match accepted {
                Ok(io) => conns.accept(io).map(Ok),
                Err(e) => Some(Err(e)),
            })
        })
    };
    let broker_service = BrokerService::new(node.serving(), conns);
    let page_api = broker_service.api();
    amqp_listeners.serve(page_api.clone(), signal_for_amqp.clone());
    let broker = BrokerServer::new(broker_service)
        .max_decoding_message_size(max_client)
        .max_encoding_message_size(max_client);
    // Every peer request is checked for a protocol this node and the sender both read.
    let internal = InterceptedService::new(
        InternalServer::new(InternalService::new(node.peering()))
            .max_decoding_message_size(MAX_INTERNAL_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_INTERNAL_MESSAGE_BYTES),
        qq_raft::protocol::check,
    );
    let http_addr = config_http_addr(&http_listener);
    info!(node_id = node.id(), %listen, %cluster_addr, http_addr, client_tls = client_tls_on, "node serving");
    let stopping = node.stopping().clone();
    // One shutdown signal, seen by both servers.
    let signal = CancellationToken::new();
    tokio::spawn({
        let signal = signal.clone();
        let signal_for_amqp = signal_for_amqp.clone();
        async move {
            shutdown.await;
            // Streams end now, so they do not hold the servers' drain up.
            stopping.cancel();
            signal.cancel();
            signal_for_amqp.cancel();
        }
    });
    let mut client_server = tonic::transport::Server::builder();
    if let Some(tls) = client_tls {
        client_server = client_server.tls_config(tls)?;
    }
    let client_router = client_server
        .max_concurrent_streams(Some(max_h2_streams))
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .add_service(broker);
    let client_server = observe
        .add_grpc_services(client_router)?
        .serve_with_incoming_shutdown(incoming, signal.clone().cancelled_owned());
    let mut cluster_server = tonic::transport::Server::builder();
    if let Some(tls) = cluster_tls {
        cluster_server = cluster_server.tls_config(tls)?;
    }
    let cluster_server = cluster_server
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        // openraft drops a heartbeat's call after `heartbeat_interval`, which resets its
        // stream. When many groups wake at once on a loaded node, more than h2's default of 20
        // such streams can be reset before the server accepted them, and h2 then closes the
        // whole connection (its guard against "rapid reset" floods). Only authenticated peers
        // (mutual TLS) reach this port; the bound stays, higher.
        .http2_max_pending_accept_reset_streams(Some(CLUSTER_MAX_PENDING_RESETS))
        .add_service(internal)
        .serve_with_incoming_shutdown(cluster_incoming, signal.clone().cancelled_owned());
    // The drain waits for every open request; bound it, so a request stuck somewhere cannot
    // keep the node from stopping.
    let drain_limit = async {
        node.stopping().cancelled().await;
        tokio::time::sleep(DRAIN_GRACE).await;
    };
    let http_server = async {
        match http_listener {
            Some(listener) => observe.serve_http(listener, page_api, signal.clone()).await,
            None => Ok(()),
        }
    };
    tokio::select! {
        served = async {
            tokio::try_join!(
                async { client_server.await.map_err(anyhow::Error::from) },
                async { cluster_server.await.map_err(anyhow::Error::from) },
                http_server,
            )
        } => { served?; }
        _ = drain_limit => warn!("requests still open {DRAIN_GRACE:?} after the shutdown signal: closing them"),
    }
    info!("shutting down");
    node.shutdown().await;
    Ok(())
}

/// Imports `definitions_file` once the node serves (joined, a metadata leader in reach),
/// retrying while the metadata group is unavailable. Every node may do it: the import is
/// idempotent.
fn spawn_boot_import(
    node: std::sync::Arc<Node>,
    path: std::path::PathBuf,
    doc: Document,
    mut serving: tokio::sync::watch::Receiver<bool>,
) {
    let tasks = node.tasks().clone();
    tasks.spawn(async move {
        let stop = node.stopping().clone();
        loop {
            tokio::select! {
                r = serving.wait_for(|s| *s) => if r.is_err() { return },
                _ = stop.cancelled() => return,
            }
            let state = node.view().current();
            let nodes = node.placement_nodes();
            match definitions::import(node.proposer(), &state, &doc, &nodes, None).await {
                Ok(_) => {
                    info!(file = %path.display(), "definitions_file imported");
                    return;
                }
                Err(e) if e.is_retryable() => {
                    warn!(file = %path.display(), "definitions_file: {e} (retrying)");
                    if stop
                        .run_until_cancelled(tokio::time::sleep(Duration::from_secs(1)))
                        .await
                        .is_none()
                    {
                        return;
                    }
                }
                Err(e) => {
                    error!(file = %path.display(), "definitions_file not imported: {e}");
                    return;
                }
            }
        }
    });
}

/// The HTTP listener's address for the log, or "none".
fn config_http_addr(listener: &Option<tokio::net::TcpListener>) -> String {
    listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map_or_else(|| "none".to_string(), |a| a.to_string())
}

/// Server TLS of the client port, from `tls_cert`/`tls_key` (and `tls_client_ca`).
fn client_tls(config: &Config) -> anyhow::Result<Option<ServerTlsConfig>> {
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Ok(None);
    };
    let read = |field: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| anyhow::anyhow!("{field}: read {}: {e}", path.display()))
    };
    let mut tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(
            read("tls_cert", cert)?,
            read("tls_key", key)?,
        ))
        .timeout(TLS_HANDSHAKE_TIMEOUT);
    if let Some(ca) = &config.tls_client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read("tls_client_ca", ca)?));
    }
    Ok(Some(tls))
}

#[cfg(test)]
mod tests;
