//! The one openraft state-machine shell shared by the metadata group and every queue group.
//!
//! openraft asks a state machine for the same things whatever it holds: apply a stream of
//! entries (blank, membership, normal), remember the membership, build, install and return
//! snapshots. This shell does all of that once; a group's [`Machine`] only says how to apply a
//! normal entry's payload, how to cut and encode its state for a snapshot, and how to install
//! one. Snapshots are persisted in the node's RocksDB (durably, through the fsync thread), so a
//! restart replays the log from the last snapshot.
//!
//! Must not: read a clock, talk to peers or clients. What a machine does inside `apply` is
//! deterministic IO at most (message bodies in RocksDB).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{Stream, StreamExt};
use openraft::EntryPayload;
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use qq_raft::store::Store;
use qq_raft::{GroupId, Response, TypeConfig};
use serde::{Deserialize, Serialize};
use tracing::warn;

pub type LogId = LogIdOf<TypeConfig>;

/// What a group's state machine provides to the [`Shell`].
pub trait Machine: Send + Sync + 'static {
    /// The state as of the last applied entry, captured in the state-machine worker so that
    /// later applies do not change it; encoded later by [`Machine::encode_cut`].
    type Cut: Send + Sync + 'static;

    fn group(&self) -> GroupId;
    fn store(&self) -> &Store;
    /// Apply one normal entry's payload at `index`; returns the encoded reply. A payload that
    /// does not decode or holds an invalid command is not an error: it is applied as a no-op
    /// ([`Refusals`]) with an error reply. An error stops the group (storage failure): never
    /// "log and continue".
    fn apply_payload(&self, index: u64, payload: &[u8]) -> io::Result<Vec<u8>>;
    /// Called after every applied batch of entries (waiters and timers watch it).
    fn applied_batch(&self);
    fn last_applied(&self) -> Option<LogId>;
    fn set_last_applied(&self, log_id: Option<LogId>);
    fn cut(&self) -> Self::Cut;
    fn encode_cut(&self, cut: Self::Cut) -> io::Result<Vec<u8>>;
    /// Replace the state with a snapshot's (and its bodies, for queues).
    fn install(&self, data: &[u8]) -> io::Result<()>;
}

/// What is persisted for a group's current snapshot.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMetaOf<TypeConfig>,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

pub struct Shell<M: Machine> {
    machine: Arc<M>,
    membership: StoredMembershipOf<TypeConfig>,
}

impl<M: Machine> Shell<M> {
    pub fn new(machine: Arc<M>) -> Shell<M> {
        Shell {
            machine,
            membership: Default::default(),
        }
    }
}

fn encode<T: Serialize>(v: &T) -> io::Result<Vec<u8>> {
    postcard::to_stdvec(v).map_err(|e| io::Error::other(format!("encode: {e}")))
}

impl<M: Machine> RaftStateMachine<TypeConfig> for Shell<M> {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = Builder<M>;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembershipOf<TypeConfig>), io::Error> {
        Ok((self.machine.last_applied(), self.membership.clone()))
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
                    payload = self
                        .machine
                        .apply_payload(entry.log_id.index, &req.payload)?;
                }
            }
            self.machine.set_last_applied(Some(entry.log_id));
            if let Some(responder) = responder {
                responder.send(Response { payload });
            }
        }
        self.machine.applied_batch();
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Builder<M> {
        Builder {
            machine: self.machine.clone(),
            cut: Some(self.machine.cut()),
            last_applied: self.machine.last_applied(),
            membership: self.membership.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        self.machine.install(&snapshot)?;
        self.machine.set_last_applied(meta.last_log_id);
        self.membership = meta.last_membership.clone();
        save(
            self.machine.store(),
            self.machine.group(),
            meta.clone(),
            snapshot,
        )
        .await?;
        self.machine.applied_batch();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Vec<u8>>>, io::Error> {
        let group = self.machine.group();
        let Some(bytes) = self.machine.store().get_snapshot(group)? else {
            return Ok(None);
        };
        let stored: StoredSnapshot = postcard::from_bytes(&bytes)
            .map_err(|e| io::Error::other(format!("group {group}: decode stored snapshot: {e}")))?;
        Ok(Some(SnapshotOf::<TypeConfig, Vec<u8>> {
            meta: stored.meta,
            snapshot: stored.data,
        }))
    }
}

/// Persist `data` as the group's current snapshot and hand it back in openraft's form.
async fn save(
    store: &Store,
    group: GroupId,
    meta: SnapshotMetaOf<TypeConfig>,
    data: Vec<u8>,
) -> io::Result<SnapshotOf<TypeConfig, Vec<u8>>> {
    let stored = StoredSnapshot { meta, data };
    store.put_snapshot(group, &encode(&stored)?).await?;
    Ok(SnapshotOf::<TypeConfig, Vec<u8>> {
        meta: stored.meta,
        snapshot: stored.data,
    })
}

pub struct Builder<M: Machine> {
    machine: Arc<M>,
    cut: Option<M::Cut>,
    last_applied: Option<LogId>,
    membership: StoredMembershipOf<TypeConfig>,
}

impl<M: Machine> RaftSnapshotBuilder<TypeConfig> for Builder<M> {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TypeConfig, Vec<u8>>, io::Error> {
        let cut = self
            .cut
            .take()
            .ok_or_else(|| io::Error::other("snapshot builder used twice"))?;
        let data = self.machine.encode_cut(cut)?;
        let meta = SnapshotMetaOf::<TypeConfig> {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
        };
        save(self.machine.store(), self.machine.group(), meta, data).await
    }
}

/// Committed entries a machine refused at apply because they do not decode or hold an invalid
/// command. Raft replicates bytes, so such an entry (from a buggy or malicious proposer) is
/// committed like any other; every replica refuses it the same way, leaves its state as it was
/// and answers an error, so the group stays available, also when the log is replayed at
/// restart. Counted per group, logged with the index.
#[derive(Default)]
pub struct Refusals(AtomicU64);

impl Refusals {
    pub fn record(&self, group: GroupId, index: u64, why: &str) {
        let total = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        warn!(
            group,
            index,
            refused_entries = total,
            "entry refused and applied as a no-op: {why}"
        );
    }

    /// Entries refused since this node started (replays at restart count again).
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}
