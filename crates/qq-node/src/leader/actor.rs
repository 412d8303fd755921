//! The actor's loop: one `tokio::select!` over what can happen to a led queue, each arm a
//! method. The sub-jobs it drives live beside it (`relay`, `expiry`, `move_rounds`,
//! `config_sync`, `consumers`); the loop only decides when each runs.

use std::future::Future;
use std::pin::Pin;

use futures::StreamExt;
use qq_core::MessageId;
use tokio::time::Instant;

use super::drops::DropLog;
use super::move_rounds::MoveRound;
use super::relay::Relay;
use super::{CONSUMER_RECONCILE, QueueLeader, Timers};
use crate::deadletter::{PreparedRound, Round};
use crate::groups::queue_sm::{DeadLetterJob, LeaderEvent};
use crate::sleep_wake;

type Publish = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// What the actor's loop carries from one turn to the next.
struct Work {
    timers: Timers,
    relay: Relay,
    /// The at-most-once dead letter being republished (one at a time).
    publish: Option<Publish>,
    moving: Option<MoveRound>,
    logged_no_route: bool,
    drops: DropLog,
    /// The clean-up runs CONSUMER_RECONCILE after something was applied, and again while it
    /// finds work; an idle queue runs no timer (it may sleep, see `groups::residency`).
    cleanup_at: Option<Instant>,
    /// When the group may sleep: `sleep_after` after the last applied entry or wake.
    sleep_at: Option<Instant>,
    /// Not before this does an applied entry make the leader look at its members' machine
    /// versions again (None: the queue runs this release's version).
    upgrade_at: Option<Instant>,
}

