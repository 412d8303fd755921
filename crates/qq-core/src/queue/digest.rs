//! The state's `Debug` form and its digest. The digest is what the chaos checker compares
//! between replicas, and nodes of two versions must compute it alike
//! (`tests/snapshot_format.rs` holds a golden one): the `Debug` form is written by hand, field
//! by field in declaration order as `derive(Debug)` would, so that a field added later can stay
//! out of it while it is empty. A new field goes at the end, printed only when it holds
//! something (or differs from its default), as `cancelled` and `machine_version` are.

use std::fmt;

use super::QueueState;

impl fmt::Debug for QueueState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("QueueState");
        d.field("config", &self.config)
            .field("last_index", &self.last_index)
            .field("clock_ms", &self.clock_ms)
            .field("last_used_ms", &self.last_used_ms)
            .field("seq", &self.seq)
            .field("msgs", &self.msgs)
            .field("returns", &self.returns)
            .field("fresh", &self.fresh)
            .field("returned_ids", &self.returned_ids)
            .field("ready_bytes", &self.ready_bytes)
            .field("delayed", &self.delayed)
            .field("delayed_bytes", &self.delayed_bytes)
            .field("expiries", &self.expiries)
            .field("consumers", &self.consumers)
            .field("cursor", &self.cursor)
            .field("leases", &self.leases)
            .field("held", &self.held)
            .field("held_bytes", &self.held_bytes)
            .field("publish_keys", &self.publish_keys)
            .field("transfer_keys", &self.transfer_keys)
            .field("stats", &self.stats)
            .field("receipts", &self.receipts)
            .field("moves", &self.moves);
        if !self.cancelled.is_empty() {
            d.field("cancelled", &self.cancelled);
        }
        if self.machine_version != super::FIRST_MACHINE_VERSION {
            d.field("machine_version", &self.machine_version);
        }
        if !self.priorities.is_empty() {
            d.field("priorities", &self.priorities);
        }
        if self.consumer_timeout_ms.is_some() || !self.unacked_deadlines.is_empty() {
            d.field("consumer_timeout_ms", &self.consumer_timeout_ms)
                .field("unacked_deadlines", &self.unacked_deadlines);
        }
        if !self.releases.is_empty() {
            d.field("releases", &self.releases);
        }
        if self.max_priority.is_some() {
            d.field("max_priority", &self.max_priority)
                .field("levels", &self.levels);
        }
        if !self.high.is_empty() || self.dequeue_counter != 0 {
            d.field("high", &self.high)
                .field("dequeue_counter", &self.dequeue_counter);
        }
        d.finish()
    }
}

impl QueueState {
    /// Stable hash of the whole state (FNV-1a over its `Debug` form, which uses ordered
    /// collections only), for replica-agreement checks.
    pub fn digest(&self) -> u64 {
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        fmt::write(&mut h, format_args!("{self:?}")).expect("hashing cannot fail");
        h.0
    }
}

/// FNV-1a, fed through `fmt::Write` so the `Debug` form is hashed without being materialised.
struct Fnv(u64);

impl fmt::Write for Fnv {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Ok(())
    }
}
