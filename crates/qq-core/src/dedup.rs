//! Idempotency windows: which keys a queue has stored a message under, for how long.
//!
//! A queue keeps two windows, so that one kind of key cannot push the other out:
//! - **publish keys**: a client's `(publisher_id, publisher_seq)` (scoped to the authenticated
//!   user by the node), or, when the client gives none, the node's own key for its retries of
//!   one proposal;
//! - **transfer keys**: the idempotency keys of dead-letter copies and moved messages.
//!
//! A key is remembered from the apply that stored its message for the queue's dedup window
//! (`x-dedup-window-ms`, default [`DEFAULT_DEDUP_WINDOW_MS`]) of command time, so a repeat
//! within the window is a duplicate, exactly (not "seq <= last seq": a retried publish that lost
//! its race with a later one is still stored). A window also holds at most [`MAX_WINDOW_KEYS`]
//! keys; past that the oldest is forgotten before its time and counted
//! ([`KeyWindow::forgotten_early`]), so memory stays bounded at any publish rate (about 60
//! bytes a key).
//!
//! Keys are kept as the first 128 bits of SHA-256 of the key's bytes: fixed size whatever the
//! client sends, the same on every replica, and a collision (which would take a distinct
//! message for a duplicate) is beyond reach, also for a client that chooses its keys.

use imbl::{OrdSet, Vector};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How long a key is remembered when the queue sets no window: 10 minutes.
pub const DEFAULT_DEDUP_WINDOW_MS: u64 = 600_000;
/// Smallest and largest `x-dedup-window-ms`.
pub const MIN_DEDUP_WINDOW_MS: u64 = 1_000;
pub const MAX_DEDUP_WINDOW_MS: u64 = 86_400_000;
/// Most keys one window holds; the oldest is forgotten early past it.
pub const MAX_WINDOW_KEYS: usize = 1_000_000;

/// The 128-bit identity of an idempotency key.
pub fn key_id(key: &str) -> u128 {
    let digest = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    u128::from_be_bytes(first)
}

/// Keys remembered with the time they were stored, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KeyWindow {
    keys: OrdSet<u128>,
    /// (stored at ms, key), in apply order; times never decrease (they are the queue's clock).
    order: Vector<(u64, u128)>,
    forgotten_early: u64,
}

impl KeyWindow {
    pub fn contains(&self, id: u128) -> bool {
        self.keys.contains(&id)
    }

    /// Forget the keys stored more than `window_ms` before `now_ms`.
    pub fn forget_expired(&mut self, now_ms: u64, window_ms: u64) {
        let cutoff = now_ms.saturating_sub(window_ms);
        while let Some(&(at, id)) = self.order.front() {
            if at >= cutoff {
                break;
            }
            self.order.pop_front();
            self.keys.remove(&id);
        }
    }

    /// Remember `id`, stored at `now_ms` (not below any time remembered before).
    pub fn remember(&mut self, now_ms: u64, id: u128) {
        if self.keys.insert(id).is_some() {
            return;
        }
        if self.order.len() >= MAX_WINDOW_KEYS
            && let Some((_, oldest)) = self.order.pop_front()
        {
            self.keys.remove(&oldest);
            self.forgotten_early += 1;
        }
        self.order.push_back((now_ms, id));
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Keys forgotten before their window ended because the window was full.
    pub fn forgotten_early(&self) -> u64 {
        self.forgotten_early
    }

    /// The window's own invariants: the keys in order are exactly the set's, each once, and
    /// their times never decrease. Linear but for one sort of a flat copy of the ids, as it
    /// runs on every snapshot: a tree lookup per key took 1.8 s for a full window of
    /// 1 000 000 keys (release build), this about a tenth of it.
    pub fn check(&self) -> Result<(), String> {
        if self.keys.len() != self.order.len() || self.order.len() > MAX_WINDOW_KEYS {
            return Err(format!(
                "dedup window: {} keys, {} in order (at most {MAX_WINDOW_KEYS})",
                self.keys.len(),
                self.order.len()
            ));
        }
        let mut ids = Vec::with_capacity(self.order.len());
        let mut last_ms = 0;
        for &(at, id) in &self.order {
            if at < last_ms {
                return Err("dedup window: times out of order".into());
            }
            last_ms = at;
            ids.push(id);
        }
        ids.sort_unstable();
        if !ids.iter().eq(self.keys.iter()) {
            return Err("dedup window: the keys in order are not the set's".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_a_duplicate_for_the_window_and_forgotten_after() {
        let mut w = KeyWindow::default();
        let k = key_id("alice\0p1\07");
        w.remember(1_000, k);
        w.forget_expired(1_000 + 600_000, 600_000);
        assert!(w.contains(k), "still inside the window at its last ms");
        w.forget_expired(1_001 + 600_000, 600_000);
        assert!(!w.contains(k));
        assert!(w.is_empty());
        w.check().unwrap();
    }

    #[test]
    fn a_full_window_forgets_its_oldest_early_and_counts_it() {
        let mut w = KeyWindow::default();
        for i in 0..=MAX_WINDOW_KEYS as u128 {
            w.remember(5, i);
        }
        assert_eq!(w.len(), MAX_WINDOW_KEYS);
        assert!(!w.contains(0));
        assert!(w.contains(1));
        assert_eq!(w.forgotten_early(), 1);
        w.check().unwrap();
    }

    #[test]
    fn a_window_whose_order_and_set_disagree_is_refused() {
        let mut w = KeyWindow::default();
        w.remember(1_000, 1);
        w.remember(1_001, 2);
        w.check().unwrap();
        let mut twice = w.clone();
        twice.order[1].1 = 1;
        assert_eq!(
            twice.check().unwrap_err(),
            "dedup window: the keys in order are not the set's"
        );
        let mut backwards = w.clone();
        backwards.order[1].0 = 999;
        assert_eq!(
            backwards.check().unwrap_err(),
            "dedup window: times out of order"
        );
        let mut extra = w;
        extra.keys.insert(3);
        assert!(extra.check().unwrap_err().contains("3 keys, 2 in order"));
    }

    #[test]
    fn keys_differ_by_every_byte() {
        assert_ne!(key_id("a\0b\01"), key_id("a\0b\02"));
        assert_ne!(key_id("ab\0\01"), key_id("a\0b\01"));
        assert_eq!(key_id("x"), key_id("x"));
    }
}
