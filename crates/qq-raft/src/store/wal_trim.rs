//! Old WAL files go away a little at a time, never all at once.
//!
//! RocksDB deletes a WAL file (64 MiB and more here) as soon as every memtable it holds has been
//! flushed, often several at once. On a filesystem mounted with `discard` (common on cloud and
//! VM images) the kernel discards all of a deleted file's blocks on the spot, and the node's
//! fsyncs, and every other process's, wait behind that discard: on the development machine
//! each such deletion stalled every fsync for 60-80 ms, and a fixed-rate run over AMQP had a
//! confirm p99 of 64-96 ms in four runs of four instead of 9-11 ms with the filesystem mounted
//! without `discard` (docs/benchmarks.md, session 25).
//!
//! So the store is opened with a WAL time-to-live ([`ARCHIVE_TTL_SECS`], years): RocksDB then
//! *moves* an obsolete WAL file into `<db>/archive` (a rename, no blocks freed) instead of
//! deleting it, and never purges the archive itself. [`WalTrimmer`]'s thread empties the archive:
//! it cuts the oldest file [`CHUNK`] bytes shorter every [`PAUSE`] and removes it once it is
//! empty, so each step frees (and discards) at most one chunk. That is up to 100 MiB/s, twice
//! what a node writes to its WAL at full speed on the development machine. Should the archive
//! still grow past [`ARCHIVE_MAX`] (a faster disk, a node catching up), whole files are removed
//! until it is back under: disk space is bounded before stalls are avoided.
//!
//! Why not RocksDB's own mechanisms:
//! - WAL recycling (`recycle_log_file_num`) deletes nothing, but RocksDB then refuses writes
//!   without the WAL, and message bodies are written that way on purpose
//!   ([`super::Store::put_bodies`]).
//! - RocksDB's `SstFileManager` can delete files (WAL files too) slowly, cutting them in chunks,
//!   but the Rust binding does not reach it: its C API creates one with 64 MiB chunks (a whole
//!   WAL file here), and deletes at once whenever the files waiting exceed a quarter of the
//!   database, which a WAL much larger than the live data always does.
//!
//! The archive holds only WAL files whose every write is already in a table file, so nothing in
//! it is needed to open the database, and what is left of it at a stop is trimmed after the
//! next start. A failed step (the file gone, a permission) is logged and tried again later.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::warn;

/// The WAL time-to-live the store is opened with: long enough that RocksDB never purges its
/// archive itself (it looks every half TTL).
pub(super) const ARCHIVE_TTL_SECS: u64 = 10 * 365 * 24 * 3600;

/// Bytes cut from the oldest archived file at each step.
const CHUNK: u64 = 1 << 20;

/// Time between two steps while there is something to trim.
const PAUSE: Duration = Duration::from_millis(10);

/// Time between two looks at an empty archive.
const IDLE: Duration = Duration::from_millis(200);

/// Archive size past which whole files are removed at once.
const ARCHIVE_MAX: u64 = 1 << 30;

/// The archive's thread ("qq-wal-trim"); stopped and joined on drop.
pub(super) struct WalTrimmer {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl WalTrimmer {
    /// Starts trimming `<db>/archive`.
    pub(super) fn start(db_dir: &Path) -> io::Result<WalTrimmer> {
        let archive = db_dir.join("archive");
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("qq-wal-trim".into())
            .spawn(move || run(&archive, &stopped))?;
        Ok(WalTrimmer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for WalTrimmer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(archive: &Path, stopped: &mpsc::Receiver<()>) {
    let mut wait = IDLE;
    loop {
        match stopped.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        wait = match step(archive) {
            Ok(true) => PAUSE,
            Ok(false) => IDLE,
            Err(e) => {
                warn!(archive = %archive.display(), error = %e, "trimming an old WAL file failed");
                IDLE
            }
        };
    }
}

/// One step: the oldest archived WAL file one chunk shorter, or removed when it is empty or
/// the archive is over [`ARCHIVE_MAX`]. Whether there was anything to trim.
fn step(archive: &Path) -> io::Result<bool> {
    let files = match archived(archive) {
        Ok(files) => files,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let Some((oldest, len)) = files.first() else {
        return Ok(false);
    };
    let total: u64 = files.iter().map(|(_, len)| len).sum();
    if *len <= CHUNK || total > ARCHIVE_MAX {
        fs::remove_file(oldest)?;
    } else {
        fs::OpenOptions::new()
            .write(true)
            .open(oldest)?
            .set_len(len - CHUNK)?;
    }
    Ok(true)
}

/// The archived WAL files with their lengths, oldest first (RocksDB numbers its files in
/// order, with leading zeros).
fn archived(archive: &Path) -> io::Result<Vec<(PathBuf, u64)>> {
    let mut files = super::crash::wal_files(archive)?;
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str, len: u64) {
        fs::File::create(dir.join(name))
            .unwrap()
            .set_len(len)
            .unwrap();
    }

    fn len(dir: &Path, name: &str) -> Option<u64> {
        fs::metadata(dir.join(name)).ok().map(|m| m.len())
    }

    #[test]
    fn steps_shorten_the_oldest_file_a_chunk_at_a_time_then_remove_it() {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path();
        file(archive, "000012.log", 2 * CHUNK + 10);
        file(archive, "000009.log", CHUNK + 1);
        file(archive, "OTHER", 5);

        assert!(step(archive).unwrap());
        assert_eq!(
            len(archive, "000009.log"),
            Some(1),
            "the oldest first, one chunk"
        );
        assert_eq!(len(archive, "000012.log"), Some(2 * CHUNK + 10));
        assert!(step(archive).unwrap());
        assert_eq!(
            len(archive, "000009.log"),
            None,
            "removed once under a chunk"
        );
        assert!(step(archive).unwrap());
        assert_eq!(len(archive, "000012.log"), Some(CHUNK + 10));
        assert!(step(archive).unwrap());
        assert!(step(archive).unwrap());
        assert_eq!(len(archive, "000012.log"), None);
        assert!(
            !step(archive).unwrap(),
            "nothing left but what is not a WAL file"
        );
        assert_eq!(len(archive, "OTHER"), Some(5));
    }

    #[test]
    fn an_archive_over_its_bound_loses_whole_files_and_a_missing_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path();
        // Sparse files: only their lengths count.
        file(archive, "000001.log", ARCHIVE_MAX);
        file(archive, "000002.log", 2 * CHUNK);
        assert!(step(archive).unwrap());
        assert_eq!(
            len(archive, "000001.log"),
            None,
            "over the bound: removed whole"
        );
        assert!(step(archive).unwrap());
        assert_eq!(
            len(archive, "000002.log"),
            Some(CHUNK),
            "under it: a chunk again"
        );
        assert!(!step(&archive.join("archive")).unwrap());
    }
}
