//! The queue leader actor: one task per queue this node leads, owning all leader-only work.
//!
//! [`watch_leadership`] runs for as long as a queue group runs on this node. When the node
//! becomes the group's leader it attaches an inbox to the state machine and starts a
//! [`QueueLeader`]; when leadership ends (or the group stops) it cancels the actor's token,
//! detaches the inbox and ends the consumer sessions served here.
//!
//! The actor is driven by what the state machine hands it (at-most-once dead letters, "the
//! metadata changed the queue's configuration") and by the applied-entry notifications of its
//! queue, and keeps its own timers, armed from the state's deadlines:
//! - message TTLs, Get leases and delayed requeues: propose `Expire { now_ms }` when the
//!   earliest is due (one timer, re-armed from `QueueState::next_deadline` after every
//!   applied entry, so a new leader picks up the replicated delayed set without a scan);
//! - x-expires: propose `ExpireQueue { now_ms, leader_since_ms }` when the queue would be
//!   unused for its expiry; the state machine decides, and if it answers expired the actor
//!   deletes the queue through the metadata (its messages are not dead-lettered);
//! - at-least-once dead letters: transfer held ones in rounds ([`crate::deadletter`]), one
//!   round committing at a time (per-target order) while the next one is prepared (see
//!   [`Relay`]), each round's settle overlapping the next rounds (at most
//!   [`SETTLES_IN_FLIGHT`]; dead letters in a round or being settled are not taken again);
//!   after a failed round, retry on a metadata change or after `dead_letter_retry_ms`;
//! - consumers that no session here serves (their stream ended on an earlier leader, or their
//!   clean-up failed): `ConsumerDown` at election and every [`CONSUMER_RECONCILE`];
//! - the queue's configuration in its own log follows the metadata (`UpdateConfig`);
//! - a running move task (redrive): rounds of [`crate::moves`], one at a time, the next one
//!   after `moved / max_per_second` seconds; a failed round is retried after a pause, a task
//!   that cannot go on is ended as Failed (`EndMove`). A new leader picks the replicated task
//!   up from the state, so a move survives a leader change.
//!
//! Time enters the queue's log only through commands stamped here (and by the API).
//!
//! Must not: carry out deliveries (the state machine does, to registered sessions) or touch
//! another queue's state.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use qq_core::meta::MetaCommand;
use qq_core::queue::{Command, Reply};
use qq_core::{MessageId, NodeId};
use qq_raft::GroupId;
use qq_raft::network::Peers;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, debug, info, warn};

use crate::clock::now_ms;
use crate::deadletter::{
    DeadLetters, PreparedRound, Round, TRANSFER_BATCH, TRANSFER_BATCH_BYTES, TransferError,
};
use crate::groups::queue_sm::{LEADER_EVENTS_BOUND, LeaderEvent, QueueMachine, QueueRequest};
use crate::groups::quiet::Quiet;
use crate::groups::registry::QueueRaft;
use crate::meta_view::MetaView;
use crate::moves::{MoveOutcome, Mover};
use crate::proposer::Proposer;
use crate::quiesce;

/// How often a leader looks for consumers in the queue state that no session of its own serves.
/// Becoming leader is not enough: a `Checkout` proposed just before a leader change can commit
/// and apply after the new leader's first clean-up (its session already gone), and its
/// `ConsumerDown` can fail during the election; such a consumer would hold its unacked
/// messages forever (found by qq-chaos: 20 messages, one prefetch, stuck in a queue).
pub const CONSUMER_RECONCILE: Duration = Duration::from_secs(3);

/// Retry of a failed proposal the actor owes (UpdateConfig, Expire, ExpireQueue).
const PROPOSAL_RETRY: Duration = Duration::from_millis(500);

/// What every leader actor of this node shares.
#[derive(Clone)]
pub struct LeaderContext {
    pub proposer: Proposer,
    pub view: MetaView,
    pub dead_letters: DeadLetters,
    pub dead_letter_retry: Duration,
    pub mover: Mover,
    pub tasks: TaskTracker,
    /// For the sleep of idle groups ([`crate::groups::quiet`]).
    pub peers: Peers,
    pub me: NodeId,
    /// A group with nothing applied for this long sleeps; None: never.
    pub quiesce_after: Option<Duration>,
}

