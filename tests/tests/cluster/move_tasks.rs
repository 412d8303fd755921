//! Story: move tasks (redrive, issue 16) against a real three-node cluster. Messages die in
//! `orders` (a per-message TTL of 0) and land in a dead-letter queue; an operator moves some of
//! them to a retry queue (order and x-death kept, moved + remaining adding up), moves others
//! back to the queue they first died in, cancels a slow task, and a task survives the kill of
//! its source queue's leader with no message lost or stored twice.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, ensure};
use qq_client::{Client, MessageBuilder, PublishOutcome, Value, ValueExt, delivery_headers, table};
use qq_proto::v1::MoveTask;
use qq_tests::{TestCluster, eventually, info};

use super::{assert_status, body, drain_exactly};

const WAIT: Duration = Duration::from_secs(30);

/// Declare `orders` dead-lettering (at-least-once, so none is dropped) to `dlq`, and `dlq`;
/// publish `bodies` to `orders` with a TTL of 0 so each dies at once; wait until `dlq` holds
/// them all. Returns their order there.
async fn fill_dlq(
    c: &Client,
    orders: &str,
    dlq: &str,
    bodies: &[String],
) -> anyhow::Result<Vec<String>> {
    c.declare_queue(dlq, HashMap::new()).await?;
    let args = table([
        ("x-dead-letter-exchange", Value::string("")),
        ("x-dead-letter-routing-key", Value::string(dlq)),
        ("x-dead-letter-strategy", Value::string("at-least-once")),
        ("x-overflow", Value::string("reject-publish")),
    ]);
    c.declare_queue(orders, args).await?;
    let mut publisher = c.publisher(256).await?;
    for b in bodies {
        let m = MessageBuilder::new(b.clone()).expiration("0").build();
        publisher.send("", orders, m).await?;
    }
    for r in publisher.close().await? {
        ensure!(r.outcome == PublishOutcome::Confirmed, "{orders}: {r:?}");
    }
    let n = bodies.len() as u64;
    eventually(&format!("{dlq}: {n} dead letters"), WAIT, || async move {
        Ok((c.get_queue(dlq).await?.messages_ready == n).then_some(()))
    })
    .await?;
    let mut order = Vec::new();
    while order.len() < bodies.len() {
        let browsed = c.browse(dlq, order.len() as u64, 1000).await?;
        ensure!(!browsed.messages.is_empty(), "{dlq}: browse ended early");
        order.extend(browsed.messages.iter().map(|m| {
            let body = m
                .message
                .as_ref()
                .map(|m| m.body.clone())
                .unwrap_or_default();
            String::from_utf8_lossy(&body).into_owned()
        }));
    }
    Ok(order)
}

async fn wait_task(
    c: &Client,
    task_id: &str,
    what: &str,
    pred: impl Fn(&MoveTask) -> bool,
) -> anyhow::Result<MoveTask> {
    let pred = &pred;
    eventually(
        &format!("move task {task_id}: {what}"),
        WAIT,
        || async move {
            let t = c.get_move_task(task_id).await?;
            Ok(pred(&t).then_some(t))
        },
    )
    .await
}

