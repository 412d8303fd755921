//! Turning the scenario outcomes into the side-by-side table (terminal and Markdown), the JSON
//! record, the latency plot, and the target verdicts. quorumq's AMQP side (the same cluster
//! over its AMQP port, scenarios 1-4) gets a column of its own. Both are judged against
//! RabbitMQ: over gRPC by issue 35's targets (3x the throughput of scenarios 1 and 3, ⅓ of
//! scenario 2's p99), over AMQP by issue 30's (2x, ½); the other targets are issue 5's, the
//! same for both.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde::Serialize;

use crate::System;
use crate::scenarios::{Better, Latency, Outcome, PLOT_PERCENTILES};

pub const SCENARIO_NAMES: [&str; 13] = [
    "throughput, 1 queue",
    "latency at fixed rate",
    "many queues",
    "dead-letter rate",
    "failover",
    "backlog memory",
    "restart recovery",
    "memory under pressure",
    "idle CPU, delayed messages",
    "move rate",
    "catch-up at scale",
    "many queues: scale",
    "priority queues",
];

pub fn scenario_name(n: u8) -> &'static str {
    SCENARIO_NAMES
        .get(usize::from(n).wrapping_sub(1))
        .copied()
        .unwrap_or("?")
}

/// One row of the table: a figure on every system.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub scenario: u8,
    pub name: String,
    pub unit: &'static str,
    pub better: Better,
    pub quorumq: Option<f64>,
    /// quorumq over its AMQP port.
    pub quorumq_amqp: Option<f64>,
    pub rabbitmq: Option<f64>,
    /// quorumq / RabbitMQ.
    pub ratio: Option<f64>,
    /// quorumq over AMQP / RabbitMQ.
    pub amqp_ratio: Option<f64>,
    pub target: Option<Target>,
}

/// The target attached to a row, and whether this run met it: over gRPC against `text`, and
/// over AMQP (where that side ran) against `amqp_text`. The two differ where the gRPC API is
/// held to more (issue 35: 3x RabbitMQ's throughput, ⅓ of its p99) than the AMQP adapter
/// (issue 30: 2x, ½).
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub text: &'static str,
    pub amqp_text: &'static str,
    pub met: Option<bool>,
    pub amqp_met: Option<bool>,
}

/// Everything a run produced, as written to the JSON file.
#[derive(Debug, Serialize)]
pub struct Report {
    pub started: String,
    pub settings: crate::scenarios::Settings,
    pub scenarios: Vec<u8>,
    pub rows: Vec<Row>,
    pub outcomes: BTreeMap<String, BTreeMap<u8, Outcome>>,
    pub errors: Vec<String>,
    pub profile: Option<String>,
}

/// A row's targets over gRPC and over AMQP, where the two protocols are held to different ones.
fn protocol_targets(scenario: u8, name: &str) -> Option<(&'static str, &'static str)> {
    match (scenario, name) {
        (1, "delivered+acked") | (3, "delivered+acked") => {
            Some((">= 3x RabbitMQ", ">= 2x RabbitMQ"))
        }
        (2, "confirm p99") | (2, "deliver p99") => Some(("<= 1/3x RabbitMQ", "<= 0.5x RabbitMQ")),
        _ => None,
    }
}

/// A row's target over gRPC (the AMQP side's is [`protocol_targets`]'s second where it
/// differs, this one otherwise).
fn target_for(scenario: u8, name: &str) -> Option<&'static str> {
    if let Some((grpc, _)) = protocol_targets(scenario, name) {
        return Some(grpc);
    }
    match (scenario, name) {
        (4, "dead letters arriving") => Some(">= 2x RabbitMQ"),
        (5, "kill -9 leader → confirms again") => Some("< 2 s"),
        (5, "confirmed messages lost") => Some("0"),
        (6, "max node RSS with backlog") => Some("< RabbitMQ"),
        (11, n) if n.ends_with("peak/steady RSS, worst node") => Some("< 1.5x"),
        (11, n) if n.ends_with("longest confirm gap") => Some("< 1 s"),
        (12, "CPU, 10000 idle queues") => Some("< 5 % core"),
        (12, n) if n.starts_with("RSS per idle queue") => Some("< RabbitMQ"),
        (12, n) if n.starts_with("failover, 1000 queues") => Some("< 5 s"),
        (12, n) if n.starts_with("declare 1000, ") && n.ends_with("in flight") => Some(">= 200/s"),
        _ => None,
    }
}

