//! Scenarios 6 and 7: a backlog. Published with no consumer (rate and resident memory of each
//! node), optionally the node leading it restarted (time until it serves again), then drained
//! (time and rate).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::{Better, Outcome, Settings, consumer_with_retry, declare_on, delete_queues};
use crate::System;
use crate::cluster::Cluster;
use crate::driver::{Conn, QueueSpec};
use crate::load::{
    ConsOutcome, ConsPlan, Counters, Progress, PubOutcome, PubPlan, consume_loop, make_body,
    publish_loop,
};

/// 6 and 7. Publish a backlog with no consumer; resident memory of each node; optionally
/// restart (kill -9, start) the node leading it and time until it serves again; then time to
/// drain the backlog.
pub async fn backlog(
    cl: &mut Cluster,
    s: &Settings,
    memory: bool,
    restart: bool,
) -> Result<Outcome> {
    let q = "bench-backlog".to_string();
    let leader = declare_on(cl, 0, &q, &QueueSpec::default()).await?;
    let mut out = Outcome::default();
    let before = cl.rss_kib();
    let (published, publish_s) = publish_backlog(cl.system(), leader, &q, s, &mut out).await?;
    if memory {
        out.figure(
            6,
            "publish into backlog",
            "msg/s",
            Better::Higher,
            published.confirmed as f64 / publish_s,
        );
        memory_figures(cl, &before, leader, &mut out).await;
    }
    if restart {
        restart_leader(cl, s, &q, leader, &mut out).await?;
    }
    drain_backlog(cl, s, &q, leader, memory, &mut out).await?;
    delete_queues(cl, &[q]).await;
    Ok(out)
}

/// Publishes the backlog into `queue` through its leader; what was confirmed, and in how many
/// seconds.
async fn publish_backlog(
    system: System,
    leader: usize,
    queue: &str,
    s: &Settings,
    out: &mut Outcome,
) -> Result<(PubOutcome, f64)> {
    let counters = Arc::new(Counters::default());
    let conn = Conn::connect(system, leader).await?;
    let p = conn.publisher(queue, s.window).await?;
    let progress = Progress::start(
        format!("6 backlog of {} {system}", s.backlog_messages),
        counters.clone(),
    );
    let start = Instant::now();
    let published = publish_loop(
        p,
        PubPlan {
            window: s.window,
            rate: None,
            count: Some(s.backlog_messages),
            stop: Arc::new(AtomicBool::new(false)),
            body_bytes: s.body_bytes,
            first_id: 0,
            record_from_ns: u64::MAX,
        },
        counters.clone(),
    )
    .await?;
    let publish_s = start.elapsed().as_secs_f64();
    progress.finish().await;
    let count = conn.message_count(queue).await?;
    out.notes.push(format!(
        "{} confirmed of {} sent in {publish_s:.1} s; the queue holds {count}",
        published.confirmed, published.sent
    ));
    Ok((published, publish_s))
}

/// Resident memory of each node with the backlog (`before`: without it).
async fn memory_figures(cl: &Cluster, before: &[Option<u64>], leader: usize, out: &mut Outcome) {
    // Let background work (flushes, compaction, GC) settle before reading RSS.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = cl.rss_kib();
    let mib = |v: &[Option<u64>]| -> Vec<String> {
        v.iter()
            .map(|x| x.map_or("-".into(), |k| format!("{:.0}", k as f64 / 1024.0)))
            .collect()
    };
    out.notes.push(format!(
        "RSS MiB per node before: {}, with the backlog: {} (leader: node {})",
        mib(before).join("/"),
        mib(&after).join("/"),
        leader + 1
    ));
    let max = after.iter().flatten().max().copied().unwrap_or(0) as f64 / 1024.0;
    let total = after.iter().flatten().sum::<u64>() as f64 / 1024.0;
    out.figure(6, "max node RSS with backlog", "MiB", Better::Lower, max);
    out.figure(6, "total RSS, 3 nodes", "MiB", Better::Lower, total);
}

