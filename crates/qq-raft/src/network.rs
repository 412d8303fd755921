//! Raft traffic between nodes: one HTTP/2 channel per peer carries every group.
//!
//! Each openraft RPC is encoded with postcard as a `RaftRequest { group, kind, payload }`; the
//! receiving node looks the group up and hands the request to its `Raft`. Small requests (votes,
//! heartbeats, small appends) of every queue group travel batched on one stream per peer
//! ([`crate::mux`]), those of the metadata group on a second one, so that queue groups that
//! fill theirs never hold up the metadata's heartbeats and votes; large appends and snapshot
//! chunks go as unary `Internal.Raft` calls.
//! Channels are created lazily and shared (tonic channels multiplex streams), never one per RPC.
//! Every channel is made by the node's [`Transport`] ([`crate::transport`]), handed in at start
//! with the clock: TCP in production, in-memory pipes in tests and a simulator.
//!
//! Node-to-node traffic goes to each peer's cluster address (its own port, apart from the
//! client port) over mutual TLS: the node presents its certificate and accepts only a server
//! whose certificate chains to the cluster CA and names [`CLUSTER_TLS_NAME`]. Without
//! [`PeerTls`] (`insecure_cluster = true`) the channels speak plain `http://`.
//!
//! A cluster address may be a host name (`quorumq-1.quorumq-headless:7201`): it is kept as
//! text, never resolved here. tonic's lazy channel resolves it (hyper's `HttpConnector`, the
//! system resolver: /etc/hosts, DNS) on every connection attempt, and reconnects, resolving
//! again, after the connection breaks; a peer that went silent under its old address is
//! found dead by HTTP/2 keep-alive (5 s, 10 s timeout), so no address outlives a failure. A
//! node that comes back with another IP under the same name is reached again without an
//! operator (tests/tests/cluster/names.rs; it fails if the name is resolved once). TLS checks
//! [`CLUSTER_TLS_NAME`], whatever name or address was dialled.
//!
//! An append carries at most [`MAX_APPEND_BYTES`] of entries (at least one entry): the rest
//! goes in the next request, openraft told so by a `PartialSuccess`. A peer that does not
//! answer is retried with a growing pause ([`UNREACHABLE_BACKOFF`]), not at once, so a leader
//! does not keep sending appends or snapshots to a node that is down.
//!
//! A snapshot travels as a file in chunks of at most [`SNAPSHOT_CHUNK_BYTES`]
//! ([`crate::snapshot`]): the sender first asks where the receiver stands (a transfer that broke
//! resumes there), then sends chunk after chunk, each read from the file when it is sent. A
//! peer that does not answer costs one failed probe per backoff step, not a snapshot.
//!
//! Left out: streaming/pipelined append (openraft's sequential default is used).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, v2::RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, alias::SnapshotOf, alias::VoteOf};
use qq_proto::internal::{RaftKind, RaftReply, RaftRequest};
use serde::{Serialize, de::DeserializeOwned};
use tokio::sync::watch;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::clock::Clock;
use crate::mux::{self, Mux};
use crate::protocol::{self, PeerClient};
use crate::snapshot::{ChunkReply, SNAPSHOT_CHUNK_BYTES, SnapshotChunk, SnapshotFile};
use crate::transport::Transport;
use crate::types::{GroupId, META_GROUP, TypeConfig};

/// HTTP/2 flow-control windows used on every channel and server of the cluster.
pub const HTTP2_CONNECTION_WINDOW: u32 = 32 * 1024 * 1024;
pub const HTTP2_STREAM_WINDOW: u32 = 4 * 1024 * 1024;

/// Largest gRPC message between nodes: an append of one large entry (a batch of publishes) is
/// the largest; snapshots travel in chunks of [`SNAPSHOT_CHUNK_BYTES`].
pub const MAX_INTERNAL_MESSAGE_BYTES: usize = 1024 * 1024 * 1024;

/// Shortest deadline for a replication RPC: openraft's own ttl is the heartbeat interval,
/// too short when the follower fsyncs inside append_entries (rust-stack-notes pitfall 9).
const MIN_RPC_TIMEOUT: Duration = Duration::from_secs(3);
/// Deadline of one snapshot chunk (4 MiB, written and, for the last, installed by the
/// receiver: a large queue's install streams its bodies into RocksDB first).
const CHUNK_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline of the install after the last chunk: the receiver streams every body of the
/// snapshot into RocksDB before it answers.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Most bytes of entries (their payloads, plus a little per entry) in one append request;
/// a single larger entry still goes alone.
pub const MAX_APPEND_BYTES: usize = 4 * 1024 * 1024;
/// What an entry costs besides its payload in [`MAX_APPEND_BYTES`] (log id, framing).
const ENTRY_OVERHEAD_BYTES: usize = 64;

