//! Membership changes of queue groups (AddMember, DeleteMember, GrowQueues, ShrinkQueues,
//! RebalanceLeaders) and the QuorumCritical check.
//!
//! A change goes through the queue's own Raft group first and is recorded in the metadata
//! only once Raft committed it, so the metadata never claims a replica Raft does not have:
//!
//! - **add**: record the node as a *learner* of the queue (`SetQueueMembers`, members
//!   unchanged): its supervisor starts an empty replica. The group's leader adds it as a Raft
//!   learner, waits until it caught up, then makes it a voter. Only then the metadata moves it
//!   from learners to members. If the Raft change fails, the learner is removed from Raft and
//!   from the metadata again (its replica stops and its data is deleted).
//! - **delete**: the leader removes the node from the group (handing leadership away first if
//!   the node leads); then the metadata drops it and the node's supervisor stops the replica
//!   and deletes its data. The last member cannot be deleted (FAILED_PRECONDITION), as in
//!   RabbitMQ.
//!
//! Raft operations run on the group's leader ([`GroupOp`], over `Internal.GroupOp` when the
//! leader is elsewhere). Every metadata record is a compare-and-set on the queue's members, so
//! two changes racing on one queue cannot overwrite each other.
//!
//! Must not: serve clients (the API does), or start and stop replicas (the supervisor in
//! [`crate::node`] does, from the metadata).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::future::join_all;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError};
use openraft::storage::RaftStateMachine;
use openraft::{BasicNode, ChangeMembers, Raft, ServerState};
use qq_core::NodeId;
use qq_core::meta::{ErrorKind, MetaCommand, MetaError, QueueMeta};
use qq_proto::internal::{ProposeReply, ProposeRequest, QueueInfoRequest};
use qq_raft::{GroupId, META_GROUP};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::codec::{decode, encode};
use crate::error::NodeError;
use crate::node::Node;
use crate::proposer::NOT_LEADER;

/// `ProposeReply.code` of `Internal.GroupOp`: the group does not run on that node.
pub const NOT_HERE: u32 = 2;

/// How long a new replica may take to catch up as a learner before the add is undone.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one membership change (joint then uniform config) may take to commit.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a caller keeps looking for the group's leader for one operation.
const OP_DEADLINE: Duration = Duration::from_secs(20);
/// How long a leader waits to see leadership leave it after triggering a transfer.
const TRANSFER_WAIT: Duration = Duration::from_secs(3);
/// How long a reachability probe of a peer (QuorumCritical) may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);
/// How many times a change is retried when another change of the same queue came first.
const CAS_ATTEMPTS: usize = 5;
/// Longest GrowQueues pattern, in bytes, and the compiled regex's size limit.
pub const MAX_PATTERN_BYTES: usize = 1024;
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// An operation on a queue group's Raft that only the group's leader carries out.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum GroupOp {
    /// Add `node` as a learner, wait until it caught up, then make it a voter.
    AddVoter { node: NodeId },
    /// Take `node` out of the group (voter or learner). If `node` leads, leadership moves to
    /// another voter first.
    Remove { node: NodeId },
    /// Hand leadership to the voter `to`.
    TransferLeader { to: NodeId },
}

/// What a leader answers to a [`GroupOp`].
enum OpOutcome {
    Done(String),
    NotLeader(Option<NodeId>),
    NotHere,
    Failed(String),
}

/// One queue's change, as the API reports it.
#[derive(Debug, Clone)]
pub struct Change {
    pub vhost: String,
    pub queue: String,
    /// `added`, `deleted`, `unchanged` or `error`.
    pub outcome: &'static str,
    pub detail: String,
    pub members: Vec<NodeId>,
}

/// Why a change was refused or failed; mapped to a gRPC status by the API.
#[derive(Debug, Clone)]
pub enum MemberError {
    Meta(MetaError),
    Node(NodeError),
}

