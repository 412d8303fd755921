//! The membership nemesis: the cluster's membership changed under load the way an operator
//! changes it, through the public admin RPCs only.
//!
//! One strike, on a spare node started empty by the runner (qq-chaos: on its spare host; qq-sim:
//! in its process) with a new id (a forgotten id never joins again):
//!
//! 1. `start`: the node runs, configured with the founders and itself; it serves nothing yet.
//! 2. `join`: `JoinNode` through a founder (the node becomes a metadata voter).
//! 3. `grow`: `GrowQueues` onto every workload queue; each queue must answer `added` (the
//!    server answers only after the new replica caught up as a learner and became a voter).
//! 4. `caught-up`: the spare's own replicas, from its `ClusterStatus`, reach the applied index
//!    the leaders reported when grow answered.
//!
//! and when the window ends:
//!
//! 5. `shrink` (when the seed says so): `ShrinkQueues` takes its replicas away again;
//!    otherwise `ForgetNode` has to delete them.
//! 6. `stop`: SIGTERM, and the node must exit by itself.
//! 7. `forget`: `ForgetNode` through a founder.
//! 8. `settled`: every founder lists only the founders and no queue names the spare.
//!
//! Steps 1-4 run in a task of their own while the runner's loop goes on; 5-8 run when the
//! window ends. A step that fails is retried (membership RPCs are idempotent and say "safe to
//! retry") until its limit; each step's time, attempts and outcome go into the report, and the
//! run fails if one did not succeed. The workload's clients stay on the founders.
//!
//! Deliberately not here: clients on the spare, or another fault while a strike lasts (the
//! schedule never overlaps windows).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use qq_client::Client;
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use tonic::Code;

use crate::workload::{self, Recorder};

/// Where the runner started the spare node: its client and cluster addresses.
#[derive(Clone, Debug)]
pub struct SpareAt {
    pub address: String,
    pub cluster_address: String,
    /// A client of its client port, where the runner's network needs one made its way (the
    /// lock-step replay's simulated network); None: a TCP client of `address`.
    pub client: Option<Client>,
}

/// The runner's side of the spare: stopping it.
pub trait Spare {
    /// Stops spare node `id` as SIGTERM does and waits until it has ended; says how it ended,
    /// or why it had to be killed.
    fn stop_spare(&mut self, id: u64) -> impl Future<Output = anyhow::Result<String>> + Send;
}

/// How long one step (with its retries) may take. A grow adds four replicas one after another
/// and each waits for its learner to catch up under load.
const STEP_LIMIT: Duration = Duration::from_secs(180);
/// How long one membership RPC may take before it is abandoned and tried again (the server
/// allows an add up to 95 s: leader search, catch-up, voter change).
const RPC_LIMIT: Duration = Duration::from_secs(120);
/// How long the spare's replicas and the founders' views may take to settle.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// One step of a strike, as the report shows it.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub node: u64,
    pub step: &'static str,
    /// Since the workload started.
    pub start_ms: u64,
    pub duration_ms: u64,
    pub ok: bool,
    pub attempts: u32,
    pub detail: String,
}

impl Step {
    fn new(node: u64, step: &'static str, start_ms: u64, rec: &Recorder) -> Step {
        Step {
            node,
            step,
            start_ms,
            duration_ms: rec.now_ms().saturating_sub(start_ms),
            ok: false,
            attempts: 1,
            detail: String::new(),
        }
    }

    /// Puts `summary` before what the step already says (its failed attempts).
    fn lead_with(&mut self, summary: String) {
        self.detail = if self.detail.is_empty() {
            summary
        } else {
            format!("{summary}; {}", self.detail)
        };
    }

    fn print(&self) {
        println!(
            "[{:>5.1}s]   membership: {} node {} {} in {} ms ({} attempt{}){}{}",
            (self.start_ms + self.duration_ms) as f64 / 1000.0,
            self.step,
            self.node,
            if self.ok { "done" } else { "FAILED" },
            self.duration_ms,
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            if self.detail.is_empty() { "" } else { ": " },
            self.detail
        );
    }
}

