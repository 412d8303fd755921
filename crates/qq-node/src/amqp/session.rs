//! What a connection's methods work with once it is open: the [`Session`] (caller, vhost,
//! negotiated frame_max, the client's capabilities) and its [`Outbox`] to the socket, and
//! [`request`], which makes a gRPC handler's request as the connection's caller. Imports
//! nothing else of `amqp` but [`super::frames`].

use std::sync::Arc;

use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::AMQPClass;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Request;

use super::Ctx;
use super::frames::encode;
use crate::api::auth::{Authenticated, Caller};

/// Frame groups (a method, or a delivery's method, header and body) waiting for the socket,
/// at most; full, senders wait (consumers stop taking deliveries, the read loop stops).
pub const OUTBOX_BOUND: usize = 256;
/// What goes to the socket.
pub enum Out {
    Bytes(Vec<u8>),
    /// Flush and close the socket.
    End,
}

/// The sending side of a connection's socket. Cheap to clone.
#[derive(Clone)]
pub struct Outbox(pub(super) mpsc::Sender<Out>);

impl Outbox {
    /// Queue whole frames; false when the connection is gone.
    pub async fn bytes(&self, bytes: Vec<u8>) -> bool {
        self.0.send(Out::Bytes(bytes)).await.is_ok()
    }

    pub async fn frame(&self, frame: AMQPFrame) -> bool {
        let mut bytes = Vec::new();
        encode(&frame, &mut bytes);
        self.bytes(bytes).await
    }

    pub async fn method(&self, channel: u16, method: AMQPClass) -> bool {
        self.frame(AMQPFrame::Method(channel, method)).await
    }
}

/// What the client said it understands (start-ok's `capabilities`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientCaps {
    pub consumer_cancel_notify: bool,
    pub connection_blocked: bool,
    pub authentication_failure_close: bool,
}

/// A connection after open-ok: who, where, and how to reach the socket.
pub struct Session {
    pub ctx: Arc<Ctx>,
    pub caller: Caller,
    pub vhost: String,
    pub out: Outbox,
    pub frame_max: u32,
    pub caps: ClientCaps,
    /// Cancelled when the connection ends: its consumers stop.
    pub done: CancellationToken,
}

/// A request of the gRPC API, made by the connection's caller.
pub fn request<T>(session: &Session, message: T) -> Request<T> {
    let mut r = Request::new(message);
    r.extensions_mut()
        .insert(Authenticated(session.caller.clone()));
    r
}
