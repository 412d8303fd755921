//! Declaring and deleting things: exchanges, queues, bindings, policies, users, permissions,
//! vhosts. Each handler checks the caller, validates what the metadata machine does not, and
//! proposes one metadata command; queue purges go to the queue's own group.

use std::time::Duration;

use qq_core::Table;
use qq_core::meta::{Limits, MetaCommand, MetaReply, Perm, Policy};
use qq_core::queue::{Command, Reply};
use qq_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::Api;
use super::auth::Caller;
use super::convert::{table_from_pb, vhost};
use super::guard::{bounded, shown};
use crate::groups::queue_sm::QueueRequest;

type Empty = Result<Response<pb::Empty>, Status>;

fn empty() -> Empty {
    Ok(Response::new(pb::Empty {}))
}

pub async fn declare_exchange(api: &Api, request: Request<pb::DeclareExchangeRequest>) -> Empty {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    bounded(&[("vhost", &r.vhost), ("name", &r.name)])?;
    let vhost = vhost(&r.vhost);
    let arguments = table_from_pb("arguments", &r.arguments)?;
    if r.passive {
        // A passive declare only looks: like RabbitMQ, it needs access to the vhost, not
        // configure on the exchange.
        api.auth.require_visible(&caller, &vhost)?;
        let state = api.node.view().current();
        // The default exchange "" always exists, though no declare created it.
        if r.name.is_empty() || state.exchange(&vhost, &r.name).is_some() {
            return empty();
        }
        return Err(Status::not_found(format!(
            "exchange '{}' in vhost '{}' not found",
            shown(&r.name),
            shown(&vhost)
        )));
    }
    api.auth.check(&caller, &vhost, Perm::Configure, &r.name)?;
    check_alternate_exchange(api, &caller, &vhost, &r.name, &arguments)?;
    api.meta(MetaCommand::DeclareExchange {
        vhost,
        name: r.name,
        kind: r.r#type,
        durable: r.durable,
        auto_delete: r.auto_delete,
        internal: r.internal,
        arguments,
        passive: false,
        owner: Some(caller.user),
    })
    .await?;
    empty()
}

/// An `alternate-exchange` argument names an exchange by a string, and messages will flow from
/// this exchange to it: as RabbitMQ, the declarer needs read on this exchange and write on the
/// alternate one (it need not exist yet).
fn check_alternate_exchange(
    api: &Api,
    caller: &Caller,
    vhost: &str,
    name: &str,
    arguments: &Table,
) -> Result<(), Status> {
    let Some(ae) = arguments.get("alternate-exchange") else {
        return Ok(());
    };
    let Some(ae) = ae.as_str() else {
        return Err(Status::invalid_argument(format!(
            "arguments: alternate-exchange of exchange '{}' must be a string (an exchange name)",
            shown(name)
        )));
    };
    api.auth.check(caller, vhost, Perm::Read, name)?;
    api.auth.check(caller, vhost, Perm::Write, ae)
}

pub async fn delete_exchange(api: &Api, request: Request<pb::DeleteExchangeRequest>) -> Empty {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    bounded(&[("vhost", &r.vhost), ("name", &r.name)])?;
    let vhost = vhost(&r.vhost);
    api.auth.check(&caller, &vhost, Perm::Configure, &r.name)?;
    api.meta(MetaCommand::DeleteExchange {
        vhost,
        name: r.name,
        if_unused: r.if_unused,
    })
    .await?;
    empty()
}

/// How long a declare waits on its own replica for the new group's first leader before it
/// asks the members (the group's first election is normally well within this).
const NEW_QUEUE_LEADER_WAIT: Duration = Duration::from_secs(2);

