//! The node-to-node service (`qq.internal.v1.Internal`): Raft RPCs for any group, forwarded
//! proposals, relayed consumer sessions, queue info from the leader, and the liveness watch.
//!
//! It only decodes and dispatches: to the group's Raft ([`crate::groups::registry`]), to the
//! [`crate::proposer`], or to a consumer session ([`crate::consume::session`]).
//!
//! Must not: serve clients; it is the only way into a node's Raft groups and will move to a
//! port of its own.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use openraft::async_runtime::WatchReceiver;
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use qq_proto::internal::internal_server::Internal;
use qq_proto::internal::*;
use qq_raft::snapshot::{ChunkReply, Received, SnapshotChunk, SnapshotFile};
use qq_raft::{META_GROUP, TypeConfig};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::peering::Peering;
use crate::consume::relay::RELAY_BOUND;
use crate::consume::session::{SessionIn, SessionOut, run_session};
use crate::groups::registry::QueueGroup;
use crate::groups::residency::{Event, Outcome};
use crate::sleep_wake;

pub struct InternalService {
    node: Peering,
}

impl InternalService {
    pub fn new(node: Peering) -> InternalService {
        InternalService { node }
    }
}

/// How long a Raft message for a queue group that is about to start here waits for it
/// ([`Peering::may_start_group`]).
const NEW_GROUP_WAIT: Duration = Duration::from_secs(1);
/// How often a vote request loads a replica unloaded under it before it is refused (a
/// refused vote is safe: the candidate asks again).
const VOTE_RELOADS: usize = 3;

fn reply<T: Serialize, E: std::fmt::Display>(r: Result<T, E>) -> RaftReply {
    match r {
        Ok(v) => match postcard::to_stdvec(&v) {
            Ok(b) => RaftReply {
                payload: b.into(),
                error: String::new(),
            },
            Err(e) => RaftReply {
                payload: Default::default(),
                error: format!("encode: {e}"),
            },
        },
        Err(e) => RaftReply {
            payload: Default::default(),
            error: e.to_string(),
        },
    }
}

fn decode<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, Status> {
    postcard::from_bytes(b).map_err(|e| Status::invalid_argument(format!("payload: {e}")))
}

/// Takes one snapshot chunk for `group` (file IO on a blocking thread); after the last, hands
/// the file to the group's Raft and answers its outcome. A received file the install did not
/// adopt is removed.
async fn receive_chunk<SM>(
    node: &Peering,
    raft: &openraft::Raft<TypeConfig, SM>,
    group: u64,
    chunk: SnapshotChunk,
) -> Result<ChunkReply, String>
where
    SM: openraft::storage::RaftStateMachine<TypeConfig, SnapshotData = SnapshotFile>,
{
    let store = node.store().clone();
    let bytes = chunk.data.len();
    let (chunk, received) = qq_raft::lockstep::spawn_blocking(move || {
        let r = store.snapshots().receive(group, &chunk);
        (chunk, r)
    })
    .await
    .map_err(|e| format!("snapshot chunk task: {e}"))?;
    let received = received.map_err(|e| format!("group {group}: {e}"))?;
    crate::metrics::snapshot_chunk_received(bytes);
    match received {
        Received::Next(offset) => Ok(ChunkReply::Next(offset)),
        Received::Complete(file) => {
            let path = file.path().to_path_buf();
            let snapshot = openraft::alias::SnapshotOf::<TypeConfig, SnapshotFile> {
                meta: chunk.meta,
                snapshot: file,
            };
            let outcome = raft.install_full_snapshot(chunk.vote, snapshot).await;
            // Adopted by the install, it was renamed; otherwise it is no use to anyone.
            if path.exists() {
                let _ = std::fs::remove_file(&path);
            }
            if outcome.is_ok() {
                crate::metrics::snapshot_installed(if group == META_GROUP {
                    crate::metrics::META
                } else {
                    crate::metrics::QUEUE
                });
            }
            outcome.map(ChunkReply::Done).map_err(|e| e.to_string())
        }
    }
}

