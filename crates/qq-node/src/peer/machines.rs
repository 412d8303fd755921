//! Which queue and metadata machine versions each peer runs, as its watch stream says
//! (`WatchEvent.machine_version` and `meta_machine_version`; a node that leaves one 0 runs
//! version 1 of it: release 0.1.0 sets neither, the release after it only the first).
//!
//! A queue's leader asks this before it moves the queue's machine on
//! (`Command::SetMachineVersion`, see `qq_core::queue`'s module `machine`), and the metadata
//! leader before it moves the metadata machine on (`MetaCommand::SetMachineVersion`, module
//! `node::meta_upgrade`): only when every member of the group is known to run the new version. A peer whose watch is not open is not
//! known (it may be restarting with another release), so a group with such a member waits.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use qq_core::NodeId;
use qq_core::meta::{FIRST_META_MACHINE_VERSION, META_MACHINE_VERSION};
use qq_core::queue::{FIRST_MACHINE_VERSION, MACHINE_VERSION};

/// What one peer runs: its queue machine version, then its metadata machine version.
type Versions = (u32, u32);

/// Shared by the peer watches (which write) and the leader actors (which read). One entry per
/// peer at most: bounded by the cluster's size.
#[derive(Clone, Default)]
pub struct PeerMachines(Arc<Mutex<BTreeMap<NodeId, Versions>>>);

impl PeerMachines {
    /// `peer`'s watch said it runs queue machine `queue` and metadata machine `meta` (0 from a
    /// release that does not say: version 1).
    pub fn record(&self, peer: NodeId, queue: u32, meta: u32) {
        let versions = (
            queue.max(FIRST_MACHINE_VERSION),
            meta.max(FIRST_META_MACHINE_VERSION),
        );
        self.0.lock().unwrap().insert(peer, versions);
    }

    /// `peer`'s watch ended: what it runs is unknown until it opens again.
    pub fn forget(&self, peer: NodeId) {
        self.0.lock().unwrap().remove(&peer);
    }

    /// The version `peer` runs; an unknown one counts as [`FIRST_MACHINE_VERSION`] (send it
    /// nothing a 0.1.0 node could not decode).
    pub fn version_of(&self, me: NodeId, peer: NodeId) -> u32 {
        self.common_version(me, [peer])
            .unwrap_or(FIRST_MACHINE_VERSION)
    }

    /// The newest queue machine version every one of `members` runs (this node, `me`, runs
    /// [`MACHINE_VERSION`]); None while a member's is unknown.
    pub fn common_version(
        &self,
        me: NodeId,
        members: impl IntoIterator<Item = NodeId>,
    ) -> Option<u32> {
        self.common(me, members, MACHINE_VERSION, |v| v.0)
    }

    /// The same for the metadata machine (this node runs [`META_MACHINE_VERSION`]).
    pub fn common_meta_version(
        &self,
        me: NodeId,
        members: impl IntoIterator<Item = NodeId>,
    ) -> Option<u32> {
        self.common(me, members, META_MACHINE_VERSION, |v| v.1)
    }

    fn common(
        &self,
        me: NodeId,
        members: impl IntoIterator<Item = NodeId>,
        mine: u32,
        of: impl Fn(&Versions) -> u32,
    ) -> Option<u32> {
        let known = self.0.lock().unwrap();
        members.into_iter().try_fold(mine, |v, m| {
            let theirs = if m == me { mine } else { of(known.get(&m)?) };
            Some(v.min(theirs))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_version_waits_for_every_member() {
        let m = PeerMachines::default();
        assert_eq!(m.common_version(1, [1]), Some(MACHINE_VERSION));
        assert_eq!(m.common_version(1, [1, 2, 3]), None, "2 and 3 unknown");
        m.record(2, MACHINE_VERSION, META_MACHINE_VERSION);
        m.record(3, 0, 0); // release 0.1.0 says nothing
        assert_eq!(m.common_version(1, [1, 2, 3]), Some(FIRST_MACHINE_VERSION));
        assert_eq!(m.common_meta_version(1, [1, 2]), Some(META_MACHINE_VERSION));
        assert_eq!(
            m.common_meta_version(1, [1, 2, 3]),
            Some(FIRST_META_MACHINE_VERSION)
        );
        m.record(3, MACHINE_VERSION, 0); // the release before metadata versions
        assert_eq!(m.common_version(1, [1, 2, 3]), Some(MACHINE_VERSION));
        assert_eq!(
            m.common_meta_version(1, [1, 2, 3]),
            Some(FIRST_META_MACHINE_VERSION)
        );
        m.forget(2);
        assert_eq!(m.common_version(1, [1, 2, 3]), None);
    }
}
