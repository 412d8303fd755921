//! One client interface over both brokers: a connection to one node, a pipelined publisher with
//! confirms, and a consumer with manual acknowledgement.
//!
//! The scenarios are written once against these types, so both brokers see exactly the same
//! load: the same message bodies, the same confirm window, the same prefetch, one settle per
//! message. quorumq is driven over gRPC with `qq-client` (`PublishStream`, `Consume`), and
//! ([`System::QuorumqAmqp`]) over its AMQP port with the very client RabbitMQ gets: lapin
//! (publisher confirms on a channel, `basic.consume` with a per-consumer `basic.qos`). Queues
//! are quorum queues with three replicas on both sides.
//!
//! Deliberately left out: reconnection. A publisher or consumer whose stream or channel breaks
//! returns the error, and the scenario that expects breakage (failover) opens a new one.

use std::collections::HashMap;
use std::task::Poll;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use qq_client::{Value, ValueExt};

use crate::System;

/// Node `n` (0-based) of quorumq listens on `QQ_BASE_PORT + 1 + n`, of RabbitMQ on
/// `RABBIT_BASE_PORT + 1 + n`; the clusters in [`crate::cluster`] are started on these.
const QQ_BASE_PORT: u16 = 7500;
const RABBIT_BASE_PORT: u16 = 5680;

/// gRPC address of quorumq node `node` (0-based).
pub fn qq_address(node: usize) -> String {
    format!("127.0.0.1:{}", QQ_BASE_PORT + 1 + node as u16)
}

/// Node-to-node (mutual TLS) address of quorumq node `node` (0-based): 100 above the client port.
pub fn qq_cluster_address(node: usize) -> String {
    format!("127.0.0.1:{}", QQ_BASE_PORT + 101 + node as u16)
}

/// HTTP address (`GET /metrics`) of quorumq node `node` (0-based): 200 above the client port.
pub fn qq_http_address(node: usize) -> String {
    format!("127.0.0.1:{}", QQ_BASE_PORT + 201 + node as u16)
}

/// AMQP port of quorumq node `node` (0-based): 300 above the client port.
pub fn qq_amqp_port(node: usize) -> u16 {
    QQ_BASE_PORT + 301 + node as u16
}

/// AMQP port of RabbitMQ node `node` (0-based).
pub fn rabbit_port(node: usize) -> u16 {
    RABBIT_BASE_PORT + 1 + node as u16
}

/// How a queue is declared: a plain three-replica quorum queue, or one that dead-letters
/// at-least-once into `target` through the default exchange (which needs `reject-publish`).
#[derive(Debug, Clone, Default)]
pub struct QueueSpec {
    pub dead_letter_target: Option<String>,
    /// RabbitMQ: spread the leaders over the nodes (`x-queue-leader-locator=balanced`) instead
    /// of putting them on the node the declaring connection is on (`client-local`). quorumq
    /// always spreads them itself.
    pub balanced: bool,
}

/// The declare arguments of a quorumq queue.
fn qq_queue_args(spec: &QueueSpec) -> HashMap<String, Value> {
    let mut args = HashMap::new();
    args.insert("x-quorum-initial-group-size".into(), Value::long(3));
    if let Some(target) = &spec.dead_letter_target {
        args.insert("x-dead-letter-exchange".into(), Value::string(""));
        args.insert("x-dead-letter-routing-key".into(), Value::string(target));
        args.insert(
            "x-dead-letter-strategy".into(),
            Value::string("at-least-once"),
        );
        args.insert("x-overflow".into(), Value::string("reject-publish"));
    }
    args
}

/// The declare arguments of a quorum queue over AMQP (RabbitMQ's, which quorumq's AMQP port
/// takes as they are).
fn rabbit_queue_args(spec: &QueueSpec) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args.insert("x-quorum-initial-group-size".into(), AMQPValue::LongInt(3));
    // By default the leader goes to the node the declaring connection is on, as quorumq's
    // scenarios expect when they pick a node.
    let locator = if spec.balanced {
        "balanced"
    } else {
        "client-local"
    };
    args.insert(
        "x-queue-leader-locator".into(),
        AMQPValue::LongString(locator.into()),
    );
    if let Some(target) = &spec.dead_letter_target {
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(target.as_str().into()),
        );
        args.insert(
            "x-dead-letter-strategy".into(),
            AMQPValue::LongString("at-least-once".into()),
        );
        args.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
    }
    args
}

/// Declares and deletes queues one at a time: quorumq's client (every call a request on the
/// connection's HTTP/2 stream pool), or one AMQP channel (whose methods are synchronous).
/// Several on one connection pipeline declares: one channel each over AMQP, concurrent
/// requests over gRPC.
pub enum Declarer {
    Qq(qq_client::Client),
    Amqp(lapin::Channel),
}

