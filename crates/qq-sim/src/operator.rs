//! The operator of a run: the plan's membership change (if it has one), carried out with
//! qq-chaos's membership strike while the faults go on. The spare node runs in this process
//! like the others (id `nodes + 1`, an empty data directory); the faults never strike it (its
//! links have no weather either), but a fault on the founders strikes around its join, grow,
//! shrink and forget.

use std::sync::Arc;
use std::time::Duration;

use qq_chaos::checker::Check;
use qq_chaos::membership::{Spare, SpareAt, Step, Strike};
use qq_chaos::workload::Recorder;
use qq_client::Client;
use tokio::task::JoinHandle;

use crate::host::{Host, cluster_addr};
use crate::net::SimNet;
use crate::schedule::Membership;

impl Spare for Host {
    async fn stop_spare(&mut self, id: u64) -> anyhow::Result<String> {
        // Stopping joins the node's thread: not on a worker the clients need.
        tokio::task::block_in_place(|| self.stop())?;
        Ok(format!("node {id} stopped gracefully"))
    }
}

enum State {
    Waiting(Host),
    Joined(Strike, Host),
    Retiring(JoinHandle<Vec<Step>>),
    Done(Vec<Step>),
}

/// The membership change of one run.
pub struct Operator {
    plan: Membership,
    state: Option<State>,
}

impl Operator {
    pub fn new(plan: Membership, spare: Host) -> Operator {
        Operator {
            plan,
            state: Some(State::Waiting(spare)),
        }
    }

    /// Takes the next step when its time (into the run) has come: start and join, or retire.
    pub fn tick(
        &mut self,
        now: Duration,
        net: &SimNet,
        founders: &Arc<Vec<Client>>,
        rec: &Arc<Recorder>,
    ) -> anyhow::Result<Option<&'static str>> {
        let at = Duration::from_millis(self.plan.at_ms);
        let until = at + Duration::from_millis(self.plan.length_ms);
        let (state, did) = match self.state.take().expect("a state") {
            State::Waiting(mut spare) if now >= at => {
                spare.start(net)?;
                let spare_at = SpareAt {
                    address: spare.listen.to_string(),
                    cluster_address: cluster_addr(spare.id).to_string(),
                    client: None,
                };
                let strike = Strike::begin(
                    founders.clone(),
                    rec.clone(),
                    spare.id,
                    spare_at,
                    self.plan.shrink_first,
                    rec.now_ms(),
                );
                (State::Joined(strike, spare), Some("spare started, joining"))
            }
            State::Joined(strike, mut spare) if now >= until => {
                let (founders, rec) = (founders.clone(), rec.clone());
                let retiring =
                    tokio::spawn(async move { strike.finish(&mut spare, &founders, &rec).await });
                (State::Retiring(retiring), Some("retiring the spare"))
            }
            other => (other, None),
        };
        self.state = Some(state);
        Ok(did)
    }

    /// Waits for the change to end (retiring the spare now if its window has not ended) and
    /// checks that every step succeeded.
    pub async fn finish(mut self, founders: &Arc<Vec<Client>>, rec: &Arc<Recorder>) -> Check {
        let steps = loop {
            match self.state.take().expect("a state") {
                State::Waiting(_) => {
                    return Check::new(
                        "membership change carried out",
                        false,
                        "the spare never started",
                    );
                }
                State::Joined(strike, mut spare) => {
                    break strike.finish(&mut spare, founders, rec).await;
                }
                State::Retiring(task) => match task.await {
                    Ok(steps) => self.state = Some(State::Done(steps)),
                    Err(e) => {
                        return Check::new(
                            "membership change carried out",
                            false,
                            format!("the retiring task ended: {e}"),
                        );
                    }
                },
                State::Done(steps) => break steps,
            }
        };
        steps_check(&steps)
    }
}

/// The check on a membership change's steps: every one succeeded.
pub(crate) fn steps_check(steps: &[Step]) -> Check {
    let failed: Vec<String> = steps
        .iter()
        .filter(|s| !s.ok)
        .map(|s| format!("{} node {}: {}", s.step, s.node, s.detail))
        .collect();
    let done: Vec<&str> = steps.iter().map(|s| s.step).collect();
    Check::all_clear(
        "membership change carried out",
        failed,
        format!("steps: {}", done.join(", ")),
    )
}
