//! A connection's channels: open and close, content assembly (a publish's method, header and
//! body frames), and the dispatch of each method to [`super::topology`],
//! [`super::publisher`] or [`super::consumer`].
//!
//! A soft error (403, 404, 405, 406) closes its channel with channel.close; after that the
//! channel ignores everything but close and close-ok, as the specification says. A hard error
//! is returned to [`super::connection`], which closes the connection.

use std::collections::HashMap;
use std::sync::Arc;

use amq_protocol::frame::{AMQPContentHeader, AMQPFrame};
use amq_protocol::protocol::{AMQPClass, access, basic, channel as chan, confirm};

use super::codes::{
    AmqpError, CHANNEL_ERROR, COMMAND_INVALID, ConnError, NOT_ALLOWED, NOT_IMPLEMENTED,
    PRECONDITION_FAILED, UNEXPECTED_FRAME, is_hard,
};
use super::consumer;
use super::convert::short;
use super::deliveries::{self, Consuming};
use super::publisher::{self, Content, Publishing};
use super::session::Session;
use super::topology;

/// One open channel's state, owned by the connection's read loop.
pub struct Channel {
    /// channel.close was sent; waiting for close-ok.
    closing: bool,
    content: Option<Content>,
    publishing: Publishing,
    /// Shared with the channel's consumer tasks.
    consuming: Consuming,
}

impl Channel {
    fn new(id: u16, session: &Session) -> Channel {
        Channel {
            closing: false,
            content: None,
            publishing: Publishing::new(id),
            consuming: Consuming::new(id, session.done.child_token()),
        }
    }
}

/// The channels of one connection.
pub struct Channels {
    session: Arc<Session>,
    open: HashMap<u16, Channel>,
}

impl Channels {
    pub fn new(session: Arc<Session>) -> Channels {
        Channels {
            session,
            open: HashMap::new(),
        }
    }

