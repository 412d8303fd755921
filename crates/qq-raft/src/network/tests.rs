use std::pin::Pin;

use futures::Stream;
use qq_proto::internal::internal_server::{Internal, InternalServer};
use qq_proto::internal::{
    BrowseQueueRequest, ForwardConsumeRequest, ForwardConsumeResponse, IncarnationReply,
    IncarnationRequest, ProposeReply, ProposeRequest, QueueInfoReply, QueueInfoRequest,
    RaftAnswers, RaftCalls, RaftReply, ReseedReply, WatchEvent, WatchRequest,
};
use tokio::sync::{Notify, mpsc};
use tonic::{Request, Response, Status, Streaming};

use super::*;

/// A peer that grants every vote at once and holds every proposal until the test ends.
pub(super) struct HoldingPeer {
    pub(super) proposal_arrived: mpsc::UnboundedSender<()>,
    pub(super) release: Arc<Notify>,
}

/// Serves a [`HoldingPeer`] that nobody releases (over TLS with `tls`); returns its address.
pub(super) async fn serve_peer(tls: Option<tonic::transport::ServerTlsConfig>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (arrived_tx, _arrived) = mpsc::unbounded_channel();
    let peer = HoldingPeer {
        proposal_arrived: arrived_tx,
        release: Arc::new(Notify::new()),
    };
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls).unwrap();
    }
    tokio::spawn(
        server
            .add_service(InternalServer::new(peer))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    address
}

/// A peer set of one node, `id`, at `address`.
pub(super) fn peers_at(id: u64, address: String, tls: Option<&PeerTls>) -> Peers {
    Peers::new(
        [PeerAddress {
            id,
            address: address.clone(),
            cluster_address: address,
        }],
        tls,
        Arc::new(crate::transport::TcpTransport),
        Clock::system(),
    )
    .unwrap()
}

/// The test peer's Raft: grants every vote; echoes the payload of an append; never
/// answers a leadership transfer.
async fn answer(r: RaftRequest) -> RaftReply {
    match RaftKind::try_from(r.kind) {
        Ok(RaftKind::Append) => RaftReply {
            payload: r.payload,
            error: String::new(),
        },
        Ok(RaftKind::TransferLeader) => std::future::pending().await,
        _ => {
            let req: VoteRequest<TypeConfig> = postcard::from_bytes(&r.payload).unwrap();
            let resp = VoteResponse::<TypeConfig>::new(req.vote, None, true);
            RaftReply {
                payload: postcard::to_stdvec(&resp).unwrap().into(),
                error: String::new(),
            }
        }
    }
}

#[tonic::async_trait]
impl Internal for HoldingPeer {
    async fn raft(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        Ok(Response::new(answer(request.into_inner()).await))
    }

    type RaftBatchStream = Pin<Box<dyn Stream<Item = Result<RaftAnswers, Status>> + Send>>;

    async fn raft_batch(
        &self,
        request: Request<Streaming<RaftCalls>>,
    ) -> Result<Response<Self::RaftBatchStream>, Status> {
        Ok(Response::new(Box::pin(crate::mux::serve(
            request.into_inner(),
            answer,
        ))))
    }

    async fn propose(
        &self,
        _request: Request<ProposeRequest>,
    ) -> Result<Response<ProposeReply>, Status> {
        let _ = self.proposal_arrived.send(());
        self.release.notified().await;
        Err(Status::cancelled("test over"))
    }

    type ConsumeStream = Pin<Box<dyn Stream<Item = Result<ForwardConsumeResponse, Status>> + Send>>;

    async fn consume(
        &self,
        _request: Request<Streaming<ForwardConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn queue_info(
        &self,
        _request: Request<QueueInfoRequest>,
    ) -> Result<Response<QueueInfoReply>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn browse(
        &self,
        _request: Request<BrowseQueueRequest>,
    ) -> Result<Response<QueueInfoReply>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn group_op(
        &self,
        _request: Request<ProposeRequest>,
    ) -> Result<Response<ProposeReply>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn incarnation(
        &self,
        _request: Request<IncarnationRequest>,
    ) -> Result<Response<IncarnationReply>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn reseed(
        &self,
        _request: Request<IncarnationRequest>,
    ) -> Result<Response<ReseedReply>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

    async fn watch(
        &self,
        _request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

/// Regression (found by qq-chaos): forwarded proposals waiting for a commit must never keep
/// Raft requests from reaching a peer. The peer allows one open stream per connection and
/// holds a forwarded proposal on it; a vote to the same peer must still get through.
#[tokio::test]
async fn raft_requests_are_not_queued_behind_forwarded_work() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (arrived_tx, mut arrived) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let peer = HoldingPeer {
        proposal_arrived: arrived_tx,
        release: release.clone(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .max_concurrent_streams(1)
            .add_service(InternalServer::new(peer))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let peers = peers_at(1, address, None);

    let mut work = peers.client(1).unwrap();
    let held = tokio::spawn(async move {
        work.propose(ProposeRequest {
            group: 7,
            payload: Default::default(),
        })
        .await
    });
    arrived.recv().await.expect("the proposal reaches the peer");

    let mut raft = GroupNetwork {
        group: 7,
        peers: peers.clone(),
    }
    .new_client(1, &BasicNode::default())
    .await;
    let vote = VoteOf::<TypeConfig>::new(3, 2);
    let granted = tokio::time::timeout(
        Duration::from_secs(20),
        raft.vote(
            VoteRequest::new(vote, None),
            RPCOption::new(Duration::from_secs(2)),
        ),
    )
    .await
    .expect("the vote must not wait for the held proposal")
    .expect("the vote is answered");
    assert!(granted.vote_granted);

    release.notify_waiters();
    let _ = held.await;
}
