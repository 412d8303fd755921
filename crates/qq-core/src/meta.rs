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
//! What it leaves out: strict priorities (`x-max-priority`),
//! exclusive/auto-delete queues (quorum queues are always durable), and the `internal` check on
//! publish, which the node does with [`MetaState::exchange`] because dead letters may be routed
//! through an internal exchange.

mod apply;
mod binding_order;
mod command;
mod exchange_bindings;
mod machine;
mod operator_policies;
mod queues;
mod routing;

use std::collections::{BTreeMap, BTreeSet};

use regex::Regex;
use serde::{Deserialize, Serialize};

pub use self::command::{
    MAX_COMMAND_ITEMS, MAX_TEXT_BYTES, MAX_VALUE_DEPTH, MetaCommand, check_table,
};
pub use self::machine::{
    FIRST_META_MACHINE_VERSION, META_MACHINE_VERSION, MetaExtras, MetaExtrasFormat1,
};
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
    /// Exchange-to-exchange bindings (`destination` is an exchange; metadata machine version
    /// 2). Left out of the state's encoding, which is release 0.1.0's: a snapshot carries them
    /// in its trailer ([`MetaExtras`]).
    #[serde(skip)]
    pub exchange_bindings: BTreeSet<Binding>,
    /// Operator policies by name (version 2; in the trailer likewise).
    #[serde(skip)]
    pub operator_policies: BTreeMap<String, Policy>,
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

    /// Bindings to queues whose source is `exchange`.
    fn bindings_from<'a>(&'a self, exchange: &'a str) -> impl Iterator<Item = &'a Binding> + 'a {
        from_source(&self.bindings, exchange)
    }

    /// Bindings to exchanges whose source is `exchange`.
    fn exchange_bindings_from<'a>(
        &'a self,
        exchange: &'a str,
    ) -> impl Iterator<Item = &'a Binding> + 'a {
        from_source(&self.exchange_bindings, exchange)
    }

    /// Whether `exchange` is the source of any binding (to a queue or an exchange).
    fn is_source(&self, exchange: &str) -> bool {
        self.bindings_from(exchange).next().is_some()
            || self.exchange_bindings_from(exchange).next().is_some()
    }

    /// Removes the bindings to queues matching `to_queue` and those to exchanges matching
    /// `to_exchange`, then deletes the auto-delete exchanges that were the source of one and
    /// are the source of none now (as RabbitMQ deletes an auto-delete exchange when its last
    /// binding goes), with the bindings to them, and so on up the chain.
    fn remove_bindings(
        &mut self,
        to_queue: impl Fn(&Binding) -> bool,
        to_exchange: impl Fn(&Binding) -> bool,
    ) {
        let mut sources: Vec<String> = self
            .bindings
            .iter()
            .filter(|b| to_queue(b))
            .chain(self.exchange_bindings.iter().filter(|b| to_exchange(b)))
            .map(|b| b.source.clone())
            .collect();
        self.bindings.retain(|b| !to_queue(b));
        self.exchange_bindings.retain(|b| !to_exchange(b));
        // Each round deletes an exchange or drops a name: bounded by the vhost's exchanges
        // and bindings.
        while let Some(source) = sources.pop() {
            let auto_delete = self.exchanges.get(&source).is_some_and(|x| x.auto_delete);
            if auto_delete && !self.is_source(&source) {
                self.exchanges.remove(&source);
                sources.extend(self.drop_bindings_to_exchange(&source));
            }
        }
    }

    /// Drops the bindings whose destination is exchange `name`; returns their sources.
    fn drop_bindings_to_exchange(&mut self, name: &str) -> Vec<String> {
        let sources = self
            .exchange_bindings
            .iter()
            .filter(|b| b.destination == name)
            .map(|b| b.source.clone())
            .collect();
        self.exchange_bindings.retain(|b| b.destination != name);
        sources
    }
}

/// The bindings of `set` whose source is `exchange` (the set is ordered by source first).
fn from_source<'a>(
    set: &'a BTreeSet<Binding>,
    exchange: &'a str,
) -> impl Iterator<Item = &'a Binding> + 'a {
    let lower = Binding {
        source: exchange.to_string(),
        destination: String::new(),
        routing_key: String::new(),
        arguments: Table::new(),
    };
    set.range(lower..).take_while(move |b| b.source == exchange)
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
    /// The metadata machine version the log runs (module `machine`); in the snapshot's
    /// trailer, not in this encoding.
    #[serde(skip, default = "machine::first")]
    machine_version: u32,
    /// Which data directory each node runs on ([`MetaCommand::RecordIncarnation`]); in the
    /// snapshot's trailer, not in this encoding.
    #[serde(skip)]
    incarnations: BTreeMap<NodeId, u64>,
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
            machine_version: FIRST_META_MACHINE_VERSION,
            incarnations: BTreeMap::new(),
        }
    }

    /// Nodes that joined the running cluster, with their addresses.
    pub fn joined_nodes(&self) -> &BTreeMap<NodeId, NodeAddrs> {
        &self.joined
    }

    /// Nodes forgotten (until they join again).
    pub fn forgotten_nodes(&self) -> &BTreeSet<NodeId> {
        &self.forgotten
    }

    /// The incarnation (data directory) node `id` recorded, if it did.
    pub fn incarnation(&self, id: NodeId) -> Option<u64> {
        self.incarnations.get(&id).copied()
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
}
