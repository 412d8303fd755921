//! A node on a new data directory does not vote until the cluster has accepted the directory.
//!
//! The store draws an incarnation for every new directory ([`qq_raft::incarnation`]) and the
//! metadata records each node's (`RecordIncarnation`). A node that starts on a new directory
//! may be new (a cluster forming, a node about to join, a forgotten id coming back) or may
//! have lost its data (a disk replaced, a damaged directory moved aside). In the second case it
//! has forgotten its votes and the entries it acknowledged: counted as the voter it was, it
//! could help elect a leader that lacks entries the cluster confirmed. So it starts with its
//! votes held ([`qq_raft::network::Peers::hold_votes`]; appends still go on) and asks its peers
//! what the metadata records for its id ([`judge`]):
//!
//! - nothing, or this very directory, from a view caught up with the metadata leader; or a
//!   peer whose metadata has not formed; or the id is forgotten: the votes are released;
//! - another directory: the node is re-seeded, through a peer (`Internal.Reseed`, run by
//!   [`crate::membership::reseed_node`]): forgotten, joined again as a new member with this
//!   directory recorded, and given its queues' replicas back. The votes are released once this
//!   node's own metadata shows its directory recorded: by then it is in no group as the voter
//!   it was.
//!
//! Every node then records its directory once (or after joining again), so that a later loss
//! is recognised. Known gap: a node that loses its directory before its first record (the
//! first seconds of its life) is taken for a new one.

use std::sync::Arc;
use std::time::Duration;

use qq_core::NodeId;
use qq_core::meta::MetaCommand;
use qq_proto::internal::{IncarnationReply, IncarnationRequest};
use tracing::{debug, error, info, warn};

use super::Node;

/// How long one round of questions to the peers waits for their answers.
const ASK_TIMEOUT: Duration = Duration::from_secs(4);
/// Pause between rounds, and between attempts to record or re-seed.
const RETRY: Duration = Duration::from_secs(1);
/// How long one `Reseed` call may take (it waits for the node's replicas to catch up).
const RESEED_TIMEOUT: Duration = Duration::from_secs(600);

/// What the peers' answers say of this node's new directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// New to the cluster (or a forgotten id): it may vote.
    Accepted,
    /// The cluster recorded another directory for this id: this one lost its data.
    Replaced { recorded: u64 },
    /// No answer settles it yet: ask again.
    Undecided,
}

/// Judges one round of answers about directory `mine`. Another directory recorded anywhere
/// wins over everything else; then a forgotten id, a peer whose metadata has not formed, or a
/// caught-up view that records nothing or `mine`.
pub(crate) fn judge(answers: &[IncarnationReply], mine: u64) -> Verdict {
    if let Some(a) = answers
        .iter()
        .find(|a| a.recorded != 0 && a.recorded != mine)
    {
        return Verdict::Replaced {
            recorded: a.recorded,
        };
    }
    let settles = |a: &IncarnationReply| a.forgotten || !a.initialized || a.caught_up;
    if answers.iter().any(settles) {
        Verdict::Accepted
    } else {
        Verdict::Undecided
    }
}

impl Node {
    /// The node's incarnation task: settles a new directory's votes (module docs), then
    /// records the directory in the metadata.
    pub(super) async fn settle_incarnation(self: Arc<Self>) {
        let mine = self.store().incarnation().id;
        let run = async {
            if self.peers().votes_held() {
                self.settle_votes(mine).await;
            }
            self.record_incarnation(mine).await;
        };
        tokio::select! {
            _ = run => {}
            _ = self.stopping().cancelled() => {}
        }
    }

