//! The checker: reads a [`History`] and says whether the cluster kept its promises.
//!
//! In the spirit of Jepsen's `total-queue` checker, with dead-lettering added:
//! - **lost**: confirmed publishes never seen acked by a consumer, nor found in the dead-letter
//!   queue, nor left in a queue at the end. Must be 0.
//! - **unexpected**: messages seen that were never published. Must be 0.
//! - **duplicates**: deliveries of a message after a consumer had already settled it (an ack or
//!   reject that did not commit, allowed by at-least-once) are counted; a message *stored*
//!   twice is a failure: two first deliveries (not redelivered) of one id from its queue, or two
//!   copies of it in the dead-letter queue. Over gRPC, publishers retry with the same
//!   publisher id and seq, so the queues' exact dedup must store every retried publish once;
//!   and dead-letter copies carry idempotency keys. AMQP 0-9-1 has no publisher dedup: a
//!   message republished after its connection failed may be stored once per send, so in an
//!   AMQP history a message may have as many copies as it had attempts (counted as
//!   `republished_copies`), and one more is a failure; a message sent once, never two.
//! - **dead-letter correctness**: every message must die the way its queue and id say
//!   (`chaos.work` rejects by id → `rejected`, `chaos.ttl` → `expired`, `chaos.limit` →
//!   `delivery_limit`), with an `x-death` entry naming its source queue; nothing else may be
//!   dead-lettered.
//!
//! The checker is a pure function of the history; the runner adds what only the live cluster
//! can tell (dead letters still held, replica agreement) as [`Check`]s of its own.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::workload::{Action, Decision, History, LIMIT, TTL, decision};

/// How a message must leave the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Acked,
    DeadLettered(&'static str),
}

