//! One RocksDB per node, shared by every Raft group, with group commit.
//!
//! # What
//!
//! [`Store`] owns the node's single RocksDB instance and one fsync thread ("qq-fsync"). Every
//! Raft group on the node (the metadata group and one group per queue) keeps its log, its vote
//! and its state-machine data in this one database, separated by a big-endian group-id key
//! prefix. Column families:
//!
//! | CF     | key                              | value                                          |
//! |--------|----------------------------------|------------------------------------------------|
//! | `log`  | group (u64 BE) ++ index (u64 BE) | postcard `Entry` ++ format ([`crate::log_record`]) |
//! | `raft` | group (u64 BE) ++ tag (1 byte)   | postcard vote / committed / last purged        |
//! | `sm`   | group (u64 BE)                   | the group's snapshot record: file name, meta   |
//! | `msg`  | group (u64 BE) ++ msg id (u64 BE)| message bodies                                 |
//!
//! The options each column family and the database are opened with, and why, are in
//! `tuning.rs`.
//!
//! Snapshots themselves are files in `<db>/snapshots` ([`crate::snapshot`]); the `sm` record
//! names the group's current one, and [`Store::open`] removes files no record names.
//!
//! Big-endian keys sort numerically, so a group's log is one contiguous key range: its last
//! entry is found with one reverse seek, and purging, truncating or deleting a whole queue is a
//! single `delete_range`.
//!
//! # Why: a shared WAL and one fsync per batch
//!
//! RocksDB has one write-ahead log per database, so every group's writes already go into one
//! file. Durability is added the way RabbitMQ's Ra does it with its shared WAL: writers put
//! their `WriteBatch` into RocksDB *un-synced* (so the data is readable at once, which is what
//! openraft 0.10 requires of `append` when it returns), then hand their completion callback to
//! the fsync thread. That thread blocks for the first request, drains everything else that is
//! queued, calls `flush_wal(true)` once, and then completes every callback it drained. While one
//! fsync runs, new requests queue up and form the next batch, so there is never more than one
//! fsync in flight per node and the batch size adapts to the load: with many busy queues one
//! fsync acknowledges the appends of many groups (and several pipelined appends of the same
//! group). [`Store::sync_stats`] exposes the counters that show it.
//!
//! Correctness rests on the WAL being ordered: a request is sent to the thread only after its
//! write returned, so the `flush_wal(true)` that follows covers it (and every earlier write of
//! any group, including un-synced truncations, purges and body deletions). The WAL is written
//! with `manual_wal_flush`: writes collect in RocksDB's WAL buffer and that same
//! `flush_wal(true)` writes and syncs them, one write(2) per group commit.
//!
//! Message bodies are the exception: [`Store::put_bodies`] skips the WAL, because every body is
//! derived from the Raft log (see there).
//!
//! Blocking calls stay off the tokio workers: the fsync runs on the dedicated thread, and async
//! callers wait on a oneshot channel ([`Store::sync`], [`Store::put_snapshot`]).
//!
//! # Storage faults are fail-stop
//!
//! A failed write or fsync leaves the WAL in an unknown state (after a failed fsync the kernel
//! may have dropped the dirty pages: retrying "succeeds" without the data, the PostgreSQL
//! fsyncgate lesson). So the first write or fsync error calls the store's [`FaultHandler`]
//! before anything waiting on it is completed; the node's handler ([`exit_on_fault`]) logs the
//! fault and exits the process with [`STORAGE_FAULT_EXIT_CODE`]. Nothing written after the last
//! good fsync was confirmed; the node's peers carry on, and the node catches up when it is
//! started again on a healthy disk.
//!
//! WAL recovery mode: `PointInTime`. Every acknowledged write was fsynced, so a crash can only
//! tear the tail of the WAL, which holds writes nobody was told are durable; recovery replays up
//! to the first torn record and drops the rest. `AbsoluteConsistency` would refuse to open after
//! an ordinary crash; `SkipAnyCorruptedRecords` could replay past a hole.
//!
//! # What it leaves out
//!
//! - No adaptive delay before an fsync (Ra's WAL can wait a little to grow a batch): batching
//!   comes only from requests that arrive while the previous fsync runs.
//! - Point writes and reads (`append`, `put_bodies`, `get_body`) run on the caller's thread; a
//!   RocksDB write stall would block that tokio worker.
//! - `delete_group` only issues range deletions; the space comes back with compaction.
//! - No per-group column families (they do not scale to thousands of queues) and no separate
//!   tuning of the `msg` CF beyond the shared defaults.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use openraft::storage::IOFlushed;
use rocksdb::{ColumnFamily, DB, IteratorMode, ReadOptions, WriteBatch, WriteOptions};

