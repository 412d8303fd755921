//! openraft's storage conformance suite against [`LogStore`], plus a group-commit test.
//!
//! The suite (`openraft::testing::log::Suite`) needs a state machine too; `MemStateMachine`
//! below is a minimal in-memory one (last applied, last membership, snapshot = postcard of
//! both). It only exists to drive the suite: the real state machines live elsewhere.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use openraft::alias::{
    EntryOf, LeaderIdOf, LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf, VoteOf,
};
use openraft::entry::RaftEntry;
use openraft::storage::{
    EntryResponder, IOFlushed, RaftLogReader, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine,
};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use openraft::vote::RaftLeaderId;
use openraft::{EntryPayload, OptionalSend, StorageError};
use qq_raft::log_store::LogStore;
use qq_raft::store::Store;
use qq_raft::{Request, Response, TypeConfig};
use serde::{Deserialize, Serialize};
use tempfile::TempDir;

type Entry = EntryOf<TypeConfig>;
type LogId = LogIdOf<TypeConfig>;
type StoredMembership = StoredMembershipOf<TypeConfig>;
type SnapshotMeta = SnapshotMetaOf<TypeConfig>;
type Snapshot = SnapshotOf<TypeConfig, Vec<u8>>;

// ---- minimal in-memory state machine ------------------------------------------------------

#[derive(Clone, Default, Serialize, Deserialize)]
struct SmData {
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
}

#[derive(Default)]
struct SmInner {
    data: SmData,
    current: Option<(SnapshotMeta, Vec<u8>)>,
}

#[derive(Clone, Default)]
struct MemStateMachine {
    inner: Arc<Mutex<SmInner>>,
}

impl RaftSnapshotBuilder<TypeConfig> for MemStateMachine {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let mut g = self.inner.lock().unwrap();
        let bytes = postcard::to_stdvec(&g.data).map_err(io::Error::other)?;
        let meta = SnapshotMeta {
            last_log_id: g.data.last_applied.clone(),
            last_membership: g.data.last_membership.clone(),
        };
        g.current = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: bytes,
        })
    }
}

