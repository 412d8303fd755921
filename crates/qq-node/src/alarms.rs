//! Memory and disk alarms, as RabbitMQ's: while this node's resident memory is above its high
//! watermark, or the free space of its data directory's file system is below its limit, the
//! node refuses publishes with RESOURCE_EXHAUSTED naming the alarm. Deliveries, acks, settles,
//! Gets and dead-letter transfers keep flowing: they free memory and disk. An alarm clears
//! when the node is back on the right side of its bound; setting and clearing are logged, and
//! `ClusterStatus` lists the alarms of the node that answers.
//!
//! Checked on a timer (`alarm_check_ms`) by one task of the node: RSS from `/proc/self/status`,
//! total memory from `/proc/meminfo`, free disk from `statvfs(data_dir)`.
//!
//! Must not: block a request (the API reads two atomics), or stop consumers.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Config;

/// The bounds a node watches, resolved from the config at start.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// Resident memory above this sets the memory alarm.
    pub memory_high_watermark_bytes: u64,
    /// Free disk below this sets the disk alarm.
    pub disk_free_limit_bytes: u64,
    pub data_dir: PathBuf,
    pub every: Duration,
}

impl Bounds {
    pub fn from_config(config: &Config) -> anyhow::Result<Bounds> {
        let memory_high_watermark_bytes = match config.memory_high_watermark_bytes {
            Some(bytes) => bytes,
            None => (total_memory_bytes()? as f64 * config.memory_high_watermark) as u64,
        };
        Ok(Bounds {
            memory_high_watermark_bytes,
            disk_free_limit_bytes: config.disk_free_limit,
            data_dir: config.data_dir.clone(),
            every: Duration::from_millis(config.alarm_check_ms),
        })
    }
}

/// The node's alarms. Cheap to read from every publish.
#[derive(Default)]
pub struct Alarms {
    memory: AtomicBool,
    disk: AtomicBool,
    /// Last measured RSS and free disk, for the alarm's message.
    rss_bytes: AtomicU64,
    free_disk_bytes: AtomicU64,
    memory_limit: AtomicU64,
    disk_limit: AtomicU64,
}

impl Alarms {
    /// Why publishes are refused right now, if they are.
    pub fn publish_refusal(&self) -> Option<String> {
        let mut why = Vec::new();
        if self.memory.load(Ordering::Relaxed) {
            why.push(format!(
                "memory alarm: resident memory {} bytes is above memory_high_watermark {} bytes",
                self.rss_bytes.load(Ordering::Relaxed),
                self.memory_limit.load(Ordering::Relaxed)
            ));
        }
        if self.disk.load(Ordering::Relaxed) {
            why.push(format!(
                "disk alarm: {} bytes free on the data directory's disk, below disk_free_limit {} bytes",
                self.free_disk_bytes.load(Ordering::Relaxed),
                self.disk_limit.load(Ordering::Relaxed)
            ));
        }
        (!why.is_empty()).then(|| {
            format!(
                "{}; publishes are refused until it clears (consumers keep draining)",
                why.join("; ")
            )
        })
    }

    /// The alarms set now, by name (`memory`, `disk`).
    pub fn active(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.memory.load(Ordering::Relaxed) {
            v.push("memory".to_string());
        }
        if self.disk.load(Ordering::Relaxed) {
            v.push("disk".to_string());
        }
        v
    }

    /// Measure once and set or clear each alarm, logging a change.
    pub fn check(&self, bounds: &Bounds) {
        self.memory_limit
            .store(bounds.memory_high_watermark_bytes, Ordering::Relaxed);
        self.disk_limit
            .store(bounds.disk_free_limit_bytes, Ordering::Relaxed);
        // Above the watermark, first hand freed heap back to the OS: memory freed by deleted
        // queues and drained messages stays resident otherwise (glibc's until trimmed,
        // jemalloc's until its dirty pages decay), and the alarm would clear late or never.
        let rss = rss_bytes().map(|rss| {
            if rss > bounds.memory_high_watermark_bytes {
                release_free_heap();
                rss_bytes().unwrap_or(rss)
            } else {
                rss
            }
        });
        match rss {
            Ok(rss) => {
                self.rss_bytes.store(rss, Ordering::Relaxed);
                let over = rss > bounds.memory_high_watermark_bytes;
                flip(&self.memory, over, "memory", || {
                    format!(
                        "resident memory {rss} bytes, memory_high_watermark {} bytes",
                        bounds.memory_high_watermark_bytes
                    )
                });
            }
            Err(e) => warn!("memory alarm: cannot read this process's RSS: {e}"),
        }
        match free_disk_bytes(&bounds.data_dir) {
            Ok(free) => {
                self.free_disk_bytes.store(free, Ordering::Relaxed);
                let under = free < bounds.disk_free_limit_bytes;
                flip(&self.disk, under, "disk", || {
                    format!(
                        "{free} bytes free, disk_free_limit {} bytes",
                        bounds.disk_free_limit_bytes
                    )
                });
            }
            Err(e) => warn!(
                "disk alarm: cannot read free space of {}: {e}",
                bounds.data_dir.display()
            ),
        }
    }

