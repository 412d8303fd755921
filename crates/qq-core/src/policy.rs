//! Queue arguments, policies, and how the two combine into a queue's effective configuration.
//!
//! A queue's behaviour comes from two places: the `x-` arguments given when it was declared
//! (fixed for its lifetime) and the highest-priority policy whose pattern matches its name
//! (changeable at any time). This module:
//!
//! - validates declare arguments ([`validate_queue_arguments`]) and policy definitions
//!   ([`validate_policy_definition`]) with messages that name the offending key and say why,
//!   e.g. `x-message-ttl: expected a non-negative long, got string`;
//! - picks the policy that applies to a queue ([`matching_policy`]);
//! - merges arguments and policy into a [`QueueConfig`] ([`effective_config`]) with the
//!   precedence of docs/semantics.md: dead-letter keys, argument wins; `max-length`,
//!   `max-length-bytes`, `message-ttl`, `expires`, the minimum; `delivery-limit`, the minimum
//!   unless one is negative (then the larger, i.e. the finite one, as RabbitMQ's
//!   `resolve_delivery_limit`); `overflow`, the policy; `requeue-delays` (a list, no minimum
//!   to take) and `dedup-window-ms` (a longer window is the safer one, a shorter the cheaper:
//!   the application decides), the argument. Each key is resolved on its own, so a DLX
//!   from an argument combines with a routing key from a policy.
//!
//! **No silent fallbacks.** At-least-once dead lettering needs overflow `reject-publish`.
//! A declare that asks for at-least-once while its effective overflow is anything else is
//! refused ([`check_declared_strategy`], FAILED_PRECONDITION). When a *policy* creates the mix
//! later, the queue cannot be refused any more: its effective strategy becomes at-most-once and
//! [`QueueConfig::note`] says why, so `GetQueue` shows it. The same goes for a dead-letter
//! routing key or strategy given by a policy without any dead-letter exchange.
//!
//! Arguments known to other RabbitMQ queue types but not to quorum queues (`x-max-priority`,
//! `x-queue-mode`, ...) are refused, as RabbitMQ does; arguments nobody knows are ignored.
//! Unlike RabbitMQ, `x-delivery-limit` is validated (a long) instead of being silently treated
//! as unset when malformed.
//!
//! Everything here is a pure function of its inputs; regexes are compiled on demand because a
//! compiled regex is not serializable state.

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::error::MetaError;
use crate::queue::{MAX_REQUEUE_DELAY_MS, MAX_REQUEUE_DELAYS};
use crate::types::{DEFAULT_DELIVERY_LIMIT, Overflow, QueueConfig, Strategy, Table, Value};

/// A named policy of one vhost: its definition applies to the queues whose names match
/// `pattern`, the highest `priority` winning (see [`matching_policy`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    pub name: String,
    /// Regex matched unanchored against queue names.
    pub pattern: String,
    /// `all`, `queues`, `quorum_queues` or `exchanges`.
    pub apply_to: String,
    pub priority: i64,
    pub definition: Table,
}

/// Largest TTL accepted for `x-message-ttl` / `x-expires` (10 years in ms, as RabbitMQ).
pub const MAX_TTL_MS: i64 = 315_360_000_000;

/// The wire names of [`Overflow`].
pub fn overflow_name(overflow: Overflow) -> &'static str {
    match overflow {
        Overflow::DropHead => "drop-head",
        Overflow::RejectPublish => "reject-publish",
        Overflow::RejectPublishDlx => "reject-publish-dlx",
    }
}

/// Parses `drop-head`, `reject-publish`, `reject-publish-dlx`.
pub fn parse_overflow(name: &str) -> Option<Overflow> {
    match name {
        "drop-head" => Some(Overflow::DropHead),
        "reject-publish" => Some(Overflow::RejectPublish),
        "reject-publish-dlx" => Some(Overflow::RejectPublishDlx),
        _ => None,
    }
}

/// Parses `at-most-once`, `at-least-once` (the requested strategy, before DLX/overflow rules).
pub fn parse_strategy(name: &str) -> Option<Strategy> {
    match name {
        "at-most-once" => Some(Strategy::AtMostOnce),
        "at-least-once" => Some(Strategy::AtLeastOnce),
        _ => None,
    }
}

