//! Consumer sessions. A session always runs on the queue's leader, where the state machine's
//! deliveries are carried out; a client attached to another node is relayed over the internal
//! service ([`super::relay`]). When the leader changes, the session ends with UNAVAILABLE and
//! the new leader returns the consumer's unacked messages to the queue (they count as failed
//! deliveries). When the node shuts down, the session ends with UNAVAILABLE too.
//!
//! Bounds: the inbox from the state machine holds what the prefetch allows
//! ([`crate::groups::queue_sm::UNLIMITED_PREFETCH_BUFFER`] without one); settles wait for the
//! log in a channel of [`SETTLES_BOUND`] (full: the session stops reading the client's
//! settles until the log catches up), and at most [`ACKS_IN_FLIGHT`] ack commands wait for
//! their commit at once.
//!
//! Must not: decide what a settle does to a message (the queue state machine does).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use qq_core::queue::{Command, Reply, SettleOutcome};
use qq_core::{ConsumerId, Message, MessageId, Value};
use qq_raft::GroupId;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::{debug, warn};

use super::Consuming;
use crate::groups::queue_sm::{ConsumerEvent, QueueMachine, QueueRequest};
use crate::proposer::Proposer;

/// Settle commands waiting for the log, at most, per session.
pub const SETTLES_BOUND: usize = 1024;

type Settler = (SettleTx, tokio::task::JoinHandle<()>);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubscribeArgs {
    pub group: GroupId,
    pub consumer_tag: String,
    pub prefetch: u32,
    pub auto_ack: bool,
    /// The consumer's priority (`x-priority`, 0 by default). Not in the encoding that a
    /// relay sends to a leader of release 0.1.0: see [`SessionIn::SubscribeWithPriority`].
    #[serde(skip)]
    pub priority: i32,
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
    /// Stop taking messages but keep those held until they are settled (AMQP basic.cancel):
    /// the queue cancels the consumer ([`Command::CancelConsumer`]), the session answers
    /// [`SessionOut::Stopped`] once that is committed and ends by itself after the last
    /// settle. Added last: postcard encodes variant indexes.
    Stop,
    /// [`SessionIn::Subscribe`] with the consumer's priority (which `SubscribeArgs` does not
    /// encode), for a leader that knows it (machine version 2). Added last.
    SubscribeWithPriority(SubscribeArgs, i32),
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
    /// After [`SessionIn::Stop`]: the queue's consumer is cancelled; every delivery it will
    /// ever get came before this. Added last.
    Stopped,
}

fn error(code: Code, message: impl Into<String>) -> SessionOut {
    SessionOut::Error {
        code: code as i32,
        message: message.into(),
    }
}

/// A settle on its way to the log: (message ids, outcome).
type Settle = (Vec<MessageId>, SettleOutcome);
type SettleTx = mpsc::Sender<Settle>;

/// Run a consumer session on this node, which must lead the queue.
pub async fn run_session(
    node: Consuming,
    args: SubscribeArgs,
    input: mpsc::Receiver<SessionIn>,
    out: mpsc::Sender<SessionOut>,
) {
    let group = args.group;
    let registry = node.registry();
    let Some(r) = registry
        .replica(group)
        .filter(|_| registry.is_queue_leader(group))
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
    let machine = r.machine().clone();
    let events = machine.register_consumer(consumer, args.prefetch);
    // A priority needs the queue's machine at version 2, which this leader's state says (it
    // only moves forward, so a version read here holds when the checkout applies).
    let priority = match machine.with_state(|s| s.machine_version()) {
        v if v >= 2 => args.priority,
        _ if args.priority != 0 => {
            warn!(
                group,
                "consumer priority ignored until the queue's machine is upgraded"
            );
            0
        }
        _ => 0,
    };
    if let Err(e) = checkout(&node, group, consumer, args.prefetch, priority).await {
        machine.unregister_consumer(consumer);
        let status = tonic::Status::from(e);
        let _ = out.send(error(status.code(), status.message())).await;
        return;
    }
    let subscribed = SessionOut::Subscribed {
        consumer_tag: args.consumer_tag.clone(),
    };
    if out.send(subscribed).await.is_err() {
        finish(&node, group, consumer, None).await;
        return;
    }
    let (settle_tx, settle_rx) = mpsc::channel(SETTLES_BOUND);
    let proposer = node.proposer().clone();
    let propose = move |ids, outcome| {
        let proposer = proposer.clone();
        async move { propose_settle(&proposer, group, consumer, ids, outcome).await }
    };
    let settler = node.tasks().spawn(run_settler(propose, settle_rx));
    let mut session = Session {
        auto_ack: args.auto_ack,
        out,
        settle_tx,
        next_tag: 1,
        unsettled: BTreeMap::new(),
        stopped: false,
        events,
        proposer: node.proposer().clone(),
        machine: machine.clone(),
        group,
        consumer,
    };
    session.serve(input, node.stopping().clone()).await;
    let Session { settle_tx, .. } = session;
    finish(&node, group, consumer, Some((settle_tx, settler))).await;
}

