//! openraft's log storage for one Raft group, on top of the node's shared [`Store`].
//!
//! # What
//!
//! [`LogStore`] implements [`RaftLogStorage`] and [`RaftLogReader`] (openraft 0.10) for one
//! group. Entries live in the `log` column family under `group ++ index` (both u64 big-endian,
//! so a group's log is one sorted key range) as records of [`crate::log_record`]; the vote, the
//! committed log id and the last purged log id live in the `raft` column family under
//! `group ++ tag`.
//!
//! # Why
//!
//! All groups share one RocksDB and therefore one WAL, and durability is provided by the
//! node's single fsync thread (see [`crate::store`]): `append` writes its batch un-synced, so
//! the entries are readable as soon as it returns (openraft 0.10 starts replicating them
//! then), and hands the `IOFlushed` callback to the fsync thread, which completes it after the
//! next `flush_wal(true)`. openraft 0.10 does not wait for the callback before the next
//! append, so consecutive appends of one group and appends of many groups share one fsync.
//! `save_vote` goes through the same thread and returns only once the vote is durable.
//! `truncate_after`, `purge` and `save_committed` are written un-synced: because the WAL is
//! ordered, the next fsync (which precedes any acknowledgement or vote this node sends) makes
//! them durable, and losing them in a crash only reverts to an earlier valid state.
//!
//! The vote and the last purged log id are cached (shared by the store and its readers, so
//! `leader_bounded_stream`, which reads the vote twice per replication batch, does not hit
//! RocksDB). The newest entries are kept in memory too ([`crate::log_tail`]): replication
//! and apply read what was just appended without going back to RocksDB. Reads of more than a
//! few hundred entries, or of open ranges, run on `spawn_blocking`.
//!
//! # What it leaves out
//!
//! - One `LogStore` (plus the readers it hands out) per group and process: a second
//!   `LogStore::new` for the same group would have its own caches.
//! - Entries are read from memory only while they are in the group's [`Tail`] (the newest
//!   ones, within its bounds); older reads (a follower far behind) hit RocksDB.
//! - `append` does not check that the entries are consecutive; openraft guarantees it.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};

use openraft::OptionalSend;
use openraft::alias::{EntryOf, LogIdOf, VoteOf};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use rocksdb::{ReadOptions, WriteBatch};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::log_record;
use crate::log_tail::Tail;
use crate::store::{
    CF_LOG, CF_RAFT, Store, TAG_COMMITTED, TAG_LAST_PURGED, TAG_VOTE, group_end, key16, raft_key,
};
use crate::types::{GroupId, TypeConfig};

/// A RocksDB write batch's own header (sequence number and count).
const BATCH_HEADER: usize = 12;
/// What a batch adds to each put beside the value: the record's tag, the column family's id,
/// the key (16 bytes) and two length varints, at most.
const BATCH_RECORD_OVERHEAD: usize = 1 + 5 + 1 + 16 + 5;

type Entry = EntryOf<TypeConfig>;
type LogId = LogIdOf<TypeConfig>;
type Vote = VoteOf<TypeConfig>;

/// Reads of at most this many entries (with a bounded range) run inline on the caller's task;
/// larger ones go to `spawn_blocking`.
const INLINE_READ_MAX: u64 = 256;

/// Values cached per group. The outer `Option` is "not loaded yet".
struct Cached {
    vote: Option<Option<Vote>>,
    last_purged: Option<Option<LogId>>,
    tail: Tail,
}

/// Log storage (and log reader) of one Raft group. Cloning gives another handle to the same
/// group and caches; it is also the [`RaftLogStorage::LogReader`].
#[derive(Clone)]
pub struct LogStore {
    store: Store,
    group: GroupId,
    cached: Arc<Mutex<Cached>>,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("group", &self.group)
            .field("store", &self.store)
            .finish()
    }
}

impl LogStore {
    /// The log store of `group` in the node's shared `store`. Nothing is read until used.
    pub fn new(store: Store, group: GroupId) -> LogStore {
        LogStore {
            group,
            cached: Arc::new(Mutex::new(Cached {
                vote: None,
                last_purged: None,
                tail: Tail::new(store.tail_budget()),
            })),
            store,
        }
    }

