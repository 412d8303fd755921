//! The queue's machine follows the releases its members run: once every member (voters and
//! learners, which apply the log too) is known to run a newer machine version than the
//! queue's, the leader proposes `SetMachineVersion` (qq-core's module `queue::machine`), as Ra
//! moves a cluster to a new machine version. Until then the queue keeps the older behaviour,
//! so a cluster in the middle of a rolling upgrade stays correct.
//!
//! The leader looks when it becomes leader, when the group wakes, and at most every
//! [`UPGRADE_CHECK`] ([`UNKNOWN_CHECK`] while a member's version is unknown) while entries
//! are applied; an idle queue that lags keeps no timer (it
//! moves on when it is next used or elected). A queue at this release's version never looks.

use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use qq_core::NodeId;
use qq_core::queue::{Command, MACHINE_VERSION, Reply};
use tokio::time::Instant;
use tracing::{debug, info};

use super::QueueLeader;

/// How often an active queue whose machine lags behind a member's release looks at its
/// members' versions again.
const UPGRADE_CHECK: Duration = Duration::from_secs(5);
/// The same while a member's version is not known yet (its watch is opening).
const UNKNOWN_CHECK: Duration = Duration::from_millis(500);

/// The upgrade sub-machine: look at the members' versions when the actor starts, when the
/// group wakes, and on an applied entry once the pause the last look named is over. It has no
/// deadline of its own: an idle queue that lags keeps no timer.
#[derive(Debug, Default)]
pub(super) struct Upgrade {
    /// Not before this does an applied entry make it look again (None: the queue runs this
    /// release's version, or no look has been made yet).
    look_at: Option<Instant>,
}

/// What the upgrade machine hears.
#[derive(Debug, Clone, Copy)]
pub(super) enum UpgradeEvent {
    /// The actor started, or the group woke.
    Started,
    /// Entries were applied.
    Applied,
    /// A look ended: `pause`, when to look again (None: the queue runs this release's
    /// version); `upgraded`: the queue's machine moved on.
    Looked {
        pause: Option<Duration>,
        upgraded: bool,
    },
}

/// What the upgrade machine asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum UpgradeAction {
    /// Look at the members' versions and upgrade the queue's machine if they all run newer.
    Look,
    /// The machine moved on: sync the settings only its new version has (config sync).
    SyncConfig,
}

impl Upgrade {
    pub(super) fn on_event(&mut self, now: Instant, event: UpgradeEvent) -> Vec<UpgradeAction> {
        match event {
            UpgradeEvent::Started => vec![UpgradeAction::Look],
            UpgradeEvent::Applied if self.look_at.is_some_and(|t| t <= now) => {
                vec![UpgradeAction::Look]
            }
            UpgradeEvent::Applied => vec![],
            UpgradeEvent::Looked { pause, upgraded } => {
                self.look_at = pause.map(|p| now + p);
                if upgraded {
                    vec![UpgradeAction::SyncConfig]
                } else {
                    vec![]
                }
            }
        }
    }
}

/// What a look at the members' versions decides.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// A member's version is not known yet (its watch is opening): look again soon.
    Unknown,
    /// Some member runs no newer version than the queue's: look again later.
    Wait,
    /// Every member runs this version, newer than the queue's: propose it.
    Upgrade(u32),
}

/// The verdict for a queue at version `current` whose members all run at least `common`
/// (None: a member's version is unknown).
fn verdict(current: u32, common: Option<u32>) -> Verdict {
    match common {
        None => Verdict::Unknown,
        Some(v) if v <= current => Verdict::Wait,
        Some(v) => Verdict::Upgrade(v),
    }
}

impl QueueLeader {
    /// Move the queue's machine to the newest version every member runs, if that is newer
    /// than the queue's. Returns when to look again while the queue still lags behind this
    /// release (None: it does not).
    pub(super) async fn upgrade_machine(&self) -> Option<Duration> {
        let current = self.machine.with_state(|s| s.machine_version());
        if current >= MACHINE_VERSION {
            return None;
        }
        let members: Vec<NodeId> = {
            let m = self.raft.metrics();
            let m = m.borrow_watched();
            let membership = m.membership_config.membership();
            membership
                .voter_ids()
                .chain(membership.learner_ids())
                .collect()
        };
        let common = match verdict(
            current,
            self.ctx.machines.common_version(self.ctx.me, members),
        ) {
            Verdict::Unknown => {
                debug!(
                    group = self.group,
                    "machine upgrade waits: a member's version is unknown"
                );
                return Some(UNKNOWN_CHECK);
            }
            Verdict::Wait => return Some(UPGRADE_CHECK),
            Verdict::Upgrade(common) => common,
        };
        match self
            .propose(Command::SetMachineVersion { version: common })
            .await
        {
            Ok(Reply::Ok) => info!(
                group = self.group,
                from = current,
                to = common,
                "queue machine upgraded: every member runs the new version"
            ),
            Ok(other) => debug!(group = self.group, "machine upgrade refused: {other:?}"),
            Err(e) => debug!(group = self.group, "machine upgrade not committed: {e}"),
        }
        (self.machine.with_state(|s| s.machine_version()) < MACHINE_VERSION)
            .then_some(UPGRADE_CHECK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lagging_queue_looks_again_on_activity_after_the_pause() {
        let t0 = Instant::now();
        let mut upgrade = Upgrade::default();
        assert_eq!(
            upgrade.on_event(t0, UpgradeEvent::Started),
            vec![UpgradeAction::Look]
        );
        let lags = UpgradeEvent::Looked {
            pause: Some(UPGRADE_CHECK),
            upgraded: false,
        };
        assert_eq!(upgrade.on_event(t0, lags), vec![]);
        let early = t0 + UPGRADE_CHECK - Duration::from_millis(1);
        assert_eq!(upgrade.on_event(early, UpgradeEvent::Applied), vec![]);
        let due = t0 + UPGRADE_CHECK;
        assert_eq!(
            upgrade.on_event(due, UpgradeEvent::Applied),
            vec![UpgradeAction::Look]
        );
    }

    #[test]
    fn an_upgraded_queue_syncs_its_config_and_stops_looking() {
        let t0 = Instant::now();
        let mut upgrade = Upgrade::default();
        let done = UpgradeEvent::Looked {
            pause: None,
            upgraded: true,
        };
        assert_eq!(upgrade.on_event(t0, done), vec![UpgradeAction::SyncConfig]);
        let much_later = t0 + Duration::from_secs(3_600);
        assert_eq!(upgrade.on_event(much_later, UpgradeEvent::Applied), vec![]);
        // A wake looks again all the same (a member may have been upgraded meanwhile).
        let woke = upgrade.on_event(much_later, UpgradeEvent::Started);
        assert_eq!(woke, vec![UpgradeAction::Look]);
    }

    #[test]
    fn the_machine_moves_only_to_a_version_every_member_runs() {
        assert_eq!(verdict(1, None), Verdict::Unknown);
        assert_eq!(
            verdict(1, Some(1)),
            Verdict::Wait,
            "a member still runs version 1"
        );
        assert_eq!(verdict(2, Some(1)), Verdict::Wait, "never backwards");
        assert_eq!(verdict(1, Some(2)), Verdict::Upgrade(2));
    }
}
