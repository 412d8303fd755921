//! The node's clock: the one way qq-node and qq-raft read the time, handed in when the node
//! starts (`main` passes [`Clock::system`] to [`crate::server::run`], which hands it to
//! [`crate::node::Node::start`]; a test or the simulator passes [`Clock::simulated`]) and
//! handed on to what needs it. One concept, one type: it is defined in qq-raft
//! ([`qq_raft::clock`]), the lowest crate that reads the time, and re-exported here.
//!
//! Two readings:
//! - [`Clock::now_ms`], wall time in milliseconds since the Unix epoch. It is what the leader
//!   actor and the proposing node stamp into the commands they propose (`Enqueue { now_ms }`,
//!   `Expire { now_ms }`, `Checkout`, `Settle`, `StartMove`, ...), and what a leader compares
//!   the state's deadlines with to know when to propose `Expire` or `ExpireQueue`. No state
//!   machine's apply reads it (nor any clock): time enters a queue's log only through commands
//!   stamped before they are proposed, so every replica applies the same time.
//! - [`Clock::now`], a monotonic [`tokio::time::Instant`], for deadlines and timers: the leader
//!   actor's timers, the proposer's retry deadlines, the supervisor's start retry, the sleep
//!   and unload of idle groups, membership changes' deadlines, the liveness handover, the
//!   AMQP refusal delay, the password cache and the management page's sessions and rates.
//!
//! Who holds it: qq-raft's [`qq_raft::network::Peers`] (the pause of each peer's batched Raft
//! stream after a failed open, [`qq_raft::mux`]), the [`crate::node::Node`] (supervisor,
//! unload sweep, consumer ids), the [`crate::groups::registry::Registry`], the
//! [`crate::proposer::Proposer`] (and through it
//! the enqueue path, consume sessions, dead letters and moves), the leader actors' context
//! ([`crate::leader::LeaderContext`]), the client API, its authentication and the management
//! page (through [`crate::api::serving::Serving::clock`]). Where a decision needs only the time (a
//! replica's sleep in [`crate::groups::residency`], the page's rates, the leader's rate-limited
//! drop lines) it takes the time as an argument instead.
//!
//! The real clock ([`Clock::system`]) reads the system's wall clock and tokio's instant. The
//! simulated one ([`Clock::simulated`]) derives wall time from tokio's instant, which a test
//! with `#[tokio::test(start_paused = true)]` (or a simulator driving tokio's clock) moves
//! with `tokio::time::advance`: both readings then advance together and nothing waits.
//!
//! Left out on purpose: durations measured only for a metric or a log line (`let started =
//! std::time::Instant::now(); ... started.elapsed()` in the proposer, the registry's loads, the
//! dead-letter rounds) stay on `std::time::Instant`: they decide nothing. tokio's `sleep`,
//! `interval` and `timeout` read tokio's clock themselves, the same source as [`Clock::now`],
//! so they follow a paused clock too (qq-raft's call deadlines and its answer sweep among
//! them). openraft keeps its own timers, and the leader-lease checks on its
//! `last_quorum_acked` ([`crate::groups::residency::wake_leader`], the registry's leader-only
//! reads) compare with openraft's own instants, on its runtime's clock (tokio's as well).
//!
//! Node-to-node traffic is the other input handed in at start: [`qq_raft::transport`].

pub use qq_raft::clock::Clock;

/// Waits until `at` on tokio's clock (the one [`Clock::now`] reads); with no deadline, forever:
/// the `select!` arm of a loop whose next deadline may not exist.
pub async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
