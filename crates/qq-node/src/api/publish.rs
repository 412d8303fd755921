//! `Publish` and `PublishStream`: validate, route with the metadata view, commit to every
//! routed queue through the shared [`crate::enqueue`] path, and confirm.
//!
//! A confirm (CONFIRMED) means every routed queue committed the message: fsynced on a majority
//! of its members. A queue that refuses it (reject-publish limits) makes it REJECTED with the
//! queue's reason; a bad message fails its own seq (FAILED, with the status code unary
//! `Publish` answers), not the stream.
//!
//! Bounds: a stream is read in batches of at most `max_inflight_publishes` (and
//! [`MAX_BATCH`]) messages; one batch is committed at a time, so the stream's order holds and
//! the client's window backs up while a batch commits. [`STREAM_ANSWERS_BOUND`] answers wait
//! for the client, at most.

use std::time::Duration;

use futures::StreamExt;
use qq_core::Message;
use qq_core::meta::Perm;
use qq_core::queue::{MsgHeader, Reply};
use qq_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::auth::Caller;
use super::convert::{message_from_pb, meta_error_to_status, parse_expiration, vhost};
use super::guard::{bounded, shown};
use super::{Api, BoxStream};
use crate::enqueue::{self, Routed};
use crate::groups::queue_sm::MAX_BATCH;

/// Answers buffered for a publish stream's client, at most.
pub const STREAM_ANSWERS_BOUND: usize = 4096;

/// Longest `publisher_id`.
pub const MAX_PUBLISHER_ID_BYTES: usize = 256;

/// What [`prepare`] decided for one publish.
pub(crate) enum Prepared {
    /// Answered without enqueueing (unroutable).
    Done(pb::PublishResponse),
    Route {
        targets: Vec<(u64, String)>,
        header: MsgHeader,
        /// `properties.priority` (validated: at most 255).
        priority: u32,
        encoded: Vec<u8>,
        /// The client's publish key (user, publisher id, seq), if it gave a publisher id.
        publish_key: Option<String>,
    },
}

/// The publish key of a request's `(publisher_id, publisher_seq)`, scoped to the caller so
/// that one user's ids cannot collide with another's.
fn publish_key(caller: &Caller, req: &pb::PublishRequest) -> Result<Option<String>, Status> {
    if req.publisher_id.is_empty() {
        if req.publisher_seq != 0 {
            return Err(Status::invalid_argument(
                "publisher_seq: set without a publisher_id",
            ));
        }
        return Ok(None);
    }
    if req.publisher_id.len() > MAX_PUBLISHER_ID_BYTES {
        return Err(Status::invalid_argument(format!(
            "publisher_id: {} bytes, more than {MAX_PUBLISHER_ID_BYTES}",
            req.publisher_id.len()
        )));
    }
    Ok(Some(format!(
        "c{}\0{}\0{}",
        caller.user, req.publisher_id, req.publisher_seq
    )))
}

/// Validate and route one publish.
async fn prepare(api: &Api, caller: &Caller, req: pb::PublishRequest) -> Result<Prepared, Status> {
    bounded(&[("vhost", &req.vhost), ("exchange", &req.exchange)])?;
    let vhost = vhost(&req.vhost);
    api.auth.check(caller, &vhost, Perm::Write, &req.exchange)?;
    let publish_key = publish_key(caller, &req)?;
    if let Some(why) = api.node.alarms().publish_refusal() {
        return Err(Status::resource_exhausted(why));
    }
    check_body_size(api, req.message.as_ref().map(|m| m.body.len()).unwrap_or(0))?;
    let (properties, body) = message_from_pb(req.message.as_ref())?;
    route_message(
        api,
        caller,
        Publish {
            vhost,
            exchange: req.exchange,
            routing_key: req.routing_key,
            mandatory: req.mandatory,
            seq: req.seq,
            properties,
            body,
            publish_key,
        },
    )
    .await
}

/// A body over `max_message_bytes` is RESOURCE_EXHAUSTED naming the bound.
pub(crate) fn check_body_size(api: &Api, size: usize) -> Result<(), Status> {
    let max = api.node.config().max_message_bytes;
    if size > max {
        return Err(Status::resource_exhausted(format!(
            "message.body: {size} bytes exceeds max_message_bytes {max}"
        )));
    }
    Ok(())
}

/// One publish whatever protocol it came on, decoded, after the caller's write permission
/// on the exchange was checked.
pub(crate) struct Publish {
    pub vhost: String,
    pub exchange: String,
    pub routing_key: String,
    pub mandatory: bool,
    /// The client's number for it (echoed in the answer).
    pub seq: u64,
    pub properties: qq_core::Properties,
    pub body: Vec<u8>,
    /// The client's publish key (user, publisher id, seq), if it gave a publisher id.
    pub publish_key: Option<String>,
}

