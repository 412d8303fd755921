//! A cancelled consumer (AMQP basic.cancel): it takes nothing new and keeps what it holds until
//! it settles it, as RabbitMQ's quorum queues keep a cancelled consumer's messages with its
//! channel.

use qq_core::queue::{
    Command, FIRST_MACHINE_VERSION, Location, MACHINE_VERSION, QueueState, Reply, SettleOutcome,
};
use qq_core::types::{ConsumerId, MessageId, QueueConfig};

mod common;

use common::{Q, deliveries};

impl Q {
    fn checkout(&mut self, consumer: ConsumerId, prefetch: u32) -> Vec<(ConsumerId, MessageId)> {
        let (reply, fx) = self.apply(Command::Checkout {
            now_ms: 1,
            consumer,
            node: 1,
            prefetch,
        });
        assert_eq!(reply, Reply::Ok);
        deliveries(&fx)
    }

    fn cancel(&mut self, consumer: ConsumerId) -> Vec<(ConsumerId, MessageId)> {
        let (reply, fx) = self.apply(Command::CancelConsumer {
            now_ms: 1,
            consumer,
        });
        assert_eq!(reply, Reply::Ok);
        deliveries(&fx)
    }

    fn settle(
        &mut self,
        consumer: ConsumerId,
        ids: &[MessageId],
        outcome: SettleOutcome,
    ) -> Vec<(ConsumerId, MessageId)> {
        let (reply, fx) = self.apply(Command::Settle {
            now_ms: 1,
            consumer,
            ids: ids.to_vec(),
            outcome,
        });
        assert_eq!(reply, Reply::Ok);
        deliveries(&fx)
    }

    fn attached(&self, consumer: ConsumerId) -> bool {
        self.s.consumers().iter().any(|c| c.0 == consumer)
    }
}

#[test]
fn a_cancelled_consumer_keeps_what_it_holds_and_takes_nothing_new() {
    let mut q = Q::new(false);
    q.checkout(1, 2);
    let a = q.publish()[0].1;
    let b = q.publish()[0].1;
    assert!(q.cancel(1).is_empty());
    // Nothing new goes to it, and it is no longer counted as a consumer.
    assert!(q.publish().is_empty());
    assert_eq!(q.s.counts().consumers, 0);
    assert_eq!(q.s.counts().unacked, 2);
    assert_eq!(q.s.location(a), Some(Location::Unacked { consumer: 1 }));
    // It settles what it holds; with the last one it leaves.
    q.settle(1, &[a], SettleOutcome::Ack);
    assert!(q.attached(1));
    assert!(q.s.cancelled().contains(&1));
    q.settle(1, &[b], SettleOutcome::Ack);
    assert!(!q.attached(1));
    assert!(q.s.cancelled().is_empty());
    // The third message waits for another consumer.
    assert_eq!(q.checkout(2, 0).len(), 1);
}

#[test]
fn cancelling_a_consumer_that_holds_nothing_detaches_it_at_once() {
    let mut q = Q::new(false);
    q.checkout(1, 0);
    q.cancel(1);
    assert!(!q.attached(1));
    assert!(q.s.cancelled().is_empty());
    // An unknown consumer: nothing happens.
    q.cancel(7);
    assert!(q.s.consumers().is_empty());
}

#[test]
fn a_requeue_by_a_cancelled_consumer_goes_to_the_others() {
    let mut q = Q::new(false);
    q.checkout(1, 1);
    let a = q.publish()[0].1;
    q.checkout(2, 1);
    q.cancel(1);
    let to = q.settle(1, &[a], SettleOutcome::Requeue);
    assert_eq!(to, vec![(2, a)]);
    assert!(!q.attached(1));
}

#[test]
fn a_cancelled_consumer_going_down_returns_what_it_still_holds() {
    let mut q = Q::new(false);
    q.checkout(1, 0);
    let a = q.publish()[0].1;
    let b = q.publish()[0].1;
    q.cancel(1);
    q.settle(1, &[a], SettleOutcome::Ack);
    let (reply, _) = q.apply(Command::ConsumerDown {
        now_ms: 2,
        consumer: 1,
    });
    assert_eq!(reply, Reply::Ok);
    assert!(!q.attached(1));
    assert!(q.s.cancelled().is_empty());
    assert_eq!(q.s.location(b), Some(Location::Ready));
    assert_eq!(q.s.location(a), None);
}

