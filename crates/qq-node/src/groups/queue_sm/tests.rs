use qq_core::Properties;
use qq_core::queue::{Command, Receipt};

use super::*;

fn enqueue(body: &[u8]) -> QueueRequest {
    let message = Message {
        properties: Properties::default(),
        body: body.to_vec().into(),
        exchange: String::new(),
        routing_key: "q".into(),
        bcc: Vec::new(),
    };
    QueueRequest {
        cmd: Command::Enqueue {
            now_ms: 1_000,
            header: qq_core::queue::MsgHeader {
                size_bytes: body.len() as u64,
                expiration_ms: None,
            },
            publish_key: None,
            dedup_key: None,
        },
        message: Some(postcard::to_stdvec(&message).unwrap()),
    }
}

/// [`enqueue`] of a high-priority message (machine version 2).
fn enqueue_high(body: &[u8]) -> QueueRequest {
    let mut req = enqueue(body);
    let Command::Enqueue { now_ms, header, .. } = req.cmd else {
        unreachable!()
    };
    req.cmd = Command::EnqueueWithPriority {
        now_ms,
        header,
        publish_key: None,
        dedup_key: None,
        priority: 9,
    };
    req
}

fn apply(m: &QueueMachine, index: u64, req: QueueRequest) {
    let entry = postcard::to_stdvec(&QueueEntry::One(req)).unwrap();
    m.apply_payload(index, &entry).unwrap();
}

fn snapshot_of(m: &QueueMachine, cut: QueueCut) -> qq_raft::snapshot::SnapshotFile {
    let mut out = m.store.snapshots().writer(m.group, None).unwrap();
    m.write_cut(cut, &mut out).unwrap();
    out.finish().unwrap()
}

/// The watcher of an unloaded instance can end after the next instance's watcher attached
/// its leader actor: its detach must leave the newer attachment in place (else the new
/// actor hears no config change and no at-most-once dead letter).
#[test]
fn a_stale_detach_leaves_the_newer_leader_attached() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let m = QueueMachine::new(5, store, QueueConfig::new("/", "q"));
    let (old, _old_inbox) = m.attach_leader();
    let (new, mut inbox) = m.attach_leader();
    m.detach_leader(old);
    assert!(m.is_leader());
    m.notify_config_changed();
    assert!(matches!(inbox.try_recv(), Ok(LeaderEvent::ConfigChanged)));
    m.detach_leader(new);
    assert!(!m.is_leader());
}

/// A snapshot is the state and bodies as of its cut, whatever is applied while it is
/// written; installed elsewhere it brings the state (receipts, move tasks, cancelled
/// consumers and the machine version included) and every live body, and removes the bodies of messages it does not have.
#[test]
fn a_snapshot_is_a_consistent_cut_and_installs_state_and_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let m = QueueMachine::new(5, store, QueueConfig::new("/", "q"));
    for i in 1..=300u64 {
        apply(&m, i, enqueue(&vec![i as u8; 3000]));
    }
    // A cancelled consumer that still holds two (carried in the header's trailer), one
    // leased with a receipt, and a move task.
    // The queue's machine moves to version 2 (which has CancelConsumer).
    apply(
        &m,
        301,
        QueueRequest::command(Command::SetMachineVersion { version: 2 }),
    );
    apply(
        &m,
        302,
        QueueRequest::command(Command::SetConsumerTimeout {
            timeout_ms: Some(60_000),
        }),
    );
    apply(
        &m,
        303,
        QueueRequest::command(Command::Checkout {
            now_ms: 1_000,
            consumer: 7,
            node: 1,
            prefetch: 2,
        }),
    );
    apply(
        &m,
        304,
        QueueRequest::command(Command::CancelConsumer {
            now_ms: 1_000,
            consumer: 7,
        }),
    );
    let receipt = Receipt {
        token: [9; 16],
        user: "alice".into(),
    };
    apply(
        &m,
        305,
        QueueRequest::command(Command::GetWithReceipt {
            now_ms: 1_000,
            lease_ms: 60_000,
            receipt,
        }),
    );
    apply(
        &m,
        306,
        QueueRequest::command(Command::StartMove {
            now_ms: 1_000,
            destination: "elsewhere".into(),
            max_messages: 1,
            max_per_second: 5,
        }),
    );
    // And a high-priority message (carried in the trailer).
    apply(&m, 307, enqueue_high(&[1; 3000]));
    let at_cut = m.with_state(|s| s.clone());
    let cut = m.cut();
    // After the cut, every ready message is purged: their bodies go from RocksDB.
    apply(&m, 308, QueueRequest::command(Command::Purge));
    assert_eq!(
        m.with_state(|s| s.message_ids().len()),
        3,
        "the leased one and the cancelled consumer's two stay"
    );
    let file = snapshot_of(&m, cut);

    // Installed on another node, over a machine with messages of its own.
    let dir2 = tempfile::tempdir().unwrap();
    let store2 = Store::open(dir2.path()).unwrap();
    let other = QueueMachine::new(5, store2.clone(), QueueConfig::new("/", "q"));
    apply(&other, 1 << 20, enqueue(b"stale"));
    let stale_id = other.with_state(|s| s.message_ids())[0];
    other.install(&mut file.reader().unwrap()).unwrap();
    let installed = other.with_state(|s| s.clone());
    assert_eq!(installed, at_cut);
    assert_eq!(installed.receipts().len(), 1);
    assert_eq!(installed.moves().len(), 1);
    assert_eq!(installed.cancelled().len(), 1);
    assert_eq!(installed.machine_version(), 2);
    assert_eq!(installed.consumer_timeouts().0, Some(60_000));
    assert_eq!(
        installed.consumer_timeouts().1.len(),
        2,
        "the cancelled consumer's two"
    );
    installed.check_invariants().unwrap();
    let ids = installed.message_ids();
    assert_eq!(installed.high_priority().0.len(), 1);
    assert_eq!(ids.len(), 301, "all 301 were live at the cut");
    for id in ids {
        let message = other.read_message(id).unwrap();
        assert_eq!(message.body.len(), 3000);
    }
    assert_eq!(
        store2.get_body(5, stale_id).unwrap(),
        None,
        "stale body removed"
    );
}