/// Pauses between attempts to reach a peer that did not answer: doubling from 100 ms to 2 s.
pub const UNREACHABLE_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(2));

/// How many of `entries`, from the first, fit in [`MAX_APPEND_BYTES`] (at least one).
fn entries_within_budget(entries: &[openraft::alias::EntryOf<TypeConfig>]) -> usize {
    let mut total = 0usize;
    for (i, e) in entries.iter().enumerate() {
        let size = ENTRY_OVERHEAD_BYTES
            + match &e.payload {
                openraft::EntryPayload::Normal(r) => r.payload.len(),
                _ => 0,
            };
        if i > 0 && total + size > MAX_APPEND_BYTES {
            return i;
        }
        total += size;
    }
    entries.len()
}

/// The DNS name every node certificate carries (besides its hosts) and that peers check: any
/// node of the cluster may sit behind any cluster address, its CA is what makes it a member.
pub const CLUSTER_TLS_NAME: &str = "qq-node";

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NetError(pub String);

/// This node's TLS identity towards its peers: the cluster CA (PEM) that peer certificates must
/// chain to, and this node's certificate and key (PEM), presented as a client certificate.
#[derive(Clone)]
pub struct PeerTls {
    pub ca_pem: Vec<u8>,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl PeerTls {
    /// The client side of mutual TLS towards a peer's cluster port.
    pub fn client_config(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .domain_name(CLUSTER_TLS_NAME)
    }
}

/// One peer: its id, the client address that status and redirects show, and the cluster
/// address its node-to-node service listens on.
#[derive(Clone, Debug)]
pub struct PeerAddress {
    pub id: u64,
    pub address: String,
    pub cluster_address: String,
}

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
    inner: Arc<PeersInner>,
}

struct PeersInner {
    map: RwLock<BTreeMap<u64, Arc<PeerChannels>>>,
    tls: Option<PeerTls>,
    /// What makes every channel.
    transport: Arc<dyn Transport>,
    /// Times the batched streams' pauses ([`Mux`]).
    clock: Clock,
    /// Bumped on every change of the peer set (a node joined or was forgotten).
    changed: watch::Sender<u64>,
    /// While set, this node neither asks for votes nor (in qq-node's service) grants them:
    /// its data directory is new and the cluster has not yet said it may
    /// ([`crate::incarnation`]).
    votes_held: AtomicBool,
}

struct PeerChannels {
    address: String,
    cluster_address: String,
    raft: Channel,
    work: Channel,
    /// The batched Raft stream of the queue groups, on the `raft` connection.
    mux: Mux,
    /// The metadata group's own batched stream, on the same connection: the metadata is the
    /// cluster's control plane (declares, membership, where queues are), and thousands of queue
    /// groups catching up or electing at once (a node hosting 10 000 queues restarting) fill
    /// the queue groups' stream to its bound; its heartbeats and votes must not queue behind
    /// them.
    meta_mux: Mux,
}

impl Peers {
    /// Channels to every peer's cluster address: `https://` with `tls`, plain `http://`
    /// without (only when the node runs with `insecure_cluster = true`), made by `transport`.
    pub fn new(
        peers: impl IntoIterator<Item = PeerAddress>,
        tls: Option<&PeerTls>,
        transport: Arc<dyn Transport>,
        clock: Clock,
    ) -> Result<Peers, NetError> {
        let mut inner = PeersInner {
            map: RwLock::new(BTreeMap::new()),
            tls: tls.cloned(),
            transport,
            clock,
            changed: watch::Sender::new(0),
            votes_held: AtomicBool::new(false),
        };
        let mut map = BTreeMap::new();
        for peer in peers {
            map.insert(peer.id, Arc::new(PeerChannels::connect(&peer, &inner)?));
        }
        *inner.map.get_mut().expect("peers lock poisoned") = map;
        Ok(Peers {
            inner: Arc::new(inner),
        })
    }

    /// Make the peer set exactly `peers` (a node joined or was forgotten): channels of peers
    /// whose addresses did not change are kept. True if anything changed.
    pub fn set(&self, peers: impl IntoIterator<Item = PeerAddress>) -> Result<bool, NetError> {
        let wanted: BTreeMap<u64, PeerAddress> = peers.into_iter().map(|p| (p.id, p)).collect();
        let mut map = self.inner.map.write().expect("peers lock poisoned");
        let mut changed = false;
        map.retain(|id, _| {
            let keep = wanted.contains_key(id);
            changed |= !keep;
            keep
        });
        for (id, peer) in wanted {
            let same = map.get(&id).is_some_and(|c| {
                c.address == peer.address && c.cluster_address == peer.cluster_address
            });
            if !same {
                map.insert(id, Arc::new(PeerChannels::connect(&peer, &self.inner)?));
                changed = true;
            }
        }
        drop(map);
        if changed {
            self.inner.changed.send_modify(|v| *v += 1);
        }
        Ok(changed)
    }