use crate::incarnation::Incarnation;
use crate::log_tail::TailBudget;
use crate::snapshot::SnapshotDir;
use crate::types::{GroupId, TypeConfig};
use fsync::SyncRequest;
use wal_trim::WalTrimmer;

pub use crash::{CutStats, Disk, WalCut};

/// Column family of Raft log entries.
pub(crate) const CF_LOG: &str = "log";
/// Column family of per-group Raft metadata (vote, committed, last purged).
pub(crate) const CF_RAFT: &str = "raft";
/// Column family of state-machine snapshots.
pub(crate) const CF_SM: &str = "sm";
/// Column family of message bodies.
pub(crate) const CF_MSG: &str = "msg";

const ALL_CFS: [&str; 4] = [CF_LOG, CF_RAFT, CF_SM, CF_MSG];

/// Tag byte of the vote in the `raft` CF.
pub(crate) const TAG_VOTE: u8 = 1;
/// Tag byte of the committed log id in the `raft` CF.
pub(crate) const TAG_COMMITTED: u8 = 2;
/// Tag byte of the last purged log id in the `raft` CF.
pub(crate) const TAG_LAST_PURGED: u8 = 3;

/// Exit code of a node stopped by a storage fault (EX_IOERR of sysexits.h).
pub const STORAGE_FAULT_EXIT_CODE: i32 = 74;

/// Called with a description of the first write or fsync error, before anything that waits on
/// the failed write is completed. The node's handler never returns ([`exit_on_fault`]); a test's
/// may, and then the waiters get the error.
pub type FaultHandler = Arc<dyn Fn(&str) + Send + Sync>;

/// Logs the fault and exits the process with [`STORAGE_FAULT_EXIT_CODE`] (fail-stop).
pub fn exit_on_fault() -> FaultHandler {
    Arc::new(|fault: &str| {
        tracing::error!(
            fault,
            exit_code = STORAGE_FAULT_EXIT_CODE,
            "storage fault: stopping the node now (fail-stop); nothing after the last good \
             fsync was confirmed; start it again on a healthy disk and it catches up from its peers"
        );
        eprintln!("qq-node: storage fault: {fault}; exiting with {STORAGE_FAULT_EXIT_CODE}");
        std::process::exit(STORAGE_FAULT_EXIT_CODE);
    })
}

/// Errors of [`Store::open`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("open rocksdb at {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: rocksdb::Error,
    },
    #[error("open the snapshot directory of rocksdb at {}: {source}", path.display())]
    Snapshots {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("start the fsync or WAL trim thread of the store at {}: {source}", path.display())]
    Thread {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the database at {} has layout {found}, written by a newer release (this one reads \
         up to {}): a node must not be downgraded; start it with the release that wrote it",
        path.display(),
        crate::layout::LAYOUT_VERSION
    )]
    NewerLayout { path: PathBuf, found: u32 },
}

/// `group ++ index`, the key of a log entry or a message body.
pub(crate) fn key16(group: GroupId, id: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&group.to_be_bytes());
    k[8..].copy_from_slice(&id.to_be_bytes());
    k
}

/// `group ++ tag`, the key of a per-group Raft record.
pub(crate) fn raft_key(group: GroupId, tag: u8) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[..8].copy_from_slice(&group.to_be_bytes());
    k[8] = tag;
    k
}

/// A key greater than every key with the prefix `group` (all keys are at most 16 bytes) and
/// smaller than every key of `group + 1`. Used as an exclusive range end; it cannot overflow.
pub(crate) fn group_end(group: GroupId) -> [u8; 17] {
    let mut k = [0xffu8; 17];
    k[..8].copy_from_slice(&group.to_be_bytes());
    k
}

