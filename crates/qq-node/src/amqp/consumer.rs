//! basic.qos, consume, cancel, get, ack, nack, reject and recover.
//!
//! A consumer is a consumer session of [`crate::consume`] on the queue's leader (relayed when
//! another node leads), as for gRPC's `Consume`; its deliveries get the channel's delivery
//! tags, in order, and the channel remembers which session and session tag each unacked tag
//! stands for. basic.get goes through gRPC's `Get` (a receipt per message) and its ack through
//! `Settle`. ack settles ACK; nack and reject with `requeue` settle REQUEUE (counted against
//! `x-delivery-limit`), without it REJECT (dead-lettered with reason `rejected`).
//!
//! When the queue's leader moves, the session ends with UNAVAILABLE: the consumer subscribes
//! again under the same tag, and the new leader redelivers what was unacked (flagged
//! redelivered); acks of the old session's tags are dropped. A queue deleted under its
//! consumers cancels them with basic.cancel (clients that announced
//! `consumer_cancel_notify`). basic.cancel ends the session at once: its unacked messages
//! return to the queue (RabbitMQ keeps them with the channel until the client settles them).
//!
//! Bounds: a session's prefetch (basic.qos; 0 means the node's `prefetch_zero_cap`), the
//! session's channels ([`crate::api::consume::STREAM_BOUND`]), and the connection's outbox.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use amq_protocol::protocol::{AMQPClass, basic};
use qq_core::Message;
use qq_core::queue::SettleOutcome;
use qq_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::debug;

use super::codes::{AmqpError, NOT_IMPLEMENTED, PRECONDITION_FAILED, RESOURCE_LOCKED};
use super::convert::{properties_to_amqp, short};
use super::frames::content_frames;
use super::session::{Session, request};
use crate::api::conn::ConsumerGuard;
use crate::api::consume::{self as grpc, STREAM_BOUND};
use crate::consume::relay::start_session;
use crate::consume::session::{SessionIn, SessionOut, SubscribeArgs};

/// How long a consumer whose session ended with UNAVAILABLE waits before subscribing again.
const RESUBSCRIBE_BACKOFF: Duration = Duration::from_millis(250);
/// How long basic.cancel waits for the consumer's session to end before answering anyway.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// An unacked delivery of the channel.
#[derive(Debug, Clone)]
enum Unacked {
    /// From consumer `ctag`'s session number `generation`, its tag there.
    Consumer {
        ctag: String,
        generation: u64,
        tag: u64,
    },
    /// From basic.get: its receipt.
    Get { receipt: String },
}

/// A live consumer: its session's input and number.
struct Handle {
    /// The node-wide number of the consumer (a tag may be reused after a cancel).
    id: u64,
    input: mpsc::Sender<SessionIn>,
    generation: u64,
    stop: CancellationToken,
    /// Cancelled once the consumer's session has ended on the queue's leader.
    finished: CancellationToken,
}

#[derive(Default)]
struct State {
    last_tag: u64,
    unacked: BTreeMap<u64, Unacked>,
    consumers: HashMap<String, Handle>,
}

/// A channel's delivery tags, unacked deliveries and consumers, shared by the read loop and
/// the consumer tasks. `order` is held from taking a tag to queuing the delivery, so tags go
/// out in order; `state` is a short lock, never held across an await.
pub struct Deliveries {
    order: tokio::sync::Mutex<()>,
    state: Mutex<State>,
    done: CancellationToken,
}

impl Deliveries {
    pub fn new(done: CancellationToken) -> Arc<Deliveries> {
        Arc::new(Deliveries {
            order: tokio::sync::Mutex::new(()),
            state: Mutex::new(State::default()),
            done,
        })
    }

    /// The channel ends: every consumer stops (its session ends, its unacked return). The
    /// receipts of basic.get messages still unacked are returned, for the caller to requeue.
    pub fn end(&self) -> Vec<String> {
        self.done.cancel();
        let mut state = self.state.lock().unwrap();
        state.consumers.clear();
        std::mem::take(&mut state.unacked)
            .into_values()
            .filter_map(|u| match u {
                Unacked::Get { receipt } => Some(receipt),
                Unacked::Consumer { .. } => None,
            })
            .collect()
    }

    fn next_tag(&self, unacked: Option<Unacked>) -> u64 {
        let mut state = self.state.lock().unwrap();
        state.last_tag += 1;
        let tag = state.last_tag;
        if let Some(u) = unacked {
            state.unacked.insert(tag, u);
        }
        tag
    }
}

