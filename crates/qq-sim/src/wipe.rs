//! A lost disk: once the faults are healed and every replica agrees, a node of a third of the
//! seeds is crashed, its data directory deleted, and started again empty. It must hold its
//! votes, be re-seeded by a peer as a new member (forgotten, joined again, its replicas added
//! back) and vote again; the run's later checks (nothing confirmed lost, replicas agree) then
//! cover its new replicas too.

use std::time::Duration;

use qq_chaos::checker::Check;
use qq_chaos::probes::replica_agreement;
use qq_client::Client;
use tokio::time::{Instant, sleep};

use crate::faults::Cluster;

/// How long the re-seed may take (the node's replicas catch up under the drain).
pub(crate) const RESEED_LIMIT: Duration = Duration::from_secs(90);

/// What the node logs on the way ([`qq_node`]'s `node::incarnation`).
const HELD: &str = "votes held until the cluster accepts it";
const RESEEDING: &str = "re-seeding it as a new member";
const ACCEPTED: &str = "data directory accepted: this node votes";

/// Wipes node `node` and waits for its re-seed; the check says how it went.
pub async fn wipe_and_reseed(cluster: &mut Cluster, node: u64, clients: &[Client]) -> Check {
    let name = check_name(node);
    if let Some(failed) = disagree_before(node, clients).await {
        return failed;
    }
    let net = cluster.net.clone();
    let Some(host) = cluster.hosts.iter_mut().find(|h| h.id == node) else {
        return Check::new(&name, false, format!("no node {node}"));
    };
    let from = host.log_len();
    // Ending a node joins its thread: not on a worker the clients need.
    let wiped = tokio::task::block_in_place(|| host.crash())
        .and_then(|_cut| host.wipe())
        .and_then(|()| host.start(&net));
    if let Err(e) = wiped {
        return Check::new(&name, false, format!("{e:#}"));
    }
    let host = &*host;
    match await_reseed(node, || host.log_after(from)).await {
        Some(check) => check,
        None => Check::new(
            &name,
            false,
            format!(
                "not re-seeded within {RESEED_LIMIT:?}; its log ends:\n{}",
                host.log_tail(20)
            ),
        ),
    }
}

/// The name of the check on node `node`'s wipe.
pub(crate) fn check_name(node: u64) -> String {
    format!("wipe: node {node} lost its disk and was re-seeded as a new member")
}

/// Before a wipe: None when every replica agrees (a wipe may begin), else the failed check.
pub(crate) async fn disagree_before(node: u64, clients: &[Client]) -> Option<Check> {
    let agreed = replica_agreement(clients, Duration::from_secs(30)).await;
    (!agreed.ok).then(|| {
        let detail = format!("replicas never agreed before the wipe: {}", agreed.detail);
        Check::new(&check_name(node), false, detail)
    })
}

/// Waits, on tokio's clock, up to [`RESEED_LIMIT`] for wiped node `node` to vote again,
/// reading what it logged since its restart (`logged_since`) every 200 ms; the check on its
/// milestones then, or None if it never voted again.
pub(crate) async fn await_reseed(node: u64, logged_since: impl Fn() -> String) -> Option<Check> {
    let began = Instant::now();
    while began.elapsed() < RESEED_LIMIT {
        let log = logged_since();
        if log.contains(ACCEPTED) {
            let ok = log.contains(HELD) && log.contains(RESEEDING);
            let how = if ok {
                "held its votes, re-seeded"
            } else {
                "voted again WITHOUT a re-seed"
            };
            let took = began.elapsed().as_secs_f64();
            let detail = format!("{how}, votes again after {took:.1} s");
            return Some(Check::new(&check_name(node), ok, detail));
        }
        sleep(Duration::from_millis(200)).await;
    }
    None
}
