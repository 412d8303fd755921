//! Is this node serving? SERVING once its metadata has caught up with the cluster's
//! ([`crate::node::Node::meta_synced`]), it is a voter of the metadata group and sees a metadata leader it
//! can reach; NOT_SERVING before that, while it sees none (an election), and from
//! the moment it starts to shut down.
//!
//! "Sees a leader" is Raft's `current_leader`, checked against the peer links of
//! [`crate::peer::liveness`]: a follower must have its watch stream to the leader open, a
//! leader must reach a majority of the voters. Raft alone would not do: a node keeps the last
//! leader it knew (its vote, persisted) while it is cut off, and after a restart while the
//! others are down, and Pre-Vote keeps it from changing that vote.
//!
//! One task follows the metadata group's Raft metrics watch and the peer links (no polling: it
//! wakes when either changes) and publishes the answer twice: to `grpc.health.v1.Health` (for
//! the overall service `""` and for `qq.v1.Broker`) and to a `watch` that `GET /healthz` reads.
//! It also counts this node's elections as metadata leader ([`crate::metrics`]).
//!
//! Must not: take part in deciding anything (clients are not refused because of it).

use std::collections::BTreeSet;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use qq_proto::v1::broker_server::SERVICE_NAME as BROKER_SERVICE;
use tokio::sync::watch;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::info;

use super::Observed;
use crate::metrics;
use crate::peer::liveness::{PeerLinks, reaches_majority};
use qq_core::NodeId;

/// The health services' names: the whole server and the client API.
const SERVICES: [&str; 2] = ["", BROKER_SERVICE];

/// Follow the metadata group and the peer links until the node stops; `serving` gets every
/// change.
pub async fn run(
    node: Observed,
    reporter: HealthReporter,
    mut links: PeerLinks,
    serving: watch::Sender<bool>,
) {
    let id = node.id();
    let mut raft_metrics = node.registry().meta_raft().metrics();
    let mut synced = node.meta_synced();
    let mut was_leader = false;
    let mut voters_seen: Option<Vec<NodeId>> = None;
    let mut published: Option<bool> = None;
    // A node without peers has no link to watch: its sender is gone from the start.
    let mut links_open = true;
    loop {
        let (now_serving, leading, term, voters) = {
            let m = raft_metrics.borrow_watched();
            let voters: Vec<NodeId> = m.membership_config.voter_ids().collect();
            let leading = m.state == ServerState::Leader;
            let linked = links.borrow();
            (
                *synced.borrow() && is_serving(id, &voters, m.current_leader, leading, &linked),
                leading,
                m.current_term,
                voters,
            )
        };
        if leading && !was_leader {
            metrics::became_leader(metrics::META);
            // One line per leader change of the metadata group (group 0), from the new leader.
            info!(
                group = 0,
                kind = "metadata",
                leader = id,
                term,
                "leader changed"
            );
        }
        if leading
            && voters_seen
                .as_ref()
                .is_some_and(|v| !v.is_empty() && *v != voters)
        {
            info!(
                group = 0,
                kind = "metadata",
                ?voters,
                term,
                "membership changed"
            );
        }
        voters_seen = Some(voters);
        was_leader = leading;
        if published != Some(now_serving) {
            info!(
                serving = now_serving,
                "health: {}",
                status_name(now_serving)
            );
            publish(&reporter, now_serving).await;
            serving.send_replace(now_serving);
            published = Some(now_serving);
        }
        tokio::select! {
            changed = raft_metrics.changed() => if changed.is_err() { break },
            // Once caught up it stays so (a latch): stop watching then.
            _ = synced.changed(), if !*synced.borrow() => {}
            changed = links.changed(), if links_open => links_open = changed.is_ok(),
            _ = node.stopping().cancelled() => break,
        }
    }
    // Stopping: say so, then end every Watch stream (they would hold the server's drain up).
    publish(&reporter, false).await;
    serving.send_replace(false);
    let mut reporter = reporter;
    for service in SERVICES {
        reporter.clear_service_status(service).await;
    }
}

/// Joined (a voter of the metadata group) and a metadata leader it reaches: itself leading
/// while it reaches a majority, or a leader whose watch stream is open.
pub fn is_serving(
    me: NodeId,
    voters: &[NodeId],
    leader: Option<NodeId>,
    leading: bool,
    linked: &BTreeSet<NodeId>,
) -> bool {
    if !voters.contains(&me) {
        return false;
    }
    match leader {
        None => false,
        Some(leader) if leader == me => leading && reaches_majority(voters, me, linked),
        Some(leader) => linked.contains(&leader),
    }
}

/// Make a reporter whose services start NOT_SERVING (tonic-health starts `""` as SERVING).
pub async fn not_serving_reporter(reporter: &HealthReporter) {
    publish(reporter, false).await;
}

async fn publish(reporter: &HealthReporter, serving: bool) {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    for service in SERVICES {
        reporter.set_service_status(service, status).await;
    }
}

fn status_name(serving: bool) -> &'static str {
    if serving {
        "SERVING (joined, metadata leader known)"
    } else {
        "NOT_SERVING (no metadata leader seen, or not a member yet)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_needs_membership_and_a_reachable_leader() {
        let voters = [1, 2, 3];
        let linked = |ids: &[NodeId]| ids.iter().copied().collect::<BTreeSet<_>>();
        // Not initialised yet: no voters, no leader.
        assert!(!is_serving(2, &[], None, false, &linked(&[])));
        // Not a voter.
        assert!(!is_serving(4, &voters, Some(1), false, &linked(&[1])));
        // An election: no leader.
        assert!(!is_serving(2, &voters, None, false, &linked(&[1, 3])));
        // Following a leader it reaches, and one it does not (cut off, or restarted alone).
        assert!(is_serving(2, &voters, Some(1), false, &linked(&[1])));
        assert!(!is_serving(2, &voters, Some(1), false, &linked(&[3])));
        // Leading with a majority, and alone.
        assert!(is_serving(1, &voters, Some(1), true, &linked(&[3])));
        assert!(!is_serving(1, &voters, Some(1), true, &linked(&[])));
        // A committed vote for itself from before a restart, not (yet) leading.
        assert!(!is_serving(1, &voters, Some(1), false, &linked(&[2, 3])));
        // A single-node cluster.
        assert!(is_serving(1, &[1], Some(1), true, &linked(&[])));
    }
}
