//! [`Members`]: what a membership change takes of its node, and the peer set kept in line
//! with the metadata ([`Members::sync_peers`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use qq_core::NodeId;
use qq_raft::network::{PeerAddress, Peers};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::config::Peer;
use crate::groups::registry::Registry;
use crate::meta_view::MetaView;
use crate::proposer::Proposer;

/// The node as a membership change sees it, and no more: its groups, its metadata and
/// proposals, its peers and the founding nodes of its configuration, its clock, and the token
/// that stops it. Cheap to clone.
#[derive(Clone)]
pub struct Members {
    pub(crate) id: NodeId,
    pub(crate) clock: Clock,
    pub(crate) peers: Peers,
    pub(crate) view: MetaView,
    pub(crate) proposer: Proposer,
    pub(crate) registry: Arc<Registry>,
    pub(crate) stopping: CancellationToken,
    /// The `peers` of the node's configuration.
    pub(crate) founding: Arc<[Peer]>,
}

impl Members {
    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn clock(&self) -> Clock {
        self.clock
    }

    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    pub fn view(&self) -> &MetaView {
        &self.view
    }

    pub fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Cancelled when the node begins to shut down.
    pub fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }

    /// The voters of the metadata group as this node knows them.
    pub fn meta_voters(&self) -> BTreeSet<NodeId> {
        self.registry.meta_voters()
    }

    /// The nodes new queues may be placed on: the metadata group's voters that are peers (a
    /// node whose join was recorded but never completed is a peer and not a voter), sorted.
    pub fn placement_nodes(&self) -> Vec<NodeId> {
        let voters: Vec<NodeId> = self
            .meta_voters()
            .into_iter()
            .filter(|id| self.peers.contains(*id))
            .collect();
        if voters.is_empty() {
            return self.peers.ids();
        }
        voters
    }

    /// Bring the peer set in line with the metadata: the founding nodes of this node's
    /// configuration, less those forgotten, plus those that joined since.
    pub fn sync_peers(&self) {
        let state = self.view.current();
        let forgotten = state.forgotten_nodes();
        let joined = state.joined_nodes();
        let founding = self
            .founding
            .iter()
            .filter(|p| !forgotten.contains(&p.id) && !joined.contains_key(&p.id))
            .map(|p| PeerAddress {
                id: p.id,
                address: p.address.clone(),
                cluster_address: p.cluster_address.clone(),
            });
        let later = joined.iter().map(|(id, a)| PeerAddress {
            id: *id,
            address: a.address.clone(),
            cluster_address: a.cluster_address.clone(),
        });
        match self.peers.set(founding.chain(later).collect::<Vec<_>>()) {
            Ok(true) => info!(peers = ?self.peers.ids(), "cluster nodes changed"),
            Ok(false) => {}
            Err(e) => warn!("cluster nodes: {e}"),
        }
    }
}