/// How long a publish that found no route waits for this node to catch up with the metadata
/// before it is refused with UNAVAILABLE.
const CATCH_UP_WAIT: Duration = Duration::from_secs(2);

/// Validate a decoded publish's properties and route it with the metadata view.
///
/// A metadata change answers its client once every node it reached has applied it (3 s at
/// most, a node that does not answer within a second is skipped). A node that was cut off,
/// paused or restarting then routes by an older view for a while, and a publish to a queue
/// or exchange just declared through another node would find nothing here: dropped as
/// unroutable, or refused as NOT_FOUND. So when this node's view finds no queue (or no such
/// exchange), it first applies up to the metadata leader's read index
/// ([`crate::proposer::Proposer::catch_up_meta`]) and routes again; only that answer stands.
/// A publish that does route is not checked: a binding added elsewhere and not yet applied
/// here can still be missed (docs/semantics.md). Found by the cluster simulator (`qq-sim`).
pub(crate) async fn route_message(
    api: &Api,
    caller: &Caller,
    publish: Publish,
) -> Result<Prepared, Status> {
    let (publish, _) = match route_by_view(api, caller, publish)? {
        Found::Route(prepared) => return Ok(prepared),
        Found::Nothing(publish, answer) => (publish, answer),
    };
    let deadline = api.node.clock().now() + CATCH_UP_WAIT;
    if !api.node.proposer().catch_up_meta(deadline).await {
        return Err(Status::unavailable(format!(
            "node {}: no queue is bound here for this publish, and this node could not catch up \
             with the cluster's metadata to be sure; retry, or publish through another node",
            api.node.id()
        )));
    }
    match route_by_view(api, caller, *publish)? {
        Found::Route(prepared) => Ok(prepared),
        Found::Nothing(_, answer) => answer.map(Prepared::Done),
    }
}

/// The metadata machine version from which a message's headers may hold
/// [`qq_core::Value::Void`]: the cluster moves to it only once every member runs a release that
/// decodes it (release 0.1.0 does not, and would refuse the enqueue while the others apply it).
const VOID_SINCE_META_VERSION: u32 = 2;

/// What this node's view of the metadata found for a publish.
enum Found {
    Route(Prepared),
    /// No queue, or no such exchange: the publish back, and the answer that would be given.
    Nothing(Box<Publish>, Result<pb::PublishResponse, Status>),
}

fn route_by_view(api: &Api, caller: &Caller, publish: Publish) -> Result<Found, Status> {
    let Publish {
        vhost,
        exchange,
        routing_key,
        mandatory,
        seq,
        mut properties,
        body,
        publish_key,
    } = publish;
    let max = api.node.config().max_message_bytes;
    let meta_err = |e: qq_core::meta::MetaError| meta_error_to_status(&e);
    check_headers(api, &properties.headers)?;
    // RabbitMQ's validated user-id: a set user_id must be the authenticated user.
    if !properties.user_id.is_empty() && properties.user_id != caller.user {
        return Err(Status::permission_denied(format!(
            "message.properties.user_id: set to '{}' but the authenticated user is '{}'",
            shown(&properties.user_id),
            shown(&caller.user)
        )));
    }
    qq_core::route::validate_sender_selected(&properties.headers).map_err(meta_err)?;
    qq_core::deadletter::strip_client_death_headers(&mut properties.headers);
    let state = api.node.view().current();
    if state.machine_version() < VOID_SINCE_META_VERSION {
        qq_core::voids_as_empty_bytes(&mut properties.headers);
    }
    let keys = qq_core::route::routing_keys(&routing_key, &properties.headers);
    if let Some(x) = state.exchange(&vhost, &exchange) {
        if x.internal {
            return Err(Status::permission_denied(format!(
                "exchange: '{}' in vhost '{}' is internal and cannot be published to",
                shown(&exchange),
                shown(&vhost)
            )));
        }
    }
    let targets = match state.route(&vhost, &exchange, &keys, &properties.headers) {
        Ok(t) if !t.is_empty() => t,
        found => {
            let answer = match found {
                Ok(_) => Ok(unroutable(seq, mandatory, &exchange, &routing_key)),
                Err(e) => match meta_err(e) {
                    s if s.code() == tonic::Code::NotFound => Err(s),
                    s => return Err(s),
                },
            };
            let publish = Publish {
                vhost,
                exchange,
                routing_key,
                mandatory,
                seq,
                properties,
                body,
                publish_key,
            };
            return Ok(Found::Nothing(Box::new(publish), answer));
        }
    };
    let visible = qq_core::route::visible_routing_keys(&routing_key, &properties.headers).len();
    let bcc = keys[visible..].to_vec();
    qq_core::route::strip_bcc(&mut properties.headers);
    let expiration_ms = if properties.expiration.is_empty() {
        None
    } else {
        Some(parse_expiration(&properties.expiration)?)
    };
    let priority = properties.priority;
    let message = Message {
        properties,
        body,
        exchange,
        routing_key,
        bcc,
    };
    let encoded = qq_raft::encoding::to_vec_exact(&message)
        .map_err(|e| Status::internal(format!("encode message: {e}")))?;
    // What the queue stores and counts (x-max-length-bytes): properties, headers and body.
    if encoded.len() > max {
        return Err(Status::resource_exhausted(format!(
            "message: {} bytes with its properties and headers exceeds max_message_bytes {max}",
            encoded.len()
        )));
    }
    let header = MsgHeader {
        size_bytes: encoded.len() as u64,
        expiration_ms,
    };
    Ok(Found::Route(Prepared::Route {
        targets: targets
            .into_iter()
            .map(|q| (q.id, q.name.clone()))
            .collect(),
        header,
        priority,
        encoded,
        publish_key,
    }))
}

