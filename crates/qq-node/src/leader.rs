//! Work only a queue's leader does: track leadership, clean up consumers that lived on an
//! earlier leader, and propose `Expire { now_ms }` when the earliest deadline (message TTL or
//! Get lease) passes. Time enters the queue's log only here and in commands the node stamps.

use openraft::async_runtime::WatchReceiver;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::{Raft, ServerState};
use qq_core::queue::Command;
use qq_raft::TypeConfig;
use tracing::{Instrument, Span, debug, info};

use crate::node::{Node, now_ms};
use crate::queue_sm::{QueueRequest, QueueShared, QueueSm};

/// Longest sleep of the expiry timer between checks.
const EXPIRY_POLL: Duration = Duration::from_millis(500);

/// How often a leader looks for consumers in the queue state that no session of its own serves.
/// Becoming leader is not enough: a `Checkout` proposed just before a leader change can commit
/// and apply after the new leader's first clean-up (its session already gone), and its
/// `ConsumerDown` can fail during the election; such a consumer would hold its unacked
/// messages forever (found by qq-chaos: 20 messages, one prefetch, stuck in a queue).
const CONSUMER_RECONCILE: Duration = Duration::from_secs(3);

pub fn spawn_queue_tasks(
    node: Arc<Node>,
    group: u64,
    raft: Raft<TypeConfig, QueueSm>,
    shared: Arc<QueueShared>,
    span: Span,
) {
    // Leadership watcher.
    {
        let node = node.clone();
        let raft = raft.clone();
        let shared = shared.clone();
        tokio::spawn(
            async move {
                let mut metrics = raft.metrics();
                let mut was_leader = false;
                let mut reconcile = tokio::time::interval(CONSUMER_RECONCILE);
                reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    let is_leader = metrics.borrow_watched().state == ServerState::Leader;
                    if is_leader != was_leader {
                        was_leader = is_leader;
                        shared.is_leader.store(is_leader, Ordering::Release);
                        if is_leader {
                            info!("became leader");
                            clean_up_old_consumers(&node, group, &shared).await;
                        } else {
                            info!("not the leader any more");
                            shared.cancel_consumers("queue leader changed; subscribe again", true);
                        }
                    }
                    tokio::select! {
                        changed = metrics.changed() => if changed.is_err() { return },
                        _ = reconcile.tick() => {
                            if was_leader {
                                clean_up_old_consumers(&node, group, &shared).await;
                            }
                        }
                    }
                }
            }
            .instrument(span.clone()),
        );
    }
    crate::deadletter::spawn_at_least_once_worker(
        node.clone(),
        group,
        shared.clone(),
        span.clone(),
    );
    // Expiry timer (message TTLs, Get leases, and x-expires of the queue as a whole).
    tokio::spawn(
        async move {
            let mut applied = shared.applied.subscribe();
            // A queue never used since this node became leader counts as used at that moment.
            let mut leader_since: Option<u64> = None;
            loop {
                if node.queue_group(group).is_none() {
                    return;
                }
                let mut wait = EXPIRY_POLL;
                let leading = shared.is_leader.load(Ordering::Acquire);
                if !leading {
                    leader_since = None;
                } else if leader_since.is_none() {
                    leader_since = Some(now_ms());
                }
                if leading {
                    let (expires_ms, idle_from, consumers, vhost, name) = {
                        let state = shared.state.lock().unwrap();
                        let c = state.config();
                        (
                            c.expires_ms,
                            state.last_used_ms().max(leader_since.unwrap_or(0)),
                            state.counts().consumers,
                            c.vhost.clone(),
                            c.name.clone(),
                        )
                    };
                    if let (Some(expires), 0) = (expires_ms, consumers) {
                        let now = now_ms();
                        if now >= idle_from + expires {
                            // Unused for x-expires: the queue is deleted, its messages are not
                            // dead-lettered (SEMANTICS.md).
                            info!(
                                expires_ms = expires,
                                "queue unused for x-expires: deleting it"
                            );
                            match node
                                .propose_meta(qq_core::meta::MetaCommand::DeleteQueue {
                                    vhost,
                                    name,
                                })
                                .await
                            {
                                Ok(_) => return,
                                Err(e) => debug!("queue expiry not applied yet: {e}"),
                            }
                        } else {
                            wait = wait.min(Duration::from_millis(idle_from + expires - now));
                        }
                    }
                }
                if leading {
                    let next = shared.state.lock().unwrap().next_deadline();
                    if let Some(deadline) = next {
                        let now = now_ms();
                        if deadline <= now {
                            let cmd = Command::Expire { now_ms: now };
                            if let Err(e) = node
                                .propose_queue(group, QueueRequest { cmd, message: None })
                                .await
                            {
                                debug!("expire not applied: {e}");
                            }
                            continue;
                        }
                        wait = wait.min(Duration::from_millis(deadline - now));
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    r = applied.changed() => if r.is_err() { return },
                }
            }
        }
        .instrument(span),
    );
}

/// The leader serves every consumer stream of its queue (followers relay to it), and a session
/// registers locally before its `Checkout` is proposed: a consumer in the state that no local
/// session serves belongs to a stream that ended (with an old leader, or whose clean-up failed),
/// so its unacked messages go back to the queue. `ConsumerDown` of a consumer already gone is a
/// no-op, so racing a session's own clean-up is harmless.
async fn clean_up_old_consumers(node: &Arc<Node>, group: u64, shared: &Arc<QueueShared>) {
    let local: HashSet<u64> = shared.consumers.lock().unwrap().keys().copied().collect();
    let stale: Vec<u64> = shared
        .state
        .lock()
        .unwrap()
        .consumers()
        .into_iter()
        .map(|c| c.0)
        .filter(|c| !local.contains(c))
        .collect();
    for consumer in stale {
        node.consumer_down(group, consumer).await;
    }
}
