//! The one openraft state-machine shell shared by the metadata group and every queue group.
//!
//! openraft asks a state machine for the same things whatever it holds: apply a stream of
//! entries (blank, membership, normal), remember the membership, build, install and return
//! snapshots. This shell does all of that once; a group's [`Machine`] only says how to apply a
//! normal entry's payload, how to cut its state for a snapshot and write the cut into a snapshot
//! file, and how to install one from a file. Snapshots are files ([`qq_raft::snapshot`]),
//! written and read on a blocking thread, never whole in memory; the group's record in RocksDB
//! names its current file (made durable through the fsync thread), so a restart installs that
//! file and replays the log after it.
//!
//! A snapshot that cannot be written, read back or recorded is a storage fault: the store's
//! fault handler stops the node (fail-stop, as for a failed RocksDB write), rather than
//! leave one group failed on a running node. One exception: a snapshot a machine [`refused`]
//! to write because its state breaks an invariant is a bug that every replica applying the
//! same log would hit, so it stops only this group on this node (openraft's build fails), not
//! the node, and the log stays for a fixed release to replay.
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
use qq_raft::snapshot::{SnapshotFile, SnapshotReader, SnapshotWriter};
use qq_raft::store::{Store, snapshot_record, snapshot_record_file, snapshot_record_rest};
use qq_raft::{GroupId, Response, TypeConfig};
use tracing::warn;

pub type LogId = LogIdOf<TypeConfig>;

/// What a group's state machine provides to the [`Shell`].
pub trait Machine: Send + Sync + 'static {
    /// The state as of the last applied entry, captured in the state-machine worker so that
    /// later applies do not change it; written later by [`Machine::write_cut`].
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
    /// Write the cut into a snapshot file (header, then bodies). Blocking IO: runs on a
    /// blocking thread. A cut whose state breaks an invariant is not written: the error is
    /// [`refused`].
    fn write_cut(&self, cut: Self::Cut, out: &mut SnapshotWriter) -> io::Result<()>;
    /// Replace the state with a snapshot's (and its bodies, for queues), streaming it. Blocking
    /// IO: runs on a blocking thread.
    fn install(&self, snapshot: &mut SnapshotReader) -> io::Result<()>;
}

/// The membership as of the last applied entry, shared with whoever outlives this shell: a
/// queue replica unloaded and loaded again ([`super::registry`]) gets a new shell around the
/// same machine, and openraft reads the applied membership from it at start.
pub type AppliedMembership = Arc<std::sync::Mutex<StoredMembershipOf<TypeConfig>>>;

pub struct Shell<M: Machine> {
    machine: Arc<M>,
    membership: AppliedMembership,
}

impl<M: Machine> Shell<M> {
    pub fn new(machine: Arc<M>) -> Shell<M> {
        Shell::resume(machine, AppliedMembership::default())
    }

    /// A shell around a machine that has applied entries already, with their membership.
    pub fn resume(machine: Arc<M>, membership: AppliedMembership) -> Shell<M> {
        Shell {
            machine,
            membership,
        }
    }

    pub fn applied_membership(&self) -> AppliedMembership {
        self.membership.clone()
    }

    fn membership(&self) -> StoredMembershipOf<TypeConfig> {
        self.membership.lock().unwrap().clone()
    }

    fn set_membership(&self, membership: StoredMembershipOf<TypeConfig>) {
        *self.membership.lock().unwrap() = membership;
    }
}

