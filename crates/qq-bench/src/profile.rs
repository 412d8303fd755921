//! Where the quorumq leader spends its CPU under scenario 1's load: a `perf record` of the
//! leader process while one publisher and one consumer run, summarised as the top symbols
//! (self time). The closing note of a run quotes it, so a missed target comes with its profile.
//!
//! Taken after the measured scenarios, in a run of its own, so sampling never perturbs a
//! number in the table. Needs `perf` (Debian's linux-perf); without it the note says so.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::cluster::{Cluster, NODES};
use crate::driver::Conn;
use crate::scenarios::{self, Settings};

const PROFILE_S: u64 = 10;
const TOP_SYMBOLS: usize = 25;

pub async fn profile_leader(cl: &mut Cluster, s: &Settings) -> Result<String> {
    if Command::new("perf").arg("--version").output().is_err() {
        bail!("perf is not installed (apt-get install linux-perf)");
    }
    let pids: Vec<Option<u32>> = (0..NODES).map(|n| cl.pid(n)).collect();
    let system = cl.system();
    let data = std::env::temp_dir().join(format!("qq-bench-perf-{}.data", std::process::id()));
    let data_path = data.clone();
    let recorder = tokio::spawn(async move {
        // Let the load start, then find the queue's leader and sample it.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let conn = Conn::connect(system, 0).await?;
        let Conn::Qq(client) = conn else {
            bail!("not a quorumq cluster")
        };
        let leader = client.get_queue("bench-throughput").await?.leader as usize;
        let pid = pids
            .get(leader.wrapping_sub(1))
            .copied()
            .flatten()
            .context("leader pid")?;
        let out = tokio::process::Command::new("perf")
            .args(["record", "-F", "499", "-g", "-o"])
            .arg(&data_path)
            .args([
                "-p",
                &pid.to_string(),
                "--",
                "sleep",
                &PROFILE_S.to_string(),
            ])
            .output()
            .await
            .context("run perf record")?;
        if !out.status.success() {
            bail!(
                "perf record failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        anyhow::Ok(leader)
    });
    let load = Settings {
        warmup_s: 1.0,
        throughput_s: PROFILE_S as f64 + 4.0,
        ..s.clone()
    };
    eprintln!("--- profile: perf record of the quorumq leader under scenario 1 load");
    let _ = scenarios::throughput(cl, &load).await?;
    let leader = recorder.await??;
    let out = Command::new("perf")
        .args(["report", "--no-children", "--stdio", "-g", "none"])
        .args(["--sort", "dso,symbol", "--percent-limit", "0.5", "-i"])
        .arg(&data)
        .output()
        .context("run perf report")?;
    let _ = std::fs::remove_file(&data);
    let text = String::from_utf8_lossy(&out.stdout);
    let top: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
        .take(TOP_SYMBOLS)
        // perf pads each line to the width it assumes for the terminal.
        .map(|l| l.trim_end_matches([' ', '-']))
        .collect();
    if top.is_empty() {
        bail!("perf report printed no samples");
    }
    Ok(format!(
        "node {leader} (leader), {PROFILE_S} s at 499 Hz, self time:\n{}",
        top.join("\n")
    ))
}
