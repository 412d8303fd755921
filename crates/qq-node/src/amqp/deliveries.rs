//! A channel's delivery tags and what each unacked one stands for; basic.get, ack, nack,
//! reject and recover.
//!
//! A consumer's delivery is settled through its session (by the session's own tag); a
//! basic.get message through gRPC's `Settle`, by its receipt. ack settles ACK; reject with
//! `requeue` settles REQUEUE (counted against `x-delivery-limit`), nack with `requeue` RELEASE
//! (not counted, as RabbitMQ 4.3), either without it REJECT (dead-lettered with reason
//! `rejected`). A tag of a session that ended (the leader moved, or
//! the channel's consumer was cancelled and its session is over) is dropped: that session's
//! deliveries went back to the queue when it ended.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use amq_protocol::protocol::{AMQPClass, basic};
use qq_core::queue::SettleOutcome;
use qq_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::debug;

use super::codes::{AmqpError, PRECONDITION_FAILED, RESOURCE_LOCKED};
use super::convert::{properties_to_amqp, short};
use super::frames::content_frames;
use super::session::{Session, request};
use crate::api::consume as grpc;
use crate::consume::session::SessionIn;

/// An unacked delivery of the channel.
#[derive(Debug, Clone)]
pub(super) enum Unacked {
    /// From consumer number `consumer`'s session number `generation`, its tag there.
    Consumer {
        consumer: u64,
        generation: u64,
        tag: u64,
    },
    /// From basic.get: its receipt.
    Get { receipt: String },
}

/// A consumer's open session: where its settles go.
pub(super) struct Handle {
    pub(super) input: mpsc::Sender<SessionIn>,
    pub(super) generation: u64,
    pub(super) signals: Signals,
}

#[derive(Default)]
pub(super) struct State {
    last_tag: u64,
    pub(super) unacked: BTreeMap<u64, Unacked>,
    /// The channel's consumers by tag: their node-wide numbers. A cancelled consumer leaves
    /// this at once (its tag may be used again) ...
    pub(super) tags: HashMap<String, u64>,
    /// ... and its session stays here, by number, until it has settled what it holds.
    pub(super) sessions: HashMap<u64, Handle>,
}

/// A channel's delivery tags, unacked deliveries and consumers, shared by the read loop and
/// the consumer tasks. `order` is held from taking a tag to queuing the delivery, so tags go
/// out in order; `state` is a short lock, never held across an await.
pub struct Deliveries {
    pub(super) order: tokio::sync::Mutex<()>,
    pub(super) state: Mutex<State>,
    pub(super) done: CancellationToken,
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
        state.tags.clear();
        state.sessions.clear();
        std::mem::take(&mut state.unacked)
            .into_values()
            .filter_map(|u| match u {
                Unacked::Get { receipt } => Some(receipt),
                Unacked::Consumer { .. } => None,
            })
            .collect()
    }

    pub(super) fn next_tag(&self, unacked: Option<Unacked>) -> u64 {
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

/// What basic.cancel and a consumer's task tell each other.
#[derive(Default, Clone)]
pub(super) struct Signals {
    /// Cancelled by basic.cancel: the consumer does not subscribe again.
    pub(super) cancelled: CancellationToken,
    /// Cancelled when no delivery will come any more: the queue cancelled the consumer
    /// ([`SessionOut::Stopped`]) or the task ended.
    pub(super) quiet: CancellationToken,
}

pub(super) fn outcome(requeue: bool) -> SettleOutcome {
    if requeue {
        SettleOutcome::Requeue
    } else {
        SettleOutcome::Reject
    }
}

pub(super) async fn get(
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
    let (mut props, body) = crate::api::convert::delivered_message_from_pb(&message)?;
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
pub(super) async fn settle(
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
pub(super) async fn recover(
    session: &Arc<Session>,
    channel: &mut Consuming,
) -> Result<(), AmqpError> {
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
    let mut by_session: HashMap<(u64, u64), Vec<u64>> = HashMap::new();
    let mut receipts = Vec::new();
    for u in taken {
        match u {
            Unacked::Consumer {
                consumer,
                generation,
                tag,
            } => by_session
                .entry((consumer, generation))
                .or_default()
                .push(tag),
            Unacked::Get { receipt } => receipts.push(receipt),
        }
    }
    let inputs: Vec<(mpsc::Sender<SessionIn>, Vec<u64>)> = {
        let state = channel.deliveries.state.lock().unwrap();
        by_session
            .into_iter()
            .flat_map(|((consumer, generation), tags)| {
                state
                    .sessions
                    .get(&consumer)
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
        // basic.nack with requeue: not a failed delivery, for a basic.get message too.
        SettleOutcome::Release => pb::SettleOutcome::Release,
        _ => pb::SettleOutcome::Requeue,
    };
    code as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nack_of_a_get_is_a_release_and_a_reject_with_requeue_a_requeue() {
        let code = |o: SettleOutcome| pb::SettleOutcome::try_from(settle_code(&o)).unwrap();
        assert_eq!(code(SettleOutcome::Release), pb::SettleOutcome::Release);
        assert_eq!(code(outcome(true)), pb::SettleOutcome::Requeue);
        assert_eq!(code(outcome(false)), pb::SettleOutcome::Reject);
        assert_eq!(code(SettleOutcome::Ack), pb::SettleOutcome::Ack);
    }
}
