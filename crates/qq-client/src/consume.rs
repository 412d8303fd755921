//! Consuming: [`Client::consume`] opens the `Consume` stream, and [`Consumer`] yields its
//! deliveries and settles them.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use qq_proto::v1::{self, Delivery, SettleOutcome, Subscribe, consume_request, consume_response};

use crate::connection::{Client, REQUEST_CHANNEL_CAPACITY};
use crate::error::{Error, Result};

impl Client {
    /// Subscribes to `queue` with `prefetch` (manual acknowledgement).
    pub async fn consume(&self, queue: &str, prefetch: u32) -> Result<Consumer> {
        self.consume_with(Subscribe {
            queue: queue.into(),
            prefetch_count: prefetch,
            ..Default::default()
        })
        .await
    }

    /// Subscribes from a full `Subscribe` (auto-ack, consumer tag, arguments).
    pub async fn consume_with(&self, mut subscribe: Subscribe) -> Result<Consumer> {
        self.fill_vhost(&mut subscribe.vhost);
        let (tx, rx) = mpsc::channel(REQUEST_CHANNEL_CAPACITY);
        tx.send(v1::ConsumeRequest {
            request: Some(consume_request::Request::Subscribe(subscribe)),
        })
        .await
        .map_err(|_| Error::Closed("consume request channel"))?;
        let mut responses = self
            .raw()
            .consume(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let first = responses
            .message()
            .await?
            .ok_or_else(|| Error::Protocol("consume stream ended before subscribed".into()))?;
        let consumer_tag = match first.response {
            Some(consume_response::Response::Subscribed(s)) => s.consumer_tag,
            Some(consume_response::Response::Cancelled(c)) => {
                return Err(Error::Protocol(format!(
                    "cancelled at subscribe: {}",
                    c.reason
                )));
            }
            other => {
                return Err(Error::Protocol(format!(
                    "expected subscribed first, got {other:?}"
                )));
            }
        };
        Ok(Consumer {
            tx: Some(tx),
            responses,
            consumer_tag,
            cancel_reason: None,
        })
    }
}

/// A subscription on a queue (`Consume` stream).
pub struct Consumer {
    tx: Option<mpsc::Sender<v1::ConsumeRequest>>,
    responses: Streaming<v1::ConsumeResponse>,
    consumer_tag: String,
    cancel_reason: Option<String>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("consumer_tag", &self.consumer_tag)
            .field("cancel_reason", &self.cancel_reason)
            .finish()
    }
}

impl Consumer {
    /// The tag the server confirmed in `subscribed`.
    pub fn consumer_tag(&self) -> &str {
        &self.consumer_tag
    }

    /// Why the server cancelled the subscription (e.g. the queue was deleted), once it has.
    pub fn cancel_reason(&self) -> Option<&str> {
        self.cancel_reason.as_deref()
    }

    /// The next delivery; `None` when the stream ended (cancelled by either side).
    pub async fn next(&mut self) -> Option<Result<Delivery>> {
        loop {
            match self.responses.message().await {
                Ok(Some(r)) => match r.response {
                    Some(consume_response::Response::Delivery(d)) => return Some(Ok(d)),
                    Some(consume_response::Response::Cancelled(c)) => {
                        self.cancel_reason = Some(c.reason);
                        return None;
                    }
                    Some(consume_response::Response::Subscribed(_)) | None => continue,
                },
                Ok(None) => return None,
                Err(status) => return Some(Err(Error::Status(status))),
            }
        }
    }

    /// Like [`Consumer::next`] but gives up after `timeout` (`Ok(None)` then, or when the
    /// stream ended).
    pub async fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Delivery>> {
        match tokio::time::timeout(timeout, self.next()).await {
            Ok(Some(r)) => r.map(Some),
            Ok(None) | Err(_) => Ok(None),
        }
    }

    /// Acknowledges `tag` (with `multiple`, every unsettled tag up to and including it).
    pub async fn ack(&self, tag: u64, multiple: bool) -> Result<()> {
        self.settle(vec![tag], multiple, SettleOutcome::Ack).await
    }

    /// Negative acknowledgement: `requeue` returns the message to the queue (redelivered,
    /// `x-delivery-count` + 1), otherwise it is rejected (dead-lettered with reason `rejected`).
    pub async fn nack(&self, tag: u64, multiple: bool, requeue: bool) -> Result<()> {
        let outcome = if requeue {
            SettleOutcome::Requeue
        } else {
            SettleOutcome::Reject
        };
        self.settle(vec![tag], multiple, outcome).await
    }

    /// Rejects one delivery without requeueing it.
    pub async fn reject(&self, tag: u64) -> Result<()> {
        self.nack(tag, false, false).await
    }

    /// Settles several tags with one outcome.
    pub async fn settle(
        &self,
        delivery_tags: Vec<u64>,
        multiple: bool,
        outcome: SettleOutcome,
    ) -> Result<()> {
        self.settle_with(delivery_tags, multiple, outcome, None, None)
            .await
    }

    /// Rejects one delivery (dead-lettered with reason `rejected`) and says why: `detail`
    /// (at most 1 024 bytes) becomes the `x-death` entry's `reason-detail` and the dead
    /// letter's `x-last-death-detail` header.
    pub async fn reject_with_reason(&self, tag: u64, detail: &str) -> Result<()> {
        self.settle_with(
            vec![tag],
            false,
            SettleOutcome::Reject,
            Some(detail.into()),
            None,
        )
        .await
    }

    /// Requeues one delivery, not to be delivered again before `delay_ms` (at most 7 days;
    /// 0: at once, whatever the queue's `x-requeue-delays`).
    pub async fn requeue_after(&self, tag: u64, delay_ms: u64) -> Result<()> {
        self.settle_with(
            vec![tag],
            false,
            SettleOutcome::Requeue,
            None,
            Some(delay_ms),
        )
        .await
    }

    /// [`Consumer::settle`] with the options of [`Client::settle_with`]. A bad option ends
    /// the stream with INVALID_ARGUMENT.
    pub async fn settle_with(
        &self,
        delivery_tags: Vec<u64>,
        multiple: bool,
        outcome: SettleOutcome,
        reason_detail: Option<String>,
        delay_ms: Option<u64>,
    ) -> Result<()> {
        let req = v1::ConsumeRequest {
            request: Some(consume_request::Request::Settle(v1::ConsumeSettle {
                delivery_tags,
                multiple,
                outcome: outcome as i32,
                reason_detail,
                delay_ms,
            })),
        };
        self.send(req).await
    }

    /// Asks the server to cancel the subscription; unsettled deliveries return to the queue.
    /// Keep calling [`Consumer::next`] to drain until it returns `None`.
    pub async fn cancel(&self) -> Result<()> {
        let req = v1::ConsumeRequest {
            request: Some(consume_request::Request::Cancel(v1::Cancel {})),
        };
        self.send(req).await
    }

    /// Closes the request half of the stream (as dropping the consumer does).
    pub fn close(&mut self) {
        self.tx = None;
    }

    async fn send(&self, req: v1::ConsumeRequest) -> Result<()> {
        let tx = self.tx.as_ref().ok_or(Error::Closed("consumer closed"))?;
        tx.send(req)
            .await
            .map_err(|_| Error::Closed("consume stream"))
    }
}
