//! The world's wall clock for the libraries that read the real one: the second source of
//! non-determinism made an input, after [`crate::entropy`].
//!
//! A node's own idea of the time comes from its clock seam ([`qq_node::clock`]), which the
//! replay sets from the world's virtual time. But libraries under it read the system's wall
//! clock themselves. One of them decides what goes on the wire: hyper puts a `date` header on
//! every HTTP/2 response (tonic's servers), rendered from `SystemTime::now()` once a second. Its
//! HPACK encoding is one byte while the second lasts and about two dozen when it changes, so two
//! runs of a seed split the same traffic into different chunks at different moments, and the
//! reads of a node end at different frames (seed 10: a consumer's acks fell into different
//! settle commands 25 s into the run). Certificates (`rcgen`, `rustls`) read it too.
//!
//! Every such read ends in the C library's `clock_gettime(CLOCK_REALTIME)`. As with
//! `getrandom`, the simulator's binaries define a `clock_gettime` of their own, which the linker
//! prefers to the C library's: on a thread that called [`follow_world`], `CLOCK_REALTIME` (and
//! its coarse form) reads the world's epoch plus the world's time ([`set_world_time`], which
//! [`crate::lockstep::World::step`] calls every tick); every other clock, and every other
//! thread, goes to the C library's function, found once with `dlsym(RTLD_NEXT)`.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Duration;

thread_local! {
    /// The world's epoch (since 1970) and its time, on a thread that follows it.
    static WORLD: Cell<Option<(Duration, Duration)>> = const { Cell::new(None) };
}

/// From now on, this thread's wall clock reads `epoch` (since 1970) plus the world's time,
/// which starts at zero.
pub fn follow_world(epoch: Duration) {
    WORLD.with(|w| w.set(Some((epoch, Duration::ZERO))));
}

/// The world's time on this thread, if it follows the world ([`follow_world`]).
pub(crate) fn set_world_time(elapsed: Duration) {
    WORLD.with(|w| {
        if let Some((epoch, _)) = w.get() {
            w.set(Some((epoch, elapsed)));
        }
    });
}

/// This thread's wall clock, if it follows the world.
fn world_now() -> Option<Duration> {
    WORLD
        .try_with(Cell::get)
        .ok()
        .flatten()
        .map(|(epoch, elapsed)| epoch + elapsed)
}

type ClockGettime = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> c_int;

/// The C library's `clock_gettime`, once looked up.
static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

fn real() -> ClockGettime {
    let mut found = REAL.load(Ordering::Relaxed);
    if found.is_null() {
        // SAFETY: a symbol lookup with a constant, NUL-terminated name.
        found = unsafe { libc::dlsym(libc::RTLD_NEXT, c"clock_gettime".as_ptr()) };
        assert!(!found.is_null(), "the C library's clock_gettime");
        REAL.store(found, Ordering::Relaxed);
    }
    // SAFETY: `clock_gettime` has this signature in every C library.
    unsafe { std::mem::transmute::<*mut c_void, ClockGettime>(found) }
}

/// The C library's `clock_gettime(2)` wrapper, replaced (module doc).
///
/// # Safety
/// As the C function: `tp` must be valid for a write of a `timespec`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clock_gettime(clock: libc::clockid_t, tp: *mut libc::timespec) -> c_int {
    if matches!(clock, libc::CLOCK_REALTIME | libc::CLOCK_REALTIME_COARSE)
        && let Some(now) = world_now()
        && !tp.is_null()
    {
        // SAFETY: the caller gives a writable `timespec` at `tp`.
        unsafe {
            (*tp).tv_sec = now.as_secs() as libc::time_t;
            (*tp).tv_nsec = now.subsec_nanos() as libc::c_long;
        }
        return 0;
    }
    // SAFETY: the C library's function with the caller's own arguments.
    unsafe { real()(clock, tp) }
}

#[cfg(test)]
mod tests;
