//! What a run asks the cluster before, while and after the nemeses act: that it formed, that it
//! is healthy and drained, which node leads a queue, whether a cut-off node inflated its term,
//! and whether the replicas agree. Each waits with a bound and says what it waited for.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::bail;
use qq_client::Client;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, timeout};

use crate::checker::Check;
use crate::replicas;
use crate::workload::{self, Clients, Control, Recorder, Role};

/// Retries `f` on errors for up to 30 s (the cluster may still be settling).
pub async fn retry<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = qq_client::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match timeout(Duration::from_secs(5), f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if Instant::now() >= deadline => bail!("{what}: {e}"),
            Err(_) if Instant::now() >= deadline => bail!("{what}: timed out"),
            _ => sleep(Duration::from_millis(300)).await,
        }
    }
}

pub async fn wait_formed(clients: &[Client], limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let mut formed = true;
        for c in clients {
            match timeout(Duration::from_secs(2), c.cluster_status()).await {
                Ok(Ok(s)) if s.metadata_leader != 0 => {}
                _ => formed = false,
            }
        }
        if formed {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("the cluster did not form within {limit:?}");
        }
        sleep(Duration::from_millis(300)).await;
    }
}

/// The leader of `queue` as some node sees it now (None when no node answers in time).
pub async fn current_leader(clients: &[Client], queue: &str) -> Option<u64> {
    for c in clients {
        if let Ok(Ok(info)) = timeout(Duration::from_secs(2), c.get_queue(queue)).await
            && info.leader != 0
        {
            return Some(info.leader);
        }
    }
    None
}

/// Each queue's Raft term on the node cut off alone (`alone`) against the highest term among
/// the others, from every node's `ClusterStatus` (their own replicas). With Pre-Vote the cut-off
/// node cannot raise its term; one more than the majority is allowed (an election it started
/// just as the cut fell). Without Pre-Vote it gains a term per election timeout. `None` when
/// the nodes did not answer.
pub async fn term_inflation(
    clients: &Arc<Vec<Client>>,
    alone: u64,
    fault: &str,
) -> Option<Vec<String>> {
    let mut asks = JoinSet::new();
    for c in clients.iter() {
        let c = c.clone();
        asks.spawn(async move { timeout(Duration::from_secs(3), c.cluster_status()).await });
    }
    let mut isolated: BTreeMap<String, u64> = BTreeMap::new();
    let mut majority: BTreeMap<String, u64> = BTreeMap::new();
    while let Some(Ok(answer)) = asks.join_next().await {
        let Ok(Ok(status)) = answer else { continue };
        for q in status.queues.iter().filter(|q| q.local_member) {
            if status.node_id == alone {
                isolated.insert(q.name.clone(), q.local_term);
            } else {
                let t = majority.entry(q.name.clone()).or_default();
                *t = (*t).max(q.local_term);
            }
        }
    }
    if isolated.is_empty() || majority.is_empty() {
        return None;
    }
    Some(
        isolated
            .iter()
            .filter_map(|(q, term)| {
                let rest = *majority.get(q)?;
                (*term > rest + 1).then(|| {
                    format!("{q}: node {alone} at term {term}, the others at {rest}, when healing {fault}")
                })
            })
            .collect(),
    )
}

/// Every node answers and, through every node, every queue has a leader.
pub async fn wait_healthy(clients: &[Client], limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let mut problem = None;
        'nodes: for c in clients {
            for q in workload::QUEUES {
                match timeout(Duration::from_secs(2), c.get_queue(q)).await {
                    Ok(Ok(info)) if info.leader != 0 => {}
                    Ok(Ok(_)) => problem = Some(format!("{q}: no leader (via {})", c.address())),
                    Ok(Err(e)) => problem = Some(format!("{q} via {}: {e}", c.address())),
                    Err(_) => problem = Some(format!("{q} via {}: timed out", c.address())),
                }
                if problem.is_some() {
                    break 'nodes;
                }
            }
        }
        match problem {
            None => return Ok(()),
            Some(p) if Instant::now() >= deadline => bail!("not healthy after {limit:?}: {p}"),
            Some(_) => sleep(Duration::from_millis(300)).await,
        }
    }
}

