//! Scenario tests of the queue state machine, one behaviour per test, through the public API.

use qq_core::queue::{
    Command, Counts, Delivery, Effect, GET_CONSUMER, Location, MsgHeader, QueueState, Receipt,
    Reply, SettleOutcome,
};
use qq_core::types::{ConsumerId, MessageId, Overflow, QueueConfig, Reason, Strategy};

mod common;

use common::deliveries;

/// A queue plus its log index; checks the internal invariants after every command.
struct Q {
    s: QueueState,
    index: u64,
}

impl Q {
    fn new(config: QueueConfig) -> Self {
        Q {
            s: QueueState::new(config),
            index: 0,
        }
    }

    fn plain() -> Self {
        Q::new(QueueConfig::new("/", "q"))
    }

    fn with(f: impl FnOnce(&mut QueueConfig)) -> Self {
        let mut c = QueueConfig::new("/", "q");
        f(&mut c);
        Q::new(c)
    }

    fn apply(&mut self, cmd: Command) -> (Reply, Vec<Effect>) {
        self.index += 1;
        let out = self.s.apply(self.index, cmd);
        self.s.check_invariants().unwrap();
        out
    }

    fn publish_full(
        &mut self,
        now_ms: u64,
        size: u64,
        expiration_ms: Option<u64>,
    ) -> (Reply, Vec<Effect>) {
        self.apply(Command::Enqueue {
            now_ms,
            header: MsgHeader {
                size_bytes: size,
                expiration_ms,
            },
            publish_key: None,
            dedup_key: None,
        })
    }

    /// Publish and expect acceptance; returns the id.
    fn publish(&mut self, now_ms: u64, expiration_ms: Option<u64>) -> MessageId {
        match self.publish_full(now_ms, 10, expiration_ms).0 {
            Reply::Enqueued { id } => id,
            other => panic!("expected Enqueued, got {other:?}"),
        }
    }

    fn checkout(&mut self, now_ms: u64, consumer: ConsumerId, prefetch: u32) -> Vec<Effect> {
        let (r, fx) = self.apply(Command::Checkout {
            now_ms,
            consumer,
            node: 1,
            prefetch,
        });
        assert_eq!(r, Reply::Ok);
        fx
    }

    fn settle(
        &mut self,
        now_ms: u64,
        consumer: ConsumerId,
        ids: &[MessageId],
        outcome: SettleOutcome,
    ) -> (Reply, Vec<Effect>) {
        self.apply(Command::Settle {
            now_ms,
            consumer,
            ids: ids.to_vec(),
            outcome,
        })
    }

    fn expire(&mut self, now_ms: u64) -> Vec<Effect> {
        let (r, fx) = self.apply(Command::Expire { now_ms });
        assert_eq!(r, Reply::Ok);
        fx
    }

    /// ExpireQueue; returns whether the queue's x-expires has passed.
    fn expire_queue(&mut self, now_ms: u64, leader_since_ms: u64) -> bool {
        match self
            .apply(Command::ExpireQueue {
                now_ms,
                leader_since_ms,
            })
            .0
        {
            Reply::QueueExpiry { expired } => expired,
            other => panic!("expected QueueExpiry, got {other:?}"),
        }
    }

    fn get(&mut self, now_ms: u64, lease_ms: u64, auto_ack: bool) -> (Option<Delivery>, u64) {
        match self
            .apply(Command::Get {
                now_ms,
                lease_ms,
                auto_ack,
            })
            .0
        {
            Reply::Got {
                delivery,
                message_count,
            } => (delivery, message_count),
            other => panic!("expected Got, got {other:?}"),
        }
    }
}

fn full_deliveries(fx: &[Effect]) -> Vec<Delivery> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Deliver(d) => Some(d.clone()),
            _ => None,
        })
        .collect()
}

fn dead(fx: &[Effect]) -> Vec<(MessageId, Reason)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::DeadLetter { id, reason, .. } => Some((*id, *reason)),
            _ => None,
        })
        .collect()
}

fn deleted(fx: &[Effect]) -> Vec<MessageId> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::DeleteBody { id } => Some(*id),
            _ => None,
        })
        .collect()
}

// ----- FIFO, round-robin, prefetch -----

#[test]
fn delivers_in_fifo_order() {
    let mut q = Q::plain();
    let ids: Vec<_> = (0..3).map(|_| q.publish(0, None)).collect();
    let fx = q.checkout(0, 1, 0);
    assert_eq!(
        deliveries(&fx),
        ids.iter().map(|id| (1, *id)).collect::<Vec<_>>()
    );
    let d = full_deliveries(&fx);
    assert!(d.iter().all(|d| !d.redelivered && d.delivery_count == 0));
    assert_eq!(q.s.counts().unacked, 3);
    assert_eq!(q.s.counts().ready, 0);
    assert_eq!(q.s.stats().enqueued_total, 3);
    assert_eq!(q.s.stats().delivered_total, 3);
}

#[test]
fn round_robin_between_consumers() {
    let mut q = Q::plain();
    q.checkout(0, 1, 0);
    q.checkout(0, 2, 0);
    let mut got = Vec::new();
    for _ in 0..4 {
        let (_, fx) = q.publish_full(0, 1, None);
        got.extend(deliveries(&fx));
    }
    let consumers: Vec<_> = got.iter().map(|(c, _)| *c).collect();
    assert_eq!(consumers, vec![1, 2, 1, 2]);
}

#[test]
fn round_robin_skips_consumers_without_credit() {
    let mut q = Q::plain();
    q.checkout(0, 1, 1);
    q.checkout(0, 2, 0);
    q.checkout(0, 3, 0);
    let mut got = Vec::new();
    for _ in 0..5 {
        let (_, fx) = q.publish_full(0, 1, None);
        got.extend(deliveries(&fx));
    }
    let consumers: Vec<_> = got.iter().map(|(c, _)| *c).collect();
    assert_eq!(consumers, vec![1, 2, 3, 2, 3]);
    // A backlog handed to a newly attached consumer goes to it alone.
    let mut q = Q::plain();
    for _ in 0..4 {
        q.publish(0, None);
    }
    let fx = q.checkout(0, 1, 2);
    assert_eq!(deliveries(&fx), vec![(1, 1), (1, 2)]);
    let fx = q.checkout(0, 2, 0);
    assert_eq!(deliveries(&fx), vec![(2, 3), (2, 4)]);
}

#[test]
fn prefetch_is_never_exceeded() {
    let mut q = Q::plain();
    let ids: Vec<_> = (0..5).map(|_| q.publish(0, None)).collect();
    let fx = q.checkout(0, 1, 2);
    assert_eq!(deliveries(&fx), vec![(1, ids[0]), (1, ids[1])]);
    assert_eq!(q.s.consumers(), vec![(1, 1, 2, 2)]);
    let (r, fx) = q.settle(0, 1, &[ids[0]], SettleOutcome::Ack);
    assert_eq!(r, Reply::Ok);
    assert_eq!(deleted(&fx), vec![ids[0]]);
    assert_eq!(deliveries(&fx), vec![(1, ids[2])]);
    // Lowering the prefetch below unacked stops deliveries until it drops below again.
    q.checkout(0, 1, 1);
    let (_, fx) = q.settle(0, 1, &[ids[1]], SettleOutcome::Ack);
    assert!(deliveries(&fx).is_empty());
    let (_, fx) = q.settle(0, 1, &[ids[2]], SettleOutcome::Ack);
    assert_eq!(deliveries(&fx), vec![(1, ids[3])]);
}

