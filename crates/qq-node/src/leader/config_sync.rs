//! The queue's configuration in its own log follows the metadata's (`UpdateConfig`), and so
//! does its consumer timeout (`SetConsumerTimeout`, from the queue's argument or policy, else
//! the node's `consumer_timeout_ms`).

use qq_core::meta::QueueMeta;
use qq_core::policy;
use qq_core::queue::Command;
use tracing::debug;

use super::{PROPOSAL_RETRY, QueueLeader, Timers};

impl QueueLeader {
    /// Bring the queue's own configuration in line with the metadata's; a failed proposal is
    /// retried on a timer.
    pub(super) async fn sync_config(&self, timers: &mut Timers) {
        timers.config_retry = None;
        if !self.try_sync_config().await {
            timers.config_retry = Some(self.ctx.clock.now() + PROPOSAL_RETRY);
        }
    }

    /// False if the proposal failed.
    async fn try_sync_config(&self) -> bool {
        let Some(wanted) = self.ctx.view.queue_by_id(self.group) else {
            return true; // deleted: the supervisor stops the group
        };
        let current = self.machine.with_state(|s| s.config().clone());
        if current != wanted.config {
            let cmd = Command::UpdateConfig {
                now_ms: self.ctx.clock.now_ms(),
                config: wanted.config.clone(),
            };
            if let Err(e) = self.propose(cmd).await {
                debug!("update config not applied yet: {e}");
                return false;
            }
        }
        self.try_sync_consumer_timeout(&wanted).await
    }

    /// The consumer timeout: the queue's argument or policy, else the node's default. Only
    /// once the queue's machine has it (version 2); until then the queue has none.
    async fn try_sync_consumer_timeout(&self, wanted: &QueueMeta) -> bool {
        let view = self.ctx.view.current();
        let timeout = policy::consumer_timeout_ms(&wanted.arguments, view.policy_of(wanted))
            .or((self.ctx.default_consumer_timeout_ms > 0)
                .then_some(self.ctx.default_consumer_timeout_ms));
        let (current, version) = self
            .machine
            .with_state(|s| (s.consumer_timeout_ms(), s.machine_version()));
        if current == timeout || version < 2 {
            return true;
        }
        match self
            .propose(Command::SetConsumerTimeout {
                timeout_ms: timeout,
            })
            .await
        {
            Ok(_) => true,
            Err(e) => {
                debug!("consumer timeout not applied yet: {e}");
                false
            }
        }
    }
}
