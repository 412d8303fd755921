//! A queue's snapshot: the state (with its receipts and move tasks) as a header, then the body
//! of every live message; cut in O(1), written off the state-machine worker, installed page by
//! page. Its state's invariants are checked before a snapshot is written and before one is
//! installed (also a replica's own at start): a state that breaks one is never written, and a
//! snapshot that carries one is refused with the current state left as it was.

use std::collections::BTreeMap;
use std::io;

use qq_core::queue::{FIRST_MACHINE_VERSION, MoveTask, QueueState, Receipts};
use qq_core::{ConsumerId, MessageId};
use qq_raft::snapshot::{SnapshotReader, SnapshotWriter};
use qq_raft::store::Pinned;
use serde::{Deserialize, Serialize};
use tracing::{error, warn};

use super::{QueueMachine, io_encode};
use crate::groups::shell::refused;

/// A snapshot file's header: the state; the bodies of its live messages follow as records.
/// Its encoding is a format that nodes of other versions read (qq-core's
/// `tests/snapshot_format.rs` holds golden bytes of `(state, receipts, moves)`).
///
/// What was added later follows it as a versioned [`Trailer`]. A node of release 0.1.0 reads
/// the header and ignores the bytes after it, which is right while the queue's machine runs
/// version 1 (the only time such a node is a member); a header without a trailer was written
/// by 0.1.0.
#[derive(Serialize, Deserialize)]
struct QueueSnapshotHeader {
    state: QueueState,
    /// The Get receipts ([`QueueState::receipts`]), which the state's own encoding leaves out.
    receipts: Receipts,
    /// The move tasks ([`QueueState::moves`]), likewise.
    moves: BTreeMap<u64, MoveTask>,
}

/// The trailer's format number, written before its record.
const TRAILER_FORMAT: u32 = 1;

/// What a snapshot carries after its header: a postcard `u32` format number, then that
/// format's record. A reader knows every format up to its own [`TRAILER_FORMAT`] and refuses a
/// newer one by name. Once a release has written a format, a new field makes a new format
/// (`TrailerV2`, ...) read beside the old; format 1 is first released with 0.2.0.
#[derive(Serialize, Deserialize)]
struct TrailerV1 {
    /// [`QueueState::machine_version`].
    machine_version: u32,
    /// [`QueueState::cancelled`]: consumers cancelled while they still hold messages.
    cancelled: Vec<ConsumerId>,
    /// [`QueueState::priorities`]: the consumers' non-zero priorities.
    priorities: Vec<(ConsumerId, i32)>,
    /// [`QueueState::consumer_timeouts`]: the consumer timeout and the deadlines of the
    /// messages checked out under it.
    consumer_timeout_ms: Option<u64>,
    deadlines: Vec<(MessageId, u64)>,
    /// [`QueueState::releases`]: returns that were not failed deliveries, per message.
    releases: Vec<(MessageId, u32)>,
    /// [`QueueState::high_priority`]: the fresh high-priority messages, and where the
    /// two-to-one cycle between the levels stands.
    high_priority: Vec<MessageId>,
    dequeue_counter: u8,
    /// [`QueueState::strict_levels`]: the fresh messages of a queue with `x-max-priority`, each
    /// with its level (the top level itself comes from the queue's arguments).
    strict_levels: Vec<(MessageId, u8)>,
}

/// [`QueueSnapshotHeader`] by reference, encoded from the cut's copy of the state.
#[derive(Serialize)]
struct QueueSnapshotHeaderRef<'a> {
    state: &'a QueueState,
    receipts: &'a Receipts,
    moves: &'a BTreeMap<u64, MoveTask>,
}

/// A queue's snapshot cut: a copy of its state and the bodies pinned at that moment. The copy
/// costs O(1) whatever the backlog (the state's collections are persistent and share their
/// nodes until the next apply changes them, module `qq_core::queue`); the encoding and the
/// list of live ids are made from it in [`Machine::write_cut`], off the state-machine worker.
pub struct QueueCut {
    state: QueueState,
    bodies: Pinned,
}

/// Bodies read or written per step while a snapshot is written or installed.
const SNAPSHOT_PAGE_BYTES: usize = 4 << 20;

impl QueueMachine {
    /// [`Machine::cut`](crate::groups::shell::Machine::cut).
    pub(super) fn take_cut(&self) -> QueueCut {
        // Taken in the state-machine worker between two applies, once every held body is
        // written: the state and the pinned bodies agree. Both are O(1): a clone of the
        // persistent state and a RocksDB snapshot. A failed write is a storage fault (the
        // store's handler stops the node); the snapshot would miss a body and be refused.
        if let Err(e) = self.flush_all_bodies() {
            error!(
                group = self.group,
                "writing held bodies before a snapshot cut: {e}"
            );
        }
        let state = self.state.lock().unwrap();
        QueueCut {
            state: state.clone(),
            bodies: self.store.pin(),
        }
    }

