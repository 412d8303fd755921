//! Consumers in the queue's state that no session of this node serves: `ConsumerDown`.

use super::QueueLeader;

impl QueueLeader {
    /// The leader serves every consumer stream of its queue (followers relay to it), and a
    /// session registers locally before its `Checkout` is proposed: a consumer in the state
    /// that no local session serves belongs to a stream that ended (with an old leader, or
    /// whose clean-up failed), so its unacked messages go back to the queue. `ConsumerDown` of
    /// a consumer already gone is a no-op, so racing a session's own clean-up is harmless.
    /// Returns whether there was any such consumer (then look again later: the proposal may
    /// have failed during an election).
    pub(super) async fn clean_up_old_consumers(&self) -> bool {
        let local = self.machine.local_consumers();
        let stale: Vec<u64> = self.machine.with_state(|s| {
            s.consumers()
                .into_iter()
                .map(|c| c.0)
                .filter(|c| !local.contains(c))
                .collect()
        });
        let found = !stale.is_empty();
        for consumer in stale {
            self.ctx.proposer.consumer_down(self.group, consumer).await;
        }
        found
    }
}
