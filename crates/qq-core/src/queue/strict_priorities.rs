//! Strict message priorities, as RabbitMQ 4.3's quorum queues have them under `x-max-priority`:
//! a queue declared with `x-max-priority = N` (1 to [`MAX_PRIORITY`]) keeps one FIFO level per
//! priority 0..=N, and always hands out the oldest message of the highest level that holds one.
//! A message's level is its `priority` property, capped at N; a message without one is level 0.
//! Returned messages still come first, in return order (the returns queue is served before the
//! levels, as RabbitMQ 4.3's).
//!
//! The queue's top level is fixed for its lifetime (an argument, not a policy): the node sets
//! it when it builds the replica's machine ([`QueueState::set_max_priority`]), from the same
//! metadata on every replica, so it is not in the log. A queue without it uses the two levels
//! of module `priorities`, and a queue with it never does: its fresh messages all sit on
//! `levels`. The levels are left out of the state's own encoding (a snapshot carries them
//! beside it: [`QueueState::strict_levels`]).

use imbl::{OrdMap, OrdSet};

use super::QueueState;
use crate::types::MessageId;

/// The highest `x-max-priority` a queue may have: 32 levels, 0 to 31, as RabbitMQ 4.3.
pub const MAX_PRIORITY: u8 = 31;

impl QueueState {
    /// Gives the queue strict levels 0..=`max` (capped at [`MAX_PRIORITY`]), or none. Set by
    /// the node when it builds the machine, before any command applies.
    pub fn set_max_priority(&mut self, max: Option<u8>) {
        self.max_priority = max.map(|m| m.min(MAX_PRIORITY));
    }

    /// The queue's top strict level, if it has strict levels.
    pub fn max_priority(&self) -> Option<u8> {
        self.max_priority
    }

    /// Puts a new ready message on the level of its `priority`; false (nothing done) if the
    /// queue has no strict levels.
    pub(super) fn add_strict(&mut self, id: MessageId, priority: u8) -> bool {
        let Some(max) = self.max_priority else {
            return false;
        };
        let level = priority.min(max);
        let mut set = self.levels.get(&level).cloned().unwrap_or_default();
        set.insert(id);
        self.levels.insert(level, set);
        true
    }

    /// Takes `id` off its level; false if no level holds it.
    pub(super) fn remove_strict(&mut self, id: MessageId) -> bool {
        let Some(level) = self
            .levels
            .iter()
            .find(|(_, set)| set.contains(&id))
            .map(|(l, _)| *l)
        else {
            return false;
        };
        let mut set = self.levels[&level].clone();
        set.remove(&id);
        if set.is_empty() {
            self.levels.remove(&level);
        } else {
            self.levels.insert(level, set);
        }
        true
    }

    /// The oldest message of the highest level that holds one.
    pub(super) fn strict_head(&self) -> Option<MessageId> {
        self.levels
            .get_max()
            .and_then(|(_, set)| set.get_min().copied())
    }

    /// Every message on the levels in the order it would be taken.
    pub(super) fn strict_in_order(&self) -> impl Iterator<Item = MessageId> + '_ {
        self.levels
            .iter()
            .rev()
            .flat_map(|(_, set)| set.iter().copied())
    }

    pub(super) fn strict_len(&self) -> usize {
        self.levels.values().map(OrdSet::len).sum()
    }

    /// The oldest message of any level.
    pub(super) fn strict_oldest(&self) -> Option<MessageId> {
        self.levels
            .values()
            .filter_map(|s| s.get_min().copied())
            .min()
    }

    pub(super) fn in_strict_level(&self, id: MessageId) -> bool {
        self.levels.values().any(|s| s.contains(&id))
    }

    /// The ready messages per strict level (level, count), highest first.
    pub fn strict_level_counts(&self) -> Vec<(u8, u64)> {
        self.levels
            .iter()
            .rev()
            .map(|(l, s)| (*l, s.len() as u64))
            .collect()
    }

    /// Each message on a level with its level, for a snapshot.
    pub fn strict_levels(&self) -> Vec<(MessageId, u8)> {
        self.levels
            .iter()
            .flat_map(|(l, s)| s.iter().map(move |id| (*id, *l)))
            .collect()
    }

    /// Puts back what [`QueueState::strict_levels`] gave (after [`QueueState::set_max_priority`]).
    /// Entries for ids that are not fresh ready messages, or that another level holds, are
    /// dropped; levels above the top are capped.
    pub fn restore_strict_levels(&mut self, entries: impl IntoIterator<Item = (MessageId, u8)>) {
        self.levels = OrdMap::new();
        for (id, level) in entries {
            let fresh_ready = self
                .msgs
                .get(&id)
                .is_some_and(|m| m.place == super::Place::Ready { returned: None });
            if fresh_ready
                && !self.fresh.contains(&id)
                && !self.high.contains(&id)
                && !self.in_strict_level(id)
            {
                self.add_strict(id, level);
            }
        }
    }

    /// The invariant: no empty level, none above the top, none without a top, and no message on
    /// a level and on the two-level scheme's sets at once.
    pub(super) fn check_strict_levels(&self) -> Result<(), String> {
        for (level, set) in &self.levels {
            if set.is_empty() {
                return Err(format!("strict level {level} is empty but kept"));
            }
            if self.max_priority.is_none_or(|max| *level > max) {
                return Err(format!(
                    "strict level {level} above the top {:?}",
                    self.max_priority
                ));
            }
            if let Some(id) = set
                .iter()
                .find(|id| self.fresh.contains(*id) || self.high.contains(*id))
            {
                return Err(format!(
                    "message {id} is on strict level {level} and another"
                ));
            }
        }
        Ok(())
    }
}