    /// Check every `bounds.every` until `stop`.
    pub async fn watch(&self, bounds: Bounds, stop: CancellationToken) {
        let mut tick = tokio::time::interval(bounds.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            self.check(&bounds);
        }
    }
}

fn flip(flag: &AtomicBool, now: bool, name: &str, detail: impl FnOnce() -> String) {
    if flag.swap(now, Ordering::Relaxed) != now {
        if now {
            warn!(
                alarm = name,
                "{name} alarm set: {}; publishes are refused",
                detail()
            );
        } else {
            info!(
                alarm = name,
                "{name} alarm cleared: {}; publishes accepted again",
                detail()
            );
        }
    }
}

/// The value in kB of `key` in a /proc file of `key: value kB` lines, in bytes.
fn proc_kb(path: &str, key: &str) -> std::io::Result<u64> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .map(|kb: u64| kb * 1024)
        .ok_or_else(|| std::io::Error::other(format!("no '{key}' in {path}")))
}

/// This process's resident memory (VmRSS), in bytes.
pub fn rss_bytes() -> std::io::Result<u64> {
    proc_kb("/proc/self/status", "VmRSS:")
}

fn total_memory_bytes() -> anyhow::Result<u64> {
    Ok(proc_kb("/proc/meminfo", "MemTotal:")?)
}

/// Bytes available to this (unprivileged-equivalent) process on `dir`'s file system.
fn free_disk_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    // SAFETY: `path` is a valid NUL-terminated string and `stat` a zeroed out-parameter that
    // statvfs fills; nothing is retained after the call.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(memory: u64, disk: u64) -> Bounds {
        Bounds {
            memory_high_watermark_bytes: memory,
            disk_free_limit_bytes: disk,
            data_dir: std::env::temp_dir(),
            every: Duration::from_secs(1),
        }
    }

    #[test]
    fn alarms_set_and_clear_with_the_bounds() {
        let alarms = Alarms::default();
        alarms.check(&bounds(u64::MAX, 0));
        assert_eq!(alarms.active(), Vec::<String>::new());
        assert!(alarms.publish_refusal().is_none());

        alarms.check(&bounds(1, u64::MAX));
        assert_eq!(alarms.active(), vec!["memory", "disk"]);
        let why = alarms.publish_refusal().unwrap();
        assert!(why.contains("memory_high_watermark") && why.contains("disk_free_limit"));

        alarms.check(&bounds(u64::MAX, 0));
        assert!(alarms.active().is_empty(), "both clear");
    }

    #[test]
    fn measurements_are_read() {
        assert!(rss_bytes().unwrap() > 0);
        assert!(total_memory_bytes().unwrap() > 0);
        assert!(free_disk_bytes(&std::env::temp_dir()).unwrap() > 0);
    }
}

/// Returns the allocators' free pages to the OS: jemalloc's (the node's allocator, `main.rs`:
/// its dirty pages otherwise decay over seconds) and glibc's (RocksDB's C++ allocations,
/// `malloc_trim`).
pub fn release_free_heap() {
    #[cfg(not(target_env = "msvc"))]
    // SAFETY: `arena.<MALLCTL_ARENAS_ALL>.purge` takes and returns nothing (null pointers,
    // zero length); the name is NUL-terminated. Unknown to a build without jemalloc arenas in
    // use, it purges nothing.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"arena.4096.purge".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}
