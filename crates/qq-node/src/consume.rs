//! Consumer sessions. A session always runs on the queue's leader, where the state machine's
//! deliveries are carried out; a client attached to another node is relayed over the internal
//! service. When the leader changes, the session ends with UNAVAILABLE and the new leader
//! returns the consumer's unacked messages to the queue (they count as failed deliveries).

use std::collections::BTreeMap;
use std::sync::Arc;

use qq_core::queue::{Command, SettleOutcome};
use qq_core::{ConsumerId, Message, MessageId, Value};
use qq_raft::GroupId;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tonic::Code;
use tracing::debug;

use crate::node::{Node, now_ms};
use crate::queue_sm::{ConsumerEvent, QueueRequest};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubscribeArgs {
    pub group: GroupId,
    pub consumer_tag: String,
    pub prefetch: u32,
    pub auto_ack: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum SessionIn {
    Subscribe(SubscribeArgs),
    Settle {
        tags: Vec<u64>,
        multiple: bool,
        outcome: SettleOutcome,
    },
    Cancel,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum SessionOut {
    Subscribed {
        consumer_tag: String,
    },
    Delivery {
        tag: u64,
        redelivered: bool,
        message: Message,
    },
    Cancelled {
        reason: String,
    },
    /// The session ended with this gRPC status code and message.
    Error {
        code: i32,
        message: String,
    },
}

fn error(code: Code, message: impl Into<String>) -> SessionOut {
    SessionOut::Error {
        code: code as i32,
        message: message.into(),
    }
}

/// Run a consumer session on this node, which must lead the queue.
pub async fn run_session(
    node: Arc<Node>,
    args: SubscribeArgs,
    mut input: mpsc::Receiver<SessionIn>,
    out: mpsc::Sender<SessionOut>,
) {
    let group = args.group;
    let Some(g) = node
        .queue_group(group)
        .filter(|_| node.is_queue_leader(group))
    else {
        let _ = out
            .send(error(
                Code::Unavailable,
                "this node does not lead the queue any more; retry",
            ))
            .await;
        return;
    };
    let consumer: ConsumerId = node.next_consumer_id();
    let (tx, mut events) = mpsc::unbounded_channel();
    g.shared.consumers.lock().unwrap().insert(consumer, tx);
    let checkout = Command::Checkout {
        now_ms: now_ms(),
        consumer,
        node: node.id,
        prefetch: args.prefetch,
    };
    if let Err(status) = node
        .propose_queue(
            group,
            QueueRequest {
                cmd: checkout,
                message: None,
            },
        )
        .await
    {
        g.shared.consumers.lock().unwrap().remove(&consumer);
        let _ = out.send(error(status.code(), status.message())).await;
        return;
    }
    if out
        .send(SessionOut::Subscribed {
            consumer_tag: args.consumer_tag.clone(),
        })
        .await
        .is_err()
    {
        finish(&node, group, consumer, None).await;
        return;
    }

    // Settles go to the log in order, without holding up deliveries.
    let (settle_tx, mut settle_rx) = mpsc::unbounded_channel::<(Vec<MessageId>, SettleOutcome)>();
    let settler = {
        let node = node.clone();
        tokio::spawn(async move {
            while let Some((mut ids, outcome)) = settle_rx.recv().await {
                // Merge queued settles of the same outcome into one command.
                while let Ok((more, o)) = settle_rx.try_recv() {
                    if o == outcome {
                        ids.extend(more);
                    } else {
                        propose_settle(&node, group, consumer, std::mem::take(&mut ids), outcome)
                            .await;
                        ids = more;
                        propose_settle(&node, group, consumer, std::mem::take(&mut ids), o).await;
                        break;
                    }
                }
                if !ids.is_empty() {
                    propose_settle(&node, group, consumer, ids, outcome).await;
                }
            }
        })
    };

    let mut next_tag: u64 = 1;
    let mut unsettled: BTreeMap<u64, MessageId> = BTreeMap::new();
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Some(ConsumerEvent::Deliver { delivery, mut message }) => {
                    let tag = next_tag;
                    next_tag += 1;
                    if delivery.delivery_count > 0 {
                        message.properties.headers.insert("x-delivery-count".into(), Value::Long(delivery.delivery_count as i64));
                    }
                    if args.auto_ack {
                        let _ = settle_tx.send((vec![delivery.id], SettleOutcome::Ack));
                    } else {
                        unsettled.insert(tag, delivery.id);
                    }
                    if out.send(SessionOut::Delivery { tag, redelivered: delivery.redelivered, message }).await.is_err() {
                        break;
                    }
                }
                Some(ConsumerEvent::Cancelled { reason, unavailable }) => {
                    let msg = if unavailable { error(Code::Unavailable, reason) } else { SessionOut::Cancelled { reason } };
                    let _ = out.send(msg).await;
                    break;
                }
                None => break,
            },
            request = input.recv() => match request {
                Some(SessionIn::Settle { tags, multiple, outcome }) => {
                    let mut ids = Vec::new();
                    for tag in tags {
                        if multiple {
                            let upto: Vec<u64> = unsettled.range(..=tag).map(|(t, _)| *t).collect();
                            if upto.is_empty() && !unsettled.contains_key(&tag) {
                                let _ = out.send(error(Code::FailedPrecondition, format!("settle: unknown delivery tag {tag}"))).await;
                                return finish(&node, group, consumer, Some((settle_tx, settler))).await;
                            }
                            for t in upto {
                                ids.push(unsettled.remove(&t).expect("listed"));
                            }
                        } else {
                            match unsettled.remove(&tag) {
                                Some(id) => ids.push(id),
                                None => {
                                    let _ = out.send(error(Code::FailedPrecondition, format!("settle: unknown delivery tag {tag}"))).await;
                                    return finish(&node, group, consumer, Some((settle_tx, settler))).await;
                                }
                            }
                        }
                    }
                    if !ids.is_empty() {
                        let _ = settle_tx.send((ids, outcome));
                    }
                }
                Some(SessionIn::Subscribe(_)) => {
                    let _ = out.send(error(Code::InvalidArgument, "subscribe: already subscribed on this stream")).await;
                    break;
                }
                Some(SessionIn::Cancel) => {
                    let _ = out.send(SessionOut::Cancelled { reason: "cancelled by client".into() }).await;
                    break;
                }
                None => break,
            },
        }
    }
    finish(&node, group, consumer, Some((settle_tx, settler))).await;
}

async fn propose_settle(
    node: &Node,
    group: GroupId,
    consumer: ConsumerId,
    ids: Vec<MessageId>,
    outcome: SettleOutcome,
) {
    let cmd = Command::Settle {
        now_ms: now_ms(),
        consumer,
        ids,
        outcome,
    };
    if let Err(e) = node
        .propose_queue(group, QueueRequest { cmd, message: None })
        .await
    {
        debug!(group, consumer, "settle not applied: {e}");
    }
}

/// Let queued settles reach the log, then return whatever is still unacked.
async fn finish(
    node: &Arc<Node>,
    group: GroupId,
    consumer: ConsumerId,
    settler: Option<(
        mpsc::UnboundedSender<(Vec<MessageId>, SettleOutcome)>,
        tokio::task::JoinHandle<()>,
    )>,
) {
    if let Some((tx, task)) = settler {
        drop(tx);
        let _ = task.await;
    }
    if let Some(g) = node.queue_group(group) {
        g.shared.consumers.lock().unwrap().remove(&consumer);
    }
    node.consumer_down(group, consumer).await;
}
