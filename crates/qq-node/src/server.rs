//! Wiring: start the node, serve both gRPC services on one listener, stop on SIGTERM/SIGINT.

use std::sync::Arc;

use qq_proto::internal::internal_server::InternalServer;
use qq_proto::v1::broker_server::BrokerServer;
use qq_raft::network::{HTTP2_CONNECTION_WINDOW, HTTP2_STREAM_WINDOW, MAX_INTERNAL_MESSAGE_BYTES};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::broker::BrokerService;
use crate::config::Config;
use crate::internal::InternalService;
use crate::node::Node;
use crate::queue_sm::DeadLetterJob;

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
    let (node, dead_letters) = Node::start(config).await?;
    node.spawn_background();
    spawn_dead_letter_worker(node.clone(), dead_letters);
    let broker = BrokerServer::new(BrokerService { node: node.clone() })
        .max_decoding_message_size(max_client)
        .max_encoding_message_size(max_client);
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    crate::liveness::spawn_peer_watches(node.clone());
    let internal = InternalServer::new(InternalService {
        node: node.clone(),
        stopping,
    })
    .max_decoding_message_size(MAX_INTERNAL_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_INTERNAL_MESSAGE_BYTES);
    info!(node_id = node.id, %listen, "node serving");
    tonic::transport::Server::builder()
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .add_service(broker)
        .add_service(internal)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            let _ = stopping_tx.send(true);
        })
        .await?;
    info!("shutting down");
    let _ = node.meta_raft.shutdown().await;
    let groups: Vec<_> = node.queues.read().unwrap().values().cloned().collect();
    for g in groups {
        let _ = g.raft.shutdown().await;
    }
    Ok(())
}

/// At-most-once dead letters: republished by [`crate::deadletter`].
fn spawn_dead_letter_worker(node: Arc<Node>, mut rx: mpsc::UnboundedReceiver<DeadLetterJob>) {
    tokio::spawn(async move {
        // Drops are counted in the source's stats; the log names each queue once.
        let mut logged = std::collections::HashSet::new();
        while let Some(job) = rx.recv().await {
            let group = job.group;
            if let Err(e) = crate::deadletter::publish_at_most_once(&node, job).await {
                if logged.insert(group) {
                    warn!(
                        "dead letter dropped (further drops for this queue are only counted): {e}"
                    );
                }
            }
        }
    });
}
