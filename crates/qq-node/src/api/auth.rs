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
//! Must not: propose anything, or let a handler skip a check by calling the domain directly.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::{Argon2, PasswordHasher};
use base64::Engine;
use qq_core::meta::{MetaCommand, MetaState, Perm, User};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::{Semaphore, watch};
use tonic::{Request, Status};
use tracing::warn;

use super::conn::Connections;
use super::convert::bounded;
use super::convert::meta_error_to_status;
use crate::meta_view::MetaView;
use qq_core::names::shown;

/// Cached grants, at most; the cache is emptied when full or when the metadata changes.
const GRANT_CACHE_BOUND: usize = 10_000;
/// Cached verified credentials, at most (one per user); full: expired entries go, then all.
const VERIFIED_CACHE_BOUND: usize = 10_000;
/// How long a verified password is trusted without verifying it again (RabbitMQ's auth cache:
/// 15 s).
pub const VERIFIED_TTL: Duration = Duration::from_secs(15);
/// Password verifies running at once, at most (each allocates 19 MiB for Argon2id).
pub const MAX_CONCURRENT_VERIFIES: usize = 2;

type Grant = (String, String, u8, String);

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

/// A verified password, trusted until `at + VERIFIED_TTL`.
struct Verified {
    password_digest: [u8; 32],
    record_digest: [u8; 32],
    at: Instant,
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
}

/// Where credentials came from ([`Auth::authenticate`]).
#[derive(Debug, Clone, Copy)]
enum Transport {
    /// The gRPC client port; `basic`: the request carried Basic credentials.
    ClientPort { basic: bool },
    /// The management page's login form on `http_addr` (always plain HTTP).
    Http,
    /// An AMQP 0-9-1 connection's start-ok (`tls`: on `amqps_addr`).
    Amqp { tls: bool },
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

/// The `PutUser` command for a new password: Argon2id with the crate's (OWASP's) defaults and a
/// random salt, as a PHC string. Runs on the proposing node (the state machine stays
/// deterministic); costs about 20 ms, so call it from `spawn_blocking`.
pub fn hash_new_password(
    name: String,
    password: &str,
    tags: Vec<String>,
) -> Result<MetaCommand, Status> {
    let phc = Argon2::default()
        .hash_password(password.as_bytes())
        .map_err(|e| Status::internal(format!("password: hashing failed: {e}")))?
        .to_string();
    Ok(MetaCommand::PutUser {
        name,
        password_hash: phc.into_bytes(),
        salt: Vec::new(),
        tags,
    })
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

/// The record an unknown user's password is verified against, to spend a known user's time:
/// an Argon2id hash with the parameters [`hash_new_password`] uses, of a password nobody
/// sends (its result is ignored anyway).
fn unknown_user(name: &str) -> User {
    User {
        name: name.to_string(),
        password_hash: UNKNOWN_USER_HASH.as_bytes().to_vec(),
        salt: Vec::new(),
        tags: Vec::new(),
    }
}

/// Argon2id (m=19456, t=2, p=1, the crate's defaults, as every stored password) of a random
/// 32-byte secret that was thrown away.
const UNKNOWN_USER_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c2R1bW15c2FsdHF1b3J1bXE$0HOB2UNGGoOYHRJo3BGvn2vaJPSBkzkUZxtAaxAmIVo";

fn record_digest(u: &User) -> [u8; 32] {
    sha256(&[&u.password_hash, &u.salt])
}

/// Basic credentials from the `authorization` metadata, if any.
fn basic_credentials<T>(req: &Request<T>) -> Result<Option<(String, String)>, Status> {
    let Some(v) = req.metadata().get("authorization") else {
        return Ok(None);
    };
    let v = v
        .to_str()
        .map_err(|_| Status::unauthenticated("authorization: not ASCII"))?;
    let b64 = v.strip_prefix("Basic ").ok_or_else(|| {
        Status::unauthenticated("authorization: expected 'Basic base64(user:password)'")
    })?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| Status::unauthenticated("authorization: invalid base64"))?;
    let raw =
        String::from_utf8(raw).map_err(|_| Status::unauthenticated("authorization: not UTF-8"))?;
    let (u, p) = raw
        .split_once(':')
        .ok_or_else(|| Status::unauthenticated("authorization: expected user:password"))?;
    Ok(Some((u.to_string(), p.to_string())))
}

impl Auth {
    pub fn new(
        view: MetaView,
        synced: watch::Receiver<bool>,
        settings: AuthSettings,
        conns: Arc<Connections>,
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
        }
    }

