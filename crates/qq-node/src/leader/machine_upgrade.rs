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
use tracing::{debug, info};

use super::QueueLeader;

/// How often an active queue whose machine lags behind a member's release looks at its
/// members' versions again.
const UPGRADE_CHECK: Duration = Duration::from_secs(5);
/// The same while a member's version is not known yet (its watch is opening).
const UNKNOWN_CHECK: Duration = Duration::from_millis(500);

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
        let Some(common) = self.ctx.machines.common_version(self.ctx.me, members) else {
            debug!(
                group = self.group,
                "machine upgrade waits: a member's version is unknown"
            );
            return Some(UNKNOWN_CHECK);
        };
        if common <= current {
            return Some(UPGRADE_CHECK);
        }
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