/// What closing the database does with the memtables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closing {
    /// Flushes them (RocksDB's default): a graceful close keeps the bodies written without the
    /// WAL.
    Flush,
    /// Flushes nothing, as a kill does: a simulator's stores ([`Disk::simulated`]).
    AsAKill,
}

#[derive(Default)]
struct Stats {
    fsyncs: AtomicU64,
    callbacks: AtomicU64,
}

struct Inner {
    db: Arc<DB>,
    snapshots: SnapshotDir,
    path: PathBuf,
    stats: Arc<Stats>,
    on_fault: FaultHandler,
    /// The bytes of the newest entries the groups keep in memory ([`crate::log_tail`]).
    tail_budget: Arc<TailBudget>,
    /// Bytes of message bodies the state machines of this store hold back from RocksDB
    /// ([`Store::held_bodies`]).
    held_bodies: Arc<AtomicUsize>,
    /// Which data directory this is ([`crate::incarnation`]).
    incarnation: Incarnation,
    closing: Closing,
    /// `Some` until drop; dropping it stops the fsync thread.
    tx: Option<mpsc::Sender<SyncRequest>>,
    thread: Option<JoinHandle<()>>,
    _wal_trim: WalTrimmer,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the channel ends the thread after it has completed what is queued; joining
        // it releases its `Arc<DB>` so the database is closed (and its lock released) when the
        // last `Store` handle goes away.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The node's RocksDB, shared by all Raft groups. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl Store {
    /// Opens (or creates) the database at `path` and starts its fsync thread; a write or fsync
    /// error exits the process ([`exit_on_fault`]).
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Self::open_with(path, exit_on_fault())
    }

    /// [`Store::open`] with another [`FaultHandler`].
    pub fn open_with(path: &Path, on_fault: FaultHandler) -> Result<Store, StoreError> {
        Self::open_as(path, on_fault, Closing::Flush)
    }

    fn open_as(path: &Path, on_fault: FaultHandler, closing: Closing) -> Result<Store, StoreError> {
        let open_error = |source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        };
        let db_opts = tuning::db_options(closing).map_err(open_error)?;
        let cfs = tuning::column_families();
        let db = DB::open_cf_descriptors(&db_opts, path, cfs).map_err(open_error)?;
        let raft_cf = db
            .cf_handle(CF_RAFT)
            .expect("the raft column family is opened with the database");
        let log_cf = db
            .cf_handle(CF_LOG)
            .expect("the log column family is opened with the database");
        crate::layout::check_and_record(&db, raft_cf, log_cf).map_err(|e| match e {
            crate::layout::LayoutError::Newer(found) => StoreError::NewerLayout {
                path: path.to_path_buf(),
                found,
            },
            crate::layout::LayoutError::Db(source) => open_error(source),
        })?;
        let incarnation =
            crate::incarnation::read_or_draw(&db, raft_cf, log_cf).map_err(open_error)?;
        let db = Arc::new(db);
        let snapshots = SnapshotDir::open(&path.join(SNAPSHOT_DIR)).map_err(|source| {
            StoreError::Snapshots {
                path: path.to_path_buf(),
                source,
            }
        })?;
        let stats = Arc::new(Stats::default());
        let started = fsync::start(db.clone(), stats.clone(), path, on_fault.clone())
            .and_then(|(tx, thread)| Ok((tx, thread, WalTrimmer::start(path)?)));
        let (tx, thread, wal_trim) = started.map_err(|source| StoreError::Thread {
            path: path.to_path_buf(),
            source,
        })?;
        let store = Store {
            inner: Arc::new(Inner {
                db,
                snapshots,
                path: path.to_path_buf(),
                stats,
                on_fault,
                tail_budget: Arc::default(),
                held_bodies: Arc::default(),
                incarnation,
                closing,
                tx: Some(tx),
                thread: Some(thread),
                _wal_trim: wal_trim,
            }),
        };
        store
            .sweep_snapshots()
            .map_err(|source| StoreError::Snapshots {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(store)
    }

    /// Which data directory this is, and whether it was new at this start.
    pub fn incarnation(&self) -> Incarnation {
        self.inner.incarnation
    }

    /// What the groups' log tails hold in memory, together.
    pub fn tail_budget(&self) -> Arc<TailBudget> {
        self.inner.tail_budget.clone()
    }

    /// The bytes of message bodies that all the state machines of this store hold in memory
    /// instead of writing them yet (a node-wide count that each of them keeps up to date).
    pub fn held_bodies(&self) -> Arc<AtomicUsize> {
        self.inner.held_bodies.clone()
    }

    /// Removes snapshot files no group's record names (a group deleted, or a stop between a
    /// new snapshot's rename and its record).
    fn sweep_snapshots(&self) -> io::Result<()> {
        for name in self.inner.snapshots.all_names()? {
            let Some(group) = SnapshotDir::group_of(&name) else {
                continue;
            };
            if self.snapshot_record_name(group)?.as_deref() != Some(name.as_str()) {
                self.inner.snapshots.remove(&name)?;
            }
        }
        Ok(())
    }

    /// The file name in `group`'s snapshot record, if it has one.
    fn snapshot_record_name(&self, group: GroupId) -> io::Result<Option<String>> {
        Ok(self
            .get_snapshot(group)?
            .and_then(|bytes| snapshot_record_file(&bytes)))
    }

    /// The node's snapshot directory (snapshot files, transfers being received).
    pub fn snapshots(&self) -> &SnapshotDir {
        &self.inner.snapshots
    }

    /// A consistent, read-only view of this node's message bodies as they are now: later
    /// writes and deletions do not show in it. A snapshot's bodies are read through one taken
    /// at the snapshot's applied index.
    pub fn pin(&self) -> Pinned {
        let snap = self.inner.db.snapshot();
        // SAFETY: the snapshot borrows the `DB` inside `self.inner.db`, an `Arc` whose clone
        // `Pinned` keeps in `_store` (through `Store`'s `Arc<Inner>`), so the `DB` neither moves
        // nor drops while the snapshot lives; `Pinned` declares `snap` before `_store`, so the
        // snapshot is released first.
        let snap = unsafe {
            std::mem::transmute::<
                rocksdb::SnapshotWithThreadMode<'_, DB>,
                rocksdb::SnapshotWithThreadMode<'static, DB>,
            >(snap)
        };
        Pinned {
            snap,
            _store: self.clone(),
        }
    }

    /// The directory of the database.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// `(fsyncs, callbacks)`: WAL syncs done by the fsync thread, and requests (append
    /// callbacks and durability waiters) they completed. `callbacks / fsyncs` is the mean
    /// group-commit batch size.
    pub fn sync_stats(&self) -> (u64, u64) {
        let s = &self.inner.stats;
        (
            s.fsyncs.load(Ordering::Relaxed),
            s.callbacks.load(Ordering::Relaxed),
        )
    }

    /// Durability barrier: returns once every write issued before the call is on disk.
    /// Waits on the fsync thread, so it never blocks a tokio worker.
    pub async fn sync(&self) -> io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(SyncRequest::Waiter(tx));
        rx.await.unwrap_or_else(|_| {
            Err(io::Error::other(format!(
                "fsync thread of {} stopped",
                self.inner.path.display()
            )))
        })
    }

    /// Hands an openraft callback to the fsync thread: it is completed once every write issued
    /// before this call is durable.
    pub(crate) fn flush_then(&self, callback: IOFlushed<TypeConfig>) {
        self.submit(SyncRequest::Flushed(callback));
    }

    fn submit(&self, req: SyncRequest) {
        if crate::lockstep::on_this_thread() && !matches!(req, SyncRequest::Freeze(_)) {
            let inner = &self.inner;
            let path = &inner.path;
            return fsync::sync_batch(
                &inner.db,
                &inner.stats,
                path,
                &inner.on_fault,
                [req].into_iter(),
            );
        }
        let sent = match &self.inner.tx {
            Some(tx) => tx.send(req).map_err(|e| e.0),
            None => Err(req),
        };
        if let Err(req) = sent {
            req.complete(Err(io::Error::other(format!(
                "fsync thread of {} stopped",
                self.inner.path.display()
            ))));
        }
    }

    pub(crate) fn db(&self) -> &DB {
        &self.inner.db
    }

    pub(crate) fn cf(&self, name: &str) -> &ColumnFamily {
        // The four CFs are created by `open`, so they always exist.
        self.inner
            .db
            .cf_handle(name)
            .unwrap_or_else(|| panic!("column family {name} missing"))
    }

    /// Writes a batch without syncing (readable at once, durable after the next fsync).
    /// `what` names the write in the error; it is only formatted when the write fails.
    pub(crate) fn write(&self, batch: WriteBatch, what: impl FnOnce() -> String) -> io::Result<()> {
        self.write_opt(batch, &WriteOptions::default(), what)
    }

    fn write_opt(
        &self,
        batch: WriteBatch,
        opts: &WriteOptions,
        what: impl FnOnce() -> String,
    ) -> io::Result<()> {
        self.inner.db.write_opt(batch, opts).map_err(|e| {
            let e = self.err(&what(), e);
            (self.inner.on_fault)(&e.to_string());
            e
        })
    }

    /// Reports a storage fault outside RocksDB (a snapshot file that cannot be written or read
    /// back) to the fault handler, as a failed write is: the node stops. Returns the error for
    /// handlers that return (tests).
    pub fn fault(&self, e: io::Error) -> io::Error {
        (self.inner.on_fault)(&e.to_string());
        e
    }

    pub(crate) fn err(&self, what: &str, e: impl fmt::Display) -> io::Error {
        io::Error::other(format!(
            "{what} (rocksdb {}): {e}",
            self.inner.path.display()
        ))
    }

    // ---- message bodies ------------------------------------------------------------------

    /// Stores message bodies of `group`, *without the write-ahead log*: after a crash, a body
    /// written since the `msg` column family was last flushed is gone, and nothing is lost by
    /// it. Every body written here is derived from the Raft log (a state machine writes it
    /// when it applies an enqueue, or when it installs a snapshot, which carries the bodies of
    /// its live messages), and on restart openraft rebuilds each state machine from its stored
    /// snapshot and the log after it, writing every body that is still live again. Skipping
    /// the WAL halves what each message costs RocksDB: its body is already in the WAL once, in
    /// the log entry that confirmed it. Deletions keep the WAL (see [`Store::delete_bodies`]).
    pub fn put_bodies(&self, group: GroupId, bodies: &[(u64, &[u8])]) -> io::Result<()> {
        let cf = self.cf(CF_MSG);
        let mut batch = WriteBatch::default();
        for (id, body) in bodies {
            batch.put_cf(cf, key16(group, *id), body);
        }
        let mut opts = WriteOptions::default();
        opts.disable_wal(true);
        self.write_opt(batch, &opts, || {
            format!("put {} bodies of group {group}", bodies.len())
        })
    }

    /// Reads one message body.
    pub fn get_body(&self, group: GroupId, id: u64) -> io::Result<Option<Vec<u8>>> {
        self.db()
            .get_cf(self.cf(CF_MSG), key16(group, id))
            .map_err(|e| self.err(&format!("get body {id} of group {group}"), e))
    }

    /// Deletes message bodies (un-synced, through the WAL: a body whose deletion was lost in a
    /// crash could stay behind forever, as the log that deleted it may be purged by then).
    pub fn delete_bodies(&self, group: GroupId, ids: &[u64]) -> io::Result<()> {
        let cf = self.cf(CF_MSG);
        let mut batch = WriteBatch::default();
        for id in ids {
            batch.delete_cf(cf, key16(group, *id));
        }
        self.write(batch, || {
            format!("delete {} bodies of group {group}", ids.len())
        })
    }

    // ---- state-machine snapshots ---------------------------------------------------------

    /// Stores the snapshot record of `group` ([`snapshot_record`]) and returns once it (and
    /// every earlier write) is durable.
    pub async fn put_snapshot(&self, group: GroupId, data: &[u8]) -> io::Result<()> {
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_SM), group.to_be_bytes(), data);
        self.write(batch, || format!("put snapshot of group {group}"))?;
        self.sync().await
    }

    /// Reads the snapshot record of `group`.
    pub fn get_snapshot(&self, group: GroupId) -> io::Result<Option<Vec<u8>>> {
        self.db()
            .get_cf(self.cf(CF_SM), group.to_be_bytes())
            .map_err(|e| self.err(&format!("get snapshot of group {group}"), e))
    }

    /// Deletes everything of `group` in every column family (log, vote and other Raft
    /// records, snapshot, bodies), as one atomic batch of range deletions. Un-synced: call
    /// [`Store::sync`] afterwards if the deletion must survive a crash. Any `LogStore` of the
    /// group must not be used afterwards (its caches would be stale).
    pub fn delete_group(&self, group: GroupId) -> io::Result<()> {
        let from = group.to_be_bytes();
        let to = group_end(group);
        let mut batch = WriteBatch::default();
        for name in ALL_CFS {
            batch.delete_range_cf(self.cf(name), &from[..], &to[..]);
        }
        self.write(batch, || format!("delete group {group}"))?;
        for name in self.inner.snapshots.names_of(group)? {
            self.inner.snapshots.remove(&name)?;
        }
        Ok(())
    }
}