impl Declarer {
    /// Declares a durable quorum queue with three replicas.
    pub async fn declare(&self, name: &str, spec: &QueueSpec) -> Result<()> {
        match self {
            Declarer::Qq(c) => {
                c.declare_queue(name, qq_queue_args(spec))
                    .await
                    .with_context(|| format!("declare {name}"))?;
            }
            Declarer::Amqp(ch) => {
                ch.queue_declare(
                    name.into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    rabbit_queue_args(spec),
                )
                .await
                .with_context(|| format!("declare {name}"))?;
            }
        }
        Ok(())
    }

    /// Deletes a queue (missing is fine on quorumq; RabbitMQ's delete of a missing queue is
    /// an ok too).
    pub async fn delete(&self, name: &str) -> Result<()> {
        match self {
            Declarer::Qq(c) => match c.delete_queue(name, false, false).await {
                Ok(_) => Ok(()),
                Err(e) if e.code() == tonic::Code::NotFound => Ok(()),
                Err(e) => Err(anyhow!("delete {name}: {e}")),
            },
            Declarer::Amqp(ch) => {
                ch.queue_delete(name.into(), QueueDeleteOptions::default())
                    .await
                    .with_context(|| format!("delete {name}"))?;
                Ok(())
            }
        }
    }

    /// Closes the channel (AMQP); nothing to do over gRPC.
    pub async fn close(self) {
        if let Declarer::Amqp(ch) = self {
            let _ = ch.close(200, "done".into()).await;
        }
    }
}

/// A connection to one node of one broker.
#[derive(Clone)]
pub enum Conn {
    Qq(qq_client::Client),
    Amqp(std::sync::Arc<lapin::Connection>),
}

impl Conn {
    /// Connects to node `node` (0-based) of `system` on the benchmark's loopback ports (quorumq
    /// over gRPC or over AMQP, RabbitMQ over AMQP).
    pub async fn connect(system: System, node: usize) -> Result<Conn> {
        match system {
            System::Quorumq => {
                let addr = qq_address(node);
                let client = qq_client::Client::connect(&addr)
                    .await
                    .with_context(|| format!("connect to quorumq node {}", node + 1))?;
                Ok(Conn::Qq(client))
            }
            System::QuorumqAmqp | System::Rabbitmq => {
                let port = match system {
                    System::Rabbitmq => rabbit_port(node),
                    _ => qq_amqp_port(node),
                };
                let uri = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
                let conn = lapin::Connection::connect(&uri, lapin::ConnectionProperties::default())
                    .await
                    .with_context(|| format!("connect to {system} node {}", node + 1))?;
                Ok(Conn::Amqp(std::sync::Arc::new(conn)))
            }
        }
    }

    /// A [`Declarer`] on this connection (a new channel over AMQP).
    pub async fn declarer(&self) -> Result<Declarer> {
        Ok(match self {
            Conn::Qq(c) => Declarer::Qq(c.clone()),
            Conn::Amqp(conn) => Declarer::Amqp(conn.create_channel().await?),
        })
    }

    /// Declares a durable quorum queue with three replicas (on a channel of its own).
    pub async fn declare_queue(&self, name: &str, spec: &QueueSpec) -> Result<()> {
        let d = self.declarer().await?;
        let r = d.declare(name, spec).await;
        d.close().await;
        r
    }

    /// Deletes a queue (missing is fine).
    pub async fn delete_queue(&self, name: &str) -> Result<()> {
        let d = self.declarer().await?;
        let r = d.delete(name).await;
        d.close().await;
        r
    }