impl From<NodeError> for MemberError {
    fn from(e: NodeError) -> Self {
        MemberError::Node(e)
    }
}
impl From<MetaError> for MemberError {
    fn from(e: MetaError) -> Self {
        MemberError::Meta(e)
    }
}
impl std::fmt::Display for MemberError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemberError::Meta(e) => write!(f, "{}", e.message),
            MemberError::Node(e) => write!(f, "{e}"),
        }
    }
}

/// A queue that would lose its majority if a node stopped.
#[derive(Debug, Clone)]
pub struct Critical {
    pub vhost: String,
    pub queue: String,
    pub members: Vec<NodeId>,
    pub online: Vec<NodeId>,
}

/// A planned or carried out leader move.
#[derive(Debug, Clone)]
pub struct LeaderMove {
    pub vhost: String,
    pub queue: String,
    pub from: NodeId,
    pub to: NodeId,
    pub detail: String,
}

fn queue_gone(vhost: &str, name: &str) -> MemberError {
    MemberError::Meta(MetaError::not_found(format!(
        "queue '{name}' in vhost '{vhost}' not found"
    )))
}

fn current_queue(node: &Node, vhost: &str, name: &str) -> Result<QueueMeta, MemberError> {
    node.view()
        .current()
        .queue(vhost, name)
        .cloned()
        .ok_or_else(|| queue_gone(vhost, name))
}

/// Refuses a node that is not in the cluster (NOT_FOUND).
pub fn check_cluster_node(node: &Node, id: NodeId) -> Result<(), MemberError> {
    let ids = node.peers().ids();
    if ids.contains(&id) {
        return Ok(());
    }
    Err(MemberError::Meta(MetaError::not_found(format!(
        "node: {id} is not a node of the cluster (nodes: {ids:?})"
    ))))
}

/// Record `members`/`learners` if the queue still has `expected` members.
async fn record(
    node: &Node,
    qm: &QueueMeta,
    members: Vec<NodeId>,
    learners: Vec<NodeId>,
) -> Result<(), MemberError> {
    let cmd = MetaCommand::SetQueueMembers {
        vhost: qm.vhost.clone(),
        name: qm.name.clone(),
        id: qm.id,
        expected: qm.members.clone(),
        members,
        learners,
    };
    node.proposer().propose_meta(cmd).await??;
    Ok(())
}

fn is_conflict(e: &MemberError) -> bool {
    matches!(e, MemberError::Meta(m) if m.kind == ErrorKind::FailedPrecondition
        && m.message.contains("members changed meanwhile"))
}

fn without(list: &[NodeId], id: NodeId) -> Vec<NodeId> {
    list.iter().copied().filter(|n| *n != id).collect()
}

/// Add `target` to the queue's members: learner, catch up, voter, then recorded.
pub async fn add_member(
    node: &Node,
    vhost: &str,
    name: &str,
    target: NodeId,
) -> Result<Change, MemberError> {
    check_cluster_node(node, target)?;
    // 1. The node runs a replica as a learner (recorded as such, not as a member).
    let mut attempt = 0;
    let qm = loop {
        let qm = current_queue(node, vhost, name)?;
        if qm.members.contains(&target) {
            return Ok(change(
                &qm,
                "unchanged",
                format!("node {target} is already a member"),
            ));
        }
        if qm.learners.contains(&target) {
            break qm;
        }
        let mut learners = qm.learners.clone();
        learners.push(target);
        match record(node, &qm, qm.members.clone(), learners).await {
            Ok(()) => break current_queue(node, vhost, name)?,
            Err(e) if is_conflict(&e) && attempt + 1 < CAS_ATTEMPTS => attempt += 1,
            Err(e) => return Err(e),
        }
    };
    // 2. Raft: learner, caught up, voter.
    if let Err(e) = group_op(node, &qm, GroupOp::AddVoter { node: target }).await {
        warn!(queue = %name, vhost, node = target, "add member failed, undoing: {e}");
        undo_learner(node, vhost, name, target).await;
        return Err(e.into());
    }
    // 3. Recorded as a member.
    let mut attempt = 0;
    loop {
        let qm = current_queue(node, vhost, name)?;
        if qm.members.contains(&target) {
            return Ok(change(&qm, "added", String::new()));
        }
        let mut members = qm.members.clone();
        members.push(target);
        match record(node, &qm, members, without(&qm.learners, target)).await {
            Ok(()) => {
                let qm = current_queue(node, vhost, name)?;
                info!(queue = %name, vhost, node = target, members = ?qm.members, "member added");
                return Ok(change(&qm, "added", String::new()));
            }
            Err(e) if is_conflict(&e) && attempt + 1 < CAS_ATTEMPTS => attempt += 1,
            Err(e) => {
                return Err(MemberError::Node(NodeError::Unavailable(format!(
                    "node {target} is a voter of the queue's Raft group but recording it in \
                     the metadata failed: {e}; run add-member again to record it"
                ))));
            }
        }
    }
}

