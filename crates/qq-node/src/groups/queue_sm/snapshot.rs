//! A queue's snapshot: the state (with its receipts and move tasks) as a header, then the body
//! of every live message; cut in O(1), written off the state-machine worker, installed page by
//! page.

use std::collections::BTreeMap;
use std::io;

use qq_core::queue::{MoveTask, QueueState, Receipts};
use qq_core::{ConsumerId, MessageId};
use qq_raft::snapshot::{SnapshotReader, SnapshotWriter};
use qq_raft::store::Pinned;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::{QueueMachine, io_encode};

/// A snapshot file's header: the state; the bodies of its live messages follow as records.
/// Its encoding is a format that nodes of other versions read (qq-core's
/// `tests/snapshot_format.rs` holds golden bytes of `(state, receipts, moves)`).
///
/// What was added later follows it as a trailer that is written only when it holds something:
/// the cancelled consumers ([`QueueState::cancelled`]), a postcard `Vec` of their ids. A node
/// that predates the trailer reads the header and ignores the bytes after it, so it forgets
/// only that those consumers were cancelled.
#[derive(Serialize, Deserialize)]
struct QueueSnapshotHeader {
    state: QueueState,
    /// The Get receipts ([`QueueState::receipts`]), which the state's own encoding leaves out.
    receipts: Receipts,
    /// The move tasks ([`QueueState::moves`]), likewise.
    moves: BTreeMap<u64, MoveTask>,
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
        // Taken in the state-machine worker between two applies, after the previous apply's
        // bodies were written (`flush_bodies`): the state and the pinned bodies agree. Both
        // are O(1): a clone of the persistent state and a RocksDB snapshot.
        let state = self.state.lock().unwrap();
        QueueCut {
            state: state.clone(),
            bodies: self.store.pin(),
        }
    }

    /// [`Machine::write_cut`](crate::groups::shell::Machine::write_cut).
    pub(super) fn write_snapshot(&self, cut: QueueCut, out: &mut SnapshotWriter) -> io::Result<()> {
        let QueueCut { state, bodies } = cut;
        let mut header = io_encode(&QueueSnapshotHeaderRef {
            state: &state,
            receipts: state.receipts(),
            moves: state.moves(),
        })?;
        if !state.cancelled().is_empty() {
            let cancelled: Vec<ConsumerId> = state.cancelled().iter().copied().collect();
            header.extend(io_encode(&cancelled)?);
        }
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

    /// [`Machine::install`](crate::groups::shell::Machine::install).
    pub(super) fn install_snapshot(&self, snapshot: &mut SnapshotReader) -> io::Result<()> {
        let (header, cancelled) = decode_header(&snapshot.header()?).map_err(|e| {
            io::Error::other(format!("queue group {}: decode snapshot: {e}", self.group))
        })?;
        // Bodies: drop those of messages the snapshot no longer has, write the snapshot's.
        let keep: std::collections::BTreeSet<MessageId> =
            header.state.message_ids().into_iter().collect();
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
        let QueueSnapshotHeader {
            mut state,
            receipts,
            moves,
        } = header;
        state.restore_receipts(receipts);
        state.restore_moves(moves);
        state.restore_cancelled(cancelled);
        *self.state.lock().unwrap() = state;
        Ok(())
    }
}

/// The header and its trailer (empty when the snapshot has none).
fn decode_header(bytes: &[u8]) -> postcard::Result<(QueueSnapshotHeader, Vec<ConsumerId>)> {
    let (header, trailer) = postcard::take_from_bytes::<QueueSnapshotHeader>(bytes)?;
    let cancelled = if trailer.is_empty() {
        Vec::new()
    } else {
        postcard::from_bytes(trailer)?
    };
    Ok((header, cancelled))
}
