//! The openraft state machine of the metadata group (group 0, on every node): a shell around
//! the pure [`qq_core::meta::MetaState`].
//!
//! Every node holds a full replica, so routing and permission checks read it locally. After
//! each applied batch the node is told (a watch counter) and reconciles its queue groups with
//! the metadata: it starts groups of new queues it is a member of, stops deleted ones, and, where
//! it leads a queue, proposes the queue's new effective configuration into the queue's own log.

use std::io;
use std::sync::{Arc, Mutex, RwLock};

use futures::{Stream, StreamExt};
use openraft::EntryPayload;
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use qq_core::meta::{MetaCommand, MetaState};
use qq_raft::store::Store;
use qq_raft::{META_GROUP, Response, TypeConfig};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::queue_sm::{current_snapshot, encode, save_snapshot};

pub struct MetaShared {
    pub store: Store,
    pub state: RwLock<MetaState>,
    pub last_applied: Mutex<Option<LogIdOf<TypeConfig>>>,
    /// Bumped after every applied batch: topology may have changed.
    pub applied: watch::Sender<u64>,
}

impl MetaShared {
    pub fn new(store: Store) -> Arc<MetaShared> {
        Arc::new(MetaShared {
            store,
            state: RwLock::new(MetaState::new()),
            last_applied: Mutex::new(None),
            applied: watch::channel(0).0,
        })
    }
}

#[derive(Serialize, Deserialize)]
struct MetaSnapshot {
    state: MetaState,
}

pub struct MetaSm {
    pub shared: Arc<MetaShared>,
    membership: StoredMembershipOf<TypeConfig>,
}

impl MetaSm {
    pub fn new(shared: Arc<MetaShared>) -> MetaSm {
        MetaSm {
            shared,
            membership: Default::default(),
        }
    }
}

impl RaftStateMachine<TypeConfig> for MetaSm {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = MetaSnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogIdOf<TypeConfig>>, StoredMembershipOf<TypeConfig>), io::Error> {
        Ok((
            *self.shared.last_applied.lock().unwrap(),
            self.membership.clone(),
        ))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + Send,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let mut payload = Vec::new();
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembershipOf::<TypeConfig>::new(Some(entry.log_id), m);
                }
                EntryPayload::Normal(req) => {
                    let cmd: MetaCommand = postcard::from_bytes(&req.payload).map_err(|e| {
                        io::Error::other(format!(
                            "metadata: decode entry {}: {e}",
                            entry.log_id.index
                        ))
                    })?;
                    let (result, _effects) = self.shared.state.write().unwrap().apply(cmd);
                    // The index travels with the reply so the proposer can wait for replicas to apply it.
                    payload = encode(&(entry.log_id.index, result))?;
                }
            }
            *self.shared.last_applied.lock().unwrap() = Some(entry.log_id);
            if let Some(responder) = responder {
                responder.send(Response { payload });
            }
        }
        self.shared.applied.send_modify(|n| *n += 1);
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> MetaSnapshotBuilder {
        MetaSnapshotBuilder {
            shared: self.shared.clone(),
            state: self.shared.state.read().unwrap().clone(),
            last_applied: *self.shared.last_applied.lock().unwrap(),
            membership: self.membership.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        let snap: MetaSnapshot = postcard::from_bytes(&snapshot)
            .map_err(|e| io::Error::other(format!("metadata: decode snapshot: {e}")))?;
        *self.shared.state.write().unwrap() = snap.state;
        *self.shared.last_applied.lock().unwrap() = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        save_snapshot(&self.shared.store, META_GROUP, meta.clone(), snapshot).await?;
        self.shared.applied.send_modify(|n| *n += 1);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Vec<u8>>>, io::Error> {
        current_snapshot(&self.shared.store, META_GROUP)
    }
}

pub struct MetaSnapshotBuilder {
    shared: Arc<MetaShared>,
    state: MetaState,
    last_applied: Option<LogIdOf<TypeConfig>>,
    membership: StoredMembershipOf<TypeConfig>,
}

impl RaftSnapshotBuilder<TypeConfig> for MetaSnapshotBuilder {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TypeConfig, Vec<u8>>, io::Error> {
        let data = encode(&MetaSnapshot {
            state: self.state.clone(),
        })?;
        let meta = SnapshotMetaOf::<TypeConfig> {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
        };
        save_snapshot(&self.shared.store, META_GROUP, meta, data).await
    }
}
