//! Writes the upgrade fixture of the current release: `cargo run -p qq-tests --example
//! make-upgrade-fixture -- OUT_DIR` (the qq-node binary as for the tests: `QQ_NODE_BIN`, or the
//! workspace's debug build). OUT_DIR receives `data.tar.gz` (the data directories `node1`,
//! `node2`, `node3` of a three-node cluster, stopped cleanly) and `record.json` (what the
//! cluster held, see `qq_tests::fixture`). Commit both under `tests/fixtures/upgrade/<version>/`
//! when a release is made; the `upgrade` test then checks every later binary against them.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use qq_tests::{ClusterOptions, RaftSettings, TestCluster, fixture};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let out: PathBuf = std::env::args()
        .nth(1)
        .context("usage: make-upgrade-fixture OUT_DIR")?
        .into();
    std::fs::create_dir_all(&out)?;
    let work = tempfile::tempdir()?;
    let options = ClusterOptions {
        data_dir_for: (1..=3)
            .map(|id| (id, work.path().join(format!("node{id}"))))
            .collect(),
        ..Default::default()
    };
    // Snapshots every 100 entries (the least a node takes): with what `populate` writes, the
    // data holds queue and metadata snapshots as well as log entries after them, so both
    // formats are read back.
    let settings = RaftSettings {
        snapshot_after_entries: 100,
        ..Default::default()
    };
    let mut cluster = TestCluster::start_with_options(3, settings, options).await?;
    let admin = cluster.client(1).await?;
    fixture::populate(&admin).await?;
    let record = fixture::record(&admin).await?;
    for id in [3, 2, 1] {
        let status = cluster.terminate(id, Duration::from_secs(60)).await?;
        ensure!(status.success(), "node {id} stopped with {status}");
    }
    cluster.stop();
    std::fs::write(
        out.join("record.json"),
        serde_json::to_string_pretty(&record)? + "\n",
    )?;
    let tar = Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "-czf"])
        .arg(out.join("data.tar.gz"))
        .args(["-C"])
        .arg(work.path())
        .args(["node1", "node2", "node3"])
        .status()?;
    ensure!(tar.success(), "tar: {tar}");
    println!("written: {}", out.display());
    Ok(())
}
