//! The operator of the replay's chaos workload: the plan's membership change and its wiped
//! disk. The client's host carries them out as the real-time runs do (qq-chaos's membership
//! strike, the wipe's check); what needs the cluster itself (starting the spare's host,
//! crashing and wiping a node) it asks of the loop that owns the world ([`Requests`]), which
//! serves each request between two steps.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qq_chaos::checker::Check;
use qq_chaos::membership::{SpareAt, Strike};
use qq_chaos::workload::Recorder;
use qq_client::Client;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use super::cluster::SpareStop;
use super::{client_addr, client_of};
use crate::host::{cluster_addr, read_after};
use crate::net::SimNet;
use crate::schedule::Membership;
use crate::wipe::{RESEED_LIMIT, await_reseed, check_name, disagree_before};

/// What the client asks of the world's loop.
pub(super) enum Request {
    /// Start the spare node on a host of its own.
    StartSpare(oneshot::Sender<anyhow::Result<SpareStop>>),
    /// Crash the node, delete its data directory, start it again: its host's index back.
    Wipe(u64, oneshot::Sender<anyhow::Result<usize>>),
}

/// Requests waiting for the world's loop.
#[derive(Clone, Default)]
pub(super) struct Requests(Arc<Mutex<Vec<Request>>>);

impl Requests {
    async fn ask<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<anyhow::Result<T>>) -> Request,
    ) -> anyhow::Result<T> {
        let (tx, rx) = oneshot::channel();
        self.0.lock().expect("requests").push(request(tx));
        rx.await
            .map_err(|_| anyhow::anyhow!("the world's loop dropped the request"))?
    }

    /// The requests made since the last call, in order.
    pub(super) fn take(&self) -> Vec<Request> {
        std::mem::take(&mut *self.0.lock().expect("requests"))
    }
}

/// The plan's membership change and wipe, for the chaos workload.
pub(super) struct Operator {
    pub(super) requests: Requests,
    pub(super) membership: Option<Membership>,
    /// The spare's id.
    pub(super) spare: u64,
    pub(super) net: SimNet,
    pub(super) wipe: Option<u64>,
    /// The nodes' log, each line headed by the time and its host (`[  12345 host3] `).
    pub(super) log: PathBuf,
}

impl Operator {
    /// The membership change in a task of its own, if the plan has one: the spare started
    /// `at_ms` after `start`, joined and grown onto every workload queue; shrunk (or not),
    /// stopped and forgotten when its window ends. The task's result is the check on its steps.
    pub(super) fn change_membership(
        &self,
        founders: Arc<Vec<Client>>,
        rec: Arc<Recorder>,
        start: Instant,
    ) -> Option<JoinHandle<Check>> {
        let plan = self.membership?;
        let (requests, id) = (self.requests.clone(), self.spare);
        let client = client_of(&self.net, client_addr(id));
        Some(tokio::spawn(async move {
            sleep_until(start + Duration::from_millis(plan.at_ms)).await;
            let mut spare = match requests.ask(Request::StartSpare).await {
                Ok(spare) => spare,
                Err(e) => {
                    let detail = format!("the spare did not start: {e:#}");
                    return Check::new("membership change carried out", false, detail);
                }
            };
            let at = SpareAt {
                address: client_addr(id).to_string(),
                cluster_address: cluster_addr(id).to_string(),
                client: Some(client),
            };
            let strike = Strike::begin(
                founders.clone(),
                rec.clone(),
                id,
                at,
                plan.shrink_first,
                rec.now_ms(),
            );
            sleep_until(start + Duration::from_millis(plan.at_ms + plan.length_ms)).await;
            let steps = strike.finish(&mut spare, &founders, &rec).await;
            crate::operator::steps_check(&steps)
        }))
    }

    /// The wipe, if the plan has one, once every replica agrees: the node crashed, its
    /// directory deleted, started again; it must hold its votes and be re-seeded
    /// ([`crate::wipe`]), within [`RESEED_LIMIT`] of virtual time.
    pub(super) async fn wipe(&self, clients: &[Client]) -> Option<Check> {
        let node = self.wipe?;
        if let Some(failed) = disagree_before(node, clients).await {
            return Some(failed);
        }
        let from = std::fs::metadata(&self.log).map_or(0, |m| m.len() as usize);
        let host = match self.requests.ask(|tx| Request::Wipe(node, tx)).await {
            Ok(host) => host,
            Err(e) => return Some(Check::new(&check_name(node), false, format!("{e:#}"))),
        };
        let check = await_reseed(node, || self.logged_by(host, from)).await;
        Some(check.unwrap_or_else(|| {
            let detail = format!("not re-seeded within {RESEED_LIMIT:?} of virtual time");
            Check::new(&check_name(node), false, detail)
        }))
    }

    /// What host `host` logged after the log's first `from` bytes, one line each.
    fn logged_by(&self, host: usize, from: usize) -> String {
        let who = format!(" host{host}");
        read_after(&self.log, from)
            .lines()
            .filter(|l| {
                l.split_once(']')
                    .is_some_and(|(head, _)| head.ends_with(&who))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