/// A replica asked for a vote: the residency machine decides whether Raft judges it or it is
/// refused ([`residency::machine`]: a sleeping leader wakes, heartbeats and refuses; a
/// sleeping follower asks the leader it follows to wake, and refuses if that node answers that
/// it leads; a leadership transfer's vote is never refused). An instance unloaded meanwhile is
/// loaded again first. Returns the refusal, or the instance to hand the vote to.
async fn vote_or_refusal(
    node: &Peering,
    mut g: QueueGroup,
    req: &VoteRequest<TypeConfig>,
) -> Result<QueueGroup, RaftReply> {
    let refuse = |group: u64, who: String| RaftReply {
        payload: Default::default(),
        error: format!("group {group} sleeps here and {who} leads it: vote refused"),
    };
    for _ in 0..VOTE_RELOADS {
        let (leading, leader) = {
            let m = g.raft.metrics();
            let m = m.borrow_watched();
            (m.state == openraft::ServerState::Leader, m.current_leader)
        };
        let event = Event::Vote {
            instance: g.instance,
            transfer: req.leadership_transfer,
            leading,
            leader: leader.filter(|l| *l != node.id()),
        };
        let asked = match g.residency.step(event) {
            Outcome::Reload => match node.registry().load(g.meta.id).await {
                Some(again) => {
                    g = again;
                    continue;
                }
                None => break,
            },
            Outcome::Refuse => return Err(refuse(g.meta.id, "this node".into())),
            Outcome::AskLeader(leader) => leader,
            _ => return Ok(g),
        };
        let leads = sleep_wake::confirm_leader(
            node.peers(),
            asked,
            vec![g.meta.id],
            sleep_wake::ASK_TIMEOUT,
        )
        .await
        .contains(&g.meta.id);
        return match g.residency.step(Event::LeaderAnswered { leads }) {
            Outcome::Refuse => Err(refuse(g.meta.id, format!("node {asked}"))),
            _ => Ok(g),
        };
    }
    Err(RaftReply {
        payload: Default::default(),
        error: format!("group {} is being loaded on node {}", g.meta.id, node.id()),
    })
}