pub async fn declare_queue(
    api: &Api,
    request: Request<pb::DeclareQueueRequest>,
) -> Result<Response<pb::DeclareQueueResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    bounded(&[("vhost", &r.vhost), ("name", &r.name)])?;
    let vhost = vhost(&r.vhost);
    if r.name.is_empty() {
        return Err(Status::invalid_argument(
            "name: a queue name is required (quorum queues cannot be server-named)",
        ));
    }
    let arguments = table_from_pb("arguments", &r.arguments)?;
    let qm = if r.passive {
        // Only looks: access to the vhost is enough, as in RabbitMQ.
        api.auth.require_visible(&caller, &vhost)?;
        api.queue_meta(&vhost, &r.name)?
    } else {
        api.auth.check(&caller, &vhost, Perm::Configure, &r.name)?;
        if let Some(dlx) = arguments.get("x-dead-letter-exchange") {
            api.auth.check(&caller, &vhost, Perm::Read, &r.name)?;
            if let Some(dlx) = dlx.as_str() {
                api.auth.check(&caller, &vhost, Perm::Write, dlx)?;
            }
        }
        let cmd = MetaCommand::DeclareQueue {
            vhost: vhost.clone(),
            name: r.name.clone(),
            arguments,
            passive: false,
            nodes: api.node.placement_nodes(),
            owner: Some(caller.user.clone()),
            origin: Some(api.node.id()),
        };
        match api.meta(cmd).await? {
            MetaReply::QueueDeclared { queue, .. } => queue,
            other => return Err(Status::internal(format!("unexpected reply {other:?}"))),
        }
    };
    // Wait until the queue's group has a leader, so the queue is usable when we answer.
    api.node
        .registry()
        .wait_for_leader(qm.id, NEW_QUEUE_LEADER_WAIT)
        .await;
    let data = api.node.proposer().queue_info(qm.id).await?;
    Ok(Response::new(pb::DeclareQueueResponse {
        name: qm.name,
        message_count: data.counts.ready,
        consumer_count: data.counts.consumers,
    }))
}

pub async fn delete_queue(
    api: &Api,
    request: Request<pb::DeleteQueueRequest>,
) -> Result<Response<pb::DeleteQueueResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    bounded(&[("vhost", &r.vhost), ("name", &r.name)])?;
    let vhost = vhost(&r.vhost);
    api.auth.check(&caller, &vhost, Perm::Configure, &r.name)?;
    let qm = api.queue_meta(&vhost, &r.name)?;
    let info = api.node.proposer().queue_info(qm.id).await;
    if (r.if_empty || r.if_unused) && info.is_err() {
        // Never delete a queue whose emptiness or consumers are unknown.
        let condition = if r.if_empty { "if_empty" } else { "if_unused" };
        return Err(Status::unavailable(format!(
            "queue '{}' in vhost '{}': no leader answers, so {condition} cannot be \
             checked; not deleted (safe to retry)",
            shown(&r.name),
            shown(&vhost)
        )));
    }
    let data = info.ok();
    let messages = data
        .as_ref()
        .map(|d| d.counts.ready + d.counts.unacked + d.counts.held + d.counts.delayed)
        .unwrap_or(0);
    if r.if_unused && data.as_ref().map(|d| d.counts.consumers).unwrap_or(0) > 0 {
        return Err(Status::failed_precondition(format!(
            "queue '{}' in vhost '{}' has consumers (if_unused)",
            shown(&r.name),
            shown(&vhost)
        )));
    }
    if r.if_empty && messages > 0 {
        return Err(Status::failed_precondition(format!(
            "queue '{}' in vhost '{}' has {messages} messages (if_empty)",
            shown(&r.name),
            shown(&vhost)
        )));
    }
    api.meta(MetaCommand::DeleteQueue {
        vhost,
        name: r.name,
    })
    .await?;
    Ok(Response::new(pb::DeleteQueueResponse {
        message_count: messages,
    }))
}

