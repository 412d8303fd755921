//! The metadata state machine: vhosts, users and permissions, exchanges, queues (with their
//! Raft members), bindings and policies.
//!
//! # Why one replicated state machine
//! Metadata is small and changes rarely, so it lives in a single Raft group (group 0) replicated
//! on every node (docs/architecture.md, "Decisions"). Every node can therefore route a publish, check a
//! permission or find a queue's members from its local replica without a network hop, and a
//! declare is answered once its command commits. [`MetaState::apply`] is a pure function of the
//! state and the command: no clock, no randomness, no IO, ordered collections only, so every
//! replica that applies the same log ends in the same state, byte for byte when serialized.
//!
//! # Deciding versus doing
//! `apply` returns a reply for the client and a list of [`MetaEffect`]s for the node to carry
//! out: a queue was created (start its Raft group on its members), deleted (stop it), or its
//! effective configuration changed after a policy change (propose `UpdateConfig` in the queue's
//! own log). Errors are *applied results*: a bad declare changes nothing and returns a
//! [`MetaError`] whose [`ErrorKind`] maps one-to-one to a gRPC status.
//!
//! # Rules worth knowing
//! - A fresh state has vhost `/` with `amq.direct`, `amq.fanout`, `amq.topic`, `amq.headers`
//!   (and the implicit nameless default exchange, also reachable as `amq.default`), and user
//!   `guest`/`guest` with `.*` permissions on `/`. A vhost created later gets the same
//!   exchanges but no permissions, as in RabbitMQ.
//! - Names: non-empty (queues are never server-named), at most 255 bytes, and a new one without
//!   control or bidi/format characters ([`crate::names`]). A *new* exchange or
//!   queue may not start with `amq.` and the default exchange cannot be declared, deleted or
//!   bound: PERMISSION_DENIED, as RabbitMQ's ACCESS_REFUSED. Redeclaring an existing `amq.`
//!   exchange equivalently is fine.
//! - Redeclaring with a different type/flags (exchanges) or a different value of any argument
//!   quorumq interprets (queues) fails with FAILED_PRECONDITION in RabbitMQ's words:
//!   `inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value '1000' of
//!   type 'long' but current is none`. Of an exchange's arguments only `alternate-exchange` is
//!   compared, as RabbitMQ's `rabbit_exchange:assert_args_equivalence` (quorumq stores it but
//!   does not route by it).
//! - A new queue gets the next id (from 1) and `min(x-quorum-initial-group-size or 3, nodes)`
//!   members taken from the sorted node list starting at `id % nodes`, so initial leaders
//!   (`members[0]`) rotate over the nodes.
//! - Deleting a queue removes its bindings; an `auto_delete` exchange that thereby loses its last
//!   binding is deleted too. Deleting an exchange removes its bindings. Deleting a vhost removes
//!   everything in it (emitting `QueueDeleted` for each queue).
//! - Deletes of missing exchanges, queues, policies return NOT_FOUND (RabbitMQ treats them as
//!   no-ops; quorumq reports what happened and lets the node decide). `if_unused`/`if_empty`
//!   for queues are checked by the node against the live queue before it proposes the delete.
//! - Permission regexes are matched unanchored; an empty regex grants nothing. The default
//!   exchange is checked under the name `amq.default`.
//!
//! What it leaves out: exchange-to-exchange bindings, operator policies,
//! exclusive/auto-delete queues (quorum queues are always durable), and the `internal` check on
//! publish, which the node does with [`MetaState::exchange`] because dead letters may be routed
//! through an internal exchange.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use regex::Regex;
use serde::{Deserialize, Serialize};

pub use crate::error::{ErrorKind, MetaError};
pub use crate::limits::{Counted, Limits, Scope};
use crate::policy;
pub use crate::policy::Policy;
use crate::route::{self, ExchangeType};
use crate::types::{NodeId, QueueConfig, QueueId, Table, Value};

pub use crate::names::MAX_NAME_BYTES;
use crate::names::{self, shown};
/// Default number of members of a new queue's Raft group.
pub const DEFAULT_GROUP_SIZE: usize = 3;
/// The vhost every fresh cluster has.
pub const DEFAULT_VHOST: &str = "/";
/// The alias of the nameless default exchange.
pub const DEFAULT_EXCHANGE_ALIAS: &str = "amq.default";
/// The fixed salt of the predeclared guest user in clusters created before Argon2id (legacy
/// SHA-256 record: sha256(salt || password)).
pub const GUEST_SALT: &[u8] = b"quorumq-guest";
/// The predeclared guest user's password (`guest`) as a fixed, precomputed Argon2id PHC string:
/// a fresh cluster must be deterministic, so its salt cannot be drawn at apply time.
pub const GUEST_PASSWORD_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$jt/khf7pHrDZ3jFuUJNp/g$hM/I6rkqCBt+/IM0vpgd0fsdU0B4zKBlI/b0okIjLEw";
/// How a PHC string of an Argon2 hash starts (`$argon2id$`, `$argon2i$`, `$argon2d$`).
const ARGON2_PREFIX: &[u8] = b"$argon2";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    pub name: String,
    pub kind: ExchangeType,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: Table,
    /// The user who declared it (counted against that user's `max-exchanges`); `None` for
    /// the predeclared `amq.*` exchanges.
    pub owner: Option<String>,
}

/// A binding of a queue to an exchange. Ordered by source, destination, routing key, then
/// arguments (doubles by their total order), so a vhost's bindings form a set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Binding {
    /// The exchange.
    pub source: String,
    /// The queue.
    pub destination: String,
    pub routing_key: String,
    pub arguments: Table,
}