    /// Ask the peers until they settle it; re-seed through them if the directory replaced
    /// another; release the votes.
    async fn settle_votes(&self, mine: u64) {
        info!(incarnation = %hex(mine), "new data directory: votes held until the cluster accepts it");
        let mut rounds = 0u64;
        loop {
            let answers = self.ask_peers(mine).await;
            match judge(&answers, mine) {
                Verdict::Accepted => break,
                Verdict::Replaced { recorded } => {
                    warn!(
                        incarnation = %hex(mine),
                        recorded = %hex(recorded),
                        "this node's id ran on another data directory, whose data is lost here: \
                         re-seeding it as a new member before it votes"
                    );
                    self.reseed(mine).await;
                    break;
                }
                Verdict::Undecided => {
                    rounds += 1;
                    if rounds % 10 == 1 {
                        info!(
                            answers = answers.len(),
                            "votes held: no peer could say yet whether this data directory is new"
                        );
                    }
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
        self.peers().hold_votes(false);
        info!(incarnation = %hex(mine), "data directory accepted: this node votes");
    }

    /// One round: every peer at once, each answer within [`ASK_TIMEOUT`] (a peer that does
    /// not answer counts for nothing).
    async fn ask_peers(&self, mine: u64) -> Vec<IncarnationReply> {
        let asks = self
            .peers()
            .ids()
            .into_iter()
            .filter(|id| *id != self.id())
            .filter_map(|id| self.peers().client(id))
            .map(|mut client| async move {
                let mut req = tonic::Request::new(self.incarnation_request(mine));
                req.set_timeout(ASK_TIMEOUT);
                match client.incarnation(req).await {
                    Ok(r) => Some(r.into_inner()),
                    // Release 0.1.0 records no directories and cannot tell: taken as a peer
                    // whose metadata has not formed, as that release would (a known gap
                    // while a cluster runs both releases).
                    Err(s) if s.code() == tonic::Code::Unimplemented => {
                        Some(IncarnationReply::default())
                    }
                    Err(_) => None,
                }
            });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Ask a peer to re-seed this node until this node's metadata records `mine`.
    async fn reseed(&self, mine: u64) {
        let recorded = async {
            let mut applied = self.view().subscribe();
            while self.view().current().incarnation(self.id()) != Some(mine) {
                if applied.changed().await.is_err() {
                    return;
                }
            }
        };
        let ask = async {
            loop {
                for id in self.peers().ids().into_iter().filter(|id| *id != self.id()) {
                    match self.ask_reseed(id, mine).await {
                        Ok(detail) => info!(by = id, "{detail}"),
                        Err(e) => warn!(by = id, "re-seeding this node failed: {e}"),
                    }
                }
                tokio::time::sleep(RETRY).await;
            }
        };
        tokio::select! {
            _ = recorded => {}
            _ = ask => {}
        }
    }

    /// This node, on directory `mine`, at the addresses its configuration gives it.
    fn incarnation_request(&self, mine: u64) -> IncarnationRequest {
        let own = self.config().peers.iter().find(|p| p.id == self.id());
        IncarnationRequest {
            node: self.id(),
            incarnation: mine,
            address: own.map(|p| p.address.clone()).unwrap_or_default(),
            cluster_address: own.map(|p| p.cluster_address.clone()).unwrap_or_default(),
        }
    }

    async fn ask_reseed(&self, peer: NodeId, mine: u64) -> Result<String, String> {
        let mut client = self
            .peers()
            .client(peer)
            .ok_or_else(|| format!("node {peer} is not a peer"))?;
        let mut req = tonic::Request::new(self.incarnation_request(mine));
        req.set_timeout(RESEED_TIMEOUT);
        match client.reseed(req).await {
            Ok(r) => Ok(r.into_inner().detail),
            Err(s) => Err(format!("{:?}: {}", s.code(), s.message())),
        }
    }

    /// Record `mine` as this node's directory once the metadata has caught up, runs version 2
    /// and this node is not forgotten. A refusal because another one is recorded means this
    /// directory replaced it unnoticed (the peers' answers were wrong): the votes are held
    /// again and the node re-seeded.
    async fn record_incarnation(&self, mine: u64) {
        let mut synced = self.meta_synced();
        while !*synced.borrow_and_update() {
            if synced.changed().await.is_err() {
                return;
            }
        }
        loop {
            let state = self.view().current();
            match state.incarnation(self.id()) {
                Some(known) if known == mine => return,
                Some(known) => {
                    error!(incarnation = %hex(mine), recorded = %hex(known), "the cluster records another data directory for this node: holding votes and re-seeding");
                    self.peers().hold_votes(true);
                    self.reseed(mine).await;
                    self.peers().hold_votes(false);
                    continue;
                }
                None => {
                    let cmd = MetaCommand::RecordIncarnation {
                        id: self.id(),
                        incarnation: mine,
                    };
                    if state.forgotten_nodes().contains(&self.id())
                        || state.machine_version() < cmd.machine_version()
                    {
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                    match self.proposer().propose_meta(cmd).await {
                        Ok(Ok(_)) => {
                            info!(incarnation = %hex(mine), "data directory recorded");
                            continue;
                        }
                        Ok(Err(e)) => debug!("recording the data directory refused: {e}"),
                        Err(e) => debug!("recording the data directory not committed: {e}"),
                    }
                }
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}

fn hex(v: u64) -> String {
    format!("{v:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(
        initialized: bool,
        caught_up: bool,
        recorded: u64,
        forgotten: bool,
    ) -> IncarnationReply {
        IncarnationReply {
            initialized,
            caught_up,
            recorded,
            forgotten,
        }
    }

    #[test]
    fn another_recorded_directory_wins_over_every_other_answer() {
        let answers = [
            answer(false, false, 0, false),
            answer(true, true, 0, false),
            answer(true, false, 7, false),
        ];
        assert_eq!(judge(&answers, 5), Verdict::Replaced { recorded: 7 });
    }

    #[test]
    fn a_new_node_is_accepted_by_a_caught_up_view_an_unformed_peer_or_being_forgotten() {
        assert_eq!(judge(&[answer(true, true, 0, false)], 5), Verdict::Accepted);
        assert_eq!(judge(&[answer(true, true, 5, false)], 5), Verdict::Accepted);
        assert_eq!(
            judge(&[answer(false, false, 0, false)], 5),
            Verdict::Accepted
        );
        assert_eq!(judge(&[answer(true, false, 0, true)], 5), Verdict::Accepted);
    }

    #[test]
    fn no_answer_or_only_views_that_lag_settle_nothing() {
        assert_eq!(judge(&[], 5), Verdict::Undecided);
        assert_eq!(
            judge(
                &[answer(true, false, 0, false), answer(true, false, 5, false)],
                5
            ),
            Verdict::Undecided
        );
    }
}