// ----- returns -----

#[test]
fn requeued_messages_go_to_the_head_in_return_order() {
    let mut q = Q::plain();
    let ids: Vec<_> = (0..5).map(|_| q.publish(0, None)).collect();
    q.checkout(0, 1, 3);
    let (r, fx) = q.settle(0, 1, &[ids[2], ids[0]], SettleOutcome::Requeue);
    assert_eq!(r, Reply::Ok);
    let d = full_deliveries(&fx);
    assert_eq!(
        d.iter().map(|d| d.id).collect::<Vec<_>>(),
        vec![ids[2], ids[0]],
        "returned messages are served first, first returned first"
    );
    assert!(d.iter().all(|d| d.redelivered && d.delivery_count == 1));
    assert_eq!(q.s.ready_ids(), vec![ids[3], ids[4]]);
}

#[test]
fn returned_messages_wait_ahead_of_new_ones() {
    let mut q = Q::plain();
    let a = q.publish(0, None);
    q.checkout(0, 1, 1);
    let b = q.publish(0, None);
    q.checkout(0, 1, 0); // b delivered too
    q.checkout(0, 1, 2);
    q.settle(0, 1, &[b], SettleOutcome::Requeue);
    // b was redelivered at once (credit); now make the consumer go away.
    let (_, fx) = q.apply(Command::ConsumerDown {
        now_ms: 0,
        consumer: 1,
    });
    assert!(fx.is_empty());
    let c = q.publish(0, None);
    assert_eq!(
        q.s.ready_ids(),
        vec![a, b, c],
        "returned in id order, before new"
    );
    let fx = q.checkout(0, 2, 0);
    let d = full_deliveries(&fx);
    assert_eq!(
        d.iter()
            .map(|d| (d.id, d.delivery_count, d.redelivered))
            .collect::<Vec<_>>(),
        vec![(a, 1, true), (b, 2, true), (c, 0, false)]
    );
}

#[test]
fn delivery_limit_default_is_20() {
    let mut q = Q::plain();
    let id = q.publish(0, None);
    q.checkout(0, 1, 1);
    for n in 1..=20u32 {
        let (_, fx) = q.settle(0, 1, &[id], SettleOutcome::Requeue);
        let d = full_deliveries(&fx);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].delivery_count, n);
    }
    let (_, fx) = q.settle(0, 1, &[id], SettleOutcome::Requeue);
    assert_eq!(dead(&fx), vec![(id, Reason::DeliveryLimit)]);
    assert!(deliveries(&fx).is_empty());
    assert_eq!(q.s.location(id), None);
    assert_eq!(
        q.s.stats()
            .dead_lettered(Reason::DeliveryLimit, Strategy::Disabled),
        1
    );
    assert_eq!(q.s.stats().returned_total, 21);
}

#[test]
fn delivery_limit_none_is_unlimited_and_zero_kills_at_first_failure() {
    let mut q = Q::with(|c| c.delivery_limit = None);
    let id = q.publish(0, None);
    q.checkout(0, 1, 1);
    for _ in 0..100 {
        let (_, fx) = q.settle(0, 1, &[id], SettleOutcome::Requeue);
        assert!(dead(&fx).is_empty());
    }
    assert_eq!(q.s.pending_deliveries()[0].delivery_count, 100);

    let mut q = Q::with(|c| c.delivery_limit = Some(0));
    let id = q.publish(0, None);
    q.checkout(0, 1, 1);
    let (_, fx) = q.apply(Command::ConsumerDown {
        now_ms: 0,
        consumer: 1,
    });
    assert_eq!(dead(&fx), vec![(id, Reason::DeliveryLimit)]);
}

// ----- TTL -----

#[test]
fn ttl_expires_at_the_deadline_not_only_at_the_head() {
    let mut q = Q::plain();
    let a = q.publish(0, None);
    let b = q.publish(0, Some(100));
    let c = q.publish(0, Some(50));
    assert_eq!(q.s.next_deadline(), Some(50));
    assert!(q.expire(49).is_empty());
    assert_eq!(dead(&q.expire(60)), vec![(c, Reason::Expired)]);
    assert_eq!(q.s.next_deadline(), Some(100));
    assert_eq!(dead(&q.expire(100)), vec![(b, Reason::Expired)]);
    assert_eq!(q.s.ready_ids(), vec![a]);
    assert_eq!(q.s.next_deadline(), None);
    assert_eq!(
        q.s.stats()
            .dead_lettered(Reason::Expired, Strategy::Disabled),
        2
    );
}

#[test]
fn expired_messages_die_in_queue_order() {
    let mut q = Q::plain();
    let a = q.publish(0, Some(30));
    let b = q.publish(0, Some(10));
    let c = q.publish(0, Some(20));
    assert_eq!(
        dead(&q.expire(100)),
        vec![
            (a, Reason::Expired),
            (b, Reason::Expired),
            (c, Reason::Expired)
        ]
    );
}

#[test]
fn ttl_is_the_minimum_of_queue_and_message_ttl() {
    let mut q = Q::with(|c| c.message_ttl_ms = Some(100));
    q.publish(1000, Some(500));
    assert_eq!(q.s.next_deadline(), Some(1100));
    q.apply(Command::Purge);
    q.publish(1000, Some(30));
    assert_eq!(q.s.next_deadline(), Some(1030));
    q.apply(Command::Purge);
    q.publish(1000, None);
    assert_eq!(q.s.next_deadline(), Some(1100));
}

#[test]
fn ttl_zero_delivers_or_expires_in_the_same_apply() {
    let mut q = Q::with(|c| c.message_ttl_ms = Some(0));
    let (r, fx) = q.publish_full(5, 10, None);
    let Reply::Enqueued { id } = r else { panic!() };
    assert_eq!(dead(&fx), vec![(id, Reason::Expired)]);
    assert_eq!(q.s.counts(), Counts::default());

    q.checkout(5, 1, 1);
    let (r, fx) = q.publish_full(6, 10, Some(0));
    let Reply::Enqueued { id } = r else { panic!() };
    assert_eq!(deliveries(&fx), vec![(1, id)]);
    assert!(dead(&fx).is_empty());
    // consumer full: the next one expires at once
    let (r, fx) = q.publish_full(6, 10, Some(0));
    let Reply::Enqueued { id } = r else { panic!() };
    assert_eq!(dead(&fx), vec![(id, Reason::Expired)]);
}

#[test]
fn unacked_messages_never_expire_but_expire_when_returned_late() {
    let mut q = Q::plain();
    let id = q.publish(0, Some(100));
    q.checkout(0, 1, 1);
    assert_eq!(q.s.next_deadline(), None, "unacked messages carry no timer");
    assert!(q.expire(500).is_empty());
    assert_eq!(q.s.location(id), Some(Location::Unacked { consumer: 1 }));
    let (_, fx) = q.settle(500, 1, &[id], SettleOutcome::Requeue);
    assert_eq!(dead(&fx), vec![(id, Reason::Expired)]);
    assert!(deliveries(&fx).is_empty());
}

#[test]
fn a_message_returned_at_its_deadline_is_not_redelivered() {
    let mut q = Q::plain();
    let id = q.publish(0, Some(100));
    q.checkout(0, 1, 1);
    // The consumer has credit again after the requeue, but the message is due: it dies.
    let (_, fx) = q.settle(100, 1, &[id], SettleOutcome::Requeue);
    assert_eq!(dead(&fx), vec![(id, Reason::Expired)]);
    assert!(deliveries(&fx).is_empty());
}

