//! A step of the churn: one request retried through the next node while the cluster cannot
//! serve it, each try bounded, until the step's limit.

use std::future::Future;
use std::time::Duration;

use qq_client::Client;
use tokio::time::{Instant, sleep, timeout};
use tonic::Code;

/// How long one try may take.
pub const TRY_LIMIT: Duration = Duration::from_secs(5);
/// How long a step may keep retrying (faults last up to 6 s, two at once, and elections follow).
pub const STEP_LIMIT: Duration = Duration::from_secs(60);

/// Whether an error is the cluster's to resolve (retry) rather than a refusal of the request.
fn retryable(code: Code) -> bool {
    !matches!(
        code,
        Code::InvalidArgument | Code::NotFound | Code::AlreadyExists | Code::PermissionDenied
    )
}

/// Runs `op` through node `start`, then the next, ... until it succeeds, fails for good or the
/// step's limit passes.
pub async fn step<F, Fut>(clients: &[Client], start: u64, what: &str, op: F) -> Result<(), String>
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = qq_client::Result<()>>,
{
    let deadline = Instant::now() + STEP_LIMIT;
    let mut i = start as usize;
    loop {
        let c = clients[i % clients.len()].clone();
        let last = match timeout(TRY_LIMIT, op(c)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) if !retryable(e.code()) => return Err(format!("{what}: {e}")),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        if Instant::now() >= deadline {
            return Err(format!("{what}: after {STEP_LIMIT:?}: {last}"));
        }
        i += 1;
        sleep(Duration::from_millis(200)).await;
    }
}

/// A read-back's answer: an error while `what` is still listed.
pub fn still_there(listed: bool, what: &str) -> qq_client::Result<()> {
    if listed {
        Err(tonic::Status::failed_precondition(format!("{what}: still there")).into())
    } else {
        Ok(())
    }
}

/// A delete or unbind whose earlier try went through answers NOT_FOUND: done. (For a read
/// back, NOT_FOUND is the answer awaited.)
pub fn done_if_gone(r: qq_client::Result<()>) -> qq_client::Result<()> {
    match r {
        Err(e) if e.code() == Code::NotFound => Ok(()),
        other => other,
    }
}