/// Directory of snapshot files, inside the database directory (RocksDB leaves files it does
/// not know alone).
const SNAPSHOT_DIR: &str = "snapshots";

/// First byte of a snapshot record in the `sm` column family: the record names a snapshot file.
/// Records written before snapshot files held the snapshot inline and start with 0 or 1.
pub const SNAPSHOT_RECORD_VERSION: u8 = 2;

/// The file name a snapshot record points to: `version ++ u16 LE length ++ name ++ rest`.
pub fn snapshot_record_file(record: &[u8]) -> Option<String> {
    let (&version, rest) = record.split_first()?;
    if version != SNAPSHOT_RECORD_VERSION || rest.len() < 2 {
        return None;
    }
    let len = u16::from_le_bytes([rest[0], rest[1]]) as usize;
    let name = rest.get(2..2 + len)?;
    String::from_utf8(name.to_vec()).ok()
}

/// A snapshot record: the file name, then `rest` (the encoded snapshot meta).
pub fn snapshot_record(file: &str, rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(3 + file.len() + rest.len());
    out.push(SNAPSHOT_RECORD_VERSION);
    out.extend_from_slice(&(file.len() as u16).to_le_bytes());
    out.extend_from_slice(file.as_bytes());
    out.extend_from_slice(rest);
    out
}

