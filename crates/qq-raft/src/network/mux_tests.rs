use super::*;

async fn peer() -> Peers {
    tests::peers_at(1, tests::serve_peer(None).await, None)
}

fn append(group: u64, payload: Vec<u8>) -> RaftRequest {
    RaftRequest {
        group,
        kind: RaftKind::Append as i32,
        payload: payload.into(),
    }
}

/// Thousands of groups' small requests share the peer's stream, in far fewer messages than
/// calls, and every caller gets its own answer.
#[tokio::test]
async fn many_groups_share_one_stream_and_each_gets_its_answer() {
    let peers = peer().await;
    let (calls_before, messages_before) = mux::sent();
    let mut calls = tokio::task::JoinSet::new();
    for group in 0..3000u64 {
        let peers = peers.clone();
        calls.spawn(async move {
            let payload = group.to_le_bytes().repeat(1 + (group % 7) as usize);
            let reply = peers
                .raft_call(1, append(group, payload.clone()), Duration::from_secs(20))
                .await
                .expect("answered");
            assert_eq!(
                reply.payload.as_ref(),
                &payload[..],
                "group {group} got another's answer"
            );
        });
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap();
    }
    let (calls_after, messages_after) = mux::sent();
    assert!(calls_after - calls_before >= 3000);
    assert!(
        messages_after - messages_before < (calls_after - calls_before) / 4,
        "{} calls went in {} messages: not batched",
        calls_after - calls_before,
        messages_after - messages_before
    );
}

/// A call that is never answered fails at its deadline and leaves the stream working; a
/// large payload goes as a call of its own and is answered too.
#[tokio::test]
async fn an_unanswered_call_times_out_without_blocking_the_stream() {
    let peers = peer().await;
    let hung = RaftRequest {
        group: 9,
        kind: RaftKind::TransferLeader as i32,
        payload: Default::default(),
    };
    let err = peers
        .raft_call(1, hung, Duration::from_millis(300))
        .await
        .expect_err("never answered");
    assert!(err.contains("no answer within"), "{err}");
    let reply = peers
        .raft_call(1, append(1, vec![7; 8]), Duration::from_secs(20))
        .await
        .expect("the stream still answers");
    assert_eq!(reply.payload.as_ref(), &[7; 8]);
    let large = vec![5; mux::MAX_BATCHED_PAYLOAD_BYTES + 1];
    let reply = peers
        .raft_call(1, append(2, large.clone()), Duration::from_secs(20))
        .await
        .expect("a large append is answered");
    assert_eq!(reply.payload.as_ref(), &large[..]);
}

/// The queue groups' stream full to its bound with calls the peer does not answer: a
/// queue group's call finds no room, the metadata group's calls still go through at once
/// on their own stream.
#[tokio::test]
async fn a_full_queue_group_stream_does_not_hold_up_the_metadata() {
    let peers = peer().await;
    let mut hung = tokio::task::JoinSet::new();
    for group in 0..mux::MAX_IN_FLIGHT as u64 {
        let peers = peers.clone();
        hung.spawn(async move {
            let transfer = RaftRequest {
                group: 1 + group,
                kind: RaftKind::TransferLeader as i32,
                payload: Default::default(),
            };
            peers.raft_call(1, transfer, Duration::from_secs(120)).await
        });
    }
    // Every hung call holds its room once the peer has the full bound of them.
    let err = loop {
        match peers
            .raft_call(1, append(5, vec![1; 8]), Duration::from_millis(200))
            .await
        {
            Err(e) => break e,
            Ok(_) => tokio::task::yield_now().await, // the hung calls are still queuing
        }
    };
    assert!(err.contains("no answer within"), "{err}");
    for round in 0..20u8 {
        let reply = peers
            .raft_call(
                1,
                append(META_GROUP, vec![round; 8]),
                Duration::from_secs(5),
            )
            .await
            .expect("the metadata's call is answered beside the full stream");
        assert_eq!(reply.payload.as_ref(), &[round; 8]);
    }
    hung.abort_all();
}

/// A peer nobody listens at: calls fail fast with an error that names it, they do not wait
/// out their deadline.
#[tokio::test]
async fn calls_to_a_peer_that_is_not_there_fail_fast() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    let peers = tests::peers_at(3, address, None);
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let err = peers
            .raft_call(3, append(1, vec![1]), Duration::from_secs(60))
            .await
            .expect_err("nobody listens");
        assert!(err.contains("node 3"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "waited out the deadline: {err}"
        );
    }
}
