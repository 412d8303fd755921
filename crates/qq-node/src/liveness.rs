//! Fast handover when a peer's process dies.
//!
//! Raft alone notices a dead leader only when its heartbeats stop for an election timeout, and
//! openraft's followers also keep the dead leader's lease for `election_timeout_max` before they
//! vote for anyone else: a kill -9 of a leader cost 3-4 s of unavailability with the default
//! timeouts (qq-bench scenario 5). RabbitMQ's Ra reacts at once because Erlang distribution
//! reports the dead node as soon as its connection closes.
//!
//! This does the same with evidence that cannot be mistaken for a slow or cut-off peer: every
//! node holds a `Watch` stream open to every peer; when it breaks, the node tries a fresh TCP
//! connection to the peer's address. Only when that is *refused* (the port is closed: the
//! process has exited, or is shutting down and no longer accepts) is the peer declared down,
//! and for every group whose leader it was this node delivers to its own Raft the transfer
//! request a leader sends when it steps down: the follower drops the dead leader's lease, and
//! the successor (the lowest-id member not known to be down, the same choice on every
//! survivor) campaigns at once with votes that ignore the lease. A partition (timeouts, no
//! refusal) or a paused process (the kernel still accepts) never triggers it; then the election
//! timeout applies as before. Raft's safety does not depend on any of this: a wrong call costs
//! at most an unnecessary election.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use openraft::async_runtime::WatchReceiver;
use openraft::raft::TransferLeaderRequest;
use openraft::storage::RaftStateMachine;
use openraft::{Raft, ServerState};
use qq_core::NodeId;
use qq_proto::internal::WatchRequest;
use qq_raft::{META_GROUP, TypeConfig};
use tracing::{info, warn};

use crate::node::Node;

/// Pause between two attempts to open the watch of a peer that is down or unreachable.
const RETRY: Duration = Duration::from_millis(100);
/// How long the probe waits for a TCP connection before calling the peer merely unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Start one watch per peer.
pub fn spawn_peer_watches(node: Arc<Node>) {
    let down: Arc<Mutex<BTreeSet<NodeId>>> = Arc::default();
    for peer in node.peers.ids() {
        if peer != node.id {
            tokio::spawn(watch_peer(node.clone(), peer, down.clone()));
        }
    }
}

async fn watch_peer(node: Arc<Node>, peer: NodeId, down: Arc<Mutex<BTreeSet<NodeId>>>) {
    let Some(address) = node.peers.address(peer).map(str::to_string) else {
        return;
    };
    let Some(mut client) = node.peers.watch_client(peer) else {
        return;
    };
    loop {
        if let Ok(response) = client.watch(WatchRequest { from: node.id }).await {
            if down.lock().unwrap().remove(&peer) {
                info!(peer, "peer is serving again");
            }
            let mut events = response.into_inner();
            while let Some(Ok(_)) = events.next().await {}
        }
        if refuses_connections(&address).await {
            if down.lock().unwrap().insert(peer) {
                warn!(
                    peer,
                    "peer refuses connections (its process is gone): the groups it led hand over now"
                );
            }
            let down_now = down.lock().unwrap().clone();
            hand_over_from(&node, peer, &down_now).await;
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// True when a TCP connection to `address` is actively refused (nothing listens there).
async fn refuses_connections(address: &str) -> bool {
    match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
        Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        Ok(Ok(_)) | Err(_) => false,
    }
}

/// For every group this node follows `dead`, start the handover to the successor.
async fn hand_over_from(node: &Node, dead: NodeId, down: &BTreeSet<NodeId>) {
    hand_over(&node.meta_raft, META_GROUP, &node.peers.ids(), dead, down).await;
    let groups: Vec<_> = node.queues.read().unwrap().values().cloned().collect();
    for g in groups {
        hand_over(&g.raft, g.meta.id, &g.meta.members, dead, down).await;
    }
}

/// The member that campaigns when `dead` led: the lowest id not known to be down. Every
/// survivor computes the same one, so their campaigns do not split the vote.
pub fn successor(members: &[NodeId], dead: NodeId, down: &BTreeSet<NodeId>) -> Option<NodeId> {
    members
        .iter()
        .copied()
        .filter(|m| *m != dead && !down.contains(m))
        .min()
}

async fn hand_over<SM>(
    raft: &Raft<TypeConfig, SM>,
    group: u64,
    members: &[NodeId],
    dead: NodeId,
    down: &BTreeSet<NodeId>,
) where
    SM: RaftStateMachine<TypeConfig>,
{
    let (vote, leader, state) = {
        let m = raft.metrics();
        let m = m.borrow_watched();
        (m.vote, m.current_leader, m.state)
    };
    if leader != Some(dead) || state != ServerState::Follower {
        return;
    }
    let Some(to) = successor(members, dead, down) else {
        return;
    };
    info!(group, dead, to, "handing over the group of a dead leader");
    // As if the dead leader had sent it: the lease of `vote` is dropped, and `to` campaigns.
    // No last log id: `to` campaigns whatever its log; voters still refuse a stale log.
    if let Err(e) = raft
        .handle_transfer_leader(TransferLeaderRequest::new(vote, to, None))
        .await
    {
        warn!(group, "handover: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_survivor_picks_the_same_successor() {
        let none = BTreeSet::new();
        assert_eq!(successor(&[1, 2, 3], 1, &none), Some(2));
        assert_eq!(successor(&[3, 1, 2], 2, &none), Some(1));
        let down: BTreeSet<NodeId> = [2].into();
        assert_eq!(successor(&[1, 2, 3, 4, 5], 1, &down), Some(3));
        assert_eq!(successor(&[1], 1, &none), None);
    }

    #[tokio::test]
    async fn a_closed_port_refuses_and_an_open_one_does_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap().to_string();
        assert!(!refuses_connections(&open).await);
        drop(listener);
        assert!(refuses_connections(&open).await);
    }
}
