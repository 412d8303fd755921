//! Live queue information, answered by the queue's leader (counts are only exact there).

use openraft::async_runtime::WatchReceiver;
use std::time::Duration;

use qq_core::queue::{Counts, Stats};
use qq_core::{NodeId, QueueConfig};
use qq_proto::internal::QueueInfoRequest;
use qq_raft::GroupId;
use serde::{Deserialize, Serialize};
use tonic::Status;

use crate::node::{Node, decode, encode};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueInfoData {
    pub counts: Counts,
    pub stats: Stats,
    pub config: QueueConfig,
    pub leader: NodeId,
    pub term: u64,
    pub commit_index: u64,
    pub last_applied: u64,
    pub digest: u64,
}

impl Node {
    /// The info as this node sees it, if it runs the group. `require_leader`: only answer as leader.
    pub fn local_queue_info(&self, group: GroupId, require_leader: bool) -> Option<QueueInfoData> {
        let g = self.queue_group(group)?;
        let m = g.raft.metrics().borrow_watched().clone();
        if require_leader && m.current_leader != Some(self.id) {
            return None;
        }
        let state = g.shared.state.lock().unwrap();
        Some(QueueInfoData {
            counts: state.counts(),
            stats: state.stats().clone(),
            config: state.config().clone(),
            leader: m.current_leader.unwrap_or(0),
            term: m.current_term,
            commit_index: m.local_committed.map(|l| l.index).unwrap_or(0),
            last_applied: m.last_applied.map(|l| l.index).unwrap_or(0),
            digest: state.digest(),
        })
    }

    /// Ask the leader of the group (wherever it is) for its info.
    pub async fn queue_info(&self, group: GroupId) -> Result<QueueInfoData, Status> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let members = self.group_members(group);
        let mut hint = self.known_leader(group);
        let mut attempt = 0usize;
        loop {
            let target = hint.unwrap_or_else(|| {
                members
                    .get(attempt % members.len().max(1))
                    .copied()
                    .unwrap_or(self.id)
            });
            if target == self.id {
                if let Some(info) = self.local_queue_info(group, true) {
                    return Ok(info);
                }
                hint = self.known_leader(group).filter(|l| *l != self.id);
            } else if let Some(mut client) = self.peers.client(target) {
                let mut req = tonic::Request::new(QueueInfoRequest { group });
                req.set_timeout(Duration::from_secs(2));
                match client.queue_info(req).await {
                    Ok(r) => {
                        let r = r.into_inner();
                        if r.error.is_empty() && r.forward_to == 0 && !r.payload.is_empty() {
                            return decode(&r.payload);
                        }
                        hint = if r.forward_to != 0 && r.forward_to != target {
                            Some(r.forward_to)
                        } else {
                            None
                        };
                    }
                    Err(_) => hint = None,
                }
            }
            attempt += 1;
            if tokio::time::Instant::now() >= deadline {
                return Err(Status::unavailable(format!(
                    "queue group {group} has no leader right now (safe to retry)"
                )));
            }
            if hint.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Serve Internal.QueueInfo.
    /// For the metadata group (0) the payload is the metadata index applied on this node.
    pub fn serve_queue_info(&self, group: GroupId) -> qq_proto::internal::QueueInfoReply {
        let mut reply = qq_proto::internal::QueueInfoReply::default();
        if group == qq_raft::META_GROUP {
            if let Ok(b) = encode(&self.meta_applied()) {
                reply.payload = b.into();
            }
            return reply;
        }
        match self.local_queue_info(group, true) {
            Some(info) => match encode(&info) {
                Ok(b) => reply.payload = b.into(),
                Err(e) => reply.error = e.message().to_string(),
            },
            None => match self.known_leader(group) {
                Some(l) if l != self.id => reply.forward_to = l,
                _ => reply.error = format!("no leader for group {group} known here"),
            },
        }
        reply
    }
}
