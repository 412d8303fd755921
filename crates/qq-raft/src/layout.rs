//! The data directory's layout version: which release's arrangement of keys and values the
//! RocksDB database holds.
//!
//! [`Store::open`](crate::store::Store::open) reads it first ([`decide`]). A database without
//! one was made by release 0.1.0 (or is new): it is layout 1, and the version is recorded. A
//! database of a later layout than this binary's [`LAYOUT_VERSION`] was written by a newer
//! release; this one refuses to open it (a downgrade) rather than misread it. A release that
//! changes the layout (a key's shape, a column family) raises the version and converts the
//! older layout when it opens it, before anything else reads the database.
//!
//! What each record holds inside (log entries, snapshots) is versioned on its own: machine
//! versions in the logs, a format number in the snapshots' trailers.

use rocksdb::{ColumnFamily, DB};

/// The layout this binary reads and writes.
pub const LAYOUT_VERSION: u32 = 1;

/// Where the version lives: in the `raft` column family, under a key no group's record can
/// have (those are a group id and a tag, 9 bytes; this sorts after every group but the last
/// possible id, which no queue reaches).
pub(crate) const LAYOUT_KEY: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xffqq-layout";

/// Why a database's layout was not accepted.
pub(crate) enum LayoutError {
    /// Written by a newer release: its layout.
    Newer(u32),
    Db(rocksdb::Error),
}

/// Reads the layout version from column family `cf` of `db` ([`decide`]) and records this
/// binary's where there is none (synced at once).
pub(crate) fn check_and_record(db: &DB, cf: &ColumnFamily) -> Result<(), LayoutError> {
    let stored = db.get_cf(cf, LAYOUT_KEY).map_err(LayoutError::Db)?;
    match decide(stored.as_deref()) {
        Err(found) => Err(LayoutError::Newer(found)),
        Ok(None) => Ok(()),
        Ok(Some(record)) => {
            db.put_cf(cf, LAYOUT_KEY, record).map_err(LayoutError::Db)?;
            db.flush_wal(true).map_err(LayoutError::Db)
        }
    }
}

/// What to do with the stored version `stored` (None: the database has none): Ok(Some(bytes))
/// to record this binary's, Ok(None) to go on, Err(found) for a newer layout.
fn decide(stored: Option<&[u8]>) -> Result<Option<[u8; 4]>, u32> {
    match stored {
        None => Ok(Some(LAYOUT_VERSION.to_be_bytes())),
        Some(bytes) => {
            let found = <[u8; 4]>::try_from(bytes)
                .map(u32::from_be_bytes)
                .unwrap_or(u32::MAX);
            if found > LAYOUT_VERSION {
                Err(found)
            } else {
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_is_recorded_older_or_same_goes_on_newer_is_refused() {
        assert_eq!(decide(None), Ok(Some(1u32.to_be_bytes())));
        assert_eq!(decide(Some(&1u32.to_be_bytes())), Ok(None));
        assert_eq!(decide(Some(&2u32.to_be_bytes())), Err(2));
        assert_eq!(decide(Some(b"x")), Err(u32::MAX), "not a version: refused");
    }
}
