//! Who is calling and what they may do: the only place the client API decides permissions.
//!
//! **Authentication.** A request carries HTTP Basic credentials in its `authorization`
//! metadata; without them it acts as `guest`. Users named in `loopback_users` (default
//! `guest`) are accepted only from a loopback peer address, as RabbitMQ's `loopback_users`; an
//! unknown peer address counts as remote. Basic credentials from a remote peer over plain text
//! are refused unless the client port serves TLS or `allow_plaintext_auth` is set. Passwords
//! are stored as Argon2id PHC strings (hashed here, on the proposing node, by
//! [`hash_new_password`]); a verify costs about 20 ms and 19 MiB, and gRPC sends credentials on
//! every call, so verified credentials are cached for [`VERIFIED_TTL`] keyed by user, SHA-256
//! of the password (compared in constant time) and a digest of the user's stored record (a
//! password change or a deleted user misses). Misses verify in `spawn_blocking` behind a
//! semaphore of [`MAX_CONCURRENT_VERIFIES`], one at a time per user and password: requests
//! that miss together wait for that one verify and read its result from the cache (when the
//! entry expired under a client with 64 requests in flight, each ran its own Argon2id: over a
//! second of CPU every 15 s, which halved the declare rate of `qq-bench` scenario 12 whenever
//! it fell in the measured window). A wrong password is logged at WARN with the peer.
//! The management page's login form ([`Auth::login_http`]) goes through the same checks and the
//! same verify bound; its transport is always plain HTTP.
//!
//! **Authorization.** Permission checks read the metadata view; grants that passed are cached
//! for one metadata version (compiling the permission regexes on every publish was the top cost
//! in a profile). A vhost is *visible* to a caller who has any permission in it, or is an
//! administrator; a vhost that is not visible (existing or not) answers PERMISSION_DENIED, so
//! its existence does not leak.
//!
//! The rooms: `login` authenticates (credentials from each transport, the loopback and plain
//! text rules); `passwords` hashes and verifies passwords with the verified-credentials
//! cache; `permissions` decides visibility and permissions with the grant cache. This file
//! holds [`Auth`] and the caller types the handlers see.
//!
//! Must not: propose anything, or let a handler skip a check by calling the domain directly.

mod login;
mod passwords;
mod permissions;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tokio::sync::{Semaphore, watch};

use self::passwords::Verified;
pub use self::passwords::{MAX_CONCURRENT_VERIFIES, VERIFIED_TTL, hash_new_password};
use self::permissions::Grant;
use super::conn::Connections;
use crate::clock::Clock;
use crate::meta_view::MetaView;

/// The authentication settings of the client port.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// Users that may connect only from a loopback address (config `loopback_users`).
    pub loopback_users: Vec<String>,
    /// Accept Basic credentials over plain text from remote peers (config
    /// `allow_plaintext_auth`).
    pub allow_plaintext_auth: bool,
    /// Whether the client port serves TLS (then Basic credentials are never plain text).
    pub client_tls: bool,
}

pub struct Auth {
    view: MetaView,
    /// Whether this node's metadata has caught up ([`crate::node::Node::meta_synced`]).
    synced: watch::Receiver<bool>,
    settings: AuthSettings,
    /// Permission checks that passed, valid for one metadata version.
    granted: Mutex<(u64, HashSet<Grant>)>,
    /// User → the last password verified for it.
    verified: Mutex<HashMap<String, Verified>>,
    verifies: Arc<Semaphore>,
    /// Verifies in flight, by SHA-256 of user and password: the turn each waits for. An entry
    /// lives while a request holds it, so there are at most as many as requests in flight.
    verifying: Mutex<HashMap<[u8; 32], Arc<tokio::sync::Mutex<()>>>>,
    /// Argon2id verifies run (for the tests).
    argon2_runs: AtomicU64,
    /// Connections per user and per vhost are counted here, as requests authenticate and name
    /// vhosts.
    conns: Arc<Connections>,
    /// The node's clock: how old a verified password is.
    clock: Clock,
}

/// A caller this process authenticated already, carried in a request's extensions by an
/// in-process adapter (the AMQP listener calls the same handlers as gRPC). Extensions are
/// never filled from the wire, so a remote client cannot set it.
#[derive(Debug, Clone)]
pub struct Authenticated(pub Caller);

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: String,
    /// The connection the request came on (unknown: not counted toward connection limits).
    pub peer: Option<SocketAddr>,
}

/// Whether a peer address is loopback (IPv4-mapped IPv6 included); unknown counts as remote.
pub fn is_loopback(peer: Option<SocketAddr>) -> bool {
    match peer.map(|a| a.ip()) {
        Some(IpAddr::V4(ip)) => ip.is_loopback(),
        Some(IpAddr::V6(ip)) => ip
            .to_ipv4_mapped()
            .map_or(ip.is_loopback(), |v4| v4.is_loopback()),
        None => false,
    }
}

impl Auth {
    pub fn new(
        view: MetaView,
        synced: watch::Receiver<bool>,
        settings: AuthSettings,
        conns: Arc<Connections>,
        clock: Clock,
    ) -> Auth {
        Auth {
            view,
            synced,
            settings,
            granted: Mutex::new((0, HashSet::new())),
            verified: Mutex::new(HashMap::new()),
            verifies: Arc::new(Semaphore::new(MAX_CONCURRENT_VERIFIES)),
            verifying: Mutex::new(HashMap::new()),
            argon2_runs: AtomicU64::new(0),
            conns,
            clock,
        }
    }

    /// The metadata view the checks read.
    pub fn view(&self) -> &MetaView {
        &self.view
    }
}

#[cfg(test)]
mod tests;
