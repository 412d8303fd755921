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
//! Order: dead letters leave in the order they died; the copies for one target go as one batch
//! entry in that order (one Raft entry per target per round), so each target sees them in order.

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

/// A dead letter ready to go: its targets and the enqueue command (with its idempotency key).
struct Copy {
    targets: Vec<(u64, String)>,
    request: QueueRequest,
}

/// Make the copy of `message` (which died in `config`'s queue) and route it through the DLX.
fn prepare(
    node: &Node,
    group: GroupId,
    config: &QueueConfig,
    id: MessageId,
    reason: Reason,
    died_at_ms: u64,
    message: &Message,
) -> Result<Copy, TransferError> {
    let Some(dlx) = config.dead_letter_exchange.as_deref() else {
        return Err(TransferError::NoRoute(format!(
            "queue '{}' has no dead-letter exchange",
            config.name
        )));
    };
    let (copy, keys) = dead_letter(
        message,
        &config.name,
        reason,
        died_at_ms,
        dlx,
        config.dead_letter_routing_key.as_deref(),
    );
    let targets = node
        .meta
        .state
        .read()
        .unwrap()
        .route(&config.vhost, dlx, &keys, &copy.properties.headers)
        .map_err(|e| TransferError::NoRoute(e.message))?;
    if targets.is_empty() {
        return Err(TransferError::NoRoute(format!(
            "exchange '{dlx}' routes no queue for keys {keys:?}"
        )));
    }
    // A cycle without a rejection in it: the copy is dropped for that target.
    let targets = targets
        .into_iter()
        .filter(|t| !is_cycle(&copy, &t.name))
        .map(|t| (t.id, t.name))
        .collect();
    let encoded = postcard::to_stdvec(&copy)
        .map_err(|e| TransferError::Unavailable(format!("encode: {e}")))?;
    let expiration_ms = if copy.properties.expiration.is_empty() {
        None
    } else {
        parse_expiration(&copy.properties.expiration).ok()
    };
    let count = deaths(&copy).first().map(|d| d.count).unwrap_or(1);
    let cmd = Command::Enqueue {
        now_ms: now_ms(),
        header: MsgHeader {
            size_bytes: copy.body.len() as u64,
            expiration_ms,
        },
        publisher: None,
        dedup_key: Some(format!("dl:{group}:{id}:{count}")),
    };
    Ok(Copy {
        targets,
        request: QueueRequest {
            cmd,
            message: Some(encoded),
        },
    })
}

fn check_reply(target: &str, reply: &Reply) -> Result<(), TransferError> {
    match reply {
        Reply::Enqueued { .. } | Reply::Duplicate => Ok(()),
        Reply::Rejected { detail } | Reply::RejectedDeadLettered { detail, .. } => Err(
            TransferError::Refused(format!("target '{target}': {detail}")),
        ),
        other => Err(TransferError::Refused(format!(
            "target '{target}': {other:?}"
        ))),
    }
}

/// Transfer dead letters (in the order they died): one ordered batch entry per target queue,
/// all targets at once. Returns, per dead letter, whether every target committed it.
async fn transfer_ordered(
    node: &Node,
    group: GroupId,
    config: &QueueConfig,
    letters: Vec<(MessageId, Reason, u64, Message)>,
) -> Vec<(MessageId, Result<(), TransferError>)> {
    let mut outcome: Vec<(MessageId, Result<(), TransferError>)> =
        Vec::with_capacity(letters.len());
    let mut per_target: std::collections::BTreeMap<u64, (String, Vec<(usize, QueueRequest)>)> =
        Default::default();
    for (i, (id, reason, died_at_ms, message)) in letters.into_iter().enumerate() {
        match prepare(node, group, config, id, reason, died_at_ms, &message) {
            Ok(copy) => {
                for (tid, name) in copy.targets {
                    per_target
                        .entry(tid)
                        .or_insert_with(|| (name, Vec::new()))
                        .1
                        .push((i, copy.request.clone()));
                }
                outcome.push((id, Ok(())));
            }
            Err(e) => outcome.push((id, Err(e))),
        }
    }
    let results = join_all(
        per_target
            .into_iter()
            .map(|(tid, (name, items))| async move {
                let (positions, reqs): (Vec<usize>, Vec<QueueRequest>) = items.into_iter().unzip();
                (name, positions, node.propose_queue_batch(tid, reqs).await)
            }),
    )
    .await;
    for (target, positions, result) in results {
        match result {
            Ok(replies) => {
                for (i, out) in positions.into_iter().zip(replies) {
                    if let Err(e) = check_reply(&target, &out.reply) {
                        if outcome[i].1.is_ok() {
                            outcome[i].1 = Err(e);
                        }
                    }
                }
            }
            Err(status) => {
                for i in positions {
                    if outcome[i].1.is_ok() {
                        outcome[i].1 = Err(TransferError::Unavailable(format!(
                            "target '{target}': {}",
                            status.message()
                        )));
                    }
                }
            }
        }
    }
    outcome
}

pub async fn publish_at_most_once(node: &Arc<Node>, job: DeadLetterJob) -> anyhow::Result<()> {
    let letters = vec![(job.id, job.reason, job.died_at_ms, job.message)];
    for (id, result) in transfer_ordered(node, job.group, &job.config, letters).await {
        if let Err(e) = result {
            anyhow::bail!(
                "queue '{}': at-most-once dead letter {id} dropped: {e:?}",
                job.config.name
            );
        }
    }
    Ok(())
}

/// The at-least-once transfer worker of one queue; active only while this node leads it.
pub fn spawn_at_least_once_worker(
    node: Arc<Node>,
    group: GroupId,
    shared: Arc<QueueShared>,
    span: Span,
) {
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
                    let mut letters = Vec::with_capacity(batch.len());
                    let mut failure = None;
                    for h in &batch {
                        match shared.read_message(h.id) {
                            Ok(m) => letters.push((h.id, h.reason, h.died_at_ms, m)),
                            Err(e) => failure = Some(TransferError::Unavailable(e.to_string())),
                        }
                    }
                    let mut done = Vec::new();
                    for (id, r) in transfer_ordered(&node, group, &config, letters).await {
                        match r {
                            Ok(()) => done.push(id),
                            Err(e) => failure = Some(e),
                        }
                    }
                    if !done.is_empty() {
                        let n = done.len();
                        let cmd = Command::DeadLetterSettle { ids: done };
                        match node
                            .propose_queue(group, QueueRequest { cmd, message: None })
                            .await
                        {
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
