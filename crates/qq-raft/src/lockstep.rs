//! Work a node hands to other threads, done on the caller's thread instead when that thread
//! runs a simulator's lock-step world.
//!
//! qq-sim can run every node of a cluster on one thread, each on a runtime with a paused clock,
//! stepped in a fixed order (qq-sim's `lockstep`), so that a seed replays the same schedule.
//! That holds only if nothing a node waits for finishes on another thread: a paused runtime
//! with nothing to run moves its clock on to its next timer, so the schedule would depend on
//! how long that work took in real time. Two kinds of such work exist: the store's fsync thread
//! ([`crate::store`]) and `spawn_blocking` (long log reads, snapshot chunks, password hashing,
//! the dead-letter relay's rounds).
//!
//! A thread that called [`mark_this_thread`] does both itself: [`spawn_blocking`] runs the
//! closure at once, and the store syncs its WAL before `append` returns. Nothing else changes:
//! a production node never marks a thread, so every call goes where it went before.

use std::cell::Cell;
use std::future::Future;

use futures::future::{Either, ready};
use tokio::task::JoinError;

thread_local! {
    static MARKED: Cell<bool> = const { Cell::new(false) };
}

/// From now on, work this thread would hand to another thread it does itself (module doc).
pub fn mark_this_thread() {
    MARKED.with(|m| m.set(true));
}

/// Whether this thread does its blocking work itself.
pub fn on_this_thread() -> bool {
    MARKED.with(Cell::get)
}

/// `tokio::task::spawn_blocking`, or `f` run at once on a marked thread.
pub fn spawn_blocking<F, T>(f: F) -> impl Future<Output = Result<T, JoinError>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    if on_this_thread() {
        Either::Left(ready(Ok(f())))
    } else {
        Either::Right(tokio::task::spawn_blocking(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_thread_runs_blocking_work_itself() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let caller = std::thread::current().id();
        let on_runtime = || async { spawn_blocking(|| std::thread::current().id()).await };
        let unmarked = runtime.block_on(on_runtime()).unwrap();
        assert_ne!(unmarked, caller);
        mark_this_thread();
        let marked = runtime.block_on(on_runtime()).unwrap();
        assert_eq!(marked, caller);
    }
}
