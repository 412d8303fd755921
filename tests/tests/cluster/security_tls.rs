//! An attacker on the network: client traffic over TLS, and node-to-node requests that do not
//! come from a node with a certificate of the cluster CA are refused on every port a node
//! listens on (the client port does not serve the internal service at all; the cluster port
//! needs a certificate from the cluster CA), and the cluster keeps serving, also after a full
//! restart.

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use qq_client::{Client, TlsOptions};
use qq_proto::internal::internal_client::InternalClient;
use qq_proto::internal::{
    ForwardConsumeRequest, ProposeRequest, RaftKind, RaftRequest, WatchRequest,
};
use qq_tests::{
    ClusterOptions, RaftSettings, TestCluster, info, make_certs, node_binary, tls_channel,
};
use tonic::transport::{Channel, Endpoint};

use crate::drain_exactly;

/// Publish and consume through the client API over TLS: declare, publish with confirm, consume
/// with a subscription, get. A client speaking plain text to the TLS port is refused.
#[tokio::test]
async fn publish_and_consume_over_client_tls() -> anyhow::Result<()> {
    let cluster = TestCluster::start_client_tls(3).await?;
    let c = cluster.client(2).await?;
    c.declare_queue("tls-q", Default::default()).await?;
    for i in 0..5 {
        c.publish("", "tls-q", qq_client::message(format!("m{i}")))
            .await?;
    }
    let mut consumer = cluster.client(3).await?.consume("tls-q", 10).await?;
    for i in 0..5 {
        let d = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .context("delivery over TLS")?
            .context("consume stream ended")??;
        ensure!(
            crate::body(&d) == format!("m{i}"),
            "got {}",
            crate::body(&d)
        );
        consumer.ack(d.delivery_tag, false).await?;
    }
    drop(consumer);
    let plain = async {
        let c = Client::connect(cluster.address(1)).await?;
        anyhow::Ok(c.cluster_status().await?)
    }
    .await;
    ensure!(
        plain.is_err(),
        "plain text to a TLS client port must fail: {plain:?}"
    );
    cluster.stop();
    Ok(())
}

/// Story: with `tls_client_ca` the client port takes only clients presenting a certificate
/// from that CA: without one the handshake fails; with one, the Rust client and `qqctl`
/// (`--ca`, `--cert`, `--key`) publish and consume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_with_tls_client_ca() -> anyhow::Result<()> {
    let options = ClusterOptions {
        client_tls: true,
        require_client_certs: true,
        ..Default::default()
    };
    let cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
    // The harness's client presents node 1's certificate (from the cluster CA).
    let c = cluster.client(1).await?;
    c.declare_queue("mtls-q", Default::default()).await?;

    let without_cert = async {
        let tls = TlsOptions {
            identity: None,
            ..cluster.client_tls().cloned().context("client TLS")?
        };
        let c = Client::connect_with(cluster.address(2), Some(&tls)).await?;
        anyhow::Ok(c.cluster_status().await?)
    }
    .await;
    ensure!(
        without_cert.is_err(),
        "a client without a certificate must be refused: {without_cert:?}"
    );

    let qqctl = qq_tests::qqctl_binary()?;
    let (cert, key) = cluster.tls().node_cert(2);
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&qqctl)
            .arg("--node")
            .arg(format!("https://{}", cluster.address(3)))
            .arg("--ca")
            .arg(cluster.tls().ca_pem())
            .arg("--cert")
            .arg(&cert)
            .arg("--key")
            .arg(&key)
            .args(args)
            .output()
            .expect("run qqctl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = run(&["publish", "--key", "mtls-q", "--body", "over-mtls"]);
    ensure!(ok, "qqctl publish over mutual TLS failed: {out}");
    let (ok, out) = run(&["consume", "mtls-q", "--count", "1"]);
    ensure!(
        ok && out.contains("over-mtls"),
        "qqctl consume over mutual TLS: {out}"
    );
    // Without --cert qqctl is refused too.
    let out = std::process::Command::new(&qqctl)
        .arg("--node")
        .arg(format!("https://{}", cluster.address(3)))
        .arg("--ca")
        .arg(cluster.tls().ca_pem())
        .arg("status")
        .output()?;
    ensure!(
        !out.status.success(),
        "qqctl without a client certificate must fail"
    );
    cluster.stop();
    Ok(())
}

/// The forged requests: a Raft vote with a huge term, an append, a Propose with garbage, a
/// consumer relay and a Watch. Returns, per request, the outcome.
async fn forge(mut c: InternalClient<Channel>) -> Vec<(&'static str, Result<(), tonic::Status>)> {
    let mut out = Vec::new();
    for (what, kind) in [("vote", RaftKind::Vote), ("append", RaftKind::Append)] {
        let r = c
            .raft(RaftRequest {
                group: 0,
                kind: kind as i32,
                payload: vec![0xff; 64].into(),
            })
            .await;
        out.push((what, r.map(|_| ())));
    }
    let r = c
        .propose(ProposeRequest {
            group: 0,
            payload: vec![0xde, 0xad, 0xbe, 0xef].into(),
        })
        .await;
    out.push(("propose", r.map(|_| ())));
    let r = c
        .consume(tokio_stream::iter([ForwardConsumeRequest {
            payload: vec![0x55; 16].into(),
        }]))
        .await;
    out.push(("consume relay", r.map(|_| ())));
    let r = c.watch(WatchRequest { from: 99 }).await;
    out.push(("watch", r.map(|_| ())));
    out
}

