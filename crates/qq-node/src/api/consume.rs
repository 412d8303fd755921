//! `Get`, `Settle` and `Consume`: taking messages out of a queue.
//!
//! `Get` and `Settle` propose to the queue's group directly. `Consume` opens a session on the
//! queue's leader ([`crate::consume`]) and adapts its messages to the stream's.
//!
//! Bounds: [`STREAM_BOUND`] messages each way between the client's stream and the session
//! (full: the adapter stops reading until the other side takes them).

use futures::StreamExt;
use qq_core::meta::Perm;
use qq_core::queue::{Command, Receipt, Reply, SettleOutcome};
use qq_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use std::sync::Arc;

use super::auth::{Auth, Caller};
use super::conn::{ConsumerGuard, StreamGuard};
use super::convert::{delivery_pb, settle_outcome_with, vhost};
use super::guard::{self, bounded, shown};
use super::{Api, BoxStream};
use crate::consume::relay::start_session;
use crate::consume::session::{SessionIn, SessionOut, SubscribeArgs};
use crate::groups::queue_sm::QueueRequest;
use crate::metrics::ConsumeStreamGuard;

/// Messages buffered each way between a client's consume stream and its session, at most.
pub const STREAM_BOUND: usize = 256;

/// The lease of a Get when the request names none.
const DEFAULT_GET_LEASE_MS: u64 = 30_000;

pub async fn get(
    api: &Api,
    request: Request<pb::GetRequest>,
) -> Result<Response<pb::GetResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    bounded(&[("vhost", &r.vhost), ("queue", &r.queue)])?;
    let vhost = vhost(&r.vhost);
    api.auth.check(&caller, &vhost, Perm::Read, &r.queue)?;
    let qm = api.queue_meta(&vhost, &r.queue)?;
    let lease_ms = if r.lease_ms == 0 {
        DEFAULT_GET_LEASE_MS
    } else {
        r.lease_ms
    };
    // The lease is bound to 128 random bits drawn here, on the proposing node, and to the
    // caller: only both settle it.
    let token: [u8; 16] = rand::random();
    let cmd = if r.auto_ack {
        Command::Get {
            now_ms: api.node.clock().now_ms(),
            lease_ms,
            auto_ack: true,
        }
    } else {
        Command::GetWithReceipt {
            now_ms: api.node.clock().now_ms(),
            lease_ms,
            receipt: Receipt {
                token,
                user: caller.user.clone(),
            },
        }
    };
    let out = api
        .node
        .proposer()
        .propose_queue_full(qm.id, QueueRequest::command(cmd))
        .await?;
    let (delivery, message_count) = match out.reply {
        Reply::Got {
            delivery,
            message_count,
        } => (delivery, message_count),
        // The queue refuses Get (single active consumer): a precondition of the queue.
        Reply::Error { detail } => return Err(Status::failed_precondition(detail)),
        other => return Err(Status::internal(format!("unexpected reply {other:?}"))),
    };
    let delivery = match (delivery, out.message) {
        (Some(d), Some(mut m)) => {
            if d.delivery_count > 0 {
                m.properties.headers.insert(
                    "x-delivery-count".into(),
                    qq_core::Value::Long(d.delivery_count as i64),
                );
            }
            // As on a consumer's delivery (from a leader that says; 0.1.0's does not).
            if let Some(n) = out.acquired_count.filter(|n| *n > 0) {
                m.properties
                    .headers
                    .insert("x-acquired-count".into(), qq_core::Value::Long(n.into()));
            }
            let receipt = if r.auto_ack {
                String::new()
            } else {
                format_receipt(qm.id, d.id, &token)
            };
            Some(delivery_pb(0, receipt, d.redelivered, m))
        }
        _ => None,
    };
    Ok(Response::new(pb::GetResponse {
        delivery,
        message_count,
    }))
}

/// A Get receipt as the client sees it: `{group}.{message id}.{token as 32 hex digits}`.
fn format_receipt(group: u64, id: u64, token: &[u8; 16]) -> String {
    let hex: String = token.iter().map(|b| format!("{b:02x}")).collect();
    format!("{group}.{id}.{hex}")
}

