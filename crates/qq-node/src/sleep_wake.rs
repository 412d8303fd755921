//! The messages between the replicas of an idle queue group about its sleep (a replica's
//! residency, Awake / Asleep / Unloaded, is [`crate::groups::residency`]'s): a leader asking
//! its followers to sleep ([`try_sleep`]), and a sleeping follower asked for a vote, or whose
//! leader's node went silent, asking that node to wake ([`confirm_leader`]). Both travel as
//! Raft messages of kinds `SLEEP` and `WAKE` on the internal service, with a short timeout:
//! an answer that does not come counts as "no".
//!
//! Must not: decide when a group sleeps (the leader actor does) or wake a replica by itself
//! (the residency machine decides what an answer means).

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use qq_core::NodeId;
use qq_proto::internal::{RaftKind, RaftRequest};
use qq_raft::GroupId;
use qq_raft::network::Peers;
use tracing::debug;

use crate::clock::Clock;
use crate::groups::registry::{QueueRaft, holds_whole_log};
use crate::groups::residency::{ResidencyCell, SleepRequest};

/// How long the leader waits for its followers' answers to a [`SleepRequest`], and a sleeping
/// follower asked for a vote for its leader's answer to a wake (shorter than a candidate's
/// vote timeout).
pub const ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// As the leader of an idle group: put it to sleep if every condition holds (module docs).
/// Returns whether it sleeps now.
pub async fn try_sleep(
    group: GroupId,
    raft: &QueueRaft,
    residency: &ResidencyCell,
    peers: &Peers,
    me: NodeId,
    clock: Clock,
) -> bool {
    let (begun, in_flight) = residency.writes();
    if in_flight > 0 || residency.is_asleep() {
        return false;
    }
    let (req, followers, voters) = {
        let m = raft.metrics();
        let m = m.borrow_watched();
        if m.state != ServerState::Leader || m.current_leader != Some(me) {
            return false;
        }
        let membership = m.membership_config.membership();
        // No joint configuration, no learner: those are changes in progress.
        if membership.get_joint_config().len() != 1 || membership.learner_ids().next().is_some() {
            return false;
        }
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let last = m.last_log_index;
        if m.local_committed.as_ref().map(|l| l.index) != last {
            return false;
        }
        let followers: Vec<NodeId> = voters.iter().copied().filter(|v| *v != me).collect();
        // A majority (this node included) holds the whole log. A follower that is down never
        // matches; requiring all of them kept every group with a member down awake, and
        // heartbeating, for as long as it was down (found with 10 000 queues and a node
        // killed). A live follower out of step answers the SLEEP below with no.
        let matched = followers
            .iter()
            .filter(|f| holds_whole_log(&m, **f))
            .count();
        if (matched + 1) * 2 <= voters.len() {
            return false;
        }
        (
            SleepRequest {
                vote: m.vote.clone(),
                committed: m.local_committed.clone(),
            },
            followers,
            voters.len(),
        )
    };
    let payload = match postcard::to_stdvec(&req) {
        Ok(p) => p,
        Err(_) => return false,
    };
    let answers = futures::future::join_all(followers.iter().map(|f| {
        let payload = payload.clone();
        async move { ask::<bool>(peers, *f, group, RaftKind::Sleep, payload, ASK_TIMEOUT).await }
    }))
    .await;
    let mut slept = 1; // this node
    for a in &answers {
        match a {
            Some(true) => slept += 1,
            Some(false) => return false, // awake and not in step: not idle after all
            None => {}                   // no answer: down or cut off; liveness wakes us
        }
    }
    if slept * 2 <= voters {
        return false;
    }
    let slept = residency.sleep_as_leader(raft, begun, &req, clock.now());
    if slept {
        debug!(group, "group sleeps");
    }
    slept
}

/// As sleeping followers of `leader` (asked for a vote, or the node-level link to it silent or
/// broken): ask it to wake `groups`. Returns those it answered that it leads (and heartbeats
/// again); none when it did not answer within `wait`. One message for all of them.
pub async fn confirm_leader(
    peers: &Peers,
    leader: NodeId,
    groups: Vec<GroupId>,
    wait: Duration,
) -> BTreeSet<GroupId> {
    let Ok(payload) = postcard::to_stdvec(&groups) else {
        return BTreeSet::new();
    };
    ask::<Vec<GroupId>>(peers, leader, 0, RaftKind::Wake, payload, wait)
        .await
        .map(|led| led.into_iter().collect())
        .unwrap_or_default()
}

/// One SLEEP or WAKE message; None when the peer did not answer (or not in kind).
async fn ask<T: serde::de::DeserializeOwned>(
    peers: &Peers,
    to: NodeId,
    group: GroupId,
    kind: RaftKind,
    payload: Vec<u8>,
    wait: Duration,
) -> Option<T> {
    let request = RaftRequest {
        group,
        kind: kind as i32,
        payload: payload.into(),
    };
    let reply = peers.raft_call(to, request, wait).await.ok()?;
    if !reply.error.is_empty() {
        return None;
    }
    postcard::from_bytes::<T>(&reply.payload).ok()
}
