//! A small tmpfs for a node's data directory: a disk that fills (or frees) on cue. Mounting
//! needs root, as CI runs the tests.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

/// A tmpfs of a given size on a temporary directory, unmounted on drop.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size_mib: u64) -> anyhow::Result<Tmpfs> {
        let dir = tempfile::Builder::new()
            .prefix("qq-small-disk-")
            .tempdir()?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .context("run mount (the test needs root)")?;
        if !out.status.success() {
            bail!(
                "mount a {size_mib} MiB tmpfs (the test needs root): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(Tmpfs { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Bytes free on it now (`df`).
    pub fn free_bytes(&self) -> anyhow::Result<u64> {
        let out = Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(self.dir.path())
            .output()
            .context("run df")?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .with_context(|| format!("df output: {text}"))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}