/// Follow the group's leadership until `stop` is cancelled; run a [`QueueLeader`] while this
/// node leads. `reloaded`: the replica's Raft instance was loaded again after an unload, so a
/// leadership it finds at once is the one it had, not a leader change (not logged or counted).
#[allow(clippy::too_many_arguments)]
pub async fn watch_leadership(
    ctx: LeaderContext,
    group: GroupId,
    raft: QueueRaft,
    machine: Arc<QueueMachine>,
    quiet: Arc<Quiet>,
    stop: CancellationToken,
    reloaded: bool,
    span: Span,
) {
    let mut first = true;
    let mut metrics = raft.metrics();
    let mut actor: Option<(CancellationToken, u64)> = None;
    // The voters last seen; a change is logged by the leader only, so once per cluster.
    let mut voters: Option<Vec<u64>> = None;
    loop {
        let (leading, term, me, now_voters) = {
            let m = metrics.borrow_watched();
            let v: Vec<u64> = m.membership_config.voter_ids().collect();
            (m.state == ServerState::Leader, m.current_term, m.id, v)
        };
        // The first membership of a new group (from none) is its creation, not a change.
        if leading
            && voters
                .as_ref()
                .is_some_and(|v| !v.is_empty() && *v != now_voters)
        {
            info!(group, voters = ?now_voters, term, "membership changed");
        }
        voters = Some(now_voters);
        match (&actor, leading) {
            (None, true) => {
                // One line per leader change of the group, from the new leader.
                if !(reloaded && first) {
                    let (vhost, queue) = ctx
                        .view
                        .current()
                        .queue_by_id(group)
                        .map(|q| (q.vhost.clone(), q.name.clone()))
                        .unwrap_or_default();
                    info!(group, vhost = %vhost, queue = %queue, leader = me, term, "leader changed");
                    crate::metrics::became_leader(crate::metrics::QUEUE);
                }
                let token = stop.child_token();
                let (attachment, inbox) = machine.attach_leader();
                let leader = QueueLeader {
                    ctx: ctx.clone(),
                    group,
                    inbox,
                    machine: machine.clone(),
                    raft: raft.clone(),
                    quiet: quiet.clone(),
                    leader_since_ms: now_ms(),
                    cancel: token.clone(),
                };
                ctx.tasks.spawn(leader.run().instrument(span.clone()));
                actor = Some((token, attachment));
            }
            (Some((token, attachment)), false) => {
                info!("not the leader any more");
                token.cancel();
                machine.detach_leader(*attachment);
                actor = None;
                machine.cancel_consumers("queue leader changed; subscribe again", true);
            }
            _ => {}
        }
        first = false;
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { break },
            _ = stop.cancelled() => break,
        }
    }
    if let Some((token, attachment)) = actor {
        token.cancel();
        machine.detach_leader(attachment);
    }
}

type Commit = Pin<Box<dyn Future<Output = Round> + Send>>;
/// A preparation's epoch and its round (Err: the preparation failed; its dead letters).
type Prepare = Pin<Box<dyn Future<Output = (u64, Result<PreparedRound, Vec<MessageId>>)> + Send>>;
type Settle = Pin<Box<dyn Future<Output = Vec<MessageId>> + Send>>;

/// Settles of transferred dead letters in flight at once; at the bound no new round starts.
pub const SETTLES_IN_FLIGHT: usize = 4;

/// Dead letters every target committed whose `DeadLetterSettle` is in flight: not taken into
/// a new round meanwhile.
#[derive(Default)]
struct Settling {
    ids: HashSet<MessageId>,
    running: FuturesUnordered<Settle>,
}

/// The at-least-once relay of the queue's held dead letters, a pipeline of rounds: one round
/// commits at a time, so every target gets the rounds in death order; the next round is
/// prepared meanwhile (bodies read and copies made on a blocking thread) and is sent as soon
/// as the committing one succeeded. A round that failed, even in part, discards the round
/// prepared after it (sent, it would overtake the failed dead letters), so the retry starts
/// again from the oldest held one. A round takes its dead letters out of reach of the next
/// ones until it ends.
#[derive(Default)]
struct Relay {
    /// Dead letters in a round being prepared, prepared or committing.
    in_rounds: HashSet<MessageId>,
    /// Bumped by every failed round: a preparation started before it is discarded.
    epoch: u64,
    preparing: Option<Prepare>,
    prepared: Option<PreparedRound>,
    committing: Option<Commit>,
    settling: Settling,
}