    /// Hold (or release) this node's votes in every group: while held, its candidates' vote
    /// and pre-vote requests fail here without being sent, and qq-node's service refuses the
    /// vote requests it receives. Appends and snapshots go on: a node may take, persist and
    /// acknowledge new entries; only its word on who may lead is withheld.
    pub fn hold_votes(&self, held: bool) {
        self.inner.votes_held.store(held, Ordering::SeqCst);
    }

    /// Whether this node's votes are held ([`Peers::hold_votes`]).
    pub fn votes_held(&self) -> bool {
        self.inner.votes_held.load(Ordering::SeqCst)
    }

    /// Notified whenever the peer set changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    fn get(&self, id: u64) -> Option<Arc<PeerChannels>> {
        self.inner
            .map
            .read()
            .expect("peers lock poisoned")
            .get(&id)
            .cloned()
    }

    pub fn ids(&self) -> Vec<u64> {
        self.inner
            .map
            .read()
            .expect("peers lock poisoned")
            .keys()
            .copied()
            .collect()
    }

    pub fn contains(&self, id: u64) -> bool {
        self.get(id).is_some()
    }

    /// Node `id`'s client address (what status and redirects show).
    pub fn address(&self, id: u64) -> Option<String> {
        self.get(id).map(|p| p.address.clone())
    }

    /// Node `id`'s cluster address (its node-to-node service).
    pub fn cluster_address(&self, id: u64) -> Option<String> {
        self.get(id).map(|p| p.cluster_address.clone())
    }

    /// A client of the internal service on `id`, for forwarded work.
    pub fn client(&self, id: u64) -> Option<PeerClient> {
        self.get(id).map(|p| internal_client(&p.work))
    }

    /// A client of the internal service on `id`, on the Raft connection, for the liveness
    /// watch: it breaks when that connection does.
    pub fn watch_client(&self, id: u64) -> Option<PeerClient> {
        self.raft_client(id)
    }

    /// Sends one Raft request to node `id` and waits at most `timeout` for its reply: batched
    /// with other groups' requests on the peer's stream when small, as a call of its own when
    /// large (or a snapshot chunk). The error says why no reply came.
    pub async fn raft_call(
        &self,
        id: u64,
        request: RaftRequest,
        timeout: Duration,
    ) -> Result<RaftReply, String> {
        let peer = self
            .get(id)
            .ok_or_else(|| format!("node {id} is not a known peer"))?;
        let alone = request.payload.len() > mux::MAX_BATCHED_PAYLOAD_BYTES
            || request.kind == RaftKind::SnapshotChunk as i32;
        if !alone {
            let mux = if request.group == META_GROUP {
                &peer.meta_mux
            } else {
                &peer.mux
            };
            return mux.call(request, timeout).await;
        }
        let mut request = tonic::Request::new(request);
        request.set_timeout(timeout);
        match internal_client(&peer.raft).raft(request).await {
            Ok(reply) => Ok(reply.into_inner()),
            Err(status) => Err(format!("node {id}: {}", status.message())),
        }
    }

    /// A client of the internal service on `id`, on the connection reserved for Raft.
    fn raft_client(&self, id: u64) -> Option<PeerClient> {
        self.get(id).map(|p| internal_client(&p.raft))
    }
}

impl PeerChannels {
    /// The channels to `peer`, made by `peers`' transport (lazily: nothing connects yet).
    fn connect(peer: &PeerAddress, peers: &PeersInner) -> Result<PeerChannels, NetError> {
        let PeerAddress {
            id,
            address,
            cluster_address,
        } = peer;
        let tls = peers.tls.as_ref();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint =
            Endpoint::from_shared(format!("{scheme}://{cluster_address}")).map_err(|e| {
                NetError(format!(
                    "peer {id} cluster address '{cluster_address}': {e}"
                ))
            })?;
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls.client_config())
                .map_err(|e| NetError(format!("peer {id} TLS: {e}")))?;
        }
        let endpoint = endpoint
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
        let raft = peers.transport.channel(&endpoint);
        let mux = || Mux::new(raft.clone(), *id, MAX_INTERNAL_MESSAGE_BYTES, peers.clock);
        Ok(PeerChannels {
            mux: mux(),
            meta_mux: mux(),
            work: peers.transport.channel(&endpoint),
            raft,
            address: address.clone(),
            cluster_address: cluster_address.clone(),
        })
    }
}

