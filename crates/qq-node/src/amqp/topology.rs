//! exchange.* and queue.*: each method becomes the gRPC handler's request, run as the
//! connection's caller, so permissions, validation, limits and RabbitMQ-shaped refusals are
//! the ones `qq.v1.Broker` gives.
//!
//! Every queue is a quorum queue: a declare that asks for `exclusive`, `auto-delete` or a
//! non-durable queue is refused with 406, as RabbitMQ refuses those properties for
//! `x-queue-type=quorum`. Deleting a queue or exchange that does not exist succeeds, as in
//! RabbitMQ. Exchange-to-exchange bindings (exchange.bind/unbind) are `BindExchange` and
//! `UnbindExchange`: refused with 406 while a rolling upgrade has not moved the metadata
//! machine to version 2.

use amq_protocol::protocol::{AMQPClass, exchange as ex, queue as q};
use amq_protocol::types::{FieldTable, ShortString};
use qq_core::meta::Perm;
use qq_proto::v1 as pb;
use tonic::{Code, Status};

use super::codes::{AmqpError, PRECONDITION_FAILED, RESOURCE_LOCKED};
use super::convert::{arguments_from_amqp, short};
use super::session::{Session, request};
use crate::api::{admin, convert::table_to_pb};

fn arguments(t: &FieldTable) -> std::collections::HashMap<String, pb::Value> {
    table_to_pb(&arguments_from_amqp(t))
}

/// A delete of something that does not exist is done.
fn missing_is_done<T>(r: Result<T, Status>, done: T) -> Result<T, Status> {
    match r {
        Err(s) if s.code() == Code::NotFound => Ok(done),
        other => other,
    }
}

pub async fn exchange(
    session: &Session,
    method: ex::AMQPMethod,
) -> Result<Option<AMQPClass>, AmqpError> {
    let api = &session.ctx.api;
    let vhost = session.vhost.clone();
    let (reply, nowait) = match method {
        ex::AMQPMethod::Declare(d) => {
            let kind = d.kind.as_str();
            if !d.passive && qq_core::route::ExchangeType::parse(kind).is_none() {
                // RabbitMQ's answer to a type it has no plugin for: a connection error.
                return Err(AmqpError::new(
                    super::codes::COMMAND_INVALID,
                    format!("invalid exchange type '{kind}'"),
                ));
            }
            let r = pb::DeclareExchangeRequest {
                vhost,
                name: d.exchange.to_string(),
                r#type: d.kind.to_string(),
                durable: d.durable,
                auto_delete: d.auto_delete,
                internal: d.internal,
                arguments: arguments(&d.arguments),
                passive: d.passive,
            };
            admin::declare_exchange(api, request(session, r)).await?;
            (ex::AMQPMethod::DeclareOk(ex::DeclareOk {}), d.nowait)
        }
        ex::AMQPMethod::Delete(d) => {
            let r = pb::DeleteExchangeRequest {
                vhost,
                name: d.exchange.to_string(),
                if_unused: d.if_unused,
            };
            let done = admin::delete_exchange(api, request(session, r))
                .await
                .map(|_| ());
            missing_is_done(done, ())?;
            (ex::AMQPMethod::DeleteOk(ex::DeleteOk {}), d.nowait)
        }
        ex::AMQPMethod::Bind(b) => {
            let r = exchange_binding(
                vhost,
                &b.destination,
                &b.source,
                &b.routing_key,
                &b.arguments,
            );
            admin::exchange_binding(api, request(session, r), true).await?;
            (ex::AMQPMethod::BindOk(ex::BindOk {}), b.nowait)
        }
        ex::AMQPMethod::Unbind(b) => {
            let r = exchange_binding(
                vhost,
                &b.destination,
                &b.source,
                &b.routing_key,
                &b.arguments,
            );
            admin::exchange_binding(api, request(session, r), false).await?;
            (ex::AMQPMethod::UnbindOk(ex::UnbindOk {}), b.nowait)
        }
        _ => return Err(client_only()),
    };
    Ok((!nowait).then_some(AMQPClass::Exchange(reply)))
}

fn client_only() -> AmqpError {
    AmqpError::new(
        super::codes::COMMAND_INVALID,
        "a server method sent by the client",
    )
}

/// The quorum-queue refusals of RabbitMQ, in its order and words.
fn quorum_properties(d: &q::Declare, vhost: &str) -> Result<(), AmqpError> {
    let name = d.queue.as_str();
    let refuse = |property: &str| {
        Err(AmqpError::new(
            PRECONDITION_FAILED,
            format!("invalid property '{property}' for queue '{name}' in vhost '{vhost}'"),
        ))
    };
    if d.auto_delete {
        return refuse("auto-delete");
    }
    if d.exclusive {
        return refuse("exclusive-owner");
    }
    if !d.durable {
        return refuse("non-durable");
    }
    Ok(())
}