/// What a key's value must be.
#[derive(Clone, Copy)]
enum Rule {
    String,
    Strategy,
    Overflow,
    /// A long in `min..=max`.
    Long {
        min: i64,
        max: i64,
    },
    Bool,
    QueueType,
    /// `client-local` or `balanced` (`x-queue-leader-locator`).
    LeaderLocator,
    /// A list of at most [`MAX_REQUEUE_DELAYS`] longs, each in `0..=MAX_REQUEUE_DELAY_MS`.
    Delays,
}

/// The keys that can be given both as a queue argument (`x-` + name) and in a policy.
const SHARED_KEYS: &[(&str, Rule)] = &[
    ("dead-letter-exchange", Rule::String),
    ("dead-letter-routing-key", Rule::String),
    ("dead-letter-strategy", Rule::Strategy),
    (
        "message-ttl",
        Rule::Long {
            min: 0,
            max: MAX_TTL_MS,
        },
    ),
    (
        "expires",
        Rule::Long {
            min: 1,
            max: MAX_TTL_MS,
        },
    ),
    (
        "max-length",
        Rule::Long {
            min: 0,
            max: i64::MAX,
        },
    ),
    (
        "max-length-bytes",
        Rule::Long {
            min: 0,
            max: i64::MAX,
        },
    ),
    ("overflow", Rule::Overflow),
    ("requeue-delays", Rule::Delays),
    // Where a new queue's first leader goes; read once, at declare (the argument wins, as in
    // RabbitMQ's rabbit_queue_location).
    ("queue-leader-locator", Rule::LeaderLocator),
    (
        "dedup-window-ms",
        Rule::Long {
            min: crate::dedup::MIN_DEDUP_WINDOW_MS as i64,
            max: crate::dedup::MAX_DEDUP_WINDOW_MS as i64,
        },
    ),
    (
        "delivery-limit",
        Rule::Long {
            min: i64::MIN,
            max: i64::MAX,
        },
    ),
    // The queue's consumer timeout in ms (RabbitMQ 4.3's quorum queues); the smaller of the
    // argument and the policy wins ([`consumer_timeout_ms`]).
    (
        "consumer-timeout",
        Rule::Long {
            min: 1,
            max: crate::queue::MAX_CONSUMER_TIMEOUT_MS as i64,
        },
    ),
];

/// Policy keys for exchanges (the same name as the exchange argument).
const EXCHANGE_POLICY_KEYS: &[(&str, Rule)] = &[("alternate-exchange", Rule::String)];

/// Keys that exist only as queue arguments.
const ARGUMENT_ONLY_KEYS: &[(&str, Rule)] = &[
    (
        "x-quorum-initial-group-size",
        Rule::Long {
            min: 1,
            max: i64::MAX,
        },
    ),
    ("x-single-active-consumer", Rule::Bool),
    ("x-queue-type", Rule::QueueType),
    // Strict priority levels 0..=N (RabbitMQ 4.3's quorum queues): fixed for the queue's
    // lifetime, accepted from metadata machine version 2 (`MetaState::declare_queue`).
    (
        "x-max-priority",
        Rule::Long {
            min: 1,
            max: crate::queue::MAX_PRIORITY as i64,
        },
    ),
];

/// Arguments RabbitMQ knows for other queue types and refuses on a quorum queue.
const UNSUPPORTED_ARGUMENTS: &[&str] = &[
    "x-queue-mode",
    "x-queue-version",
    "x-queue-master-locator",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-stream-filter-size-bytes",
    "x-initial-cluster-size",
];

/// Every argument quorumq interprets: validated at declare and compared on redeclare.
pub fn known_argument_names() -> impl Iterator<Item = String> {
    SHARED_KEYS
        .iter()
        .map(|(k, _)| format!("x-{k}"))
        .chain(ARGUMENT_ONLY_KEYS.iter().map(|(k, _)| k.to_string()))
}

fn describe_rule(rule: Rule) -> String {
    match rule {
        Rule::String => "a string".into(),
        Rule::Strategy => "at-most-once or at-least-once".into(),
        Rule::Overflow => "drop-head, reject-publish or reject-publish-dlx".into(),
        Rule::Long {
            min: 0,
            max: i64::MAX,
        } => "a non-negative long".into(),
        Rule::Long { min: 0, max } => format!("a non-negative long <= {max}"),
        Rule::Long { min, max: i64::MAX } if min > i64::MIN => format!("a long >= {min}"),
        Rule::Long { min, max } if min > i64::MIN => format!("a long between {min} and {max}"),
        Rule::Long { .. } => "a long".into(),
        Rule::Bool => "a bool".into(),
        Rule::QueueType => "'quorum' (only quorum queues exist)".into(),
        Rule::LeaderLocator => "client-local or balanced".into(),
        Rule::Delays => format!(
            "a list of at most {MAX_REQUEUE_DELAYS} delays in ms, each a long between 0 and \
             {MAX_REQUEUE_DELAY_MS} (7 days)"
        ),
    }
}

