//! Machine versions: which commands a queue's log may carry, so that a cluster running two
//! releases at once (a rolling upgrade) stays correct.
//!
//! A release that adds a command (or changes what one does) raises [`MACHINE_VERSION`]. A
//! queue's state records the version its log runs ([`QueueState::machine_version`]); it starts
//! at [`FIRST_MACHINE_VERSION`], the machine of release 0.1.0, on every replica. Its leader
//! proposes [`Command::SetMachineVersion`] once every member of the group runs a release that
//! has the new version (the node learns its peers' versions from their watch streams), as Ra
//! moves a cluster to a new machine version only when every member runs it. Until then:
//!
//! - a command of a later version is refused by every replica alike ([`Reply::Error`], no
//!   change to the state), and the node that wanted it falls back to the older behaviour;
//!   a replica of the older release cannot decode it and refuses it too, so the replicas agree;
//! - a version this binary does not have is refused (a member was downgraded after the switch,
//!   which the upgrade notes forbid).
//!
//! | version | release | what it adds |
//! |---:|---|---|
//! | 1 | 0.1.0 | everything up to 0.1.0 |
//! | 2 | next | `CancelConsumer` (AMQP basic.cancel keeps what the consumer holds); `CheckoutWithPriority` (consumer priorities); `SetConsumerTimeout` (consumer timeouts, which return messages released, not failed); `Settle` and `SettleReceipts` with `SettleOutcome::Release` (module `counts`); `EnqueueWithPriority` (message priorities, module `priorities`); `SetMachineVersion` |
//!
//! `SetMachineVersion` itself is version 2's, and is never gated: it is proposed only when
//! every member decodes it.

use super::{Command, QueueState, Reply, SettleOutcome};

/// The machine of release 0.1.0: what a queue starts at, and what a state decoded from a
/// snapshot without a version runs.
pub const FIRST_MACHINE_VERSION: u32 = 1;

/// The newest machine this binary runs.
pub const MACHINE_VERSION: u32 = 2;

/// `serde(default)` of [`QueueState::machine_version`].
pub(super) fn first() -> u32 {
    FIRST_MACHINE_VERSION
}

impl Command {
    /// The machine version that introduced this command.
    pub fn machine_version(&self) -> u32 {
        match self {
            Command::CancelConsumer { .. }
            | Command::SetMachineVersion { .. }
            | Command::CheckoutWithPriority { .. }
            | Command::SetConsumerTimeout { .. }
            | Command::EnqueueWithPriority { .. } => 2,
            Command::Settle {
                outcome: SettleOutcome::Release,
                ..
            }
            | Command::SettleReceipts {
                outcome: SettleOutcome::Release,
                ..
            } => 2,
            _ => FIRST_MACHINE_VERSION,
        }
    }
}

impl QueueState {
    /// The machine version this queue's log runs.
    pub fn machine_version(&self) -> u32 {
        self.machine_version
    }

    /// Puts back the version a snapshot carried (its trailer; a snapshot without one was
    /// written at [`FIRST_MACHINE_VERSION`]).
    pub fn restore_machine_version(&mut self, version: u32) {
        self.machine_version = version.clamp(FIRST_MACHINE_VERSION, MACHINE_VERSION);
    }

    /// Whether the queue's machine runs `cmd` yet. `SetMachineVersion` always passes: it is
    /// what moves the machine on.
    pub(super) fn admits(&self, cmd: &Command) -> Result<(), String> {
        let needs = cmd.machine_version();
        if matches!(cmd, Command::SetMachineVersion { .. }) || needs <= self.machine_version {
            return Ok(());
        }
        Err(format!(
            "command {} needs queue machine version {needs}; this queue runs version {} until \
             every member runs a release that has it",
            command_name(cmd),
            self.machine_version
        ))
    }

    pub(super) fn set_machine_version(&mut self, version: u32) -> Reply {
        if version > MACHINE_VERSION {
            return Reply::Error {
                detail: format!(
                    "machine version {version} is newer than this release's {MACHINE_VERSION}: \
                     a member was downgraded after the queue moved on"
                ),
            };
        }
        // Never back: a stale proposal (an older leader's) changes nothing.
        self.machine_version = self.machine_version.max(version);
        Reply::Ok
    }

    /// The invariant: the version is one this binary has.
    pub(super) fn check_machine_version(&self) -> Result<(), String> {
        if (FIRST_MACHINE_VERSION..=MACHINE_VERSION).contains(&self.machine_version) {
            Ok(())
        } else {
            Err(format!(
                "machine version {} is outside {FIRST_MACHINE_VERSION}..={MACHINE_VERSION}",
                self.machine_version
            ))
        }
    }
}

fn command_name(cmd: &Command) -> &'static str {
    match cmd {
        Command::CancelConsumer { .. } => "CancelConsumer",
        Command::SetMachineVersion { .. } => "SetMachineVersion",
        Command::CheckoutWithPriority { .. } => "CheckoutWithPriority",
        Command::SetConsumerTimeout { .. } => "SetConsumerTimeout",
        Command::EnqueueWithPriority { .. } => "EnqueueWithPriority",
        Command::Settle { .. } => "Settle (release)",
        Command::SettleReceipts { .. } => "SettleReceipts (release)",
        _ => "of version 1",
    }
}