/// Waits until the three source queues are empty and hold no dead letters (consumers are still
/// running: acked and rejected messages leave, TTL messages expire, over-limit ones die).
///
/// On a slow machine the backlog can take long: the wait goes on while the number of messages
/// left keeps falling, and gives up after `stall` without progress.
pub async fn wait_drained(clients: &[Client], stall: Duration) -> anyhow::Result<()> {
    let mut deadline = Instant::now() + stall;
    let mut fewest = u64::MAX;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let c = &clients[attempt % clients.len()];
        let mut left = Vec::new();
        let mut total = 0;
        for q in workload::SOURCES {
            match timeout(Duration::from_secs(3), c.get_queue(q)).await {
                Ok(Ok(i)) if i.messages == 0 && i.messages_dead_letter_held == 0 => {}
                Ok(Ok(i)) => {
                    total += i.messages;
                    left.push(format!(
                        "{q}: {} messages ({} dead letters held)",
                        i.messages, i.messages_dead_letter_held
                    ))
                }
                Ok(Err(e)) => left.push(format!("{q}: {e}")),
                Err(_) => left.push(format!("{q}: timed out")),
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        if total > 0 && total < fewest {
            fewest = total;
            deadline = Instant::now() + stall;
        }
        if Instant::now() >= deadline {
            bail!("no progress for {stall:?}: {}", left.join("; "));
        }
        sleep(Duration::from_millis(500)).await;
    }
}

/// Consumes `queue` through the workload's protocol until it is empty (as `clients` see it),
/// recording each message as `role` says.
pub async fn drain(
    work: &Clients,
    clients: &Arc<Vec<Client>>,
    queue: &'static str,
    role: Role,
    rec: &Arc<Recorder>,
) -> anyhow::Result<()> {
    let control = Arc::new(Control::default());
    let task = tokio::spawn(work.consumer(0, queue, role, rec.clone(), control.clone()));
    let deadline = Instant::now() + Duration::from_secs(120);
    let drained = async {
        loop {
            // Dead letters still held are not consumable; the drained check reports them.
            let info = retry("queue info", || clients[0].get_queue(queue)).await?;
            let consumable = info.messages_ready + info.messages_unacked;
            if consumable == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("{queue} still has {consumable} messages after 120 s of draining");
            }
            sleep(Duration::from_millis(300)).await;
        }
    }
    .await;
    // Stopped whatever the outcome: a drainer left running outlived its run and, in a matrix
    // (one process, the next cluster on the same addresses), consumed and acked the next run's
    // messages into the old run's history, which the next run then counted as lost.
    control.stop_consuming.store(true, Ordering::Relaxed);
    // The consumer notices within its idle timeout; its last acks are already sent.
    task.await?;
    drained
}

/// After healing, every member of every queue's Raft group reaches the same applied index and
/// state digest, and keeps the state's invariants (`ClusterStatus` reports each node's own
/// replica).
pub async fn replica_agreement(clients: &[Client], limit: Duration) -> Check {
    let deadline = Instant::now() + limit;
    loop {
        let (seen, problem) = match replicas::views(clients, Duration::from_secs(3)).await {
            Ok(seen) => {
                let broken = seen.iter().find_map(|(q, v)| {
                    (!v.broken.is_empty())
                        .then(|| format!("{q}: invariants broken: {:?}", v.broken))
                });
                if let Some(b) = broken {
                    return Check::new("replicas agree", false, b);
                }
                let problem = seen.iter().find_map(|(q, v)| {
                    let distinct: std::collections::BTreeSet<&(u64, u64)> =
                        v.replicas.values().collect();
                    (v.replicas.len() != v.members || distinct.len() != 1)
                        .then(|| format!("{q}: {:?} (members {})", v.replicas, v.members))
                });
                (seen, problem)
            }
            Err(e) => (BTreeMap::new(), Some(e)),
        };
        match problem {
            None => {
                let detail: Vec<String> = seen
                    .iter()
                    .map(|(q, v)| {
                        let (applied, digest) =
                            v.replicas.values().next().copied().unwrap_or_default();
                        format!(
                            "{q}: {} replicas at {applied} digest {digest:016x}, invariants kept",
                            v.replicas.len()
                        )
                    })
                    .collect();
                return Check::new("replicas agree", true, detail.join("; "));
            }
            Some(p) if Instant::now() >= deadline => {
                return Check::new("replicas agree", false, format!("after {limit:?}: {p}"));
            }
            Some(_) => sleep(Duration::from_millis(500)).await,
        }
    }
}
