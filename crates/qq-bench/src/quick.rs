//! `make bench-quick`: the check to run before merging a change on the hot path (issue 35).
//!
//! quorumq alone, over gRPC: scenario 1 (one queue, window 1 000, prefetch 1 000, 1 KiB
//! persistent messages, confirms and acks) and scenario 2 (publish→confirm and publish→deliver
//! at a fixed rate, 4 000 msg/s unless `--latency-rate` says otherwise), `--runs` times on one
//! cluster. It prints every run, the medians, and the medians' ratio to a baseline file measured
//! on this machine earlier (`--save-baseline` writes one). A ratio, never a verdict: the
//! machines are shared and noisy, so a change is suspect when its ratio stays low over several
//! runs, not when one number moves. Nothing here is a test that can fail a build.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::cluster::Cluster;
use crate::scenarios::{self, Outcome, Settings};

/// The figures compared, as `(scenario, figure name, unit)`.
const FIGURES: [(u8, &str, &str); 4] = [
    (1, "delivered+acked", "msg/s"),
    (1, "confirmed", "msg/s"),
    (2, "confirm p99", "ms"),
    (2, "deliver p99", "ms"),
];

/// One figure over the runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Series {
    pub scenario: u8,
    pub name: String,
    pub values: Vec<f64>,
    pub median: Option<f64>,
}

/// What a quick check measured (and what a baseline file holds).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QuickResult {
    pub started: String,
    pub commit: String,
    pub latency_rate: f64,
    pub runs: usize,
    pub series: Vec<Series>,
}

/// The middle value (the mean of the middle two for an even count).
fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Runs scenarios 1 and 2 `runs` times on the quorumq cluster.
pub async fn measure(
    cl: &mut Cluster,
    settings: &Settings,
    runs: usize,
    rate: f64,
    started: String,
) -> Result<QuickResult> {
    let mut series: Vec<Series> = FIGURES
        .iter()
        .map(|(scenario, name, _)| Series {
            scenario: *scenario,
            name: name.to_string(),
            values: Vec::new(),
            median: None,
        })
        .collect();
    for run in 1..=runs {
        eprintln!("--- quick check, run {run} of {runs}");
        let one = scenarios::throughput(cl, settings).await?;
        let two = scenarios::latency(cl, settings, rate).await?;
        for s in &mut series {
            let outcome: &Outcome = if s.scenario == 1 { &one } else { &two };
            if let Some(v) = outcome.value(&s.name) {
                eprintln!("  run {run}: {} {} = {v:.2}", s.scenario, s.name);
                s.values.push(v);
            }
        }
    }
    for s in &mut series {
        s.median = median(&s.values);
    }
    Ok(QuickResult {
        started,
        commit: git_commit(),
        latency_rate: rate,
        runs,
        series,
    })
}

/// The table: each run, the median, the baseline's median and the ratio (now / baseline, so
/// above 1 is faster for rates and slower for latencies).
pub fn table(now: &QuickResult, baseline: Option<&QuickResult>) -> String {
    let mut out = format!(
        "quick check of {} ({} runs, scenario 2 at {:.0} msg/s){}\n\n",
        now.commit,
        now.runs,
        now.latency_rate,
        baseline.map_or(String::new(), |b| format!(
            ", against the baseline of {} ({})",
            b.commit, b.started
        ))
    );
    out.push_str(&format!(
        "{:<28} {:>28} {:>10} {:>10} {:>8}\n",
        "figure", "runs", "median", "baseline", "ratio"
    ));
    for s in &now.series {
        let unit = FIGURES
            .iter()
            .find(|(n, name, _)| *n == s.scenario && *name == s.name)
            .map_or("", |f| f.2);
        let runs: Vec<String> = s.values.iter().map(|v| format!("{v:.1}")).collect();
        let base = baseline
            .and_then(|b| {
                b.series
                    .iter()
                    .find(|x| x.scenario == s.scenario && x.name == s.name)
            })
            .and_then(|x| x.median);
        let ratio = match (s.median, base) {
            (Some(m), Some(b)) if b > 0.0 => format!("{:.2}x", m / b),
            _ => "-".into(),
        };
        out.push_str(&format!(
            "{:<28} {:>28} {:>10} {:>10} {:>8}\n",
            format!("{} {} ({unit})", s.scenario, s.name),
            runs.join(" "),
            s.median.map_or("n/a".into(), |m| format!("{m:.1}")),
            base.map_or("-".into(), |b| format!("{b:.1}")),
            ratio
        ));
    }
    out.push_str(
        "\nratio = median now / baseline median: above 1 is faster for msg/s, slower for ms.\n",
    );
    out
}

pub fn read(path: &Path) -> Result<Option<QuickResult>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let r = serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    Ok(Some(r))
}

pub fn write(path: &Path, r: &QuickResult) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(r)?)
        .with_context(|| format!("write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(values: &[f64]) -> QuickResult {
        QuickResult {
            started: "t".into(),
            commit: "c".into(),
            latency_rate: 4000.0,
            runs: values.len(),
            series: vec![Series {
                scenario: 1,
                name: "delivered+acked".into(),
                values: values.to_vec(),
                median: median(values),
            }],
        }
    }

    #[test]
    fn the_table_shows_the_median_against_the_baseline() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        let now = result(&[30000.0, 27000.0, 33000.0]);
        let base = result(&[20000.0, 21000.0, 19000.0]);
        let t = table(&now, Some(&base));
        assert!(t.contains("30000.0"), "{t}");
        assert!(t.contains("1.50x"), "{t}");
        assert!(table(&now, None).contains(" -\n"), "{}", table(&now, None));
    }
}
