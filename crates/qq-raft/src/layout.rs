//! The data directory's layout version: which release's arrangement of keys and values the
//! RocksDB database holds.
//!
//! [`Store::open`](crate::store::Store::open) reads it first ([`decide`]). A database without
//! one was made by release 0.1.0 (or is new): it is layout 1. A database of a later layout than
//! this binary's [`LAYOUT_VERSION`] was written by a newer release; this one refuses to open it
//! (a downgrade) rather than misread it. A release that changes the layout raises the version
//! and converts the older layout when it opens it, before anything else reads the database.
//!
//! | layout | written by | what changed |
//! |---|---|---|
//! | 1 | 0.1.0 (no version recorded), and builds before layout 2 | |
//! | 2 | this release | every `log` record ends with its record format ([`crate::log_record`]) |
//!
//! Layout 1 becomes 2 (logged, with the number of records) by appending the format byte to every log record ([`convert_1_to_2`]),
//! in batches of at most [`CONVERT_BATCH_BYTES`]. Each batch records how far it got (under
//! [`PROGRESS_KEY`]) in the same atomic write, so a crash during the conversion resumes after
//! the last batch written; the version becomes 2, and the progress key goes, in the last one.
//! The conversion reads and writes each record once; logs are short (snapshots purge them).
//!
//! What each record holds inside is versioned on its own: machine versions in the logs, a
//! format number in each log record and in the snapshots' trailers.

use rocksdb::{ColumnFamily, DB, WriteBatch};

/// The layout this binary reads and writes.
pub const LAYOUT_VERSION: u32 = 2;

/// Where the version lives: in the `raft` column family, under a key no group's record can
/// have (those are a group id and a tag, 9 bytes; this sorts after every group but the last
/// possible id, which no queue reaches).
pub(crate) const LAYOUT_KEY: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xffqq-layout";

/// The last log key a conversion from layout 1 has converted (in the `raft` column family,
/// beside [`LAYOUT_KEY`]), while one is under way.
pub(crate) const PROGRESS_KEY: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xffqq-layout-converted";

/// A conversion batch stops taking records once they reach this many bytes.
pub(crate) const CONVERT_BATCH_BYTES: usize = 8 << 20;

/// Why a database's layout was not accepted.
pub(crate) enum LayoutError {
    /// Written by a newer release: its layout.
    Newer(u32),
    Db(rocksdb::Error),
}

/// Reads the layout version from column family `raft` of `db` ([`decide`]), converts an older
/// layout's `log` column family, and records this binary's version (synced before it returns).
pub(crate) fn check_and_record(
    db: &DB,
    raft: &ColumnFamily,
    log: &ColumnFamily,
) -> Result<(), LayoutError> {
    let stored = db.get_cf(raft, LAYOUT_KEY).map_err(LayoutError::Db)?;
    match decide(stored.as_deref()).map_err(LayoutError::Newer)? {
        LAYOUT_VERSION => Ok(()),
        older => {
            let records = convert_1_to_2(db, raft, log).map_err(LayoutError::Db)?;
            db.flush_wal(true).map_err(LayoutError::Db)?;
            if records > 0 {
                tracing::info!(
                    records,
                    from = older,
                    to = LAYOUT_VERSION,
                    "converted the log's records to this layout"
                );
            }
            Ok(())
        }
    }
}

/// The layout the database holds (`stored`: its recorded version, None for none: 1), or
/// Err(found) for a newer one than this binary's.
fn decide(stored: Option<&[u8]>) -> Result<u32, u32> {
    let found = match stored {
        None => 1,
        Some(bytes) => <[u8; 4]>::try_from(bytes)
            .map(u32::from_be_bytes)
            .unwrap_or(u32::MAX),
    };
    if found > LAYOUT_VERSION {
        Err(found)
    } else {
        Ok(found)
    }
}

/// Appends the record format to every `log` record after the one named under
/// [`PROGRESS_KEY`] (from the start when there is none), batch by batch, and records layout 2
/// with the last batch. Returns how many records it converted.
fn convert_1_to_2(db: &DB, raft: &ColumnFamily, log: &ColumnFamily) -> Result<u64, rocksdb::Error> {
    let mut after = db.get_cf(raft, PROGRESS_KEY)?;
    let mut records = 0;
    loop {
        let mut it = match &after {
            Some(key) => {
                let mut it = db.raw_iterator_cf(log);
                it.seek(key);
                if it.valid() && it.key() == Some(key.as_slice()) {
                    it.next();
                }
                it
            }
            None => {
                let mut it = db.raw_iterator_cf(log);
                it.seek_to_first();
                it
            }
        };
        let mut batch = WriteBatch::default();
        let mut bytes = 0;
        let mut last = None;
        while it.valid() && bytes < CONVERT_BATCH_BYTES {
            let (key, record) = (it.key().expect("valid"), it.value().expect("valid"));
            batch.put_cf(log, key, crate::log_record::from_layout_1(record));
            bytes += key.len() + record.len();
            last = Some(key.to_vec());
            records += 1;
            it.next();
        }
        it.status()?;
        let done = !it.valid();
        drop(it);
        if done {
            batch.put_cf(raft, LAYOUT_KEY, LAYOUT_VERSION.to_be_bytes());
            batch.delete_cf(raft, PROGRESS_KEY);
            return db.write(batch).map(|()| records);
        }
        let last = last.expect("a batch stops early only after taking records");
        batch.put_cf(raft, PROGRESS_KEY, &last);
        db.write(batch)?;
        after = Some(last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_is_layout_1_older_or_same_goes_on_newer_is_refused() {
        assert_eq!(decide(None), Ok(1));
        assert_eq!(decide(Some(&1u32.to_be_bytes())), Ok(1));
        assert_eq!(decide(Some(&2u32.to_be_bytes())), Ok(2));
        assert_eq!(decide(Some(&3u32.to_be_bytes())), Err(3));
        assert_eq!(decide(Some(b"x")), Err(u32::MAX), "not a version: refused");
    }
}
