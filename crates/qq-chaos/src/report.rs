//! What a run tells people: a summary for the terminal, a JSON report for tools, and a timeline
//! PNG of throughput and latency with the fault windows shaded.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::full_palette::GREEN_700;
use serde::Serialize;

use crate::checker::Verdict;
use crate::membership::Step;
use crate::nemesis::Kind;
use crate::outcome::{self, NemesisOutcome, Outcome};
use crate::workload::{Action, History, Protocol, SOURCES};

/// How long after a fault ends its effect on confirms is still counted as its own.
const AFTERMATH_MS: u64 = 10_000;

#[derive(Clone, Debug, Serialize)]
pub struct FaultReport {
    pub kind: Kind,
    pub target: String,
    pub start_s: f64,
    pub end_s: f64,
    /// The longest time, from the fault's start until 10 s after it ended, during which a
    /// source queue confirmed no publish: the unavailability the fault caused (failover time
    /// for leader faults).
    pub longest_confirm_gap_ms: u64,
    pub gap_queue: String,
    /// The membership nemesis' steps (join, grow, ..., forget) with their durations.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Step>,
    /// A procedure's steps with their offsets (rolling-restart).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub procedure: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Throughput {
    /// Confirmed publishes per second before the first fault.
    pub before_faults: f64,
    /// ... while a fault was in force.
    pub during_faults: f64,
    /// ... between faults and after the last one (until publishing stopped).
    pub between_and_after: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Publish → confirm, including retries, in ms.
    pub p50_ms: u64,
    pub p99_ms: u64,
    pub max_ms: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub seed: u64,
    pub protocol: Protocol,
    /// The nemeses this machine can inject (`requested` less e.g. netem without netem).
    pub nemeses: Vec<Kind>,
    /// The nemeses asked for.
    pub requested: Vec<Kind>,
    pub workload_s: f64,
    pub notes: Vec<String>,
    pub leaders_at_start: BTreeMap<String, u64>,
    pub faults: Vec<FaultReport>,
    pub throughput: Throughput,
    pub latency: Latency,
    pub publish_errors: BTreeMap<String, u64>,
    pub consumer_interruptions: BTreeMap<String, u64>,
    pub reconnects: BTreeMap<String, u64>,
    pub verdict: Verdict,
}

impl Report {
    /// Each nemesis asked for, judged ([`outcome::per_nemesis`]).
    pub fn per_nemesis(&self) -> Vec<NemesisOutcome> {
        let struck: Vec<Kind> = self.faults.iter().map(|f| f.kind).collect();
        outcome::per_nemesis(&self.requested, &struck, self.verdict.ok())
    }

    /// The run's outcome ([`outcome::of_run`]).
    pub fn result(&self) -> Outcome {
        outcome::of_run(&self.per_nemesis(), self.verdict.ok())
    }

    /// `report.json`: the report with its result and each nemesis' outcome.
    pub fn to_json(&self) -> serde_json::Result<serde_json::Value> {
        let mut json = serde_json::to_value(self)?;
        if let Some(fields) = json.as_object_mut() {
            fields.insert("result".into(), serde_json::to_value(self.result())?);
            fields.insert(
                "per_nemesis".into(),
                serde_json::to_value(self.per_nemesis())?,
            );
        }
        Ok(json)
    }
}

/// Confirm times (ms) per source queue, sorted.
fn confirms_by_queue(h: &History) -> BTreeMap<&str, Vec<u64>> {
    let mut by: BTreeMap<&str, Vec<u64>> = SOURCES.iter().map(|q| (*q, Vec::new())).collect();
    for p in &h.publishes {
        if let Some(t) = p.confirmed_ms {
            by.entry(p.queue.as_str()).or_default().push(t);
        }
    }
    for v in by.values_mut() {
        v.sort_unstable();
    }
    by
}

