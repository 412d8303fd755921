//! What a run amounts to: PASS, FAIL, SKIPPED or PARTIAL, for the run and for each nemesis
//! asked for. A nemesis that injected no fault (netem on a kernel without it, a kind the
//! schedule had no room for) is SKIPPED, never PASS, and a run is PASS only when every nemesis
//! asked for injected faults; the exit code follows (docs/chaos.md, "Results").

use serde::Serialize;

use crate::nemesis::Kind;

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

/// Per nemesis asked for (`requested`), given the kinds of the faults injected (`struck`):
/// SKIPPED when it injected none, else the run's checks' PASS or FAIL (they judge the run as
/// a whole: with several nemeses, a failure is every injecting one's).
pub fn per_nemesis(requested: &[Kind], struck: &[Kind], checks_ok: bool) -> Vec<NemesisOutcome> {
    requested
        .iter()
        .map(|kind| {
            let faults = struck.iter().filter(|k| *k == kind).count();
            let result = if faults == 0 {
                Outcome::Skipped
            } else if checks_ok {
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

/// The run's outcome: FAIL when a check failed; else PASS only when every nemesis asked for
/// injected faults, SKIPPED when none did, PARTIAL when some did not.
pub fn of_run(per: &[NemesisOutcome], checks_ok: bool) -> Outcome {
    if !checks_ok {
        return Outcome::Fail;
    }
    let skipped = per.iter().filter(|n| n.result == Outcome::Skipped).count();
    if skipped == 0 {
        Outcome::Pass
    } else if skipped == per.len() {
        Outcome::Skipped
    } else {
        Outcome::Partial
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcomes(per: &[NemesisOutcome]) -> Vec<(Kind, usize, Outcome)> {
        per.iter().map(|n| (n.kind, n.faults, n.result)).collect()
    }

    /// Each nemesis asked for is judged alone: one that injected nothing is SKIPPED, and then
    /// the run is not PASS (PARTIAL, or SKIPPED when none injected), nor exits 0.
    #[test]
    fn a_nemesis_that_injects_nothing_is_skipped_and_the_run_is_not_a_pass() {
        use Kind::{KillLeader, Netem, PartitionHalves};
        let asked = [PartitionHalves, Netem];
        let partial = per_nemesis(&asked, &[PartitionHalves, PartitionHalves], true);
        assert_eq!(
            outcomes(&partial),
            [
                (PartitionHalves, 2, Outcome::Pass),
                (Netem, 0, Outcome::Skipped)
            ]
        );
        assert_eq!(of_run(&partial, true), Outcome::Partial);
        assert_eq!(of_run(&partial, true).exit_code(), 3);

        let nothing = per_nemesis(&[Netem], &[], true);
        assert_eq!(outcomes(&nothing), [(Netem, 0, Outcome::Skipped)]);
        assert_eq!(of_run(&nothing, true), Outcome::Skipped);
        assert_eq!(of_run(&nothing, true).exit_code(), 3);

        let all = per_nemesis(
            &[PartitionHalves, KillLeader],
            &[KillLeader, PartitionHalves],
            true,
        );
        assert_eq!(of_run(&all, true), Outcome::Pass);
        assert_eq!(of_run(&all, true).exit_code(), 0);

        let failed = per_nemesis(&asked, &[PartitionHalves], false);
        assert_eq!(
            outcomes(&failed),
            [
                (PartitionHalves, 1, Outcome::Fail),
                (Netem, 0, Outcome::Skipped)
            ]
        );
        assert_eq!(of_run(&failed, false), Outcome::Fail);
        assert_eq!(of_run(&failed, false).exit_code(), 1);
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
