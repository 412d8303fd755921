//! What every node says of its own replicas: `ClusterStatus` of each node, each queue's
//! members and, per member node, its replica's applied index and state digest. Read by the
//! wipe (wait until every replica caught up) and by the final check (replicas agree).

use std::collections::BTreeMap;
use std::time::Duration;

use qq_client::Client;

/// One queue: how many members it has, (applied index, state digest) per member node that
/// reported its replica, and the invariants a replica broke (by node).
#[derive(Debug, Default)]
pub struct Queue {
    pub members: usize,
    pub replicas: BTreeMap<u64, (u64, u64)>,
    pub broken: BTreeMap<u64, String>,
}

/// Every queue by name, from the `ClusterStatus` of every node (each call bounded by
/// `call_timeout`). Err names a node that did not answer.
pub async fn views(
    clients: &[Client],
    call_timeout: Duration,
) -> Result<BTreeMap<String, Queue>, String> {
    let mut seen: BTreeMap<String, Queue> = BTreeMap::new();
    for c in clients {
        match tokio::time::timeout(call_timeout, c.cluster_status()).await {
            Ok(Ok(s)) => {
                for q in s.queues {
                    let entry = seen.entry(q.name).or_default();
                    entry.members = q.members.len();
                    if q.local_member {
                        entry
                            .replicas
                            .insert(s.node_id, (q.local_last_applied, q.local_state_digest));
                        if !q.local_invariant_error.is_empty() {
                            entry.broken.insert(s.node_id, q.local_invariant_error);
                        }
                    }
                }
            }
            _ => return Err(format!("{} did not answer", c.address())),
        }
    }
    Ok(seen)
}
