//! Where a consumer session runs: on this node when it leads the queue, otherwise on the
//! leader, reached over `Internal.Consume`, with deliveries and settles relayed both ways.

use std::sync::Arc;

use futures::StreamExt;
use qq_proto::internal::{ForwardConsumeRequest, ForwardConsumeResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::consume::{SessionIn, SessionOut, SubscribeArgs, run_session};
use crate::node::Node;

pub async fn start_session(
    node: Arc<Node>,
    args: SubscribeArgs,
    mut input: mpsc::Receiver<SessionIn>,
    out: mpsc::Sender<SessionOut>,
) -> Result<(), Status> {
    let group = args.group;
    let leader = match node.known_leader(group) {
        Some(l) => l,
        None => node.queue_info(group).await?.leader,
    };
    if leader == node.id {
        tokio::spawn(run_session(node, args, input, out));
        return Ok(());
    }
    let mut client = node
        .peers
        .client(leader)
        .ok_or_else(|| Status::unavailable(format!("queue leader {leader} is not a known node")))?;
    let (fwd_tx, fwd_rx) = mpsc::channel::<ForwardConsumeRequest>(256);
    let encode = |m: &SessionIn| {
        postcard::to_stdvec(m).map(|payload| ForwardConsumeRequest {
            payload: payload.into(),
        })
    };
    fwd_tx
        .send(encode(&SessionIn::Subscribe(args)).map_err(|e| Status::internal(e.to_string()))?)
        .await
        .map_err(|_| Status::internal("relay closed"))?;
    let mut responses = client
        .consume(ReceiverStream::new(fwd_rx))
        .await
        .map_err(|s| Status::unavailable(format!("queue leader {leader}: {}", s.message())))?
        .into_inner();
    tokio::spawn(async move {
        while let Some(m) = input.recv().await {
            let Ok(req) = encode(&m) else { return };
            if fwd_tx.send(req).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        loop {
            let msg = match responses.next().await {
                Some(Ok(ForwardConsumeResponse { payload })) => {
                    match postcard::from_bytes::<SessionOut>(&payload) {
                        Ok(m) => m,
                        Err(e) => SessionOut::Error {
                            code: tonic::Code::Internal as i32,
                            message: format!("relay decode: {e}"),
                        },
                    }
                }
                Some(Err(s)) => SessionOut::Error {
                    code: tonic::Code::Unavailable as i32,
                    message: format!("queue leader {leader}: {}", s.message()),
                },
                None => SessionOut::Error {
                    code: tonic::Code::Unavailable as i32,
                    message: format!("queue leader {leader} closed the session; subscribe again"),
                },
            };
            let end = matches!(msg, SessionOut::Error { .. } | SessionOut::Cancelled { .. });
            if out.send(msg).await.is_err() || end {
                return;
            }
        }
    });
    Ok(())
}