    /// [`Machine::write_cut`](crate::groups::shell::Machine::write_cut).
    pub(super) fn write_snapshot(&self, cut: QueueCut, out: &mut SnapshotWriter) -> io::Result<()> {
        let QueueCut { state, bodies } = cut;
        // Off the state-machine worker, on the cut's copy. At 1 000 000 messages (release
        // build, 2 busy cores) 0.1-0.4 s, against 0.3-1.0 s to encode the header alone.
        if let Err(e) = state.check_invariants() {
            error!(
                group = self.group,
                invariant = %e,
                "snapshot refused: the queue's state breaks an invariant (a bug); the log is kept"
            );
            return Err(refused(self.broken(&e)));
        }
        let mut header = io_encode(&QueueSnapshotHeaderRef {
            state: &state,
            receipts: state.receipts(),
            moves: state.moves(),
        })?;
        header.extend(io_encode(&TRAILER_FORMAT)?);
        let (high_priority, dequeue_counter) = state.high_priority();
        header.extend(io_encode(&TrailerV1 {
            machine_version: state.machine_version(),
            cancelled: state.cancelled().iter().copied().collect(),
            priorities: state.priorities().iter().map(|(c, p)| (*c, *p)).collect(),
            consumer_timeout_ms: state.consumer_timeouts().0,
            deadlines: state.consumer_timeouts().1,
            releases: state.releases(),
            high_priority,
            dequeue_counter,
            strict_levels: state.strict_levels(),
        })?);
        out.header(&header)?;
        // Both in id order: a merge of the live ids with the pinned bodies, page by page.
        let mut live = state.live_ids().peekable();
        let mut missing = 0u64;
        let mut from = 0u64;
        loop {
            let page = bodies.scan_bodies(self.group, from, SNAPSHOT_PAGE_BYTES)?;
            let Some(&(last, _)) = page.last() else {
                break;
            };
            for (id, body) in page {
                while live.next_if(|l| *l < id).is_some() {
                    missing += 1;
                }
                if live.next_if_eq(&id).is_some() {
                    out.body(id, &body)?;
                }
            }
            from = last + 1;
        }
        missing += live.count() as u64;
        if missing > 0 {
            warn!(
                group = self.group,
                missing, "snapshot written without the bodies of live messages it could not find"
            );
        }
        Ok(())
    }

    /// [`Machine::install`](crate::groups::shell::Machine::install). The snapshot's state is
    /// decoded and checked whole before anything is replaced: one that breaks an invariant is
    /// refused, and the state and bodies stay as they were.
    pub(super) fn install_snapshot(&self, snapshot: &mut SnapshotReader) -> io::Result<()> {
        let state = self.checked_state(&snapshot.header()?)?;
        self.flush_all_bodies()?;
        // Bodies: drop those of messages the snapshot no longer has, write the snapshot's.
        let keep: std::collections::BTreeSet<MessageId> = state.message_ids().into_iter().collect();
        let stale: Vec<MessageId> = self
            .state
            .lock()
            .unwrap()
            .message_ids()
            .into_iter()
            .filter(|id| !keep.contains(id))
            .collect();
        drop(keep);
        for ids in stale.chunks(65_536) {
            self.store.delete_bodies(self.group, ids)?;
        }
        let mut page: Vec<(MessageId, Vec<u8>)> = Vec::new();
        let mut page_bytes = 0usize;
        loop {
            let next = snapshot.next_body()?;
            let end = next.is_none();
            if let Some((id, body)) = next {
                page_bytes += body.len();
                page.push((id, body));
            }
            if page_bytes >= SNAPSHOT_PAGE_BYTES || (end && !page.is_empty()) {
                let refs: Vec<(MessageId, &[u8])> =
                    page.iter().map(|(id, b)| (*id, b.as_slice())).collect();
                self.store.put_bodies(self.group, &refs)?;
                page.clear();
                page_bytes = 0;
            }
            if end {
                break;
            }
        }
        *self.state.lock().unwrap() = state;
        Ok(())
    }

