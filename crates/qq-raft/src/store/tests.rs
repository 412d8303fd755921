use super::*;
use rocksdb::Options;

#[tokio::test]
async fn bodies_snapshots_and_delete_group() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store
        .put_bodies(1, &[(1, &b"a"[..]), (2, &b"bb"[..]), (3, &b"ccc"[..])])
        .unwrap();
    store.put_bodies(2, &[(1, &b"other"[..])]).unwrap();
    store.delete_bodies(1, &[2]).unwrap();
    assert_eq!(store.get_body(1, 1).unwrap().as_deref(), Some(&b"a"[..]));
    assert_eq!(store.get_body(1, 2).unwrap(), None);
    let pinned = store.pin();
    let all = pinned.scan_bodies(1, 0, usize::MAX).unwrap();
    assert_eq!(all, vec![(1, b"a".to_vec()), (3, b"ccc".to_vec())]);
    assert_eq!(pinned.scan_bodies(1, 2, usize::MAX).unwrap().len(), 1);
    assert_eq!(
        pinned.scan_bodies(1, 0, 1).unwrap().len(),
        1,
        "at least one, then the budget"
    );
    // Later writes do not show in the pinned view.
    store.delete_bodies(1, &[1]).unwrap();
    assert_eq!(pinned.scan_bodies(1, 0, usize::MAX).unwrap().len(), 2);
    assert_eq!(store.pin().scan_bodies(1, 0, usize::MAX).unwrap().len(), 1);
    store.put_bodies(1, &[(1, &b"a"[..])]).unwrap();
    drop(pinned);

    store.put_snapshot(1, b"snap").await.unwrap();
    assert_eq!(
        store.get_snapshot(1).unwrap().as_deref(),
        Some(&b"snap"[..])
    );
    store.sync().await.unwrap();

    store.delete_group(1).unwrap();
    assert_eq!(store.get_body(1, 1).unwrap(), None);
    assert_eq!(store.get_snapshot(1).unwrap(), None);
    assert_eq!(
        store.get_body(2, 1).unwrap().as_deref(),
        Some(&b"other"[..])
    );
    let (fsyncs, callbacks) = store.sync_stats();
    assert!(fsyncs >= 1 && callbacks >= 2);
}

#[test]
fn open_error_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = Store::open(&file).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("open rocksdb at "), "{msg}");
    assert!(msg.contains("not-a-dir"), "{msg}");
}

#[test]
fn a_new_database_records_its_layout_and_a_newer_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    drop(Store::open(&path).unwrap());
    {
        let db = DB::open_cf(&Options::default(), &path, ALL_CFS).unwrap();
        let cf = db.cf_handle(CF_RAFT).unwrap();
        let key = crate::layout::LAYOUT_KEY;
        let v = db.get_cf(cf, key).unwrap().unwrap();
        assert_eq!(v, crate::layout::LAYOUT_VERSION.to_be_bytes());
        db.put_cf(cf, key, (crate::layout::LAYOUT_VERSION + 1).to_be_bytes())
            .unwrap();
    }
    let e = Store::open(&path).unwrap_err();
    assert!(matches!(e, StoreError::NewerLayout { found: 3, .. }), "{e}");
    assert!(e.to_string().contains("newer release"), "{e}");
}

/// A new directory draws an incarnation and says it is new; reopened, the same one, not new.
/// A directory with Raft state but no incarnation (an older release's) gets one, not new. A
/// wiped directory draws another.
#[test]
fn a_directory_keeps_its_incarnation_and_a_new_one_draws_another() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let first = Store::open(&path).unwrap().incarnation();
    assert!(first.new && first.id != 0, "{first:?}");
    let again = Store::open(&path).unwrap().incarnation();
    assert_eq!(
        again,
        Incarnation {
            new: false,
            ..first
        }
    );

    let older = dir.path().join("older");
    layout_1_database(&older, &[(3, entries(3, 2, 10))], 0);
    let found = Store::open(&older).unwrap().incarnation();
    assert!(!found.new, "{found:?}");

    std::fs::remove_dir_all(&path).unwrap();
    let wiped = Store::open(&path).unwrap().incarnation();
    assert!(
        wiped.new && wiped.id != first.id,
        "{wiped:?} after {first:?}"
    );
}