    /// The group this store belongs to.
    pub fn group(&self) -> GroupId {
        self.group
    }

    /// The shared node store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn ctx(&self, what: &str) -> String {
        format!("{what} of group {}", self.group)
    }

    fn encode<T: Serialize>(&self, what: &str, v: &T) -> io::Result<Vec<u8>> {
        crate::encoding::to_vec_exact(v).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("encode {}: {e}", self.ctx(what)),
            )
        })
    }

    fn decode<T: DeserializeOwned>(&self, what: &str, bytes: &[u8]) -> io::Result<T> {
        postcard::from_bytes(bytes).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("decode {}: {e}", self.ctx(what)),
            )
        })
    }

    /// A log record's entry ([`log_record`]).
    fn decode_entry(&self, what: &str, record: &[u8]) -> io::Result<Entry> {
        log_record::decode(record).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("decode {}: {e}", self.ctx(what)),
            )
        })
    }

    fn read_raft<T: DeserializeOwned>(&self, tag: u8, what: &str) -> io::Result<Option<T>> {
        let db = self.store.db();
        match db
            .get_pinned_cf(self.store.cf(CF_RAFT), raft_key(self.group, tag))
            .map_err(|e| self.store.err(&format!("read {}", self.ctx(what)), e))?
        {
            Some(bytes) => Ok(Some(self.decode(what, &bytes)?)),
            None => Ok(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cached> {
        // The critical sections cannot panic halfway through an update; recover from poison.
        self.cached.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cached_vote(&self) -> io::Result<Option<Vote>> {
        let mut c = self.lock();
        if let Some(v) = &c.vote {
            return Ok(v.clone());
        }
        let v: Option<Vote> = self.read_raft(TAG_VOTE, "vote")?;
        c.vote = Some(v.clone());
        Ok(v)
    }

    fn cached_last_purged(&self) -> io::Result<Option<LogId>> {
        let mut c = self.lock();
        if let Some(v) = &c.last_purged {
            return Ok(v.clone());
        }
        let v: Option<LogId> = self.read_raft(TAG_LAST_PURGED, "last purged log id")?;
        c.last_purged = Some(v.clone());
        Ok(v)
    }

    /// The last entry's log id, found with one reverse seek over the group's key range.
    fn last_log_id_in_db(&self) -> io::Result<Option<LogId>> {
        let db = self.store.db();
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(key16(self.group, 0).to_vec());
        opts.set_iterate_upper_bound(group_end(self.group).to_vec());
        let mut it = db.raw_iterator_cf_opt(self.store.cf(CF_LOG), opts);
        it.seek_to_last();
        if !it.valid() {
            it.status()
                .map_err(|e| self.store.err(&format!("seek {}", self.ctx("last log")), e))?;
            return Ok(None);
        }
        let value = it.value().expect("valid iterator has a value");
        let entry = self.decode_entry("last log entry", value)?;
        Ok(Some(entry.log_id()))
    }

    /// Reads entries `[start, end)` (`end == None`: to the end of the group's log). Checks
    /// that what it returns is consecutive. An iterator reads one consistent RocksDB view.
    fn read_entries(&self, start: u64, end: Option<u64>) -> io::Result<Vec<Entry>> {
        let db = self.store.db();
        let mut opts = ReadOptions::default();
        match end {
            Some(end) => opts.set_iterate_upper_bound(key16(self.group, end).to_vec()),
            None => opts.set_iterate_upper_bound(group_end(self.group).to_vec()),
        }
        let mut it = db.raw_iterator_cf_opt(self.store.cf(CF_LOG), opts);
        it.seek(key16(self.group, start));
        let mut out = Vec::new();
        let mut expect: Option<u64> = None;
        while it.valid() {
            let key = it.key().expect("valid iterator has a key");
            if key.len() != 16 || key[..8] != self.group.to_be_bytes() {
                break;
            }
            let index = u64::from_be_bytes(key[8..16].try_into().expect("16-byte key"));
            if let Some(e) = expect
                && index != e
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "hole in {}: expected index {e}, found {index}",
                        self.ctx("log")
                    ),
                ));
            }
            let entry = self.decode_entry("log entry", it.value().expect("value"))?;
            if entry.index() != index {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: key index {index} holds entry {}",
                        self.ctx("corrupt log"),
                        entry.log_id()
                    ),
                ));
            }
            out.push(entry);
            expect = index.checked_add(1);
            it.next();
        }
        it.status()
            .map_err(|e| self.store.err(&format!("read {}", self.ctx("log")), e))?;
        Ok(out)
    }
}