impl Relay {
    fn busy(&self) -> bool {
        self.preparing.is_some()
            || self.prepared.is_some()
            || self.committing.is_some()
            || !self.settling.running.is_empty()
    }

    /// Dead letters held but in no round and not being settled: none means no round to take.
    fn untaken(&self, held: u64) -> u64 {
        held.saturating_sub((self.in_rounds.len() + self.settling.ids.len()) as u64)
    }

    fn release(&mut self, ids: &[MessageId]) {
        for id in ids {
            self.in_rounds.remove(id);
        }
    }

    /// A preparation ended: keep its round for sending, unless a round failed since it began.
    /// False: the preparation itself failed.
    fn preparation_ended(
        &mut self,
        epoch: u64,
        round: Result<PreparedRound, Vec<MessageId>>,
    ) -> bool {
        match round {
            Ok(round) if epoch == self.epoch => self.prepared = Some(round),
            Ok(round) => self.release(&round.ids),
            Err(ids) => {
                self.release(&ids);
                return false;
            }
        }
        true
    }

    /// A round ended: its dead letters leave it (those every target committed go on to be
    /// settled, by [`QueueLeader::after_round`]); a failure discards the prepared round (a
    /// preparation still running is discarded when it ends).
    fn round_ended(&mut self, round: &Round) {
        self.release(&round.ids);
        if round.failure.is_some() {
            self.epoch += 1;
            if let Some(next) = self.prepared.take() {
                self.release(&next.ids);
            }
        }
    }
}

type Publish = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
type MoveRound = Pin<Box<dyn Future<Output = (Instant, MoveOutcome)> + Send>>;

/// The leader-only work of one queue while this node leads it.
pub struct QueueLeader {
    ctx: LeaderContext,
    group: GroupId,
    machine: Arc<QueueMachine>,
    raft: QueueRaft,
    quiet: Arc<Quiet>,
    inbox: mpsc::Receiver<LeaderEvent>,
    /// A queue never used since this node became leader counts as used from then (x-expires).
    leader_since_ms: u64,
    cancel: CancellationToken,
}

/// Lines about dropped dead letters: at most one per [`DROP_LOG_EVERY`] per queue.
const DROP_LOG_EVERY: Duration = Duration::from_secs(1);

/// At-most-once dead letters dropped (their republish failed, or the actor's inbox was full),
/// logged rate-limited: a line says how many were dropped since the previous one.
struct DropLog {
    /// Not yet logged.
    pending: u64,
    /// The latest reason a republish gave.
    latest: Option<String>,
    last_line: Option<Instant>,
    /// The machine's inbox-drop count already taken into `pending`.
    inbox_seen: u64,
}

impl DropLog {
    fn new(inbox_seen: u64) -> DropLog {
        DropLog {
            pending: 0,
            latest: None,
            last_line: None,
            inbox_seen,
        }
    }

    fn dropped(&mut self, n: u64, why: String) {
        self.pending += n;
        self.latest = Some(why);
    }

    fn count_inbox_drops(&mut self, total: u64) {
        let new = total.saturating_sub(self.inbox_seen);
        self.inbox_seen = total;
        if new > 0 {
            self.dropped(
                new,
                format!("the leader's queue of dead letters was full ({LEADER_EVENTS_BOUND})"),
            );
        }
    }

    fn log_if_due(&mut self, group: GroupId) {
        if let Some((dropped, latest)) = self.take_due(Instant::now()) {
            warn!(
                group,
                dropped,
                "at-most-once dead letters dropped: {dropped} since the last such line (latest: {latest})"
            );
        }
    }

    /// The count and latest reason to log at `now`, if a line is due: something was dropped
    /// and the previous line is at least [`DROP_LOG_EVERY`] old.
    fn take_due(&mut self, now: Instant) -> Option<(u64, String)> {
        if self.pending == 0
            || self
                .last_line
                .is_some_and(|t| now.saturating_duration_since(t) < DROP_LOG_EVERY)
        {
            return None;
        }
        self.last_line = Some(now);
        let latest = self.latest.take().unwrap_or_else(|| "unknown".into());
        Some((std::mem::take(&mut self.pending), latest))
    }
}

#[cfg(test)]
mod relay_tests {
    use super::*;

    /// A relay with round `committing` sent and round `next` prepared.
    fn relay_with(committing: &[MessageId], next: &[MessageId]) -> Relay {
        let mut relay = Relay::default();
        relay
            .in_rounds
            .extend(committing.iter().chain(next).copied());
        assert!(relay.preparation_ended(0, Ok(PreparedRound::without_copies(next.to_vec()))));
        relay
    }

