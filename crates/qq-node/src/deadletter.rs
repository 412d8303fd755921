//! Republishing dead letters (at-most-once): the message has already left the source queue's
//! state; the leader that applied its death routes a copy (with its `x-death` history, made by
//! the pure [`qq_core::deadletter::dead_letter`]) through the dead-letter exchange and enqueues it
//! into every target queue, skipping targets that would close a dead-letter cycle. A copy that
//! cannot be routed is dropped and counted by the source's stats; the first such drop per queue
//! is logged.
//!
//! Left out (the dead-lettering issue): the at-least-once transfer of held dead letters.

use std::sync::Arc;

use qq_core::deadletter::{dead_letter, is_cycle};
use qq_core::queue::{Command, MsgHeader, Reply};
use tracing::warn;

use crate::convert::parse_expiration;
use crate::node::Node;
use crate::queue_sm::{DeadLetterJob, QueueRequest};

pub async fn publish_at_most_once(node: &Arc<Node>, job: DeadLetterJob) -> anyhow::Result<()> {
    let config = &job.config;
    let Some(dlx) = config.dead_letter_exchange.as_deref() else { return Ok(()) };
    let (copy, keys) = dead_letter(
        &job.message,
        &config.name,
        job.reason,
        job.died_at_ms,
        dlx,
        config.dead_letter_routing_key.as_deref(),
    );
    let targets = match node.meta.state.read().unwrap().route(&config.vhost, dlx, &keys, &copy.properties.headers) {
        Ok(t) => t,
        Err(e) => {
            warn!(queue = %config.name, "dead letter dropped: {e}");
            return Ok(());
        }
    };
    let targets: Vec<_> = targets.into_iter().filter(|t| !is_cycle(&copy, &t.name)).collect();
    if targets.is_empty() {
        return Ok(());
    }
    let encoded = postcard::to_stdvec(&copy)?;
    let expiration_ms = if copy.properties.expiration.is_empty() { None } else { parse_expiration(&copy.properties.expiration).ok() };
    let count = qq_core::deadletter::deaths(&copy).first().map(|d| d.count).unwrap_or(1);
    for t in targets {
        let cmd = Command::Enqueue {
            now_ms: job.died_at_ms.max(crate::node::now_ms()),
            header: MsgHeader { size_bytes: copy.body.len() as u64, expiration_ms },
            publisher: None,
            dedup_key: Some(format!("dl:{}:{}:{}", job.group, job.id, count)),
        };
        match node.propose_queue(t.id, QueueRequest { cmd, message: Some(encoded.clone()) }).await {
            Ok(Reply::Enqueued { .. } | Reply::Duplicate) => {}
            Ok(other) => warn!(queue = %config.name, target = %t.name, "dead letter refused: {other:?}"),
            Err(e) => warn!(queue = %config.name, target = %t.name, "dead letter lost: {e}"),
        }
    }
    Ok(())
}
