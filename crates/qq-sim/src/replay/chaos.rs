//! The chaos workload as the replay's client ([`super::Program::Chaos`]): what the real-time
//! runs do (`crate::run`), the membership change and the wiped disk included
//! ([`super::operator`]); over gRPC only.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use qq_chaos::checker;
use qq_chaos::probes::{replica_agreement, wait_formed};
use qq_chaos::session::Session;
use qq_chaos::workload::{self, Protocol};
use qq_client::Client;
use tokio::time::Instant;

use super::operator::Operator;
use super::{Trace, check_line};

/// Messages per second over all publishers, and unconfirmed publishes each may have in flight:
/// `make sim`'s defaults.
const RATE: f64 = 150.0;
const PUBLISH_CONCURRENCY: usize = 64;

/// What the client runs besides the workload: the plan's idle queues, churn route, length,
/// membership change and wipe.
pub(super) struct Run {
    pub(super) idle: usize,
    pub(super) first_route: u64,
    pub(super) length: Duration,
    pub(super) operator: Operator,
}

/// Runs the workload for `run.length` (the faults strike meanwhile, and are all healed by its
/// end), then its checks; every step and check goes into the trace.
pub(super) async fn client(clients: Vec<Client>, trace: Trace, run: Run) {
    let Run {
        idle,
        first_route,
        length,
        operator,
    } = run;
    let start = Instant::now();
    let note = |what: String| {
        let at = start.elapsed().as_millis();
        trace.lock().expect("trace").push(format!("{at:>6} {what}"));
    };
    let clients = Arc::new(clients);
    note(format!(
        "formed: {:?}",
        wait_formed(&clients, Duration::from_secs(60))
            .await
            .map_err(|e| e.to_string())
    ));
    loop {
        match workload::declare(&clients[0]).await {
            Ok(()) => break,
            Err(e) => note(format!("declare the topology: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let declared = qq_chaos::idle::declare(&clients, idle).await;
    note(format!("declare {idle} idle queues: {declared:?}"));
    let mut session = Session::start(
        Protocol::Grpc,
        clients.clone(),
        Vec::new(),
        RATE,
        PUBLISH_CONCURRENCY,
    );
    let rec = session.rec.clone();
    let churn_stop = Arc::new(AtomicBool::new(false));
    let churn = tokio::spawn(crate::churn::run(
        clients.clone(),
        first_route,
        churn_stop.clone(),
    ));
    let membership = operator.change_membership(clients.clone(), rec.clone(), start);
    tokio::time::sleep_until(start + length).await;
    session.stop_publishing();
    churn_stop.store(true, Ordering::Relaxed);
    note("the run is over: publishing stops, every fault is healed".into());
    let mut checks = vec![session.healthy().await];
    checks.push(qq_chaos::idle::check(&clients, idle).await);
    checks.push(match churn.await {
        Ok(check) => check,
        Err(e) => checker::Check::new("topology churn", false, format!("panicked: {e}")),
    });
    if let Some(task) = membership {
        checks.push(task.await.unwrap_or_else(|e| {
            checker::Check::new("membership change carried out", false, format!("{e}"))
        }));
        note("membership change over".into());
    }
    if let Some(check) = operator.wipe(&clients).await {
        checks.push(check);
        note("wipe over".into());
    }
    session.finish_publishers().await;
    checks.extend(session.drain().await);
    checks.push(replica_agreement(&clients, Duration::from_secs(30)).await);
    let mut verdict = checker::check(&rec.take());
    verdict.checks.extend(checks);
    let c = &verdict.counts;
    note(format!(
        "counts: {} confirmed, {} lost, {} unexpected, {} dead-lettered, {} acked",
        c.confirmed, c.lost, c.unexpected, c.dead_lettered, c.acked
    ));
    for check in &verdict.checks {
        note(check_line(&check.name, check.ok, &check.detail));
    }
}
