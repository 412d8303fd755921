//! Verbs that change the cluster's definitions: exchanges, queues, bindings, policies, users,
//! permissions and vhosts.

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use qq_client::{Client, v1};
use serde_json::Value as Json;

use super::NameArgs;
use crate::typed::{json_to_value, parse_pairs};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ExchangeType {
    Direct,
    Fanout,
    Topic,
    Headers,
}

impl ExchangeType {
    fn as_str(self) -> &'static str {
        match self {
            ExchangeType::Direct => "direct",
            ExchangeType::Fanout => "fanout",
            ExchangeType::Topic => "topic",
            ExchangeType::Headers => "headers",
        }
    }
}

// The `Args` structs carry no doc comment: clap would take it for the verb's help text,
// which is the doc comment of the `Command` variant in main.rs.

#[derive(Debug, Args)]
pub struct DeclareExchangeArgs {
    name: String,
    #[arg(long = "type", value_enum, default_value = "direct")]
    kind: ExchangeType,
    /// Exchange argument key=value (typed, see `qqctl --help`).
    #[arg(long = "arg", value_name = "KEY=VALUE")]
    args: Vec<String>,
    /// Internal: cannot be published to directly.
    #[arg(long)]
    internal: bool,
}

pub async fn declare_exchange(client: &Client, a: DeclareExchangeArgs) -> anyhow::Result<()> {
    let kind = a.kind.as_str();
    client
        .declare_exchange_with(v1::DeclareExchangeRequest {
            name: a.name.clone(),
            r#type: kind.into(),
            durable: true,
            internal: a.internal,
            arguments: parse_pairs(&a.args)?,
            ..Default::default()
        })
        .await?;
    println!("exchange {} ({kind}) declared", a.name);
    Ok(())
}

#[derive(Debug, Args)]
pub struct DeleteExchangeArgs {
    name: String,
    #[arg(long)]
    if_unused: bool,
}

pub async fn delete_exchange(client: &Client, a: DeleteExchangeArgs) -> anyhow::Result<()> {
    client.delete_exchange(&a.name, a.if_unused).await?;
    println!("exchange {} deleted", a.name);
    Ok(())
}

#[derive(Debug, Args)]
pub struct DeclareQueueArgs {
    name: String,
    /// Queue argument key=value, e.g. x-max-length=5 (integers → long, true/false → bool,
    /// else string).
    #[arg(long = "arg", value_name = "KEY=VALUE")]
    args: Vec<String>,
}

