//! Following a queue group's leadership: the actor runs while this node leads.

use std::sync::Arc;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use qq_raft::GroupId;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, info};

use super::{LeaderContext, QueueLeader};
use crate::groups::queue_sm::QueueMachine;
use crate::groups::registry::QueueRaft;
use crate::groups::residency::ResidencyCell;

/// Follow the group's leadership until `stop` is cancelled; run a [`QueueLeader`] while this
/// node leads. `reloaded`: the replica's Raft instance was loaded again after an unload, so a
/// leadership it finds at once is the one it had, not a leader change (not logged or counted).
#[allow(clippy::too_many_arguments)]
pub async fn watch_leadership(
    ctx: LeaderContext,
    group: GroupId,
    raft: QueueRaft,
    machine: Arc<QueueMachine>,
    residency: Arc<ResidencyCell>,
    stop: CancellationToken,
    reloaded: bool,
    span: Span,
) {
    let mut first = true;
    let mut metrics = raft.metrics();
    let mut actor: Option<(CancellationToken, u64)> = None;
    // The voters last seen; a change is logged by the leader only, so once per cluster.
    let mut voters: Option<Vec<u64>> = None;
    loop {
        let (leading, term, me, now_voters) = {
            let m = metrics.borrow_watched();
            let v: Vec<u64> = m.membership_config.voter_ids().collect();
            (m.state == ServerState::Leader, m.current_term, m.id, v)
        };
        // The first membership of a new group (from none) is its creation, not a change.
        if leading
            && voters
                .as_ref()
                .is_some_and(|v| !v.is_empty() && *v != now_voters)
        {
            info!(group, voters = ?now_voters, term, "membership changed");
        }
        voters = Some(now_voters);
        match (&actor, leading) {
            (None, true) => {
                // One line per leader change of the group, from the new leader.
                if !(reloaded && first) {
                    log_new_leader(&ctx, group, me, term);
                }
                let token = stop.child_token();
                let attachment =
                    start_actor(&ctx, group, &raft, &machine, &residency, &token, &span);
                actor = Some((token, attachment));
            }
            (Some((token, attachment)), false) => {
                info!("not the leader any more");
                token.cancel();
                machine.detach_leader(*attachment);
                actor = None;
                machine.cancel_consumers("queue leader changed; subscribe again", true);
            }
            _ => {}
        }
        first = false;
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { break },
            _ = stop.cancelled() => break,
        }
    }
    if let Some((token, attachment)) = actor {
        token.cancel();
        machine.detach_leader(attachment);
    }
}

/// The line a new leader logs (and the leadership it counts).
fn log_new_leader(ctx: &LeaderContext, group: GroupId, me: u64, term: u64) {
    let (vhost, queue) = ctx
        .view
        .current()
        .queue_by_id(group)
        .map(|q| (q.vhost.clone(), q.name.clone()))
        .unwrap_or_default();
    info!(group, vhost = %vhost, queue = %queue, leader = me, term, "leader changed");
    crate::metrics::became_leader(crate::metrics::QUEUE);
}

/// Attach an inbox to the machine and spawn a [`QueueLeader`] on it, cancelled by `token`;
/// the attachment, to detach it when leadership ends.
fn start_actor(
    ctx: &LeaderContext,
    group: GroupId,
    raft: &QueueRaft,
    machine: &Arc<QueueMachine>,
    residency: &Arc<ResidencyCell>,
    token: &CancellationToken,
    span: &Span,
) -> u64 {
    let (attachment, inbox) = machine.attach_leader();
    let leader = QueueLeader {
        ctx: ctx.clone(),
        group,
        inbox,
        machine: machine.clone(),
        raft: raft.clone(),
        residency: residency.clone(),
        leader_since_ms: ctx.clock.now_ms(),
        cancel: token.clone(),
    };
    ctx.tasks.spawn(leader.run().instrument(span.clone()));
    attachment
}
