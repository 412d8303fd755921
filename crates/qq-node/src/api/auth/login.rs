//! Authentication: who is calling, from the credentials each transport brings (gRPC Basic
//! metadata or `guest`, the management page's form, AMQP PLAIN/AMQPLAIN or a client
//! certificate), under the loopback-only and plain-text rules.

use std::net::SocketAddr;

use base64::Engine;
use qq_core::names::shown;
use tonic::{Request, Status};
use tracing::warn;

use super::{Auth, Authenticated, Caller, is_loopback};

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
}