/// A channel's consuming state: basic.qos for the consumers started after it, and the
/// channel's deliveries.
pub struct Consuming {
    pub id: u16,
    pub prefetch: u16,
    pub global_qos: bool,
    pub deliveries: Arc<Deliveries>,
}

impl Consuming {
    pub fn new(id: u16, done: CancellationToken) -> Consuming {
        Consuming {
            id,
            prefetch: 0,
            global_qos: false,
            deliveries: Deliveries::new(done),
        }
    }
}

pub async fn basic(
    session: &Arc<Session>,
    channel: &mut Consuming,
    method: basic::AMQPMethod,
) -> Result<Option<AMQPClass>, AmqpError> {
    use basic::AMQPMethod as M;
    let reply = match method {
        M::Qos(q) => {
            channel.prefetch = q.prefetch_count;
            channel.global_qos = q.global;
            Some(M::QosOk(basic::QosOk {}))
        }
        M::Consume(c) => consume(session, channel, c).await?,
        M::Cancel(c) => {
            cancel(channel, c.consumer_tag.as_str()).await;
            (!c.nowait).then_some(M::CancelOk(basic::CancelOk {
                consumer_tag: c.consumer_tag,
            }))
        }
        M::Get(g) => {
            get(session, channel, g).await?;
            None
        }
        M::Ack(a) => {
            settle(
                session,
                channel,
                a.delivery_tag,
                a.multiple,
                SettleOutcome::Ack,
            )
            .await?;
            None
        }
        M::Nack(n) => {
            settle(
                session,
                channel,
                n.delivery_tag,
                n.multiple,
                outcome(n.requeue),
            )
            .await?;
            None
        }
        M::Reject(r) => {
            settle(session, channel, r.delivery_tag, false, outcome(r.requeue)).await?;
            None
        }
        M::Recover(r) if !r.requeue => {
            return Err(AmqpError::new(NOT_IMPLEMENTED, "requeue=false"));
        }
        M::RecoverAsync(r) if !r.requeue => {
            return Err(AmqpError::new(NOT_IMPLEMENTED, "requeue=false"));
        }
        M::Recover(_) => {
            recover(session, channel).await?;
            Some(M::RecoverOk(basic::RecoverOk {}))
        }
        M::RecoverAsync(_) => {
            recover(session, channel).await?;
            None
        }
        _ => {
            return Err(AmqpError::new(
                super::codes::COMMAND_INVALID,
                "a server method sent by the client",
            ));
        }
    };
    Ok(reply.map(AMQPClass::Basic))
}

fn outcome(requeue: bool) -> SettleOutcome {
    if requeue {
        SettleOutcome::Requeue
    } else {
        SettleOutcome::Reject
    }
}

async fn consume(
    session: &Arc<Session>,
    channel: &mut Consuming,
    c: basic::Consume,
) -> Result<Option<basic::AMQPMethod>, AmqpError> {
    let api = &session.ctx.api;
    let queue = c.queue.to_string();
    if channel.global_qos && channel.prefetch > 0 {
        return Err(AmqpError::new(
            NOT_IMPLEMENTED,
            format!(
                "queue '{queue}' in vhost '{}' does not support global qos",
                session.vhost
            ),
        ));
    }
    if c.exclusive {
        return Err(AmqpError::new(
            NOT_IMPLEMENTED,
            "exclusive consumers are not supported; use a single-active-consumer queue \
             (x-single-active-consumer)",
        ));
    }
    let ctag = if c.consumer_tag.as_str().is_empty() {
        format!("amq.ctag-qq-{}", api.node().next_consumer_id())
    } else {
        c.consumer_tag.to_string()
    };
    if channel
        .deliveries
        .state
        .lock()
        .unwrap()
        .consumers
        .contains_key(&ctag)
    {
        return Err(AmqpError::new(
            super::codes::NOT_ALLOWED,
            format!("attempt to reuse consumer tag '{ctag}'"),
        ));
    }
    let sub = pb::Subscribe {
        vhost: session.vhost.clone(),
        queue,
        consumer_tag: ctag.clone(),
        prefetch_count: channel.prefetch as u32,
        auto_ack: c.no_ack,
        arguments: crate::api::convert::table_to_pb(&super::convert::table_from_amqp(&c.arguments)),
    };
    let args = grpc::subscribe_args(api, &session.caller, sub)?;
    let guard = grpc::admit_consumer(api, &session.caller, &session.vhost)?;
    let consumer = Consumer {
        id: api.node().next_consumer_id(),
        session: session.clone(),
        channel: channel.id,
        deliveries: channel.deliveries.clone(),
        ctag: ctag.clone(),
        args,
        no_ack: c.no_ack,
        stop: channel.deliveries.done.child_token(),
        finished: CancellationToken::new(),
        _guard: guard,
    };
    let out = consumer.subscribe(0).await?;
    if !c.nowait {
        let ok = basic::AMQPMethod::ConsumeOk(basic::ConsumeOk {
            consumer_tag: short(&ctag),
        });
        session.out.method(channel.id, AMQPClass::Basic(ok)).await;
    }
    let node = api.node().clone();
    node.tasks().spawn(consumer.run(out));
    Ok(None)
}

