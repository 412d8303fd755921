//! How long the queue is: what counts against its length limits (`x-max-length`,
//! `x-max-length-bytes`), and what one more message would break.

use super::QueueState;

impl QueueState {
    pub(super) fn ready_len(&self) -> u64 {
        (self.returns.len() + self.fresh_len()) as u64
    }

    pub(super) fn unacked_len(&self) -> u64 {
        self.leases.len() as u64
            + self
                .consumers
                .values()
                .map(|c| c.checked_out.len() as u64)
                .sum::<u64>()
    }

    /// Ready, delayed and held messages count against the length limits.
    pub(super) fn is_over_limit(&self) -> bool {
        let count = self.ready_len() + self.held.len() as u64 + self.delayed.len() as u64;
        let bytes = self.ready_bytes + self.held_bytes + self.delayed_bytes;
        self.config.max_length.is_some_and(|l| count > l)
            || self.config.max_length_bytes.is_some_and(|l| bytes > l)
    }

    /// Which limit one more ready message of `size` bytes would break, as a refusal detail.
    pub(super) fn would_exceed(&self, size: u64) -> Option<String> {
        let count = self.ready_len() + self.held.len() as u64 + self.delayed.len() as u64 + 1;
        let bytes = self.ready_bytes + self.held_bytes + self.delayed_bytes + size;
        let name = &self.config.name;
        if let Some(l) = self.config.max_length
            && count > l
        {
            return Some(format!("queue '{name}' is full (x-max-length {l})"));
        }
        if let Some(l) = self.config.max_length_bytes
            && bytes > l
        {
            return Some(format!("queue '{name}' is full (x-max-length-bytes {l})"));
        }
        None
    }
}
