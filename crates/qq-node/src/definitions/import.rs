//! Import: a parsed document checked whole against a copy of the metadata (the pure
//! `MetaState::apply` the metadata group runs), then proposed item by item, skipping what is
//! already there.

use std::collections::BTreeMap;

use qq_core::NodeId;
use qq_core::Table;
use qq_core::meta::{
    Binding, ErrorKind, Limits, MetaCommand, MetaError, MetaState, Permissions, Policy,
};
use tracing::info;

use super::error::{Cause, DefinitionsError, Located};
use super::{Document, Item, KINDS, MAX_REPORTED_ERRORS, Summary};
use crate::proposer::Proposer;

/// What a command of the document does to the metadata.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Created,
    Updated,
    Unchanged,
}

/// Whether `cmd` would change `state`, and how.
fn outcome(state: &MetaState, cmd: &MetaCommand) -> Outcome {
    match cmd {
        MetaCommand::PutVhost { .. }
        | MetaCommand::PutUser { .. }
        | MetaCommand::SetPermissions { .. }
        | MetaCommand::SetVhostLimits { .. }
        | MetaCommand::SetUserLimits { .. } => access_outcome(state, cmd),
        _ => topology_outcome(state, cmd),
    }
}

/// What is there already decides: nothing (created), the same (unchanged), or something else
/// (updated).
fn exists(there: bool, same: bool) -> Outcome {
    match (there, same) {
        (false, _) => Outcome::Created,
        (true, true) => Outcome::Unchanged,
        (true, false) => Outcome::Updated,
    }
}

/// [`outcome`] of a vhost, a user, permissions or limits.
fn access_outcome(state: &MetaState, cmd: &MetaCommand) -> Outcome {
    match cmd {
        MetaCommand::PutVhost { name } => exists(state.vhost_exists(name), true),
        MetaCommand::PutUser {
            name,
            password_hash,
            salt,
            tags,
        } => match state.user(name) {
            None => Outcome::Created,
            Some(u) => exists(
                true,
                &u.password_hash == password_hash && &u.salt == salt && &u.tags == tags,
            ),
        },
        MetaCommand::SetPermissions {
            user,
            vhost,
            configure,
            write,
            read,
        } => match state.permissions(user, vhost) {
            None => Outcome::Created,
            Some(p) => exists(
                true,
                *p == Permissions {
                    configure: configure.clone(),
                    write: write.clone(),
                    read: read.clone(),
                },
            ),
        },
        MetaCommand::SetVhostLimits { vhost, limits } => {
            let current = state.vhost_limits(vhost);
            exists(current != Limits::default(), current == *limits)
        }
        MetaCommand::SetUserLimits { user, limits } => {
            let current = state.user_limits(user);
            exists(current != Limits::default(), current == *limits)
        }
        _ => Outcome::Created,
    }
}

/// [`outcome`] of a policy, an exchange, a queue or a binding.
fn topology_outcome(state: &MetaState, cmd: &MetaCommand) -> Outcome {
    match cmd {
        MetaCommand::SetPolicy {
            vhost,
            name,
            pattern,
            apply_to,
            priority,
            definition,
        } => {
            let found = state.policies(vhost).find(|p| &p.name == name);
            policy_outcome(found, (pattern, apply_to, *priority, definition))
        }
        // Equivalence of an existing exchange or queue is apply's to judge (an inequivalent
        // one is refused there); an equivalent one is left alone.
        MetaCommand::DeclareExchange { vhost, name, .. } => {
            exists(state.exchange(vhost, name).is_some(), true)
        }
        MetaCommand::DeclareQueue { vhost, name, .. } => {
            exists(state.queue(vhost, name).is_some(), true)
        }
        MetaCommand::SetOperatorPolicy {
            vhost,
            name,
            pattern,
            apply_to,
            priority,
            definition,
        } => {
            let found = state.operator_policies(vhost).find(|p| &p.name == name);
            policy_outcome(found, (pattern, apply_to, *priority, definition))
        }
        MetaCommand::Bind {
            vhost,
            queue,
            exchange,
            routing_key,
            arguments,
        } => {
            let wanted = binding(exchange, queue, routing_key, arguments);
            exists(state.bindings(vhost).any(|b| *b == wanted), true)
        }
        MetaCommand::BindExchange {
            vhost,
            destination,
            source,
            routing_key,
            arguments,
        } => {
            let wanted = binding(source, destination, routing_key, arguments);
            let v = state.vhost(vhost);
            exists(
                v.is_some_and(|v| v.exchange_bindings.contains(&wanted)),
                true,
            )
        }
        _ => Outcome::Created,
    }
}

