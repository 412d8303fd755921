//! basic.qos, consume and cancel, and each consumer's task; basic.get, ack, nack, reject
//! and recover are in [`super::deliveries`].
//!
//! A consumer is a consumer session of [`crate::consume`] on the queue's leader (relayed when
//! another node leads), as for gRPC's `Consume`; its deliveries get the channel's delivery
//! tags, in order, and the channel remembers which session and session tag each unacked tag
//! stands for.
//!
//! When the queue's leader moves, the session ends with UNAVAILABLE: the consumer subscribes
//! again under the same tag, and the new leader redelivers what was unacked (flagged
//! redelivered); acks of the old session's tags are dropped. A queue deleted under its
//! consumers cancels them with basic.cancel (clients that announced
//! `consumer_cancel_notify`).
//!
//! basic.cancel stops the session ([`SessionIn::Stop`]): the queue's consumer is cancelled
//! and takes nothing more, and cancel-ok goes out once that is committed, after every
//! delivery the consumer got. What it holds stays with the channel until the client settles
//! it, as RabbitMQ's quorum queues do; the session ends with the last settle, or when the
//! channel closes (what is left then returns to the queue).
//!
//! Bounds: a session's prefetch (basic.qos; 0 means the node's `prefetch_zero_cap`), the
//! session's channels ([`crate::api::consume::STREAM_BOUND`]), and the connection's outbox.

use std::sync::Arc;
use std::time::Duration;

use amq_protocol::protocol::{AMQPClass, basic};
use qq_core::Message;
use qq_core::queue::SettleOutcome;
use qq_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::debug;

use super::codes::{AmqpError, NOT_IMPLEMENTED};
use super::convert::{properties_to_amqp, short};
use super::deliveries::{self, Consuming, Deliveries, Handle, Signals, Unacked, outcome};
use super::frames::content_frames;
use super::session::Session;
use crate::api::conn::ConsumerGuard;
use crate::api::consume::{self as grpc, STREAM_BOUND};
use crate::consume::relay::start_session;
use crate::consume::session::{SessionIn, SessionOut, SubscribeArgs};

/// How long a consumer whose session ended with UNAVAILABLE waits before subscribing again.
const RESUBSCRIBE_BACKOFF: Duration = Duration::from_millis(250);
/// How long basic.cancel waits for the queue to cancel the consumer before answering anyway.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

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
            deliveries::get(session, channel, g).await?;
            None
        }
        M::Ack(a) => {
            deliveries::settle(
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
            // As RabbitMQ 4.3: a nack with requeue hands the message back without counting a
            // failed delivery (a reject with requeue counts one).
            let outcome = match n.requeue {
                true => SettleOutcome::Release,
                false => SettleOutcome::Reject,
            };
            deliveries::settle(session, channel, n.delivery_tag, n.multiple, outcome).await?;
            None
        }
        M::Reject(r) => {
            deliveries::settle(session, channel, r.delivery_tag, false, outcome(r.requeue)).await?;
            None
        }
        M::Recover(r) if !r.requeue => {
            return Err(AmqpError::new(NOT_IMPLEMENTED, "requeue=false"));
        }
        M::RecoverAsync(r) if !r.requeue => {
            return Err(AmqpError::new(NOT_IMPLEMENTED, "requeue=false"));
        }
        M::Recover(_) => {
            deliveries::recover(session, channel).await?;
            Some(M::RecoverOk(basic::RecoverOk {}))
        }
        M::RecoverAsync(_) => {
            deliveries::recover(session, channel).await?;
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
        format!("amq.ctag-qq-{}", api.node().consuming().next_consumer_id())
    } else {
        c.consumer_tag.to_string()
    };
    if channel
        .deliveries
        .state
        .lock()
        .unwrap()
        .tags
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
        arguments: crate::api::convert::table_to_pb(&super::convert::arguments_from_amqp(
            &c.arguments,
        )),
    };
    let args = grpc::subscribe_args(api, &session.caller, sub)?;
    let guard = grpc::admit_consumer(api, &session.caller, &session.vhost)?;
    let consumer = Consumer {
        id: api.node().consuming().next_consumer_id(),
        session: session.clone(),
        channel: channel.id,
        deliveries: channel.deliveries.clone(),
        ctag: ctag.clone(),
        args,
        no_ack: c.no_ack,
        stop: channel.deliveries.done.child_token(),
        signals: Signals::default(),
        _guard: guard,
    };
    let out = consumer.subscribe(0).await?;
    channel
        .deliveries
        .state
        .lock()
        .unwrap()
        .tags
        .insert(ctag.clone(), consumer.id);
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
    /// The node-wide number of the consumer (a tag may be used again after a cancel).
    id: u64,
    session: Arc<Session>,
    channel: u16,
    deliveries: Arc<Deliveries>,
    ctag: String,
    args: SubscribeArgs,
    no_ack: bool,
    /// Cancelled when the channel ends.
    stop: CancellationToken,
    signals: Signals,
    _guard: ConsumerGuard,
}

