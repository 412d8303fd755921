//! The workload's life in a run, the same for both runners (qq-chaos and qq-sim): start the
//! publishers and consumers, let the faults happen, then wind down (publishers finish or give
//! up, the source queues drain, every queue is emptied by a final drain) and hand the history
//! to the checker.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use qq_client::Client;
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};

use crate::checker::Check;
use crate::probes::{drain, wait_drained, wait_healthy};
use crate::workload::{self, Clients, Control, Protocol, Recorder, Role};

/// How long unconfirmed publishes may keep retrying once publishing stops.
const PUBLISH_GIVE_UP: Duration = Duration::from_secs(30);
/// How long the source queues may go without draining before the run gives up on them.
const DRAIN_STALL: Duration = Duration::from_secs(60);

/// The workload while it runs.
pub struct Session {
    pub clients: Arc<Vec<Client>>,
    pub work: Clients,
    pub rec: Arc<Recorder>,
    pub control: Arc<Control>,
    publishers: JoinSet<()>,
    consumers: JoinSet<()>,
}

impl Session {
    /// One publisher and one working consumer per node (`rate` messages per second over all
    /// publishers, `concurrency` in flight per publisher and queue), and a consumer that always
    /// requeues on the delivery-limit queue. `amqp` are the nodes' AMQP addresses (only used
    /// over AMQP).
    pub fn start(
        protocol: Protocol,
        clients: Arc<Vec<Client>>,
        amqp: Vec<String>,
        rate: f64,
        concurrency: usize,
    ) -> Session {
        let rec = Arc::new(Recorder::new(protocol));
        let control = Arc::new(Control::default());
        let work = Clients::new(protocol, clients.clone(), amqp);
        let mut publishers = JoinSet::new();
        for p in 0..clients.len() {
            publishers.spawn(work.publisher(
                p,
                rate / clients.len() as f64,
                concurrency,
                rec.clone(),
                control.clone(),
            ));
        }
        let mut consumers = JoinSet::new();
        for c in 0..clients.len() {
            consumers.spawn(work.consumer(
                c,
                workload::WORK,
                Role::Work,
                rec.clone(),
                control.clone(),
            ));
        }
        consumers.spawn(work.consumer(
            1,
            workload::LIMIT,
            Role::AlwaysRequeue,
            rec.clone(),
            control.clone(),
        ));
        Session {
            clients,
            work,
            rec,
            control,
            publishers,
            consumers,
        }
    }

    /// Whether every node answers and every queue has a leader within a minute: a check.
    pub async fn healthy(&self) -> Check {
        let healthy = wait_healthy(&self.clients, Duration::from_secs(60)).await;
        Check::new(
            "cluster healthy after healing",
            healthy.is_ok(),
            healthy
                .as_ref()
                .err()
                .map_or("every node answers, every queue has a leader".into(), |e| {
                    e.to_string()
                }),
        )
    }

    /// No new publishes from now on.
    pub fn stop_publishing(&self) {
        self.control.stop_publishing.store(true, Ordering::Relaxed);
    }

    /// Waits for the publishers: their unconfirmed publishes retry for [`PUBLISH_GIVE_UP`],
    /// then give up (recorded as not confirmed).
    pub async fn finish_publishers(&mut self) {
        self.stop_publishing();
        let give_up_at = Instant::now() + PUBLISH_GIVE_UP;
        while !self.publishers.is_empty() {
            if Instant::now() >= give_up_at {
                self.control.give_up.store(true, Ordering::Relaxed);
            }
            let _ = timeout(Duration::from_millis(500), self.publishers.join_next()).await;
        }
    }

    /// Lets the consumers drain the source queues, stops them, then empties every queue (the
    /// dead letters too) with drain consumers: two checks.
    pub async fn drain(&mut self) -> Vec<Check> {
        let drained = wait_drained(&self.clients, DRAIN_STALL).await;
        let mut checks = vec![Check::new(
            "source queues drained, no dead letter held",
            drained.is_ok(),
            match &drained {
                Ok(()) => "chaos.work, chaos.ttl and chaos.limit empty; 0 dead letters held".into(),
                Err(e) => e.to_string(),
            },
        )];
        self.control.stop_consuming.store(true, Ordering::Relaxed);
        while self.consumers.join_next().await.is_some() {}
        // A queue that cannot be drained is a finding (messages stuck), not a reason to stop:
        // the other checks still run on what was seen.
        let mut stuck = Vec::new();
        for q in workload::SOURCES {
            if let Err(e) = drain(
                &self.work,
                &self.clients,
                q,
                Role::DrainLeftovers,
                &self.rec,
            )
            .await
            {
                stuck.push(e.to_string());
            }
        }
        if let Err(e) = drain(
            &self.work,
            &self.clients,
            workload::DLQ,
            Role::DrainDeadLetters,
            &self.rec,
        )
        .await
        {
            stuck.push(e.to_string());
        }
        checks.push(Check::all_clear(
            "every queue drains to empty",
            stuck,
            "yes",
        ));
        checks
    }
}