fn parse_receipt(receipt: &str) -> Option<(u64, u64, [u8; 16])> {
    let mut parts = receipt.split('.');
    let group = parts.next()?.parse().ok()?;
    let id = parts.next()?.parse().ok()?;
    let hex = parts.next()?;
    if parts.next().is_some() || hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut token = [0u8; 16];
    for (i, byte) in token.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some((group, id, token))
}

pub async fn settle(
    api: &Api,
    request: Request<pb::SettleRequest>,
) -> Result<Response<pb::Empty>, Status> {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    let outcome = settle_outcome_with(r.outcome, "", r.reason_detail, r.delay_ms)?;
    let mut by_group: std::collections::BTreeMap<u64, Vec<(u64, Receipt)>> = Default::default();
    for receipt in &r.receipts {
        let (group, id, token) = parse_receipt(receipt).ok_or_else(|| {
            Status::invalid_argument(format!(
                "receipts: '{}' is not a receipt from Get",
                shown(receipt)
            ))
        })?;
        let bound = Receipt {
            token,
            user: caller.user.clone(),
        };
        by_group.entry(group).or_default().push((id, bound));
    }
    for (group, receipts) in by_group {
        // A receipt of a queue in a vhost the caller may not see answers as one of a queue
        // that does not exist.
        guard::queue_by_id(api, &caller, group, Perm::Read, || {
            Status::not_found(format!(
                "receipts: the queue of receipt group {group} does not exist"
            ))
        })?;
        let proposer = api.node.proposer();
        let settle = |outcome: SettleOutcome, receipts: Vec<(u64, Receipt)>| {
            let cmd = Command::SettleReceipts {
                now_ms: api.node.clock().now_ms(),
                receipts,
                outcome,
            };
            proposer.propose_queue(group, QueueRequest::command(cmd))
        };
        let mut reply = settle(outcome.clone(), receipts.clone()).await?;
        // A queue whose machine is still at version 1 (a rolling upgrade) refuses a release,
        // all or nothing: it is a requeue there, as release 0.1.0 counted every return.
        if matches!(reply, Reply::Error { .. }) && outcome == SettleOutcome::Release {
            reply = settle(SettleOutcome::Requeue, receipts).await?;
        }
        if let Reply::Error { detail } = reply {
            return Err(Status::not_found(format!("receipts: {detail}")));
        }
    }
    Ok(Response::new(pb::Empty {}))
}

pub async fn consume(
    api: &Api,
    request: Request<Streaming<pb::ConsumeRequest>>,
) -> Result<Response<BoxStream<pb::ConsumeResponse>>, Status> {
    use pb::consume_request::Request as Req;
    let caller = api.auth.caller(&request).await?;
    let stream_slot = api.conns.open_stream(caller.peer)?;
    let mut input = request.into_inner();
    let first = input.next().await.ok_or_else(|| {
        Status::invalid_argument("subscribe: the first request must be subscribe")
    })??;
    let Some(Req::Subscribe(sub)) = first.request else {
        return Err(Status::invalid_argument(
            "subscribe: the first request must be subscribe",
        ));
    };
    let vhost_name = vhost(&sub.vhost);
    let queue_name = sub.queue.clone();
    let args = subscribe_args(api, &caller, sub)?;
    let consumer_slot = admit_consumer(api, &caller, &vhost_name)?;
    let (in_tx, in_rx) = mpsc::channel::<SessionIn>(STREAM_BOUND);
    let (tx, rx) = mpsc::channel(STREAM_BOUND);
    // Ends the request pump (and so the session) when the response side ends first, e.g. when
    // the caller's read permission is revoked.
    let stream_done = api.node.stopping().child_token();
    api.node
        .tasks()
        .spawn(pump_requests(input, in_tx, tx.clone(), stream_done.clone()));
    let (out_tx, out_rx) = mpsc::channel::<SessionOut>(STREAM_BOUND);
    start_session(api.node.consuming().clone(), args, in_rx, out_tx).await?;
    let access = Access {
        auth: api.auth.clone(),
        caller,
        vhost: vhost_name,
        queue: queue_name,
        _held: (stream_slot, consumer_slot),
    };
    api.node
        .tasks()
        .spawn(pump_responses(out_rx, tx, access, stream_done));
    // Counted while tonic holds the response stream: until the client goes or the stream ends.
    let open = ConsumeStreamGuard::open();
    let responses = ReceiverStream::new(rx).map(move |r| {
        let _counted = &open;
        r
    });
    Ok(Response::new(Box::pin(responses)))
}

