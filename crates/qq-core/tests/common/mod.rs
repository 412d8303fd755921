//! Helpers shared by the queue state machine's test files. Each test file is its own crate
//! and uses a part of them.
#![allow(dead_code)]

use qq_core::queue::{Command, Effect, MsgHeader, QueueState, Reply};
use qq_core::types::{ConsumerId, MessageId, QueueConfig};

/// A queue at machine version 2 (which has CancelConsumer, consumer priorities and timeouts:
/// its leader moves it there once every member runs a release that has it), applied one
/// command per index with the invariants checked after each.
pub struct Q {
    pub s: QueueState,
    pub index: u64,
}

impl Q {
    pub fn new(single_active_consumer: bool) -> Q {
        let mut config = QueueConfig::new("/", "q");
        config.single_active_consumer = single_active_consumer;
        let mut q = Q {
            s: QueueState::new(config),
            index: 0,
        };
        let (reply, _) = q.apply(Command::SetMachineVersion { version: 2 });
        assert_eq!(reply, Reply::Ok);
        q
    }

    pub fn apply(&mut self, cmd: Command) -> (Reply, Vec<Effect>) {
        self.index += 1;
        let out = self.s.apply(self.index, cmd);
        self.s.check_invariants().unwrap();
        out
    }

    /// Publishes a 10-byte message; returns its deliveries.
    pub fn publish(&mut self) -> Vec<(ConsumerId, MessageId)> {
        let (reply, fx) = self.apply(Command::Enqueue {
            now_ms: 1,
            header: MsgHeader {
                size_bytes: 10,
                expiration_ms: None,
            },
            publish_key: None,
            dedup_key: None,
        });
        assert!(matches!(reply, Reply::Enqueued { .. }), "{reply:?}");
        deliveries(&fx)
    }

    /// Publishes a 10-byte message of `priority` (machine version 2's `EnqueueWithPriority`);
    /// returns its id.
    pub fn publish_with_priority(&mut self, priority: u8, ttl_ms: Option<u64>) -> MessageId {
        self.publish_delivered(priority, ttl_ms).0
    }

    /// As [`Q::publish_with_priority`], with what was delivered at once.
    pub fn publish_delivered(
        &mut self,
        priority: u8,
        ttl_ms: Option<u64>,
    ) -> (MessageId, Vec<(ConsumerId, MessageId)>) {
        let (reply, fx) = self.apply(Command::EnqueueWithPriority {
            now_ms: 1,
            header: MsgHeader {
                size_bytes: 10,
                expiration_ms: ttl_ms,
            },
            publish_key: None,
            dedup_key: None,
            priority,
        });
        match reply {
            Reply::Enqueued { id } => (id, deliveries(&fx)),
            other => panic!("{other:?}"),
        }
    }
}

/// The (consumer, message) of every delivery among `fx`, in order.
pub fn deliveries(fx: &[Effect]) -> Vec<(ConsumerId, MessageId)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Deliver(d) => Some((d.consumer, d.id)),
            _ => None,
        })
        .collect()
}
