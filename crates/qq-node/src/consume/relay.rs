//! Where a consumer session runs: on this node when it leads the queue, otherwise on the
//! leader, reached over `Internal.Consume`, with deliveries and settles relayed both ways.
//!
//! Bounds: [`RELAY_BOUND`] messages each way (full: the relay stops reading its source until
//! the other side takes them, which backs up to the client's or the leader's stream).

use futures::StreamExt;
use qq_core::NodeId;
use qq_proto::internal::{ForwardConsumeRequest, ForwardConsumeResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use super::Consuming;
use super::session::{SessionIn, SessionOut, SubscribeArgs, outcome_for_machine, run_session};

/// Messages buffered each way in a relay, at most.
pub const RELAY_BOUND: usize = 256;

/// Start a consumer session for `args` on the queue's leader, here or relayed.
pub async fn start_session(
    node: Consuming,
    args: SubscribeArgs,
    input: mpsc::Receiver<SessionIn>,
    out: mpsc::Sender<SessionOut>,
) -> Result<(), Status> {
    let group = args.group;
    let leader = match node.registry().known_leader(group) {
        Some(l) => l,
        None => node.proposer().queue_info(group).await?.leader,
    };
    if leader == node.id() {
        node.tasks()
            .spawn(run_session(node.clone(), args, input, out));
        return Ok(());
    }
    let mut client = node
        .peers()
        .client(leader)
        .ok_or_else(|| Status::unavailable(format!("queue leader {leader} is not a known node")))?;
    let (fwd_tx, fwd_rx) = mpsc::channel::<ForwardConsumeRequest>(RELAY_BOUND);
    // A priority goes only to a leader that knows it (machine version 2); a leader of release
    // 0.1.0 attaches the consumer without one, as a queue at version 1 does.
    let leader_version = node.peer_machines().version_of(node.id(), leader);
    let first = match args.priority {
        p if p != 0 && leader_version >= 2 => SessionIn::SubscribeWithPriority(args, p),
        _ => SessionIn::Subscribe(args),
    };
    let subscribe = encode(&first).map_err(|e| Status::internal(e.to_string()))?;
    fwd_tx
        .send(subscribe)
        .await
        .map_err(|_| Status::internal("relay closed"))?;
    let responses = client
        .consume(ReceiverStream::new(fwd_rx))
        .await
        .map_err(|s| Status::unavailable(format!("queue leader {leader}: {}", s.message())))?
        .into_inner();
    let stopping = node.stopping().clone();
    let machines = node.peer_machines().clone();
    let me = node.id();
    node.tasks().spawn(async move {
        // Ending this (node shutting down) closes the leader's session.
        let mut input = input;
        while let Some(Some(m)) = stopping.run_until_cancelled(input.recv()).await {
            // A leader of release 0.1.0 (machine version 1) cannot decode Stop: the older
            // cancel, which closes its session (it returns what the consumer holds).
            // Asked only for a Stop or a release, not for every settle.
            let version = || machines.version_of(me, leader);
            if matches!(m, SessionIn::Stop) && version() < 2 {
                return;
            }
            // Nor a release, which it takes as the requeue it knows.
            let m = match m {
                SessionIn::Settle {
                    tags,
                    multiple,
                    outcome,
                } => SessionIn::Settle {
                    tags,
                    multiple,
                    outcome: outcome_for_machine(outcome, version),
                },
                m => m,
            };
            let Ok(req) = encode(&m) else { return };
            if fwd_tx.send(req).await.is_err() {
                return;
            }
        }
    });
    let stopping = node.stopping().clone();
    node.tasks()
        .spawn(relay_responses(leader, responses, out, stopping));
    Ok(())
}

fn encode(m: &SessionIn) -> Result<ForwardConsumeRequest, postcard::Error> {
    postcard::to_stdvec(m).map(|payload| ForwardConsumeRequest {
        payload: payload.into(),
    })
}

/// The leader's session output → this node's client, until it ends or this node stops.
async fn relay_responses(
    leader: NodeId,
    mut responses: Streaming<ForwardConsumeResponse>,
    out: mpsc::Sender<SessionOut>,
    stopping: CancellationToken,
) {
    let unavailable = |message: String| SessionOut::Error {
        code: tonic::Code::Unavailable as i32,
        message,
    };
    loop {
        let Some(next) = stopping.run_until_cancelled(responses.next()).await else {
            let why = "node is shutting down; subscribe again on another node";
            let _ = out.send(unavailable(why.into())).await;
            return;
        };
        let msg = match next {
            Some(Ok(ForwardConsumeResponse { payload })) => {
                match postcard::from_bytes::<SessionOut>(&payload) {
                    Ok(m) => m,
                    Err(e) => SessionOut::Error {
                        code: tonic::Code::Internal as i32,
                        message: format!("relay decode: {e}"),
                    },
                }
            }
            Some(Err(s)) => unavailable(format!("queue leader {leader}: {}", s.message())),
            None => unavailable(format!(
                "queue leader {leader} closed the session; subscribe again"
            )),
        };
        let end = matches!(msg, SessionOut::Error { .. } | SessionOut::Cancelled { .. });
        if out.send(msg).await.is_err() {
            return;
        }
        if end {
            // The leader's session says nothing after its last word and closes the stream once
            // it has left the queue (its consumer-down committed). `out` stays open until then:
            // whoever waits for its end (an AMQP basic.cancel) knows the consumer is gone.
            while let Some(Some(Ok(_))) = stopping.run_until_cancelled(responses.next()).await {}
            return;
        }
    }
}
