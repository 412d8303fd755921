//! # qqctl: the command line for quorumq
//!
//! One process per command, one gRPC connection to one node (`--node`, any node: the node
//! forwards to the leader concerned). Every command maps onto one or a few `qq.v1.Broker` RPCs
//! through `qq-client`; nothing here knows about Raft.
//!
//! Output is meant for people: tables for lists, JSON for a single queue's full state. Errors
//! print `error: <CODE>: <message>` (the gRPC code as API.md spells it) to stderr and exit 1,
//! so scripts can match on the code.
//!
//! **Typed `key=value` arguments** (`--arg`, `--header`): the value is a `long` when it parses
//! as an integer (`x-max-length=5`), a `bool` for `true` / `false`, and a string otherwise
//! (`x-overflow=reject-publish`). Quote a number to keep it a string: `x-match='"all"'` is not
//! needed for words, but `k='"42"'` sends the string `42`. `--definition` of `set-policy` is
//! JSON: integers become longs, other numbers doubles, arrays lists, objects tables.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use qq_client::{
    Client, Delivery, MessageBuilder, PublishOutcome, QueueInfo, SettleOutcome, Value, ValueExt,
    display_table, display_value, v1,
};
use serde_json::{Map, Value as Json, json};

#[derive(Debug, Parser)]
#[command(
    name = "qqctl",
    version,
    about = "Command-line client for a quorumq cluster"
)]
struct Cli {
    /// Any node of the cluster (host:port or http://host:port).
    #[arg(long, global = true, env = "QQ_NODE", default_value = "127.0.0.1:7101")]
    node: String,
    /// User name (requests without credentials act as guest).
    #[arg(long, global = true, env = "QQ_USER", default_value = "guest")]
    user: String,
    /// Password.
    #[arg(long, global = true, env = "QQ_PASSWORD", default_value = "guest")]
    password: String,
    /// Virtual host (empty means /).
    #[arg(long, global = true, env = "QQ_VHOST", default_value = "")]
    vhost: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ExchangeType {
    Direct,
    Fanout,
    Topic,
    Headers,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Declare an exchange.
    DeclareExchange {
        name: String,
        #[arg(long = "type", value_enum, default_value = "direct")]
        kind: ExchangeType,
        /// Exchange argument key=value (typed, see `qqctl --help`).
        #[arg(long = "arg", value_name = "KEY=VALUE")]
        args: Vec<String>,
        /// Internal: cannot be published to directly.
        #[arg(long)]
        internal: bool,
    },
    /// Delete an exchange.
    DeleteExchange {
        name: String,
        #[arg(long)]
        if_unused: bool,
    },
    /// Declare a quorum queue.
    DeclareQueue {
        name: String,
        /// Queue argument key=value, e.g. x-max-length=5 (integers → long, true/false → bool,
        /// else string).
        #[arg(long = "arg", value_name = "KEY=VALUE")]
        args: Vec<String>,
    },
    /// Delete a queue.
    DeleteQueue {
        name: String,
        #[arg(long)]
        if_unused: bool,
        #[arg(long)]
        if_empty: bool,
    },
    /// Remove every ready message from a queue.
    Purge { name: String },
    /// Bind a queue to an exchange.
    Bind(BindArgs),
    /// Remove a binding.
    Unbind(BindArgs),
    /// Publish a message (or --count messages) and print the outcome.
    Publish(PublishArgs),
    /// Take one message. Default and --no-ack: print it and return it to the queue;
    /// --ack: take it for good.
    Get {
        queue: String,
        /// Remove the message from the queue (auto-ack).
        #[arg(long, conflicts_with = "no_ack")]
        ack: bool,
        /// Leave the message in the queue (it is requeued after printing; this counts as a
        /// failed delivery).
        #[arg(long)]
        no_ack: bool,
    },
    /// Consume from a queue, printing each delivery; acks unless --reject or --requeue.
    Consume {
        queue: String,
        #[arg(long, default_value_t = 10)]
        prefetch: u32,
        /// Stop after this many deliveries (default: run until interrupted).
        #[arg(long)]
        count: Option<u64>,
        /// Reject every delivery (dead-letters with reason `rejected`).
        #[arg(long, conflicts_with = "requeue")]
        reject: bool,
        /// Requeue every delivery (redelivered, x-delivery-count + 1).
        #[arg(long)]
        requeue: bool,
    },
    /// Table of queues.
    ListQueues,
    /// One queue's full state, including its effective configuration, as JSON.
    Queue { name: String },
    /// Table of exchanges.
    ListExchanges,
    /// Table of bindings.
    ListBindings,
    /// Set a policy: e.g. set-policy limit '^jobs\.' --definition '{"max-length":5}'.
    SetPolicy {
        name: String,
        pattern: String,
        /// JSON object of policy keys (max-length, message-ttl, overflow, dead-letter-exchange, …).
        #[arg(long)]
        definition: String,
        #[arg(long, default_value_t = 0)]
        priority: i64,
        #[arg(long, default_value = "queues", value_parser = ["all", "queues", "exchanges"])]
        apply_to: String,
    },
    /// Remove a policy.
    ClearPolicy { name: String },
    /// Table of policies.
    ListPolicies,
    /// Create or update a user.
    PutUser {
        name: String,
        #[arg(long = "new-password")]
        new_password: String,
        /// Comma-separated tags (e.g. administrator).
        #[arg(long, value_delimiter = ',')]
        tags: Vec<String>,
    },
    /// Delete a user.
    DeleteUser { name: String },
    /// Set a user's permissions on the vhost given with --vhost (default /); each is a regex.
    SetPermissions {
        user: String,
        #[arg(long, default_value = ".*")]
        configure: String,
        #[arg(long, default_value = ".*")]
        write: String,
        #[arg(long, default_value = ".*")]
        read: String,
    },
    /// Create a vhost.
    PutVhost { name: String },
    /// Delete a vhost and everything in it.
    DeleteVhost { name: String },
    /// Nodes, metadata leader and queue leaders.
    Status,
    /// Cluster-wide counters.
    Overview,
}

#[derive(Debug, Args)]
struct BindArgs {
    queue: String,
    exchange: String,
    #[arg(long, default_value = "")]
    key: String,
    /// Binding argument key=value (headers exchanges: x-match=all, format=pdf, …).
    #[arg(long = "arg", value_name = "KEY=VALUE")]
    args: Vec<String>,
}

#[derive(Debug, Args)]
struct PublishArgs {
    /// Exchange (default: the nameless default exchange, routing to the queue named by --key).
    #[arg(long, default_value = "")]
    exchange: String,
    #[arg(long)]
    key: String,
    /// Message body as text.
    #[arg(long, conflicts_with_all = ["count", "size"])]
    body: Option<String>,
    /// Publish this many generated messages and print the confirmed rate.
    #[arg(long)]
    count: Option<u64>,
    /// Body size in bytes of generated messages.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Header key=value (typed like --arg).
    #[arg(long = "header", value_name = "KEY=VALUE")]
    headers: Vec<String>,
    /// Per-message TTL in ms (sent as given: the server validates it).
    #[arg(long)]
    expiration: Option<String>,
    /// Return UNROUTABLE when no queue matches.
    #[arg(long)]
    mandatory: bool,
    /// Use the pipelined PublishStream instead of unary publishes.
    #[arg(long)]
    stream: bool,
    /// Unconfirmed messages in flight with --stream.
    #[arg(long, default_value_t = 256)]
    window: usize,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<qq_client::Error>() {
                Some(client_error) => eprintln!("error: {client_error}"),
                None => eprintln!("error: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let client = Client::connect(&cli.node)
        .await?
        .with_credentials(&cli.user, &cli.password)?
        .with_vhost(&cli.vhost);
    match cli.command {
        Command::DeclareExchange {
            name,
            kind,
            args,
            internal,
        } => {
            let kind = match kind {
                ExchangeType::Direct => "direct",
                ExchangeType::Fanout => "fanout",
                ExchangeType::Topic => "topic",
                ExchangeType::Headers => "headers",
            };
            client
                .declare_exchange_with(v1::DeclareExchangeRequest {
                    name: name.clone(),
                    r#type: kind.into(),
                    durable: true,
                    internal,
                    arguments: parse_pairs(&args)?,
                    ..Default::default()
                })
                .await?;
            println!("exchange {name} ({kind}) declared");
        }
        Command::DeleteExchange { name, if_unused } => {
            client.delete_exchange(&name, if_unused).await?;
            println!("exchange {name} deleted");
        }
        Command::DeclareQueue { name, args } => {
            let r = client.declare_queue(&name, parse_pairs(&args)?).await?;
            println!(
                "queue {} declared ({} messages, {} consumers)",
                r.name, r.message_count, r.consumer_count
            );
        }
        Command::DeleteQueue {
            name,
            if_unused,
            if_empty,
        } => {
            let n = client.delete_queue(&name, if_unused, if_empty).await?;
            println!("queue {name} deleted ({n} messages)");
        }
        Command::Purge { name } => {
            let n = client.purge_queue(&name).await?;
            println!("queue {name} purged ({n} messages)");
        }
        Command::Bind(b) => {
            client
                .bind(&b.queue, &b.exchange, &b.key, parse_pairs(&b.args)?)
                .await?;
            println!("bound {} to {} with key {:?}", b.queue, b.exchange, b.key);
        }
        Command::Unbind(b) => {
            client
                .unbind(&b.queue, &b.exchange, &b.key, parse_pairs(&b.args)?)
                .await?;
            println!(
                "unbound {} from {} with key {:?}",
                b.queue, b.exchange, b.key
            );
        }
        Command::Publish(p) => publish(&client, p).await?,
        Command::Get {
            queue,
            ack,
            no_ack: _,
        } => {
            let r = client.get(&queue, ack, 0).await?;
            match r.delivery {
                None => println!("queue {queue} is empty"),
                Some(d) => {
                    print_delivery(&d, Some(&d.receipt));
                    if !ack {
                        client
                            .settle(vec![d.receipt.clone()], SettleOutcome::Requeue)
                            .await?;
                        println!("(requeued; use --ack to remove it)");
                    }
                }
            }
            println!("{} messages left", r.message_count);
        }
        Command::Consume {
            queue,
            prefetch,
            count,
            reject,
            requeue,
        } => {
            let mut consumer = client.consume(&queue, prefetch).await?;
            eprintln!(
                "consuming from {queue} as {} (ctrl-c to stop)",
                consumer.consumer_tag()
            );
            let mut seen = 0u64;
            while count.is_none_or(|c| seen < c) {
                let d = tokio::select! {
                    d = consumer.next() => d,
                    _ = tokio::signal::ctrl_c() => break,
                };
                let Some(d) = d else {
                    match consumer.cancel_reason() {
                        Some(reason) => println!("cancelled by the server: {reason}"),
                        None => println!("stream ended"),
                    }
                    break;
                };
                let d = d?;
                print_delivery(&d, None);
                if reject {
                    consumer.nack(d.delivery_tag, false, false).await?;
                } else if requeue {
                    consumer.nack(d.delivery_tag, false, true).await?;
                } else {
                    consumer.ack(d.delivery_tag, false).await?;
                }
                seen += 1;
            }
            consumer.cancel().await.ok();
            // Drain until the server confirms the cancel, so settles are not lost with the stream.
            while let Ok(Some(_)) = consumer.next_timeout(Duration::from_secs(2)).await {}
            eprintln!("{seen} deliveries");
        }
        Command::ListQueues => {
            let queues = client.list_queues().await?;
            let mut rows = vec![row([
                "name",
                "messages",
                "ready",
                "unacked",
                "dl-held",
                "consumers",
                "leader",
                "members",
            ])];
            for q in &queues {
                rows.push(vec![
                    q.name.clone(),
                    q.messages.to_string(),
                    q.messages_ready.to_string(),
                    q.messages_unacked.to_string(),
                    q.messages_dead_letter_held.to_string(),
                    q.consumers.to_string(),
                    q.leader.to_string(),
                    join_ids(&q.members),
                ]);
            }
            print_table(&rows);
        }
        Command::Queue { name } => {
            let q = client.get_queue(&name).await?;
            println!("{}", serde_json::to_string_pretty(&queue_json(&q))?);
        }
        Command::ListExchanges => {
            let mut rows = vec![row([
                "name",
                "type",
                "durable",
                "auto-delete",
                "internal",
                "arguments",
            ])];
            for e in client.list_exchanges().await? {
                let name = if e.name.is_empty() {
                    "(default)".to_string()
                } else {
                    e.name
                };
                rows.push(vec![
                    name,
                    e.r#type,
                    e.durable.to_string(),
                    e.auto_delete.to_string(),
                    e.internal.to_string(),
                    display_table(&e.arguments),
                ]);
            }
            print_table(&rows);
        }
        Command::ListBindings => {
            let mut rows = vec![row(["exchange", "queue", "routing-key", "arguments"])];
            for b in client.list_bindings().await? {
                let ex = if b.exchange.is_empty() {
                    "(default)".to_string()
                } else {
                    b.exchange
                };
                rows.push(vec![
                    ex,
                    b.queue,
                    b.routing_key,
                    display_table(&b.arguments),
                ]);
            }
            print_table(&rows);
        }
        Command::SetPolicy {
            name,
            pattern,
            definition,
            priority,
            apply_to,
        } => {
            let json: Json =
                serde_json::from_str(&definition).context("--definition is not JSON")?;
            let Json::Object(map) = json else {
                bail!("--definition must be a JSON object")
            };
            let def = map
                .into_iter()
                .map(|(k, v)| (k, json_to_value(v)))
                .collect();
            client
                .set_policy(&name, &pattern, &apply_to, priority, def)
                .await?;
            println!("policy {name} set");
        }
        Command::ClearPolicy { name } => {
            client.clear_policy(&name).await?;
            println!("policy {name} cleared");
        }
        Command::ListPolicies => {
            let mut rows = vec![row([
                "name",
                "pattern",
                "apply-to",
                "priority",
                "definition",
            ])];
            for p in client.list_policies().await? {
                rows.push(vec![
                    p.name,
                    p.pattern,
                    p.apply_to,
                    p.priority.to_string(),
                    display_table(&p.definition),
                ]);
            }
            print_table(&rows);
        }
        Command::PutUser {
            name,
            new_password,
            tags,
        } => {
            client.put_user(&name, &new_password, tags).await?;
            println!("user {name} saved");
        }
        Command::DeleteUser { name } => {
            client.delete_user(&name).await?;
            println!("user {name} deleted");
        }
        Command::SetPermissions {
            user,
            configure,
            write,
            read,
        } => {
            let on_vhost = if cli.vhost.is_empty() {
                "/"
            } else {
                cli.vhost.as_str()
            };
            client
                .set_permissions(&user, on_vhost, &configure, &write, &read)
                .await?;
            println!("permissions of {user} on {on_vhost} set");
        }
        Command::PutVhost { name } => {
            client.put_vhost(&name).await?;
            println!("vhost {name} created");
        }
        Command::DeleteVhost { name } => {
            client.delete_vhost(&name).await?;
            println!("vhost {name} deleted");
        }
        Command::Status => {
            let s = client.cluster_status().await?;
            println!("answered by node {}", s.node_id);
            if s.metadata_leader == 0 {
                println!("metadata leader: none");
            } else {
                println!("metadata leader: {}", s.metadata_leader);
            }
            let mut rows = vec![row(["node", "address", "reachable"])];
            for n in &s.nodes {
                rows.push(vec![
                    n.id.to_string(),
                    n.address.clone(),
                    n.reachable.to_string(),
                ]);
            }
            print_table(&rows);
            if !s.queues.is_empty() {
                println!();
                let mut rows = vec![row([
                    "vhost",
                    "queue",
                    "leader",
                    "members",
                    "applied here",
                    "digest here",
                ])];
                for q in &s.queues {
                    let vhost = if q.vhost.is_empty() {
                        "/".to_string()
                    } else {
                        q.vhost.clone()
                    };
                    rows.push(vec![
                        vhost,
                        q.name.clone(),
                        q.leader.to_string(),
                        join_ids(&q.members),
                        if q.local_member {
                            q.local_last_applied.to_string()
                        } else {
                            "-".into()
                        },
                        if q.local_member {
                            format!("{:016x}", q.local_state_digest)
                        } else {
                            "-".into()
                        },
                    ]);
                }
                print_table(&rows);
            }
        }
        Command::Overview => {
            let o = client.overview().await?;
            println!("answered by node {}", o.node_id);
            println!("queues:           {}", o.queues);
            println!("messages:         {}", o.messages);
            println!("messages ready:   {}", o.messages_ready);
            println!("messages unacked: {}", o.messages_unacked);
            println!("consumers:        {}", o.consumers);
            println!(
                "dead-lettered (confirmed at-least-once): {}",
                o.messages_dead_lettered_confirmed_total
            );
            if !o.messages_dead_lettered_total.is_empty() {
                let mut rows = vec![row(["reason", "strategy", "dead-lettered"])];
                for c in &o.messages_dead_lettered_total {
                    rows.push(vec![
                        c.reason.clone(),
                        c.strategy.clone(),
                        c.count.to_string(),
                    ]);
                }
                print_table(&rows);
            }
        }
    }
    Ok(())
}

async fn publish(client: &Client, p: PublishArgs) -> anyhow::Result<()> {
    let headers = parse_pairs(&p.headers)?;
    let build = |body: Vec<u8>| {
        let mut b = MessageBuilder::new(body).headers(headers.clone());
        if let Some(e) = &p.expiration {
            b = b.expiration(e.clone());
        }
        b.build()
    };
    let request = |body: Vec<u8>| v1::PublishRequest {
        exchange: p.exchange.clone(),
        routing_key: p.key.clone(),
        mandatory: p.mandatory,
        message: Some(build(body)),
        ..Default::default()
    };
    let Some(count) = p.count else {
        let body = p.body.clone().unwrap_or_default().into_bytes();
        let confirm = if p.stream {
            let mut publisher = client.publisher(1).await?;
            publisher.send_request(request(body)).await?;
            let confirms = publisher.close().await?;
            confirms.into_iter().next().context("no confirm received")?
        } else {
            client.publish_with(request(body)).await?
        };
        print_outcome(confirm.outcome, &confirm.detail);
        return Ok(());
    };

    let started = Instant::now();
    let mut tally: HashMap<PublishOutcome, u64> = HashMap::new();
    let body = |i: u64| {
        let mut b = format!("msg-{i} ").into_bytes();
        b.resize(p.size.max(b.len()), b'.');
        b
    };
    if p.stream {
        let mut publisher = client.publisher(p.window).await?;
        for i in 0..count {
            publisher.send_request(request(body(i))).await?;
            for c in publisher.take_confirms() {
                *tally.entry(c.outcome).or_default() += 1;
            }
        }
        for c in publisher.close().await? {
            *tally.entry(c.outcome).or_default() += 1;
        }
    } else {
        for i in 0..count {
            let c = client.publish_with(request(body(i))).await?;
            *tally.entry(c.outcome).or_default() += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let confirmed = tally.get(&PublishOutcome::Confirmed).copied().unwrap_or(0);
    let mut outcomes: Vec<String> = tally
        .iter()
        .map(|(o, n)| format!("{}={n}", o.as_str_name()))
        .collect();
    outcomes.sort();
    println!("{count} messages in {secs:.2} s: {}", outcomes.join(" "));
    println!("{:.0} confirmed msgs/s", confirmed as f64 / secs.max(1e-9));
    Ok(())
}

fn print_outcome(outcome: PublishOutcome, detail: &str) {
    if detail.is_empty() {
        println!("{}", outcome.as_str_name());
    } else {
        println!("{}: {detail}", outcome.as_str_name());
    }
}

fn print_delivery(d: &Delivery, receipt: Option<&str>) {
    let (headers, body) = match &d.message {
        Some(m) => (
            m.properties
                .as_ref()
                .map(|p| display_table(&p.headers))
                .unwrap_or_else(|| "{}".into()),
            String::from_utf8_lossy(&m.body).into_owned(),
        ),
        None => ("{}".into(), String::new()),
    };
    let id = match receipt {
        Some(r) => format!("receipt={r}"),
        None => format!("tag={}", d.delivery_tag),
    };
    let exchange = if d.exchange.is_empty() {
        "(default)"
    } else {
        &d.exchange
    };
    println!(
        "{id} redelivered={} exchange={exchange} routing-key={} headers={headers}\n  body: {body}",
        d.redelivered, d.routing_key
    );
}

/// `key=value` pairs into a typed table: integer → long, true/false → bool, else string.
fn parse_pairs(pairs: &[String]) -> anyhow::Result<HashMap<String, Value>> {
    pairs
        .iter()
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .with_context(|| format!("'{p}' is not key=value"))?;
            if k.is_empty() {
                bail!("'{p}': empty key");
            }
            Ok((k.to_string(), typed_value(v)))
        })
        .collect()
}

fn typed_value(v: &str) -> Value {
    if let Ok(n) = v.parse::<i64>() {
        Value::long(n)
    } else if v == "true" || v == "false" {
        Value::bool(v == "true")
    } else if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
        Value::string(&v[1..v.len() - 1])
    } else {
        Value::string(v)
    }
}

fn json_to_value(j: Json) -> Value {
    match j {
        Json::Null => Value { kind: None },
        Json::Bool(b) => Value::bool(b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::long(i),
            None => Value::double(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::string(s),
        Json::Array(a) => Value::list(a.into_iter().map(json_to_value).collect()),
        Json::Object(o) => {
            Value::table(o.into_iter().map(|(k, v)| (k, json_to_value(v))).collect())
        }
    }
}

fn value_to_json(v: &Value) -> Json {
    use v1::value::Kind;
    match &v.kind {
        None => Json::Null,
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::LongValue(n)) => json!(n),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::DoubleValue(d)) => json!(d),
        Some(Kind::TimestampValue(_)) | Some(Kind::BytesValue(_)) => json!(display_value(v)),
        Some(Kind::ListValue(l)) => Json::Array(l.values.iter().map(value_to_json).collect()),
        Some(Kind::TableValue(t)) => table_to_json(&t.fields),
    }
}

fn table_to_json(t: &HashMap<String, Value>) -> Json {
    let mut keys: Vec<&String> = t.keys().collect();
    keys.sort();
    Json::Object(
        keys.into_iter()
            .map(|k| (k.clone(), value_to_json(&t[k])))
            .collect::<Map<_, _>>(),
    )
}

fn queue_json(q: &QueueInfo) -> Json {
    let effective = q.effective.as_ref().map(|e| {
        json!({
            "dead_letter_exchange": if e.has_dead_letter_exchange { json!(e.dead_letter_exchange) } else { Json::Null },
            "dead_letter_routing_key": e.dead_letter_routing_key,
            "dead_letter_strategy": e.dead_letter_strategy,
            "overflow": e.overflow,
            "max_length": e.max_length,
            "max_length_bytes": e.max_length_bytes,
            "message_ttl_ms": e.message_ttl_ms,
            "expires_ms": e.expires_ms,
            "delivery_limit": e.delivery_limit,
            "single_active_consumer": e.single_active_consumer,
            "note": e.note,
        })
    });
    json!({
        "name": q.name,
        "vhost": if q.vhost.is_empty() { "/" } else { &q.vhost },
        "id": q.id,
        "arguments": table_to_json(&q.arguments),
        "policy": if q.policy.is_empty() { Json::Null } else { json!(q.policy) },
        "effective": effective,
        "messages": q.messages,
        "messages_ready": q.messages_ready,
        "messages_unacked": q.messages_unacked,
        "messages_dead_letter_held": q.messages_dead_letter_held,
        "consumers": q.consumers,
        "leader": q.leader,
        "members": q.members,
        "raft_term": q.raft_term,
        "commit_index": q.commit_index,
        "last_applied": q.last_applied,
        "state_digest": format!("{:016x}", q.state_digest),
    })
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|s| s.to_string()).collect()
}

fn join_ids(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// Prints rows as left-aligned columns; the first row is the header.
fn print_table(rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if i + 1 == r.len() {
                    s.clone()
                } else {
                    format!("{s:<w$}", w = widths[i])
                }
            })
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    if rows.len() == 1 {
        println!("(none)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_values_are_typed() {
        let t = parse_pairs(&[
            "a=5".into(),
            "b=true".into(),
            "c=reject-publish".into(),
            "d=\"7\"".into(),
        ])
        .unwrap();
        assert_eq!(t["a"].as_long(), Some(5));
        assert_eq!(t["b"].as_bool(), Some(true));
        assert_eq!(t["c"].as_str(), Some("reject-publish"));
        assert_eq!(t["d"].as_str(), Some("7"));
        assert!(parse_pairs(&["novalue".into()]).is_err());
    }

    #[test]
    fn cli_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