/// Count a consumer toward the user's and the vhost's consumer limits while its guard lives.
pub(crate) fn admit_consumer(
    api: &Api,
    caller: &Caller,
    vhost: &str,
) -> Result<ConsumerGuard, Status> {
    let state = api.node.view().current();
    api.conns.admit_consumer(
        &caller.user,
        state.user_limits(&caller.user),
        vhost,
        state.vhost_limits(vhost),
    )
}

/// Check a subscribe request and make the session's arguments.
pub(crate) fn subscribe_args(
    api: &Api,
    caller: &Caller,
    sub: pb::Subscribe,
) -> Result<SubscribeArgs, Status> {
    bounded(&[
        ("subscribe.vhost", &sub.vhost),
        ("subscribe.queue", &sub.queue),
    ])?;
    let vhost = vhost(&sub.vhost);
    api.auth.check(caller, &vhost, Perm::Read, &sub.queue)?;
    let qm = api.queue_meta(&vhost, &sub.queue)?;
    let max_prefetch = api.node.config().max_prefetch;
    if sub.prefetch_count > max_prefetch {
        return Err(Status::resource_exhausted(format!(
            "prefetch_count: {} exceeds the node's max_prefetch {max_prefetch}",
            sub.prefetch_count
        )));
    }
    // Prefetch 0 asks for no limit: the node's cap stands in, so a consumer that does not
    // read backs up through flow control instead of filling the node's memory.
    let prefetch = match sub.prefetch_count {
        0 => api.node.config().prefetch_zero_cap,
        n => n,
    };
    let consumer_tag = if sub.consumer_tag.is_empty() {
        format!("ctag-{}", api.node.consuming().next_consumer_id())
    } else {
        sub.consumer_tag
    };
    let priority = consumer_priority(&sub.arguments)?;
    Ok(SubscribeArgs {
        group: qm.id,
        consumer_tag,
        prefetch,
        auto_ack: sub.auto_ack,
        priority,
    })
}

/// `arguments["x-priority"]`: a whole number within 32 bits (RabbitMQ's consumer priority),
/// 0 when absent. Other arguments are ignored, as RabbitMQ ignores arguments it does not know.
fn consumer_priority(
    arguments: &std::collections::HashMap<String, pb::Value>,
) -> Result<i32, Status> {
    let Some(v) = arguments.get("x-priority") else {
        return Ok(0);
    };
    let field = "subscribe.arguments[x-priority]";
    let v = crate::api::convert::value_from_pb(field, v)?;
    let n = v.as_i64().ok_or_else(|| {
        Status::invalid_argument(format!(
            "{field}: expected a whole number, got {}",
            v.type_name()
        ))
    })?;
    i32::try_from(n)
        .map_err(|_| Status::invalid_argument(format!("{field}: {n} is outside the 32-bit range")))
}