/// Take a learner that did not make it out of the group and out of the metadata again.
async fn undo_learner(node: &Node, vhost: &str, name: &str, target: NodeId) {
    let Ok(qm) = current_queue(node, vhost, name) else {
        return;
    };
    if let Err(e) = group_op(node, &qm, GroupOp::Remove { node: target }).await {
        warn!(queue = %name, node = target, "undo: removing the learner from Raft: {e}");
    }
    for _ in 0..CAS_ATTEMPTS {
        let Ok(qm) = current_queue(node, vhost, name) else {
            return;
        };
        if !qm.learners.contains(&target) || qm.members.contains(&target) {
            return;
        }
        match record(node, &qm, qm.members.clone(), without(&qm.learners, target)).await {
            Err(e) if is_conflict(&e) => continue,
            Err(e) => {
                warn!(queue = %name, node = target, "undo: dropping the learner record: {e}");
                return;
            }
            Ok(()) => return,
        }
    }
}

/// Take `target` out of the queue's members: out of Raft, then out of the metadata.
pub async fn delete_member(
    node: &Node,
    vhost: &str,
    name: &str,
    target: NodeId,
) -> Result<Change, MemberError> {
    let mut attempt = 0;
    loop {
        let qm = current_queue(node, vhost, name)?;
        if !qm.members.contains(&target) && !qm.learners.contains(&target) {
            return Ok(change(
                &qm,
                "unchanged",
                format!("node {target} is not a member"),
            ));
        }
        if qm.members == [target] {
            return Err(MemberError::Meta(MetaError::failed_precondition(format!(
                "cannot delete node {target} from queue '{name}' in vhost '{vhost}': it is the \
                 queue's last member"
            ))));
        }
        group_op(node, &qm, GroupOp::Remove { node: target }).await?;
        let qm = current_queue(node, vhost, name)?;
        match record(
            node,
            &qm,
            without(&qm.members, target),
            without(&qm.learners, target),
        )
        .await
        {
            Ok(()) => {
                let qm = current_queue(node, vhost, name)?;
                info!(queue = %name, vhost, node = target, members = ?qm.members, "member deleted");
                return Ok(change(&qm, "deleted", String::new()));
            }
            Err(e) if is_conflict(&e) && attempt + 1 < CAS_ATTEMPTS => attempt += 1,
            Err(e) => {
                return Err(MemberError::Node(NodeError::Unavailable(format!(
                    "node {target} left the queue's Raft group but recording it in the \
                     metadata failed: {e}; run delete-member again to record it"
                ))));
            }
        }
    }
}

fn change(qm: &QueueMeta, outcome: &'static str, detail: String) -> Change {
    Change {
        vhost: qm.vhost.clone(),
        queue: qm.name.clone(),
        outcome,
        detail,
        members: qm.members.clone(),
    }
}

fn failed(qm: &QueueMeta, e: &MemberError) -> Change {
    change(qm, "error", e.to_string())
}