/// Every forged request must fail; a transport or TLS failure or UNIMPLEMENTED, never an answer
/// from the service itself (INVALID_ARGUMENT about the payload means it was read).
fn assert_refused(
    port: &str,
    outcomes: &[(&'static str, Result<(), tonic::Status>)],
) -> anyhow::Result<()> {
    for (what, r) in outcomes {
        match r {
            Ok(()) => bail!("{port}: forged {what} was served"),
            Err(s) if s.code() == tonic::Code::InvalidArgument => {
                bail!("{port}: forged {what} reached the service: {s:?}")
            }
            Err(s) => info!(port, what, code = ?s.code(), "refused"),
        }
    }
    Ok(())
}

/// Forged requests to `node` on every port, in every way that lacks a cluster certificate.
async fn forge_everywhere(
    cluster: &TestCluster,
    node: u64,
    foreign: &ForeignCert,
) -> anyhow::Result<()> {
    let tls = cluster.tls();
    // Client port: the internal service is not served there (plain or not).
    let plain = Endpoint::from_shared(format!("http://{}", cluster.address(node)))?
        .connect()
        .await?;
    assert_refused("client port", &forge(InternalClient::new(plain)).await)?;
    // Cluster port, plain text: no TLS, no service.
    let http = async {
        Endpoint::from_shared(format!("http://{}", cluster.cluster_address(node)))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(anyhow::Error::from)
    }
    .await;
    match http {
        Err(e) => info!(node, "http:// to the cluster port: {e:#}"),
        Ok(ch) => assert_refused(
            "cluster port over http://",
            &forge(InternalClient::new(ch)).await,
        )?,
    }
    // Cluster port, TLS without a client certificate.
    match tls_channel(cluster.cluster_address(node), &tls.ca_pem(), None).await {
        Err(e) => info!(node, "TLS without a certificate: {e:#}"),
        Ok(ch) => assert_refused(
            "cluster port without a certificate",
            &forge(InternalClient::new(ch)).await,
        )?,
    }
    // Cluster port, a valid-looking certificate from another CA (the client trusts the real CA,
    // so the refusal comes from the server).
    match tls_channel(
        cluster.cluster_address(node),
        &tls.ca_pem(),
        Some((&foreign.cert, &foreign.key)),
    )
    .await
    {
        Err(e) => info!(node, "TLS with a foreign certificate: {e:#}"),
        Ok(ch) => assert_refused(
            "cluster port with a foreign-CA certificate",
            &forge(InternalClient::new(ch)).await,
        )?,
    }
    Ok(())
}

struct ForeignCert {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    ca: std::path::PathBuf,
}

/// Publish one message and take it back.
async fn still_serves(cluster: &TestCluster, queue: &str, body: &str) -> anyhow::Result<()> {
    let c = cluster.client(1).await?;
    c.publish("", queue, qq_client::message(body.to_string()))
        .await?;
    let got = drain_exactly(&cluster.client(3).await?, queue, 1).await?;
    ensure!(got == vec![body.to_string()], "got {got:?}");
    Ok(())
}

#[tokio::test]
async fn forged_node_requests_are_refused_on_every_port() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start(3).await?;
    let dir = tempfile::tempdir()?;
    let foreign = ForeignCert {
        cert: dir.path().join("node/node.pem"),
        key: dir.path().join("node/node.key"),
        ca: dir.path().join("ca/ca.pem"),
    };
    make_certs(
        &node_binary()?,
        &dir.path().join("ca"),
        &dir.path().join("node"),
        "intruder",
    )?;
    ensure!(foreign.ca.exists(), "foreign CA created");

    // The control: with a node certificate the same garbage reaches the service, which reads it
    // and refuses the payload (so the refusals below are the port's and the TLS layer's doing).
    let mut valid = cluster.internal_client(2).await?;
    let r = valid
        .raft(RaftRequest {
            group: 0,
            kind: RaftKind::Vote as i32,
            payload: vec![0xff; 64].into(),
        })
        .await;
    ensure!(
        matches!(&r, Err(s) if s.code() == tonic::Code::InvalidArgument),
        "an authenticated garbage vote is read and refused by the service: {r:?}"
    );

    cluster
        .client(1)
        .await?
        .declare_queue("after-forgery", Default::default())
        .await?;
    for node in cluster.ids() {
        info!(node, "--- forging requests to node {node}");
        forge_everywhere(&cluster, node, &foreign).await?;
    }
    still_serves(&cluster, "after-forgery", "one").await?;

    info!("--- full restart");
    for node in cluster.ids() {
        cluster.terminate(node, Duration::from_secs(30)).await?;
    }
    cluster.restart_all().await?;
    for node in cluster.ids() {
        forge_everywhere(&cluster, node, &foreign).await?;
    }
    still_serves(&cluster, "after-forgery", "two").await?;
    cluster.stop();
    Ok(())
}