/// The longest stretch inside `[from, to]` without a confirm in `times` (sorted), counting
/// from `from` to the first confirm and from the last confirm to `to`.
pub fn longest_gap(times: &[u64], from: u64, to: u64) -> u64 {
    let mut last = from;
    let mut longest = 0;
    for &t in times.iter().filter(|&&t| t > from && t <= to) {
        longest = longest.max(t - last);
        last = t;
    }
    longest.max(to - last)
}

/// Fault windows (ms) with their kind and target, as the runner applied them.
#[derive(Clone, Debug)]
pub struct Window {
    pub kind: Kind,
    pub target: String,
    pub start_ms: u64,
    pub end_ms: u64,
    /// What a membership strike did, step by step (empty for other faults).
    pub steps: Vec<Step>,
    /// A procedure's steps (rolling-restart), for the report.
    pub procedure: Vec<String>,
}

pub fn fault_reports(h: &History, windows: &[Window], publish_end_ms: u64) -> Vec<FaultReport> {
    let by = confirms_by_queue(h);
    windows
        .iter()
        .map(|w| {
            let to = (w.end_ms + AFTERMATH_MS)
                .min(publish_end_ms)
                .max(w.start_ms);
            let (queue, gap) = by
                .iter()
                .map(|(q, times)| (q.to_string(), longest_gap(times, w.start_ms, to)))
                .max_by_key(|(_, g)| *g)
                .unwrap_or_default();
            FaultReport {
                kind: w.kind,
                target: w.target.clone(),
                start_s: w.start_ms as f64 / 1000.0,
                end_s: w.end_ms as f64 / 1000.0,
                longest_confirm_gap_ms: gap,
                gap_queue: queue,
                steps: w.steps.clone(),
                procedure: w.procedure.clone(),
            }
        })
        .collect()
}