/// Compile a GrowQueues pattern: bounded in length and compiled size (INVALID_ARGUMENT).
pub fn compile_pattern(pattern: &str) -> Result<regex::Regex, MetaError> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(MetaError::invalid(format!(
            "pattern: {} bytes, more than {MAX_PATTERN_BYTES}",
            pattern.len()
        )));
    }
    regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| MetaError::invalid(format!("pattern: not a valid regex: {e}")))
}

/// Add `target` to every queue (of `vhost`, or all vhosts if empty) whose name matches
/// `pattern` and that lacks it; one change per matching queue.
pub async fn grow(
    node: &Node,
    target: NodeId,
    vhost: &str,
    pattern: &regex::Regex,
) -> Result<Vec<Change>, MemberError> {
    check_cluster_node(node, target)?;
    let queues: Vec<QueueMeta> = node
        .view()
        .current()
        .queues()
        .filter(|q| (vhost.is_empty() || q.vhost == vhost) && pattern.is_match(&q.name))
        .cloned()
        .collect();
    let mut changes = Vec::with_capacity(queues.len());
    for qm in queues {
        changes.push(match add_member(node, &qm.vhost, &qm.name, target).await {
            Ok(c) => c,
            Err(e) => failed(&qm, &e),
        });
    }
    Ok(changes)
}

/// Remove `target` from every queue where it is a member and not the last one.
pub async fn shrink(node: &Node, target: NodeId) -> Result<Vec<Change>, MemberError> {
    let queues: Vec<QueueMeta> = node
        .view()
        .current()
        .queues()
        .filter(|q| q.members.contains(&target) || q.learners.contains(&target))
        .cloned()
        .collect();
    let mut changes = Vec::with_capacity(queues.len());
    for qm in queues {
        if qm.members == [target] {
            changes.push(change(
                &qm,
                "unchanged",
                format!("node {target} is the last member"),
            ));
            continue;
        }
        changes.push(
            match delete_member(node, &qm.vhost, &qm.name, target).await {
                Ok(c) => c,
                Err(e) => failed(&qm, &e),
            },
        );
    }
    Ok(changes)
}

/// Which nodes answer now (this node always does).
pub async fn online_nodes(node: &Node) -> BTreeSet<NodeId> {
    let peers = node.peers();
    let reach = join_all(peers.ids().into_iter().map(|id| async move {
        if id == node.id() {
            return (id, true);
        }
        let Some(mut client) = peers.client(id) else {
            return (id, false);
        };
        let mut req = tonic::Request::new(QueueInfoRequest {
            group: 0,
            with_digest: false,
            wait_applied: 0,
        });
        req.set_timeout(PROBE_TIMEOUT);
        (id, client.queue_info(req).await.is_ok())
    }))
    .await;
    reach
        .into_iter()
        .filter(|(_, up)| *up)
        .map(|(id, _)| id)
        .collect()
}

/// Whether a group of `members` keeps a majority of online members without `stopping`.
fn keeps_majority(members: &[NodeId], stopping: NodeId, online: &BTreeSet<NodeId>) -> bool {
    let left = members
        .iter()
        .filter(|m| **m != stopping && online.contains(m))
        .count();
    left > members.len() / 2
}

/// The queues (and whether the metadata) that would lose their majority if `target` stopped,
/// given which nodes answer now.
pub async fn quorum_critical(
    node: &Node,
    target: NodeId,
) -> Result<(Vec<Critical>, bool), MemberError> {
    check_cluster_node(node, target)?;
    let online = online_nodes(node).await;
    let state = node.view().current();
    let queues = state
        .queues()
        .filter(|q| q.members.contains(&target) && !keeps_majority(&q.members, target, &online))
        .map(|q| Critical {
            vhost: q.vhost.clone(),
            queue: q.name.clone(),
            members: q.members.clone(),
            online: q
                .members
                .iter()
                .copied()
                .filter(|m| online.contains(m))
                .collect(),
        })
        .collect();
    let voters: Vec<NodeId> = node.meta_voters().into_iter().collect();
    let metadata = !keeps_majority(&voters, target, &online);
    Ok((queues, metadata))
}

