//! Message priorities over AMQP as RabbitMQ 4.0's quorum queues have them: a backlog of normal
//! and high-priority messages (priority 5 and up) is delivered two high for each normal while
//! both wait, each level in publish order, with the `priority` property delivered unchanged;
//! and RabbitMQ 4.3's strict levels under `x-max-priority`.

use anyhow::{Context, ensure};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use qq_tests::{TestCluster, info};

use super::amqp::{WAIT, connect, declare, quorum};

/// Publishes each (body, priority) to `queue` through the default exchange, persistent, each
/// confirmed (`ch` is in confirm mode).
async fn publish_all(
    ch: &Channel,
    queue: &str,
    messages: &[(&str, Option<u8>)],
) -> anyhow::Result<()> {
    for (body, priority) in messages {
        let mut props = BasicProperties::default().with_delivery_mode(2);
        if let Some(p) = priority {
            props = props.with_priority(*p);
        }
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                props,
            )
            .await?
            .await?;
        ensure!(confirm.is_ack(), "{body}: {confirm:?}");
    }
    Ok(())
}

/// Consumes `n` messages from `queue` one at a time (prefetch 1, ack each): each body and
/// priority property, in delivery order.
async fn consume_one_by_one(
    ch: &Channel,
    queue: &str,
    n: usize,
) -> anyhow::Result<Vec<(String, Option<u8>)>> {
    ch.basic_qos(1, BasicQosOptions::default()).await?;
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "reader".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut got = Vec::new();
    for _ in 0..n {
        let d = tokio::time::timeout(WAIT, consumer.next())
            .await
            .context("no delivery")?
            .context("the consumer ended")??;
        got.push((String::from_utf8(d.data.clone())?, *d.properties.priority()));
        d.ack(BasicAckOptions::default()).await?;
    }
    Ok(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_priority_messages_go_two_to_one_before_normal_ones() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let conn = connect(&cluster, 2).await?;
    let ch = conn.create_channel().await?;
    declare(&ch, "prio", quorum()).await?;
    let line = "quorumq_queue_machine_version{vhost=\"/\",queue=\"prio\"} 2";
    cluster
        .wait_metric_line_everywhere(line, "prio at machine version 2")
        .await?;

    info!("--- a backlog: n0..n3 (no priority, 4, 3), then h0..h5 (priority 5, 9)");
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let published: Vec<(&str, Option<u8>)> = vec![
        ("n0", None),
        ("n1", Some(4)),
        ("n2", None),
        ("n3", Some(3)),
        ("h0", Some(9)),
        ("h1", Some(5)),
        ("h2", Some(9)),
        ("h3", Some(5)),
        ("h4", Some(9)),
        ("h5", Some(5)),
    ];
    publish_all(&ch, "prio", &published).await?;

    // Six high-priority messages wait, on every replica.
    let line = "quorumq_queue_messages_ready_high_priority{vhost=\"/\",queue=\"prio\"} 6";
    cluster
        .wait_metric_line_everywhere(line, "six high-priority messages ready")
        .await?;

    info!("--- one at a time (prefetch 1, ack each)");
    let mut got = Vec::new();
    for (body, priority) in consume_one_by_one(&ch, "prio", published.len()).await? {
        let sent = published
            .iter()
            .find(|(b, _)| *b == body)
            .context("unknown body")?;
        ensure!(
            priority == sent.1,
            "{body}: priority {priority:?}, sent {:?}",
            sent.1
        );
        got.push(body);
    }
    let expected = ["h0", "h1", "n0", "h2", "h3", "n1", "h4", "h5", "n2", "n3"];
    ensure!(got == expected, "delivered {got:?}, expected {expected:?}");
    conn.close(200, "bye".into()).await?;
    cluster.stop();
    Ok(())
}

/// RabbitMQ 4.3's strict priorities under `x-max-priority`: the highest level first, FIFO
/// within a level, a priority above the top counted as the top; kept across a restart of every
/// node (the levels come back from the log and the queue's arguments); a redeclare with another
/// `x-max-priority` is 406.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_levels_deliver_the_highest_first_across_a_restart() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start(3).await?;
    let conn = connect(&cluster, 1).await?;
    let ch = conn.create_channel().await?;
    let with_max = |n: i64| {
        let mut args = quorum();
        args.insert("x-max-priority".into(), AMQPValue::LongLongInt(n));
        args
    };
    declare(&ch, "strict", with_max(9)).await?;
    let line = "quorumq_queue_machine_version{vhost=\"/\",queue=\"strict\"} 2";
    cluster
        .wait_metric_line_everywhere(line, "strict at machine version 2")
        .await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let published: [(&str, Option<u8>); 7] = [
        ("a", None),
        ("b3", Some(3)),
        ("c9", Some(9)),
        ("d5", Some(5)),
        ("e200", Some(200)),
        ("f3", Some(3)),
        ("g0", Some(0)),
    ];
    publish_all(&ch, "strict", &published).await?;
    let e = ch
        .queue_declare("strict".into(), super::amqp::durable(), with_max(5))
        .await
        .expect_err("a redeclare with another x-max-priority");
    ensure!(super::amqp::reply_code(&e) == Some(406), "{e}");
    drop(conn);

    info!("--- every node restarts: the levels come back from the log");
    cluster.restart_all().await?;
    for (level, n) in [(9, 2), (5, 1), (3, 2), (0, 2)] {
        let line = format!(
            "quorumq_queue_messages_ready_by_priority{{vhost=\"/\",queue=\"strict\",priority=\"{level}\"}} {n}"
        );
        cluster
            .wait_metric_line_everywhere(&line, &format!("{n} ready at level {level}"))
            .await?;
    }
    let conn = connect(&cluster, 3).await?;
    let ch = conn.create_channel().await?;
    let got: Vec<String> = consume_one_by_one(&ch, "strict", published.len())
        .await?
        .into_iter()
        .map(|(body, _)| body)
        .collect();
    let expected = ["c9", "e200", "d5", "b3", "f3", "a", "g0"];
    ensure!(got == expected, "delivered {got:?}, expected {expected:?}");
    conn.close(200, "bye".into()).await?;
    cluster.stop();
    Ok(())
}
