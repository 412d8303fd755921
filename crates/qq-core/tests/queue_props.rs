//! Property tests of the queue state machine (after RabbitMQ's `rabbit_fifo_prop_SUITE`):
//! random command sequences, with message conservation, credit, limits and timers checked after
//! every step, and snapshot + replay checked against a straight run.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use qq_core::queue::{
    Command, Effect, FIRST_MACHINE_VERSION, GET_CONSUMER, Location, MACHINE_VERSION, MoveState,
    MsgHeader, QueueState, Reply, SettleOutcome,
};
use qq_core::types::{
    ConsumerId, MessageId, Overflow, QueueConfig, Reason, Strategy as DlStrategy,
};

/// An abstract step; ids to settle are resolved against the state when it is applied.
#[derive(Clone, Debug)]
enum Op {
    Enqueue {
        dt: u64,
        size: u64,
        expiration_ms: Option<u64>,
        publisher: Option<(u64, u64)>,
        key: Option<u8>,
        /// Some: `EnqueueWithPriority` (5 and up is high).
        priority: Option<u8>,
    },
    Checkout {
        dt: u64,
        consumer: ConsumerId,
        node: u64,
        prefetch: u32,
    },
    CheckoutWithPriority {
        dt: u64,
        consumer: ConsumerId,
        node: u64,
        prefetch: u32,
        priority: i32,
    },
    /// Settle ids the consumer holds (picked by these selectors).
    SettleHeld {
        dt: u64,
        consumer: ConsumerId,
        picks: Vec<usize>,
        outcome: SettleOutcome,
    },
    /// Settle arbitrary ids (usually refused).
    SettleAny {
        dt: u64,
        consumer: ConsumerId,
        ids: Vec<MessageId>,
        outcome: SettleOutcome,
    },
    ConsumerDown {
        dt: u64,
        consumer: ConsumerId,
    },
    CancelConsumer {
        dt: u64,
        consumer: ConsumerId,
    },
    /// Move the machine to this version (0 and MACHINE_VERSION + 1 are refused).
    SetMachineVersion {
        version: u32,
    },
    SetConsumerTimeout {
        timeout_ms: Option<u64>,
    },
    NodeDown {
        dt: u64,
        node: u64,
    },
    Get {
        dt: u64,
        lease_ms: u64,
        auto_ack: bool,
    },
    Expire {
        dt: u64,
    },
    /// `lag` > 0: a new leader whose clock is behind the queue's. The leader started
    /// `since_back` before (or `since_ahead` after) the queue's clock.
    ExpireQueue {
        dt: u64,
        lag: u64,
        since_back: u64,
        since_ahead: u64,
    },
    DeadLetterSettle {
        picks: Vec<usize>,
        stray: Option<MessageId>,
    },
    Purge,
    UpdateConfig {
        dt: u64,
        config: QueueConfig,
    },
    /// A move task of up to `max` messages (0: all ready).
    StartMove {
        dt: u64,
        max: u64,
    },
    /// The running (or last) task's MoveDone for some ready messages, plus maybe a stray id.
    MoveDone {
        picks: Vec<usize>,
        stray: Option<MessageId>,
    },
    CancelMove,
}

fn outcome() -> impl Strategy<Value = SettleOutcome> {
    prop_oneof![
        3 => Just(SettleOutcome::Ack),
        2 => Just(SettleOutcome::Requeue),
        1 => Just(SettleOutcome::Reject),
        2 => prop_oneof![Just(0u64), 1u64..150]
            .prop_map(|delay_ms| SettleOutcome::RequeueAfter { delay_ms }),
        1 => "[a-z é]{0,12}".prop_map(|detail| SettleOutcome::RejectWithDetail { detail }),
        2 => Just(SettleOutcome::Release),
    ]
}

fn config() -> impl Strategy<Value = QueueConfig> {
    (
        prop_oneof![Just(None), Just(Some(0u64)), Just(Some(3)), Just(Some(6))],
        prop_oneof![Just(None), Just(Some(60u64)), Just(Some(200))],
        prop_oneof![
            Just(Overflow::DropHead),
            Just(Overflow::RejectPublish),
            Just(Overflow::RejectPublishDlx)
        ],
        prop_oneof![
            Just(DlStrategy::Disabled),
            Just(DlStrategy::AtMostOnce),
            Just(DlStrategy::AtLeastOnce)
        ],
        prop_oneof![Just(None), Just(Some(0u64)), Just(Some(2)), Just(Some(20))],
        prop_oneof![
            Just(None),
            Just(Some(0u64)),
            Just(Some(25)),
            Just(Some(100))
        ],
        prop::bool::weighted(0.2),
        prop_oneof![
            Just(None),
            Just(Some(0u64)),
            Just(Some(30)),
            Just(Some(150))
        ],
        prop_oneof![
            2 => Just(Vec::new()),
            1 => Just(vec![30u64]),
            1 => Just(vec![0u64, 40, 90]),
        ],
        prop_oneof![3 => Just(600_000u64), 1 => Just(1_000), 1 => Just(150)],
    )
        .prop_map(
            |(max_len, max_bytes, overflow, strategy, limit, ttl, sac, expires, delays, window)| {
                let mut c = QueueConfig::new("/", "q");
                c.max_length = max_len;
                c.max_length_bytes = max_bytes;
                c.overflow = overflow;
                c.dead_letter_strategy = strategy;
                c.delivery_limit = limit;
                c.message_ttl_ms = ttl;
                c.single_active_consumer = sac;
                c.expires_ms = expires;
                c.requeue_delays_ms = delays;
                c.dedup_window_ms = window;
                c
            },
        )
}

