//! The node's dealings with openraft that hold no node state: the Raft settings, a group's
//! first initialisation, whether a replica starts asleep, and handing a leadership away.

use std::collections::BTreeMap;
use std::sync::Arc;

use openraft::async_runtime::WatchReceiver;
use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, Raft, SnapshotPolicy};
use qq_core::NodeId;
use qq_raft::TypeConfig;
use qq_raft::log_store::LogStore;
use tokio::sync::watch;
use tracing::{debug, info, info_span};

use crate::config::Config;
use crate::groups::registry::MetaRaft;
use crate::groups::residency::SleepRequest;

/// The Raft settings of every group on this node.
pub(super) fn raft_config(config: &Config) -> anyhow::Result<Arc<openraft::Config>> {
    let raft = openraft::Config {
        cluster_name: "quorumq".into(),
        heartbeat_interval: config.heartbeat_ms,
        election_timeout_min: config.election_timeout_min_ms,
        election_timeout_max: config.election_timeout_max_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_after_entries),
        max_in_snapshot_log_to_keep: 1000,
        // A node back from a partition must not depose healthy leaders (found by
        // qq-chaos: every group stalled for seconds after each heal without it).
        enable_pre_vote: Some(true),
        // A node re-seeded with an empty data directory (the procedure its refusal to start
        // on a damaged directory gives) comes back with an empty log. Without this, every
        // leader that had replicated to it panics its group's Raft core when it sees the
        // follower's log behind what it had acknowledged (found by tests/cluster/reseed.rs),
        // making the group unavailable on that node. With it, the leader starts that
        // follower's replication over (by snapshot where its log is compacted). The leader
        // still holds every committed entry, so this loses nothing; the caveat is the one the
        // procedure states: the wiped node forgot its votes and its acknowledgements, so it
        // must rejoin only while the other nodes hold a majority of every group.
        allow_log_reversion: Some(true),
        // openraft allocates its per-entry latency ring buffers (7 of this many slots, about
        // 148 KiB per group at the default 1024) whether or not its `runtime-stats` feature,
        // the only user, is on; it is off here. Every group on the node pays it, idle or not.
        log_stage_capacity: Some(1),
        ..Default::default()
    };
    Ok(Arc::new(raft.validate()?))
}

/// The Raft settings of a queue replica loaded again after an unload: the node's, with the
/// timers off (it still sleeps) and a leader restored as the leader of its term.
pub(super) fn reload_config(raft_config: &openraft::Config) -> Arc<openraft::Config> {
    Arc::new(openraft::Config {
        enable_tick: false,
        enable_heartbeat: false,
        enable_leader_restore: Some(true),
        ..raft_config.clone()
    })
}

/// Initialise the cluster's metadata group if this node has the lowest id and nothing was
/// initialised yet.
pub(super) async fn initialise_if_first(
    meta_raft: &MetaRaft,
    config: &Config,
) -> anyhow::Result<()> {
    let lowest = *config
        .node_ids()
        .first()
        .expect("validated: peers not empty");
    if lowest != config.node_id || meta_raft.is_initialized().await? {
        return Ok(());
    }
    let members: BTreeMap<u64, BasicNode> = config
        .peers
        .iter()
        .map(|p| {
            let addr = p.address.clone();
            (p.id, BasicNode { addr })
        })
        .collect();
    initialize_unless_joined(
        meta_raft,
        members,
        &info_span!("metadata", node_id = config.node_id),
    )
    .await
}

