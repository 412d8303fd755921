//! One variant of scenario 11, phase by phase: the follower taken away (and wiped), a backlog
//! published while it is down, the follower started again and watched until it has caught up,
//! a steady publisher throughout.

use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::progress::{Reporter, Watch, qq_snapshot_files};
use super::{
    AFTER, FOLLOWER, LEADER, Measured, Peaks, SAMPLE_EVERY, Variant, WARM, joined, mib, sampling,
    spawn_publisher,
};
use crate::System;
use crate::cluster::Cluster;
use crate::driver::Conn;
use crate::erl_loop::{child_output, rabbit_node};
use crate::load::{Counters, Progress, PubOutcome, now_ns, wall};
use crate::scenarios::Settings;

/// One variant on `queue` (led by node 1): kill node 3 (and wipe it), publish `down_messages`
/// while it is down, start it, wait for its catch-up; a steady publisher throughout.
pub(super) async fn variant(
    cl: &mut Cluster,
    s: &Settings,
    v: Variant,
    queue: &str,
    down_messages: u64,
) -> Result<Measured> {
    let mut notes = Vec::new();
    let mut peaks = Peaks::default();
    peaks.sample(cl);
    notes.push(format!(
        "RSS MiB per node at the start: {}",
        cl.rss_kib()
            .iter()
            .map(|r| r.map_or("-".into(), |k| format!("{:.0}", mib(k))))
            .collect::<Vec<_>>()
            .join("/")
    ));
    let conn = Conn::connect(cl.system(), LEADER).await?;
    let steady_counters = Arc::new(Counters::default());
    let stop_steady = Arc::new(AtomicBool::new(false));
    let steady = spawn_publisher(
        &conn,
        queue,
        s,
        Some(s.catchup_rate),
        None,
        stop_steady.clone(),
        1 << 40,
        steady_counters.clone(),
    );
    let mut run = Run {
        s,
        v,
        queue,
        conn,
        steady_counters,
        peaks,
        notes,
    };
    let result = run.phases(cl, down_messages).await;
    stop_steady.store(true, Ordering::Relaxed);
    let steady = sampling(cl, &mut run.peaks, steady).await;
    let done = result?;
    let steady = joined(steady)?;
    run.measured(cl, done, steady).await
}

/// A variant under way: what every phase reads or adds to.
struct Run<'a> {
    s: &'a Settings,
    v: Variant,
    queue: &'a str,
    /// To the leader, for the publishers.
    conn: Conn,
    steady_counters: Arc<Counters>,
    peaks: Peaks,
    notes: Vec<String>,
}

/// What the phases measured, up to the steady publisher's end.
struct Phases {
    down_rate: f64,
    down_gap_ns: u64,
    catchup_s: Option<f64>,
    catchup_confirm_rate: f64,
    killed_ns: u64,
    restarted_ns: u64,
}