/// The headers are within `max_headers` entries (nested ones included) and
/// `max_header_depth` levels of nesting.
fn check_headers(api: &Api, headers: &qq_core::Table) -> Result<(), Status> {
    fn walk<'a>(
        values: &mut dyn Iterator<Item = &'a qq_core::Value>,
        depth: usize,
        count: &mut usize,
        deepest: &mut usize,
    ) {
        *deepest = (*deepest).max(depth);
        for v in values {
            *count += 1;
            match v {
                qq_core::Value::List(items) => walk(&mut items.iter(), depth + 1, count, deepest),
                qq_core::Value::Table(t) => walk(&mut t.values(), depth + 1, count, deepest),
                _ => {}
            }
        }
    }
    let (mut count, mut depth) = (0, 0);
    if !headers.is_empty() {
        walk(&mut headers.values(), 1, &mut count, &mut depth);
    }
    let config = api.node.config();
    if count > config.max_headers {
        return Err(Status::resource_exhausted(format!(
            "message.properties.headers: {count} entries exceeds max_headers {}",
            config.max_headers
        )));
    }
    if depth > config.max_header_depth {
        return Err(Status::resource_exhausted(format!(
            "message.properties.headers: nested {depth} levels deep, more than \
             max_header_depth {}",
            config.max_header_depth
        )));
    }
    Ok(())
}

/// The answer to a publish no queue is bound for: CONFIRMED, or UNROUTABLE if mandatory.
fn unroutable(seq: u64, mandatory: bool, exchange: &str, routing_key: &str) -> pb::PublishResponse {
    let (outcome, detail) = if mandatory {
        (
            pb::PublishOutcome::Unroutable,
            format!(
                "no queue is bound to exchange '{}' for key '{}'",
                shown(exchange),
                shown(routing_key)
            ),
        )
    } else {
        (pb::PublishOutcome::Confirmed, String::new())
    };
    pb::PublishResponse {
        seq,
        outcome: outcome as i32,
        detail,
        code: 0,
    }
}

/// `Some(detail)` when the queue refused the message (reject-publish limits); a duplicate
/// is stored already, so it is no refusal.
fn refusal(queue: &str, reply: &Reply) -> Result<Option<String>, Status> {
    match reply {
        Reply::Enqueued { .. } | Reply::Duplicate => Ok(None),
        Reply::Rejected { detail } | Reply::RejectedDeadLettered { detail, .. } => {
            Ok(Some(detail.clone()))
        }
        other => Err(Status::internal(format!(
            "queue '{}': unexpected reply {other:?}",
            shown(queue)
        ))),
    }
}

/// The answer to a routed publish: REJECTED naming every refusal, else CONFIRMED, with
/// detail "duplicate" when every target had stored it already.
fn answer(seq: u64, rejected: Vec<String>, all_duplicates: bool) -> pb::PublishResponse {
    if rejected.is_empty() {
        pb::PublishResponse {
            seq,
            outcome: pb::PublishOutcome::Confirmed as i32,
            detail: if all_duplicates {
                "duplicate".to_string()
            } else {
                String::new()
            },
            code: 0,
        }
    } else {
        pb::PublishResponse {
            seq,
            outcome: pb::PublishOutcome::Rejected as i32,
            detail: rejected.join("; "),
            code: 0,
        }
    }
}

