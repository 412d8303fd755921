//! The node-to-node side of a node's incarnation (its data directory, [`qq_raft::incarnation`]):
//! what this node's metadata records of another node's directory (`Incarnation`), and the
//! re-seeding of a node that came back on a new directory (`Reseed`). The node that asks is
//! [`crate::node`]'s `incarnation` task.

use std::time::Duration;

use qq_proto::internal::{IncarnationReply, IncarnationRequest, ReseedReply};
use qq_raft::META_GROUP;
use tonic::Status;

use super::peering::Peering;

/// How long an answer waits for this node's metadata to catch up with the leader's.
const CATCH_UP: Duration = Duration::from_secs(2);

/// What this node's metadata says of node `req.node`'s directory: caught up to the metadata
/// leader's read index when there is a leader to ask.
pub async fn incarnation(node: &Peering, req: &IncarnationRequest) -> IncarnationReply {
    let initialized = !node.meta_voters().is_empty();
    let leader = node.registry().known_leader(META_GROUP).is_some();
    // Without a leader (a cluster forming) there is nothing to catch up with: answer at once.
    let caught_up = initialized
        && leader
        && node
            .proposer()
            .catch_up_meta(node.clock().now() + CATCH_UP)
            .await;
    let state = node.view().current();
    IncarnationReply {
        initialized,
        caught_up,
        recorded: state.incarnation(req.node).unwrap_or(0),
        forgotten: state.forgotten_nodes().contains(&req.node),
    }
}

/// Re-seed node `req.node` on its new directory `req.incarnation`
/// ([`crate::membership::reseed_node`]), in a task of its own: the asking node stops waiting
/// as soon as its metadata shows the directory recorded (before its replicas are back), and
/// the re-seed must not stop half-way with the call.
pub async fn reseed(node: &Peering, req: IncarnationRequest) -> Result<ReseedReply, Status> {
    if req.node == 0 || req.incarnation == 0 {
        return Err(Status::invalid_argument(
            "node, incarnation: both are required",
        ));
    }
    let task = {
        let members = node.members().clone();
        let stopping = node.stopping().clone();
        node.tasks().spawn(async move {
            let addrs = (req.address.as_str(), req.cluster_address.as_str());
            let reseed = crate::membership::reseed_node(&members, req.node, req.incarnation, addrs);
            stopping.run_until_cancelled(reseed).await
        })
    };
    let detail = task
        .await
        .map_err(|e| Status::internal(format!("re-seed task: {e}")))?
        .ok_or_else(|| Status::unavailable("this node is stopping; ask another"))?
        .map_err(crate::api::members::status)?;
    Ok(ReseedReply { detail })
}
