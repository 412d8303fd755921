//! Consumers in the queue's state that no session of this node serves: `ConsumerDown`, on the
//! [`Reconcile`] sub-machine's timer.

use tokio::time::Instant;

use super::{CONSUMER_RECONCILE, QueueLeader};

/// The consumer clean-up sub-machine: a clean-up [`CONSUMER_RECONCILE`] after the actor
/// started or something was applied, and again while one finds work; an idle queue runs no
/// timer (it may sleep). Its deadline is the next clean-up.
#[derive(Debug)]
pub(super) struct Reconcile {
    at: Option<Instant>,
}

/// What the clean-up machine hears.
#[derive(Debug, Clone, Copy)]
pub(super) enum ReconcileEvent {
    /// Entries were applied.
    Applied,
    /// The actor's timer fired.
    Tick,
    /// The clean-up it asked for ran; `more`: it found work (look again).
    Done { more: bool },
}

/// What the clean-up machine asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ReconcileAction {
    /// Clean up consumers no session here serves (and log dropped dead letters).
    CleanUp,
}

impl Reconcile {
    /// The machine of an actor started at `now`.
    pub(super) fn new(now: Instant) -> Reconcile {
        Reconcile {
            at: Some(now + CONSUMER_RECONCILE),
        }
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.at
    }

    pub(super) fn on_event(&mut self, now: Instant, event: ReconcileEvent) -> Vec<ReconcileAction> {
        match event {
            ReconcileEvent::Applied => {
                self.at.get_or_insert(now + CONSUMER_RECONCILE);
            }
            ReconcileEvent::Tick if self.at.is_some_and(|t| t <= now) => {
                self.at = None;
                return vec![ReconcileAction::CleanUp];
            }
            ReconcileEvent::Tick => {}
            ReconcileEvent::Done { more } => {
                self.at = more.then(|| now + CONSUMER_RECONCILE);
            }
        }
        vec![]
    }
}

impl QueueLeader {
    /// The leader serves every consumer stream of its queue (followers relay to it), and a
    /// session registers locally before its `Checkout` is proposed: a consumer in the state
    /// that no local session serves belongs to a stream that ended (with an old leader, or
    /// whose clean-up failed), so its unacked messages go back to the queue. `ConsumerDown` of
    /// a consumer already gone is a no-op, so racing a session's own clean-up is harmless.
    /// Returns whether there was any such consumer (then look again later: the proposal may
    /// have failed during an election).
    pub(super) async fn clean_up_old_consumers(&self) -> bool {
        let local = self.machine.local_consumers();
        let stale: Vec<u64> = self.machine.with_state(|s| {
            s.consumers()
                .into_iter()
                .map(|c| c.0)
                .filter(|c| !local.contains(c))
                .collect()
        });
        let found = !stale.is_empty();
        for consumer in stale {
            self.ctx.proposer.consumer_down(self.group, consumer).await;
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_clean_up_runs_after_activity_and_again_only_while_it_finds_work() {
        let t0 = Instant::now();
        let mut reconcile = Reconcile::new(t0);
        let first = t0 + CONSUMER_RECONCILE;
        assert_eq!(reconcile.next_deadline(), Some(first));
        // Activity does not push a pending clean-up back.
        reconcile.on_event(t0 + Duration::from_secs(1), ReconcileEvent::Applied);
        assert_eq!(reconcile.next_deadline(), Some(first));
        let early = first - Duration::from_millis(1);
        assert_eq!(reconcile.on_event(early, ReconcileEvent::Tick), vec![]);
        let actions = reconcile.on_event(first, ReconcileEvent::Tick);
        assert_eq!(actions, vec![ReconcileAction::CleanUp]);
        reconcile.on_event(first, ReconcileEvent::Done { more: true });
        assert_eq!(reconcile.next_deadline(), Some(first + CONSUMER_RECONCILE));
        let second = first + CONSUMER_RECONCILE;
        reconcile.on_event(second, ReconcileEvent::Tick);
        reconcile.on_event(second, ReconcileEvent::Done { more: false });
        assert_eq!(
            reconcile.next_deadline(),
            None,
            "an idle queue keeps no timer"
        );
        let later = second + Duration::from_secs(60);
        reconcile.on_event(later, ReconcileEvent::Applied);
        assert_eq!(reconcile.next_deadline(), Some(later + CONSUMER_RECONCILE));
    }
}