fn dt() -> impl Strategy<Value = u64> {
    prop_oneof![3 => Just(0u64), 3 => 1u64..10, 1 => 10u64..120]
}

fn op() -> impl Strategy<Value = Op> {
    let consumer = 1u64..=4;
    prop_oneof![
        8 => (dt(), 1u64..40, prop::option::weighted(0.3, 0u64..80),
              prop::option::weighted(0.4, (0u64..3, 0u64..12)),
              prop::option::weighted(0.2, 0u8..6), prop::option::weighted(0.3, 0u8..10))
            .prop_map(|(dt, size, expiration_ms, publisher, key, priority)| Op::Enqueue {
                dt, size, expiration_ms, publisher, key, priority }),
        3 => (dt(), consumer.clone(), 1u64..=2, 0u32..4)
            .prop_map(|(dt, consumer, node, prefetch)| Op::Checkout { dt, consumer, node, prefetch }),
        2 => (dt(), consumer.clone(), 1u64..=2, 0u32..4, -1i32..=2)
            .prop_map(|(dt, consumer, node, prefetch, priority)| Op::CheckoutWithPriority {
                dt, consumer, node, prefetch, priority }),
        6 => (dt(), 0u64..=4, prop::collection::vec(any::<usize>(), 0..4), outcome())
            .prop_map(|(dt, consumer, picks, outcome)| Op::SettleHeld { dt, consumer, picks, outcome }),
        1 => (dt(), 0u64..=4, prop::collection::vec(0u64..80, 0..3), outcome())
            .prop_map(|(dt, consumer, ids, outcome)| Op::SettleAny { dt, consumer, ids, outcome }),
        1 => (dt(), 0u64..=4).prop_map(|(dt, consumer)| Op::ConsumerDown { dt, consumer }),
        1 => (dt(), consumer.clone()).prop_map(|(dt, consumer)| Op::CancelConsumer { dt, consumer }),
        2 => (0u32..=MACHINE_VERSION + 1).prop_map(|version| Op::SetMachineVersion { version }),
        1 => prop::option::weighted(0.8, 1u64..60)
            .prop_map(|timeout_ms| Op::SetConsumerTimeout { timeout_ms }),
        1 => (dt(), 1u64..=2).prop_map(|(dt, node)| Op::NodeDown { dt, node }),
        2 => (dt(), 1u64..60, any::<bool>())
            .prop_map(|(dt, lease_ms, auto_ack)| Op::Get { dt, lease_ms, auto_ack }),
        2 => dt().prop_map(|dt| Op::Expire { dt }),
        2 => (dt(), prop_oneof![4 => Just(0u64), 1 => 1u64..100], 0u64..300, 0u64..50)
            .prop_map(|(dt, lag, since_back, since_ahead)| Op::ExpireQueue {
                dt, lag, since_back, since_ahead }),
        2 => (prop::collection::vec(any::<usize>(), 0..3), prop::option::weighted(0.2, 0u64..80))
            .prop_map(|(picks, stray)| Op::DeadLetterSettle { picks, stray }),
        1 => Just(Op::Purge),
        1 => (dt(), config()).prop_map(|(dt, config)| Op::UpdateConfig { dt, config }),
        1 => (dt(), 0u64..4).prop_map(|(dt, max)| Op::StartMove { dt, max }),
        2 => (prop::collection::vec(any::<usize>(), 0..3), prop::option::weighted(0.2, 0u64..80))
            .prop_map(|(picks, stray)| Op::MoveDone { picks, stray }),
        1 => Just(Op::CancelMove),
    ]
}