type Entry = openraft::alias::EntryOf<TypeConfig>;

/// `n` entries of group `group`, each with a payload of `size` bytes.
fn entries(group: GroupId, n: u64, size: usize) -> Vec<Entry> {
    use openraft::entry::RaftEntry;
    use openraft::vote::RaftLeaderId;
    let leader = <openraft::alias::LeaderIdOf<TypeConfig>>::new(2, 1).to_committed();
    (1..=n)
        .map(|index| {
            let payload = vec![(group as u8) ^ (index as u8); size];
            Entry::new_normal(
                openraft::LogId::new(leader.clone(), index),
                crate::types::Request {
                    payload: payload.into(),
                },
            )
        })
        .collect()
}

/// A database as release 0.1.0 left it: no layout version, log records without their format;
/// the first `converted` records of the first group already converted (a conversion stopped
/// there by a crash), with the progress key naming the last of them.
fn layout_1_database(path: &Path, groups: &[(GroupId, Vec<Entry>)], converted: usize) {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    let db = DB::open_cf(&opts, path, ALL_CFS).unwrap();
    let (log, raft) = (
        db.cf_handle(CF_LOG).unwrap(),
        db.cf_handle(CF_RAFT).unwrap(),
    );
    for (group, entries) in groups {
        for (i, e) in entries.iter().enumerate() {
            let old = crate::encoding::to_vec_exact(e).unwrap();
            let key = key16(*group, openraft::entry::RaftEntry::index(e));
            if *group == groups[0].0 && i < converted {
                db.put_cf(log, key, crate::log_record::from_layout_1(&old))
                    .unwrap();
                db.put_cf(raft, crate::layout::PROGRESS_KEY, key).unwrap();
            } else {
                db.put_cf(log, key, old).unwrap();
            }
        }
    }
}

/// Every log record of the database, decoded as this binary reads them.
fn stored_entries(store: &Store) -> Vec<Entry> {
    let db = store.db();
    db.iterator_cf(store.cf(CF_LOG), IteratorMode::Start)
        .map(|kv| crate::log_record::decode(&kv.unwrap().1).unwrap())
        .collect()
}

#[test]
fn a_layout_1_log_is_converted_in_batches_and_a_stopped_conversion_resumes() {
    // Two groups, about 2.5 conversion batches of records in all.
    let groups: Vec<(GroupId, Vec<Entry>)> = vec![
        (1, entries(1, 120, 100 * 1024)),
        (7, entries(7, 90, 100 * 1024)),
    ];
    let expected: Vec<Entry> = groups.iter().flat_map(|(_, e)| e.clone()).collect();
    for converted in [0, 33] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        layout_1_database(&path, &groups, converted);
        let store = Store::open(&path).unwrap();
        assert_eq!(
            stored_entries(&store),
            expected,
            "converted before: {converted}"
        );
        let raft = store.cf(CF_RAFT);
        let layout = store.db().get_cf(raft, crate::layout::LAYOUT_KEY).unwrap();
        assert_eq!(layout.unwrap(), 2u32.to_be_bytes());
        let progress = store
            .db()
            .get_cf(raft, crate::layout::PROGRESS_KEY)
            .unwrap();
        assert_eq!(progress, None, "the progress key goes with the last batch");
        drop(store);
        // Opening layout 2 again converts nothing more.
        let store = Store::open(&path).unwrap();
        assert_eq!(stored_entries(&store), expected);
    }
}

