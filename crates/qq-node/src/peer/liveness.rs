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
//! the successor campaigns at once with votes that ignore the lease. A partition (timeouts, no
//! refusal) or a paused process (the kernel still accepts) never triggers it; then the election
//! timeout applies as before.
//!
//! Right then, the node opens a fresh connection to every other member. It acts only for groups
//! where it and the members that accepted are a majority: a node cut off by a firewall that
//! *rejects* (which also looks like a refused connection) finds every peer refusing, and must
//! not campaign past Pre-Vote and come back with a raised term. The successor is the lowest id
//! among the node and the members that accepted, so the survivors of a crash, which reach each
//! other, pick the same one and do not split the vote. Raft's safety does not depend on any of
//! this: a wrong call costs at most an unnecessary election.
//!
//! The watch is also the node-level heartbeat that sleeping queue groups rely on
//! ([`crate::groups::residency`]): the peer sends an event every `heartbeat_ms`. A link with no
//! event for `election_timeout_max_ms` (the peer frozen, cut off, or only slow), or a broken
//! one, wakes the sleeping groups the peer leads (they elect if it is gone) and those this node
//! leads with it (they notice a lost quorum); only a broken stream counts as a lost link;
//! a link that (re)opens wakes the (loaded) groups this node leads with that peer, so a
//! returning node hears its leaders before its election timers run out. One stream per node pair, however
//! many groups.
//!
//! The peers whose watch is open right now are published ([`PeerLinks`]) for the node's health
//! ([`crate::observe::health`]): a node is healthy only while it reaches its metadata leader.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use futures::StreamExt;
use futures::future::BoxFuture;
use openraft::alias::VoteOf;
use openraft::async_runtime::WatchReceiver;
use openraft::raft::TransferLeaderRequest;
use openraft::storage::RaftStateMachine;
use openraft::{Raft, ServerState};
use qq_core::NodeId;
use qq_proto::internal::WatchRequest;
use qq_raft::transport::Transport;
use qq_raft::{GroupId, META_GROUP, TypeConfig};
use tracing::{debug, info, warn};

use super::peering::Peering;
use crate::clock::Clock;
use crate::groups::registry::{Replica, holds_whole_log};
use crate::sleep_wake;

/// Pause between two attempts to open the watch of a peer that is down or unreachable.
const RETRY: Duration = Duration::from_millis(100);
/// How long a silent peer has to confirm that it still leads the groups that sleep here.
const CONFIRM_WAIT: Duration = Duration::from_secs(1);
/// How long the probe waits for a TCP connection before calling the peer merely unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The peers whose watch stream is open now: they answered and have not gone since (a cut
/// connection is noticed by HTTP/2 keep-alive, within about 15 s).
pub type PeerLinks = watch::Receiver<BTreeSet<NodeId>>;

/// Start one watch per peer, and one for each node that joins later (a watch ends when its
/// peer is forgotten).
pub fn spawn_peer_watches(node: Peering, clients: Arc<dyn Transport>) -> PeerLinks {
    let (links, linked) = watch::channel(BTreeSet::new());
    let stopping = node.stopping().clone();
    let tasks = node.tasks().clone();
    tasks.spawn(async move {
        stopping
            .clone()
            .run_until_cancelled(watch_peer_set(node, links, clients))
            .await;
    });
    linked
}