/// Move queue leaders so each node leads about as many queues as the others: while some
/// queue's leader leads at least two more queues than another member of that queue, hand
/// the leadership to the member leading fewest. Returns the moves tried, each with its result.
pub async fn rebalance(
    node: &Node,
) -> Result<(Vec<LeaderMove>, BTreeMap<NodeId, u32>), MemberError> {
    let queues: Vec<QueueMeta> = node.view().current().queues().cloned().collect();
    let mut leaders: Vec<(QueueMeta, NodeId)> = Vec::with_capacity(queues.len());
    for qm in queues {
        match node.proposer().queue_info(qm.id).await {
            Ok(info) => leaders.push((qm, info.leader)),
            Err(e) => warn!(queue = %qm.name, "rebalance: leader unknown, skipped: {e}"),
        }
    }
    let mut count: BTreeMap<NodeId, u32> = node.peers().ids().into_iter().map(|n| (n, 0)).collect();
    for (_, l) in &leaders {
        *count.entry(*l).or_default() += 1;
    }
    // Plan: most loaded leaders first, each queue moved at most once.
    let mut planned: Vec<(usize, NodeId, NodeId)> = Vec::new();
    loop {
        let mut best: Option<(usize, NodeId, NodeId, u32)> = None;
        for (i, (qm, l)) in leaders.iter().enumerate() {
            if planned.iter().any(|(p, _, _)| *p == i) {
                continue;
            }
            let Some(to) = qm.members.iter().copied().min_by_key(|m| (count[m], *m)) else {
                continue;
            };
            let gain = count[l].saturating_sub(count[&to]);
            if gain >= 2 && best.is_none_or(|b| gain > b.3) {
                best = Some((i, *l, to, gain));
            }
        }
        let Some((i, from, to, _)) = best else { break };
        *count.get_mut(&from).expect("counted") -= 1;
        *count.get_mut(&to).expect("counted") += 1;
        planned.push((i, from, to));
    }
    let mut moves = Vec::with_capacity(planned.len());
    for (i, from, to) in planned {
        let qm = &leaders[i].0;
        let detail = match group_op(node, qm, GroupOp::TransferLeader { to }).await {
            Ok(_) => {
                // Record the new leader first among the members (what `balanced` counts).
                reorder_first(node, qm, to).await;
                String::new()
            }
            Err(e) => {
                *count.get_mut(&to).expect("counted") -= 1;
                *count.get_mut(&from).expect("counted") += 1;
                format!("not moved: {e}")
            }
        };
        moves.push(LeaderMove {
            vhost: qm.vhost.clone(),
            queue: qm.name.clone(),
            from,
            to,
            detail,
        });
    }
    Ok((moves, count))
}

/// Put `first` at the head of the queue's members (best effort: a conflict leaves it).
async fn reorder_first(node: &Node, qm: &QueueMeta, first: NodeId) {
    let Ok(qm) = current_queue(node, &qm.vhost, &qm.name) else {
        return;
    };
    if qm.members.first() == Some(&first) || !qm.members.contains(&first) {
        return;
    }
    let mut members = vec![first];
    members.extend(without(&qm.members, first));
    if let Err(e) = record(node, &qm, members, qm.learners.clone()).await {
        warn!(queue = %qm.name, "recording the new leader first: {e}");
    }
}

/// Carry out `op` on the group's leader, wherever it is, until [`OP_DEADLINE`].
pub async fn group_op(node: &Node, qm: &QueueMeta, op: GroupOp) -> Result<String, NodeError> {
    let label = format!("queue '{}'", qm.name);
    group_op_on(node, qm.id, &qm.members, &label, op).await
}

/// Carry out `op` on the metadata group's leader.
async fn meta_op(node: &Node, op: GroupOp) -> Result<String, NodeError> {
    let members = node.peers().ids();
    group_op_on(node, META_GROUP, &members, "the metadata", op).await
}

