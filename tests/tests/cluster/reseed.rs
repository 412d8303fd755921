//! Story: a node's data directory is damaged while it is down. It refuses to start and says
//! how to re-seed it from its peers; the operator follows that advice (move the directory
//! aside, start with an empty one). On its new directory the node holds its votes, is
//! re-seeded as a new member (forgotten, joined again, its replica given back), catches up with
//! what was published while it was gone, and then carries a majority with one other node:
//! nothing confirmed is lost. Node 1 is the one wiped, because it is the node that initialises the cluster on a
//! first start and must not do so again over a running cluster.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use qq_client::{Client, message};
use qq_tests::{ClusterOptions, RaftSettings, TestCluster, info, tail};

use crate::body;

/// Publishes `range` to `queue` with confirms; every one must be confirmed.
async fn publish_all(c: &Client, queue: &str, range: std::ops::Range<u64>) -> anyhow::Result<()> {
    let mut publisher = c.publisher(64).await?;
    for i in range.clone() {
        publisher
            .send("", queue, message(format!("{i:06}")))
            .await?;
    }
    let confirms = publisher.close().await?;
    ensure!(
        confirms.len() == range.clone().count() && confirms.iter().all(|c| c.is_confirmed()),
        "not every publish of {range:?} was confirmed: {:?}",
        confirms.iter().find(|c| !c.is_confirmed())
    );
    Ok(())
}

/// Overwrites every MANIFEST file of the RocksDB under `data_dir` with garbage of the same
/// length (a torn or scribbled metadata file; a truncated one can end on a record boundary
/// and still open).
fn scribble_manifests(data_dir: &Path) -> anyhow::Result<usize> {
    let db = data_dir.join("db");
    let mut n = 0;
    for entry in std::fs::read_dir(&db).with_context(|| format!("read {}", db.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        if name.starts_with("MANIFEST-") {
            let len = std::fs::metadata(&path)?.len();
            std::fs::write(&path, vec![0xab; len as usize])?;
            n += 1;
        }
    }
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_node_refuses_to_start_and_reseeds_from_its_peers() -> anyhow::Result<()> {
    let data = tempfile::tempdir()?;
    let node1_data: PathBuf = data.path().join("node1");
    let options = ClusterOptions {
        data_dir_for: vec![(1, node1_data.clone())],
        ..Default::default()
    };
    let mut cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
    let c2 = cluster.client(2).await?;
    c2.declare_queue("reseed.q", Default::default()).await?;
    let members = c2.get_queue("reseed.q").await?.members;
    ensure!(
        members.contains(&1),
        "node 1 must hold a replica: {members:?}"
    );
    publish_all(&c2, "reseed.q", 0..300).await?;
    // Node 1 records its data directory in the metadata within seconds of forming the
    // cluster; a directory lost before that would be taken for a new node's.
    let log_path = cluster.log_path(1).to_path_buf();
    qq_tests::eventually(
        "node 1 to record its data directory",
        Duration::from_secs(30),
        || {
            let log_path = log_path.clone();
            async move {
                let log = std::fs::read_to_string(&log_path)?;
                Ok(log.contains("data directory recorded").then_some(()))
            }
        },
    )
    .await?;

    info!("--- node 1 stops cleanly; its RocksDB MANIFEST is overwritten with garbage");
    let status = cluster.terminate(1, Duration::from_secs(30)).await?;
    ensure!(status.success(), "node 1 did not stop cleanly: {status}");
    let damaged = scribble_manifests(&node1_data)?;
    ensure!(
        damaged > 0,
        "no MANIFEST file under {}",
        node1_data.display()
    );

    info!("--- node 1 refuses to start and says how to re-seed it");
    cluster.start_node(1)?;
    let code = cluster.wait_exit(1, Duration::from_secs(30)).await?;
    let log = tail(cluster.log_path(1), 40);
    ensure!(
        code.is_some_and(|c| c != 0),
        "node 1 exited with {code:?}; log:\n{log}"
    );
    ensure!(
        log.contains("re-seed this node from its peers") && log.contains("empty data directory"),
        "node 1's refusal does not say how to re-seed it:\n{log}"
    );

    info!("--- publishing goes on while node 1 is down");
    publish_all(&c2, "reseed.q", 300..600).await?;

    info!("--- the procedure: move the directory aside, start with an empty one");
    let aside = data.path().join("node1.damaged");
    std::fs::rename(&node1_data, &aside)?;
    // The log goes on from node 1's earlier runs, whose first start (a new directory too)
    // held and released its votes: only what follows counts.
    let restarted_at = qq_tests::log_len(&log_path);
    cluster.restart(1).await?;
    let c1 = cluster.client(1).await?;
    let status = c1.cluster_status().await?;
    ensure!(
        status.metadata_leader != 0,
        "node 1 sees no metadata leader"
    );
    // Node 1's id ran on another directory, whose data is gone: it holds its votes and is
    // re-seeded as a new member (forgotten, joined again, its replica added back and caught
    // up) before it counts again. The metadata came back by replication: node 1 knows the
    // queue it never declared, and is a member of it again.
    qq_tests::eventually(
        "node 1 to be re-seeded and a member of reseed.q again",
        Duration::from_secs(90),
        || {
            let (c1, log_path) = (c1.clone(), log_path.clone());
            async move {
                let log = qq_tests::log_since(&log_path, restarted_at);
                if !log.contains("data directory accepted: this node votes") {
                    return Ok(None);
                }
                ensure!(
                    log.contains("votes held until the cluster accepts it")
                        && log.contains("re-seeding it as a new member"),
                    "node 1 voted again without a re-seed:\n{}",
                    tail(&log_path, 40)
                );
                let info = c1.get_queue("reseed.q").await?;
                Ok(info.members.contains(&1).then_some(()))
            }
        },
    )
    .await?;

    info!("--- node 1 and node 3 alone (node 2 stopped) still hold every confirmed message");
    cluster.kill9(2);
    let c3 = cluster.client(3).await?;
    cluster.leader_of_except("reseed.q", 2).await?;
    let mut seen = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < 600 && tokio::time::Instant::now() < deadline {
        match c3.get("reseed.q", true, 0).await {
            Ok(r) => match r.delivery {
                Some(d) => {
                    let n: u64 = body(&d).parse().context("message number")?;
                    ensure!(seen.insert(n), "message {n} delivered twice");
                }
                None => break,
            },
            // A leader election between nodes 1 and 3 may still be under way.
            Err(e) if e.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let missing: Vec<u64> = (0..600).filter(|n| !seen.contains(n)).collect();
    ensure!(
        missing.is_empty(),
        "{} confirmed messages missing after the re-seed, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    Ok(())
}
