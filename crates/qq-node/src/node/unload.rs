//! Unloading sleepers: the Raft instance of a replica that has slept long enough is shut
//! down (its machine and membership stay in the registry, see [`crate::groups::registry`]);
//! [`super::replicas`] loads it again when something needs it.

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use qq_core::queue::MoveState;

use super::Node;
use crate::groups::registry::{QueueGroup, holds_whole_log};

/// How often the node looks for replicas that have slept for `unload_after_ms`.
const UNLOAD_SWEEP: Duration = Duration::from_secs(1);
/// At most one release of freed heap ([`crate::alarms::release_free_heap`]) per this long
/// after unloads ([`Node::unload_sleepers`]).
const UNLOAD_TRIM_EVERY: Duration = Duration::from_secs(10);

impl Node {
    /// Unload the Raft instance of every replica that has slept for `after` (and, where it
    /// leads, whose leader actor has nothing to wait for): see [`crate::groups::registry`].
    pub(super) async fn unload_sleepers(self: Arc<Self>, after: Duration) {
        let mut sweep = tokio::time::interval(UNLOAD_SWEEP);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut untrimmed = 0usize;
        let mut trimmed_at = self.clock.now();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = sweep.tick() => {}
            }
            let mut unloaded = 0;
            for g in self.registry.queues() {
                if self.shutdown.is_cancelled() {
                    return;
                }
                if g.residency
                    .asleep_for(self.clock.now())
                    .is_some_and(|d| d >= after)
                    && self.registry.unload(g.meta.id, may_unload).await
                {
                    unloaded += 1;
                }
            }
            // The allocator keeps what the instances freed resident until asked or until its
            // dirty pages decay; with glibc an unload saved nothing without this (measured:
            // 1 000 queues, 656 MB across three nodes either way, 337 MB after a trim; not
            // measured again with jemalloc). A release walks every arena under its lock, so
            // at most one per UNLOAD_TRIM_EVERY.
            untrimmed += unloaded;
            if untrimmed > 0 && self.clock.elapsed(trimmed_at) >= UNLOAD_TRIM_EVERY {
                let _ = qq_raft::lockstep::spawn_blocking(crate::alarms::release_free_heap).await;
                untrimmed = 0;
                trimmed_at = self.clock.now();
            }
        }
    }
}

/// Whether a sleeping replica's Raft instance may be unloaded: where it leads, every member
/// holds its whole log, and its leader actor has nothing to wait for: no message deadline (TTL,
/// Get lease, delayed requeue), no `x-expires` to watch, no dead letters held for transfer, no
/// move task running. Any of them keeps the group loaded (asleep) until it is done.
///
/// A leader with a member behind (a node down, which a leader may sleep through) stays loaded:
/// that member's return must find it ready to catch it up. Unloaded, the survivors of a node
/// lost with 10 000 queues had to load every such leader at once when it came back, and its
/// restart did not finish in 150 s (59 s with every replica loaded).
fn may_unload(g: &QueueGroup) -> bool {
    let m = g.raft.metrics();
    {
        let m = m.borrow_watched();
        if m.state != ServerState::Leader {
            return true;
        }
        // The leader replicates to every other member (voter or learner).
        let Some(replication) = &m.replication else {
            return false;
        };
        if !replication.keys().all(|id| holds_whole_log(&m, *id)) {
            return false;
        }
    }
    g.machine.with_state(|s| {
        let counts = s.counts();
        s.next_deadline().is_none()
            && counts.held == 0
            && (s.config().expires_ms.is_none() || counts.consumers > 0)
            && s.moves().values().all(|m| m.state != MoveState::Running)
    })
}