    fn round(ids: &[MessageId], transferred: &[MessageId], failed: bool) -> Round {
        Round {
            ids: ids.to_vec(),
            transferred: transferred.to_vec(),
            failure: failed.then(|| TransferError::Unavailable("target down".into())),
        }
    }

    #[test]
    fn a_round_that_succeeded_lets_the_prepared_one_go() {
        let mut relay = relay_with(&[1, 2], &[3, 4]);
        relay.round_ended(&round(&[1, 2], &[1, 2], false));
        let next = relay.prepared.as_ref().expect("the prepared round is kept");
        assert_eq!(next.ids, vec![3, 4]);
        assert_eq!(relay.in_rounds, HashSet::from([3, 4]));
    }

    #[test]
    fn a_failed_round_discards_the_round_prepared_after_it() {
        // Dead letter 2 failed: sending 3 and 4 now would put them before 2 in the target.
        let mut relay = relay_with(&[1, 2], &[3, 4]);
        relay.round_ended(&round(&[1, 2], &[1], true));
        assert!(relay.prepared.is_none());
        assert!(relay.in_rounds.is_empty(), "all of them can be taken again");
        assert_eq!(relay.untaken(4), 4);
    }

    #[test]
    fn a_preparation_begun_before_a_failure_is_discarded_when_it_ends() {
        let mut relay = Relay::default();
        relay.in_rounds.extend([1, 2, 3, 4]);
        let epoch = relay.epoch; // round 3-4 starts preparing while 1-2 commits
        relay.round_ended(&round(&[1, 2], &[], true));
        assert!(relay.preparation_ended(epoch, Ok(PreparedRound::without_copies(vec![3, 4]))));
        assert!(relay.prepared.is_none());
        assert!(relay.in_rounds.is_empty());
        // A preparation begun after the failure is kept.
        relay.in_rounds.extend([1, 2]);
        assert!(
            relay.preparation_ended(relay.epoch, Ok(PreparedRound::without_copies(vec![1, 2])))
        );
        assert!(relay.prepared.is_some());
    }

    #[test]
    fn a_failed_preparation_releases_its_dead_letters() {
        let mut relay = Relay::default();
        relay.in_rounds.extend([1, 2]);
        assert!(!relay.preparation_ended(0, Err(vec![1, 2])));
        assert!(relay.in_rounds.is_empty());
    }
}

#[cfg(test)]
mod drop_log_tests {
    use super::*;

    #[test]
    fn drops_are_logged_at_most_once_a_second_with_their_count() {
        let t0 = Instant::now();
        let mut log = DropLog::new(10);
        assert_eq!(log.take_due(t0), None, "nothing dropped, nothing to say");
        log.dropped(1, "no route".into());
        assert_eq!(log.take_due(t0), Some((1, "no route".into())));
        // Within the second: counted, not logged.
        for _ in 0..5 {
            log.dropped(1, "no route".into());
        }
        log.count_inbox_drops(13); // 3 more, dropped at the full inbox (10 seen before)
        assert_eq!(log.take_due(t0 + Duration::from_millis(999)), None);
        let (n, why) = log
            .take_due(t0 + DROP_LOG_EVERY)
            .expect("a line after a second");
        assert_eq!(n, 8);
        assert!(why.contains("full"), "{why}");
        log.count_inbox_drops(13);
        assert_eq!(log.take_due(t0 + 3 * DROP_LOG_EVERY), None, "nothing new");
    }
}

/// The actor's timers, as instants (None: not armed).
#[derive(Default)]
struct Timers {
    transfer_retry: Option<Instant>,
    config_retry: Option<Instant>,
    expire_retry: Option<Instant>,
    /// The next move round: not before this (rate limit or retry pause).
    move_next: Option<Instant>,
}