fn internal_client(channel: &Channel) -> PeerClient {
    protocol::client(channel.clone(), MAX_INTERNAL_MESSAGE_BYTES)
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
    /// Err while this node's votes are held: its candidacy goes nowhere.
    fn refuse_if_votes_held(&self) -> Result<(), RPCError<TypeConfig>> {
        if !self.peers.votes_held() {
            return Ok(());
        }
        Err(RPCError::Unreachable(Unreachable::new(&NetError(format!(
            "group {}: not asking node {} for its vote: this node's votes are held until the \
             cluster accepts its data directory",
            self.group, self.target
        )))))
    }

    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        kind: RaftKind,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let unreachable = |msg: String| RPCError::Unreachable(Unreachable::new(&NetError(msg)));
        let payload = crate::encoding::to_vec_exact(req)
            .map_err(|e| RPCError::Network(NetworkError::new(&NetError(format!("encode: {e}")))))?;
        let request = RaftRequest {
            group: self.group,
            kind: kind as i32,
            payload: payload.into(),
        };
        let reply = self
            .peers
            .raft_call(self.target, request, timeout)
            .await
            .map_err(unreachable)?;
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

impl GroupClient {
    /// Sends a snapshot file chunk by chunk: first an empty chunk that asks where the receiver
    /// stands, then from there on. Only one chunk is in memory at a time.
    async fn send_snapshot(
        &self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, SnapshotFile>,
    ) -> Result<SnapshotResponse<TypeConfig>, RPCError<TypeConfig>> {
        let file = snapshot.snapshot;
        let total = file.len();
        let mut chunk = SnapshotChunk {
            vote,
            meta: snapshot.meta,
            total,
            offset: 0,
            data: Vec::new(),
        };
        loop {
            let timeout = if chunk.offset + chunk.data.len() as u64 >= total {
                INSTALL_TIMEOUT
            } else {
                CHUNK_TIMEOUT
            };
            let sent = chunk.data.len();
            let reply: ChunkReply = self.call(RaftKind::SnapshotChunk, &chunk, timeout).await?;
            let next = match reply {
                ChunkReply::Done(resp) => return Ok(resp),
                ChunkReply::Next(next) => next,
            };
            if next > total || (sent > 0 && next == chunk.offset) {
                return Err(RPCError::Network(NetworkError::new(&NetError(format!(
                    "node {} group {}: snapshot transfer makes no progress (at {next} of {total})",
                    self.target, self.group
                )))));
            }
            let reader = file.clone();
            chunk.data = crate::lockstep::spawn_blocking(move || {
                reader.read_chunk(next, SNAPSHOT_CHUNK_BYTES)
            })
            .await
            .map_err(|e| io_error(format!("snapshot read task: {e}")))
            .and_then(|r| r.map_err(|e| io_error(e.to_string())))?;
            chunk.offset = next;
        }
    }
}

fn io_error(msg: String) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::new(&NetError(msg)))
}

impl RaftNetworkV2<TypeConfig> for GroupClient {
    type SnapshotData = SnapshotFile;

    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        // The byte budget: send the first entries that fit; on success, say how far they went.
        let fit = entries_within_budget(&rpc.entries);
        let cut = (fit < rpc.entries.len()).then(|| {
            rpc.entries.truncate(fit);
            rpc.entries.last().map(|e| e.log_id)
        });
        let reply = self
            .call(
                RaftKind::Append,
                &rpc,
                option.hard_ttl().max(MIN_RPC_TIMEOUT),
            )
            .await?;
        Ok(match (reply, cut) {
            (AppendEntriesResponse::Success, Some(last)) => {
                AppendEntriesResponse::PartialSuccess(last)
            }
            (reply, _) => reply,
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.refuse_if_votes_held()?;
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
        self.refuse_if_votes_held()?;
        self.call(
            RaftKind::PreVote,
            &rpc,
            option.hard_ttl().max(MIN_RPC_TIMEOUT),
        )
        .await
    }

    /// Leadership transfer: the leader tells the target (and every voter) to take over; without
    /// it a transfer would wait for an election timeout and may elect another node.
    async fn transfer_leader(
        &mut self,
        req: openraft::raft::TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<openraft::raft::TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(
            RaftKind::TransferLeader,
            &req,
            option.hard_ttl().max(MIN_RPC_TIMEOUT),
        )
        .await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, SnapshotFile>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            res = self.send_snapshot(vote, snapshot) => res.map_err(StreamingError::from),
        }
    }

    /// Used by openraft after an `Unreachable` error, until the peer answers again.
    fn backoff(&self) -> Option<openraft::network::Backoff> {
        let (first, max) = UNREACHABLE_BACKOFF;
        Some(openraft::network::Backoff::new(std::iter::successors(
            Some(first),
            move |d| Some((*d * 2).min(max)),
        )))
    }
}

#[cfg(test)]
mod budget_tests;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod mux_tests;

#[cfg(test)]
mod tls_tests;

#[cfg(test)]
mod transport_tests;
