//! Exchange routing: which bindings a publish matches.
//!
//! This module holds the pure matching rules; [`crate::meta::MetaState::route`] walks an
//! exchange's bindings and asks these functions which ones match. Nothing here looks at the
//! metadata state, so the rules can be tested as tables.
//!
//! The rules are RabbitMQ's:
//! - **direct**: the binding key equals one of the message's routing keys.
//! - **fanout**: every binding matches.
//! - **topic**: keys are words separated by `.`; in a binding key `*` matches exactly one word
//!   and `#` zero or more. An empty key has zero words (so `#` matches it and `*` does not).
//! - **headers**: the binding's arguments are compared with the message headers, per `x-match`:
//!   `all` (the default) or `any`, which ignore binding arguments whose name starts with `x-`,
//!   and `all-with-x` / `any-with-x`, which include them (so a binding can match on
//!   `x-first-death-reason` of a dead letter). A binding argument matches a header of the same
//!   name with an equal value of the same type. `all` with no arguments left to compare matches
//!   everything; `any` with none matches nothing. RabbitMQ also lets a binding argument of type
//!   *void* match on mere presence of a header; [`Value`] has no void variant, so quorumq has no
//!   presence-only form.
//! - **sender-selected distribution**: a `CC` or `BCC` header (a list of strings) adds routing
//!   keys. `BCC` is stripped from the message before anyone else sees it ([`strip_bcc`]).
//!
//! What it leaves out: the walk over exchange-to-exchange bindings and alternate exchanges,
//! and the default exchange (routed by queue name, as it has no bindings), all done by
//! [`crate::meta::MetaState::route`].

use serde::{Deserialize, Serialize};

use crate::error::MetaError;
use crate::types::{Table, Value};

/// The header that adds routing keys and stays on the message.
pub const CC_HEADER: &str = "CC";
/// The header that adds routing keys and is stripped before the message is stored or delivered.
pub const BCC_HEADER: &str = "BCC";
/// The headers-exchange binding argument that selects the match mode.
pub const X_MATCH: &str = "x-match";

/// The kind of an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ExchangeType {
    Direct,
    Fanout,
    Topic,
    Headers,
}

impl ExchangeType {
    /// Parses the wire name (`direct`, `fanout`, `topic`, `headers`).
    pub fn parse(name: &str) -> Option<ExchangeType> {
        match name {
            "direct" => Some(ExchangeType::Direct),
            "fanout" => Some(ExchangeType::Fanout),
            "topic" => Some(ExchangeType::Topic),
            "headers" => Some(ExchangeType::Headers),
            _ => None,
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeType::Direct => "direct",
            ExchangeType::Fanout => "fanout",
            ExchangeType::Topic => "topic",
            ExchangeType::Headers => "headers",
        }
    }

    /// Does a binding with this key and these arguments match a message published with
    /// `routing_keys` (the key plus CC and BCC keys) and `headers`?
    pub fn binding_matches(
        self,
        binding_key: &str,
        binding_arguments: &Table,
        routing_keys: &[String],
        headers: &Table,
    ) -> bool {
        match self {
            ExchangeType::Direct => routing_keys.iter().any(|k| k == binding_key),
            ExchangeType::Fanout => true,
            ExchangeType::Topic => routing_keys.iter().any(|k| topic_matches(binding_key, k)),
            ExchangeType::Headers => headers_match(binding_arguments, headers),
        }
    }
}

/// Splits a topic key into words; the empty key has no words (as in RabbitMQ).
fn topic_words(key: &str) -> Vec<&str> {
    if key.is_empty() {
        Vec::new()
    } else {
        key.split('.').collect()
    }
}

/// Does the topic binding `pattern` match routing key `key`? `*` matches exactly one word,
/// `#` zero or more words; other words match literally.
pub fn topic_matches(pattern: &str, key: &str) -> bool {
    let pattern = topic_words(pattern);
    let key = topic_words(key);
    // matched[j]: the pattern words seen so far can match the first j key words.
    let mut matched = vec![false; key.len() + 1];
    matched[0] = true;
    for word in &pattern {
        let mut next = vec![false; key.len() + 1];
        match *word {
            "#" => {
                // Zero or more words: reachable from any j' <= j already matched.
                let mut any = false;
                for j in 0..=key.len() {
                    any |= matched[j];
                    next[j] = any;
                }
            }
            "*" => next[1..].copy_from_slice(&matched[..key.len()]),
            literal => {
                for j in 1..=key.len() {
                    next[j] = matched[j - 1] && key[j - 1] == literal;
                }
            }
        }
        matched = next;
    }
    matched[key.len()]
}

