//! The supervisor: keeps the queue groups running here, and the peer set, in line with the
//! metadata. It acts on the metadata machine's effects as they come; after a metadata snapshot
//! install, an effect that did not fit its channel, or a failed start, it compares every group
//! with the state instead ([`Node::reconcile`]).
//!
//! Must not: open or close a replica itself ([`super::replicas`] does), or decide anything a
//! queue's leader decides.

use std::sync::Arc;
use std::time::Duration;

use qq_core::meta::{MetaEffect, QueueMeta};
use qq_raft::GroupId;
use tokio::sync::mpsc;

use super::Node;
use crate::clock::sleep_until;
use crate::groups::registry::Replica;

/// How long the supervisor waits before it tries again to start a group that failed to start.
const START_RETRY: Duration = Duration::from_secs(2);

impl Node {
    /// Keep the running queue groups in line with the metadata until shutdown.
    pub(super) async fn supervise(self: Arc<Self>, mut effects: mpsc::Receiver<MetaEffect>) {
        let mut resync = self.registry.meta_machine().subscribe_resync();
        let mut retry: Option<tokio::time::Instant> = None;
        if !self.reconcile().await {
            retry = Some(self.clock.now() + START_RETRY);
        }
        loop {
            let retry_at = retry;
            let ok = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                effect = effects.recv() => match effect {
                    Some(effect) => self.on_effect(effect).await,
                    None => return,
                },
                r = resync.changed() => {
                    if r.is_err() { return }
                    self.reconcile().await
                }
                _ = sleep_until(retry_at) => {
                    retry = None;
                    self.reconcile().await
                }
            };
            if !ok && retry.is_none() {
                retry = Some(self.clock.now() + START_RETRY);
            }
        }
    }

    /// Act on one metadata effect, checked against the current state (effects of a log being
    /// replayed at start may be stale). False if a group failed to start.
    async fn on_effect(&self, effect: MetaEffect) -> bool {
        let current = self.view.current();
        match effect {
            MetaEffect::QueueCreated(created) => {
                let Some(qm) = current.queue_by_id(created.id).cloned() else {
                    return true;
                };
                if qm.members.contains(&self.id) && !self.registry.hosts(qm.id) {
                    let started = self.start_queue_group(qm).await;
                    if started {
                        self.initialise_unless_heard(created);
                    }
                    return started;
                }
            }
            MetaEffect::QueueDeleted(qm) => {
                if current.queue_by_id(qm.id).is_none() {
                    self.stop_queue_group(qm.id).await;
                }
            }
            MetaEffect::QueueConfigChanged(qm) => {
                if self.registry.hosts(qm.id) {
                    let id = qm.id;
                    self.registry.update_meta(qm);
                    self.config_changed(id).await;
                }
            }
            MetaEffect::QueueMembersChanged(qm) => {
                let Some(qm) = current.queue_by_id(qm.id).cloned() else {
                    return true;
                };
                let mine = qm.replicas().any(|n| n == self.id);
                match (mine, self.registry.hosts(qm.id)) {
                    (true, false) => return self.start_queue_group(qm).await,
                    (false, true) => self.stop_queue_group(qm.id).await,
                    (true, true) => self.registry.update_meta(qm),
                    (false, false) => {}
                }
            }
            MetaEffect::NodesChanged => self.sync_peers(),
        }
        true
    }

    /// Bring the peer set in line with the metadata ([`Members::sync_peers`]).
    pub fn sync_peers(&self) {
        self.members.sync_peers();
    }

    /// Make the peers and the running queue groups match the metadata. False if a group
    /// failed to start.
    async fn reconcile(&self) -> bool {
        self.sync_peers();
        let wanted: Vec<QueueMeta> = self
            .view
            .current()
            .queues()
            .filter(|q| q.replicas().any(|n| n == self.id))
            .cloned()
            .collect();
        let wanted_ids: std::collections::HashSet<GroupId> = wanted.iter().map(|q| q.id).collect();
        for group in self.registry.running() {
            if !wanted_ids.contains(&group) {
                self.stop_queue_group(group).await;
            }
        }
        let mut ok = true;
        for qm in wanted {
            match self.registry.replica(qm.id) {
                None => ok &= self.start_queue_group(qm).await,
                Some(r) => {
                    let id = qm.id;
                    let changed = r.meta().config != qm.config;
                    self.registry.update_meta(qm);
                    if changed {
                        self.config_changed(id).await;
                    }
                }
            }
        }
        ok
    }

    /// A hosted queue's configuration changed in the metadata: its leader actor brings the
    /// queue's own log in line. An unloaded replica that leads is loaded for it (its actor
    /// syncs the configuration as it starts).
    async fn config_changed(&self, group: GroupId) {
        match self.registry.replica(group) {
            Some(Replica::Loaded(g)) => g.machine.notify_config_changed(),
            Some(Replica::Unloaded(_)) if self.registry.is_queue_leader(group) => {
                self.registry.load(group).await;
            }
            _ => {}
        }
    }
}
