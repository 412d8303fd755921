//! The workload over AMQP 0-9-1 with lapin, behaving as RabbitMQ's clients do when a node
//! fails: every publisher has one connection with one channel in confirm mode, every consumer
//! one connection with one channel and one basic.consume. When a connection or channel fails
//! (node killed, a 541 refusal closing it, a heartbeat missed, a confirm that does not come
//! within [`CONFIRM_TIMEOUT`]), the client opens a new connection to the next node, enables
//! confirms again and republishes what was unconfirmed; a consumer subscribes again through
//! the next node. AMQP 0-9-1 has no publisher dedup: a republished message may be stored twice
//! (once per send), which the checker allows for AMQP histories and for nothing else.
//!
//! The client asks for a [`HEARTBEAT_S`] heartbeat, so a connection to a paused node is
//! noticed; every wait is bounded by a timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{
    Acker, BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind,
};
use tokio::sync::Mutex;
use tokio::time::timeout;

use super::{
    Action, Death, Outcome, Outgoing, PREFETCH, RPC_TIMEOUT, Recorder, Seen, Sender, Subscriber,
    Subscription,
};

/// Heartbeat the client asks for: a silent connection is dropped after two.
pub const HEARTBEAT_S: u16 = 5;
/// How long opening a connection with its channel may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a publish waits for its confirm before its connection is given up.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// After a failed connect, how long a publisher waits before trying (the next node) again.
const CONNECT_BACKOFF: Duration = Duration::from_millis(500);
/// How long closing a connection we are done with may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// The AMQP URI of every node, as guest (`allow_plaintext_auth` on the chaos nodes).
pub struct Amqp {
    uris: Arc<Vec<String>>,
}

impl Amqp {
    /// `addresses`: each node's AMQP host:port.
    pub fn new(addresses: Vec<String>) -> Amqp {
        let uris = addresses
            .iter()
            .map(|a| format!("amqp://guest:guest@{a}/%2f?heartbeat={HEARTBEAT_S}"))
            .collect();
        Amqp {
            uris: Arc::new(uris),
        }
    }

    /// Publisher `p`'s connection, first to node `p`.
    pub fn publisher(&self, p: usize, rec: Arc<Recorder>) -> Publisher {
        Publisher {
            uris: self.uris.clone(),
            rec,
            link: Mutex::new(Link {
                open: None,
                generation: 0,
                node: p,
                retry_at: Instant::now(),
            }),
        }
    }
}

/// A short name of a lapin error, for the error counts.
fn kind(e: &lapin::Error) -> String {
    match e.kind() {
        ErrorKind::ProtocolError(amqp) => format!("AMQP {}", amqp.get_id()),
        ErrorKind::IOError(_) => "IO".into(),
        ErrorKind::MissingHeartbeatError => "HEARTBEAT".into(),
        ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidConnectionState(_) => {
            "CLOSED".into()
        }
        other => format!("{other:?}"),
    }
}

async fn connect(uri: &str) -> Result<(Connection, Channel), String> {
    let conn = Connection::connect(uri, ConnectionProperties::default())
        .await
        .map_err(|e| kind(&e))?;
    let channel = conn.create_channel().await.map_err(|e| kind(&e))?;
    Ok((conn, channel))
}

/// Closes a connection we are done with, in the background (a dead peer never answers).
fn close_later(conn: Connection) {
    tokio::spawn(async move {
        let _ = timeout(CLOSE_TIMEOUT, conn.close(200, "reconnecting".into())).await;
    });
}

/// A publisher's open connection and its confirm-mode channel.
struct Open {
    conn: Connection,
    channel: Channel,
}

struct Link {
    open: Option<Open>,
    /// Counts the connections opened; a failure reported for an older one is ignored.
    generation: u64,
    /// The node the next connection goes to (modulo the number of nodes).
    node: usize,
    /// No connection attempt before this (after a failed one).
    retry_at: Instant,
}

/// One publisher's AMQP client: one connection at a time, shared by its publishes.
pub struct Publisher {
    uris: Arc<Vec<String>>,
    rec: Arc<Recorder>,
    link: Mutex<Link>,
}

impl Publisher {
    /// The open channel, connecting (to the next node) if there is none.
    async fn channel(&self) -> Result<(u64, Channel), String> {
        let mut link = self.link.lock().await;
        if let Some(open) = &link.open {
            if open.channel.status().connected() {
                return Ok((link.generation, open.channel.clone()));
            }
            // Failed under us (lapin saw the socket close or a heartbeat go missing).
            let generation = link.generation;
            drop(link);
            self.broken(generation).await;
            link = self.link.lock().await;
        }
        if Instant::now() < link.retry_at {
            return Err("NO CONNECTION".into());
        }
        let uri = &self.uris[link.node % self.uris.len()];
        let opened = match timeout(CONNECT_TIMEOUT, connect(uri)).await {
            Ok(Ok((conn, channel))) => {
                match timeout(
                    RPC_TIMEOUT,
                    channel.confirm_select(ConfirmSelectOptions::default()),
                )
                .await
                {
                    Ok(Ok(())) => Ok(Open { conn, channel }),
                    Ok(Err(e)) => Err(format!("confirm.select {}", kind(&e))),
                    Err(_) => Err("confirm.select TIMEOUT".into()),
                }
            }
            Ok(Err(e)) => Err(format!("connect {e}")),
            Err(_) => Err("connect TIMEOUT".into()),
        };
        match opened {
            Ok(open) => {
                if link.generation > 0 {
                    self.rec.error(|h| &mut h.reconnects, "publisher".into());
                }
                link.generation += 1;
                let channel = open.channel.clone();
                link.open = Some(open);
                Ok((link.generation, channel))
            }
            Err(e) => {
                link.node += 1;
                link.retry_at = Instant::now() + CONNECT_BACKOFF;
                Err(e)
            }
        }
    }