/// A settle as a queue's machine at `version` takes it: a release (AMQP `basic.nack` with
/// requeue) needs version 2; before, it is a requeue, as release 0.1.0 counted every return.
/// `version` is asked only for a release: settles are the hot path, and every other outcome
/// is the same at every version.
pub(crate) fn outcome_for_machine(
    outcome: SettleOutcome,
    version: impl FnOnce() -> u32,
) -> SettleOutcome {
    match outcome {
        SettleOutcome::Release if version() < 2 => SettleOutcome::Requeue,
        other => other,
    }
}

/// Attach the consumer: `CheckoutWithPriority` with a priority, else `Checkout`.
async fn checkout(
    node: &Consuming,
    group: GroupId,
    consumer: ConsumerId,
    prefetch: u32,
    priority: i32,
) -> Result<(), crate::error::NodeError> {
    let now_ms = node.clock().now_ms();
    let cmd = match priority {
        0 => Command::Checkout {
            now_ms,
            consumer,
            node: node.id(),
            prefetch,
        },
        priority => Command::CheckoutWithPriority {
            now_ms,
            consumer,
            node: node.id(),
            prefetch,
            priority,
        },
    };
    node.proposer()
        .propose_queue(group, QueueRequest::command(cmd))
        .await
        .map(|_| ())
}

/// Ack commands of one session proposed and not yet committed, at most. Acks commute (each
/// names its own messages), so the next need not wait for the last one's commit: the
/// consumer's credit, which a settle gives back when it applies, returns up to a commit
/// sooner under load.
pub const ACKS_IN_FLIGHT: usize = 4;

/// Settles go to the log without holding up deliveries; queued settles of the same outcome
/// are merged into one command. Acks are pipelined ([`ACKS_IN_FLIGHT`]); any other outcome
/// (a requeue, a reject, a release) waits for the acks in flight and then for its own commit,
/// so those keep the order the client gave them in. `propose` proposes one settle command
/// and ends when it is committed (or failed).
async fn run_settler<P, F>(propose: P, mut settle_rx: mpsc::Receiver<Settle>)
where
    P: Fn(Vec<MessageId>, SettleOutcome) -> F,
    F: std::future::Future<Output = ()>,
{
    let mut acks = FuturesUnordered::new();
    let mut held: Option<Settle> = None;
    loop {
        let first = match held.take() {
            Some(s) => s,
            None => match next_settle(&mut settle_rx, &mut acks).await {
                Some(s) => s,
                None => break,
            },
        };
        let ((ids, outcome), rest) = merge_queued(first, &mut settle_rx);
        held = rest;
        if outcome == SettleOutcome::Ack {
            while acks.len() >= ACKS_IN_FLIGHT {
                acks.next().await;
            }
            acks.push(propose(ids, outcome));
        } else {
            while acks.next().await.is_some() {}
            propose(ids, outcome).await;
        }
    }
    while acks.next().await.is_some() {}
}

/// The session's next settle, while the acks in flight go on to their commits.
async fn next_settle<F: std::future::Future<Output = ()>>(
    settle_rx: &mut mpsc::Receiver<Settle>,
    acks: &mut FuturesUnordered<F>,
) -> Option<Settle> {
    loop {
        if acks.is_empty() {
            return settle_rx.recv().await;
        }
        tokio::select! {
            biased;
            got = settle_rx.recv() => return got,
            _ = acks.next() => {}
        }
    }
}

