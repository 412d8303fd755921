//! Publishing: the unary publish calls on [`Client`], their [`Confirm`], and the pipelined
//! [`Publisher`] over `PublishStream`.

use std::collections::VecDeque;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use qq_proto::v1::{Message, PublishOutcome, PublishRequest, PublishResponse};

use crate::connection::{Client, REQUEST_CHANNEL_CAPACITY};
use crate::error::{Error, Result};

impl Client {
    /// Publishes one message and waits until every routed queue has committed it.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<Confirm> {
        self.publish_with(PublishRequest {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            message: Some(message),
            ..Default::default()
        })
        .await
    }

    /// Publishes with `mandatory` set: an unroutable message comes back as `UNROUTABLE`.
    pub async fn publish_mandatory(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<Confirm> {
        self.publish_with(PublishRequest {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            mandatory: true,
            message: Some(message),
            ..Default::default()
        })
        .await
    }

    /// Publishes a full request (the vhost is filled in when empty).
    pub async fn publish_with(&self, mut req: PublishRequest) -> Result<Confirm> {
        self.fill_vhost(&mut req.vhost);
        let seq = req.seq;
        let resp = self.raw().publish(req).await?.into_inner();
        Ok(Confirm::from_response(PublishResponse { seq, ..resp }))
    }

    /// Opens a `PublishStream` with at most `window` unconfirmed messages in flight.
    pub async fn publisher(&self, window: usize) -> Result<Publisher> {
        let window = window.max(1);
        let (tx, rx) = mpsc::channel(REQUEST_CHANNEL_CAPACITY.min(window).max(1));
        // The call is opened lazily, on the first confirm we wait for: a server may wait for the
        // first request before answering with response headers, and nothing has been sent yet.
        let mut raw = self.raw();
        let opening: OpeningCall =
            Box::pin(async move { raw.publish_stream(ReceiverStream::new(rx)).await });
        Ok(Publisher {
            vhost: self.vhost.clone(),
            tx,
            responses: Responses::Opening(opening),
            window,
            next_seq: 1,
            in_flight: 0,
            ready: VecDeque::new(),
        })
    }
}

/// The answer to one publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Confirm {
    /// The publisher's sequence number (0 for a unary publish).
    pub seq: u64,
    pub outcome: PublishOutcome,
    /// Why, for `REJECTED` (which queue refused it and why) and `FAILED` (the refusal's message).
    pub detail: String,
    /// For `FAILED`: the status unary `publish` would have answered (e.g. `NotFound` for a
    /// missing exchange); `Ok` otherwise.
    pub code: tonic::Code,
}

impl Confirm {
    fn from_response(r: PublishResponse) -> Confirm {
        Confirm {
            seq: r.seq,
            outcome: r.outcome(),
            code: tonic::Code::from_i32(r.code),
            detail: r.detail,
        }
    }

    /// Every routed queue committed the message.
    pub fn is_confirmed(&self) -> bool {
        self.outcome == PublishOutcome::Confirmed
    }
}

/// A pipelined publisher over `PublishStream`.
///
/// [`Publisher::send`] numbers the message and sends it at once unless `window` messages are
/// unconfirmed; then it first waits for a confirm. Confirms that arrive meanwhile are kept and
/// returned by [`Publisher::take_confirms`], [`Publisher::next_confirm`] or
/// [`Publisher::flush`]. Sequence numbers start at 1.
pub struct Publisher {
    vhost: String,
    tx: mpsc::Sender<PublishRequest>,
    responses: Responses,
    window: usize,
    next_seq: u64,
    in_flight: usize,
    ready: VecDeque<Confirm>,
}

type OpeningCall = futures::future::BoxFuture<
    'static,
    Result<tonic::Response<Streaming<PublishResponse>>, tonic::Status>,
>;

/// The response half of a `PublishStream` call: opening until the server answers.
enum Responses {
    Opening(OpeningCall),
    Open(Box<Streaming<PublishResponse>>),
}

impl Publisher {
    /// The response stream, opening the call first if needed.
    async fn responses(&mut self) -> Result<&mut Streaming<PublishResponse>> {
        if let Responses::Opening(call) = &mut self.responses {
            let stream = call.await?.into_inner();
            self.responses = Responses::Open(Box::new(stream));
        }
        match &mut self.responses {
            Responses::Open(stream) => Ok(stream),
            Responses::Opening(_) => unreachable!("the call was just opened"),
        }
    }

    /// Sends one message; returns its `seq`.
    pub async fn send(
        &mut self,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<u64> {
        self.send_request(PublishRequest {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            message: Some(message),
            ..Default::default()
        })
        .await
    }

    /// Sends a full request; its `seq` is replaced by the publisher's next one, returned.
    pub async fn send_request(&mut self, mut req: PublishRequest) -> Result<u64> {
        while self.in_flight >= self.window {
            self.receive_one().await?;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        req.seq = seq;
        if req.vhost.is_empty() {
            req.vhost.clone_from(&self.vhost);
        }
        if self.tx.send(req).await.is_err() {
            // The call ended; its status says why.
            return Err(self.ended_error().await);
        }
        self.in_flight += 1;
        Ok(seq)
    }

    /// Number of sent, unconfirmed messages.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Confirms received so far and not yet taken, without waiting.
    pub fn take_confirms(&mut self) -> Vec<Confirm> {
        self.ready.drain(..).collect()
    }

    /// The next confirm, waiting for one if none is kept; `None` when nothing is in flight.
    pub async fn next_confirm(&mut self) -> Result<Option<Confirm>> {
        if self.ready.is_empty() && self.in_flight > 0 {
            self.receive_one().await?;
        }
        Ok(self.ready.pop_front())
    }

    /// Waits until every sent message is confirmed; returns all confirms not yet taken.
    pub async fn flush(&mut self) -> Result<Vec<Confirm>> {
        while self.in_flight > 0 {
            self.receive_one().await?;
        }
        Ok(self.take_confirms())
    }

    /// Flushes, then closes the request stream and waits for the server to end the call.
    pub async fn close(mut self) -> Result<Vec<Confirm>> {
        let confirms = self.flush().await?;
        let Publisher { tx, responses, .. } = self;
        drop(tx);
        // Still opening after a flush means nothing was ever sent: there is no call to end.
        if let Responses::Open(mut stream) = responses {
            while stream.message().await?.is_some() {}
        }
        Ok(confirms)
    }

    async fn receive_one(&mut self) -> Result<()> {
        match self.responses().await?.message().await? {
            Some(r) => {
                self.in_flight = self.in_flight.saturating_sub(1);
                self.ready.push_back(Confirm::from_response(r));
                Ok(())
            }
            None => Err(Error::Protocol(format!(
                "publish stream ended with {} messages unconfirmed",
                self.in_flight
            ))),
        }
    }

    async fn ended_error(&mut self) -> Error {
        loop {
            let responses = match self.responses().await {
                Ok(r) => r,
                Err(e) => return e,
            };
            match responses.message().await {
                Ok(Some(r)) => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.ready.push_back(Confirm::from_response(r));
                }
                Ok(None) => return Error::Closed("publish stream"),
                Err(status) => return Error::Status(status),
            }
        }
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("window", &self.window)
            .field("next_seq", &self.next_seq)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}
