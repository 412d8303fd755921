//! Wiring: start the node, serve the client API and the internal service on one listener, and
//! shut down in order.
//!
//! Shutdown (SIGTERM or Ctrl-C, see `main.rs`): the listener stops accepting; the node's token
//! is cancelled, so consumer sessions and publish streams end with UNAVAILABLE, proposals stop
//! retrying and the leader actors stop; requests already in flight finish (or fail with
//! UNAVAILABLE: a write inside Raft gets [`crate::proposer`]'s short grace, since peers may no
//! longer reach this node to commit it); the drain is bounded by [`DRAIN_GRACE`]; then the
//! node waits for its tasks, stops its Raft groups and flushes RocksDB ([`Node::shutdown`]).

use std::time::Duration;

use qq_proto::internal::internal_server::InternalServer;
use qq_proto::v1::broker_server::BrokerServer;
use qq_raft::network::{HTTP2_CONNECTION_WINDOW, HTTP2_STREAM_WINDOW, MAX_INTERNAL_MESSAGE_BYTES};
use tracing::{info, warn};

use crate::api::BrokerService;
use crate::config::Config;
use crate::node::Node;
use crate::peer::liveness::spawn_peer_watches;
use crate::peer::service::InternalService;

/// How long the server waits for open requests once shutdown begins.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Run a node until `shutdown` resolves.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("listen on {}: {e}", config.listen))?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    // Decode somewhat larger messages than allowed, so the node itself refuses them with
    // RESOURCE_EXHAUSTED naming the limit (tonic would answer OUT_OF_RANGE).
    let max_client = (config.max_message_bytes.saturating_mul(4))
        .saturating_add(1024 * 1024)
        .min(1 << 30);
    let listen = config.listen;
    // Starting the groups does not wait for peers: Raft RPCs to nodes not yet up are retried.
    let node = Node::start(config).await?;
    spawn_peer_watches(node.clone());
    let broker = BrokerServer::new(BrokerService::new(node.clone()))
        .max_decoding_message_size(max_client)
        .max_encoding_message_size(max_client);
    let internal = InternalServer::new(InternalService::new(node.clone()))
        .max_decoding_message_size(MAX_INTERNAL_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_INTERNAL_MESSAGE_BYTES);
    info!(node_id = node.id(), %listen, "node serving");
    let stopping = node.stopping().clone();
    let server = tonic::transport::Server::builder()
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .add_service(broker)
        .add_service(internal)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            // Streams end now, so they do not hold the server's drain up.
            stopping.cancel();
        });
    // The drain waits for every open request; bound it, so a request stuck somewhere cannot
    // keep the node from stopping.
    let drain_limit = async {
        node.stopping().cancelled().await;
        tokio::time::sleep(DRAIN_GRACE).await;
    };
    tokio::select! {
        served = server => served?,
        _ = drain_limit => warn!("requests still open {DRAIN_GRACE:?} after the shutdown signal: closing them"),
    }
    info!("shutting down");
    node.shutdown().await;
    Ok(())
}
