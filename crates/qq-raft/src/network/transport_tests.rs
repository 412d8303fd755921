//! Every node-to-node connection goes through the node's [`Transport`]: two peers on an
//! in-memory network (no socket listens at their addresses) get Raft calls, batched and
//! alone, and forwarded work through it, in the clear and over mutual TLS.

use qq_proto::internal::QueueInfoRequest;
use qq_proto::internal::internal_server::InternalServer;
use tokio::sync::{Notify, mpsc};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::ServerTlsConfig;

use super::tests::HoldingPeer;
use super::*;
use crate::transport::memory::MemoryNetwork;

/// Where the peer listens on the in-memory network: nothing listens there on this machine, so
/// a channel that bypassed the transport (TCP) is refused.
const PEER_ADDRESS: &str = "127.0.0.1:1";

/// Serves a peer that grants every vote on `network` at [`PEER_ADDRESS`], behind the protocol
/// check as a node serves it (over TLS with `tls`).
async fn serve_peer_on(network: &MemoryNetwork, tls: Option<ServerTlsConfig>) {
    let incoming = network.listen(PEER_ADDRESS.parse().unwrap()).await.unwrap();
    let (proposal_arrived, _) = mpsc::unbounded_channel();
    let peer = HoldingPeer {
        proposal_arrived,
        release: Arc::new(Notify::new()),
    };
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls).unwrap();
    }
    let service = InterceptedService::new(InternalServer::new(peer), protocol::check);
    tokio::spawn(server.add_service(service).serve_with_incoming(incoming));
}

/// Node 2 at [`PEER_ADDRESS`] on `network`.
fn peers_on(network: &MemoryNetwork, tls: Option<&PeerTls>) -> Peers {
    let peer = PeerAddress {
        id: 2,
        address: "node-2".to_string(),
        cluster_address: PEER_ADDRESS.to_string(),
    };
    Peers::new([peer], tls, Arc::new(network.clone()), Clock::system()).unwrap()
}

#[tokio::test]
async fn every_channel_to_a_peer_is_the_transports() {
    let network = MemoryNetwork::new();
    serve_peer_on(&network, None).await;
    let peers = peers_on(&network, None);

    assert!(tls_tests::vote(peers.clone(), 2).await, "a batched call");
    let large = vec![7u8; mux::MAX_BATCHED_PAYLOAD_BYTES + 1];
    let request = RaftRequest {
        group: 7,
        kind: RaftKind::Append as i32,
        payload: large.clone().into(),
    };
    let reply = peers
        .raft_call(2, request, Duration::from_secs(10))
        .await
        .expect("a call of its own");
    assert_eq!(reply.payload.as_ref(), &large[..]);
    let info = peers
        .client(2)
        .unwrap()
        .queue_info(QueueInfoRequest::default())
        .await
        .expect_err("the test peer answers no queue info");
    assert_eq!(
        info.code(),
        tonic::Code::Unimplemented,
        "the peer itself answered the forwarded work: {info}"
    );
    assert_eq!(
        network.connections(),
        2,
        "one connection for Raft, one for forwarded work"
    );
}

/// TLS runs over whatever connection the transport gives: same CA answers, another is refused.
#[tokio::test]
async fn mutual_tls_runs_over_any_transport() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cluster = tls_tests::ca_and_node();
    let me = tls_tests::peer_tls(&cluster);

    let network = MemoryNetwork::new();
    serve_peer_on(&network, Some(tls_tests::server_tls(&cluster))).await;
    assert!(tls_tests::vote(peers_on(&network, Some(&me)), 2).await);

    let foreign = MemoryNetwork::new();
    let other_ca = tls_tests::server_tls(&tls_tests::ca_and_node());
    serve_peer_on(&foreign, Some(other_ca)).await;
    assert!(
        !tls_tests::vote(peers_on(&foreign, Some(&me)), 2).await,
        "a server from another CA must be refused"
    );
}
