//! Scenario 8, memory under pressure (issue 12), quorumq only: peak resident memory of the
//! nodes (a) while a consumer with prefetch 0 ("unlimited") never reads a large backlog, and
//! (b) while a publisher floods past the memory alarm.
//!
//! (a) shows the server-side cap on prefetch 0 (`prefetch_zero_cap`, 2 000) and gRPC flow
//! control at work: the queue's leader holds at most the cap in flight, however large the
//! backlog. (b1) restarts the nodes with `memory_high_watermark_bytes` set a little above
//! their size, floods one queue with 64 KiB messages, and reports how far memory went, how
//! many publishes were confirmed and refused, and whether the alarm cleared once the queue was
//! deleted. (b2) does the same with the watermark below every node's size (the alarm is on
//! from the start), to show what a flood costs a node that refuses it. The nodes are
//! restarted with their usual config afterwards.
//!
//! RabbitMQ is left out on purpose: its client (lapin) reads and buffers every delivery itself,
//! so a "consumer that never reads" cannot be built on that side, and its alarm thresholds are
//! not ours to set per scenario.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;

use crate::System;
use crate::cluster::{Cluster, NODES, rss_kib};
use crate::driver::{QueueSpec, qq_address};
use crate::scenarios::{Better, MemorySizes, Outcome, Settings, declare_on};

const SCENARIO: u8 = 8;
const MIB: f64 = 1024.0 * 1024.0;
/// A watermark below any node's resident size (a node idles at well over 64 MiB).
const ALARM_FROM_START: u64 = 64 << 20;

/// Peak resident memory (bytes) of node `node`, sampled every 100 ms while `work` runs.
async fn peak_rss_during<F: Future>(cl: &Cluster, nodes: &[usize], work: F) -> (F::Output, u64) {
    let pids: Vec<u32> = nodes.iter().filter_map(|&n| cl.pid(n)).collect();
    let sample = || pids.iter().filter_map(|&p| rss_kib(p)).max().unwrap_or(0) * 1024;
    let mut peak = sample();
    tokio::pin!(work);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            out = &mut work => return (out, peak.max(sample())),
            _ = tick.tick() => peak = peak.max(sample()),
        }
    }
}

pub async fn memory_bounds(cl: &mut Cluster, s: &Settings) -> Result<Outcome> {
    let mut o = Outcome::default();
    if cl.system() != System::Quorumq {
        o.notes
            .push("quorumq only (see crates/qq-bench/src/memory.rs)".into());
        return Ok(o);
    }
    let sizes = &s.memory;
    prefetch_zero_non_reader(cl, sizes, &mut o).await?;
    // (b1) The watermark a little above the nodes' size now: how far a flood takes memory.
    let idle = cl.rss_kib().into_iter().flatten().max().unwrap_or(0) * 1024;
    let mut flooded = flood(cl, &sizes, &mut o, "flood", idle + sizes.headroom_bytes).await;
    // (b2) The watermark below every node's size: the alarm is on from the start, and the
    // flood is refused; what does refusing cost?
    if flooded.is_ok() {
        flooded = flood(cl, sizes, &mut o, "flood in alarm", ALARM_FROM_START).await;
    }
    // Back to the usual config whatever happened, so the cluster is as the next run expects.
    if let Cluster::Qq(c) = cl {
        c.restart_with(&[])?;
    }
    cl.ensure_up(Duration::from_secs(120)).await?;
    flooded?;
    Ok(o)
}

/// (a): a backlog, then a prefetch-0 consumer that never reads.
async fn prefetch_zero_non_reader(
    cl: &Cluster,
    sizes: &MemorySizes,
    o: &mut Outcome,
) -> Result<()> {
    let queue = "bench.mem.p0";
    let leader = declare_on(cl, 0, queue, &QueueSpec::default()).await?;
    let client = qq_client::Client::connect(&qq_address(leader)).await?;
    let body = Bytes::from(vec![b'm'; sizes.backlog_body]);
    let mut publisher = client.publisher(1000).await?;
    for _ in 0..sizes.backlog {
        publisher
            .send("", queue, qq_client::message(body.clone()))
            .await?;
    }
    let refused = publisher
        .close()
        .await?
        .iter()
        .filter(|c| !c.is_confirmed())
        .count();
    if refused > 0 {
        bail!("{refused} of the backlog's publishes were not confirmed");
    }
    let before = cl.pid(leader).and_then(rss_kib).unwrap_or(0) * 1024;
    let (unacked, peak) = peak_rss_during(cl, &[leader], async {
        // Subscribed, and never read.
        let consumer = client.consume(queue, 0).await?;
        tokio::time::sleep(sizes.hold).await;
        let unacked = client.get_queue(queue).await?.messages_unacked;
        drop(consumer);
        anyhow::Ok(unacked)
    })
    .await;
    let unacked = unacked?;
    o.figure(
        SCENARIO,
        "p0 non-reader: leader RSS before",
        "MiB",
        Better::Lower,
        before as f64 / MIB,
    );
    o.figure(
        SCENARIO,
        "p0 non-reader: leader peak RSS",
        "MiB",
        Better::Lower,
        peak as f64 / MIB,
    );
    o.figure(
        SCENARIO,
        "p0 non-reader: unacked held",
        "msgs",
        Better::Lower,
        unacked as f64,
    );
    o.notes.push(format!(
        "p0 non-reader: backlog {} x {} B = {:.0} MiB; the consumer held {unacked} unacked for {:?}",
        sizes.backlog,
        sizes.backlog_body,
        (sizes.backlog * sizes.backlog_body as u64) as f64 / MIB,
        sizes.hold
    ));
    client.delete_queue(queue, false, false).await?;
    Ok(())
}