    /// Messages in the queue (ready and unacknowledged over gRPC, ready over AMQP, which is
    /// all of them when nobody consumes).
    pub async fn message_count(&self, name: &str) -> Result<u64> {
        match self {
            // ListQueues: the counts without the state digest GetQueue computes (linear in
            // the queue's size, on the queue's leader: a poll every 250 ms of a growing target
            // took CPU from the very queue being measured).
            Conn::Qq(c) => c
                .list_queues()
                .await?
                .into_iter()
                .find(|q| q.name == name)
                .map(|q| q.messages)
                .with_context(|| format!("queue {name} not listed")),
            Conn::Amqp(conn) => {
                let ch = conn.create_channel().await?;
                let q = ch
                    .queue_declare(
                        name.into(),
                        QueueDeclareOptions {
                            passive: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .with_context(|| format!("passive declare {name}"))?;
                let _ = ch.close(200, "counted".into()).await;
                Ok(u64::from(q.message_count()))
            }
        }
    }

    /// A publisher to `queue` through the default exchange with at most `window` unconfirmed.
    pub async fn publisher(&self, queue: &str, window: usize) -> Result<Pub> {
        match self {
            Conn::Qq(c) => Ok(Pub::Qq {
                publisher: c.publisher(window).await?,
                queue: queue.to_string(),
            }),
            Conn::Amqp(conn) => {
                let channel = conn.create_channel().await?;
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await?;
                Ok(Pub::Amqp {
                    channel,
                    queue: queue.to_string(),
                    pending: FuturesUnordered::new(),
                    next_seq: 1,
                })
            }
        }
    }

    /// A consumer on `queue` with manual acknowledgement and `prefetch` unacknowledged at most.
    pub async fn consumer(&self, queue: &str, prefetch: u16) -> Result<Cons> {
        match self {
            Conn::Qq(c) => Ok(Cons::Qq(c.consume(queue, u32::from(prefetch)).await?)),
            Conn::Amqp(conn) => {
                let channel = conn.create_channel().await?;
                channel
                    .basic_qos(prefetch, BasicQosOptions { global: false })
                    .await?;
                let consumer = channel
                    .basic_consume(
                        queue.into(),
                        "".into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .with_context(|| format!("consume {queue}"))?;
                Ok(Cons::Amqp {
                    consumer,
                    channel,
                    settles: FuturesUnordered::new(),
                })
            }
        }
    }

    /// Publishes one message and waits for its confirm (used to probe that a node serves).
    pub async fn publish_one(&self, queue: &str, body: Bytes) -> Result<()> {
        let mut p = self.publisher(queue, 1).await?;
        p.send(body).await?;
        match p.next_confirm().await? {
            Some((_, true)) => Ok(()),
            Some((_, false)) => bail!("publish to {queue} was not confirmed"),
            None => bail!("no confirm for the publish to {queue}"),
        }
    }
}

type RabbitConfirm = BoxFuture<'static, (u64, lapin::Result<lapin::Confirmation>)>;

/// A pipelined publisher. The caller keeps the window: it sends while fewer than its window are
/// in flight and collects confirms with [`Pub::next_confirm`].
///
/// Over AMQP a send does not wait for lapin to write the publish: lapin's `basic_publish`
/// resolves only once its I/O thread has written the frames, so a publisher awaiting each one
/// makes two thread hand-offs per message and is held back by them whatever the broker (on
/// 2026-11-28 pipelining raised RabbitMQ's scenario 1 by about a third and quorumq's AMQP
/// figure by a sixth; docs/benchmarks.md). The publishes in flight count against the window
/// from the moment they are sent, as they do over gRPC.
pub enum Pub {
    Qq {
        publisher: qq_client::Publisher,
        queue: String,
    },
    Amqp {
        channel: lapin::Channel,
        queue: String,
        pending: FuturesUnordered<RabbitConfirm>,
        next_seq: u64,
    },
}

impl Pub {
    /// Sends one message; returns its sequence number (1, 2, …).
    pub async fn send(&mut self, body: Bytes) -> Result<u64> {
        match self {
            Pub::Qq { publisher, queue } => {
                Ok(publisher.send("", queue, qq_client::message(body)).await?)
            }
            Pub::Amqp {
                channel,
                queue,
                pending,
                next_seq,
            } => {
                let seq = *next_seq;
                *next_seq += 1;
                let (channel, queue) = (channel.clone(), queue.clone());
                let confirm: RabbitConfirm = Box::pin(async move {
                    let sent = channel
                        .basic_publish(
                            "".into(),
                            queue.as_str().into(),
                            BasicPublishOptions::default(),
                            &body,
                            lapin::BasicProperties::default().with_delivery_mode(2),
                        )
                        .await;
                    match sent {
                        Ok(confirm) => (seq, confirm.await),
                        Err(e) => (seq, Err(e)),
                    }
                });
                pending.push(started(confirm));
                Ok(seq)
            }
        }
    }

    /// The next confirm as `(seq, confirmed)`; `confirmed` is false for a negative confirm
    /// (rejected). `None` when nothing is in flight. Cancel-safe.
    pub async fn next_confirm(&mut self) -> Result<Option<(u64, bool)>> {
        match self {
            Pub::Qq { publisher, .. } => Ok(publisher
                .next_confirm()
                .await?
                .map(|c| (c.seq, c.is_confirmed()))),
            Pub::Amqp { pending, .. } => match pending.next().await {
                None => Ok(None),
                Some((seq, Ok(confirmation))) => Ok(Some((seq, confirmation.is_ack()))),
                Some((_, Err(e))) => Err(anyhow!("publisher confirm: {e}")),
            },
        }
    }

    /// Sent and not yet confirmed.
    pub fn in_flight(&self) -> usize {
        match self {
            Pub::Qq { publisher, .. } => publisher.in_flight(),
            Pub::Amqp { pending, .. } => pending.len(),
        }
    }
}

/// One delivered message, to be settled with [`Cons::ack`] or [`Cons::reject`].
pub struct Msg {
    pub body: Bytes,
    tag: u64,
    acker: Option<lapin::Acker>,
}

/// `f` polled once, now: a lapin publish or settle numbers itself and queues its frames on its
/// first poll, so polling each as it is sent keeps them in order without waiting for lapin to
/// write them (see [`Pub`]). The output, if it came at once, is kept for whoever awaits; a
/// pending `f` registers the real waker when that one polls it.
fn started<T: Send + 'static>(mut f: BoxFuture<'static, T>) -> BoxFuture<'static, T> {
    let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(done) => Box::pin(async move { done }),
        Poll::Pending => f,
    }
}