pub fn throughput(h: &History, windows: &[Window], publish_end_ms: u64) -> Throughput {
    let first = windows.first().map_or(publish_end_ms, |w| w.start_ms);
    let in_fault = |t: u64| windows.iter().any(|w| t >= w.start_ms && t < w.end_ms);
    let fault_ms: u64 = windows.iter().map(|w| w.end_ms - w.start_ms).sum();
    let (mut before, mut during, mut rest) = (0u64, 0u64, 0u64);
    for t in h.publishes.iter().filter_map(|p| p.confirmed_ms) {
        if t > publish_end_ms {
            continue;
        } else if t < first {
            before += 1;
        } else if in_fault(t) {
            during += 1;
        } else {
            rest += 1;
        }
    }
    let rate = |n: u64, ms: u64| {
        if ms == 0 {
            0.0
        } else {
            n as f64 * 1000.0 / ms as f64
        }
    };
    Throughput {
        before_faults: rate(before, first),
        during_faults: rate(during, fault_ms),
        between_and_after: rate(rest, publish_end_ms.saturating_sub(first + fault_ms)),
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub fn latency(h: &History) -> Latency {
    let mut v: Vec<u64> = h
        .publishes
        .iter()
        .filter_map(|p| p.confirmed_ms.map(|c| c - p.start_ms))
        .collect();
    v.sort_unstable();
    Latency {
        p50_ms: percentile(&v, 50.0),
        p99_ms: percentile(&v, 99.0),
        max_ms: v.last().copied().unwrap_or(0),
    }
}

pub fn summary(r: &Report) -> String {
    let c = &r.verdict.counts;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "==== qq-chaos summary (seed {}, over {}) ====",
        r.seed,
        r.protocol.name()
    );
    let names: Vec<&str> = r.nemeses.iter().map(|k| k.name()).collect();
    let _ = writeln!(
        s,
        "nemeses: {}   workload: {:.0} s",
        names.join(","),
        r.workload_s
    );
    for n in &r.notes {
        let _ = writeln!(s, "note: {n}");
    }
    let leaders: Vec<String> = r
        .leaders_at_start
        .iter()
        .map(|(q, l)| format!("{q}@{l}"))
        .collect();
    let _ = writeln!(s, "leaders at start: {}", leaders.join(" "));
    let _ = writeln!(s, "faults ({}):", r.faults.len());
    for f in &r.faults {
        let _ = writeln!(
            s,
            "  {:>6.1}-{:<6.1}s {:<17} {:<12} longest confirm gap {:>6} ms ({})",
            f.start_s,
            f.end_s,
            f.kind.name(),
            f.target,
            f.longest_confirm_gap_ms,
            f.gap_queue
        );
        for step in &f.steps {
            let _ = writeln!(
                s,
                "      {:>6.1}s {:<9} node {:<2} {:>6} ms  {}{}",
                step.start_ms as f64 / 1000.0,
                step.step,
                step.node,
                step.duration_ms,
                if step.ok { "" } else { "FAILED: " },
                step.detail
            );
        }
        for line in &f.procedure {
            let _ = writeln!(s, "      {line}");
        }
    }
    let _ = writeln!(
        s,
        "publishes: {} attempted, {} confirmed, {} unconfirmed, {} retried",
        c.attempted, c.confirmed, c.unconfirmed, c.retried
    );
    let _ = writeln!(
        s,
        "outcomes: {} acked, {} dead-lettered {:?}, {} left in queues",
        c.acked, c.dead_lettered, c.dead_lettered_by_reason, c.left_in_queues
    );
    let _ = writeln!(
        s,
        "lost {}   unexpected {}   redeliveries after a settle {}   stored twice {}   duplicate dead letters {}   (retried publishes {})",
        c.lost,
        c.unexpected,
        c.duplicate_deliveries,
        c.stored_duplicates,
        c.dead_letter_duplicates,
        c.retried
    );
    let t = &r.throughput;
    let _ = writeln!(
        s,
        "confirmed msgs/s: before faults {:.0}, during faults {:.0}, between/after {:.0}",
        t.before_faults, t.during_faults, t.between_and_after
    );
    let _ = writeln!(
        s,
        "publish->confirm latency: p50 {} ms, p99 {} ms, max {} ms",
        r.latency.p50_ms, r.latency.p99_ms, r.latency.max_ms
    );
    let _ = writeln!(s, "publish errors (retried): {:?}", r.publish_errors);
    let _ = writeln!(s, "consumer interruptions: {:?}", r.consumer_interruptions);
    let _ = writeln!(
        s,
        "reconnects: {:?}   republished copies (AMQP, allowed) {}",
        r.reconnects, c.republished_copies
    );
    for (label, ex) in [
        ("lost", &r.verdict.lost_examples),
        ("unexpected", &r.verdict.unexpected_examples),
        ("wrong dead letter", &r.verdict.wrong_dead_letter_examples),
        (
            "missing dead letter",
            &r.verdict.missing_dead_letter_examples,
        ),
    ] {
        if !ex.is_empty() {
            let _ = writeln!(s, "{label} e.g.: {}", ex.join(", "));
        }
    }
    for check in &r.verdict.checks {
        let _ = writeln!(
            s,
            "[{}] {}: {}",
            if check.ok { "PASS" } else { "FAIL" },
            check.name,
            check.detail
        );
    }
    for n in r.per_nemesis() {
        let _ = writeln!(
            s,
            "nemesis {:<17} {:>3} faults  {}{}",
            n.kind.name(),
            n.faults,
            n.result.name(),
            if n.result == Outcome::Skipped {
                " (injected nothing)"
            } else {
                ""
            }
        );
    }
    let _ = writeln!(s, "RESULT: {}", r.result().name());
    s
}

/// Writes a matrix's `matrix.md` (its table, also printed) and `matrix.json` (every run's
/// report) into `base`.
pub fn write_matrix(base: &Path, rows: &[(String, Report)]) -> anyhow::Result<()> {
    let table = matrix_table(rows);
    std::fs::write(base.join("matrix.md"), &table)?;
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|(name, r)| Ok(serde_json::json!({ "run": name, "report": r.to_json()? })))
        .collect::<serde_json::Result<_>>()?;
    std::fs::write(base.join("matrix.json"), serde_json::to_vec_pretty(&json)?)?;
    println!("\n{table}");
    println!("matrix: {}", base.join("matrix.md").display());
    Ok(())
}

