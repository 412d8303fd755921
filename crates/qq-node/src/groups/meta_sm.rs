//! The metadata group's state machine (group 0, a replica on every node): the pure
//! [`qq_core::meta::MetaState`] inside the shared [`Shell`](super::shell::Shell).
//!
//! The state is held as an `Arc` and replaced copy-on-write on apply, so readers take a cheap,
//! immutable, versioned snapshot ([`crate::meta_view::MetaView`]) instead of holding a lock
//! while they route or check permissions. The effects an apply returns (a queue created,
//! deleted, or its configuration changed) go to the node's group supervisor on a bounded
//! channel; when it is full, or after a snapshot install (which has no effects), the supervisor
//! is told to resynchronise with the whole state instead.
//!
//! A snapshot is written and installed only if its state keeps the invariants
//! ([`MetaState::check_invariants`]); one whose state breaks them is refused, and the current
//! state kept.
//!
//! Must not: start or stop groups itself, read a clock, or block on the supervisor.

use std::io;
use std::sync::{Arc, Mutex, RwLock};

use qq_core::meta::{
    MetaCommand, MetaEffect, MetaError, MetaExtras, MetaExtrasFormat1, MetaReply, MetaState,
};
use qq_raft::snapshot::{SnapshotReader, SnapshotWriter};
use qq_raft::store::Store;
use qq_raft::{GroupId, META_GROUP};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tracing::error;

use super::shell::{LogId, Machine, Refusals, refused};

/// Metadata effects queued for the supervisor, at most. When full, the effect is not queued
/// and the supervisor resynchronises from the state (nothing is lost: the state is the truth).
pub const META_EFFECTS_BOUND: usize = 1024;

pub struct MetaMachine {
    store: Store,
    state: RwLock<Arc<MetaState>>,
    last_applied: Mutex<Option<LogId>>,
    /// Bumped after every applied batch: the metadata's version as this node sees it.
    applied: watch::Sender<u64>,
    effects: mpsc::Sender<MetaEffect>,
    /// Bumped when the supervisor must compare every running group with the state.
    resync: watch::Sender<u64>,
    refusals: Refusals,
}

/// A metadata snapshot's header: the state in release 0.1.0's encoding, then a trailer (a
/// postcard `u32` format number and that format's record) with what later releases added
/// ([`MetaExtras`]). A 0.1.0 node reads the state and ignores the trailer, which is right while
/// the metadata machine runs version 1 (the only time such a node is a member); a header
/// without a trailer was written by 0.1.0.
#[derive(Deserialize)]
struct MetaSnapshot {
    state: MetaState,
}

/// [`MetaSnapshot`]'s encoding, from a borrowed state.
#[derive(Serialize)]
struct MetaSnapshotRef<'a> {
    state: &'a MetaState,
}

/// The trailer's format: 1 is [`MetaExtrasFormat1`], 2 is [`MetaExtras`] (with the nodes'
/// incarnations). A reader knows every format up to its own and refuses a newer one by name;
/// a new field makes a new format.
const META_TRAILER_FORMAT: u32 = 2;

/// The state of a snapshot header, with its trailer's extras put back.
fn decode_snapshot(bytes: &[u8]) -> Result<MetaState, String> {
    let (snap, rest) =
        postcard::take_from_bytes::<MetaSnapshot>(bytes).map_err(|e| e.to_string())?;
    let mut state = snap.state;
    if rest.is_empty() {
        return Ok(state);
    }
    let (format, rest) = postcard::take_from_bytes::<u32>(rest).map_err(|e| e.to_string())?;
    let extras: MetaExtras = match format {
        1 => postcard::from_bytes::<MetaExtrasFormat1>(rest)
            .map_err(|e| e.to_string())?
            .into(),
        META_TRAILER_FORMAT => postcard::from_bytes(rest).map_err(|e| e.to_string())?,
        _ => {
            return Err(format!(
                "trailer format {format} is not one this release reads (it reads 1 to \
                 {META_TRAILER_FORMAT}): written by a newer release"
            ));
        }
    };
    state.restore_extras(extras);
    Ok(state)
}

impl MetaMachine {
    pub fn new(store: Store) -> (Arc<MetaMachine>, mpsc::Receiver<MetaEffect>) {
        let (effects, rx) = mpsc::channel(META_EFFECTS_BOUND);
        let machine = Arc::new(MetaMachine {
            store,
            state: RwLock::new(Arc::new(MetaState::new())),
            last_applied: Mutex::new(None),
            applied: watch::channel(0).0,
            effects,
            resync: watch::channel(0).0,
            refusals: Refusals::default(),
        });
        (machine, rx)
    }

