//! Membership changes (administrator-only): AddMember, DeleteMember, GrowQueues,
//! ShrinkQueues, RebalanceLeaders, QuorumCritical, as thin adapters over
//! [`crate::membership`].

use qq_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::Api;
use super::convert::meta_error_to_status;
use super::guard::{bounded, shown};
use crate::membership::{self, Change, MemberError};

type Unary<T> = Result<Response<T>, Status>;

pub(crate) fn status(e: MemberError) -> Status {
    match e {
        MemberError::Meta(m) => meta_error_to_status(&m),
        MemberError::Node(n) => n.into(),
    }
}

fn node_field(node: u64) -> Result<u64, Status> {
    if node == 0 {
        return Err(Status::invalid_argument("node: a node id is required"));
    }
    Ok(node)
}

fn vhost_of(vhost: String) -> String {
    if vhost.is_empty() { "/".into() } else { vhost }
}

fn to_pb(c: Change) -> pb::MemberChange {
    pb::MemberChange {
        vhost: c.vhost,
        queue: c.queue,
        outcome: c.outcome.into(),
        detail: c.detail,
        members: c.members,
    }
}

pub async fn add_member(api: &Api, request: Request<pb::MemberRequest>) -> Unary<pb::MemberChange> {
    member(api, request, true).await
}

pub async fn delete_member(
    api: &Api,
    request: Request<pb::MemberRequest>,
) -> Unary<pb::MemberChange> {
    member(api, request, false).await
}

async fn member(
    api: &Api,
    request: Request<pb::MemberRequest>,
    add: bool,
) -> Unary<pb::MemberChange> {
    api.admin(&request).await?;
    let r = request.into_inner();
    bounded(&[("vhost", &r.vhost), ("queue", &r.queue)])?;
    let vhost = vhost_of(r.vhost);
    let node = node_field(r.node)?;
    api.queue_meta(&vhost, &r.queue)?;
    let node_ref = &api.node.members();
    let c = if add {
        membership::add_member(node_ref, &vhost, &r.queue, node).await
    } else {
        membership::delete_member(node_ref, &vhost, &r.queue, node).await
    }
    .map_err(status)?;
    Ok(Response::new(to_pb(c)))
}

pub async fn grow(api: &Api, request: Request<pb::GrowQueuesRequest>) -> Unary<pb::MemberChanges> {
    api.admin(&request).await?;
    let r = request.into_inner();
    bounded(&[("vhost", &r.vhost)])?;
    let node = node_field(r.node)?;
    let pattern = membership::compile_pattern(&r.pattern).map_err(|e| meta_error_to_status(&e))?;
    if !r.vhost.is_empty() && !api.node.view().current().vhost_exists(&r.vhost) {
        return Err(Status::not_found(format!(
            "vhost '{}' not found",
            shown(&r.vhost)
        )));
    }
    let changes = membership::grow(&api.node.members(), node, &r.vhost, &pattern)
        .await
        .map_err(status)?;
    Ok(Response::new(pb::MemberChanges {
        changes: changes.into_iter().map(to_pb).collect(),
    }))
}

pub async fn shrink(
    api: &Api,
    request: Request<pb::ShrinkQueuesRequest>,
) -> Unary<pb::MemberChanges> {
    api.admin(&request).await?;
    let node = node_field(request.get_ref().node)?;
    let changes = membership::shrink(&api.node.members(), node)
        .await
        .map_err(status)?;
    Ok(Response::new(pb::MemberChanges {
        changes: changes.into_iter().map(to_pb).collect(),
    }))
}

pub async fn rebalance(
    api: &Api,
    request: Request<pb::RebalanceLeadersRequest>,
) -> Unary<pb::RebalanceLeadersResponse> {
    api.admin(&request).await?;
    let (moves, counts) = membership::rebalance(&api.node.members())
        .await
        .map_err(status)?;
    Ok(Response::new(pb::RebalanceLeadersResponse {
        moves: moves
            .into_iter()
            .map(|m| pb::LeaderMove {
                vhost: m.vhost,
                queue: m.queue,
                from: m.from,
                to: m.to,
                detail: m.detail,
            })
            .collect(),
        leaders_per_node: counts.into_iter().collect(),
    }))
}

pub async fn quorum_critical(
    api: &Api,
    request: Request<pb::QuorumCriticalRequest>,
) -> Unary<pb::QuorumCriticalResponse> {
    api.admin(&request).await?;
    let node = node_field(request.get_ref().node)?;
    let (queues, metadata) = membership::quorum_critical(&api.node.members(), node)
        .await
        .map_err(status)?;
    Ok(Response::new(pb::QuorumCriticalResponse {
        queues: queues
            .into_iter()
            .map(|c| pb::CriticalQueue {
                vhost: c.vhost,
                queue: c.queue,
                members: c.members,
                online: c.online,
            })
            .collect(),
        metadata,
    }))
}

pub async fn join_node(
    api: &Api,
    request: Request<pb::JoinNodeRequest>,
) -> Unary<pb::JoinNodeResponse> {
    api.admin(&request).await?;
    let r = request.into_inner();
    if r.id == 0 {
        return Err(Status::invalid_argument("id: a node id is required"));
    }
    let detail = membership::join_node(&api.node.members(), r.id, &r.address, &r.cluster_address)
        .await
        .map_err(status)?;
    Ok(Response::new(pb::JoinNodeResponse { detail }))
}

pub async fn forget_node(
    api: &Api,
    request: Request<pb::ForgetNodeRequest>,
) -> Unary<pb::MemberChanges> {
    api.admin(&request).await?;
    let id = request.into_inner().id;
    if id == 0 {
        return Err(Status::invalid_argument("id: a node id is required"));
    }
    let changes = membership::forget_node(&api.node.members(), id)
        .await
        .map_err(status)?;
    Ok(Response::new(pb::MemberChanges {
        changes: changes.into_iter().map(to_pb).collect(),
    }))
}