fn verdict(text: &str, qq: Option<f64>, rabbit: Option<f64>) -> Option<bool> {
    let ratio = ratio(qq, rabbit);
    match text {
        ">= 3x RabbitMQ" => ratio.map(|x| x >= 3.0),
        ">= 2x RabbitMQ" => ratio.map(|x| x >= 2.0),
        "<= 1/3x RabbitMQ" => ratio.map(|x| x <= 1.0 / 3.0),
        "<= 0.5x RabbitMQ" => ratio.map(|x| x <= 0.5),
        "< 2 s" => qq.map(|q| q < 2.0),
        "< 1 s" => qq.map(|q| q < 1.0),
        "< 5 s" | "< 5 % core" => qq.map(|q| q < 5.0),
        ">= 200/s" => qq.map(|q| q >= 200.0),
        "< 1.5x" => qq.map(|q| q < 1.5),
        "0" => qq.map(|q| q == 0.0),
        "< RabbitMQ" => ratio.map(|x| x < 1.0),
        _ => None,
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// Pairs the figures of the systems, in scenario order and in the order they were measured.
pub fn rows(outcomes: &BTreeMap<String, BTreeMap<u8, Outcome>>) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    let empty = BTreeMap::new();
    let side = |s: System| outcomes.get(&s.to_string()).unwrap_or(&empty);
    let (qq, amqp, rabbit) = (
        side(System::Quorumq),
        side(System::QuorumqAmqp),
        side(System::Rabbitmq),
    );
    for side in [qq, amqp, rabbit] {
        for outcome in side.values() {
            for f in &outcome.figures {
                if rows
                    .iter()
                    .any(|r| r.scenario == f.scenario && r.name == f.name)
                {
                    continue;
                }
                rows.push(Row {
                    scenario: f.scenario,
                    name: f.name.clone(),
                    unit: f.unit,
                    better: f.better,
                    quorumq: None,
                    quorumq_amqp: None,
                    rabbitmq: None,
                    ratio: None,
                    amqp_ratio: None,
                    target: None,
                });
            }
        }
    }
    rows.sort_by_key(|r| r.scenario);
    let find = |side: &BTreeMap<u8, Outcome>, scenario: u8, name: &str| {
        side.values()
            .flat_map(|o| &o.figures)
            .find(|f| f.scenario == scenario && f.name == name)
            .and_then(|f| f.value)
    };
    for r in &mut rows {
        r.quorumq = find(qq, r.scenario, &r.name);
        r.quorumq_amqp = find(amqp, r.scenario, &r.name);
        r.rabbitmq = find(rabbit, r.scenario, &r.name);
        r.ratio = ratio(r.quorumq, r.rabbitmq);
        r.amqp_ratio = ratio(r.quorumq_amqp, r.rabbitmq);
        r.target = target_for(r.scenario, &r.name).map(|text| {
            let amqp_text = protocol_targets(r.scenario, &r.name).map_or(text, |(_, a)| a);
            Target {
                text,
                amqp_text,
                met: verdict(text, r.quorumq, r.rabbitmq),
                amqp_met: r
                    .quorumq_amqp
                    .and_then(|_| verdict(amqp_text, r.quorumq_amqp, r.rabbitmq)),
            }
        });
    }
    rows
}

fn fmt_value(v: Option<f64>, unit: &str) -> String {
    match v {
        None => "n/a".into(),
        Some(v) if unit == "msg/s" || unit == "msgs" || unit == "MiB" => format!("{v:.0}"),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) if v >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// The AMQP column: blank for the scenarios that side does not run.
fn fmt_amqp_value(r: &Row) -> String {
    match r.quorumq_amqp {
        None => "-".into(),
        v => fmt_value(v, r.unit),
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}x"))
}

fn fmt_met(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "(not measured)",
    }
}

fn fmt_target(t: &Option<Target>) -> String {
    match t {
        None => String::new(),
        Some(t) if t.amqp_met.is_some() && t.amqp_text == t.text => format!(
            "{} {}, AMQP {}",
            t.text,
            fmt_met(t.met),
            fmt_met(t.amqp_met)
        ),
        Some(t) if t.amqp_met.is_some() => format!(
            "{} {}, AMQP {} {}",
            t.text,
            fmt_met(t.met),
            t.amqp_text,
            fmt_met(t.amqp_met)
        ),
        Some(t) => format!("{} {}", t.text, fmt_met(t.met)),
    }
}

/// The table for the terminal.
pub fn text_table(rows: &[Row]) -> String {
    let header = [
        "scenario",
        "figure",
        "quorumq",
        "qq/AMQP",
        "RabbitMQ",
        "qq/rabbit",
        "AMQP/rabbit",
        "target",
    ];
    let body: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                format!("{} {}", r.scenario, scenario_name(r.scenario)),
                format!("{} ({})", r.name, r.unit),
                fmt_value(r.quorumq, r.unit),
                fmt_amqp_value(r),
                fmt_value(r.rabbitmq, r.unit),
                fmt_ratio(r.ratio),
                fmt_ratio(r.amqp_ratio),
                fmt_target(&r.target),
            ]
        })
        .collect();
    let mut width = header.map(|h| h.chars().count());
    for row in &body {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(width).enumerate() {
            let pad = w.saturating_sub(cell.chars().count());
            if (2..=6).contains(&i) {
                let _ = write!(s, "{}{}  ", " ".repeat(pad), cell);
            } else {
                let _ = write!(s, "{}{}  ", cell, " ".repeat(pad));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = String::new();
    let head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    out.push_str(&line(&head));
    out.push('\n');
    let total: usize = width.iter().sum::<usize>() + 2 * (width.len() - 1);
    out.push_str(&"-".repeat(total));
    out.push('\n');
    let mut last = 0;
    for (r, cells) in rows.iter().zip(&body) {
        let mut cells = cells.clone();
        if r.scenario == last {
            cells[0] = String::new();
        }
        last = r.scenario;
        out.push_str(&line(&cells));
        out.push('\n');
    }
    out
}

/// The verdict lines: each target met or missed, over gRPC and (a line of its own) over AMQP.
pub fn verdicts(rows: &[Row]) -> Vec<String> {
    let line = |r: &Row, text: &str, side: &str, met: Option<bool>, qq: Option<f64>| {
        format!(
            "{}: scenario {} {} ({}), target {}: {side} {} {}, RabbitMQ {} {}",
            match met {
                Some(true) => "MET   ",
                Some(false) => "MISSED",
                None => "N/A   ",
            },
            r.scenario,
            r.name,
            r.unit,
            text,
            fmt_value(qq, r.unit),
            r.unit,
            fmt_value(r.rabbitmq, r.unit),
            r.unit,
        )
    };
    let mut out = Vec::new();
    for r in rows {
        let Some(t) = &r.target else { continue };
        out.push(line(r, t.text, "quorumq", t.met, r.quorumq));
        if r.quorumq_amqp.is_some() {
            let (text, met) = (t.amqp_text, t.amqp_met);
            out.push(line(r, text, "quorumq/AMQP", met, r.quorumq_amqp));
        }
    }
    out
}

/// The Markdown summary.
pub fn markdown(report: &Report) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# quorumq vs RabbitMQ quorum queues\n");
    let _ = writeln!(
        md,
        "Run started {} on this machine ({} cores); both three-node clusters on one host, \
         1 KiB messages, quorum queues with three replicas, publisher confirms after a \
         majority fsync, manual acks. Scenarios: {:?}.\n",
        report.started,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        report.scenarios
    );
    let _ = writeln!(
        md,
        "quorumq/AMQP is the same quorumq cluster driven over its AMQP port with lapin, the \
         client RabbitMQ is driven with (scenarios 1-4 and 13).\n"
    );
    let _ = writeln!(
        md,
        "| scenario | figure | quorumq | qq/AMQP | RabbitMQ | qq/rabbit | AMQP/rabbit | target |\n\
         |---|---|---:|---:|---:|---:|---:|---|"
    );
    for r in &report.rows {
        let _ = writeln!(
            md,
            "| {} {} | {} ({}) | {} | {} | {} | {} | {} | {} |",
            r.scenario,
            scenario_name(r.scenario),
            r.name,
            r.unit,
            fmt_value(r.quorumq, r.unit),
            fmt_amqp_value(r),
            fmt_value(r.rabbitmq, r.unit),
            fmt_ratio(r.ratio),
            fmt_ratio(r.amqp_ratio),
            fmt_target(&r.target)
        );
    }
    let _ = writeln!(md, "\n## Targets\n");
    for v in verdicts(&report.rows) {
        let _ = writeln!(md, "- {v}");
    }
    let _ = writeln!(md, "\n## Latency percentiles (ms)\n");
    let _ = writeln!(
        md,
        "| scenario | system | kind | samples | {} |\n|---|---|---|---:|{}",
        PLOT_PERCENTILES
            .iter()
            .map(|p| pct_label(*p))
            .collect::<Vec<_>>()
            .join(" | "),
        "---:|".repeat(PLOT_PERCENTILES.len())
    );
    for (system, outcomes) in &report.outcomes {
        for o in outcomes.values() {
            for l in &o.latencies {
                let cells: Vec<String> = PLOT_PERCENTILES
                    .iter()
                    .map(|p| l.at(*p).map_or("-".into(), |v| format!("{v:.2}")))
                    .collect();
                let _ = writeln!(
                    md,
                    "| {} | {system} | {} | {} | {} |",
                    l.scenario,
                    l.kind,
                    l.samples,
                    cells.join(" | ")
                );
            }
        }
    }
    let _ = writeln!(md, "\n## Notes from the run\n");
    for (system, outcomes) in &report.outcomes {
        for (n, o) in outcomes {
            for note in &o.notes {
                let _ = writeln!(md, "- {system}, scenario {n}: {note}");
            }
        }
    }
    for e in &report.errors {
        let _ = writeln!(md, "- error: {e}");
    }
    if let Some(p) = &report.profile {
        let _ = writeln!(
            md,
            "\n## Profile of the quorumq leader (perf, scenario 1 load)\n\n```\n{p}\n```"
        );
    }
    md
}

fn pct_label(p: f64) -> String {
    if p >= 100.0 {
        "max".into()
    } else {
        format!("p{p}")
    }
}

/// One panel per scenario with latencies: x = percentile, y = milliseconds (log scale), a line
/// per system and kind.
pub fn plot(report: &Report, path: &Path) -> Result<()> {
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
        .context("read /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf (fonts-dejavu-core)")?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("register DejaVu Sans"))?;
    let mut panels: BTreeMap<u8, Vec<(String, &Latency)>> = BTreeMap::new();
    for (system, outcomes) in &report.outcomes {
        for o in outcomes.values() {
            for l in &o.latencies {
                if !l.percentiles.is_empty() {
                    panels
                        .entry(l.scenario)
                        .or_default()
                        .push((format!("{system} {}", l.kind), l));
                }
            }
        }
    }
    let n = panels.len().max(1);
    let root = BitMapBackend::new(path, (560 * n as u32, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let areas = root.split_evenly((1, n));
    for (area, (scenario, series)) in areas.iter().zip(&panels) {
        let max = series
            .iter()
            .flat_map(|(_, l)| l.percentiles.iter().map(|(_, v)| *v))
            .fold(1.0f64, f64::max);
        let min = series
            .iter()
            .flat_map(|(_, l)| l.percentiles.iter().map(|(_, v)| *v))
            .fold(f64::MAX, f64::min)
            .clamp(0.01, 1.0);
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{scenario} {}", scenario_name(*scenario)),
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(
                -0.2f64..(PLOT_PERCENTILES.len() as f64 - 0.8),
                (min * 0.8..max * 1.5).log_scale(),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_labels(PLOT_PERCENTILES.len())
            .x_label_formatter(&|x| {
                let i = x.round() as usize;
                if (x - x.round()).abs() < 0.01 && i < PLOT_PERCENTILES.len() {
                    pct_label(PLOT_PERCENTILES[i])
                } else {
                    String::new()
                }
            })
            .y_desc("latency (ms)")
            .y_label_formatter(&|v| {
                if *v >= 1.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v}")
                }
            })
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for (name, lat) in series {
            let side = if name.starts_with("quorumq/AMQP") {
                1
            } else if name.starts_with("quorumq") {
                0
            } else {
                2
            };
            let color = match (side, lat.kind.contains("confirm")) {
                (0, true) => RGBColor(31, 119, 180),
                (0, false) => RGBColor(44, 160, 44),
                (1, true) => RGBColor(148, 103, 189),
                (1, false) => RGBColor(140, 86, 75),
                (_, true) => RGBColor(255, 127, 14),
                (_, false) => RGBColor(214, 39, 40),
            };
            let points: Vec<(f64, f64)> = lat
                .percentiles
                .iter()
                .filter_map(|(p, v)| {
                    PLOT_PERCENTILES
                        .iter()
                        .position(|q| (q - p).abs() < 1e-9)
                        .map(|i| (i as f64, v.max(min)))
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 3, color.filled())),
                )
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::Figure;

    fn outcome(figures: &[(u8, &str, f64)]) -> Outcome {
        Outcome {
            figures: figures
                .iter()
                .map(|(s, n, v)| Figure {
                    scenario: *s,
                    name: n.to_string(),
                    unit: "msg/s",
                    better: Better::Higher,
                    value: Some(*v),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn rows_pair_both_systems_and_judge_targets() {
        let mut outcomes = BTreeMap::new();
        outcomes.insert(
            System::Quorumq.to_string(),
            BTreeMap::from([(1, outcome(&[(1, "delivered+acked", 3000.0)]))]),
        );
        outcomes.insert(
            System::Rabbitmq.to_string(),
            BTreeMap::from([(
                1,
                outcome(&[(1, "delivered+acked", 1000.0), (1, "only rabbit", 5.0)]),
            )]),
        );
        outcomes.insert(
            System::QuorumqAmqp.to_string(),
            BTreeMap::from([(1, outcome(&[(1, "delivered+acked", 1500.0)]))]),
        );
        let rows = rows(&outcomes);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].ratio, Some(3.0));
        assert_eq!(rows[0].amqp_ratio, Some(1.5));
        let target = rows[0].target.as_ref().unwrap();
        assert_eq!((target.met, target.amqp_met), (Some(true), Some(false)));
        assert_eq!(rows[1].quorumq, None);
        assert_eq!(rows[1].quorumq_amqp, None);
        assert!(rows[1].target.is_none());
        let table = text_table(&rows);
        assert!(table.contains("3.00x"), "{table}");
        assert!(table.contains("1.50x"), "{table}");
        assert!(
            table.contains(">= 3x RabbitMQ met, AMQP >= 2x RabbitMQ MISSED"),
            "{table}"
        );
        let lines = verdicts(&rows);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[1].starts_with("MISSED") && lines[1].contains("quorumq/AMQP 1500"));
    }

    #[test]
    fn grpc_is_held_to_a_third_of_rabbitmqs_p99_and_amqp_to_half() {
        let p99 = |v: f64| {
            let mut o = outcome(&[(2, "confirm p99", v)]);
            o.figures[0].unit = "ms";
            o.figures[0].better = Better::Lower;
            BTreeMap::from([(2, o)])
        };
        let outcomes = BTreeMap::from([
            (System::Quorumq.to_string(), p99(4.0)),
            (System::QuorumqAmqp.to_string(), p99(4.0)),
            (System::Rabbitmq.to_string(), p99(10.0)),
        ]);
        let rows = rows(&outcomes);
        let t = rows[0].target.as_ref().unwrap();
        assert_eq!(
            (t.text, t.amqp_text),
            ("<= 1/3x RabbitMQ", "<= 0.5x RabbitMQ")
        );
        assert_eq!((t.met, t.amqp_met), (Some(false), Some(true)));
        let lines = verdicts(&rows);
        assert!(lines[0].starts_with("MISSED") && lines[0].contains("<= 1/3x"));
        assert!(lines[1].starts_with("MET") && lines[1].contains("<= 0.5x"));
    }

    #[test]
    fn verdicts_follow_the_issue() {
        assert_eq!(verdict("< 2 s", Some(1.5), None), Some(true));
        assert_eq!(verdict("< 2 s", Some(2.5), Some(1.0)), Some(false));
        assert_eq!(verdict("0", Some(0.0), Some(3.0)), Some(true));
        assert_eq!(
            verdict("<= 0.5x RabbitMQ", Some(4.0), Some(10.0)),
            Some(true)
        );
        assert_eq!(verdict("< RabbitMQ", Some(400.0), None), None);
        assert_eq!(verdict("< 1 s", Some(0.4), Some(3.0)), Some(true));
        assert_eq!(verdict("< 1.5x", Some(1.6), Some(1.1)), Some(false));
        assert_eq!(verdict("< 5 % core", Some(4.9), Some(1.0)), Some(true));
        assert_eq!(verdict(">= 200/s", Some(181.0), Some(43.0)), Some(false));
        assert_eq!(
            target_for(12, "declare 1000, 64 in flight"),
            Some(">= 200/s")
        );
        assert_eq!(target_for(12, "declare 1000, one after another"), None);
    }
}