/// A value as shown in an error message: strings quoted, numbers bare, others by type.
fn show_value(value: &Value) -> String {
    match value {
        Value::String(s) => format!("'{}'", crate::names::shown(s)),
        Value::Long(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => other.type_name().to_string(),
    }
}

/// A delays list: its entries in ms, or why not.
fn parse_delays(key: &str, value: &Value) -> Result<Vec<u64>, MetaError> {
    let Value::List(items) = value else {
        return Err(MetaError::invalid(format!(
            "{key}: expected {}, got {}",
            describe_rule(Rule::Delays),
            value.type_name()
        )));
    };
    if items.len() > MAX_REQUEUE_DELAYS {
        return Err(MetaError::invalid(format!(
            "{key}: {} delays, at most {MAX_REQUEUE_DELAYS}",
            items.len()
        )));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item.as_i64()
                .and_then(|n| u64::try_from(n).ok())
                .filter(|n| *n <= MAX_REQUEUE_DELAY_MS)
                .ok_or_else(|| {
                    MetaError::invalid(format!(
                        "{key}: entry {i} is {}; expected a long between 0 and \
                         {MAX_REQUEUE_DELAY_MS} (7 days)",
                        show_value(item)
                    ))
                })
        })
        .collect()
}

fn check(key: &str, rule: Rule, value: &Value) -> Result<(), MetaError> {
    if let Rule::Delays = rule {
        return parse_delays(key, value).map(|_| ());
    }
    let ok = match (rule, value) {
        (Rule::String, Value::String(_)) => true,
        (Rule::Strategy, Value::String(s)) => parse_strategy(s).is_some(),
        (Rule::Overflow, Value::String(s)) => parse_overflow(s).is_some(),
        (Rule::Long { min, max }, Value::Long(n)) => (min..=max).contains(n),
        (Rule::Bool, Value::Bool(_)) => true,
        (Rule::QueueType, Value::String(s)) => s == "quorum",
        (Rule::LeaderLocator, Value::String(s)) => s == "client-local" || s == "balanced",
        _ => false,
    };
    if ok {
        return Ok(());
    }
    let got = match (rule, value) {
        // Wrong type: say which type; right type, bad value: show the value.
        (
            Rule::String | Rule::Strategy | Rule::Overflow | Rule::QueueType | Rule::LeaderLocator,
            Value::String(_),
        )
        | (Rule::Long { .. }, Value::Long(_)) => show_value(value),
        _ => value.type_name().to_string(),
    };
    Err(MetaError::invalid(format!(
        "{key}: expected {}, got {got}",
        describe_rule(rule)
    )))
}

/// Validates the arguments of a queue declare. Known keys must have the right type and range;
/// `x-dead-letter-routing-key` needs `x-dead-letter-exchange`; arguments of other queue types
/// are refused; unknown arguments are ignored. The at-least-once/overflow combination depends
/// on the policy too and is checked by [`check_declared_strategy`].
pub fn validate_queue_arguments(args: &Table) -> Result<(), MetaError> {
    for (key, value) in args {
        if let Some(rule) = key
            .strip_prefix("x-")
            .and_then(|k| SHARED_KEYS.iter().find(|(name, _)| *name == k))
            .map(|(_, rule)| *rule)
            .or_else(|| {
                ARGUMENT_ONLY_KEYS
                    .iter()
                    .find(|(name, _)| name == key)
                    .map(|(_, rule)| *rule)
            })
        {
            check(key, rule, value)?;
        } else if UNSUPPORTED_ARGUMENTS.contains(&key.as_str()) {
            return Err(MetaError::invalid(format!(
                "{key}: not supported by quorum queues"
            )));
        }
    }
    if args.contains_key("x-dead-letter-routing-key")
        && !args.contains_key("x-dead-letter-exchange")
    {
        return Err(MetaError::invalid(
            "x-dead-letter-routing-key: requires x-dead-letter-exchange",
        ));
    }
    Ok(())
}