fn pick_ids(candidates: &[MessageId], picks: &[usize]) -> Vec<MessageId> {
    let mut out = Vec::new();
    if candidates.is_empty() {
        return out;
    }
    for p in picks {
        let id = candidates[p % candidates.len()];
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

/// The newest move task's number (0, unknown, when there is none).
fn last_task(s: &QueueState) -> u64 {
    s.moves().keys().next_back().copied().unwrap_or(0)
}

/// Turn an abstract step into a command against the current state.
fn resolve(s: &QueueState, op: &Op) -> Command {
    let t = s.clock_ms();
    match op.clone() {
        Op::Enqueue {
            dt,
            size,
            expiration_ms,
            publisher,
            key,
            priority,
        } => {
            let header = MsgHeader {
                size_bytes: size,
                expiration_ms,
            };
            let publish_key = publisher.map(|(p, seq)| format!("pub{p}\0{seq}"));
            let dedup_key = key.map(|k| format!("key-{k}"));
            match priority {
                None => Command::Enqueue {
                    now_ms: t + dt,
                    header,
                    publish_key,
                    dedup_key,
                },
                Some(priority) => Command::EnqueueWithPriority {
                    now_ms: t + dt,
                    header,
                    publish_key,
                    dedup_key,
                    priority,
                },
            }
        }
        Op::CheckoutWithPriority {
            dt,
            consumer,
            node,
            prefetch,
            priority,
        } => Command::CheckoutWithPriority {
            now_ms: t + dt,
            consumer,
            node,
            prefetch,
            priority,
        },
        Op::Checkout {
            dt,
            consumer,
            node,
            prefetch,
        } => Command::Checkout {
            now_ms: t + dt,
            consumer,
            node,
            prefetch,
        },
        Op::SettleHeld {
            dt,
            consumer,
            picks,
            outcome,
        } => {
            let held: Vec<MessageId> = s
                .message_ids()
                .into_iter()
                .filter(|id| s.location(*id) == Some(Location::Unacked { consumer }))
                .collect();
            Command::Settle {
                now_ms: t + dt,
                consumer,
                ids: pick_ids(&held, &picks),
                outcome,
            }
        }
        Op::SettleAny {
            dt,
            consumer,
            ids,
            outcome,
        } => Command::Settle {
            now_ms: t + dt,
            consumer,
            ids,
            outcome,
        },
        Op::ConsumerDown { dt, consumer } => Command::ConsumerDown {
            now_ms: t + dt,
            consumer,
        },
        Op::CancelConsumer { dt, consumer } => Command::CancelConsumer {
            now_ms: t + dt,
            consumer,
        },
        Op::SetMachineVersion { version } => Command::SetMachineVersion { version },
        Op::SetConsumerTimeout { timeout_ms } => Command::SetConsumerTimeout { timeout_ms },
        Op::NodeDown { dt, node } => Command::NodeDown {
            now_ms: t + dt,
            node,
        },
        Op::Get {
            dt,
            lease_ms,
            auto_ack,
        } => Command::Get {
            now_ms: t + dt,
            lease_ms,
            auto_ack,
        },
        Op::Expire { dt } => Command::Expire { now_ms: t + dt },
        Op::ExpireQueue {
            dt,
            lag,
            since_back,
            since_ahead,
        } => Command::ExpireQueue {
            now_ms: (t + dt).saturating_sub(lag),
            leader_since_ms: (t + since_ahead).saturating_sub(since_back),
        },
        Op::DeadLetterSettle { picks, stray } => {
            let held: Vec<MessageId> = s.held_dead_letters().iter().map(|h| h.id).collect();
            let mut ids = pick_ids(&held, &picks);
            ids.extend(stray);
            Command::DeadLetterSettle { ids }
        }
        Op::Purge => Command::Purge,
        Op::UpdateConfig { dt, config } => Command::UpdateConfig {
            now_ms: t + dt,
            config,
        },
        Op::StartMove { dt, max } => Command::StartMove {
            now_ms: t + dt,
            destination: "elsewhere".into(),
            max_messages: max,
            max_per_second: 0,
        },
        Op::MoveDone { picks, stray } => {
            let mut ids = pick_ids(&s.ready_ids(), &picks);
            ids.extend(stray);
            Command::MoveDone {
                task: last_task(s),
                ids,
            }
        }
        Op::CancelMove => Command::EndMove {
            task: last_task(s),
            state: MoveState::Cancelled,
            detail: "cancelled".into(),
        },
    }
}

/// What the test knows from replies and effects alone.
#[derive(Default)]
struct Model {
    live: BTreeSet<MessageId>,
    gone: BTreeSet<MessageId>,
    delivered: BTreeSet<MessageId>,
    /// Largest id ever handed out on a first delivery, per priority level (0 normal, 1 high;
    /// a queue with strict levels: its level).
    last_first_delivery: BTreeMap<u8, MessageId>,
    /// The level of each message that arrived above level 0.
    levels: BTreeMap<MessageId, u8>,
    /// Requeued with a delay: not to be delivered before this time.
    not_before: BTreeMap<MessageId, u64>,
    /// Idempotency keys of stored messages ((publish or transfer, key) -> stored at ms).
    keys: BTreeMap<(bool, String), u64>,
}

impl Model {
    fn arrive(&mut self, id: MessageId) -> Result<(), TestCaseError> {
        prop_assert!(
            !self.live.contains(&id) && !self.gone.contains(&id),
            "id {id} reused"
        );
        self.live.insert(id);
        Ok(())
    }

    fn leave(&mut self, id: MessageId) -> Result<(), TestCaseError> {
        prop_assert!(self.live.remove(&id), "id {id} left but was not live");
        self.not_before.remove(&id);
        self.gone.insert(id);
        Ok(())
    }

    fn deliver(&mut self, id: MessageId, redelivered: bool, now: u64) -> Result<(), TestCaseError> {
        prop_assert!(self.live.contains(&id), "delivered {id} that is not live");
        if let Some(due) = self.not_before.remove(&id) {
            prop_assert!(now >= due, "delayed {id} delivered at {now}, before {due}");
        }
        prop_assert_eq!(
            redelivered,
            self.delivered.contains(&id),
            "redelivered flag of {}",
            id
        );
        if !redelivered {
            // FIFO within each priority level.
            let level = self.levels.get(&id).copied().unwrap_or(0);
            let last = self.last_first_delivery.entry(level).or_insert(0);
            prop_assert!(
                id > *last,
                "first deliveries out of FIFO order (level {})",
                level
            );
            *last = id;
        }
        self.delivered.insert(id);
        Ok(())
    }
}

/// Check one applied step: the reply and effects against the model, then the state.
fn check_step(
    model: &mut Model,
    before: &QueueState,
    cmd: &Command,
    reply: &Reply,
    effects: &[Effect],
    s: &QueueState,
) -> Result<(), TestCaseError> {
    // Dedup: exact within the window, each kind of key on its own.
    if let Command::Enqueue {
        publish_key,
        dedup_key,
        ..
    }
    | Command::EnqueueWithPriority {
        publish_key,
        dedup_key,
        ..
    } = cmd
        && !gated(before, cmd)
    {
        let now = s.clock_ms();
        let cutoff = now.saturating_sub(s.config().dedup_window_ms);
        model.keys.retain(|_, at| *at >= cutoff);
        let keys: Vec<(bool, String)> = [(true, publish_key), (false, dedup_key)]
            .into_iter()
            .filter_map(|(kind, k)| k.clone().map(|k| (kind, k)))
            .collect();
        let seen = keys.iter().any(|k| model.keys.contains_key(k));
        prop_assert_eq!(
            *reply == Reply::Duplicate,
            seen,
            "duplicate answer disagrees with the keys seen in the window"
        );
        if matches!(reply, Reply::Enqueued { .. }) {
            for k in keys {
                model.keys.insert(k, now);
            }
        }
    }
    match reply {
        Reply::Enqueued { id } | Reply::RejectedDeadLettered { id, .. } => {
            if let Command::EnqueueWithPriority { priority, .. } = cmd {
                let level = match before.max_priority() {
                    Some(max) => (*priority).min(max),
                    None => u8::from(*priority >= qq_core::queue::HIGH_PRIORITY_FROM),
                };
                if level > 0 {
                    model.levels.insert(*id, level);
                }
            }
            model.arrive(*id)?
        }
        Reply::Got {
            delivery: Some(d), ..
        } => {
            prop_assert_eq!(d.consumer, GET_CONSUMER);
            model.deliver(d.id, d.redelivered, s.clock_ms())?;
        }
        // A command of a later machine version changes nothing at all (checked below): the
        // replicas of an older release cannot decode it and leave even the time alone.
        Reply::Error { .. } if gated(before, cmd) => {}
        Reply::Error { .. } => {
            // A refused command changes nothing but the time: it acts exactly as an Expire.
            let now_ms = s.clock_ms();
            let mut expire_only = before.clone();
            let (r, fx) = expire_only.apply(s.last_applied(), Command::Expire { now_ms });
            prop_assert_eq!(r, Reply::Ok);
            prop_assert_eq!(&fx[..], effects, "a refused command has effects of its own");
            prop_assert_eq!(&expire_only, s, "a refused command changed the state");
            prop_assert!(
                matches!(
                    cmd,
                    Command::Settle { .. }
                        | Command::Get { .. }
                        | Command::ConsumerDown { .. }
                        // a second task while one runs; an unknown task
                        | Command::StartMove { .. }
                        | Command::MoveDone { .. }
                        | Command::EndMove { .. }
                        // a version this release does not have
                        | Command::SetMachineVersion { .. }
                ),
                "unexpected refusal of {:?}",
                cmd
            );
        }
        _ => {}
    }
    if let Command::ExpireQueue {
        now_ms,
        leader_since_ms,
    } = *cmd
    {
        // The x-expires rule, from the state before the command, or, when consumers timed out
        // as its timers fired, from the state after them (they left now: a use of the queue).
        // (A cancelled consumer that still holds messages keeps the queue in use.)
        let timed_out = effects
            .iter()
            .any(|e| matches!(e, Effect::ConsumerTimedOut { .. }));
        let basis = if timed_out { s } else { before };
        let expired = before.config().expires_ms.is_some_and(|e| {
            basis.consumers().is_empty() && now_ms >= basis.last_used_ms().max(leader_since_ms) + e
        });
        prop_assert_eq!(reply, &Reply::QueueExpiry { expired });
        // Otherwise it acts exactly as an Expire at the same time (and does not use the queue).
        let mut expire_only = before.clone();
        let (r, fx) = expire_only.apply(s.last_applied(), Command::Expire { now_ms });
        prop_assert_eq!(r, Reply::Ok);
        prop_assert_eq!(&fx[..], effects, "ExpireQueue has effects of its own");
        prop_assert_eq!(
            &expire_only,
            s,
            "ExpireQueue changed the state unlike Expire"
        );
    }
    // The due time of x-expires is exactly where ExpireQueue starts answering expired.
    let leader_since_ms = s.clock_ms() / 2;
    if let Some(due_ms) = s.queue_expiry_due_ms(leader_since_ms) {
        let e = s.config().expires_ms;
        prop_assert!(s.consumers().is_empty());
        prop_assert_eq!(
            Some(due_ms),
            e.map(|e| s.last_used_ms().max(leader_since_ms) + e)
        );
        for (now_ms, expected) in [(due_ms.saturating_sub(1), due_ms == 0), (due_ms, true)] {
            let mut probe = s.clone();
            let (r, _) = probe.apply(
                s.last_applied() + 1,
                Command::ExpireQueue {
                    now_ms,
                    leader_since_ms,
                },
            );
            prop_assert_eq!(r, Reply::QueueExpiry { expired: expected });
        }
    } else {
        prop_assert!(s.config().expires_ms.is_none() || !s.consumers().is_empty());
    }
    // A running move task holds the ready messages: nothing is delivered while one runs (it
    // started before this step and still runs after it), and MoveDone removes only ready ones.
    if before.running_move().is_some() && s.running_move().is_some() {
        let delivered = effects.iter().any(|e| matches!(e, Effect::Deliver(_)))
            || matches!(
                reply,
                Reply::Got {
                    delivery: Some(_),
                    ..
                }
            );
        prop_assert!(!delivered, "delivered while a move task runs");
    }
    if let Command::MoveDone { ids, .. } = cmd {
        for e in effects {
            if let Effect::DeleteBody { id } = e
                && ids.contains(id)
            {
                prop_assert_eq!(before.location(*id), Some(Location::Ready));
            }
        }
    }
    if let Command::Settle { ids, .. } = cmd
        && !matches!(reply, Reply::Error { .. })
    {
        // every settled id was held by that consumer before
        for id in ids {
            let held = matches!(before.location(*id), Some(Location::Unacked { .. }));
            prop_assert!(held, "settled {} that was not unacked", id);
        }
    }
    // Delivery counting (RabbitMQ 4.3): a requeue is a failed delivery, counted in both the
    // delivery count and the acquired count; a release only in the acquired count, and the
    // delivery limit never kills a released message.
    if let Command::Settle { ids, outcome, .. } = cmd
        && !matches!(reply, Reply::Error { .. })
    {
        let failed_before = |id: MessageId| {
            before
                .pending_deliveries()
                .iter()
                .find(|d| d.id == id)
                .map(|d| d.delivery_count)
        };
        for id in ids {
            let (Some(acquired_before), Some(acquired)) =
                (before.acquired_count(*id), s.acquired_count(*id))
            else {
                continue; // acked, dead-lettered or expired in this step
            };
            match outcome {
                SettleOutcome::Release => {
                    prop_assert_eq!(acquired, acquired_before + 1, "release of {}", id);
                }
                SettleOutcome::Requeue | SettleOutcome::RequeueAfter { .. } => {
                    prop_assert_eq!(acquired, acquired_before + 1, "requeue of {}", id);
                    if let Some(failed) = failed_before(*id) {
                        let after = s
                            .pending_deliveries()
                            .iter()
                            .find(|d| d.id == *id)
                            .map(|d| d.delivery_count);
                        // Back in the queue now; once redelivered its count shows one more.
                        prop_assert!(after.is_none() || after == Some(failed + 1));
                    }
                }
                _ => {}
            }
        }
        if *outcome == SettleOutcome::Release {
            let limit_killed = effects.iter().any(|e| {
                matches!(e, Effect::DeadLetter { id, reason: Reason::DeliveryLimit, .. } if ids.contains(id))
            });
            prop_assert!(!limit_killed, "a release reached the delivery limit");
        }
    }
    // A requeue that names a delay puts each message that did not die in this step out of
    // reach until the settle's time + the delay; the queue's delays by delivery count too.
    if let Command::Settle { ids, outcome, .. } = cmd
        && !matches!(reply, Reply::Error { .. })
    {
        let died: BTreeSet<MessageId> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::DeadLetter { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        for id in ids.iter().filter(|id| !died.contains(id)) {
            let delay = match outcome {
                SettleOutcome::RequeueAfter { delay_ms } => Some(*delay_ms),
                // x-requeue-delays by the count after this failure (entry n-1, the last
                // repeating); Get leases do not show their count, only the due time is checked.
                SettleOutcome::Requeue => before
                    .pending_deliveries()
                    .iter()
                    .find(|d| d.id == *id)
                    .map(|d| {
                        let delays = &before.config().requeue_delays_ms;
                        let i = (d.delivery_count as usize).min(delays.len().saturating_sub(1));
                        delays.get(i).copied().unwrap_or(0)
                    }),
                _ => continue,
            };
            match (delay, s.location(*id)) {
                (Some(0), loc) => prop_assert!(
                    !matches!(loc, Some(Location::Delayed { .. })),
                    "requeue after 0 delayed {}",
                    id
                ),
                (Some(d), loc) => {
                    prop_assert_eq!(
                        loc,
                        Some(Location::Delayed {
                            due_ms: s.clock_ms() + d
                        }),
                        "requeue after {} of {}",
                        d,
                        id
                    );
                    model.not_before.insert(*id, s.clock_ms() + d);
                }
                (None, Some(Location::Delayed { due_ms })) => {
                    prop_assert!(due_ms > s.clock_ms());
                    model.not_before.insert(*id, due_ms);
                }
                (None, _) => {}
            }
        }
    }
    for e in effects {
        match e {
            Effect::Deliver(d) => {
                prop_assert_ne!(d.consumer, GET_CONSUMER);
                prop_assert!(d.lease_deadline_ms.is_none());
                prop_assert!(d.delivery_count == 0 || d.redelivered);
                let acquired = s.acquired_count(d.id);
                prop_assert!(
                    acquired >= Some(d.delivery_count),
                    "acquired count of {}",
                    d.id
                );
                prop_assert_eq!(
                    acquired > Some(0),
                    d.redelivered,
                    "redelivered flag of {}",
                    d.id
                );
                model.deliver(d.id, d.redelivered, s.clock_ms())?;
            }
            Effect::DeadLetter { id, strategy, .. } => {
                prop_assert!(model.live.contains(id), "dead letter {id} is not live");
                if *strategy != DlStrategy::AtLeastOnce {
                    model.leave(*id)?;
                }
            }
            Effect::DeleteBody { id } => model.leave(*id)?,
            // Checked above: the consumer is gone and its messages returned.
            Effect::ConsumerTimedOut { .. } => {}
            // A Get's message was live, and its acquired count is at least its failures.
            Effect::Got { id, acquired_count } => {
                prop_assert!(model.live.contains(id), "got {id}, which is not live");
                if let Reply::Got {
                    delivery: Some(d), ..
                } = reply
                {
                    prop_assert_eq!(d.id, *id);
                    prop_assert!(*acquired_count >= d.delivery_count);
                }
            }
        }
    }

    // Conservation: the state holds exactly the live ids, each in one place.
    prop_assert_eq!(
        s.message_ids(),
        model.live.iter().copied().collect::<Vec<_>>()
    );
    s.check_invariants().map_err(TestCaseError::fail)?;
    let mut per_place: BTreeMap<Option<Location>, u64> = BTreeMap::new();
    let mut ready_bytes = 0;
    for id in s.message_ids() {
        let loc = s.location(id);
        prop_assert!(loc.is_some());
        let key = match loc {
            Some(Location::Unacked { .. }) => Some(Location::Unacked { consumer: 0 }),
            Some(Location::Delayed { .. }) => Some(Location::Delayed { due_ms: 0 }),
            other => other,
        };
        *per_place.entry(key).or_default() += 1;
        if loc == Some(Location::Ready) {
            ready_bytes += s.header(id).unwrap().size_bytes;
        }
    }
    let counts = s.counts();
    let n = |l: Location| per_place.get(&Some(l)).copied().unwrap_or(0);
    prop_assert_eq!(counts.ready, n(Location::Ready));
    prop_assert_eq!(counts.unacked, n(Location::Unacked { consumer: 0 }));
    prop_assert_eq!(counts.held, n(Location::Held));
    prop_assert_eq!(counts.delayed, n(Location::Delayed { due_ms: 0 }));
    // Browse shows exactly the ready messages, in dispatch order, with their positions; the
    // oldest ready message is the one enqueued first.
    let browsed = s.browse(0, usize::MAX, u64::MAX);
    prop_assert_eq!(
        browsed.iter().map(|b| b.id).collect::<Vec<_>>(),
        s.ready_ids()
    );
    prop_assert!(
        browsed
            .iter()
            .enumerate()
            .all(|(i, b)| b.position == i as u64)
    );
    prop_assert_eq!(
        s.oldest_ready_enqueued_ms(),
        browsed.iter().map(|b| b.enqueued_ms).min()
    );
    prop_assert_eq!(counts.ready_bytes, ready_bytes);
    prop_assert_eq!(counts.ready as usize, s.ready_ids().len());
    // A move round takes the head of the ready messages without walking the rest.
    let head: Vec<MessageId> = s.ready_ids().into_iter().take(3).collect();
    prop_assert_eq!(s.first_ready_ids(3), head);
    prop_assert_eq!(counts.held as usize, s.held_dead_letters().len());
    // A transfer round takes the head of the held dead letters (skipping those in flight),
    // bounded by count and bytes, without walking the rest.
    let held = s.held_dead_letters();
    let in_flight: Vec<MessageId> = held.iter().step_by(2).map(|h| h.id).collect();
    let mut expect = Vec::new();
    let mut bytes = 0;
    for h in held.iter().filter(|h| !in_flight.contains(&h.id)) {
        if expect.len() == 3 || (!expect.is_empty() && bytes + h.size_bytes > 40) {
            break;
        }
        bytes += h.size_bytes;
        expect.push(h.clone());
    }
    prop_assert_eq!(
        s.first_held_dead_letters(3, 40, |id| in_flight.contains(&id)),
        expect
    );
    // A cancelled consumer is attached until it settles its last message, but not counted.
    prop_assert_eq!(
        counts.consumers as usize,
        s.consumers().len() - s.cancelled().len()
    );
    if let Command::CancelConsumer { consumer, .. } = cmd
        && !gated(before, cmd)
    {
        let holds = s.consumers().iter().any(|c| c.0 == *consumer);
        prop_assert_eq!(holds, s.cancelled().contains(consumer));
    }
    // Machine versions: a command the queue's version does not have changes nothing; the
    // version only moves forward, and only to one this release has.
    if gated(before, cmd) {
        prop_assert!(
            matches!(reply, Reply::Error { .. }),
            "{cmd:?} ran at version 1"
        );
        prop_assert_eq!(s, before);
    }
    if let Command::SetMachineVersion { version } = cmd {
        let expect = if *version > MACHINE_VERSION {
            before.machine_version()
        } else {
            before.machine_version().max(*version)
        };
        prop_assert_eq!(s.machine_version(), expect);
        prop_assert_eq!(
            matches!(reply, Reply::Error { .. }),
            *version > MACHINE_VERSION
        );
    }

    // Consumer timeouts: after a step nothing checked out to a consumer is past its deadline,
    // and a consumer that timed out is gone.
    let (_, deadlines) = s.consumer_timeouts();
    prop_assert!(
        deadlines.iter().all(|(_, d)| *d > s.clock_ms()),
        "a checked-out message is past its deadline at {}: {deadlines:?}",
        s.clock_ms()
    );
    for e in effects {
        if let Effect::ConsumerTimedOut { consumer, id, .. } = e {
            // (unless this very command attached it again after the timers fired)
            let attached_again = matches!(cmd,
                Command::Checkout { consumer: c, .. } | Command::CheckoutWithPriority { consumer: c, .. }
                    if c == consumer);
            prop_assert!(
                attached_again || s.consumers().iter().all(|c| c.0 != *consumer),
                "timed-out consumer {consumer} still attached"
            );
            prop_assert!(
                attached_again
                    || !matches!(s.location(*id), Some(Location::Unacked { consumer: c }) if c == *consumer),
                "timed-out message {id} still with {consumer}"
            );
        }
    }

    // Consumer priorities: a consumer got a message in this step only if no live consumer of
    // a higher priority still has credit after it (they are served first).
    if !s.config().single_active_consumer {
        let priority = |c: ConsumerId| s.priorities().get(&c).copied().unwrap_or(0);
        let with_credit: Vec<(ConsumerId, i32)> = s
            .consumers()
            .into_iter()
            .filter(|(c, _, prefetch, unacked)| {
                !s.cancelled().contains(c) && (*prefetch == 0 || unacked < prefetch)
            })
            .map(|(c, ..)| (c, priority(c)))
            .collect();
        for e in effects {
            if let Effect::Deliver(d) = e {
                let p = priority(d.consumer);
                prop_assert!(
                    with_credit.iter().all(|(_, q)| *q <= p),
                    "consumer {} (priority {p}) served while {:?} had credit",
                    d.consumer,
                    with_credit
                );
            }
        }
    }

    // Credit: a consumer that got something in this step is within its prefetch.
    let consumers: BTreeMap<ConsumerId, (u32, u32)> = s
        .consumers()
        .into_iter()
        .map(|(c, _, prefetch, unacked)| (c, (prefetch, unacked)))
        .collect();
    for e in effects {
        if let Effect::Deliver(d) = e {
            // (A cancelled consumer that timed out as the timers fired and that this very
            // command attached again is a new consumer.)
            let timed_out = effects.iter().any(
                |e| matches!(e, Effect::ConsumerTimedOut { consumer, .. } if *consumer == d.consumer),
            );
            prop_assert!(
                (timed_out || !before.cancelled().contains(&d.consumer))
                    && !s.cancelled().contains(&d.consumer),
                "delivered to cancelled consumer {} by {:?}",
                d.consumer,
                cmd
            );
            let (prefetch, unacked) = consumers[&d.consumer];
            prop_assert!(prefetch == 0 || unacked <= prefetch, "prefetch exceeded");
        }
    }
    // Work-conserving: with messages ready, no eligible consumer has credit (unless a move
    // task holds the ready messages).
    if counts.ready > 0 && !s.config().single_active_consumer && s.running_move().is_none() {
        for (c, (prefetch, unacked)) in &consumers {
            if s.cancelled().contains(c) {
                continue;
            }
            prop_assert!(
                *prefetch != 0 && unacked >= prefetch,
                "consumer {} idle with messages ready",
                c
            );
        }
    }

    // Timers: nothing overdue survives an apply.
    if let Some(d) = s.next_deadline() {
        prop_assert!(
            d > s.clock_ms(),
            "deadline {} overdue at {}",
            d,
            s.clock_ms()
        );
    }

    // Limits.
    let c = s.config();
    let over = c
        .max_length
        .is_some_and(|l| counts.ready + counts.held + counts.delayed > l)
        || c.max_length_bytes
            .is_some_and(|l| counts.ready_bytes + counts.held_bytes + counts.delayed_bytes > l);
    if c.overflow == Overflow::DropHead {
        prop_assert!(
            !over || counts.ready == 0,
            "drop-head left the queue over its limit"
        );
    } else if let Reply::Enqueued { id } = reply
        && s.location(*id) == Some(Location::Ready)
    {
        prop_assert!(!over, "reject-publish accepted a message over the limit");
    }
    Ok(())
}

/// A snapshot as a node makes one: the state's own encoding, and what travels beside it (the
/// moves, the cancelled consumers, the machine version, the consumer priorities and timeouts).
struct Snapshot {
    state: Vec<u8>,
    moves: std::collections::BTreeMap<u64, qq_core::queue::MoveTask>,
    cancelled: imbl::OrdSet<ConsumerId>,
    machine: u32,
    priorities: imbl::OrdMap<ConsumerId, i32>,
    timeouts: (Option<u64>, Vec<(MessageId, u64)>),
    releases: Vec<(MessageId, u32)>,
    high: (Vec<MessageId>, u8),
    /// The top strict level (from the queue's arguments, not the snapshot) and the levels.
    max_priority: Option<u8>,
    strict: Vec<(MessageId, u8)>,
}

impl Snapshot {
    fn of(s: &QueueState) -> Snapshot {
        Snapshot {
            state: postcard::to_allocvec(s).unwrap(),
            moves: s.moves().clone(),
            cancelled: s.cancelled().clone(),
            machine: s.machine_version(),
            priorities: s.priorities().clone(),
            timeouts: s.consumer_timeouts(),
            releases: s.releases(),
            high: s.high_priority(),
            max_priority: s.max_priority(),
            strict: s.strict_levels(),
        }
    }

    fn restore(self) -> Result<QueueState, TestCaseError> {
        let mut restored: QueueState = postcard::from_bytes(&self.state).unwrap();
        prop_assert_eq!(restored.machine_version(), FIRST_MACHINE_VERSION);
        restored.restore_moves(self.moves);
        restored.restore_cancelled(self.cancelled);
        restored.restore_machine_version(self.machine);
        restored.restore_priorities(self.priorities);
        restored.restore_consumer_timeouts(self.timeouts.0, self.timeouts.1);
        restored.restore_releases(self.releases);
        restored.restore_high_priority(self.high.0, self.high.1);
        restored.set_max_priority(self.max_priority);
        restored.restore_strict_levels(self.strict);
        restored.check_invariants().map_err(TestCaseError::fail)?;
        Ok(restored)
    }
}

/// Whether the queue's machine version is too old for `cmd` (it is refused untouched).
fn gated(before: &QueueState, cmd: &Command) -> bool {
    cmd.machine_version() > before.machine_version()
        && !matches!(cmd, Command::SetMachineVersion { .. })
}

fn run(initial: QueueConfig, ops: &[(u64, Op)], snapshot_at: usize) -> Result<(), TestCaseError> {
    run_with_levels(initial, None, ops, snapshot_at)
}

/// [`run`] on a queue with strict priority levels 0..=`max_priority` (`x-max-priority`).
fn run_with_levels(
    initial: QueueConfig,
    max_priority: Option<u8>,
    ops: &[(u64, Op)],
    snapshot_at: usize,
) -> Result<(), TestCaseError> {
    let mut s = QueueState::new(initial);
    s.set_max_priority(max_priority);
    let mut model = Model::default();
    let mut index = 0;
    let mut log = Vec::new();
    let mut outputs = Vec::new();
    let mut snapshot = None;
    for (step, (gap, op)) in ops.iter().enumerate() {
        if step == snapshot_at {
            snapshot = Some(Snapshot::of(&s));
        }
        index += gap;
        let cmd = resolve(&s, op);
        let before = s.clone();
        let (reply, effects) = s.apply(index, cmd.clone());
        check_step(&mut model, &before, &cmd, &reply, &effects, &s)?;
        log.push((index, cmd));
        outputs.push((reply, effects));
    }
    let mut restored = snapshot.unwrap_or_else(|| Snapshot::of(&s)).restore()?;
    let from = snapshot_at.min(log.len());
    for ((index, cmd), expected) in log[from..].iter().zip(&outputs[from..]) {
        let got = restored.apply(*index, cmd.clone());
        prop_assert_eq!(
            &got,
            expected,
            "replay after snapshot diverged at index {}",
            index
        );
    }
    prop_assert_eq!(&restored, &s);
    prop_assert_eq!(restored.digest(), s.digest());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn random_command_sequences_keep_every_invariant(
        initial in config(),
        ops in prop::collection::vec((1u64..=2, op()), 1..120),
        snapshot_at in 0usize..120,
    ) {
        run(initial, &ops, snapshot_at)?;
    }
}

// The same on queues with strict priority levels (`x-max-priority`): every invariant, FIFO
// within each level, and replay after a snapshot that carries the levels.
proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    #[test]
    fn random_command_sequences_on_strict_levels(
        initial in config(),
        max_priority in 1u8..=31,
        ops in prop::collection::vec((1u64..=2, op()), 1..120),
        snapshot_at in 0usize..120,
    ) {
        run_with_levels(initial, Some(max_priority), &ops, snapshot_at)?;
    }
}

// Longer runs without length limits: round-robin, returns and the delivery limit at scale.
proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn long_sequences_without_limits(
        ops in prop::collection::vec((1u64..=1, op()), 200..400),
        snapshot_at in 0usize..400,
    ) {
        let mut c = QueueConfig::new("/", "q");
        c.delivery_limit = Some(3);
        run(c, &ops, snapshot_at)?;
    }
}