async fn group_op_on(
    node: &Node,
    group: GroupId,
    members: &[NodeId],
    label: &str,
    op: GroupOp,
) -> Result<String, NodeError> {
    let deadline = tokio::time::Instant::now()
        + OP_DEADLINE
        + match op {
            GroupOp::AddVoter { .. } => CATCH_UP_TIMEOUT + CHANGE_TIMEOUT,
            _ => CHANGE_TIMEOUT,
        };
    let payload = encode(&op)?;
    let mut hint = node.registry().known_leader(group);
    let mut attempt = 0usize;
    let mut last: String;
    loop {
        if node.stopping().is_cancelled() {
            return Err(NodeError::ShuttingDown);
        }
        let target = hint.unwrap_or_else(|| members[attempt % members.len()]);
        let outcome = if target == node.id() {
            serve_local(node, group, op.clone()).await
        } else {
            remote(node, target, group, payload.clone()).await
        };
        hint = None;
        match outcome {
            OpOutcome::Done(detail) => return Ok(detail),
            OpOutcome::Failed(e) => return Err(NodeError::Unavailable(e)),
            OpOutcome::NotLeader(h) => {
                last = format!("node {target} is not the leader");
                hint = h.filter(|h| *h != target);
            }
            OpOutcome::NotHere => last = format!("node {target} does not run the group"),
        }
        attempt += 1;
        if tokio::time::Instant::now() >= deadline {
            return Err(NodeError::Unavailable(format!(
                "{label}: membership operation not carried out: {last} (safe to retry)"
            )));
        }
        tokio::time::sleep(Duration::from_millis((50 * attempt as u64).min(500))).await;
    }
}

async fn remote(node: &Node, target: NodeId, group: GroupId, payload: Vec<u8>) -> OpOutcome {
    let Some(mut client) = node.peers().client(target) else {
        return OpOutcome::NotHere;
    };
    let mut req = tonic::Request::new(ProposeRequest {
        group,
        payload: payload.into(),
    });
    req.set_timeout(CATCH_UP_TIMEOUT + CHANGE_TIMEOUT + Duration::from_secs(5));
    match client.group_op(req).await {
        Err(s) => OpOutcome::NotLeader(None).or_unreachable(target, s.message()),
        Ok(r) => {
            let r = r.into_inner();
            match r.code {
                NOT_LEADER => OpOutcome::NotLeader((r.forward_to != 0).then_some(r.forward_to)),
                NOT_HERE => OpOutcome::NotHere,
                _ if !r.error.is_empty() => OpOutcome::Failed(r.error),
                _ => match decode::<String>(&r.payload) {
                    Ok(d) => OpOutcome::Done(d),
                    Err(e) => OpOutcome::Failed(e.to_string()),
                },
            }
        }
    }
}

impl OpOutcome {
    /// A peer that could not be reached is treated as not leading (try the others).
    fn or_unreachable(self, target: NodeId, e: &str) -> OpOutcome {
        tracing::debug!(node = target, "group op: {e}");
        self
    }
}

/// Serve `Internal.GroupOp`.
pub async fn serve_group_op(node: &Node, group: GroupId, payload: &[u8]) -> ProposeReply {
    let mut reply = ProposeReply::default();
    let op: GroupOp = match postcard::from_bytes(payload) {
        Ok(op) => op,
        Err(e) => {
            reply.error = format!("payload: not a group operation: {e}");
            return reply;
        }
    };
    match serve_local(node, group, op).await {
        OpOutcome::Done(d) => match encode(&d) {
            Ok(b) => reply.payload = b.into(),
            Err(e) => reply.error = e.to_string(),
        },
        OpOutcome::NotLeader(h) => {
            reply.code = NOT_LEADER;
            reply.forward_to = h.unwrap_or(0);
        }
        OpOutcome::NotHere => reply.code = NOT_HERE,
        OpOutcome::Failed(e) => reply.error = e,
    }
    reply
}

fn write_outcome<T>(
    r: Result<T, RaftError<qq_raft::TypeConfig, ClientWriteError<qq_raft::TypeConfig>>>,
) -> Result<T, OpOutcome> {
    match r {
        Ok(v) => Ok(v),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            Err(OpOutcome::NotLeader(f.leader_id))
        }
        Err(e) => Err(OpOutcome::Failed(e.to_string())),
    }
}