/// A strike under way: the spare started, joining and growing in a task.
pub struct Strike {
    id: u64,
    shrink_first: bool,
    started: Step,
    joining: JoinHandle<Vec<Step>>,
}

impl Strike {
    /// Begins a strike on spare node `id`, which the runner started `at` at `start_ms`.
    pub fn begin(
        founders: Arc<Vec<Client>>,
        rec: Arc<Recorder>,
        id: u64,
        at: SpareAt,
        shrink_first: bool,
        start_ms: u64,
    ) -> Strike {
        let mut started = Step::new(id, "start", start_ms, &rec);
        started.ok = true;
        started.detail = format!(
            "on {}, empty data directory; leaves by {}",
            at.address,
            if shrink_first {
                "shrink, stop, forget"
            } else {
                "stop, forget (forget deletes its replicas)"
            }
        );
        started.print();
        let joining = tokio::spawn(join_and_grow(founders, rec, id, at));
        Strike {
            id,
            shrink_first,
            started,
            joining,
        }
    }

    /// Ends the strike: waits for the join and grow, then shrinks (if chosen), stops and
    /// forgets the spare. Returns every step, the failed ones included.
    pub async fn finish(
        self,
        spare: &mut impl Spare,
        founders: &[Client],
        rec: &Recorder,
    ) -> Vec<Step> {
        let mut steps = vec![self.started];
        match self.joining.await {
            Ok(s) => steps.extend(s),
            Err(e) => {
                let mut failed = Step::new(self.id, "join", rec.now_ms(), rec);
                failed.detail = format!("the join task ended: {e}");
                failed.print();
                steps.push(failed);
            }
        }
        steps.extend(retire(spare, founders, rec, self.id, self.shrink_first).await);
        steps
    }
}

/// Whether an error is worth another attempt. A bad argument or an unknown node is not; an
/// unavailable group, a timeout or a refused precondition that the cluster may still resolve
/// (a replica not yet deleted) is.
fn retryable(code: Code) -> bool {
    !matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::PermissionDenied
            | Code::AlreadyExists
            | Code::Unimplemented
            | Code::Unauthenticated
    )
}

/// What one attempt of a step came to.
enum Attempt<T> {
    Done(T),
    Retry(String),
    Fatal(String),
}

/// Runs `f` against the founders (node 1 first, the next one after each failure) until it is
/// done, fails for good, or [`STEP_LIMIT`] passes. Fills in the step's outcome.
async fn attempts<T, F, Fut>(
    step: &mut Step,
    founders: &[Client],
    rec: &Recorder,
    mut f: F,
) -> Option<T>
where
    F: FnMut(Client, u32) -> Fut,
    Fut: Future<Output = Attempt<T>>,
{
    let deadline = Instant::now() + STEP_LIMIT;
    let mut errors: Vec<String> = Vec::new();
    let mut n = 0u32;
    let outcome = loop {
        let client = founders[n as usize % founders.len()].clone();
        n += 1;
        let answer = match timeout(RPC_LIMIT, f(client.clone(), n)).await {
            Ok(a) => a,
            Err(_) => Attempt::Retry(format!("no answer within {}s", RPC_LIMIT.as_secs())),
        };
        match answer {
            Attempt::Done(v) => break Some(v),
            Attempt::Fatal(e) => {
                errors.push(format!("via {}: {e}", client.address()));
                break None;
            }
            Attempt::Retry(e) => errors.push(format!("via {}: {e}", client.address())),
        }
        if Instant::now() + RETRY_PAUSE >= deadline {
            errors.push(format!("gave up after {}s", STEP_LIMIT.as_secs()));
            break None;
        }
        sleep(RETRY_PAUSE).await;
    };
    step.attempts = n;
    step.ok = outcome.is_some();
    step.duration_ms = rec.now_ms().saturating_sub(step.start_ms);
    // Every failed attempt is part of the story; the first three and the last suffice.
    if errors.len() > 4 {
        let last = errors.pop().expect("more than four");
        errors.truncate(3);
        errors.push(format!("... {last}"));
    }
    if !errors.is_empty() {
        let sep = if step.detail.is_empty() { "" } else { "; " };
        step.detail = format!(
            "{}{sep}failed attempts: {}",
            step.detail,
            errors.join(" | ")
        );
    }
    outcome
}