    /// The metadata view the checks read.
    pub fn view(&self) -> &MetaView {
        &self.view
    }

    /// The authenticated caller: an in-process adapter's [`Authenticated`], Basic
    /// credentials, or `guest` without them.
    pub async fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        if let Some(Authenticated(caller)) = req.extensions().get::<Authenticated>() {
            return Ok(caller.clone());
        }
        let (user, password, basic) = match basic_credentials(req)? {
            Some((u, p)) => (u, p, true),
            None => ("guest".to_string(), "guest".to_string(), false),
        };
        self.authenticate(
            user,
            password,
            req.remote_addr(),
            Transport::ClientPort { basic },
        )
        .await
    }

    /// A login on the management page (`http_addr`, plain HTTP) by `peer`: the same rules and
    /// the same verification as the client port's (loopback-only users, no password over
    /// plain text from a remote address unless `allow_plaintext_auth`, Argon2id behind the
    /// verify bound, a wrong password logged with the peer). The caller it returns has no
    /// client-port connection (`peer` None), so nothing is counted toward connection limits.
    pub async fn login_http(
        &self,
        user: &str,
        password: String,
        peer: Option<SocketAddr>,
    ) -> Result<Caller, Status> {
        self.authenticate(user.to_string(), password, peer, Transport::Http)
            .await
    }

    /// An AMQP 0-9-1 login (PLAIN or AMQPLAIN credentials from connection.start-ok) by
    /// `peer`: the client port's rules (loopback-only users; a password over plain TCP from a
    /// remote address only with `allow_plaintext_auth`), counted toward the user's
    /// connections.
    pub async fn login_amqp(
        &self,
        user: String,
        password: String,
        peer: Option<SocketAddr>,
        tls: bool,
    ) -> Result<Caller, Status> {
        self.authenticate(user, password, peer, Transport::Amqp { tls })
            .await
    }

    /// An AMQP login by client certificate (SASL EXTERNAL, on `amqps_addr` with
    /// `tls_client_ca`): the TLS handshake verified the certificate; the user named by its
    /// subject's common name must exist. Counted toward the user's connections.
    pub fn login_amqp_external(
        &self,
        user: String,
        peer: Option<SocketAddr>,
    ) -> Result<Caller, Status> {
        self.require_synced()?;
        let shown_peer = peer.map_or_else(|| "unknown".to_string(), |a| a.to_string());
        self.refuse_remote_loopback_user(&user, peer, &shown_peer, "amqps")?;
        let state = self.view.current();
        if state.user(&user).is_none() {
            warn!(user = %user, peer = ?peer, via = "amqps", "login refused: certificate names no user");
            return Err(Status::unauthenticated(format!(
                "EXTERNAL: no user named by the certificate's common name '{}'",
                shown(&user)
            )));
        }
        self.conns
            .admit_user(peer, &user, state.user_limits(&user))?;
        Ok(Caller { user, peer })
    }

    /// Users, permissions and everything a request is about live in the metadata: until this
    /// node has caught up with the cluster's, it would answer from what it knew.
    fn require_synced(&self) -> Result<(), Status> {
        if *self.synced.borrow() {
            return Ok(());
        }
        Err(Status::unavailable(
            "this node is catching up on the cluster's metadata; retry, or use another node",
        ))
    }

    /// `loopback_users` may log in only from a loopback address, whatever the mechanism.
    fn refuse_remote_loopback_user(
        &self,
        user: &str,
        peer: Option<SocketAddr>,
        shown_peer: &str,
        via: &str,
    ) -> Result<(), Status> {
        if is_loopback(peer) || !self.settings.loopback_users.iter().any(|u| u == user) {
            return Ok(());
        }
        warn!(user = %user, peer = %shown_peer, via, "login refused: loopback-only user from a remote address");
        Err(Status::unauthenticated(format!(
            "user '{}' can only connect via localhost",
            shown(user)
        )))
    }

    async fn authenticate(
        &self,
        user: String,
        password: String,
        peer: Option<SocketAddr>,
        transport: Transport,
    ) -> Result<Caller, Status> {
        self.require_synced()?;
        let loopback = is_loopback(peer);
        let shown_peer = peer.map_or_else(|| "unknown".to_string(), |a| a.to_string());
        let via = match transport {
            Transport::ClientPort { .. } => "client port",
            Transport::Http => "http page",
            Transport::Amqp { .. } => "amqp",
        };
        self.refuse_remote_loopback_user(&user, peer, &shown_peer, via)?;
        let plain_text = match transport {
            Transport::ClientPort { basic } => basic && !self.settings.client_tls,
            Transport::Http => true,
            Transport::Amqp { tls } => !tls,
        };
        if plain_text && !loopback && !self.settings.allow_plaintext_auth {
            warn!(user = %user, peer = %shown_peer, via, "login refused: credentials over plain text");
            return Err(Status::unauthenticated(match transport {
                Transport::Amqp { .. } => {
                    "a password over plain AMQP from a non-loopback address is refused; use \
                     amqps or set allow_plaintext_auth = true"
                }
                Transport::ClientPort { .. } => {
                    "authorization: basic credentials over plain text from a non-loopback address \
                     are refused; use TLS on the client port or set allow_plaintext_auth = true"
                }
                Transport::Http => {
                    "login: the page is plain HTTP and a password from a non-loopback address is \
                     refused; reach it through loopback (e.g. an SSH tunnel) or set \
                     allow_plaintext_auth = true"
                }
            }));
        }
        if self.verify(&user, password).await? {
            match transport {
                Transport::ClientPort { .. } | Transport::Amqp { .. } => {
                    let limits = self.view.current().user_limits(&user);
                    self.conns.admit_user(peer, &user, limits)?;
                    Ok(Caller { user, peer })
                }
                Transport::Http => Ok(Caller { user, peer: None }),
            }
        } else {
            warn!(user = %user, peer = %shown_peer, via, "login refused: invalid credentials");
            Err(Status::unauthenticated(format!(
                "invalid credentials for user '{}'",
                shown(&user)
            )))
        }
    }

    /// A digest of `user`'s stored password record (None: no such user). A page session keeps
    /// the one of its login and ends when it changes (password changed, user deleted).
    pub fn credential_stamp(&self, user: &str) -> Option<[u8; 32]> {
        self.view.current().user(user).map(record_digest)
    }

    /// Whether `user` is tagged `administrator`.
    pub fn is_administrator(&self, state: &MetaState, user: &str) -> bool {
        Self::is_admin(state, user)
    }

    /// Whether `password` is `user`'s: from the cache, else verified off the async workers.
    async fn verify(&self, user: &str, password: String) -> Result<bool, Status> {
        let Some(record) = self.view.current().user(user).cloned() else {
            // An unknown user costs what a wrong password costs, one Argon2id verify (against
            // a hash no password matches here), so the time of the refusal does not tell
            // which user names exist.
            self.argon2_verify(unknown_user(user), password).await?;
            return Ok(false);
        };
        let password_digest = sha256(&[user.as_bytes(), password.as_bytes()]);
        let record_digest = record_digest(&record);
        if self.cached(user, &password_digest, &record_digest) {
            return Ok(true);
        }
        let turn = self
            .verifying
            .lock()
            .unwrap()
            .entry(password_digest)
            .or_default()
            .clone();
        let result = {
            let _turn = turn.lock().await;
            if self.cached(user, &password_digest, &record_digest) {
                Ok(true)
            } else {
                self.verify_now(user, password, record, password_digest, record_digest)
                    .await
            }
        };
        {
            let mut verifying = self.verifying.lock().unwrap();
            // Clones are taken under this lock: two holders are the map and this request.
            if Arc::strong_count(&turn) == 2 {
                verifying.remove(&password_digest);
            }
        }
        result
    }

    /// Whether `user`'s password with this digest was verified against this record less than
    /// [`VERIFIED_TTL`] ago.
    fn cached(&self, user: &str, password_digest: &[u8; 32], record_digest: &[u8; 32]) -> bool {
        let cache = self.verified.lock().unwrap();
        cache.get(user).is_some_and(|v| {
            v.at.elapsed() < VERIFIED_TTL
                && bool::from(v.password_digest.ct_eq(password_digest))
                && bool::from(v.record_digest.ct_eq(record_digest))
        })
    }

    /// Argon2id, off the async workers, behind the verify bound; a success is cached.
    async fn verify_now(
        &self,
        user: &str,
        password: String,
        record: User,
        password_digest: [u8; 32],
        record_digest: [u8; 32],
    ) -> Result<bool, Status> {
        let ok = self.argon2_verify(record, password).await?;
        if ok {
            let mut cache = self.verified.lock().unwrap();
            if cache.len() >= VERIFIED_CACHE_BOUND {
                cache.retain(|_, v| v.at.elapsed() < VERIFIED_TTL);
                if cache.len() >= VERIFIED_CACHE_BOUND {
                    cache.clear();
                }
            }
            cache.insert(
                user.to_string(),
                Verified {
                    password_digest,
                    record_digest,
                    at: Instant::now(),
                },
            );
        }
        Ok(ok)
    }

    /// `password` against `record`'s hash, off the async workers, behind the verify bound.
    async fn argon2_verify(&self, record: User, password: String) -> Result<bool, Status> {
        self.argon2_runs.fetch_add(1, Ordering::Relaxed);
        let permit = self
            .verifies
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Status::unavailable("authentication: node is shutting down"))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            record.verify_password(&password)
        })
        .await
        .map_err(|e| Status::internal(format!("authentication: verify failed: {e}")))
    }

    fn is_admin(state: &MetaState, user: &str) -> bool {
        state
            .user(user)
            .is_some_and(|u| u.tags.iter().any(|t| t == "administrator"))
    }

    /// Whether `caller` may see `vhost`: any permission in it, or an administrator.
    pub fn may_see(&self, state: &MetaState, caller: &Caller, vhost: &str) -> bool {
        Self::is_admin(state, &caller.user) || state.permissions(&caller.user, vhost).is_some()
    }

    /// OK for a visible vhost that exists; PERMISSION_DENIED for one the caller may not see
    /// (whether it exists or not); NOT_FOUND for a missing vhost an administrator names.
    pub fn require_visible(&self, caller: &Caller, vhost: &str) -> Result<(), Status> {
        bounded(&[("vhost", vhost)])?;
        let state = self.view.current();
        if !self.may_see(&state, caller, vhost) {
            return Err(refused(caller, vhost));
        }
        if !state.vhost_exists(vhost) {
            return Err(Status::not_found(format!(
                "vhost '{}' not found",
                shown(vhost)
            )));
        }
        self.conns
            .admit_vhost(caller.peer, vhost, state.vhost_limits(vhost))
    }

    /// `perm` on `resource` (an exchange or queue name) in `vhost`.
    pub fn check(
        &self,
        caller: &Caller,
        vhost: &str,
        perm: Perm,
        resource: &str,
    ) -> Result<(), Status> {
        let version = self.view.version();
        let key = (
            caller.user.clone(),
            vhost.to_string(),
            perm as u8,
            resource.to_string(),
        );
        {
            let mut granted = self.granted.lock().unwrap();
            if granted.0 != version || granted.1.len() > GRANT_CACHE_BOUND {
                *granted = (version, HashSet::new());
            } else if granted.1.contains(&key) {
                drop(granted);
                let limits = self.view.current().vhost_limits(vhost);
                return self.conns.admit_vhost(caller.peer, vhost, limits);
            }
        }
        let state = self.view.current();
        if !self.may_see(&state, caller, vhost) {
            return Err(refused(caller, vhost));
        }
        state
            .check_permission(&caller.user, vhost, perm, resource)
            .map_err(|e| meta_error_to_status(&e))?;
        self.conns
            .admit_vhost(caller.peer, vhost, state.vhost_limits(vhost))?;
        let mut granted = self.granted.lock().unwrap();
        // Remember the grant only if the metadata did not move on since the version was read.
        if granted.0 == version && self.view.version() == version {
            granted.1.insert(key);
        }
        Ok(())
    }

    pub fn require_admin(&self, caller: &Caller) -> Result<(), Status> {
        if Self::is_admin(&self.view.current(), &caller.user) {
            Ok(())
        } else {
            Err(Status::permission_denied(format!(
                "user '{}' is not an administrator",
                shown(&caller.user)
            )))
        }
    }
}