/// Initialise a group with `members` unless its replica here already takes part in one: a
/// member that was re-seeded (started with an empty data directory) or started its group late
/// can hear the leader (a vote or an append) between its Raft starting and this call, and
/// openraft then refuses to initialise; that replica is in the group already, and catches up
/// from its leader. Found by qq-chaos `wipe-rejoin`: the refusal used to end the group's
/// start-up before its leadership watch ran, so when that replica later led the queue, no
/// leader actor ran (held dead letters never moved, the queue stopped draining).
pub(super) async fn initialize_unless_joined<SM>(
    raft: &Raft<TypeConfig, SM>,
    members: BTreeMap<u64, BasicNode>,
    span: &tracing::Span,
) -> anyhow::Result<()>
where
    SM: openraft::storage::RaftStateMachine<TypeConfig>,
{
    // openraft checks and initialises in one step on its core: checking first here would leave
    // the window open.
    match raft.initialize(members.clone()).await {
        Ok(()) => {
            span.in_scope(|| info!(?members, "initialised the group"));
            Ok(())
        }
        Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
            span.in_scope(|| debug!("not initialised: the group has begun here already ({e})"));
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// A replica starting here (the node starts) that may start asleep: what its leader would
/// have asked it to sleep with. That is when its persisted vote is committed and names another
/// node, and its whole log is committed: it followed that leader with nothing pending, as a
/// sleeping follower does ([`crate::groups::residency`]). Started awake instead, the replicas of a
/// restarted node hosting thousands of queues all ran their election timers before their
/// leaders (themselves asleep and unloaded) could reach them, and their pre-votes made every
/// peer load the replicas they asked.
///
/// A vote that is stale (another leader was elected while this node was down) is safe: that
/// leader's first append carries its newer vote and wakes the replica, and a leader with a
/// member behind is woken when that member's link opens ([`crate::peer::liveness`]).
pub(super) async fn follower_asleep_at_start(
    mut log: LogStore,
    me: NodeId,
) -> Option<SleepRequest> {
    use openraft::storage::{RaftLogReader, RaftLogStorage};
    let vote = log.read_vote().await.ok()??;
    let committed = log.read_committed().await.ok()?;
    let last = log.get_log_state().await.ok()?.last_log_id;
    let leader = vote.leader_id().node_id;
    (vote.is_committed() && leader != me && committed.is_some() && committed == last)
        .then_some(SleepRequest { vote, committed })
}

/// If `raft` leads its group, ask the voter with the most replicated log to take over; a
/// receiver that turns false once this node no longer leads.
pub(super) async fn transfer_away<SM>(
    raft: &Raft<TypeConfig, SM>,
    me: NodeId,
) -> Option<watch::Receiver<bool>>
where
    SM: openraft::storage::RaftStateMachine<TypeConfig>,
{
    let m = raft.metrics().borrow_watched().clone();
    if m.state != openraft::ServerState::Leader {
        return None;
    }
    let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
    let matched = |id: &NodeId| {
        m.replication
            .as_ref()
            .and_then(|r| r.get(id).cloned().flatten())
            .map(|l| l.index)
    };
    let to = voters
        .iter()
        .copied()
        .filter(|v| *v != me)
        .max_by_key(|v| (matched(v), std::cmp::Reverse(*v)))?;
    raft.trigger().transfer_leader(to).await.ok()?;
    let (tx, rx) = watch::channel(true);
    let mut metrics = raft.metrics();
    tokio::spawn(async move {
        loop {
            if metrics.borrow_watched().state != openraft::ServerState::Leader {
                let _ = tx.send(false);
                return;
            }
            if metrics.changed().await.is_err() {
                let _ = tx.send(false);
                return;
            }
        }
    });
    Some(rx)
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorage;
    use qq_core::QueueConfig;

    use std::collections::BTreeSet;
    use std::time::Duration;

    use openraft::ServerState;
    use qq_raft::GroupId;
    use qq_raft::network::{GroupNetwork, Peers};
    use qq_raft::store::Store;

    use super::*;
    use crate::groups::queue_sm::QueueMachine;
    use crate::groups::shell::Shell;

    const GROUP: GroupId = 7;

    /// A peer set without peers: these tests' groups have one voter.
    fn no_peers() -> Peers {
        let transport = Arc::new(qq_raft::transport::TcpTransport);
        Peers::new(Vec::new(), None, transport, crate::clock::Clock::system()).unwrap()
    }

    async fn queue_raft(store: &Store) -> Raft<TypeConfig, Shell<QueueMachine>> {
        let config = Config::for_tests("insecure_cluster = true").unwrap();
        Raft::new(
            1,
            raft_config(&config).unwrap(),
            GroupNetwork {
                group: GROUP,
                peers: no_peers(),
            },
            LogStore::new(store.clone(), GROUP),
            Shell::new(QueueMachine::new(
                GROUP,
                store.clone(),
                QueueConfig::new("/", "q"),
            )),
        )
        .await
        .unwrap()
    }

    fn members() -> BTreeMap<u64, BasicNode> {
        (1..=3).map(|id| (id, BasicNode::default())).collect()
    }

    /// The replica heard its leader (here: a vote stored before its Raft started, as a vote
    /// request or an append between the start and the initialisation leaves it) and openraft
    /// refuses to initialise: that is a replica in its group already, not a failed start.
    #[tokio::test]
    async fn a_replica_that_heard_its_leader_first_starts_without_initialising() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let vote = openraft::alias::VoteOf::<TypeConfig>::new_committed(4, 2);
        LogStore::new(store.clone(), GROUP)
            .save_vote(&vote)
            .await
            .unwrap();
        let raft = queue_raft(&store).await;
        let refused = raft.initialize(members()).await;
        assert!(
            matches!(
                refused,
                Err(RaftError::APIError(InitializeError::NotAllowed(_)))
            ),
            "openraft refuses to initialise over a vote: {refused:?}"
        );
        initialize_unless_joined(&raft, members(), &tracing::Span::none())
            .await
            .expect("a replica that heard its leader is started, not failed");
        assert_eq!(raft.metrics().borrow_watched().vote, vote);
        raft.shutdown().await.unwrap();
    }

    /// A replica that followed another node's leader with its whole log committed starts
    /// asleep (its node restarted); one with an uncommitted tail, or whose vote names itself,
    /// starts awake.
    #[tokio::test]
    async fn a_follower_asleep_at_start_is_known_from_its_stored_state() {
        use openraft::entry::RaftEntry;
        use openraft::raft::AppendEntriesRequest;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let raft = queue_raft(&store).await;
        let vote = openraft::alias::VoteOf::<TypeConfig>::new_committed(1, 2);
        let log_id = |index| {
            openraft::alias::LogIdOf::<TypeConfig>::new(
                openraft::impls::leader_id_adv::LeaderId {
                    term: 1,
                    node_id: 2,
                },
                index,
            )
        };
        let voters: BTreeSet<u64> = (1..=3).collect();
        let membership = openraft::Membership::new_with_defaults(vec![voters], []);
        let append = |prev, entries, commit| AppendEntriesRequest::<TypeConfig> {
            vote: vote.clone(),
            prev_log_id: prev,
            entries,
            leader_commit: Some(log_id(commit)),
        };
        let reply = raft
            .append_entries(append(
                None,
                vec![
                    openraft::alias::EntryOf::<TypeConfig>::new_membership(log_id(0), membership),
                    openraft::alias::EntryOf::<TypeConfig>::new_blank(log_id(1)),
                ],
                1,
            ))
            .await
            .unwrap();
        assert!(reply.is_success(), "{reply:?}");
        raft.wait(Some(Duration::from_secs(5)))
            .metrics(|m| m.last_applied == Some(log_id(1)), "the entries applied")
            .await
            .unwrap();

        let log = || LogStore::new(store.clone(), GROUP);
        let asleep = follower_asleep_at_start(log(), 1).await;
        let req = asleep.expect("a follower of node 2 with its whole log committed");
        assert_eq!(req.vote, vote);
        assert_eq!(req.committed, Some(log_id(1)));
        assert!(
            follower_asleep_at_start(log(), 2).await.is_none(),
            "the vote names the node itself: it led, so it starts awake"
        );

        // An entry beyond the commit: not asleep at start.
        let reply = raft
            .append_entries(append(
                Some(log_id(1)),
                vec![openraft::alias::EntryOf::<TypeConfig>::new_blank(log_id(2))],
                1,
            ))
            .await
            .unwrap();
        assert!(reply.is_success(), "{reply:?}");
        assert!(follower_asleep_at_start(log(), 1).await.is_none());
        raft.shutdown().await.unwrap();
    }

    /// The metrics of a started instance over an applied machine (before its core started, an
    /// instance reports the initial ones: a learner that knows nothing).
    async fn first_metrics(
        raft: &Raft<TypeConfig, Shell<QueueMachine>>,
    ) -> openraft::RaftMetrics<TypeConfig> {
        raft.wait(Some(Duration::from_secs(5)))
            .metrics(|m| m.last_applied.is_some(), "the instance's first metrics")
            .await
            .unwrap()
    }

    /// An unloaded replica loaded again (the unload's shutdown, then a new instance with the
    /// reload settings around the same machine and applied membership) is what it was: here
    /// the leader of a one-voter group, of the same term, with the same voters, without an
    /// election. Without the applied membership it would come back as a learner (found when
    /// the first unloaded group was read: it had no leader any more).
    #[tokio::test]
    async fn a_reloaded_leader_is_the_leader_of_its_term_with_its_membership() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let config = Config::for_tests("insecure_cluster = true").unwrap();
        let machine = QueueMachine::new(GROUP, store.clone(), QueueConfig::new("/", "q"));
        let open = |raft_config: Arc<openraft::Config>, shell: Shell<QueueMachine>| {
            let store = store.clone();
            async move {
                Raft::new(
                    1,
                    raft_config,
                    GroupNetwork {
                        group: GROUP,
                        peers: no_peers(),
                    },
                    LogStore::new(store, GROUP),
                    shell,
                )
                .await
                .unwrap()
            }
        };
        let shell = Shell::new(machine.clone());
        let membership = shell.applied_membership();
        let raft = open(raft_config(&config).unwrap(), shell).await;
        let one: BTreeMap<u64, BasicNode> = [(1, BasicNode::default())].into();
        raft.initialize(one).await.unwrap();
        let before = raft
            .wait(Some(Duration::from_secs(5)))
            .metrics(
                |m| m.state == ServerState::Leader && m.last_applied.is_some(),
                "leader with its first entry applied",
            )
            .await
            .unwrap();
        raft.shutdown().await.unwrap();

        let reload = reload_config(&raft_config(&config).unwrap());
        let raft = open(reload.clone(), Shell::resume(machine.clone(), membership)).await;
        let after = first_metrics(&raft).await;
        assert_eq!(after.state, ServerState::Leader);
        assert_eq!(after.current_term, before.current_term);
        assert_eq!(after.vote, before.vote);
        let voters: Vec<u64> = after.membership_config.voter_ids().collect();
        assert_eq!(voters, vec![1]);
        assert_eq!(after.last_applied, before.last_applied);
        raft.shutdown().await.unwrap();

        // The same without the applied membership: not a voter any more.
        let raft = open(reload, Shell::new(machine)).await;
        let lost = first_metrics(&raft).await;
        assert_eq!(lost.state, ServerState::Learner);
        raft.shutdown().await.unwrap();
    }

    /// A pristine replica is initialised; any other failure is still an error.
    #[tokio::test]
    async fn a_pristine_replica_is_initialised() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let raft = queue_raft(&store).await;
        initialize_unless_joined(&raft, members(), &tracing::Span::none())
            .await
            .unwrap();
        assert!(raft.is_initialized().await.unwrap());
        let voters: Vec<u64> = raft
            .metrics()
            .borrow_watched()
            .membership_config
            .voter_ids()
            .collect();
        assert_eq!(voters, vec![1, 2, 3]);
        raft.shutdown().await.unwrap();
    }
}
