//! The queue's configuration in its own log follows the metadata's (`UpdateConfig`).

use qq_core::queue::Command;
use tokio::time::Instant;
use tracing::debug;

use super::{PROPOSAL_RETRY, QueueLeader, Timers};
use crate::clock::now_ms;

impl QueueLeader {
    /// Bring the queue's own configuration in line with the metadata's; a failed proposal is
    /// retried on a timer.
    pub(super) async fn sync_config(&self, timers: &mut Timers) {
        timers.config_retry = None;
        if !self.try_sync_config().await {
            timers.config_retry = Some(Instant::now() + PROPOSAL_RETRY);
        }
    }

    /// False if the proposal failed.
    async fn try_sync_config(&self) -> bool {
        let Some(wanted) = self.ctx.view.queue_by_id(self.group) else {
            return true; // deleted: the supervisor stops the group
        };
        let current = self.machine.with_state(|s| s.config().clone());
        if current == wanted.config {
            return true;
        }
        let cmd = Command::UpdateConfig {
            now_ms: now_ms(),
            config: wanted.config,
        };
        match self.propose(cmd).await {
            Ok(_) => true,
            Err(e) => {
                debug!("update config not applied yet: {e}");
                false
            }
        }
    }
}