/// `first` with the settles queued behind it of the same outcome; the first queued one of
/// another outcome is handed back.
fn merge_queued(first: Settle, settle_rx: &mut mpsc::Receiver<Settle>) -> (Settle, Option<Settle>) {
    let (mut ids, outcome) = first;
    while let Ok((more, o)) = settle_rx.try_recv() {
        if o != outcome {
            return ((ids, outcome), Some((more, o)));
        }
        ids.extend(more);
    }
    ((ids, outcome), None)
}

/// One session's state while it serves its stream.
struct Session {
    auto_ack: bool,
    out: mpsc::Sender<SessionOut>,
    settle_tx: SettleTx,
    next_tag: u64,
    /// Delivery tag → message id, of deliveries not settled yet.
    unsettled: BTreeMap<u64, MessageId>,
    /// The client stopped the consumer ([`SessionIn::Stop`]): the session ends with the last
    /// settle.
    stopped: bool,
    /// What the queue's machine hands this consumer.
    events: mpsc::Receiver<ConsumerEvent>,
    /// Where [`SessionIn::Stop`] proposes the consumer's cancel.
    proposer: Proposer,
    /// The queue's state here, for its machine version.
    machine: Arc<QueueMachine>,
    group: GroupId,
    consumer: ConsumerId,
}

/// Whether the session goes on after an event.
enum Next {
    Continue,
    End,
}

impl Session {
    async fn serve(&mut self, mut input: mpsc::Receiver<SessionIn>, stopping: CancellationToken) {
        loop {
            let next = tokio::select! {
                event = self.events.recv() => self.on_event(event).await,
                request = input.recv() => self.on_request(request).await,
                _ = stopping.cancelled() => {
                    self.end(error(Code::Unavailable, "node is shutting down; subscribe again on another node")).await
                }
            };
            if let Next::End = next {
                return;
            }
        }
    }

    /// [`SessionIn::Stop`]: cancel the consumer in the queue, pass on what it was given
    /// before the cancel committed, then say [`SessionOut::Stopped`].
    async fn stop(&mut self) -> Next {
        if self.stopped {
            return Next::Continue;
        }
        let cmd = Command::CancelConsumer {
            now_ms: self.proposer.clock().now_ms(),
            consumer: self.consumer,
        };
        let committed = self
            .proposer
            .propose_queue(self.group, QueueRequest::command(cmd))
            .await;
        match committed {
            Err(e) => {
                let status = tonic::Status::from(e);
                return self.end(error(status.code(), status.message())).await;
            }
            // The queue's machine predates CancelConsumer (a member still runs release 0.1.0,
            // module `qq_core::queue::machine`): the older cancel, which ends the consumer and
            // returns what it holds.
            Ok(Reply::Error { detail }) => {
                debug!(
                    group = self.group,
                    "cancel as before machine version 2: {detail}"
                );
                if self.out.send(SessionOut::Stopped).await.is_err() {
                    return Next::End;
                }
                let reason = "cancelled by client".into();
                return self.end(SessionOut::Cancelled { reason }).await;
            }
            Ok(_) => {}
        }
        // The machine queues a delivery while applying its entry, so every delivery committed
        // before the cancel is in `events` by now.
        while let Ok(event) = self.events.try_recv() {
            if let Next::End = self.on_event(Some(event)).await {
                return Next::End;
            }
        }
        self.stopped = true;
        if self.out.send(SessionOut::Stopped).await.is_err() {
            return Next::End;
        }
        self.end_if_drained().await
    }

    /// A stopped session ends once nothing it delivered is unsettled.
    async fn end_if_drained(&self) -> Next {
        if self.stopped && self.unsettled.is_empty() {
            let reason = "cancelled by client".into();
            return self.end(SessionOut::Cancelled { reason }).await;
        }
        Next::Continue
    }

    async fn end(&self, last: SessionOut) -> Next {
        let _ = self.out.send(last).await;
        Next::End
    }