async fn ready(c: &Client, queue: &str) -> anyhow::Result<u64> {
    Ok(c.get_queue(queue).await?.messages_ready)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn move_to_a_queue_back_to_first_death_and_cancel() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    let c2 = cluster.client(2).await?;
    let bodies: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    let order = fill_dlq(&c, "mv.orders", "mv.dlq", &bodies).await?;
    c.declare_queue("mv.retry", HashMap::new()).await?;

    info!("--- bad arguments are refused before anything is proposed");
    assert_status(
        c.start_move_task("mv.dlq", "mv.nowhere", 0, 0).await,
        tonic::Code::NotFound,
        "mv.nowhere",
    );
    assert_status(
        c.start_move_task("mv.dlq", "mv.dlq", 0, 0).await,
        tonic::Code::InvalidArgument,
        "destination",
    );
    assert_status(
        c.start_move_task("", "mv.retry", 0, 0).await,
        tonic::Code::InvalidArgument,
        "source",
    );
    assert_status(
        c.get_move_task("nope").await,
        tonic::Code::InvalidArgument,
        "task_id",
    );
    assert_status(
        c.get_move_task("999999.1").await,
        tonic::Code::NotFound,
        "999999.1",
    );

    info!("--- permissions: read on the source, write on the destination");
    c.put_user("bob", "bob-pw", vec![]).await?;
    // bob reads everything but writes only mv.orders.
    c.set_permissions("bob", "/", ".*", "^mv\\.orders$", ".*")
        .await?;
    let bob = c.clone().with_credentials("bob", "bob-pw")?;
    assert_status(
        bob.start_move_task("mv.dlq", "mv.retry", 0, 0).await,
        tonic::Code::PermissionDenied,
        "mv.retry",
    );
    // carol writes everything but reads nothing: she may not take messages out of mv.dlq.
    c.put_user("carol", "carol-pw", vec![]).await?;
    c.set_permissions("carol", "/", ".*", ".*", "^$").await?;
    let carol = c.clone().with_credentials("carol", "carol-pw")?;
    assert_status(
        carol.start_move_task("mv.dlq", "mv.retry", 0, 0).await,
        tonic::Code::PermissionDenied,
        "mv.dlq",
    );

    info!("--- 4 of 10 move to mv.retry: order and x-death kept, moved + remaining add up");
    let id = c2.start_move_task("mv.dlq", "mv.retry", 4, 0).await?;
    let t = wait_task(&c, &id, "done", |t| t.state == "DONE").await?;
    ensure!(t.moved == 4 && t.remaining == 0, "{t:?}");
    ensure!(ready(&c, "mv.dlq").await? == 6);
    let mut moved = Vec::new();
    for _ in 0..4 {
        let d = c
            .get("mv.retry", true, 0)
            .await?
            .delivery
            .context("a moved message")?;
        let h = delivery_headers(&d);
        ensure!(
            h.get("x-first-death-queue").and_then(|v| v.as_str()) == Some("mv.orders"),
            "{h:?}"
        );
        ensure!(h.contains_key("x-death"), "x-death lost: {h:?}");
        moved.push(body(&d));
    }
    ensure!(
        moved == order[..4],
        "moved {moved:?}, dead-letter order {order:?}"
    );
    drain_exactly(&c, "mv.retry", 0).await?;
    let listed = c.list_move_tasks().await?;
    ensure!(
        listed.iter().any(|t| t.task_id == id && t.state == "DONE"),
        "{listed:?}"
    );

    info!("--- a slow move back: its progress adds up while it runs");
    let started = std::time::Instant::now();
    let slow = c.start_move_task("mv.dlq", "", 2, 1).await?;
    let t = c.get_move_task(&slow).await?;
    ensure!(t.moved + t.remaining == 2, "{t:?}");

    info!("--- empty destination: 2 go back to their x-first-death-queue, at 1 per second");
    wait_task(&c, &slow, "done", |t| t.state == "DONE").await?;
    // One per round at 1 per second: the second round waits a second after the first began.
    ensure!(
        started.elapsed() >= Duration::from_secs(1),
        "2 messages at 1 per second moved in {:?}",
        started.elapsed()
    );
    ensure!(ready(&c, "mv.orders").await? == 2);
    ensure!(ready(&c, "mv.dlq").await? == 4);
    let back = drain_exactly(&c, "mv.orders", 2).await?;
    ensure!(back == order[4..6], "{back:?}");

    info!("--- a slow task is cancelled: nothing lost, delivery resumes in the source");
    let id = c.start_move_task("mv.dlq", "mv.retry", 0, 1).await?;
    assert_status(
        c.start_move_task("mv.dlq", "mv.retry", 0, 0).await,
        tonic::Code::FailedPrecondition,
        "already",
    );
    wait_task(&c, &id, "one moved", |t| t.moved >= 1).await?;
    c2.cancel_move_task(&id).await?;
    let t = c.get_move_task(&id).await?;
    ensure!(t.state == "CANCELLED" && t.remaining == 0, "{t:?}");
    ensure!(t.detail.contains("cancelled"), "{t:?}");
    // A round in flight at the cancel may still finish: count once it settled.
    let (in_dlq, in_retry) = eventually("moves settled", WAIT, || async {
        let t = c.get_move_task(&id).await?;
        let (d, r) = (ready(&c, "mv.dlq").await?, ready(&c, "mv.retry").await?);
        Ok((r == t.moved && d + r == 4).then_some((d, r)))
    })
    .await?;
    ensure!(in_retry < 4, "the cancelled task moved everything");
    let rest = drain_exactly(&c, "mv.dlq", in_dlq as usize).await?;
    let moved = drain_exactly(&c, "mv.retry", in_retry as usize).await?;
    ensure!([moved, rest].concat() == order[6..], "order lost");

    info!("--- a message with no x-first-death-queue fails a move back; it stays put");
    c.declare_queue("mv.plain", HashMap::new()).await?;
    let r = c
        .publish("", "mv.plain", qq_client::message("never died"))
        .await?;
    ensure!(r.outcome == PublishOutcome::Confirmed, "{r:?}");
    let id = c.start_move_task("mv.plain", "", 0, 0).await?;
    let t = wait_task(&c, &id, "failed", |t| t.state == "FAILED").await?;
    ensure!(
        t.detail.contains("x-first-death-queue") && t.moved == 0,
        "{t:?}"
    );
    drain_exactly(&c, "mv.plain", 1).await?;
    cluster.stop();
    Ok(())
}

