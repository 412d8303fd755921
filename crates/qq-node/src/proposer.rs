//! The one path a command takes to its group's leader, and the one path a leader-only read
//! (live queue info) takes.
//!
//! A proposal goes to this node's Raft if it leads the group; otherwise it is forwarded over
//! the internal service to the node that does (the hint from Raft, else the group's members in
//! turn), and retried through elections until [`PROPOSE_DEADLINE`], then `Unavailable`.
//! Replies come back as bytes and are decoded here into the machines' reply types.
//!
//! Must not: decide anything about the commands it carries (the API and the leader actor do),
//! or hold a lock across a network call.

use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use qq_core::NodeId;
use qq_core::meta::{MetaCommand, MetaError, MetaReply};
use qq_core::queue::{Command, Reply};
use qq_proto::internal::{
    BrowseQueueRequest, ProposeReply, ProposeRequest, QueueInfoReply, QueueInfoRequest,
};
use qq_raft::network::Peers;
use qq_raft::{GroupId, META_GROUP, Request};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::clock::Clock;
use crate::codec::{decode, encode};
use crate::error::NodeError;
use crate::groups::queue_sm::{
    QueueEntry, QueueEntryRef, QueueReplyOut, QueueRequest, check_entry, check_requests,
};
use crate::groups::registry::{BrowseData, QueueInfoData, Registry};
use crate::meta_view::MetaView;
use crate::metrics;

/// `ProposeReply.code`: this node does not lead the group (`forward_to` may hint who does).
pub const NOT_LEADER: u32 = 1;

/// How long a proposal keeps retrying (leader elections, forwarding) before UNAVAILABLE.
const PROPOSE_DEADLINE: Duration = Duration::from_secs(8);

