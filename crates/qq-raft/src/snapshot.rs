//! Snapshot files: a group's snapshot is written, kept, sent and read in bounded pieces, never
//! whole in memory.
//!
//! # What
//!
//! A snapshot is a file in the node's snapshot directory ([`SnapshotDir`], `<db>/snapshots`):
//!
//! ```text
//! "QQSNAP01"                          magic and format version
//! record*                             tag (1 byte), length (u32 LE), CRC-32 of the payload (u32 LE), payload
//!   HEADER  (once, first)             the machine's encoded state (queue headers, metadata)
//!   BODY    (any number)              message id (u64 BE) ++ body
//!   END     (once, last)              number of BODY records (u64 LE)
//! ```
//!
//! [`SnapshotWriter`] streams records through a buffered file and publishes the file with an
//! fsync and a rename; [`SnapshotReader`] streams them back and fails on a bad checksum, a
//! missing header or a missing end (a truncated file). A [`SnapshotFile`] is an open handle:
//! openraft passes it around as the snapshot's data, the network reads it chunk by chunk with
//! positional reads, and a newer snapshot that replaces (unlinks) the file does not pull it
//! from under a transfer that still reads it.
//!
//! Between nodes a snapshot travels in chunks of at most [`SNAPSHOT_CHUNK_BYTES`]
//! ([`SnapshotChunk`]); the receiver appends them to a part file and answers the offset it
//! expects next, so a broken transfer resumes where the receiver stands ([`SnapshotDir::receive`]).
//! When the last byte is in, the part file is synced and renamed, and the node hands it to the
//! group's Raft, whose state machine installs it by streaming.
//!
//! # Why files
//!
//! A queue's snapshot holds the bodies of all its live messages: a million 1 KiB messages make a
//! 1 GiB snapshot. Built as one buffer it cost the leader several times that in memory (read,
//! encode, store, send), and every follower the same again to receive and install it. As a file
//! it costs one chunk in memory at each step, and the disk holds what memory used to.
//!
//! # File names
//!
//! `g{group}-{log id}.snap` is a group's current snapshot (the `sm` column family names it);
//! `*.tmp` (being written) and `recv-*` (being received, or received and not yet installed) are
//! removed at start ([`SnapshotDir::open`]). Two snapshots of one group at the same log id hold
//! the same state, so a rename over an existing name is harmless.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::alias::{LogIdOf, SnapshotMetaOf, VoteOf};
use openraft::raft::SnapshotResponse;
use serde::{Deserialize, Serialize};

use crate::types::{GroupId, TypeConfig};

/// Most bytes of snapshot data in one message between nodes (the byte budget of a chunk).
pub const SNAPSHOT_CHUNK_BYTES: usize = 4 << 20;
/// Largest snapshot a node accepts from a peer; a larger announced size is refused.
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 40;
/// Buffer of the writer and the reader (what a snapshot costs in memory while streamed).
const IO_BUFFER_BYTES: usize = 1 << 20;

const MAGIC: &[u8; 8] = b"QQSNAP01";
const TAG_HEADER: u8 = 1;
const TAG_BODY: u8 = 2;
const TAG_END: u8 = 3;
const SUFFIX: &str = ".snap";
const TMP_SUFFIX: &str = ".tmp";
const RECV_PREFIX: &str = "recv-";

/// A snapshot file, open. Cheap to clone; reads are positional, so clones do not interfere.
#[derive(Clone, Debug)]
pub struct SnapshotFile {
    file: Arc<File>,
    len: u64,
    path: PathBuf,
}