/// One Markdown table for a matrix of runs: per nemesis, what the checker counted and the
/// worst unavailability a fault caused.
fn matrix_table(rows: &[(String, Report)]) -> String {
    let mut s = String::from(
        "| nemesis | protocol | faults | confirmed | retried | reconnects | lost | unexpected | redeliveries after settle | stored twice | republished copies | dup. dead letters | dead-lettered | longest confirm gap | result |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for (name, r) in rows {
        let c = &r.verdict.counts;
        let gap = r
            .faults
            .iter()
            .map(|f| f.longest_confirm_gap_ms)
            .max()
            .unwrap_or(0);
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s | {} |",
            r.protocol.name(),
            r.faults.len(),
            c.confirmed,
            c.retried,
            r.reconnects.values().sum::<u64>(),
            c.lost,
            c.unexpected,
            c.duplicate_deliveries,
            c.stored_duplicates,
            c.republished_copies,
            c.dead_letter_duplicates,
            c.dead_lettered,
            gap as f64 / 1000.0,
            r.result().name()
        );
    }
    s
}

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// The timeline: confirmed and acked messages per second (top), publish→confirm latency p50 and
/// p99 per second of publishing (bottom), fault windows shaded and named.
pub fn plot(h: &History, windows: &[Window], end_ms: u64, path: &Path) -> anyhow::Result<()> {
    let font = std::fs::read(FONT).with_context(|| format!("{FONT} (Debian fonts-dejavu-core)"))?;
    // Registering twice (a second plot in one process) is harmless; the first font stays.
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(font.into()));

    let secs = (end_ms / 1000 + 1) as usize;
    let mut confirmed = vec![0u32; secs];
    let mut acked = vec![0u32; secs];
    let mut lat: Vec<Vec<u64>> = vec![Vec::new(); secs];
    for p in &h.publishes {
        if let Some(c) = p.confirmed_ms {
            if let Some(b) = confirmed.get_mut((c / 1000) as usize) {
                *b += 1;
            }
            if let Some(l) = lat.get_mut((p.start_ms / 1000) as usize) {
                l.push(c - p.start_ms);
            }
        }
    }
    for d in h.deliveries.iter().filter(|d| d.action == Action::Ack) {
        if let Some(b) = acked.get_mut((d.t_ms / 1000) as usize) {
            *b += 1;
        }
    }
    let pcts: Vec<(u64, u64)> = lat
        .iter_mut()
        .map(|v| {
            v.sort_unstable();
            (percentile(v, 50.0), percentile(v, 99.0))
        })
        .collect();

    let per_second = |v: &[u32]| -> Vec<(f64, f64)> {
        v.iter()
            .enumerate()
            .map(|(i, n)| (i as f64, *n as f64))
            .collect()
    };
    let latency = |pick: fn(&(u64, u64)) -> u64| -> Vec<(f64, f64)> {
        pcts.iter()
            .enumerate()
            .filter(|(i, _)| !lat[*i].is_empty())
            .map(|(i, p)| (i as f64, pick(p) as f64))
            .collect()
    };

    let root = BitMapBackend::new(path, (1400, 820)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(430);
    let x_max = secs as f64;
    panel(
        &top,
        "throughput (messages per second)",
        x_max,
        windows,
        &[
            ("publishes confirmed/s", BLUE, per_second(&confirmed)),
            ("acked/s", GREEN_700, per_second(&acked)),
        ],
    )?;
    panel(
        &bottom,
        "publish -> confirm latency (ms, by second of publishing)",
        x_max,
        windows,
        &[
            ("p50", BLUE, latency(|p| p.0)),
            ("p99", RED, latency(|p| p.1)),
        ],
    )?;
    root.present()?;
    Ok(())
}

