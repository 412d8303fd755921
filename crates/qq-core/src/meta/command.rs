//! [`MetaCommand`]: what the metadata log carries, and the bounds every command is checked
//! against before it is proposed and again when it is applied.

use super::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MetaCommand {
    PutVhost {
        name: String,
    },
    DeleteVhost {
        name: String,
    },
    PutUser {
        name: String,
        password_hash: Vec<u8>,
        salt: Vec<u8>,
        tags: Vec<String>,
    },
    DeleteUser {
        name: String,
    },
    SetPermissions {
        user: String,
        vhost: String,
        configure: String,
        write: String,
        read: String,
    },
    DeclareExchange {
        vhost: String,
        name: String,
        kind: String,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Table,
        passive: bool,
        /// The declaring user, for user limits; `None` from internal callers.
        owner: Option<String>,
    },
    DeleteExchange {
        vhost: String,
        name: String,
        if_unused: bool,
    },
    /// `nodes`: every cluster node id; apply sorts them and picks members deterministically.
    DeclareQueue {
        vhost: String,
        name: String,
        arguments: Table,
        passive: bool,
        nodes: Vec<NodeId>,
        /// The declaring user, for user limits; `None` from internal callers.
        owner: Option<String>,
        /// The node the client declared on, the first member (initial leader) under
        /// `x-queue-leader-locator` `client-local` (ignored if not among `nodes`).
        origin: Option<NodeId>,
    },
    /// `if_unused`/`if_empty` are checked by the node against the live queue before proposing.
    DeleteQueue {
        vhost: String,
        name: String,
    },
    Bind {
        vhost: String,
        queue: String,
        exchange: String,
        routing_key: String,
        arguments: Table,
    },
    Unbind {
        vhost: String,
        queue: String,
        exchange: String,
        routing_key: String,
        arguments: Table,
    },
    SetPolicy {
        vhost: String,
        name: String,
        pattern: String,
        apply_to: String,
        priority: i64,
        definition: Table,
    },
    ClearPolicy {
        vhost: String,
        name: String,
    },
    /// Replaces the vhost's limits (all unset: clears them).
    SetVhostLimits {
        vhost: String,
        limits: Limits,
    },
    /// Replaces the user's limits (all unset: clears them).
    SetUserLimits {
        user: String,
        limits: Limits,
    },
    // Membership changes (AddMember, DeleteMember, GrowQueues, ShrinkQueues).
    /// Records a queue's replicas after (members) or before (learners) a change of its Raft
    /// group, proposed by the node doing the change. Applied only if the queue `id` still has
    /// exactly `expected` members (FAILED_PRECONDITION otherwise: another change came first).
    /// `members` may not be empty, nor repeat a node, nor share one with `learners`.
    SetQueueMembers {
        vhost: String,
        name: String,
        id: QueueId,
        expected: Vec<NodeId>,
        members: Vec<NodeId>,
        learners: Vec<NodeId>,
    },
    // Cluster membership (JoinNode, ForgetNode).
    /// A node joins the cluster: every node adds it to its peers. Refused if `id` joined
    /// before with other addresses. A forgotten id joins again (a new member under the old
    /// id) from metadata machine version 2 on; version 1 refuses it. Recorded before the node
    /// enters the metadata group's Raft membership, so every node can reach it by then.
    JoinNode {
        id: NodeId,
        address: String,
        cluster_address: String,
    },
    /// A node leaves the cluster for good: every node drops it from its peers. Refused while
    /// it still holds a replica of any queue (FAILED_PRECONDITION naming them).
    ForgetNode {
        id: NodeId,
    },
    // Metadata machine version 2 (module `machine`): appended, so that the encoding of every
    // command above stays release 0.1.0's.
    /// Moves the metadata machine to `version`, proposed by the metadata leader once every
    /// node runs a release that has it.
    SetMachineVersion {
        version: u32,
    },
    /// Binds exchange `destination` to exchange `source`: what `source` routes by this
    /// binding, `destination` routes on.
    BindExchange {
        vhost: String,
        destination: String,
        source: String,
        routing_key: String,
        arguments: Table,
    },
    UnbindExchange {
        vhost: String,
        destination: String,
        source: String,
        routing_key: String,
        arguments: Table,
    },
    /// An operator policy: limits imposed over the users' policies and arguments (the
    /// stricter value wins), keys [`crate::policy::OPERATOR_POLICY_KEYS`].
    SetOperatorPolicy {
        vhost: String,
        name: String,
        pattern: String,
        apply_to: String,
        priority: i64,
        definition: Table,
    },
    ClearOperatorPolicy {
        vhost: String,
        name: String,
    },
    /// Node `id` says which data directory it runs on: `incarnation`, a random number its
    /// store drew when the directory was new. Recorded once; the same again changes nothing,
    /// another one is refused (FAILED_PRECONDITION): a node on a new, empty directory under an
    /// id the cluster knows lost what it had acknowledged and must be re-seeded (forgotten and
    /// joined again, which clears the record) before it may vote. Refused for a forgotten id.
    RecordIncarnation {
        id: NodeId,
        incarnation: u64,
    },
}

