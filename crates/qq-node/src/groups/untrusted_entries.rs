//! Property: whatever bytes a committed entry holds, applying it never fails the group. An
//! entry that does not decode or holds an invalid command is refused as a no-op: `apply_payload`
//! answers (an error reply), the state is unchanged, the refusal is counted; an entry that is
//! valid is applied. Replicas fed the same entries stay equal.
//!
//! Entries are arbitrary bytes and valid entries with bytes overwritten, cut or appended
//! (including enqueues whose message does not decode, and commands carrying a message).

use proptest::prelude::*;
use qq_core::meta::MetaCommand;
use qq_core::queue::{Command, MsgHeader};
use qq_core::{Message, Properties, QueueConfig};
use qq_raft::store::Store;

use super::meta_sm::MetaMachine;
use super::queue_sm::{QueueEntry, QueueMachine, QueueRequest, check_entry, check_message};
use super::shell::Machine;

fn valid_queue_entries() -> Vec<Vec<u8>> {
    let message = Message {
        properties: Properties::default(),
        body: b"hello".to_vec().into(),
        exchange: String::new(),
        routing_key: "q".into(),
        bcc: Vec::new(),
    };
    let enqueue = QueueRequest {
        cmd: Command::Enqueue {
            now_ms: 1_000,
            header: MsgHeader {
                size_bytes: 5,
                expiration_ms: None,
            },
            publish_key: None,
            dedup_key: Some("k1".into()),
        },
        message: Some(postcard::to_stdvec(&message).unwrap()),
    };
    let get = QueueRequest::command(Command::Get {
        now_ms: 1_000,
        lease_ms: 0,
        auto_ack: true,
    });
    [
        QueueEntry::One(enqueue.clone()),
        QueueEntry::Batch(vec![enqueue.clone(), enqueue]),
        QueueEntry::One(get),
    ]
    .iter()
    .map(|e| postcard::to_stdvec(e).unwrap())
    .collect()
}

fn mutate(bytes: &[u8], edits: &[(usize, u8)], keep: usize, tail: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for &(pos, byte) in edits {
        let at = pos % b.len();
        b[at] = byte;
    }
    b.truncate(keep.max(1));
    b.extend_from_slice(tail);
    b
}

fn entries() -> impl Strategy<Value = Vec<(bool, usize, Vec<(usize, u8)>, usize, Vec<u8>)>> {
    proptest::collection::vec(
        (
            any::<bool>(),
            any::<usize>(),
            proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
            0usize..512,
            proptest::collection::vec(any::<u8>(), 0..16),
        ),
        1..16,
    )
}

/// A message with every kind of field set: properties, nested headers, body, names, BCC keys.
fn rich_message() -> Vec<u8> {
    use qq_core::Value;
    let mut nested = qq_core::Table::new();
    nested.insert("n".into(), Value::Long(-7));
    nested.insert("b".into(), Value::Bytes(vec![0, 255, 3]));
    let mut headers = qq_core::Table::new();
    headers.insert("s".into(), Value::String("ünï".into()));
    headers.insert("t".into(), Value::Table(nested));
    headers.insert(
        "l".into(),
        Value::List(vec![
            Value::Bool(true),
            Value::Double(1.5),
            Value::Timestamp(9),
        ]),
    );
    let message = Message {
        properties: Properties {
            content_type: "text/plain".into(),
            headers,
            delivery_mode: 2,
            priority: 3,
            expiration: "1000".into(),
            timestamp: 1_700_000_000,
            ..Properties::default()
        },
        body: b"a body of some length".to_vec(),
        exchange: "x".into(),
        routing_key: "rk".into(),
        bcc: vec!["b1".into(), "b2".into()],
    };
    postcard::to_stdvec(&message).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The check at apply decodes a message as `MessageShape` (borrowed) and the queue reads it
    /// back as `Message`: the two must accept exactly the same bytes.
    #[test]
    #[allow(clippy::type_complexity)]
    fn message_shape_accepts_what_message_accepts(
        cases in proptest::collection::vec(
            (
                proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
                0usize..256,
                proptest::collection::vec(any::<u8>(), 0..8),
            ),
            1..64,
        )
    ) {
        let valid = rich_message();
        prop_assert!(check_message(&valid).is_ok());
        for (edits, keep, tail) in cases {
            let bytes = mutate(&valid, &edits, keep, &tail);
            prop_assert_eq!(
                check_message(&bytes).is_ok(),
                postcard::from_bytes::<Message>(&bytes).is_ok(),
                "bytes {:?}", bytes
            );
        }
    }

    #[test]
    fn queue_machine_refuses_bad_entries_and_stays_available(entries in entries()) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let valid = valid_queue_entries();
        let a = QueueMachine::new(1, store.clone(), QueueConfig::new("/", "q"));
        let b = QueueMachine::new(2, store, QueueConfig::new("/", "q"));
        for (i, (raw, pick, edits, keep, tail)) in entries.into_iter().enumerate() {
            let bytes = if raw {
                tail
            } else {
                mutate(&valid[pick % valid.len()], &edits, keep, &tail)
            };
            let index = i as u64 + 1;
            let before = a.with_state(|s| s.digest());
            let refused_before = a.refusals();
            let ra = a.apply_payload(index, &bytes);
            let rb = b.apply_payload(index, &bytes);
            prop_assert!(ra.is_ok(), "apply failed the group: {ra:?}");
            prop_assert_eq!(ra.unwrap(), rb.unwrap());
            if check_entry(&bytes).is_err() {
                prop_assert_eq!(a.with_state(|s| s.digest()), before);
                prop_assert_eq!(a.refusals(), refused_before + 1);
            }
        }
        prop_assert_eq!(a.with_state(|s| s.digest()), b.with_state(|s| s.digest()));
    }

    #[test]
    fn meta_machine_refuses_bad_entries_and_stays_available(entries in entries()) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let valid: Vec<Vec<u8>> = [
            MetaCommand::PutVhost { name: "v".into() },
            MetaCommand::DeleteQueue { vhost: "/".into(), name: "q".into() },
        ]
        .iter()
        .map(|c| postcard::to_stdvec(c).unwrap())
        .collect();
        let (a, _effects_a) = MetaMachine::new(store.clone());
        let (b, _effects_b) = MetaMachine::new(store);
        for (i, (raw, pick, edits, keep, tail)) in entries.into_iter().enumerate() {
            let bytes = if raw {
                tail
            } else {
                mutate(&valid[pick % valid.len()], &edits, keep, &tail)
            };
            let before = a.state();
            let ra = a.apply_payload(i as u64 + 1, &bytes);
            let rb = b.apply_payload(i as u64 + 1, &bytes);
            prop_assert!(ra.is_ok(), "apply failed the group: {ra:?}");
            prop_assert_eq!(ra.unwrap(), rb.unwrap());
            if postcard::from_bytes::<MetaCommand>(&bytes).is_err() {
                prop_assert_eq!(&*a.state(), &*before);
            }
        }
        prop_assert_eq!(&*a.state(), &*b.state());
    }
}