    async fn on_event(&mut self, event: Option<ConsumerEvent>) -> Next {
        match event {
            Some(ConsumerEvent::Deliver {
                delivery,
                acquired_count,
                mut message,
            }) => {
                let tag = self.next_tag;
                self.next_tag += 1;
                if delivery.delivery_count > 0 {
                    message.properties.headers.insert(
                        "x-delivery-count".into(),
                        Value::Long(delivery.delivery_count as i64),
                    );
                }
                if acquired_count > 0 {
                    message.properties.headers.insert(
                        "x-acquired-count".into(),
                        Value::Long(i64::from(acquired_count)),
                    );
                }
                if self.auto_ack {
                    let _ = self
                        .settle_tx
                        .send((vec![delivery.id], SettleOutcome::Ack))
                        .await;
                } else {
                    self.unsettled.insert(tag, delivery.id);
                }
                let out = SessionOut::Delivery {
                    tag,
                    redelivered: delivery.redelivered,
                    message,
                };
                if self.out.send(out).await.is_err() {
                    return Next::End;
                }
                Next::Continue
            }
            Some(ConsumerEvent::Cancelled {
                reason,
                unavailable,
            }) => {
                let last = if unavailable {
                    error(Code::Unavailable, reason)
                } else {
                    SessionOut::Cancelled { reason }
                };
                self.end(last).await
            }
            // The state machine dropped this consumer: its delivery buffer was full.
            None => {
                let why = "consumer fell too far behind its deliveries; subscribe again";
                self.end(error(Code::Unavailable, why)).await
            }
        }
    }

    async fn on_request(&mut self, request: Option<SessionIn>) -> Next {
        match request {
            Some(SessionIn::Settle {
                tags,
                multiple,
                outcome,
            }) => match self.take_tags(tags, multiple) {
                Ok(ids) => {
                    if !ids.is_empty() {
                        let outcome = outcome_for_machine(outcome, || {
                            self.machine.with_state(|s| s.machine_version())
                        });
                        let _ = self.settle_tx.send((ids, outcome)).await;
                    }
                    self.end_if_drained().await
                }
                Err(tag) => {
                    let why = format!("settle: unknown delivery tag {tag}");
                    self.end(error(Code::FailedPrecondition, why)).await
                }
            },
            Some(SessionIn::Subscribe(_) | SessionIn::SubscribeWithPriority(..)) => {
                let why = "subscribe: already subscribed on this stream";
                self.end(error(Code::InvalidArgument, why)).await
            }
            Some(SessionIn::Cancel) => {
                let reason = "cancelled by client".into();
                self.end(SessionOut::Cancelled { reason }).await
            }
            Some(SessionIn::Stop) => self.stop().await,
            None => Next::End,
        }
    }

    /// The message ids of the settled tags (with `multiple`, every unsettled tag up to each);
    /// `Err(tag)` names a tag that is not an unsettled delivery.
    fn take_tags(&mut self, tags: Vec<u64>, multiple: bool) -> Result<Vec<MessageId>, u64> {
        let mut ids = Vec::new();
        for tag in tags {
            if multiple {
                let upto: Vec<u64> = self.unsettled.range(..=tag).map(|(t, _)| *t).collect();
                if upto.is_empty() && !self.unsettled.contains_key(&tag) {
                    return Err(tag);
                }
                for t in upto {
                    ids.extend(self.unsettled.remove(&t));
                }
            } else {
                ids.push(self.unsettled.remove(&tag).ok_or(tag)?);
            }
        }
        Ok(ids)
    }
}

async fn propose_settle(
    proposer: &Proposer,
    group: GroupId,
    consumer: ConsumerId,
    ids: Vec<MessageId>,
    outcome: SettleOutcome,
) {
    let cmd = Command::Settle {
        now_ms: proposer.clock().now_ms(),
        consumer,
        ids,
        outcome,
    };
    if let Err(e) = proposer
        .propose_queue(group, QueueRequest::command(cmd))
        .await
    {
        debug!(group, consumer, "settle not applied: {e}");
    }
}

