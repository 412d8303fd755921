//! The actor's loop. Each job is a sub-machine beside it (module docs of `leader`): the loop
//! waits for the earliest of their deadlines or for the next thing to happen (a message, an
//! applied entry, a wake, a topology change, an in-flight round or publish ending), turns
//! what happened into the machines' events and carries out the actions they answer.

use std::future::Future;
use std::pin::Pin;

use futures::StreamExt;
use qq_core::MessageId;
use tokio::sync::watch;
use tokio::time::Instant;

use super::QueueLeader;
use super::config_sync::{ConfigEvent, ConfigSync};
use super::consumers::{Reconcile, ReconcileAction, ReconcileEvent};
use super::drops::DropLog;
use super::expiry::Expiry;
use super::flight::InFlight;
use super::machine_upgrade::{Upgrade, UpgradeAction, UpgradeEvent};
use super::move_rounds::{MoveAction, MoveEvent, Moves};
use super::relay::{Relay, RelayEvent};
use super::sleep::{Sleep, SleepAction, SleepEvent};
use crate::clock::sleep_until;
use crate::deadletter::{PreparedRound, Round};
use crate::groups::queue_sm::{DeadLetterJob, LeaderEvent};
use crate::moves::MoveOutcome;
use crate::sleep_wake;

/// What the actor's loop carries from one turn to the next: the sub-machines, and the work
/// in flight they asked for.
struct Work {
    expiry: Expiry,
    relay: Relay,
    moves: Moves,
    config: ConfigSync,
    upgrade: Upgrade,
    reconcile: Reconcile,
    sleep: Sleep,
    drops: DropLog,
    flight: InFlight,
}

