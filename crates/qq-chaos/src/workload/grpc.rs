//! The workload over the gRPC API (`qq-client`): unary publishes carrying a publisher id and
//! seq, each retry through the next node; consume streams through one node at a time.

use std::sync::Arc;

use qq_client::{
    Client, Consumer, Delivery, MessageBuilder, PublishRequest, ValueExt, code_name,
    delivery_headers,
};
use tokio::time::timeout;

use super::{
    Action, Death, Outcome, Outgoing, PREFETCH, RPC_TIMEOUT, Recorder, Seen, Sender, Subscriber,
    Subscription,
};

/// One client per node, connected lazily (a node that is down now may be up later).
pub fn clients(addresses: &[String]) -> anyhow::Result<Arc<Vec<Client>>> {
    let clients = addresses
        .iter()
        .map(|a| Client::connect_lazy(a))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(clients))
}

/// Publisher `p`'s side of the clients: every node, tried in turn from node `p`.
pub struct Publisher {
    clients: Arc<Vec<Client>>,
    /// `chaos-p<p>-<run>`: random per run, so two runs never share one.
    publisher_id: String,
}

impl Publisher {
    pub fn new(clients: Arc<Vec<Client>>, p: usize, rec: &Recorder) -> Publisher {
        Publisher {
            clients,
            publisher_id: format!("chaos-p{p}-{}", rec.run_id()),
        }
    }
}

fn retryable(code: tonic::Code) -> bool {
    use tonic::Code::*;
    !matches!(
        code,
        InvalidArgument | NotFound | PermissionDenied | FailedPrecondition | ResourceExhausted
    )
}

impl Sender for Publisher {
    /// A unary publish through node `p + attempt - 1`, with the same publisher id and seq on
    /// every attempt: the queue stores it once however many attempts reach it, which the
    /// checker verifies.
    async fn send(&self, m: &Outgoing, attempt: u32) -> Outcome {
        let client = &self.clients[(m.p + attempt as usize - 1) % self.clients.len()];
        let message = MessageBuilder::new(m.body.clone())
            .message_id(m.id.clone())
            .build();
        let req = PublishRequest {
            exchange: String::new(),
            routing_key: m.queue.to_string(),
            message: Some(message),
            publisher_id: self.publisher_id.clone(),
            publisher_seq: m.seq,
            ..Default::default()
        };
        match timeout(RPC_TIMEOUT, client.publish_with(req)).await {
            Ok(Ok(confirm)) if confirm.is_confirmed() => Outcome::Confirmed,
            Ok(Ok(confirm)) => Outcome::Refused {
                code: format!("{:?}", confirm.outcome),
                detail: format!("{:?}: {}", confirm.outcome, confirm.detail),
            },
            Ok(Err(e)) if !retryable(e.code()) => Outcome::Refused {
                code: code_name(e.code()).to_string(),
                detail: e.to_string(),
            },
            Ok(Err(e)) => Outcome::Failed(code_name(e.code()).to_string()),
            Err(_) => Outcome::Failed("TIMEOUT".into()),
        }
    }
}

pub fn message_id(d: &Delivery) -> String {
    d.message
        .as_ref()
        .and_then(|m| m.properties.as_ref())
        .map(|p| p.message_id.clone())
        .unwrap_or_default()
}

/// The `x-death` entries of a delivery, most recent first (empty when absent or malformed).
pub fn deaths(d: &Delivery) -> Vec<Death> {
    let headers = delivery_headers(d);
    let Some(list) = headers.get("x-death").and_then(|v| v.as_list()) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|v| v.as_table())
        .map(|t| Death {
            queue: t
                .get("queue")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string(),
            reason: t
                .get("reason")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string(),
            count: t.get("count").and_then(|v| v.as_long()).unwrap_or(0),
        })
        .collect()
}

impl Subscriber for Vec<Client> {
    type Sub = Consumer;

    async fn subscribe(&self, node: usize, queue: &'static str) -> Result<Consumer, String> {
        self[node % self.len()]
            .consume(queue, PREFETCH)
            .await
            .map_err(|e| code_name(e.code()).to_string())
    }
}

impl Subscription for Consumer {
    type Tag = u64;

    async fn next(&mut self) -> Result<Option<(Seen, u64)>, String> {
        match Consumer::next(self).await {
            None => Ok(None),
            Some(Err(e)) => Err(code_name(e.code()).to_string()),
            Some(Ok(d)) => {
                let seen = Seen {
                    id: message_id(&d),
                    redelivered: d.redelivered,
                    deaths: deaths(&d),
                };
                Ok(Some((seen, d.delivery_tag)))
            }
        }
    }

    async fn settle(&mut self, tag: u64, action: Action) -> Result<(), String> {
        match action {
            Action::Ack => self.ack(tag, false).await,
            Action::Reject => self.reject(tag).await,
            Action::Requeue => self.nack(tag, false, true).await,
        }
        .map_err(|e| code_name(e.code()).to_string())
    }

    /// Dropping the consumer closes the stream.
    async fn close(self) {}
}
