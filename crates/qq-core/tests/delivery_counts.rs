//! Delivery counting as RabbitMQ 4.3: a requeue is a failed delivery (the delivery count and the
//! acquired count grow, the delivery limit applies); a release (AMQP `basic.nack` with requeue)
//! and a consumer timeout grow only the acquired count.

mod common;

use common::{Q, deliveries};
use qq_core::queue::{Command, Effect, Location, Reply, SettleOutcome};
use qq_core::types::{MessageId, Reason};

fn checkout(q: &mut Q, consumer: u64, now_ms: u64) -> Vec<Effect> {
    let cmd = Command::Checkout {
        now_ms,
        consumer,
        node: 1,
        prefetch: 1,
    };
    q.apply(cmd).1
}

fn settle(q: &mut Q, consumer: u64, id: MessageId, outcome: SettleOutcome) -> Vec<Effect> {
    let cmd = Command::Settle {
        now_ms: 5,
        consumer,
        ids: vec![id],
        outcome,
    };
    let (reply, fx) = q.apply(cmd);
    assert_eq!(reply, Reply::Ok);
    fx
}

/// The delivery of `id` among `fx`: (delivery count, redelivered).
fn delivered(fx: &[Effect], id: MessageId) -> (u32, bool) {
    fx.iter()
        .find_map(|e| match e {
            Effect::Deliver(d) if d.id == id => Some((d.delivery_count, d.redelivered)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{id} not delivered in {fx:?}"))
}

#[test]
fn a_release_counts_only_as_acquired_and_never_reaches_the_delivery_limit() {
    let mut q = Q::new(false);
    let mut config = q.s.config().clone();
    config.delivery_limit = Some(0); // the first failed delivery kills
    q.apply(Command::UpdateConfig { now_ms: 1, config });
    checkout(&mut q, 1, 1);
    let [(_, id)] = q.publish()[..] else { panic!() };
    assert_eq!(q.s.acquired_count(id), Some(0));
    for n in 1..=3 {
        let fx = settle(&mut q, 1, id, SettleOutcome::Release);
        // Back at once and handed out again: not failed, but acquired n times.
        assert_eq!(delivered(&fx, id), (0, true));
        assert_eq!(q.s.acquired_count(id), Some(n));
    }
    // A requeue is a failure: past the limit of 0 it dead-letters.
    let fx = settle(&mut q, 1, id, SettleOutcome::Requeue);
    assert!(
        fx.iter().any(|e| matches!(
            e,
            Effect::DeadLetter { id: d, reason: Reason::DeliveryLimit, .. } if *d == id
        )),
        "{fx:?}"
    );
    assert_eq!(q.s.acquired_count(id), None);
}

#[test]
fn a_requeue_counts_in_both_and_the_counts_survive_a_snapshot() {
    let mut q = Q::new(false);
    checkout(&mut q, 1, 1);
    let [(_, id)] = q.publish()[..] else { panic!() };
    let fx = settle(&mut q, 1, id, SettleOutcome::Requeue);
    assert_eq!(delivered(&fx, id), (1, true));
    let fx = settle(&mut q, 1, id, SettleOutcome::Release);
    assert_eq!(delivered(&fx, id), (1, true));
    assert_eq!(q.s.acquired_count(id), Some(2));
    // The releases travel beside the state's own encoding, as a node's snapshot carries them.
    let bytes = postcard::to_allocvec(&q.s).unwrap();
    let mut restored: qq_core::queue::QueueState = postcard::from_bytes(&bytes).unwrap();
    restored.restore_machine_version(q.s.machine_version());
    assert_eq!(restored.acquired_count(id), Some(1));
    restored.restore_releases(q.s.releases());
    assert_eq!(restored.acquired_count(id), Some(2));
    restored.check_invariants().unwrap();
}

#[test]
fn a_consumer_timeout_returns_what_it_held_released_not_failed() {
    let mut q = Q::new(false);
    let mut config = q.s.config().clone();
    config.delivery_limit = Some(0);
    q.apply(Command::UpdateConfig { now_ms: 1, config });
    let cmd = Command::SetConsumerTimeout {
        timeout_ms: Some(100),
    };
    assert_eq!(q.apply(cmd).0, Reply::Ok);
    checkout(&mut q, 1, 1);
    let [(_, id)] = q.publish()[..] else { panic!() };
    let (_, fx) = q.apply(Command::Expire { now_ms: 200 });
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::ConsumerTimedOut { consumer: 1, .. })),
        "{fx:?}"
    );
    // With a delivery limit of 0 a failed return would have killed it.
    assert_eq!(q.s.location(id), Some(Location::Ready));
    assert_eq!(q.s.acquired_count(id), Some(1));
    let fx = checkout(&mut q, 2, 201);
    assert_eq!(deliveries(&fx), vec![(2, id)]);
    assert_eq!(delivered(&fx, id), (0, true));
}

