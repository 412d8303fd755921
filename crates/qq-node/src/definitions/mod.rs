//! Definitions: the whole topology of the cluster as one JSON document, in RabbitMQ's layout
//! (`rabbitmqctl export_definitions`) where it fits, and its import.
//!
//! **Layout.** Top-level arrays `users` (`name`, `password_hash`, `hashing_algorithm`, `tags`),
//! `vhosts` (`name`), `permissions` (`user`, `vhost`, `configure`, `write`, `read`),
//! `exchanges` (`name`, `vhost`, `type`, `durable`, `auto_delete`, `internal`, `arguments`),
//! `queues` (`name`, `vhost`, `durable`, `auto_delete`, `arguments`, with `x-queue-type`
//! `quorum`), `bindings` (`source`, `vhost`, `destination`, `destination_type` `queue`,
//! `routing_key`, `arguments`) and `policies` (`vhost`, `name`, `pattern`, `apply-to`,
//! `definition`, `priority`); quorumq's own extras `quorumq_vhost_limits` (`vhost`, `limits`)
//! and `quorumq_user_limits` (`user`, `limits`), limits as in `qqctl set-vhost-limits`
//! (`max-queues`, `max-exchanges`, `max-connections`, `max-consumers`). A password hash is the
//! Argon2id PHC string the node stores ([`HASHING_ALGORITHM`]); records from before Argon2id
//! travel as [`LEGACY_HASHING_ALGORITHM`] (`base64(salt):base64(sha256)`). Argument values map
//! to JSON as strings, integers (long), booleans, floats (double), arrays and objects; bytes,
//! timestamps and non-finite doubles, which JSON lacks, as one-key objects `{"$bytes":
//! base64}`, `{"$timestamp": seconds}`, `{"$double": "NaN" | "inf" | "-inf"}`. The
//! predeclared `amq.*` exchanges are not exported (every vhost has them).
//!
//! **Import** ([`import`]) is all or nothing up front: the document is parsed (every error
//! names its JSON path, e.g. `queues[3].arguments.x-max-length: ...`), then every command is
//! applied to a *copy* of the current metadata, with the same pure [`MetaState::apply`] the
//! metadata group runs, so anything an individual RPC would refuse (an inequivalent queue
//! redeclare, a missing vhost, a bad argument or regex) refuses the document and nothing is
//! proposed. Only then are the commands proposed, one by one, skipping what is already there
//! identically; users, permissions, limits and policies that differ are replaced (as
//! RabbitMQ's import does), queues and exchanges are declared (an inequivalent one is an
//! error). So importing twice, or on every node at boot, is harmless. A metadata change by
//! someone else between the check and the proposals can still refuse a later command: the
//! error then says how many changes were applied before it.
//!
//! Bounds: a document of at most [`MAX_DEFINITIONS_BYTES`] (RESOURCE_EXHAUSTED past it); the
//! core's bounds on names, tables and nesting per command; at most [`MAX_REPORTED_ERRORS`]
//! errors in one refusal.
//!
//! The rooms: `error` says why an import failed, as a type (the gRPC adapter maps it to a
//! status); `parse` reads the document into commands (JSON paths in errors), `hashes`
//! checks the password hashes it carries, `import` checks the commands against a copy of the
//! metadata and then proposes them, `export` writes the metadata as a document.
//!
//! Must not: propose anything before the whole document has been checked.

mod error;
mod export;
mod hashes;
mod import;
mod parse;

use qq_core::meta::MetaCommand;

pub use self::error::{Cause, DefinitionsError};
pub use self::export::{export, value_to_json};
pub use self::hashes::{HashFields, put_user_with_hash, validate_phc};
pub use self::import::import;
pub use self::parse::value_from_json;

/// Largest document accepted, in bytes (import RPC and `definitions_file`).
pub const MAX_DEFINITIONS_BYTES: usize = 4 * 1024 * 1024;
/// At most this many errors are listed when a document is refused.
pub const MAX_REPORTED_ERRORS: usize = 10;
/// `hashing_algorithm` of an Argon2id PHC string (what quorumq stores).
pub const HASHING_ALGORITHM: &str = "quorumq_argon2id";
/// `hashing_algorithm` of a record from before Argon2id: `base64(salt):base64(sha256)`.
pub const LEGACY_HASHING_ALGORITHM: &str = "quorumq_legacy_sha256";
/// Bounds on an imported Argon2id hash's parameters, so a hash cannot make every login of
/// its user cost more than this: memory (KiB), passes, lanes.
pub const MAX_ARGON2_M_COST: u32 = 256 * 1024;
pub const MAX_ARGON2_T_COST: u32 = 16;
pub const MAX_ARGON2_P_COST: u32 = 16;

/// Top-level keys of RabbitMQ's files that carry nothing quorumq imports.
const IGNORED_KEYS: &[&str] = &[
    "rabbit_version",
    "rabbitmq_version",
    "product_name",
    "product_version",
    "quorumq_version",
];
/// Top-level keys quorumq has nothing for: accepted only empty.
const UNSUPPORTED_KEYS: &[&str] = &["parameters", "global_parameters", "topic_permissions"];

/// The kinds of item, in the order they are applied.
const KINDS: [&str; 10] = [
    "vhosts",
    "users",
    "permissions",
    "quorumq_vhost_limits",
    "quorumq_user_limits",
    "policies",
    "operator_policies",
    "exchanges",
    "queues",
    "bindings",
];

/// One item of the document as the command that puts it in place.
#[derive(Debug, Clone)]
pub struct Item {
    /// Its JSON path, e.g. `queues[3]`.
    pub path: String,
    /// Index into [`KINDS`].
    kind: usize,
    pub cmd: MetaCommand,
}

/// A parsed document: its items in the order they are applied.
#[derive(Debug, Clone, Default)]
pub struct Document {
    pub items: Vec<Item>,
}

/// What an import did, per kind: (kind, created, updated, unchanged).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub counts: Vec<(String, u64, u64, u64)>,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .counts
            .iter()
            .map(|(k, c, u, n)| format!("{k}: {c} created, {u} updated, {n} unchanged"))
            .collect();
        f.write_str(&parts.join("; "))
    }
}

fn invalid(path: &str, reason: impl std::fmt::Display) -> DefinitionsError {
    DefinitionsError::invalid(path, reason)
}
