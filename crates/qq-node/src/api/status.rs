//! Reading the broker's state: lists of queues, exchanges, bindings and policies, one queue's
//! live information (from its leader), the cluster's status and the overview.
//!
//! Lists come from the metadata view; message counts come from each queue's leader, wherever
//! it is ([`crate::proposer::Proposer::queue_info`]). Every answer shows only the vhosts the
//! caller may see ([`super::auth::Auth::may_see`]): naming another vhost is PERMISSION_DENIED,
//! and `ClusterStatus` and `Overview` leave the other vhosts' queues out.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use qq_core::Strategy;
use qq_core::meta::{Binding, MetaState, Policy, QueueMeta};
use qq_core::policy;
use qq_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::Api;
use super::admin::limits_to_pb;
use super::auth::Caller;
use super::convert::{table_to_pb, vhost};
use crate::groups::registry::QueueInfoData;

/// How long `ClusterStatus` waits for each peer's answer.
const REACH_TIMEOUT: Duration = Duration::from_millis(800);

/// A queue's information as the API shows it; the age of its oldest message at `now_ms`.
pub(crate) fn queue_info_pb(
    meta: &MetaState,
    qm: &QueueMeta,
    data: Option<QueueInfoData>,
    now_ms: u64,
) -> pb::QueueInfo {
    let c = &qm.config;
    let effective = pb::EffectiveConfig {
        dead_letter_exchange: c.dead_letter_exchange.clone().unwrap_or_default(),
        has_dead_letter_exchange: c.dead_letter_exchange.is_some(),
        dead_letter_routing_key: c.dead_letter_routing_key.clone().unwrap_or_default(),
        dead_letter_strategy: c.dead_letter_strategy.as_str().to_string(),
        overflow: policy::overflow_name(c.overflow).to_string(),
        max_length: c.max_length,
        max_length_bytes: c.max_length_bytes,
        message_ttl_ms: c.message_ttl_ms,
        expires_ms: c.expires_ms,
        delivery_limit: c.delivery_limit,
        single_active_consumer: c.single_active_consumer,
        note: c.note.clone().unwrap_or_default(),
        requeue_delays_ms: c.requeue_delays_ms.clone(),
    };
    let mut info = pb::QueueInfo {
        name: qm.name.clone(),
        vhost: qm.vhost.clone(),
        arguments: table_to_pb(&qm.arguments),
        policy: c.policy.clone().unwrap_or_default(),
        operator_policy: meta
            .operator_policy_of(qm)
            .map(|p| p.name.clone())
            .unwrap_or_default(),
        effective: Some(effective),
        members: qm.members.clone(),
        id: qm.id,
        ..Default::default()
    };
    if let Some(d) = data {
        info.messages = d.counts.ready + d.counts.unacked + d.counts.held + d.counts.delayed;
        info.messages_delayed = d.counts.delayed;
        // Display only: the answering node's clock against the leader-stamped enqueue time.
        info.oldest_message_age_ms = d
            .oldest_ready_enqueued_ms
            .map(|t| now_ms.saturating_sub(t))
            .unwrap_or(0);
        info.messages_ready = d.counts.ready;
        info.messages_unacked = d.counts.unacked;
        info.messages_dead_letter_held = d.counts.held;
        info.consumers = d.counts.consumers;
        info.leader = d.leader;
        info.raft_term = d.term;
        info.commit_index = d.commit_index;
        info.last_applied = d.last_applied;
        info.state_digest = d.digest;
    }
    info
}

/// `ListPolicies`, or `ListOperatorPolicies` (`operator`).
pub async fn list_policies(
    api: &Api,
    request: Request<pb::ListPoliciesRequest>,
    operator: bool,
) -> Result<Response<pb::ListPoliciesResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    let policies = policies_of(api, &caller, &vhost(&request.get_ref().vhost), operator)?;
    Ok(Response::new(pb::ListPoliciesResponse { policies }))
}

/// The policies (or the `operator` policies) of vhost `v`, if `caller` may see it.
pub(crate) fn policies_of(
    api: &Api,
    caller: &Caller,
    v: &str,
    operator: bool,
) -> Result<Vec<pb::Policy>, Status> {
    api.auth.require_visible(caller, v)?;
    let meta = api.node.view().current();
    let policies: Vec<&Policy> = if operator {
        meta.operator_policies(v).collect()
    } else {
        meta.policies(v).collect()
    };
    Ok(policies
        .into_iter()
        .map(|p| pb::Policy {
            vhost: v.to_string(),
            name: p.name.clone(),
            pattern: p.pattern.clone(),
            apply_to: p.apply_to.clone(),
            priority: p.priority,
            definition: table_to_pb(&p.definition),
        })
        .collect())
}

