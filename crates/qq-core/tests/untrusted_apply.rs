//! Property: a committed entry is untrusted input. Whatever bytes a log entry holds, decoding
//! them and applying what decodes never panics, on the queue machine and on the metadata
//! machine, and two replicas applying the same entries stay equal (apply is deterministic).
//!
//! Entries are arbitrary bytes and, to reach deep into apply, valid encodings of every command
//! with random bytes overwritten, cut or appended: they decode into commands with extreme ids,
//! times, sizes, prefetch values, strings and tables.

use proptest::prelude::*;
use qq_core::Value;
use qq_core::meta::{Limits, MetaCommand, MetaState};
use qq_core::queue::{Command, MsgHeader, QueueState, SettleOutcome};
use qq_core::types::{Overflow, QueueConfig, Strategy as DlStrategy};

fn queue_templates() -> Vec<Vec<u8>> {
    let header = MsgHeader {
        size_bytes: 10,
        expiration_ms: Some(500),
    };
    let mut config = QueueConfig::new("/", "q");
    config.dead_letter_exchange = Some("dlx".into());
    config.dead_letter_strategy = DlStrategy::AtLeastOnce;
    config.overflow = Overflow::RejectPublish;
    config.max_length = Some(3);
    config.message_ttl_ms = Some(100);
    config.expires_ms = Some(1000);
    config.requeue_delays_ms = vec![10, 200];
    let commands = vec![
        Command::Enqueue {
            now_ms: 1_000,
            header: header.clone(),
            publish_key: Some("p1".into()),
            dedup_key: None,
        },
        Command::Enqueue {
            now_ms: 1_000,
            header,
            publish_key: None,
            dedup_key: Some("k".into()),
        },
        Command::Checkout {
            now_ms: 1_000,
            consumer: 9,
            node: 2,
            prefetch: 3,
        },
        Command::Settle {
            now_ms: 1_000,
            consumer: 7,
            ids: vec![1, 2],
            outcome: SettleOutcome::Reject,
        },
        Command::Settle {
            now_ms: 1_000,
            consumer: 0,
            ids: vec![3],
            outcome: SettleOutcome::Requeue,
        },
        Command::Settle {
            now_ms: 1_000,
            consumer: 7,
            ids: vec![1],
            outcome: SettleOutcome::RequeueAfter { delay_ms: 300 },
        },
        Command::Settle {
            now_ms: 1_000,
            consumer: 7,
            ids: vec![2],
            outcome: SettleOutcome::RejectWithDetail {
                detail: "why".into(),
            },
        },
        Command::ConsumerDown {
            now_ms: 1_000,
            consumer: 7,
        },
        Command::NodeDown {
            now_ms: 1_000,
            node: 1,
        },
        Command::Get {
            now_ms: 1_000,
            lease_ms: 100,
            auto_ack: true,
        },
        Command::Expire { now_ms: 2_000 },
        Command::DeadLetterSettle { ids: vec![1, 2, 3] },
        Command::Purge,
        Command::UpdateConfig {
            now_ms: 1_000,
            config,
        },
        Command::ExpireQueue {
            now_ms: 5_000,
            leader_since_ms: 1_000,
        },
    ];
    commands
        .iter()
        .map(|c| postcard::to_stdvec(c).unwrap())
        .collect()
}

fn meta_templates() -> Vec<Vec<u8>> {
    let args: qq_core::Table = [
        (
            "x-dead-letter-exchange".to_string(),
            Value::String("dlx".into()),
        ),
        ("x-max-length".to_string(), Value::Long(5)),
    ]
    .into_iter()
    .collect();
    let commands = vec![
        MetaCommand::PutVhost { name: "v".into() },
        MetaCommand::DeleteVhost { name: "v".into() },
        MetaCommand::PutUser {
            name: "u".into(),
            password_hash: vec![1; 32],
            salt: vec![2; 4],
            tags: vec!["administrator".into()],
        },
        MetaCommand::DeleteUser { name: "u".into() },
        MetaCommand::SetPermissions {
            user: "u".into(),
            vhost: "/".into(),
            configure: ".*".into(),
            write: "^a".into(),
            read: "(".into(),
        },
        MetaCommand::DeclareExchange {
            vhost: "/".into(),
            name: "x".into(),
            kind: "topic".into(),
            durable: true,
            auto_delete: false,
            internal: false,
            arguments: args.clone(),
            passive: false,
            owner: None,
        },
        MetaCommand::DeleteExchange {
            vhost: "/".into(),
            name: "x".into(),
            if_unused: true,
        },
        MetaCommand::DeclareQueue {
            vhost: "/".into(),
            name: "q".into(),
            arguments: args.clone(),
            passive: false,
            nodes: vec![1, 2, 3],
            owner: None,
            origin: None,
        },
        MetaCommand::DeleteQueue {
            vhost: "/".into(),
            name: "q".into(),
        },
        MetaCommand::Bind {
            vhost: "/".into(),
            queue: "q".into(),
            exchange: "x".into(),
            routing_key: "a.#".into(),
            arguments: args.clone(),
        },
        MetaCommand::Unbind {
            vhost: "/".into(),
            queue: "q".into(),
            exchange: "x".into(),
            routing_key: "a.#".into(),
            arguments: args.clone(),
        },
        MetaCommand::SetPolicy {
            vhost: "/".into(),
            name: "p".into(),
            pattern: "^q".into(),
            apply_to: "queues".into(),
            priority: 1,
            definition: args,
        },
        MetaCommand::ClearPolicy {
            vhost: "/".into(),
            name: "p".into(),
        },
        MetaCommand::SetVhostLimits {
            vhost: "/".into(),
            limits: Limits {
                max_queues: Some(1),
                max_exchanges: Some(0),
                max_connections: None,
                max_consumers: Some(u64::MAX),
            },
        },
        MetaCommand::SetUserLimits {
            user: "u".into(),
            limits: Limits {
                max_queues: Some(0),
                ..Limits::default()
            },
        },
    ];
    commands
        .iter()
        .map(|c| postcard::to_stdvec(c).unwrap())
        .collect()
}