impl QueueLeader {
    pub(super) async fn run(mut self) {
        let mut applied = self.machine.subscribe_applied();
        let mut topology = self.ctx.view.subscribe();
        let mut woken = self.residency.subscribe_woken();
        let mut w = Work {
            cleanup_at: Some(self.ctx.clock.now() + CONSUMER_RECONCILE),
            sleep_at: self.sleep_deadline(),
            timers: Timers::default(),
            relay: Relay::default(),
            publish: None,
            moving: None,
            logged_no_route: false,
            drops: DropLog::new(self.machine.dropped_dead_letters()),
            upgrade_at: None,
        };

        self.clean_up_old_consumers().await;
        self.sync_config(&mut w.timers).await;
        self.look_at_machine(&mut w).await;
        loop {
            if self.cancel.is_cancelled() || self.expire_due(&mut w.timers).await {
                return; // stopped, or the queue expired and is being deleted
            }
            self.start_work(&mut w);
            let wake = self.next_wake(&w.timers);
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                (epoch, round) = poll_some(&mut w.relay.preparing) => {
                    self.on_prepared(&mut w, epoch, round);
                }
                round = poll_some(&mut w.relay.committing) => self.on_committed(&mut w, round),
                Some(settled) = w.relay.settling.running.next(), if !w.relay.settling.running.is_empty() => {
                    on_settled(&mut w, settled);
                }
                (started, outcome) = poll_some(&mut w.moving) => {
                    w.moving = None;
                    self.after_move(started, outcome, &mut w.timers).await;
                }
                published = poll_some(&mut w.publish) => self.on_published(&mut w, published),
                event = self.inbox.recv(), if w.publish.is_none() => match event {
                    Some(LeaderEvent::DeadLetter(job)) => self.republish(&mut w, job),
                    Some(LeaderEvent::ConfigChanged) => self.sync_config(&mut w.timers).await,
                    None => return,
                },
                r = applied.changed() => {
                    if r.is_err() { return }
                    w.cleanup_at.get_or_insert_with(|| self.ctx.clock.now() + CONSUMER_RECONCILE);
                    w.sleep_at = self.sleep_deadline();
                    if w.upgrade_at.is_some_and(|t| t <= self.ctx.clock.now()) {
                        self.look_at_machine(&mut w).await;
                    }
                }
                r = woken.changed() => {
                    if r.is_err() { return }
                    w.sleep_at = self.sleep_deadline();
                    self.look_at_machine(&mut w).await;
                }
                _ = sleep_until(w.sleep_at) => self.on_sleep_due(&mut w).await,
                r = topology.changed() => {
                    if r.is_err() { return }
                    // The topology may give held dead letters a route now.
                    w.timers.transfer_retry = None;
                }
                _ = sleep_until(w.cleanup_at) => self.on_cleanup_due(&mut w).await,
                _ = sleep_until(wake) => {
                    if w.timers.config_retry.is_some_and(|t| t <= self.ctx.clock.now()) {
                        self.sync_config(&mut w.timers).await;
                    }
                }
            }
        }
    }

    /// Before waiting: send a prepared round if none is committing, start preparing the next
    /// one, and start a move round.
    fn start_work(&self, w: &mut Work) {
        if w.relay.committing.is_none()
            && let Some(round) = w.relay.prepared.take()
        {
            let dl = self.ctx.dead_letters.clone();
            w.relay.committing = Some(Box::pin(async move { dl.commit_round(round).await }));
        }
        if w.relay.preparing.is_none() && w.relay.prepared.is_none() {
            w.relay.preparing =
                self.next_round(&mut w.timers, &mut w.logged_no_route, &mut w.relay);
        }
        if w.moving.is_none() {
            w.moving = self.next_move(&mut w.timers);
        }
    }

    /// A round's preparation ended; a failed one is retried after `dead_letter_retry`.
    fn on_prepared(&self, w: &mut Work, epoch: u64, round: Result<PreparedRound, Vec<MessageId>>) {
        w.relay.preparing = None;
        if !w.relay.preparation_ended(epoch, round) {
            w.timers.transfer_retry = Some(self.ctx.clock.now() + self.ctx.dead_letter_retry);
        }
    }

    /// The committing round ended.
    fn on_committed(&self, w: &mut Work, round: Round) {
        w.relay.committing = None;
        w.relay.round_ended(&round);
        self.after_round(
            round,
            &mut w.timers,
            &mut w.logged_no_route,
            &mut w.relay.settling,
        );
    }

    /// An at-most-once dead letter's republish ended; a failure is a drop, logged.
    fn on_published(&self, w: &mut Work, published: Result<(), String>) {
        w.publish = None;
        if let Err(e) = published {
            w.drops.dropped(1, e);
            w.drops.log_if_due(self.group, self.ctx.clock.now());
        }
    }

    /// Republish an at-most-once dead letter the machine handed over.
    fn republish(&self, w: &mut Work, job: DeadLetterJob) {
        let dl = self.ctx.dead_letters.clone();
        w.publish = Some(Box::pin(async move { dl.publish_at_most_once(job).await }));
    }

    /// Nothing applied for `sleep_after`: the group sleeps unless work is in flight (then
    /// it is asked again later).
    async fn on_sleep_due(&self, w: &mut Work) {
        w.sleep_at = None;
        let busy = w.relay.busy() || w.moving.is_some() || w.publish.is_some();
        let slept = !busy
            && sleep_wake::try_sleep(
                self.group,
                &self.raft,
                &self.residency,
                &self.ctx.peers,
                self.ctx.me,
                self.ctx.clock,
            )
            .await;
        if !slept {
            w.sleep_at = self.sleep_deadline();
        }
    }

    /// The consumer clean-up is due; dropped dead letters are counted and logged with it.
    async fn on_cleanup_due(&self, w: &mut Work) {
        w.drops
            .count_inbox_drops(self.machine.dropped_dead_letters());
        w.drops.log_if_due(self.group, self.ctx.clock.now());
        let more = self.clean_up_old_consumers().await || w.drops.pending > 0;
        w.cleanup_at = more.then(|| self.ctx.clock.now() + CONSUMER_RECONCILE);
    }

    /// Move the queue's machine on if every member runs a newer one; while it lags, an applied
    /// entry looks again after the pause it names (module `machine_upgrade`).
    /// A machine that moved on takes the settings only its new version has (the consumer
    /// timeout).
    async fn look_at_machine(&self, w: &mut Work) {
        let before = self.machine.with_state(|s| s.machine_version());
        w.upgrade_at = self
            .upgrade_machine()
            .await
            .map(|pause| self.ctx.clock.now() + pause);
        if self.machine.with_state(|s| s.machine_version()) > before {
            self.sync_config(&mut w.timers).await;
        }
    }

    /// `sleep_after` from now; None: the group never sleeps.
    fn sleep_deadline(&self) -> Option<Instant> {
        self.ctx.sleep_after.map(|d| self.ctx.clock.now() + d)
    }

    /// The earliest of the actor's deadlines.
    fn next_wake(&self, timers: &Timers) -> Option<Instant> {
        let expiry = match timers.expire_retry {
            Some(t) => Some(t),
            None => self.expiry_deadlines().wake(self.ctx.clock),
        };
        [
            expiry,
            timers.transfer_retry,
            timers.config_retry,
            timers.move_next,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// Resolves with the future's output when there is one in flight; pending forever otherwise.
async fn poll_some<T>(f: &mut Option<Pin<Box<dyn Future<Output = T> + Send>>>) -> T {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Settles of transferred dead letters ended: they may be taken again (if still held).
fn on_settled(w: &mut Work, settled: Vec<MessageId>) {
    for id in settled {
        w.relay.settling.ids.remove(&id);
    }
}
