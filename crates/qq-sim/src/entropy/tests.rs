use std::collections::HashMap;

use rand::{Rng, TryRngCore};

use super::seed_this_thread;
use crate::child_process::printed;

/// What a thread draws from each source of randomness the module doc names.
#[derive(Debug, PartialEq, Eq)]
struct Draws {
    map_order: Vec<u32>,
    rng: Vec<u64>,
    os_rng: u64,
    select_branches: Vec<u8>,
}

/// Runs the draws on a new thread, seeded with `seed` (or not).
fn draws(seed: Option<u64>) -> Draws {
    std::thread::spawn(move || {
        if let Some(seed) = seed {
            seed_this_thread(seed);
        }
        let map: HashMap<u32, ()> = (0..64).map(|k| (k, ())).collect();
        let mut rng = rand::rng();
        let rng_draws = (0..4).map(|_| rng.random()).collect();
        let mut os = [0u8; 8];
        rand::rngs::OsRng
            .try_fill_bytes(&mut os)
            .expect("entropy from the OS rng");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        // Four branches ready at once: tokio picks where to start at random.
        let select_branches = runtime.block_on(async {
            let mut picks = Vec::new();
            for _ in 0..32 {
                picks.push(tokio::select! {
                    _ = std::future::ready(()) => 0,
                    _ = std::future::ready(()) => 1,
                    _ = std::future::ready(()) => 2,
                    _ = std::future::ready(()) => 3,
                });
            }
            picks
        });
        Draws {
            map_order: map.keys().copied().collect(),
            rng: rng_draws,
            os_rng: u64::from_le_bytes(os),
            select_branches,
        }
    })
    .join()
    .expect("the drawing thread")
}

/// Set for the child process of [`a_seeded_process_draws_the_same_every_time`].
const CHILD_SEED: &str = "QQ_SIM_ENTROPY_CHILD_SEED";

/// The draws of a child process whose drawing thread is seeded with `seed`
/// ([`crate::child_process`]).
fn child_process_draws(seed: u64) -> String {
    let lines = printed("entropy::tests::child_draws", CHILD_SEED, seed, "draws: ");
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines.concat()
}

/// In the child process only: prints the draws of a thread seeded with [`CHILD_SEED`].
#[test]
fn child_draws() {
    if let Ok(seed) = std::env::var(CHILD_SEED) {
        println!("draws: {:?}", draws(Some(seed.parse().expect("seed"))));
    }
}

#[test]
fn a_seeded_process_draws_the_same_every_time() {
    let first = child_process_draws(7);
    assert_eq!(first, child_process_draws(7));
    assert_ne!(first, child_process_draws(8));
}

#[test]
fn a_seeded_thread_draws_the_same_from_std_and_rand_every_time() {
    let (a, b) = (draws(Some(7)), draws(Some(7)));
    assert_eq!(
        (a.map_order, a.rng, a.os_rng),
        (b.map_order, b.rng, b.os_rng)
    );
}

#[test]
fn every_source_follows_the_seed() {
    let (a, b) = (draws(Some(7)), draws(Some(8)));
    assert_ne!(a.map_order, b.map_order, "HashMap keys");
    assert_ne!(a.rng, b.rng, "rand::rng");
    assert_ne!(a.os_rng, b.os_rng, "OsRng");
    assert_ne!(a.select_branches, b.select_branches, "tokio's select!");
}

#[test]
fn an_unseeded_thread_draws_from_the_kernel() {
    let (a, b) = (draws(None), draws(None));
    assert_ne!(a.rng, b.rng);
    assert_ne!(a.map_order, b.map_order);
}