/// Validate and route a batch (what one stream delivered at once) in order; a bad message
/// fails its own seq (FAILED with the status unary `Publish` would answer), not the stream.
async fn prepare_batch(
    api: &Api,
    caller: &Caller,
    batch: Vec<pb::PublishRequest>,
) -> Vec<(u64, Prepared)> {
    let mut prepared = Vec::with_capacity(batch.len());
    for req in batch {
        let seq = req.seq;
        let p = prepare(api, caller, req).await.unwrap_or_else(|status| {
            Prepared::Done(pb::PublishResponse {
                seq,
                outcome: pb::PublishOutcome::Failed as i32,
                detail: status.message().to_string(),
                code: status.code() as i32,
            })
        });
        prepared.push((seq, p));
    }
    prepared
}

/// Commit prepared publishes with one Raft entry per target queue; answers in order.
pub(crate) async fn commit(
    api: &Api,
    batch: Vec<(u64, Prepared)>,
) -> Result<Vec<pb::PublishResponse>, Status> {
    let enqueuer = api.node.enqueuer();
    let mut answers: Vec<(u64, Option<pb::PublishResponse>)> = Vec::with_capacity(batch.len());
    let mut copies: Vec<Vec<Routed>> = Vec::with_capacity(batch.len());
    for (seq, prepared) in batch {
        match prepared {
            Prepared::Done(r) => {
                answers.push((seq, Some(r)));
                copies.push(Vec::new());
            }
            Prepared::Route {
                targets,
                header,
                priority,
                encoded,
                publish_key,
            } => {
                answers.push((seq, None));
                copies.push(
                    enqueue::per_target(targets, encoded)
                        .map(|((target, name), encoded)| Routed {
                            target,
                            name,
                            // The client's key, or a fresh one of the node's: a retry (the
                            // client's, or the node's own) stores the message once.
                            request: enqueuer.publish_request(
                                &header,
                                priority,
                                encoded,
                                publish_key
                                    .clone()
                                    .unwrap_or_else(|| enqueuer.next_publish_key()),
                            ),
                        })
                        .collect(),
                );
            }
        }
    }
    let replies = enqueuer.commit(copies).await;
    let mut out = Vec::with_capacity(answers.len());
    for ((seq, done), targets) in answers.into_iter().zip(replies) {
        if let Some(r) = done {
            out.push(r);
            continue;
        }
        let mut rejected = Vec::new();
        let mut all_duplicates = true;
        for t in targets {
            let reply = t.reply?;
            all_duplicates &= reply == Reply::Duplicate;
            if let Some(detail) = refusal(&t.name, &reply)? {
                rejected.push(detail);
            }
        }
        out.push(answer(seq, rejected, all_duplicates));
    }
    Ok(out)
}

pub async fn publish(
    api: &Api,
    request: Request<pb::PublishRequest>,
) -> Result<Response<pb::PublishResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    let req = request.into_inner();
    let seq = req.seq;
    // A bad message fails the call (on a stream, only its seq).
    let prepared = prepare(api, &caller, req).await?;
    let mut answers = commit(api, vec![(seq, prepared)]).await?;
    let answer = answers
        .pop()
        .ok_or_else(|| Status::internal("publish: no answer"))?;
    Ok(Response::new(answer))
}

pub async fn publish_stream(
    api: &Api,
    request: Request<Streaming<pb::PublishRequest>>,
) -> Result<Response<BoxStream<pb::PublishResponse>>, Status> {
    use futures::FutureExt;
    let caller = api.auth.caller(&request).await?;
    let stream_slot = api.conns.open_stream(caller.peer)?;
    let mut input = request.into_inner();
    let (tx, rx) = mpsc::channel(STREAM_ANSWERS_BOUND);
    // One batch in flight at a time keeps the stream's order; a batch is everything that
    // arrived while the previous one was being committed (bounded).
    let max_batch = api.node.config().max_inflight_publishes.min(MAX_BATCH);
    let api = api.clone();
    let stopping = api.node.stopping().clone();
    api.node.tasks().clone().spawn(async move {
        let _stream_slot = stream_slot;
        loop {
            let first = match stopping.run_until_cancelled(input.next()).await {
                Some(Some(Ok(r))) => r,
                Some(Some(Err(_))) | Some(None) => return,
                None => {
                    let _ = tx
                        .send(Err(crate::error::NodeError::ShuttingDown.into()))
                        .await;
                    return;
                }
            };
            let mut batch = vec![first];
            let mut closed = false;
            while batch.len() < max_batch {
                match input.next().now_or_never() {
                    Some(Some(Ok(r))) => batch.push(r),
                    Some(Some(Err(_))) | Some(None) => {
                        closed = true;
                        break;
                    }
                    None => break,
                }
            }
            match commit(&api, prepare_batch(&api, &caller, batch).await).await {
                Ok(answers) => {
                    for a in answers {
                        if tx.send(Ok(a)).await.is_err() {
                            return;
                        }
                    }
                }
                Err(status) => {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            }
            if closed {
                return;
            }
        }
    });
    Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
}
