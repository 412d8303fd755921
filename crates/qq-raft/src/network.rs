//! Raft traffic between nodes: one HTTP/2 channel per peer carries every group.
//!
//! Each openraft RPC is encoded with postcard and sent as `Internal.Raft { group, kind,
//! payload }`; the receiving node looks the group up and hands the request to its `Raft`.
//! Channels are created lazily and shared (tonic channels multiplex streams), never one per RPC.
//!
//! Left out: streaming/pipelined append (openraft's sequential default is used) and chunked
//! snapshots (a snapshot travels as one message; the channel's size limit is raised for it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, v2::RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, alias::SnapshotOf, alias::VoteOf};
use qq_proto::internal::{RaftKind, RaftRequest, internal_client::InternalClient};
use serde::{Serialize, de::DeserializeOwned};
use tonic::transport::{Channel, Endpoint};

use crate::types::{GroupId, TypeConfig};

/// HTTP/2 flow-control windows used on every channel and server of the cluster.
pub const HTTP2_CONNECTION_WINDOW: u32 = 32 * 1024 * 1024;
pub const HTTP2_STREAM_WINDOW: u32 = 4 * 1024 * 1024;

/// Largest gRPC message between nodes (snapshots travel whole).
pub const MAX_INTERNAL_MESSAGE_BYTES: usize = 1024 * 1024 * 1024;

/// Shortest deadline for a replication RPC: openraft's own ttl is the heartbeat interval,
/// too short when the follower fsyncs inside append_entries (rust-stack-notes pitfall 9).
const MIN_RPC_TIMEOUT: Duration = Duration::from_secs(3);
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NetError(pub String);

/// Lazily connected channels to every peer node: one connection for Raft (replication, votes,
/// snapshots of every group) and one for the work nodes forward to each other (proposals,
/// relayed consumers, queue info).
///
/// Two connections, because HTTP/2 caps the streams open on one connection (the server's
/// SETTINGS_MAX_CONCURRENT_STREAMS): on a shared connection, forwarded proposals that wait for
/// a commit could fill it and queue the very replication requests their commit waits for.
/// qq-chaos found this as a distributed stall after a partition: nodes A and B each forwarded
/// proposals to the other's groups until neither could replicate to the other.
#[derive(Clone)]
pub struct Peers {
    inner: Arc<BTreeMap<u64, PeerChannels>>,
}

struct PeerChannels {
    address: String,
    raft: Channel,
    work: Channel,
}

impl Peers {
    pub fn new(peers: impl IntoIterator<Item = (u64, String)>) -> Result<Peers, NetError> {
        let mut map = BTreeMap::new();
        for (id, addr) in peers {
            let endpoint = Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|e| NetError(format!("peer {id} address '{addr}': {e}")))?
                .tcp_nodelay(true)
                .connect_timeout(Duration::from_secs(2))
                // Large windows: bulk replication, and h2's budget for small DATA frames (gRPC
                // unary replies are small) scales with the connection window; at the 64 KiB
                // default, hundreds of concurrent small replies trip its flood guard (GOAWAY
                // ENHANCE_YOUR_CALM "too_many_data_frames").
                .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
                .initial_stream_window_size(HTTP2_STREAM_WINDOW)
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(10));
            map.insert(
                id,
                PeerChannels {
                    raft: endpoint.connect_lazy(),
                    work: endpoint.connect_lazy(),
                    address: addr,
                },
            );
        }
        Ok(Peers {
            inner: Arc::new(map),
        })
    }

    pub fn ids(&self) -> Vec<u64> {
        self.inner.keys().copied().collect()
    }

    pub fn address(&self, id: u64) -> Option<&str> {
        self.inner.get(&id).map(|p| p.address.as_str())
    }

    /// A client of the internal service on `id`, for forwarded work.
    pub fn client(&self, id: u64) -> Option<InternalClient<Channel>> {
        self.inner.get(&id).map(|p| internal_client(&p.work))
    }

    /// A client of the internal service on `id`, on the Raft connection, for the liveness
    /// watch: it breaks when that connection does.
    pub fn watch_client(&self, id: u64) -> Option<InternalClient<Channel>> {
        self.raft_client(id)
    }

    /// A client of the internal service on `id`, on the connection reserved for Raft.
    fn raft_client(&self, id: u64) -> Option<InternalClient<Channel>> {
        self.inner.get(&id).map(|p| internal_client(&p.raft))
    }
}

fn internal_client(channel: &Channel) -> InternalClient<Channel> {
    InternalClient::new(channel.clone())
        .max_decoding_message_size(MAX_INTERNAL_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_INTERNAL_MESSAGE_BYTES)
}

/// Network factory of one group.
#[derive(Clone)]
pub struct GroupNetwork {
    pub group: GroupId,
    pub peers: Peers,
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = GroupClient;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> GroupClient {
        GroupClient {
            group: self.group,
            target,
            peers: self.peers.clone(),
        }
    }
}

/// The connection of one group to one peer.
pub struct GroupClient {
    group: GroupId,
    target: u64,
    peers: Peers,
}

