//! GrowQueues and ShrinkQueues: one node added to, or deleted from, every queue that matches,
//! one [`Change`] per queue.

use qq_core::NodeId;
use qq_core::meta::{MetaError, QueueMeta};

use super::Members;
use super::queue_members::{add_member, delete_member};
use super::{Change, MemberError, change, check_cluster_node, failed};

/// Longest GrowQueues pattern, in bytes, and the compiled regex's size limit.
pub const MAX_PATTERN_BYTES: usize = 1024;
const REGEX_SIZE_LIMIT: usize = 1 << 20;

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
    node: &Members,
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
pub async fn shrink(node: &Members, target: NodeId) -> Result<Vec<Change>, MemberError> {
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
