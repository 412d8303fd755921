//! What a node's store is opened with ([`Disk`]), and a crash that leaves the disk as
//! `kill -9` leaves it, for a simulator that runs nodes inside its own process
//! ([`Store::freeze`], [`WalCut`]).
//!
//! # Why a simulated crash needs help
//!
//! With `manual_wal_flush`, what a node wrote since the fsync thread's last `flush_wal(true)`
//! waits in RocksDB's WAL buffer, in the process's memory; message bodies are written without
//! the WAL and live in a memtable until RocksDB flushes it. A `kill -9` loses both. A simulator
//! cannot kill a node that shares its process: it drops the node's runtime, and the database
//! then closes in-process, which writes the WAL buffer out and flushes the memtables. Such a
//! crash would lose nothing, and so would test nothing of what the store promises.
//!
//! # How
//!
//! [`Store::freeze`] is the moment of the kill. On the fsync thread, between two syncs, it
//! stops RocksDB's background flushes and compactions (nothing more reaches an SST file),
//! notes the length of every WAL file, and from then on syncs and completes nothing (no
//! append, vote or snapshot is acknowledged after the kill; the waiters are dropped when the
//! store closes). The simulator then drops the node; closing the database writes the buffer out
//! but flushes no memtable. [`WalCut::apply`] cuts each WAL file back to its noted length, and
//! one made after the freeze to nothing. What is left is what the disk held at the freeze
//! moment: the synced WAL, the bytes of the buffer that earlier had to be written for room, the
//! SST files and the snapshot files, as after a kill.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use rocksdb::DB;

use super::{Closing, FaultHandler, Inner, Store, StoreError, SyncRequest, exit_on_fault};

/// How a node opens its store: what a storage fault does, and who else is handed the store.
#[derive(Clone)]
pub struct Disk {
    on_fault: FaultHandler,
    opened: Option<Arc<dyn Fn(&Store) + Send + Sync>>,
}

impl Disk {
    /// The real disk: a storage fault stops the process ([`exit_on_fault`]).
    pub fn real() -> Disk {
        Disk {
            on_fault: exit_on_fault(),
            opened: None,
        }
    }

    /// A simulator's: `on_fault` in place of the exit, and `opened` handed every store opened
    /// with it (to [`Store::freeze`] it at a crash).
    pub fn simulated(
        on_fault: FaultHandler,
        opened: impl Fn(&Store) + Send + Sync + 'static,
    ) -> Disk {
        Disk {
            on_fault,
            opened: Some(Arc::new(opened)),
        }
    }

    /// Opens the store at `path` ([`Store::open_with`]).
    pub fn open(&self, path: &Path) -> Result<Store, StoreError> {
        let closing = match self.opened {
            Some(_) => Closing::AsAKill,
            None => Closing::Flush,
        };
        let store = Store::open_as(path, self.on_fault.clone(), closing)?;
        if let Some(opened) = &self.opened {
            opened(&store);
        }
        Ok(store)
    }
}

/// The WAL files of a frozen store and their lengths at the freeze ([`Store::freeze`]).
#[derive(Debug)]
pub struct WalCut {
    dir: PathBuf,
    lengths: Vec<(PathBuf, u64)>,
    store: Weak<Inner>,
}

impl Store {
    /// The moment of a simulated `kill -9` (module docs): returns once background work has
    /// stopped and the WAL lengths are noted; nothing is synced or acknowledged after it.
    /// Called off the node's runtime (it blocks until the fsync thread answers).
    pub fn freeze(&self) -> io::Result<WalCut> {
        if self.inner.closing != Closing::AsAKill {
            return Err(io::Error::other(
                "only a store opened by a simulated disk can be frozen: this one flushes its \
                 memtables when it closes",
            ));
        }
        if crate::lockstep::on_this_thread() {
            // On one schedule, the kill must leave the disk as the schedule alone decides. The
            // freeze cancels RocksDB's queued flushes and waits only for running ones, and which
            // of a batch of queued memtable flushes (one per column family) had begun is up to
            // RocksDB's threads. Found by the lock-step replay (seed 10: bodies written without
            // the WAL survived a crash in one run and not the other). So every flush RocksDB has
            // queued ends first; the memtable being written is still lost, as a kill loses it.
            self.inner
                .db
                .wait_for_compact(&rocksdb::WaitForCompactOptions::default())
                .map_err(io::Error::other)?;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        self.submit(SyncRequest::Freeze(tx));
        let lengths = rx
            .recv()
            .map_err(|_| io::Error::other("the fsync thread ended before the freeze"))??;
        Ok(WalCut {
            dir: self.inner.path.clone(),
            lengths,
            store: Arc::downgrade(&self.inner),
        })
    }
}

impl WalCut {
    /// Cuts the WAL files back to their lengths at the freeze (a file made since, to nothing).
    /// Refused while any handle of the store is alive: the database must be closed first.
    pub fn apply(&self) -> io::Result<CutStats> {
        if self.store.strong_count() > 0 {
            return Err(io::Error::other(format!(
                "the store at {} is still open: a WAL is cut only once it is closed",
                self.dir.display()
            )));
        }
        let mut stats = CutStats::default();
        for (path, now) in wal_files(&self.dir)? {
            let at_freeze = self
                .lengths
                .iter()
                .find(|(p, _)| *p == path)
                .map_or(0, |(_, len)| *len);
            if now > at_freeze {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)?
                    .set_len(at_freeze)?;
                stats.files += 1;
                stats.bytes += now - at_freeze;
            }
        }
        Ok(stats)
    }
}

