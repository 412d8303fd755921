//! The newest entries of one group's log, kept in memory as they were appended, so that the
//! reads that follow every append (the leader's replication to each follower, and the
//! state machine's apply on every member) do not go back to RocksDB for them: no iterator,
//! no checksum, no decode, only a clone of each entry.
//!
//! # Invariants
//!
//! - What the tail holds is a run of consecutive entries ending at the last one appended,
//!   and every one of them is in RocksDB too: [`Tail::appended`] runs after the write,
//!   [`Tail::truncate_from`] and [`Tail::purge_to`] before theirs. A read the tail cannot
//!   serve whole ([`Tail::get`] is `None`) goes to RocksDB, as before.
//! - Bounds: at most [`TAIL_MAX_ENTRIES`] entries and [`TAIL_MAX_BYTES`] (encoded) per
//!   group, and [`NODE_TAIL_MAX_BYTES`] for all the groups of a node ([`TailBudget`]). At a
//!   bound the oldest entries go first; an entry larger than the group's bound is not kept.
//!   A group's tail is freed with its log store (an unloaded group keeps none).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use openraft::alias::EntryOf;
use openraft::entry::RaftEntry;

use crate::types::TypeConfig;

type Entry = EntryOf<TypeConfig>;

/// Entries kept per group, at most.
pub const TAIL_MAX_ENTRIES: usize = 1024;
/// Encoded bytes kept per group, at most.
pub const TAIL_MAX_BYTES: usize = 4 << 20;
/// Encoded bytes kept by all the groups of a node, at most.
pub const NODE_TAIL_MAX_BYTES: usize = 256 << 20;

/// The bytes held by every tail of a node's store.
#[derive(Debug, Default)]
pub struct TailBudget {
    used: AtomicUsize,
}

impl TailBudget {
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// One group's tail.
pub struct Tail {
    /// Each entry with its encoded size.
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
    budget: Arc<TailBudget>,
}

impl Tail {
    pub fn new(budget: Arc<TailBudget>) -> Tail {
        Tail {
            entries: VecDeque::new(),
            bytes: 0,
            budget,
        }
    }

    fn first(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.index())
    }

    /// One past the last entry held.
    fn end(&self) -> Option<u64> {
        self.entries.back().map(|(e, _)| e.index() + 1)
    }

    /// Entries `[start, end)`, if the tail holds all of them.
    pub fn get(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        let first = self.first()?;
        if start < first || end > self.end()? || end <= start {
            return None;
        }
        let from = (start - first) as usize;
        let to = (end - first) as usize;
        Some(
            self.entries
                .range(from..to)
                .map(|(e, _)| e.clone())
                .collect(),
        )
    }

    /// Entries just written to the log, in order, each with its encoded size. Entries that
    /// do not follow what the tail holds replace it.
    pub fn appended(&mut self, entries: Vec<(Entry, usize)>) {
        for (entry, size) in entries {
            if self.end().is_some_and(|end| end != entry.index()) || size > TAIL_MAX_BYTES {
                self.clear();
            }
            if size > TAIL_MAX_BYTES {
                continue;
            }
            self.entries.push_back((entry, size));
            self.bytes += size;
            self.budget.used.fetch_add(size, Ordering::Relaxed);
        }
        while !self.entries.is_empty()
            && (self.entries.len() > TAIL_MAX_ENTRIES
                || self.bytes > TAIL_MAX_BYTES
                || self.budget.used() > NODE_TAIL_MAX_BYTES)
        {
            self.pop_front();
        }
    }

    /// Entries from `index` on are about to be deleted from the log.
    pub fn truncate_from(&mut self, index: u64) {
        while self.end().is_some_and(|end| end > index) {
            let (_, size) = self.entries.pop_back().expect("not empty");
            self.release(size);
        }
    }

