use super::*;

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
    assert!(matches!(e, StoreError::NewerLayout { found: 2, .. }), "{e}");
    assert!(e.to_string().contains("newer release"), "{e}");
}