#[test]
fn no_command_delivers_an_expired_message() {
    let mut q = Q::plain();
    let a = q.publish(0, Some(100));
    let b = q.publish(0, None);
    let fx = q.checkout(150, 1, 0);
    assert_eq!(dead(&fx), vec![(a, Reason::Expired)]);
    assert_eq!(deliveries(&fx), vec![(1, b)]);
}

#[test]
fn time_never_goes_backwards() {
    let mut q = Q::plain();
    q.publish(1000, None);
    // A command stamped by a lagging leader: the queue's clock stays at 1000.
    let id = q.publish(400, Some(100));
    assert_eq!(q.s.clock_ms(), 1000);
    assert_eq!(q.s.next_deadline(), Some(1100));
    assert!(q.expire(1099).is_empty());
    assert_eq!(dead(&q.expire(1100)), vec![(id, Reason::Expired)]);
}

// ----- length limits -----

#[test]
fn drop_head_dead_letters_the_oldest_ready_messages() {
    let mut q = Q::with(|c| c.max_length = Some(2));
    let a = q.publish(0, None);
    let b = q.publish(0, None);
    let (r, fx) = q.publish_full(0, 10, None);
    let Reply::Enqueued { id: c } = r else {
        panic!()
    };
    assert_eq!(dead(&fx), vec![(a, Reason::Maxlen)]);
    assert_eq!(q.s.ready_ids(), vec![b, c]);

    // bytes: the new message itself can go (RabbitMQ's at_most_once_dead_letter_order_maxlen)
    let mut q = Q::with(|c| c.max_length_bytes = Some(1000));
    let Reply::Enqueued { id: m1 } = q.publish_full(0, 400, None).0 else {
        panic!()
    };
    let Reply::Enqueued { id: m2 } = q.publish_full(0, 400, None).0 else {
        panic!()
    };
    assert_eq!(q.s.counts().ready_bytes, 800);
    let (r, fx) = q.publish_full(0, 1500, None);
    let Reply::Enqueued { id: m3 } = r else {
        panic!()
    };
    assert_eq!(
        dead(&fx),
        vec![
            (m1, Reason::Maxlen),
            (m2, Reason::Maxlen),
            (m3, Reason::Maxlen)
        ]
    );
    assert_eq!(q.s.counts(), Counts::default());
}

#[test]
fn unacked_messages_do_not_count_against_limits() {
    let mut q = Q::with(|c| c.max_length = Some(1));
    q.checkout(0, 1, 2);
    q.publish(0, None);
    q.publish(0, None);
    let c = q.publish(0, None);
    assert_eq!(q.s.counts().unacked, 2);
    assert_eq!(q.s.ready_ids(), vec![c]);
}

#[test]
fn reject_publish_is_exact() {
    let mut q = Q::with(|c| {
        c.max_length = Some(2);
        c.overflow = Overflow::RejectPublish;
    });
    let a = q.publish(0, None);
    q.publish(0, None);
    let (r, fx) = q.publish_full(0, 10, None);
    assert_eq!(
        r,
        Reply::Rejected {
            detail: "queue 'q' is full (x-max-length 2)".into()
        }
    );
    assert!(fx.is_empty());
    assert_eq!(q.s.counts().ready, 2);
    assert_eq!(q.s.stats().rejected_publishes_total, 1);
    // A consumer takes one: room for exactly one more.
    q.checkout(0, 1, 1);
    assert_eq!(q.s.location(a), Some(Location::Unacked { consumer: 1 }));
    q.publish(0, None);
    assert!(matches!(
        q.publish_full(0, 10, None).0,
        Reply::Rejected { .. }
    ));

    let mut q = Q::with(|c| {
        c.max_length_bytes = Some(100);
        c.overflow = Overflow::RejectPublish;
    });
    assert!(matches!(
        q.publish_full(0, 60, None).0,
        Reply::Enqueued { .. }
    ));
    assert!(matches!(
        q.publish_full(0, 40, None).0,
        Reply::Enqueued { .. }
    ));
    assert_eq!(
        q.publish_full(0, 1, None).0,
        Reply::Rejected {
            detail: "queue 'q' is full (x-max-length-bytes 100)".into()
        }
    );
}

#[test]
fn reject_publish_accepts_what_a_waiting_consumer_takes() {
    let mut q = Q::with(|c| {
        c.max_length = Some(0);
        c.overflow = Overflow::RejectPublish;
    });
    assert!(matches!(
        q.publish_full(0, 10, None).0,
        Reply::Rejected { .. }
    ));
    q.checkout(0, 1, 1);
    let (r, fx) = q.publish_full(0, 10, None);
    let Reply::Enqueued { id } = r else { panic!() };
    assert_eq!(deliveries(&fx), vec![(1, id)]);
    assert!(matches!(
        q.publish_full(0, 10, None).0,
        Reply::Rejected { .. }
    ));
}

#[test]
fn reject_publish_dlx_refuses_and_dead_letters_the_new_message() {
    let mut q = Q::with(|c| {
        c.max_length = Some(1);
        c.overflow = Overflow::RejectPublishDlx;
        c.dead_letter_strategy = Strategy::AtMostOnce;
    });
    let a = q.publish(7, None);
    let index_before = q.index;
    let (r, fx) = q.publish_full(9, 10, None);
    assert_eq!(
        r,
        Reply::RejectedDeadLettered {
            id: index_before + 1,
            detail: "queue 'q' is full (x-max-length 1)".into()
        }
    );
    assert_eq!(
        fx,
        vec![Effect::DeadLetter {
            id: index_before + 1,
            reason: Reason::Maxlen,
            strategy: Strategy::AtMostOnce,
            died_at_ms: 9,
            detail: None
        }]
    );
    assert_eq!(q.s.message_ids(), vec![a]);
    assert_eq!(
        q.s.stats()
            .dead_lettered(Reason::Maxlen, Strategy::AtMostOnce),
        1
    );
}

// ----- dead-letter strategies -----

#[test]
fn reject_dead_letters_in_the_order_given() {
    let mut q = Q::with(|c| c.dead_letter_strategy = Strategy::AtMostOnce);
    let ids: Vec<_> = (0..3).map(|_| q.publish(0, None)).collect();
    q.checkout(0, 1, 0);
    let (_, fx) = q.settle(3, 1, &[ids[2], ids[0], ids[1]], SettleOutcome::Reject);
    assert_eq!(
        dead(&fx),
        vec![
            (ids[2], Reason::Rejected),
            (ids[0], Reason::Rejected),
            (ids[1], Reason::Rejected)
        ]
    );
    assert!(
        deleted(&fx).is_empty(),
        "the glue deletes after republishing"
    );
    assert!(q.s.message_ids().is_empty());
    assert_eq!(
        q.s.stats()
            .dead_lettered(Reason::Rejected, Strategy::AtMostOnce),
        3
    );
}

fn at_least_once(max_length: u64) -> Q {
    Q::with(|c| {
        c.dead_letter_exchange = Some("dlx".into());
        c.dead_letter_strategy = Strategy::AtLeastOnce;
        c.overflow = Overflow::RejectPublish;
        c.max_length = Some(max_length);
    })
}