/// One consumer's task: deliveries to the client, subscribing again when the leader moves.
struct Consumer {
    id: u64,
    session: Arc<Session>,
    channel: u16,
    deliveries: Arc<Deliveries>,
    ctag: String,
    args: SubscribeArgs,
    no_ack: bool,
    stop: CancellationToken,
    /// Cancelled when the task ends, after its last session ended (see [`cancel`]).
    finished: CancellationToken,
    _guard: ConsumerGuard,
}

impl Consumer {
    /// Start session `generation` and register it; its output.
    async fn subscribe(&self, generation: u64) -> Result<mpsc::Receiver<SessionOut>, AmqpError> {
        let (in_tx, in_rx) = mpsc::channel::<SessionIn>(STREAM_BOUND);
        let (out_tx, out_rx) = mpsc::channel::<SessionOut>(STREAM_BOUND);
        let node = self.session.ctx.api.node().clone();
        start_session(node, self.args.clone(), in_rx, out_tx).await?;
        self.deliveries.state.lock().unwrap().consumers.insert(
            self.ctag.clone(),
            Handle {
                id: self.id,
                input: in_tx,
                generation,
                stop: self.stop.clone(),
                finished: self.finished.clone(),
            },
        );
        Ok(out_rx)
    }

    async fn run(self, out: mpsc::Receiver<SessionOut>) {
        self.serve(out).await;
        self.finished.cancel();
    }

    async fn serve(&self, mut out: mpsc::Receiver<SessionOut>) {
        let mut generation = 0;
        loop {
            let ended = self.pump(&mut out, generation).await;
            let Some(code) = ended else {
                break;
            };
            if code != Code::Unavailable as i32 || self.stop.is_cancelled() {
                break;
            }
            // The leader moved (or this node stopped leading): subscribe again.
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(RESUBSCRIBE_BACKOFF) => {}
                    _ = self.stop.cancelled() => return self.forget(),
                }
                generation += 1;
                match self.subscribe(generation).await {
                    Ok(o) => {
                        out = o;
                        break;
                    }
                    Err(e) => debug!(ctag = %self.ctag, "amqp consumer resubscribe: {}", e.text),
                }
            }
        }
        self.forget();
    }

    /// Serve one session; `Some(code)` when it ended with an error, `None` when the consumer
    /// is over (cancelled by the client or the server, or the channel closed).
    async fn pump(&self, out: &mut mpsc::Receiver<SessionOut>, generation: u64) -> Option<i32> {
        loop {
            let next = tokio::select! {
                o = out.recv() => o,
                _ = self.stop.cancelled() => {
                    self.wind_down(out).await;
                    return None;
                }
            };
            match next {
                Some(SessionOut::Subscribed { .. }) => {}
                Some(SessionOut::Delivery {
                    tag,
                    redelivered,
                    message,
                }) => {
                    if !self.deliver(generation, tag, redelivered, message).await {
                        return None;
                    }
                }
                Some(SessionOut::Cancelled { reason }) => {
                    debug!(ctag = %self.ctag, "amqp consumer cancelled: {reason}");
                    self.cancelled_by_server().await;
                    return None;
                }
                Some(SessionOut::Error { code, message }) => {
                    debug!(ctag = %self.ctag, code, "amqp consumer session ended: {message}");
                    if code != Code::Unavailable as i32 {
                        self.cancelled_by_server().await;
                    }
                    return Some(code);
                }
                None => return Some(Code::Unavailable as i32),
            }
        }
    }

    /// The consumer was cancelled or its channel closed: wait (at most [`CANCEL_WAIT`]) until
    /// its session ended on the leader, so that no later message goes to it. Deliveries that
    /// still come are not sent on: the session's end returns them to the queue.
    async fn wind_down(&self, out: &mut mpsc::Receiver<SessionOut>) {
        let drained = async { while out.recv().await.is_some() {} };
        if tokio::time::timeout(CANCEL_WAIT, drained).await.is_err() {
            debug!(ctag = %self.ctag, "amqp consumer: session still open after the cancel wait");
        }
    }

    async fn deliver(
        &self,
        generation: u64,
        tag: u64,
        redelivered: bool,
        message: Message,
    ) -> bool {
        let _order = self.deliveries.order.lock().await;
        let unacked = (!self.no_ack).then(|| Unacked::Consumer {
            ctag: self.ctag.clone(),
            generation,
            tag,
        });
        let delivery_tag = self.deliveries.next_tag(unacked);
        let deliver = basic::Deliver {
            consumer_tag: short(&self.ctag),
            delivery_tag,
            redelivered,
            exchange: short(&message.exchange),
            routing_key: short(&message.routing_key),
        };
        let bytes = content_frames(
            self.channel,
            AMQPClass::Basic(basic::AMQPMethod::Deliver(deliver)),
            properties_to_amqp(&message.properties),
            &message.body,
            self.session.frame_max,
        );
        self.session.out.bytes(bytes).await
    }

    /// The server ends this consumer (queue deleted): basic.cancel to clients that asked.
    async fn cancelled_by_server(&self) {
        self.forget();
        if self.session.caps.consumer_cancel_notify {
            let cancel = basic::AMQPMethod::Cancel(basic::Cancel {
                consumer_tag: short(&self.ctag),
                nowait: true,
            });
            self.session
                .out
                .method(self.channel, AMQPClass::Basic(cancel))
                .await;
        }
    }

    fn forget(&self) {
        let mut state = self.deliveries.state.lock().unwrap();
        if state
            .consumers
            .get(&self.ctag)
            .is_some_and(|h| h.id == self.id)
        {
            state.consumers.remove(&self.ctag);
        }
    }
}