/// The queue changes of a grow, shrink or forget: every workload queue must show `want` (or
/// `unchanged` when a retry finds the work already done). Returns a summary or what is missing.
fn check_changes(
    changes: &[qq_client::v1::MemberChange],
    want: &str,
    retrying: bool,
) -> Result<String, String> {
    let mut missing = Vec::new();
    for q in workload::QUEUES {
        match changes.iter().find(|c| c.queue == q) {
            Some(c) if c.outcome == want || (retrying && c.outcome == "unchanged") => {}
            Some(c) => missing.push(format!("{q}: {} {}", c.outcome, c.detail)),
            None if retrying => {}
            None => missing.push(format!("{q}: not in the answer")),
        }
    }
    if missing.is_empty() {
        let done = changes.iter().filter(|c| c.outcome == want).count();
        Ok(format!("{done} queues {want}"))
    } else {
        Err(missing.join(", "))
    }
}

/// Steps 2-4: join, grow, caught up.
async fn join_and_grow(
    founders: Arc<Vec<Client>>,
    rec: Arc<Recorder>,
    id: u64,
    at: SpareAt,
) -> Vec<Step> {
    let mut steps = Vec::new();
    let SpareAt {
        address,
        cluster_address,
        client,
    } = at;

    let mut join = Step::new(id, "join", rec.now_ms(), &rec);
    let joined = attempts(&mut join, &founders, &rec, |c, _| {
        let (address, cluster_address) = (address.clone(), cluster_address.clone());
        async move {
            match c.join_node(id, &address, &cluster_address).await {
                Ok(detail) => Attempt::Done(detail),
                Err(e) if retryable(e.code()) => Attempt::Retry(e.to_string()),
                Err(e) => Attempt::Fatal(e.to_string()),
            }
        }
    })
    .await;
    let ok = joined.is_some();
    if let Some(detail) = joined {
        join.lead_with(if detail.is_empty() {
            "metadata voter".into()
        } else {
            detail
        });
    }
    join.print();
    steps.push(join);
    if !ok {
        return steps;
    }

    let mut grow = Step::new(id, "grow", rec.now_ms(), &rec);
    let grown = attempts(&mut grow, &founders, &rec, |c, n| async move {
        match c.grow_queues(id, "^chaos\\.", "").await {
            Ok(changes) => match check_changes(&changes, "added", n > 1) {
                Ok(summary) => Attempt::Done(summary),
                Err(missing) => Attempt::Retry(missing),
            },
            Err(e) if retryable(e.code()) => Attempt::Retry(e.to_string()),
            Err(e) => Attempt::Fatal(e.to_string()),
        }
    })
    .await;
    let ok = grown.is_some();
    if let Some(summary) = grown {
        grow.lead_with(summary);
    }
    grow.print();
    steps.push(grow);
    if !ok {
        return steps;
    }

    let spare = match client {
        Some(c) => Ok(c),
        None => Client::connect_lazy(&address),
    };
    let caught = caught_up(&founders, &rec, id, spare).await;
    caught.print();
    steps.push(caught);
    steps
}