/// The `x-match` modes of a headers exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XMatch {
    All,
    Any,
    AllWithX,
    AnyWithX,
}

impl XMatch {
    /// Parses `all`, `any`, `all-with-x`, `any-with-x`.
    pub fn parse(name: &str) -> Option<XMatch> {
        match name {
            "all" => Some(XMatch::All),
            "any" => Some(XMatch::Any),
            "all-with-x" => Some(XMatch::AllWithX),
            "any-with-x" => Some(XMatch::AnyWithX),
            _ => None,
        }
    }

    /// The mode a binding asks for; a missing or malformed `x-match` means `all` (bindings are
    /// validated by [`validate_binding_arguments`] when they are created).
    pub fn of_binding(arguments: &Table) -> XMatch {
        arguments
            .get(X_MATCH)
            .and_then(Value::as_str)
            .and_then(XMatch::parse)
            .unwrap_or(XMatch::All)
    }
}

/// Headers-exchange matching of a binding's arguments against a message's headers.
pub fn headers_match(binding_arguments: &Table, headers: &Table) -> bool {
    let mode = XMatch::of_binding(binding_arguments);
    let with_x = matches!(mode, XMatch::AllWithX | XMatch::AnyWithX);
    let mut compared = binding_arguments
        .iter()
        .filter(|(name, _)| name.as_str() != X_MATCH && (with_x || !name.starts_with("x-")))
        .map(|(name, wanted)| headers.get(name) == Some(wanted));
    match mode {
        XMatch::All | XMatch::AllWithX => compared.all(|ok| ok),
        XMatch::Any | XMatch::AnyWithX => compared.any(|ok| ok),
    }
}

/// Checks binding arguments for an exchange of kind `kind`: for a headers exchange, `x-match`
/// must be a string naming one of the four modes.
pub fn validate_binding_arguments(kind: ExchangeType, arguments: &Table) -> Result<(), MetaError> {
    if kind != ExchangeType::Headers {
        return Ok(());
    }
    match arguments.get(X_MATCH) {
        None => Ok(()),
        Some(Value::String(s)) if XMatch::parse(s).is_some() => Ok(()),
        Some(Value::String(s)) => Err(MetaError::invalid(format!(
            "x-match: expected all, any, all-with-x or any-with-x, got '{}'",
            crate::names::shown(s)
        ))),
        Some(other) => Err(MetaError::invalid(format!(
            "x-match: expected a string, got {}",
            other.type_name()
        ))),
    }
}

/// The string keys of a `CC`/`BCC` header; anything that is not a list of strings adds none
/// (publishes are checked by [`validate_sender_selected`] first).
fn header_keys<'a>(headers: &'a Table, name: &str) -> impl Iterator<Item = &'a str> {
    let list: &[Value] = match headers.get(name) {
        Some(Value::List(items)) => items,
        _ => &[],
    };
    list.iter().filter_map(Value::as_str)
}

/// All the keys a publish routes on: `routing_key`, then the `CC` keys, then the `BCC` keys.
pub fn routing_keys(routing_key: &str, headers: &Table) -> Vec<String> {
    std::iter::once(routing_key)
        .chain(header_keys(headers, CC_HEADER))
        .chain(header_keys(headers, BCC_HEADER))
        .map(str::to_string)
        .collect()
}

/// The routing key and the `CC` keys (not `BCC`): what `x-death` records as `routing-keys`.
pub fn visible_routing_keys(routing_key: &str, headers: &Table) -> Vec<String> {
    std::iter::once(routing_key)
        .chain(header_keys(headers, CC_HEADER))
        .map(str::to_string)
        .collect()
}

/// Removes the `BCC` header.
pub fn strip_bcc(headers: &mut Table) {
    headers.remove(BCC_HEADER);
}

/// Checks a publish's `CC` and `BCC` headers: when present, each must be a list of strings.
/// (RabbitMQ refuses a non-list with a precondition failure and silently skips non-string
/// elements; quorumq refuses both, naming the header.)
pub fn validate_sender_selected(headers: &Table) -> Result<(), MetaError> {
    for name in [CC_HEADER, BCC_HEADER] {
        match headers.get(name) {
            None => {}
            Some(Value::List(items)) => {
                if let Some(bad) = items.iter().find(|v| v.as_str().is_none()) {
                    return Err(MetaError::invalid(format!(
                        "{name}: expected a list of strings, got an element of type {}",
                        bad.type_name()
                    )));
                }
            }
            Some(other) => {
                return Err(MetaError::invalid(format!(
                    "{name}: expected a list of strings, got {}",
                    other.type_name()
                )));
            }
        }
    }
    Ok(())
}
