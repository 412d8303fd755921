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
//! ([`KeyWindow::forgotten_early`]), so memory stays bounded at any publish rate (about 70
//! bytes a key).
//!
//! Keys are kept as the first 128 bits of SHA-256 of the key's bytes: fixed size whatever the
//! client sends, the same on every replica, and a collision (which would take a distinct
//! message for a duplicate) is beyond reach, also for a client that chooses its keys.

use std::collections::HashSet;
use std::fmt;
use std::sync::OnceLock;

use imbl::Vector;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
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
///
/// `order` is the window; `keys` is an index of the same ids for lookups, a hash set (one
/// probe, where a persistent tree took several cache misses per lookup, insert and removal:
/// about 2 µs of every enqueue on every replica with a full window, against 0.6 µs now). The
/// index is not cloned: a clone (a snapshot's cut, taken between two applies) shares `order`
/// (persistent, O(1)) and builds its index from it only if it is looked up. The encoded form
/// and the `Debug` form are the ones of the former `OrdSet` (the ids sorted), so snapshots and
/// replica digests do not change.
#[derive(Default)]
pub struct KeyWindow {
    keys: OnceLock<HashSet<u128>>,
    /// (stored at ms, key), in apply order; times never decrease (they are the queue's clock).
    order: Vector<(u64, u128)>,
    forgotten_early: u64,
}

impl Clone for KeyWindow {
    fn clone(&self) -> KeyWindow {
        KeyWindow {
            keys: OnceLock::new(),
            order: self.order.clone(),
            forgotten_early: self.forgotten_early,
        }
    }
}

/// The index follows from the order, so two windows are equal when their orders are.
impl PartialEq for KeyWindow {
    fn eq(&self, other: &KeyWindow) -> bool {
        self.forgotten_early == other.forgotten_early && self.order == other.order
    }
}

/// The ids of the window, sorted: the former `OrdSet`'s encoding and `Debug` form.
struct SortedIds(Vec<u128>);

impl SortedIds {
    fn of(order: &Vector<(u64, u128)>) -> SortedIds {
        let mut ids: Vec<u128> = order.iter().map(|&(_, id)| id).collect();
        ids.sort_unstable();
        SortedIds(ids)
    }
}

impl fmt::Debug for SortedIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.iter()).finish()
    }
}

impl fmt::Debug for KeyWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyWindow")
            .field("keys", &SortedIds::of(&self.order))
            .field("order", &self.order)
            .field("forgotten_early", &self.forgotten_early)
            .finish()
    }
}

#[derive(Serialize)]
struct EncodedRef<'a> {
    keys: &'a [u128],
    order: &'a Vector<(u64, u128)>,
    forgotten_early: u64,
}

#[derive(Deserialize)]
struct Encoded {
    keys: Vec<u128>,
    order: Vector<(u64, u128)>,
    forgotten_early: u64,
}

impl Serialize for KeyWindow {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        EncodedRef {
            keys: &SortedIds::of(&self.order).0,
            order: &self.order,
            forgotten_early: self.forgotten_early,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for KeyWindow {
    /// The encoded set becomes the index, so that [`KeyWindow::check`] (run on every
    /// installed snapshot) still finds a set and an order that disagree.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<KeyWindow, D::Error> {
        let Encoded {
            keys,
            order,
            forgotten_early,
        } = Encoded::deserialize(d)?;
        Ok(KeyWindow {
            keys: OnceLock::from(keys.into_iter().collect::<HashSet<u128>>()),
            order,
            forgotten_early,
        })
    }
}

impl KeyWindow {
    pub fn contains(&self, id: u128) -> bool {
        self.index().contains(&id)
    }

    /// The index of `order`'s ids, built on first use after a clone or a decode.
    fn index(&self) -> &HashSet<u128> {
        self.keys
            .get_or_init(|| self.order.iter().map(|&(_, id)| id).collect())
    }

    fn index_mut(&mut self) -> &mut HashSet<u128> {
        self.index();
        self.keys.get_mut().expect("the index was just built")
    }

    /// Forget the keys stored more than `window_ms` before `now_ms`.
    pub fn forget_expired(&mut self, now_ms: u64, window_ms: u64) {
        let cutoff = now_ms.saturating_sub(window_ms);
        while let Some(&(at, id)) = self.order.front() {
            if at >= cutoff {
                break;
            }
            self.order.pop_front();
            self.index_mut().remove(&id);
        }
    }

    /// Remember `id`, stored at `now_ms` (not below any time remembered before).
    pub fn remember(&mut self, now_ms: u64, id: u128) {
        if !self.index_mut().insert(id) {
            return;
        }
        if self.order.len() >= MAX_WINDOW_KEYS
            && let Some((_, oldest)) = self.order.pop_front()
        {
            self.index_mut().remove(&oldest);
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

    /// The window's own invariants: the ids in order are each there once, the index (when
    /// built) holds exactly them, and their times never decrease. Linear: it runs on every
    /// snapshot, on the cut's copy (whose index is not built).
    pub fn check(&self) -> Result<(), String> {
        let index = self.keys.get();
        let indexed = index.map_or(self.order.len(), HashSet::len);
        if indexed != self.order.len() || self.order.len() > MAX_WINDOW_KEYS {
            return Err(format!(
                "dedup window: {indexed} keys, {} in order (at most {MAX_WINDOW_KEYS})",
                self.order.len()
            ));
        }
        let mut ids = HashSet::with_capacity(self.order.len());
        let mut last_ms = 0;
        for &(at, id) in &self.order {
            if at < last_ms {
                return Err("dedup window: times out of order".into());
            }
            last_ms = at;
            ids.insert(id);
        }
        if ids.len() != self.order.len() || index.is_some_and(|k| *k != ids) {
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
        extra.index_mut().insert(3);
        assert!(extra.check().unwrap_err().contains("3 keys, 2 in order"));
    }

    #[test]
    fn a_clone_and_a_decoded_copy_find_the_same_keys() {
        let mut w = KeyWindow::default();
        for i in 0..100u128 {
            w.remember(i as u64, i * 7);
        }
        let clone = w.clone();
        assert!(
            clone.keys.get().is_none(),
            "a clone does not copy the index"
        );
        assert!(clone.contains(14) && !clone.contains(15));
        clone.check().unwrap();
        let decoded: KeyWindow = postcard::from_bytes(&postcard::to_allocvec(&w).unwrap()).unwrap();
        assert_eq!(decoded, w);
        assert!(decoded.contains(693) && !decoded.contains(700));
        decoded.check().unwrap();
        assert_eq!(format!("{decoded:?}"), format!("{w:?}"));
    }

    #[test]
    fn keys_differ_by_every_byte() {
        assert_ne!(key_id("a\0b\01"), key_id("a\0b\02"));
        assert_ne!(key_id("ab\0\01"), key_id("a\0b\01"));
        assert_eq!(key_id("x"), key_id("x"));
    }
}
