//! Raft operations on a group (add a voter, remove a node, transfer leadership) that only the
//! group's leader carries out: sent to it wherever it is (`Internal.GroupOp` when elsewhere),
//! retried through elections, and served on the leader.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError};
use openraft::storage::RaftStateMachine;
use openraft::{BasicNode, ChangeMembers, Raft, ServerState};
use qq_core::NodeId;
use qq_core::meta::QueueMeta;
use qq_proto::internal::{ProposeReply, ProposeRequest};
use qq_raft::{GroupId, META_GROUP};
use serde::{Deserialize, Serialize};

use super::Members;
use crate::codec::{decode, encode};
use crate::error::NodeError;
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

/// Carry out `op` on the group's leader, wherever it is, until [`OP_DEADLINE`].
pub async fn group_op(node: &Members, qm: &QueueMeta, op: GroupOp) -> Result<String, NodeError> {
    let label = format!("queue '{}'", qm.name);
    group_op_on(node, qm.id, &qm.members, &label, op).await
}

/// Carry out `op` on the metadata group's leader.
pub(super) async fn meta_op(node: &Members, op: GroupOp) -> Result<String, NodeError> {
    let members = node.peers().ids();
    group_op_on(node, META_GROUP, &members, "the metadata", op).await
}

async fn group_op_on(
    node: &Members,
    group: GroupId,
    members: &[NodeId],
    label: &str,
    op: GroupOp,
) -> Result<String, NodeError> {
    let deadline = node.clock().now()
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
        if node.clock().now() >= deadline {
            return Err(NodeError::Unavailable(format!(
                "{label}: membership operation not carried out: {last} (safe to retry)"
            )));
        }
        tokio::time::sleep(Duration::from_millis((50 * attempt as u64).min(500))).await;
    }
}

async fn remote(node: &Members, target: NodeId, group: GroupId, payload: Vec<u8>) -> OpOutcome {
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
pub async fn serve_group_op(node: &Members, group: GroupId, payload: &[u8]) -> ProposeReply {
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
async fn serve_local(node: &Members, group: GroupId, op: GroupOp) -> OpOutcome {
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
async fn serve_on<SM>(
    node: &Members,
    raft: &Raft<qq_raft::TypeConfig, SM>,
    op: GroupOp,
) -> OpOutcome
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
    match op {
        GroupOp::AddVoter { node: target } => {
            if voters.contains(&target) {
                return OpOutcome::Done(format!("node {target} is already a voter"));
            }
            add_voter(node, raft, target).await
        }
        GroupOp::Remove { node: target } => {
            if target == me {
                let Some(to) = voters.iter().copied().find(|v| *v != me) else {
                    return OpOutcome::Failed(format!("node {target} is the only voter"));
                };
                return hand_over(raft, to).await;
            }
            remove(raft, &voters, &in_group, target).await
        }
        GroupOp::TransferLeader { to } => {
            if to == me {
                return OpOutcome::Done(String::new());
            }
            if !voters.contains(&to) {
                return OpOutcome::Failed(format!("node {to} is not a voter of the group"));
            }
            hand_over(raft, to).await
        }
    }
}

/// Hand this leader's leadership to `to` and wait (at most [`TRANSFER_WAIT`]) to see it leave.
async fn hand_over<SM>(raft: &Raft<qq_raft::TypeConfig, SM>, to: NodeId) -> OpOutcome
where
    SM: RaftStateMachine<qq_raft::TypeConfig>,
{
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

/// On the leader: `target` added as a learner, caught up, then made a voter.
async fn add_voter<SM>(
    node: &Members,
    raft: &Raft<qq_raft::TypeConfig, SM>,
    target: NodeId,
) -> OpOutcome
where
    SM: RaftStateMachine<qq_raft::TypeConfig>,
{
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

/// On the leader: `target` (not this node) taken out of the group, voter or learner.
async fn remove<SM>(
    raft: &Raft<qq_raft::TypeConfig, SM>,
    voters: &BTreeSet<NodeId>,
    in_group: &BTreeSet<NodeId>,
    target: NodeId,
) -> OpOutcome
where
    SM: RaftStateMachine<qq_raft::TypeConfig>,
{
    let change = if voters.contains(&target) {
        ChangeMembers::RemoveVoters([target].into())
    } else if in_group.contains(&target) {
        ChangeMembers::RemoveNodes([target].into())
    } else {
        return OpOutcome::Done(format!("node {target} is not in the group"));
    };
    match tokio::time::timeout(CHANGE_TIMEOUT, raft.change_membership(change, false)).await {
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
