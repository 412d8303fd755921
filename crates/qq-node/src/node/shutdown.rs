//! A node's orderly stop: its tasks first, then its leaderships handed over, then its Raft
//! groups and the store.

use std::time::Duration;

use openraft::ServerState;
use tokio::sync::watch;
use tracing::{info, warn};

use super::Node;
use super::raft::transfer_away;

/// How long shutdown waits for the node's tasks to finish before it stops the groups anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long a stopping node waits for the leaderships it handed over to leave it. Short: the
/// transfer itself takes milliseconds, but a node whose cluster port already stopped accepting
/// often does not hear of its successor at all (observed: the new leader was elected 10 ms
/// after the transfer, the stopping node never saw it), so the wait mostly lets the
/// TransferLeader requests leave.
const HANDOVER_WAIT: Duration = Duration::from_millis(500);

impl Node {
    /// Stop the node's work: cancel every task (consumer sessions end with UNAVAILABLE,
    /// proposals stop retrying), wait for them (at most [`SHUTDOWN_GRACE`]), stop the Raft
    /// groups, then flush the store. Call after the servers stopped accepting.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, self.tasks.wait())
            .await
            .is_err()
        {
            warn!(
                left = self.tasks.len(),
                "tasks still running after the shutdown grace period"
            );
        }
        self.hand_over_leaderships().await;
        for g in self.registry.queues() {
            let _ = g.raft.shutdown().await;
        }
        let _ = self.registry.meta_raft().shutdown().await;
        self.loads_stop.cancel();
        if let Err(e) = self.store.sync().await {
            warn!("final fsync: {e}");
        }
        info!("node stopped");
    }

    /// Before the groups stop: hand the leadership of every group this node leads to the voter
    /// that replicated most of its log, so clients wait for a leadership transfer (a few ms)
    /// rather than an election timeout, as RabbitMQ's quorum queues do on a graceful stop.
    /// Waits at most [`HANDOVER_WAIT`] for leadership to leave; a transfer that did not reach
    /// its target is made up for by an election, as after a crash.
    async fn hand_over_leaderships(&self) {
        let me = self.id;
        let mut handed: Vec<watch::Receiver<bool>> = Vec::new();
        if let Some(rx) = transfer_away(self.registry.meta_raft(), me).await {
            handed.push(rx);
        }
        // Unloaded leaders too: their followers hear the successor's term at once instead of
        // electing after the liveness link breaks.
        self.registry
            .load_where(|d| d.metrics.state == ServerState::Leader)
            .await;
        for g in self.registry.queues() {
            // A sleeping leader's heartbeats and timers back on first: the successor's term
            // must reach the followers as it does from an awake group.
            g.residency.wake();
            if let Some(rx) = transfer_away(&g.raft, me).await {
                handed.push(rx);
            }
        }
        if handed.is_empty() {
            return;
        }
        let n = handed.len();
        let gone = tokio::time::timeout(HANDOVER_WAIT, async {
            for mut rx in handed {
                let _ = rx.wait_for(|still_leader| !*still_leader).await;
            }
        })
        .await
        .is_ok();
        info!(
            groups = n,
            seen_to_leave = gone,
            "leadership transfers sent before stopping"
        );
    }
}