#[test]
fn with_single_active_consumer_the_next_one_takes_over_at_the_cancel() {
    let mut q = Q::new(true);
    q.checkout(1, 1);
    q.checkout(2, 1);
    let a = q.publish()[0];
    assert_eq!(a.0, 1);
    let b = q.publish();
    assert!(
        b.is_empty(),
        "the waiting consumer takes nothing while 1 is active"
    );
    // 1 is cancelled while it holds `a`: 2 becomes the active one and takes what is ready.
    let took = q.cancel(1);
    assert_eq!(took.len(), 1);
    assert_eq!(took[0].0, 2);
    assert_eq!(q.s.location(a.1), Some(Location::Unacked { consumer: 1 }));
    q.settle(1, &[a.1], SettleOutcome::Ack);
    assert!(!q.attached(1));
}

#[test]
fn a_snapshot_carries_the_cancelled_consumers_and_the_machine_version_beside_the_state() {
    let mut q = Q::new(false);
    q.checkout(1, 0);
    q.checkout(2, 0);
    q.publish();
    q.publish();
    q.cancel(1);
    assert_eq!(q.s.cancelled().len(), 1);
    // The state's own encoding leaves the set out (older snapshots decode); the snapshot
    // carries it beside, as it does the receipts.
    let bytes = postcard::to_stdvec(&q.s).unwrap();
    let mut restored: QueueState = postcard::from_bytes(&bytes).unwrap();
    assert!(restored.cancelled().is_empty());
    restored.restore_receipts(q.s.receipts().clone());
    restored.restore_moves(q.s.moves().clone());
    restored.restore_cancelled(q.s.cancelled().iter().copied());
    assert_eq!(restored.machine_version(), FIRST_MACHINE_VERSION);
    restored.restore_machine_version(q.s.machine_version());
    assert_eq!(restored, q.s);
    assert_eq!(restored.digest(), q.s.digest());
    // A carried id that is not attached is dropped.
    restored.restore_cancelled([9]);
    assert!(restored.cancelled().is_empty());
    restored.check_invariants().unwrap();
}

#[test]
fn a_queue_cancels_consumers_only_once_its_machine_runs_version_2() {
    // A queue starts at the machine of release 0.1.0, which has no CancelConsumer: every
    // replica refuses it alike and changes nothing.
    let mut s = QueueState::new(QueueConfig::new("/", "q"));
    assert_eq!(s.machine_version(), FIRST_MACHINE_VERSION);
    let checkout = Command::Checkout {
        now_ms: 1,
        consumer: 7,
        node: 1,
        prefetch: 1,
    };
    assert_eq!(s.apply(1, checkout).0, Reply::Ok);
    let before = s.clone();
    let cancel = Command::CancelConsumer {
        now_ms: 2,
        consumer: 7,
    };
    let (reply, fx) = s.apply(2, cancel.clone());
    assert!(
        matches!(&reply, Reply::Error { detail } if detail.contains("machine version 2")),
        "{reply:?}"
    );
    assert!(fx.is_empty());
    assert_eq!(s, before);
    // A version this release does not have is refused; the version never goes back.
    let (reply, _) = s.apply(
        3,
        Command::SetMachineVersion {
            version: MACHINE_VERSION + 1,
        },
    );
    assert!(matches!(reply, Reply::Error { .. }), "{reply:?}");
    assert_eq!(s.machine_version(), FIRST_MACHINE_VERSION);
    assert_eq!(
        s.apply(4, Command::SetMachineVersion { version: 2 }).0,
        Reply::Ok
    );
    assert_eq!(
        s.apply(5, Command::SetMachineVersion { version: 1 }).0,
        Reply::Ok
    );
    assert_eq!(s.machine_version(), 2);
    assert_eq!(s.apply(6, cancel).0, Reply::Ok);
    assert_eq!(s.counts().consumers, 0);
    s.check_invariants().unwrap();
    // The version shows in the digest only once it is not the first (older digests hold).
    assert!(format!("{s:?}").contains("machine_version: 2"));
    assert!(!format!("{before:?}").contains("machine_version"));
}