/// One Raft request for any group here, from a unary `Raft` call or a `RaftBatch` stream.
async fn serve_raft(node: &Peering, r: RaftRequest) -> Result<RaftReply, Status> {
    let kind = RaftKind::try_from(r.kind).map_err(|_| Status::invalid_argument("kind"))?;
    macro_rules! dispatch {
        ($raft:expr) => {
            match kind {
                RaftKind::Append => reply(
                    $raft
                        .append_entries(decode::<AppendEntriesRequest<TypeConfig>>(&r.payload)?)
                        .await,
                ),
                RaftKind::Vote => reply(
                    $raft
                        .vote(decode::<VoteRequest<TypeConfig>>(&r.payload)?)
                        .await,
                ),
                RaftKind::PreVote => reply(
                    $raft
                        .pre_vote(decode::<VoteRequest<TypeConfig>>(&r.payload)?)
                        .await,
                ),
                RaftKind::Snapshot => {
                    return Err(Status::invalid_argument(
                        "kind: whole snapshots are no longer accepted; send SNAPSHOT_CHUNK",
                    ))
                }
                RaftKind::SnapshotChunk => {
                    let chunk: SnapshotChunk = decode(&r.payload)?;
                    reply(receive_chunk(node, &$raft, r.group, chunk).await)
                }
                RaftKind::TransferLeader => reply(
                    $raft
                        .handle_transfer_leader(decode::<
                            openraft::raft::TransferLeaderRequest<TypeConfig>,
                        >(&r.payload)?)
                        .await,
                ),
                RaftKind::Unspecified => return Err(Status::invalid_argument("kind: unspecified")),
                RaftKind::Sleep | RaftKind::Wake => {
                    return Err(Status::invalid_argument(
                        "kind: SLEEP is for queue groups only",
                    ))
                }
            }
        };
    }
    if kind == RaftKind::Wake {
        // Asked by sleeping followers: their groups that this node leads wake, and are
        // named in the answer.
        let groups: Vec<u64> = decode(&r.payload)?;
        let led = node.registry().wake_led(&groups).await;
        return Ok(reply::<Vec<u64>, String>(Ok(led)));
    }
    if matches!(kind, RaftKind::Vote | RaftKind::PreVote) && node.peers().votes_held() {
        // A node on a new data directory: it may have voted in this term before it lost it.
        return Ok(RaftReply {
            payload: Default::default(),
            error: format!(
                "node {} holds its votes until the cluster accepts its data directory",
                node.id()
            ),
        });
    }
    let out = if r.group == META_GROUP {
        dispatch!(node.registry().meta_raft())
    } else {
        let group = match node.registry().load(r.group).await {
            Some(g) => Some(g),
            None if node.may_start_group(r.group) => {
                node.registry()
                    .queue_when_started(r.group, NEW_GROUP_WAIT)
                    .await
            }
            None => None,
        };
        match group {
            Some(g) => match kind {
                RaftKind::Sleep => reply::<bool, String>(Ok(g.residency.sleep_as_follower(
                    &g.raft,
                    node.id(),
                    decode(&r.payload)?,
                    node.clock().now(),
                ))),
                RaftKind::Append => {
                    let req: AppendEntriesRequest<TypeConfig> = decode(&r.payload)?;
                    let wakes = g.residency.append_wakes(&req);
                    let out = reply(g.raft.append_entries(req).await);
                    if wakes {
                        g.residency.wake();
                    }
                    out
                }
                RaftKind::Vote | RaftKind::PreVote => {
                    let req: VoteRequest<TypeConfig> = decode(&r.payload)?;
                    match vote_or_refusal(node, g, &req).await {
                        Err(refusal) => refusal,
                        Ok(g) if kind == RaftKind::Vote => reply(g.raft.vote(req).await),
                        Ok(g) => reply(g.raft.pre_vote(req).await),
                    }
                }
                _ => dispatch!(g.raft),
            },
            None => RaftReply {
                payload: Default::default(),
                error: format!("group {} is not running on node {}", r.group, node.id()),
            },
        }
    };
    Ok(out)
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Internal for InternalService {
    async fn raft(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        Ok(Response::new(
            serve_raft(&self.node, request.into_inner()).await?,
        ))
    }

    type RaftBatchStream = BoxStream<RaftAnswers>;

    async fn raft_batch(
        &self,
        request: Request<Streaming<RaftCalls>>,
    ) -> Result<Response<Self::RaftBatchStream>, Status> {
        let node = self.node.clone();
        // Open for as long as the peer sends, like the watch: it ends when this node starts to
        // shut down, so that it does not hold up the server's drain.
        let stopping = self.node.stopping().clone().cancelled_owned();
        let answers = qq_raft::mux::serve(request.into_inner(), move |r| {
            let node = node.clone();
            async move {
                serve_raft(&node, r)
                    .await
                    .unwrap_or_else(|status| RaftReply {
                        payload: Default::default(),
                        error: format!("{:?}: {}", status.code(), status.message()),
                    })
            }
        });
        Ok(Response::new(Box::pin(answers.take_until(stopping))))
    }

    async fn propose(
        &self,
        request: Request<ProposeRequest>,
    ) -> Result<Response<ProposeReply>, Status> {
        let r = request.into_inner();
        Ok(Response::new(
            self.node
                .proposer()
                .serve_propose(r.group, r.payload.to_vec())
                .await?,
        ))
    }

    async fn incarnation(
        &self,
        request: Request<IncarnationRequest>,
    ) -> Result<Response<IncarnationReply>, Status> {
        let r = request.into_inner();
        Ok(Response::new(
            crate::peer::incarnation::incarnation(&self.node, &r).await,
        ))
    }

    async fn reseed(
        &self,
        request: Request<IncarnationRequest>,
    ) -> Result<Response<ReseedReply>, Status> {
        let r = request.into_inner();
        Ok(Response::new(
            crate::peer::incarnation::reseed(&self.node, r).await?,
        ))
    }

    async fn group_op(
        &self,
        request: Request<ProposeRequest>,
    ) -> Result<Response<ProposeReply>, Status> {
        let r = request.into_inner();
        Ok(Response::new(
            crate::membership::serve_group_op(&self.node.members(), r.group, &r.payload).await,
        ))
    }

    type ConsumeStream = BoxStream<ForwardConsumeResponse>;
    type WatchStream = BoxStream<WatchEvent>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let from = request.into_inner().from;
        // A peer (re)opening its watch may be back from a restart or a partition: the groups
        // this node leads with it must reach it before its election timers run out.
        crate::peer::liveness::spawn_wake_led_with(&self.node, from);
        // One event now and one every heartbeat interval: the watcher calls this node silent
        // when none comes for an election timeout ([`crate::peer::liveness`]). The channel
        // holds one event: a watcher that does not read holds the sender, not memory.
        let (tx, rx) = mpsc::channel(1);
        let id = self.node.id();
        let every = Duration::from_millis(self.node.config().heartbeat_ms);
        // Open until the watcher goes or this node starts to shut down (its peers then see
        // the stream end, and a refused connection once the port closes).
        let stopping = self.node.stopping().clone();
        self.node.tasks().spawn(async move {
            stopping
                .run_until_cancelled(async move {
                    let mut beat = tokio::time::interval(every);
                    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        beat.tick().await;
                        let event = WatchEvent {
                            node_id: id,
                            machine_version: qq_core::queue::MACHINE_VERSION,
                            meta_machine_version: qq_core::meta::META_MACHINE_VERSION,
                        };
                        if tx.send(Ok(event)).await.is_err() {
                            return;
                        }
                    }
                })
                .await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn consume(
        &self,
        request: Request<Streaming<ForwardConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        let mut input = request.into_inner();
        let first = input
            .next()
            .await
            .ok_or_else(|| Status::invalid_argument("empty consume stream"))??;
        let args = match decode::<SessionIn>(&first.payload)? {
            SessionIn::Subscribe(args) => args,
            SessionIn::SubscribeWithPriority(mut args, priority) => {
                args.priority = priority;
                args
            }
            _ => return Err(Status::invalid_argument("first message must subscribe")),
        };
        let (in_tx, in_rx) = mpsc::channel(RELAY_BOUND);
        let stopping = self.node.stopping().clone();
        self.node.tasks().spawn(async move {
            while let Some(Some(Ok(m))) = stopping.run_until_cancelled(input.next()).await {
                let Ok(msg) = postcard::from_bytes::<SessionIn>(&m.payload) else {
                    return;
                };
                if in_tx.send(msg).await.is_err() {
                    return;
                }
            }
        });
        let (out_tx, mut out_rx) = mpsc::channel::<SessionOut>(RELAY_BOUND);
        self.node.tasks().spawn(run_session(
            self.node.consuming().clone(),
            args,
            in_rx,
            out_tx,
        ));
        let (tx, rx) = mpsc::channel(RELAY_BOUND);
        self.node.tasks().spawn(async move {
            while let Some(m) = out_rx.recv().await {
                let Ok(payload) = postcard::to_stdvec(&m) else {
                    return;
                };
                if tx
                    .send(Ok(ForwardConsumeResponse {
                        payload: payload.into(),
                    }))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn queue_info(
        &self,
        request: Request<QueueInfoRequest>,
    ) -> Result<Response<QueueInfoReply>, Status> {
        let r = request.into_inner();
        Ok(Response::new(
            self.node
                .proposer()
                .serve_queue_info(r.group, r.with_digest, r.wait_applied, r.read_index)
                .await,
        ))
    }

    async fn browse(
        &self,
        request: Request<BrowseQueueRequest>,
    ) -> Result<Response<QueueInfoReply>, Status> {
        let r = request.into_inner();
        Ok(Response::new(
            self.node
                .proposer()
                .serve_browse(r.group, r.offset, r.limit)
                .await,
        ))
    }
}
