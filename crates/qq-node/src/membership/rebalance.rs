//! RebalanceLeaders: queue leaderships moved so each node leads about as many queues as the
//! others.

use std::collections::BTreeMap;

use qq_core::NodeId;
use qq_core::meta::QueueMeta;
use tracing::warn;

use super::Members;
use super::group_op::{GroupOp, group_op};
use super::{LeaderMove, MemberError, current_queue, record, without};

/// Move queue leaders so each node leads about as many queues as the others: while some
/// queue's leader leads at least two more queues than another member of that queue, hand
/// the leadership to the member leading fewest. Returns the moves tried, each with its result.
pub async fn rebalance(
    node: &Members,
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
async fn reorder_first(node: &Members, qm: &QueueMeta, first: NodeId) {
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