/// The fate of message `id` published to `queue`.
pub fn fate(queue: &str, id: &str) -> Fate {
    match queue {
        TTL => Fate::DeadLettered("expired"),
        LIMIT => Fate::DeadLettered("delivery_limit"),
        _ => match decision(id) {
            Decision::Reject => Fate::DeadLettered("rejected"),
            _ => Fate::Acked,
        },
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

impl Check {
    pub fn new(name: &str, ok: bool, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            ok,
            detail: detail.into(),
        }
    }

    /// Passes when there are no `findings` (with `when_clear` as the detail); otherwise fails
    /// and lists them.
    pub fn all_clear(name: &str, findings: Vec<String>, when_clear: impl Into<String>) -> Check {
        if findings.is_empty() {
            Check::new(name, true, when_clear)
        } else {
            Check::new(name, false, findings.join("; "))
        }
    }
}

/// Up to this many example ids are kept per finding.
const EXAMPLES: usize = 10;

#[derive(Clone, Debug, Default, Serialize)]
pub struct Counts {
    /// Messages the publishers tried to send (unique ids).
    pub attempted: usize,
    pub confirmed: usize,
    /// Publishes that ended without a confirm (may or may not have been stored).
    pub unconfirmed: usize,
    /// Publishes sent more than once (a retry after an error or timeout).
    pub retried: usize,
    pub acked: usize,
    pub dead_lettered: usize,
    pub dead_lettered_by_reason: BTreeMap<String, usize>,
    pub left_in_queues: usize,
    pub lost: usize,
    pub unexpected: usize,
    /// Deliveries of a message after a consumer had already acked or rejected it.
    pub duplicate_deliveries: usize,
    /// Extra first deliveries of one id from its queue: the message was stored twice (must
    /// be 0).
    pub stored_duplicates: usize,
    /// Of those, and of the extra dead-letter copies, how many belong to retried publishes.
    pub duplicates_of_retried_publishes: usize,
    /// AMQP only: extra copies (first deliveries, dead letters) of messages sent more than
    /// once, at most one per extra send (no publisher dedup: allowed, not failures).
    pub republished_copies: usize,
    /// Extra copies of a message in the dead-letter queue (must be 0).
    pub dead_letter_duplicates: usize,
    /// Dead letters with the wrong reason or source queue, or of messages that should not die.
    pub wrong_dead_letters: usize,
    /// Confirmed messages whose fate is dead-lettering but that are not in the dead-letter queue.
    pub missing_dead_letters: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Verdict {
    pub counts: Counts,
    pub checks: Vec<Check>,
    pub lost_examples: Vec<String>,
    pub unexpected_examples: Vec<String>,
    pub wrong_dead_letter_examples: Vec<String>,
    pub missing_dead_letter_examples: Vec<String>,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

fn examples<'a>(ids: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut v: Vec<String> = ids.into_iter().cloned().collect();
    v.sort();
    v.truncate(EXAMPLES);
    v
}

pub fn check(h: &History) -> Verdict {
    let published: HashMap<&str, &crate::workload::PublishRecord> =
        h.publishes.iter().map(|p| (p.id.as_str(), p)).collect();
    let confirmed: HashSet<&str> = h
        .publishes
        .iter()
        .filter(|p| p.confirmed_ms.is_some())
        .map(|p| p.id.as_str())
        .collect();

    let mut c = Counts {
        attempted: h.publishes.len(),
        confirmed: confirmed.len(),
        unconfirmed: h.publishes.len() - confirmed.len(),
        retried: h.publishes.iter().filter(|p| p.attempts > 1).count(),
        ..Counts::default()
    };

    // Consumers: what was acked, and deliveries after a settle that should have been final.
    let mut acked: HashSet<&str> = HashSet::new();
    let mut settled: HashSet<(&str, &str)> = HashSet::new();
    let mut first_deliveries: HashMap<(&str, &str), usize> = HashMap::new();
    for d in &h.deliveries {
        if !d.redelivered {
            *first_deliveries.entry((&d.queue, &d.id)).or_default() += 1;
        }
        if settled.contains(&(d.queue.as_str(), d.id.as_str())) {
            c.duplicate_deliveries += 1;
        }
        match d.action {
            Action::Ack => {
                acked.insert(&d.id);
                settled.insert((&d.queue, &d.id));
            }
            Action::Reject => {
                settled.insert((&d.queue, &d.id));
            }
            Action::Requeue => {}
        }
    }
    c.acked = acked.len();
    // Copies of a message beyond the first: allowed up to one per extra send when retries are
    // not deduplicated (AMQP), else failures.
    let retried = |id: &str| published.get(id).is_some_and(|p| p.attempts > 1);
    let allowed_extra = |id: &str| match published.get(id) {
        Some(p) if !h.protocol.dedups_retries() => p.attempts.saturating_sub(1) as usize,
        _ => 0,
    };
    let mut extra_copies = |id: &str, n: usize, failures: &mut usize| {
        let extra = n.saturating_sub(1);
        let allowed = extra.min(allowed_extra(id));
        c.republished_copies += allowed;
        *failures += extra - allowed;
        if extra > allowed && retried(id) {
            c.duplicates_of_retried_publishes += extra - allowed;
        }
    };
    let mut stored_duplicates = 0;
    for ((_, id), n) in &first_deliveries {
        extra_copies(id, *n, &mut stored_duplicates);
    }

    // The dead-letter queue: copies per id (a redelivery of the same copy is not a new copy).
    let mut copies: HashMap<&str, usize> = HashMap::new();
    let mut wrong: Vec<String> = Vec::new();
    for dl in &h.dead_letters {
        if !dl.redelivered {
            *copies.entry(&dl.id).or_default() += 1;
        }
        let Some(p) = published.get(dl.id.as_str()) else {
            continue; // counted as unexpected below
        };
        let want = fate(&p.queue, &dl.id);
        let last = dl.deaths.first();
        match (want, last) {
            (Fate::DeadLettered(reason), Some(death))
                if death.reason == reason && death.queue == p.queue && death.count >= 1 => {}
            _ => wrong.push(format!(
                "{} from {}: expected {:?}, x-death {:?}",
                dl.id, p.queue, want, dl.deaths
            )),
        }
    }
    let mut dead_letter_duplicates = 0;
    for (id, n) in &copies {
        extra_copies(id, *n, &mut dead_letter_duplicates);
    }
    c.stored_duplicates = stored_duplicates;
    c.dead_letter_duplicates = dead_letter_duplicates;
    c.dead_lettered = copies.len();
    for id in copies.keys() {
        if let Some(p) = published.get(id)
            && let Fate::DeadLettered(reason) = fate(&p.queue, id)
        {
            *c.dead_lettered_by_reason
                .entry(reason.to_string())
                .or_default() += 1;
        }
    }
    c.wrong_dead_letters = wrong.len();

    let left: HashSet<&str> = h.leftovers.iter().map(|l| l.id.as_str()).collect();
    c.left_in_queues = h.leftovers.len();

    let lost: Vec<String> = confirmed
        .iter()
        .filter(|id| !acked.contains(*id) && !copies.contains_key(*id) && !left.contains(*id))
        .map(|id| id.to_string())
        .collect();
    c.lost = lost.len();

    let seen = h
        .deliveries
        .iter()
        .map(|d| &d.id)
        .chain(h.dead_letters.iter().map(|d| &d.id))
        .chain(h.leftovers.iter().map(|l| &l.id));
    let unexpected: HashSet<&String> = seen
        .filter(|id| !published.contains_key(id.as_str()))
        .collect();
    c.unexpected = unexpected.len();

    // A message still in its queue when the consumers stopped never met its fate; the runner's
    // "drained" check reports those. Every other one that had to die must be in the DLQ.
    let missing: Vec<String> = confirmed
        .iter()
        .filter(|id| {
            let p = published[**id];
            matches!(fate(&p.queue, id), Fate::DeadLettered(_))
                && !copies.contains_key(**id)
                && !left.contains(**id)
        })
        .map(|id| id.to_string())
        .collect();
    c.missing_dead_letters = missing.len();

    let checks = vec![
        Check::new(
            "no confirmed message lost",
            c.lost == 0,
            format!("{} of {} confirmed messages lost", c.lost, c.confirmed),
        ),
        Check::new(
            "no unexpected message",
            c.unexpected == 0,
            format!("{} messages seen that were never published", c.unexpected),
        ),
        Check::new(
            "no message stored twice",
            c.stored_duplicates == 0,
            format!(
                "{} messages delivered for the first time twice ({} of all duplicates are \
                 of retried publishes; {} copies of republished AMQP messages allowed)",
                c.stored_duplicates, c.duplicates_of_retried_publishes, c.republished_copies
            ),
        ),
        Check::new(
            "no duplicate dead letters",
            c.dead_letter_duplicates == 0,
            format!(
                "{} extra copies in {}",
                c.dead_letter_duplicates,
                crate::workload::DLQ
            ),
        ),
        Check::new(
            "every dead letter has the right reason and source",
            c.wrong_dead_letters == 0,
            format!("{} wrong dead letters", c.wrong_dead_letters),
        ),
        Check::new(
            "every rejected/expired/over-limit message dead-lettered",
            c.missing_dead_letters == 0,
            format!(
                "{} confirmed messages that had to die are not in {}",
                c.missing_dead_letters,
                crate::workload::DLQ
            ),
        ),
    ];
    Verdict {
        counts: c,
        checks,
        lost_examples: examples(&lost),
        unexpected_examples: examples(unexpected),
        wrong_dead_letter_examples: examples(&wrong),
        missing_dead_letter_examples: examples(&missing),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{
        DeadLetterRecord, Death, DeliveryRecord, Leftover, Protocol, PublishRecord, WORK, queue_for,
    };

    fn id_with(queue: &str, want: Option<Decision>) -> String {
        (0..)
            .map(|i| format!("p0-{i}"))
            .find(|id| queue_for(id) == queue && want.is_none_or(|d| decision(id) == d))
            .unwrap()
    }

    fn published(id: &str, confirmed: bool) -> PublishRecord {
        PublishRecord {
            id: id.into(),
            queue: queue_for(id).into(),
            start_ms: 0,
            attempts: 1,
            confirmed_ms: confirmed.then_some(5),
            failure: None,
        }
    }

    fn delivered(id: &str, action: Action, redelivered: bool) -> DeliveryRecord {
        DeliveryRecord {
            t_ms: 10,
            queue: queue_for(id).into(),
            id: id.into(),
            redelivered,
            action,
        }
    }

    fn dead(id: &str, queue: &str, reason: &str) -> DeadLetterRecord {
        DeadLetterRecord {
            id: id.into(),
            redelivered: false,
            deaths: vec![Death {
                queue: queue.into(),
                reason: reason.into(),
                count: 1,
            }],
        }
    }

    /// One message of every fate, each ending where it should.
    fn healthy() -> (History, [String; 4]) {
        let ack = id_with(WORK, Some(Decision::Ack));
        let rej = id_with(WORK, Some(Decision::Reject));
        let ttl = id_with(TTL, None);
        let lim = id_with(LIMIT, None);
        let h = History {
            publishes: [&ack, &rej, &ttl, &lim]
                .iter()
                .map(|id| published(id, true))
                .collect(),
            deliveries: vec![
                delivered(&ack, Action::Ack, false),
                delivered(&rej, Action::Reject, false),
                delivered(&lim, Action::Requeue, false),
                delivered(&lim, Action::Requeue, true),
                delivered(&lim, Action::Requeue, true),
            ],
            dead_letters: vec![
                dead(&rej, WORK, "rejected"),
                dead(&ttl, TTL, "expired"),
                dead(&lim, LIMIT, "delivery_limit"),
            ],
            ..History::default()
        };
        (h, [ack, rej, ttl, lim])
    }

    #[test]
    fn a_healthy_history_passes() {
        let (h, _) = healthy();
        let v = check(&h);
        assert!(v.ok(), "{:#?}", v.checks);
        assert_eq!(v.counts.confirmed, 4);
        assert_eq!(v.counts.acked, 1);
        assert_eq!(v.counts.dead_lettered, 3);
        assert_eq!(v.counts.duplicate_deliveries, 0);
    }

    #[test]
    fn a_confirmed_message_nobody_saw_is_lost() {
        let (mut h, [ack, ..]) = healthy();
        h.deliveries.retain(|d| d.id != ack);
        let v = check(&h);
        assert_eq!(v.counts.lost, 1);
        assert_eq!(v.lost_examples, vec![ack.clone()]);
        assert!(!v.ok());
        // Found left in its queue at the end, it is not lost.
        h.leftovers.push(Leftover {
            queue: WORK.into(),
            id: ack,
        });
        assert!(check(&h).ok());
    }

    #[test]
    fn an_unconfirmed_message_may_vanish_but_not_appear_from_nowhere() {
        let (mut h, _) = healthy();
        let extra = id_with(WORK, Some(Decision::Ack));
        let mut p = published(&format!("{extra}x"), false);
        p.queue = WORK.into();
        h.publishes.push(p);
        assert!(
            check(&h).ok(),
            "an unconfirmed publish that never arrived is fine"
        );
        h.deliveries.push(DeliveryRecord {
            id: "never-published".into(),
            ..delivered(&extra, Action::Ack, false)
        });
        let v = check(&h);
        assert_eq!(v.counts.unexpected, 1);
        assert!(!v.ok());
    }

    #[test]
    fn dead_letters_must_have_the_right_reason_and_exist() {
        let (h, [ack, rej, ..]) = healthy();
        let mut wrong = h.clone();
        wrong.dead_letters[0] = dead(&rej, WORK, "expired");
        let v = check(&wrong);
        assert_eq!(v.counts.wrong_dead_letters, 1);
        assert!(!v.ok());

        let mut missing = h.clone();
        missing.dead_letters.remove(0);
        let v = check(&missing);
        assert_eq!(v.counts.missing_dead_letters, 1);
        assert_eq!(
            v.counts.lost, 1,
            "a rejected message nowhere to be found is also lost"
        );
        // Still in its queue at the end: never consumed, so neither missing nor lost.
        missing.leftovers.push(Leftover {
            queue: WORK.into(),
            id: rej.clone(),
        });
        assert!(check(&missing).ok());

        let mut should_not_die = h.clone();
        should_not_die
            .dead_letters
            .push(dead(&ack, WORK, "rejected"));
        assert_eq!(check(&should_not_die).counts.wrong_dead_letters, 1);
    }

    #[test]
    fn redeliveries_are_counted_and_stored_duplicates_fail() {
        let (mut h, [ack, rej, ..]) = healthy();
        // The ack was lost: the message came back and was acked again. Allowed, counted.
        h.deliveries.push(delivered(&ack, Action::Ack, true));
        let v = check(&h);
        assert!(v.ok());
        assert_eq!(v.counts.duplicate_deliveries, 1);

        // A redelivery of the same dead-letter copy is not a second copy.
        let mut again = dead(&rej, WORK, "rejected");
        again.redelivered = true;
        h.dead_letters.push(again);
        assert_eq!(check(&h).counts.dead_letter_duplicates, 0);

        // A second copy is a failure, also when the publisher sent the message twice: its
        // retries carry the same publisher id and seq.
        h.publishes
            .iter_mut()
            .find(|p| p.id == rej)
            .unwrap()
            .attempts = 2;
        h.dead_letters.push(dead(&rej, WORK, "rejected"));
        let v = check(&h);
        assert_eq!(v.counts.dead_letter_duplicates, 1);
        assert_eq!(v.counts.duplicates_of_retried_publishes, 1);
        assert!(!v.ok());
    }

    #[test]
    fn over_amqp_a_message_may_be_stored_once_per_send_and_no_more() {
        let (mut h, [ack, rej, ..]) = healthy();
        h.protocol = Protocol::Amqp;
        let sent = |h: &mut History, id: &str, attempts: u32| {
            h.publishes
                .iter_mut()
                .find(|p| p.id == id)
                .unwrap()
                .attempts = attempts;
        };
        // Sent once: a second copy is a failure, as over gRPC.
        h.deliveries.push(delivered(&ack, Action::Ack, false));
        let v = check(&h);
        assert_eq!(v.counts.stored_duplicates, 1);
        assert!(!v.ok());
        // Republished once (its connection failed before the confirm): two copies allowed.
        sent(&mut h, &ack, 2);
        let v = check(&h);
        assert!(v.ok(), "{:#?}", v.checks);
        assert_eq!(v.counts.republished_copies, 1);
        // A third copy is one more than it was sent.
        h.deliveries.push(delivered(&ack, Action::Ack, false));
        let v = check(&h);
        assert_eq!(v.counts.stored_duplicates, 1);
        assert_eq!(v.counts.duplicates_of_retried_publishes, 1);
        assert!(!v.ok());
        h.deliveries.pop();

        // Dead letters likewise: a rejected message sent twice may die twice, not three times.
        h.deliveries.push(delivered(&rej, Action::Reject, false));
        h.dead_letters.push(dead(&rej, WORK, "rejected"));
        assert_eq!(check(&h).counts.dead_letter_duplicates, 1);
        sent(&mut h, &rej, 2);
        let v = check(&h);
        assert!(v.ok(), "{:#?}", v.checks);
        assert_eq!(v.counts.republished_copies, 3);
        h.dead_letters.push(dead(&rej, WORK, "rejected"));
        assert_eq!(check(&h).counts.dead_letter_duplicates, 1);
    }

    #[test]
    fn a_message_delivered_first_twice_was_stored_twice() {
        let (mut h, [ack, ..]) = healthy();
        assert!(check(&h).ok());
        h.deliveries.push(delivered(&ack, Action::Ack, false));
        let v = check(&h);
        assert_eq!(v.counts.stored_duplicates, 1);
        assert!(!v.ok());
    }
}