impl GroupClient {
    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        kind: RaftKind,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let unreachable = |msg: String| RPCError::Unreachable(Unreachable::new(&NetError(msg)));
        let mut client = self
            .peers
            .raft_client(self.target)
            .ok_or_else(|| unreachable(format!("node {} is not a known peer", self.target)))?;
        let payload = postcard::to_stdvec(req)
            .map_err(|e| RPCError::Network(NetworkError::new(&NetError(format!("encode: {e}")))))?;
        let mut request = tonic::Request::new(RaftRequest {
            group: self.group,
            kind: kind as i32,
            payload: payload.into(),
        });
        request.set_timeout(timeout);
        let reply = match client.raft(request).await {
            Ok(r) => r.into_inner(),
            Err(status) => {
                return Err(unreachable(format!(
                    "node {}: {}",
                    self.target,
                    status.message()
                )));
            }
        };
        if !reply.error.is_empty() {
            return Err(unreachable(format!(
                "node {} group {}: {}",
                self.target, self.group, reply.error
            )));
        }
        postcard::from_bytes(&reply.payload).map_err(|e| {
            RPCError::Network(NetworkError::new(&NetError(format!("decode reply: {e}"))))
        })
    }
}

impl RaftNetworkV2<TypeConfig> for GroupClient {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(
            RaftKind::Append,
            &rpc,
            option.hard_ttl().max(MIN_RPC_TIMEOUT),
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(RaftKind::Vote, &rpc, option.hard_ttl().max(MIN_RPC_TIMEOUT))
            .await
    }

    /// Pre-Vote: a node that lost its leader asks first whether a majority would vote for it,
    /// and only then raises its term. A node cut off from the others can therefore not inflate
    /// its term and, when the network heals, does not depose the leader the majority kept.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(
            RaftKind::PreVote,
            &rpc,
            option.hard_ttl().max(MIN_RPC_TIMEOUT),
        )
        .await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, Vec<u8>>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let req = SnapshotRequest {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot,
        };
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            res = self.call(RaftKind::Snapshot, &req, SNAPSHOT_TIMEOUT) => res.map_err(StreamingError::from),
        }
    }

    fn backoff(&self) -> Option<openraft::network::Backoff> {
        None
    }
}

/// A whole snapshot on the wire.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct SnapshotRequest {
    pub vote: VoteOf<TypeConfig>,
    pub meta: openraft::alias::SnapshotMetaOf<TypeConfig>,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;

    use futures::Stream;
    use qq_proto::internal::internal_server::{Internal, InternalServer};
    use qq_proto::internal::{
        ForwardConsumeRequest, ForwardConsumeResponse, ProposeReply, ProposeRequest,
        QueueInfoReply, QueueInfoRequest, RaftReply, WatchEvent, WatchRequest,
    };
    use tokio::sync::{Notify, mpsc};
    use tonic::{Request, Response, Status, Streaming};

    use super::*;

    /// A peer that grants every vote at once and holds every proposal until the test ends.
    struct HoldingPeer {
        proposal_arrived: mpsc::UnboundedSender<()>,
        release: Arc<Notify>,
    }

    #[tonic::async_trait]
    impl Internal for HoldingPeer {
        async fn raft(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
            let req: VoteRequest<TypeConfig> = postcard::from_bytes(&request.into_inner().payload)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let resp = VoteResponse::<TypeConfig>::new(req.vote, None, true);
            Ok(Response::new(RaftReply {
                payload: postcard::to_stdvec(&resp).unwrap().into(),
                error: String::new(),
            }))
        }

        async fn propose(
            &self,
            _request: Request<ProposeRequest>,
        ) -> Result<Response<ProposeReply>, Status> {
            let _ = self.proposal_arrived.send(());
            self.release.notified().await;
            Err(Status::cancelled("test over"))
        }

        type ConsumeStream =
            Pin<Box<dyn Stream<Item = Result<ForwardConsumeResponse, Status>> + Send>>;

        async fn consume(
            &self,
            _request: Request<Streaming<ForwardConsumeRequest>>,
        ) -> Result<Response<Self::ConsumeStream>, Status> {
            Err(Status::unimplemented("not in this test"))
        }

        async fn queue_info(
            &self,
            _request: Request<QueueInfoRequest>,
        ) -> Result<Response<QueueInfoReply>, Status> {
            Err(Status::unimplemented("not in this test"))
        }

        type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

        async fn watch(
            &self,
            _request: Request<WatchRequest>,
        ) -> Result<Response<Self::WatchStream>, Status> {
            Err(Status::unimplemented("not in this test"))
        }
    }

    /// Regression (found by qq-chaos): forwarded proposals waiting for a commit must never keep
    /// Raft requests from reaching a peer. The peer allows one open stream per connection and
    /// holds a forwarded proposal on it; a vote to the same peer must still get through.
    #[tokio::test]
    async fn raft_requests_are_not_queued_behind_forwarded_work() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (arrived_tx, mut arrived) = mpsc::unbounded_channel();
        let release = Arc::new(Notify::new());
        let peer = HoldingPeer {
            proposal_arrived: arrived_tx,
            release: release.clone(),
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .max_concurrent_streams(1)
                .add_service(InternalServer::new(peer))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let peers = Peers::new([(1, address)]).unwrap();

        let mut work = peers.client(1).unwrap();
        let held = tokio::spawn(async move {
            work.propose(ProposeRequest {
                group: 7,
                payload: Default::default(),
            })
            .await
        });
        arrived.recv().await.expect("the proposal reaches the peer");

        let mut raft = GroupNetwork {
            group: 7,
            peers: peers.clone(),
        }
        .new_client(1, &BasicNode::default())
        .await;
        let vote = VoteOf::<TypeConfig>::new(3, 2);
        let granted = tokio::time::timeout(
            Duration::from_secs(20),
            raft.vote(
                VoteRequest::new(vote, None),
                RPCOption::new(Duration::from_secs(2)),
            ),
        )
        .await
        .expect("the vote must not wait for the held proposal")
        .expect("the vote is answered");
        assert!(granted.vote_granted);

        release.notify_waiters();
        let _ = held.await;
    }
}