/// Run `op` here if this node leads the group.
async fn serve_local(node: &Node, group: GroupId, op: GroupOp) -> OpOutcome {
    if group == META_GROUP {
        return serve_on(node, node.registry().meta_raft(), op).await;
    }
    let Some((g, _write)) = node.registry().for_write(group).await else {
        return OpOutcome::NotHere;
    };
    node.registry().wake_to_lead(group).await;
    serve_on(node, &g.raft, op).await
}

/// Run `op` on `raft` if it leads its group.
async fn serve_on<SM>(node: &Node, raft: &Raft<qq_raft::TypeConfig, SM>, op: GroupOp) -> OpOutcome
where
    SM: RaftStateMachine<qq_raft::TypeConfig>,
{
    let (state, leader, voters, in_group) = {
        let m = raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership().clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let in_group: BTreeSet<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
        (m.state, m.current_leader, voters, in_group)
    };
    if state != ServerState::Leader {
        return OpOutcome::NotLeader(leader.filter(|l| *l != node.id()));
    }
    let me = node.id();
    let hand_over = |to: NodeId| {
        let raft = raft.clone();
        async move {
            if let Err(e) = raft.trigger().transfer_leader(to).await {
                return OpOutcome::Failed(format!("transfer leadership: {e}"));
            }
            let mut rx = raft.metrics();
            let _ = tokio::time::timeout(TRANSFER_WAIT, async {
                while rx.borrow_watched().state == ServerState::Leader {
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            })
            .await;
            OpOutcome::NotLeader(Some(to))
        }
    };
    match op {
        GroupOp::AddVoter { node: target } => {
            if voters.contains(&target) {
                return OpOutcome::Done(format!("node {target} is already a voter"));
            }
            let addr = match node.peers().address(target) {
                Some(a) => a,
                None => {
                    // A node that just joined: its record may be applied here but not yet
                    // acted on, or not applied yet (then the caller retries).
                    node.sync_peers();
                    match node.peers().address(target) {
                        Some(a) => a,
                        None => return OpOutcome::NotLeader(None),
                    }
                }
            };
            match tokio::time::timeout(
                CATCH_UP_TIMEOUT,
                raft.add_learner(target, BasicNode { addr }, true),
            )
            .await
            {
                Err(_) => {
                    return OpOutcome::Failed(format!(
                        "node {target} did not catch up within {}s",
                        CATCH_UP_TIMEOUT.as_secs()
                    ));
                }
                Ok(r) => {
                    if let Err(o) = write_outcome(r) {
                        return o;
                    }
                }
            }
            let ids: BTreeSet<NodeId> = [target].into();
            match tokio::time::timeout(
                CHANGE_TIMEOUT,
                raft.change_membership(ChangeMembers::AddVoterIds(ids), false),
            )
            .await
            {
                Err(_) => OpOutcome::Failed(format!(
                    "making node {target} a voter did not commit within {}s",
                    CHANGE_TIMEOUT.as_secs()
                )),
                Ok(r) => match write_outcome(r) {
                    Ok(_) => OpOutcome::Done(String::new()),
                    Err(o) => o,
                },
            }
        }
        GroupOp::Remove { node: target } => {
            if target == me {
                let Some(to) = voters.iter().copied().find(|v| *v != me) else {
                    return OpOutcome::Failed(format!("node {target} is the only voter"));
                };
                return hand_over(to).await;
            }
            let change = if voters.contains(&target) {
                ChangeMembers::RemoveVoters([target].into())
            } else if in_group.contains(&target) {
                ChangeMembers::RemoveNodes([target].into())
            } else {
                return OpOutcome::Done(format!("node {target} is not in the group"));
            };
            match tokio::time::timeout(CHANGE_TIMEOUT, raft.change_membership(change, false)).await
            {
                Err(_) => OpOutcome::Failed(format!(
                    "removing node {target} did not commit within {}s",
                    CHANGE_TIMEOUT.as_secs()
                )),
                Ok(r) => match write_outcome(r) {
                    Ok(_) => OpOutcome::Done(String::new()),
                    Err(o) => o,
                },
            }
        }
        GroupOp::TransferLeader { to } => {
            if to == me {
                return OpOutcome::Done(String::new());
            }
            if !voters.contains(&to) {
                return OpOutcome::Failed(format!("node {to} is not a voter of the group"));
            }
            hand_over(to).await
        }
    }
}

/// Longest address a joining node may give, in bytes.
const MAX_ADDRESS_BYTES: usize = 255;

fn check_address(field: &str, address: &str) -> Result<(), MemberError> {
    let valid = address.len() <= MAX_ADDRESS_BYTES
        && address.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
    if valid {
        return Ok(());
    }
    Err(MemberError::Meta(MetaError::invalid(format!(
        "{field}: '{}' is not host:port (at most {MAX_ADDRESS_BYTES} bytes)",
        address.chars().take(MAX_ADDRESS_BYTES).collect::<String>()
    ))))
}

/// Let node `id` join the running cluster: record it in the metadata (every node adds it to
/// its peers), then make it a learner of the metadata group, wait until it caught up, and a
/// voter. It hosts no queue replicas until some are added (AddMember, GrowQueues) or new
/// queues are placed on it. Idempotent: joining a node that is already a voter with the same
/// addresses changes nothing.
pub async fn join_node(
    node: &Node,
    id: NodeId,
    address: &str,
    cluster_address: &str,
) -> Result<String, MemberError> {
    if id == 0 {
        return Err(MemberError::Meta(MetaError::invalid(
            "id: a node id must be at least 1",
        )));
    }
    check_address("address", address)?;
    check_address("cluster_address", cluster_address)?;
    if node.peers().contains(id) && !node.view().current().joined_nodes().contains_key(&id) {
        let voters = node.meta_voters();
        if voters.contains(&id) {
            return Ok(format!("node {id} is already a member of the cluster"));
        }
    }
    node.proposer()
        .propose_meta(MetaCommand::JoinNode {
            id,
            address: address.to_string(),
            cluster_address: cluster_address.to_string(),
        })
        .await??;
    node.sync_peers();
    let detail = meta_op(node, GroupOp::AddVoter { node: id }).await?;
    info!(
        node = id,
        address, cluster_address, "node joined the cluster"
    );
    Ok(detail)
}

/// Forget node `id` for good: its queue replicas are deleted (a queue of which it is the last
/// member refuses), it leaves the metadata group, and every node drops it from its peers. The
/// node must be stopped first (as RabbitMQ's forget_cluster_node), and cannot forget itself.
pub async fn forget_node(node: &Node, id: NodeId) -> Result<Vec<Change>, MemberError> {
    check_cluster_node(node, id)?;
    if id == node.id() {
        return Err(MemberError::Meta(MetaError::failed_precondition(format!(
            "id: node {id} is the node serving this request; forget it from another node"
        ))));
    }
    if online_nodes(node).await.contains(&id) {
        return Err(MemberError::Meta(MetaError::failed_precondition(format!(
            "id: node {id} is still running; stop it first (a running node would keep \
             claiming its replicas)"
        ))));
    }
    let changes = shrink(node, id).await?;
    if let Some(c) = changes.iter().find(|c| c.outcome != "deleted") {
        return Err(MemberError::Meta(MetaError::failed_precondition(format!(
            "id: node {id} still holds a replica of queue '{}' in vhost '{}': {}",
            c.queue, c.vhost, c.detail
        ))));
    }
    meta_op(node, GroupOp::Remove { node: id }).await?;
    node.proposer()
        .propose_meta(MetaCommand::ForgetNode { id })
        .await??;
    node.sync_peers();
    info!(node = id, queues = changes.len(), "node forgotten");
    Ok(changes)
}
