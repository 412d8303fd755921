//! The queue's configuration in its own log follows the metadata's (`UpdateConfig`), and so
//! does its consumer timeout (`SetConsumerTimeout`, from the queue's argument or policy, else
//! the node's `consumer_timeout_ms`).

use qq_core::QueueConfig;
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

    /// Propose what the metadata wants and the queue's log lacks, in order; false if a
    /// proposal failed (those after it are not made).
    async fn try_sync_config(&self) -> bool {
        let Some(facts) = self.config_facts() else {
            return true; // deleted: the supervisor stops the group
        };
        for cmd in plan(&facts, self.ctx.clock.now_ms()) {
            if let Err(e) = self.propose(cmd).await {
                debug!("config sync not applied yet: {e}");
                return false;
            }
        }
        true
    }

    /// What the metadata wants of the queue and what its log has (None: the queue is
    /// deleted). The consumer timeout wanted: the queue's argument or policy, else the node's
    /// default.
    fn config_facts(&self) -> Option<ConfigFacts> {
        let wanted = self.ctx.view.queue_by_id(self.group)?;
        let view = self.ctx.view.current();
        let default = self.ctx.default_consumer_timeout_ms;
        let wanted_timeout_ms =
            policy::consumer_timeout_ms(&wanted.arguments, view.policy_of(&wanted))
                .or((default > 0).then_some(default));
        let (current, current_timeout_ms, machine_version) = self.machine.with_state(|s| {
            let current = s.config().clone();
            (current, s.consumer_timeout_ms(), s.machine_version())
        });
        Some(ConfigFacts {
            wanted: wanted.config.clone(),
            current,
            wanted_timeout_ms,
            current_timeout_ms,
            machine_version,
        })
    }
}

/// What the metadata wants of a queue and what the queue's own log has.
#[derive(Debug, Clone)]
pub(super) struct ConfigFacts {
    pub(super) wanted: QueueConfig,
    pub(super) current: QueueConfig,
    pub(super) wanted_timeout_ms: Option<u64>,
    pub(super) current_timeout_ms: Option<u64>,
    pub(super) machine_version: u32,
}

/// The proposals a sync makes at `now_ms`, in order: `UpdateConfig` if the configuration
/// differs, then `SetConsumerTimeout` if the timeout differs and the queue's machine has one
/// (version 2; until then the queue has none). `UpdateConfig` leaves the timeout and the
/// version as they are, so both are decided from one reading.
pub(super) fn plan(facts: &ConfigFacts, now_ms: u64) -> Vec<Command> {
    let mut cmds = vec![];
    if facts.current != facts.wanted {
        cmds.push(Command::UpdateConfig {
            now_ms,
            config: facts.wanted.clone(),
        });
    }
    if facts.current_timeout_ms != facts.wanted_timeout_ms && facts.machine_version >= 2 {
        cmds.push(Command::SetConsumerTimeout {
            timeout_ms: facts.wanted_timeout_ms,
        });
    }
    cmds
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

    fn facts() -> ConfigFacts {
        let config = QueueConfig::new("/", "q");
        ConfigFacts {
            wanted: config.clone(),
            current: config,
            wanted_timeout_ms: Some(30_000),
            current_timeout_ms: Some(30_000),
            machine_version: 2,
        }
    }

    #[test]
    fn a_sync_proposes_only_what_differs_config_first() {
        assert!(plan(&facts(), 7).is_empty(), "in line: nothing to propose");
        let mut f = facts();
        f.wanted.max_length = Some(10);
        f.wanted_timeout_ms = None;
        let cmds = plan(&f, 7);
        assert_eq!(cmds.len(), 2);
        assert!(
            matches!(&cmds[0], Command::UpdateConfig { now_ms: 7, config } if config.max_length == Some(10)),
            "{cmds:?}"
        );
        assert!(
            matches!(cmds[1], Command::SetConsumerTimeout { timeout_ms: None }),
            "{cmds:?}"
        );
    }

    #[test]
    fn a_machine_before_version_2_gets_no_consumer_timeout() {
        let mut f = facts();
        f.wanted_timeout_ms = Some(5_000);
        f.machine_version = 1;
        assert!(plan(&f, 7).is_empty());
        f.machine_version = 2;
        let cmds = plan(&f, 7);
        assert!(
            matches!(
                cmds[..],
                [Command::SetConsumerTimeout {
                    timeout_ms: Some(5_000)
                }]
            ),
            "{cmds:?}"
        );
    }
}
