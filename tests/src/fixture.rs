//! The upgrade fixture: a cluster's data written by one release, and what a later release must
//! find in it.
//!
//! [`populate`] gives a running cluster a little of everything a production cluster holds
//! (vhosts, users with password hashes, permissions, limits, policies, exchanges, bindings,
//! queues with arguments, messages with every property and header type, dead letters with
//! their `x-death` history, a message taken with a lease and not settled). [`record`] writes
//! down what the cluster holds, as JSON that does not depend on how the broker stores it. The
//! `make-upgrade-fixture` example runs both on the current release, stops the nodes cleanly and
//! packs their data directories with the record beside them; the `upgrade` test starts today's
//! binary on those directories and compares its own record with the stored one.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, ensure};
use base64::Engine;
use qq_client::{Client, Value, ValueExt, v1};
use serde_json::{Value as Json, json};

/// The vhost of the fixture's second set of definitions (the default vhost holds the queues).
pub const VHOST: &str = "legacy";
/// A user whose password must still verify after the upgrade.
pub const USER: (&str, &str) = ("keeper", "keeper-secret-1");
/// The queue holding a leased (taken, unsettled) message.
pub const LEASED_QUEUE: &str = "fx.leased";

/// A message with every property set and one header of each type.
fn message(i: usize) -> v1::Message {
    let headers: HashMap<String, Value> = [
        ("s", Value::string(format!("text-{i}"))),
        ("l", Value::long(-(i as i64) - 1)),
        ("b", Value::bool(i % 2 == 0)),
        ("d", Value::double(i as f64 + 0.25)),
        ("x", Value::bytes(vec![0u8, 1, 2, i as u8])),
        ("t", Value::timestamp(1_700_000_000 + i as i64)),
        ("a", Value::list(vec![Value::long(1), Value::string("two")])),
        (
            "m",
            Value::table([("k".to_string(), Value::long(i as i64))].into()),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    v1::Message {
        properties: Some(v1::Properties {
            content_type: "text/plain".into(),
            content_encoding: "utf-8".into(),
            headers,
            delivery_mode: 2,
            priority: (i % 10) as u32,
            correlation_id: format!("corr-{i}"),
            reply_to: "replies".into(),
            expiration: String::new(),
            message_id: format!("id-{i}"),
            timestamp: 1_700_000_000 + i as i64,
            r#type: "fixture".into(),
            user_id: String::new(),
            app_id: "make-upgrade-fixture".into(),
        }),
        body: format!("body-{i}").into_bytes().into(),
    }
}

fn args(pairs: &[(&str, Value)]) -> HashMap<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Definitions and messages of every kind the fixture keeps, through `admin` (an administrator
/// on the default vhost).
pub async fn populate(admin: &Client) -> anyhow::Result<()> {
    admin.put_vhost(VHOST).await?;
    admin
        .put_user(USER.0, USER.1, vec!["monitoring".into()])
        .await?;
    admin
        .set_permissions(USER.0, "/", "^fx\\.", "^fx\\.", ".*")
        .await?;
    admin
        .set_vhost_limits(
            VHOST,
            v1::Limits {
                max_queues: Some(50),
                max_connections: Some(20),
                ..Default::default()
            },
        )
        .await?;
    admin
        .set_policy(
            "fx-limit",
            "^fx\\.capped$",
            "queues",
            7,
            args(&[("max-length", Value::long(5))]),
        )
        .await?;
    // Enough metadata entries (over 100) for a metadata snapshot in the fixture.
    for i in 0..90 {
        admin
            .declare_exchange(&format!("fx.e{i:02}"), "direct")
            .await?;
    }
    admin.declare_exchange("fx.topic", "topic").await?;
    admin.declare_exchange("fx.dlx", "fanout").await?;
    admin
        .declare_queue(
            "fx.work",
            args(&[
                ("x-delivery-limit", Value::long(3)),
                ("x-dead-letter-exchange", Value::string("fx.dlx")),
            ]),
        )
        .await?;
    admin.declare_queue("fx.dead", HashMap::new()).await?;
    admin.declare_queue("fx.capped", HashMap::new()).await?;
    admin.declare_queue(LEASED_QUEUE, HashMap::new()).await?;
    admin
        .bind("fx.work", "fx.topic", "work.#", HashMap::new())
        .await?;
    admin.bind("fx.dead", "fx.dlx", "", HashMap::new()).await?;
    for i in 0..40 {
        admin.publish("fx.topic", "work.item", message(i)).await?;
    }
    for i in 40..50 {
        admin.publish("", "fx.capped", message(i)).await?;
    }
    // Enough queue entries (over 100) for a queue snapshot in the fixture.
    admin.declare_queue("fx.bulk", HashMap::new()).await?;
    for i in 0..150 {
        let m = v1::Message {
            body: format!("bulk-{i}").into_bytes().into(),
            ..Default::default()
        };
        admin.publish("", "fx.bulk", m).await?;
    }
    for i in 50..53 {
        admin.publish("", LEASED_QUEUE, message(i)).await?;
    }
    // Three rejected: dead-lettered to fx.dead with an x-death entry (reason rejected).
    for _ in 0..3 {
        let got = admin.get("fx.work", false, 60_000).await?;
        let receipt = got.delivery.context("a delivery")?.receipt;
        admin
            .settle(vec![receipt], v1::SettleOutcome::Reject)
            .await?;
    }
    // One returned: redelivered, with a failed delivery counted.
    let got = admin.get("fx.work", false, 60_000).await?;
    let receipt = got.delivery.context("a delivery")?.receipt;
    admin
        .settle(vec![receipt], v1::SettleOutcome::Requeue)
        .await?;
    // One taken and left unsettled: held under its lease.
    admin.get(LEASED_QUEUE, false, 60_000).await?;
    Ok(())
}

/// A header value as JSON, its type kept.
fn value_json(v: &Value) -> Json {
    use v1::value::Kind;
    match &v.kind {
        None => Json::Null,
        Some(Kind::StringValue(s)) => json!({ "string": s }),
        Some(Kind::LongValue(n)) => json!({ "long": n }),
        Some(Kind::BoolValue(b)) => json!({ "bool": b }),
        Some(Kind::DoubleValue(d)) => json!({ "double": d }),
        Some(Kind::BytesValue(b)) => {
            json!({ "bytes": base64::engine::general_purpose::STANDARD.encode(b) })
        }
        Some(Kind::TimestampValue(t)) => json!({ "timestamp": t }),
        Some(Kind::ListValue(l)) => {
            json!({ "list": l.values.iter().map(value_json).collect::<Vec<_>>() })
        }
        Some(Kind::TableValue(t)) => json!({ "table": table_json(&t.fields) }),
    }
}

fn table_json(t: &HashMap<String, Value>) -> Json {
    let sorted: BTreeMap<&String, Json> = t.iter().map(|(k, v)| (k, value_json(v))).collect();
    json!(sorted)
}

fn message_json(m: &v1::BrowsedMessage) -> Json {
    let msg = m.message.clone().unwrap_or_default();
    let p = msg.properties.unwrap_or_default();
    json!({
        "body": String::from_utf8_lossy(&msg.body),
        "exchange": m.exchange,
        "routing_key": m.routing_key,
        "redelivered": m.redelivered,
        "delivery_count": m.delivery_count,
        "enqueued_at_ms": m.enqueued_at_ms,
        "properties": {
            "content_type": p.content_type,
            "content_encoding": p.content_encoding,
            "headers": table_json(&p.headers),
            "delivery_mode": p.delivery_mode,
            "priority": p.priority,
            "correlation_id": p.correlation_id,
            "reply_to": p.reply_to,
            "expiration": p.expiration,
            "message_id": p.message_id,
            "timestamp": p.timestamp,
            "type": p.r#type,
            "user_id": p.user_id,
            "app_id": p.app_id,
        },
    })
}

/// Everything the cluster holds, as `client` (an administrator) sees it: the exported
/// definitions, and per queue its arguments, policy, counts and ready messages in order.
pub async fn record(client: &Client) -> anyhow::Result<Json> {
    let definitions: Json = serde_json::from_str(&client.export_definitions().await?)
        .context("ExportDefinitions is JSON")?;
    let mut queues = BTreeMap::new();
    for listed in client.list_queues().await? {
        let (q, ready) = counts_and_ready(client, &listed.name).await?;
        queues.insert(
            q.name.clone(),
            json!({
                "arguments": table_json(&q.arguments),
                "policy": q.policy,
                "messages": q.messages,
                "unacked": q.messages_unacked,
                "dead_letter_held": q.messages_dead_letter_held,
                "ready": ready,
            }),
        );
    }
    Ok(json!({ "definitions": definitions, "queues": queues }))
}

/// A queue's counts and its ready messages in order, read so that they agree: a Get lease
/// that lapses while the ready list is read moves a message from unacked to ready, so the
/// counts are read before and after the list and the whole read is repeated until they match.
async fn counts_and_ready(
    client: &Client,
    name: &str,
) -> anyhow::Result<(v1::QueueInfo, Vec<Json>)> {
    for _ in 0..10 {
        let before = client.get_queue(name).await?;
        let mut ready = Vec::new();
        loop {
            let page = client.browse(name, ready.len() as u64, 1000).await?;
            if page.messages.is_empty() {
                break;
            }
            ready.extend(page.messages.iter().map(message_json));
        }
        let after = client.get_queue(name).await?;
        if (before.messages_ready, before.messages_unacked)
            == (after.messages_ready, after.messages_unacked)
        {
            return Ok((after, ready));
        }
    }
    anyhow::bail!("{name}: its counts kept changing while its ready messages were read")
}

/// Compares what the upgraded cluster holds (`now`) with what the old release recorded
/// (`then`). Allowances: the release that exported, and empty arrays (see below); and a leased message whose lease ran out since is ready again (at the
/// head, as any returned message), so in [`LEASED_QUEUE`] the unacked count may have moved to
/// the ready list.
pub fn compare(then: &Json, now: &Json) -> anyhow::Result<()> {
    // The exporting binary's release is the one field that must change; an array a later
    // release added to the document (e.g. operator_policies) is left out when empty, as the
    // old release had nothing to put in it.
    let definitions = |j: &Json| {
        let mut d = j["definitions"].clone();
        if let Some(m) = d.as_object_mut() {
            m.remove("quorumq_version");
            m.retain(|_, v| v.as_array().is_none_or(|a| !a.is_empty()));
        }
        d
    };
    ensure!(
        definitions(then) == definitions(now),
        "definitions differ:\nthen {}\nnow  {}",
        definitions(then),
        definitions(now)
    );
    let (Some(before), Some(after)) = (then["queues"].as_object(), now["queues"].as_object())
    else {
        anyhow::bail!("no queues recorded");
    };
    let names = |m: &serde_json::Map<String, Json>| m.keys().cloned().collect::<Vec<_>>();
    ensure!(
        names(before) == names(after),
        "queues differ: {:?} then, {:?} now",
        names(before),
        names(after)
    );
    for (name, b) in before {
        let a = &after[name];
        for key in ["arguments", "policy", "messages", "dead_letter_held"] {
            ensure!(
                b[key] == a[key],
                "{name}: {key} was {} now {}",
                b[key],
                a[key]
            );
        }
        let (b_ready, a_ready) = (b["ready"].as_array(), a["ready"].as_array());
        let (Some(b_ready), Some(a_ready)) = (b_ready, a_ready) else {
            anyhow::bail!("{name}: no ready list");
        };
        let returned = b["unacked"]
            .as_u64()
            .unwrap_or(0)
            .checked_sub(a["unacked"].as_u64().unwrap_or(0))
            .with_context(|| {
                format!("{name}: unacked was {} now {}", b["unacked"], a["unacked"])
            })?;
        ensure!(
            name == LEASED_QUEUE || returned == 0,
            "{name}: unacked was {} now {}",
            b["unacked"],
            a["unacked"]
        );
        ensure!(
            a_ready.len() == b_ready.len() + returned as usize,
            "{name}: {} ready then, {} now ({returned} returned by an expired lease)",
            b_ready.len(),
            a_ready.len()
        );
        let tail = &a_ready[returned as usize..];
        for (i, (x, y)) in b_ready.iter().zip(tail).enumerate() {
            ensure!(x == y, "{name}: ready message {i} was\n{x}\nnow\n{y}");
        }
    }
    Ok(())
}