    /// The connection of `generation` failed: closed, and the next one goes to the next node.
    async fn broken(&self, generation: u64) {
        let mut link = self.link.lock().await;
        if link.generation == generation
            && let Some(open) = link.open.take()
        {
            link.node += 1;
            close_later(open.conn);
        }
    }
}

impl Sender for Publisher {
    /// basic.publish on the current channel and its confirm. A nack is retried on the same
    /// connection; an error or a missing confirm gives the connection up (its other unconfirmed
    /// publishes fail with it and are republished on the next one).
    async fn send(&self, m: &Outgoing, _attempt: u32) -> Outcome {
        let (generation, channel) = match self.channel().await {
            Ok(c) => c,
            Err(why) => return Outcome::Unsent(why),
        };
        let properties = BasicProperties::default()
            .with_message_id(m.id.as_str().into())
            .with_delivery_mode(2);
        let confirm = async {
            channel
                .basic_publish(
                    "".into(),
                    m.queue.into(),
                    BasicPublishOptions::default(),
                    &m.body,
                    properties,
                )
                .await?
                .await
        };
        let failed = match timeout(CONFIRM_TIMEOUT, confirm).await {
            Ok(Ok(Confirmation::Ack(_))) => return Outcome::Confirmed,
            Ok(Ok(Confirmation::Nack(_))) => return Outcome::Failed("NACK".into()),
            Ok(Ok(Confirmation::NotRequested)) => "NOT CONFIRMING".to_string(),
            Ok(Err(e)) => kind(&e),
            Err(_) => "TIMEOUT".to_string(),
        };
        self.broken(generation).await;
        Outcome::Failed(failed)
    }
}

impl Subscriber for Amqp {
    type Sub = Consume;

    /// A new connection to node `node`, a channel with basic.qos and basic.consume.
    async fn subscribe(&self, node: usize, queue: &'static str) -> Result<Consume, String> {
        let (conn, channel) = connect(&self.uris[node % self.uris.len()])
            .await
            .map_err(|e| format!("connect {e}"))?;
        let consume = async {
            channel
                .basic_qos(PREFETCH as u16, BasicQosOptions::default())
                .await?;
            channel
                .basic_consume(
                    queue.into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
        };
        match consume.await {
            Ok(consumer) => Ok(Consume { conn, consumer }),
            Err(e) => {
                close_later(conn);
                Err(kind(&e))
            }
        }
    }
}

/// One consumer's connection and its basic.consume.
pub struct Consume {
    conn: Connection,
    consumer: lapin::Consumer,
}

fn text(v: Option<&AMQPValue>) -> String {
    match v {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        Some(AMQPValue::ShortString(s)) => s.as_str().to_string(),
        _ => String::new(),
    }
}

/// The `x-death` entries of a delivery, most recent first (empty when absent or malformed).
fn deaths(properties: &BasicProperties) -> Vec<Death> {
    let Some(headers) = properties.headers() else {
        return Vec::new();
    };
    let Some(AMQPValue::FieldArray(list)) = headers.inner().get("x-death") else {
        return Vec::new();
    };
    list.as_slice()
        .iter()
        .filter_map(|v| match v {
            AMQPValue::FieldTable(t) => Some(t.inner()),
            _ => None,
        })
        .map(|t| Death {
            queue: text(t.get("queue")),
            reason: text(t.get("reason")),
            count: match t.get("count") {
                Some(AMQPValue::LongLongInt(n)) => *n,
                _ => 0,
            },
        })
        .collect()
}

impl Subscription for Consume {
    type Tag = Acker;

    async fn next(&mut self) -> Result<Option<(Seen, Acker)>, String> {
        match self.consumer.next().await {
            None => Ok(None),
            Some(Err(e)) => Err(kind(&e)),
            Some(Ok(d)) => {
                let seen = Seen {
                    id: d
                        .properties
                        .message_id()
                        .as_ref()
                        .map(|s| s.as_str().to_string())
                        .unwrap_or_default(),
                    redelivered: d.redelivered,
                    deaths: deaths(&d.properties),
                };
                Ok(Some((seen, d.acker)))
            }
        }
    }

    async fn settle(&mut self, acker: Acker, action: Action) -> Result<(), String> {
        match action {
            Action::Ack => acker.ack(BasicAckOptions::default()).await,
            Action::Reject => acker.reject(BasicRejectOptions { requeue: false }).await,
            // A failed delivery, which the delivery limit counts (a nack with requeue is a
            // release since RabbitMQ 4.3, which it does not).
            Action::Requeue => acker.reject(BasicRejectOptions { requeue: true }).await,
        }
        .map(|_| ())
        .map_err(|e| kind(&e))
    }

    async fn close(self) {
        let _ = timeout(CLOSE_TIMEOUT, self.conn.close(200, "bye".into())).await;
    }
}