/// (b): a publisher flooding with the nodes' `memory_high_watermark_bytes` at `watermark`;
/// figures are named after `label`.
async fn flood(
    cl: &mut Cluster,
    sizes: &MemorySizes,
    o: &mut Outcome,
    label: &str,
    watermark: u64,
) -> Result<()> {
    match cl {
        Cluster::Qq(c) => c.restart_with(&[
            format!("memory_high_watermark_bytes = {watermark}"),
            "alarm_check_ms = 200".to_string(),
        ])?,
        Cluster::Rabbit(_) => bail!("quorumq only"),
    }
    cl.ensure_up(Duration::from_secs(120)).await?;
    let start_rss = cl.rss_kib().into_iter().flatten().max().unwrap_or(0) * 1024;
    let queue = "bench.mem.flood";
    let leader = declare_on(cl, 0, queue, &QueueSpec::default()).await?;
    let client = qq_client::Client::connect(&qq_address(leader)).await?;
    let body = Bytes::from(vec![b'f'; sizes.flood_body]);
    let all: Vec<usize> = (0..NODES).collect();
    let flood = async {
        let (mut confirmed, mut refused, mut alarm_seen) = (0u64, 0u64, false);
        let until = Instant::now() + sizes.flood;
        let mut publisher = client.publisher(64).await?;
        let mut last_status = Instant::now();
        while Instant::now() < until {
            while publisher.in_flight() < 64 {
                publisher
                    .send("", queue, qq_client::message(body.clone()))
                    .await?;
            }
            match publisher.next_confirm().await? {
                Some(c) if c.is_confirmed() => confirmed += 1,
                Some(_) => refused += 1,
                None => {}
            }
            if !alarm_seen && last_status.elapsed() > Duration::from_millis(250) {
                last_status = Instant::now();
                alarm_seen = client
                    .cluster_status()
                    .await?
                    .alarms
                    .iter()
                    .any(|a| a == "memory");
            }
        }
        for c in publisher.close().await? {
            if c.is_confirmed() {
                confirmed += 1;
            } else {
                refused += 1;
            }
        }
        anyhow::Ok((confirmed, refused, alarm_seen))
    };
    let (flooded, peak) = peak_rss_during(cl, &all, flood).await;
    let (confirmed, refused, alarm_seen) = flooded.context("flood")?;
    client.delete_queue(queue, false, false).await?;
    // Does the alarm clear once the queue is gone?
    let t = Instant::now();
    let cleared = loop {
        let alarms = client.cluster_status().await?.alarms;
        if alarms.is_empty() {
            break Some(t.elapsed());
        }
        if t.elapsed() > Duration::from_secs(30) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    o.figure(
        SCENARIO,
        &format!("{label}: watermark"),
        "MiB",
        Better::Lower,
        watermark as f64 / MIB,
    );
    o.figure(
        SCENARIO,
        &format!("{label}: peak RSS (largest node)"),
        "MiB",
        Better::Lower,
        peak as f64 / MIB,
    );
    o.figure(
        SCENARIO,
        &format!("{label}: peak over watermark"),
        "MiB",
        Better::Lower,
        (peak as f64 - watermark as f64) / MIB,
    );
    o.figure(
        SCENARIO,
        &format!("{label}: confirmed"),
        "msgs",
        Better::Higher,
        confirmed as f64,
    );
    o.figure(
        SCENARIO,
        &format!("{label}: refused"),
        "msgs",
        Better::Higher,
        refused as f64,
    );
    o.figure(
        SCENARIO,
        &format!("{label}: RSS growth"),
        "MiB",
        Better::Lower,
        (peak as f64 - start_rss as f64) / MIB,
    );
    o.notes.push(format!(
        "{label}: {} KiB bodies for {:?}, largest node {:.0} MiB after restart, watermark \
         {:.0} MiB; memory alarm seen: {alarm_seen}; after deleting the queue the alarm {}",
        sizes.flood_body / 1024,
        sizes.flood,
        start_rss as f64 / MIB,
        watermark as f64 / MIB,
        match cleared {
            Some(d) => format!("cleared in {:.1} s", d.as_secs_f64()),
            None => "did not clear within 30 s".into(),
        }
    ));
    Ok(())
}
