//! The chaos workload as the replay's client ([`super::Program::Chaos`]): what the real-time
//! runs do (`crate::run`), without the membership change, the wiped disk and AMQP.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use qq_chaos::checker;
use qq_chaos::probes::{replica_agreement, wait_formed};
use qq_chaos::session::Session;
use qq_chaos::workload::{self, Protocol};
use qq_client::Client;
use tokio::time::Instant;

use super::{Trace, check_line};

/// Messages per second over all publishers, and unconfirmed publishes each may have in flight:
/// `make sim`'s defaults.
const RATE: f64 = 150.0;
const PUBLISH_CONCURRENCY: usize = 64;

/// Runs the workload for `length` (the faults strike meanwhile, and are all healed by its
/// end), then its checks; every step and check goes into the trace.
pub(super) async fn client(
    clients: Vec<Client>,
    trace: Trace,
    idle: usize,
    first_route: u64,
    length: Duration,
) {
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
