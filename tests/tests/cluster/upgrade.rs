//! Upgrades keep every message: today's binary starts on the data directories an earlier
//! release wrote (`tests/fixtures/upgrade/<release>/`, made by that release's
//! `make-upgrade-fixture` example) and finds everything that release recorded: definitions,
//! password hashes, policies, queues with their arguments, every ready message with its
//! properties, headers and x-death history, in order, and the message held under a lease.
//! The cluster then serves as usual, and every node reports its release in ClusterStatus.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, ensure};
use qq_client::v1;
use qq_tests::{ClusterOptions, RaftSettings, TestCluster, fixture, info};

/// The releases with a committed fixture.
fn fixtures() -> anyhow::Result<Vec<PathBuf>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upgrade");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .with_context(|| format!("read {}", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("data.tar.gz").is_file())
        .collect();
    dirs.sort();
    ensure!(!dirs.is_empty(), "no fixture under {}", root.display());
    Ok(dirs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn todays_binary_finds_everything_an_earlier_release_wrote() -> anyhow::Result<()> {
    for dir in fixtures()? {
        let release = dir.file_name().unwrap_or_default().to_string_lossy();
        info!(%release, "--- starting on the data of release {release}");
        let work = tempfile::tempdir()?;
        let tar = Command::new("tar")
            .arg("-xzf")
            .arg(dir.join("data.tar.gz"))
            .arg("-C")
            .arg(work.path())
            .status()?;
        ensure!(tar.success(), "tar: {tar}");
        let options = ClusterOptions {
            data_dir_for: (1..=3)
                .map(|id| (id, work.path().join(format!("node{id}"))))
                .collect(),
            ..Default::default()
        };
        let cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
        let admin = cluster.client(1).await?;
        // The fixture's logs hold entries (it stops without a snapshot of every group): each
        // node converted its log to layout 2, and everything below was read through it.
        for id in cluster.ids() {
            let log = std::fs::read_to_string(cluster.log_path(id))?;
            ensure!(
                log.contains("converted the log's records to this layout"),
                "node {id} did not convert its log from layout 1"
            );
        }
        let then: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("record.json"))?)?;
        let now = fixture::record(&admin).await?;
        fixture::compare(&then, &now).with_context(|| format!("release {release}"))?;

        info!("--- the old password hash still verifies; the cluster serves");
        let (user, password) = fixture::USER;
        let keeper = cluster.client(2).await?.with_credentials(user, password)?;
        let depth = keeper.declare_queue_passive("fx.work").await?.message_count;
        let then_depth = then["queues"]["fx.work"]["messages"].as_u64();
        ensure!(Some(depth) == then_depth, "fx.work holds {depth}");
        let message = v1::Message {
            body: b"after the upgrade".to_vec().into(),
            ..Default::default()
        };
        keeper.publish("fx.topic", "work.new", message).await?;
        let bodies = super::drain_exactly(&admin, "fx.work", depth as usize + 1).await?;
        ensure!(
            bodies.last().map(String::as_str) == Some("after the upgrade"),
            "the new message comes last: {bodies:?}"
        );

        info!("--- every node reports its release");
        let status = admin.cluster_status().await?;
        for n in &status.nodes {
            ensure!(
                n.reachable && n.version == env!("CARGO_PKG_VERSION"),
                "node {}: {n:?}",
                n.id
            );
        }
        cluster.stop();
    }
    Ok(())
}