#[test]
fn at_least_once_holds_dead_letters_until_settled() {
    let mut q = at_least_once(2);
    let m1 = q.publish(0, None);
    let m2 = q.publish(0, None);
    let (d, left) = q.get(10, 1000, false);
    assert_eq!(d.unwrap().id, m1);
    assert_eq!(left, 1);
    let (r, fx) = q.settle(20, GET_CONSUMER, &[m1], SettleOutcome::Reject);
    assert_eq!(r, Reply::Ok);
    assert_eq!(
        fx,
        vec![Effect::DeadLetter {
            id: m1,
            reason: Reason::Rejected,
            strategy: Strategy::AtLeastOnce,
            died_at_ms: 20,
            detail: None
        }]
    );
    let counts = q.s.counts();
    assert_eq!((counts.ready, counts.held, counts.held_bytes), (1, 1, 10));
    assert_eq!(q.s.location(m1), Some(Location::Held));
    assert_eq!(q.s.message_ids(), vec![m1, m2]);
    let held = q.s.held_dead_letters();
    assert_eq!(held.len(), 1);
    assert_eq!(
        (held[0].id, held[0].reason, held[0].died_at_ms),
        (m1, Reason::Rejected, 20)
    );
    // held letters count against the limit
    assert!(matches!(
        q.publish_full(30, 10, None).0,
        Reply::Rejected { .. }
    ));
    let (r, fx) = q.apply(Command::DeadLetterSettle { ids: vec![m1, 999] });
    assert_eq!(r, Reply::Ok);
    assert_eq!(fx, vec![Effect::DeleteBody { id: m1 }]);
    assert_eq!(q.s.stats().dead_lettered_confirmed, 1);
    assert!(q.s.held_dead_letters().is_empty());
    // settling again is harmless
    let (_, fx) = q.apply(Command::DeadLetterSettle { ids: vec![m1] });
    assert!(fx.is_empty());
    q.publish(40, None);
}

#[test]
fn held_dead_letters_keep_death_order() {
    let mut q = at_least_once(100);
    let a = q.publish(0, Some(50));
    let b = q.publish(0, None);
    q.checkout(0, 1, 0);
    let c = q.publish(0, Some(10));
    q.settle(5, 1, &[b], SettleOutcome::Reject);
    q.settle(6, 1, &[a], SettleOutcome::Reject);
    let _ = q.expire(100);
    let held: Vec<_> =
        q.s.held_dead_letters()
            .iter()
            .map(|h| (h.id, h.reason))
            .collect();
    // c was delivered to consumer 1 (prefetch 0), so nothing expires.
    assert_eq!(held, vec![(b, Reason::Rejected), (a, Reason::Rejected)]);
    assert_eq!(q.s.location(c), Some(Location::Unacked { consumer: 1 }));
}

#[test]
fn leaving_at_least_once_releases_held_dead_letters() {
    let mut q = at_least_once(10);
    let a = q.publish(0, None);
    let b = q.publish(0, None);
    q.checkout(0, 1, 0);
    q.settle(5, 1, &[b, a], SettleOutcome::Reject);
    assert_eq!(q.s.counts().held, 2);
    let mut config = q.s.config().clone();
    config.dead_letter_strategy = Strategy::AtMostOnce;
    let (r, fx) = q.apply(Command::UpdateConfig { now_ms: 9, config });
    assert_eq!(r, Reply::Ok);
    assert_eq!(
        fx,
        vec![
            Effect::DeadLetter {
                id: b,
                reason: Reason::Rejected,
                strategy: Strategy::AtMostOnce,
                died_at_ms: 5,
                detail: None
            },
            Effect::DeadLetter {
                id: a,
                reason: Reason::Rejected,
                strategy: Strategy::AtMostOnce,
                died_at_ms: 5,
                detail: None
            }
        ]
    );
    assert_eq!(
        q.s.counts(),
        Counts {
            consumers: 1,
            ..Counts::default()
        }
    );
    assert_eq!(q.s.stats().dead_lettered_total(), 2, "not counted twice");
}

#[test]
fn update_config_trims_at_once_with_drop_head() {
    let mut q = Q::plain();
    let ids: Vec<_> = (0..5).map(|_| q.publish(0, None)).collect();
    let mut config = q.s.config().clone();
    config.max_length = Some(2);
    let (_, fx) = q.apply(Command::UpdateConfig { now_ms: 0, config });
    assert_eq!(
        dead(&fx),
        ids[..3]
            .iter()
            .map(|id| (*id, Reason::Maxlen))
            .collect::<Vec<_>>()
    );
    // reject-publish with a lowered limit drops nothing
    let mut config = q.s.config().clone();
    config.max_length = Some(1);
    config.overflow = Overflow::RejectPublish;
    let (_, fx) = q.apply(Command::UpdateConfig { now_ms: 0, config });
    assert!(fx.is_empty());
    assert_eq!(q.s.counts().ready, 2);
}

#[test]
fn queue_ttl_change_applies_to_later_messages() {
    let mut q = Q::plain();
    let a = q.publish(0, None);
    let mut config = q.s.config().clone();
    config.message_ttl_ms = Some(10);
    q.apply(Command::UpdateConfig { now_ms: 0, config });
    let b = q.publish(0, None);
    assert_eq!(dead(&q.expire(20)), vec![(b, Reason::Expired)]);
    assert_eq!(q.s.ready_ids(), vec![a]);
}

// ----- dedup -----

fn publish_at(q: &mut Q, now_ms: u64, publisher: Option<(u64, u64)>, key: Option<&str>) -> Reply {
    q.apply(Command::Enqueue {
        now_ms,
        header: MsgHeader {
            size_bytes: 1,
            expiration_ms: None,
        },
        publish_key: publisher.map(|(p, seq)| format!("user\0p{p}\0{seq}")),
        dedup_key: key.map(str::to_string),
    })
    .0
}

fn publish_as(q: &mut Q, publisher: Option<(u64, u64)>, key: Option<&str>) -> Reply {
    publish_at(q, 0, publisher, key)
}

#[test]
fn publisher_keys_deduplicate_exactly() {
    let mut q = Q::plain();
    let stored = |r: Reply| matches!(r, Reply::Enqueued { .. });
    assert!(stored(publish_as(&mut q, Some((7, 1)), None)));
    assert_eq!(publish_as(&mut q, Some((7, 1)), None), Reply::Duplicate);
    assert!(stored(publish_as(&mut q, Some((7, 3)), None)));
    // A retry that lost its race with a later publish is stored: exact, not "seq <= last".
    assert!(stored(publish_as(&mut q, Some((7, 2)), None)));
    assert_eq!(publish_as(&mut q, Some((7, 2)), None), Reply::Duplicate);
    assert_eq!(publish_as(&mut q, Some((7, 3)), None), Reply::Duplicate);
    assert!(stored(publish_as(&mut q, Some((8, 1)), None)));
    assert_eq!(q.s.counts().ready, 4);
    assert_eq!(q.s.stats().duplicates_total, 3);
}

#[test]
fn a_refused_publish_is_not_remembered() {
    let mut q = Q::with(|c| {
        c.max_length = Some(1);
        c.overflow = Overflow::RejectPublish;
    });
    assert!(matches!(
        publish_as(&mut q, Some((7, 1)), None),
        Reply::Enqueued { .. }
    ));
    assert!(matches!(
        publish_as(&mut q, Some((7, 2)), Some("k")),
        Reply::Rejected { .. }
    ));
    q.apply(Command::Purge);
    assert!(matches!(
        publish_as(&mut q, Some((7, 2)), Some("k")),
        Reply::Enqueued { .. }
    ));
}