    /// One frame of a channel other than 0 (or an unexpected one on 0). `refusal`: the error
    /// a method gets instead of running ([`super::frames::ReadError::Refused`]), once the
    /// channel's state would let it run.
    pub async fn handle(
        &mut self,
        frame: AMQPFrame,
        refusal: Option<AmqpError>,
    ) -> Result<(), ConnError> {
        let id = frame.channel_id();
        if id == 0 {
            let (code, class_method) = match &frame {
                AMQPFrame::Method(_, m) => (
                    CHANNEL_ERROR,
                    (m.get_amqp_class_id(), m.get_amqp_method_id()),
                ),
                _ => (COMMAND_INVALID, (0, 0)),
            };
            return Err(ConnError {
                code,
                text: format!("unexpected frame on channel 0: {frame}"),
                class_method,
            });
        }
        if let AMQPFrame::Method(_, AMQPClass::Channel(chan::AMQPMethod::Open(_))) = frame {
            return self.open_channel(id).await;
        }
        let Some(channel) = self.open.get_mut(&id) else {
            let class_method = match &frame {
                AMQPFrame::Method(_, m) => (m.get_amqp_class_id(), m.get_amqp_method_id()),
                _ => (0, 0),
            };
            return Err(ConnError {
                code: CHANNEL_ERROR,
                text: format!("expected 'channel.open' on channel {id}"),
                class_method,
            });
        };
        if channel.closing {
            match frame {
                AMQPFrame::Method(_, AMQPClass::Channel(chan::AMQPMethod::CloseOk(_))) => {
                    self.open.remove(&id);
                }
                AMQPFrame::Method(_, AMQPClass::Channel(chan::AMQPMethod::Close(_))) => {
                    self.open.remove(&id);
                    self.session.out.method(id, close_ok()).await;
                }
                _ => {}
            }
            return Ok(());
        }
        let (class_method, result) = match frame {
            AMQPFrame::Method(_, method) => {
                let cm = (method.get_amqp_class_id(), method.get_amqp_method_id());
                (cm, self.method(id, method, refusal).await)
            }
            AMQPFrame::Header(_, header) => ((60, 40), self.header(id, header).await),
            AMQPFrame::Body(_, body) => ((60, 40), self.body(id, body).await),
            AMQPFrame::Heartbeat | AMQPFrame::InvalidHeartbeat(_) => {
                return Err(ConnError::new(
                    UNEXPECTED_FRAME,
                    format!("heartbeat frame on channel {id}"),
                ));
            }
            AMQPFrame::ProtocolHeader(_) => {
                return Err(ConnError::new(
                    UNEXPECTED_FRAME,
                    "protocol header mid-stream",
                ));
            }
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) if is_hard(e.code) => Err(ConnError {
                code: e.code,
                text: e.reply_text(),
                class_method,
            }),
            Err(e) => {
                self.close_channel(id, e, class_method).await;
                Ok(())
            }
        }
    }

    async fn open_channel(&mut self, id: u16) -> Result<(), ConnError> {
        if self.open.contains_key(&id) {
            return Err(ConnError::new(
                CHANNEL_ERROR,
                format!("second 'channel.open' seen on channel {id}"),
            ));
        }
        if id > self.session.ctx.channel_max {
            return Err(ConnError::new(
                NOT_ALLOWED,
                format!(
                    "channel id {id} is above the negotiated channel_max {}",
                    self.session.ctx.channel_max
                ),
            ));
        }
        self.open.insert(id, Channel::new(id, &self.session));
        let ok = AMQPClass::Channel(chan::AMQPMethod::OpenOk(chan::OpenOk {}));
        self.session.out.method(id, ok).await;
        Ok(())
    }

    /// Send channel.close for a soft error; the channel's consumers end now.
    async fn close_channel(&mut self, id: u16, e: AmqpError, (class_id, method_id): (u16, u16)) {
        let Some(channel) = self.open.get_mut(&id) else {
            return;
        };
        channel.closing = true;
        channel.content = None;
        teardown(&self.session, channel).await;
        let close = chan::Close {
            reply_code: e.code,
            reply_text: short(&e.reply_text()),
            class_id,
            method_id,
        };
        self.session
            .out
            .method(id, AMQPClass::Channel(chan::AMQPMethod::Close(close)))
            .await;
    }

    /// The connection ends: every channel's consumers end (their unacked deliveries return to
    /// their queues) and pending publishes are dropped unconfirmed.
    pub async fn close_all(&mut self) {
        for (_, mut channel) in self.open.drain() {
            teardown(&self.session, &mut channel).await;
        }
    }

    async fn method(
        &mut self,
        id: u16,
        method: AMQPClass,
        refusal: Option<AmqpError>,
    ) -> Result<(), AmqpError> {
        let session = self.session.clone();
        if let AMQPClass::Channel(chan::AMQPMethod::Close(_)) = method {
            if let Some(mut channel) = self.open.remove(&id) {
                teardown(&self.session, &mut channel).await;
            }
            session.out.method(id, close_ok()).await;
            return Ok(());
        }
        let channel = self.open.get_mut(&id).expect("checked by handle");
        if channel.content.is_some() {
            return Err(AmqpError::new(
                UNEXPECTED_FRAME,
                "expected content header for class 60, got non content header frame instead",
            ));
        }
        if let Some(e) = refusal {
            return Err(e);
        }
        let reply = match method {
            AMQPClass::Channel(chan::AMQPMethod::CloseOk(_)) => None,
            AMQPClass::Channel(chan::AMQPMethod::Flow(f)) if f.active => {
                Some(AMQPClass::Channel(chan::AMQPMethod::FlowOk(chan::FlowOk {
                    active: true,
                })))
            }
            AMQPClass::Channel(chan::AMQPMethod::Flow(_)) => {
                return Err(AmqpError::new(NOT_IMPLEMENTED, "active=false"));
            }
            AMQPClass::Access(access::AMQPMethod::Request(_)) => Some(AMQPClass::Access(
                access::AMQPMethod::RequestOk(access::RequestOk {}),
            )),
            AMQPClass::Exchange(m) => topology::exchange(&session, m).await?,
            AMQPClass::Queue(m) => topology::queue(&session, m).await?,
            AMQPClass::Confirm(confirm::AMQPMethod::Select(s)) => {
                channel.publishing.confirm = true;
                (!s.nowait).then_some(AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(
                    confirm::SelectOk {},
                )))
            }
            AMQPClass::Tx(_) => {
                return Err(AmqpError::new(
                    NOT_IMPLEMENTED,
                    "transactions (tx.*) are not supported; use publisher confirms",
                ));
            }
            AMQPClass::Basic(basic::AMQPMethod::Publish(p)) => {
                publisher::check_publish(&session, &p).await?;
                channel.content = Some(Content {
                    publish: p,
                    header: None,
                    body: Vec::new(),
                });
                None
            }
            AMQPClass::Basic(m) => consumer::basic(&session, &mut channel.consuming, m).await?,
            other => {
                return Err(AmqpError::new(
                    COMMAND_INVALID,
                    format!(
                        "method {}.{} is not valid here",
                        other.get_amqp_class_id(),
                        other.get_amqp_method_id()
                    ),
                ));
            }
        };
        if let Some(reply) = reply {
            session.out.method(id, reply).await;
        }
        Ok(())
    }

    async fn header(&mut self, id: u16, header: AMQPContentHeader) -> Result<(), AmqpError> {
        let session = self.session.clone();
        let channel = self.open.get_mut(&id).expect("checked by handle");
        let Some(content) = channel.content.as_mut().filter(|c| c.header.is_none()) else {
            return Err(AmqpError::new(
                UNEXPECTED_FRAME,
                "content header frame without a basic.publish before it",
            ));
        };
        if header.class_id != 60 {
            return Err(AmqpError::new(
                UNEXPECTED_FRAME,
                format!("content header of class {}, expected 60", header.class_id),
            ));
        }
        let max = session.ctx.api.node().config().max_message_bytes as u64;
        if header.body_size > max {
            channel.content = None;
            return Err(AmqpError::new(
                PRECONDITION_FAILED,
                format!(
                    "message size {} is larger than configured max size {max}",
                    header.body_size
                ),
            ));
        }
        content.header = Some(header);
        self.complete_if_whole(id).await
    }

    async fn body(&mut self, id: u16, body: Vec<u8>) -> Result<(), AmqpError> {
        let channel = self.open.get_mut(&id).expect("checked by handle");
        let Some(content) = channel.content.as_mut() else {
            return Err(AmqpError::new(
                UNEXPECTED_FRAME,
                "content body frame without a basic.publish before it",
            ));
        };
        let Some(header) = &content.header else {
            return Err(AmqpError::new(
                UNEXPECTED_FRAME,
                "content body frame before its content header",
            ));
        };
        if content.body.len() as u64 + body.len() as u64 > header.body_size {
            return Err(AmqpError::new(
                UNEXPECTED_FRAME,
                format!(
                    "content body longer than the {} bytes its header declared",
                    header.body_size
                ),
            ));
        }
        if content.body.is_empty() && body.len() as u64 == header.body_size {
            // The whole body in one frame (the usual case): kept as it came, not copied.
            content.body = body;
        } else {
            if content.body.is_empty() {
                content.body.reserve(header.body_size as usize);
            }
            content.body.extend_from_slice(&body);
        }
        self.complete_if_whole(id).await
    }

    /// Publish the channel's content once its body is whole.
    async fn complete_if_whole(&mut self, id: u16) -> Result<(), AmqpError> {
        let session = self.session.clone();
        let channel = self.open.get_mut(&id).expect("checked by handle");
        let whole = channel.content.as_ref().is_some_and(|c| {
            c.header
                .as_ref()
                .is_some_and(|h| c.body.len() as u64 == h.body_size)
        });
        if !whole {
            return Ok(());
        }
        let content = channel.content.take().expect("checked above");
        publisher::publish(&session, &mut channel.publishing, content).await
    }
}

fn close_ok() -> AMQPClass {
    AMQPClass::Channel(chan::AMQPMethod::CloseOk(chan::CloseOk {}))
}

/// A channel ends: its consumers stop, its unacked gets return to their queues, and what it
/// published is committed.
async fn teardown(session: &Session, channel: &mut Channel) {
    let gets = channel.consuming.deliveries.end();
    // A delivery that took its tag before the end is queued before what the caller sends next
    // (close-ok or close); later ones see the channel ended (`Consumer::deliver`).
    drop(channel.consuming.deliveries.order.lock().await);
    deliveries::requeue_gets(session, gets).await;
    if let Some(publisher) = channel.publishing.publisher.take() {
        publisher.drain().await;
    }
}
