//! Strict message priorities (RabbitMQ 4.3's `x-max-priority` on quorum queues): a property
//! test against a model (returned messages first in return order, then the highest level
//! holding a message, FIFO within a level, a priority above the top counted as the top), and
//! examples of what the levels do with TTL at the head, length limits and a snapshot.

mod common;

use std::collections::{BTreeMap, VecDeque};

use common::{Q, deliveries};
use proptest::prelude::*;
use qq_core::queue::{Command, MsgHeader, QueueState, Reply, SettleOutcome};
use qq_core::types::{MessageId, Overflow};

/// A strict queue with levels 0..=`max`, at machine version 2, and one consumer (7) of
/// prefetch 1.
fn strict_queue(max: u8) -> Q {
    let mut q = Q::new(false);
    q.s.set_max_priority(Some(max));
    q
}

fn settle(q: &mut Q, id: MessageId, outcome: SettleOutcome) -> Vec<(u64, MessageId)> {
    let (reply, fx) = q.apply(Command::Settle {
        now_ms: 3,
        consumer: 7,
        ids: vec![id],
        outcome,
    });
    assert_eq!(reply, Reply::Ok);
    deliveries(&fx)
}

/// Publishes a 10-byte message of `priority`: its id and what was delivered at once.
fn publish(q: &mut Q, priority: u8, ttl_ms: Option<u64>) -> (MessageId, Vec<MessageId>) {
    let (id, delivered) = q.publish_delivered(priority, ttl_ms);
    (id, delivered.into_iter().map(|(_, id)| id).collect())
}

/// What the queue must do, as plainly as it can be said.
#[derive(Default)]
struct Model {
    returns: VecDeque<MessageId>,
    levels: BTreeMap<u8, VecDeque<MessageId>>,
}

impl Model {
    fn head(&mut self) -> Option<MessageId> {
        if let Some(id) = self.returns.pop_front() {
            return Some(id);
        }
        let (&level, ids) = self.levels.iter_mut().rev().find(|(_, q)| !q.is_empty())?;
        let id = ids.pop_front();
        if ids.is_empty() {
            self.levels.remove(&level);
        }
        id
    }

    fn order(&self) -> Vec<MessageId> {
        let mut out: Vec<MessageId> = self.returns.iter().copied().collect();
        for ids in self.levels.values().rev() {
            out.extend(ids);
        }
        out
    }
}

#[derive(Debug, Clone)]
enum Op {
    Publish(u8),
    Ack,
    /// Back to the queue without a failed delivery (it goes to the returns queue).
    Release,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..=40).prop_map(Op::Publish),
        2 => Just(Op::Ack),
        1 => Just(Op::Release),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn deliveries_follow_strict_levels(max in 1u8..=31, ops in prop::collection::vec(op(), 1..120)) {
        let mut q = strict_queue(max);
        let (reply, fx) = q.apply(Command::Checkout { now_ms: 1, consumer: 7, node: 1, prefetch: 1 });
        prop_assert_eq!(reply, Reply::Ok);
        prop_assert!(deliveries(&fx).is_empty());
        let mut model = Model::default();
        let mut held: Option<MessageId> = None;
        for op in ops {
            let delivered = match op {
                Op::Publish(p) => {
                    let (id, delivered) = publish(&mut q, p, None);
                    model.levels.entry(p.min(max)).or_default().push_back(id);
                    delivered
                }
                Op::Ack => match held.take() {
                    Some(id) => settle(&mut q, id, SettleOutcome::Ack).into_iter().map(|(_, id)| id).collect(),
                    None => continue,
                },
                Op::Release => match held.take() {
                    Some(id) => {
                        model.returns.push_back(id);
                        settle(&mut q, id, SettleOutcome::Release).into_iter().map(|(_, id)| id).collect()
                    }
                    None => continue,
                },
            };
            if held.is_none() {
                let want = model.head();
                prop_assert_eq!(delivered.first().copied(), want, "the head of the model goes");
                held = want;
            } else {
                prop_assert!(delivered.is_empty(), "nothing more while the consumer is full");
            }
            prop_assert_eq!(q.s.ready_ids(), model.order());
        }
    }
}

fn enqueue(q: &mut Q, priority: u8, ttl_ms: Option<u64>) -> MessageId {
    publish(q, priority, ttl_ms).0
}

#[test]
fn a_plain_enqueue_is_level_zero_and_a_priority_above_the_top_is_the_top() {
    let mut q = strict_queue(3);
    let plain = {
        let (reply, _) = q.apply(Command::Enqueue {
            now_ms: 1,
            header: MsgHeader {
                size_bytes: 10,
                expiration_ms: None,
            },
            publish_key: None,
            dedup_key: None,
        });
        match reply {
            Reply::Enqueued { id } => id,
            other => panic!("{other:?}"),
        }
    };
    let one = enqueue(&mut q, 1, None);
    let top = enqueue(&mut q, 3, None);
    let above = enqueue(&mut q, 200, None);
    assert_eq!(q.s.ready_ids(), [top, above, one, plain]);
    assert_eq!(q.s.strict_level_counts(), [(3, 2), (1, 1), (0, 1)]);
}

#[test]
fn a_message_past_its_ttl_expires_from_any_level() {
    let mut q = strict_queue(9);
    let low = enqueue(&mut q, 0, Some(5));
    let high = enqueue(&mut q, 9, None);
    // Time passes beyond the low message's TTL: it expires although a higher level waits.
    q.apply(Command::Expire { now_ms: 100 });
    assert_eq!(q.s.ready_ids(), [high]);
    assert!(!q.s.ready_ids().contains(&low));
}

#[test]
fn drop_head_drops_the_next_message_out_and_reject_publish_counts_every_level() {
    let mut q = strict_queue(5);
    let mut c = q.s.config().clone();
    c.max_length = Some(2);
    q.apply(Command::UpdateConfig {
        now_ms: 2,
        config: c.clone(),
    });
    let low = enqueue(&mut q, 0, None);
    let high = enqueue(&mut q, 5, None);
    let mid = enqueue(&mut q, 2, None);
    // Over the limit by one: the ready head (the high message) goes, as in the two-level scheme.
    assert_eq!(q.s.ready_ids(), [mid, low]);
    assert!(!q.s.ready_ids().contains(&high));

    c.overflow = Overflow::RejectPublish;
    q.apply(Command::UpdateConfig {
        now_ms: 3,
        config: c,
    });
    let (reply, _) = q.apply(Command::EnqueueWithPriority {
        now_ms: 4,
        header: MsgHeader {
            size_bytes: 10,
            expiration_ms: None,
        },
        publish_key: None,
        dedup_key: None,
        priority: 5,
    });
    assert!(matches!(reply, Reply::Rejected { .. }), "{reply:?}");
}

#[test]
fn the_levels_survive_the_snapshot_extras() {
    let mut q = strict_queue(4);
    let ids: Vec<MessageId> = [0, 4, 2, 4, 1]
        .iter()
        .map(|p| enqueue(&mut q, *p, None))
        .collect();
    let order = q.s.ready_ids();
    let bytes = postcard::to_stdvec(&q.s).unwrap();
    let mut restored: QueueState = postcard::from_bytes(&bytes).unwrap();
    restored.restore_machine_version(2);
    restored.set_max_priority(Some(4));
    restored.restore_strict_levels(q.s.strict_levels());
    restored.check_invariants().unwrap();
    assert_eq!(restored.ready_ids(), order);
    assert_eq!(order, [ids[1], ids[3], ids[2], ids[4], ids[0]]);
    assert_eq!(restored.digest(), q.s.digest());
}