/// Step 4: the spare's replicas reach the applied index each queue's leader reported once
/// grow had answered.
async fn caught_up(
    founders: &[Client],
    rec: &Recorder,
    id: u64,
    spare: qq_client::Result<Client>,
) -> Step {
    let mut step = Step::new(id, "caught-up", rec.now_ms(), rec);
    let mut target = Vec::new();
    for q in workload::QUEUES {
        let mut applied = None;
        for c in founders {
            if let Ok(Ok(info)) = timeout(Duration::from_secs(3), c.get_queue(q)).await {
                applied = Some(info.last_applied);
                break;
            }
        }
        let Some(applied) = applied else {
            step.duration_ms = rec.now_ms().saturating_sub(step.start_ms);
            step.detail = format!("{q}: no founder answered GetQueue");
            return step;
        };
        target.push((q, applied));
    }
    let spare = match spare {
        Ok(c) => c,
        Err(e) => {
            step.detail = format!("client for the spare: {e}");
            return step;
        }
    };
    let deadline = Instant::now() + SETTLE_LIMIT;
    let mut polls = 0;
    loop {
        polls += 1;
        let behind: Vec<String> =
            match timeout(Duration::from_secs(3), spare.cluster_status()).await {
                Ok(Ok(s)) => target
                    .iter()
                    .filter_map(|(q, want)| match s.queues.iter().find(|l| l.name == *q) {
                        Some(l) if l.local_member && l.local_last_applied >= *want => None,
                        Some(l) if l.local_member => {
                            Some(format!("{q}: applied {} of {want}", l.local_last_applied))
                        }
                        _ => Some(format!("{q}: no local replica")),
                    })
                    .collect(),
                Ok(Err(e)) => vec![format!("ClusterStatus: {e}")],
                Err(_) => vec!["ClusterStatus: no answer within 3 s".into()],
            };
        step.duration_ms = rec.now_ms().saturating_sub(step.start_ms);
        step.attempts = polls;
        if behind.is_empty() {
            step.ok = true;
            let applied: Vec<String> = target.iter().map(|(q, a)| format!("{q}≥{a}")).collect();
            step.detail = format!("replicas applied {}", applied.join(" "));
            return step;
        }
        if Instant::now() >= deadline {
            step.detail = format!(
                "not caught up after {}s: {}",
                SETTLE_LIMIT.as_secs(),
                behind.join(", ")
            );
            return step;
        }
        sleep(RETRY_PAUSE).await;
    }
}

/// Steps 5-8: shrink (if chosen), stop, forget, settled.
async fn retire(
    spare: &mut impl Spare,
    founders: &[Client],
    rec: &Recorder,
    id: u64,
    shrink_first: bool,
) -> Vec<Step> {
    let mut steps = Vec::new();
    if shrink_first {
        let mut shrink = Step::new(id, "shrink", rec.now_ms(), rec);
        let shrunk = attempts(&mut shrink, founders, rec, |c, n| async move {
            match c.shrink_queues(id).await {
                // A queue it never joined (a grow that failed) is simply not in the answer.
                Ok(changes) => match check_changes(&changes, "deleted", true) {
                    Ok(summary) if n == 1 && changes.is_empty() => {
                        Attempt::Done(format!("{summary} (it held no replica)"))
                    }
                    Ok(summary) => Attempt::Done(summary),
                    Err(missing) => Attempt::Retry(missing),
                },
                Err(e) if retryable(e.code()) => Attempt::Retry(e.to_string()),
                Err(e) => Attempt::Fatal(e.to_string()),
            }
        })
        .await;
        if let Some(summary) = shrunk {
            shrink.lead_with(summary);
        }
        shrink.print();
        steps.push(shrink);
    }

    let mut stop = Step::new(id, "stop", rec.now_ms(), rec);
    match spare.stop_spare(id).await {
        Ok(how) => {
            stop.ok = true;
            stop.detail = format!("SIGTERM: {how}");
        }
        Err(e) => stop.detail = format!("{e:#}"),
    }
    stop.duration_ms = rec.now_ms().saturating_sub(stop.start_ms);
    stop.print();
    steps.push(stop);

    let mut forget = Step::new(id, "forget", rec.now_ms(), rec);
    let forgotten = attempts(&mut forget, founders, rec, |c, n| async move {
        match c.forget_node(id).await {
            Ok(changes) => match check_changes(&changes, "deleted", true) {
                Ok(summary) => Attempt::Done(format!("replicas: {summary}")),
                Err(missing) => Attempt::Retry(missing),
            },
            // An earlier attempt that timed out on this side may have finished on the
            // server: the node is gone, which `settled` confirms.
            Err(e) if n > 1 && e.code() == Code::NotFound => {
                Attempt::Done(format!("already forgotten by an earlier attempt ({e})"))
            }
            Err(e) if retryable(e.code()) => Attempt::Retry(e.to_string()),
            Err(e) => Attempt::Fatal(e.to_string()),
        }
    })
    .await;
    if let Some(summary) = forgotten {
        forget.lead_with(summary);
    }
    forget.print();
    steps.push(forget);

    let settled = settled(founders, rec, id).await;
    settled.print();
    steps.push(settled);
    steps
}

