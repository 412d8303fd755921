//! basic.publish: validate and route at once (a refusal closes the channel with RabbitMQ's
//! code before anything is stored), then commit through the same path as gRPC's
//! `PublishStream` ([`crate::api::publish::commit`]), one batch at a time per channel, and
//! answer confirms in order.
//!
//! A confirm (basic.ack) means what a gRPC CONFIRMED means: every routed queue committed the
//! message, fsynced on a majority of its members. A queue that refuses it (reject-publish
//! limits) or a commit that fails (no majority, leader lost) is basic.nack. An unroutable
//! publish is acked at once; with `mandatory` it is first returned with 312 NO_ROUTE.
//! Consecutive acks (or nacks) of a batch go out as one frame with `multiple`.
//!
//! Bounds: at most `max_inflight_publishes` publishes wait for their commit per channel; one
//! more makes the read loop wait, so the connection's socket is not read (TCP backpressure,
//! as RabbitMQ's credit flow). While a memory or disk alarm is on, a publish makes the
//! connection send connection.blocked (to clients that asked for it) and stop reading until
//! the alarm clears, then connection.unblocked.

use std::sync::Arc;
use std::time::Duration;

use amq_protocol::frame::{AMQPContentHeader, AMQPFrame};
use amq_protocol::protocol::{AMQPClass, basic, connection as conn};
use qq_core::meta::Perm;
use qq_proto::v1 as pb;
use tokio::sync::mpsc;

use super::codes::{AmqpError, NO_ROUTE, NOT_IMPLEMENTED, PRECONDITION_FAILED};
use super::convert::{properties_from_amqp, short};
use super::frames::{content_frames, encode};
use super::session::{Outbox, Session};
use crate::api::publish::{self as grpc, Prepared, Publish};

/// Most publishes a channel commits as one batch. Until 2026-11-29 the bound was tokio's
/// task budget: the batch was gathered with `recv().now_or_never()`, which reports an empty
/// channel once the task's 128 polls are spent, so every batch ended at 124 publishes while
/// up to 875 more of scenario 1's 1 000 in flight waited. Gathering all of them (`try_recv`,
/// about 440 per batch) was slower: over AMQP 17 132-20 361 msg/s against 18 932-23 483, and
/// 82-99 µs of CPU per message against 67-78 (three runs each, alternating;
/// docs/benchmarks.md, "The allocator's trim threshold, the client's allocator, and an AMQP
/// channel's commit batch"). So the bound stays near where it was, but stated here and not
/// left to the runtime.
const COMMIT_BATCH: usize = 128;

/// How often a blocked connection looks at the alarms again.
const ALARM_POLL: Duration = Duration::from_millis(250);

/// A publish on its way to its queues: its confirm number (0: not in confirm mode).
struct Pending {
    seq: u64,
    prepared: Prepared,
}

/// A publish waiting for its content header and body.
pub struct Content {
    pub publish: basic::Publish,
    pub header: Option<AMQPContentHeader>,
    pub body: Vec<u8>,
}

/// A channel's publishing state: confirm mode and the number of the last publish since, and
/// its commit pipeline once it published.
pub struct Publishing {
    pub channel: u16,
    pub confirm: bool,
    pub seq: u64,
    pub publisher: Option<Publisher>,
}

impl Publishing {
    pub fn new(channel: u16) -> Publishing {
        Publishing {
            channel,
            confirm: false,
            seq: 0,
            publisher: None,
        }
    }
}

/// A channel's commit pipeline.
pub struct Publisher {
    tx: mpsc::Sender<Pending>,
    task: tokio::task::JoinHandle<()>,
    /// Whether confirms may still go out: held while they are queued, set to false when the
    /// channel's close-ok (or close) is about to go out.
    open: Arc<tokio::sync::Mutex<bool>>,
}

/// How long closing a channel waits for its publishes to be committed.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

impl Publisher {
    /// The channel closes: what was published before is still committed (as RabbitMQ routes
    /// every publish it read before a close), waiting at most [`DRAIN_WAIT`].
    pub async fn drain(self) {
        drop(self.tx);
        let _ = tokio::time::timeout(DRAIN_WAIT, self.task).await;
        // Past the wait the commits go on, but no confirm follows the channel's close.
        *self.open.lock().await = false;
    }
}

/// Checks made at the method frame, before the content is read.
pub async fn check_publish(session: &Session, p: &basic::Publish) -> Result<(), AmqpError> {
    if p.immediate {
        return Err(AmqpError::new(NOT_IMPLEMENTED, "immediate=true"));
    }
    wait_out_alarm(session).await;
    Ok(())
}

/// While an alarm refuses publishes: blocked, not reading, until it clears.
async fn wait_out_alarm(session: &Session) {
    let alarms = session.ctx.api.node().alarms();
    let Some(why) = alarms.publish_refusal() else {
        return;
    };
    if session.caps.connection_blocked {
        let blocked = conn::Blocked {
            reason: short(&why),
        };
        let m = AMQPClass::Connection(conn::AMQPMethod::Blocked(blocked));
        session.out.method(0, m).await;
    }
    while alarms.publish_refusal().is_some() && !session.done.is_cancelled() {
        tokio::time::sleep(ALARM_POLL).await;
    }
    if session.caps.connection_blocked {
        let m = AMQPClass::Connection(conn::AMQPMethod::Unblocked(conn::Unblocked {}));
        session.out.method(0, m).await;
    }
}

