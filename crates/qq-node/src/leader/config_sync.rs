//! The queue's configuration in its own log follows the metadata's (`UpdateConfig`), and so
//! does its consumer timeout (`SetConsumerTimeout`, from the queue's argument or policy, else
//! the node's `consumer_timeout_ms`).

use qq_core::meta::QueueMeta;
use qq_core::policy;
use qq_core::queue::Command;
use tokio::time::Instant;
use tracing::debug;

use super::{PROPOSAL_RETRY, QueueLeader};

/// The config sync sub-machine: a sync when the metadata changed (or the machine moved to a
/// version with more settings), and again [`PROPOSAL_RETRY`] after a failed one. Its deadline
/// is that retry. What a sync proposes is read from the metadata and the state when it runs.
#[derive(Debug, Default)]
pub(super) struct ConfigSync {
    retry_at: Option<Instant>,
}

/// What the config sync machine hears.
#[derive(Debug, Clone, Copy)]
pub(super) enum ConfigEvent {
    /// The metadata's view of the queue may differ from the queue's own (the actor started,
    /// the metadata changed it, or the machine was upgraded).
    Changed,
    /// The actor's timer fired.
    Tick,
    /// The sync it asked for failed.
    Failed,
}

/// What the config sync machine asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ConfigAction {
    /// Bring the queue's configuration and consumer timeout in line with the metadata.
    Sync,
}

impl ConfigSync {
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.retry_at
    }

    pub(super) fn on_event(&mut self, now: Instant, event: ConfigEvent) -> Vec<ConfigAction> {
        match event {
            ConfigEvent::Tick if self.retry_at.is_none_or(|t| t > now) => vec![],
            ConfigEvent::Changed | ConfigEvent::Tick => {
                self.retry_at = None;
                vec![ConfigAction::Sync]
            }
            ConfigEvent::Failed => {
                self.retry_at = Some(now + PROPOSAL_RETRY);
                vec![]
            }
        }
    }
}

impl QueueLeader {
    /// Feed the config sync machine `event` and carry out its sync, if it asks for one.
    pub(super) async fn config_event(&self, sync: &mut ConfigSync, event: ConfigEvent) {
        for ConfigAction::Sync in sync.on_event(self.ctx.clock.now(), event) {
            if !self.try_sync_config().await {
                sync.on_event(self.ctx.clock.now(), ConfigEvent::Failed);
            }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_change_syncs_at_once_and_a_failure_retries_after_a_pause() {
        let t0 = Instant::now();
        let mut sync = ConfigSync::default();
        assert_eq!(sync.on_event(t0, ConfigEvent::Tick), vec![], "nothing owed");
        assert_eq!(
            sync.on_event(t0, ConfigEvent::Changed),
            vec![ConfigAction::Sync]
        );
        assert_eq!(sync.next_deadline(), None);
        sync.on_event(t0, ConfigEvent::Failed);
        let retry = t0 + PROPOSAL_RETRY;
        assert_eq!(sync.next_deadline(), Some(retry));
        let early = retry - Duration::from_millis(1);
        assert_eq!(sync.on_event(early, ConfigEvent::Tick), vec![]);
        assert_eq!(
            sync.on_event(retry, ConfigEvent::Tick),
            vec![ConfigAction::Sync]
        );
        assert_eq!(sync.next_deadline(), None, "the retry is spent");
    }

    #[test]
    fn a_change_during_the_pause_syncs_at_once() {
        let t0 = Instant::now();
        let mut sync = ConfigSync::default();
        sync.on_event(t0, ConfigEvent::Failed);
        assert_eq!(
            sync.on_event(t0, ConfigEvent::Changed),
            vec![ConfigAction::Sync]
        );
        assert_eq!(sync.next_deadline(), None);
    }
}