/// The names of the WAL files directly in `dir` ([`crash::wal_files`]), sorted; none when
/// `dir` does not exist.
fn logs_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = crash::wal_files(dir)
        .unwrap_or_default()
        .into_iter()
        .map(|(path, _)| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn an_obsolete_wal_file_is_archived_and_then_trimmed_away() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut batch = WriteBatch::default();
    for k in 0u8..8 {
        batch.put_cf(store.cf(CF_RAFT), [k], vec![k; 1 << 20]);
    }
    store.write(batch, || "8 MiB".into()).unwrap();
    store.sync().await.unwrap();
    let before = logs_in(dir.path());
    assert_eq!(before.len(), 1, "{before:?}");

    // Every memtable flushed: that WAL holds nothing a table file does not.
    for cf in ALL_CFS {
        store.db().flush_cf(store.cf(cf)).unwrap();
    }
    let archive = dir.path().join("archive");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let live = logs_in(dir.path());
        let old_gone = !live.contains(&before[0]);
        if old_gone && archive.is_dir() && logs_in(&archive).is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "live {live:?}, archived {:?}",
            logs_in(&archive)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // RocksDB made the archive (it moved the file there rather than deleting it), and the
    // trimmer emptied it; the database still reads what the old WAL held.
    let raft = store.cf(CF_RAFT);
    assert_eq!(
        store.db().get_cf(raft, [7u8]).unwrap().unwrap().len(),
        1 << 20
    );
}

/// The nice value of each of this process's threads whose name starts with `prefix`.
fn nice_of_threads(prefix: &str) -> Vec<(String, i64)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let task = task.unwrap().path();
        let Ok(comm) = std::fs::read_to_string(task.join("comm")) else {
            continue; // the thread ended
        };
        let Ok(stat) = std::fs::read_to_string(task.join("stat")) else {
            continue;
        };
        let comm = comm.trim().to_string();
        if comm.starts_with(prefix) {
            // After "pid (comm) ", the fields start at the third (state); nice is the 19th.
            let after = &stat[stat.rfind(')').unwrap() + 2..];
            let nice = after.split(' ').nth(19 - 3).unwrap().parse().unwrap();
            found.push((comm, nice));
        }
    }
    found
}

#[tokio::test]
async fn flushes_and_compactions_run_at_the_lowest_cpu_priority() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut batch = WriteBatch::default();
    batch.put_cf(store.cf(CF_RAFT), [1u8], vec![1u8; 1 << 10]);
    store.write(batch, || "1 KiB".into()).unwrap();
    store.sync().await.unwrap();
    // A flush runs in the high-priority pool, a manual compaction in the low one; each thread
    // lowers its priority before it runs its job.
    store.db().flush_cf(store.cf(CF_RAFT)).unwrap();
    store
        .db()
        .compact_range_cf(store.cf(CF_RAFT), None::<&[u8]>, None::<&[u8]>);
    let threads = nice_of_threads("rocksdb:");
    for pool in ["rocksdb:high", "rocksdb:low"] {
        assert!(
            threads.iter().any(|(name, _)| name == pool),
            "no {pool} thread among {threads:?}"
        );
    }
    for (name, nice) in &threads {
        if name == "rocksdb:high" || name == "rocksdb:low" {
            assert_eq!(*nice, 19, "{name}: {threads:?}");
        }
    }
}

/// On a lock-step thread the store syncs before `sync` (and `append`) returns: the future is
/// ready at its first poll, one fsync per request, and the fsync thread is not involved.
#[test]
fn a_lockstep_thread_syncs_its_writes_itself() {
    use futures::FutureExt;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            crate::lockstep::mark_this_thread();
            store.put_bodies(1, &[(1, &b"a"[..])]).unwrap();
            for n in 1..=3 {
                let synced = store.sync().now_or_never();
                assert!(matches!(synced, Some(Ok(()))), "{synced:?}");
                assert_eq!(store.sync_stats(), (n, n));
            }
        });
    });
}