/// One chart: the series as lines over the run's seconds, fault windows shaded and named.
fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    x_max: f64,
    windows: &[Window],
    series: &[(&str, RGBColor, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    let top = series
        .iter()
        .flat_map(|(_, _, points)| points.iter().map(|p| p.1))
        .fold(1.0, f64::max);
    let y_max = top * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart.configure_mesh().x_desc("seconds").draw()?;
    shade(&mut chart, windows, y_max)?;
    for (label, color, points) in series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(*label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}

type Chart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

fn shade(chart: &mut Chart<'_, '_>, windows: &[Window], y_max: f64) -> anyhow::Result<()> {
    for w in windows {
        let (s, e) = (w.start_ms as f64 / 1000.0, w.end_ms as f64 / 1000.0);
        chart.draw_series([Rectangle::new(
            [(s, 0.0), (e, y_max)],
            RED.mix(0.12).filled(),
        )])?;
        chart.draw_series([Text::new(
            format!("{} {}", w.kind.name(), w.target),
            (s, y_max * 0.97),
            ("sans-serif", 13).into_font().color(&BLACK),
        )])?;
        // A membership strike's steps: a line where each began, named, staggered downwards.
        for (i, step) in w.steps.iter().enumerate() {
            let x = step.start_ms as f64 / 1000.0;
            let color = if step.ok {
                BLACK.mix(0.35)
            } else {
                RED.mix(0.9)
            };
            chart.draw_series([PathElement::new(
                [(x, 0.0), (x, y_max * 0.92)],
                color.stroke_width(1),
            )])?;
            chart.draw_series([Text::new(
                format!("{} {:.1}s", step.step, step.duration_ms as f64 / 1000.0),
                (x, y_max * (0.92 - 0.05 * (i % 8) as f64)),
                ("sans-serif", 11).into_font().color(&color),
            )])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_gap_counts_from_the_fault_start() {
        assert_eq!(longest_gap(&[100, 200, 1500, 1600], 150, 1700), 1300);
        assert_eq!(longest_gap(&[100, 2000], 150, 3000), 1850);
        assert_eq!(longest_gap(&[100], 150, 3000), 2850, "no confirm at all");
        assert_eq!(longest_gap(&[160, 170, 180], 150, 190), 10);
        assert_eq!(
            longest_gap(&[160, 170, 180], 150, 2180),
            2000,
            "stalled to the end"
        );
    }

    /// The summary and `report.json` say what each nemesis did and what the run amounts to:
    /// netem asked for and never injected makes the run PARTIAL, not PASS.
    #[test]
    fn a_report_names_each_nemesis_outcome() {
        let fault = FaultReport {
            kind: Kind::PartitionHalves,
            target: "node 1 alone".into(),
            start_s: 10.0,
            end_s: 20.0,
            longest_confirm_gap_ms: 0,
            gap_queue: String::new(),
            steps: Vec::new(),
            procedure: Vec::new(),
        };
        let mut verdict = Verdict::default();
        verdict
            .checks
            .push(crate::checker::Check::new("nothing lost", true, "-"));
        let report = Report {
            seed: 1,
            protocol: Protocol::Grpc,
            nemeses: vec![Kind::PartitionHalves],
            requested: vec![Kind::PartitionHalves, Kind::Netem],
            workload_s: 60.0,
            notes: Vec::new(),
            leaders_at_start: BTreeMap::new(),
            faults: vec![fault],
            throughput: Throughput::default(),
            latency: Latency::default(),
            publish_errors: BTreeMap::new(),
            consumer_interruptions: BTreeMap::new(),
            reconnects: BTreeMap::new(),
            verdict,
        };
        assert_eq!(report.result(), Outcome::Partial);
        let text = summary(&report);
        assert!(
            text.contains("nemesis partition-halves    1 faults  PASS\n"),
            "{text}"
        );
        assert!(
            text.contains("nemesis netem               0 faults  SKIPPED (injected nothing)"),
            "{text}"
        );
        assert!(text.ends_with("RESULT: PARTIAL\n"), "{text}");
        let json = report.to_json().unwrap();
        assert_eq!(json["result"], "PARTIAL");
        assert_eq!(json["per_nemesis"][1]["kind"], "netem");
        assert_eq!(json["per_nemesis"][1]["result"], "SKIPPED");
    }

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 51);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&[], 99.0), 0);
    }
}
