//! Story: an operator exports a cluster's definitions and rebuilds the topology elsewhere.
//!
//! - A topology with users, vhosts, permissions, limits, exchanges, queues with dead-letter
//!   arguments, bindings and policies is exported, imported into a fresh cluster and exported
//!   again: the two documents are equal (as JSON, modulo order). An imported user logs in with
//!   the original password; imported bindings route.
//! - Importing again changes nothing; a bad document is refused naming the JSON path and
//!   leaves the cluster as it was; an inequivalent queue is refused naming it; only
//!   administrators export or import; a document over the bound is RESOURCE_EXHAUSTED.
//! - `definitions_file` in the node config is imported at boot; a file that does not parse
//!   stops the node at start, naming the file.
//! - `log_format = "json"`: every stderr line is a JSON object; there are "leader changed"
//!   lines (metadata group and a queue, from the new leader) and one line for an alarm set.

use std::time::Duration;

use anyhow::{Context, ensure};
use qq_client::{Client, Value, ValueExt, message, table, v1};
use qq_tests::{ClusterOptions, RaftSettings, TestCluster, eventually, info};
use serde_json::Value as J;
use tonic::Code;

use super::{assert_status, drain_set};

/// Runs `qqctl --node ADDRESS ARGS...` (as guest); its stdout, or an error with its stderr.
fn qqctl(address: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(qq_tests::qqctl_binary()?)
        .arg("--node")
        .arg(address)
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "qqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The document with every array sorted, so two exports compare modulo order.
fn normalized(text: &str) -> anyhow::Result<J> {
    let mut doc: J = serde_json::from_str(text).context("export is not JSON")?;
    if let J::Object(top) = &mut doc {
        for value in top.values_mut() {
            if let J::Array(items) = value {
                items.sort_by_key(|v| v.to_string());
            }
        }
    }
    Ok(doc)
}

async fn build_topology(admin: &Client) -> anyhow::Result<()> {
    admin.put_vhost("shop").await?;
    admin
        .set_permissions("guest", "shop", ".*", ".*", ".*")
        .await?;
    admin
        .put_user("alice", "alice-secret", vec!["management".into()])
        .await?;
    admin
        .set_permissions("alice", "shop", ".*", ".*", ".*")
        .await?;
    admin
        .set_permissions("alice", "/", "^alice\\.", "", "^alice\\.")
        .await?;
    admin
        .set_vhost_limits(
            "shop",
            v1::Limits {
                max_queues: Some(100),
                ..Default::default()
            },
        )
        .await?;
    let shop = admin.clone().with_vhost("shop");
    shop.declare_exchange("orders", "topic").await?;
    shop.declare_exchange("orders.dlx", "fanout").await?;
    shop.declare_queue("orders.dlq", Default::default()).await?;
    shop.declare_queue(
        "orders.eu",
        table([
            ("x-dead-letter-exchange", Value::string("orders.dlx")),
            ("x-dead-letter-routing-key", Value::string("dead")),
            ("x-delivery-limit", Value::long(3)),
            ("x-message-ttl", Value::long(600_000)),
        ]),
    )
    .await?;
    shop.bind("orders.eu", "orders", "eu.#", Default::default())
        .await?;
    shop.bind("orders.dlq", "orders.dlx", "", Default::default())
        .await?;
    shop.declare_exchange("by-region", "headers").await?;
    shop.bind(
        "orders.eu",
        "by-region",
        "",
        table([
            ("x-match", Value::string("all")),
            ("region", Value::string("eu")),
            ("weight", Value::double(0.5)),
        ]),
    )
    .await?;
    admin
        .set_user_limits(
            "alice",
            v1::Limits {
                max_consumers: Some(7),
                ..Default::default()
            },
        )
        .await?;
    shop.set_policy(
        "cap",
        "^orders\\.eu$",
        "queues",
        5,
        table([("max-length", Value::long(1000))]),
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_round_trip_into_a_fresh_cluster() -> anyhow::Result<()> {
    let first = TestCluster::start(3).await?;
    let admin = first.client(1).await?;
    info!("--- build a topology and export it");
    build_topology(&admin).await?;
    let exported = admin.export_definitions().await?;
    let doc: J = serde_json::from_str(&exported)?;
    let alice = doc["users"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == "alice"))
        .context("alice is exported")?;
    ensure!(
        alice["hashing_algorithm"] == "quorumq_argon2id"
            && alice["password_hash"]
                .as_str()
                .is_some_and(|h| h.starts_with("$argon2id$")),
        "alice's hash: {alice}"
    );
    ensure!(
        !exported.contains("alice-secret"),
        "the password itself is not exported"
    );
    ensure!(
        doc["bindings"]
            .as_array()
            .is_some_and(|b| b.iter().any(|b| b["source"] == "by-region"
                && b["arguments"]["weight"] == 0.5
                && b["arguments"]["x-match"] == "all")),
        "headers binding with its arguments: {}",
        doc["bindings"]
    );
    ensure!(
        doc["quorumq_user_limits"][0]["limits"]["max-consumers"] == 7,
        "user limits: {}",
        doc["quorumq_user_limits"]
    );
    let queue = doc["queues"]
        .as_array()
        .and_then(|q| q.iter().find(|q| q["name"] == "orders.eu"))
        .context("orders.eu is exported")?;
    ensure!(
        queue["arguments"]["x-dead-letter-exchange"] == "orders.dlx"
            && queue["arguments"]["x-queue-type"] == "quorum"
            && queue["vhost"] == "shop",
        "orders.eu: {queue}"
    );
    info!("--- only administrators export");
    let as_alice = first
        .client(1)
        .await?
        .with_credentials("alice", "alice-secret")?;
    assert_status(
        as_alice.export_definitions().await,
        Code::PermissionDenied,
        "administrator",
    );
    info!("--- qqctl definitions export writes the same document to a file");
    let files = tempfile::tempdir()?;
    let file = files.path().join("defs.json");
    let file_arg = file.display().to_string();
    qqctl(
        first.address(1),
        &["definitions", "export", "--file", &file_arg],
    )?;
    assert_eq!(
        normalized(&std::fs::read_to_string(&file)?)?,
        normalized(&exported)?
    );
    first.stop();

    info!("--- import into a fresh cluster, export again: the same document");
    let second = TestCluster::start(3).await?;
    let admin = second.client(2).await?;
    let counts = admin.import_definitions(&exported).await?;
    let queues = counts
        .iter()
        .find(|c| c.kind == "queues")
        .context("queues counted")?;
    ensure!(
        queues.created == 2 && queues.unchanged == 0,
        "queues: {queues:?}"
    );
    let again = admin.export_definitions().await?;
    assert_eq!(normalized(&again)?, normalized(&exported)?);

    info!("--- the imported user logs in with the original password; bindings route");
    let alice = second
        .client(1)
        .await?
        .with_credentials("alice", "alice-secret")?
        .with_vhost("shop");
    alice
        .publish("orders", "eu.fr", message("bonjour"))
        .await
        .context("alice publishes through the imported binding")?;
    drain_set(&alice, "orders.eu", &["bonjour"]).await?;
    let wrong = second
        .client(1)
        .await?
        .with_credentials("alice", "not-her-password")?
        .with_vhost("shop");
    assert_status(wrong.list_queues().await, Code::Unauthenticated, "");
    let info = admin
        .clone()
        .with_vhost("shop")
        .get_queue("orders.eu")
        .await?;
    ensure!(info.policy == "cap", "policy applied: {:?}", info.policy);

    info!("--- importing again (with qqctl, from the file) changes nothing");
    let table = qqctl(second.address(3), &["definitions", "import", &file_arg])?;
    let counts = admin.import_definitions(&exported).await?;
    for c in &counts {
        ensure!(
            c.created == 0 && c.updated == 0,
            "a second import changed something: {counts:?}"
        );
    }
    ensure!(
        table
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["queues", "0", "0", "2"]),
        "qqctl's import table: {table}"
    );

    info!("--- a bad document is refused with its path and changes nothing");
    let bad = serde_json::json!({
        "vhosts": [{"name": "brand-new"}],
        "queues": [
            {"name": "fine", "vhost": "/", "arguments": {}},
            {"name": "broken", "vhost": "/", "arguments": {"x-max-length": "lots"}},
        ],
    });
    assert_status(
        admin.import_definitions(&bad.to_string()).await,
        Code::InvalidArgument,
        "queues[1].arguments.x-max-length",
    );
    let bad_user = serde_json::json!({
        "users": [{"name": "mallory", "password_hash": "plain-text",
                   "hashing_algorithm": "quorumq_argon2id", "tags": []}],
    });
    assert_status(
        admin.import_definitions(&bad_user.to_string()).await,
        Code::InvalidArgument,
        "users[0].password_hash",
    );
    assert_status(
        admin.import_definitions("{\"queues\": [").await,
        Code::InvalidArgument,
        "not JSON",
    );
    info!("--- an inequivalent queue is refused, naming it");
    let inequivalent = serde_json::json!({
        "vhosts": [{"name": "another-new"}],
        "queues": [{"name": "orders.eu", "vhost": "shop",
                    "arguments": {"x-max-length": 5}}],
    });
    assert_status(
        admin.import_definitions(&inequivalent.to_string()).await,
        Code::FailedPrecondition,
        "queues[0]",
    );
    assert_eq!(
        normalized(&admin.export_definitions().await?)?,
        normalized(&exported)?,
        "refused imports left something behind"
    );

    info!("--- bounds and permissions of ImportDefinitions");
    let huge = format!(
        "{{\"vhosts\": [], \"pad\": \"{}\"}}",
        "x".repeat(4 * 1024 * 1024)
    );
    assert_status(
        admin.import_definitions(&huge).await,
        Code::ResourceExhausted,
        "definitions_json",
    );
    let alice_anywhere = second
        .client(1)
        .await?
        .with_credentials("alice", "alice-secret")?;
    assert_status(
        alice_anywhere.import_definitions(&exported).await,
        Code::PermissionDenied,
        "administrator",
    );

    info!("--- a user put with an exported hash keeps its password");
    let hash = serde_json::from_str::<J>(&exported)?["users"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == "alice"))
        .and_then(|u| u["password_hash"].as_str().map(str::to_string))
        .context("alice's hash")?;
    admin.put_user_with_hash("alice2", &hash, vec![]).await?;
    admin
        .set_permissions("alice2", "/", ".*", ".*", ".*")
        .await?;
    let alice2 = second
        .client(1)
        .await?
        .with_credentials("alice2", "alice-secret")?;
    alice2.list_queues().await.context("alice2 logs in")?;
    assert_status(
        admin
            .put_user_with_hash(
                "eve",
                "$argon2i$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaA",
                vec![],
            )
            .await,
        Code::InvalidArgument,
        "password_hash",
    );
    second.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_file_is_imported_at_boot_and_logs_can_be_json() -> anyhow::Result<()> {
    let files = tempfile::tempdir()?;
    let good = files.path().join("definitions.json");
    // A user with the hash of "guest" (the predeclared one's), a vhost, a queue, a policy.
    let guest_hash = qq_core_guest_hash();
    let doc = serde_json::json!({
        "users": [{"name": "bob", "password_hash": guest_hash,
                   "hashing_algorithm": "quorumq_argon2id", "tags": ["administrator"]}],
        "vhosts": [{"name": "boot"}],
        "permissions": [{"user": "bob", "vhost": "boot",
                         "configure": ".*", "write": ".*", "read": ".*"}],
        "queues": [{"name": "boot.q", "vhost": "boot", "durable": true, "auto_delete": false,
                    "arguments": {"x-queue-type": "quorum", "x-max-length": 10}}],
        "policies": [{"vhost": "boot", "name": "ttl", "pattern": "^boot\\.",
                      "apply-to": "queues", "definition": {"message-ttl": 60000},
                      "priority": 0}],
    });
    std::fs::write(&good, doc.to_string())?;
    let options = ClusterOptions {
        extra_config: vec![
            format!("definitions_file = \"{}\"", good.display()),
            "log_format = \"json\"".into(),
        ],
        // Node 2 starts in disk alarm (a limit larger than any disk): its log says so.
        extra_config_for: vec![(2, "disk_free_limit = 1000000000000000000".into())],
        ..Default::default()
    };
    let cluster = TestCluster::start_with_options(3, RaftSettings::default(), options).await?;
    info!("--- every node imports the file once it joined; bob logs in");
    let bob = cluster
        .client(3)
        .await?
        .with_credentials("bob", "guest")?
        .with_vhost("boot");
    let queue = eventually("boot.q imported", Duration::from_secs(30), || {
        let bob = bob.clone();
        async move { Ok(bob.get_queue("boot.q").await.ok()) }
    })
    .await?;
    ensure!(
        queue.policy == "ttl",
        "policy of boot.q: {:?}",
        queue.policy
    );
    bob.publish("", "boot.q", message("after boot")).await?;
    drain_set(&bob, "boot.q", &["after boot"]).await?;

    info!("--- the nodes log JSON, with one line per leader change from the new leader");
    let logs: Vec<(u64, std::path::PathBuf)> = cluster
        .ids()
        .into_iter()
        .map(|id| (id, cluster.log_path(id).to_path_buf()))
        .collect();
    let leader_lines = eventually(
        "'leader changed' lines in the nodes' JSON logs (metadata and queue groups)",
        Duration::from_secs(30),
        || {
            let logs = logs.clone();
            async move {
                let (mut metadata, mut queues, mut imports, mut alarms) = (0, 0, 0, 0);
                for (id, log) in &logs {
                    let text = std::fs::read_to_string(log)?;
                    for line in text.lines().filter(|l| !l.trim().is_empty()) {
                        let v: J = serde_json::from_str(line)
                            .with_context(|| format!("node {id}: not a JSON log line: {line}"))?;
                        let f = &v["fields"];
                        if f["message"] == "definitions imported" {
                            imports += 1;
                        }
                        if f["alarm"] == "disk" {
                            ensure!(*id == 2 && v["level"] == "WARN", "alarm line: {line}");
                            alarms += 1;
                        }
                        if f["message"] != "leader changed" {
                            continue;
                        }
                        ensure!(
                            v["level"] == "INFO"
                                && f["term"].is_u64()
                                && f["leader"] == *id
                                && f["group"].is_u64(),
                            "node {id}: leader change line: {line}"
                        );
                        if f["group"] == 0 {
                            metadata += 1;
                        } else if f["queue"] == "boot.q" && f["vhost"] == "boot" {
                            queues += 1;
                        }
                    }
                }
                Ok(
                    (metadata >= 1 && queues >= 1 && imports >= 1 && alarms == 1)
                        .then_some((metadata, queues, imports, alarms)),
                )
            }
        },
    )
    .await?;
    info!(
        ?leader_lines,
        "leader changes (metadata, boot.q), imports and alarms logged"
    );
    cluster.stop();

    info!("--- a definitions_file that does not parse stops the node at start");
    let bad = files.path().join("bad.json");
    std::fs::write(&bad, "{\"queues\": [{\"name\": 7}]}")?;
    let options = ClusterOptions {
        extra_config: vec![format!("definitions_file = \"{}\"", bad.display())],
        not_started: vec![1],
        ..Default::default()
    };
    let mut cluster = TestCluster::start_with_options(1, RaftSettings::default(), options).await?;
    cluster.start_node(1)?;
    let code = cluster.wait_exit(1, Duration::from_secs(30)).await?;
    ensure!(code.is_some_and(|c| c != 0), "exit code {code:?}");
    let text = std::fs::read_to_string(cluster.log_path(1))?;
    ensure!(
        text.contains(&bad.display().to_string()) && text.contains("queues[0].name"),
        "the log names the file and the field: {text}"
    );
    cluster.stop();
    Ok(())
}

/// The predeclared guest user's Argon2id hash, as an export of a fresh cluster shows it.
fn qq_core_guest_hash() -> &'static str {
    "$argon2id$v=19$m=19456,t=2,p=1$jt/khf7pHrDZ3jFuUJNp/g$hM/I6rkqCBt+/IM0vpgd0fsdU0B4zKBlI/b0okIjLEw"
}