/// Validates a policy definition: only the ten policy keys, each with the right type and range.
pub fn validate_policy_definition(def: &Table) -> Result<(), MetaError> {
    let policy_keys = || SHARED_KEYS.iter().chain(EXCHANGE_POLICY_KEYS);
    for (key, value) in def {
        let Some((_, rule)) = policy_keys().find(|(name, _)| name == key) else {
            let known: Vec<&str> = policy_keys().map(|(k, _)| *k).collect();
            return Err(MetaError::invalid(format!(
                "definition: '{key}' is not a recognised policy setting (known: {})",
                known.join(", ")
            )));
        };
        check(key, *rule, value)?;
    }
    Ok(())
}

/// Refuses a declare whose *arguments* ask for at-least-once while the effective overflow
/// (argument or policy, policy winning) is not `reject-publish` (FAILED_PRECONDITION).
pub fn check_declared_strategy(args: &Table, config: &QueueConfig) -> Result<(), MetaError> {
    let asked = args
        .get("x-dead-letter-strategy")
        .and_then(Value::as_str)
        .and_then(parse_strategy);
    if asked == Some(Strategy::AtLeastOnce) && config.overflow != Overflow::RejectPublish {
        return Err(MetaError::failed_precondition(format!(
            "x-dead-letter-strategy: at-least-once requires overflow reject-publish, \
             but the effective overflow is {}",
            overflow_name(config.overflow)
        )));
    }
    Ok(())
}

/// Does `policy` apply to queues (`apply_to` `all`, `queues`, `quorum_queues`, or empty)?
pub fn applies_to_queues(policy: &Policy) -> bool {
    matches!(
        policy.apply_to.as_str(),
        "" | "all" | "queues" | "quorum_queues"
    )
}

/// Is `apply_to` a valid policy target?
pub fn valid_apply_to(apply_to: &str) -> bool {
    matches!(
        apply_to,
        "" | "all" | "queues" | "quorum_queues" | "exchanges"
    )
}

/// The policy that applies to queue `queue_name`: among those whose pattern matches the name
/// (unanchored) and that apply to queues, the highest priority; among equal priorities, the
/// smallest name (RabbitMQ leaves ties unspecified; quorumq must be deterministic).
pub fn matching_policy<'a>(
    policies: impl Iterator<Item = &'a Policy>,
    queue_name: &str,
) -> Option<&'a Policy> {
    highest_matching(policies.filter(|p| applies_to_queues(p)), queue_name)
}

/// Among `policies`, those whose pattern matches `name` (unanchored): the highest priority,
/// the smallest name among equals.
fn highest_matching<'a>(
    policies: impl Iterator<Item = &'a Policy>,
    name: &str,
) -> Option<&'a Policy> {
    policies
        .filter(|p| {
            Regex::new(&p.pattern)
                .map(|re| re.is_match(name))
                .unwrap_or(false)
        })
        .min_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then_with(|| a.name.cmp(&b.name))
        })
}

/// The policy that applies to exchange `exchange_name`: as [`matching_policy`], among the
/// policies that apply to exchanges (`apply_to` `all`, empty, or `exchanges`).
pub fn matching_exchange_policy<'a>(
    policies: impl Iterator<Item = &'a Policy>,
    exchange_name: &str,
) -> Option<&'a Policy> {
    let for_exchanges =
        policies.filter(|p| matches!(p.apply_to.as_str(), "" | "all" | "exchanges"));
    highest_matching(for_exchanges, exchange_name)
}

/// The value of `key` from the arguments (`x-key`) and from the policy (`key`).
fn both<'a>(
    args: &'a Table,
    policy: Option<&'a Policy>,
    key: &str,
) -> (Option<&'a Value>, Option<&'a Value>) {
    (
        args.get(&format!("x-{key}")),
        policy.and_then(|p| p.definition.get(key)),
    )
}

fn string_arg_wins(args: &Table, policy: Option<&Policy>, key: &str) -> Option<String> {
    let (a, p) = both(args, policy, key);
    a.and_then(Value::as_str)
        .or_else(|| p.and_then(Value::as_str))
        .map(str::to_string)
}