/// The pause before the `attempt`th (from 1) new try of a leader-only read that found no
/// leader to answer: 5, 10, 20, 40, 80 ms, then 100 ms. A declare reads its new queue this way,
/// and one in four used to wait a whole 100 ms for a leader that was ready after a few.
fn retry_pause(attempt: usize) -> Duration {
    let exp = u32::try_from(attempt.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(5);
    Duration::from_millis((5u64 << exp).min(100))
}

/// How long a proposal already inside Raft may still take once the node starts to shut down;
/// then it fails with UNAVAILABLE (it may still commit: a retry is safe, as for any
/// UNAVAILABLE). Its peers may no longer reach this node to commit it.
const SHUTDOWN_GRACE_FOR_WRITES: Duration = Duration::from_secs(2);

/// How long a leader-only read (queue info, browse) keeps looking for the leader.
const INFO_DEADLINE: Duration = Duration::from_secs(5);

/// What a leader-only read asks for.
#[derive(Clone, Copy)]
enum LeaderRead {
    Info { with_digest: bool },
    Browse { offset: u64, limit: u32 },
}

/// Why a local proposal did not go through.
enum LocalError {
    /// Not the leader; the hint if known.
    Forward(Option<NodeId>),
    /// The group is not running on this node.
    NotHere,
    Unavailable(String),
}

/// Why a forwarded proposal did not go through.
enum RemoteError {
    /// The leader refused it as invalid (it does not decode there, or is out of bounds): a
    /// retry would be refused again. A leader of an older release refuses a command it
    /// does not know this way.
    Refused(String),
    /// Anything else (unreachable, timed out, shutting down): try again, maybe elsewhere.
    Failed(String),
}

/// Cheap to clone: every task that proposes holds one.
#[derive(Clone)]
pub struct Proposer {
    id: NodeId,
    peers: Peers,
    registry: Arc<Registry>,
    view: MetaView,
    /// Cancelled when the node shuts down: proposals in flight stop retrying.
    stopping: CancellationToken,
    /// The node's clock: retry deadlines, and the time stamped into what is proposed here.
    clock: Clock,
    /// Queue commands waiting to share an entry ([`combine`]).
    combiner: Arc<combine::Combiner>,
}

impl Proposer {
    pub fn new(
        id: NodeId,
        peers: Peers,
        registry: Arc<Registry>,
        view: MetaView,
        stopping: CancellationToken,
        clock: Clock,
    ) -> Proposer {
        Proposer {
            id,
            peers,
            registry,
            view,
            stopping,
            clock,
            combiner: Arc::default(),
        }
    }

    /// The node's clock, which stamps the commands proposed through here.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Propose to a group whose leader may be anywhere; returns the encoded reply.
    pub async fn propose(&self, group: GroupId, payload: Vec<u8>) -> Result<Vec<u8>, NodeError> {
        let deadline = self.clock.now() + PROPOSE_DEADLINE;
        let mut hint: Option<NodeId> = None;
        let mut attempt = 0usize;
        let mut followed_at_once = false;
        loop {
            if self.stopping.is_cancelled() {
                return Err(NodeError::ShuttingDown);
            }
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
                    // The leader will refuse it again: no retry.
                    Err(RemoteError::Refused(e)) => return Err(NodeError::InvalidArgument(e)),
                    Err(RemoteError::Failed(e)) => (self.member_after(group, Some(t), attempt), e),
                },
            };
            let moved = next.is_some() && next != hint;
            hint = next;
            attempt += 1;
            // A queue deleted meanwhile has no group left to answer: say so now rather than
            // after the deadline (a publish in flight while its queue was deleted waited 8 s).
            if group != META_GROUP && self.view.queue_by_id(group).is_none() {
                return Err(NodeError::Unavailable(format!(
                    "queue group {group} was deleted meanwhile: {error} (safe to retry)"
                )));
            }
            if self.clock.now() >= deadline {
                let what = if group == META_GROUP {
                    "the metadata".to_string()
                } else {
                    format!("queue group {group}")
                };
                return Err(NodeError::Unavailable(format!(
                    "no quorum for {what} right now: {error} (safe to retry)"
                )));
            }
            // A hint that moved is followed at once, but not twice in a row: while a dead
            // leader's port refuses at once and this node's Raft still names it, the hint
            // swings between that node and another without ever waiting, a loop that spun a
            // core until the deadline (found by qq-sim's replay, seed 21, where time stood
            // still inside it).
            if moved && !followed_at_once {
                followed_at_once = true;
            } else {
                followed_at_once = false;
                tokio::time::sleep(Duration::from_millis((20 * attempt as u64).min(250))).await;
            }
        }
    }

    /// Members of a group by the metadata (every node for the metadata group).
    pub fn group_members(&self, group: GroupId) -> Vec<NodeId> {
        if group == META_GROUP {
            return self.peers.ids();
        }
        self.view.queue_members(group)
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

    /// Ok(Ok(reply)) done; Ok(Err(hint)) not the leader there.
    async fn propose_remote(
        &self,
        target: NodeId,
        group: GroupId,
        payload: Vec<u8>,
    ) -> Result<Result<Vec<u8>, Option<NodeId>>, RemoteError> {
        let mut client = self
            .peers
            .client(target)
            .ok_or_else(|| RemoteError::Failed(format!("unknown node {target}")))?;
        let mut req = tonic::Request::new(ProposeRequest {
            group,
            payload: payload.into(),
        });
        req.set_timeout(Duration::from_secs(5));
        let reply = client
            .propose(req)
            .await
            .map_err(|s| {
                let e = format!("node {target}: {}", s.message());
                if s.code() == tonic::Code::InvalidArgument {
                    RemoteError::Refused(e)
                } else {
                    RemoteError::Failed(e)
                }
            })?
            .into_inner();
        if !reply.error.is_empty() {
            return Err(RemoteError::Failed(format!(
                "node {target}: {}",
                reply.error
            )));
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
        let req = Request {
            payload: payload.into(),
        };
        let write = async {
            if group == META_GROUP {
                Ok(self.registry.meta_raft().client_write(req).await)
            } else {
                // Counted before the wake, so the group cannot fall asleep (or be unloaded)
                // between; loaded first if it was unloaded.
                match self.registry.for_write(group).await {
                    Some((g, _write)) => {
                        self.registry.wake_to_lead(group).await;
                        Ok(g.raft.client_write(req).await)
                    }
                    None => Err(LocalError::NotHere),
                }
            }
        };
        let shutting_down = async {
            self.stopping.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE_FOR_WRITES).await;
        };
        let started = std::time::Instant::now();
        let result = tokio::select! {
            r = write => r?,
            _ = shutting_down => {
                return Err(LocalError::Unavailable(NodeError::ShuttingDown.to_string()));
            }
        };
        match result {
            Ok(resp) => {
                let kind = if group == META_GROUP {
                    metrics::META
                } else {
                    metrics::QUEUE
                };
                metrics::committed(kind, started.elapsed());
                Ok(resp.data.payload)
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))
            | Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(f))) => {
                Err(LocalError::Forward(f.leader_id))
            }
            Err(e) => Err(LocalError::Unavailable(e.to_string())),
        }
    }

    /// Serve a proposal forwarded by a peer.
    /// A forwarded proposal is checked as a local one is: one that does not decode or is out
    /// of bounds is refused (INVALID_ARGUMENT) and never proposed.
    pub async fn serve_propose(
        &self,
        group: GroupId,
        payload: Vec<u8>,
    ) -> Result<ProposeReply, NodeError> {
        if group == META_GROUP {
            let cmd: MetaCommand = postcard::from_bytes(&payload).map_err(|e| {
                NodeError::InvalidArgument(format!("payload: not a metadata command: {e}"))
            })?;
            cmd.validate_new()
                .map_err(|e| NodeError::InvalidArgument(format!("payload: {e}")))?;
        } else {
            check_entry(&payload)
                .map_err(|e| NodeError::InvalidArgument(format!("payload: {e}")))?;
        }
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
        Ok(reply)
    }

    pub async fn propose_queue(
        &self,
        group: GroupId,
        req: QueueRequest,
    ) -> Result<Reply, NodeError> {
        if combine::combinable(&req) {
            let mut replies = self
                .propose_queue_batch(group, std::slice::from_ref(&req))
                .await?;
            return replies
                .pop()
                .map(|r| r.reply)
                .ok_or_else(|| NodeError::Internal("a combined command without a reply".into()));
        }
        Ok(self.propose_queue_full(group, req).await?.reply)
    }

    /// Like [`Proposer::propose_queue`], with the message of a `Get` read on the leader.
    pub async fn propose_queue_full(
        &self,
        group: GroupId,
        req: QueueRequest,
    ) -> Result<QueueReplyOut, NodeError> {
        check_requests(std::slice::from_ref(&req)).map_err(NodeError::InvalidArgument)?;
        let payload = encode(&QueueEntry::One(req))?;
        let bytes = self.propose(group, payload).await?;
        QueueReplyOut::decode(&bytes).map_err(|e| NodeError::Internal(format!("decode reply: {e}")))
    }

    /// Propose several commands, applied in order with nothing between them; one reply each.
    /// They go as one entry, shared with other submitters' commands when all are
    /// [`combine::combinable`].
    pub async fn propose_queue_batch(
        &self,
        group: GroupId,
        reqs: &[QueueRequest],
    ) -> Result<Vec<QueueReplyOut>, NodeError> {
        check_requests(reqs).map_err(NodeError::InvalidArgument)?;
        if reqs.iter().all(combine::combinable) {
            return self.propose_combined(group, reqs).await;
        }
        let payload = encode(&QueueEntryRef::Batch(reqs))?;
        let bytes = self.propose(group, payload).await?;
        decode(&bytes)
    }

    /// Checked commands that may share an entry with others' ([`combine`]): submitted, and
    /// proposed by a chain of the group's (started here when one is free).
    async fn propose_combined(&self, group: GroupId, reqs: &[QueueRequest]) -> combine::Replies {
        let (submission, replies) = combine::Submission::new(reqs)?;
        if self.combiner.submit(group, submission) {
            let this = self.clone();
            tokio::spawn(async move { this.combined_chain(group).await });
        }
        replies.await.unwrap_or(Err(NodeError::ShuttingDown))
    }

    /// Proposes what waits for `group`, an entry at a time, until nothing does.
    async fn combined_chain(&self, group: GroupId) {
        while let Some(batch) = self.combiner.next_batch(group) {
            let replies = match combine::payload(&batch) {
                Ok(payload) => self.propose(group, payload).await.and_then(|b| decode(&b)),
                Err(e) => Err(e),
            };
            combine::answer(batch, replies);
        }
    }

    /// Propose a metadata command. Returns once the change is applied on this node and on every
    /// reachable node (bounded wait), so a publish on any node right after a declare or bind
    /// routes with it: routing reads each node's local replica.
    pub async fn propose_meta(
        &self,
        cmd: MetaCommand,
    ) -> Result<Result<MetaReply, MetaError>, NodeError> {
        // A command of a metadata machine version the cluster does not run yet is refused
        // here too (apply would refuse it on every replica alike).
        let runs = self.view.current().check_runs(&cmd);
        if let Err(e) = cmd.validate_new().and(runs) {
            return Ok(Err(e));
        }
        let bytes = self.propose(META_GROUP, encode(&cmd)?).await?;
        let (index, result): (u64, Result<MetaReply, MetaError>) = decode(&bytes)?;
        self.wait_meta_applied_everywhere(index).await;
        Ok(result)
    }

    /// Return a consumer's unacked messages to the queue and forget it. A failure is only
    /// logged: the queue's next leader removes every consumer it does not serve itself.
    pub async fn consumer_down(&self, group: GroupId, consumer: u64) {
        let cmd = Command::ConsumerDown {
            now_ms: self.clock.now_ms(),
            consumer,
        };
        if let Err(e) = self.propose_queue(group, QueueRequest::command(cmd)).await {
            debug!(
                group,
                consumer, "consumer down not applied (a new leader cleans up): {e}"
            );
        }
    }

    /// Ask the leader of the group (wherever it is) for its live info, without the state
    /// digest (see [`Proposer::queue_info_with_digest`]).
    pub async fn queue_info(&self, group: GroupId) -> Result<QueueInfoData, NodeError> {
        self.queue_info_read(group, false).await
    }

    /// As [`Proposer::queue_info`], with the digest of the whole queue state: linear in the
    /// queue's size, under the state's lock, so only for reads a person or a checker asks for
    /// (GetQueue), never for polls.
    pub async fn queue_info_with_digest(&self, group: GroupId) -> Result<QueueInfoData, NodeError> {
        self.queue_info_read(group, true).await
    }

    async fn queue_info_read(
        &self,
        group: GroupId,
        with_digest: bool,
    ) -> Result<QueueInfoData, NodeError> {
        self.leader_read(group, LeaderRead::Info { with_digest }, || {
            self.registry.local_queue_info(group, true, with_digest)
        })
        .await
    }

    /// Ask the leader of the group for the ready messages at `offset..offset + limit`.
    pub async fn browse(
        &self,
        group: GroupId,
        offset: u64,
        limit: u32,
    ) -> Result<BrowseData, NodeError> {
        self.leader_read(group, LeaderRead::Browse { offset, limit }, || {
            self.registry.local_browse(group, offset, limit as usize)
        })
        .await
    }

    /// A read only the group's leader answers: `local` when this node leads, else the
    /// leader's node over the internal service (the hint, else the members in turn), until
    /// [`INFO_DEADLINE`].
    async fn leader_read<T: serde::de::DeserializeOwned>(
        &self,
        group: GroupId,
        read: LeaderRead,
        local: impl Fn() -> Option<T>,
    ) -> Result<T, NodeError> {
        let deadline = self.clock.now() + INFO_DEADLINE;
        let members = self.group_members(group);
        let mut hint = self.registry.known_leader(group);
        let mut attempt = 0usize;
        loop {
            let target = hint.unwrap_or_else(|| {
                members
                    .get(attempt % members.len().max(1))
                    .copied()
                    .unwrap_or(self.id)
            });
            if target == self.id {
                self.registry.wake_to_lead(group).await;
                if let Some(answer) = local() {
                    return Ok(answer);
                }
                hint = self.registry.known_leader(group).filter(|l| *l != self.id);
            } else if let Some(mut client) = self.peers.client(target) {
                let reply = match read {
                    LeaderRead::Info { with_digest } => {
                        let mut req = tonic::Request::new(QueueInfoRequest {
                            group,
                            with_digest,
                            wait_applied: 0,
                            read_index: false,
                        });
                        req.set_timeout(Duration::from_secs(2));
                        client.queue_info(req).await
                    }
                    LeaderRead::Browse { offset, limit } => {
                        let mut req = tonic::Request::new(BrowseQueueRequest {
                            group,
                            offset,
                            limit,
                        });
                        req.set_timeout(Duration::from_secs(2));
                        client.browse(req).await
                    }
                };
                match reply {
                    Ok(r) => {
                        let r = r.into_inner();
                        if r.error.is_empty() && r.forward_to == 0 && !r.payload.is_empty() {
                            return decode(&r.payload);
                        }
                        hint = if r.forward_to != 0 && r.forward_to != target {
                            Some(r.forward_to)
                        } else {
                            None
                        };
                    }
                    Err(_) => hint = None,
                }
            }
            attempt += 1;
            if self.clock.now() >= deadline || self.stopping.is_cancelled() {
                return Err(NodeError::Unavailable(format!(
                    "queue group {group} has no leader right now (safe to retry)"
                )));
            }
            if hint.is_none() {
                // A leader elected a moment ago answers once its first entry reached a quorum
                // (a few ms): ask again soon, then back off to 100 ms.
                tokio::time::sleep(retry_pause(attempt)).await;
            }
        }
    }

    /// Serve `Internal.Browse`: as [`Proposer::serve_queue_info`], with the browsed messages.
    pub async fn serve_browse(&self, group: GroupId, offset: u64, limit: u32) -> QueueInfoReply {
        self.registry.wake_to_lead(group).await;
        let local = self.registry.local_browse(group, offset, limit as usize);
        self.leader_reply(group, local)
    }

    /// The reply of a leader-only read: the answer, or where the leader is.
    fn leader_reply<T: serde::Serialize>(
        &self,
        group: GroupId,
        local: Option<T>,
    ) -> QueueInfoReply {
        let mut reply = QueueInfoReply::default();
        match local {
            Some(answer) => match encode(&answer) {
                Ok(b) => reply.payload = b.into(),
                Err(e) => reply.error = e.to_string(),
            },
            None => match self.registry.known_leader(group) {
                Some(l) if l != self.id => reply.forward_to = l,
                _ => reply.error = format!("no leader for group {group} known here"),
            },
        }
        reply
    }

    /// Serve `Internal.QueueInfo`. For the metadata group (0), module `meta_sync` answers: the
    /// metadata index applied here (once it reaches `wait_applied`), or the read index.
    pub async fn serve_queue_info(
        &self,
        group: GroupId,
        with_digest: bool,
        wait_applied: u64,
        read_index: bool,
    ) -> QueueInfoReply {
        if group == META_GROUP {
            return self.serve_meta_info(wait_applied, read_index).await;
        }
        self.registry.wake_to_lead(group).await;
        self.leader_reply(
            group,
            self.registry.local_queue_info(group, true, with_digest),
        )
    }
}

pub mod combine;
mod meta_sync;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_read_retries_soon_then_backs_off_to_100_ms() {
        let pauses: Vec<u64> = (1..=8).map(|a| retry_pause(a).as_millis() as u64).collect();
        assert_eq!(pauses, [5, 10, 20, 40, 80, 100, 100, 100]);
        assert_eq!(retry_pause(usize::MAX), Duration::from_millis(100));
    }
}