    /// The state as of the last applied entry (immutable; later applies make a new one).
    pub fn state(&self) -> Arc<MetaState> {
        self.state.read().unwrap().clone()
    }

    pub fn version(&self) -> u64 {
        *self.applied.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    pub fn subscribe_resync(&self) -> watch::Receiver<u64> {
        self.resync.subscribe()
    }

    /// The metadata log index applied on this node.
    pub fn applied_index(&self) -> u64 {
        self.last_applied().map(|l| l.index).unwrap_or(0)
    }

    fn emit(&self, effects: Vec<MetaEffect>) {
        for effect in effects {
            if self.effects.try_send(effect).is_err() {
                self.resync.send_modify(|n| *n += 1);
            }
        }
    }
}

impl Machine for MetaMachine {
    type Cut = Arc<MetaState>;

    fn group(&self) -> GroupId {
        META_GROUP
    }

    fn store(&self) -> &Store {
        &self.store
    }

    fn apply_payload(&self, index: u64, payload: &[u8]) -> io::Result<Vec<u8>> {
        let cmd: MetaCommand = match postcard::from_bytes(payload) {
            Ok(cmd) => cmd,
            Err(e) => {
                let why = format!("entry {index} is not a metadata command: {e}");
                self.refusals.record(META_GROUP, index, &why);
                let refused: Result<MetaReply, MetaError> = Err(MetaError::invalid(why));
                return postcard::to_stdvec(&(index, refused))
                    .map_err(|e| io::Error::other(format!("encode: {e}")));
            }
        };
        if let Err(e) = cmd.validate() {
            // Apply refuses it too (deterministically); here it is also counted and logged.
            self.refusals.record(META_GROUP, index, &e.message);
        }
        let (result, effects) = {
            let mut state = self.state.write().unwrap();
            Arc::make_mut(&mut *state).apply(cmd)
        };
        self.emit(effects);
        // The index travels with the reply so the proposer can wait for replicas to apply it.
        postcard::to_stdvec(&(index, result)).map_err(|e| io::Error::other(format!("encode: {e}")))
    }

    fn applied_batch(&self) {
        self.applied.send_modify(|n| *n += 1);
    }

    fn last_applied(&self) -> Option<LogId> {
        *self.last_applied.lock().unwrap()
    }

    fn set_last_applied(&self, log_id: Option<LogId>) {
        *self.last_applied.lock().unwrap() = log_id;
    }

    fn cut(&self) -> Arc<MetaState> {
        self.state()
    }

    fn write_cut(&self, cut: Arc<MetaState>, out: &mut SnapshotWriter) -> io::Result<()> {
        if let Err(e) = cut.check_invariants() {
            error!(
                group = META_GROUP,
                invariant = %e,
                "snapshot refused: the metadata breaks an invariant (a bug); the log is kept"
            );
            return Err(refused(format!(
                "metadata group {META_GROUP}: snapshot refused: its state breaks an invariant: {e}"
            )));
        }
        let encode = |e: postcard::Error| io::Error::other(format!("encode: {e}"));
        let mut header = postcard::to_stdvec(&MetaSnapshotRef { state: &cut }).map_err(encode)?;
        header.extend(postcard::to_stdvec(&META_TRAILER_FORMAT).map_err(encode)?);
        header.extend(postcard::to_stdvec(&cut.extras()).map_err(encode)?);
        out.header(&header)
    }