impl Consumer {
    /// Start session `generation` and register it; its output.
    async fn subscribe(&self, generation: u64) -> Result<mpsc::Receiver<SessionOut>, AmqpError> {
        let (in_tx, in_rx) = mpsc::channel::<SessionIn>(STREAM_BOUND);
        let (out_tx, out_rx) = mpsc::channel::<SessionOut>(STREAM_BOUND);
        let consuming = self.session.ctx.api.node().consuming().clone();
        start_session(consuming, self.args.clone(), in_rx, out_tx).await?;
        self.deliveries.state.lock().unwrap().sessions.insert(
            self.id,
            Handle {
                input: in_tx,
                generation,
                signals: self.signals.clone(),
            },
        );
        Ok(out_rx)
    }

    async fn run(self, out: mpsc::Receiver<SessionOut>) {
        self.serve(out).await;
        self.forget();
        self.signals.quiet.cancel();
    }

    async fn serve(&self, mut out: mpsc::Receiver<SessionOut>) {
        let mut generation = 0;
        loop {
            let ended = self.pump(&mut out, generation).await;
            let Some(code) = ended else {
                return;
            };
            let over = self.stop.is_cancelled() || self.signals.cancelled.is_cancelled();
            if code != Code::Unavailable as i32 || over {
                return;
            }
            // The leader moved (or this node stopped leading): subscribe again.
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(RESUBSCRIBE_BACKOFF) => {}
                    _ = self.stop.cancelled() => return,
                    _ = self.signals.cancelled.cancelled() => return,
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
                // basic.cancel's cancel-ok may go now: nothing more will be delivered.
                Some(SessionOut::Stopped) => self.signals.quiet.cancel(),
                // After a client's cancel, the session ends by itself once all is settled.
                Some(SessionOut::Cancelled { .. }) if self.signals.cancelled.is_cancelled() => {
                    return None;
                }
                Some(SessionOut::Cancelled { reason }) => {
                    debug!(ctag = %self.ctag, "amqp consumer cancelled: {reason}");
                    self.cancelled_by_server().await;
                    return None;
                }
                Some(SessionOut::Error { code, message }) => {
                    debug!(ctag = %self.ctag, code, "amqp consumer session ended: {message}");
                    if code != Code::Unavailable as i32 && !self.signals.cancelled.is_cancelled() {
                        self.cancelled_by_server().await;
                    }
                    return Some(code);
                }
                None => return Some(Code::Unavailable as i32),
            }
        }
    }

    /// The channel closed: wait (at most [`CANCEL_WAIT`]) until the consumer's session ended
    /// on the leader. Deliveries that still come are not sent on: the session's end returns
    /// them to the queue.
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
        // The channel closed while this delivery waited: nothing more goes out on it (its
        // close-ok may be queued already); the session's end returns the message.
        if self.stop.is_cancelled() {
            return false;
        }
        let unacked = (!self.no_ack).then_some(Unacked::Consumer {
            consumer: self.id,
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

    /// The consumer is over: its tag (if still its own) and its session leave the channel.
    fn forget(&self) {
        let mut state = self.deliveries.state.lock().unwrap();
        state.sessions.remove(&self.id);
        if state.tags.get(&self.ctag) == Some(&self.id) {
            state.tags.remove(&self.ctag);
        }
    }
}

/// basic.cancel: the tag leaves the channel at once; the consumer's session stops (the queue
/// cancels the consumer) and cancel-ok waits until that is committed (at most
/// [`CANCEL_WAIT`]), so a message published after cancel-ok never goes to it. What it holds
/// stays unacked on the channel.
async fn cancel(channel: &mut Consuming, ctag: &str) {
    let handle = {
        let mut state = channel.deliveries.state.lock().unwrap();
        let id = state.tags.remove(ctag);
        id.and_then(|id| state.sessions.get(&id))
            .map(|h| (h.input.clone(), h.signals.clone()))
    };
    let Some((input, signals)) = handle else {
        return;
    };
    signals.cancelled.cancel();
    // Between two sessions (the leader moved) there is nobody to tell: the task ends at the
    // cancel and the old session's deliveries went back to the queue.
    if input.send(SessionIn::Stop).await.is_ok() {
        let _ = tokio::time::timeout(CANCEL_WAIT, signals.quiet.cancelled()).await;
    }
}
