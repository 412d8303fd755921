//! Vhost and user limits, RabbitMQ's `set_vhost_limits` / `set_user_limits`: replicated in the
//! metadata, unlimited unless set.
//!
//! Queues and exchanges are counted by the metadata state machine at apply, so the limit holds
//! cluster-wide even when declares race on different nodes. Connections and consumers live on
//! the nodes, not in any log: each node counts its own and refuses past the limit (see
//! `qq-node`'s `api::conn`), so for those the limit is per node.
//!
//! What it leaves out: RabbitMQ's `max-channels` (a gRPC connection has streams, bounded per
//! connection by the node config `max_streams_per_connection`).

use serde::{Deserialize, Serialize};

use crate::error::MetaError;

/// Limits of one vhost or one user. `None` is unlimited; `Some(0)` refuses every new one (for
/// a vhost's connections: RabbitMQ's way to block a vhost).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_queues: Option<u64>,
    pub max_exchanges: Option<u64>,
    pub max_connections: Option<u64>,
    pub max_consumers: Option<u64>,
}

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    Queues,
    Exchanges,
    Connections,
    Consumers,
}

impl Counted {
    /// The limit's name, as RabbitMQ writes it (`max-queues`).
    pub fn limit_name(self) -> &'static str {
        match self {
            Counted::Queues => "max-queues",
            Counted::Exchanges => "max-exchanges",
            Counted::Connections => "max-connections",
            Counted::Consumers => "max-consumers",
        }
    }
    fn noun(self) -> &'static str {
        match self {
            Counted::Queues => "queue",
            Counted::Exchanges => "exchange",
            Counted::Connections => "connection",
            Counted::Consumers => "consumer",
        }
    }
}

/// Whose limit it is, for the error message.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    Vhost(&'a str),
    User(&'a str),
}

impl Limits {
    pub fn get(&self, counted: Counted) -> Option<u64> {
        match counted {
            Counted::Queues => self.max_queues,
            Counted::Exchanges => self.max_exchanges,
            Counted::Connections => self.max_connections,
            Counted::Consumers => self.max_consumers,
        }
    }

    pub fn is_unlimited(&self) -> bool {
        *self == Limits::default()
    }

    /// RESOURCE_EXHAUSTED when `current` (the count before adding one) is at the limit.
    pub fn admit(&self, counted: Counted, scope: Scope<'_>, current: u64) -> Result<(), MetaError> {
        match self.get(counted) {
            Some(max) if current >= max => Err(MetaError::resource_exhausted(format!(
                "{} limit ({}) {} is reached",
                counted.noun(),
                counted.limit_name(),
                match scope {
                    Scope::Vhost(v) => format!("in vhost '{v}' ({max})"),
                    Scope::User(u) => format!("of user '{u}' ({max})"),
                }
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn admit_refuses_at_the_limit_and_names_it() {
        let limits = Limits {
            max_queues: Some(2),
            ..Limits::default()
        };
        assert!(limits.admit(Counted::Queues, Scope::Vhost("v"), 1).is_ok());
        let e = limits
            .admit(Counted::Queues, Scope::Vhost("v"), 2)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::ResourceExhausted);
        assert_eq!(
            e.message,
            "queue limit (max-queues) in vhost 'v' (2) is reached"
        );
        // Unset limits admit anything.
        assert!(
            limits
                .admit(Counted::Exchanges, Scope::User("u"), u64::MAX)
                .is_ok()
        );
        let e = Limits {
            max_connections: Some(0),
            ..Limits::default()
        }
        .admit(Counted::Connections, Scope::User("u"), 0)
        .unwrap_err();
        assert_eq!(
            e.message,
            "connection limit (max-connections) of user 'u' (0) is reached"
        );
    }
}
