//! Seeded entropy for a thread: the first of the simulator's sources of randomness made an
//! input.
//!
//! Three things in a node draw on the operating system's entropy, and each makes two runs of
//! one seed differ:
//! - the keys of every `std` `HashMap` (drawn once per thread), and so the order its entries
//!   are visited in;
//! - tokio's random pick among the ready branches of a `select!` (the runtime's seed is drawn
//!   the same way), in quorumq's code and in tonic's servers;
//! - `rand::rng()`, which openraft's election timeouts and our own ids draw from.
//!
//! All of them end in the C library's `getrandom`: `std` calls it directly, the `getrandom`
//! crate (under `rand` and `argon2`) finds it with `dlsym`. This module defines a `getrandom`
//! of its own in the simulator's binaries, which the linker prefers to the C library's (and
//! `build.rs` exports it, so that `dlsym` finds it too). On a thread that called
//! [`seed_this_thread`] it fills the buffer from a SplitMix64 stream of that seed; on every
//! other thread it asks the kernel, as the C library would. So the simulator decides which
//! threads are deterministic, and nothing else in the process changes.
//!
//! What it does not reach: `ring` (under rustls) asks the kernel with the raw system call, so
//! TLS handshakes stay random. They change key bytes and the length of a signature by a byte
//! or two, not which task runs when.

use std::cell::Cell;
use std::ffi::{c_uint, c_void};

thread_local! {
    /// The thread's SplitMix64 state, once seeded.
    static STATE: Cell<Option<u64>> = const { Cell::new(None) };
}

/// From now on, every draw on entropy this thread makes comes from `seed`.
pub fn seed_this_thread(seed: u64) {
    STATE.with(|s| s.set(Some(seed)));
}

/// SplitMix64's step: the next state and the output it gives.
fn splitmix64(state: u64) -> (u64, u64) {
    let state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (state, z ^ (z >> 31))
}

/// Fills `out` from the thread's seeded stream; false if the thread is not seeded.
fn fill_seeded(out: &mut [u8]) -> bool {
    STATE.with(|s| {
        let Some(mut state) = s.get() else {
            return false;
        };
        for chunk in out.chunks_mut(8) {
            let (next, word) = splitmix64(state);
            state = next;
            chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
        }
        s.set(Some(state));
        true
    })
}

/// The C library's `getrandom(2)` wrapper, replaced (module doc).
///
/// # Safety
/// As the C function: `buf` must be valid for `len` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getrandom(buf: *mut c_void, len: usize, flags: c_uint) -> isize {
    if len > 0 {
        // SAFETY: the caller gives `len` writable bytes at `buf`.
        let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        if fill_seeded(out) {
            return len as isize;
        }
    }
    // SAFETY: the system call with the caller's own arguments, as the C library makes it.
    unsafe { libc::syscall(libc::SYS_getrandom, buf, len, flags) as isize }
}

#[cfg(test)]
mod tests;
