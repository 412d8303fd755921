//! Scenario 9, quorumq only: the idle CPU of a queue's leader node while a large number of
//! messages wait in the queue's delayed set (requeued with a one-hour delay).
//!
//! The delayed set costs no polling: the leader keeps one timer for the earliest due time
//! (`QueueState::next_deadline`), so with nothing due for an hour the node should idle as if
//! the queue were empty. The scenario measures exactly that: the leader's CPU (utime + stime
//! from `/proc/<pid>/stat`, one sample every 3 s, the median as % of one core) on an empty
//! queue, then again with `delayed_messages` delayed ones. Issue 16's bound: 1 000 000
//! delayed messages must not raise it above 2 % of a core.
//!
//! Setup: publish the messages (64-byte bodies, pipelined with confirms), consume them with a
//! prefetch of 1 000 and requeue each batch of 500 with `delay_ms` = 1 hour. RabbitMQ has no
//! delayed requeue, so its side is not measured.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use qq_client::{PublishOutcome, SettleOutcome};

use crate::System;
use crate::cluster::Cluster;
use crate::driver::{QueueSpec, qq_address};
use crate::scenarios::{Better, Outcome, Settings, declare_on};

const QUEUE: &str = "bench-delayed";
const DELAY_MS: u64 = 3_600_000;
const PREFETCH: u32 = 1_000;
const SETTLE_BATCH: usize = 500;
/// One CPU sample: long enough that one clock tick (10 ms at the usual 100 Hz) is 0.33 % of
/// a core, well below the 2 % bound.
const SAMPLE: Duration = Duration::from_secs(3);
/// Quiet time before sampling: the node finishes what the setup left (snapshots, compaction).
const SETTLE_DOWN: Duration = Duration::from_secs(10);

/// CPU time of a process so far, in clock ticks (utime + stime of `/proc/<pid>/stat`).
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed /proc/pid/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let utime: u64 = fields.get(11).context("no utime")?.parse()?;
    let stime: u64 = fields.get(12).context("no stime")?.parse()?;
    Ok(utime + stime)
}

fn clock_ticks_per_s() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The median CPU use of the processes `pids` together over `samples` samples of [`SAMPLE`],
/// in % of one core, and every sample.
pub(crate) async fn idle_cpu_percent(pids: &[u32], samples: usize) -> Result<(f64, Vec<f64>)> {
    let hz = clock_ticks_per_s();
    let ticks = || -> Result<u64> { pids.iter().map(|p| cpu_ticks(*p)).sum() };
    let mut values = Vec::with_capacity(samples);
    let mut last = (ticks()?, Instant::now());
    for _ in 0..samples {
        tokio::time::sleep(SAMPLE).await;
        let now = (ticks()?, Instant::now());
        let cpu_s = (now.0 - last.0) as f64 / hz;
        values.push(100.0 * cpu_s / (now.1 - last.1).as_secs_f64());
        last = now;
    }
    let mut sorted = values.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    Ok((median, values))
}

pub async fn delayed_idle_cpu(cl: &mut Cluster, s: &Settings) -> Result<Outcome> {
    let mut out = Outcome::default();
    if cl.system() != System::Quorumq {
        out.notes
            .push("no delayed requeue in RabbitMQ: scenario 9 measures quorumq only".into());
        return Ok(out);
    }
    let n = s.delayed_messages;
    let leader = declare_on(cl, 0, QUEUE, &QueueSpec::default()).await?;
    let pid = cl.pid(leader).context("the leader's pid")?;
    let client = qq_client::Client::connect(&qq_address(leader)).await?;

    tokio::time::sleep(SETTLE_DOWN).await;
    let (empty, _) = idle_cpu_percent(&[pid], s.idle_cpu_samples).await?;
    out.figure(
        9,
        "leader idle CPU, empty queue",
        "% core",
        Better::Lower,
        empty,
    );

    let t = Instant::now();
    let mut publisher = client.publisher(s.window).await?;
    let body = bytes::Bytes::from(vec![b'x'; 64]);
    let check = |c: qq_client::Confirm| -> Result<()> {
        ensure!(c.outcome == PublishOutcome::Confirmed, "publish: {c:?}");
        Ok(())
    };
    for _ in 0..n {
        publisher
            .send("", QUEUE, qq_client::message(body.clone()))
            .await?;
        for c in publisher.take_confirms() {
            check(c)?;
        }
    }
    for c in publisher.close().await? {
        check(c)?;
    }
    let published_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let mut consumer = client.consume(QUEUE, PREFETCH).await?;
    let mut tags = Vec::with_capacity(SETTLE_BATCH);
    let mut requeued = 0u64;
    while requeued < n {
        let d = tokio::time::timeout(Duration::from_secs(60), consumer.next())
            .await
            .context("no delivery for 60 s")?
            .context("consume stream ended")??;
        tags.push(d.delivery_tag);
        if tags.len() == SETTLE_BATCH || requeued + tags.len() as u64 == n {
            requeued += tags.len() as u64;
            let batch = std::mem::take(&mut tags);
            consumer
                .settle_with(batch, false, SettleOutcome::Requeue, None, Some(DELAY_MS))
                .await?;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let q = client.get_queue(QUEUE).await?;
        if q.messages_delayed == n {
            break;
        }
        if Instant::now() > deadline {
            bail!("{} of {n} messages delayed after 120 s", q.messages_delayed);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let requeued_s = t.elapsed().as_secs_f64();
    consumer.cancel().await.ok();
    drop(consumer);

    tokio::time::sleep(SETTLE_DOWN).await;
    let (delayed, samples) = idle_cpu_percent(&[pid], s.idle_cpu_samples).await?;
    out.figure(
        9,
        "leader idle CPU, delayed messages",
        "% core",
        Better::Lower,
        delayed,
    );
    out.notes.push(format!(
        "{n} delayed messages ({DELAY_MS} ms delay) on node {}: published in {published_s:.0} s, \
         delivered and requeued in {requeued_s:.0} s; idle samples (% core): {}",
        leader + 1,
        samples
            .iter()
            .map(|v| format!("{v:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    if let Some(rss) = cl.rss_kib().get(leader).copied().flatten() {
        out.notes.push(format!(
            "leader RSS with the delayed set: {} MiB",
            rss / 1024
        ));
    }
    client.delete_queue(QUEUE, false, false).await.ok();
    Ok(out)
}