/// Let queued settles reach the log, then return whatever is still unacked.
async fn finish(node: &Consuming, group: GroupId, consumer: ConsumerId, settler: Option<Settler>) {
    if let Some((tx, task)) = settler {
        drop(tx);
        let _ = task.await;
    }
    if let Some(r) = node.registry().replica(group) {
        r.machine().unregister_consumer(consumer);
    }
    node.proposer().consumer_down(group, consumer).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    /// A settle the settler proposed, with the switch that commits it.
    type Proposed = (Settle, oneshot::Sender<()>);

    /// A stand-in for the log: each proposal is reported when the settler starts it and ends
    /// only when the test commits it.
    fn fake_log() -> (
        impl Fn(Vec<MessageId>, SettleOutcome) -> futures::future::BoxFuture<'static, ()>,
        mpsc::UnboundedReceiver<Proposed>,
    ) {
        let (started_tx, started_rx) = mpsc::unbounded_channel();
        let propose = move |ids, outcome| {
            let started_tx = started_tx.clone();
            let fut = async move {
                let (commit_tx, commit_rx) = oneshot::channel();
                let _ = started_tx.send(((ids, outcome), commit_tx));
                let _ = commit_rx.await;
            };
            Box::pin(fut) as futures::future::BoxFuture<'static, ()>
        };
        (propose, started_rx)
    }

    /// Every task has run as far as it can (the paused clock only moves when all are idle).
    async fn settle_down() {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }

    async fn started(rx: &mut mpsc::UnboundedReceiver<Proposed>) -> Proposed {
        settle_down().await;
        rx.try_recv().expect("a proposal was started")
    }

    async fn nothing_started(rx: &mut mpsc::UnboundedReceiver<Proposed>) {
        settle_down().await;
        if let Ok((settle, _)) = rx.try_recv() {
            panic!("{settle:?} was proposed too early");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn acks_pipeline_and_another_outcome_waits_for_them() {
        let (propose, mut proposals) = fake_log();
        let (tx, rx) = mpsc::channel(SETTLES_BOUND);
        let settler = tokio::spawn(run_settler(propose, rx));

        // Up to ACKS_IN_FLIGHT acks go to the log without waiting for each other.
        let mut acks = Vec::new();
        for id in 1..=ACKS_IN_FLIGHT as u64 {
            tx.send((vec![id], SettleOutcome::Ack)).await.unwrap();
            let ((ids, outcome), commit) = started(&mut proposals).await;
            assert_eq!((ids, outcome), (vec![id], SettleOutcome::Ack));
            acks.push(commit);
        }
        // One more waits for a slot.
        tx.send((vec![10], SettleOutcome::Ack)).await.unwrap();
        nothing_started(&mut proposals).await;
        // A requeue queued behind it is not merged with it, nor proposed early.
        tx.send((vec![11], SettleOutcome::Requeue)).await.unwrap();
        nothing_started(&mut proposals).await;

        acks.remove(0).send(()).unwrap();
        let ((ids, _), commit) = started(&mut proposals).await;
        assert_eq!(ids, vec![10]);
        acks.push(commit);
        // The requeue waits for every ack before it, the last one included.
        while acks.len() > 1 {
            acks.remove(0).send(()).unwrap();
            nothing_started(&mut proposals).await;
        }
        acks.remove(0).send(()).unwrap();
        let ((ids, outcome), requeue) = started(&mut proposals).await;
        assert_eq!((ids, outcome), (vec![11], SettleOutcome::Requeue));

        // An ack after the requeue waits for the requeue's commit: the order holds both ways.
        tx.send((vec![12], SettleOutcome::Ack)).await.unwrap();
        nothing_started(&mut proposals).await;
        requeue.send(()).unwrap();
        let ((ids, _), last) = started(&mut proposals).await;
        assert_eq!(ids, vec![12]);

        // With the session gone the settler ends only once its last ack is committed.
        drop(tx);
        settle_down().await;
        assert!(
            !settler.is_finished(),
            "the settler ended with an ack in flight"
        );
        last.send(()).unwrap();
        settler.await.unwrap();
    }

    #[test]
    fn queued_settles_merge_by_outcome_and_stop_at_another() {
        let (tx, mut rx) = mpsc::channel(8);
        tx.try_send((vec![2], SettleOutcome::Ack)).unwrap();
        tx.try_send((vec![3, 4], SettleOutcome::Ack)).unwrap();
        tx.try_send((vec![5], SettleOutcome::Requeue)).unwrap();
        tx.try_send((vec![6], SettleOutcome::Ack)).unwrap();

        let (merged, rest) = merge_queued((vec![1], SettleOutcome::Ack), &mut rx);
        assert_eq!(merged, (vec![1, 2, 3, 4], SettleOutcome::Ack));
        // The requeue is handed back, not merged into the acks nor dropped; the ack behind it
        // stays queued, so the requeue goes to the log before it.
        assert_eq!(rest, Some((vec![5], SettleOutcome::Requeue)));
        assert_eq!(rx.try_recv().unwrap(), (vec![6], SettleOutcome::Ack));

        let (merged, rest) = merge_queued((vec![7], SettleOutcome::Reject), &mut rx);
        assert_eq!(merged, (vec![7], SettleOutcome::Reject));
        assert_eq!(rest, None);
    }
}
