use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::World;
use crate::child_process::printed;
use crate::entropy::seed_this_thread;

type Trace = Arc<Mutex<Vec<String>>>;
type Peers = Arc<Mutex<HashMap<usize, mpsc::Sender<(usize, u32)>>>>;

/// A host of the toy system: it passes a counter on to a peer after a random delay, picking
/// the peer by a `HashMap`'s order, and notes every receipt and every idle moment (a random
/// timeout raced against its inbox in an unbiased `select!`) with its clock.
async fn toy_host(me: usize, mut inbox: mpsc::Receiver<(usize, u32)>, peers: Peers, trace: Trace) {
    let start = Instant::now();
    let note = |what: String| {
        let at = start.elapsed().as_millis();
        trace.lock().unwrap().push(format!("{at} host{me} {what}"));
    };
    loop {
        let idle = Duration::from_millis(rand::rng().random_range(1..30));
        tokio::select! {
            got = inbox.recv() => {
                let Some((from, n)) = got else { return };
                note(format!("got {n} from host{from}"));
                let to = peers.lock().unwrap().iter().find(|(k, _)| **k != me).map(|(k, tx)| (*k, tx.clone()));
                if let Some((to, tx)) = to {
                    let delay = Duration::from_millis(rand::rng().random_range(0..15));
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let _ = tx.send((me, n + 1)).await;
                        let _ = to;
                    });
                }
            }
            _ = tokio::time::sleep(idle) => note("idle".into()),
        }
    }
}

/// Starts host `h` of the toy system on `world` (again, after a crash).
fn start_toy(world: &World, h: usize, peers: &Peers, trace: &Trace) {
    let (tx, rx) = mpsc::channel(64);
    peers.lock().unwrap().insert(h, tx);
    world.spawn(h, toy_host(h, rx, peers.clone(), trace.clone()));
}

/// The toy system's trace over 2 s of virtual time, on a thread seeded with `seed`: three
/// hosts, two counters passed around, host 2 crashed at 0.5 s and restarted at 0.8 s, host 1
/// paused from 1.2 to 1.4 s.
fn toy_trace(seed: u64) -> Vec<String> {
    std::thread::spawn(move || {
        seed_this_thread(seed);
        let mut world = World::new(Duration::from_millis(1));
        let (peers, trace): (Peers, Trace) = Default::default();
        for _ in 0..3 {
            let h = world.add_host().unwrap();
            start_toy(&world, h, &peers, &trace);
        }
        for first in [0, 1] {
            let tx = peers.lock().unwrap()[&first].clone();
            world.spawn(first, async move { tx.send((first, 0)).await.unwrap() });
        }
        world.run_for(Duration::from_millis(500));
        world.crash(2);
        peers.lock().unwrap().remove(&2);
        trace.lock().unwrap().push("crash host2".into());
        world.run_for(Duration::from_millis(300));
        world.restart(2).unwrap();
        start_toy(&world, 2, &peers, &trace);
        world.run_for(Duration::from_millis(400));
        world.set_paused(1, true);
        world.run_for(Duration::from_millis(200));
        world.set_paused(1, false);
        world.run_for(Duration::from_millis(600));
        assert_eq!(world.elapsed(), Duration::from_secs(2));
        let trace = trace.lock().unwrap().clone();
        trace
    })
    .join()
    .expect("the world's thread")
}

/// Set for the child processes of [`two_runs_of_a_seed_give_the_same_trace`].
const CHILD_SEED: &str = "QQ_SIM_LOCKSTEP_CHILD_SEED";

/// In a child process only: prints the toy system's trace for [`CHILD_SEED`].
#[test]
fn child_trace() {
    if let Ok(seed) = std::env::var(CHILD_SEED) {
        for line in toy_trace(seed.parse().expect("seed")) {
            println!("trace: {line}");
        }
    }
}

/// The trace of a child process ([`crate::child_process`]).
fn child_process_trace(seed: u64) -> String {
    let trace = printed("lockstep::tests::child_trace", CHILD_SEED, seed, "trace: ");
    assert!(trace.len() > 200, "a short trace: {trace:?}");
    trace.join("\n")
}

#[test]
fn two_runs_of_a_seed_give_the_same_trace() {
    let first = child_process_trace(11);
    assert_eq!(first, child_process_trace(11));
    assert_ne!(first, child_process_trace(12));
}

#[test]
fn a_crashed_host_stops_and_a_paused_one_catches_up_in_order() {
    let trace = toy_trace(5);
    let at = |line: &String| -> u128 { line.split(' ').next().unwrap().parse().unwrap_or(0) };
    let crash = trace.iter().position(|l| l == "crash host2").unwrap();
    // Host 2's restarted runtime counts from its restart (0.8 s of the world).
    let after_crash: Vec<_> = trace[crash..]
        .iter()
        .filter(|l| l.contains(" host2 "))
        .collect();
    assert!(after_crash.iter().all(|l| at(l) < 1_200), "{after_crash:?}");
    // Host 1 noted nothing while paused; it catches up, its own clock never going back.
    let host1: Vec<u128> = trace
        .iter()
        .filter(|l| l.contains(" host1 "))
        .map(at)
        .collect();
    assert!(host1.windows(2).all(|w| w[0] <= w[1]), "{host1:?}");
    assert!(host1.iter().any(|t| (1_200..1_400).contains(t)));
}
