use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{follow_world, set_world_time};

/// CLOCK_MONOTONIC through the C library's symbol (the simulator's `clock_gettime`).
fn monotonic() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) },
        0
    );
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// CLOCK_MONOTONIC straight from the kernel, past any `clock_gettime` symbol.
fn kernel_monotonic() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the system call with a valid, writable timespec.
    let r = unsafe { libc::syscall(libc::SYS_clock_gettime, libc::CLOCK_MONOTONIC, &mut t) };
    assert_eq!(r, 0);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn since_1970() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
}

#[test]
fn a_thread_that_follows_the_world_reads_its_time() {
    let epoch = Duration::from_millis(1_790_000_000_000);
    std::thread::spawn(move || {
        follow_world(epoch);
        assert_eq!(since_1970(), epoch);
        set_world_time(Duration::from_millis(25_075));
        assert_eq!(since_1970(), epoch + Duration::from_millis(25_075));
        // The monotonic clock is the kernel's still: a read through the replaced function
        // falls between two reads straight from the kernel.
        let (before, ours, after) = (kernel_monotonic(), monotonic(), kernel_monotonic());
        assert!(
            before <= ours && ours <= after,
            "{before:?} {ours:?} {after:?}"
        );
    })
    .join()
    .expect("the following thread");
}

#[test]
fn other_threads_read_the_real_clock() {
    let real = since_1970();
    std::thread::spawn(|| follow_world(Duration::ZERO))
        .join()
        .expect("a following thread");
    set_world_time(Duration::from_secs(3));
    let now = since_1970();
    assert!(
        now >= real && now - real < Duration::from_secs(60),
        "{now:?}"
    );
}
