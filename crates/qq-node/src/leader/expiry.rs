//! Expiry on the leader: `Expire` when a message deadline (TTL, Get lease, delayed requeue) is
//! due, `ExpireQueue` when the queue may be unused for its `x-expires`, and then its deletion.

use qq_core::meta::MetaCommand;
use qq_core::queue::{Command, Reply};
use tokio::time::Instant;
use tracing::{debug, info};

use super::{PROPOSAL_RETRY, QueueLeader, Timers};
use crate::clock::now_ms;

impl QueueLeader {
    /// Propose Expire / ExpireQueue if due. Returns true when the queue expired and its
    /// deletion was committed.
    pub(super) async fn expire_due(&self, timers: &mut Timers) -> bool {
        if timers.expire_retry.is_some_and(|t| t > Instant::now()) {
            return false;
        }
        timers.expire_retry = None;
        let now = now_ms();
        let (deadline, queue_due, vhost, name) = self.machine.with_state(|s| {
            (
                s.next_deadline(),
                s.queue_expiry_due_ms(self.leader_since_ms),
                s.config().vhost.clone(),
                s.config().name.clone(),
            )
        });
        if queue_due.is_some_and(|d| d <= now) {
            let cmd = Command::ExpireQueue {
                now_ms: now,
                leader_since_ms: self.leader_since_ms,
            };
            match self.propose(cmd).await {
                Ok(Reply::QueueExpiry { expired: true }) => {
                    // Unused for x-expires: the queue is deleted, its messages are not
                    // dead-lettered.
                    info!("queue unused for x-expires: deleting it");
                    match self
                        .ctx
                        .proposer
                        .propose_meta(MetaCommand::DeleteQueue { vhost, name })
                        .await
                    {
                        Ok(_) => return true,
                        Err(e) => debug!("queue expiry not applied yet: {e}"),
                    }
                }
                // Used meanwhile: look again after a pause rather than at once.
                Ok(_) => {}
                Err(e) => debug!("queue expiry check not applied: {e}"),
            }
            timers.expire_retry = Some(Instant::now() + PROPOSAL_RETRY);
        } else if deadline.is_some_and(|d| d <= now) {
            if let Err(e) = self.propose(Command::Expire { now_ms: now }).await {
                debug!("expire not applied: {e}");
                timers.expire_retry = Some(Instant::now() + PROPOSAL_RETRY);
            }
        }
        false
    }
}