pub async fn purge_queue(
    api: &Api,
    request: Request<pb::PurgeQueueRequest>,
) -> Result<Response<pb::PurgeQueueResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    bounded(&[("vhost", &r.vhost), ("name", &r.name)])?;
    let vhost = vhost(&r.vhost);
    api.auth.check(&caller, &vhost, Perm::Read, &r.name)?;
    let qm = api.queue_meta(&vhost, &r.name)?;
    match api
        .node
        .proposer()
        .propose_queue(qm.id, QueueRequest::command(Command::Purge))
        .await?
    {
        Reply::Purged { count } => Ok(Response::new(pb::PurgeQueueResponse {
            message_count: count,
        })),
        other => Err(Status::internal(format!("unexpected reply {other:?}"))),
    }
}

/// Bind or unbind: write on the queue, read on the exchange (as RabbitMQ).
pub async fn binding(api: &Api, request: Request<pb::BindRequest>, bind: bool) -> Empty {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    bounded(&[
        ("vhost", &r.vhost),
        ("queue", &r.queue),
        ("exchange", &r.exchange),
    ])?;
    let vhost = vhost(&r.vhost);
    api.auth.check(&caller, &vhost, Perm::Write, &r.queue)?;
    api.auth.check(&caller, &vhost, Perm::Read, &r.exchange)?;
    let arguments = table_from_pb("arguments", &r.arguments)?;
    let (queue, exchange, routing_key) = (r.queue, r.exchange, r.routing_key);
    let cmd = if bind {
        MetaCommand::Bind {
            vhost,
            queue,
            exchange,
            routing_key,
            arguments,
        }
    } else {
        MetaCommand::Unbind {
            vhost,
            queue,
            exchange,
            routing_key,
            arguments,
        }
    };
    api.meta(cmd).await?;
    empty()
}

/// `BindExchange` (`bind`) or `UnbindExchange`: write on the destination and read on the
/// source, as RabbitMQ checks `exchange.bind`.
pub async fn exchange_binding(
    api: &Api,
    request: Request<pb::ExchangeBindRequest>,
    bind: bool,
) -> Empty {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    bounded(&[
        ("vhost", &r.vhost),
        ("destination", &r.destination),
        ("source", &r.source),
    ])?;
    let vhost = vhost(&r.vhost);
    api.auth
        .check(&caller, &vhost, Perm::Write, &r.destination)?;
    api.auth.check(&caller, &vhost, Perm::Read, &r.source)?;
    let arguments = table_from_pb("arguments", &r.arguments)?;
    let cmd = MetaCommand::exchange_binding(
        bind,
        vhost,
        r.destination,
        r.source,
        r.routing_key,
        arguments,
    );
    api.meta(cmd).await?;
    empty()
}

/// `SetPolicy`, or `SetOperatorPolicy` (`operator`): administrators only (RabbitMQ's
/// policymaker and administrator tags are one tag here).
pub async fn set_policy(
    api: &Api,
    request: Request<pb::SetPolicyRequest>,
    operator: bool,
) -> Empty {
    api.admin(&request).await?;
    let r = request.into_inner();
    let definition = table_from_pb("definition", &r.definition)?;
    let apply_to = if r.apply_to.is_empty() {
        "all".to_string()
    } else {
        r.apply_to
    };
    let policy = Policy {
        name: r.name,
        pattern: r.pattern,
        apply_to,
        priority: r.priority,
        definition,
    };
    api.meta(MetaCommand::set_policy(operator, vhost(&r.vhost), policy))
        .await?;
    empty()
}

/// `ClearPolicy`, or `ClearOperatorPolicy` (`operator`).
pub async fn clear_policy(
    api: &Api,
    request: Request<pb::ClearPolicyRequest>,
    operator: bool,
) -> Empty {
    api.admin(&request).await?;
    let r = request.into_inner();
    let (vhost, name) = (vhost(&r.vhost), r.name);
    api.meta(if operator {
        MetaCommand::ClearOperatorPolicy { vhost, name }
    } else {
        MetaCommand::ClearPolicy { vhost, name }
    })
    .await?;
    empty()
}

