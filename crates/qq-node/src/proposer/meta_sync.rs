//! The metadata's reach across the nodes: a change waits until every node it reaches has
//! applied it ([`Proposer::propose_meta`]); a node whose view may trail the cluster's catches
//! up to the metadata leader's read index ([`Proposer::catch_up_meta`]); and the node-to-node
//! QueueInfo of group 0 answers both (applied index, or read index).

use std::time::Duration;

use openraft::ReadPolicy;
use qq_core::NodeId;
use qq_proto::internal::{QueueInfoReply, QueueInfoRequest};
use qq_raft::META_GROUP;

use super::Proposer;
use crate::codec::{decode, encode};

/// How long a metadata change waits for reachable nodes to apply it.
const META_PROPAGATION_WAIT: Duration = Duration::from_secs(3);
/// How long a peer asked for a metadata index holds its answer until it has applied it.
const META_APPLIED_WAIT: Duration = Duration::from_millis(500);

impl Proposer {
    /// Wait (up to [`META_PROPAGATION_WAIT`]) until every reachable node applied the metadata
    /// `index`: all peers at once, each asked to answer as soon as it has applied it (a peer
    /// that does not wait, an older version, is asked again after 10 ms).
    pub(super) async fn wait_meta_applied_everywhere(&self, index: u64) {
        let deadline = self.clock.now() + META_PROPAGATION_WAIT;
        let waits = self
            .peers
            .ids()
            .into_iter()
            .filter(|id| *id != self.id)
            .map(|id| self.wait_peer_meta_applied(id, index, deadline));
        // Here too: a change proposed through the leader on another node has applied there.
        let here = self.wait_meta_applied_here(index, deadline);
        tokio::join!(futures::future::join_all(waits), here);
    }

    async fn wait_peer_meta_applied(&self, id: NodeId, index: u64, deadline: tokio::time::Instant) {
        loop {
            let Some(mut client) = self.peers.client(id) else {
                return;
            };
            let asked = self.clock.now();
            let mut req = tonic::Request::new(QueueInfoRequest {
                group: META_GROUP,
                with_digest: false,
                wait_applied: index,
                read_index: false,
            });
            req.set_timeout(META_APPLIED_WAIT + Duration::from_millis(500));
            let applied = match client.queue_info(req).await {
                Ok(r) => decode::<u64>(&r.into_inner().payload).ok(),
                Err(_) => None, // unreachable: it catches up when it returns
            };
            match applied {
                Some(a) if a >= index => return,
                None => return,
                Some(_) if self.clock.now() >= deadline => return,
                Some(_) if self.clock.elapsed(asked) < Duration::from_millis(10) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Some(_) => {}
            }
        }
    }

    /// Catches this node's view of the metadata up with every change committed before now (a
    /// follower read): gets the metadata leader's read index (its leadership confirmed by a
    /// quorum, so no change a client was told is done lies beyond it), then waits until
    /// `deadline` to have applied that much here. False if this node did not get there (no
    /// leader reachable, or it cannot follow the leader right now).
    pub async fn catch_up_meta(&self, deadline: tokio::time::Instant) -> bool {
        let Some(index) = self.meta_read_index(deadline).await else {
            return false;
        };
        self.wait_meta_applied_here(index, deadline).await;
        self.view.applied_index() >= index
    }

    /// The metadata leader's read index: from this node if it leads, else asked of the leader
    /// it knows (which may name another), until `deadline`.
    async fn meta_read_index(&self, deadline: tokio::time::Instant) -> Option<u64> {
        loop {
            let mut ask = self.registry.known_leader(META_GROUP);
            for _ in 0..=self.peers.ids().len() {
                let Some(to) = ask.take() else { break };
                if to == self.id {
                    if let Some(index) = self.local_meta_read_index().await {
                        return Some(index);
                    }
                    break;
                }
                match self.peer_meta_read_index(to, deadline).await {
                    Ok(index) => return Some(index),
                    Err(forward_to) => ask = forward_to,
                }
            }
            if self.clock.now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// This node's read index for the metadata, if it leads it (confirmed by a quorum).
    async fn local_meta_read_index(&self) -> Option<u64> {
        let (read, _) = self
            .registry
            .meta_raft()
            .get_read_log_id(ReadPolicy::ReadIndex)
            .await
            .ok()?;
        Some(read.index())
    }

    /// Peer `id`'s read index for the metadata; Err names the leader it knows, if any.
    async fn peer_meta_read_index(
        &self,
        id: NodeId,
        deadline: tokio::time::Instant,
    ) -> Result<u64, Option<NodeId>> {
        let mut client = self.peers.client(id).ok_or(None)?;
        let mut req = tonic::Request::new(QueueInfoRequest {
            group: META_GROUP,
            with_digest: false,
            wait_applied: 0,
            read_index: true,
        });
        req.set_timeout(deadline.saturating_duration_since(self.clock.now()));
        let reply = client.queue_info(req).await.map_err(|_| None)?.into_inner();
        if reply.error.is_empty() && reply.forward_to == 0 {
            return decode::<u64>(&reply.payload).map_err(|_| None);
        }
        Err((reply.forward_to != 0).then_some(reply.forward_to))
    }

    /// Until this node applied the metadata `index`, at most until `deadline`.
    pub(super) async fn wait_meta_applied_here(&self, index: u64, deadline: tokio::time::Instant) {
        let mut applied = self.view.subscribe();
        let _ = tokio::time::timeout_at(deadline, async {
            loop {
                applied.borrow_and_update();
                if self.view.applied_index() >= index || applied.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }

    /// `Internal.QueueInfo` for the metadata group: this node's applied index, once it reaches
    /// `wait_applied` or after [`META_APPLIED_WAIT`]; with `read_index`, the read index if this
    /// node leads the metadata, else the leader it knows in `forward_to`.
    pub(super) async fn serve_meta_info(
        &self,
        wait_applied: u64,
        read_index: bool,
    ) -> QueueInfoReply {
        let mut reply = QueueInfoReply::default();
        reply.version = crate::VERSION.to_string();
        if read_index {
            match self.local_meta_read_index().await {
                Some(index) => {
                    if let Ok(b) = encode(&index) {
                        reply.payload = b.into();
                    }
                }
                None => match self.registry.known_leader(META_GROUP) {
                    Some(l) if l != self.id => reply.forward_to = l,
                    _ => reply.error = "no metadata leader known here".to_string(),
                },
            }
            return reply;
        }
        if wait_applied > 0 {
            let deadline = self.clock.now() + META_APPLIED_WAIT;
            self.wait_meta_applied_here(wait_applied, deadline).await;
        }
        if let Ok(b) = encode(&self.view.applied_index()) {
            reply.payload = b.into();
        }
        reply
    }
}
