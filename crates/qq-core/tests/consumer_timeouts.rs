//! Consumer timeouts (`x-consumer-timeout`): a consumer that holds a message past the queue's
//! timeout is ended, and what it held returns to the queue as failed deliveries.

use qq_core::queue::{Command, Effect, Location, MsgHeader, QueueState, Reply};
use qq_core::types::QueueConfig;

fn enqueue(now_ms: u64) -> Command {
    Command::Enqueue {
        now_ms,
        header: MsgHeader {
            size_bytes: 10,
            expiration_ms: None,
        },
        publish_key: None,
        dedup_key: None,
    }
}

#[test]
fn a_consumer_holding_a_message_past_the_timeout_is_ended_and_its_messages_return() {
    let mut s = QueueState::new(QueueConfig::new("/", "q"));
    let mut i = 0;
    let mut apply = |s: &mut QueueState, cmd: Command| {
        i += 1;
        let out = s.apply(i, cmd);
        s.check_invariants().unwrap();
        out
    };
    // Machine version 1 has no consumer timeouts.
    let (reply, _) = apply(
        &mut s,
        Command::SetConsumerTimeout {
            timeout_ms: Some(100),
        },
    );
    assert!(matches!(reply, Reply::Error { .. }), "{reply:?}");
    apply(&mut s, Command::SetMachineVersion { version: 2 });
    assert_eq!(
        apply(
            &mut s,
            Command::SetConsumerTimeout {
                timeout_ms: Some(100)
            }
        )
        .0,
        Reply::Ok
    );
    let checkout = Command::Checkout {
        now_ms: 10,
        consumer: 1,
        node: 1,
        prefetch: 2,
    };
    apply(&mut s, checkout);
    let (_, fx) = apply(&mut s, enqueue(10)); // checked out at 10: due at 110
    let first = match &fx[..] {
        [Effect::Deliver(d)] => d.id,
        other => panic!("{other:?}"),
    };
    apply(&mut s, enqueue(60)); // due at 160
    assert_eq!(s.next_deadline(), Some(110));
    // Nothing happens before the deadline.
    let (_, fx) = apply(&mut s, Command::Expire { now_ms: 109 });
    assert!(fx.is_empty(), "{fx:?}");
    let (_, fx) = apply(&mut s, Command::Expire { now_ms: 110 });
    assert_eq!(
        fx,
        vec![Effect::ConsumerTimedOut {
            consumer: 1,
            id: first,
            timeout_ms: 100
        }]
    );
    assert!(s.consumers().is_empty());
    assert_eq!(s.counts().ready, 2);
    assert_eq!(s.location(first), Some(Location::Ready));
    assert_eq!(s.next_deadline(), None);
    // Without a timeout nothing times out.
    apply(&mut s, Command::SetConsumerTimeout { timeout_ms: None });
    apply(
        &mut s,
        Command::Checkout {
            now_ms: 200,
            consumer: 2,
            node: 1,
            prefetch: 0,
        },
    );
    let (_, fx) = apply(&mut s, Command::Expire { now_ms: 1_000_000 });
    assert!(fx.is_empty(), "{fx:?}");
    assert_eq!(s.counts().unacked, 2);
}
