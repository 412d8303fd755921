//! Message priorities as RabbitMQ 4.0's quorum queues have them: priority 5 and up is high,
//! the rest normal; returned messages first; between the levels two high for each normal while
//! both wait, the older head going at every third take; FIFO within a level.

mod common;

use common::{Q, deliveries};
use qq_core::queue::{Command, Effect, Location, MsgHeader, QueueState, Reply, SettleOutcome};
use qq_core::types::{MessageId, Overflow, QueueConfig, Reason};

fn checkout(q: &mut Q, consumer: u64, prefetch: u32) -> Vec<Effect> {
    let cmd = Command::Checkout {
        now_ms: 2,
        consumer,
        node: 1,
        prefetch,
    };
    q.apply(cmd).1
}

fn ack(q: &mut Q, consumer: u64, id: MessageId) -> Vec<Effect> {
    let cmd = Command::Settle {
        now_ms: 3,
        consumer,
        ids: vec![id],
        outcome: SettleOutcome::Ack,
    };
    let (reply, fx) = q.apply(cmd);
    assert_eq!(reply, Reply::Ok);
    fx
}

/// Takes every ready message one at a time (prefetch 1, ack each): the delivery order.
fn drain_one_by_one(q: &mut Q) -> Vec<MessageId> {
    let mut order = Vec::new();
    let mut fx = checkout(q, 7, 1);
    while let [(_, id)] = deliveries(&fx)[..] {
        order.push(id);
        fx = ack(q, 7, id);
    }
    order
}

/// `n` messages of `priority` each; their ids.
fn publish_n(q: &mut Q, n: usize, priority: u8) -> Vec<MessageId> {
    (0..n)
        .map(|_| q.publish_with_priority(priority, None))
        .collect()
}

#[test]
fn high_goes_two_to_one_before_normal_and_each_level_stays_fifo() {
    let mut q = Q::new(false);
    let normal = publish_n(&mut q, 4, 0);
    let high = publish_n(&mut q, 6, 9);
    let order = drain_one_by_one(&mut q);
    // Counter 0, 1: high; at 2 the older head, a normal one (all normals are older); and so
    // on while both wait. Then the rest of the normal level.
    let expected = vec![
        high[0], high[1], normal[0], high[2], high[3], normal[1], high[4], high[5], normal[2],
        normal[3],
    ];
    assert_eq!(order, expected);
}

#[test]
fn at_the_weight_an_older_high_head_goes_again() {
    let mut q = Q::new(false);
    let high = publish_n(&mut q, 4, 5);
    let normal = publish_n(&mut q, 2, 4); // 4 is normal
    let order = drain_one_by_one(&mut q);
    // Every high message is older than every normal one, so high goes even at the weight.
    let mut expected = high.clone();
    expected.extend(&normal);
    assert_eq!(order, expected);
}

#[test]
fn browse_and_first_ready_ids_follow_the_delivery_order() {
    let mut q = Q::new(false);
    publish_n(&mut q, 3, 0);
    publish_n(&mut q, 5, 7);
    publish_n(&mut q, 2, 0);
    let listed = q.s.ready_ids();
    let browsed: Vec<MessageId> = q.s.browse(0, 100, u64::MAX).iter().map(|b| b.id).collect();
    assert_eq!(listed, browsed);
    assert_eq!(q.s.first_ready_ids(4), listed[..4].to_vec());
    assert_eq!(drain_one_by_one(&mut q), listed);
}

#[test]
fn a_returned_message_goes_before_both_levels() {
    let mut q = Q::new(false);
    let fx = checkout(&mut q, 1, 1);
    assert!(deliveries(&fx).is_empty());
    let first = q.publish_with_priority(0, None); // delivered to consumer 1 at once
    let high = publish_n(&mut q, 2, 9);
    let requeue = Command::Settle {
        now_ms: 3,
        consumer: 1,
        ids: vec![first],
        outcome: SettleOutcome::Requeue,
    };
    let (_, fx) = q.apply(requeue);
    assert_eq!(
        deliveries(&fx),
        vec![(1, first)],
        "the returned normal one, not a high one"
    );
    let fx = ack(&mut q, 1, first);
    assert_eq!(deliveries(&fx), vec![(1, high[0])]);
}