fn cmp_value(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::String(_) => 0,
            Value::Long(_) => 1,
            Value::Bool(_) => 2,
            Value::Double(_) => 3,
            Value::Bytes(_) => 4,
            Value::Timestamp(_) => 5,
            Value::List(_) => 6,
            Value::Table(_) => 7,
        }
    }
    match (a, b) {
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Long(x), Value::Long(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Double(x), Value::Double(y)) => x.total_cmp(y),
        (Value::Bytes(x), Value::Bytes(y)) => x.cmp(y),
        (Value::Timestamp(x), Value::Timestamp(y)) => x.cmp(y),
        (Value::List(x), Value::List(y)) => x
            .iter()
            .zip(y)
            .map(|(x, y)| cmp_value(x, y))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        (Value::Table(x), Value::Table(y)) => cmp_table(x, y),
        _ => rank(a).cmp(&rank(b)),
    }
}

fn cmp_table(a: &Table, b: &Table) -> Ordering {
    a.iter()
        .zip(b)
        .map(|((ka, va), (kb, vb))| ka.cmp(kb).then_with(|| cmp_value(va, vb)))
        .find(|o| o.is_ne())
        .unwrap_or_else(|| a.len().cmp(&b.len()))
}

impl Ord for Binding {
    fn cmp(&self, other: &Self) -> Ordering {
        self.source
            .cmp(&other.source)
            .then_with(|| self.destination.cmp(&other.destination))
            .then_with(|| self.routing_key.cmp(&other.routing_key))
            .then_with(|| cmp_table(&self.arguments, &other.arguments))
    }
}
impl PartialOrd for Binding {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Binding {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for Binding {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueMeta {
    pub id: QueueId,
    pub vhost: String,
    pub name: String,
    /// The arguments it was declared with (fixed for its lifetime).
    pub arguments: Table,
    /// Its Raft group's voters; `members[0]` is the initial leader.
    pub members: Vec<NodeId>,
    /// Effective configuration, recomputed on every policy change.
    pub config: QueueConfig,
    /// The user who declared it (counted against that user's `max-queues`).
    pub owner: Option<String>,
    /// Nodes being added (`AddMember`): they run a replica that catches up as a Raft learner,
    /// but are not members (not counted for quorum, not asked to lead) until a
    /// [`MetaCommand::SetQueueMembers`] records them after the Raft change committed.
    #[serde(default)]
    pub learners: Vec<NodeId>,
}

impl QueueMeta {
    /// Every node that runs a replica of the queue: members, then learners.
    pub fn replicas(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.members.iter().chain(self.learners.iter()).copied()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub name: String,
    /// An Argon2id PHC string (`$argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>`, UTF-8, with
    /// `salt` empty: the salt is inside), hashed by the node that proposed `PutUser`; or, in
    /// records written before Argon2id, the legacy sha256(salt || password). Verified by the
    /// node (qq-node's `api::auth::passwords::verify`), never here: the replicated state only
    /// holds the record.
    pub password_hash: Vec<u8>,
    pub salt: Vec<u8>,
    pub tags: Vec<String>,
}

impl User {
    /// Whether the record holds a legacy SHA-256 hash rather than an Argon2 PHC string.
    pub fn is_legacy_hash(&self) -> bool {
        !self.password_hash.starts_with(ARGON2_PREFIX)
    }
}

/// A user's permissions on one vhost: three regexes over resource names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permissions {
    pub configure: String,
    pub write: String,
    pub read: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Perm {
    Configure,
    Write,
    Read,
}

impl Perm {
    pub fn as_str(self) -> &'static str {
        match self {
            Perm::Configure => "configure",
            Perm::Write => "write",
            Perm::Read => "read",
        }
    }
}

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
    /// before or was forgotten (an id is never reused). Recorded before the node enters the
    /// metadata group's Raft membership, so every node can reach it by then.
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
            MetaCommand::SetPolicy { name, .. } => names::check_new("name", name),
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
            | MetaCommand::ClearPolicy { vhost, name: n } => {
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
            MetaCommand::ForgetNode { id } => {
                if *id == 0 {
                    return Err(MetaError::invalid("id: a node id must be at least 1"));
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MetaReply {
    Ok,
    QueueDeclared { queue: QueueMeta, created: bool },
    QueueDeleted { queue: QueueMeta },
}

/// What the node must do after an apply (only the effects, never the decision).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MetaEffect {
    /// Start the queue's Raft group on its members.
    QueueCreated(QueueMeta),
    /// Stop the queue's group and drop its data.
    QueueDeleted(QueueMeta),
    /// Propose the new `config` in the queue's own log.
    QueueConfigChanged(QueueMeta),
    /// Its members or learners changed: start the replica on a node that gained one, stop it
    /// (and drop its data) on a node that lost it.
    QueueMembersChanged(QueueMeta),
    /// A node joined or was forgotten: bring the peer set in line with [`MetaState`].
    NodesChanged,
}

/// The addresses of a node that joined the running cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddrs {
    pub address: String,
    pub cluster_address: String,
}

/// Where a new queue may go: every cluster node, and the node the client declared on.
struct Placement {
    nodes: Vec<NodeId>,
    origin: Option<NodeId>,
}

/// Everything that lives in one vhost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Vhost {
    pub exchanges: BTreeMap<String, Exchange>,
    pub queues: BTreeMap<String, QueueMeta>,
    pub bindings: BTreeSet<Binding>,
    pub policies: BTreeMap<String, Policy>,
    /// user name → permissions on this vhost.
    pub permissions: BTreeMap<String, Permissions>,
}

impl Vhost {
    fn with_default_exchanges() -> Self {
        let mut vhost = Vhost::default();
        for kind in [
            ExchangeType::Direct,
            ExchangeType::Fanout,
            ExchangeType::Topic,
            ExchangeType::Headers,
        ] {
            let name = format!("amq.{}", kind.as_str());
            vhost.exchanges.insert(
                name.clone(),
                Exchange {
                    name,
                    kind,
                    durable: true,
                    auto_delete: false,
                    internal: false,
                    arguments: Table::new(),
                    owner: None,
                },
            );
        }
        vhost
    }

