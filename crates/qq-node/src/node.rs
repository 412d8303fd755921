//! A quorumq node: the metadata group, the queue groups it is a member of, and the one path
//! every command takes to the leader of its group.
//!
//! The path of a message (DESIGN-NOTES §1): publish on any node → route with the local
//! metadata replica → [`Node::propose_queue`] to each routed queue's leader (locally, or
//! forwarded over the internal service to the node that leads) → commit on a majority (each
//! node's log append is fsynced by the store's single fsync thread) → apply → reply.
//!
//! Queue groups are started and stopped by reconciliation against the metadata replica after
//! every metadata apply (and on a timer): the node never has to interpret metadata effects in
//! order, it just makes its running groups match what the metadata says.

use openraft::async_runtime::WatchReceiver;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Raft, ServerState, SnapshotPolicy};
use qq_core::meta::{MetaCommand, MetaError, MetaReply, QueueMeta};
use qq_core::queue::{Command, Reply};
use qq_core::{NodeId, QueueId};
use qq_proto::internal::{ProposeReply, ProposeRequest};
use qq_raft::log_store::LogStore;
use qq_raft::network::{GroupNetwork, Peers};
use qq_raft::store::Store;
use qq_raft::{GroupId, META_GROUP, Request, TypeConfig};
use serde::{Serialize, de::DeserializeOwned};
use tokio::sync::mpsc;
use tonic::Status;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::config::Config;
use crate::meta_sm::{MetaShared, MetaSm};
use crate::queue_sm::{
    DeadLetterJob, QueueEntry, QueueReplyOut, QueueRequest, QueueShared, QueueSm,
};

/// How long a proposal keeps retrying (leader elections, forwarding) before UNAVAILABLE.
/// `ProposeReply.code`: this node does not lead the group (`forward_to` may hint who does).
pub const NOT_LEADER: u32 = 1;

/// How long a metadata change waits for reachable nodes to apply it.
const META_PROPAGATION_WAIT: Duration = Duration::from_secs(3);

const PROPOSE_DEADLINE: Duration = Duration::from_secs(8);

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A running queue group on this node.
#[derive(Clone)]
pub struct QueueGroup {
    pub raft: Raft<TypeConfig, QueueSm>,
    pub shared: Arc<QueueShared>,
    pub meta: QueueMeta,
}

/// Why a local proposal did not go through.
enum LocalError {
    /// Not the leader; the hint if known.
    Forward(Option<NodeId>),
    /// The group is not running on this node.
    NotHere,
    Unavailable(String),
}

pub struct Node {
    pub id: NodeId,
    pub config: Config,
    pub store: Store,
    pub peers: Peers,
    pub meta: Arc<MetaShared>,
    pub meta_raft: Raft<TypeConfig, MetaSm>,
    pub queues: RwLock<HashMap<GroupId, QueueGroup>>,
    raft_config: Arc<openraft::Config>,
    consumer_seq: AtomicU64,
    key_seq: AtomicU64,
    pub dead_letter_tx: mpsc::UnboundedSender<DeadLetterJob>,
    /// Permission checks that passed, valid for one metadata version (compiling the
    /// permission regexes on every publish was the top cost in a profile).
    pub granted: std::sync::Mutex<(u64, std::collections::HashSet<(String, String, u8, String)>)>,
}