/// basic.cancel: the consumer's session ends (its unacked messages return to the queue), and
/// cancel-ok waits until it has ended on the queue's leader (at most [`CANCEL_WAIT`]): a message
/// published after cancel-ok never goes to the cancelled consumer.
async fn cancel(channel: &mut Consuming, ctag: &str) {
    let handle = channel
        .deliveries
        .state
        .lock()
        .unwrap()
        .consumers
        .remove(ctag);
    if let Some(h) = handle {
        h.stop.cancel();
        let _ = h.input.send(SessionIn::Cancel).await;
        let _ = tokio::time::timeout(CANCEL_WAIT, h.finished.cancelled()).await;
    }
}

async fn get(
    session: &Arc<Session>,
    channel: &mut Consuming,
    g: basic::Get,
) -> Result<(), AmqpError> {
    let r = pb::GetRequest {
        vhost: session.vhost.clone(),
        queue: g.queue.to_string(),
        auto_ack: g.no_ack,
        lease_ms: 0,
    };
    let got = match grpc::get(&session.ctx.api, request(session, r)).await {
        Ok(got) => got.into_inner(),
        // A single-active-consumer queue refuses basic.get: RabbitMQ's 405.
        Err(s) if s.code() == Code::FailedPrecondition => {
            return Err(AmqpError::new(RESOURCE_LOCKED, s.message()));
        }
        Err(s) => return Err(s.into()),
    };
    let Some(delivery) = got.delivery else {
        let empty = basic::AMQPMethod::GetEmpty(basic::GetEmpty {});
        session
            .out
            .method(channel.id, AMQPClass::Basic(empty))
            .await;
        return Ok(());
    };
    let _order = channel.deliveries.order.lock().await;
    let unacked = (!g.no_ack).then(|| Unacked::Get {
        receipt: delivery.receipt.clone(),
    });
    let tag = channel.deliveries.next_tag(unacked);
    let message = delivery.message.unwrap_or_default();
    let (mut props, body) = crate::api::convert::message_from_pb(Some(&message))?;
    // RabbitMQ's quorum queues put the count on every basic.get, 0 the first time.
    props
        .headers
        .entry("x-delivery-count".into())
        .or_insert(qq_core::Value::Long(0));
    let ok = basic::GetOk {
        delivery_tag: tag,
        redelivered: delivery.redelivered,
        exchange: short(&delivery.exchange),
        routing_key: short(&delivery.routing_key),
        message_count: got.message_count.min(u32::MAX as u64) as u32,
    };
    let bytes = content_frames(
        channel.id,
        AMQPClass::Basic(basic::AMQPMethod::GetOk(ok)),
        properties_to_amqp(&props),
        &body,
        session.frame_max,
    );
    session.out.bytes(bytes).await;
    Ok(())
}