pub async fn list_queues(
    api: &Api,
    request: Request<pb::ListQueuesRequest>,
) -> Result<Response<pb::ListQueuesResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    let queues = queues_of(api, &caller, &vhost(&request.get_ref().vhost)).await?;
    let meta = api.node.view().current();
    let now_ms = api.node.clock().now_ms();
    let queues = queues
        .into_iter()
        .map(|(q, d)| queue_info_pb(&meta, &q, d, now_ms))
        .collect();
    Ok(Response::new(pb::ListQueuesResponse { queues }))
}

/// The queues of vhost `v`, if `caller` may see it, each with its leader's live information
/// (None: the leader did not answer).
pub(crate) async fn queues_of(
    api: &Api,
    caller: &Caller,
    v: &str,
) -> Result<Vec<(QueueMeta, Option<QueueInfoData>)>, Status> {
    api.auth.require_visible(caller, v)?;
    let queues: Vec<QueueMeta> = api
        .node
        .view()
        .current()
        .queues()
        .filter(|q| q.vhost == v)
        .cloned()
        .collect();
    let proposer = api.node.proposer();
    let infos = join_all(queues.iter().map(|q| proposer.queue_info(q.id))).await;
    Ok(queues
        .into_iter()
        .zip(infos)
        .map(|(q, d)| (q, d.ok()))
        .collect())
}

pub async fn get_queue(
    api: &Api,
    request: Request<pb::GetQueueRequest>,
) -> Result<Response<pb::QueueInfo>, Status> {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    let (qm, data) = queue_of(api, &caller, &vhost(&r.vhost), &r.name).await?;
    let meta = api.node.view().current();
    let now_ms = api.node.clock().now_ms();
    Ok(Response::new(queue_info_pb(&meta, &qm, Some(data), now_ms)))
}

/// Queue `name` of vhost `v`, if `caller` may see the vhost, with its leader's information.
pub(crate) async fn queue_of(
    api: &Api,
    caller: &Caller,
    v: &str,
    name: &str,
) -> Result<(QueueMeta, QueueInfoData), Status> {
    super::guard::bounded(&[("name", name)])?;
    api.auth.require_visible(caller, v)?;
    let qm = api.queue_meta(v, name)?;
    let data = api.node.proposer().queue_info_with_digest(qm.id).await?;
    Ok((qm, data))
}

pub async fn list_exchanges(
    api: &Api,
    request: Request<pb::ListExchangesRequest>,
) -> Result<Response<pb::ListExchangesResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    let exchanges = exchanges_of(api, &caller, &vhost(&request.get_ref().vhost))?;
    Ok(Response::new(pb::ListExchangesResponse { exchanges }))
}

/// The exchanges of vhost `v`, if `caller` may see it.
pub(crate) fn exchanges_of(
    api: &Api,
    caller: &Caller,
    v: &str,
) -> Result<Vec<pb::ExchangeInfo>, Status> {
    api.auth.require_visible(caller, v)?;
    Ok(api
        .node
        .view()
        .current()
        .exchanges(v)
        .map(|x| pb::ExchangeInfo {
            vhost: v.to_string(),
            name: x.name.clone(),
            r#type: x.kind.as_str().to_string(),
            durable: x.durable,
            auto_delete: x.auto_delete,
            internal: x.internal,
            arguments: table_to_pb(&x.arguments),
        })
        .collect())
}

pub async fn list_bindings(
    api: &Api,
    request: Request<pb::ListBindingsRequest>,
) -> Result<Response<pb::ListBindingsResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    let bindings = bindings_of(api, &caller, &vhost(&request.get_ref().vhost))?;
    Ok(Response::new(pb::ListBindingsResponse { bindings }))
}

/// The bindings of vhost `v`, if `caller` may see it.
pub(crate) fn bindings_of(
    api: &Api,
    caller: &Caller,
    v: &str,
) -> Result<Vec<pb::BindingInfo>, Status> {
    api.auth.require_visible(caller, v)?;
    let meta = api.node.view().current();
    let info = |b: &Binding, kind: &str| pb::BindingInfo {
        vhost: v.to_string(),
        exchange: b.source.clone(),
        queue: if kind == "queue" {
            b.destination.clone()
        } else {
            String::new()
        },
        routing_key: b.routing_key.clone(),
        arguments: table_to_pb(&b.arguments),
        destination_kind: kind.to_string(),
        destination: b.destination.clone(),
    };
    let to_exchanges = meta.vhost(v).into_iter().flat_map(|x| &x.exchange_bindings);
    Ok(meta
        .bindings(v)
        .map(|b| info(b, "queue"))
        .chain(to_exchanges.map(|b| info(b, "exchange")))
        .collect())
}

pub async fn cluster_status(
    api: &Api,
    request: Request<pb::ClusterStatusRequest>,
) -> Result<Response<pb::ClusterStatusResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    Ok(Response::new(cluster_status_of(api, &caller).await))
}