/// A whole message: validated and routed now, committed by the channel's pipeline.
pub async fn publish(
    session: &Arc<Session>,
    channel: &mut Publishing,
    content: Content,
) -> Result<(), AmqpError> {
    let Content {
        publish,
        header,
        body,
    } = content;
    let header = header.expect("complete content has a header");
    let api = &session.ctx.api;
    let exchange = publish.exchange.to_string();
    api.auth()
        .check(&session.caller, &session.vhost, Perm::Write, &exchange)?;
    grpc::check_body_size(api, body.len())?;
    let properties = properties_from_amqp(&header.properties);
    // RabbitMQ's validated user-id, with its code (gRPC answers PERMISSION_DENIED).
    if !properties.user_id.is_empty() && properties.user_id != session.caller.user {
        return Err(AmqpError::new(
            PRECONDITION_FAILED,
            format!(
                "user_id property set to '{}' but authenticated user was '{}'",
                properties.user_id, session.caller.user
            ),
        ));
    }
    // Kept only for a mandatory publish, to return it if nothing routes it.
    let returned = publish
        .mandatory
        .then(|| (header.properties.clone(), body.clone()));
    let seq = if channel.confirm {
        channel.seq += 1;
        channel.seq
    } else {
        0
    };
    let prepared = grpc::route_message(
        api,
        &session.caller,
        Publish {
            vhost: session.vhost.clone(),
            exchange: exchange.clone(),
            routing_key: publish.routing_key.to_string(),
            mandatory: publish.mandatory,
            seq,
            properties,
            body,
            publish_key: None,
        },
    )
    .await?;
    if let (Prepared::Done(answer), Some((props, body))) = (&prepared, returned) {
        if answer.outcome == pb::PublishOutcome::Unroutable as i32 {
            let ret = basic::Return {
                reply_code: NO_ROUTE,
                reply_text: "NO_ROUTE".into(),
                exchange: short(&exchange),
                routing_key: publish.routing_key.clone(),
            };
            let bytes = content_frames(
                channel.channel,
                AMQPClass::Basic(basic::AMQPMethod::Return(ret)),
                props,
                &body,
                session.frame_max,
            );
            session.out.bytes(bytes).await;
        }
    }
    let publisher = channel
        .publisher
        .get_or_insert_with(|| start(session.clone(), channel.channel));
    // Full: the read loop waits here, and the socket is not read meanwhile.
    let _ = publisher.tx.send(Pending { seq, prepared }).await;
    Ok(())
}

fn start(session: Arc<Session>, channel: u16) -> Publisher {
    let bound = session
        .ctx
        .api
        .node()
        .config()
        .max_inflight_publishes
        .max(1);
    let (tx, rx) = mpsc::channel(bound);
    let open = Arc::new(tokio::sync::Mutex::new(true));
    let node = session.ctx.api.node().clone();
    let task = node
        .tasks()
        .spawn(commit_loop(session, channel, rx, open.clone()));
    Publisher { tx, task, open }
}

/// Commit what arrived, a batch at a time, and confirm in order, until the channel drops
/// its sender and everything sent before is committed (a client gone meanwhile gets no
/// confirms, but what it published is stored).
async fn commit_loop(
    session: Arc<Session>,
    channel: u16,
    mut rx: mpsc::Receiver<Pending>,
    open: Arc<tokio::sync::Mutex<bool>>,
) {
    let api = session.ctx.api.clone();
    let max_batch = api
        .node()
        .config()
        .max_inflight_publishes
        .clamp(1, COMMIT_BATCH);
    let mut client_gone = false;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let seqs: Vec<u64> = batch.iter().map(|p| p.seq).collect();
        let answers = grpc::commit(
            &api,
            batch.into_iter().map(|p| (p.seq, p.prepared)).collect(),
        )
        .await;
        let acked: Vec<(u64, bool)> = match answers {
            Ok(answers) => answers.iter().map(|a| (a.seq, confirms(a))).collect(),
            Err(_) => seqs.iter().map(|s| (*s, false)).collect(),
        };
        let confirming = open.lock().await;
        if *confirming && !client_gone && !send_confirms(&session.out, channel, &acked).await {
            client_gone = true;
        }
    }
}

/// Whether an answer is an ack (stored, or nothing to store) rather than a nack.
fn confirms(a: &pb::PublishResponse) -> bool {
    a.outcome == pb::PublishOutcome::Confirmed as i32
        || a.outcome == pb::PublishOutcome::Unroutable as i32
}

/// basic.ack / basic.nack for the confirm-mode publishes of a batch, a run of the same answer
/// as one frame with `multiple`.
async fn send_confirms(out: &Outbox, channel: u16, acked: &[(u64, bool)]) -> bool {
    let numbered: Vec<(u64, bool)> = acked.iter().copied().filter(|(s, _)| *s != 0).collect();
    let mut bytes = Vec::new();
    let mut i = 0;
    while i < numbered.len() {
        let (_, ack) = numbered[i];
        let mut j = i;
        while j + 1 < numbered.len() && numbered[j + 1].1 == ack {
            j += 1;
        }
        let (tag, multiple) = (numbered[j].0, j > i);
        let method = if ack {
            basic::AMQPMethod::Ack(basic::Ack {
                delivery_tag: tag,
                multiple,
            })
        } else {
            basic::AMQPMethod::Nack(basic::Nack {
                delivery_tag: tag,
                multiple,
                requeue: false,
            })
        };
        encode(
            &AMQPFrame::Method(channel, AMQPClass::Basic(method)),
            &mut bytes,
        );
        i = j + 1;
    }
    bytes.is_empty() || out.bytes(bytes).await
}