/// What [`WalCut::apply`] took away.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CutStats {
    /// WAL files cut.
    pub files: u64,
    /// Bytes cut from them.
    pub bytes: u64,
}

/// On the fsync thread, between two syncs: stops background work, then notes the WAL lengths.
pub(super) fn freeze_on_fsync_thread(db: &DB, dir: &Path) -> io::Result<Vec<(PathBuf, u64)>> {
    // The store was opened with `Closing::AsAKill`, so this flushes no memtable. Waits for a
    // running flush or compaction; none starts after it.
    db.cancel_all_background_work(true);
    wal_files(dir)
}

/// The WAL files (`*.log`) directly in `dir` and their lengths, in no order.
pub(super) fn wal_files(dir: &Path) -> io::Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            out.push((path, entry.metadata()?.len()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::CF_RAFT;

    fn put(store: &Store, key: &[u8], value: &[u8]) {
        let mut batch = rocksdb::WriteBatch::default();
        batch.put_cf(store.cf(CF_RAFT), key, value);
        store.write(batch, || "test write".to_string()).unwrap();
    }

    fn simulated(dir: &Path) -> Store {
        Disk::simulated(Arc::new(|_: &str| {}), |_: &Store| {})
            .open(dir)
            .unwrap()
    }

    fn get(store: &Store, key: &[u8]) -> Option<Vec<u8>> {
        store.db().get_cf(store.cf(CF_RAFT), key).unwrap()
    }

    /// Synced writes and bodies survive a frozen crash only as far as the disk held them: the
    /// synced write stays, the unsynced one and the WAL-less body are gone.
    #[tokio::test]
    async fn a_frozen_crash_keeps_only_what_was_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let store = simulated(dir.path());
        put(&store, b"synced", b"1");
        store.sync().await.unwrap();
        put(&store, b"unsynced", b"2");
        store.put_bodies(7, &[(1, &b"body"[..])]).unwrap();

        let cut = store.freeze().unwrap();
        assert!(cut.apply().is_err(), "refused while the store is open");
        drop(store);
        let stats = cut.apply().unwrap();
        assert!(stats.bytes > 0, "the close wrote the buffer out: {stats:?}");

        let store = Store::open(dir.path()).unwrap();
        assert_eq!(get(&store, b"synced").as_deref(), Some(&b"1"[..]));
        assert_eq!(get(&store, b"unsynced"), None);
        assert_eq!(store.get_body(7, 1).unwrap(), None);
    }

    /// Without the freeze, closing in-process keeps everything: what the freeze is for.
    #[tokio::test]
    async fn a_plain_close_keeps_unsynced_writes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        put(&store, b"unsynced", b"2");
        store.put_bodies(7, &[(1, &b"body"[..])]).unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(get(&store, b"unsynced").as_deref(), Some(&b"2"[..]));
        assert_eq!(store.get_body(7, 1).unwrap().as_deref(), Some(&b"body"[..]));
    }

    /// After the freeze nothing is acknowledged: a sync asked for then is never answered,
    /// and its waiter is dropped when the store closes.
    #[tokio::test]
    async fn nothing_is_synced_after_the_freeze() {
        let dir = tempfile::tempdir().unwrap();
        let store = simulated(dir.path());
        assert!(
            Store::open(tempfile::tempdir().unwrap().path())
                .unwrap()
                .freeze()
                .is_err(),
            "a real store flushes when it closes: it cannot be frozen"
        );
        let _cut = store.freeze().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        store.submit(SyncRequest::Waiter(tx));
        drop(store);
        // Closing joined the fsync thread: an answer would be here by now.
        assert!(rx.await.is_err(), "a sync after the freeze was answered");
    }
}