impl SnapshotFile {
    pub fn open(path: &Path) -> io::Result<SnapshotFile> {
        let file = File::open(path).map_err(|e| at(path, "open snapshot", e))?;
        let len = file.metadata()?.len();
        Ok(SnapshotFile {
            file: Arc::new(file),
            len,
            path: path.to_path_buf(),
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Up to `max` bytes from `offset` (fewer only at the end of the file).
    pub fn read_chunk(&self, offset: u64, max: usize) -> io::Result<Vec<u8>> {
        let n = (self.len.saturating_sub(offset)).min(max as u64) as usize;
        let mut buf = vec![0u8; n];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| at(&self.path, "read snapshot chunk", e))?;
        Ok(buf)
    }

    /// A streaming reader from the start.
    pub fn reader(&self) -> io::Result<SnapshotReader> {
        let mut r = SnapshotReader {
            input: BufReader::with_capacity(
                IO_BUFFER_BYTES,
                PositionalReader {
                    file: self.file.clone(),
                    pos: 0,
                },
            ),
            path: self.path.clone(),
            bodies: 0,
            header_read: false,
            ended: false,
        };
        let mut magic = [0u8; 8];
        r.input
            .read_exact(&mut magic)
            .map_err(|e| at(&self.path, "read snapshot magic", e))?;
        if &magic != MAGIC {
            return Err(at(
                &self.path,
                "read snapshot",
                "not a quorumq snapshot file",
            ));
        }
        Ok(r)
    }
}

struct PositionalReader {
    file: Arc<File>,
    pos: u64,
}

impl Read for PositionalReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Streams a snapshot file's records: [`SnapshotReader::header`] first, then
/// [`SnapshotReader::next_body`] until it returns `None`.
pub struct SnapshotReader {
    input: BufReader<PositionalReader>,
    path: PathBuf,
    bodies: u64,
    header_read: bool,
    ended: bool,
}

impl SnapshotReader {
    fn record(&mut self) -> io::Result<(u8, Vec<u8>)> {
        let mut head = [0u8; 9];
        self.input
            .read_exact(&mut head)
            .map_err(|e| at(&self.path, "read snapshot record (truncated file?)", e))?;
        let tag = head[0];
        let len = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(head[5..9].try_into().expect("4 bytes"));
        let mut payload = vec![0u8; len];
        self.input
            .read_exact(&mut payload)
            .map_err(|e| at(&self.path, "read snapshot record (truncated file?)", e))?;
        if crc32fast::hash(&payload) != crc {
            return Err(at(&self.path, "read snapshot", "record checksum mismatch"));
        }
        Ok((tag, payload))
    }

    /// The machine's encoded state (the first record).
    pub fn header(&mut self) -> io::Result<Vec<u8>> {
        if self.header_read {
            return Err(at(&self.path, "read snapshot", "header read twice"));
        }
        let (tag, payload) = self.record()?;
        if tag != TAG_HEADER {
            return Err(at(
                &self.path,
                "read snapshot",
                "first record is not the header",
            ));
        }
        self.header_read = true;
        Ok(payload)
    }

    /// The next `(message id, body)`, or `None` at the end record (whose count is checked).
    pub fn next_body(&mut self) -> io::Result<Option<(u64, Vec<u8>)>> {
        if !self.header_read {
            return Err(at(
                &self.path,
                "read snapshot",
                "bodies read before the header",
            ));
        }
        if self.ended {
            return Ok(None);
        }
        let (tag, mut payload) = self.record()?;
        match tag {
            TAG_BODY if payload.len() >= 8 => {
                let id = u64::from_be_bytes(payload[..8].try_into().expect("8 bytes"));
                payload.drain(..8);
                self.bodies += 1;
                Ok(Some((id, payload)))
            }
            TAG_END if payload.len() == 8 => {
                let count = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
                if count != self.bodies {
                    return Err(at(
                        &self.path,
                        "read snapshot",
                        format!("end record counts {count} bodies, read {}", self.bodies),
                    ));
                }
                self.ended = true;
                Ok(None)
            }
            _ => Err(at(
                &self.path,
                "read snapshot",
                format!("bad record (tag {tag})"),
            )),
        }
    }
}

/// Writes a snapshot file: [`SnapshotWriter::header`] once, then bodies, then
/// [`SnapshotWriter::finish`] (fsync and rename). Dropped unfinished, it leaves a `.tmp` file
/// that the next start removes.
pub struct SnapshotWriter {
    out: BufWriter<File>,
    tmp: PathBuf,
    dest: PathBuf,
    bodies: u64,
    header_written: bool,
}

impl SnapshotWriter {
    fn create(dest: PathBuf) -> io::Result<SnapshotWriter> {
        let mut tmp = dest.clone().into_os_string();
        tmp.push(TMP_SUFFIX);
        let tmp = PathBuf::from(tmp);
        let file = File::create(&tmp).map_err(|e| at(&tmp, "create snapshot", e))?;
        let mut out = BufWriter::with_capacity(IO_BUFFER_BYTES, file);
        out.write_all(MAGIC)
            .map_err(|e| at(&tmp, "write snapshot", e))?;
        Ok(SnapshotWriter {
            out,
            tmp,
            dest,
            bodies: 0,
            header_written: false,
        })
    }

    fn record(&mut self, tag: u8, parts: &[&[u8]]) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let len = u32::try_from(len).map_err(|_| {
            at(
                &self.tmp,
                "write snapshot",
                format!("record of {len} bytes is over 4 GiB"),
            )
        })?;
        let mut crc = crc32fast::Hasher::new();
        for p in parts {
            crc.update(p);
        }
        let mut head = [0u8; 9];
        head[0] = tag;
        head[1..5].copy_from_slice(&len.to_le_bytes());
        head[5..9].copy_from_slice(&crc.finalize().to_le_bytes());
        self.out
            .write_all(&head)
            .and_then(|()| parts.iter().try_for_each(|p| self.out.write_all(p)))
            .map_err(|e| at(&self.tmp, "write snapshot", e))
    }

    /// The machine's encoded state; must come first, once.
    pub fn header(&mut self, state: &[u8]) -> io::Result<()> {
        if self.header_written {
            return Err(at(&self.tmp, "write snapshot", "header written twice"));
        }
        self.header_written = true;
        self.record(TAG_HEADER, &[state])
    }

    pub fn body(&mut self, id: u64, body: &[u8]) -> io::Result<()> {
        if !self.header_written {
            return Err(at(&self.tmp, "write snapshot", "body before the header"));
        }
        self.bodies += 1;
        self.record(TAG_BODY, &[&id.to_be_bytes(), body])
    }

    /// Ends the file, makes it durable and gives it its name.
    pub fn finish(mut self) -> io::Result<SnapshotFile> {
        if !self.header_written {
            return Err(at(&self.tmp, "write snapshot", "no header"));
        }
        let count = self.bodies.to_le_bytes();
        self.record(TAG_END, &[&count])?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| at(&self.tmp, "write snapshot", e.error().to_string()))?;
        file.sync_all()
            .map_err(|e| at(&self.tmp, "fsync snapshot", e))?;
        fs::rename(&self.tmp, &self.dest).map_err(|e| at(&self.dest, "rename snapshot", e))?;
        sync_parent(&self.dest)?;
        SnapshotFile::open(&self.dest)
    }
}