#[test]
fn keys_are_remembered_for_the_dedup_window_of_command_time() {
    let mut q = Q::with(|c| c.dedup_window_ms = 10_000);
    assert!(matches!(
        publish_at(&mut q, 1_000, Some((1, 1)), None),
        Reply::Enqueued { .. }
    ));
    assert!(matches!(
        publish_at(&mut q, 1_000, None, Some("dl/1")),
        Reply::Enqueued { .. }
    ));
    // Still inside the window at its last millisecond.
    assert_eq!(
        publish_at(&mut q, 11_000, Some((1, 1)), None),
        Reply::Duplicate
    );
    assert_eq!(
        publish_at(&mut q, 11_000, None, Some("dl/1")),
        Reply::Duplicate
    );
    // Past it, both kinds are forgotten and stored again.
    assert!(matches!(
        publish_at(&mut q, 11_001, Some((1, 1)), None),
        Reply::Enqueued { .. }
    ));
    assert!(matches!(
        publish_at(&mut q, 11_001, None, Some("dl/1")),
        Reply::Enqueued { .. }
    ));
    q.s.check_invariants().unwrap();
}

#[test]
fn publish_and_transfer_keys_are_separate_windows() {
    let mut q = Q::plain();
    // The same text as a publish key and as a transfer key are two different keys.
    let same = "user\0p1\01";
    assert!(matches!(
        publish_as(&mut q, Some((1, 1)), None),
        Reply::Enqueued { .. }
    ));
    assert!(matches!(
        publish_as(&mut q, None, Some(same)),
        Reply::Enqueued { .. }
    ));
    assert_eq!(publish_as(&mut q, None, Some(same)), Reply::Duplicate);
    assert_eq!(q.s.counts().ready, 2);
}

#[test]
fn dedup_keys_deduplicate_dead_letter_copies() {
    let mut q = Q::plain();
    assert!(matches!(
        publish_as(&mut q, None, Some("src/5/1")),
        Reply::Enqueued { .. }
    ));
    assert_eq!(publish_as(&mut q, None, Some("src/5/1")), Reply::Duplicate);
    assert!(matches!(
        publish_as(&mut q, None, Some("src/5/2")),
        Reply::Enqueued { .. }
    ));
    assert!(matches!(
        publish_as(&mut q, None, None),
        Reply::Enqueued { .. }
    ));
    assert_eq!(q.s.counts().ready, 3);
}

// ----- Get -----

#[test]
fn get_lease_lapses_as_a_failed_delivery() {
    let mut q = Q::plain();
    let a = q.publish(0, None);
    let b = q.publish(0, None);
    let (d, left) = q.get(100, 1000, false);
    assert_eq!(
        d,
        Some(Delivery {
            consumer: GET_CONSUMER,
            id: a,
            delivery_count: 0,
            redelivered: false,
            lease_deadline_ms: Some(1100)
        })
    );
    assert_eq!(left, 1);
    assert_eq!(q.s.counts().unacked, 1);
    assert_eq!(q.s.next_deadline(), Some(1100));
    assert!(q.expire(1099).is_empty());
    assert!(q.expire(1100).is_empty());
    assert_eq!(q.s.ready_ids(), vec![a, b], "back at the head");
    // the lapsed receipt can no longer be settled
    let (r, _) = q.settle(1200, GET_CONSUMER, &[a], SettleOutcome::Ack);
    assert_eq!(
        r,
        Reply::Error {
            detail: format!("unknown delivery tag {a}")
        }
    );
    let (d, _) = q.get(1200, 1000, false);
    let d = d.unwrap();
    assert_eq!((d.id, d.delivery_count, d.redelivered), (a, 1, true));
    let (r, fx) = q.settle(1300, GET_CONSUMER, &[a], SettleOutcome::Ack);
    assert_eq!(r, Reply::Ok);
    assert_eq!(deleted(&fx), vec![a]);
}

#[test]
fn get_receipts_settle_only_with_their_token_and_user() {
    let mut q = Q::plain();
    let a = q.publish(0, None);
    let alice = |token: [u8; 16]| Receipt {
        token,
        user: "alice".into(),
    };
    let (r, _) = q.apply(Command::GetWithReceipt {
        now_ms: 10,
        lease_ms: 1000,
        receipt: alice([7; 16]),
    });
    let Reply::Got {
        delivery: Some(d), ..
    } = r
    else {
        panic!("expected a delivery, got {r:?}")
    };
    assert_eq!(d.id, a);
    let settle = |receipt: Receipt| Command::SettleReceipts {
        now_ms: 20,
        receipts: vec![(a, receipt)],
        outcome: SettleOutcome::Ack,
    };
    // A forged token, another user's use of the right token, and the old id-only settle all
    // refuse and settle nothing.
    let (r, _) = q.apply(settle(alice([8; 16])));
    assert!(matches!(r, Reply::Error { .. }), "{r:?}");
    let (r, _) = q.apply(settle(Receipt {
        token: [7; 16],
        user: "mallory".into(),
    }));
    assert_eq!(
        r,
        Reply::Error {
            detail: format!("receipt of message {a} belongs to another user")
        }
    );
    let (r, _) = q.settle(30, GET_CONSUMER, &[a], SettleOutcome::Ack);
    assert!(matches!(r, Reply::Error { .. }), "{r:?}");
    assert_eq!(q.s.counts().unacked, 1);
    q.s.check_invariants().unwrap();
    // The right token and user settle it, once.
    let (r, fx) = q.apply(settle(alice([7; 16])));
    assert_eq!(r, Reply::Ok);
    assert_eq!(deleted(&fx), vec![a]);
    let (r, _) = q.apply(settle(alice([7; 16])));
    assert!(matches!(r, Reply::Error { .. }), "{r:?}");
    q.s.check_invariants().unwrap();
}

#[test]
fn get_auto_ack_removes_at_once() {
    let mut q = Q::plain();
    assert_eq!(q.get(0, 0, true), (None, 0));
    let a = q.publish(0, None);
    q.publish(0, None);
    let (r, fx) = q.apply(Command::Get {
        now_ms: 0,
        lease_ms: 0,
        auto_ack: true,
    });
    assert_eq!(
        r,
        Reply::Got {
            delivery: Some(Delivery {
                consumer: GET_CONSUMER,
                id: a,
                delivery_count: 0,
                redelivered: false,
                lease_deadline_ms: None
            }),
            message_count: 1
        }
    );
    assert_eq!(
        fx,
        vec![
            Effect::Got {
                id: a,
                acquired_count: 0
            },
            Effect::DeleteBody { id: a }
        ]
    );
    assert_eq!(q.s.location(a), None);
}

#[test]
fn get_is_refused_on_single_active_consumer_queues() {
    let mut q = Q::with(|c| c.single_active_consumer = true);
    q.publish(0, None);
    let (r, _) = q.apply(Command::Get {
        now_ms: 0,
        lease_ms: 10,
        auto_ack: false,
    });
    assert!(matches!(r, Reply::Error { .. }));
    assert_eq!(q.s.counts().ready, 1);
}

// ----- consumers going away -----

