//! The metadata machine's versions, as the queues' (`crate::queue`'s module `machine`): which
//! commands the metadata log may carry, so that a cluster running two releases at once (a
//! rolling upgrade) stays correct.
//!
//! The state records the version its log runs ([`MetaState::machine_version`]), starting at
//! [`FIRST_META_MACHINE_VERSION`], release 0.1.0's, on every replica. The metadata leader
//! proposes [`MetaCommand::SetMachineVersion`] once every node runs a release that has the new
//! version (each node says which on its watch stream). Until then a command of a later version
//! is refused by every replica alike (FAILED_PRECONDITION, no change): a replica of the older
//! release cannot decode it and refuses it too, so the replicas agree.
//!
//! | version | release | what it adds |
//! |---:|---|---|
//! | 1 | 0.1.0 | everything up to 0.1.0 |
//! | 2 | next | `BindExchange`, `UnbindExchange` (exchange-to-exchange bindings); `SetOperatorPolicy`, `ClearOperatorPolicy` (operator policies); `SetMachineVersion`; `JoinNode` of a forgotten id joins it again (version 1 refuses it); `RecordIncarnation` (which data directory each node runs on) |
//!
//! What version 2 added to the state is not in the state's encoding (which is 0.1.0's, and
//! which a 0.1.0 node reads from a snapshot): it travels beside it as [`MetaExtras`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Binding, MetaCommand, MetaError, MetaReply, MetaState};
use crate::NodeId;
use crate::policy::Policy;

/// The metadata machine of release 0.1.0.
pub const FIRST_META_MACHINE_VERSION: u32 = 1;

/// The newest metadata machine this binary runs.
pub const META_MACHINE_VERSION: u32 = 2;

/// `serde(default)` of the state's machine version.
pub(super) fn first() -> u32 {
    FIRST_META_MACHINE_VERSION
}

impl MetaCommand {
    /// The metadata machine version that introduced this command.
    pub fn machine_version(&self) -> u32 {
        match self {
            MetaCommand::SetMachineVersion { .. }
            | MetaCommand::BindExchange { .. }
            | MetaCommand::UnbindExchange { .. }
            | MetaCommand::SetOperatorPolicy { .. }
            | MetaCommand::ClearOperatorPolicy { .. }
            | MetaCommand::RecordIncarnation { .. } => 2,
            _ => FIRST_META_MACHINE_VERSION,
        }
    }
}

/// [`MetaExtras`] as snapshot trailer format 1 wrote them: without the incarnations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetaExtrasFormat1 {
    pub machine_version: u32,
    pub vhosts: BTreeMap<String, (Vec<Binding>, Vec<Policy>)>,
}

impl From<MetaExtrasFormat1> for MetaExtras {
    fn from(v1: MetaExtrasFormat1) -> MetaExtras {
        MetaExtras {
            machine_version: v1.machine_version,
            vhosts: v1.vhosts,
            incarnations: BTreeMap::new(),
        }
    }
}

/// What the state holds beyond release 0.1.0's encoding: written after it in a snapshot (as
/// format 1 of the metadata snapshot's trailer). Once a release has written it, a new field
/// makes a new format read beside this one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetaExtras {
    pub machine_version: u32,
    /// Per vhost: its exchange-to-exchange bindings and its operator policies.
    pub vhosts: BTreeMap<String, (Vec<Binding>, Vec<Policy>)>,
    /// Each node's recorded incarnation ([`MetaCommand::RecordIncarnation`]); trailer format 2
    /// (format 1 ends before it).
    pub incarnations: BTreeMap<NodeId, u64>,
}

impl MetaState {
    /// The metadata machine version this log runs.
    pub fn machine_version(&self) -> u32 {
        self.machine_version
    }

    /// Whether the machine runs `cmd` yet: FAILED_PRECONDITION naming what is missing if not.
    /// `SetMachineVersion` always passes (it is proposed only when every node decodes it).
    pub fn check_runs(&self, cmd: &MetaCommand) -> Result<(), MetaError> {
        let needs = cmd.machine_version();
        if matches!(cmd, MetaCommand::SetMachineVersion { .. }) || needs <= self.machine_version {
            return Ok(());
        }
        Err(MetaError::failed_precondition(format!(
            "this needs metadata machine version {needs}, and the cluster runs {}: \
             every node must run a release that has it (a rolling upgrade is not finished)",
            self.machine_version
        )))
    }

    pub(super) fn set_machine_version(&mut self, version: u32) -> Result<MetaReply, MetaError> {
        if version > META_MACHINE_VERSION {
            return Err(MetaError::failed_precondition(format!(
                "version: metadata machine version {version} is newer than this release's \
                 {META_MACHINE_VERSION}"
            )));
        }
        self.machine_version = self.machine_version.max(version);
        Ok(MetaReply::Ok)
    }

    /// What a snapshot carries beside the state's own encoding.
    pub fn extras(&self) -> MetaExtras {
        let vhosts = self
            .vhosts
            .iter()
            .filter(|(_, v)| !v.exchange_bindings.is_empty() || !v.operator_policies.is_empty())
            .map(|(name, v)| {
                let bindings = v.exchange_bindings.iter().cloned().collect();
                let policies = v.operator_policies.values().cloned().collect();
                (name.clone(), (bindings, policies))
            })
            .collect();
        MetaExtras {
            machine_version: self.machine_version,
            vhosts,
            incarnations: self.incarnations.clone(),
        }
    }

    /// Puts back what [`MetaState::extras`] took from a state (into one decoded from the same
    /// snapshot; a snapshot without them leaves the state at version 1). Extras of a vhost
    /// the state lacks are dropped.
    pub fn restore_extras(&mut self, extras: MetaExtras) {
        self.machine_version = extras
            .machine_version
            .clamp(FIRST_META_MACHINE_VERSION, META_MACHINE_VERSION);
        self.incarnations = extras.incarnations;
        for (name, (bindings, policies)) in extras.vhosts {
            if let Some(v) = self.vhosts.get_mut(&name) {
                v.exchange_bindings = bindings.into_iter().collect();
                v.operator_policies = policies.into_iter().map(|p| (p.name.clone(), p)).collect();
            }
        }
    }
}
