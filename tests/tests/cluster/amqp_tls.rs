//! amqps: with `amqps_addr` and `tls_client_ca`, a client presenting a certificate from the CA
//! logs in by SASL EXTERNAL as the user its common name names, and publishes and gets over
//! TLS; a client without a certificate does not get through the handshake. Driven by pika
//! (installed by `tests/amqp/setup.sh`), whose TLS and EXTERNAL support is RabbitMQ's users'.

use std::time::Duration;

use anyhow::{Context, ensure};
use qq_tests::{ClusterOptions, RaftSettings, TestCluster, info, make_certs, node_binary};

/// Connects with the CA, optionally a client certificate, and EXTERNAL (else PLAIN guest);
/// declares, publishes with a confirm and gets the message back. Prints `OK` or the error.
const CLIENT: &str = r#"
import ssl, sys, pika
port, ca, cert, key = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ctx = ssl.create_default_context(cafile=ca)
ctx.check_hostname = False
if cert:
    ctx.load_cert_chain(cert, key)
    creds = pika.credentials.ExternalCredentials()
else:
    creds = pika.PlainCredentials('guest', 'guest')
try:
    params = pika.ConnectionParameters('127.0.0.1', int(port), '/', creds,
                                       ssl_options=pika.SSLOptions(ctx), socket_timeout=10,
                                       connection_attempts=1)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare('tls-amqp', durable=True, arguments={'x-queue-type': 'quorum'})
    ch.basic_publish('', 'tls-amqp', b'over amqps')
    _, _, body = ch.basic_get('tls-amqp', auto_ack=True)
    print('OK' if body == b'over amqps' else f'WRONG {body!r}')
    conn.close()
except Exception as e:
    print(f'ERROR {type(e).__name__}: {e}')
"#;

async fn client(args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .arg("-c")
            .arg(CLIENT)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("the pika client did not finish in 60 s")??;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_client_certificates_and_external() -> anyhow::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("amqp");
    let setup = tokio::process::Command::new("bash")
        .arg(dir.join("setup.sh"))
        .status()
        .await?;
    ensure!(
        setup.success(),
        "tests/amqp/setup.sh failed (pika not installed)"
    );
    // Free ports for the three amqps listeners.
    let ports = qq_tests::free_ports(3)?;
    let options = ClusterOptions {
        client_tls: true,
        require_client_certs: true,
        extra_config_for: (1..=3)
            .map(|id| {
                (
                    id,
                    format!("amqps_addr = \"127.0.0.1:{}\"", ports[id as usize - 1]),
                )
            })
            .collect(),
        ..Default::default()
    };
    let cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
    let grpc = cluster.client(1).await?;
    grpc.put_user("alice", "unused-password", vec![]).await?;
    grpc.set_permissions("alice", "/", ".*", ".*", ".*").await?;
    let certs = cluster.path().join("alice");
    make_certs(&node_binary()?, &cluster.tls().ca_dir, &certs, "alice")?;
    let ca = cluster.tls().ca_pem();
    let (cert, key) = (certs.join("node.pem"), certs.join("node.key"));
    let port = ports[1].to_string();

    info!("--- EXTERNAL as alice (her certificate's common name), on node 2");
    let said = client(&[
        &port,
        ca.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    ])
    .await?;
    ensure!(said.trim() == "OK", "EXTERNAL over amqps: {said}");

    info!("--- no client certificate: the handshake fails");
    let said = client(&[&port, ca.to_str().unwrap(), "", ""]).await?;
    ensure!(
        said.starts_with("ERROR"),
        "a client without a certificate got in: {said}"
    );
    cluster.stop();
    Ok(())
}