/// What follows the file name in a snapshot record.
pub fn snapshot_record_rest(record: &[u8]) -> Option<&[u8]> {
    let len = u16::from_le_bytes([*record.get(1)?, *record.get(2)?]) as usize;
    record.get(3 + len..)
}

/// A consistent read-only view of the database at one moment ([`Store::pin`]).
pub struct Pinned {
    // Field order matters: the snapshot is released before the store it borrows from.
    snap: rocksdb::SnapshotWithThreadMode<'static, DB>,
    _store: Store,
}

impl Pinned {
    /// Up to `max_bytes` of bodies of `group` (at least one, if any is left) with id
    /// `>= from_id`, in id order, as of the moment of the pin. Blocking.
    pub fn scan_bodies(
        &self,
        group: GroupId,
        from_id: u64,
        max_bytes: usize,
    ) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let store = &self._store;
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(group_end(group).to_vec());
        let start = key16(group, from_id);
        let it = self.snap.iterator_cf_opt(
            store.cf(CF_MSG),
            opts,
            IteratorMode::From(&start, rocksdb::Direction::Forward),
        );
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for item in it {
            let (k, v) =
                item.map_err(|e| store.err(&format!("scan pinned bodies of group {group}"), e))?;
            if k.len() != 16 || k[..8] != group.to_be_bytes() {
                break;
            }
            let id = u64::from_be_bytes(k[8..16].try_into().expect("16-byte key"));
            bytes += v.len();
            out.push((id, v.into_vec()));
            if bytes >= max_bytes {
                break;
            }
        }
        Ok(out)
    }
}

mod crash;
mod fsync;
#[cfg(test)]
mod tests;
mod tuning;
mod wal_trim;