impl MetaCommand {
    /// `BindExchange` (`bind`) or `UnbindExchange` of exchange `destination` to `source`.
    pub fn exchange_binding(
        bind: bool,
        vhost: String,
        destination: String,
        source: String,
        routing_key: String,
        arguments: Table,
    ) -> MetaCommand {
        if bind {
            MetaCommand::BindExchange {
                vhost,
                destination,
                source,
                routing_key,
                arguments,
            }
        } else {
            MetaCommand::UnbindExchange {
                vhost,
                destination,
                source,
                routing_key,
                arguments,
            }
        }
    }

    /// `SetOperatorPolicy` (`operator`) or `SetPolicy`, from a policy's fields.
    pub fn set_policy(operator: bool, vhost: String, policy: Policy) -> MetaCommand {
        let Policy {
            name,
            pattern,
            apply_to,
            priority,
            definition,
        } = policy;
        if operator {
            MetaCommand::SetOperatorPolicy {
                vhost,
                name,
                pattern,
                apply_to,
                priority,
                definition,
            }
        } else {
            MetaCommand::SetPolicy {
                vhost,
                name,
                pattern,
                apply_to,
                priority,
                definition,
            }
        }
    }
}

/// Longest text field (pattern, routing key, permission regex, tag) a command may carry.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// Most entries in a command's table (arguments, definition) or list (tags, nodes), and the
/// deepest nesting of tables and lists inside a table.
pub const MAX_COMMAND_ITEMS: usize = 1024;
pub const MAX_VALUE_DEPTH: usize = 16;

impl MetaCommand {
    /// [`MetaCommand::validate`], and the characters of every name the command creates
    /// ([`names::check_new`]): checked by the proposing node and by a leader for a forwarded
    /// proposal, not at apply, so a log written before the rule replays as it applied then.
    pub fn validate_new(&self) -> Result<(), MetaError> {
        self.validate()?;
        match self {
            MetaCommand::PutVhost { name } | MetaCommand::PutUser { name, .. } => {
                names::check_new("name", name)
            }
            MetaCommand::DeclareExchange { name, passive, .. }
            | MetaCommand::DeclareQueue { name, passive, .. }
                if !passive =>
            {
                names::check_new("name", name)
            }
            MetaCommand::SetPolicy { name, .. } | MetaCommand::SetOperatorPolicy { name, .. } => {
                names::check_new("name", name)
            }
            _ => Ok(()),
        }
    }