/// Client requests → session input, until either ends or the node stops. A request the
/// session cannot take (a settle with an unknown outcome or bad options) ends the client's
/// stream with INVALID_ARGUMENT; the session then ends as for a closed stream, so the
/// consumer's unsettled deliveries return to the queue.
async fn pump_requests(
    mut input: Streaming<pb::ConsumeRequest>,
    in_tx: mpsc::Sender<SessionIn>,
    answers: mpsc::Sender<Result<pb::ConsumeResponse, Status>>,
    stopping: CancellationToken,
) {
    use pb::consume_request::Request as Req;
    while let Some(Some(Ok(req))) = stopping.run_until_cancelled(input.next()).await {
        let msg = match req.request {
            Some(Req::Settle(s)) => {
                match settle_outcome_with(s.outcome, "settle.", s.reason_detail, s.delay_ms) {
                    Ok(outcome) => SessionIn::Settle {
                        tags: s.delivery_tags,
                        multiple: s.multiple,
                        outcome,
                    },
                    Err(status) => {
                        let _ = answers.send(Err(status)).await;
                        return;
                    }
                }
            }
            Some(Req::Cancel(_)) => SessionIn::Cancel,
            Some(Req::Subscribe(_)) | None => SessionIn::Subscribe(SubscribeArgs {
                group: 0,
                consumer_tag: String::new(),
                prefetch: 0,
                auto_ack: false,
                priority: 0,
            }),
        };
        if in_tx.send(msg).await.is_err() {
            return;
        }
    }
}

/// What a consume stream was granted: read on `queue` in `vhost`, checked again on every
/// metadata change.
struct Access {
    auth: Arc<Auth>,
    caller: Caller,
    vhost: String,
    queue: String,
    /// The stream's slot on its connection and its consumer count, freed when it ends.
    _held: (StreamGuard, ConsumerGuard),
}

/// Session output → the client's stream; an error ends it. Every change of the metadata view
/// checks the caller's read permission again: revoked (or the user deleted), the stream ends
/// with PERMISSION_DENIED and the session with it (its unacked messages return to the queue).
async fn pump_responses(
    mut out_rx: mpsc::Receiver<SessionOut>,
    tx: mpsc::Sender<Result<pb::ConsumeResponse, Status>>,
    access: Access,
    stream_done: CancellationToken,
) {
    let _done = stream_done.clone().drop_guard();
    let mut meta_changes = access.auth.view().subscribe();
    // A change between the subscribe check and here is seen at once.
    meta_changes.mark_changed();
    loop {
        // Room in the client's stream is reserved first, so a revoke is seen even while the
        // client is not reading.
        let revoked = tokio::select! {
            changed = meta_changes.changed() => {
                if changed.is_err() {
                    return;
                }
                access.recheck()
            }
            permit = tx.reserve() => {
                let Ok(permit) = permit else {
                    return;
                };
                tokio::select! {
                    out = out_rx.recv() => {
                        let Some(out) = out else {
                            return;
                        };
                        if !forward(out, permit) {
                            return;
                        }
                        None
                    }
                    changed = meta_changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        access.recheck()
                    }
                }
            }
        };
        if let Some(status) = revoked {
            // Stop the session now (its unsettled deliveries return to the queue); the client
            // gets the status after what it has not read yet.
            drop(out_rx);
            stream_done.cancel();
            let _ = tx.send(Err(status)).await;
            return;
        }
    }
}

impl Access {
    /// The status that ends the stream, when the caller may no longer read the queue.
    fn recheck(&self) -> Option<Status> {
        self.auth
            .check(&self.caller, &self.vhost, Perm::Read, &self.queue)
            .err()
    }
}

/// One session output into the reserved room of the client's stream; false when the stream is
/// over.
fn forward(out: SessionOut, permit: mpsc::Permit<'_, Result<pb::ConsumeResponse, Status>>) -> bool {
    use pb::consume_response::Response as R;
    let response = match out {
        SessionOut::Subscribed { consumer_tag } => R::Subscribed(pb::Subscribed { consumer_tag }),
        SessionOut::Delivery {
            tag,
            redelivered,
            message,
        } => R::Delivery(delivery_pb(tag, String::new(), redelivered, message)),
        SessionOut::Cancelled { reason } => R::Cancelled(pb::Cancelled { reason }),
        // Only an AMQP consumer stops its session (basic.cancel); gRPC's cancel ends it.
        SessionOut::Stopped => return true,
        SessionOut::Error { code, message } => {
            permit.send(Err(Status::new(tonic::Code::from_i32(code), message)));
            return false;
        }
    };
    permit.send(Ok(pb::ConsumeResponse {
        response: Some(response),
    }));
    true
}
