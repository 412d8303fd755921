//! The snapshot header's bytes are a format: a node installs snapshots that another version
//! wrote. The fixture `fixtures/queue_snapshot_header.postcard` is the postcard encoding of
//! `(state, receipts, moves)` (the fields of qq-node's snapshot header, in order) of the state
//! [`golden_state`] builds, written by the code whose state kept every collection in
//! `std::collections` (BTreeMap, BTreeSet, VecDeque). Whatever the state's collections are
//! now, the same commands must encode to the same bytes, and those bytes must decode to the
//! same state.

use std::collections::BTreeMap;

use qq_core::queue::{
    Command, Effect, MoveState, MoveTask, MsgHeader, QueueState, Receipt, Reply, SettleOutcome,
};
use qq_core::types::{ConsumerId, MessageId, Overflow, QueueConfig, Strategy};

const GOLDEN: &[u8] = include_bytes!("fixtures/queue_snapshot_header.postcard");
/// [`QueueState::digest`] of that state by the same code: the chaos checker compares the
/// replicas' digests, which nodes of two versions must compute alike.
const GOLDEN_DIGEST: u64 = 0xc5d4_6953_9014_bde9;

struct Q {
    s: QueueState,
    index: u64,
    /// Delivered and not yet settled, per consumer, in delivery order.
    out: BTreeMap<ConsumerId, Vec<MessageId>>,
}

impl Q {
    fn apply(&mut self, cmd: Command) -> Reply {
        self.index += 1;
        let (reply, effects) = self.s.apply(self.index, cmd);
        self.s.check_invariants().unwrap();
        for e in effects {
            if let Effect::Deliver(d) = e {
                self.out.entry(d.consumer).or_default().push(d.id);
            }
        }
        reply
    }

    fn take(&mut self, consumer: ConsumerId) -> MessageId {
        self.out.get_mut(&consumer).unwrap().remove(0)
    }

    fn settle(&mut self, now_ms: u64, consumer: ConsumerId, outcome: SettleOutcome) {
        let id = self.take(consumer);
        let reply = self.apply(Command::Settle {
            now_ms,
            consumer,
            ids: vec![id],
            outcome,
        });
        assert_eq!(reply, Reply::Ok);
    }
}

/// A state with something in every collection: ready messages never delivered and returned,
/// deadlines, a delayed requeue, checked-out messages, a Get lease with and one without a
/// receipt, a held dead letter, an ended move task, publish and transfer keys.
fn golden_state() -> QueueState {
    let mut config = QueueConfig::new("/", "golden");
    config.dead_letter_exchange = Some("dlx".into());
    config.dead_letter_strategy = Strategy::AtLeastOnce;
    config.overflow = Overflow::RejectPublish;
    let mut q = Q {
        s: QueueState::new(config),
        index: 0,
        out: BTreeMap::new(),
    };
    for i in 0..14u64 {
        let reply = q.apply(Command::Enqueue {
            now_ms: 1_000 + i,
            header: MsgHeader {
                size_bytes: 100 + i,
                expiration_ms: (i % 4 == 0).then_some(600_000),
            },
            publish_key: (i % 2 == 0).then(|| format!("alice\0p1\0{i}")),
            dedup_key: (i % 3 == 0).then(|| format!("dl-{i}")),
        });
        assert!(matches!(reply, Reply::Enqueued { .. }), "{reply:?}");
    }
    let task = match q.apply(Command::StartMove {
        now_ms: 1_100,
        destination: "elsewhere".into(),
        max_messages: 2,
        max_per_second: 10,
    }) {
        Reply::MoveStarted { task } => task,
        other => panic!("start move: {other:?}"),
    };
    q.apply(Command::EndMove {
        task,
        state: MoveState::Cancelled,
        detail: "by a test".into(),
    });
    for (consumer, prefetch) in [(7, 2), (8, 3)] {
        let reply = q.apply(Command::Checkout {
            now_ms: 1_200,
            consumer,
            node: 2,
            prefetch,
        });
        assert_eq!(reply, Reply::Ok);
    }
    q.settle(1_300, 8, SettleOutcome::Ack);
    q.settle(1_301, 8, SettleOutcome::RequeueAfter { delay_ms: 5_000 });
    q.settle(
        1_302,
        8,
        SettleOutcome::RejectWithDetail {
            detail: "bad".into(),
        },
    );
    // Consumer 7 has no credit left: what 8 held goes back to the returns queue and stays.
    q.apply(Command::ConsumerDown {
        now_ms: 1_400,
        consumer: 8,
    });
    q.apply(Command::GetWithReceipt {
        now_ms: 1_500,
        lease_ms: 30_000,
        receipt: Receipt {
            token: [7; 16],
            user: "alice".into(),
        },
    });
    q.apply(Command::Get {
        now_ms: 1_501,
        lease_ms: 60_000,
        auto_ack: false,
    });
    q.s
}

fn encode(s: &QueueState) -> Vec<u8> {
    postcard::to_stdvec(&(s, s.receipts(), s.moves())).unwrap()
}

#[test]
fn the_golden_state_has_something_everywhere() {
    let s = golden_state();
    let c = s.counts();
    assert!(
        c.ready > 0 && c.unacked > 0 && c.held > 0 && c.delayed > 0,
        "{c:?}"
    );
    assert_eq!(s.receipts().len(), 1);
    assert_eq!(s.moves().len(), 1);
    assert!(s.next_deadline().is_some());
}

#[test]
fn the_state_encodes_to_the_fixture_bytes() {
    assert_eq!(encode(&golden_state()), GOLDEN);
}

#[test]
fn the_fixture_decodes_to_the_same_state_and_back() {
    // Receipts and moves are decoded as std maps, whatever type the state keeps them in.
    let (mut decoded, receipts, moves): (
        QueueState,
        BTreeMap<MessageId, Receipt>,
        BTreeMap<u64, MoveTask>,
    ) = postcard::from_bytes(GOLDEN).unwrap();
    decoded.restore_receipts(receipts);
    decoded.restore_moves(moves);
    decoded.check_invariants().unwrap();
    let built = golden_state();
    assert_eq!(decoded, built);
    assert_eq!(decoded.digest(), GOLDEN_DIGEST);
    assert_eq!(built.digest(), GOLDEN_DIGEST);
    assert_eq!(encode(&decoded), GOLDEN);
}
