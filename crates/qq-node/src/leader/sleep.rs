//! When the leader asks its group to sleep ([`crate::sleep_wake::try_sleep`], which steps the
//! residency machine, `groups::residency`): the [`Sleep`] sub-machine's idle timer.

use std::time::Duration;

use tokio::time::Instant;

/// The idle sub-machine: the group may sleep `after` the last applied entry or wake, unless
/// work is in flight then (a relay round or settle, a move round, a republish): then it asks
/// again `after` later. A group that slept keeps no timer until it wakes. Its deadline is
/// when the group may sleep.
#[derive(Debug)]
pub(super) struct Sleep {
    /// None: the group never sleeps.
    after: Option<Duration>,
    at: Option<Instant>,
}

/// What the idle machine hears.
#[derive(Debug, Clone, Copy)]
pub(super) enum SleepEvent {
    /// Entries were applied, or the group woke: it is not idle.
    Active,
    /// The actor's timer fired; `busy`: the actor has work in flight.
    Tick { busy: bool },
    /// The sleep it asked for did not happen (a write, a follower that did not agree...).
    Stayed,
}

/// What the idle machine asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SleepAction {
    /// Put the group to sleep.
    TrySleep,
}

impl Sleep {
    /// The machine of an actor started at `now`.
    pub(super) fn new(after: Option<Duration>, now: Instant) -> Sleep {
        let mut sleep = Sleep { after, at: None };
        sleep.arm(now);
        sleep
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.at
    }

    pub(super) fn on_event(&mut self, now: Instant, event: SleepEvent) -> Vec<SleepAction> {
        match event {
            SleepEvent::Active | SleepEvent::Stayed => self.arm(now),
            SleepEvent::Tick { busy } if self.at.is_some_and(|t| t <= now) => {
                if !busy {
                    self.at = None;
                    return vec![SleepAction::TrySleep];
                }
                self.arm(now);
            }
            SleepEvent::Tick { .. } => {}
        }
        vec![]
    }

    fn arm(&mut self, now: Instant) {
        self.at = self.after.map(|d| now + d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(10);

    #[test]
    fn an_idle_group_sleeps_after_its_last_activity() {
        let t0 = Instant::now();
        let mut sleep = Sleep::new(Some(AFTER), t0);
        let t1 = t0 + Duration::from_secs(4);
        sleep.on_event(t1, SleepEvent::Active);
        assert_eq!(
            sleep.next_deadline(),
            Some(t1 + AFTER),
            "activity pushes it back"
        );
        let quiet = SleepEvent::Tick { busy: false };
        assert_eq!(
            sleep.on_event(t0 + AFTER, quiet),
            vec![],
            "not idle long enough"
        );
        assert_eq!(
            sleep.on_event(t1 + AFTER, quiet),
            vec![SleepAction::TrySleep]
        );
        assert_eq!(
            sleep.next_deadline(),
            None,
            "a sleeping group keeps no timer"
        );
        let woke = t1 + 3 * AFTER;
        sleep.on_event(woke, SleepEvent::Active);
        assert_eq!(sleep.next_deadline(), Some(woke + AFTER));
    }

    #[test]
    fn sleep_is_not_chosen_while_work_is_in_flight() {
        let t0 = Instant::now();
        let mut sleep = Sleep::new(Some(AFTER), t0);
        let due = t0 + AFTER;
        assert_eq!(sleep.on_event(due, SleepEvent::Tick { busy: true }), vec![]);
        assert_eq!(
            sleep.next_deadline(),
            Some(due + AFTER),
            "asked again later"
        );
        let again = due + AFTER;
        let actions = sleep.on_event(again, SleepEvent::Tick { busy: false });
        assert_eq!(actions, vec![SleepAction::TrySleep]);
    }

    #[test]
    fn a_sleep_that_did_not_happen_is_tried_again_later() {
        let t0 = Instant::now();
        let mut sleep = Sleep::new(Some(AFTER), t0);
        sleep.on_event(t0 + AFTER, SleepEvent::Tick { busy: false });
        let refused = t0 + AFTER + Duration::from_millis(30);
        sleep.on_event(refused, SleepEvent::Stayed);
        assert_eq!(sleep.next_deadline(), Some(refused + AFTER));
    }

    #[test]
    fn a_group_without_sleep_after_never_sleeps() {
        let t0 = Instant::now();
        let mut sleep = Sleep::new(None, t0);
        assert_eq!(sleep.next_deadline(), None);
        sleep.on_event(t0, SleepEvent::Active);
        let far = t0 + Duration::from_secs(3_600);
        assert_eq!(
            sleep.on_event(far, SleepEvent::Tick { busy: false }),
            vec![]
        );
    }
}
