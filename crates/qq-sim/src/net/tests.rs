//! The network's faults on raw connections: node 1 dials node 2's listener.

use std::time::Duration;

use futures::StreamExt;
use qq_raft::transport::Conn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

const ADDRESS: &str = "10.77.0.2:7000";

/// Node 1's end and node 2's end of one new connection.
async fn connect(net: &SimNet, incoming: &mut Incoming) -> (DuplexStream, Conn) {
    let ours = net.dial(1, ADDRESS).await.expect("dial");
    let theirs = incoming
        .next()
        .await
        .expect("accepted")
        .expect("a connection");
    (ours, theirs)
}

async fn listening(net: &SimNet) -> Incoming {
    net.transport(2)
        .listen(ADDRESS.parse().unwrap())
        .await
        .expect("listen")
}

/// Reads exactly `n` bytes, or None if they do not come within `limit`.
async fn read_within(
    io: &mut (impl AsyncReadExt + Unpin),
    n: usize,
    limit: Duration,
) -> Option<Vec<u8>> {
    let mut buf = vec![0; n];
    tokio::time::timeout(limit, io.read_exact(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(buf)
}

#[tokio::test]
async fn a_blocked_direction_stalls_until_it_heals_and_loses_nothing() {
    let net = SimNet::new(1);
    let mut incoming = listening(&net).await;
    let (mut ours, mut theirs) = connect(&net, &mut incoming).await;
    net.set_link(
        1,
        2,
        Link {
            blocked: true,
            ..Link::default()
        },
    );
    ours.write_all(b"held").await.unwrap();
    assert_eq!(
        read_within(&mut theirs, 4, Duration::from_millis(300)).await,
        None
    );
    // The other direction still flows.
    theirs.write_all(b"back").await.unwrap();
    assert_eq!(
        read_within(&mut ours, 4, Duration::from_secs(5))
            .await
            .as_deref(),
        Some(&b"back"[..])
    );
    net.heal();
    assert_eq!(
        read_within(&mut theirs, 4, Duration::from_secs(5))
            .await
            .as_deref(),
        Some(&b"held"[..])
    );
}

#[tokio::test]
async fn a_dial_waits_while_either_direction_is_blocked() {
    let net = SimNet::new(1);
    let mut incoming = listening(&net).await;
    net.set_link(
        2,
        1,
        Link {
            blocked: true,
            ..Link::default()
        },
    );
    let dial = net.dial(1, ADDRESS);
    tokio::pin!(dial);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut dial)
            .await
            .is_err()
    );
    net.heal();
    let _ours = tokio::time::timeout(Duration::from_secs(5), dial)
        .await
        .unwrap()
        .unwrap();
    assert!(incoming.next().await.is_some());
}

#[tokio::test]
async fn delay_holds_every_chunk_and_keeps_the_order() {
    let net = SimNet::new(1);
    let mut incoming = listening(&net).await;
    let (mut ours, mut theirs) = connect(&net, &mut incoming).await;
    net.set_link(
        1,
        2,
        Link {
            delay_ms: 300,
            jitter_ms: 100,
            ..Link::default()
        },
    );
    let sent = tokio::time::Instant::now();
    for i in 0..20u8 {
        ours.write_all(&[i]).await.unwrap();
        ours.flush().await.unwrap();
    }
    let got = read_within(&mut theirs, 20, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        sent.elapsed() >= Duration::from_millis(300),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(got, (0..20u8).collect::<Vec<_>>(), "in order");
    assert!(net.stats().delayed_chunks >= 1);
}

#[tokio::test]
async fn a_cut_ends_the_connection_on_both_sides() {
    let net = SimNet::new(1);
    let mut incoming = listening(&net).await;
    let (mut ours, mut theirs) = connect(&net, &mut incoming).await;
    assert_eq!(net.cut(2, 1), 1);
    let mut buf = [0u8; 1];
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), theirs.read(&mut buf))
            .await
            .unwrap()
            .unwrap(),
        0
    );
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), ours.read(&mut buf))
            .await
            .unwrap()
            .unwrap(),
        0
    );
    assert_eq!(net.stats().cut_connections, 1);
}

#[tokio::test]
async fn nobody_listening_is_a_refused_dial() {
    let net = SimNet::new(1);
    let e = net.dial(1, ADDRESS).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    let incoming = listening(&net).await;
    drop(incoming);
    // A listener that went away (its node crashed) refuses too.
    assert!(net.dial(1, ADDRESS).await.is_err());
    assert_eq!(net.stats().refused_dials, 2);
}
