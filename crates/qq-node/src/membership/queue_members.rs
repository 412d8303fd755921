//! One queue's member added (learner, caught up, voter, then recorded; undone if Raft
//! refuses) or deleted (out of Raft, then out of the metadata).

use qq_core::NodeId;
use qq_core::meta::MetaError;
use tracing::{info, warn};

use super::Members;
use super::group_op::{GroupOp, group_op};
use super::{
    CAS_ATTEMPTS, Change, MemberError, change, check_cluster_node, current_queue, is_conflict,
    record, without,
};
use crate::error::NodeError;

/// Add `target` to the queue's members: learner, catch up, voter, then recorded.
pub async fn add_member(
    node: &Members,
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
async fn undo_learner(node: &Members, vhost: &str, name: &str, target: NodeId) {
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
    node: &Members,
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
