//! The data directory's layout version: which release's arrangement of keys and values the
//! RocksDB database holds.
//!
//! [`Store::open`](crate::store::Store::open) reads it first. A database without one was made
//! by release 0.1.0 (or is new): it is layout 1, and the version is recorded. A database of a
//! later layout than this binary's [`LAYOUT_VERSION`] was written by a newer release; this one
//! refuses to open it (a downgrade) rather than misread it. A release that changes the layout
//! (a key's shape, a column family) raises the version and converts the older layout when it
//! opens it, before anything else reads the database.
//!
//! What each record holds inside (log entries, snapshots) is versioned on its own: machine
//! versions in the logs, a format number in the snapshots' trailers.

use std::path::Path;

use rocksdb::DB;

use crate::store::{CF_RAFT, StoreError};

/// The layout this binary reads and writes.
pub const LAYOUT_VERSION: u32 = 1;

/// Where the version lives: in the `raft` column family, under a key no group's record can
/// have (those are a group id and a tag, 9 bytes; this sorts after every group but the last
/// possible id, which no queue reaches).
const LAYOUT_KEY: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xffqq-layout";

/// Checks the database's layout (see the module) and records this binary's when it has none.
pub(crate) fn check_and_record(db: &DB, path: &Path) -> Result<(), StoreError> {
    let open_error = |source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    };
    let cf = db
        .cf_handle(CF_RAFT)
        .expect("the raft column family is opened with the database");
    match db.get_cf(cf, LAYOUT_KEY).map_err(open_error)? {
        Some(bytes) => {
            let found = <[u8; 4]>::try_from(bytes.as_slice())
                .map(u32::from_be_bytes)
                .unwrap_or(u32::MAX);
            if found > LAYOUT_VERSION {
                return Err(StoreError::NewerLayout {
                    path: path.to_path_buf(),
                    found,
                });
            }
            Ok(())
        }
        None => {
            db.put_cf(cf, LAYOUT_KEY, LAYOUT_VERSION.to_be_bytes())
                .map_err(open_error)?;
            db.flush_wal(true).map_err(open_error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn a_new_database_records_its_layout_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = Store::open(&path).unwrap();
        drop(store);
        {
            let db = DB::open_cf(
                &rocksdb::Options::default(),
                &path,
                ["log", "raft", "sm", "msg"],
            )
            .unwrap();
            let cf = db.cf_handle(CF_RAFT).unwrap();
            let v = db.get_cf(cf, LAYOUT_KEY).unwrap().unwrap();
            assert_eq!(v, LAYOUT_VERSION.to_be_bytes());
            db.put_cf(cf, LAYOUT_KEY, (LAYOUT_VERSION + 1).to_be_bytes())
                .unwrap();
        }
        let e = Store::open(&path).unwrap_err();
        assert!(matches!(e, StoreError::NewerLayout { found: 2, .. }), "{e}");
        let message = e.to_string();
        assert!(message.contains("newer release"), "{message}");
    }
}
