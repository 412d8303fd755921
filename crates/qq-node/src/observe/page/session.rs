//! The management page's login sessions: a random 128-bit token in an `HttpOnly`,
//! `SameSite=Strict` cookie, mapped here to the user who logged in.
//!
//! Bounds: at most [`MAX_SESSIONS`] sessions per node. A login at the bound first drops the
//! sessions idle past [`SESSION_IDLE`]; if all are still live, it ends the least recently used
//! one (logged at WARN: that user must log in again), so a flood of logins cannot lock every
//! operator out, and memory stays bounded. A session idle for [`SESSION_IDLE`] ends; so does
//! one whose user was deleted or whose password changed (the credential stamp differs).
//! Sessions live in this node's memory only: a restart logs everyone out, and each node has
//! its own.
//!
//! Must not: keep a password, or hand a session to a token it did not issue.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use crate::clock::Clock;

/// Sessions per node, at most (see the module doc for what happens at the bound).
pub const MAX_SESSIONS: usize = 1024;
/// A session unused this long ends.
pub const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// The cookie that carries the token.
pub const COOKIE: &str = "qq_session";

struct Session {
    user: String,
    stamp: [u8; 32],
    last_used: Instant,
    /// Order of last use (a counter: instants can tie), for ending the least recently used.
    last_use: u64,
}

/// One node's page sessions.
pub struct Sessions {
    inner: Mutex<Inner>,
    idle: Duration,
    bound: usize,
    /// The node's clock: how long a session was idle.
    clock: Clock,
}

#[derive(Default)]
struct Inner {
    sessions: HashMap<String, Session>,
    uses: u64,
}

/// A new random token: 128 bits from the thread's CSPRNG (ChaCha, seeded by the OS), in hex.
fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl Sessions {
    pub fn new(clock: Clock) -> Sessions {
        Sessions::with_bounds(MAX_SESSIONS, SESSION_IDLE, clock)
    }

    fn with_bounds(bound: usize, idle: Duration, clock: Clock) -> Sessions {
        Sessions {
            inner: Mutex::new(Inner::default()),
            idle,
            bound,
            clock,
        }
    }

    /// A session for `user`, whose stored credentials have `stamp`; returns its token.
    pub fn create(&self, user: &str, stamp: [u8; 32]) -> String {
        let mut inner = self.inner.lock().unwrap();
        inner.uses += 1;
        let last_use = inner.uses;
        let sessions = &mut inner.sessions;
        if sessions.len() >= self.bound {
            sessions.retain(|_, s| self.clock.elapsed(s.last_used) < self.idle);
        }
        if sessions.len() >= self.bound
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.last_use)
                .map(|(t, _)| t.clone())
        {
            if let Some(s) = sessions.remove(&oldest) {
                warn!(
                    user = %s.user,
                    max_sessions = self.bound,
                    "page: at max sessions; ended the least recently used session"
                );
            }
        }
        let mut token = new_token();
        while sessions.contains_key(&token) {
            token = new_token();
        }
        sessions.insert(
            token.clone(),
            Session {
                user: user.to_string(),
                stamp,
                last_used: self.clock.now(),
                last_use,
            },
        );
        token
    }

    /// The user of the session `token`, if it is live and `current_stamp` (the user's stored
    /// credentials now; None: the user is gone) is still the one it logged in with. Marks it
    /// used; ends it if not live.
    pub fn user(
        &self,
        token: &str,
        current_stamp: impl FnOnce(&str) -> Option<[u8; 32]>,
    ) -> Option<String> {
        let mut inner = self.inner.lock().unwrap();
        inner.uses += 1;
        let last_use = inner.uses;
        let s = inner.sessions.get_mut(token)?;
        if self.clock.elapsed(s.last_used) >= self.idle || current_stamp(&s.user) != Some(s.stamp) {
            inner.sessions.remove(token);
            return None;
        }
        s.last_used = self.clock.now();
        s.last_use = last_use;
        Some(s.user.clone())
    }

    /// Ends the session `token` (logout).
    pub fn end(&self, token: &str) {
        self.inner.lock().unwrap().sessions.remove(token);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap().sessions.len()
    }
}

/// The session token in a `Cookie` header value, if any.
pub fn token_from_cookies(header: &str) -> Option<&str> {
    header
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
        .filter(|v| v.len() == 32 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The `Set-Cookie` value that hands out `token`.
pub fn set_cookie(token: &str) -> String {
    format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/")
}

/// The `Set-Cookie` value that removes the cookie.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAMP: [u8; 32] = [7; 32];

    #[test]
    fn a_session_finds_its_user_until_logout_or_a_credential_change() {
        let sessions = Sessions::new(Clock::system());
        let token = sessions.create("alice", STAMP);
        assert_eq!(token.len(), 32);
        assert_ne!(token, sessions.create("alice", STAMP), "tokens are random");
        assert_eq!(
            sessions.user(&token, |_| Some(STAMP)).as_deref(),
            Some("alice")
        );
        assert_eq!(
            sessions.user("0123456789abcdef0123456789abcdef", |_| Some(STAMP)),
            None
        );
        // Password changed: the session ends for good.
        assert_eq!(sessions.user(&token, |_| Some([8; 32])), None);
        assert_eq!(sessions.user(&token, |_| Some(STAMP)), None);
        let token = sessions.create("bob", STAMP);
        assert_eq!(sessions.user(&token, |_| None), None, "user deleted");
        let token = sessions.create("carol", STAMP);
        sessions.end(&token);
        assert_eq!(sessions.user(&token, |_| Some(STAMP)), None);
    }

    #[test]
    fn idle_sessions_expire() {
        let sessions = Sessions::with_bounds(4, Duration::ZERO, Clock::system());
        let token = sessions.create("alice", STAMP);
        assert_eq!(sessions.user(&token, |_| Some(STAMP)), None);
    }

    #[test]
    fn at_the_bound_the_least_recently_used_session_ends() {
        let sessions = Sessions::with_bounds(3, Duration::from_secs(3600), Clock::system());
        let first = sessions.create("u1", STAMP);
        let second = sessions.create("u2", STAMP);
        let third = sessions.create("u3", STAMP);
        // u1 used again: u2 is now the least recently used.
        assert!(sessions.user(&first, |_| Some(STAMP)).is_some());
        let fourth = sessions.create("u4", STAMP);
        assert_eq!(sessions.len(), 3);
        assert_eq!(sessions.user(&second, |_| Some(STAMP)), None);
        for t in [&first, &third, &fourth] {
            assert!(sessions.user(t, |_| Some(STAMP)).is_some());
        }
    }

    #[test]
    fn cookie_parsing_takes_only_a_well_formed_token() {
        let t = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            token_from_cookies(&format!("a=b; {COOKIE}={t}; c=d")),
            Some(t)
        );
        assert_eq!(token_from_cookies(&format!("{COOKIE}=short")), None);
        assert_eq!(token_from_cookies(&format!("{COOKIE}={t}x")), None);
        assert_eq!(token_from_cookies("other=1"), None);
        assert!(set_cookie(t).contains("HttpOnly; SameSite=Strict"));
    }
}
