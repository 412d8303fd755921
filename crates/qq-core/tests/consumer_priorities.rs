//! Consumer priorities (`x-priority`), as RabbitMQ's quorum queues: the highest priority with
//! credit is served first; with single active consumer the highest priority becomes active once
//! the active one holds nothing.

use qq_core::queue::{Command, QueueState, Reply, SettleOutcome};
use qq_core::types::{ConsumerId, MessageId, QueueConfig};

mod common;

use common::{Q, deliveries};

impl Q {
    fn checkout(&mut self, consumer: ConsumerId, prefetch: u32, priority: i32) {
        let (reply, _) = self.apply(Command::CheckoutWithPriority {
            now_ms: 1,
            consumer,
            node: 1,
            prefetch,
            priority,
        });
        assert_eq!(reply, Reply::Ok);
    }

    /// Publishes one message; returns who got it.
    fn publish_to(&mut self) -> Option<ConsumerId> {
        self.publish().first().map(|(c, _)| *c)
    }

    fn ack(&mut self, consumer: ConsumerId, ids: &[MessageId]) -> Vec<(ConsumerId, MessageId)> {
        let (reply, fx) = self.apply(Command::Settle {
            now_ms: 1,
            consumer,
            ids: ids.to_vec(),
            outcome: SettleOutcome::Ack,
        });
        assert_eq!(reply, Reply::Ok);
        deliveries(&fx)
    }

    fn held_by(&self, consumer: ConsumerId) -> Vec<MessageId> {
        let mut ids: Vec<MessageId> = self
            .s
            .message_ids()
            .into_iter()
            .filter(|id| {
                matches!(self.s.location(*id), Some(qq_core::queue::Location::Unacked { consumer: c }) if c == consumer)
            })
            .collect();
        ids.sort();
        ids
    }
}

#[test]
fn the_highest_priority_with_credit_is_served_first_and_equals_share() {
    let mut q = Q::new(false);
    q.checkout(1, 0, 0); // unlimited, priority 0
    q.checkout(2, 2, 5);
    q.checkout(3, 2, 5);
    let got: Vec<Option<ConsumerId>> = (0..6).map(|_| q.publish_to()).collect();
    // 2 and 3 (priority 5) take turns until both are at their prefetch of 2; then 1.
    assert_eq!(got, [Some(2), Some(3), Some(2), Some(3), Some(1), Some(1)]);
    // An ack gives 2 credit again: the next message is 2's, not 1's.
    let held = q.held_by(2);
    q.ack(2, &held[..1]);
    assert_eq!(q.publish_to(), Some(2));
}

#[test]
fn a_negative_priority_gets_messages_only_when_the_default_ones_are_full() {
    let mut q = Q::new(false);
    q.checkout(1, 0, -1);
    q.checkout(2, 1, 0);
    assert_eq!(q.publish_to(), Some(2));
    assert_eq!(q.publish_to(), Some(1));
}

#[test]
fn with_single_active_consumer_a_higher_priority_takes_over_once_the_active_holds_nothing() {
    let mut q = Q::new(true);
    q.checkout(1, 2, 0);
    assert_eq!(q.publish_to(), Some(1));
    assert_eq!(q.publish_to(), Some(1));
    // 2 attaches with a higher priority while 1 holds two: 1 stays active meanwhile.
    q.checkout(2, 10, 3);
    assert_eq!(
        q.publish_to(),
        None,
        "1 is at its prefetch; 2 waits its turn"
    );
    // 1 settles one: it has credit again, but takes nothing new while 2 waits.
    let held = q.held_by(1);
    assert_eq!(q.ack(1, &held[..1]), vec![]);
    // 1 settles the rest: 2 becomes active and takes what is ready, and what comes.
    let rest = q.held_by(1);
    let ready: Vec<ConsumerId> = q.ack(1, &rest).iter().map(|(c, _)| *c).collect();
    assert_eq!(ready, [2]);
    assert_eq!(q.publish_to(), Some(2));
    assert!(q.held_by(1).is_empty());
}

#[test]
fn with_single_active_consumer_the_highest_priority_is_chosen_at_first() {
    let mut q = Q::new(true);
    q.checkout(1, 0, 1);
    q.checkout(2, 0, 7);
    q.checkout(3, 0, 7);
    // 2 and 3 share the top priority: the earlier attached one is active.
    assert_eq!(q.publish_to(), Some(2));
    assert_eq!(q.publish_to(), Some(2));
}

#[test]
fn a_plain_checkout_keeps_the_priority_and_a_machine_at_version_1_refuses_priorities() {
    let mut q = Q::new(false);
    q.checkout(1, 0, 4);
    // A prefetch change (plain Checkout) keeps the consumer's priority.
    q.apply(Command::Checkout {
        now_ms: 1,
        consumer: 1,
        node: 1,
        prefetch: 5,
    });
    assert_eq!(q.s.priorities().get(&1), Some(&4));
    // A consumer that leaves takes its priority with it.
    q.apply(Command::ConsumerDown {
        now_ms: 1,
        consumer: 1,
    });
    assert!(q.s.priorities().is_empty());

    let mut old = QueueState::new(QueueConfig::new("/", "q"));
    let before = old.clone();
    let (reply, _) = old.apply(
        1,
        Command::CheckoutWithPriority {
            now_ms: 1,
            consumer: 1,
            node: 1,
            prefetch: 0,
            priority: 4,
        },
    );
    assert!(matches!(reply, Reply::Error { .. }), "{reply:?}");
    assert_eq!(old, before);
}