/// One snapshot chunk on the wire. The receiver names the file itself from `meta`: nothing a
/// peer sends becomes a path.
#[derive(Serialize, Deserialize)]
pub struct SnapshotChunk {
    pub vote: VoteOf<TypeConfig>,
    pub meta: SnapshotMetaOf<TypeConfig>,
    /// Size of the whole snapshot file.
    pub total: u64,
    /// Where `data` goes in the file.
    pub offset: u64,
    /// At most [`SNAPSHOT_CHUNK_BYTES`]; empty to ask where the receiver stands.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// The receiver's answer to a chunk.
#[derive(Serialize, Deserialize)]
pub enum ChunkReply {
    /// Send from this offset next (also the answer to a chunk that was not where expected).
    Next(u64),
    /// The snapshot is complete and was handed to the group's Raft, which answered this.
    Done(SnapshotResponse<TypeConfig>),
}

/// What [`SnapshotDir::receive`] made of a chunk.
pub enum Received {
    /// Expecting more, from this offset.
    Next(u64),
    /// The whole file is in, durable; install it (and remove it if the install fails).
    Complete(SnapshotFile),
}

/// A transfer in progress: the part file and how much of it is written.
struct Receiving {
    name: String,
    total: u64,
    file: File,
    len: u64,
}

/// The node's snapshot directory, and the transfers it is receiving (one per group at most).
pub struct SnapshotDir {
    path: PathBuf,
    receiving: Mutex<HashMap<GroupId, Arc<Mutex<Option<Receiving>>>>>,
}

impl SnapshotDir {
    /// Opens (creates) the directory and removes what a stop left half done: files being
    /// written or received.
    pub fn open(path: &Path) -> io::Result<SnapshotDir> {
        fs::create_dir_all(path).map_err(|e| at(path, "create snapshot directory", e))?;
        for entry in fs::read_dir(path).map_err(|e| at(path, "list snapshot directory", e))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(TMP_SUFFIX) || name.starts_with(RECV_PREFIX) {
                fs::remove_file(entry.path()).map_err(|e| at(&entry.path(), "remove", e))?;
            }
        }
        Ok(SnapshotDir {
            path: path.to_path_buf(),
            receiving: Mutex::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file name of `group`'s snapshot at `log_id`.
    pub fn name(group: GroupId, log_id: Option<&LogIdOf<TypeConfig>>) -> String {
        let id: String = match log_id {
            Some(l) => l
                .to_string()
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect(),
            None => "none".into(),
        };
        format!("g{group}-{id}{SUFFIX}")
    }

    /// The group a snapshot file name belongs to (`None` for other files).
    pub fn group_of(name: &str) -> Option<GroupId> {
        let rest = name.strip_suffix(SUFFIX)?.strip_prefix('g')?;
        rest.split('-').next()?.parse().ok()
    }

    /// Every snapshot file name of `group` in the directory.
    pub fn names_of(&self, group: GroupId) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.path).map_err(|e| at(&self.path, "list", e))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if Self::group_of(&name) == Some(group) {
                out.push(name);
            }
        }
        Ok(out)
    }

