//! [`Observed`]: what the observers (health, the metrics collector) read of their node.

use std::sync::Arc;

use qq_core::NodeId;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::alarms::Alarms;
use crate::groups::registry::Registry;
use crate::meta_view::MetaView;

/// The node as its observers see it, and no more: its groups, its metadata, its alarms,
/// whether its metadata caught up, and the token that stops them. Cheap to clone.
#[derive(Clone)]
pub struct Observed {
    pub(crate) id: NodeId,
    pub(crate) registry: Arc<Registry>,
    pub(crate) view: MetaView,
    pub(crate) alarms: Arc<Alarms>,
    /// The `per_queue_metrics` setting.
    pub(crate) per_queue_metrics: bool,
    pub(crate) meta_synced: watch::Receiver<bool>,
    pub(crate) stopping: CancellationToken,
}

impl Observed {
    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn view(&self) -> &MetaView {
        &self.view
    }

    pub fn alarms(&self) -> &Alarms {
        &self.alarms
    }

    pub fn per_queue_metrics(&self) -> bool {
        self.per_queue_metrics
    }

    /// Whether the node's metadata has caught up ([`crate::node::Node::meta_synced`]).
    pub fn meta_synced(&self) -> watch::Receiver<bool> {
        self.meta_synced.clone()
    }

    /// Cancelled when the node begins to shut down.
    pub fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }
}
