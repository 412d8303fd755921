//! The state's full consistency check: every index agrees with the messages, for tests and
//! whenever a snapshot is written or installed.

use std::collections::{BTreeMap, BTreeSet};

use super::{GET_CONSUMER, Place, QueueState};
use crate::types::{ConsumerId, MessageId};

impl QueueState {
    /// Full consistency check of the internal indexes (for tests, and on every snapshot written
    /// or installed: keep it about linear in the messages).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut ready = 0u64;
        let mut ready_bytes = 0u64;
        let mut held_bytes = 0u64;
        let mut expiries = BTreeSet::new();
        let mut leases = BTreeSet::new();
        let mut unacked: BTreeMap<ConsumerId, BTreeSet<MessageId>> = BTreeMap::new();
        let mut held = BTreeMap::new();
        let mut returns = BTreeMap::new();
        let mut delayed = BTreeMap::new();
        let mut delayed_bytes = 0u64;
        // `fresh` is in id order as `msgs` is: walked beside it rather than looked up per
        // message, as this runs on every snapshot (module `snapshot` of qq-node).
        let mut fresh = self.fresh.iter().peekable();
        for (id, m) in &self.msgs {
            if *id > self.last_index {
                return Err(format!(
                    "message {id} is after last index {}",
                    self.last_index
                ));
            }
            match m.place {
                Place::Ready { returned } => {
                    ready += 1;
                    ready_bytes += m.header.size_bytes;
                    if let Some(d) = m.deadline_ms {
                        expiries.insert((d, *id));
                    }
                    match returned {
                        Some(r) => {
                            returns.insert(r, *id);
                        }
                        None => {
                            while fresh.next_if(|f| *f < id).is_some() {}
                            if fresh.next_if_eq(&id).is_none()
                                && !self.high.contains(id)
                                && !self.in_strict_level(*id)
                            {
                                return Err(format!("ready message {id} not in fresh"));
                            }
                        }
                    }
                }
                Place::Unacked {
                    consumer,
                    lease_deadline_ms,
                    ..
                } => {
                    if !m.delivered {
                        return Err(format!("unacked message {id} never delivered"));
                    }
                    unacked.entry(consumer).or_default().insert(*id);
                    match (consumer == GET_CONSUMER, lease_deadline_ms) {
                        (true, Some(d)) => {
                            leases.insert((d, *id));
                        }
                        (false, None) => {}
                        _ => return Err(format!("message {id}: lease does not match holder")),
                    }
                }
                Place::Held { seq, .. } => {
                    held_bytes += m.header.size_bytes;
                    held.insert(seq, *id);
                }
                Place::Delayed { due_ms, seq } => {
                    delayed_bytes += m.header.size_bytes;
                    delayed.insert((due_ms, seq), *id);
                    if let Some(d) = m.deadline_ms {
                        expiries.insert((d, *id));
                    }
                }
            }
        }
        if !delayed.iter().eq(self.delayed.iter()) || delayed_bytes != self.delayed_bytes {
            return Err("delayed index disagrees with messages".into());
        }
        if !self
            .returned_ids
            .iter()
            .eq(returns.values().copied().collect::<BTreeSet<_>>().iter())
        {
            return Err("returned ids disagree with the returns queue".into());
        }
        if ready != self.ready_len() || ready_bytes != self.ready_bytes {
            return Err(format!(
                "ready {ready}/{ready_bytes}B but indexes say {}/{}B",
                self.ready_len(),
                self.ready_bytes
            ));
        }
        if !returns.iter().eq(self.returns.iter()) {
            return Err("returns index disagrees with messages".into());
        }
        if !expiries.iter().eq(self.expiries.iter()) {
            return Err("expiry index disagrees with ready and delayed messages".into());
        }
        if !leases.iter().eq(self.leases.iter()) {
            return Err("lease index disagrees with messages".into());
        }
        if !held.iter().eq(self.held.iter()) || held_bytes != self.held_bytes {
            return Err("held index disagrees with messages".into());
        }
        let gets = unacked.remove(&GET_CONSUMER).unwrap_or_default();
        if gets.len() != self.leases.len() {
            return Err("get leases disagree".into());
        }
        if let Some(id) = self.receipts.keys().find(|id| !gets.contains(id)) {
            return Err(format!("receipt of message {id} without a Get lease"));
        }
        for (cid, c) in &self.consumers {
            let mine = unacked.remove(cid).unwrap_or_default();
            if !mine.iter().eq(c.checked_out.iter()) {
                return Err(format!("consumer {cid} checked-out set disagrees"));
            }
        }
        if let Some((cid, _)) = unacked.first_key_value() {
            return Err(format!("messages held by unknown consumer {cid}"));
        }
        // (A running move task holds the ready messages.)
        if self.ready_len() > 0 && self.next_consumer().is_some() && self.running_move().is_none() {
            return Err("a consumer has credit while messages are ready".into());
        }
        self.check_cancelled()?;
        self.check_machine_version()?;
        self.check_strict_levels()?;
        self.check_priorities()?;
        self.check_timeouts()?;
        self.check_releases()?;
        self.check_message_priorities()?;
        self.publish_keys.check()?;
        self.transfer_keys.check()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Command, MsgHeader};
    use super::*;
    use crate::QueueConfig;

    /// The walk beside `fresh` finds a ready message missing from it, first, last or between.
    #[test]
    fn a_ready_message_missing_from_fresh_is_found() {
        let mut s = QueueState::new(QueueConfig::new("/", "q"));
        for index in 1..=3 {
            let cmd = Command::Enqueue {
                now_ms: 1_000,
                header: MsgHeader {
                    size_bytes: 1,
                    expiration_ms: None,
                },
                publish_key: None,
                dedup_key: None,
            };
            s.apply(index, cmd);
        }
        s.check_invariants().unwrap();
        for id in s.message_ids() {
            let mut broken = s.clone();
            broken.fresh.remove(&id);
            assert_eq!(
                broken.check_invariants().unwrap_err(),
                format!("ready message {id} not in fresh")
            );
        }
    }
}