impl RaftStateMachine<TypeConfig> for MemStateMachine {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = MemStateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let g = self.inner.lock().unwrap();
        Ok((g.data.last_applied.clone(), g.data.last_membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>>
            + Unpin
            + OptionalSend,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let resp = {
                let mut g = self.inner.lock().unwrap();
                let log_id = entry.log_id();
                g.data.last_applied = Some(log_id.clone());
                match entry.payload {
                    EntryPayload::Blank => Response::default(),
                    EntryPayload::Normal(Request { payload }) => Response {
                        payload: payload.to_vec(),
                    },
                    EntryPayload::Membership(m) => {
                        g.data.last_membership = StoredMembership::new(Some(log_id), m);
                        Response::default()
                    }
                }
            };
            if let Some(r) = responder {
                r.send(resp);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        let data: SmData = postcard::from_bytes(&snapshot).map_err(io::Error::other)?;
        let mut g = self.inner.lock().unwrap();
        g.data = data;
        g.current = Some((meta.clone(), snapshot));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let g = self.inner.lock().unwrap();
        Ok(g.current
            .clone()
            .map(|(meta, snapshot)| Snapshot { meta, snapshot }))
    }
}

// ---- the suite ------------------------------------------------------------------------------

/// Each suite case gets a fresh RocksDB in a fresh temp dir (the guard removes it).
struct Builder;

impl StoreBuilder<TypeConfig, LogStore, MemStateMachine, TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(TempDir, LogStore, MemStateMachine), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open store");
        // A non-zero group id, so key prefixes are exercised.
        Ok((dir, LogStore::new(store, 42), MemStateMachine::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() -> Result<(), StorageError<TypeConfig>> {
    Suite::<TypeConfig, LogStore, MemStateMachine, Builder, TempDir>::test_all(Builder).await
}

// ---- group commit -----------------------------------------------------------------------------

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(LeaderIdOf::<TypeConfig>::new(term, 1).to_committed(), index)
}

fn entry(group: u64, index: u64) -> Entry {
    Entry::new_normal(
        log_id(1, index),
        Request {
            payload: format!("g{group}-i{index}").into_bytes().into(),
        },
    )
}

/// Many concurrent appends from 20 groups: fewer fsyncs than completed callbacks (several
/// callbacks per fsync), and every acknowledged entry is there after reopening the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_across_groups() {
    const GROUPS: u64 = 20;
    const APPENDS: u64 = 50;
    const PER_APPEND: u64 = 3;

    // Under the target dir rather than /tmp: a real disk, where an fsync costs something.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (fsyncs0, callbacks0) = store.sync_stats();

    let mut tasks = Vec::new();
    for group in 1..=GROUPS {
        let mut ls = LogStore::new(store.clone(), group);
        tasks.push(tokio::spawn(async move {
            // Like openraft 0.10: submit appends back to back, do not wait for each flush.
            let mut pending = Vec::new();
            for a in 0..APPENDS {
                let first = a * PER_APPEND + 1;
                let entries: Vec<Entry> = (first..first + PER_APPEND)
                    .map(|i| entry(group, i))
                    .collect();
                let (tx, rx) = TypeConfig::oneshot();
                ls.append(entries, IOFlushed::signal(tx)).await.unwrap();
                // Readable as soon as append returns, before it is durable.
                let last = first + PER_APPEND - 1;
                let got = ls.try_get_log_entries(last..=last).await.unwrap();
                assert_eq!(got.len(), 1);
                pending.push((last, rx));
                if a % 10 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            let mut acked = 0;
            for (last, rx) in pending {
                rx.await.expect("callback dropped").expect("append failed");
                acked = last;
            }
            (group, acked)
        }));
    }

    let mut acked = Vec::new();
    for t in tasks {
        acked.push(
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .unwrap()
                .unwrap(),
        );
    }

    let (fsyncs, callbacks) = store.sync_stats();
    let (fsyncs, callbacks) = (fsyncs - fsyncs0, callbacks - callbacks0);
    println!(
        "group commit: {callbacks} callbacks, {fsyncs} fsyncs ({:.1} per fsync)",
        callbacks as f64 / fsyncs.max(1) as f64
    );
    assert_eq!(callbacks, GROUPS * APPENDS);
    assert!(
        fsyncs < callbacks,
        "expected batching: {fsyncs} fsyncs for {callbacks} callbacks"
    );

    drop(store);

    // Reopen: every acknowledged entry must be there.
    let store = Store::open(dir.path()).unwrap();
    for (group, last) in acked {
        assert_eq!(last, APPENDS * PER_APPEND);
        let mut ls = LogStore::new(store.clone(), group);
        let state = ls.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(1, last)));
        let got = ls.try_get_log_entries(1..=last).await.unwrap();
        assert_eq!(got.len() as u64, last, "group {group}");
        for (i, e) in got.iter().enumerate() {
            assert_eq!(*e, entry(group, i as u64 + 1));
        }
    }
}

/// `save_vote` returns only after an fsync that covers it, and the vote survives reopening.
#[tokio::test]
async fn save_vote_is_durable_through_the_fsync_thread() {
    let dir = tempfile::tempdir().unwrap();
    let vote = VoteOf::<TypeConfig>::new(5, 3);
    {
        let store = Store::open(dir.path()).unwrap();
        let mut ls = LogStore::new(store.clone(), 9);
        let (f0, c0) = store.sync_stats();
        ls.save_vote(&vote).await.unwrap();
        let (f1, c1) = store.sync_stats();
        assert!(f1 > f0 && c1 > c0);
    }
    let store = Store::open(dir.path()).unwrap();
    let mut ls = LogStore::new(store, 9);
    assert_eq!(ls.read_vote().await.unwrap(), Some(vote));
}
