//! Wiring: start the node, serve both gRPC services on one listener, stop on SIGTERM/SIGINT.

use std::sync::Arc;

use qq_proto::internal::internal_server::InternalServer;
use qq_proto::v1::broker_server::BrokerServer;
use qq_raft::network::MAX_INTERNAL_MESSAGE_BYTES;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::broker::BrokerService;
use crate::config::Config;
use crate::internal::InternalService;
use crate::node::Node;
use crate::queue_sm::DeadLetterJob;

/// Run a node until `shutdown` resolves.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("listen on {}: {e}", config.listen))?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    // Serve first: peers need our Raft endpoint while the metadata group starts.
    let (node_tx, node_rx) = tokio::sync::oneshot::channel::<Arc<Node>>();
    let max_client = config.max_message_bytes + 64 * 1024;
    let pending = PendingNode::new(node_rx);
    let broker = BrokerServer::new(LazyBroker { pending: pending.clone() })
        .max_decoding_message_size(max_client)
        .max_encoding_message_size(max_client);
    let internal = InternalServer::new(LazyInternal { pending })
        .max_decoding_message_size(MAX_INTERNAL_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_INTERNAL_MESSAGE_BYTES);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(broker)
            .add_service(internal)
            .serve_with_incoming_shutdown(incoming, shutdown),
    );
    let listen = config.listen;
    let (node, dead_letters) = Node::start(config).await?;
    node.spawn_background();
    spawn_dead_letter_worker(node.clone(), dead_letters);
    let _ = node_tx.send(node.clone());
    info!(node_id = node.id, %listen, "node serving");
    server.await??;
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
        while let Some(job) = rx.recv().await {
            if let Err(e) = crate::deadletter::publish_at_most_once(&node, job).await {
                warn!("dead letter dropped: {e}");
            }
        }
    });
}

/// The node, once started. Requests before that wait for it.
#[derive(Clone)]
struct PendingNode {
    rx: tokio::sync::watch::Receiver<Option<Arc<Node>>>,
}

impl PendingNode {
    fn new(rx: tokio::sync::oneshot::Receiver<Arc<Node>>) -> PendingNode {
        let (tx, wrx) = tokio::sync::watch::channel(None);
        tokio::spawn(async move {
            if let Ok(node) = rx.await {
                let _ = tx.send(Some(node));
                tx.closed().await;
            }
        });
        PendingNode { rx: wrx }
    }

    async fn get(&self) -> Result<Arc<Node>, tonic::Status> {
        let mut rx = self.rx.clone();
        let r = rx.wait_for(|n| n.is_some()).await;
        match r {
            Ok(n) => Ok(n.clone().expect("waited for Some")),
            Err(_) => Err(tonic::Status::unavailable("node is starting")),
        }
    }
}

struct LazyBroker {
    pending: PendingNode,
}
struct LazyInternal {
    pending: PendingNode,
}

macro_rules! lazy_unary {
    ($svc:ident, $method:ident, $req:ty, $resp:ty) => {
        async fn $method(&self, request: tonic::Request<$req>) -> Result<tonic::Response<$resp>, tonic::Status> {
            let node = self.pending.get().await?;
            $svc { node }.$method(request).await
        }
    };
}

use qq_proto::internal as ip;
use qq_proto::internal::internal_server::Internal;
use qq_proto::v1 as pb;
use qq_proto::v1::broker_server::Broker;

#[tonic::async_trait]
impl Internal for LazyInternal {
    lazy_unary!(InternalService, raft, ip::RaftRequest, ip::RaftReply);
    lazy_unary!(InternalService, propose, ip::ProposeRequest, ip::ProposeReply);
    lazy_unary!(InternalService, queue_info, ip::QueueInfoRequest, ip::QueueInfoReply);
    type ConsumeStream = <InternalService as Internal>::ConsumeStream;
    lazy_unary!(InternalService, consume, tonic::Streaming<ip::ForwardConsumeRequest>, Self::ConsumeStream);
}

#[tonic::async_trait]
impl Broker for LazyBroker {
    lazy_unary!(BrokerService, declare_exchange, pb::DeclareExchangeRequest, pb::Empty);
    lazy_unary!(BrokerService, delete_exchange, pb::DeleteExchangeRequest, pb::Empty);
    lazy_unary!(BrokerService, declare_queue, pb::DeclareQueueRequest, pb::DeclareQueueResponse);
    lazy_unary!(BrokerService, delete_queue, pb::DeleteQueueRequest, pb::DeleteQueueResponse);
    lazy_unary!(BrokerService, purge_queue, pb::PurgeQueueRequest, pb::PurgeQueueResponse);
    lazy_unary!(BrokerService, bind_queue, pb::BindRequest, pb::Empty);
    lazy_unary!(BrokerService, unbind_queue, pb::BindRequest, pb::Empty);
    lazy_unary!(BrokerService, publish, pb::PublishRequest, pb::PublishResponse);
    type PublishStreamStream = <BrokerService as Broker>::PublishStreamStream;
    lazy_unary!(BrokerService, publish_stream, tonic::Streaming<pb::PublishRequest>, Self::PublishStreamStream);
    lazy_unary!(BrokerService, get, pb::GetRequest, pb::GetResponse);
    lazy_unary!(BrokerService, settle, pb::SettleRequest, pb::Empty);
    type ConsumeStream = <BrokerService as Broker>::ConsumeStream;
    lazy_unary!(BrokerService, consume, tonic::Streaming<pb::ConsumeRequest>, Self::ConsumeStream);
    lazy_unary!(BrokerService, set_policy, pb::SetPolicyRequest, pb::Empty);
    lazy_unary!(BrokerService, clear_policy, pb::ClearPolicyRequest, pb::Empty);
    lazy_unary!(BrokerService, list_policies, pb::ListPoliciesRequest, pb::ListPoliciesResponse);
    lazy_unary!(BrokerService, list_queues, pb::ListQueuesRequest, pb::ListQueuesResponse);
    lazy_unary!(BrokerService, get_queue, pb::GetQueueRequest, pb::QueueInfo);
    lazy_unary!(BrokerService, list_exchanges, pb::ListExchangesRequest, pb::ListExchangesResponse);
    lazy_unary!(BrokerService, list_bindings, pb::ListBindingsRequest, pb::ListBindingsResponse);
    lazy_unary!(BrokerService, put_user, pb::PutUserRequest, pb::Empty);
    lazy_unary!(BrokerService, delete_user, pb::DeleteUserRequest, pb::Empty);
    lazy_unary!(BrokerService, set_permissions, pb::SetPermissionsRequest, pb::Empty);
    lazy_unary!(BrokerService, put_vhost, pb::PutVhostRequest, pb::Empty);
    lazy_unary!(BrokerService, delete_vhost, pb::DeleteVhostRequest, pb::Empty);
    lazy_unary!(BrokerService, cluster_status, pb::ClusterStatusRequest, pb::ClusterStatusResponse);
    lazy_unary!(BrokerService, overview, pb::OverviewRequest, pb::OverviewResponse);
}