    /// The state a snapshot header carries, with its trailer put back, if it keeps every
    /// invariant ([`QueueState::check_invariants`]).
    fn checked_state(&self, header: &[u8]) -> io::Result<QueueState> {
        let (header, trailer) = decode_header(header).map_err(|e| {
            io::Error::other(format!("queue group {}: decode snapshot: {e}", self.group))
        })?;
        let QueueSnapshotHeader {
            mut state,
            receipts,
            moves,
        } = header;
        state.restore_receipts(receipts);
        state.restore_moves(moves);
        state.restore_cancelled(trailer.cancelled);
        state.restore_machine_version(trailer.machine_version);
        state.restore_priorities(trailer.priorities);
        state.restore_consumer_timeouts(trailer.consumer_timeout_ms, trailer.deadlines);
        state.restore_releases(trailer.releases);
        state.restore_high_priority(trailer.high_priority, trailer.dequeue_counter);
        state.set_max_priority(self.max_priority);
        state.restore_strict_levels(trailer.strict_levels);
        state
            .check_invariants()
            .map_err(|e| io::Error::other(self.broken(&e)))?;
        Ok(state)
    }

    /// Why a snapshot of a state that breaks `invariant` is refused.
    fn broken(&self, invariant: &str) -> String {
        format!(
            "queue group {}: snapshot refused: its state breaks an invariant: {invariant}",
            self.group
        )
    }
}