/// Settle `tag` (with `multiple`, every unacked tag up to it): 406 for a tag that is not an
/// unacked delivery of this channel, as RabbitMQ.
async fn settle(
    session: &Arc<Session>,
    channel: &mut Consuming,
    tag: u64,
    multiple: bool,
    outcome: SettleOutcome,
) -> Result<(), AmqpError> {
    let taken: Vec<Unacked> = {
        let mut state = channel.deliveries.state.lock().unwrap();
        // multiple with tag 0: everything unacked.
        let upto = if tag == 0 { u64::MAX } else { tag };
        let tags: Vec<u64> = if multiple {
            state.unacked.range(..=upto).map(|(t, _)| *t).collect()
        } else {
            vec![tag]
        };
        let known = if multiple {
            tag == 0 || !tags.is_empty()
        } else {
            state.unacked.contains_key(&tag)
        };
        if !known {
            return Err(AmqpError::new(
                PRECONDITION_FAILED,
                format!("unknown delivery tag {tag}"),
            ));
        }
        tags.iter()
            .filter_map(|t| state.unacked.remove(t))
            .collect()
    };
    settle_taken(session, channel, taken, outcome).await
}

/// A closed channel's unacked basic.get messages go back to their queues at once (as
/// RabbitMQ's), not when their leases end.
pub async fn requeue_gets(session: &Session, receipts: Vec<String>) {
    if receipts.is_empty() {
        return;
    }
    let r = pb::SettleRequest {
        receipts,
        outcome: pb::SettleOutcome::Requeue as i32,
        reason_detail: None,
        delay_ms: None,
    };
    if let Err(e) = grpc::settle(&session.ctx.api, request(session, r)).await {
        debug!("amqp: requeue of a closed channel's gets: {e}");
    }
}

/// basic.recover: every unacked delivery of the channel goes back to its queue.
async fn recover(session: &Arc<Session>, channel: &mut Consuming) -> Result<(), AmqpError> {
    let taken: Vec<Unacked> = {
        let mut state = channel.deliveries.state.lock().unwrap();
        std::mem::take(&mut state.unacked).into_values().collect()
    };
    settle_taken(session, channel, taken, SettleOutcome::Requeue).await
}

async fn settle_taken(
    session: &Arc<Session>,
    channel: &mut Consuming,
    taken: Vec<Unacked>,
    outcome: SettleOutcome,
) -> Result<(), AmqpError> {
    let mut by_consumer: HashMap<String, (u64, Vec<u64>)> = HashMap::new();
    let mut receipts = Vec::new();
    for u in taken {
        match u {
            Unacked::Consumer {
                ctag,
                generation,
                tag,
            } => by_consumer
                .entry(ctag)
                .or_insert((generation, Vec::new()))
                .1
                .push(tag),
            Unacked::Get { receipt } => receipts.push(receipt),
        }
    }
    // A tag of an earlier session (the leader moved since) is dropped: that session's
    // deliveries went back to the queue when it ended.
    let inputs: Vec<(mpsc::Sender<SessionIn>, Vec<u64>)> = {
        let state = channel.deliveries.state.lock().unwrap();
        by_consumer
            .into_iter()
            .flat_map(|(ctag, (generation, tags))| {
                state
                    .consumers
                    .get(&ctag)
                    .filter(|h| h.generation == generation)
                    .map(|h| (h.input.clone(), tags))
            })
            .collect()
    };
    for (input, tags) in inputs {
        let _ = input
            .send(SessionIn::Settle {
                tags,
                multiple: false,
                outcome: outcome.clone(),
            })
            .await;
    }
    if !receipts.is_empty() {
        let api = &session.ctx.api;
        let r = pb::SettleRequest {
            receipts,
            outcome: settle_code(&outcome),
            reason_detail: None,
            delay_ms: None,
        };
        grpc::settle(api, request(session, r)).await?;
    }
    Ok(())
}

/// The gRPC settle outcome of an AMQP settle.
fn settle_code(outcome: &SettleOutcome) -> i32 {
    let code = match outcome {
        SettleOutcome::Ack => pb::SettleOutcome::Ack,
        SettleOutcome::Reject | SettleOutcome::RejectWithDetail { .. } => pb::SettleOutcome::Reject,
        _ => pb::SettleOutcome::Requeue,
    };
    code as i32
}
