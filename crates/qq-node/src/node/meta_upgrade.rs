//! The metadata machine follows the releases the nodes run, as a queue's does (module
//! `leader::machine_upgrade`): once every member of the metadata group (voters and learners)
//! is known to run a newer metadata machine version than the log's, the metadata leader
//! proposes `MetaCommand::SetMachineVersion` (qq-core's module `meta::machine`). Until then
//! the commands of the newer version (exchange-to-exchange bindings, operator policies) are
//! refused with FAILED_PRECONDITION, so a cluster in the middle of a rolling upgrade stays
//! correct.
//!
//! One task per node: it looks every [`CHECK`] and ends once the log runs this release's
//! version (a fresh cluster gets there within a second or so of electing its metadata leader).
//! While the version lags the check costs a lock and a read of the Raft metrics.

use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use qq_core::NodeId;
use qq_core::meta::{META_MACHINE_VERSION, MetaCommand};
use tracing::{debug, info};

use super::Node;

/// How often the task looks while the metadata machine lags behind this release.
const CHECK: Duration = Duration::from_millis(500);

impl Node {
    pub(super) async fn upgrade_meta_machine(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = self.stopping().cancelled() => return,
                _ = tokio::time::sleep(CHECK) => {}
            }
            let current = self.view().current().machine_version();
            if current >= META_MACHINE_VERSION {
                return;
            }
            let Some(members) = self.meta_members_if_leading() else {
                continue;
            };
            let machines = self.peer_machines();
            let Some(common) = machines.common_meta_version(self.id(), members) else {
                debug!("metadata machine upgrade waits: a node's version is unknown");
                continue;
            };
            if common <= current {
                continue;
            }
            let cmd = MetaCommand::SetMachineVersion { version: common };
            match self.proposer().propose_meta(cmd).await {
                Ok(Ok(_)) => info!(
                    from = current,
                    to = common,
                    "metadata machine upgraded: every node runs the new version"
                ),
                Ok(Err(e)) => debug!("metadata machine upgrade refused: {e}"),
                Err(e) => debug!("metadata machine upgrade not committed: {e}"),
            }
        }
    }

    /// The metadata group's voters and learners, if this node leads it.
    fn meta_members_if_leading(&self) -> Option<Vec<NodeId>> {
        let metrics = self.registry().meta_raft().metrics();
        let m = metrics.borrow_watched();
        if m.current_leader != Some(self.id()) {
            return None;
        }
        let membership = m.membership_config.membership();
        Some(
            membership
                .voter_ids()
                .chain(membership.learner_ids())
                .collect(),
        )
    }
}
