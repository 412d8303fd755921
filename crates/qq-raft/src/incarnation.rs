//! Which data directory a node runs on: its incarnation, a random number drawn when the
//! directory is new and kept in it for good.
//!
//! A node that comes back under the same id on a new, empty directory (a disk replaced, a
//! directory moved aside after damage, a volume deleted) has forgotten its Raft votes and every
//! entry it acknowledged. Counted as the voter it was, it could help elect a leader that lacks
//! entries the cluster confirmed. The cluster records each node's incarnation in its metadata
//! (`RecordIncarnation`); a node on a new directory that finds another incarnation recorded
//! under its id holds its votes until it has been re-seeded as a new member (qq-node's
//! `node::incarnation`).

use rocksdb::{ColumnFamily, DB};

/// Where the incarnation lives: in the `raft` column family, beside the layout version
/// ([`crate::layout::LAYOUT_KEY`]), under a key no group's record can have.
pub(crate) const INCARNATION_KEY: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xffqq-incarnation";

/// The prefix of the store's own keys in the `raft` column family (layout, incarnation).
const OWN_KEYS: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xffqq-";

/// This data directory's incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Incarnation {
    /// Never 0.
    pub id: u64,
    /// Drawn at this start, on a directory that held no Raft state: the node may be new, or
    /// one whose data was lost.
    pub new: bool,
}

/// Reads the incarnation of `db`, or draws one and writes it (synced) if there is none. A
/// directory without one but with Raft state (written by an older release) gets one too and
/// is not new.
pub(crate) fn read_or_draw(
    db: &DB,
    raft: &ColumnFamily,
    log: &ColumnFamily,
) -> Result<Incarnation, rocksdb::Error> {
    if let Some(bytes) = db.get_cf(raft, INCARNATION_KEY)? {
        if let Ok(b) = <[u8; 8]>::try_from(bytes.as_slice()) {
            let id = u64::from_be_bytes(b);
            if id != 0 {
                return Ok(Incarnation { id, new: false });
            }
        }
    }
    let new = holds_no_raft_state(db, raft, log);
    let id = loop {
        let id: u64 = rand::random();
        if id != 0 {
            break id;
        }
    };
    db.put_cf(raft, INCARNATION_KEY, id.to_be_bytes())?;
    db.flush_wal(true)?;
    Ok(Incarnation { id, new })
}

/// No log record, and nothing in `raft` but the store's own keys.
fn holds_no_raft_state(db: &DB, raft: &ColumnFamily, log: &ColumnFamily) -> bool {
    let mut it = db.raw_iterator_cf(log);
    it.seek_to_first();
    if it.valid() {
        return false;
    }
    let mut it = db.raw_iterator_cf(raft);
    it.seek_to_first();
    while it.valid() {
        if !it.key().is_some_and(|k| k.starts_with(OWN_KEYS)) {
            return false;
        }
        it.next();
    }
    true
}