/// Step 8: every founder lists exactly the founders, and no queue has the spare as a member.
async fn settled(founders: &[Client], rec: &Recorder, id: u64) -> Step {
    let mut step = Step::new(id, "settled", rec.now_ms(), rec);
    let want: Vec<u64> = (1..=founders.len() as u64).collect();
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        let mut problem = None;
        for c in founders {
            match timeout(Duration::from_secs(3), c.cluster_status()).await {
                Ok(Ok(s)) => {
                    let nodes: Vec<u64> = s.nodes.iter().map(|n| n.id).collect();
                    if nodes != want {
                        problem = Some(format!("node {} lists nodes {nodes:?}", s.node_id));
                    } else if let Some(q) = s.queues.iter().find(|q| q.members.contains(&id)) {
                        problem = Some(format!(
                            "node {} shows {} with members {:?}",
                            s.node_id, q.name, q.members
                        ));
                    }
                }
                Ok(Err(e)) => problem = Some(format!("{}: {e}", c.address())),
                Err(_) => problem = Some(format!("{}: no answer within 3 s", c.address())),
            }
            if problem.is_some() {
                break;
            }
        }
        step.duration_ms = rec.now_ms().saturating_sub(step.start_ms);
        match problem {
            None => {
                step.ok = true;
                step.detail = format!("every founder lists nodes {want:?}; no queue names {id}");
                return step;
            }
            Some(p) if Instant::now() >= deadline => {
                step.detail = format!("after {}s: {p}", SETTLE_LIMIT.as_secs());
                return step;
            }
            Some(_) => sleep(RETRY_PAUSE).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qq_client::v1::MemberChange;

    fn changes(outcomes: &[(&str, &str)]) -> Vec<MemberChange> {
        outcomes
            .iter()
            .map(|(q, o)| MemberChange {
                queue: q.to_string(),
                outcome: o.to_string(),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn a_grow_counts_only_when_every_workload_queue_was_added() {
        let all_added = changes(&[
            ("chaos.dlq", "added"),
            ("chaos.work", "added"),
            ("chaos.ttl", "added"),
            ("chaos.limit", "added"),
        ]);
        assert_eq!(
            check_changes(&all_added, "added", false),
            Ok("4 queues added".into())
        );
        let one_failed = changes(&[
            ("chaos.dlq", "added"),
            ("chaos.work", "error"),
            ("chaos.ttl", "added"),
            ("chaos.limit", "added"),
        ]);
        assert!(check_changes(&one_failed, "added", true).is_err());
        let one_missing = &all_added[1..];
        assert!(check_changes(one_missing, "added", false).is_err());
        // A retry finds what an abandoned attempt already did.
        let again = changes(&[
            ("chaos.dlq", "unchanged"),
            ("chaos.work", "added"),
            ("chaos.ttl", "unchanged"),
            ("chaos.limit", "unchanged"),
        ]);
        assert_eq!(
            check_changes(&again, "added", true),
            Ok("1 queues added".into())
        );
        assert!(check_changes(&again, "added", false).is_err());
    }
}
