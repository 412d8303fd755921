use openraft::vote::RaftLeaderId;

use super::*;

fn log_id(index: u64) -> LogIdOf<TypeConfig> {
    LogIdOf::<TypeConfig>::new(
        <openraft::alias::LeaderIdOf<TypeConfig>>::new(2, 1).to_committed(),
        index,
    )
}

fn write(dir: &SnapshotDir, group: GroupId, index: u64, bodies: u64) -> SnapshotFile {
    let mut w = dir.writer(group, Some(&log_id(index))).unwrap();
    w.header(b"state").unwrap();
    for id in 0..bodies {
        w.body(id, &vec![id as u8; 1000 + id as usize]).unwrap();
    }
    w.finish().unwrap()
}

fn read_all(file: &SnapshotFile) -> io::Result<(Vec<u8>, Vec<(u64, Vec<u8>)>)> {
    let mut r = file.reader()?;
    let header = r.header()?;
    let mut bodies = Vec::new();
    while let Some(b) = r.next_body()? {
        bodies.push(b);
    }
    Ok((header, bodies))
}

#[test]
fn a_written_snapshot_reads_back_and_a_damaged_one_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = SnapshotDir::open(tmp.path()).unwrap();
    let file = write(&dir, 7, 10, 50);
    let (header, bodies) = read_all(&file).unwrap();
    assert_eq!(header, b"state");
    assert_eq!(bodies.len(), 50);
    assert_eq!(bodies[49], (49, vec![49u8; 1049]));
    assert_eq!(
        dir.names_of(7).unwrap(),
        vec![SnapshotDir::name(7, Some(&log_id(10)))]
    );
    assert!(dir.names_of(8).unwrap().is_empty());

    // Truncated: the end record is missing.
    let bytes = fs::read(file.path()).unwrap();
    let cut = tmp.path().join("cut");
    fs::write(&cut, &bytes[..bytes.len() - 20]).unwrap();
    let err = read_all(&SnapshotFile::open(&cut).unwrap()).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    // One flipped byte in a body: the checksum says so.
    let mut flipped = bytes.clone();
    flipped[500] ^= 0xff;
    let bad = tmp.path().join("bad");
    fs::write(&bad, &flipped).unwrap();
    let err = read_all(&SnapshotFile::open(&bad).unwrap()).unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
}

fn chunk(file: &SnapshotFile, index: u64, offset: u64, max: usize) -> SnapshotChunk {
    SnapshotChunk {
        vote: VoteOf::<TypeConfig>::new(2, 1),
        meta: SnapshotMetaOf::<TypeConfig> {
            last_log_id: Some(log_id(index)),
            last_membership: Default::default(),
        },
        total: file.len(),
        offset,
        data: file.read_chunk(offset, max).unwrap(),
    }
}

#[test]
fn chunks_are_received_in_order_resumed_and_completed() {
    let src = tempfile::tempdir().unwrap();
    let src = SnapshotDir::open(src.path()).unwrap();
    let file = write(&src, 3, 20, 200);
    let dst_tmp = tempfile::tempdir().unwrap();
    let dst = SnapshotDir::open(dst_tmp.path()).unwrap();
    let step = 64 * 1024;

    // A probe (no data) asks where to start.
    let mut probe = chunk(&file, 20, 0, 0);
    probe.data.clear();
    assert!(matches!(dst.receive(3, &probe).unwrap(), Received::Next(0)));
    // Two chunks, then the transfer breaks; a chunk from the wrong offset is not written.
    for k in 0..2 {
        let c = chunk(&file, 20, k * step as u64, step);
        assert!(
            matches!(dst.receive(3, &c).unwrap(), Received::Next(n) if n == (k + 1) * step as u64)
        );
    }
    let wrong = chunk(&file, 20, 3 * step as u64, step);
    assert!(matches!(dst.receive(3, &wrong).unwrap(), Received::Next(n) if n == 2 * step as u64));
    // The sender starts over with a probe and resumes from the receiver's offset.
    let mut offset = match dst.receive(3, &probe).unwrap() {
        Received::Next(n) => n,
        Received::Complete(_) => panic!("not complete yet"),
    };
    assert_eq!(offset, 2 * step as u64);
    let received = loop {
        match dst.receive(3, &chunk(&file, 20, offset, step)).unwrap() {
            Received::Next(n) => offset = n,
            Received::Complete(f) => break f,
        }
    };
    assert_eq!(
        fs::read(received.path()).unwrap(),
        fs::read(file.path()).unwrap()
    );
    assert_eq!(read_all(&received).unwrap().1.len(), 200);
    let adopted = dst.adopt(received, 3, Some(&log_id(20))).unwrap();
    assert_eq!(
        dst.names_of(3).unwrap(),
        vec![SnapshotDir::name(3, Some(&log_id(20)))]
    );
    assert_eq!(read_all(&adopted).unwrap().1.len(), 200);

    // A newer snapshot replaces a half-received older one.
    let newer = write(&src, 3, 30, 10);
    assert!(matches!(
        dst.receive(3, &chunk(&file, 20, 0, step)).unwrap(),
        Received::Next(_)
    ));
    let mut offset = 0;
    loop {
        match dst.receive(3, &chunk(&newer, 30, offset, step)).unwrap() {
            Received::Next(n) => offset = n,
            Received::Complete(f) => {
                assert_eq!(read_all(&f).unwrap().1.len(), 10);
                break;
            }
        }
    }
    let parts = fs::read_dir(dst_tmp.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".part")
        })
        .count();
    assert_eq!(parts, 0, "the older part file is gone");

    // Refusals: oversized chunk, a chunk past the end.
    let mut big = chunk(&newer, 30, 0, 16);
    big.data = vec![0; SNAPSHOT_CHUNK_BYTES + 1];
    assert!(dst.receive(3, &big).is_err());
    let mut past = chunk(&newer, 30, 0, 16);
    past.offset = past.total;
    assert!(dst.receive(3, &past).is_err());

    // A restart removes what was being received.
    drop(dst);
    let dst = SnapshotDir::open(dst_tmp.path()).unwrap();
    assert_eq!(
        dst.all_names().unwrap(),
        vec![SnapshotDir::name(3, Some(&log_id(20)))]
    );
}