pub async fn put_user(api: &Api, request: Request<pb::PutUserRequest>) -> Empty {
    api.admin(&request).await?;
    let r = request.into_inner();
    if r.name.is_empty() {
        return Err(Status::invalid_argument("name: a user name is required"));
    }
    if !r.password_hash.is_empty() {
        if !r.password.is_empty() {
            return Err(Status::invalid_argument(
                "password_hash: give either a password or a password_hash, not both",
            ));
        }
        // A hash as ExportDefinitions gives it, checked before it is proposed.
        let cmd = crate::definitions::put_user_with_hash(
            crate::definitions::HashFields {
                hash: "password_hash",
                algorithm: "password_hash",
            },
            r.name,
            &r.password_hash,
            crate::definitions::HASHING_ALGORITHM,
            r.tags,
        )?;
        api.meta(cmd).await?;
        return empty();
    }
    if r.password.is_empty() {
        return Err(Status::invalid_argument("password: must not be empty"));
    }
    // Argon2id with a random salt, here on the proposing node: apply stays deterministic.
    let cmd = qq_raft::lockstep::spawn_blocking(move || {
        super::auth::hash_new_password(r.name, &r.password, r.tags)
    })
    .await
    .map_err(|e| Status::internal(format!("password: hashing failed: {e}")))??;
    api.meta(cmd).await?;
    empty()
}

pub async fn delete_user(api: &Api, request: Request<pb::DeleteUserRequest>) -> Empty {
    api.admin(&request).await?;
    let name = request.into_inner().name;
    api.meta(MetaCommand::DeleteUser { name }).await?;
    empty()
}

pub async fn set_permissions(api: &Api, request: Request<pb::SetPermissionsRequest>) -> Empty {
    api.admin(&request).await?;
    let r = request.into_inner();
    api.meta(MetaCommand::SetPermissions {
        user: r.user,
        vhost: vhost(&r.vhost),
        configure: r.configure,
        write: r.write,
        read: r.read,
    })
    .await?;
    empty()
}

pub async fn put_vhost(api: &Api, request: Request<pb::PutVhostRequest>) -> Empty {
    api.admin(&request).await?;
    let name = request.into_inner().name;
    if name.is_empty() {
        return Err(Status::invalid_argument("name: a vhost name is required"));
    }
    api.meta(MetaCommand::PutVhost { name }).await?;
    empty()
}

pub async fn delete_vhost(api: &Api, request: Request<pb::DeleteVhostRequest>) -> Empty {
    api.admin(&request).await?;
    let name = request.into_inner().name;
    api.meta(MetaCommand::DeleteVhost { name }).await?;
    empty()
}

fn limits_from_pb(limits: Option<pb::Limits>) -> Limits {
    let l = limits.unwrap_or_default();
    Limits {
        max_queues: l.max_queues,
        max_exchanges: l.max_exchanges,
        max_connections: l.max_connections,
        max_consumers: l.max_consumers,
    }
}

pub fn limits_to_pb(l: &Limits) -> pb::Limits {
    pb::Limits {
        max_queues: l.max_queues,
        max_exchanges: l.max_exchanges,
        max_connections: l.max_connections,
        max_consumers: l.max_consumers,
    }
}

pub async fn set_vhost_limits(api: &Api, request: Request<pb::SetVhostLimitsRequest>) -> Empty {
    api.admin(&request).await?;
    let r = request.into_inner();
    api.meta(MetaCommand::SetVhostLimits {
        vhost: vhost(&r.vhost),
        limits: limits_from_pb(r.limits),
    })
    .await?;
    empty()
}

pub async fn set_user_limits(api: &Api, request: Request<pb::SetUserLimitsRequest>) -> Empty {
    api.admin(&request).await?;
    let r = request.into_inner();
    if r.user.is_empty() {
        return Err(Status::invalid_argument("user: a user name is required"));
    }
    api.meta(MetaCommand::SetUserLimits {
        user: r.user,
        limits: limits_from_pb(r.limits),
    })
    .await?;
    empty()
}