#[test]
fn consumer_down_returns_its_messages_as_failed_deliveries() {
    let mut q = Q::plain();
    q.checkout(0, 1, 2);
    let a = q.publish(0, None);
    let b = q.publish(0, None);
    let c = q.publish(0, None);
    let (r, fx) = q.apply(Command::ConsumerDown {
        now_ms: 0,
        consumer: 1,
    });
    assert_eq!(r, Reply::Ok);
    assert!(fx.is_empty());
    assert_eq!(q.s.counts().consumers, 0);
    assert_eq!(q.s.ready_ids(), vec![a, b, c]);
    let fx = q.checkout(0, 2, 0);
    let d = full_deliveries(&fx);
    assert_eq!(
        d.iter()
            .map(|d| (d.id, d.delivery_count))
            .collect::<Vec<_>>(),
        vec![(a, 1), (b, 1), (c, 0)]
    );
    // unknown consumer: harmless
    let (r, fx) = q.apply(Command::ConsumerDown {
        now_ms: 0,
        consumer: 77,
    });
    assert_eq!((r, fx), (Reply::Ok, vec![]));
    // settling after being removed is refused
    q.apply(Command::ConsumerDown {
        now_ms: 0,
        consumer: 2,
    });
    let (r, _) = q.settle(0, 2, &[a], SettleOutcome::Ack);
    assert!(matches!(r, Reply::Error { .. }));
}

#[test]
fn node_down_removes_every_consumer_on_that_node() {
    let mut q = Q::plain();
    for (consumer, node) in [(1, 1), (2, 2), (3, 1)] {
        q.apply(Command::Checkout {
            now_ms: 0,
            consumer,
            node,
            prefetch: 1,
        });
    }
    let ids: Vec<_> = (0..3).map(|_| q.publish(0, None)).collect();
    let (_, fx) = q.apply(Command::NodeDown { now_ms: 0, node: 1 });
    assert!(deliveries(&fx).is_empty(), "consumer 2 is full");
    assert_eq!(q.s.consumers(), vec![(2, 2, 1, 1)]);
    assert_eq!(q.s.ready_ids(), vec![ids[0], ids[2]]);
}

#[test]
fn single_active_consumer_serves_only_the_earliest() {
    let mut q = Q::with(|c| c.single_active_consumer = true);
    q.checkout(0, 5, 2);
    q.checkout(0, 3, 0);
    let ids: Vec<_> = (0..4).map(|_| q.publish(0, None)).collect();
    assert_eq!(
        q.s.pending_deliveries()
            .iter()
            .map(|d| (d.consumer, d.id))
            .collect::<Vec<_>>(),
        vec![(5, ids[0]), (5, ids[1])]
    );
    assert_eq!(q.s.counts().ready, 2);
    let (_, fx) = q.apply(Command::ConsumerDown {
        now_ms: 0,
        consumer: 5,
    });
    assert_eq!(
        deliveries(&fx),
        vec![(3, ids[0]), (3, ids[1]), (3, ids[2]), (3, ids[3])]
    );
}

// ----- x-expires of the queue as a whole -----

fn expiring(expires_ms: u64) -> Q {
    Q::with(|c| c.expires_ms = Some(expires_ms))
}

#[test]
fn a_queue_never_used_expires_counting_from_its_leader_start() {
    let mut q = expiring(100);
    assert_eq!(q.s.last_used_ms(), 0);
    assert_eq!(q.s.queue_expiry_due_ms(50), Some(150));
    assert!(!q.expire_queue(149, 50));
    assert!(q.expire_queue(150, 50));
    // A leader that started later grants the queue more time.
    assert!(!q.expire_queue(150, 60));
    assert_eq!(q.s.queue_expiry_due_ms(60), Some(160));
}

#[test]
fn a_get_or_a_leaving_consumer_restarts_the_expiry() {
    let mut q = expiring(100);
    q.get(120, 10, true);
    assert_eq!(q.s.last_used_ms(), 120);
    assert_eq!(q.s.queue_expiry_due_ms(50), Some(220));
    assert!(!q.expire_queue(219, 50));
    q.checkout(200, 1, 0);
    q.apply(Command::ConsumerDown {
        now_ms: 300,
        consumer: 1,
    });
    assert_eq!(q.s.last_used_ms(), 300);
    assert_eq!(q.s.queue_expiry_due_ms(50), Some(400));
    assert!(!q.expire_queue(399, 50));
    assert!(q.expire_queue(400, 50));
}

#[test]
fn a_queue_with_a_consumer_or_without_x_expires_never_expires() {
    let mut q = expiring(100);
    q.checkout(0, 1, 0);
    assert_eq!(q.s.queue_expiry_due_ms(0), None);
    assert!(!q.expire_queue(1_000_000, 0));

    let mut q = Q::plain();
    assert_eq!(q.s.queue_expiry_due_ms(0), None);
    assert!(!q.expire_queue(1_000_000, 0));
}

#[test]
fn expiry_is_decided_where_the_command_lands_in_the_log() {
    // The leader saw the queue due at 100 and proposed ExpireQueue, but a consumer attached
    // first in the log: the queue is kept.
    let mut q = expiring(100);
    assert_eq!(q.s.queue_expiry_due_ms(0), Some(100));
    q.checkout(100, 1, 0);
    assert!(!q.expire_queue(100, 0));
}

#[test]
fn expire_queue_compares_its_own_time_not_the_queue_clock() {
    // A previous leader's clock ran ahead to 1000; the new leader (started at 500 by its own
    // clock) does not expire the queue before 500 + expires by that clock.
    let mut q = expiring(100);
    q.expire(1000);
    assert!(!q.expire_queue(550, 500));
    assert_eq!(q.s.clock_ms(), 1000, "time never goes backwards");
    assert!(q.expire_queue(600, 500));
}

#[test]
fn expire_queue_acts_as_expire_and_does_not_use_the_queue() {
    let mut a = Q::with(|c| {
        c.expires_ms = Some(50);
        c.message_ttl_ms = Some(10);
    });
    let m = a.publish(0, None);
    a.get(5, 3, false);
    let n = a.publish(6, None);
    let mut b = Q {
        s: a.s.clone(),
        index: a.index,
    };
    let fx_expire = b.expire(20);
    let (r, fx) = a.apply(Command::ExpireQueue {
        now_ms: 20,
        leader_since_ms: 0,
    });
    assert_eq!(r, Reply::QueueExpiry { expired: false });
    assert_eq!(fx, fx_expire);
    assert_eq!(dead(&fx), vec![(m, Reason::Expired), (n, Reason::Expired)]);
    assert_eq!(a.s, b.s);
    assert_eq!(a.s.last_used_ms(), 5, "only the Get used the queue");
    assert_eq!(a.s.clock_ms(), 20);
}

#[test]
fn command_and_reply_encodings_keep_their_variant_indexes() {
    // postcard writes the variant index first: logs written before ExpireQueue must decode the
    // same, so new variants go last.
    let enc = |c: &Command| postcard::to_allocvec(c).unwrap();
    assert_eq!(enc(&Command::Expire { now_ms: 5 }), vec![6, 5]);
    assert_eq!(enc(&Command::Purge), vec![8]);
    assert_eq!(
        enc(&Command::ExpireQueue {
            now_ms: 1,
            leader_since_ms: 2
        }),
        vec![10, 1, 2]
    );
    let enc = |r: &Reply| postcard::to_allocvec(r).unwrap();
    assert_eq!(enc(&Reply::Error { detail: "x".into() }), vec![7, 1, b'x']);
    assert_eq!(enc(&Reply::QueueExpiry { expired: true }), vec![8, 1]);
}

// ----- purge, settle errors, misc -----

#[test]
fn purge_removes_ready_messages_only() {
    let mut q = Q::plain();
    q.checkout(0, 1, 1);
    let a = q.publish(0, None);
    let b = q.publish(0, Some(100));
    let c = q.publish(0, None);
    let (r, fx) = q.apply(Command::Purge);
    assert_eq!(r, Reply::Purged { count: 2 });
    assert_eq!(
        fx,
        vec![Effect::DeleteBody { id: b }, Effect::DeleteBody { id: c }]
    );
    assert_eq!(q.s.message_ids(), vec![a]);
    assert_eq!(q.s.next_deadline(), None);
    assert_eq!(q.s.stats().dead_lettered_total(), 0);
}

