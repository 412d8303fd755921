use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{follow_world, set_world_time};

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
        // The monotonic clock is the real one still.
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(start.elapsed() >= Duration::from_millis(5));
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
