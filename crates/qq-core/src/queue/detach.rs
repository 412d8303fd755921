//! Taking a message out of the place it is in (ready, delayed, waiting, unacked), with the
//! indexes that follow each place, and the sequence numbers that order the returns and the
//! delayed set: the bookkeeping every handler of [`QueueState::apply`] shares.

use super::{GET_CONSUMER, MessageId, Place, QueueState};

impl QueueState {
    pub(super) fn detach_ready(&mut self, id: MessageId) {
        let m = &self.msgs[&id];
        let Place::Ready { returned } = m.place else {
            unreachable!("message {id} is not ready")
        };
        let (deadline, size) = (m.deadline_ms, m.header.size_bytes);
        match returned {
            Some(pos) => {
                self.returns.remove(&pos);
                self.returned_ids.remove(&id);
            }
            None => self.remove_fresh(id),
        }
        if let Some(d) = deadline {
            self.expiries.remove(&(d, id));
        }
        self.ready_bytes -= size;
    }

    pub(super) fn detach_delayed(&mut self, id: MessageId) {
        let m = &self.msgs[&id];
        let Place::Delayed { due_ms, seq } = m.place else {
            unreachable!("message {id} is not delayed")
        };
        self.delayed.remove(&(due_ms, seq));
        if let Some(d) = m.deadline_ms {
            self.expiries.remove(&(d, id));
        }
        self.delayed_bytes -= m.header.size_bytes;
    }

    /// Detach a message that waits in the queue: ready or delayed.
    pub(super) fn detach_waiting(&mut self, id: MessageId) {
        if matches!(self.msgs[&id].place, Place::Delayed { .. }) {
            self.detach_delayed(id);
        } else {
            self.detach_ready(id);
        }
    }

    pub(super) fn detach_unacked(&mut self, id: MessageId) {
        let m = &self.msgs[&id];
        let Place::Unacked {
            consumer,
            lease_deadline_ms,
            ..
        } = m.place
        else {
            unreachable!("message {id} is not unacked")
        };
        if consumer == GET_CONSUMER {
            let d = lease_deadline_ms.expect("get lease has a deadline");
            self.leases.remove(&(d, id));
            self.receipts.remove(&id);
        } else {
            self.consumers
                .get_mut(&consumer)
                .expect("holder exists")
                .checked_out
                .remove(&id);
            self.stop_timeout(id);
        }
    }

    /// Sort key of a ready message in dispatch order.
    pub(super) fn queue_pos(&self, id: MessageId) -> (u8, u64) {
        match self.msgs[&id].place {
            Place::Ready {
                returned: Some(pos),
            } => (0, pos),
            Place::Delayed { seq, .. } => (2, seq),
            _ => (1, id),
        }
    }

    pub(super) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}