impl Node {
    /// Open storage, start the metadata group (initialising the cluster if this node has the
    /// lowest id and nothing was initialised yet) and return the node. Background loops are
    /// started by [`Node::spawn_background`].
    pub async fn start(
        config: Config,
    ) -> anyhow::Result<(Arc<Node>, mpsc::UnboundedReceiver<DeadLetterJob>)> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| anyhow::anyhow!("create data_dir {}: {e}", config.data_dir.display()))?;
        let store = Store::open(&config.data_dir.join("db"))?;
        let peers = Peers::new(config.peers.iter().map(|p| (p.id, p.address.clone())))?;
        let raft_config = Arc::new(
            openraft::Config {
                cluster_name: "quorumq".into(),
                heartbeat_interval: config.heartbeat_ms,
                election_timeout_min: config.election_timeout_min_ms,
                election_timeout_max: config.election_timeout_max_ms,
                snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_after_entries),
                max_in_snapshot_log_to_keep: 1000,
                // A node back from a partition must not depose healthy leaders (found by
                // qq-chaos: every group stalled for seconds after each heal without it).
                enable_pre_vote: Some(true),
                ..Default::default()
            }
            .validate()?,
        );
        let meta = MetaShared::new(store.clone());
        let meta_raft = Raft::new(
            config.node_id,
            raft_config.clone(),
            GroupNetwork {
                group: META_GROUP,
                peers: peers.clone(),
            },
            LogStore::new(store.clone(), META_GROUP),
            MetaSm::new(meta.clone()),
        )
        .await?;
        let lowest = *config
            .node_ids()
            .first()
            .expect("validated: peers not empty");
        if lowest == config.node_id && !meta_raft.is_initialized().await? {
            let members: BTreeMap<u64, BasicNode> = config
                .peers
                .iter()
                .map(|p| {
                    (
                        p.id,
                        BasicNode {
                            addr: p.address.clone(),
                        },
                    )
                })
                .collect();
            info!(?members, "initialising the cluster's metadata group");
            meta_raft.initialize(members).await?;
        }
        let (dead_letter_tx, dead_letter_rx) = mpsc::unbounded_channel();
        let seed = now_ms() * 1000;
        let node = Arc::new(Node {
            id: config.node_id,
            config,
            store,
            peers,
            meta,
            meta_raft,
            queues: RwLock::new(HashMap::new()),
            raft_config,
            consumer_seq: AtomicU64::new(seed),
            key_seq: AtomicU64::new(seed),
            dead_letter_tx,
            granted: std::sync::Mutex::new((0, Default::default())),
        });
        Ok((node, dead_letter_rx))
    }

    /// Reconcile queue groups after every metadata apply, and every few seconds.
    pub fn spawn_background(self: &Arc<Self>) {
        let node = self.clone();
        let mut applied = self.meta.applied.subscribe();
        tokio::spawn(async move {
            loop {
                node.reconcile().await;
                tokio::select! {
                    r = applied.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        });
    }

    /// A consumer id unique within any queue: node id in the top byte.
    pub fn next_consumer_id(&self) -> u64 {
        (self.id << 56) | (self.consumer_seq.fetch_add(1, Ordering::Relaxed) & ((1 << 56) - 1))
    }

    /// An idempotency key for one publish to one queue: retries reuse it.
    pub fn next_publish_key(&self) -> String {
        format!(
            "p{}.{}",
            self.id,
            self.key_seq.fetch_add(1, Ordering::Relaxed)
        )
    }

    pub fn queue_group(&self, group: GroupId) -> Option<QueueGroup> {
        self.queues.read().unwrap().get(&group).cloned()
    }

    /// Make the running queue groups match the metadata.
    async fn reconcile(self: &Arc<Self>) {
        let wanted: Vec<QueueMeta> = {
            let state = self.meta.state.read().unwrap();
            state
                .queues()
                .filter(|q| q.members.contains(&self.id))
                .cloned()
                .collect()
        };
        let wanted_ids: std::collections::HashSet<QueueId> = wanted.iter().map(|q| q.id).collect();
        let running: Vec<GroupId> = self.queues.read().unwrap().keys().copied().collect();
        for group in running {
            if !wanted_ids.contains(&group) {
                self.stop_queue_group(group).await;
            }
        }
        for qm in wanted {
            let existing = self.queue_group(qm.id);
            match existing {
                None => {
                    if let Err(e) = self.start_queue_group(qm.clone()).await {
                        warn!(queue = %qm.name, group = qm.id, "cannot start queue group: {e:#}");
                    }
                }
                Some(g) => {
                    // Policy changes reach a queue as UpdateConfig in its own log, proposed by its leader.
                    let current = g.shared.state.lock().unwrap().config().clone();
                    if current != qm.config && g.raft.is_leader() {
                        let cmd = Command::UpdateConfig {
                            now_ms: now_ms(),
                            config: qm.config.clone(),
                        };
                        if let Err(e) = self
                            .propose_queue(qm.id, QueueRequest { cmd, message: None })
                            .await
                        {
                            debug!(group = qm.id, "update config not applied yet: {e}");
                        }
                    }
                    if let Some(g) = self.queues.write().unwrap().get_mut(&qm.id) {
                        g.meta = qm;
                    }
                }
            }
        }
    }

    async fn start_queue_group(self: &Arc<Self>, qm: QueueMeta) -> anyhow::Result<()> {
        let span = info_span!("queue", node_id = self.id, queue = %qm.name, group = qm.id);
        let shared = QueueShared::new(
            qm.id,
            self.store.clone(),
            qm.config.clone(),
            self.dead_letter_tx.clone(),
        );
        let raft = Raft::new(
            self.id,
            self.raft_config.clone(),
            GroupNetwork {
                group: qm.id,
                peers: self.peers.clone(),
            },
            LogStore::new(self.store.clone(), qm.id),
            QueueSm::new(shared.clone()),
        )
        .instrument(span.clone())
        .await?;
        self.queues.write().unwrap().insert(
            qm.id,
            QueueGroup {
                raft: raft.clone(),
                shared: shared.clone(),
                meta: qm.clone(),
            },
        );
        if qm.members.first() == Some(&self.id) && !raft.is_initialized().await? {
            let members: BTreeMap<u64, BasicNode> = qm
                .members
                .iter()
                .map(|id| {
                    (
                        *id,
                        BasicNode {
                            addr: self.peers.address(*id).unwrap_or_default().to_string(),
                        },
                    )
                })
                .collect();
            span.in_scope(|| info!(?members, "initialising queue group"));
            raft.initialize(members).await?;
        }
        crate::leader::spawn_queue_tasks(self.clone(), qm.id, raft, shared, span);
        Ok(())
    }

    async fn stop_queue_group(&self, group: GroupId) {
        let removed = self.queues.write().unwrap().remove(&group);
        if let Some(g) = removed {
            info!(group, queue = %g.meta.name, "queue deleted: stopping its group");
            g.shared.cancel_consumers("queue deleted", false);
            let _ = g.raft.shutdown().await;
            if let Err(e) = self.store.delete_group(group) {
                warn!(group, "delete data of queue group: {e}");
            }
        }
    }

    /// Propose to a group whose leader may be anywhere; returns the encoded reply. Retries
    /// through elections and forwarding until [`PROPOSE_DEADLINE`], then UNAVAILABLE.
    pub async fn propose(&self, group: GroupId, payload: Vec<u8>) -> Result<Vec<u8>, Status> {
        let deadline = tokio::time::Instant::now() + PROPOSE_DEADLINE;
        let mut hint: Option<NodeId> = None;
        let mut attempt = 0usize;
        loop {
            let target = hint.filter(|h| *h != self.id);
            let (next, error) = match target {
                None => match self.propose_local(group, payload.clone()).await {
                    Ok(bytes) => return Ok(bytes),
                    Err(LocalError::Forward(h)) => (h, "no leader elected yet".to_string()),
                    Err(LocalError::NotHere) => (
                        self.member_after(group, None, attempt),
                        "not a member".into(),
                    ),
                    Err(LocalError::Unavailable(e)) => (None, e),
                },
                Some(t) => match self.propose_remote(t, group, payload.clone()).await {
                    Ok(Ok(bytes)) => return Ok(bytes),
                    Ok(Err(h)) => (h, format!("node {t} is not the leader")),
                    Err(e) => (self.member_after(group, Some(t), attempt), e),
                },
            };
            let moved = next.is_some() && next != hint;
            hint = next;
            attempt += 1;
            if tokio::time::Instant::now() >= deadline {
                let what = if group == META_GROUP {
                    "the metadata".to_string()
                } else {
                    format!("queue group {group}")
                };
                return Err(Status::unavailable(format!(
                    "no quorum for {what} right now: {error} (safe to retry)"
                )));
            }
            if !moved {
                tokio::time::sleep(Duration::from_millis((20 * attempt as u64).min(250))).await;
            }
        }
    }

    /// Some member of the group other than `not`, rotating with `attempt`.
    fn member_after(&self, group: GroupId, not: Option<NodeId>, attempt: usize) -> Option<NodeId> {
        let members: Vec<NodeId> = self
            .group_members(group)
            .into_iter()
            .filter(|m| Some(*m) != not)
            .collect();
        if members.is_empty() {
            None
        } else {
            Some(members[attempt % members.len()])
        }
    }

    /// Members of a group by the metadata (every node for the metadata group).
    pub fn group_members(&self, group: GroupId) -> Vec<NodeId> {
        if group == META_GROUP {
            return self.peers.ids();
        }
        self.meta
            .state
            .read()
            .unwrap()
            .queue_by_id(group)
            .map(|q| q.members.clone())
            .unwrap_or_default()
    }

    /// Ok(Ok(reply)) done; Ok(Err(hint)) not the leader there.
    async fn propose_remote(
        &self,
        target: NodeId,
        group: GroupId,
        payload: Vec<u8>,
    ) -> Result<Result<Vec<u8>, Option<NodeId>>, String> {
        let mut client = self
            .peers
            .client(target)
            .ok_or_else(|| format!("unknown node {target}"))?;
        let mut req = tonic::Request::new(ProposeRequest {
            group,
            payload: payload.into(),
        });
        req.set_timeout(Duration::from_secs(5));
        let reply = client
            .propose(req)
            .await
            .map_err(|s| format!("node {target}: {}", s.message()))?
            .into_inner();
        if !reply.error.is_empty() {
            return Err(format!("node {target}: {}", reply.error));
        }
        if reply.code == NOT_LEADER {
            return Ok(Err(if reply.forward_to == 0 {
                None
            } else {
                Some(reply.forward_to)
            }));
        }
        Ok(Ok(reply.payload.to_vec()))
    }

    async fn propose_local(&self, group: GroupId, payload: Vec<u8>) -> Result<Vec<u8>, LocalError> {
        let req = Request { payload };
        let result = if group == META_GROUP {
            self.meta_raft.client_write(req).await
        } else {
            let Some(g) = self.queue_group(group) else {
                return Err(LocalError::NotHere);
            };
            g.raft.client_write(req).await
        };
        match result {
            Ok(resp) => Ok(resp.data.payload),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))
            | Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(f))) => {
                Err(LocalError::Forward(f.leader_id))
            }
            Err(e) => Err(LocalError::Unavailable(e.to_string())),
        }
    }

    /// Serve a forwarded proposal: (payload, forward_to hint, error).
    pub async fn serve_propose(&self, group: GroupId, payload: Vec<u8>) -> ProposeReply {
        let mut reply = ProposeReply::default();
        match self.propose_local(group, payload).await {
            Ok(bytes) => reply.payload = bytes.into(),
            Err(LocalError::Forward(h)) => {
                reply.code = NOT_LEADER;
                reply.forward_to = h.unwrap_or(0);
            }
            Err(LocalError::NotHere) => {
                reply.error = format!("group {group} is not running on this node")
            }
            Err(LocalError::Unavailable(e)) => reply.error = e,
        }
        reply
    }

    pub async fn propose_queue(&self, group: GroupId, req: QueueRequest) -> Result<Reply, Status> {
        Ok(self.propose_queue_full(group, req).await?.reply)
    }

    /// Like [`Node::propose_queue`], with the message of a `Get` read on the leader.
    pub async fn propose_queue_full(
        &self,
        group: GroupId,
        req: QueueRequest,
    ) -> Result<QueueReplyOut, Status> {
        let bytes = self.propose(group, encode(&QueueEntry::One(req))?).await?;
        decode(&bytes)
    }

    /// Propose several commands as one entry, applied in order; one reply each.
    pub async fn propose_queue_batch(
        &self,
        group: GroupId,
        reqs: Vec<QueueRequest>,
    ) -> Result<Vec<QueueReplyOut>, Status> {
        let bytes = self
            .propose(group, encode(&QueueEntry::Batch(reqs))?)
            .await?;
        decode(&bytes)
    }

    /// Propose a metadata command. Returns once the change is applied on this node and on every
    /// reachable node (bounded wait), so a publish on any node right after a declare or bind
    /// routes with it: routing reads each node's local replica.
    pub async fn propose_meta(
        &self,
        cmd: MetaCommand,
    ) -> Result<Result<MetaReply, MetaError>, Status> {
        let bytes = self.propose(META_GROUP, encode(&cmd)?).await?;
        let (index, result): (u64, Result<MetaReply, MetaError>) = decode(&bytes)?;
        self.wait_meta_applied_everywhere(index).await;
        Ok(result)
    }

    /// Return a consumer's unacked messages to the queue and forget it. A failure is only
    /// logged: the next leader removes every consumer it does not serve itself.
    pub async fn consumer_down(&self, group: GroupId, consumer: u64) {
        let cmd = Command::ConsumerDown {
            now_ms: now_ms(),
            consumer,
        };
        if let Err(e) = self
            .propose_queue(group, QueueRequest { cmd, message: None })
            .await
        {
            debug!(
                group,
                consumer, "consumer down not applied (a new leader cleans up): {e}"
            );
        }
    }

    /// The metadata index this node has applied.
    pub fn meta_applied(&self) -> u64 {
        self.meta
            .last_applied
            .lock()
            .unwrap()
            .map(|l| l.index)
            .unwrap_or(0)
    }

    async fn wait_meta_applied_everywhere(&self, index: u64) {
        let deadline = tokio::time::Instant::now() + META_PROPAGATION_WAIT;
        for id in self.peers.ids() {
            loop {
                let applied = if id == self.id {
                    Some(self.meta_applied())
                } else {
                    let Some(mut client) = self.peers.client(id) else {
                        break;
                    };
                    let mut req = tonic::Request::new(qq_proto::internal::QueueInfoRequest {
                        group: META_GROUP,
                    });
                    req.set_timeout(Duration::from_millis(500));
                    match client.queue_info(req).await {
                        Ok(r) => decode::<u64>(&r.into_inner().payload).ok(),
                        Err(_) => None, // unreachable: it catches up when it returns
                    }
                };
                match applied {
                    Some(a) if a >= index => break,
                    None => break,
                    Some(_) if tokio::time::Instant::now() >= deadline => break,
                    Some(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        }
    }

    /// The leader of a group as this node knows it (own metrics if a member).
    pub fn known_leader(&self, group: GroupId) -> Option<NodeId> {
        if group == META_GROUP {
            return self.meta_raft.metrics().borrow_watched().current_leader;
        }
        self.queue_group(group)
            .and_then(|g| g.raft.metrics().borrow_watched().current_leader)
    }

    pub fn is_queue_leader(&self, group: GroupId) -> bool {
        self.queue_group(group)
            .map(|g| g.raft.metrics().borrow_watched().state == ServerState::Leader)
            .unwrap_or(false)
    }
}

pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, Status> {
    postcard::to_stdvec(v).map_err(|e| Status::internal(format!("encode: {e}")))
}

pub fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, Status> {
    postcard::from_bytes(b).map_err(|e| Status::internal(format!("decode reply: {e}")))
}