impl QueueLeader {
    async fn run(mut self) {
        let mut applied = self.machine.subscribe_applied();
        let mut topology = self.ctx.view.subscribe();
        let mut woken = self.quiet.subscribe_woken();
        // The clean-up runs CONSUMER_RECONCILE after something was applied, and again while it
        // finds work; an idle queue runs no timer (it may sleep, see `groups::quiet`).
        let mut cleanup_at = Some(Instant::now() + CONSUMER_RECONCILE);
        // When the group may sleep: `quiesce_after` after the last applied entry or wake.
        let quiesce_after = self.ctx.quiesce_after;
        let mut sleep_at = quiesce_after.map(|d| Instant::now() + d);
        let mut timers = Timers::default();
        let mut relay = Relay::default();
        let mut publish: Option<Publish> = None;
        let mut moving: Option<MoveRound> = None;
        let mut logged_no_route = false;
        let mut drops = DropLog::new(self.machine.dropped_dead_letters());

        self.clean_up_old_consumers().await;
        self.sync_config(&mut timers).await;
        loop {
            if self.cancel.is_cancelled() || self.expire_due(&mut timers).await {
                return; // stopped, or the queue expired and is being deleted
            }
            if relay.committing.is_none()
                && let Some(round) = relay.prepared.take()
            {
                let dl = self.ctx.dead_letters.clone();
                relay.committing = Some(Box::pin(async move { dl.commit_round(round).await }));
            }
            if relay.preparing.is_none() && relay.prepared.is_none() {
                relay.preparing = self.next_round(&mut timers, &mut logged_no_route, &mut relay);
            }
            if moving.is_none() {
                moving = self.next_move(&mut timers);
            }
            let wake = self.next_wake(&timers);
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                (epoch, round) = poll_some(&mut relay.preparing) => {
                    relay.preparing = None;
                    if !relay.preparation_ended(epoch, round) {
                        timers.transfer_retry = Some(Instant::now() + self.ctx.dead_letter_retry);
                    }
                }
                round = poll_some(&mut relay.committing) => {
                    relay.committing = None;
                    relay.round_ended(&round);
                    self.after_round(round, &mut timers, &mut logged_no_route, &mut relay.settling);
                }
                Some(settled) = relay.settling.running.next(), if !relay.settling.running.is_empty() => {
                    for id in settled {
                        relay.settling.ids.remove(&id);
                    }
                }
                (started, outcome) = poll_some(&mut moving) => {
                    moving = None;
                    self.after_move(started, outcome, &mut timers).await;
                }
                published = poll_some(&mut publish) => {
                    publish = None;
                    if let Err(e) = published {
                        drops.dropped(1, e);
                        drops.log_if_due(self.group);
                    }
                }
                event = self.inbox.recv(), if publish.is_none() => match event {
                    Some(LeaderEvent::DeadLetter(job)) => {
                        let dl = self.ctx.dead_letters.clone();
                        publish = Some(Box::pin(async move { dl.publish_at_most_once(job).await }));
                    }
                    Some(LeaderEvent::ConfigChanged) => self.sync_config(&mut timers).await,
                    None => return,
                },
                r = applied.changed() => {
                    if r.is_err() { return }
                    cleanup_at.get_or_insert_with(|| Instant::now() + CONSUMER_RECONCILE);
                    sleep_at = quiesce_after.map(|d| Instant::now() + d);
                }
                r = woken.changed() => {
                    if r.is_err() { return }
                    sleep_at = quiesce_after.map(|d| Instant::now() + d);
                }
                _ = sleep_until(sleep_at) => {
                    sleep_at = None;
                    let busy = relay.busy() || moving.is_some() || publish.is_some();
                    let slept = !busy
                        && quiesce::try_sleep(
                            self.group,
                            &self.raft,
                            &self.quiet,
                            &self.ctx.peers,
                            self.ctx.me,
                        )
                        .await;
                    if !slept {
                        sleep_at = quiesce_after.map(|d| Instant::now() + d);
                    }
                }
                r = topology.changed() => {
                    if r.is_err() { return }
                    // The topology may give held dead letters a route now.
                    timers.transfer_retry = None;
                }
                _ = sleep_until(cleanup_at) => {
                    drops.count_inbox_drops(self.machine.dropped_dead_letters());
                    drops.log_if_due(self.group);
                    let more = self.clean_up_old_consumers().await || drops.pending > 0;
                    cleanup_at = more.then(|| Instant::now() + CONSUMER_RECONCILE);
                }
                _ = sleep_until(wake) => {
                    if timers.config_retry.is_some_and(|t| t <= Instant::now()) {
                        self.sync_config(&mut timers).await;
                    }
                }
            }
        }
    }

    /// Start preparing a round of held at-least-once dead letters, if any are held that are in
    /// no round and not being settled, no retry pause is running and fewer than
    /// [`SETTLES_IN_FLIGHT`] settles are.
    fn next_round(
        &self,
        timers: &mut Timers,
        logged_no_route: &mut bool,
        relay: &mut Relay,
    ) -> Option<Prepare> {
        let held = self.machine.with_state(|s| s.counts().held);
        if held == 0 {
            *logged_no_route = false;
            return None;
        }
        // Every held one taken: nothing to take (or a round or settle just ended, and that
        // wakes the loop again). Saves walking the taken ids on every applied entry.
        if timers.transfer_retry.is_some_and(|t| t > Instant::now())
            || relay.settling.running.len() >= SETTLES_IN_FLIGHT
            || relay.untaken(held) == 0
        {
            return None;
        }
        let (batch, config) = self.machine.with_state(|s| {
            let batch = s.first_held_dead_letters(TRANSFER_BATCH, TRANSFER_BATCH_BYTES, |id| {
                relay.in_rounds.contains(&id) || relay.settling.ids.contains(&id)
            });
            (batch, s.config().clone())
        });
        if batch.is_empty() {
            return None; // every held dead letter is taken
        }
        debug!(
            first = batch[0].id,
            n = batch.len(),
            in_rounds = relay.in_rounds.len(),
            settling = relay.settling.ids.len(),
            "dead-letter transfer round"
        );
        timers.transfer_retry = None;
        let ids: Vec<MessageId> = batch.iter().map(|h| h.id).collect();
        relay.in_rounds.extend(ids.iter().copied());
        let (dl, machine, group, epoch) = (
            self.ctx.dead_letters.clone(),
            self.machine.clone(),
            self.group,
            relay.epoch,
        );
        let preparation =
            tokio::task::spawn_blocking(move || dl.prepare_round(group, &machine, &config, batch));
        Some(Box::pin(async move {
            match preparation.await {
                Ok(round) => (epoch, Ok(round)),
                Err(e) => {
                    warn!("dead-letter round preparation failed: {e}");
                    (epoch, Err(ids))
                }
            }
        }))
    }

    fn after_round(
        &self,
        round: Round,
        timers: &mut Timers,
        logged_no_route: &mut bool,
        settling: &mut Settling,
    ) {
        if !round.transferred.is_empty() {
            let ids = round.transferred;
            settling.ids.extend(ids.iter().copied());
            let (dl, group) = (self.ctx.dead_letters.clone(), self.group);
            settling.running.push(Box::pin(async move {
                dl.settle(group, ids.clone()).await;
                ids
            }));
        }
        let Some(failure) = round.failure else {
            return; // more may be held: next round at once
        };
        match failure {
            TransferError::NoRoute(why) if !*logged_no_route => {
                warn!("at-least-once dead letters held: {why}");
                *logged_no_route = true;
            }
            e => debug!("dead-letter transfer will be retried: {e:?}"),
        }
        timers.transfer_retry = Some(Instant::now() + self.ctx.dead_letter_retry);
    }

    /// A round of the running move task, if there is one and its pause is over.
    fn next_move(&self, timers: &mut Timers) -> Option<MoveRound> {
        if timers.move_next.is_some_and(|t| t > Instant::now()) {
            return None;
        }
        timers.move_next = None;
        self.machine.with_state(|s| s.running_move().map(|_| ()))?;
        let (mover, machine, group) = (self.ctx.mover.clone(), self.machine.clone(), self.group);
        Some(Box::pin(async move {
            let started = Instant::now();
            (started, mover.round(group, &machine).await)
        }))
    }

    async fn after_move(&self, started: Instant, outcome: MoveOutcome, timers: &mut Timers) {
        match outcome {
            MoveOutcome::Moved(0) => {
                // Nothing taken though a task runs (its end not applied yet): look again later.
                timers.move_next = Some(Instant::now() + PROPOSAL_RETRY);
            }
            MoveOutcome::Moved(n) => {
                let rate = self
                    .machine
                    .with_state(|s| s.running_move().map(|t| t.max_per_second))
                    .unwrap_or(0);
                if rate > 0 {
                    let pause = Duration::from_secs_f64(n as f64 / f64::from(rate));
                    timers.move_next = Some(started + pause);
                }
            }
            MoveOutcome::Retry(why) => {
                debug!("move round will be retried: {why}");
                timers.move_next = Some(Instant::now() + PROPOSAL_RETRY);
            }
            MoveOutcome::Fail { task, detail } => {
                warn!(task, "move task failed: {detail}");
                let cmd = Command::EndMove {
                    task,
                    state: qq_core::queue::MoveState::Failed,
                    detail,
                };
                if let Err(e) = self.propose(cmd).await {
                    debug!("end move not applied: {e}");
                    timers.move_next = Some(Instant::now() + PROPOSAL_RETRY);
                }
            }
        }
    }

    /// Propose Expire / ExpireQueue if due. Returns true when the queue expired and its
    /// deletion was committed.
    async fn expire_due(&self, timers: &mut Timers) -> bool {
        if timers.expire_retry.is_some_and(|t| t > Instant::now()) {
            return false;
        }
        timers.expire_retry = None;
        let now = now_ms();
        let (deadline, queue_due, vhost, name) = self.machine.with_state(|s| {
            (
                s.next_deadline(),
                s.queue_expiry_due_ms(self.leader_since_ms),
                s.config().vhost.clone(),
                s.config().name.clone(),
            )
        });
        if queue_due.is_some_and(|d| d <= now) {
            let cmd = Command::ExpireQueue {
                now_ms: now,
                leader_since_ms: self.leader_since_ms,
            };
            match self.propose(cmd).await {
                Ok(Reply::QueueExpiry { expired: true }) => {
                    // Unused for x-expires: the queue is deleted, its messages are not
                    // dead-lettered.
                    info!("queue unused for x-expires: deleting it");
                    match self
                        .ctx
                        .proposer
                        .propose_meta(MetaCommand::DeleteQueue { vhost, name })
                        .await
                    {
                        Ok(_) => return true,
                        Err(e) => debug!("queue expiry not applied yet: {e}"),
                    }
                }
                // Used meanwhile: look again after a pause rather than at once.
                Ok(_) => {}
                Err(e) => debug!("queue expiry check not applied: {e}"),
            }
            timers.expire_retry = Some(Instant::now() + PROPOSAL_RETRY);
        } else if deadline.is_some_and(|d| d <= now) {
            if let Err(e) = self.propose(Command::Expire { now_ms: now }).await {
                debug!("expire not applied: {e}");
                timers.expire_retry = Some(Instant::now() + PROPOSAL_RETRY);
            }
        }
        false
    }

    /// The earliest of the actor's deadlines.
    fn next_wake(&self, timers: &Timers) -> Option<Instant> {
        let now = now_ms();
        let (deadline, queue_due) = self.machine.with_state(|s| {
            (
                s.next_deadline(),
                s.queue_expiry_due_ms(self.leader_since_ms),
            )
        });
        let at_ms = |ms: u64| Instant::now() + Duration::from_millis(ms.saturating_sub(now));
        let expiry = match timers.expire_retry {
            Some(t) => Some(t),
            None => [deadline, queue_due].into_iter().flatten().min().map(at_ms),
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

    async fn propose(&self, cmd: Command) -> Result<Reply, crate::error::NodeError> {
        self.ctx
            .proposer
            .propose_queue(self.group, QueueRequest::command(cmd))
            .await
    }

    /// Bring the queue's own configuration in line with the metadata's; a failed proposal is
    /// retried on a timer.
    async fn sync_config(&self, timers: &mut Timers) {
        timers.config_retry = None;
        if !self.try_sync_config().await {
            timers.config_retry = Some(Instant::now() + PROPOSAL_RETRY);
        }
    }

    /// False if the proposal failed.
    async fn try_sync_config(&self) -> bool {
        let Some(wanted) = self.ctx.view.queue_by_id(self.group) else {
            return true; // deleted: the supervisor stops the group
        };
        let current = self.machine.with_state(|s| s.config().clone());
        if current == wanted.config {
            return true;
        }
        let cmd = Command::UpdateConfig {
            now_ms: now_ms(),
            config: wanted.config,
        };
        match self.propose(cmd).await {
            Ok(_) => true,
            Err(e) => {
                debug!("update config not applied yet: {e}");
                false
            }
        }
    }

    /// The leader serves every consumer stream of its queue (followers relay to it), and a
    /// session registers locally before its `Checkout` is proposed: a consumer in the state
    /// that no local session serves belongs to a stream that ended (with an old leader, or
    /// whose clean-up failed), so its unacked messages go back to the queue. `ConsumerDown` of
    /// a consumer already gone is a no-op, so racing a session's own clean-up is harmless.
    /// Returns whether there was any such consumer (then look again later: the proposal may
    /// have failed during an election).
    async fn clean_up_old_consumers(&self) -> bool {
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