/// 7. kill -9 of the leader, started again: the time until it answers with the queue's length
/// and confirms a publish (300 s at most).
async fn restart_leader(
    cl: &mut Cluster,
    s: &Settings,
    queue: &str,
    leader: usize,
    out: &mut Outcome,
) -> Result<()> {
    let system = cl.system();
    cl.kill9(leader)?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    cl.start_node(leader)?;
    let probe = make_body(u64::MAX, s.body_bytes);
    let served = loop {
        let attempt = async {
            let c = Conn::connect(system, leader).await?;
            let n = c.message_count(queue).await?;
            c.publish_one(queue, probe.clone()).await?;
            anyhow::Ok(n)
        };
        match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(Ok(n)) => break Some(n),
            _ if started.elapsed() > Duration::from_secs(300) => break None,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    match served {
        Some(n) => {
            out.figure(
                7,
                "restart → serves again",
                "s",
                Better::Lower,
                started.elapsed().as_secs_f64(),
            );
            out.notes.push(format!(
                "restarted node {} (the leader) with kill -9; it answered with {n} messages and confirmed a publish",
                leader + 1
            ));
        }
        None => out
            .notes
            .push("the restarted node did not serve within 300 s".into()),
    }
    let rss = cl.rss_kib();
    if let Some(Some(k)) = rss.get(leader) {
        out.notes.push(format!(
            "RSS of the restarted node once serving: {:.0} MiB",
            *k as f64 / 1024.0
        ));
    }
    Ok(())
}

/// Drains the backlog through the node that leads the queue (found again whenever a
/// subscription ends): its time and rate (scenario 6).
async fn drain_backlog(
    cl: &Cluster,
    s: &Settings,
    queue: &str,
    leader: usize,
    memory: bool,
    out: &mut Outcome,
) -> Result<()> {
    let system = cl.system();
    let total = Conn::connect(system, leader)
        .await?
        .message_count(queue)
        .await?;
    let counters = Arc::new(Counters::default());
    let progress = Progress::start(format!("6 drain {total} {system}"), counters.clone());
    let start = Instant::now();
    let drained = drain(cl, queue, s.prefetch, total, counters).await?;
    progress.finish().await;
    if let Some(last) = drained.last_at {
        let t = (last - start).as_secs_f64();
        if memory {
            out.figure(6, "drain time", "s", Better::Lower, t);
            out.figure(
                6,
                "drain rate",
                "msg/s",
                Better::Higher,
                drained.received as f64 / t,
            );
        }
    }
    if drained.received < total {
        out.notes.push(format!(
            "drained {} of {total}{}",
            drained.received,
            drained
                .ended
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        ));
    }
    Ok(())
}

/// Consumes `total` messages, acking each. A subscription that ends (a leader change ends
/// quorumq's consume streams) is opened again on the node that leads the queue then; the drain
/// gives up after twenty failed subscriptions in a row, two idle periods or 15 minutes.
async fn drain(
    cl: &Cluster,
    queue: &str,
    prefetch: u16,
    total: u64,
    counters: Arc<Counters>,
) -> Result<ConsOutcome> {
    let mut all = ConsOutcome::default();
    let deadline = Instant::now() + Duration::from_secs(900);
    let (mut failures, mut idle) = (0, 0);
    while all.received < total && Instant::now() < deadline && failures < 20 && idle < 2 {
        let node = cl.leader(queue).await.unwrap_or(0);
        let subscribed = async {
            let conn = Conn::connect(cl.system(), node).await?;
            consumer_with_retry(&conn, queue, prefetch).await
        };
        let c = match subscribed.await {
            Ok(c) => c,
            Err(e) => {
                failures += 1;
                all.ended = Some(format!("{e:#}"));
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
        };
        let o = consume_loop(
            c,
            ConsPlan {
                reject: false,
                stop: Arc::new(AtomicBool::new(false)),
                count: Some(total - all.received),
                idle_timeout: Some(Duration::from_secs(10)),
                collect_ids: false,
                record_from_ns: u64::MAX,
            },
            counters.clone(),
        )
        .await?;
        all.received += o.received;
        all.last_at = o.last_at.or(all.last_at);
        if o.ended.is_some() {
            all.ended = o.ended;
            if o.received == 0 {
                failures += 1;
            } else {
                failures = 0;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        } else if o.received == 0 {
            idle += 1;
        }
    }
    Ok(all)
}
