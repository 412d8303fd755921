//! Story: an operator looks at a cluster with stock tools and no credentials.
//!
//! 1. gRPC health (`grpc.health.v1.Health`) says NOT_SERVING while a node has no cluster to
//!    join, and SERVING once it has joined and sees a metadata leader; `GET /healthz` agrees.
//!    Server reflection lists `qq.v1.Broker` (and describes it) but not the internal service.
//! 2. `GET /metrics` on a queue's leader shows its depth, and only there; a reject into a
//!    dead-letter exchange shows in `quorumq_dead_lettered_total`; commit latency, consume
//!    streams, alarms and memory are there.
//! 3. With `per_queue_metrics = false` no per-queue series is exported, only node sums.

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use qq_client::{SettleOutcome, Value, ValueExt, message, table};
use qq_tests::{ClusterOptions, RaftSettings, TestCluster, eventually, info, sample};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

const WAIT: Duration = Duration::from_secs(30);
const BROKER: &str = "qq.v1.Broker";

async fn channel(address: &str) -> anyhow::Result<Channel> {
    Ok(Channel::from_shared(format!("http://{address}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?)
}

/// The health status of `service` on the node at `address` (no credentials sent).
async fn health(address: &str, service: &str) -> anyhow::Result<ServingStatus> {
    let mut client = HealthClient::new(channel(address).await?);
    let reply = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await?
        .into_inner();
    Ok(ServingStatus::try_from(reply.status)?)
}

/// Waits until both health services of the node at `address` report `want`.
async fn wait_health(address: &str, want: ServingStatus) -> anyhow::Result<()> {
    eventually(
        &format!("{address} to be {want:?}"),
        qq_tests::FORMATION_TIMEOUT,
        || async move {
            for service in ["", BROKER] {
                let got = health(address, service).await?;
                if got != want {
                    bail!("{service:?} is {got:?}");
                }
            }
            Ok(Some(()))
        },
    )
    .await
}

/// One reflection request, its one answer.
async fn reflect(address: &str, request: MessageRequest) -> anyhow::Result<MessageResponse> {
    let mut client = ServerReflectionClient::new(channel(address).await?);
    let outbound = tokio_stream::iter([ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    }]);
    let mut answers = client.server_reflection_info(outbound).await?.into_inner();
    let answer = answers
        .message()
        .await?
        .context("reflection closed the stream without an answer")?;
    answer
        .message_response
        .context("reflection answer without a message")
}

async fn metrics(cluster: &TestCluster, node: u64) -> anyhow::Result<String> {
    let (status, body) = cluster.http_get(node, "/metrics").await?;
    ensure!(
        status == 200,
        "GET /metrics on node {node}: {status}: {body}"
    );
    Ok(body)
}

/// Polls node `node`'s metrics until `series` has `value`.
async fn wait_sample(
    cluster: &TestCluster,
    node: u64,
    series: &str,
    value: f64,
) -> anyhow::Result<String> {
    eventually(
        &format!("{series} = {value} on node {node}"),
        WAIT,
        || async move {
            let text = metrics(cluster, node).await?;
            match sample(&text, series) {
                Some(v) if v == value => Ok(Some(text)),
                other => bail!("{series} is {other:?}"),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_serving_once_a_node_joined_and_reflection_describes_the_broker()
-> anyhow::Result<()> {
    info!("--- node 2 alone: node 1, which forms the cluster, is not started");
    let options = ClusterOptions {
        not_started: vec![1, 3],
        ..Default::default()
    };
    let mut cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
    let (status, body) = eventually("node 2's HTTP endpoint to answer", WAIT, || async {
        Ok(Some(cluster.http_get(2, "/healthz").await?))
    })
    .await?;
    assert_eq!((status, body.trim()), (503, "NOT_SERVING"));
    let address = cluster.address(2).to_string();
    for service in ["", BROKER] {
        assert_eq!(
            health(&address, service).await?,
            ServingStatus::NotServing,
            "service {service:?} of a node that has joined nothing"
        );
    }
    let unknown = health(&address, "qq.internal.v1.Internal").await;
    let code = unknown
        .expect_err("the internal service has no health on the client port")
        .downcast::<tonic::Status>()?
        .code();
    assert_eq!(code, tonic::Code::NotFound);

    info!("--- nodes 1 and 3 start: the cluster forms, every node turns SERVING");
    cluster.start_node(1)?;
    cluster.start_node(3)?;
    for id in cluster.ids() {
        let address = cluster.address(id).to_string();
        wait_health(&address, ServingStatus::Serving).await?;
        let (status, body) = cluster.http_get(id, "/healthz").await?;
        assert_eq!((status, body.trim()), (200, "SERVING"), "node {id}");
        let text = metrics(&cluster, id).await?;
        assert_eq!(
            sample(&text, "quorumq_node_serving"),
            Some(1.0),
            "node {id}"
        );
    }
    cluster.check_alive()?;

    info!("--- reflection: the client contract and standard services, nothing internal");
    let MessageResponse::ListServicesResponse(list) =
        reflect(&address, MessageRequest::ListServices(String::new())).await?
    else {
        bail!("ListServices answered with something else");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        BROKER,
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not in {names:?}"
        );
    }
    assert!(
        !names.iter().any(|n| n.starts_with("qq.internal")),
        "the internal service is listed: {names:?}"
    );
    let MessageResponse::FileDescriptorResponse(files) = reflect(
        &address,
        MessageRequest::FileContainingSymbol(BROKER.into()),
    )
    .await?
    else {
        bail!("FileContainingSymbol({BROKER}) answered with something else");
    };
    let described = files.file_descriptor_proto.iter().any(|f| {
        f.windows(b"qq/v1/broker.proto".len())
            .any(|w| w == b"qq/v1/broker.proto")
    });
    assert!(described, "no descriptor of qq/v1/broker.proto came back");
    let internal = reflect(
        &address,
        MessageRequest::FileContainingSymbol("qq.internal.v1.Internal".into()),
    )
    .await;
    match internal {
        Ok(MessageResponse::ErrorResponse(_)) => {}
        Err(e)
            if e.downcast_ref::<tonic::Status>().map(|s| s.code())
                == Some(tonic::Code::NotFound) => {}
        other => bail!("the internal service is described: {other:?}"),
    }

    info!("--- an unknown path is not found");
    let (status, _) = cluster.http_get(2, "/nowhere").await?;
    assert_eq!(status, 404);

    info!("--- nodes 1 and 3 die: node 2 reaches no majority, and says so");
    cluster.kill9(1);
    cluster.kill9(3);
    wait_health(&address, ServingStatus::NotServing).await?;
    let (status, _) = cluster.http_get(2, "/healthz").await?;
    assert_eq!(status, 503);

    info!("--- node 1 is back: a majority again");
    cluster.start_node(1)?;
    wait_health(&address, ServingStatus::Serving).await?;
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_cluster_is_serving() -> anyhow::Result<()> {
    let cluster = TestCluster::start(1).await?;
    wait_health(cluster.address(1), ServingStatus::Serving).await?;
    let (status, body) = cluster.http_get(1, "/healthz").await?;
    assert_eq!((status, body.trim()), (200, "SERVING"));
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_a_queue_on_its_leader_and_dead_letters() -> anyhow::Result<()> {
    // Node 3 starts in disk alarm, so the alarm gauge has something to show.
    let options = ClusterOptions {
        extra_config_for: vec![(3, "disk_free_limit = 1000000000000000000".into())],
        ..Default::default()
    };
    let cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
    let client = cluster.client(1).await?;

    info!("--- a queue dead-lettering into dlq, and five messages in it");
    client.declare_exchange("dlx", "fanout").await?;
    client.declare_queue("dlq", Default::default()).await?;
    client.bind("dlq", "dlx", "", Default::default()).await?;
    let args = table([("x-dead-letter-exchange", Value::string("dlx"))]);
    client.declare_queue("q", args).await?;
    const N: usize = 5;
    for i in 0..N {
        client.publish("", "q", message(format!("m{i}"))).await?;
    }
    let leader = cluster.leader_of("q").await?;
    let ready = r#"quorumq_queue_messages_ready{vhost="/",queue="q"}"#;
    let text = wait_sample(&cluster, leader, ready, N as f64).await?;
    for series in [
        r#"quorumq_queue_messages_unacked{vhost="/",queue="q"}"#,
        r#"quorumq_queue_messages_dead_letter_held{vhost="/",queue="q"}"#,
        r#"quorumq_queue_consumers{vhost="/",queue="q"}"#,
    ] {
        assert_eq!(sample(&text, series), Some(0.0), "{series} on the leader");
    }
    let commits = sample(
        &text,
        r#"quorumq_raft_commit_latency_seconds_count{kind="queue"}"#,
    )
    .context("no commit latency histogram")?;
    assert!(
        commits >= N as f64,
        "{commits} commits observed on q's leader"
    );
    assert!(sample(&text, "quorumq_process_resident_memory_bytes").unwrap_or(0.0) > 0.0);
    assert!(sample(&text, r#"quorumq_raft_term{vhost="/",queue="q"}"#).unwrap_or(0.0) >= 1.0);
    for other in cluster.others(leader) {
        let text = metrics(&cluster, other).await?;
        assert_eq!(
            sample(&text, ready),
            None,
            "a follower (node {other}) reports q"
        );
        assert!(
            sample(&text, r#"quorumq_raft_applied_index{vhost="/",queue="q"}"#).is_some(),
            "a follower reports the Raft state of its replica of q"
        );
    }

    info!("--- a consume stream is counted while it is open");
    let consumer = client.consume("dlq", 10).await?;
    wait_sample(&cluster, 1, "quorumq_consume_streams", 1.0).await?;
    consumer.cancel().await?;
    drop(consumer);
    wait_sample(&cluster, 1, "quorumq_consume_streams", 0.0).await?;

    info!("--- a rejected message is dead-lettered: counted by reason and strategy on q's leader");
    let got = client.get("q", false, 0).await?;
    let delivery = got.delivery.context("q is empty")?;
    client
        .settle(vec![delivery.receipt], SettleOutcome::Reject)
        .await?;
    wait_sample(&cluster, leader, ready, (N - 1) as f64).await?;
    wait_sample(
        &cluster,
        leader,
        r#"quorumq_dead_lettered_total{reason="rejected",strategy="at_most_once"}"#,
        1.0,
    )
    .await?;
    let dlq_leader = cluster.leader_of("dlq").await?;
    wait_sample(
        &cluster,
        dlq_leader,
        r#"quorumq_queue_messages_ready{vhost="/",queue="dlq"}"#,
        1.0,
    )
    .await?;

    info!("--- alarms: node 3 is in disk alarm, node 1 is not");
    let alarmed = metrics(&cluster, 3).await?;
    assert_eq!(sample(&alarmed, r#"quorumq_alarm{kind="disk"}"#), Some(1.0));
    let fine = metrics(&cluster, 1).await?;
    assert_eq!(sample(&fine, r#"quorumq_alarm{kind="disk"}"#), Some(0.0));
    assert_eq!(sample(&fine, r#"quorumq_alarm{kind="memory"}"#), Some(0.0));
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_queue_metrics_off_leaves_only_node_sums() -> anyhow::Result<()> {
    let options = ClusterOptions {
        extra_config: vec!["per_queue_metrics = false".into()],
        ..Default::default()
    };
    let cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
    let client = cluster.client(1).await?;
    client.declare_queue("q", Default::default()).await?;
    for i in 0..3 {
        client.publish("", "q", message(format!("m{i}"))).await?;
    }
    let leader = cluster.leader_of("q").await?;
    let text = wait_sample(&cluster, leader, "quorumq_messages_ready", 3.0).await?;
    assert_eq!(sample(&text, "quorumq_queues_led"), Some(1.0));
    for id in cluster.ids() {
        let text = metrics(&cluster, id).await?;
        let per_queue: Vec<&str> = text.lines().filter(|l| l.contains("queue=\"")).collect();
        assert!(
            per_queue.is_empty(),
            "node {id} exports per-queue series: {per_queue:?}"
        );
        assert!(
            sample(&text, r#"quorumq_raft_groups{state="leader"}"#).is_some(),
            "node {id} has no aggregated Raft state"
        );
    }
    cluster.stop();
    Ok(())
}
