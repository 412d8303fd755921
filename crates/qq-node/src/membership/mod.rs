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
//! The rooms: `queue_members` adds and deletes one queue's member; `grow_shrink` does it for
//! every matching queue; `rebalance` moves queue leaders; `quorum` answers QuorumCritical;
//! `cluster` joins and forgets nodes; `group_op` carries a Raft operation to the group's
//! leader (and serves it there). This file holds the types the API reports and the
//! compare-and-set record of a queue's members that every change ends with.
//!
//! Must not: serve clients (the API does), or start and stop replicas (the supervisor in
//! [`crate::node`] does, from the metadata).

mod cluster;
mod group_op;
mod grow_shrink;
mod members;
mod queue_members;
mod quorum;
mod rebalance;

use qq_core::NodeId;
use qq_core::meta::{ErrorKind, MetaCommand, MetaError, QueueMeta};

pub use self::cluster::{forget_node, join_node, reseed_node};
pub use self::group_op::{GroupOp, NOT_HERE, group_op, serve_group_op};
pub use self::grow_shrink::{MAX_PATTERN_BYTES, compile_pattern, grow, shrink};
pub use self::members::Members;
pub use self::queue_members::{add_member, delete_member};
pub use self::quorum::{online_nodes, quorum_critical};
pub use self::rebalance::rebalance;
use crate::error::NodeError;

/// How many times a change is retried when another change of the same queue came first.
const CAS_ATTEMPTS: usize = 5;

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

fn current_queue(node: &Members, vhost: &str, name: &str) -> Result<QueueMeta, MemberError> {
    node.view()
        .current()
        .queue(vhost, name)
        .cloned()
        .ok_or_else(|| queue_gone(vhost, name))
}

/// Refuses a node that is not in the cluster (NOT_FOUND).
pub fn check_cluster_node(node: &Members, id: NodeId) -> Result<(), MemberError> {
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
    node: &Members,
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