/// Keep one [`watch_peer`] task per peer as the peer set changes.
async fn watch_peer_set(
    node: Peering,
    links: watch::Sender<BTreeSet<NodeId>>,
    clients: Arc<dyn Transport>,
) {
    let mut changes = node.peers().subscribe();
    let mut watched: BTreeSet<NodeId> = BTreeSet::new();
    loop {
        let current: BTreeSet<NodeId> = node.peers().ids().into_iter().collect();
        watched.retain(|p| current.contains(p));
        for peer in current {
            if peer != node.id() && watched.insert(peer) {
                let stopping = node.stopping().clone();
                let watch = watch_peer(node.clone(), peer, links.clone(), clients.clone());
                node.tasks().spawn(async move {
                    stopping.run_until_cancelled(watch).await;
                });
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

async fn watch_peer(
    node: Peering,
    peer: NodeId,
    links: watch::Sender<BTreeSet<NodeId>>,
    clients: Arc<dyn Transport>,
) {
    let Some(address) = node.peers().address(peer) else {
        return;
    };
    let Some(mut client) = node.peers().watch_client(peer) else {
        return;
    };
    // Whether the peer refused a connection since its watch last broke (for the log only).
    let mut down = false;
    // The peer sends an event every heartbeat interval; none for the longest election timeout
    // and it is silent (shorter woke followers of peers that were only slow on a loaded
    // machine, which then elected: found by qq-chaos with 1 000 idle queues).
    let silence = Duration::from_millis(node.config().election_timeout_max_ms);
    // Ends when the peer is forgotten (ForgetNode).
    while node.peers().contains(peer) {
        if let Ok(response) = client.watch(WatchRequest { from: node.id() }).await {
            if std::mem::take(&mut down) {
                info!(peer, "peer is serving again");
            }
            links.send_modify(|open| {
                open.insert(peer);
            });
            // Back (or first seen): the groups led here with it must reach it soon.
            spawn_wake_led_with(&node, peer);
            let mut events = response.into_inner();
            // Silent (no event for `silence`), the peer may be frozen or cut off, or only
            // slow: the groups that depend on it wake, and Raft's own timers decide; the link
            // stays open (and counted) until the stream breaks.
            let mut silent = false;
            loop {
                match tokio::time::timeout(silence, events.next()).await {
                    Ok(Some(Ok(event))) => {
                        silent = false;
                        node.peer_machines().record(
                            peer,
                            event.machine_version,
                            event.meta_machine_version,
                        );
                    }
                    Ok(_) => break,
                    Err(_) if !silent => {
                        silent = true;
                        let linked = links.borrow().clone();
                        let woke = wake_leaders_without_quorum(&node, peer, &linked).await
                            + wake_followers_of(&node, peer, &linked).await;
                        info!(
                            peer,
                            ?silence,
                            woke,
                            "peer silent: woke the sleeping groups that depend on it"
                        );
                    }
                    Err(_) => {}
                }
            }
            links.send_modify(|open| {
                open.remove(&peer);
            });
            node.peer_machines().forget(peer);
            // Lost: the sleeping groups it leads must elect, those led here must notice a
            // lost quorum, as awake groups do. When its port refuses (the process is gone),
            // the handover below elects the groups it led, paced; waking them too would start
            // a second, unpaced round of elections.
            let linked = links.borrow().clone();
            let mut woke = wake_leaders_without_quorum(&node, peer, &linked).await;
            if probe(&*clients, &address).await != Probe::Refused {
                woke += wake_followers_of(&node, peer, &linked).await;
            }
            if woke > 0 {
                info!(
                    peer,
                    woke, "link to peer lost: woke the sleeping groups that depend on it"
                );
            }
        }
        if probe(&*clients, &address).await == Probe::Refused {
            if !std::mem::replace(&mut down, true) {
                warn!(
                    peer,
                    "peer refuses connections (its process is gone, or a firewall rejects): \
                     groups it led hand over where this node reaches a majority"
                );
            }
            hand_over_from(&node, peer, &*clients).await;
        }
        tokio::time::sleep(RETRY).await;
    }
    links.send_modify(|open| {
        open.remove(&peer);
    });
}

/// The link to `peer` is silent or broken: of the sleeping groups led here with `peer` as a
/// member, only those where this node and the members it still links to are no majority wake
/// (they must step down when their lease runs out, as awake ones do); the others keep their
/// quorum and sleep on (waking them all made thousands of leaders heartbeat at once). Returns
/// how many woke.
async fn wake_leaders_without_quorum(
    node: &Peering,
    peer: NodeId,
    linked: &BTreeSet<NodeId>,
) -> usize {
    let me = node.id();
    let reach: BTreeSet<NodeId> = linked.iter().copied().filter(|p| *p != peer).collect();
    let mut woke = 0;
    // Unloaded ones among them are loaded first (as the leaders they were).
    node.registry()
        .load_where(|d| {
            d.metrics.state == ServerState::Leader
                && d.meta.members.contains(&peer)
                && !reaches_majority(&d.meta.members, me, &reach)
        })
        .await;
    for g in node.registry().queues() {
        if g.residency.is_asleep()
            && g.meta.members.contains(&peer)
            && !reaches_majority(&g.meta.members, me, &reach)
            && g.raft.metrics().borrow_watched().state == ServerState::Leader
            && g.residency.wake_to_lead()
        {
            woke += 1;
        }
    }
    woke
}

/// The link to `peer` is silent or broken, and its port does not refuse (it may be frozen, cut
/// off or only slow): the sleeping groups it leads here. It is asked first, and those it
/// confirms within [`CONFIRM_WAIT`] sleep on. Of the rest, this node wakes only the groups
/// where it is the successor (the lowest id among itself and the members it links to, as in a
/// handover) and where those are a majority: one campaigner per group instead of every
/// survivor at once, woken [`WAKE_CHUNK`] at a time. The other survivors wake when asked for
/// their vote, or after [`FALLBACK_WAKE`] if still nobody leads.
///
/// Returns how many woke at once.
async fn wake_followers_of(node: &Peering, peer: NodeId, linked: &BTreeSet<NodeId>) -> usize {
    let me = node.id();
    let reach: BTreeSet<NodeId> = linked.iter().copied().filter(|p| *p != peer).collect();
    let registry = node.registry();
    let mut woke = 0;
    let followed = registry.asleep_led_by(peer);
    if followed.is_empty() {
        return woke;
    }
    let confirmed =
        sleep_wake::confirm_leader(node.peers(), peer, followed.clone(), CONFIRM_WAIT).await;
    let (mine, others): (Vec<_>, Vec<_>) = followed
        .into_iter()
        .filter(|g| !confirmed.contains(g))
        .filter_map(|g| registry.replica(g))
        .map(|r| r.meta().clone())
        .partition(|meta| {
            let members: Vec<NodeId> = meta
                .members
                .iter()
                .copied()
                .filter(|m| *m != peer)
                .collect();
            reaches_majority(&meta.members, me, &reach)
                && successor(&members, me, &reach) == Some(me)
        });
    let mine: Vec<GroupId> = mine.iter().map(|meta| meta.id).collect();
    for chunk in mine.chunks(WAKE_CHUNK) {
        woke += registry.wake_groups(chunk).await;
        tokio::time::sleep(WAKE_PAUSE).await;
    }
    fall_back(node, peer, others.iter().map(|meta| meta.id).collect());
    woke
}

/// After [`FALLBACK_WAKE`], wakes those of `groups` that still sleep following `peer` (their
/// successor did not elect), [`WAKE_CHUNK`] at a time.
fn fall_back(node: &Peering, peer: NodeId, groups: Vec<GroupId>) {
    if groups.is_empty() {
        return;
    }
    let tracker = node.tasks().clone();
    let node = node.clone();
    tracker.spawn(async move {
        tokio::time::sleep(FALLBACK_WAKE).await;
        let still = node.registry().asleep_led_by(peer);
        let late: Vec<_> = groups.into_iter().filter(|g| still.contains(g)).collect();
        let mut n = 0;
        for chunk in late.chunks(WAKE_CHUNK) {
            n += node.registry().wake_groups(chunk).await;
            tokio::time::sleep(WAKE_PAUSE).await;
        }
        if n > 0 {
            info!(
                peer,
                woke = n,
                "groups of a lost leader still without one: woke them"
            );
        }
    });
}

/// Groups woken at once to campaign after their leader's node was lost, and the pause between
/// two such chunks: thousands of simultaneous elections on a small machine time each other
/// out (found with 10 000 queues: none of 3 334 failed over in 120 s).
const WAKE_CHUNK: usize = 64;
const WAKE_PAUSE: Duration = Duration::from_millis(50);
/// When a survivor that is not a group's successor wakes it anyway, if nobody leads it yet.
const FALLBACK_WAKE: Duration = Duration::from_secs(5);

#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// A TCP connection was established.
    Accepted,
    /// Actively refused: nothing listens there (or a firewall rejects).
    Refused,
    /// Any other failure, or no answer within [`PROBE_TIMEOUT`].
    NoAnswer,
}

/// Try a fresh connection to `address` (TCP, or what the node's client transport makes).
async fn probe(clients: &dyn Transport, address: &str) -> Probe {
    match tokio::time::timeout(PROBE_TIMEOUT, clients.probe(address)).await {
        Ok(Ok(_)) => Probe::Accepted,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Probe::Refused,
        Ok(Err(_)) | Err(_) => Probe::NoAnswer,
    }
}

/// For every group in which this node follows `dead`, start the handover: the metadata group
/// first, then the queue groups. Where another survivor is the successor, this node only drops
/// the dead leader's lease (cheap, at once) and wakes the group later if nobody elected it.
/// Where this node is the successor, it campaigns for at most [`HANDOVER_WINDOW`] groups at a
/// time and starts the next as earlier ones get a leader: thousands of elections started at
/// once on a small machine time each other out (10 000 queues: a third never failed over).
async fn hand_over_from(node: &Peering, dead: NodeId, clients: &dyn Transport) {
    let me = node.id();
    let all = node.peers().ids();
    let meta_vote = followed_vote(node.registry().meta_raft(), dead);
    // Unloaded followers of the dead leader are loaded first (their lease is dropped, or
    // they campaign, below).
    node.registry()
        .load_where(|d| {
            d.metrics.current_leader == Some(dead) && d.metrics.state == ServerState::Follower
        })
        .await;
    let groups: Vec<_> = node
        .registry()
        .queues()
        .into_iter()
        .filter_map(|g| followed_vote(&g.raft, dead).map(|vote| (g, vote)))
        .collect();
    if meta_vote.is_none() && groups.is_empty() {
        return;
    }
    let others = all.iter().copied().filter(|p| *p != me && *p != dead);
    let answers = futures::future::join_all(others.map(|p| async move {
        let address = node.peers().address(p).unwrap_or_default();
        (p, probe(clients, &address).await)
    }))
    .await;
    let reachable: BTreeSet<NodeId> = answers
        .into_iter()
        .filter(|(_, a)| *a == Probe::Accepted)
        .map(|(p, _)| p)
        .collect();
    if let Some(vote) = meta_vote {
        hand_over(
            node.registry().meta_raft(),
            META_GROUP,
            vote,
            &all,
            me,
            &reachable,
        )
        .await;
    }
    let (mine, others): (Vec<_>, Vec<_>) = groups.into_iter().partition(|(g, _)| {
        reaches_majority(&g.meta.members, me, &reachable)
            && successor(&g.meta.members, me, &reachable) == Some(me)
    });
    for (g, vote) in &others {
        hand_over(&g.raft, g.meta.id, *vote, &g.meta.members, me, &reachable).await;
    }
    fall_back(node, dead, others.iter().map(|(g, _)| g.meta.id).collect());

    // By group id: a group's turn may come after the unload sweep let its instance go again
    // (it slept on, untouched, for `unload_after_ms`), and the instance taken above would be
    // a stopped one (found with 10 000 queues: hundreds of "raft stopped" handovers, and their
    // groups without a leader for minutes). Each is loaded (again) and woken at its turn.
    let mine: Vec<(GroupId, VoteOf<TypeConfig>)> = mine
        .into_iter()
        .map(|(g, vote)| (g.meta.id, vote))
        .collect();
    paced(
        node.clock(),
        mine,
        |(id, vote)| {
            let (node, id, vote, reachable) = (node.clone(), *id, *vote, reachable.clone());
            Box::pin(async move {
                let Some(g) = node.registry().load(id).await else {
                    return false;
                };
                g.residency.wake();
                hand_over(&g.raft, id, vote, &g.meta.members, me, &reachable).await;
                true
            })
        },
        |(id, _)| {
            node.registry()
                .replica(*id)
                .is_none_or(|r| r.current_leader().is_some_and(|l| l != dead))
        },
    )
    .await;
}

/// Runs `start` on each of `items`, with at most [`HANDOVER_WINDOW`] of them unfinished at
/// once: one is finished when `done` says so, or [`HANDOVER_WAIT`] after its start. `start`
/// answers false when there was nothing to start for an item (it does not count). Returns how
/// many were started. Times are `clock`'s.
async fn paced<T>(
    clock: Clock,
    items: Vec<T>,
    mut start: impl FnMut(&T) -> BoxFuture<'static, bool>,
    done: impl Fn(&T) -> bool,
) -> usize {
    let mut waiting = items.into_iter();
    let mut running: Vec<(T, tokio::time::Instant)> = Vec::new();
    let mut started = 0;
    loop {
        running.retain(|(item, since)| !done(item) && clock.elapsed(*since) < HANDOVER_WAIT);
        while running.len() < HANDOVER_WINDOW {
            let Some(item) = waiting.next() else {
                break;
            };
            if start(&item).await {
                started += 1;
                running.push((item, clock.now()));
            }
        }
        if running.is_empty() {
            return started;
        }
        tokio::time::sleep(HANDOVER_POLL).await;
    }
}

/// A link with `peer` (re)opened, in either direction: the sleeping groups led here with it
/// wake, so that a restarted or returning peer hears its leaders (and catches up) before its
/// election timers run out. At most [`HANDOVER_WINDOW`] at a time: the next wakes as earlier
/// ones have brought the peer's replica up to date (or after [`HANDOVER_WAIT`]). Woken all at
/// once, the 6 666 groups the two survivors led with a restarted node (10 000 queues) kept
/// each other's heartbeats timing out; a peer whose replica is not reached in time asks by a
/// vote, which a sleeping leader answers by waking.
///
/// Unloaded leaders are left asleep: one unloads only while every member holds its whole log
/// (`may_unload` in [`crate::node`]), and nothing was written since (a write loads it first),
/// so the peer's replica has all it needs. A restarted peer's replica starts asleep following
/// it; one that starts awake (it led, or its data directory was re-seeded) asks for votes,
/// and a vote request loads and wakes the leader.
pub fn spawn_wake_led_with(node: &Peering, peer: NodeId) {
    let node2 = node.clone();
    node.tasks().spawn(async move {
        let led: Vec<GroupId> = node2
            .registry()
            .replicas()
            .into_iter()
            .filter(|r| {
                matches!(r, Replica::Loaded(_))
                    && r.residency().is_asleep()
                    && r.meta().members.contains(&peer)
                    && r.state() == ServerState::Leader
            })
            .map(|r| r.meta().id)
            .collect();
        let woke = paced(
            node2.clock(),
            led,
            |id| {
                // Loaded ones only (above); one unloaded since needs nothing (below).
                if let Some(g) = node2.registry().queue(*id) {
                    g.residency.wake_to_lead();
                }
                Box::pin(std::future::ready(true))
            },
            |id| {
                // Unloaded since it was picked: it had every member up to date to unload.
                let Some(g) = node2.registry().queue(*id) else {
                    return true;
                };
                let m = g.raft.metrics();
                let m = m.borrow_watched();
                m.state != ServerState::Leader || holds_whole_log(&m, peer)
            },
        )
        .await;
        if woke > 0 {
            debug!(
                peer,
                woke, "link to peer open: woke the groups led here with it"
            );
        }
    });
}

/// Campaigns a survivor runs at once for the groups of a dead leader, how long one may take
/// before the next starts anyway, and how often they are checked.
const HANDOVER_WINDOW: usize = 128;
const HANDOVER_WAIT: Duration = Duration::from_secs(2);
const HANDOVER_POLL: Duration = Duration::from_millis(10);

/// The vote of `leader` when this node follows it in the group.
fn followed_vote<SM>(raft: &Raft<TypeConfig, SM>, leader: NodeId) -> Option<VoteOf<TypeConfig>>
where
    SM: RaftStateMachine<TypeConfig>,
{
    let m = raft.metrics();
    let m = m.borrow_watched();
    (m.current_leader == Some(leader) && m.state == ServerState::Follower).then(|| m.vote.clone())
}

/// Whether `me` and the members it reaches are a majority of `members`.
pub fn reaches_majority(members: &[NodeId], me: NodeId, reachable: &BTreeSet<NodeId>) -> bool {
    let n = members
        .iter()
        .filter(|m| **m == me || reachable.contains(m))
        .count();
    n * 2 > members.len()
}

/// The member that campaigns: the lowest id among `me` and the members it reaches.
pub fn successor(members: &[NodeId], me: NodeId, reachable: &BTreeSet<NodeId>) -> Option<NodeId> {
    members
        .iter()
        .copied()
        .filter(|m| *m == me || reachable.contains(m))
        .min()
}

/// Deliver to this node's Raft the transfer request the dead leader (whose `vote` it follows)
/// would have sent, if this node reaches a majority of the group.
async fn hand_over<SM>(
    raft: &Raft<TypeConfig, SM>,
    group: u64,
    vote: VoteOf<TypeConfig>,
    members: &[NodeId],
    me: NodeId,
    reachable: &BTreeSet<NodeId>,
) where
    SM: RaftStateMachine<TypeConfig>,
{
    if !reaches_majority(members, me, reachable) {
        debug!(
            group,
            "no handover: this node does not reach a majority of the group right now"
        );
        return;
    }
    let Some(to) = successor(members, me, reachable) else {
        return;
    };
    info!(group, to, "handing over the group of a dead leader");
    // The lease of `vote` is dropped, and `to` campaigns. If the vote changed since it was read
    // (an election happened meanwhile), Raft ignores the request. No last log id: `to`
    // campaigns whatever its log; voters still refuse a stale log.
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
        // Node 1 died; 2 and 3 reach each other: both pick 2.
        assert_eq!(successor(&[1, 2, 3], 2, &[3].into()), Some(2));
        assert_eq!(successor(&[3, 1, 2], 3, &[2].into()), Some(2));
        // Five members, 1 dead and 2 silent: 3, 4 and 5 pick 3.
        for (me, reach) in [(3, [4, 5]), (4, [3, 5]), (5, [3, 4])] {
            assert_eq!(successor(&[1, 2, 3, 4, 5], me, &reach.into()), Some(3));
        }
    }

    #[test]
    fn only_a_node_that_reaches_a_majority_hands_over() {
        let connected: BTreeSet<NodeId> = [2].into();
        // Node 1 led; node 2 still reaches node 3: 2 of 3.
        assert!(reaches_majority(&[1, 2, 3], 3, &connected));
        // Node 3 reaches nobody (a rejecting firewall makes every peer look dead).
        assert!(!reaches_majority(&[1, 2, 3], 3, &BTreeSet::new()));
        // Five members: itself and one peer are not enough, two peers are.
        assert!(!reaches_majority(&[1, 2, 3, 4, 5], 5, &connected));
        assert!(reaches_majority(&[1, 2, 3, 4, 5], 5, &[2, 4].into()));
        // Connections to nodes outside the group do not count.
        assert!(!reaches_majority(&[1, 3, 5], 5, &[2, 4].into()));
    }

    #[tokio::test]
    async fn a_closed_port_refuses_and_an_open_one_accepts() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap().to_string();
        assert_eq!(
            probe(&qq_raft::transport::TcpTransport, &open).await,
            Probe::Accepted
        );
        drop(listener);
        assert_eq!(
            probe(&qq_raft::transport::TcpTransport, &open).await,
            Probe::Refused
        );
    }
}
