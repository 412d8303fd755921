//! What a snapshot cut of a large queue costs: builds a `QueueState` of N messages (default
//! 1 200 000, each published with a publisher key, as a client with a publisher id makes), then
//! times, in this process:
//! - the fill (enqueue commands/s);
//! - `state.clone()` (what the cut takes under the state lock) and the postcard encode of the
//!   snapshot header (what the builder task does with that copy);
//! - a steady mix at that backlog (one consumer with prefetch 1 000: enqueue one, ack one),
//!   without and then with a clone held alive, as while a snapshot is being written;
//! - the heap the state holds (counted by a global allocator), per message, and that of a
//!   full dedup window per key.
//!
//! Run in release: `cargo run --release -p qq-core --example snapshot_cut [N]`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use qq_core::queue::{Command, Effect, MsgHeader, QueueState, Reply, SettleOutcome};
use qq_core::types::{MessageId, QueueConfig};

/// Counts the bytes live on the heap.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// This thread's time on a CPU so far (Linux), so that rates are comparable on a busy machine.
fn cpu_s() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(f64::NAN, |ns| ns as f64 / 1e9)
}

struct Q {
    s: QueueState,
    index: u64,
    seq: u64,
    /// 20 commands per ms: 20k msg/s of command time.
    ticks: u64,
}

impl Q {
    fn now(&self) -> u64 {
        1_000_000 + self.ticks / 20
    }

    fn apply(&mut self, cmd: Command) -> (Reply, Vec<Effect>) {
        self.index += 1;
        self.ticks += 1;
        self.s.apply(self.index, cmd)
    }

    fn publish(&mut self) -> Vec<Effect> {
        self.seq += 1;
        let (reply, fx) = self.apply(Command::Enqueue {
            now_ms: self.now(),
            header: MsgHeader {
                size_bytes: 1024,
                expiration_ms: None,
            },
            publish_key: Some(format!("bench-user\0publisher-7\0{}", self.seq)),
            dedup_key: None,
        });
        assert!(matches!(reply, Reply::Enqueued { .. }), "{reply:?}");
        fx
    }
}

fn delivered(fx: &[Effect], out: &mut std::collections::VecDeque<MessageId>) {
    for e in fx {
        if let Effect::Deliver(d) = e {
            out.push_back(d.id);
        }
    }
}

/// Runs `rounds` of enqueue + ack; commands per second of wall time and of CPU time.
fn steady(q: &mut Q, rounds: usize, out: &mut std::collections::VecDeque<MessageId>) -> (f64, f64) {
    let start = Instant::now();
    let cpu = cpu_s();
    for _ in 0..rounds {
        let fx = q.publish();
        delivered(&fx, out);
        let id = out.pop_front().expect("a delivered message to ack");
        let now = q.now();
        let (reply, fx) = q.apply(Command::Settle {
            now_ms: now,
            consumer: 1,
            ids: vec![id],
            outcome: SettleOutcome::Ack,
        });
        assert_eq!(reply, Reply::Ok);
        delivered(&fx, out);
    }
    let commands = (2 * rounds) as f64;
    (
        commands / start.elapsed().as_secs_f64(),
        commands / (cpu_s() - cpu),
    )
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("N: a number of messages"))
        .unwrap_or(1_200_000);
    let rounds = 300_000;
    let before = live();
    let mut window = qq_core::dedup::KeyWindow::default();
    for i in 0..qq_core::dedup::MAX_WINDOW_KEYS as u128 {
        window.remember(1, i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835));
    }
    println!(
        "a full dedup window: {:.0} bytes per key",
        (live() - before) as f64 / window.len() as f64
    );
    drop(window);
    let before = live();
    let mut q = Q {
        s: QueueState::new(QueueConfig::new("/", "q")),
        index: 0,
        seq: 0,
        ticks: 0,
    };
    let start = Instant::now();
    let cpu = cpu_s();
    for _ in 0..n {
        q.publish();
    }
    let fill = start.elapsed().as_secs_f64();
    let fill_cpu = cpu_s() - cpu;
    let held = live() - before;
    println!(
        "fill: {n} enqueues in {fill:.2} s = {:.0} commands/s ({:.0} per CPU second)",
        n as f64 / fill,
        n as f64 / fill_cpu
    );
    println!(
        "state heap: {:.1} MiB = {:.0} bytes per message (with its publish key, up to {} remembered)",
        held as f64 / (1 << 20) as f64,
        held as f64 / n as f64,
        qq_core::dedup::MAX_WINDOW_KEYS,
    );

    for round in 0..3 {
        let start = Instant::now();
        let copy = q.s.clone();
        let clone_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let header = postcard::to_stdvec(&(&copy, copy.receipts(), copy.moves())).unwrap();
        let encode_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let ids = copy.message_ids();
        let ids_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        drop(copy);
        let drop_s = start.elapsed().as_secs_f64();
        println!(
            "cut {round}: clone {:.3} ms, encode {:.1} ms ({} bytes), message_ids {:.1} ms ({}), drop of the clone {:.3} ms",
            clone_s * 1e3,
            encode_s * 1e3,
            header.len(),
            ids_s * 1e3,
            ids.len(),
            drop_s * 1e3
        );
    }

    let mut out = std::collections::VecDeque::new();
    let (_, fx) = q.apply(Command::Checkout {
        now_ms: q.now(),
        consumer: 1,
        node: 1,
        prefetch: 1000,
    });
    delivered(&fx, &mut out);
    let (rate, per_cpu) = steady(&mut q, rounds, &mut out);
    println!("steady at {n}: enqueue+ack {rate:.0} commands/s ({per_cpu:.0} per CPU second)");
    let copy = q.s.clone();
    let (rate, per_cpu) = steady(&mut q, rounds, &mut out);
    println!(
        "steady at {n}, a clone held: enqueue+ack {rate:.0} commands/s ({per_cpu:.0} per CPU second)"
    );
    let copy_extra = live();
    drop(copy);
    println!(
        "a clone held through {rounds} rounds cost {:.1} MiB",
        (copy_extra - live()) as f64 / (1 << 20) as f64
    );
}