    fn install(&self, snapshot: &mut SnapshotReader) -> io::Result<()> {
        let header = snapshot.header()?;
        let state = decode_snapshot(&header)
            .map_err(|e| io::Error::other(format!("metadata: decode snapshot: {e}")))?;
        state.check_invariants().map_err(|e| {
            io::Error::other(format!(
                "metadata group {META_GROUP}: snapshot refused: its state breaks an invariant: {e}"
            ))
        })?;
        *self.state.write().unwrap() = Arc::new(state);
        self.resync.send_modify(|n| *n += 1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use qq_core::meta::MetaCommand;
    use qq_core::types::{Table, Value};

    use super::*;

    #[test]
    fn a_snapshot_keeps_the_extras_and_reads_one_without_them() {
        let mut state = MetaState::new();
        for cmd in [
            MetaCommand::SetMachineVersion { version: 2 },
            MetaCommand::SetOperatorPolicy {
                vhost: "/".into(),
                name: "cap".into(),
                pattern: ".*".into(),
                apply_to: "queues".into(),
                priority: 0,
                definition: Table::from([("max-length".to_string(), Value::Long(5))]),
            },
        ] {
            state.apply(cmd).0.unwrap();
        }
        let mut bytes = postcard::to_stdvec(&MetaSnapshotRef { state: &state }).unwrap();
        // Release 0.1.0 wrote the state alone: version 1, no extras.
        let old = decode_snapshot(&bytes).unwrap();
        assert_eq!(old.machine_version(), 1);
        assert_eq!(old.operator_policies("/").count(), 0);
        bytes.extend(postcard::to_stdvec(&META_TRAILER_FORMAT).unwrap());
        let extras = postcard::to_stdvec(&state.extras()).unwrap();
        let mut newer = bytes.clone();
        bytes.extend(&extras);
        assert_eq!(decode_snapshot(&bytes).unwrap(), state);
        // A format this release does not know is refused by name.
        newer[bytes.len() - extras.len() - 1] = 3;
        newer.extend(&extras);
        let e = decode_snapshot(&newer).unwrap_err();
        assert!(e.contains("trailer format 3"), "{e}");
    }

    /// Trailer format 1 (before the incarnations) still reads, with none recorded; format 2
    /// carries them.
    #[test]
    fn a_format_1_trailer_reads_and_format_2_keeps_the_incarnations() {
        let mut state = MetaState::new();
        for cmd in [
            MetaCommand::SetMachineVersion { version: 2 },
            MetaCommand::RecordIncarnation {
                id: 2,
                incarnation: 0xfeed,
            },
        ] {
            state.apply(cmd).0.unwrap();
        }
        let head = postcard::to_stdvec(&MetaSnapshotRef { state: &state }).unwrap();
        let extras = state.extras();
        let v1 = MetaExtrasFormat1 {
            machine_version: extras.machine_version,
            vhosts: extras.vhosts.clone(),
        };
        let mut one = head.clone();
        one.extend(postcard::to_stdvec(&1u32).unwrap());
        one.extend(postcard::to_stdvec(&v1).unwrap());
        let read = decode_snapshot(&one).unwrap();
        assert_eq!((read.machine_version(), read.incarnation(2)), (2, None));
        let mut two = head;
        two.extend(postcard::to_stdvec(&META_TRAILER_FORMAT).unwrap());
        two.extend(postcard::to_stdvec(&extras).unwrap());
        assert_eq!(decode_snapshot(&two).unwrap().incarnation(2), Some(0xfeed));
    }

    /// A state with queue `q` whose id the index has lost (its serde form edited: no command
    /// makes one).
    fn broken_state() -> MetaState {
        let mut state = MetaState::new();
        state
            .apply(MetaCommand::DeclareQueue {
                vhost: "/".into(),
                name: "q".into(),
                arguments: Table::new(),
                passive: false,
                nodes: vec![1, 2, 3],
                owner: None,
                origin: None,
            })
            .0
            .unwrap();
        state.check_invariants().unwrap();
        let mut v = serde_json::to_value(&state).unwrap();
        v["queue_ids"] = serde_json::json!({});
        serde_json::from_value(v).unwrap()
    }

    /// Neither written nor installed: a metadata snapshot whose state breaks an invariant.
    /// The install leaves the state as it was; the write is [`refused`] (no storage fault).
    #[test]
    fn a_metadata_snapshot_that_breaks_an_invariant_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (m, _effects) = MetaMachine::new(Store::open(dir.path()).unwrap());
        let broken = broken_state();
        let mut header = postcard::to_stdvec(&MetaSnapshotRef { state: &broken }).unwrap();
        header.extend(postcard::to_stdvec(&META_TRAILER_FORMAT).unwrap());
        header.extend(postcard::to_stdvec(&broken.extras()).unwrap());
        let mut out = m.store.snapshots().writer(META_GROUP, None).unwrap();
        out.header(&header).unwrap();
        let file = out.finish().unwrap();
        let before = m.state();
        let err = m
            .install(&mut file.reader().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("metadata group 0")
                && err.contains("queue 'q' in vhost '/': its id 1 is not indexed to it"),
            "{err}"
        );
        assert_eq!(*m.state(), *before);

        let mut out = m.store.snapshots().writer(META_GROUP, None).unwrap();
        let err = m.write_cut(Arc::new(broken), &mut out).unwrap_err();
        assert!(super::super::shell::is_refused(&err), "{err}");
    }
}
