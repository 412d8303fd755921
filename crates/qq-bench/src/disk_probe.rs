//! A witness for the machine's disk while scenario 2 measures latency.
//!
//! On this kind of machine (a small VM whose disk is a file on a shared host) a broker's
//! confirm p99 is often decided by stalls of 100-1 000 ms in which no fsync on the machine
//! completes, whichever broker is running. A p99 alone cannot say whether the broker or the
//! machine stalled. So beside the measured flows a thread of its own writes 4 KiB and calls
//! `fdatasync` every [`INTERVAL`] on a file in the run directory (the brokers' filesystem), and
//! times each round. Its p99 and its worst round go into the results next to the broker's
//! latencies: a broker p99 of 300 ms beside a probe maximum of 250 ms is the machine's; beside
//! a probe maximum of 2 ms it is the broker's.
//!
//! The probe adds 100 small synced writes per second, the same for both brokers. Rounds that
//! start before `record_from` (the flows' warm-up) are not counted.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Time between the starts of two rounds (a round that takes longer starts the next at once).
pub const INTERVAL: Duration = Duration::from_millis(10);

/// Bytes written (and synced) each round.
const WRITE: usize = 4096;

/// The file is rewound after this many rounds, so it never grows past 4 MiB.
const ROUNDS_PER_FILE: u32 = 1024;

/// A running probe; [`DiskProbe::finish`] stops it and sums it up.
pub struct DiskProbe {
    /// Dropping it stops the probe, at once even between two rounds.
    stop: mpsc::Sender<()>,
    thread: JoinHandle<io::Result<Vec<Duration>>>,
    path: PathBuf,
}

/// What the probe saw: every counted round's time, summed up.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSummary {
    pub rounds: usize,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Rounds of 50 ms or more.
    pub over_50ms: usize,
}

impl DiskProbe {
    /// Starts the probe on a file of its own in `dir`; rounds that start before `record_from`
    /// are not counted.
    pub fn start(dir: &Path, record_from: Instant) -> io::Result<DiskProbe> {
        let path = dir.join("disk-probe");
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)?;
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("disk-probe".into())
            .spawn(move || rounds(file, &stopped, record_from))?;
        Ok(DiskProbe { stop, thread, path })
    }

    /// Stops the probe, removes its file and sums up the counted rounds (`None` when none
    /// was counted); an I/O error of the probe is returned as it came.
    pub fn finish(self) -> io::Result<Option<ProbeSummary>> {
        drop(self.stop);
        let times = self
            .thread
            .join()
            .map_err(|_| io::Error::other("the disk probe thread panicked"))??;
        let _ = fs::remove_file(&self.path);
        Ok(summarize(times))
    }
}

fn rounds(
    mut file: File,
    stopped: &mpsc::Receiver<()>,
    record_from: Instant,
) -> io::Result<Vec<Duration>> {
    let block = [0x5au8; WRITE];
    let mut times = Vec::new();
    let mut n = 0u32;
    // At least one round, however soon the probe is stopped.
    loop {
        let start = Instant::now();
        if n == ROUNDS_PER_FILE {
            file.rewind()?;
            n = 0;
        }
        file.write_all(&block)?;
        file.sync_data()?;
        n += 1;
        let took = start.elapsed();
        if start >= record_from {
            times.push(took);
        }
        // The rest of the interval, or the stop, whichever comes first.
        match stopped.recv_timeout(INTERVAL.saturating_sub(took)) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return Ok(times),
        }
    }
}

/// Nearest-rank p99 and the maximum of `times`, in ms; `None` for no rounds.
fn summarize(mut times: Vec<Duration>) -> Option<ProbeSummary> {
    if times.is_empty() {
        return None;
    }
    times.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let rank = (times.len() * 99).div_ceil(100).max(1);
    Some(ProbeSummary {
        rounds: times.len(),
        p99_ms: ms(times[rank - 1]),
        max_ms: ms(times[times.len() - 1]),
        over_50ms: times
            .iter()
            .filter(|t| **t >= Duration::from_millis(50))
            .count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|m| Duration::from_millis(*m)).collect()
    }

    #[test]
    fn the_summary_takes_the_nearest_rank_and_counts_the_stalls() {
        // 200 rounds: 197 of 1 ms, then 60, 70 and 300 ms. Nearest rank of p99 is the 198th.
        let mut times = ms(&[300, 60, 70]);
        times.extend(ms(&[1; 197]));
        let s = summarize(times).unwrap();
        assert_eq!(s.rounds, 200);
        assert_eq!(s.p99_ms, 60.0);
        assert_eq!(s.max_ms, 300.0);
        assert_eq!(s.over_50ms, 3);
        assert_eq!(summarize(Vec::new()), None);
    }

    #[test]
    fn a_probe_counts_only_rounds_after_its_mark_and_removes_its_file() {
        let dir = std::env::temp_dir().join(format!("qq-disk-probe-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let counted = DiskProbe::start(&dir, Instant::now()).unwrap();
        assert!(dir.join("disk-probe").exists());
        let s = counted
            .finish()
            .unwrap()
            .expect("a probe makes at least one round");
        assert!(s.rounds >= 1 && s.max_ms >= s.p99_ms, "{s:?}");
        assert!(!dir.join("disk-probe").exists());

        let later = Instant::now() + Duration::from_secs(3600);
        let not_yet = DiskProbe::start(&dir, later).unwrap();
        assert_eq!(
            not_yet.finish().unwrap(),
            None,
            "no round starts after the mark"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