/// An AMQP ack or reject on its way (see [`Cons::settle_amqp`]).
type AmqpSettle = BoxFuture<'static, lapin::Result<bool>>;

/// A consumer with manual acknowledgement.
pub enum Cons {
    Qq(qq_client::Consumer),
    Amqp {
        consumer: lapin::Consumer,
        channel: lapin::Channel,
        /// Acks and rejects sent and not yet written by lapin: at most the prefetch, since
        /// the broker delivers no more until they arrive.
        settles: FuturesUnordered<AmqpSettle>,
    },
}

impl Cons {
    /// The next delivery; `None` when the subscription ended. Cancel-safe.
    pub async fn next(&mut self) -> Result<Option<Msg>> {
        match self {
            Cons::Qq(c) => match c.next().await {
                None => Ok(None),
                Some(Err(e)) => Err(e.into()),
                Some(Ok(d)) => Ok(Some(Msg {
                    body: qq_client::delivery_body(&d),
                    tag: d.delivery_tag,
                    acker: None,
                })),
            },
            Cons::Amqp { consumer, .. } => match consumer.next().await {
                None => Ok(None),
                Some(Err(e)) => Err(e.into()),
                Some(Ok(d)) => Ok(Some(Msg {
                    body: Bytes::from(d.data),
                    tag: d.delivery_tag,
                    acker: Some(d.acker),
                })),
            },
        }
    }

    /// Acknowledges one message.
    pub async fn ack(&mut self, msg: &Msg) -> Result<()> {
        match (self, &msg.acker) {
            (Cons::Qq(c), _) => Ok(c.ack(msg.tag, false).await?),
            (Cons::Amqp { settles, .. }, Some(acker)) => {
                let acker = acker.clone();
                let ack = async move { acker.ack(BasicAckOptions::default()).await };
                Cons::settle_amqp(settles, Box::pin(ack)).await
            }
            (Cons::Amqp { .. }, None) => bail!("an AMQP delivery without an acker"),
        }
    }

    /// Rejects one message without requeueing it (it is dead-lettered).
    pub async fn reject(&mut self, msg: &Msg) -> Result<()> {
        match (self, &msg.acker) {
            (Cons::Qq(c), _) => Ok(c.nack(msg.tag, false, false).await?),
            (Cons::Amqp { settles, .. }, Some(acker)) => {
                let acker = acker.clone();
                let options = BasicRejectOptions { requeue: false };
                let reject = async move { acker.reject(options).await };
                Cons::settle_amqp(settles, Box::pin(reject)).await
            }
            (Cons::Amqp { .. }, None) => bail!("an AMQP delivery without an acker"),
        }
    }

    /// Sends an ack or reject without waiting for lapin to write it (as a publish, see
    /// [`Pub`]): polled once now, so settles go out in order; the ones written meanwhile are
    /// collected, and an error of any of them is returned here or at [`Cons::close`].
    async fn settle_amqp(
        settles: &mut FuturesUnordered<AmqpSettle>,
        settle: AmqpSettle,
    ) -> Result<()> {
        settles.push(started(settle));
        while let Some(Some(done)) = settles.next().now_or_never() {
            done?;
        }
        Ok(())
    }

    /// Ends the subscription once every settle sent is written; unsettled deliveries go back
    /// to the queue.
    pub async fn close(self) {
        match self {
            Cons::Qq(mut c) => {
                let _ = c.cancel().await;
                c.close();
            }
            Cons::Amqp {
                channel,
                mut settles,
                ..
            } => {
                while settles.next().await.is_some() {}
                let _ = channel.close(200, "done".into()).await;
            }
        }
    }
}