fn min_non_negative(args: &Table, policy: Option<&Policy>, key: &str) -> Option<u64> {
    let (a, p) = both(args, policy, key);
    let a = a
        .and_then(Value::as_i64)
        .and_then(|n| u64::try_from(n).ok());
    let p = p
        .and_then(Value::as_i64)
        .and_then(|n| u64::try_from(n).ok());
    match (a, p) {
        (Some(a), Some(p)) => Some(a.min(p)),
        (a, p) => a.or(p),
    }
}

/// The top strict priority level of a queue declared with `args` (`x-max-priority`), if any.
/// Inputs are assumed validated (a value out of range counts as none).
pub fn max_priority(args: &Table) -> Option<u8> {
    args.get("x-max-priority")
        .and_then(Value::as_i64)
        .and_then(|n| u8::try_from(n).ok())
        .filter(|n| (1..=crate::queue::MAX_PRIORITY).contains(n))
}

/// The consumer timeout of a queue declared with `args` under `policy`: the smaller of
/// `x-consumer-timeout` and the policy's `consumer-timeout` (None: neither sets one). Kept out
/// of [`QueueConfig`], whose encoding predates it: the leader proposes it to the queue with
/// `Command::SetConsumerTimeout`.
pub fn consumer_timeout_ms(args: &Table, policy: Option<&Policy>) -> Option<u64> {
    min_non_negative(args, policy, "consumer-timeout").filter(|t| *t > 0)
}

/// The effective configuration of queue `vhost`/`name` declared with `args`, under `policy`
/// (the one [`matching_policy`] chose, if any). Inputs are assumed validated.
pub fn effective_config(
    vhost: &str,
    name: &str,
    args: &Table,
    policy: Option<&Policy>,
) -> QueueConfig {
    let mut config = QueueConfig::new(vhost, name);
    let mut notes: Vec<String> = Vec::new();
    config.policy = policy.map(|p| p.name.clone());

    config.message_ttl_ms = min_non_negative(args, policy, "message-ttl");
    config.expires_ms = min_non_negative(args, policy, "expires");
    config.max_length = min_non_negative(args, policy, "max-length");
    config.max_length_bytes = min_non_negative(args, policy, "max-length-bytes");

    let (a, p) = both(args, policy, "overflow");
    config.overflow = p
        .or(a)
        .and_then(Value::as_str)
        .and_then(parse_overflow)
        .unwrap_or_default();

    let (a, p) = both(args, policy, "delivery-limit");
    let limit = match (a.and_then(Value::as_i64), p.and_then(Value::as_i64)) {
        (Some(a), Some(p)) if a < 0 || p < 0 => a.max(p),
        (Some(a), Some(p)) => a.min(p),
        (a, p) => a.or(p).unwrap_or(DEFAULT_DELIVERY_LIMIT),
    };
    config.delivery_limit = u64::try_from(limit).ok();

    // Like the dead-letter keys: the application's argument wins over a policy.
    let (a, p) = both(args, policy, "requeue-delays");
    config.requeue_delays_ms = a
        .or(p)
        .and_then(|v| parse_delays("requeue-delays", v).ok())
        .unwrap_or_default();

    // As requeue-delays: the application's argument wins over a policy.
    let (a, p) = both(args, policy, "dedup-window-ms");
    config.dedup_window_ms = a
        .or(p)
        .and_then(Value::as_i64)
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(crate::dedup::DEFAULT_DEDUP_WINDOW_MS);

    config.single_active_consumer = matches!(
        args.get("x-single-active-consumer"),
        Some(Value::Bool(true))
    );

    config.dead_letter_exchange = string_arg_wins(args, policy, "dead-letter-exchange");
    config.dead_letter_routing_key = string_arg_wins(args, policy, "dead-letter-routing-key");
    let requested = string_arg_wins(args, policy, "dead-letter-strategy")
        .as_deref()
        .and_then(parse_strategy);
    config.dead_letter_strategy = if config.dead_letter_exchange.is_none() {
        let mut ignored = Vec::new();
        if config.dead_letter_routing_key.is_some() {
            ignored.push("dead-letter-routing-key");
        }
        if requested.is_some() {
            ignored.push("dead-letter-strategy");
        }
        if !ignored.is_empty() {
            notes.push(format!(
                "{} set without a dead-letter-exchange; dead lettering is disabled",
                ignored.join(" and ")
            ));
        }
        config.dead_letter_routing_key = None;
        Strategy::Disabled
    } else {
        match requested {
            Some(Strategy::AtLeastOnce) if config.overflow != Overflow::RejectPublish => {
                notes.push(format!(
                    "dead-letter-strategy at-least-once needs overflow reject-publish \
                     (effective overflow is {}); using at-most-once",
                    overflow_name(config.overflow)
                ));
                Strategy::AtMostOnce
            }
            Some(Strategy::AtLeastOnce) => Strategy::AtLeastOnce,
            _ => Strategy::AtMostOnce,
        }
    };

    config.note = (!notes.is_empty()).then(|| notes.join("; "));
    config
}

