//! Story: the disk under one node fills up. The node stops at once, fail-stop: it exits with
//! code 74 (qq_raft's STORAGE_FAULT_EXIT_CODE) and says why in its log, before confirming
//! anything it could not make durable; the other two nodes carry on, and every confirmed
//! message is still there.
//!
//! Needs root (mounts a small tmpfs for that node's data directory), as CI runs.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use qq_tests::{ClusterOptions, RaftSettings, TestCluster, Tmpfs, info, tail};

use crate::body;

/// Exit code of a node stopped by a storage fault (`qq_raft::store::STORAGE_FAULT_EXIT_CODE`).
const STORAGE_FAULT_EXIT_CODE: i32 = 74;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_stops_and_nothing_confirmed_is_lost() -> anyhow::Result<()> {
    let disk = Tmpfs::mount(48)?;
    let node3_data: PathBuf = disk.path().join("node3");
    let options = ClusterOptions {
        data_dir_for: vec![(3, node3_data)],
        // No disk alarm on node 3: its disk must really fill.
        extra_config_for: vec![(3, "disk_free_limit = 0".into())],
        ..Default::default()
    };
    let mut cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
    let c = cluster.client(1).await?;
    c.declare_queue("fill", Default::default()).await?;
    let info = c.get_queue("fill").await?;
    ensure!(
        info.members.contains(&3),
        "node 3 must hold a replica: {info:?}"
    );

    info!("--- publishing 64 KiB messages until node 3's 48 MiB disk is full");
    let pad = "x".repeat(64 * 1024);
    let mut publisher = c.publisher(32).await?;
    let mut confirmed = BTreeSet::new();
    let mut exit = None;
    // 4 000 × 64 KiB = 250 MiB, far more than the disk takes.
    for i in 0..4_000u64 {
        publisher
            .send("", "fill", qq_client::message(format!("{i:08} {pad}")))
            .await?;
        for cf in publisher.take_confirms() {
            if cf.is_confirmed() {
                confirmed.insert(cf.seq - 1);
            }
        }
        if i % 64 == 63 {
            match cluster.wait_exit(3, Duration::ZERO).await {
                Ok(code) => {
                    exit = Some(code);
                    break;
                }
                Err(_) => continue,
            }
        }
    }
    for cf in publisher.close().await? {
        if cf.is_confirmed() {
            confirmed.insert(cf.seq - 1);
        }
    }
    let code = match exit {
        Some(code) => code,
        None => cluster.wait_exit(3, Duration::from_secs(20)).await?,
    };
    let log = tail(cluster.log_path(3), 50);
    ensure!(
        code == Some(STORAGE_FAULT_EXIT_CODE),
        "node 3 exited with {code:?}, not {STORAGE_FAULT_EXIT_CODE}; log:\n{log}"
    );
    ensure!(
        log.contains("storage fault"),
        "node 3's log does not say why it stopped:\n{log}"
    );
    ensure!(!confirmed.is_empty(), "nothing was confirmed");
    info!(
        confirmed = confirmed.len(),
        "--- node 3 stopped; draining through node 1"
    );

    let mut seen = BTreeSet::new();
    loop {
        let r = c.get("fill", true, 0).await?;
        let Some(d) = r.delivery else { break };
        let b = body(&d);
        let n: u64 = b[..8].parse().context("message number")?;
        ensure!(seen.insert(n), "message {n} delivered twice");
    }
    let lost: Vec<_> = confirmed.difference(&seen).collect();
    ensure!(lost.is_empty(), "confirmed messages lost: {lost:?}");
    cluster.stop();
    drop(disk);
    Ok(())
}
