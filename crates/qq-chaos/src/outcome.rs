//! What a run amounts to: PASS, FAIL, SKIPPED or PARTIAL, for the run and for each nemesis
//! asked for. A nemesis that injected no fault (netem on a kernel without it, a kind the
//! schedule had no room for) is SKIPPED, never PASS, and a run is PASS only when every nemesis
//! asked for injected faults; the exit code follows (docs/chaos.md, "Results").

use serde::Serialize;

use crate::nemesis::Kind;
use crate::report::Report;

/// What a run, or one nemesis of it, amounts to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Outcome {
    /// Every check passed and every nemesis asked for injected faults.
    Pass,
    /// A check failed.
    Fail,
    /// Nothing failed, but nothing was tested: no nemesis asked for injected a fault (for
    /// one nemesis: it injected none, e.g. netem on a kernel without it).
    Skipped,
    /// Nothing failed, but some nemeses asked for injected no fault (each one's outcome
    /// says which): the run tested less than it was asked to.
    Partial,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::Skipped => "SKIPPED",
            Outcome::Partial => "PARTIAL",
        }
    }

    /// The process' exit code: 0 PASS, 1 FAIL, 3 SKIPPED or PARTIAL (2 is a run that could
    /// not be carried out).
    pub fn exit_code(self) -> i32 {
        match self {
            Outcome::Pass => 0,
            Outcome::Fail => 1,
            Outcome::Skipped | Outcome::Partial => 3,
        }
    }

    /// Several runs (a matrix) together: FAIL if one failed, PASS if all passed, SKIPPED if
    /// none tested anything, else PARTIAL.
    pub fn of_all(outcomes: impl IntoIterator<Item = Outcome>) -> Outcome {
        let outcomes: Vec<Outcome> = outcomes.into_iter().collect();
        if outcomes.contains(&Outcome::Fail) {
            Outcome::Fail
        } else if outcomes.iter().all(|o| *o == Outcome::Pass) {
            Outcome::Pass
        } else if outcomes.iter().all(|o| *o == Outcome::Skipped) {
            Outcome::Skipped
        } else {
            Outcome::Partial
        }
    }
}

/// One nemesis asked for: the faults it injected and its outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NemesisOutcome {
    pub kind: Kind,
    pub faults: usize,
    pub result: Outcome,
}

impl Report {
    /// Per nemesis asked for: SKIPPED when it injected no fault, else the run's checks'
    /// PASS or FAIL (they judge the run as a whole: with several nemeses, a failure is
    /// every injecting one's).
    pub fn per_nemesis(&self) -> Vec<NemesisOutcome> {
        self.requested
            .iter()
            .map(|kind| {
                let faults = self.faults.iter().filter(|f| f.kind == *kind).count();
                let result = if faults == 0 {
                    Outcome::Skipped
                } else if self.verdict.ok() {
                    Outcome::Pass
                } else {
                    Outcome::Fail
                };
                NemesisOutcome {
                    kind: *kind,
                    faults,
                    result,
                }
            })
            .collect()
    }

    /// FAIL when a check failed; else PASS only when every nemesis asked for injected faults:
    /// SKIPPED when none did, PARTIAL when some did not.
    pub fn result(&self) -> Outcome {
        if !self.verdict.ok() {
            return Outcome::Fail;
        }
        let per = self.per_nemesis();
        let skipped = per.iter().filter(|n| n.result == Outcome::Skipped).count();
        if skipped == 0 {
            Outcome::Pass
        } else if skipped == per.len() {
            Outcome::Skipped
        } else {
            Outcome::Partial
        }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::checker::{Check, Verdict};
    use crate::report::{FaultReport, Latency, Throughput, summary};
    use crate::workload::Protocol;

    /// A report of a run asked for `requested` whose faults were of the kinds `struck`.
    fn report(requested: &[Kind], struck: &[Kind], checks_ok: bool) -> Report {
        let fault = |kind: Kind| FaultReport {
            kind,
            target: "node 1".into(),
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
            .push(Check::new("nothing lost", checks_ok, "-"));
        Report {
            seed: 1,
            protocol: Protocol::Grpc,
            nemeses: requested.to_vec(),
            requested: requested.to_vec(),
            workload_s: 60.0,
            notes: Vec::new(),
            leaders_at_start: BTreeMap::new(),
            faults: struck.iter().map(|k| fault(*k)).collect(),
            throughput: Throughput::default(),
            latency: Latency::default(),
            publish_errors: BTreeMap::new(),
            consumer_interruptions: BTreeMap::new(),
            reconnects: BTreeMap::new(),
            verdict,
        }
    }

    fn outcomes(r: &Report) -> Vec<(Kind, usize, Outcome)> {
        r.per_nemesis()
            .into_iter()
            .map(|n| (n.kind, n.faults, n.result))
            .collect()
    }

    /// Each nemesis asked for is judged alone: one that injected nothing is SKIPPED, and then
    /// the run is not PASS (PARTIAL, or SKIPPED when none injected), nor exits 0.
    #[test]
    fn a_nemesis_that_injects_nothing_is_skipped_and_the_run_is_not_a_pass() {
        use Kind::{KillLeader, Netem, PartitionHalves};
        let asked = [PartitionHalves, Netem];
        let partial = report(&asked, &[PartitionHalves, PartitionHalves], true);
        assert_eq!(
            outcomes(&partial),
            [
                (PartitionHalves, 2, Outcome::Pass),
                (Netem, 0, Outcome::Skipped)
            ]
        );
        assert_eq!(partial.result(), Outcome::Partial);
        assert_eq!(partial.result().exit_code(), 3);
        let text = summary(&partial);
        assert!(
            text.contains("nemesis netem               0 faults  SKIPPED (injected nothing)"),
            "{text}"
        );
        assert!(text.contains("RESULT: PARTIAL"), "{text}");
        assert_eq!(partial.to_json().unwrap()["result"], "PARTIAL");
        assert_eq!(
            partial.to_json().unwrap()["per_nemesis"][1]["result"],
            "SKIPPED"
        );

        let nothing = report(&[Netem], &[], true);
        assert_eq!(outcomes(&nothing), [(Netem, 0, Outcome::Skipped)]);
        assert_eq!(nothing.result(), Outcome::Skipped);

        let all = report(
            &[PartitionHalves, KillLeader],
            &[KillLeader, PartitionHalves],
            true,
        );
        assert_eq!(all.result(), Outcome::Pass);
        assert_eq!(all.result().exit_code(), 0);

        let failed = report(&asked, &[PartitionHalves], false);
        assert_eq!(
            outcomes(&failed),
            [
                (PartitionHalves, 1, Outcome::Fail),
                (Netem, 0, Outcome::Skipped)
            ]
        );
        assert_eq!(failed.result(), Outcome::Fail);
        assert_eq!(failed.result().exit_code(), 1);
    }

    #[test]
    fn a_matrix_passes_only_when_every_run_passed() {
        use Outcome::*;
        assert_eq!(Outcome::of_all([Pass, Pass]), Pass);
        assert_eq!(Outcome::of_all([Pass, Skipped]), Partial);
        assert_eq!(Outcome::of_all([Skipped, Skipped]), Skipped);
        assert_eq!(Outcome::of_all([Partial, Pass]), Partial);
        assert_eq!(Outcome::of_all([Skipped, Fail, Pass]), Fail);
    }
}