/// The cluster as this node sees it, with the queues of the vhosts `caller` may see.
pub(crate) async fn cluster_status_of(api: &Api, caller: &Caller) -> pb::ClusterStatusResponse {
    let node = &api.node;
    let peers = node.peers();
    let reach = join_all(peers.ids().into_iter().map(|id| async move {
        if id == node.id() {
            return (id, Some(crate::VERSION.to_string()));
        }
        let Some(mut client) = peers.client(id) else {
            return (id, None);
        };
        let mut req = tonic::Request::new(qq_proto::internal::QueueInfoRequest {
            group: 0,
            with_digest: false,
            wait_applied: 0,
            read_index: false,
        });
        req.set_timeout(REACH_TIMEOUT);
        let version = client.queue_info(req).await.ok();
        (id, version.map(|r| r.into_inner().version))
    }))
    .await;
    let nodes = reach
        .into_iter()
        .map(|(id, version)| pb::NodeStatus {
            id,
            address: peers.address(id).unwrap_or_default(),
            reachable: version.is_some(),
            version: version.unwrap_or_default(),
        })
        .collect();
    let registry = node.registry();
    let state = node.view().current();
    let queues = state
        .queues()
        .filter(|q| api.auth.may_see(&state, caller, &q.vhost))
        .map(|q| {
            let local = registry.local_queue_info(q.id, false, true);
            let broken = match registry.local_invariants(q.id) {
                Some(Err(e)) => e,
                _ => String::new(),
            };
            pb::QueueLeader {
                vhost: q.vhost.clone(),
                name: q.name.clone(),
                leader: registry.known_leader(q.id).unwrap_or(0),
                members: q.members.clone(),
                local_member: local.is_some(),
                local_last_applied: local.as_ref().map(|l| l.last_applied).unwrap_or(0),
                local_state_digest: local.as_ref().map(|l| l.digest).unwrap_or(0),
                local_term: local.as_ref().map(|l| l.term).unwrap_or(0),
                local_invariant_error: broken,
            }
        })
        .collect();
    pb::ClusterStatusResponse {
        nodes,
        metadata_leader: registry.known_leader(0).unwrap_or(0),
        queues,
        node_id: node.id(),
        alarms: node.alarms().active(),
    }
}

pub async fn overview(
    api: &Api,
    request: Request<pb::OverviewRequest>,
) -> Result<Response<pb::OverviewResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    Ok(Response::new(overview_of(api, &caller).await))
}

/// Message and dead-letter totals over the queues of the vhosts `caller` may see.
pub(crate) async fn overview_of(api: &Api, caller: &Caller) -> pb::OverviewResponse {
    let state = api.node.view().current();
    let metas: Vec<QueueMeta> = state
        .queues()
        .filter(|q| api.auth.may_see(&state, caller, &q.vhost))
        .cloned()
        .collect();
    let proposer = api.node.proposer();
    let infos = join_all(metas.iter().map(|q| proposer.queue_info(q.id))).await;
    let mut o = pb::OverviewResponse {
        queues: metas.len() as u64,
        node_id: api.node.id(),
        ..Default::default()
    };
    let mut dl: BTreeMap<(&'static str, &'static str), u64> = BTreeMap::new();
    for reason in qq_core::Reason::ALL {
        for strategy in [
            Strategy::Disabled,
            Strategy::AtMostOnce,
            Strategy::AtLeastOnce,
        ] {
            dl.insert((reason.as_str(), strategy.as_str()), 0);
        }
    }
    for d in infos.into_iter().flatten() {
        o.messages += d.counts.ready + d.counts.unacked + d.counts.held + d.counts.delayed;
        o.messages_ready += d.counts.ready;
        o.messages_unacked += d.counts.unacked;
        o.consumers += d.counts.consumers;
        for (reason, strategy, n) in d.stats.dead_lettered_all() {
            *dl.entry((reason.as_str(), strategy.as_str())).or_default() += n;
        }
        o.messages_dead_lettered_confirmed_total += d.stats.dead_lettered_confirmed;
    }
    o.messages_dead_lettered_total = dl
        .into_iter()
        .map(|((reason, strategy), count)| pb::DeadLetterCount {
            reason: reason.into(),
            strategy: strategy.into(),
            count,
        })
        .collect();
    o
}

/// Every vhost and user with limits set; administrators only.
pub async fn list_limits(
    api: &Api,
    request: Request<pb::ListLimitsRequest>,
) -> Result<Response<pb::ListLimitsResponse>, Status> {
    api.admin(&request).await?;
    let state = api.node.view().current();
    Ok(Response::new(pb::ListLimitsResponse {
        vhosts: state
            .all_vhost_limits()
            .map(|(vhost, l)| pb::VhostLimits {
                vhost: vhost.to_string(),
                limits: Some(limits_to_pb(l)),
            })
            .collect(),
        users: state
            .all_user_limits()
            .map(|(user, l)| pb::UserLimits {
                user: user.to_string(),
                limits: Some(limits_to_pb(l)),
            })
            .collect(),
    }))
}