/// The header and its trailer (release 0.1.0 wrote none: its machine, nothing cancelled).
fn decode_header(bytes: &[u8]) -> Result<(QueueSnapshotHeader, TrailerV1), String> {
    let (header, rest) =
        postcard::take_from_bytes::<QueueSnapshotHeader>(bytes).map_err(|e| e.to_string())?;
    if rest.is_empty() {
        let trailer = TrailerV1 {
            machine_version: FIRST_MACHINE_VERSION,
            cancelled: Vec::new(),
            priorities: Vec::new(),
            consumer_timeout_ms: None,
            deadlines: Vec::new(),
            releases: Vec::new(),
            high_priority: Vec::new(),
            dequeue_counter: 0,
            strict_levels: Vec::new(),
        };
        return Ok((header, trailer));
    }
    let (format, record) =
        postcard::take_from_bytes::<u32>(rest).map_err(|e| format!("trailer format: {e}"))?;
    match format {
        1 => {
            let trailer = postcard::from_bytes(record).map_err(|e| format!("trailer: {e}"))?;
            Ok((header, trailer))
        }
        _ => Err(format!(
            "trailer format {format} is newer than this release reads ({TRAILER_FORMAT})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use qq_core::QueueConfig;
    use qq_raft::store::Store;

    use super::*;
    use crate::groups::shell::{Machine, is_refused};

    fn header_bytes(state: &QueueState) -> Vec<u8> {
        io_encode(&QueueSnapshotHeaderRef {
            state,
            receipts: state.receipts(),
            moves: state.moves(),
        })
        .unwrap()
    }

    #[test]
    fn a_header_without_trailer_is_release_0_1_0s_and_a_newer_trailer_is_refused() {
        let state = QueueState::new(QueueConfig::new("/", "q"));
        let bytes = header_bytes(&state);
        let (_, trailer) = decode_header(&bytes).unwrap();
        assert_eq!(trailer.machine_version, FIRST_MACHINE_VERSION);
        assert!(trailer.cancelled.is_empty());

        let mut with = bytes.clone();
        with.extend(io_encode(&TRAILER_FORMAT).unwrap());
        let v1 = TrailerV1 {
            machine_version: 2,
            cancelled: vec![4, 9],
            priorities: vec![(4, -2)],
            consumer_timeout_ms: Some(5),
            deadlines: vec![(7, 12)],
            releases: vec![(7, 3)],
            high_priority: vec![8],
            dequeue_counter: 1,
            strict_levels: vec![(10, 3)],
        };
        with.extend(io_encode(&v1).unwrap());
        let (_, trailer) = decode_header(&with).unwrap();
        assert_eq!(
            (trailer.machine_version, trailer.cancelled),
            (2, vec![4, 9])
        );
        assert_eq!(trailer.priorities, vec![(4, -2)]);
        assert_eq!(
            (trailer.consumer_timeout_ms, trailer.deadlines),
            (Some(5), vec![(7, 12)])
        );
        assert_eq!(trailer.releases, vec![(7, 3)]);
        assert_eq!(
            (trailer.high_priority, trailer.dequeue_counter),
            (vec![8], 1)
        );
        assert_eq!(trailer.strict_levels, vec![(10, 3)]);

        let mut newer = bytes;
        newer.extend(io_encode(&(TRAILER_FORMAT + 1)).unwrap());
        newer.extend([0, 0]);
        let err = decode_header(&newer).err().unwrap();
        assert!(err.contains("trailer format 2 is newer"), "{err}");
    }

    /// A queue machine of group 5 with two messages (entries 1 and 2) and their bodies.
    fn machine_with_two(dir: &std::path::Path) -> std::sync::Arc<QueueMachine> {
        let m = QueueMachine::new(5, Store::open(dir).unwrap(), QueueConfig::new("/", "q"));
        for (index, body) in [(1u64, b"one"), (2, b"two")] {
            let message = qq_core::Message {
                properties: Default::default(),
                body: body.to_vec().into(),
                exchange: String::new(),
                routing_key: "q".into(),
                bcc: Vec::new(),
            };
            let req = super::super::QueueRequest {
                cmd: qq_core::queue::Command::Enqueue {
                    now_ms: 1_000,
                    header: qq_core::queue::MsgHeader {
                        size_bytes: 3,
                        expiration_ms: None,
                    },
                    publish_key: None,
                    dedup_key: None,
                },
                message: Some(postcard::to_stdvec(&message).unwrap()),
            };
            let entry = postcard::to_stdvec(&super::super::QueueEntry::One(req)).unwrap();
            m.apply_payload(index, &entry).unwrap();
        }
        m
    }

    /// `state` with its ready bytes off by one: a state no apply makes, built through its
    /// serde form (its fields are qq-core's own).
    fn with_wrong_ready_bytes(state: &QueueState) -> QueueState {
        let mut v = serde_json::to_value(state).unwrap();
        let bytes = v["ready_bytes"].as_u64().unwrap();
        v["ready_bytes"] = (bytes + 1).into();
        let broken: QueueState = serde_json::from_value(v).unwrap();
        assert!(broken.check_invariants().is_err());
        broken
    }

    /// A snapshot whose state breaks an invariant is refused by name, and neither the state
    /// nor a body of the replica changes (without the check it would install: the state would
    /// differ and the two bodies, which the snapshot does not have, would be gone).
    #[test]
    fn a_snapshot_that_breaks_an_invariant_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let m = machine_with_two(dir.path());
        let before = m.with_state(|s| s.clone());

        let broken = with_wrong_ready_bytes(&QueueState::new(QueueConfig::new("/", "q")));
        let mut out = m.store.snapshots().writer(5, None).unwrap();
        out.header(&header_bytes(&broken)).unwrap();
        let file = out.finish().unwrap();

        let err = m
            .install(&mut file.reader().unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("queue group 5"), "{err}");
        assert!(
            err.contains("breaks an invariant: ready 0/0B but indexes say 0/1B"),
            "{err}"
        );
        assert_eq!(m.with_state(|s| s.clone()), before);
        let ids = before.message_ids();
        assert_eq!(ids.len(), 2);
        for id in ids {
            assert_eq!(m.read_message(id).unwrap().body.len(), 3);
        }
    }

    /// A cut whose state breaks an invariant is not written: the error says which and is
    /// [`refused`], so the shell does not take it for a storage fault.
    #[test]
    fn a_state_that_breaks_an_invariant_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let m = machine_with_two(dir.path());
        let broken = with_wrong_ready_bytes(&m.with_state(|s| s.clone()));
        *m.state.lock().unwrap() = broken;
        let mut out = m.store.snapshots().writer(5, None).unwrap();
        let err = m.write_cut(m.cut(), &mut out).unwrap_err();
        assert!(is_refused(&err), "{err}");
        let err = err.to_string();
        assert!(
            err.contains("queue group 5") && err.contains("ready 2/6B but indexes say 2/7B"),
            "{err}"
        );
    }

    /// Built through the shell, a refused snapshot fails the build without calling the
    /// store's fault handler, which would stop the node.
    #[tokio::test]
    async fn a_refused_snapshot_fails_the_build_without_a_storage_fault() {
        use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};

        let dir = tempfile::tempdir().unwrap();
        let faults = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = faults.clone();
        let store = Store::open_with(
            dir.path(),
            std::sync::Arc::new(move |fault: &str| seen.lock().unwrap().push(fault.to_string())),
        )
        .unwrap();
        let m = QueueMachine::new(5, store, QueueConfig::new("/", "q"));
        *m.state.lock().unwrap() =
            with_wrong_ready_bytes(&QueueState::new(QueueConfig::new("/", "q")));
        let mut shell = crate::groups::shell::Shell::new(m);
        let mut builder = shell.try_create_snapshot_builder(true).await.unwrap();
        let err = builder.build_snapshot().await.unwrap_err().to_string();
        assert!(err.contains("breaks an invariant"), "{err}");
        assert_eq!(*faults.lock().unwrap(), Vec::<String>::new());
    }
}