impl Run<'_> {
    async fn phases(&mut self, cl: &mut Cluster, down_messages: u64) -> Result<Phases> {
        sampling(cl, &mut self.peaks, tokio::time::sleep(WARM)).await;
        let (killed, killed_ns) = self.take_away(cl)?;
        let (down, down_rate) = self.publish_while_down(cl, down_messages).await?;
        let (mut watch, target) = self.leader_target(cl).await?;
        cl.start_node(FOLLOWER)?;
        let restarted = Instant::now();
        let restarted_ns = now_ns();
        self.notes.push(format!(
            "node 3 down for {:.1} s; restarted with the leader's commit index at {target}",
            (restarted - killed).as_secs_f64()
        ));
        let (cc0, ct0) = (self.steady_counters.confirmed(), Instant::now());
        let caught = self.watch_catch_up(cl, &mut watch, target, restarted).await;
        let catchup_confirm_rate =
            (self.steady_counters.confirmed() - cc0) as f64 / ct0.elapsed().as_secs_f64();
        let (caught, transfers, add_member) = caught?;
        self.catch_up_note(&caught, target, catchup_confirm_rate);
        if cl.system() == System::Quorumq {
            self.notes.push(transfers.note(cl));
        }
        sampling(cl, &mut self.peaks, tokio::time::sleep(AFTER)).await;
        if let Watch::Rabbit(r) = watch {
            r.stop();
        }
        add_member.stop();
        self.notes.push(format!(
            "the full-speed publisher's longest confirm gap {}",
            gap_at(down.max_confirm_gap_end_ns, killed_ns, restarted_ns)
        ));
        Ok(Phases {
            down_rate,
            down_gap_ns: down.max_confirm_gap_ns,
            catchup_s: caught.catchup_s,
            catchup_confirm_rate,
            killed_ns,
            restarted_ns,
        })
    }

    /// Kills node 3 (and, for (b), forgets it on RabbitMQ and removes its data directory).
    fn take_away(&mut self, cl: &mut Cluster) -> Result<(Instant, u64)> {
        cl.kill9(FOLLOWER)?;
        let killed = (Instant::now(), now_ns());
        if self.v == Variant::Wiped {
            if cl.system() == System::Rabbitmq {
                let t = Instant::now();
                cl.rabbitmqctl(LEADER, &["forget_cluster_node", &rabbit_node(FOLLOWER)])?;
                self.notes.push(format!(
                    "forget_cluster_node {} took {:.1} s (node down, before the publishing)",
                    rabbit_node(FOLLOWER),
                    t.elapsed().as_secs_f64()
                ));
            }
            let dir = cl.wipe_data(FOLLOWER)?;
            self.notes
                .push(format!("node 3's data directory {} removed", dir.display()));
        }
        Ok(killed)
    }

    /// Publishes `down_messages` as fast as the window allows while node 3 is down; the
    /// outcome and the rate of both publishers' confirms meanwhile.
    async fn publish_while_down(
        &mut self,
        cl: &Cluster,
        down_messages: u64,
    ) -> Result<(PubOutcome, f64)> {
        let down_counters = Arc::new(Counters::default());
        let progress = Progress::start(
            format!(
                "11 {} {down_messages} while node 3 is down {}",
                self.v.tag(),
                cl.system()
            ),
            down_counters.clone(),
        );
        let (c0, t0) = (self.steady_counters.confirmed(), Instant::now());
        let down = spawn_publisher(
            &self.conn,
            self.queue,
            self.s,
            None,
            Some(down_messages),
            Arc::new(AtomicBool::new(false)),
            0,
            down_counters.clone(),
        );
        let down = joined(sampling(cl, &mut self.peaks, down).await)?;
        progress.finish().await;
        let down_s = t0.elapsed().as_secs_f64();
        let steady_down = self.steady_counters.confirmed() - c0;
        let down_rate = (down.confirmed + steady_down) as f64 / down_s;
        self.notes.push(format!(
            "while node 3 was down: {} confirmed at full speed and {steady_down} at the steady \
             rate in {down_s:.1} s; {} refused",
            down.confirmed, down.rejected
        ));
        Ok((down, down_rate))
    }

    /// Where progress is read from, and the leader's commit index now: what node 3 must reach.
    async fn leader_target(&mut self, cl: &Cluster) -> Result<(Watch, u64)> {
        let mut watch = match cl.system() {
            System::Quorumq | System::QuorumqAmqp => Watch::Qq,
            System::Rabbitmq => Watch::Rabbit(Reporter::start(
                cl,
                self.queue,
                self.s.catchup_deadline + Duration::from_secs(120),
            )?),
        };
        let wait_target = Instant::now();
        loop {
            if let Some(c) = watch.leader_commit(self.queue).await {
                return Ok((watch, c));
            }
            reporter_alive(&mut watch)?;
            if wait_target.elapsed() > Duration::from_secs(60) {
                bail!("could not read the leader's commit index of {}", self.queue);
            }
            sampling(
                cl,
                &mut self.peaks,
                tokio::time::sleep(Duration::from_millis(100)),
            )
            .await;
        }
    }

    /// Polls node 3's applied index until it reaches `target` or the deadline passes; also
    /// makes it a member again on RabbitMQ ((b)) and sees snapshot transfers on quorumq.
    async fn watch_catch_up(
        &mut self,
        cl: &Cluster,
        watch: &mut Watch,
        target: u64,
        restarted: Instant,
    ) -> Result<(CaughtUp, Transfers, AddMember)> {
        let system = cl.system();
        let mut add_member = AddMember {
            child: None,
            added: self.v != Variant::Wiped || system != System::Rabbitmq,
        };
        let mut caught = CaughtUp::default();
        let mut transfers = Transfers::default();
        while restarted.elapsed() < self.s.catchup_deadline {
            self.peaks.sample(cl);
            if system == System::Quorumq {
                transfers.observe(cl, restarted);
            }
            add_member
                .step(cl, self.queue, restarted, &mut self.notes)
                .await?;
            if let Some(a) = watch.follower_applied(self.queue).await {
                caught
                    .first_progress
                    .get_or_insert(restarted.elapsed().as_secs_f64());
                caught.last_applied = Some(a);
                if a >= target {
                    caught.catchup_s = Some(restarted.elapsed().as_secs_f64());
                    break;
                }
            }
            reporter_alive(watch)?;
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        Ok((caught, transfers, add_member))
    }

    fn catch_up_note(&mut self, caught: &CaughtUp, target: u64, confirm_rate: f64) {
        self.notes.push(match caught.catchup_s {
            Some(c) => format!(
                "node 3 applied {} ≥ {target} {c:.1} s after its start (first progress read at \
                 {:.1} s); {confirm_rate:.0} msg/s confirmed meanwhile at a steady \
                 {:.0} msg/s",
                caught.last_applied.unwrap_or(0),
                caught.first_progress.unwrap_or(0.0),
                self.s.catchup_rate
            ),
            None => format!(
                "NOT caught up within {:.0} s: node 3 applied {} of the {target} to reach",
                self.s.catchup_deadline.as_secs_f64(),
                caught
                    .last_applied
                    .map_or("nothing readable".into(), |a| a.to_string())
            ),
        });
    }

    /// The variant's figures, once the steady publisher has ended with `steady`.
    async fn measured(self, cl: &Cluster, p: Phases, steady: PubOutcome) -> Result<Measured> {
        let Run {
            v,
            queue,
            peaks,
            mut notes,
            ..
        } = self;
        let gap = |ns: u64| ns as f64 / 1e9;
        notes.push(format!(
            "longest confirm gap: {:.3} s for the steady publisher ({} confirmed over the \
             variant; {}), {:.3} s for the one while down",
            gap(steady.max_confirm_gap_ns),
            steady.confirmed,
            gap_at(steady.max_confirm_gap_end_ns, p.killed_ns, p.restarted_ns),
            gap(p.down_gap_ns)
        ));
        let leader_now = cl.leader(queue).await.ok();
        if leader_now != Some(LEADER) {
            notes.push(format!(
                "the queue's leader changed during the variant: now {}",
                leader_now.map_or("unknown".into(), |l| format!("node {}", l + 1))
            ));
        }
        Ok(Measured {
            variant: v,
            down_rate: p.down_rate,
            catchup_s: p.catchup_s,
            peaks,
            max_gap_s: gap(steady.max_confirm_gap_ns.max(p.down_gap_ns)),
            catchup_confirm_rate: p.catchup_confirm_rate,
            notes,
        })
    }
}