/// [`outcome`] of a policy (user's or operator's) with these fields, given the one of its name.
fn policy_outcome(
    found: Option<&Policy>,
    (pattern, apply_to, priority, definition): (&String, &String, i64, &Table),
) -> Outcome {
    match found {
        None => Outcome::Created,
        Some(p) => exists(
            true,
            &p.pattern == pattern
                && &p.apply_to == apply_to
                && p.priority == priority
                && &p.definition == definition,
        ),
    }
}

fn binding(source: &str, destination: &str, routing_key: &str, arguments: &Table) -> Binding {
    Binding {
        source: source.to_string(),
        destination: destination.to_string(),
        routing_key: routing_key.to_string(),
        arguments: arguments.clone(),
    }
}

/// A refusal of `path` by the metadata's own rules: its kind, and its message naming the path
/// ([`Located`]). (The API answers a missing vhost, user, exchange or queue, which the document
/// neither has nor finds, as the document's fault: INVALID_ARGUMENT.)
fn refusal(path: &str, e: &MetaError) -> (ErrorKind, String) {
    (
        e.kind,
        Located(path, &Cause::Refused(e.clone())).to_string(),
    )
}

/// The commands of `doc` for this cluster (`nodes`, `owner`), checked against a copy of
/// `state`: each with what it will do, or every refusal (the first one's status code).
fn plan(
    state: &MetaState,
    doc: &Document,
    nodes: &[NodeId],
    owner: Option<&str>,
) -> Result<Vec<(Item, Outcome)>, DefinitionsError> {
    let mut sim = state.clone();
    let mut steps = Vec::new();
    let mut errors: Vec<(ErrorKind, String)> = Vec::new();
    for item in &doc.items {
        let mut item = item.clone();
        match &mut item.cmd {
            MetaCommand::DeclareQueue {
                nodes: n, owner: o, ..
            } => {
                *n = nodes.to_vec();
                *o = owner.map(str::to_string);
            }
            MetaCommand::DeclareExchange { owner: o, .. } => *o = owner.map(str::to_string),
            _ => {}
        }
        let outcome = outcome(&sim, &item.cmd);
        let (result, _effects) = sim.apply(item.cmd.clone());
        if let Err(e) = result {
            errors.push(refusal(&item.path, &e));
            continue;
        }
        steps.push((item, outcome));
    }
    if let Some((kind, _)) = errors.first() {
        let shown: Vec<&str> = errors
            .iter()
            .take(MAX_REPORTED_ERRORS)
            .map(|(_, m)| m.as_str())
            .collect();
        let mut message = shown.join("; ");
        if errors.len() > MAX_REPORTED_ERRORS {
            message.push_str(&format!(
                "; and {} more",
                errors.len() - MAX_REPORTED_ERRORS
            ));
        }
        return Err(DefinitionsError::Refused {
            kind: *kind,
            refusals: message,
        });
    }
    Ok(steps)
}