/// An `exclusive` redeclare of an existing queue, by a caller who may configure it:
/// RabbitMQ's 405 (the queue exists, so it cannot be this connection's exclusive queue), before
/// the 406 an exclusive declare of a new quorum queue gets.
fn exclusive_redeclare(session: &Session, d: &q::Declare) -> Result<(), AmqpError> {
    let (vhost, name) = (session.vhost.as_str(), d.queue.as_str());
    let api = &session.ctx.api;
    if !d.exclusive || api.node().view().current().queue(vhost, name).is_none() {
        return Ok(());
    }
    api.auth()
        .check(&session.caller, vhost, Perm::Configure, name)?;
    Err(AmqpError::new(
        RESOURCE_LOCKED,
        format!(
            "cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost}'. It \
             could be originally declared on another connection or the exclusive property \
             value does not match that of the original declaration."
        ),
    ))
}

/// The gRPC request of an exchange.bind or exchange.unbind.
fn exchange_binding(
    vhost: String,
    destination: &ShortString,
    source: &ShortString,
    routing_key: &ShortString,
    args: &FieldTable,
) -> pb::ExchangeBindRequest {
    pb::ExchangeBindRequest {
        vhost,
        destination: destination.to_string(),
        source: source.to_string(),
        routing_key: routing_key.to_string(),
        arguments: arguments(args),
    }
}

/// The gRPC request of a queue.bind or queue.unbind.
fn binding(
    vhost: String,
    queue: &ShortString,
    exchange: &ShortString,
    routing_key: &ShortString,
    args: &FieldTable,
) -> pb::BindRequest {
    pb::BindRequest {
        vhost,
        queue: queue.to_string(),
        exchange: exchange.to_string(),
        routing_key: routing_key.to_string(),
        arguments: arguments(args),
    }
}

pub async fn queue(
    session: &Session,
    method: q::AMQPMethod,
) -> Result<Option<AMQPClass>, AmqpError> {
    let api = &session.ctx.api;
    let vhost = session.vhost.clone();
    let (reply, nowait) = match method {
        q::AMQPMethod::Declare(d) => {
            if !d.passive {
                exclusive_redeclare(session, &d)?;
                quorum_properties(&d, &vhost)?;
            }
            let r = pb::DeclareQueueRequest {
                vhost,
                name: d.queue.to_string(),
                arguments: arguments(&d.arguments),
                passive: d.passive,
            };
            let ok = admin::declare_queue(api, request(session, r))
                .await?
                .into_inner();
            let reply = q::AMQPMethod::DeclareOk(q::DeclareOk {
                queue: short(&ok.name),
                message_count: ok.message_count.min(u32::MAX as u64) as u32,
                consumer_count: ok.consumer_count.min(u32::MAX as u64) as u32,
            });
            (reply, d.nowait)
        }
        q::AMQPMethod::Bind(b) => {
            let r = binding(vhost, &b.queue, &b.exchange, &b.routing_key, &b.arguments);
            admin::binding(api, request(session, r), true).await?;
            (q::AMQPMethod::BindOk(q::BindOk {}), b.nowait)
        }
        q::AMQPMethod::Unbind(b) => {
            let r = binding(vhost, &b.queue, &b.exchange, &b.routing_key, &b.arguments);
            admin::binding(api, request(session, r), false).await?;
            (q::AMQPMethod::UnbindOk(q::UnbindOk {}), false)
        }
        q::AMQPMethod::Purge(p) => {
            let r = pb::PurgeQueueRequest {
                vhost,
                name: p.queue.to_string(),
            };
            let ok = admin::purge_queue(api, request(session, r))
                .await?
                .into_inner();
            let reply = q::AMQPMethod::PurgeOk(q::PurgeOk {
                message_count: ok.message_count.min(u32::MAX as u64) as u32,
            });
            (reply, p.nowait)
        }
        q::AMQPMethod::Delete(d) => {
            let r = pb::DeleteQueueRequest {
                vhost,
                name: d.queue.to_string(),
                if_unused: d.if_unused,
                if_empty: d.if_empty,
            };
            let deleted = admin::delete_queue(api, request(session, r))
                .await
                .map(|r| r.into_inner().message_count);
            let count = missing_is_done(deleted, 0)?;
            let reply = q::AMQPMethod::DeleteOk(q::DeleteOk {
                message_count: count.min(u32::MAX as u64) as u32,
            });
            (reply, d.nowait)
        }
        _ => return Err(client_only()),
    };
    Ok((!nowait).then_some(AMQPClass::Queue(reply)))
}