/// A valid encoding with `edits` (position, byte) overwritten, then cut to `keep` bytes and
/// `tail` appended: mostly still decodable, with arbitrary values.
fn mutated(template: &[u8], edits: &[(usize, u8)], keep: usize, tail: &[u8]) -> Vec<u8> {
    let mut bytes = template.to_vec();
    for &(pos, byte) in edits {
        if !bytes.is_empty() {
            let at = pos % bytes.len();
            bytes[at] = byte;
        }
    }
    bytes.truncate(keep.max(1));
    bytes.extend_from_slice(tail);
    bytes
}

/// An entry: plain arbitrary bytes, or a mutated template (index into the templates).
fn entry() -> impl Strategy<Value = (bool, usize, Vec<(usize, u8)>, usize, Vec<u8>)> {
    (
        any::<bool>(),
        any::<usize>(),
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        0usize..256,
        proptest::collection::vec(any::<u8>(), 0..8),
    )
}

fn bytes_of(
    templates: &[Vec<u8>],
    (raw, pick, edits, keep, tail): (bool, usize, Vec<(usize, u8)>, usize, Vec<u8>),
) -> Vec<u8> {
    if raw {
        let mut b = tail;
        b.extend(edits.iter().map(|e| e.1));
        b
    } else {
        mutated(&templates[pick % templates.len()], &edits, keep, &tail)
    }
}

/// A queue with something in it: ready messages, a consumer holding one, a Get lease.
fn busy_queue() -> QueueState {
    let config = QueueConfig {
        max_length: Some(5),
        overflow: Overflow::DropHead,
        delivery_limit: Some(2),
        ..QueueConfig::new("/", "q")
    };
    let mut q = QueueState::new(config);
    for i in 0..4u64 {
        q.apply(
            i + 1,
            Command::Enqueue {
                now_ms: 1_000,
                header: MsgHeader {
                    size_bytes: 10,
                    expiration_ms: Some(500),
                },
                publish_key: None,
                dedup_key: Some(format!("k{i}")),
            },
        );
    }
    q.apply(
        10,
        Command::Checkout {
            now_ms: 1_000,
            consumer: 7,
            node: 1,
            prefetch: 1,
        },
    );
    q.apply(
        11,
        Command::Get {
            now_ms: 1_000,
            lease_ms: 100,
            auto_ack: false,
        },
    );
    q
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn queue_apply_of_arbitrary_entries_never_panics(
        entries in proptest::collection::vec(entry(), 1..24)
    ) {
        let templates = queue_templates();
        let mut a = busy_queue();
        let mut b = busy_queue();
        let mut index = 100u64;
        for e in entries {
            index += 1;
            if let Ok(cmd) = postcard::from_bytes::<Command>(&bytes_of(&templates, e)) {
                let (ra, fa) = a.apply(index, cmd.clone());
                let (rb, fb) = b.apply(index, cmd);
                prop_assert_eq!(format!("{ra:?}{fa:?}"), format!("{rb:?}{fb:?}"));
            }
        }
        prop_assert_eq!(a.digest(), b.digest());
    }

    #[test]
    fn meta_apply_of_arbitrary_entries_never_panics(
        entries in proptest::collection::vec(entry(), 1..24)
    ) {
        let templates = meta_templates();
        let mut a = MetaState::new();
        let mut b = MetaState::new();
        for e in entries {
            if let Ok(cmd) = postcard::from_bytes::<MetaCommand>(&bytes_of(&templates, e)) {
                let (ra, _) = a.apply(cmd.clone());
                let (rb, _) = b.apply(cmd);
                prop_assert_eq!(ra, rb);
            }
        }
        prop_assert_eq!(a, b);
    }
}

/// The properties above are only as strong as the share of entries that decode into commands
/// and reach apply: keep it substantial.
#[test]
fn mutated_entries_mostly_decode_into_commands() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed as usize
    };
    let (qt, mt) = (queue_templates(), meta_templates());
    let (mut queue, mut meta) = (0, 0);
    for _ in 0..10_000 {
        let edits: Vec<(usize, u8)> = (0..next() % 4).map(|_| (next(), next() as u8)).collect();
        let keep = next() % 256;
        let q = mutated(&qt[next() % qt.len()], &edits, keep, &[]);
        let m = mutated(&mt[next() % mt.len()], &edits, keep, &[]);
        queue += postcard::from_bytes::<Command>(&q).is_ok() as u32;
        meta += postcard::from_bytes::<MetaCommand>(&m).is_ok() as u32;
    }
    eprintln!("decoded: queue {queue} / 10000, meta {meta} / 10000");
    assert!(queue > 3_000, "queue commands decoded: {queue} of 10 000");
    assert!(meta > 2_000, "metadata commands decoded: {meta} of 10 000");
}
