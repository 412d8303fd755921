//! Reading RabbitMQ's internal state while a scenario runs, without disturbing it.
//!
//! A `rabbitmqctl` call starts an Erlang VM: about a second of CPU on this machine each, too
//! much to poll with. Instead one `rabbitmqctl eval` runs a loop inside a node for the whole
//! measurement: every period it evaluates an expression and writes `<unix ms> <numbers…>` to a
//! file (through a rename, so a reader never sees half a line) until a stop file appears or its
//! deadline passes. This process reads the file.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;

use crate::cluster::Cluster;

/// The node name of RabbitMQ node `node` (0-based).
pub fn rabbit_node(node: usize) -> String {
    format!("bench{}@localhost", node + 1)
}

/// The standard output of a finished child, trimmed.
pub fn child_output(child: &mut Child) -> String {
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    out.trim().to_string()
}

/// A loop running inside a RabbitMQ node (see the module documentation).
pub struct ErlLoop {
    child: Child,
    out: PathBuf,
    stop: PathBuf,
}

impl ErlLoop {
    /// Starts the loop on RabbitMQ node `node`. `prelude` is Erlang evaluated once (a sequence
    /// of expressions, each ending with a comma); `step` an expression evaluated every
    /// `period` whose value (iodata) follows the timestamp on the line. `tag` names the files.
    pub fn start(
        cl: &Cluster,
        node: usize,
        tag: &str,
        prelude: &str,
        step: &str,
        period: Duration,
        deadline: Duration,
    ) -> Result<ErlLoop> {
        let base = std::env::temp_dir().join(format!("qq-bench-{tag}-{}", std::process::id()));
        let out = base.with_extension("progress");
        let stop = base.with_extension("stop");
        let tmp = base.with_extension("tmp");
        for f in [&out, &stop, &tmp] {
            let _ = std::fs::remove_file(f);
        }
        let expr = format!(
            r#"{prelude}
Deadline = erlang:monotonic_time(millisecond) + {deadline_ms},
Loop = fun L() ->
    Line = io_lib:format("~b ~s~n", [erlang:system_time(millisecond), {step}]),
    ok = file:write_file("{tmp}", Line),
    ok = file:rename("{tmp}", "{out}"),
    case filelib:is_regular("{stop}") orelse erlang:monotonic_time(millisecond) > Deadline of
        true -> done;
        false -> timer:sleep({period_ms}), L()
    end
end,
Loop()."#,
            deadline_ms = deadline.as_millis(),
            period_ms = period.as_millis(),
            tmp = tmp.display(),
            out = out.display(),
            stop = stop.display(),
        );
        let child = cl.rabbitmqctl_spawn(node, &["eval", &expr])?;
        Ok(ErlLoop { child, out, stop })
    }

    /// The numbers of the latest line, if it is younger than `stale`.
    pub fn read(&self, stale: Duration) -> Option<Vec<i64>> {
        let text = std::fs::read_to_string(&self.out).ok()?;
        let mut v = text.split_whitespace().map(|x| x.parse::<i64>().ok());
        let at_ms = v.next()??;
        let numbers: Option<Vec<i64>> = v.collect();
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()?
            .as_millis() as i64;
        if now_ms - at_ms > stale.as_millis() as i64 {
            return None;
        }
        numbers
    }

    /// Whether the eval ended (it should not before it is stopped): its status and output.
    pub fn ended(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!("{status}: {}", child_output(&mut self.child))),
            _ => None,
        }
    }

    /// Asks the loop to stop, waits up to 10 s for it, then kills the `rabbitmqctl`.
    pub fn stop(mut self) {
        let _ = std::fs::write(&self.stop, b"stop");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for f in [&self.out, &self.stop] {
            let _ = std::fs::remove_file(f);
        }
    }
}