#[test]
fn a_release_is_refused_until_the_machine_moves_to_version_2() {
    let mut s = qq_core::queue::QueueState::new(qq_core::types::QueueConfig::new("/", "q"));
    s.apply(
        1,
        Command::Checkout {
            now_ms: 1,
            consumer: 1,
            node: 1,
            prefetch: 1,
        },
    );
    let (_, fx) = s.apply(
        2,
        Command::Enqueue {
            now_ms: 1,
            header: qq_core::queue::MsgHeader {
                size_bytes: 1,
                expiration_ms: None,
            },
            publish_key: None,
            dedup_key: None,
        },
    );
    let [(_, id)] = deliveries(&fx)[..] else {
        panic!()
    };
    let before = s.clone();
    let (reply, fx) = s.apply(
        3,
        Command::Settle {
            now_ms: 2,
            consumer: 1,
            ids: vec![id],
            outcome: SettleOutcome::Release,
        },
    );
    assert!(matches!(reply, Reply::Error { .. }), "{reply:?}");
    assert!(fx.is_empty());
    assert_eq!(s, before, "a refused command changes nothing");
    // A Get receipt's release likewise (release 0.1.0 could not decode it).
    let receipt = qq_core::queue::Receipt {
        token: [1; 16],
        user: "u".into(),
    };
    let (reply, fx) = s.apply(
        4,
        Command::SettleReceipts {
            now_ms: 2,
            receipts: vec![(id, receipt)],
            outcome: SettleOutcome::Release,
        },
    );
    assert!(
        matches!(&reply, Reply::Error { detail } if detail.contains("SettleReceipts")),
        "{reply:?}"
    );
    assert!(fx.is_empty());
    assert_eq!(s.ready_ids(), before.ready_ids());
}

/// A Get reports the acquired count of what it takes (an `Effect::Got`), read before an
/// auto-ack forgets the message with its releases.
#[test]
fn an_auto_ack_get_reports_the_releases_it_forgets() {
    let mut q = Q::new(false);
    let (_, fx) = q.apply(Command::Checkout {
        now_ms: 1,
        consumer: 1,
        node: 1,
        prefetch: 1,
    });
    assert!(fx.is_empty());
    let delivered = q.publish();
    let [(_, id)] = delivered[..] else { panic!() };
    let (_, fx) = q.apply(Command::Settle {
        now_ms: 2,
        consumer: 1,
        ids: vec![id],
        outcome: SettleOutcome::Release,
    });
    // Released, and at once delivered again to the same consumer: release it once more, then
    // let the consumer go (a failed delivery).
    assert_eq!(deliveries(&fx), [(1, id)]);
    q.apply(Command::Settle {
        now_ms: 3,
        consumer: 1,
        ids: vec![id],
        outcome: SettleOutcome::Release,
    });
    q.apply(Command::ConsumerDown {
        now_ms: 4,
        consumer: 1,
    });
    let (reply, fx) = q.apply(Command::Get {
        now_ms: 5,
        lease_ms: 0,
        auto_ack: true,
    });
    assert!(
        matches!(
            reply,
            Reply::Got {
                delivery: Some(_),
                ..
            }
        ),
        "{reply:?}"
    );
    assert!(
        fx.contains(&Effect::Got {
            id,
            acquired_count: 3
        }),
        "two releases and one failed delivery: {fx:?}"
    );
    assert_eq!(q.s.acquired_count(id), None, "forgotten");
}
