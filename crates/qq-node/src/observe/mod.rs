//! Operating a node: what tools can see without credentials and without a proto file.
//!
//! - [`health`]: `grpc.health.v1.Health` on the client port (service `""` and `qq.v1.Broker`),
//!   SERVING once the node has joined and reaches a metadata leader; the same answer for
//!   `GET /healthz`.
//! - gRPC server reflection (`grpc.reflection.v1`, and `v1alpha` for older tools) on the
//!   client port, describing `qq.v1.Broker` and the health service only (the internal service
//!   is not on that port and is not described).
//! - [`http`]: `GET /metrics` and `GET /healthz` on `http_addr`.
//! - [`page`]: the management page on `http_addr` (login with the broker's users).
//! - [`collector`]: the scrape-time collector of per-queue and per-node state, next to the
//!   event instruments of [`crate::metrics`].
//!
//! Health and reflection are plain tonic services beside the broker on the same server: the
//! broker authenticates inside its handlers ([`crate::api::auth`]), so they need no
//! credentials, and they reveal service names, the public schema and one status.
//!
//! Must not: change state, or be consulted by the broker to decide anything.

pub mod collector;
pub mod health;
pub mod http;
pub mod observed;
pub mod page;

pub use observed::Observed;

use std::sync::Arc;

use prometheus_client::registry::Registry;
use qq_core::{Reason, Strategy};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::server::Router;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

use crate::api::Api;
use crate::metrics::{self, DeadLetterLabels};
use crate::peer::liveness::PeerLinks;
use collector::NodeCollector;

/// Every metric name starts with this (`quorumq_...`).
pub const METRICS_PREFIX: &str = "quorumq";

/// The health task's output and the services built on it.
pub struct Observability {
    node: Observed,
    health: HealthServer<HealthService>,
    serving: watch::Receiver<bool>,
}

impl Observability {
    /// Starts following the node's health (a task of the node, stopped with it). The health
    /// services answer NOT_SERVING until it has seen a metadata leader.
    pub async fn start(
        node: Observed,
        tasks: &TaskTracker,
        peer_links: PeerLinks,
    ) -> Observability {
        let reporter = HealthReporter::new();
        health::not_serving_reporter(&reporter).await;
        let health = HealthServer::new(HealthService::from_health_reporter(reporter.clone()));
        let (serving_tx, serving) = watch::channel(false);
        tasks.spawn(health::run(node.clone(), reporter, peer_links, serving_tx));
        Observability {
            node,
            health,
            serving,
        }
    }

    /// SERVING (true) or not, as the health services say it.
    pub fn serving(&self) -> watch::Receiver<bool> {
        self.serving.clone()
    }

    /// Adds health and reflection to the client port's services.
    pub fn add_grpc_services(&self, router: Router) -> anyhow::Result<Router> {
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(qq_proto::v1::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        Ok(router
            .add_service(self.health.clone())
            .add_service(reflection().build_v1()?)
            .add_service(reflection().build_v1alpha()?))
    }

    /// Serves `GET /metrics`, `GET /healthz` and the management page (reading through `api`)
    /// on `listener` until `stop`.
    pub async fn serve_http(
        &self,
        listener: TcpListener,
        api: Api,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        let registry = Arc::new(self.registry());
        let page = page::router(api, self.serving.clone());
        http::serve(listener, registry, self.serving.clone(), page, stop)
            .await
            .map_err(|e| anyhow::anyhow!("http_addr: serve: {e}"))
    }

    /// The registry of `GET /metrics`: the event instruments and the node's collector.
    fn registry(&self) -> Registry {
        let mut registry = Registry::with_prefix(METRICS_PREFIX);
        let instruments = metrics::instruments();
        // Every label value from the start, so rates are defined before the first event.
        for reason in Reason::ALL {
            for strategy in [
                Strategy::Disabled,
                Strategy::AtMostOnce,
                Strategy::AtLeastOnce,
            ] {
                let _ = instruments.dead_lettered.get_or_create(&DeadLetterLabels {
                    reason: reason.as_str(),
                    strategy: strategy.as_str(),
                });
            }
        }
        for kind in [metrics::META, metrics::QUEUE] {
            let _ = instruments.leader_changes.get_or_create(&kind);
            let _ = instruments.commit_latency.get_or_create(&kind);
            let _ = instruments.snapshots_installed.get_or_create(&kind);
        }
        registry.register(
            "raft_commit_latency_seconds",
            "Time from a proposal on this node (its leader) to its commit and apply, by group kind",
            instruments.commit_latency.clone(),
        );
        registry.register(
            "dead_lettered",
            "Messages that died in queues this node leads, by reason and dead-letter strategy",
            instruments.dead_lettered.clone(),
        );
        registry.register(
            "raft_leader_changes",
            "Times this node became the leader of a Raft group, by group kind",
            instruments.leader_changes.clone(),
        );
        registry.register(
            "consume_streams",
            "Client consume streams open on this node",
            instruments.consume_streams.clone(),
        );
        registry.register(
            "snapshot_received_bytes",
            "Snapshot bytes received from leaders (in chunks of at most 4 MiB)",
            instruments.snapshot_bytes_received.clone(),
        );
        registry.register(
            "snapshots_installed",
            "Snapshots received from a leader and installed on this node, by group kind",
            instruments.snapshots_installed.clone(),
        );
        registry.register(
            "raft_group_sleeps",
            "Times a queue replica on this node went from Awake to Asleep (idle: no timers, no heartbeats)",
            instruments.group_sleeps.clone(),
        );
        registry.register(
            "raft_group_wakes",
            "Times a sleeping queue replica on this node (Asleep or Unloaded) was woken",
            instruments.group_wakes.clone(),
        );
        registry.register(
            "raft_group_unloads",
            "Times a queue replica on this node went from Asleep to Unloaded: its Raft instance let go (unload_after_ms)",
            instruments.group_unloads.clone(),
        );
        registry.register(
            "raft_group_loads",
            "Times an Unloaded queue replica on this node had its Raft instance created again",
            instruments.group_loads.clone(),
        );
        registry.register_collector(Box::new(NodeCollector::new(
            self.node.clone(),
            self.serving.clone(),
        )));
        registry
    }
}