#[test]
fn an_entry_by_reference_encodes_as_the_entry() {
    let reqs = vec![
        enqueue(b"a"),
        enqueue_high(b"b"),
        QueueRequest::command(Command::Purge),
    ];
    assert_eq!(
        postcard::to_stdvec(&QueueEntryRef::Batch(&reqs)).unwrap(),
        postcard::to_stdvec(&QueueEntry::Batch(reqs.clone())).unwrap()
    );
    assert_eq!(
        postcard::to_stdvec(&QueueEntryRef::One(&reqs[1])).unwrap(),
        postcard::to_stdvec(&QueueEntry::One(reqs[1].clone())).unwrap()
    );
}

/// A queue with `x-max-priority` gets its levels from its arguments when its machine is built,
/// and a snapshot installed on another replica of it keeps every message on its level.
#[test]
fn strict_levels_come_from_the_arguments_and_travel_in_the_snapshot() {
    let qm = QueueMeta {
        id: 6,
        vhost: "/".into(),
        name: "strict".into(),
        arguments: [("x-max-priority".to_string(), qq_core::Value::Long(4))]
            .into_iter()
            .collect(),
        members: vec![1, 2, 3],
        config: QueueConfig::new("/", "strict"),
        owner: None,
        learners: Vec::new(),
    };
    let dir = tempfile::tempdir().unwrap();
    let m = QueueMachine::for_queue(Store::open(dir.path()).unwrap(), &qm);
    assert_eq!(m.with_state(|s| s.max_priority()), Some(4));
    apply(
        &m,
        1,
        QueueRequest::command(Command::SetMachineVersion { version: 2 }),
    );
    apply(&m, 2, enqueue(b"plain"));
    apply(&m, 3, enqueue_high(b"nine, so four"));
    let order = m.with_state(|s| s.ready_ids());
    assert!(
        order.len() == 2 && order[0] > order[1],
        "the later, higher message first: {order:?}"
    );
    let file = snapshot_of(&m, m.cut());

    let dir2 = tempfile::tempdir().unwrap();
    let other = QueueMachine::for_queue(Store::open(dir2.path()).unwrap(), &qm);
    other.install(&mut file.reader().unwrap()).unwrap();
    let installed = other.with_state(|s| s.clone());
    installed.check_invariants().unwrap();
    assert_eq!(installed.ready_ids(), order);
    assert_eq!(installed.strict_level_counts(), [(4, 1), (0, 1)]);
    assert_eq!(installed, m.with_state(|s| s.clone()));
}

/// A body is held in memory after its enqueue, readable, and never written when its message
/// goes before the queue's bound is reached; a cut writes what is held; the node's count
/// follows and is given back when the machine goes.
#[test]
fn bodies_are_held_until_a_bound_or_a_cut_and_a_quick_settle_never_writes_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let held = store.held_bodies();
    let m = QueueMachine::new(5, store.clone(), QueueConfig::new("/", "q"));
    let id = |index: u64| index << entry::BATCH_SHIFT;
    apply(&m, 1, enqueue(b"first"));
    assert_eq!(store.get_body(5, id(1)).unwrap(), None, "held, not written");
    assert_eq!(&m.read_message(id(1)).unwrap().body[..], b"first");
    assert!(held.load(std::sync::atomic::Ordering::Relaxed) > 0);
    apply(&m, 2, QueueRequest::command(Command::Purge));
    assert_eq!(held.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert!(m.read_message(id(1)).is_err(), "purged");

    // Past the queue's bound the oldest bodies are written, the newest stay held.
    let big = vec![7u8; 1 << 20];
    for index in 10..16 {
        apply(&m, index, enqueue(&big));
    }
    assert!(
        store.get_body(5, id(10)).unwrap().is_some(),
        "oldest written"
    );
    assert_eq!(store.get_body(5, id(15)).unwrap(), None, "newest held");
    for index in 10..16 {
        assert_eq!(m.read_message(id(index)).unwrap().body.len(), 1 << 20);
    }
    let bound = bodies::QUEUE_HELD_MAX_BYTES;
    assert!(held.load(std::sync::atomic::Ordering::Relaxed) <= bound);

    // A cut writes everything held: the pinned bodies agree with the state.
    let cut = m.cut();
    assert!(store.get_body(5, id(15)).unwrap().is_some());
    assert_eq!(held.load(std::sync::atomic::Ordering::Relaxed), 0);
    drop(cut);

    apply(&m, 20, enqueue(b"last"));
    assert!(held.load(std::sync::atomic::Ordering::Relaxed) > 0);
    drop(m);
    assert_eq!(
        held.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "given back"
    );
}
