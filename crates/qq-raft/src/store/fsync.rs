//! The fsync thread of a [`Store`](super::Store): it drains what is waiting, makes the WAL
//! durable with one `flush_wal(true)`, and only then completes every request of the batch
//! (see "Why: a shared WAL and one fsync per batch" in [`super`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread::JoinHandle;

use openraft::storage::IOFlushed;
use rocksdb::DB;

use super::{FaultHandler, Stats};
use crate::types::TypeConfig;

/// Most requests completed by one fsync (the drain loop stops there and syncs).
const MAX_BATCH: usize = 65_536;

/// A unit of work for the fsync thread.
pub(super) enum SyncRequest {
    /// An openraft append callback.
    Flushed(IOFlushed<TypeConfig>),
    /// An async waiter (vote, snapshot, [`Store::sync`]).
    Waiter(tokio::sync::oneshot::Sender<io::Result<()>>),
    /// A simulated crash ([`Store::freeze`](super::Store::freeze)): answered with the WAL
    /// lengths at that moment.
    Freeze(mpsc::Sender<io::Result<Vec<(PathBuf, u64)>>>),
}

impl SyncRequest {
    pub(super) fn complete(self, result: io::Result<()>) {
        match self {
            SyncRequest::Flushed(cb) => cb.io_completed(result),
            SyncRequest::Waiter(tx) => {
                let _ = tx.send(result);
            }
            // Only when the thread is gone: no lengths were noted, so nothing may be cut.
            SyncRequest::Freeze(tx) => {
                let _ = tx.send(Err(result.err().unwrap_or_else(|| {
                    io::Error::other("the fsync thread did not take the freeze")
                })));
            }
        }
    }
}

/// Starts the fsync thread ("qq-fsync") of the database at `path`; dropping the sender it
/// returns ends the thread once it has completed what is queued.
pub(super) fn start(
    db: Arc<DB>,
    stats: Arc<Stats>,
    path: &Path,
    on_fault: FaultHandler,
) -> io::Result<(mpsc::Sender<SyncRequest>, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    let path = path.to_path_buf();
    let thread = std::thread::Builder::new()
        .name("qq-fsync".to_string())
        .spawn(move || fsync_loop(db, rx, stats, path, on_fault))?;
    Ok((tx, thread))
}

/// The fsync thread: one `flush_wal(true)` per drained batch of requests.
fn fsync_loop(
    db: Arc<DB>,
    rx: mpsc::Receiver<SyncRequest>,
    stats: Arc<Stats>,
    path: PathBuf,
    on_fault: FaultHandler,
) {
    let mut batch: Vec<SyncRequest> = Vec::new();
    let mut freeze = None;
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(req) = next.take() {
            match req {
                SyncRequest::Freeze(reply) => freeze = Some(reply),
                req => batch.push(req),
            }
            if batch.len() < MAX_BATCH {
                next = rx.try_recv().ok();
            }
        }
        if let Some(reply) = freeze.take() {
            let _ = reply.send(super::crash::freeze_on_fsync_thread(&db, &path));
            // Nothing of this batch or after it is synced or completed: the waiters go when
            // the store closes (the channel ends), as a killed process's would.
            let held: Vec<SyncRequest> = batch.drain(..).chain(rx.iter()).collect();
            drop(held);
            return;
        }

        sync_batch(&db, &stats, &path, &on_fault, batch.drain(..));
    }
}

/// One `flush_wal(true)`, then every request of `batch` completed with its outcome; a failure
/// goes to `on_fault` before any waiter hears of it (nothing of the batch may be confirmed).
/// The fsync thread's step, and a lock-step thread's own ([`crate::lockstep`]).
pub(super) fn sync_batch(
    db: &DB,
    stats: &Stats,
    path: &Path,
    on_fault: &FaultHandler,
    batch: impl ExactSizeIterator<Item = SyncRequest>,
) {
    let result = db.flush_wal(true);
    stats.fsyncs.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = &result {
        on_fault(&format!(
            "fsync of the rocksdb WAL at {} failed: {e}",
            path.display()
        ));
    }
    // Count before completing, so that a waiter that wakes up sees its own completion.
    stats
        .callbacks
        .fetch_add(batch.len() as u64, Ordering::Relaxed);
    for req in batch {
        let r = match &result {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::other(format!(
                "fsync rocksdb WAL at {}: {e}",
                path.display()
            ))),
        };
        req.complete(r);
    }
}