/// Imports `doc`: checks all of it against the current metadata, then proposes what is not
/// already there. `owner`: the importing user (counted for user limits), `None` at boot.
pub async fn import(
    proposer: &Proposer,
    state: &MetaState,
    doc: &Document,
    nodes: &[NodeId],
    owner: Option<&str>,
) -> Result<Summary, DefinitionsError> {
    let steps = plan(state, doc, nodes, owner)?;
    let mut counts: BTreeMap<usize, (u64, u64, u64)> = BTreeMap::new();
    let mut applied = 0usize;
    for (item, outcome) in steps {
        let c = counts.entry(item.kind).or_default();
        match outcome {
            Outcome::Unchanged => {
                c.2 += 1;
                continue;
            }
            Outcome::Created => c.0 += 1,
            Outcome::Updated => c.1 += 1,
        }
        let cause = match proposer.propose_meta(item.cmd).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(Cause::Refused(e)),
            Err(e) => Some(Cause::Node(e)),
        };
        if let Some(cause) = cause {
            return Err(DefinitionsError::Stopped {
                path: item.path,
                cause,
                applied,
            });
        }
        applied += 1;
    }
    let summary = Summary {
        counts: counts
            .into_iter()
            .map(|(k, (c, u, n))| (KINDS[k].to_string(), c, u, n))
            .collect(),
    };
    info!(changes = applied, summary = %summary, "definitions imported");
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use qq_core::{Table, Value};
    use serde_json::{Value as J, json};
    use tonic::{Code, Status};

    use super::*;
    use crate::definitions::export;

    fn doc(j: J) -> Result<Document, DefinitionsError> {
        Document::parse(j.to_string().as_bytes())
    }

    #[test]
    fn export_then_parse_and_plan_round_trips() {
        let mut state = MetaState::new();
        let cmds = [
            MetaCommand::PutVhost {
                name: "shop".into(),
            },
            MetaCommand::DeclareQueue {
                vhost: "shop".into(),
                name: "q".into(),
                arguments: Table::from([("x-max-length".to_string(), Value::Long(5))]),
                passive: false,
                nodes: vec![1, 2, 3],
                owner: None,
                origin: None,
            },
        ];
        for c in cmds {
            state.apply(c).0.unwrap();
        }
        let exported = export(&state);
        let parsed = doc(exported.clone()).unwrap();
        // Everything is already there: nothing to do.
        let steps = plan(&state, &parsed, &[1, 2, 3], None).unwrap();
        assert!(
            steps.iter().all(|(_, o)| *o == Outcome::Unchanged),
            "{steps:?}"
        );
        // Into a fresh state: the result exports the same.
        let mut fresh = MetaState::new();
        for (item, _) in plan(&fresh.clone(), &parsed, &[1, 2, 3], None).unwrap() {
            fresh.apply(item.cmd).0.unwrap();
        }
        assert_eq!(export(&fresh), exported);
    }

    #[test]
    fn what_the_document_lacks_is_its_own_fault() {
        // A vhost neither in the document nor in the cluster: the core says NOT_FOUND, the
        // import answers INVALID_ARGUMENT naming the item.
        let e = doc(json!({"queues": [{"name": "a", "vhost": "nowhere"}]}))
            .and_then(|d| plan(&MetaState::new(), &d, &[1], None))
            .map_err(Status::from)
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("queues[0]"), "{}", e.message());
    }

    #[test]
    fn bad_argument_names_its_path() {
        let e = doc(json!({"queues": [{"name": "a"}, {"name": "b", "vhost": "/",
            "arguments": {"x-max-length": "lots"}}]}))
        .and_then(|d| plan(&MetaState::new(), &d, &[1], None))
        .map_err(Status::from)
        .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().contains("queues[1].arguments.x-max-length: "),
            "{}",
            e.message()
        );
    }

    #[test]
    fn an_inequivalent_queue_is_named() {
        let mut state = MetaState::new();
        state
            .apply(MetaCommand::DeclareQueue {
                vhost: "/".into(),
                name: "q".into(),
                arguments: Table::new(),
                passive: false,
                nodes: vec![1],
                owner: None,
                origin: None,
            })
            .0
            .unwrap();
        let d = doc(json!({"queues": [{"name": "q", "arguments": {"x-max-length": 3}}]})).unwrap();
        let e = Status::from(plan(&state, &d, &[1], None).unwrap_err());
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("queues[0]"), "{}", e.message());
        assert!(e.message().contains("'q'"), "{}", e.message());
    }

    #[test]
    fn a_rabbitmq_export_imports_where_it_fits() {
        // The shape of `rabbitmqctl export_definitions` (3.12), without its users.
        let d = doc(json!({
            "rabbit_version": "3.12.1", "rabbitmq_version": "3.12.1",
            "product_name": "RabbitMQ", "product_version": "3.12.1",
            "vhosts": [{"name": "shop", "limits": [], "metadata": {"description": "", "tags": []}}],
            "permissions": [{"user": "guest", "vhost": "shop",
                             "configure": ".*", "write": ".*", "read": ".*"}],
            "topic_permissions": [], "parameters": [], "global_parameters": [],
            "policies": [{"vhost": "shop", "name": "dlx", "pattern": "^jobs$",
                          "apply-to": "queues", "definition": {"dead-letter-exchange": "dead"},
                          "priority": 0}],
            "queues": [{"name": "jobs", "vhost": "shop", "durable": true, "auto_delete": false,
                        "type": "quorum", "arguments": {"x-queue-type": "quorum",
                        "x-delivery-limit": 5}}],
            "exchanges": [{"name": "dead", "vhost": "shop", "type": "fanout", "durable": true,
                           "auto_delete": false, "internal": false, "arguments": {}}],
            "bindings": [{"source": "dead", "vhost": "shop", "destination": "jobs",
                          "destination_type": "queue", "routing_key": "", "arguments": {}}],
        }))
        .unwrap();
        let mut state = MetaState::new();
        for (item, outcome) in plan(&state.clone(), &d, &[1, 2, 3], None).unwrap() {
            assert_ne!(outcome, Outcome::Unchanged, "{}", item.path);
            state.apply(item.cmd).0.unwrap();
        }
        assert!(state.queue("shop", "jobs").is_some());
        // A classic queue is refused, naming it.
        let classic = doc(json!({"queues": [{"name": "c", "vhost": "/",
            "arguments": {"x-queue-type": "classic"}}]}))
        .unwrap();
        let e = Status::from(plan(&MetaState::new(), &classic, &[1], None).unwrap_err());
        assert!(e.message().contains("queues[0]"), "{}", e.message());
    }
}
