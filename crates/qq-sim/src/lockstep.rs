//! One scheduler for every node: runtimes stepped in turn on one thread, on one virtual clock.
//!
//! Today each node of the simulator runs on a thread of its own with the real clock, so two
//! runs of a seed share their plan of faults but not their schedule (docs/simulation.md). A
//! [`World`] is the scheduler that replaces those threads (issue 32):
//! - every host (a node, or the workload) gets its own single-threaded tokio runtime whose
//!   clock is paused: time moves only when the runtime has nothing left to run, and then
//!   straight to its next timer;
//! - [`World::step`] runs the hosts one after another, always in the order they were added,
//!   each for one tick of virtual time (until everything due within the tick has run), all on
//!   the calling thread. A host woken by another (a byte on a simulated connection) runs at its
//!   next turn, within the same tick or the next;
//! - so the order in which tasks run depends only on what the tasks do. With the thread's
//!   entropy seeded ([`crate::entropy`]), what they draw depends only on the seed.
//!
//! A crash is [`World::crash`]: the host's runtime is dropped with every task on it, as
//! `kill -9` ends a process. A paused host is one [`World::step`] skips.
//!
//! What a host must not do for a run to replay: wait for a thread outside the world (an fsync
//! thread, `spawn_blocking`, real sockets with traffic on them), since the moment such work
//! ends is not the schedule's. The nodes' seams for that are `qq_raft::lockstep` and the
//! simulated network ([`crate::replay`] uses both).

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

thread_local! {
    /// The host [`World::step`] is running on this thread, if any, and the world's time.
    static STEPPING: Cell<Option<(usize, Duration)>> = const { Cell::new(None) };
}

/// The host whose turn it is on this thread ([`World::step`]) and the world's time (the end of
/// the tick), for whatever wants to know who is speaking and when (the replay's log lines).
/// None between turns.
pub fn current_host() -> Option<(usize, Duration)> {
    STEPPING.with(Cell::get)
}

/// The runtimes of the hosts, stepped in turn (module doc).
pub struct World {
    tick: Duration,
    hosts: Vec<Option<Runtime>>,
    paused: Vec<bool>,
    /// How far each host's clock has gone, in the world's time.
    reached: Vec<Duration>,
    elapsed: Duration,
}

impl World {
    /// An empty world whose steps are `tick` of virtual time long.
    pub fn new(tick: Duration) -> World {
        World {
            tick,
            hosts: Vec::new(),
            paused: Vec::new(),
            reached: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    /// Adds a host (a fresh runtime) and returns its index, its place in every step.
    pub fn add_host(&mut self) -> anyhow::Result<usize> {
        self.hosts.push(Some(Self::runtime()?));
        self.paused.push(false);
        self.reached.push(self.elapsed);
        Ok(self.hosts.len() - 1)
    }

    fn runtime() -> anyhow::Result<Runtime> {
        Ok(tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()?)
    }

    /// Spawns `task` on host `host`; it first runs at the host's next turn.
    pub fn spawn<F>(&self, host: usize, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.live(host).spawn(task)
    }

    fn live(&self, host: usize) -> &Runtime {
        self.hosts[host]
            .as_ref()
            .unwrap_or_else(|| panic!("host {host} has crashed"))
    }

    /// Ends every task of `host` at once; [`World::restart`] gives it a fresh runtime.
    pub fn crash(&mut self, host: usize) {
        if let Some(runtime) = self.hosts[host].take() {
            runtime.shutdown_background();
        }
    }

    /// A crashed host's fresh runtime, empty until something is spawned on it.
    pub fn restart(&mut self, host: usize) -> anyhow::Result<()> {
        anyhow::ensure!(self.hosts[host].is_none(), "host {host} is running");
        self.hosts[host] = Some(Self::runtime()?);
        self.reached[host] = self.elapsed;
        Ok(())
    }

    /// Whether [`World::step`] skips `host` (a paused process: none of its tasks runs and none
    /// of its timers fires).
    pub fn set_paused(&mut self, host: usize, paused: bool) {
        self.paused[host] = paused;
    }

    /// One tick: every live, unpaused host runs, in order, until all it has due within the
    /// tick has run. A thread that follows the world's wall clock ([`crate::wall_clock`])
    /// reads the tick's end for the whole tick.
    ///
    /// A host that was skipped (paused) catches its clock up at its next turn: it runs its
    /// timers due meanwhile, in order, as a resumed process does.
    pub fn step(&mut self) {
        self.elapsed += self.tick;
        crate::wall_clock::set_world_time(self.elapsed);
        for host in 0..self.hosts.len() {
            let Some(runtime) = &self.hosts[host] else {
                continue;
            };
            if self.paused[host] {
                continue;
            }
            let behind = self.elapsed - self.reached[host];
            STEPPING.with(|s| s.set(Some((host, self.elapsed))));
            runtime.block_on(async move { tokio::time::sleep(behind).await });
            STEPPING.with(|s| s.set(None));
            self.reached[host] = self.elapsed;
        }
    }

    /// Steps until `length` of virtual time has passed.
    pub fn run_for(&mut self, length: Duration) {
        let end = self.elapsed + length;
        while self.elapsed < end {
            self.step();
        }
    }

    /// Virtual time since the world began.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }
}

#[cfg(test)]
mod tests;