#[test]
fn a_priority_below_five_is_normal_and_keeps_its_place() {
    let mut q = Q::new(false);
    let a = q.publish_with_priority(4, None);
    q.publish();
    let b = q.publish_with_priority(1, None);
    let order = drain_one_by_one(&mut q);
    assert_eq!(order, vec![a, a + 1, b]);
}

#[test]
fn drop_head_drops_in_delivery_order_and_ttl_expires_high_messages() {
    let mut q = Q::new(false);
    let mut config = q.s.config().clone();
    config.max_length = Some(3);
    config.overflow = Overflow::DropHead;
    q.apply(Command::UpdateConfig { now_ms: 1, config });
    let normal = q.publish_with_priority(0, None);
    let high = publish_n(&mut q, 3, 9);
    // Four messages, limit three: the head in delivery order is the first high one.
    assert_eq!(q.s.location(high[0]), None);
    assert_eq!(q.s.location(normal), Some(Location::Ready));
    let short = q.publish_with_priority(9, Some(10)); // over the limit again: drops high[1]
    assert_eq!(q.s.location(high[1]), None);
    let (_, fx) = q.apply(Command::Expire { now_ms: 100 });
    assert!(
        fx.iter().any(|e| matches!(
            e,
            Effect::DeadLetter { id, reason: Reason::Expired, .. } if *id == short
        )),
        "{fx:?}"
    );
    assert_eq!(q.s.ready_ids().len(), 2);
}

#[test]
fn a_get_takes_the_head_the_two_to_one_rule_gives() {
    let mut q = Q::new(false);
    let normal = q.publish_with_priority(0, None);
    let high = publish_n(&mut q, 3, 6);
    let mut got = Vec::new();
    for _ in 0..4 {
        let get = Command::Get {
            now_ms: 5,
            lease_ms: 0,
            auto_ack: true,
        };
        match q.apply(get).0 {
            Reply::Got {
                delivery: Some(d), ..
            } => got.push(d.id),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, vec![high[0], high[1], normal, high[2]]);
}

#[test]
fn the_levels_and_the_counter_survive_a_snapshot() {
    let mut q = Q::new(false);
    publish_n(&mut q, 2, 0);
    publish_n(&mut q, 3, 8);
    let get = Command::Get {
        now_ms: 5,
        lease_ms: 0,
        auto_ack: true,
    };
    q.apply(get); // counter 1
    let bytes = postcard::to_allocvec(&q.s).unwrap();
    let mut restored: QueueState = postcard::from_bytes(&bytes).unwrap();
    restored.restore_machine_version(q.s.machine_version());
    let (high, counter) = q.s.high_priority();
    restored.restore_high_priority(high, counter);
    restored.check_invariants().unwrap();
    assert_eq!(restored, q.s);
    assert_eq!(restored.digest(), q.s.digest());
    assert_eq!(restored.ready_ids(), q.s.ready_ids());
}

#[test]
fn a_high_priority_enqueue_is_refused_at_version_1_and_changes_nothing() {
    let mut s = QueueState::new(QueueConfig::new("/", "q"));
    let before = s.clone();
    let (reply, fx) = s.apply(
        1,
        Command::EnqueueWithPriority {
            now_ms: 0,
            header: MsgHeader {
                size_bytes: 1,
                expiration_ms: None,
            },
            publish_key: None,
            dedup_key: None,
            priority: 9,
        },
    );
    assert!(
        matches!(&reply, Reply::Error { detail } if detail.contains("EnqueueWithPriority")),
        "{reply:?}"
    );
    assert!(fx.is_empty());
    assert_eq!(s, before);
}