#[test]
fn settle_of_an_unknown_id_is_refused_as_a_whole() {
    let mut q = Q::plain();
    q.checkout(0, 1, 0);
    q.checkout(0, 2, 0);
    let a = q.publish(0, None); // to consumer 1
    let b = q.publish(0, None); // to consumer 2
    let before = q.s.clone();
    let (r, fx) = q.settle(0, 1, &[a, b], SettleOutcome::Ack);
    assert_eq!(
        r,
        Reply::Error {
            detail: format!("unknown delivery tag {b}")
        }
    );
    assert!(fx.is_empty());
    let (r, _) = q.settle(0, 1, &[a, a], SettleOutcome::Ack);
    assert!(matches!(r, Reply::Error { .. }));
    // nothing changed apart from the applied index
    assert_eq!(q.s.pending_deliveries(), before.pending_deliveries());
    assert_eq!(q.s.stats(), before.stats());
    let (r, _) = q.settle(0, 1, &[], SettleOutcome::Ack);
    assert_eq!(r, Reply::Ok);
}

#[test]
fn consumer_id_zero_is_reserved() {
    let mut q = Q::plain();
    let (r, _) = q.apply(Command::Checkout {
        now_ms: 0,
        consumer: GET_CONSUMER,
        node: 1,
        prefetch: 1,
    });
    assert!(matches!(r, Reply::Error { .. }));
    assert_eq!(q.s.counts().consumers, 0);
}

#[test]
#[should_panic(expected = "not after last applied")]
fn apply_index_must_increase() {
    let mut s = QueueState::new(QueueConfig::new("/", "q"));
    s.apply(5, Command::Purge);
    s.apply(5, Command::Purge);
}

#[test]
fn message_ids_are_log_indexes() {
    let mut s = QueueState::new(QueueConfig::new("/", "q"));
    let (r, _) = s.apply(
        42,
        Command::Enqueue {
            now_ms: 0,
            header: MsgHeader {
                size_bytes: 3,
                expiration_ms: None,
            },
            publish_key: None,
            dedup_key: None,
        },
    );
    assert_eq!(r, Reply::Enqueued { id: 42 });
    assert_eq!(s.last_applied(), 42);
}

#[test]
fn snapshot_round_trip_and_digest() {
    let mut q = at_least_once(10);
    q.publish(0, Some(500));
    q.checkout(0, 1, 1);
    let b = q.publish(0, None);
    q.publish(0, None);
    assert_eq!(q.get(1, 100, false).0.unwrap().id, b);
    let bytes = postcard::to_allocvec(&q.s).unwrap();
    let restored: QueueState = postcard::from_bytes(&bytes).unwrap();
    restored.check_invariants().unwrap();
    assert_eq!(restored, q.s);
    assert_eq!(restored.digest(), q.s.digest());
    let mut other = q.s.clone();
    other.apply(q.index + 1, Command::Purge);
    assert_ne!(other.digest(), q.s.digest());
}

// ----- delayed requeue -----

fn requeue_after(delay_ms: u64) -> SettleOutcome {
    SettleOutcome::RequeueAfter { delay_ms }
}

#[test]
fn requeue_with_a_delay_is_not_delivered_before_it() {
    let mut q = Q::plain();
    let a = q.publish(0, None);
    let fx = q.checkout(0, 1, 0);
    assert_eq!(deliveries(&fx), vec![(1, a)]);
    let (r, fx) = q.settle(10, 1, &[a], requeue_after(100));
    assert_eq!(r, Reply::Ok);
    assert!(
        deliveries(&fx).is_empty(),
        "delayed, so not delivered at once"
    );
    assert_eq!(q.s.location(a), Some(Location::Delayed { due_ms: 110 }));
    let c = q.s.counts();
    assert_eq!(
        (c.ready, c.unacked, c.delayed, c.delayed_bytes),
        (0, 0, 1, 10)
    );
    assert_eq!(
        q.s.next_deadline(),
        Some(110),
        "the leader's timer is armed for it"
    );
    assert!(deliveries(&q.expire(109)).is_empty(), "one ms early");
    // A command other than Expire that carries the time releases it too.
    let b = q.publish(50, None);
    assert_eq!(q.s.location(b), Some(Location::Unacked { consumer: 1 }));
    let d = full_deliveries(&q.expire(110));
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].id, d[0].redelivered, d[0].delivery_count),
        (a, true, 1)
    );
    assert_eq!(q.s.counts().delayed, 0);
    assert_eq!(q.s.next_deadline(), None);
}

#[test]
fn get_does_not_take_a_delayed_message_before_its_time() {
    let mut q = Q::plain();
    let a = q.publish(0, None);
    let (d, _) = q.get(0, 1_000, false);
    let d = d.unwrap();
    let (r, _) = q.settle(5, GET_CONSUMER, &[d.id], requeue_after(50));
    assert_eq!(r, Reply::Ok);
    assert_eq!(q.get(54, 1_000, true), (None, 0));
    let (d, _) = q.get(55, 1_000, true);
    assert_eq!(d.map(|d| (d.id, d.delivery_count)), Some((a, 1)));
}

#[test]
fn delayed_messages_keep_their_order_and_go_before_fresh_ones() {
    let mut q = Q::plain();
    let ids: Vec<_> = (0..3).map(|_| q.publish(0, None)).collect();
    q.checkout(0, 1, 0);
    // Requeued in the order c, a, b, all with the same delay; a fourth with a shorter one.
    q.settle(1, 1, &[ids[2], ids[0], ids[1]], requeue_after(100));
    let (_, fx) = q.apply(Command::ConsumerDown {
        now_ms: 2,
        consumer: 1,
    });
    assert!(fx.is_empty());
    let late = q.publish(3, None);
    assert_eq!(q.s.ready_ids(), vec![late], "the delayed ones wait");
    q.expire(101);
    assert_eq!(q.s.ready_ids(), vec![ids[2], ids[0], ids[1], late]);
    // Browse shows them in that order without taking them.
    let b = q.s.browse(1, 2, u64::MAX);
    assert_eq!(
        b.iter().map(|b| (b.position, b.id)).collect::<Vec<_>>(),
        vec![(1, ids[0]), (2, ids[1])]
    );
    assert!(b.iter().all(|b| b.redelivered && b.delivery_count == 1));
    assert_eq!(q.s.counts().ready, 4);
}

#[test]
fn requeue_delays_follow_the_delivery_count_then_the_delivery_limit() {
    let mut q = Q::with(|c| {
        c.requeue_delays_ms = vec![100, 1_000];
        c.delivery_limit = Some(3);
        c.dead_letter_strategy = Strategy::AtMostOnce;
    });
    let a = q.publish(0, None);
    q.checkout(0, 1, 0);
    let mut now = 0;
    // After failed delivery n the delay is entry n-1; the last one repeats.
    for expected_delay in [100, 1_000, 1_000] {
        let (r, fx) = q.settle(now, 1, &[a], SettleOutcome::Requeue);
        assert_eq!(r, Reply::Ok);
        assert!(fx.is_empty());
        assert_eq!(
            q.s.location(a),
            Some(Location::Delayed {
                due_ms: now + expected_delay
            })
        );
        assert!(deliveries(&q.expire(now + expected_delay - 1)).is_empty());
        now += expected_delay;
        assert_eq!(deliveries(&q.expire(now)), vec![(1, a)]);
    }
    // The fourth failed delivery is past the limit of 3: it dies instead of waiting.
    let (_, fx) = q.settle(now, 1, &[a], SettleOutcome::Requeue);
    assert_eq!(dead(&fx), vec![(a, Reason::DeliveryLimit)]);
    assert_eq!(q.s.location(a), None);
}

