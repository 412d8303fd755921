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

/// Lazily connected channels to every peer node, shared by all groups and by forwarding.
#[derive(Clone)]
pub struct Peers {
    inner: Arc<BTreeMap<u64, (String, Channel)>>,
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
            map.insert(id, (addr, endpoint.connect_lazy()));
        }
        Ok(Peers {
            inner: Arc::new(map),
        })
    }

    pub fn ids(&self) -> Vec<u64> {
        self.inner.keys().copied().collect()
    }

    pub fn address(&self, id: u64) -> Option<&str> {
        self.inner.get(&id).map(|(a, _)| a.as_str())
    }

    /// A client of the internal service on `id`.
    pub fn client(&self, id: u64) -> Option<InternalClient<Channel>> {
        self.inner.get(&id).map(|(_, ch)| {
            InternalClient::new(ch.clone())
                .max_decoding_message_size(MAX_INTERNAL_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_INTERNAL_MESSAGE_BYTES)
        })
    }
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
            .client(self.target)
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