impl<M: Machine> RaftStateMachine<TypeConfig> for Shell<M> {
    type SnapshotData = SnapshotFile;
    type SnapshotBuilder = Builder<M>;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembershipOf<TypeConfig>), io::Error> {
        Ok((self.machine.last_applied(), self.membership()))
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
                    self.set_membership(StoredMembershipOf::<TypeConfig>::new(
                        Some(entry.log_id),
                        m,
                    ));
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
            membership: self.membership(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: SnapshotFile,
    ) -> Result<(), io::Error> {
        let machine = self.machine.clone();
        let file = snapshot.clone();
        let store = self.machine.store();
        blocking(move || machine.install(&mut file.reader()?))
            .await
            .map_err(|e| store.fault(e))?;
        self.machine.set_last_applied(meta.last_log_id);
        self.set_membership(meta.last_membership.clone());
        save(store, self.machine.group(), meta.clone(), snapshot)
            .await
            .map_err(|e| store.fault(e))?;
        self.machine.applied_batch();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, SnapshotFile>>, io::Error> {
        let group = self.machine.group();
        let store = self.machine.store();
        let Some(record) = store.get_snapshot(group)? else {
            return Ok(None);
        };
        let bad = |why: String| {
            io::Error::other(format!(
                "group {group}: stored snapshot record: {why} (a record written by a quorumq \
                 before snapshot files cannot be read: re-seed this node from its peers)"
            ))
        };
        let name = snapshot_record_file(&record).ok_or_else(|| bad("no file name".into()))?;
        let rest = snapshot_record_rest(&record).ok_or_else(|| bad("no meta".into()))?;
        let meta: SnapshotMetaOf<TypeConfig> =
            postcard::from_bytes(rest).map_err(|e| bad(format!("meta: {e}")))?;
        let file = SnapshotFile::open(&store.snapshots().path().join(&name))?;
        Ok(Some(SnapshotOf::<TypeConfig, SnapshotFile> {
            meta,
            snapshot: file,
        }))
    }
}

/// Runs blocking IO off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    qq_raft::lockstep::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("snapshot IO task: {e}")))?
}

/// Make `file` the group's current snapshot: give it its name, record it durably, then remove
/// the file it replaces.
async fn save(
    store: &Store,
    group: GroupId,
    meta: SnapshotMetaOf<TypeConfig>,
    file: SnapshotFile,
) -> io::Result<SnapshotOf<TypeConfig, SnapshotFile>> {
    let dir = store.snapshots();
    let record = store.get_snapshot(group)?;
    let previous = record.as_deref().and_then(snapshot_record_file);
    let previous_log_id = record
        .as_deref()
        .and_then(snapshot_record_rest)
        .and_then(|rest| postcard::from_bytes::<SnapshotMetaOf<TypeConfig>>(rest).ok())
        .and_then(|m| m.last_log_id);
    if previous_log_id > meta.last_log_id {
        // A build that started before an install of a newer snapshot finished after it: the
        // newer one stays current. The file goes; the open handle still serves the caller.
        let name = file
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        if let Some(name) = name {
            dir.remove(&name)?;
        }
        return Ok(SnapshotOf::<TypeConfig, SnapshotFile> {
            meta,
            snapshot: file,
        });
    }
    let file = dir.adopt(file, group, meta.last_log_id.as_ref())?;
    let name = file
        .path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let meta_bytes =
        postcard::to_stdvec(&meta).map_err(|e| io::Error::other(format!("encode: {e}")))?;
    store
        .put_snapshot(group, &snapshot_record(&name, &meta_bytes))
        .await?;
    if let Some(previous) = previous.filter(|p| *p != name) {
        dir.remove(&previous)?;
    }
    Ok(SnapshotOf::<TypeConfig, SnapshotFile> {
        meta,
        snapshot: file,
    })
}

pub struct Builder<M: Machine> {
    machine: Arc<M>,
    cut: Option<M::Cut>,
    last_applied: Option<LogId>,
    membership: StoredMembershipOf<TypeConfig>,
}

impl<M: Machine> RaftSnapshotBuilder<TypeConfig> for Builder<M> {
    type SnapshotData = SnapshotFile;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TypeConfig, SnapshotFile>, io::Error> {
        let cut = self
            .cut
            .take()
            .ok_or_else(|| io::Error::other("snapshot builder used twice"))?;
        let meta = SnapshotMetaOf::<TypeConfig> {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
        };
        let machine = self.machine.clone();
        let log_id = self.last_applied;
        let store = self.machine.store();
        let file = blocking(move || {
            let group = machine.group();
            let mut out = machine.store().snapshots().writer(group, log_id.as_ref())?;
            machine.write_cut(cut, &mut out)?;
            out.finish()
        })
        .await
        .map_err(|e| if is_refused(&e) { e } else { store.fault(e) })?;
        save(store, self.machine.group(), meta, file)
            .await
            .map_err(|e| store.fault(e))
    }
}

/// Why a machine refused to write a snapshot: its state breaks an invariant.
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// The error of a snapshot [`Machine::write_cut`] refuses to write (its state breaks an
/// invariant): the build fails without the store's fault handler (module doc).
pub fn refused(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, Refused(why))
}

pub fn is_refused(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Refused>())
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