pub async fn declare_queue(client: &Client, a: DeclareQueueArgs) -> anyhow::Result<()> {
    let r = client.declare_queue(&a.name, parse_pairs(&a.args)?).await?;
    println!(
        "queue {} declared ({} messages, {} consumers)",
        r.name, r.message_count, r.consumer_count
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct DeleteQueueArgs {
    name: String,
    #[arg(long)]
    if_unused: bool,
    #[arg(long)]
    if_empty: bool,
}

pub async fn delete_queue(client: &Client, a: DeleteQueueArgs) -> anyhow::Result<()> {
    let n = client
        .delete_queue(&a.name, a.if_unused, a.if_empty)
        .await?;
    println!("queue {} deleted ({n} messages)", a.name);
    Ok(())
}

pub async fn purge(client: &Client, a: NameArgs) -> anyhow::Result<()> {
    let n = client.purge_queue(&a.name).await?;
    println!("queue {} purged ({n} messages)", a.name);
    Ok(())
}

#[derive(Debug, Args)]
pub struct BindArgs {
    queue: String,
    exchange: String,
    #[arg(long, default_value = "")]
    key: String,
    /// Binding argument key=value (headers exchanges: x-match=all, format=pdf, …).
    #[arg(long = "arg", value_name = "KEY=VALUE")]
    args: Vec<String>,
}

pub async fn bind(client: &Client, b: BindArgs) -> anyhow::Result<()> {
    client
        .bind(&b.queue, &b.exchange, &b.key, parse_pairs(&b.args)?)
        .await?;
    println!("bound {} to {} with key {:?}", b.queue, b.exchange, b.key);
    Ok(())
}

pub async fn unbind(client: &Client, b: BindArgs) -> anyhow::Result<()> {
    client
        .unbind(&b.queue, &b.exchange, &b.key, parse_pairs(&b.args)?)
        .await?;
    println!(
        "unbound {} from {} with key {:?}",
        b.queue, b.exchange, b.key
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct ExchangeBindArgs {
    /// The exchange that routes on.
    destination: String,
    /// The exchange whose matching messages go to the destination.
    source: String,
    #[arg(long, default_value = "")]
    key: String,
    /// Binding argument key=value (a headers source: x-match=all, format=pdf, …).
    #[arg(long = "arg", value_name = "KEY=VALUE")]
    args: Vec<String>,
}

pub async fn bind_exchange(client: &Client, b: ExchangeBindArgs) -> anyhow::Result<()> {
    let args = parse_pairs(&b.args)?;
    client
        .bind_exchange(&b.destination, &b.source, &b.key, args)
        .await?;
    println!(
        "bound exchange {} to {} with key {:?}",
        b.destination, b.source, b.key
    );
    Ok(())
}

pub async fn unbind_exchange(client: &Client, b: ExchangeBindArgs) -> anyhow::Result<()> {
    let args = parse_pairs(&b.args)?;
    client
        .unbind_exchange(&b.destination, &b.source, &b.key, args)
        .await?;
    println!(
        "unbound exchange {} from {} with key {:?}",
        b.destination, b.source, b.key
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct SetPolicyArgs {
    name: String,
    pattern: String,
    /// JSON object of policy keys (max-length, message-ttl, overflow, dead-letter-exchange, …;
    /// an operator policy: max-length, max-length-bytes, message-ttl, delivery-limit, expires).
    #[arg(long)]
    definition: String,
    #[arg(long, default_value_t = 0)]
    priority: i64,
    /// What it applies to (an operator policy: queues only, so not exchanges).
    #[arg(long, default_value = "queues", value_parser = ["all", "queues", "quorum_queues", "exchanges"])]
    apply_to: String,
}

/// A `--definition` JSON object as the policy's keys and values.
fn definition(text: &str) -> anyhow::Result<std::collections::HashMap<String, v1::Value>> {
    let json: Json = serde_json::from_str(text).context("--definition is not JSON")?;
    let Json::Object(map) = json else {
        bail!("--definition must be a JSON object")
    };
    Ok(map
        .into_iter()
        .map(|(k, v)| (k, json_to_value(v)))
        .collect())
}

/// `set-policy`, or `set-operator-policy` (`operator`).
pub async fn set_policy(client: &Client, a: SetPolicyArgs, operator: bool) -> anyhow::Result<()> {
    let def = definition(&a.definition)?;
    let (name, pattern, apply_to) = (&a.name, &a.pattern, &a.apply_to);
    if operator {
        client
            .set_operator_policy(name, pattern, apply_to, a.priority, def)
            .await?;
        println!("operator policy {name} set");
    } else {
        client
            .set_policy(name, pattern, apply_to, a.priority, def)
            .await?;
        println!("policy {name} set");
    }
    Ok(())
}

/// `clear-policy`, or `clear-operator-policy` (`operator`).
pub async fn clear_policy(client: &Client, a: NameArgs, operator: bool) -> anyhow::Result<()> {
    if operator {
        client.clear_operator_policy(&a.name).await?;
        println!("operator policy {} cleared", a.name);
    } else {
        client.clear_policy(&a.name).await?;
        println!("policy {} cleared", a.name);
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct PutUserArgs {
    name: String,
    #[arg(long = "new-password", required_unless_present = "password_hash")]
    new_password: Option<String>,
    /// Instead of a password: an Argon2id PHC string, as `definitions export` shows it.
    #[arg(long, conflicts_with = "new_password")]
    password_hash: Option<String>,
    /// Comma-separated tags (e.g. administrator).
    #[arg(long, value_delimiter = ',')]
    tags: Vec<String>,
}

pub async fn put_user(client: &Client, a: PutUserArgs) -> anyhow::Result<()> {
    match (&a.new_password, &a.password_hash) {
        (_, Some(hash)) => client.put_user_with_hash(&a.name, hash, a.tags).await?,
        (Some(password), None) => client.put_user(&a.name, password, a.tags).await?,
        (None, None) => anyhow::bail!("put-user: --new-password or --password-hash is required"),
    }
    println!("user {} saved", a.name);
    Ok(())
}

pub async fn delete_user(client: &Client, a: NameArgs) -> anyhow::Result<()> {
    client.delete_user(&a.name).await?;
    println!("user {} deleted", a.name);
    Ok(())
}

#[derive(Debug, Args)]
pub struct SetPermissionsArgs {
    // Not `user`: that id is the global --user flag, which the positional would overwrite
    // (the caller would then authenticate as the user being granted).
    #[arg(value_name = "USER")]
    grantee: String,
    #[arg(long, default_value = ".*")]
    configure: String,
    #[arg(long, default_value = ".*")]
    write: String,
    #[arg(long, default_value = ".*")]
    read: String,
}

/// On the vhost the client was given with `--vhost` (empty means `/`).
pub async fn set_permissions(client: &Client, a: SetPermissionsArgs) -> anyhow::Result<()> {
    let on_vhost = if client.vhost().is_empty() {
        "/"
    } else {
        client.vhost()
    };
    client
        .set_permissions(&a.grantee, on_vhost, &a.configure, &a.write, &a.read)
        .await?;
    println!("permissions of {} on {on_vhost} set", a.grantee);
    Ok(())
}

pub async fn put_vhost(client: &Client, a: NameArgs) -> anyhow::Result<()> {
    client.put_vhost(&a.name).await?;
    println!("vhost {} created", a.name);
    Ok(())
}

pub async fn delete_vhost(client: &Client, a: NameArgs) -> anyhow::Result<()> {
    client.delete_vhost(&a.name).await?;
    println!("vhost {} deleted", a.name);
    Ok(())
}

#[derive(Debug, Args)]
pub struct LimitsArgs {
    /// The vhost (set-vhost-limits) or user (set-user-limits).
    name: String,
    /// RabbitMQ's JSON, e.g. '{"max-queues": 1024, "max-connections": 10}'; keys
    /// max-queues, max-exchanges, max-connections, max-consumers; a negative value or a
    /// missing key is unlimited; '{}' clears them.
    definition: String,
}

/// RabbitMQ's limit JSON → the request's limits.
pub fn parse_limits(definition: &str) -> anyhow::Result<v1::Limits> {
    let json: Json = serde_json::from_str(definition).context("limits: not JSON")?;
    let Json::Object(map) = json else {
        bail!("limits: expected a JSON object, e.g. '{{\"max-queues\": 10}}'");
    };
    let mut limits = v1::Limits::default();
    for (key, value) in map {
        let n = value
            .as_i64()
            .with_context(|| format!("limits: {key}: expected an integer, got {value}"))?;
        let n = u64::try_from(n).ok();
        match key.as_str() {
            "max-queues" => limits.max_queues = n,
            "max-exchanges" => limits.max_exchanges = n,
            "max-connections" => limits.max_connections = n,
            "max-consumers" => limits.max_consumers = n,
            other => bail!(
                "limits: unknown limit '{other}' (max-queues, max-exchanges, max-connections, \
                 max-consumers)"
            ),
        }
    }
    Ok(limits)
}

pub async fn set_vhost_limits(client: &Client, a: LimitsArgs) -> anyhow::Result<()> {
    client
        .set_vhost_limits(&a.name, parse_limits(&a.definition)?)
        .await?;
    println!("limits of vhost {} set", a.name);
    Ok(())
}

pub async fn set_user_limits(client: &Client, a: LimitsArgs) -> anyhow::Result<()> {
    client
        .set_user_limits(&a.name, parse_limits(&a.definition)?)
        .await?;
    println!("limits of user {} set", a.name);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_limits;

    #[test]
    fn limits_json_as_rabbitmq_writes_it() {
        let l = parse_limits(r#"{"max-queues": 10, "max-connections": -1, "max-consumers": 0}"#)
            .unwrap();
        assert_eq!(l.max_queues, Some(10));
        assert_eq!(l.max_connections, None, "negative is unlimited");
        assert_eq!(l.max_consumers, Some(0));
        assert_eq!(l.max_exchanges, None);
        assert!(parse_limits("{}").unwrap() == Default::default());
        let e = parse_limits(r#"{"max-channels": 1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown limit 'max-channels'"), "{e}");
        assert!(parse_limits(r#"{"max-queues": "ten"}"#).is_err());
        assert!(parse_limits("[1]").is_err());
    }
}