/// `[start, end)` of a range of log indices; `end == None` means unbounded.
fn index_range<RB: RangeBounds<u64>>(range: &RB) -> Option<(u64, Option<u64>)> {
    let start = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(e) => e.checked_add(1),
        Bound::Excluded(e) => Some(*e),
        Bound::Unbounded => None,
    };
    if let Some(end) = end
        && end <= start
    {
        return None;
    }
    Some((start, end))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let Some((start, end)) = index_range(&range) else {
            return Ok(Vec::new());
        };
        if let Some(end) = end
            && let Some(entries) = self.lock().tail.get(start, end)
        {
            return Ok(entries);
        }
        match end {
            Some(end) if end - start <= INLINE_READ_MAX => self.read_entries(start, Some(end)),
            _ => {
                let this = self.clone();
                crate::lockstep::spawn_blocking(move || this.read_entries(start, end))
                    .await
                    .map_err(|e| io::Error::other(format!("read {}: {e}", self.ctx("log"))))?
            }
        }
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.cached_vote()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged = self.cached_last_purged()?;
        let last = self.last_log_id_in_db()?;
        Ok(LogState {
            last_log_id: last.or_else(|| last_purged.clone()),
            last_purged_log_id: last_purged,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let bytes = self.encode("vote", vote)?;
        {
            // Write and update the cache under the lock, so that a concurrent first load cannot
            // put the old vote back into the cache.
            let mut c = self.lock();
            let mut batch = WriteBatch::default();
            batch.put_cf(
                self.store.cf(CF_RAFT),
                raft_key(self.group, TAG_VOTE),
                bytes,
            );
            self.store
                .write(batch, || format!("save {}", self.ctx("vote")))?;
            c.vote = Some(Some(vote.clone()));
        }
        self.store.sync().await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        let key = raft_key(self.group, TAG_COMMITTED);
        let cf = self.store.cf(CF_RAFT);
        let mut batch = WriteBatch::default();
        match &committed {
            Some(c) => batch.put_cf(cf, key, self.encode("committed log id", c)?),
            None => batch.delete_cf(cf, key),
        }
        self.store
            .write(batch, || format!("save {}", self.ctx("committed log id")))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        self.read_raft(TAG_COMMITTED, "committed log id")
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let cf = self.store.cf(CF_LOG);
        let mut records = Vec::new();
        let mut kept = Vec::new();
        for entry in entries {
            let bytes = log_record::encode(&entry).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("encode {}: {e}", self.ctx("log entry")),
                )
            })?;
            kept.push((entry, bytes.len()));
            records.push(bytes);
        }
        // Sized once: a batch that grows as it is filled copies what it holds at each doubling.
        let room: usize = records
            .iter()
            .map(|r| r.len() + BATCH_RECORD_OVERHEAD)
            .sum();
        let mut batch = WriteBatch::with_capacity_bytes(room + BATCH_HEADER);
        for ((entry, _), bytes) in kept.iter().zip(&records) {
            batch.put_cf(cf, key16(self.group, entry.index()), bytes);
        }
        let last = kept.last().map(|(e, _)| e.index());
        let n = kept.len();
        if n == 0 {
            // Nothing to write, but the callback still means "everything before is durable".
            self.store.flush_then(callback);
            return Ok(());
        }
        self.store.write(batch, || {
            format!("append {n} entries up to {:?} {}", last, self.ctx("log"))
        })?;
        // After the write: the tail never holds what RocksDB does not.
        self.lock().tail.appended(kept);
        self.store.flush_then(callback);
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = match &last_log_id {
            Some(id) => match id.index().checked_add(1) {
                Some(i) => i,
                None => return Ok(()),
            },
            None => 0,
        };
        // Before the write: a read in between finds the entries in RocksDB, not stale ones here.
        self.lock().tail.truncate_from(from);
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(
            self.store.cf(CF_LOG),
            &key16(self.group, from)[..],
            &group_end(self.group)[..],
        );
        self.store.write(batch, || {
            format!("truncate after {:?} {}", last_log_id, self.ctx("log"))
        })
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let bytes = self.encode("last purged log id", &log_id)?;
        let mut c = self.lock();
        c.tail.purge_to(log_id.index());
        let mut batch = WriteBatch::default();
        batch.put_cf(
            self.store.cf(CF_RAFT),
            raft_key(self.group, TAG_LAST_PURGED),
            bytes,
        );
        let to = key16(self.group, log_id.index().saturating_add(1));
        let end = group_end(self.group);
        let to: &[u8] = if log_id.index() == u64::MAX {
            &end[..]
        } else {
            &to[..]
        };
        // Record last_purged and delete the entries in one atomic batch: there is never a state
        // where entries are gone but last_purged is older.
        batch.delete_range_cf(self.store.cf(CF_LOG), &key16(self.group, 0)[..], to);
        self.store.write(batch, || {
            format!("purge up to {log_id} {}", self.ctx("log"))
        })?;
        c.last_purged = Some(Some(log_id));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorage;
    use openraft::type_config::TypeConfigExt;
    use openraft::vote::RaftLeaderId;

    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(
            <openraft::alias::LeaderIdOf<TypeConfig>>::new(term, 1).to_committed(),
            index,
        )
    }

    async fn append(ls: &mut LogStore, range: std::ops::RangeInclusive<u64>) {
        let entries: Vec<Entry> = range.map(|i| Entry::new_blank(log_id(1, i))).collect();
        let (tx, rx) = TypeConfig::oneshot();
        ls.append(entries, IOFlushed::signal(tx)).await.unwrap();
        rx.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn groups_are_isolated_and_state_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let mut a = LogStore::new(store.clone(), 1);
            let mut b = LogStore::new(store.clone(), 2);
            let mut max = LogStore::new(store.clone(), u64::MAX);
            append(&mut a, 1..=10).await;
            append(&mut b, 1..=3).await;
            append(&mut max, 5..=6).await;
            a.purge(log_id(1, 4)).await.unwrap();
            a.truncate_after(Some(log_id(1, 8))).await.unwrap();
            let vote = Vote::new(3, 7);
            a.save_vote(&vote).await.unwrap();
            a.save_committed(Some(log_id(1, 6))).await.unwrap();
            store.sync().await.unwrap();

            let st = b.get_log_state().await.unwrap();
            assert_eq!(st.last_log_id, Some(log_id(1, 3)));
            assert_eq!(st.last_purged_log_id, None);
            let st = max.get_log_state().await.unwrap();
            assert_eq!(st.last_log_id, Some(log_id(1, 6)));
            assert_eq!(b.read_vote().await.unwrap(), None);
        }
        let store = Store::open(dir.path()).unwrap();
        let mut a = LogStore::new(store.clone(), 1);
        let st = a.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id, Some(log_id(1, 4)));
        assert_eq!(st.last_log_id, Some(log_id(1, 8)));
        assert_eq!(a.read_vote().await.unwrap(), Some(Vote::new(3, 7)));
        assert_eq!(a.read_committed().await.unwrap(), Some(log_id(1, 6)));
        let got = a.try_get_log_entries(0..100).await.unwrap();
        let idx: Vec<u64> = got.iter().map(|e| e.index()).collect();
        assert_eq!(idx, vec![5, 6, 7, 8]);
        // An unbounded read goes through spawn_blocking.
        assert_eq!(a.try_get_log_entries(6..).await.unwrap().len(), 3);
        assert!(a.try_get_log_entries(7..7).await.unwrap().is_empty());

        a.truncate_after(None).await.unwrap();
        let st = a.get_log_state().await.unwrap();
        assert_eq!(st.last_log_id, Some(log_id(1, 4)));

        store.delete_group(2).unwrap();
        let mut b = LogStore::new(store.clone(), 2);
        assert_eq!(b.get_log_state().await.unwrap().last_log_id, None);
    }
}
