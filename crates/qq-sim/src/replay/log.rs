//! The nodes' log of a replay: one file, each line headed by the world's virtual time (ms) and
//! the host whose turn it was when it was written (`[  12345 host2] ...`,
//! [`crate::lockstep::current_host`]; `[world]` between turns), so that a check can read what
//! one node said (the wipe's milestones) and two runs' logs can be compared line by line.

use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::MakeWriter;

use crate::lockstep::current_host;

#[derive(Clone)]
pub(super) struct HostLog(Arc<Mutex<File>>);

impl HostLog {
    pub(super) fn new(file: File) -> HostLog {
        HostLog(Arc::new(Mutex::new(file)))
    }
}

/// One event's text, written with its host's head when the formatter is done with it.
pub(super) struct Line {
    file: Arc<Mutex<File>>,
    text: Vec<u8>,
}

impl Write for Line {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let head = match current_host() {
            Some((h, at)) => format!("[{:>7} host{h}] ", at.as_millis()),
            None => "[world] ".to_string(),
        };
        let mut file = self.file.lock().expect("log");
        // A log line that cannot be written is lost, as a full disk loses it.
        let _ = file.write_all(head.as_bytes());
        let _ = file.write_all(&self.text);
    }
}

impl<'a> MakeWriter<'a> for HostLog {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line {
            file: self.0.clone(),
            text: Vec::new(),
        }
    }
}
