//! QuorumCritical: which queues (and whether the metadata) would lose their majority if a
//! node stopped, given which nodes answer now.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::future::join_all;
use qq_core::NodeId;
use qq_proto::internal::QueueInfoRequest;

use super::Members;
use super::{Critical, MemberError, check_cluster_node};

/// How long a reachability probe of a peer (QuorumCritical) may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);

/// Which nodes answer now (this node always does).
pub async fn online_nodes(node: &Members) -> BTreeSet<NodeId> {
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
            read_index: false,
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
    node: &Members,
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
