//! Story: who may connect, and what a user with credentials for one vhost can see and do.
//!
//! `guest` (and a request without credentials) is served only from loopback; Basic credentials
//! from a remote address over plain text are refused unless `allow_plaintext_auth`; a user sees
//! nothing of a vhost it has no permission in; a publish naming another user in `user_id` is
//! refused; Get receipts cannot be forged or used by another user; revoking read, or deleting
//! the user, ends an open consume stream with PERMISSION_DENIED. The rows of docs/security.md
//! name these tests.

use std::time::Duration;

use qq_client::{Client, MessageBuilder, PublishOutcome, SettleOutcome, message};
use qq_tests::{ClusterOptions, RaftSettings, TestCluster, eventually, info, non_loopback_ip};
use tonic::Code;

use super::assert_status;

/// One node listening on every address, with `extra` config lines, and the address a client
/// uses to reach it from a non-loopback address of this host.
async fn remote_reachable_node(extra: &[&str]) -> anyhow::Result<(TestCluster, String)> {
    let ip = non_loopback_ip()?;
    let options = ClusterOptions {
        listen_on_all_addresses: true,
        extra_config: extra.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let cluster = TestCluster::start_with_options(1, RaftSettings::default(), options).await?;
    let port = cluster
        .address(1)
        .rsplit(':')
        .next()
        .expect("host:port")
        .to_string();
    Ok((cluster, format!("{ip}:{port}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_and_plaintext_credentials_are_refused_from_a_remote_address() -> anyhow::Result<()> {
    let (cluster, remote) = remote_reachable_node(&[]).await?;
    let local = cluster.client(1).await?;
    local.put_user("alice", "alice-pw", vec![]).await?;
    local
        .set_permissions("alice", "/", ".*", ".*", ".*")
        .await?;

    info!(%remote, "--- guest from a non-loopback address: refused, with the reason");
    let anonymous = Client::connect(&remote).await?;
    assert_status(
        anonymous.list_queues().await,
        Code::Unauthenticated,
        "user 'guest' can only connect via localhost",
    );
    let guest = anonymous.clone().with_credentials("guest", "guest")?;
    assert_status(
        guest.publish("", "q", message("x")).await,
        Code::Unauthenticated,
        "can only connect via localhost",
    );

    info!("--- basic credentials over plain text from a non-loopback address: refused");
    let alice_remote = anonymous.clone().with_credentials("alice", "alice-pw")?;
    assert_status(
        alice_remote.list_queues().await,
        Code::Unauthenticated,
        "allow_plaintext_auth",
    );

    info!("--- the same users from loopback are served");
    local.list_queues().await?;
    let alice_local = local.clone().with_credentials("alice", "alice-pw")?;
    alice_local.list_queues().await?;
    cluster.stop();

    info!("--- allow_plaintext_auth = true: alice is served remotely, guest still is not");
    let (cluster, remote) = remote_reachable_node(&["allow_plaintext_auth = true"]).await?;
    let local = cluster.client(1).await?;
    local.put_user("alice", "alice-pw", vec![]).await?;
    local
        .set_permissions("alice", "/", ".*", ".*", ".*")
        .await?;
    let anonymous = Client::connect(&remote).await?;
    let alice_remote = anonymous.clone().with_credentials("alice", "alice-pw")?;
    alice_remote
        .declare_queue("alice.q", Default::default())
        .await?;
    assert_status(
        anonymous.list_queues().await,
        Code::Unauthenticated,
        "can only connect via localhost",
    );
    let wrong = anonymous
        .clone()
        .with_credentials("alice", "not-her-password")?;
    assert_status(
        wrong.list_queues().await,
        Code::Unauthenticated,
        "invalid credentials",
    );
    let log = std::fs::read_to_string(cluster.log_path(1))?;
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("invalid credentials")
            && l.contains(&remote[..remote.rfind(':').unwrap()])),
        "a wrong password is logged at WARN with the peer address"
    );
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_sees_nothing_of_a_vhost_it_has_no_access_to() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let admin = cluster.client(1).await?;
    admin.put_vhost("b").await?;
    admin
        .set_permissions("guest", "b", ".*", ".*", ".*")
        .await?;
    let admin_b = admin.clone().with_vhost("b");
    admin_b
        .declare_queue("secret.q", Default::default())
        .await?;
    admin_b.declare_exchange("secret.ex", "fanout").await?;
    admin_b
        .bind("secret.q", "secret.ex", "", Default::default())
        .await?;
    admin_b
        .set_policy("secret.policy", "^secret", "queues", 0, Default::default())
        .await?;
    admin.declare_queue("public.q", Default::default()).await?;
    admin.put_user("alice", "alice-pw", vec![]).await?;
    admin
        .set_permissions("alice", "/", ".*", ".*", ".*")
        .await?;

    let alice = cluster
        .client(2)
        .await?
        .with_credentials("alice", "alice-pw")?;
    info!("--- alice works in / and sees / only");
    let names: Vec<String> = alice
        .list_queues()
        .await?
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(names, ["public.q"]);

    info!("--- every listing of vhost b, and of a vhost that does not exist, is refused alike");
    for vhost in ["b", "no-such-vhost"] {
        let alice_b = alice.clone().with_vhost(vhost);
        let needle = format!("access to vhost '{vhost}' refused for user 'alice'");
        assert_status(alice_b.list_queues().await, Code::PermissionDenied, &needle);
        assert_status(
            alice_b.list_exchanges().await,
            Code::PermissionDenied,
            &needle,
        );
        assert_status(
            alice_b.list_bindings().await,
            Code::PermissionDenied,
            &needle,
        );
        assert_status(
            alice_b.list_policies().await,
            Code::PermissionDenied,
            &needle,
        );
        assert_status(
            alice_b.get_queue("secret.q").await,
            Code::PermissionDenied,
            &needle,
        );
        assert_status(
            alice_b.get("secret.q", true, 0).await,
            Code::PermissionDenied,
            &needle,
        );
    }

    info!("--- overview and cluster status leave vhost b out for alice, not for the admin");
    let status = alice.cluster_status().await?;
    let listed: Vec<(String, String)> = status
        .queues
        .iter()
        .map(|q| (q.vhost.clone(), q.name.clone()))
        .collect();
    assert_eq!(listed, [("/".to_string(), "public.q".to_string())]);
    assert_eq!(alice.overview().await?.queues, 1);
    let admin_status = admin.cluster_status().await?;
    assert!(
        admin_status.queues.iter().any(|q| q.vhost == "b"),
        "{admin_status:?}"
    );
    assert_eq!(admin.overview().await?.queues, 2);

    info!("--- publishing with another user's user_id is refused; her own or none is fine");
    let as_guest = MessageBuilder::new("x").user_id("guest").build();
    assert_status(
        alice.publish("", "public.q", as_guest).await,
        Code::PermissionDenied,
        "user_id",
    );
    let as_alice = MessageBuilder::new("y").user_id("alice").build();
    let r = alice.publish("", "public.q", as_alice).await?;
    assert_eq!(r.outcome, PublishOutcome::Confirmed);
    let r = alice.publish("", "public.q", message("z")).await?;
    assert_eq!(r.outcome, PublishOutcome::Confirmed);
    let bodies = super::drain_exactly(&admin, "public.q", 2).await?;
    assert_eq!(bodies, ["y", "z"], "the refused publish stored nothing");
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_receipts_cannot_be_forged_or_used_by_another_user() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let admin = cluster.client(1).await?;
    admin.declare_queue("r.q", Default::default()).await?;
    for user in ["alice", "bob"] {
        admin.put_user(user, "pw", vec![]).await?;
        admin.set_permissions(user, "/", ".*", ".*", ".*").await?;
    }
    let alice = cluster.client(2).await?.with_credentials("alice", "pw")?;
    let bob = cluster.client(3).await?.with_credentials("bob", "pw")?;
    admin.publish("", "r.q", message("m1")).await?;
    let got = alice.get("r.q", false, 60_000).await?;
    let receipt = got.delivery.expect("a message").receipt;
    let parts: Vec<&str> = receipt.split('.').collect();
    assert_eq!(parts.len(), 3, "receipt {receipt:?}");
    assert_eq!(parts[2].len(), 32, "128 random bits in hex: {receipt:?}");

    info!("--- a forged token, the old guessable form and bob's use of alice's receipt fail");
    let mut forged_token: Vec<u8> = parts[2].bytes().collect();
    forged_token[0] = if forged_token[0] == b'0' { b'1' } else { b'0' };
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        parts[1],
        String::from_utf8(forged_token)?
    );
    assert_status(
        alice.settle(vec![forged], SettleOutcome::Ack).await,
        Code::NotFound,
        "receipt",
    );
    assert_status(
        alice
            .settle(
                vec![format!("{}-{}", parts[0], parts[1])],
                SettleOutcome::Ack,
            )
            .await,
        Code::InvalidArgument,
        "not a receipt from Get",
    );
    assert_status(
        bob.settle(vec![receipt.clone()], SettleOutcome::Ack).await,
        Code::NotFound,
        "another user",
    );
    let q = admin.get_queue("r.q").await?;
    assert_eq!(
        (q.messages_ready, q.messages_unacked),
        (0, 1),
        "still under alice's lease"
    );

    info!("--- alice's own receipt settles it");
    alice
        .settle(vec![receipt.clone()], SettleOutcome::Ack)
        .await?;
    let q = admin.get_queue("r.q").await?;
    assert_eq!(q.messages, 0);
    assert_status(
        alice.settle(vec![receipt], SettleOutcome::Ack).await,
        Code::NotFound,
        "receipt",
    );
    cluster.stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_read_or_deleting_the_user_ends_consume_streams() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let admin = cluster.client(1).await?;
    admin.declare_queue("c.q", Default::default()).await?;
    for user in ["alice", "bob"] {
        admin.put_user(user, "pw", vec![]).await?;
        admin.set_permissions(user, "/", ".*", ".*", ".*").await?;
    }
    let leader = cluster.leader_of("c.q").await?;
    // Alice's stream is relayed from another node; bob's is on the leader itself.
    let elsewhere = cluster.others(leader)[0];
    let alice = cluster
        .client(elsewhere)
        .await?
        .with_credentials("alice", "pw")?;
    let bob = cluster
        .client(leader)
        .await?
        .with_credentials("bob", "pw")?;

    info!("--- alice consumes, then loses read on the queue");
    let mut consumer = alice.consume("c.q", 10).await?;
    admin.publish("", "c.q", message("a1")).await?;
    let d = consumer
        .next_timeout(Duration::from_secs(10))
        .await?
        .expect("a delivery before the revoke");
    assert_eq!(super::body(&d), "a1");
    admin.set_permissions("alice", "/", ".*", ".*", "").await?;
    let end = tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("the stream ends after the revoke");
    match end {
        Some(Err(e)) => {
            let status = e.status().expect("a gRPC status");
            assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        }
        other => panic!("expected PERMISSION_DENIED, got {other:?}"),
    }
    eventually(
        "alice's unacked message back in the queue",
        Duration::from_secs(15),
        || {
            let admin = admin.clone();
            async move {
                let q = admin.get_queue("c.q").await?;
                Ok((q.messages_ready == 1 && q.consumers == 0).then_some(()))
            }
        },
    )
    .await?;

    info!("--- bob consumes, then is deleted");
    let mut consumer = bob.consume("c.q", 10).await?;
    let d = consumer
        .next_timeout(Duration::from_secs(10))
        .await?
        .expect("a delivery before the delete");
    assert_eq!(super::body(&d), "a1");
    admin.delete_user("bob").await?;
    let end = tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("the stream ends after the delete");
    match end {
        Some(Err(e)) => {
            let status = e.status().expect("a gRPC status");
            assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        }
        other => panic!("expected PERMISSION_DENIED, got {other:?}"),
    }
    assert_status(
        bob.list_queues().await,
        Code::Unauthenticated,
        "invalid credentials",
    );
    cluster.stop();
    Ok(())
}
