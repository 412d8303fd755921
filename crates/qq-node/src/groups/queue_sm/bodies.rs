//! Message bodies: written under `(group, message id)`, read back for deliveries, Gets and dead
//! letters.
//!
//! A body is held in memory when its enqueue is applied and written to RocksDB only when it
//! has to be, so that a message settled soon after never reaches RocksDB: no memtable insert,
//! no deletion, nothing for a flush or a compaction to drop (writing and then deleting such
//! bodies was about a sixth of a follower's CPU at full speed). Nothing durable depends on it:
//! bodies are written without RocksDB's WAL anyway, because each is derived from the Raft log.
//! A body lost from memory (a crash, a group unloaded) is written again when the group is
//! opened, which installs its snapshot and applies the log after it.
//!
//! Held bodies are written, oldest first:
//! - after an entry, while the queue holds more than [`QUEUE_HELD_MAX_BYTES`];
//! - after an entry, all of them, while the node's queues together hold more than
//!   [`NODE_HELD_MAX_BYTES`] ([`qq_raft::store::Store::held_bodies`]); so a node holds at
//!   most that plus one entry's bodies, whatever the number of queues;
//! - all of them before a snapshot's cut (the cut pins RocksDB, and the snapshot carries the
//!   bodies of live messages from it) and before a snapshot is installed.
//!
//! Deletions of bodies already written go to RocksDB at the end of each entry, as before.
//! Reads look at the held bodies first, under the same lock as the writes.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use qq_core::{Message, MessageId};
use qq_raft::store::Store;

use super::QueueMachine;

/// Most bytes of bodies one queue holds in memory.
pub const QUEUE_HELD_MAX_BYTES: usize = 4 << 20;
/// Most bytes of bodies all the queues of a node hold in memory (plus one entry's).
pub const NODE_HELD_MAX_BYTES: usize = 64 << 20;

/// Bodies held back from RocksDB, and deletions to write at the end of the entry.
pub(super) struct PendingBodies {
    /// By message id: ids grow with the log index, so the first is the oldest.
    held: BTreeMap<MessageId, Vec<u8>>,
    bytes: usize,
    deletes: Vec<MessageId>,
    /// The node's count of held bytes, shared by its queue machines.
    node: Arc<AtomicUsize>,
}

impl PendingBodies {
    pub(super) fn new(store: &Store) -> PendingBodies {
        PendingBodies {
            held: BTreeMap::new(),
            bytes: 0,
            deletes: Vec::new(),
            node: store.held_bodies(),
        }
    }

    fn hold(&mut self, id: MessageId, body: Vec<u8>) {
        self.bytes += body.len();
        self.node.fetch_add(body.len(), Ordering::Relaxed);
        if let Some(old) = self.held.insert(id, body) {
            self.release(old.len());
        }
    }

    fn take(&mut self, id: MessageId) -> Option<Vec<u8>> {
        let body = self.held.remove(&id)?;
        self.release(body.len());
        Some(body)
    }

    fn release(&mut self, len: usize) {
        self.bytes -= len;
        self.node.fetch_sub(len, Ordering::Relaxed);
    }

    /// The held bodies to write now, oldest first: all of them, or (`keep`) those over the
    /// bounds.
    fn due(&mut self, keep: bool) -> Vec<(MessageId, Vec<u8>)> {
        if !keep || self.node.load(Ordering::Relaxed) > NODE_HELD_MAX_BYTES {
            let all = std::mem::take(&mut self.held);
            self.release(self.bytes);
            return all.into_iter().collect();
        }
        let mut due = Vec::new();
        while self.bytes > QUEUE_HELD_MAX_BYTES {
            let Some((id, body)) = self.held.pop_first() else {
                break;
            };
            self.release(body.len());
            due.push((id, body));
        }
        due
    }
}

impl Drop for PendingBodies {
    fn drop(&mut self) {
        self.node.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl QueueMachine {
    pub(super) fn put_body(&self, id: MessageId, body: Vec<u8>) {
        self.pending.lock().unwrap().hold(id, body);
    }

    pub(super) fn delete_body(&self, id: MessageId) {
        let mut pending = self.pending.lock().unwrap();
        // Ids are never reused: a body still held is not in RocksDB.
        if pending.take(id).is_none() {
            pending.deletes.push(id);
        }
    }

    /// At the end of an entry: write its deletions and the held bodies over the bounds.
    pub(super) fn flush_bodies(&self) -> io::Result<()> {
        self.write_bodies(true)
    }

    /// Write every held body and every deletion (before a cut or an install).
    pub(super) fn flush_all_bodies(&self) -> io::Result<()> {
        self.write_bodies(false)
    }

    /// Under the lock, so that a read finds a body either held or written.
    fn write_bodies(&self, keep: bool) -> io::Result<()> {
        let mut pending = self.pending.lock().unwrap();
        let due = pending.due(keep);
        if !due.is_empty() {
            let bodies: Vec<(u64, &[u8])> = due.iter().map(|(id, b)| (*id, b.as_slice())).collect();
            self.store.put_bodies(self.group, &bodies)?;
        }
        let deletes = std::mem::take(&mut pending.deletes);
        if !deletes.is_empty() {
            self.store.delete_bodies(self.group, &deletes)?;
        }
        Ok(())
    }

    pub fn read_message(&self, id: MessageId) -> io::Result<Message> {
        let decode = |bytes: &[u8]| {
            postcard::from_bytes(bytes).map_err(|e| {
                io::Error::other(format!(
                    "queue group {}: decode message {id}: {e}",
                    self.group
                ))
            })
        };
        let stored = {
            let pending = self.pending.lock().unwrap();
            // A held body is decoded in place: every delivery of a message settled soon
            // after reads it from here, and a copy of it first would be one more per message.
            if let Some(held) = pending.held.get(&id) {
                return decode(held);
            }
            self.store.get_body(self.group, id)?
        };
        let bytes = stored.ok_or_else(|| {
            io::Error::other(format!(
                "queue group {}: body of message {id} is missing",
                self.group
            ))
        })?;
        decode(&bytes)
    }
}
