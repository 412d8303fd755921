//! The cluster's own membership: a node joins (recorded, then learner, caught up, voter of the
//! metadata group) or is forgotten (its replicas deleted, out of the metadata group, then
//! recorded).

use qq_core::NodeId;
use qq_core::meta::{MetaCommand, MetaError};
use tracing::info;

use super::Members;
use super::group_op::{GroupOp, meta_op};
use super::grow_shrink::shrink;
use super::queue_members::add_member;
use super::quorum::online_nodes;
use super::{Change, MemberError, check_cluster_node};

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
    node: &Members,
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
pub async fn forget_node(node: &Members, id: NodeId) -> Result<Vec<Change>, MemberError> {
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
    let changes = forget_running(node, id).await?;
    info!(node = id, queues = changes.len(), "node forgotten");
    Ok(changes)
}

/// [`forget_node`] without asking whether node `id` still runs: for a node that asked to be
/// re-seeded ([`reseed_node`]), which runs but holds its votes.
async fn forget_running(node: &Members, id: NodeId) -> Result<Vec<Change>, MemberError> {
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
    Ok(changes)
}

/// Re-seed node `id`, which runs on a new data directory (`incarnation`) while the cluster
/// recorded another (it lost its votes and what it acknowledged, and holds its votes): forget
/// it (out of every queue group and the metadata group), let it join again at `addrs`
/// (`address`, `cluster_address`; [`join_node`]), record `incarnation` (the node votes again
/// once it sees it), and add it back to every queue it held. Refused (FAILED_PRECONDITION) if it is the last member of a queue: that queue's data
/// went with the directory. Idempotent: once `incarnation` is recorded it only says so; a node
/// found forgotten (an earlier attempt stopped half-way) joins again, without the replicas
/// the earlier attempt took away (`qqctl grow` gives them back).
pub async fn reseed_node(
    node: &Members,
    id: NodeId,
    incarnation: u64,
    addrs: (&str, &str),
) -> Result<String, MemberError> {
    if id == node.id() {
        return Err(MemberError::Meta(MetaError::failed_precondition(format!(
            "node: node {id} is the node serving this request; ask another node"
        ))));
    }
    let state = node.view().current();
    if state.incarnation(id) == Some(incarnation) {
        return Ok(format!("node {id} runs on {incarnation:016x} already"));
    }
    let (address, cluster_address) =
        match (node.peers().address(id), node.peers().cluster_address(id)) {
            (Some(a), Some(c)) => (a, c),
            _ => (addrs.0.to_string(), addrs.1.to_string()),
        };
    check_address("address", &address)?;
    check_address("cluster_address", &cluster_address)?;
    info!(node = id, incarnation = %format_args!("{incarnation:016x}"), "re-seeding a node on a new data directory");
    let changes = if state.forgotten_nodes().contains(&id) {
        Vec::new()
    } else {
        check_cluster_node(node, id)?;
        forget_running(node, id).await?
    };
    join_node(node, id, &address, &cluster_address).await?;
    node.proposer()
        .propose_meta(MetaCommand::RecordIncarnation { id, incarnation })
        .await??;
    let mut back = 0;
    for c in changes.iter().filter(|c| c.outcome == "deleted") {
        let added = add_member(node, &c.vhost, &c.queue, id).await?;
        back += usize::from(added.outcome == "added");
    }
    info!(node = id, queues = back, "node re-seeded");
    Ok(format!(
        "node {id} re-seeded on data directory {incarnation:016x}: joined again, a replica of \
         {back} queue(s) back"
    ))
}