/// Where the effective value of one setting came from ([`setting_sources`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingSource {
    /// Neither an argument nor the policy sets it: the broker's default.
    Default,
    /// The queue's `x-` argument.
    Argument,
    /// The policy's definition.
    Policy,
    /// Both give the same value (a minimum or maximum of two equal values).
    Both,
}

/// The settings [`effective_config`] resolves, by their policy key, in display order.
pub const SETTING_KEYS: [&str; 11] = [
    "dead-letter-exchange",
    "dead-letter-routing-key",
    "dead-letter-strategy",
    "message-ttl",
    "expires",
    "max-length",
    "max-length-bytes",
    "overflow",
    "delivery-limit",
    "requeue-delays",
    "single-active-consumer",
];

/// For each of [`SETTING_KEYS`], where [`effective_config`] took its value from, by the same
/// precedence rules (argument wins for dead-letter keys and requeue delays, the minimum for
/// lengths and TTLs, the policy for overflow, the finite minimum for the delivery limit).
/// Inputs are assumed validated, as for [`effective_config`].
pub fn setting_sources(
    args: &Table,
    policy: Option<&Policy>,
) -> Vec<(&'static str, SettingSource)> {
    fn pick<T: Ord>(a: Option<T>, p: Option<T>, smaller: bool) -> SettingSource {
        match (a, p) {
            (Some(a), Some(p)) if a == p => SettingSource::Both,
            (Some(a), Some(p)) => {
                if (a < p) == smaller {
                    SettingSource::Argument
                } else {
                    SettingSource::Policy
                }
            }
            (Some(_), None) => SettingSource::Argument,
            (None, Some(_)) => SettingSource::Policy,
            (None, None) => SettingSource::Default,
        }
    }
    let first = |a: bool, p: bool| {
        if a {
            SettingSource::Argument
        } else if p {
            SettingSource::Policy
        } else {
            SettingSource::Default
        }
    };
    SETTING_KEYS
        .iter()
        .map(|&key| {
            let (a, p) = both(args, policy, key);
            let source = match key {
                "dead-letter-exchange" | "dead-letter-routing-key" | "dead-letter-strategy" => {
                    first(
                        a.and_then(Value::as_str).is_some(),
                        p.and_then(Value::as_str).is_some(),
                    )
                }
                "message-ttl" | "expires" | "max-length" | "max-length-bytes" => {
                    let non_negative = |v: Option<&Value>| {
                        v.and_then(Value::as_i64)
                            .and_then(|n| u64::try_from(n).ok())
                    };
                    pick(non_negative(a), non_negative(p), true)
                }
                "overflow" => {
                    let parses = |v: Option<&Value>| {
                        v.and_then(Value::as_str).and_then(parse_overflow).is_some()
                    };
                    if parses(p) {
                        SettingSource::Policy
                    } else if parses(a) {
                        SettingSource::Argument
                    } else {
                        SettingSource::Default
                    }
                }
                "delivery-limit" => {
                    let (a, p) = (a.and_then(Value::as_i64), p.and_then(Value::as_i64));
                    // Either negative (unlimited): the larger wins, as in effective_config.
                    let smaller = !(a.is_some_and(|a| a < 0) || p.is_some_and(|p| p < 0));
                    pick(a, p, smaller)
                }
                "requeue-delays" => first(a.is_some(), p.is_some()),
                "single-active-consumer" => {
                    first(args.contains_key("x-single-active-consumer"), false)
                }
                _ => SettingSource::Default,
            };
            (key, source)
        })
        .collect()
}

mod operator;
#[cfg(test)]
mod setting_source_tests;

pub use operator::{OPERATOR_POLICY_KEYS, apply_operator_policy, validate_operator_policy};