/// Messages in the move that a leader kill interrupts.
const N: usize = 3000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_survives_the_kill_of_the_source_leader() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    let bodies: Vec<String> = (0..N).map(|i| format!("k{i:04}")).collect();
    let order = fill_dlq(&c, "mk.orders", "mk.dlq", &bodies).await?;
    c.declare_queue("mk.retry", HashMap::new()).await?;

    // No rate limit: rounds run back to back, each one a commit in mk.retry and then a
    // MoveDone in mk.dlq, so a kill at a random moment often falls between the two (the case
    // where the new leader re-sends a batch that is already in mk.retry).
    info!("--- a move without a rate limit starts");
    let id = c.start_move_task("mk.dlq", "mk.retry", 0, 0).await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let t = c.get_move_task(&id).await?;
        ensure!(t.state == "RUNNING", "finished before the kill: {t:?}");
        if t.moved >= 128 {
            break;
        }
        ensure!(tokio::time::Instant::now() < deadline, "no progress: {t:?}");
    }

    info!("--- the source queue's leader is killed mid-move");
    let old = cluster.leader_of("mk.dlq").await?;
    cluster.kill9(old);
    let new = cluster.leader_of_except("mk.dlq", old).await?;
    info!(old, new, "--- new leader");
    let c = cluster.client(cluster.others(old)[0]).await?;
    let t = wait_task(&c, &id, "done on the new leader", |t| t.state == "DONE").await?;
    ensure!(t.moved == N as u64 && t.remaining == 0, "{t:?}");

    info!("--- every message is in mk.retry once, in order; mk.dlq is empty");
    let q = c.get_queue("mk.retry").await?;
    ensure!(
        q.messages_ready == N as u64,
        "mk.retry holds {} of {N}",
        q.messages_ready
    );
    let mut got = Vec::new();
    while got.len() < N {
        let page = c.browse("mk.retry", got.len() as u64, 1000).await?;
        ensure!(!page.messages.is_empty(), "mk.retry: browse ended early");
        got.extend(page.messages.iter().map(|m| {
            let body = m
                .message
                .as_ref()
                .map(|m| m.body.clone())
                .unwrap_or_default();
            String::from_utf8_lossy(&body).into_owned()
        }));
    }
    ensure!(got == order, "mk.retry is not the dead-letter order");
    ensure!(ready(&c, "mk.dlq").await? == 0);
    cluster.stop();
    Ok(())
}