    /// Bounds checked before a command is proposed (by the proposing node, and by a leader
    /// for a forwarded proposal) and again at apply: a command outside them is refused
    /// without being applied. What depends on the state (does the vhost exist, is the
    /// redeclare equivalent) is left to apply.
    pub fn validate(&self) -> Result<(), MetaError> {
        let text = |field: &str, v: &str| check_len(field, v.len(), MAX_TEXT_BYTES, "bytes");
        let name = |field: &str, v: &str| check_len(field, v.len(), MAX_NAME_BYTES, "bytes");
        match self {
            MetaCommand::PutVhost { name: n } | MetaCommand::DeleteVhost { name: n } => {
                name("name", n)
            }
            MetaCommand::PutUser {
                name: n,
                password_hash,
                salt,
                tags,
            } => {
                name("name", n)?;
                check_len(
                    "password_hash",
                    password_hash.len(),
                    MAX_TEXT_BYTES,
                    "bytes",
                )?;
                check_len("salt", salt.len(), MAX_TEXT_BYTES, "bytes")?;
                check_len("tags", tags.len(), MAX_COMMAND_ITEMS, "tags")?;
                tags.iter().try_for_each(|t| name("tags", t))
            }
            MetaCommand::DeleteUser { name: n } => name("name", n),
            MetaCommand::SetPermissions {
                user,
                vhost,
                configure,
                write,
                read,
            } => {
                name("user", user)?;
                name("vhost", vhost)?;
                text("configure", configure)?;
                text("write", write)?;
                text("read", read)
            }
            MetaCommand::DeclareExchange {
                vhost,
                name: n,
                kind,
                arguments,
                owner,
                ..
            } => {
                name("vhost", vhost)?;
                name("name", n)?;
                name("type", kind)?;
                name("owner", owner.as_deref().unwrap_or(""))?;
                check_table("arguments", arguments)
            }
            MetaCommand::DeleteExchange { vhost, name: n, .. }
            | MetaCommand::DeleteQueue { vhost, name: n }
            | MetaCommand::ClearPolicy { vhost, name: n }
            | MetaCommand::ClearOperatorPolicy { vhost, name: n } => {
                name("vhost", vhost)?;
                name("name", n)
            }
            MetaCommand::DeclareQueue {
                vhost,
                name: n,
                arguments,
                nodes,
                owner,
                ..
            } => {
                name("vhost", vhost)?;
                name("name", n)?;
                name("owner", owner.as_deref().unwrap_or(""))?;
                check_len("nodes", nodes.len(), MAX_COMMAND_ITEMS, "nodes")?;
                check_table("arguments", arguments)
            }
            MetaCommand::Bind {
                vhost,
                queue,
                exchange,
                routing_key,
                arguments,
            }
            | MetaCommand::Unbind {
                vhost,
                queue,
                exchange,
                routing_key,
                arguments,
            } => {
                name("vhost", vhost)?;
                name("queue", queue)?;
                name("exchange", exchange)?;
                text("routing_key", routing_key)?;
                check_table("arguments", arguments)
            }
            MetaCommand::SetPolicy {
                vhost,
                name: n,
                pattern,
                apply_to,
                definition,
                ..
            }
            | MetaCommand::SetOperatorPolicy {
                vhost,
                name: n,
                pattern,
                apply_to,
                definition,
                ..
            } => {
                name("vhost", vhost)?;
                name("name", n)?;
                text("pattern", pattern)?;
                name("apply_to", apply_to)?;
                check_table("definition", definition)
            }
            MetaCommand::SetVhostLimits { vhost, .. } => name("vhost", vhost),
            MetaCommand::SetUserLimits { user, .. } => name("user", user),
            MetaCommand::SetQueueMembers {
                vhost,
                name: n,
                expected,
                members,
                learners,
                ..
            } => {
                name("vhost", vhost)?;
                name("name", n)?;
                check_len("expected", expected.len(), MAX_COMMAND_ITEMS, "nodes")?;
                check_len("members", members.len(), MAX_COMMAND_ITEMS, "nodes")?;
                check_len("learners", learners.len(), MAX_COMMAND_ITEMS, "nodes")
            }
            MetaCommand::JoinNode {
                id,
                address,
                cluster_address,
            } => {
                if *id == 0 {
                    return Err(MetaError::invalid("id: a node id must be at least 1"));
                }
                name("address", address)?;
                name("cluster_address", cluster_address)
            }
            MetaCommand::BindExchange {
                vhost,
                destination,
                source,
                routing_key,
                arguments,
            }
            | MetaCommand::UnbindExchange {
                vhost,
                destination,
                source,
                routing_key,
                arguments,
            } => {
                name("vhost", vhost)?;
                name("destination", destination)?;
                name("source", source)?;
                text("routing_key", routing_key)?;
                check_table("arguments", arguments)
            }
            MetaCommand::SetMachineVersion { .. } => Ok(()),
            MetaCommand::ForgetNode { id } => {
                if *id == 0 {
                    return Err(MetaError::invalid("id: a node id must be at least 1"));
                }
                Ok(())
            }
            MetaCommand::RecordIncarnation { id, incarnation } => {
                if *id == 0 {
                    return Err(MetaError::invalid("id: a node id must be at least 1"));
                }
                if *incarnation == 0 {
                    return Err(MetaError::invalid("incarnation: must not be 0"));
                }
                Ok(())
            }
        }
    }
}

fn check_len(field: &str, len: usize, max: usize, unit: &str) -> Result<(), MetaError> {
    if len > max {
        return Err(MetaError::invalid(format!(
            "{field}: {len} {unit}, more than {max}"
        )));
    }
    Ok(())
}

/// A table's size, its keys and text values, and its nesting depth are within the bounds.
pub fn check_table(field: &str, table: &Table) -> Result<(), MetaError> {
    fn walk(field: &str, v: &Value, depth: usize) -> Result<(), MetaError> {
        if depth > MAX_VALUE_DEPTH {
            return Err(MetaError::invalid(format!(
                "{field}: nested deeper than {MAX_VALUE_DEPTH} levels"
            )));
        }
        match v {
            Value::String(s) => check_len(field, s.len(), MAX_TEXT_BYTES, "bytes"),
            Value::Bytes(b) => check_len(field, b.len(), MAX_TEXT_BYTES, "bytes"),
            Value::List(items) => {
                check_len(field, items.len(), MAX_COMMAND_ITEMS, "items")?;
                items.iter().try_for_each(|i| walk(field, i, depth + 1))
            }
            Value::Table(t) => {
                check_len(field, t.len(), MAX_COMMAND_ITEMS, "entries")?;
                t.iter().try_for_each(|(k, v)| {
                    check_len(field, k.len(), MAX_NAME_BYTES, "bytes in a key")?;
                    walk(field, v, depth + 1)
                })
            }
            _ => Ok(()),
        }
    }
    check_len(field, table.len(), MAX_COMMAND_ITEMS, "entries")?;
    table.iter().try_for_each(|(k, v)| {
        check_len(field, k.len(), MAX_NAME_BYTES, "bytes in a key")?;
        walk(field, v, 1)
    })
}