/// Fails once the RabbitMQ progress reporter has ended.
fn reporter_alive(watch: &mut Watch) -> Result<()> {
    if let Watch::Rabbit(r) = watch
        && let Some(e) = r.ended()
    {
        bail!("the RabbitMQ progress reporter ended: {e}");
    }
    Ok(())
}

/// Where a confirm gap ended: wall-clock time, and offsets from the kill and the restart.
fn gap_at(end: u64, killed_ns: u64, restarted_ns: u64) -> String {
    let rel = |t: u64| end as f64 / 1e9 - t as f64 / 1e9;
    format!(
        "ended {} UTC, {:+.1} s from the kill, {:+.1} s from the restart",
        wall(end),
        rel(killed_ns),
        rel(restarted_ns)
    )
}

/// How node 3's catch-up went.
#[derive(Default)]
struct CaughtUp {
    first_progress: Option<f64>,
    last_applied: Option<u64>,
    catchup_s: Option<f64>,
}

/// quorumq: how node 3 caught up; a snapshot transfer shows as a `recv-*` file.
#[derive(Default)]
struct Transfers {
    received_max: u64,
    seen_at: Option<f64>,
}

impl Transfers {
    fn observe(&mut self, cl: &Cluster, restarted: Instant) {
        for (name, len) in qq_snapshot_files(cl, FOLLOWER) {
            if name.starts_with("recv-") {
                self.seen_at
                    .get_or_insert(restarted.elapsed().as_secs_f64());
                self.received_max = self.received_max.max(len);
            }
        }
    }

    fn note(&self, cl: &Cluster) -> String {
        let leader_snaps: Vec<String> = qq_snapshot_files(cl, LEADER)
            .into_iter()
            .map(|(n, l)| format!("{n} ({:.0} MiB)", l as f64 / 1048576.0))
            .collect();
        match self.seen_at {
            Some(at) => format!(
                "node 3 was seen receiving a snapshot from {at:.1} s after its start, up to \
                 {:.0} MiB received at one sample; snapshot files on node 1 now: {}",
                self.received_max as f64 / 1048576.0,
                leader_snaps.join(", ")
            ),
            None => format!(
                "no snapshot transfer to node 3 was seen (it caught up from the leader's \
                 log); snapshot files on node 1 now: {}",
                if leader_snaps.is_empty() {
                    "none".to_string()
                } else {
                    leader_snaps.join(", ")
                }
            ),
        }
    }
}

/// RabbitMQ, (b): node 3 made a member of the queue again once it serves
/// (`rabbit_quorum_queue:add_member`, run by a `rabbitmqctl eval` in the background).
struct AddMember {
    child: Option<Child>,
    added: bool,
}

impl AddMember {
    async fn step(
        &mut self,
        cl: &Cluster,
        queue: &str,
        restarted: Instant,
        notes: &mut Vec<String>,
    ) -> Result<()> {
        if self.added {
            return Ok(());
        }
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait()? {
                let said = child_output(child);
                notes.push(format!(
                    "add_member answered {said} ({status}) {:.1} s after the start",
                    restarted.elapsed().as_secs_f64()
                ));
                if !status.success() || said != "ok" {
                    bail!("add_member of node 3 to {queue} failed: {said}");
                }
                self.added = true;
            }
        } else if cl.pid(FOLLOWER).is_some() && cl.answers(FOLLOWER).await {
            notes.push(format!(
                "node 3 serves AMQP {:.1} s after its start; adding it to {queue}",
                restarted.elapsed().as_secs_f64()
            ));
            let expr = format!(
                "rabbit_quorum_queue:add_member(<<\"/\">>, <<\"{queue}\">>, '{}', 120000).",
                rabbit_node(FOLLOWER)
            );
            self.child = Some(cl.rabbitmqctl_spawn(LEADER, &["eval", &expr])?);
        }
        Ok(())
    }

    fn stop(self) {
        if let Some(mut c) = self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