/// PERMISSION_DENIED for a vhost `caller` may not see, whether it exists or not.
fn refused(caller: &Caller, vhost: &str) -> Status {
    Status::permission_denied(format!(
        "access to vhost '{}' refused for user '{}'",
        shown(vhost),
        shown(&caller.user)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses() {
        let a = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
        assert!(is_loopback(a("127.0.0.1:1")));
        assert!(is_loopback(a("127.5.0.1:1")));
        assert!(is_loopback(a("[::1]:1")));
        assert!(is_loopback(a("[::ffff:127.0.0.1]:1")));
        assert!(!is_loopback(a("192.0.2.2:1")));
        assert!(!is_loopback(a("[::ffff:192.0.2.2]:1")));
        assert!(!is_loopback(None));
    }

    /// Checks over a fresh cluster's metadata (guest/guest), stored in `dir`.
    fn fresh_auth(dir: &std::path::Path) -> Auth {
        let store = qq_raft::store::Store::open(dir).unwrap();
        let (meta, _effects) = crate::groups::meta_sm::MetaMachine::new(store);
        Auth::new(
            MetaView::new(meta),
            watch::channel(true).1,
            AuthSettings {
                loopback_users: vec![],
                allow_plaintext_auth: true,
                client_tls: false,
            },
            Connections::new(16, 16),
        )
    }

    /// A client certificate (SASL EXTERNAL) naming a loopback-only user logs in only from a
    /// loopback address, as a password would; a name that is no user is refused.
    #[test]
    fn external_logins_keep_the_loopback_rule() {
        let dir = tempfile::tempdir().unwrap();
        let mut auth = fresh_auth(dir.path());
        auth.settings.loopback_users = vec!["guest".into()];
        let remote = Some("192.0.2.2:5000".parse().unwrap());
        let local = Some("127.0.0.1:5000".parse().unwrap());
        let refused = auth
            .login_amqp_external("guest".into(), remote)
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert!(refused.message().contains("only connect via localhost"));
        assert_eq!(
            auth.login_amqp_external("guest".into(), local)
                .unwrap()
                .user,
            "guest"
        );
        let nobody = auth
            .login_amqp_external("mallory".into(), local)
            .unwrap_err();
        assert_eq!(nobody.code(), tonic::Code::Unauthenticated);
    }

    /// Requests that miss the cache together (an expired entry under a client with many
    /// calls in flight) run one Argon2id verify between them, not one each; a wrong password
    /// is never taken from a right one's verify.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_misses_for_the_same_credentials_verify_once() {
        let dir = tempfile::tempdir().unwrap();
        let auth = Arc::new(fresh_auth(dir.path()));
        let calls: Vec<_> = (0..16)
            .map(|_| {
                let auth = auth.clone();
                tokio::spawn(async move { auth.verify("guest", "guest".into()).await })
            })
            .collect();
        for call in calls {
            assert!(call.await.unwrap().unwrap(), "guest/guest verifies");
        }
        assert_eq!(auth.argon2_runs.load(Ordering::Relaxed), 1);
        assert!(
            auth.verifying.lock().unwrap().is_empty(),
            "no turn left behind"
        );
        assert!(!auth.verify("guest", "wrong".into()).await.unwrap());
        assert_eq!(auth.argon2_runs.load(Ordering::Relaxed), 2);
    }

    /// An unknown user is refused after an Argon2id verify, as a wrong password is, so the
    /// refusal's timing does not tell which user names exist.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unknown_user_costs_an_argon2_verify_like_a_wrong_password() {
        let dir = tempfile::tempdir().unwrap();
        let auth = fresh_auth(dir.path());
        assert!(!auth.verify("nobody", "guest".into()).await.unwrap());
        assert_eq!(auth.argon2_runs.load(Ordering::Relaxed), 1);
        assert!(!auth.verify("guest", "wrong".into()).await.unwrap());
        assert_eq!(auth.argon2_runs.load(Ordering::Relaxed), 2);
        // The dummy parses, so a verify against it runs Argon2id in full.
        let dummy = unknown_user("x");
        let phc = std::str::from_utf8(&dummy.password_hash).unwrap();
        let parsed = argon2::PasswordHash::new(phc).unwrap();
        assert_eq!(parsed.algorithm.as_str(), "argon2id");
        assert_eq!(parsed.hash.map(|h| h.len()), Some(32));
    }

    #[test]
    fn put_user_stores_an_argon2id_phc_string_that_verifies() {
        let cmd = hash_new_password("bob".into(), "s3cret", vec![]).unwrap();
        let mut state = MetaState::new();
        let (reply, _) = state.apply(cmd);
        reply.unwrap();
        let bob = state.user("bob").unwrap();
        let phc = std::str::from_utf8(&bob.password_hash).unwrap();
        assert!(
            phc.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "stored: {phc}"
        );
        assert!(!bob.is_legacy_hash());
        assert!(bob.verify_password("s3cret"));
        assert!(!bob.verify_password("s3creT"));
        state.authenticate("bob", "s3cret").unwrap();
        // A random salt: the same password hashes differently every time.
        let again = hash_new_password("bob".into(), "s3cret", vec![]).unwrap();
        let MetaCommand::PutUser { password_hash, .. } = again else {
            unreachable!()
        };
        assert_ne!(password_hash, bob.password_hash);
    }
}