    /// All snapshot file names (of every group).
    pub fn all_names(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.path).map_err(|e| at(&self.path, "list", e))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if Self::group_of(&name).is_some() {
                out.push(name);
            }
        }
        Ok(out)
    }

    /// A writer of `group`'s snapshot at `log_id`.
    pub fn writer(
        &self,
        group: GroupId,
        log_id: Option<&LogIdOf<TypeConfig>>,
    ) -> io::Result<SnapshotWriter> {
        SnapshotWriter::create(self.path.join(Self::name(group, log_id)))
    }

    /// Gives `file` its name as `group`'s snapshot at `log_id` (a received file is renamed).
    pub fn adopt(
        &self,
        file: SnapshotFile,
        group: GroupId,
        log_id: Option<&LogIdOf<TypeConfig>>,
    ) -> io::Result<SnapshotFile> {
        let dest = self.path.join(Self::name(group, log_id));
        if file.path == dest {
            return Ok(file);
        }
        fs::rename(&file.path, &dest).map_err(|e| at(&dest, "rename snapshot", e))?;
        sync_parent(&dest)?;
        Ok(SnapshotFile { path: dest, ..file })
    }

    /// Removes a snapshot file by name (a missing one is fine).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let path = self.path.join(name);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(at(&path, "remove snapshot", e)),
            _ => Ok(()),
        }
    }

    /// Takes one chunk of a snapshot of `group` from a peer. Blocking file IO: call it from a
    /// blocking thread. A chunk for another snapshot than the one being received starts over
    /// (the old part file is dropped); a chunk that is not at the expected offset is not written
    /// and the expected offset is answered, which is also how a sender resumes.
    pub fn receive(&self, group: GroupId, chunk: &SnapshotChunk) -> io::Result<Received> {
        if chunk.data.len() > SNAPSHOT_CHUNK_BYTES {
            return Err(io::Error::other(format!(
                "snapshot chunk of {} bytes, more than {SNAPSHOT_CHUNK_BYTES}",
                chunk.data.len()
            )));
        }
        if chunk.total == 0 || chunk.total > MAX_SNAPSHOT_BYTES {
            return Err(io::Error::other(format!(
                "snapshot size {}: must be between 1 and {MAX_SNAPSHOT_BYTES}",
                chunk.total
            )));
        }
        if chunk.offset.saturating_add(chunk.data.len() as u64) > chunk.total {
            return Err(io::Error::other(format!(
                "snapshot chunk at {} of {} bytes goes past the size {}",
                chunk.offset,
                chunk.data.len(),
                chunk.total
            )));
        }
        let slot = self
            .receiving
            .lock()
            .expect("snapshot receiving lock poisoned")
            .entry(group)
            .or_default()
            .clone();
        let mut slot = slot.lock().expect("snapshot slot lock poisoned");
        let name = Self::name(group, chunk.meta.last_log_id.as_ref());
        let same = slot
            .as_ref()
            .is_some_and(|r| r.name == name && r.total == chunk.total);
        if !same {
            if let Some(old) = slot.take() {
                let _ = fs::remove_file(self.part_path(&old.name));
            }
            let path = self.part_path(&name);
            let file = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(&path)
                .map_err(|e| at(&path, "create snapshot part", e))?;
            *slot = Some(Receiving {
                name: name.clone(),
                total: chunk.total,
                file,
                len: 0,
            });
        }
        let r = slot.as_mut().expect("set above");
        if chunk.offset != r.len || chunk.data.is_empty() {
            return Ok(Received::Next(r.len));
        }
        let path = self.part_path(&name);
        r.file
            .write_all(&chunk.data)
            .map_err(|e| at(&path, "write snapshot part", e))?;
        r.len += chunk.data.len() as u64;
        if r.len < r.total {
            return Ok(Received::Next(r.len));
        }
        let done = slot.take().expect("set above");
        done.file
            .sync_all()
            .map_err(|e| at(&path, "fsync snapshot part", e))?;
        let dest = self.path.join(format!("{RECV_PREFIX}{name}"));
        fs::rename(&path, &dest).map_err(|e| at(&dest, "rename received snapshot", e))?;
        sync_parent(&dest)?;
        Ok(Received::Complete(SnapshotFile::open(&dest)?))
    }

    fn part_path(&self, name: &str) -> PathBuf {
        self.path.join(format!("{RECV_PREFIX}{name}.part"))
    }
}

fn sync_parent(path: &Path) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| at(dir, "fsync directory", e))
}

fn at(path: &Path, what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests;
