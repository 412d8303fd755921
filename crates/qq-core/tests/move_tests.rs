//! Move tasks (redrive) in the queue state machine: the task's life, and that a moved message
//! leaves the source only with `MoveDone`.

use qq_core::queue::{Command, Effect, MoveState, MsgHeader, QueueState, Reply};
use qq_core::types::{MessageId, QueueConfig};

struct Q {
    s: QueueState,
    index: u64,
}

impl Q {
    fn new() -> Q {
        Q {
            s: QueueState::new(QueueConfig::new("/", "dlq")),
            index: 0,
        }
    }

    fn apply(&mut self, cmd: Command) -> (Reply, Vec<Effect>) {
        self.index += 1;
        let out = self.s.apply(self.index, cmd);
        self.s.check_invariants().unwrap();
        out
    }

    fn publish(&mut self, n: usize) {
        for _ in 0..n {
            let (r, _) = self.apply(Command::Enqueue {
                now_ms: 1,
                header: MsgHeader {
                    size_bytes: 1,
                    expiration_ms: None,
                },
                publish_key: None,
                dedup_key: None,
            });
            assert!(matches!(r, Reply::Enqueued { .. }), "{r:?}");
        }
    }

    fn start(&mut self, max_messages: u64) -> u64 {
        match self.apply(Command::StartMove {
            now_ms: 2,
            destination: "q".into(),
            max_messages,
            max_per_second: 0,
        }) {
            (Reply::MoveStarted { task }, _) => task,
            other => panic!("start move: {other:?}"),
        }
    }

    fn state(&self, task: u64) -> (MoveState, u64, u64) {
        let t = &self.s.moves()[&task];
        (t.state, t.moved, t.remaining())
    }
}

fn deleted(fx: &[Effect]) -> Vec<MessageId> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::DeleteBody { id } => Some(*id),
            _ => None,
        })
        .collect()
}

#[test]
fn a_task_moves_up_to_max_and_messages_leave_only_with_move_done() {
    let mut q = Q::new();
    q.publish(5);
    let task = q.start(3);
    assert_eq!(q.state(task), (MoveState::Running, 0, 3));
    // Starting takes nothing out of the queue.
    assert_eq!(q.s.counts().ready, 5);
    let head: Vec<MessageId> = q.s.ready_ids().into_iter().take(2).collect();
    let (r, fx) = q.apply(Command::MoveDone {
        task,
        ids: head.clone(),
    });
    assert_eq!(r, Reply::Ok);
    assert_eq!(deleted(&fx), head);
    assert_eq!(q.s.counts().ready, 3);
    assert_eq!(q.state(task), (MoveState::Running, 2, 1));
    // A retried MoveDone (a new leader's) moves nothing twice.
    let (_, fx) = q.apply(Command::MoveDone { task, ids: head });
    assert!(deleted(&fx).is_empty());
    assert_eq!(q.state(task), (MoveState::Running, 2, 1));
    let next = q.s.ready_ids()[0];
    q.apply(Command::MoveDone {
        task,
        ids: vec![next],
    });
    assert_eq!(q.state(task), (MoveState::Done, 3, 0));
    assert_eq!(q.s.counts().ready, 2);
}

#[test]
fn a_running_task_pauses_delivery_and_refuses_a_second_task() {
    let mut q = Q::new();
    q.publish(2);
    let task = q.start(0);
    assert_eq!(q.state(task), (MoveState::Running, 0, 2));
    let (r, _) = q.apply(Command::Get {
        now_ms: 3,
        lease_ms: 1000,
        auto_ack: true,
    });
    assert!(
        matches!(
            r,
            Reply::Got {
                delivery: None,
                message_count: 2
            }
        ),
        "{r:?}"
    );
    let (r, _) = q.apply(Command::StartMove {
        now_ms: 3,
        destination: String::new(),
        max_messages: 0,
        max_per_second: 0,
    });
    assert!(matches!(r, Reply::Error { .. }), "{r:?}");
    // Cancelled: delivery resumes; a late MoveDone of copies already made still removes them.
    q.apply(Command::EndMove {
        task,
        state: MoveState::Cancelled,
        detail: "by alice".into(),
    });
    assert_eq!(q.state(task), (MoveState::Cancelled, 0, 0));
    let first = q.s.ready_ids()[0];
    let (_, fx) = q.apply(Command::MoveDone {
        task,
        ids: vec![first],
    });
    assert_eq!(deleted(&fx), vec![first]);
    let (r, _) = q.apply(Command::Get {
        now_ms: 4,
        lease_ms: 1000,
        auto_ack: true,
    });
    assert!(
        matches!(
            r,
            Reply::Got {
                delivery: Some(_),
                ..
            }
        ),
        "{r:?}"
    );
}

#[test]
fn a_task_on_an_empty_queue_is_done_at_once_and_a_failure_is_kept() {
    let mut q = Q::new();
    let task = q.start(0);
    assert_eq!(q.state(task), (MoveState::Done, 0, 0));
    q.publish(1);
    let task = q.start(0);
    q.apply(Command::EndMove {
        task,
        state: MoveState::Failed,
        detail: "destination 'q' does not exist".into(),
    });
    let t = &q.s.moves()[&task];
    assert_eq!(t.state, MoveState::Failed);
    assert!(t.detail.contains("does not exist"));
    assert_eq!(q.s.counts().ready, 1);
    // A task cannot be ended as Done by a client.
    let (r, _) = q.apply(Command::EndMove {
        task,
        state: MoveState::Done,
        detail: String::new(),
    });
    assert!(matches!(r, Reply::Error { .. }));
}

#[test]
fn only_the_last_ended_tasks_are_remembered() {
    let mut q = Q::new();
    for _ in 0..qq_core::queue::MAX_ENDED_MOVES + 5 {
        q.start(0);
    }
    assert_eq!(q.s.moves().len(), qq_core::queue::MAX_ENDED_MOVES);
}

#[test]
fn a_waiting_consumer_gets_the_messages_in_the_apply_that_ends_the_task() {
    let mut q = Q::new();
    q.publish(2);
    let task = q.start(0);
    let (_, fx) = q.apply(Command::Checkout {
        now_ms: 3,
        consumer: 1,
        node: 1,
        prefetch: 10,
    });
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Deliver(_))),
        "delivered while the task runs: {fx:?}"
    );
    let first = q.s.ready_ids()[0];
    // One message moves; the cancel hands the other to the waiting consumer at once.
    q.apply(Command::MoveDone {
        task,
        ids: vec![first],
    });
    assert_eq!(q.state(task), (MoveState::Running, 1, 1));
    let (_, fx) = q.apply(Command::EndMove {
        task,
        state: MoveState::Cancelled,
        detail: String::new(),
    });
    let delivered = fx
        .iter()
        .filter(|e| matches!(e, Effect::Deliver(_)))
        .count();
    assert_eq!(delivered, 1, "{fx:?}");
    assert_eq!(q.s.counts().ready, 0);
}
