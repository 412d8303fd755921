//! Message bodies: written under `(group, message id)` once per applied entry, read back for
//! deliveries, Gets and dead letters.

use std::collections::HashMap;
use std::io;

use qq_core::{Message, MessageId};

use super::QueueMachine;

/// Body writes collected while an entry is applied, written when it is done
/// ([`QueueMachine::flush_bodies`]). Reads look here first.
#[derive(Default)]
pub(super) struct PendingBodies {
    puts: HashMap<MessageId, Vec<u8>>,
    deletes: Vec<MessageId>,
}

impl QueueMachine {
    pub(super) fn put_body(&self, id: MessageId, body: Vec<u8>) {
        self.pending.lock().unwrap().puts.insert(id, body);
    }

    pub(super) fn delete_body(&self, id: MessageId) {
        let mut pending = self.pending.lock().unwrap();
        // Ids are never reused: a body put by this entry is not on disk yet.
        if pending.puts.remove(&id).is_none() {
            pending.deletes.push(id);
        }
    }

    /// Write the bodies put and deleted by the entry just applied.
    pub(super) fn flush_bodies(&self) -> io::Result<()> {
        let PendingBodies { puts, deletes } = std::mem::take(&mut *self.pending.lock().unwrap());
        if !puts.is_empty() {
            let mut bodies: Vec<(u64, &[u8])> =
                puts.iter().map(|(id, b)| (*id, b.as_slice())).collect();
            bodies.sort_unstable_by_key(|(id, _)| *id);
            self.store.put_bodies(self.group, &bodies)?;
        }
        if !deletes.is_empty() {
            self.store.delete_bodies(self.group, &deletes)?;
        }
        Ok(())
    }

    pub fn read_message(&self, id: MessageId) -> io::Result<Message> {
        let pending = self.pending.lock().unwrap().puts.get(&id).cloned();
        let bytes = match pending {
            Some(b) => Some(b),
            None => self.store.get_body(self.group, id)?,
        };
        let bytes = bytes.ok_or_else(|| {
            io::Error::other(format!(
                "queue group {}: body of message {id} is missing",
                self.group
            ))
        })?;
        postcard::from_bytes(&bytes).map_err(|e| {
            io::Error::other(format!(
                "queue group {}: decode message {id}: {e}",
                self.group
            ))
        })
    }
}