#[test]
fn a_delay_named_by_the_consumer_overrides_the_queue_delays() {
    let mut q = Q::with(|c| c.requeue_delays_ms = vec![60_000]);
    let a = q.publish(0, None);
    q.checkout(0, 1, 0);
    let (_, fx) = q.settle(1, 1, &[a], requeue_after(0));
    assert_eq!(deliveries(&fx), vec![(1, a)], "0: at once");
    // Returns that are not requeues (consumer down, lapsed lease) are not delayed.
    let (_, fx) = q.apply(Command::ConsumerDown {
        now_ms: 2,
        consumer: 1,
    });
    assert!(fx.is_empty());
    assert_eq!(q.s.location(a), Some(Location::Ready));
}

#[test]
fn a_delayed_message_expires_at_its_ttl() {
    let mut q = Q::with(|c| c.dead_letter_strategy = Strategy::AtMostOnce);
    let a = q.publish(0, Some(50));
    q.checkout(0, 1, 0);
    q.settle(10, 1, &[a], requeue_after(1_000));
    assert_eq!(q.s.next_deadline(), Some(50), "the TTL comes first");
    let fx = q.expire(50);
    assert_eq!(dead(&fx), vec![(a, Reason::Expired)]);
    assert_eq!(q.s.counts().delayed, 0);
}

#[test]
fn delayed_messages_count_against_limits_and_are_purged() {
    let mut q = Q::with(|c| {
        c.max_length = Some(1);
        c.overflow = Overflow::RejectPublish;
    });
    let a = q.publish(0, None);
    q.checkout(0, 1, 1);
    q.settle(1, 1, &[a], requeue_after(1_000));
    q.apply(Command::ConsumerDown {
        now_ms: 1,
        consumer: 1,
    });
    let (r, _) = q.publish_full(2, 10, None);
    assert!(matches!(r, Reply::Rejected { .. }), "{r:?}");
    let (r, fx) = q.apply(Command::Purge);
    assert_eq!(r, Reply::Purged { count: 1 });
    assert_eq!(deleted(&fx), vec![a]);
    assert_eq!(q.s.next_deadline(), None);
}

#[test]
fn settle_options_out_of_bounds_are_refused_at_apply() {
    let mut q = Q::plain();
    let a = q.publish(0, None);
    q.checkout(0, 1, 0);
    let before = q.s.clone();
    for outcome in [
        SettleOutcome::RejectWithDetail {
            detail: "x".repeat(1025),
        },
        requeue_after(7 * 24 * 3600 * 1000 + 1),
    ] {
        let (r, fx) = q.settle(5, 1, &[a], outcome);
        assert!(matches!(r, Reply::Error { .. }), "{r:?}");
        assert!(fx.is_empty());
    }
    assert_eq!(q.s.location(a), Some(Location::Unacked { consumer: 1 }));
    assert_eq!(q.s.digest(), before.digest(), "nothing applied");
    let mut c = QueueConfig::new("/", "q");
    c.requeue_delays_ms = vec![1; 33];
    let (r, _) = q.apply(Command::UpdateConfig {
        now_ms: 5,
        config: c,
    });
    assert!(matches!(r, Reply::Error { .. }), "{r:?}");
    // At the bound it is accepted.
    let detail = "é".repeat(512);
    assert_eq!(detail.len(), 1024);
    let (r, _) = q.settle(6, 1, &[a], SettleOutcome::RejectWithDetail { detail });
    assert_eq!(r, Reply::Ok);
}

// ----- reject with a reason detail -----

#[test]
fn reject_detail_travels_with_the_dead_letter() {
    let mut q = Q::with(|c| c.dead_letter_strategy = Strategy::AtMostOnce);
    let a = q.publish(0, None);
    q.checkout(0, 1, 0);
    let detail = "missing customer id".to_string();
    let (_, fx) = q.settle(
        3,
        1,
        &[a],
        SettleOutcome::RejectWithDetail {
            detail: detail.clone(),
        },
    );
    assert_eq!(
        fx,
        vec![Effect::DeadLetter {
            id: a,
            reason: Reason::Rejected,
            strategy: Strategy::AtMostOnce,
            died_at_ms: 3,
            detail: Some(detail.clone()),
        }]
    );

    // At-least-once keeps it with the held dead letter, for a transfer by any later leader.
    let mut q = Q::with(|c| {
        c.dead_letter_strategy = Strategy::AtLeastOnce;
        c.overflow = Overflow::RejectPublish;
    });
    let a = q.publish(0, None);
    q.checkout(0, 1, 0);
    q.settle(
        3,
        1,
        &[a],
        SettleOutcome::RejectWithDetail {
            detail: detail.clone(),
        },
    );
    let held = q.s.held_dead_letters();
    assert_eq!(held[0].detail.as_deref(), Some(detail.as_str()));
    let snapshot = postcard::to_allocvec(&q.s).unwrap();
    let restored: QueueState = postcard::from_bytes(&snapshot).unwrap();
    assert_eq!(restored.held_dead_letters(), held);
}

// ----- browse and age -----

#[test]
fn browse_reads_ready_messages_without_taking_them() {
    let mut q = Q::plain();
    let ids: Vec<_> = (0..5).map(|i| q.publish(i * 10, None)).collect();
    let digest = q.s.digest();
    let all = q.s.browse(0, 100, u64::MAX);
    assert_eq!(all.iter().map(|b| b.id).collect::<Vec<_>>(), ids);
    assert_eq!(
        all.iter().map(|b| b.enqueued_ms).collect::<Vec<_>>(),
        vec![0, 10, 20, 30, 40]
    );
    assert_eq!(q.s.browse(3, 10, u64::MAX).len(), 2);
    assert!(q.s.browse(5, 10, u64::MAX).is_empty());
    assert!(q.s.browse(u64::MAX, 10, u64::MAX).is_empty());
    // A byte bound cuts the page (messages are 10 bytes here) but never to nothing.
    assert_eq!(q.s.browse(0, 100, 25).len(), 2);
    assert_eq!(q.s.browse(0, 100, 30).len(), 3);
    assert_eq!(q.s.browse(4, 100, 1).len(), 1);
    assert_eq!(q.s.browse(1, 100, 0).len(), 1);
    assert_eq!(q.s.digest(), digest, "browsing changes nothing");
    assert_eq!(q.s.oldest_ready_enqueued_ms(), Some(0));
    // The oldest ready message by enqueue time, wherever it sits in dispatch order.
    let (d, _) = q.get(50, 1_000, false);
    assert_eq!(d.unwrap().id, ids[0]);
    assert_eq!(q.s.oldest_ready_enqueued_ms(), Some(10));
    q.apply(Command::Expire { now_ms: 2_000 }); // the lease lapses: ids[0] returns
    assert_eq!(q.s.ready_ids()[0], ids[0]);
    assert_eq!(q.s.oldest_ready_enqueued_ms(), Some(0));
    q.apply(Command::Purge);
    assert_eq!(q.s.oldest_ready_enqueued_ms(), None);
}
