//! Republishing dead letters through the dead-letter exchange.
//!
//! The copy is made by the pure [`qq_core::deadletter::dead_letter`] (x-death history, keys,
//! expiration removed), routed with the local metadata replica, and enqueued into every target
//! queue, skipping targets that would close a dead-letter cycle. Each copy carries the
//! idempotency key `dl:{source group}:{message id}:{death count}`, so a retried transfer never
//! leaves a duplicate in a target (the target's state machine drops a key it has seen).
//!
//! - at-most-once: the message already left the source's state; the leader that applied the
//!   death tries once ([`publish_at_most_once`]). No route or a refusing target drops it.
//! - at-least-once: the message stays held in the source's replicated state; a worker next to
//!   the source leader ([`spawn_at_least_once_worker`]) transfers held dead letters and proposes
//!   `DeadLetterSettle` for those every target committed. It retries after each apply, after
//!   each metadata change (topology), and every `dead_letter_retry_ms`.
//!
//! Known gap: dead letters of one batch are transferred concurrently, so their order within the
//! batch is not guaranteed in the target.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::join_all;
use qq_core::deadletter::{dead_letter, deaths, is_cycle};
use qq_core::queue::{Command, MsgHeader, Reply};
use qq_core::{Message, MessageId, QueueConfig, Reason};
use qq_raft::GroupId;
use tracing::{Instrument, Span, debug, warn};

use crate::convert::parse_expiration;
use crate::node::{Node, now_ms};
use crate::queue_sm::{DeadLetterJob, QueueRequest, QueueShared};

/// Held dead letters transferred per round.
const TRANSFER_BATCH: usize = 128;

/// Why a transfer did not complete (the dead letter stays held under at-least-once).
#[derive(Debug)]
pub enum TransferError {
    NoRoute(String),
    Refused(String),
    Unavailable(String),
}

/// Route `message` (which died in `config`'s queue) through the DLX into every target.
pub async fn transfer(
    node: &Node,
    group: GroupId,
    config: &QueueConfig,
    id: MessageId,
    reason: Reason,
    died_at_ms: u64,
    message: &Message,
) -> Result<(), TransferError> {
    let Some(dlx) = config.dead_letter_exchange.as_deref() else {
        return Err(TransferError::NoRoute(format!("queue '{}' has no dead-letter exchange", config.name)));
    };
    let (copy, keys) = dead_letter(message, &config.name, reason, died_at_ms, dlx, config.dead_letter_routing_key.as_deref());
    let targets = node
        .meta
        .state
        .read()
        .unwrap()
        .route(&config.vhost, dlx, &keys, &copy.properties.headers)
        .map_err(|e| TransferError::NoRoute(e.message))?;
    if targets.is_empty() {
        return Err(TransferError::NoRoute(format!("exchange '{dlx}' routes no queue for keys {keys:?}")));
    }
    // A cycle without a rejection in it: the copy is dropped for that target.
    let targets: Vec<_> = targets.into_iter().filter(|t| !is_cycle(&copy, &t.name)).collect();
    let encoded = postcard::to_stdvec(&copy).map_err(|e| TransferError::Unavailable(format!("encode: {e}")))?;
    let expiration_ms = if copy.properties.expiration.is_empty() { None } else { parse_expiration(&copy.properties.expiration).ok() };
    let count = deaths(&copy).first().map(|d| d.count).unwrap_or(1);
    let key = format!("dl:{group}:{id}:{count}");
    let results = join_all(targets.iter().map(|t| {
        let cmd = Command::Enqueue {
            now_ms: now_ms(),
            header: MsgHeader { size_bytes: copy.body.len() as u64, expiration_ms },
            publisher: None,
            dedup_key: Some(key.clone()),
        };
        let request = QueueRequest { cmd, message: Some(encoded.clone()) };
        async move { (t.name.clone(), node.propose_queue(t.id, request).await) }
    }))
    .await;
    for (target, result) in results {
        match result {
            Ok(Reply::Enqueued { .. } | Reply::Duplicate) => {}
            Ok(Reply::Rejected { detail } | Reply::RejectedDeadLettered { detail, .. }) => {
                return Err(TransferError::Refused(format!("target '{target}': {detail}")));
            }
            Ok(other) => return Err(TransferError::Refused(format!("target '{target}': {other:?}"))),
            Err(status) => return Err(TransferError::Unavailable(format!("target '{target}': {}", status.message()))),
        }
    }
    Ok(())
}

pub async fn publish_at_most_once(node: &Arc<Node>, job: DeadLetterJob) -> anyhow::Result<()> {
    if let Err(e) = transfer(node, job.group, &job.config, job.id, job.reason, job.died_at_ms, &job.message).await {
        anyhow::bail!("queue '{}': at-most-once dead letter {} dropped: {e:?}", job.config.name, job.id);
    }
    Ok(())
}

/// The at-least-once transfer worker of one queue; active only while this node leads it.
pub fn spawn_at_least_once_worker(node: Arc<Node>, group: GroupId, shared: Arc<QueueShared>, span: Span) {
    tokio::spawn(
        async move {
            let mut applied = shared.applied.subscribe();
            let mut topology = node.meta.applied.subscribe();
            let retry = Duration::from_millis(node.config.dead_letter_retry_ms);
            let mut logged_no_route = false;
            loop {
                if node.queue_group(group).is_none() {
                    return;
                }
                let held = if shared.is_leader.load(Ordering::Acquire) {
                    shared.state.lock().unwrap().held_dead_letters()
                } else {
                    Vec::new()
                };
                if !held.is_empty() {
                    let config = shared.state.lock().unwrap().config().clone();
                    let batch: Vec<_> = held.into_iter().take(TRANSFER_BATCH).collect();
                    let results = join_all(batch.iter().map(|h| {
                        let (node, shared, config) = (&node, &shared, &config);
                        async move {
                            let message = shared.read_message(h.id).map_err(|e| TransferError::Unavailable(e.to_string()))?;
                            transfer(node, group, config, h.id, h.reason, h.died_at_ms, &message).await.map(|_| h.id)
                        }
                    }))
                    .await;
                    let mut done = Vec::new();
                    let mut failure = None;
                    for r in results {
                        match r {
                            Ok(id) => done.push(id),
                            Err(e) => failure = Some(e),
                        }
                    }
                    if !done.is_empty() {
                        let n = done.len();
                        let cmd = Command::DeadLetterSettle { ids: done };
                        match node.propose_queue(group, QueueRequest { cmd, message: None }).await {
                            Ok(_) => debug!(n, "dead letters confirmed by every target"),
                            Err(e) => debug!("dead-letter settle not applied: {e}"),
                        }
                    }
                    match failure {
                        None => continue, // more may be held: next round at once
                        Some(TransferError::NoRoute(why)) if !logged_no_route => {
                            warn!("at-least-once dead letters held: {why}");
                            logged_no_route = true;
                        }
                        Some(e) => debug!("dead-letter transfer will be retried: {e:?}"),
                    }
                } else {
                    logged_no_route = false;
                }
                tokio::select! {
                    _ = tokio::time::sleep(retry) => {}
                    r = topology.changed() => if r.is_err() { return },
                    r = applied.changed() => if r.is_err() { return },
                }
            }
        }
        .instrument(span),
    );
}
