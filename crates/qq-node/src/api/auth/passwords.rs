//! Passwords: hashing a new one, and verifying one off the async workers behind a bound, with
//! the cache of verified credentials (keyed by user, password digest and record digest).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use argon2::{Argon2, PasswordHasher, PasswordVerifier};
use qq_core::meta::{MetaCommand, User};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::time::Instant;
use tonic::Status;

use super::Auth;

/// Cached verified credentials, at most (one per user); full: expired entries go, then all.
const VERIFIED_CACHE_BOUND: usize = 10_000;
/// How long a verified password is trusted without verifying it again (RabbitMQ's auth cache:
/// 15 s).
pub const VERIFIED_TTL: Duration = Duration::from_secs(15);
/// Password verifies running at once, at most (each allocates 19 MiB for Argon2id).
pub const MAX_CONCURRENT_VERIFIES: usize = 2;

/// A verified password, trusted until `at + VERIFIED_TTL`.
pub(super) struct Verified {
    password_digest: [u8; 32],
    record_digest: [u8; 32],
    at: Instant,
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

/// Checks `password` against `record`: Argon2 (with the parameters stored in the PHC string;
/// about 20 ms and 19 MiB at the defaults, so callers cache the result) or, for a record
/// written before Argon2id, the legacy sha256(salt || password), compared in constant time
/// either way. Here on the node, not in the replicated state (which only holds the record).
pub fn verify(record: &User, password: &str) -> bool {
    if record.is_legacy_hash() {
        let computed = legacy_hash(password, &record.salt);
        return bool::from(computed.as_slice().ct_eq(record.password_hash.as_slice()));
    }
    let Ok(phc) = std::str::from_utf8(&record.password_hash) else {
        return false;
    };
    Argon2::default()
        .verify_password(password.as_bytes(), phc)
        .is_ok()
}

/// sha256(salt || password): the hash of records written before Argon2id, which still verify.
pub fn legacy_hash(password: &str, salt: &[u8]) -> Vec<u8> {
    let mut hasher = Sha256::new();
    hasher.update(salt);
    hasher.update(password.as_bytes());
    hasher.finalize().to_vec()
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

impl Auth {
    /// A digest of `user`'s stored password record (None: no such user). A page session keeps
    /// the one of its login and ends when it changes (password changed, user deleted).
    pub fn credential_stamp(&self, user: &str) -> Option<[u8; 32]> {
        self.view.current().user(user).map(record_digest)
    }

    /// Whether `password` is `user`'s: from the cache, else verified off the async workers.
    pub(super) async fn verify(&self, user: &str, password: String) -> Result<bool, Status> {
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
            self.clock.elapsed(v.at) < VERIFIED_TTL
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
                cache.retain(|_, v| self.clock.elapsed(v.at) < VERIFIED_TTL);
                if cache.len() >= VERIFIED_CACHE_BOUND {
                    cache.clear();
                }
            }
            cache.insert(
                user.to_string(),
                Verified {
                    password_digest,
                    record_digest,
                    at: self.clock.now(),
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
        qq_raft::lockstep::spawn_blocking(move || {
            let _permit = permit;
            verify(&record, &password)
        })
        .await
        .map_err(|e| Status::internal(format!("authentication: verify failed: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use qq_core::meta::{MetaCommand, MetaState};

    use super::*;
    use crate::api::auth::tests::fresh_auth;

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

    /// A verified password is trusted for VERIFIED_TTL by the node's clock, then verified
    /// again: under tokio's paused clock the entry expires only when the clock is advanced
    /// (with the cache's age read from `std::time::Instant`, as before `Clock`, it never did).
    #[tokio::test(start_paused = true)]
    async fn a_verified_password_is_trusted_until_the_clock_passes_its_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let auth = fresh_auth(dir.path());
        assert!(auth.verify("guest", "guest".into()).await.unwrap());
        tokio::time::advance(VERIFIED_TTL - Duration::from_millis(1)).await;
        assert!(auth.verify("guest", "guest".into()).await.unwrap());
        assert_eq!(
            auth.argon2_runs.load(Ordering::Relaxed),
            1,
            "from the cache"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(auth.verify("guest", "guest".into()).await.unwrap());
        assert_eq!(
            auth.argon2_runs.load(Ordering::Relaxed),
            2,
            "expired: verified"
        );
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
        assert!(verify(bob, "s3cret"));
        assert!(!verify(bob, "s3creT"));
        // A random salt: the same password hashes differently every time.
        let again = hash_new_password("bob".into(), "s3cret", vec![]).unwrap();
        let MetaCommand::PutUser { password_hash, .. } = again else {
            unreachable!()
        };
        assert_ne!(password_hash, bob.password_hash);
    }

    #[test]
    fn the_predeclared_guest_verifies_and_a_wrong_password_does_not() {
        let state = MetaState::new();
        let guest = state.user("guest").unwrap();
        assert!(verify(guest, "guest"));
        assert!(!verify(guest, "wrong"));
    }

    #[test]
    fn legacy_sha256_records_still_verify() {
        // A record written before Argon2id (an old data directory's guest) verifies by the old
        // rule.
        let legacy = qq_core::meta::User {
            name: "guest".into(),
            password_hash: legacy_hash("guest", qq_core::meta::GUEST_SALT),
            salt: qq_core::meta::GUEST_SALT.to_vec(),
            tags: vec![],
        };
        assert!(legacy.is_legacy_hash());
        assert!(verify(&legacy, "guest"));
        assert!(!verify(&legacy, "guesT"));
    }
}