    /// Bindings whose source is `exchange`.
    /// The alternate exchange of `x`: its `alternate-exchange` argument, else the key of the
    /// highest-priority policy applying to it (the argument wins, as in RabbitMQ).
    fn alternate_exchange<'a>(&'a self, x: &'a Exchange) -> Option<&'a str> {
        if let Some(ae) = x
            .arguments
            .get("alternate-exchange")
            .and_then(Value::as_str)
        {
            return Some(ae);
        }
        crate::policy::matching_exchange_policy(self.policies.values(), &x.name)?
            .definition
            .get("alternate-exchange")
            .and_then(Value::as_str)
    }

    fn bindings_from<'a>(&'a self, exchange: &'a str) -> impl Iterator<Item = &'a Binding> + 'a {
        let lower = Binding {
            source: exchange.to_string(),
            destination: String::new(),
            routing_key: String::new(),
            arguments: Table::new(),
        };
        self.bindings
            .range(lower..)
            .take_while(move |b| b.source == exchange)
    }

    /// Removes every binding matching `drop`, then deletes the auto-delete exchanges that had
    /// bindings before and have none now.
    fn remove_bindings(&mut self, doomed: impl Fn(&Binding) -> bool) {
        let removed: BTreeSet<String> = self
            .bindings
            .iter()
            .filter(|b| doomed(b))
            .map(|b| b.source.clone())
            .collect();
        self.bindings.retain(|b| !doomed(b));
        for source in removed {
            let auto_delete = self.exchanges.get(&source).is_some_and(|x| x.auto_delete);
            if auto_delete && self.bindings_from(&source).next().is_none() {
                self.exchanges.remove(&source);
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaState {
    vhosts: BTreeMap<String, Vhost>,
    users: BTreeMap<String, User>,
    next_queue_id: QueueId,
    /// Index id → (vhost, name), kept in step with `vhosts[..].queues`.
    queue_ids: BTreeMap<QueueId, (String, String)>,
    /// Set limits only; a missing entry is unlimited. Removed with the vhost or user.
    vhost_limits: BTreeMap<String, Limits>,
    user_limits: BTreeMap<String, Limits>,
    /// Nodes that joined after the cluster formed (the founding nodes are in every node's
    /// configuration), and nodes forgotten for good (founding ones included).
    joined: BTreeMap<NodeId, NodeAddrs>,
    forgotten: BTreeSet<NodeId>,
}

impl Default for MetaState {
    fn default() -> Self {
        Self::new()
    }
}

/// RabbitMQ's wording: `cannot declare queue 'q': queue limit ... is reached`.
fn declare_refused(queue: &str, e: MetaError) -> MetaError {
    MetaError::new(
        e.kind,
        format!("cannot declare queue '{queue}': {}", e.message),
    )
}

fn vhost_not_found(name: &str) -> MetaError {
    MetaError::not_found(format!("vhost '{}' not found", shown(name)))
}

fn exchange_not_found(vhost: &str, name: &str) -> MetaError {
    MetaError::not_found(format!(
        "no exchange '{}' in vhost '{}'",
        shown(name),
        shown(vhost)
    ))
}

fn queue_not_found(vhost: &str, name: &str) -> MetaError {
    MetaError::not_found(format!(
        "no queue '{}' in vhost '{}'",
        shown(name),
        shown(vhost)
    ))
}

fn default_exchange_refused() -> MetaError {
    MetaError::permission_denied("operation not permitted on the default exchange")
}

fn is_default_exchange(name: &str) -> bool {
    name.is_empty() || name == DEFAULT_EXCHANGE_ALIAS
}

fn check_name(what: &str, name: &str) -> Result<(), MetaError> {
    if name.is_empty() {
        return Err(MetaError::invalid(format!(
            "name: a {what} name is required"
        )));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(MetaError::invalid(format!(
            "name: {what} name is {} bytes, longer than {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    Ok(())
}

fn check_not_reserved(what: &str, name: &str) -> Result<(), MetaError> {
    if name.starts_with("amq.") {
        return Err(MetaError::permission_denied(format!(
            "{what} name '{name}' contains reserved prefix 'amq.*'"
        )));
    }
    Ok(())
}

fn compile(what: &str, pattern: &str) -> Result<Regex, MetaError> {
    Regex::new(pattern).map_err(|e| {
        // The regex crate's message repeats the whole pattern; its last line says what is wrong.
        let e = e.to_string();
        let why = e.lines().last().unwrap_or_default();
        MetaError::invalid(format!(
            "{what}: invalid regex '{}': {}",
            shown(pattern),
            shown(why)
        ))
    })
}

/// RabbitMQ's rendering of an argument value in an inequivalence message.
fn show_arg(value: Option<&Value>) -> String {
    match value {
        None => "none".to_string(),
        Some(v) => {
            let shown = match v {
                Value::String(s) => shown(s),
                Value::Long(n) | Value::Timestamp(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                Value::Double(d) => d.to_string(),
                other => format!("{other:?}"),
            };
            format!("the value '{shown}' of type '{}'", v.type_name())
        }
    }
}

impl MetaState {
    /// A fresh cluster: vhost `/` with the `amq.*` exchanges, user guest/guest with `.*`
    /// permissions on `/`.
    pub fn new() -> Self {
        let mut vhost = Vhost::with_default_exchanges();
        let all = ".*".to_string();
        vhost.permissions.insert(
            "guest".into(),
            Permissions {
                configure: all.clone(),
                write: all.clone(),
                read: all,
            },
        );
        let guest = User {
            name: "guest".into(),
            password_hash: GUEST_PASSWORD_HASH.as_bytes().to_vec(),
            salt: Vec::new(),
            tags: vec!["administrator".into()],
        };
        MetaState {
            vhosts: BTreeMap::from([(DEFAULT_VHOST.to_string(), vhost)]),
            users: BTreeMap::from([("guest".to_string(), guest)]),
            next_queue_id: 1,
            queue_ids: BTreeMap::new(),
            vhost_limits: BTreeMap::new(),
            user_limits: BTreeMap::new(),
            joined: BTreeMap::new(),
            forgotten: BTreeSet::new(),
        }
    }

    /// Nodes that joined the running cluster, with their addresses.
    pub fn joined_nodes(&self) -> &BTreeMap<NodeId, NodeAddrs> {
        &self.joined
    }

    /// Nodes forgotten for good.
    pub fn forgotten_nodes(&self) -> &BTreeSet<NodeId> {
        &self.forgotten
    }

    // ---------------------------------------------------------------- queries

    /// The vhost's limits (unlimited when none are set).
    pub fn vhost_limits(&self, vhost: &str) -> Limits {
        self.vhost_limits.get(vhost).copied().unwrap_or_default()
    }
    /// The user's limits (unlimited when none are set).
    pub fn user_limits(&self, user: &str) -> Limits {
        self.user_limits.get(user).copied().unwrap_or_default()
    }
    /// Every vhost with limits set, by name.
    pub fn all_vhost_limits(&self) -> impl Iterator<Item = (&str, &Limits)> {
        self.vhost_limits.iter().map(|(k, v)| (k.as_str(), v))
    }
    /// Every user with limits set, by name.
    pub fn all_user_limits(&self) -> impl Iterator<Item = (&str, &Limits)> {
        self.user_limits.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn vhost_exists(&self, vhost: &str) -> bool {
        self.vhosts.contains_key(vhost)
    }
    pub fn vhosts(&self) -> impl Iterator<Item = &str> {
        self.vhosts.keys().map(String::as_str)
    }
    pub fn vhost(&self, vhost: &str) -> Option<&Vhost> {
        self.vhosts.get(vhost)
    }
    pub fn users(&self) -> impl Iterator<Item = &User> {
        self.users.values()
    }
    pub fn user(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }
    pub fn permissions(&self, user: &str, vhost: &str) -> Option<&Permissions> {
        self.vhosts.get(vhost)?.permissions.get(user)
    }
    pub fn queue(&self, vhost: &str, name: &str) -> Option<&QueueMeta> {
        self.vhosts.get(vhost)?.queues.get(name)
    }
    pub fn queue_by_id(&self, id: QueueId) -> Option<&QueueMeta> {
        let (vhost, name) = self.queue_ids.get(&id)?;
        self.queue(vhost, name)
    }
    /// Every queue of every vhost, by vhost then name.
    pub fn queues(&self) -> impl Iterator<Item = &QueueMeta> {
        self.vhosts.values().flat_map(|v| v.queues.values())
    }
    /// The id the next new queue will get.
    pub fn next_queue_id(&self) -> QueueId {
        self.next_queue_id
    }
    /// An exchange by name (`""`/`amq.default` is the implicit default exchange: `None`).
    pub fn exchange(&self, vhost: &str, name: &str) -> Option<&Exchange> {
        self.vhosts.get(vhost)?.exchanges.get(name)
    }
    /// The exchanges of a vhost (empty for a missing vhost), by name.
    pub fn exchanges(&self, vhost: &str) -> impl Iterator<Item = &Exchange> {
        self.vhosts
            .get(vhost)
            .into_iter()
            .flat_map(|v| v.exchanges.values())
    }
    pub fn bindings(&self, vhost: &str) -> impl Iterator<Item = &Binding> {
        self.vhosts
            .get(vhost)
            .into_iter()
            .flat_map(|v| v.bindings.iter())
    }
    pub fn policies(&self, vhost: &str) -> impl Iterator<Item = &Policy> {
        self.vhosts
            .get(vhost)
            .into_iter()
            .flat_map(|v| v.policies.values())
    }

    /// The policy queue `q`'s effective configuration names, if it still exists.
    pub fn policy_of(&self, q: &QueueMeta) -> Option<&Policy> {
        let name = q.config.policy.as_deref()?;
        self.policies(&q.vhost).find(|p| p.name == name)
    }

    /// Routes a publish to exchange `exchange` with `routing_keys` (the key plus CC and BCC keys,
    /// see [`route::routing_keys`]) and `headers`. The default exchange (`""` or `amq.default`)
    /// routes to the existing queues named by the keys. Returns the distinct target queues,
    /// sorted by name; NOT_FOUND if the vhost or exchange is missing.
    pub fn route(
        &self,
        vhost: &str,
        exchange: &str,
        routing_keys: &[String],
        headers: &Table,
    ) -> Result<Vec<&QueueMeta>, MetaError> {
        let v = self
            .vhosts
            .get(vhost)
            .ok_or_else(|| vhost_not_found(vhost))?;
        // Borrowed, not cloned: this runs for every publish.
        let queues = |names: BTreeSet<&str>| -> Vec<&QueueMeta> {
            names.into_iter().filter_map(|n| v.queues.get(n)).collect()
        };
        if is_default_exchange(exchange) {
            return Ok(queues(routing_keys.iter().map(String::as_str).collect()));
        }
        let mut x = v
            .exchanges
            .get(exchange)
            .ok_or_else(|| exchange_not_found(vhost, exchange))?;
        // An exchange that routes the message nowhere hands it to its alternate exchange, and
        // so on; each exchange is tried once (an alternate-exchange cycle ends), and a missing
        // alternate exchange ends the chain (as RabbitMQ's rabbit_exchange:route).
        let mut tried = BTreeSet::new();
        loop {
            tried.insert(x.name.as_str());
            let names = v
                .bindings_from(&x.name)
                .filter(|b| {
                    x.kind
                        .binding_matches(&b.routing_key, &b.arguments, routing_keys, headers)
                })
                .map(|b| b.destination.as_str())
                .collect();
            let found = queues(names);
            if !found.is_empty() {
                return Ok(found);
            }
            match v.alternate_exchange(x).and_then(|ae| v.exchanges.get(ae)) {
                Some(ae) if !tried.contains(ae.name.as_str()) => x = ae,
                _ => return Ok(found),
            }
        }
    }

    /// Checks that `user` may `perm` the exchange or queue `resource` in `vhost`. NOT_FOUND for a
    /// missing vhost; PERMISSION_DENIED naming user, permission, resource and vhost otherwise.
    /// The default exchange (`""`) is checked as `amq.default`.
    pub fn check_permission(
        &self,
        user: &str,
        vhost: &str,
        perm: Perm,
        resource: &str,
    ) -> Result<(), MetaError> {
        let v = self
            .vhosts
            .get(vhost)
            .ok_or_else(|| vhost_not_found(vhost))?;
        let resource = if resource.is_empty() {
            DEFAULT_EXCHANGE_ALIAS
        } else {
            resource
        };
        let Some(p) = v.permissions.get(user) else {
            return Err(MetaError::permission_denied(format!(
                "access to vhost '{}' refused for user '{}'",
                shown(vhost),
                shown(user)
            )));
        };
        let pattern = match perm {
            Perm::Configure => &p.configure,
            Perm::Write => &p.write,
            Perm::Read => &p.read,
        };
        let granted =
            !pattern.is_empty() && Regex::new(pattern).is_ok_and(|re| re.is_match(resource));
        if granted {
            Ok(())
        } else {
            Err(MetaError::permission_denied(format!(
                "user '{}' has no {} permission on '{}' in vhost '{}'",
                shown(user),
                perm.as_str(),
                shown(resource),
                shown(vhost)
            )))
        }
    }

    // ---------------------------------------------------------------- apply

    /// Applies one committed command. On error nothing changed.
    pub fn apply(&mut self, cmd: MetaCommand) -> (Result<MetaReply, MetaError>, Vec<MetaEffect>) {
        // A committed command outside the bounds (only a faulty proposer makes one) changes
        // nothing, on every replica alike.
        if let Err(e) = cmd.validate() {
            return (Err(e), Vec::new());
        }
        let mut effects = Vec::new();
        let result = match cmd {
            MetaCommand::PutVhost { name } => self.put_vhost(name),
            MetaCommand::DeleteVhost { name } => self.delete_vhost(&name, &mut effects),
            MetaCommand::PutUser {
                name,
                password_hash,
                salt,
                tags,
            } => self.put_user(name, password_hash, salt, tags),
            MetaCommand::DeleteUser { name } => self.delete_user(&name),
            MetaCommand::SetPermissions {
                user,
                vhost,
                configure,
                write,
                read,
            } => self.set_permissions(
                user,
                &vhost,
                Permissions {
                    configure,
                    write,
                    read,
                },
            ),
            MetaCommand::DeclareExchange {
                vhost,
                name,
                kind,
                durable,
                auto_delete,
                internal,
                arguments,
                passive,
                owner,
            } => self.declare_exchange(
                &vhost,
                &name,
                &kind,
                durable,
                auto_delete,
                internal,
                arguments,
                passive,
                owner,
            ),
            MetaCommand::DeleteExchange {
                vhost,
                name,
                if_unused,
            } => self.delete_exchange(&vhost, &name, if_unused),
            MetaCommand::DeclareQueue {
                vhost,
                name,
                arguments,
                passive,
                nodes,
                owner,
                origin,
            } => self.declare_queue(
                &vhost,
                &name,
                arguments,
                passive,
                Placement { nodes, origin },
                owner,
                &mut effects,
            ),
            MetaCommand::DeleteQueue { vhost, name } => {
                self.delete_queue(&vhost, &name, &mut effects)
            }
            MetaCommand::Bind {
                vhost,
                queue,
                exchange,
                routing_key,
                arguments,
            } => self.bind(&vhost, queue, exchange, routing_key, arguments, true),
            MetaCommand::Unbind {
                vhost,
                queue,
                exchange,
                routing_key,
                arguments,
            } => self.bind(&vhost, queue, exchange, routing_key, arguments, false),
            MetaCommand::SetPolicy {
                vhost,
                name,
                pattern,
                apply_to,
                priority,
                definition,
            } => self.set_policy(
                &vhost,
                Policy {
                    name,
                    pattern,
                    apply_to,
                    priority,
                    definition,
                },
                &mut effects,
            ),
            MetaCommand::ClearPolicy { vhost, name } => {
                self.clear_policy(&vhost, &name, &mut effects)
            }
            MetaCommand::SetVhostLimits { vhost, limits } => self.set_vhost_limits(vhost, limits),
            MetaCommand::SetUserLimits { user, limits } => self.set_user_limits(user, limits),
            MetaCommand::SetQueueMembers {
                vhost,
                name,
                id,
                expected,
                members,
                learners,
            } => self.set_queue_members(
                &vhost,
                &name,
                id,
                &expected,
                members,
                learners,
                &mut effects,
            ),
            MetaCommand::JoinNode {
                id,
                address,
                cluster_address,
            } => self.join_node(id, address, cluster_address, &mut effects),
            MetaCommand::ForgetNode { id } => self.forget_node(id, &mut effects),
        };
        (result, effects)
    }

    fn join_node(
        &mut self,
        id: NodeId,
        address: String,
        cluster_address: String,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        if self.forgotten.contains(&id) {
            return Err(MetaError::failed_precondition(format!(
                "id: node {id} was forgotten; a forgotten id is never reused, choose a new one"
            )));
        }
        let addrs = NodeAddrs {
            address,
            cluster_address,
        };
        match self.joined.get(&id) {
            Some(known) if *known == addrs => return Ok(MetaReply::Ok),
            Some(_) => {
                return Err(MetaError::new(
                    ErrorKind::AlreadyExists,
                    format!("id: node {id} already joined with other addresses"),
                ));
            }
            None => {}
        }
        self.joined.insert(id, addrs);
        effects.push(MetaEffect::NodesChanged);
        Ok(MetaReply::Ok)
    }

    fn forget_node(
        &mut self,
        id: NodeId,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let holding: Vec<String> = self
            .queues()
            .filter(|q| q.replicas().any(|n| n == id))
            .take(10)
            .map(|q| format!("{}/{}", q.vhost, q.name))
            .collect();
        if !holding.is_empty() {
            return Err(MetaError::failed_precondition(format!(
                "id: node {id} still holds replicas of {} (shrink them first)",
                holding.join(", ")
            )));
        }
        self.joined.remove(&id);
        if self.forgotten.insert(id) {
            effects.push(MetaEffect::NodesChanged);
        }
        Ok(MetaReply::Ok)
    }

    fn vhost_mut(&mut self, vhost: &str) -> Result<&mut Vhost, MetaError> {
        self.vhosts
            .get_mut(vhost)
            .ok_or_else(|| vhost_not_found(vhost))
    }

    fn put_vhost(&mut self, name: String) -> Result<MetaReply, MetaError> {
        check_name("vhost", &name)?;
        self.vhosts
            .entry(name)
            .or_insert_with(Vhost::with_default_exchanges);
        Ok(MetaReply::Ok)
    }

    fn delete_vhost(
        &mut self,
        name: &str,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let vhost = self
            .vhosts
            .remove(name)
            .ok_or_else(|| vhost_not_found(name))?;
        self.vhost_limits.remove(name);
        for queue in vhost.queues.into_values() {
            self.queue_ids.remove(&queue.id);
            effects.push(MetaEffect::QueueDeleted(queue));
        }
        Ok(MetaReply::Ok)
    }

    fn put_user(
        &mut self,
        name: String,
        password_hash: Vec<u8>,
        salt: Vec<u8>,
        tags: Vec<String>,
    ) -> Result<MetaReply, MetaError> {
        check_name("user", &name)?;
        self.users.insert(
            name.clone(),
            User {
                name,
                password_hash,
                salt,
                tags,
            },
        );
        Ok(MetaReply::Ok)
    }

    fn delete_user(&mut self, name: &str) -> Result<MetaReply, MetaError> {
        self.users
            .remove(name)
            .ok_or_else(|| MetaError::not_found(format!("user '{name}' not found")))?;
        self.user_limits.remove(name);
        for vhost in self.vhosts.values_mut() {
            vhost.permissions.remove(name);
        }
        Ok(MetaReply::Ok)
    }

    fn set_permissions(
        &mut self,
        user: String,
        vhost: &str,
        permissions: Permissions,
    ) -> Result<MetaReply, MetaError> {
        if !self.users.contains_key(&user) {
            return Err(MetaError::not_found(format!("user '{user}' not found")));
        }
        compile("configure", &permissions.configure)?;
        compile("write", &permissions.write)?;
        compile("read", &permissions.read)?;
        self.vhost_mut(vhost)?.permissions.insert(user, permissions);
        Ok(MetaReply::Ok)
    }

    #[allow(clippy::too_many_arguments)]
    fn declare_exchange(
        &mut self,
        vhost: &str,
        name: &str,
        kind: &str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Table,
        passive: bool,
        owner: Option<String>,
    ) -> Result<MetaReply, MetaError> {
        let owned = owner.as_deref().map_or(0, |u| {
            self.count_owned(u, |v| v.exchanges.values().map(|x| &x.owner))
        });
        let user_limits = owner.as_deref().map(|u| self.user_limits(u));
        let vhost_limits = self.vhost_limits(vhost);
        let v = self.vhost_mut(vhost)?;
        if passive {
            return if is_default_exchange(name) || v.exchanges.contains_key(name) {
                Ok(MetaReply::Ok)
            } else {
                Err(exchange_not_found(vhost, name))
            };
        }
        if is_default_exchange(name) {
            return Err(default_exchange_refused());
        }
        check_name("exchange", name)?;
        let kind_parsed = ExchangeType::parse(kind)
            .ok_or_else(|| MetaError::invalid(format!("type: unknown exchange type '{kind}'")))?;
        if let Some(current) = v.exchanges.get(name) {
            let inequivalent = |arg: &str, received: &str, current: &str| {
                MetaError::failed_precondition(format!(
                    "inequivalent arg '{arg}' for exchange '{name}' in vhost '{vhost}': \
                     received '{received}' but current is '{current}'"
                ))
            };
            if current.kind != kind_parsed {
                return Err(inequivalent("type", kind, current.kind.as_str()));
            }
            for (arg, received, cur) in [
                ("durable", durable, current.durable),
                ("auto_delete", auto_delete, current.auto_delete),
                ("internal", internal, current.internal),
            ] {
                if received != cur {
                    return Err(inequivalent(arg, &received.to_string(), &cur.to_string()));
                }
            }
            for key in EXCHANGE_EQUIVALENCE_ARGS {
                let (received, cur) = (arguments.get(key), current.arguments.get(key));
                if received != cur {
                    let what = format!("exchange '{name}' in vhost '{vhost}'");
                    return Err(inequivalent_arg(&what, key, received, cur));
                }
            }
            return Ok(MetaReply::Ok);
        }
        check_not_reserved("exchange", name)?;
        // The predeclared `amq.*` exchanges do not count.
        let declared = v
            .exchanges
            .keys()
            .filter(|n| !n.starts_with("amq."))
            .count() as u64;
        vhost_limits.admit(Counted::Exchanges, Scope::Vhost(vhost), declared)?;
        if let (Some(u), Some(limits)) = (owner.as_deref(), user_limits) {
            limits.admit(Counted::Exchanges, Scope::User(u), owned)?;
        }
        v.exchanges.insert(
            name.to_string(),
            Exchange {
                name: name.to_string(),
                kind: kind_parsed,
                durable,
                auto_delete,
                internal,
                arguments,
                owner,
            },
        );
        Ok(MetaReply::Ok)
    }

    fn delete_exchange(
        &mut self,
        vhost: &str,
        name: &str,
        if_unused: bool,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        if is_default_exchange(name) {
            return Err(default_exchange_refused());
        }
        if name.starts_with("amq.") {
            return Err(MetaError::permission_denied(format!(
                "deletion of system exchange '{name}' in vhost '{vhost}' not allowed"
            )));
        }
        if !v.exchanges.contains_key(name) {
            return Err(exchange_not_found(vhost, name));
        }
        if if_unused && v.bindings_from(name).next().is_some() {
            return Err(MetaError::failed_precondition(format!(
                "exchange '{name}' in vhost '{vhost}' in use"
            )));
        }
        v.exchanges.remove(name);
        v.bindings.retain(|b| b.source != name);
        Ok(MetaReply::Ok)
    }

    // The fields of MetaCommand::DeclareQueue, passed through one by one.
    #[allow(clippy::too_many_arguments)]
    fn declare_queue(
        &mut self,
        vhost: &str,
        name: &str,
        arguments: Table,
        passive: bool,
        placement: Placement,
        owner: Option<String>,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let Placement { mut nodes, origin } = placement;
        nodes.sort_unstable();
        nodes.dedup();
        // Both scan every queue: only when they decide something (a declare with neither a
        // balanced locator nor a user limit must not cost time linear in the queues).
        let balanced = self.vhosts.get(vhost).is_some_and(|v| {
            let matching = policy::matching_policy(v.policies.values(), name);
            leader_locator(&arguments, matching) == Some("balanced")
        });
        let least_leading = if balanced {
            self.least_leading(&nodes)
        } else {
            0
        };
        let next_id = self.next_queue_id;
        let owned = owner
            .as_deref()
            .filter(|u| self.user_limits.contains_key(*u))
            .map_or(0, |u| {
                self.count_owned(u, |v| v.queues.values().map(|q| &q.owner))
            });
        let user_limits = owner.as_deref().map(|u| self.user_limits(u));
        let vhost_limits = self.vhost_limits(vhost);
        let v = self.vhost_mut(vhost)?;
        if passive {
            return match v.queues.get(name) {
                Some(q) => Ok(MetaReply::QueueDeclared {
                    queue: q.clone(),
                    created: false,
                }),
                None => Err(queue_not_found(vhost, name)),
            };
        }
        check_name("queue", name)?;
        if let Some(current) = v.queues.get(name) {
            check_equivalent(vhost, name, &current.arguments, &arguments)?;
            return Ok(MetaReply::QueueDeclared {
                queue: current.clone(),
                created: false,
            });
        }
        check_not_reserved("queue", name)?;
        policy::validate_queue_arguments(&arguments)?;
        vhost_limits
            .admit(Counted::Queues, Scope::Vhost(vhost), v.queues.len() as u64)
            .map_err(|e| declare_refused(name, e))?;
        if let (Some(u), Some(limits)) = (owner.as_deref(), user_limits) {
            limits
                .admit(Counted::Queues, Scope::User(u), owned)
                .map_err(|e| declare_refused(name, e))?;
        }
        let matching = policy::matching_policy(v.policies.values(), name);
        let config = policy::effective_config(vhost, name, &arguments, matching);
        policy::check_declared_strategy(&arguments, &config)?;
        let locator = leader_locator(&arguments, matching).map(str::to_string);

        if nodes.is_empty() {
            return Err(MetaError::failed_precondition(
                "no cluster nodes to place the queue on",
            ));
        }
        let group_size = arguments
            .get("x-quorum-initial-group-size")
            .and_then(Value::as_i64)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(DEFAULT_GROUP_SIZE)
            .min(nodes.len());
        let first = match locator.as_deref() {
            Some("client-local") => origin.and_then(|o| nodes.iter().position(|n| *n == o)),
            Some("balanced") => Some(least_leading),
            _ => None,
        };
        let start = first.unwrap_or((next_id % nodes.len() as u64) as usize);
        let members = (0..group_size)
            .map(|i| nodes[(start + i) % nodes.len()])
            .collect();

        let queue = QueueMeta {
            id: next_id,
            vhost: vhost.to_string(),
            name: name.to_string(),
            arguments,
            members,
            config,
            owner,
            learners: Vec::new(),
        };
        v.queues.insert(name.to_string(), queue.clone());
        self.queue_ids
            .insert(next_id, (vhost.to_string(), name.to_string()));
        self.next_queue_id += 1;
        effects.push(MetaEffect::QueueCreated(queue.clone()));
        Ok(MetaReply::QueueDeclared {
            queue,
            created: true,
        })
    }

    /// The index in `nodes` (sorted) of the node that is the first member (initial or
    /// rebalanced leader) of the fewest queues; the lowest id on a tie. Replicated state only.
    fn least_leading(&self, nodes: &[NodeId]) -> usize {
        let mut led: BTreeMap<NodeId, usize> = nodes.iter().map(|n| (*n, 0)).collect();
        for q in self.queues() {
            if let Some(c) = q.members.first().and_then(|f| led.get_mut(f)) {
                *c += 1;
            }
        }
        let mut best = 0;
        for (i, n) in nodes.iter().enumerate() {
            if led[n] < led[&nodes[best]] {
                best = i;
            }
        }
        best
    }

    #[allow(clippy::too_many_arguments)]
    fn set_queue_members(
        &mut self,
        vhost: &str,
        name: &str,
        id: QueueId,
        expected: &[NodeId],
        members: Vec<NodeId>,
        learners: Vec<NodeId>,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        let Some(q) = v.queues.get_mut(name).filter(|q| q.id == id) else {
            return Err(queue_not_found(vhost, name));
        };
        if q.members != expected {
            return Err(MetaError::failed_precondition(format!(
                "queue '{name}' in vhost '{vhost}': its members changed meanwhile \
                 (now {:?}, expected {expected:?}); try again",
                q.members
            )));
        }
        if members.is_empty() {
            return Err(MetaError::failed_precondition(format!(
                "queue '{name}' in vhost '{vhost}': cannot remove its last member"
            )));
        }
        let mut seen = BTreeSet::new();
        if let Some(n) = members.iter().chain(&learners).find(|n| !seen.insert(**n)) {
            return Err(MetaError::invalid(format!(
                "members: node {n} is listed twice (members and learners are distinct)"
            )));
        }
        q.members = members;
        q.learners = learners;
        effects.push(MetaEffect::QueueMembersChanged(q.clone()));
        Ok(MetaReply::Ok)
    }

    /// How many of the objects `of` lists in every vhost belong to `user`.
    fn count_owned<'a, I>(&'a self, user: &str, of: impl Fn(&'a Vhost) -> I) -> u64
    where
        I: Iterator<Item = &'a Option<String>>,
    {
        self.vhosts
            .values()
            .flat_map(of)
            .filter(|o| o.as_deref() == Some(user))
            .count() as u64
    }

    fn set_vhost_limits(&mut self, vhost: String, limits: Limits) -> Result<MetaReply, MetaError> {
        if !self.vhosts.contains_key(&vhost) {
            return Err(vhost_not_found(&vhost));
        }
        if limits.is_unlimited() {
            self.vhost_limits.remove(&vhost);
        } else {
            self.vhost_limits.insert(vhost, limits);
        }
        Ok(MetaReply::Ok)
    }

    fn set_user_limits(&mut self, user: String, limits: Limits) -> Result<MetaReply, MetaError> {
        if !self.users.contains_key(&user) {
            return Err(MetaError::not_found(format!("user '{user}' not found")));
        }
        if limits.is_unlimited() {
            self.user_limits.remove(&user);
        } else {
            self.user_limits.insert(user, limits);
        }
        Ok(MetaReply::Ok)
    }

    fn delete_queue(
        &mut self,
        vhost: &str,
        name: &str,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        let queue = v
            .queues
            .remove(name)
            .ok_or_else(|| queue_not_found(vhost, name))?;
        v.remove_bindings(|b| b.destination == name);
        self.queue_ids.remove(&queue.id);
        effects.push(MetaEffect::QueueDeleted(queue.clone()));
        Ok(MetaReply::QueueDeleted { queue })
    }

    fn bind(
        &mut self,
        vhost: &str,
        queue: String,
        exchange: String,
        routing_key: String,
        arguments: Table,
        add: bool,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        if is_default_exchange(&exchange) {
            return Err(default_exchange_refused());
        }
        let kind = v
            .exchanges
            .get(&exchange)
            .ok_or_else(|| exchange_not_found(vhost, &exchange))?
            .kind;
        if !v.queues.contains_key(&queue) {
            return Err(queue_not_found(vhost, &queue));
        }
        let binding = Binding {
            source: exchange,
            destination: queue,
            routing_key,
            arguments,
        };
        if add {
            route::validate_binding_arguments(kind, &binding.arguments)?;
            v.bindings.insert(binding);
        } else {
            v.remove_bindings(|b| *b == binding);
        }
        Ok(MetaReply::Ok)
    }

    fn set_policy(
        &mut self,
        vhost: &str,
        policy: Policy,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        check_name("policy", &policy.name)?;
        compile("pattern", &policy.pattern)?;
        if !policy::valid_apply_to(&policy.apply_to) {
            return Err(MetaError::invalid(format!(
                "apply_to: expected all, queues, quorum_queues or exchanges, got '{}'",
                policy.apply_to
            )));
        }
        policy::validate_policy_definition(&policy.definition)?;
        v.policies.insert(policy.name.clone(), policy);
        recompute_configs(vhost, v, effects);
        Ok(MetaReply::Ok)
    }

    fn clear_policy(
        &mut self,
        vhost: &str,
        name: &str,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        v.policies.remove(name).ok_or_else(|| {
            MetaError::not_found(format!("no policy '{name}' in vhost '{vhost}'"))
        })?;
        recompute_configs(vhost, v, effects);
        Ok(MetaReply::Ok)
    }
}

/// A new queue's leader locator: the argument wins over the policy (RabbitMQ's
/// rabbit_queue_location).
fn leader_locator<'a>(arguments: &'a Table, matching: Option<&'a Policy>) -> Option<&'a str> {
    arguments
        .get("x-queue-leader-locator")
        .or_else(|| matching.and_then(|p| p.definition.get("queue-leader-locator")))
        .and_then(Value::as_str)
}

/// Recomputes the effective configuration of every queue of `v` and reports those that changed.
fn recompute_configs(vhost: &str, v: &mut Vhost, effects: &mut Vec<MetaEffect>) {
    for queue in v.queues.values_mut() {
        let config = policy::effective_config(
            vhost,
            &queue.name,
            &queue.arguments,
            policy::matching_policy(v.policies.values(), &queue.name),
        );
        if config != queue.config {
            queue.config = config;
            effects.push(MetaEffect::QueueConfigChanged(queue.clone()));
        }
    }
}

/// A redeclare must carry the same value (or the same absence) for every argument quorumq
/// interprets; `x-queue-type` absent means `quorum`.
fn check_equivalent(
    vhost: &str,
    name: &str,
    current: &Table,
    received: &Table,
) -> Result<(), MetaError> {
    let quorum = Value::String("quorum".into());
    for key in policy::known_argument_names() {
        let normalize = |t: &'_ Table| -> Option<Value> {
            match t.get(&key) {
                None if key == "x-queue-type" => Some(quorum.clone()),
                other => other.cloned(),
            }
        };
        let (cur, rec) = (normalize(current), normalize(received));
        if cur != rec {
            let what = format!("queue '{name}' in vhost '{vhost}'");
            return Err(inequivalent_arg(&what, &key, rec.as_ref(), cur.as_ref()));
        }
    }
    Ok(())
}

/// The exchange arguments a redeclare must repeat: RabbitMQ compares only
/// `alternate-exchange` (`rabbit_exchange:assert_args_equivalence`).
const EXCHANGE_EQUIVALENCE_ARGS: [&str; 1] = ["alternate-exchange"];

/// RabbitMQ's refusal of a redeclare whose argument `key` differs (`rabbit_misc:
/// equivalence_fail`); `what` names the queue or exchange and its vhost.
fn inequivalent_arg(
    what: &str,
    key: &str,
    received: Option<&Value>,
    current: Option<&Value>,
) -> MetaError {
    MetaError::failed_precondition(format!(
        "inequivalent arg '{key}' for {what}: received {} but current is {}",
        show_arg(received),
        show_arg(current)
    ))
}