    /// Entries up to `index` (included) are about to be purged from the log.
    pub fn purge_to(&mut self, index: u64) {
        while self.first().is_some_and(|first| first <= index) {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some((_, size)) = self.entries.pop_front() {
            self.release(size);
        }
    }

    fn release(&mut self, size: usize) {
        self.bytes -= size;
        self.budget.used.fetch_sub(size, Ordering::Relaxed);
    }

    fn clear(&mut self) {
        while !self.entries.is_empty() {
            self.pop_front();
        }
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use openraft::vote::RaftLeaderId;

    use super::*;

    fn entry(term: u64, index: u64) -> (Entry, usize) {
        let leader = <openraft::alias::LeaderIdOf<TypeConfig>>::new(term, 1).to_committed();
        (Entry::new_blank(openraft::LogId::new(leader, index)), 100)
    }

    fn indexes(got: Option<Vec<Entry>>) -> Option<Vec<(u64, u64)>> {
        got.map(|v| {
            v.iter()
                .map(|e| (e.log_id().committed_leader_id().term, e.index()))
                .collect()
        })
    }

    #[test]
    fn serves_only_ranges_it_holds_whole() {
        let budget = Arc::new(TailBudget::default());
        let mut t = Tail::new(budget.clone());
        t.appended((5..=9).map(|i| entry(1, i)).collect());
        assert_eq!(budget.used(), 500);
        assert_eq!(
            indexes(t.get(6, 8)),
            Some(vec![(1, 6), (1, 7)]),
            "a range inside"
        );
        assert_eq!(t.get(4, 8).map(|v| v.len()), None, "starts before the tail");
        assert_eq!(t.get(8, 11).map(|v| v.len()), None, "ends after the tail");
        assert_eq!(t.get(7, 7).map(|v| v.len()), None, "empty range");
    }

    #[test]
    fn truncation_and_a_new_term_replace_the_end() {
        let budget = Arc::new(TailBudget::default());
        let mut t = Tail::new(budget.clone());
        t.appended((1..=5).map(|i| entry(1, i)).collect());
        t.truncate_from(4);
        assert_eq!(t.get(4, 5).map(|v| v.len()), None);
        t.appended(vec![entry(2, 4)]);
        assert_eq!(indexes(t.get(3, 5)), Some(vec![(1, 3), (2, 4)]));
        // An append that does not follow (a snapshot moved the log on) replaces the tail.
        t.appended(vec![entry(2, 10)]);
        assert_eq!(t.get(3, 5).map(|v| v.len()), None);
        assert_eq!(indexes(t.get(10, 11)), Some(vec![(2, 10)]));
        assert_eq!(budget.used(), 100);
        t.purge_to(10);
        assert_eq!(budget.used(), 0);
        t.appended(vec![entry(2, 11)]);
        drop(t);
        assert_eq!(budget.used(), 0, "a dropped tail gives its bytes back");
    }

    #[test]
    fn bounds_drop_the_oldest_entries() {
        let budget = Arc::new(TailBudget::default());
        let mut t = Tail::new(budget.clone());
        t.appended(
            (1..=TAIL_MAX_ENTRIES as u64 + 10)
                .map(|i| entry(1, i))
                .collect(),
        );
        assert_eq!(t.entries.len(), TAIL_MAX_ENTRIES);
        assert_eq!(t.first(), Some(11));
        let (big, _) = entry(1, TAIL_MAX_ENTRIES as u64 + 11);
        t.appended(vec![(big, TAIL_MAX_BYTES + 1)]);
        assert!(t.entries.is_empty(), "an entry over the bound is not kept");
        assert_eq!(budget.used(), 0);
        // The node's budget: another group's tail cannot grow past it.
        budget
            .used
            .fetch_add(NODE_TAIL_MAX_BYTES, Ordering::Relaxed);
        let mut other = Tail::new(budget.clone());
        other.appended(vec![entry(1, 1)]);
        assert!(other.entries.is_empty());
    }
}
