//! A rolling upgrade keeps every message: a three-node cluster of the previous release
//! (its `qq-node` at `$QQ_PREVIOUS_NODE_BIN`, which `make previous-release` builds from the
//! release's commit) serves a publisher and a consumer while its nodes are replaced one at a
//! time by today's binary (SIGTERM, then a start on the same data). Nothing confirmed is lost,
//! nothing arrives that was not published, and the queue's machine moves to today's version
//! only once the last node runs today's binary (`quorumq_queue_machine_version`), as does the
//! metadata machine (`quorumq_metadata_machine_version`: exchange-to-exchange bindings are
//! refused while the cluster is mixed, accepted after).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use qq_client::Client;
use qq_tests::{ClusterOptions, RaftSettings, TestCluster, eventually, info};
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "rolling";
const IDS: [u64; 3] = [1, 2, 3];

/// The previous release's `qq-node`; the test fails (it does not skip) without it.
fn previous_binary() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("QQ_PREVIOUS_NODE_BIN")
        .map(PathBuf::from)
        .context(
            "QQ_PREVIOUS_NODE_BIN is not set: `make previous-release` builds the previous \
         release's qq-node and prints its path (make test sets it)",
        )?;
    ensure!(
        path.is_file(),
        "QQ_PREVIOUS_NODE_BIN={} is not a file",
        path.display()
    );
    Ok(path)
}

/// The number of the high-priority message published through an upgraded node while the
/// cluster is mixed (the load's own numbers never reach it).
const MIXED_HIGH_PRIORITY: u64 = 1 << 40;

/// What the load saw: confirmed publishes and delivered bodies (numbers).
#[derive(Default)]
struct Seen {
    published: BTreeSet<u64>,
    confirmed: BTreeSet<u64>,
    delivered: BTreeSet<u64>,
}

/// A client of the first node in `order` that answers.
async fn any_client(addresses: &[String], start: usize) -> Option<Client> {
    for k in 0..addresses.len() {
        let address = &addresses[(start + k) % addresses.len()];
        if let Ok(c) = Client::connect(address).await {
            return Some(c);
        }
    }
    None
}

/// Publishes numbered messages one at a time, each until it is confirmed (a failed one is
/// published again through the next node: a message may arrive twice, never not at all),
/// every third with priority 9.
async fn publish(addresses: Vec<String>, seen: Arc<Mutex<Seen>>, stop: CancellationToken) {
    let mut n = 0u64;
    let mut at = 0usize;
    let mut client = None;
    while !stop.is_cancelled() {
        if client.is_none() {
            client = any_client(&addresses, at).await;
        }
        let Some(c) = &client else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        seen.lock().unwrap().published.insert(n);
        // Every third one high-priority: while the cluster is mixed the queue's machine is at
        // version 1, and the node stores it as a plain enqueue (a refused one never confirms).
        let priority = if n % 3 == 0 { 9 } else { 0 };
        let message = qq_client::MessageBuilder::new(n.to_string().into_bytes())
            .priority(priority)
            .build();
        match c.publish("", QUEUE, message).await {
            Ok(confirm) if confirm.is_confirmed() => {
                seen.lock().unwrap().confirmed.insert(n);
                n += 1;
            }
            _ => {
                // Its node is going or gone: the same number again through the next one.
                at += 1;
                client = None;
            }
        }
    }
}

/// Consumes and acks, resubscribing through the next node when the stream breaks.
async fn consume(addresses: Vec<String>, seen: Arc<Mutex<Seen>>, stop: CancellationToken) {
    let mut at = 0usize;
    while !stop.is_cancelled() {
        let Some(c) = any_client(&addresses, at).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        at += 1;
        let Ok(mut consumer) = c.consume(QUEUE, 50).await else {
            continue;
        };
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                d = consumer.next_timeout(Duration::from_secs(2)) => d,
            };
            match next {
                Ok(Some(d)) => {
                    let body = qq_client::delivery_body(&d);
                    if let Some(n) = std::str::from_utf8(&body).ok().and_then(|s| s.parse().ok()) {
                        seen.lock().unwrap().delivered.insert(n);
                    }
                    if consumer.ack(d.delivery_tag, false).await.is_err() {
                        break;
                    }
                }
                Ok(None) => {} // quiet for 2 s: keep waiting
                Err(_) => break,
            }
        }
    }
}

