//! The cluster port is the transport's: a node run on an in-memory network answers a peer
//! that reaches it only through that network (no socket listens at its cluster address).

use qq_proto::internal::{RaftKind, RaftRequest};
use qq_raft::META_GROUP;
use qq_raft::network::{PeerAddress, Peers};
use qq_raft::transport::memory::MemoryNetwork;
use std::sync::Arc;
use tokio::sync::oneshot;

use crate::clock::Clock;

use super::*;

#[tokio::test]
async fn the_cluster_port_is_served_from_the_transport() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::for_tests("insecure_cluster = true").unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.data_dir = dir.path().to_path_buf();
    let cluster_address = config.cluster_addr.to_string();
    let network = MemoryNetwork::new();
    let (stop, stopped) = oneshot::channel::<()>();
    let seams = Seams {
        clock: Clock::system(),
        transport: Arc::new(network.clone()),
        clients: Arc::new(qq_raft::transport::TcpTransport),
        disk: qq_raft::store::Disk::real(),
    };
    let node = tokio::spawn(run(config, seams, async {
        let _ = stopped.await;
    }));

    let peer = PeerAddress {
        id: 1,
        address: "node-1".to_string(),
        cluster_address,
    };
    let peers = Peers::new([peer], None, Arc::new(network.clone()), Clock::system()).unwrap();
    // A WAKE naming no group: the node answers it itself, with the (no) groups it leads.
    let wake = RaftRequest {
        group: META_GROUP,
        kind: RaftKind::Wake as i32,
        payload: postcard::to_stdvec(&Vec::<u64>::new()).unwrap().into(),
    };
    let reply = peers
        .raft_call(1, wake, Duration::from_secs(30))
        .await
        .expect("the node answers through the transport");
    assert_eq!(reply.error, "");
    let led: Vec<u64> = postcard::from_bytes(&reply.payload).unwrap();
    assert_eq!(led, Vec::<u64>::new());
    assert!(network.connections() >= 1);

    stop.send(()).unwrap();
    node.await.unwrap().expect("the node stops cleanly");
}