impl Work {
    /// The earliest of the machines' deadlines.
    fn next_deadline(&self) -> Option<Instant> {
        [
            self.expiry.next_deadline(),
            self.relay.next_deadline(),
            self.config.next_deadline(),
            self.moves.next_deadline(),
            self.reconcile.next_deadline(),
            self.sleep.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Work in flight: the group does not sleep meanwhile.
    fn busy(&self) -> bool {
        self.relay.busy() || self.moves.busy() || self.flight.publish.is_some()
    }
}

/// What the actor follows beside its inbox.
struct Streams {
    applied: watch::Receiver<u64>,
    topology: watch::Receiver<u64>,
    woken: watch::Receiver<u64>,
}

/// What happened while the loop waited.
enum Happened {
    Prepared(u64, Result<PreparedRound, Vec<MessageId>>),
    Committed(Round),
    Settled(Vec<MessageId>),
    Moved(Instant, MoveOutcome),
    Published(Result<(), String>),
    Inbox(LeaderEvent),
    Applied,
    Woken,
    Topology,
    /// The earliest deadline came.
    Deadline,
}

impl QueueLeader {
    pub(super) async fn run(mut self) {
        let mut streams = Streams {
            applied: self.machine.subscribe_applied(),
            topology: self.ctx.view.subscribe(),
            woken: self.residency.subscribe_woken(),
        };
        let now = self.ctx.clock.now();
        let mut w = Work {
            expiry: Expiry::default(),
            relay: Relay::new(self.ctx.dead_letter_retry),
            moves: Moves::default(),
            config: ConfigSync::default(),
            upgrade: Upgrade::default(),
            reconcile: Reconcile::new(now),
            sleep: Sleep::new(self.ctx.sleep_after, now),
            drops: DropLog::new(self.machine.dropped_dead_letters()),
            flight: InFlight::default(),
        };
        self.clean_up_old_consumers().await;
        self.config_event(&mut w.config, ConfigEvent::Changed).await;
        self.upgrade_event(&mut w, UpgradeEvent::Started).await;
        loop {
            if self.cancel.is_cancelled() || self.expire_due(&mut w.expiry).await {
                return; // stopped, or the queue expired and is being deleted
            }
            self.start_work(&mut w).await;
            let Some(happened) = self.wait(&mut w, &mut streams).await else {
                return; // stopped, or what the actor follows is gone
            };
            self.on_happened(&mut w, happened).await;
        }
    }

    /// Before waiting: the relay sends a prepared round and takes the next one, and a move
    /// round starts (if their machines say so).
    async fn start_work(&self, w: &mut Work) {
        let now = self.ctx.clock.now();
        let held = self.machine.with_state(|s| s.counts().held);
        let relay = w.relay.on_event(now, RelayEvent::Turn { held });
        self.relay_actions(&mut w.relay, &mut w.flight, now, relay);
        let task_running = self.move_task().is_some();
        let moves = w.moves.on_event(now, MoveEvent::Turn { task_running });
        self.move_actions(w, moves).await;
    }

    /// Wait for the earliest deadline or the next thing to happen. None: stop.
    async fn wait(&mut self, w: &mut Work, s: &mut Streams) -> Option<Happened> {
        let wake = w.next_deadline();
        let f = &mut w.flight;
        let publishing = f.publish.is_some();
        let happened = tokio::select! {
            _ = self.cancel.cancelled() => return None,
            (epoch, round) = poll_some(&mut f.preparing) => Happened::Prepared(epoch, round),
            round = poll_some(&mut f.committing) => Happened::Committed(round),
            Some(ids) = f.settling.next(), if !f.settling.is_empty() => Happened::Settled(ids),
            (started, outcome) = poll_some(&mut f.moving) => Happened::Moved(started, outcome),
            published = poll_some(&mut f.publish) => Happened::Published(published),
            event = self.inbox.recv(), if !publishing => Happened::Inbox(event?),
            r = s.applied.changed() => r.map(|_| Happened::Applied).ok()?,
            r = s.woken.changed() => r.map(|_| Happened::Woken).ok()?,
            r = s.topology.changed() => r.map(|_| Happened::Topology).ok()?,
            _ = sleep_until(wake) => Happened::Deadline,
        };
        Some(happened)
    }

    /// Turn what happened into the machines' events and carry out their actions.
    async fn on_happened(&self, w: &mut Work, happened: Happened) {
        let now = self.ctx.clock.now();
        match happened {
            Happened::Prepared(epoch, round) => {
                w.flight.preparing = None;
                let actions = w.relay.on_event(now, RelayEvent::Prepared { epoch, round });
                self.relay_actions(&mut w.relay, &mut w.flight, now, actions);
            }
            Happened::Committed(round) => {
                w.flight.committing = None;
                let actions = w.relay.on_event(now, RelayEvent::Committed(round));
                self.relay_actions(&mut w.relay, &mut w.flight, now, actions);
            }
            Happened::Settled(ids) => {
                let actions = w.relay.on_event(now, RelayEvent::Settled(ids));
                self.relay_actions(&mut w.relay, &mut w.flight, now, actions);
            }
            Happened::Moved(started, outcome) => {
                w.flight.moving = None;
                let rate = self.move_task().unwrap_or(0);
                let ended = MoveEvent::RoundEnded {
                    started,
                    outcome,
                    rate,
                };
                let actions = w.moves.on_event(now, ended);
                self.move_actions(w, actions).await;
            }
            Happened::Published(published) => self.on_published(w, published),
            Happened::Inbox(LeaderEvent::DeadLetter(job)) => self.republish(w, job),
            Happened::Inbox(LeaderEvent::ConfigChanged) => {
                self.config_event(&mut w.config, ConfigEvent::Changed).await;
            }
            Happened::Applied => {
                w.reconcile.on_event(now, ReconcileEvent::Applied);
                w.sleep.on_event(now, SleepEvent::Active);
                self.upgrade_event(w, UpgradeEvent::Applied).await;
            }
            Happened::Woken => {
                w.sleep.on_event(now, SleepEvent::Active);
                self.upgrade_event(w, UpgradeEvent::Started).await;
            }
            Happened::Topology => {
                let actions = w.relay.on_event(now, RelayEvent::TopologyChanged);
                self.relay_actions(&mut w.relay, &mut w.flight, now, actions);
            }
            Happened::Deadline => self.on_deadline(w, now).await,
        }
    }

    /// The earliest deadline came: each machine whose own is due acts. Expiry, the relay and
    /// moves act on every turn of the loop, so here only the timers of the others.
    async fn on_deadline(&self, w: &mut Work, now: Instant) {
        self.config_event(&mut w.config, ConfigEvent::Tick).await;
        for ReconcileAction::CleanUp in w.reconcile.on_event(now, ReconcileEvent::Tick) {
            // Dropped dead letters are counted and logged with the clean-up.
            w.drops
                .count_inbox_drops(self.machine.dropped_dead_letters());
            w.drops.log_if_due(self.group, self.ctx.clock.now());
            let more = self.clean_up_old_consumers().await || w.drops.pending > 0;
            let done = ReconcileEvent::Done { more };
            w.reconcile.on_event(self.ctx.clock.now(), done);
        }
        let busy = w.busy();
        for SleepAction::TrySleep in w.sleep.on_event(now, SleepEvent::Tick { busy }) {
            let slept = sleep_wake::try_sleep(
                self.group,
                &self.raft,
                &self.residency,
                &self.ctx.peers,
                self.ctx.me,
                self.ctx.clock,
            )
            .await;
            if !slept {
                w.sleep.on_event(self.ctx.clock.now(), SleepEvent::Stayed);
            }
        }
    }

    /// Carry out what the move machine asked for.
    async fn move_actions(&self, w: &mut Work, actions: Vec<MoveAction>) {
        for action in actions {
            match action {
                MoveAction::StartRound => w.flight.moving = Some(self.move_round()),
                MoveAction::EndMove { task, detail } => {
                    if !self.end_move(task, detail).await {
                        w.moves.on_event(self.ctx.clock.now(), MoveEvent::EndFailed);
                    }
                }
            }
        }
    }

    /// Feed the upgrade machine `event` and carry out its looks (and the config sync after an
    /// upgrade).
    async fn upgrade_event(&self, w: &mut Work, event: UpgradeEvent) {
        let mut actions = w.upgrade.on_event(self.ctx.clock.now(), event);
        while !actions.is_empty() {
            let action = actions.remove(0);
            match action {
                UpgradeAction::Look => {
                    let before = self.machine.with_state(|s| s.machine_version());
                    let pause = self.upgrade_machine().await;
                    let upgraded = self.machine.with_state(|s| s.machine_version()) > before;
                    let looked = UpgradeEvent::Looked { pause, upgraded };
                    actions.extend(w.upgrade.on_event(self.ctx.clock.now(), looked));
                }
                UpgradeAction::SyncConfig => {
                    self.config_event(&mut w.config, ConfigEvent::Changed).await;
                }
            }
        }
    }

    /// An at-most-once dead letter's republish ended; a failure is a drop, logged.
    fn on_published(&self, w: &mut Work, published: Result<(), String>) {
        w.flight.publish = None;
        if let Err(e) = published {
            w.drops.dropped(1, e);
            w.drops.log_if_due(self.group, self.ctx.clock.now());
        }
    }

    /// Republish an at-most-once dead letter the machine handed over.
    fn republish(&self, w: &mut Work, job: DeadLetterJob) {
        let dl = self.ctx.dead_letters.clone();
        w.flight.publish = Some(Box::pin(async move { dl.publish_at_most_once(job).await }));
    }
}

/// Resolves with the future's output when there is one in flight; pending forever otherwise.
async fn poll_some<T>(f: &mut Option<Pin<Box<dyn Future<Output = T> + Send>>>) -> T {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::leader::{CONSUMER_RECONCILE, PROPOSAL_RETRY};

    const SLEEP_AFTER: Duration = Duration::from_secs(60);

    fn work(now: Instant) -> Work {
        Work {
            expiry: Expiry::default(),
            relay: Relay::new(Duration::from_secs(2)),
            moves: Moves::default(),
            config: ConfigSync::default(),
            upgrade: Upgrade::default(),
            reconcile: Reconcile::new(now),
            sleep: Sleep::new(Some(SLEEP_AFTER), now),
            drops: DropLog::new(0),
            flight: InFlight::default(),
        }
    }

    #[test]
    fn the_loop_waits_for_the_earliest_deadline_of_its_machines() {
        let t0 = Instant::now();
        let mut w = work(t0);
        assert_eq!(w.next_deadline(), Some(t0 + CONSUMER_RECONCILE));
        w.config.on_event(t0, ConfigEvent::Failed);
        assert_eq!(w.next_deadline(), Some(t0 + PROPOSAL_RETRY));
        w.config.on_event(t0, ConfigEvent::Changed);
        let cleanup = t0 + CONSUMER_RECONCILE;
        w.reconcile.on_event(cleanup, ReconcileEvent::Tick);
        w.reconcile
            .on_event(cleanup, ReconcileEvent::Done { more: false });
        assert_eq!(
            w.next_deadline(),
            Some(t0 + SLEEP_AFTER),
            "only the sleep is left"
        );
    }

    #[test]
    fn a_round_in_flight_keeps_the_group_awake() {
        let t0 = Instant::now();
        let mut w = work(t0);
        assert!(!w.busy());
        w.moves.on_event(t0, MoveEvent::Turn { task_running: true });
        assert!(w.busy());
        let tick = SleepEvent::Tick { busy: w.busy() };
        assert_eq!(w.sleep.on_event(t0 + SLEEP_AFTER, tick), vec![]);
    }
}
