//! Story: SIGTERM under load stops a node cleanly, and nothing confirmed is lost.
//!
//! Publishers write to a queue through every node while a consumer holds unacked deliveries of
//! a second queue through the node that is then stopped with SIGTERM (it leads the first
//! queue). The node must exit on its own with status 0 within the grace period, having ended
//! the consumer's stream with UNAVAILABLE (its deliveries return to the queue), failed or
//! finished its in-flight publishes, and logged a clean stop. The cluster keeps confirming
//! meanwhile. The node then restarts on the same data and catches up, and every confirmed
//! message is in the queue.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, ensure};
use qq_client::{Client, PublishOutcome};
use qq_tests::{TestCluster, eventually, info};

const QUEUE: &str = "shutdown.work";
const HELD: &str = "shutdown.held";
const HELD_MESSAGES: usize = 50;
/// Confirms each phase waits for, from the publishers still running.
const CONFIRMS_PER_PHASE: usize = 200;

/// One publisher's record: confirmed ids and the error codes it saw.
#[derive(Default)]
struct Record {
    /// The node it publishes through.
    node: u64,
    confirmed: BTreeSet<String>,
    errors: Vec<tonic::Code>,
}

/// Publish `{prefix}-0`, `{prefix}-1`, ... one at a time until `stop`, recording confirms.
/// An error is recorded and the next message is tried after a pause: a node that stopped
/// answers with UNAVAILABLE (or the connection is refused).
async fn publish_until(
    client: Client,
    prefix: String,
    record: Arc<Mutex<Record>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut i = 0usize;
    while !stop.is_cancelled() {
        let body = format!("{prefix}-{i}");
        i += 1;
        match client
            .publish("", QUEUE, qq_client::message(body.clone()))
            .await
        {
            Ok(c) if c.outcome == PublishOutcome::Confirmed => {
                record.lock().unwrap().confirmed.insert(body);
            }
            Ok(c) => panic!("{body} not confirmed: {c:?}"),
            Err(e) => {
                record.lock().unwrap().errors.push(e.code());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Consume (and ack) `count` messages of [`QUEUE`]; their bodies.
async fn consume_all(client: &Client, count: usize) -> anyhow::Result<BTreeSet<String>> {
    let mut consumer = client.consume(QUEUE, 1000).await?;
    let mut got = BTreeSet::new();
    for _ in 0..count {
        let d = consumer
            .next_timeout(Duration::from_secs(30))
            .await?
            .with_context(|| format!("only {} of {count} messages delivered", got.len()))?;
        got.insert(super::body(&d));
        consumer.ack(d.delivery_tag, false).await?;
    }
    consumer.cancel().await?;
    Ok(got)
}

fn confirmed(records: &[Arc<Mutex<Record>>]) -> usize {
    records
        .iter()
        .map(|r| r.lock().unwrap().confirmed.len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_stops_cleanly_and_loses_nothing() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start(3).await?;
    let any = cluster.client(1).await?;
    any.declare_queue(QUEUE, Default::default()).await?;
    any.declare_queue(HELD, Default::default()).await?;
    let victim = cluster.leader_of(QUEUE).await?;
    let survivor = cluster.others(victim)[0];
    info!(victim, survivor, "--- the node to stop leads {QUEUE}");

    info!("--- a consumer through node {victim} holds {HELD_MESSAGES} unacked deliveries");
    for i in 0..HELD_MESSAGES {
        any.publish("", HELD, qq_client::message(format!("h-{i}")))
            .await?;
    }
    let on_victim = cluster.client(victim).await?;
    let mut consumer = on_victim.consume(HELD, HELD_MESSAGES as u32).await?;
    for _ in 0..HELD_MESSAGES {
        consumer
            .next_timeout(Duration::from_secs(30))
            .await?
            .context("a held delivery")?;
    }

    info!("--- publishers through every node");
    let stop = tokio_util::sync::CancellationToken::new();
    let mut records = Vec::new();
    let mut publishers = Vec::new();
    for id in cluster.ids() {
        for k in 0..2 {
            let record = Arc::new(Mutex::new(Record {
                node: id,
                ..Default::default()
            }));
            records.push(record.clone());
            publishers.push(tokio::spawn(publish_until(
                cluster.client(id).await?,
                format!("n{id}.{k}"),
                record,
                stop.clone(),
            )));
        }
    }
    eventually("publishes flowing", Duration::from_secs(30), || {
        let n = confirmed(&records);
        async move { Ok((n >= CONFIRMS_PER_PHASE).then_some(())) }
    })
    .await?;

    info!("--- SIGTERM node {victim} under load");
    let status = cluster.terminate(victim, Duration::from_secs(30)).await?;
    ensure!(status.success(), "node {victim} exited with {status}");
    let ended = consumer.next_timeout(Duration::from_secs(10)).await;
    match ended {
        Err(e) => ensure!(
            e.code() == tonic::Code::Unavailable,
            "consumer stream ended with {e:?}, expected UNAVAILABLE"
        ),
        Ok(d) => anyhow::bail!("consumer stream did not end with UNAVAILABLE: {d:?}"),
    }
    let log = std::fs::read_to_string(cluster.log_path(victim))?;
    ensure!(log.contains("node stopped"), "no clean stop in the log");
    ensure!(
        !log.contains("tasks still running after the shutdown grace period"),
        "a task outlived the shutdown grace period"
    );
    ensure!(
        !log.contains("requests still open"),
        "a request outlived the server's drain"
    );

    info!("--- the cluster keeps confirming without node {victim}");
    let before = confirmed(&records);
    eventually("publishes flowing again", Duration::from_secs(30), || {
        let n = confirmed(&records);
        async move { Ok((n >= before + CONFIRMS_PER_PHASE).then_some(())) }
    })
    .await?;
    stop.cancel();
    for p in publishers {
        p.await?;
    }
    // Through the survivors, a publish fails only with UNAVAILABLE (safe to retry). Through
    // the stopped node, a request the client sent while the node was closing its connection
    // never reached a handler: the client's transport reports it as CANCELLED.
    for r in &records {
        let r = r.lock().unwrap();
        for code in &r.errors {
            let allowed = *code == tonic::Code::Unavailable
                || (r.node == victim && *code == tonic::Code::Cancelled);
            ensure!(
                allowed,
                "a publish through node {} failed with {code:?}; only UNAVAILABLE is expected",
                r.node
            );
        }
    }

    info!("--- restart node {victim} on its data; it catches up");
    cluster.restart(victim).await?;
    let restarted = cluster.client(victim).await?;
    super::wait_caught_up(&restarted, victim, QUEUE).await?;

    info!("--- every confirmed message is in {QUEUE}; the held deliveries returned to {HELD}");
    let want: BTreeSet<String> = records
        .iter()
        .flat_map(|r| r.lock().unwrap().confirmed.clone())
        .collect();
    let q = restarted.get_queue(QUEUE).await?;
    let got = consume_all(&restarted, q.messages as usize).await?;
    let missing: Vec<&String> = want.difference(&got).take(10).collect();
    ensure!(
        missing.is_empty(),
        "{} confirmed messages lost, e.g. {missing:?}",
        want.difference(&got).count()
    );
    eventually("held deliveries returned", Duration::from_secs(30), || {
        let restarted = restarted.clone();
        async move {
            let q = restarted.get_queue(HELD).await?;
            Ok((q.messages_ready == HELD_MESSAGES as u64 && q.consumers == 0).then_some(()))
        }
    })
    .await?;
    info!(confirmed = want.len(), "nothing confirmed was lost");
    cluster.stop();
    Ok(())
}