/// Waits until every node reports `version` for `queue`.
pub async fn wait_machine_version(
    cluster: &TestCluster,
    queue: &str,
    version: u64,
) -> anyhow::Result<()> {
    for id in cluster.ids() {
        eventually(
            &format!("node {id} to report machine version {version} for {queue}"),
            Duration::from_secs(30),
            || async move {
                Ok((machine_version(cluster, id, queue).await? == Some(version)).then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}

/// `queue`'s machine version on node `id`, from its metrics (None: not reported there).
async fn machine_version(
    cluster: &TestCluster,
    id: u64,
    queue: &str,
) -> anyhow::Result<Option<u64>> {
    let (status, text) = cluster.http_get(id, "/metrics").await?;
    ensure!(status == 200, "GET /metrics on node {id}: {status}");
    Ok(text
        .lines()
        .filter(|l| l.starts_with("quorumq_queue_machine_version{"))
        .find(|l| l.contains(&format!("queue=\"{queue}\"")))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_under_load_loses_nothing() -> anyhow::Result<()> {
    let previous = previous_binary()?;
    let options = ClusterOptions {
        binary_for: IDS.iter().map(|id| (*id, previous.clone())).collect(),
        extra_config: vec!["per_queue_metrics = true".into()],
        ..Default::default()
    };
    let mut cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
    cluster
        .client(1)
        .await?
        .declare_queue(QUEUE, Default::default())
        .await?;
    let addresses: Vec<String> = IDS
        .iter()
        .map(|id| cluster.address(*id).to_string())
        .collect();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = CancellationToken::new();
    let publisher = tokio::spawn(publish(addresses.clone(), seen.clone(), stop.clone()));
    let consumer = tokio::spawn(consume(addresses, seen.clone(), stop.clone()));

    let confirmed = || seen.lock().unwrap().confirmed.len();
    for id in IDS {
        // Some load on the cluster as it is before each step.
        let before = confirmed();
        eventually(
            &format!("100 more confirms before node {id} is upgraded"),
            Duration::from_secs(60),
            || async { Ok((confirmed() >= before + 100).then_some(())) },
        )
        .await?;
        if id == 3 {
            // Two nodes run today's binary, one the previous release: the queue stays on the
            // previous machine (the node not upgraded could not decode today's commands).
            for upgraded in [1, 2] {
                let v = machine_version(&cluster, upgraded, QUEUE).await?;
                ensure!(
                    v == Some(1),
                    "node {upgraded} reports machine version {v:?} while node 3 runs the previous release"
                );
            }
            // A high-priority publish through an upgraded node while the queue's machine is at
            // version 1 (whichever node leads): stored, as a plain enqueue, and confirmed.
            let n = MIXED_HIGH_PRIORITY;
            seen.lock().unwrap().published.insert(n);
            let message = qq_client::MessageBuilder::new(n.to_string().into_bytes())
                .priority(9)
                .build();
            let confirm = cluster.client(1).await?.publish("", QUEUE, message).await?;
            ensure!(
                confirm.is_confirmed(),
                "a high-priority publish while mixed: {confirm:?}"
            );
            seen.lock().unwrap().confirmed.insert(n);
            // The metadata machine stays at version 1 too: a command of version 2 is refused
            // by name, before anything is proposed.
            let e = cluster
                .client(1)
                .await?
                .bind_exchange("amq.fanout", "amq.direct", "", Default::default())
                .await
                .expect_err("an exchange binding while the cluster is mixed");
            ensure!(
                e.code() == tonic::Code::FailedPrecondition
                    && e.to_string().contains("metadata machine version 2"),
                "an exchange binding while mixed: {e}"
            );
        }
        info!(
            node = id,
            "--- upgrading node {id}: SIGTERM, then today's binary"
        );
        let status = cluster.terminate(id, Duration::from_secs(30)).await?;
        ensure!(status.success(), "node {id} stopped with {status}");
        cluster.set_binary(id, None);
        cluster.restart(id).await?;
    }
    let before = confirmed();
    eventually(
        "100 more confirms once every node runs today's binary",
        Duration::from_secs(60),
        || async { Ok((confirmed() >= before + 100).then_some(())) },
    )
    .await?;
    info!("--- every node runs today's binary: the queue's machine moves on");
    wait_machine_version(&cluster, QUEUE, 2).await?;
    info!("--- and the metadata machine: exchange-to-exchange bindings are accepted");
    cluster
        .wait_metric_line_everywhere(
            "quorumq_metadata_machine_version 2",
            "the metadata machine at version 2",
        )
        .await?;
    cluster
        .client(2)
        .await?
        .bind_exchange("amq.fanout", "amq.direct", "", Default::default())
        .await?;

    stop.cancel();
    publisher.await?;
    // Everything confirmed is delivered: the consumer drains what is left.
    let drain = CancellationToken::new();
    let addresses: Vec<String> = IDS
        .iter()
        .map(|id| cluster.address(*id).to_string())
        .collect();
    let draining = tokio::spawn(consume(addresses, seen.clone(), drain.clone()));
    consumer.abort();
    let missing = || {
        let s = seen.lock().unwrap();
        s.confirmed.difference(&s.delivered).count()
    };
    let drained = eventually(
        "every confirmed message delivered",
        Duration::from_secs(60),
        || async { Ok((missing() == 0).then_some(())) },
    )
    .await;
    drain.cancel();
    let _ = draining.await;
    let s = seen.lock().unwrap();
    let lost: Vec<&u64> = s.confirmed.difference(&s.delivered).collect();
    let unexpected: Vec<&u64> = s.delivered.difference(&s.published).collect();
    info!(
        confirmed = s.confirmed.len(),
        delivered = s.delivered.len(),
        lost = lost.len(),
        unexpected = unexpected.len(),
        "rolling upgrade checked"
    );
    if drained.is_err() || !lost.is_empty() || !unexpected.is_empty() {
        bail!(
            "lost {} of {} confirmed (first {:?}), unexpected {:?}",
            lost.len(),
            s.confirmed.len(),
            lost.iter().take(10).collect::<Vec<_>>(),
            unexpected
        );
    }
    drop(s);
    cluster.stop();
    Ok(())
}
