//! Who is calling and what they may do: the only place the client API decides permissions.
//!
//! A request carries HTTP Basic credentials in its `authorization` metadata; without them it
//! acts as `guest`. Permission checks read the metadata view; grants that passed are cached for
//! one metadata version (compiling the permission regexes on every publish was the top cost in
//! a profile).
//!
//! Must not: propose anything, or let a handler skip a check by calling the domain directly.

use std::collections::HashSet;
use std::sync::Mutex;

use base64::Engine;
use qq_core::meta::Perm;
use tonic::{Request, Status};

use super::convert::meta_error_to_status;
use crate::meta_view::MetaView;

/// Cached grants, at most; the cache is emptied when full or when the metadata changes.
const GRANT_CACHE_BOUND: usize = 10_000;

type Grant = (String, String, u8, String);

pub struct Auth {
    view: MetaView,
    /// Permission checks that passed, valid for one metadata version.
    granted: Mutex<(u64, HashSet<Grant>)>,
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: String,
}

impl Auth {
    pub fn new(view: MetaView) -> Auth {
        Auth {
            view,
            granted: Mutex::new((0, HashSet::new())),
        }
    }

    /// The authenticated caller: Basic credentials, or `guest` without them.
    pub fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        let (user, password) = match req.metadata().get("authorization") {
            None => ("guest".to_string(), "guest".to_string()),
            Some(v) => {
                let v = v
                    .to_str()
                    .map_err(|_| Status::unauthenticated("authorization: not ASCII"))?;
                let b64 = v.strip_prefix("Basic ").ok_or_else(|| {
                    Status::unauthenticated("authorization: expected 'Basic base64(user:password)'")
                })?;
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|_| Status::unauthenticated("authorization: invalid base64"))?;
                let raw = String::from_utf8(raw)
                    .map_err(|_| Status::unauthenticated("authorization: not UTF-8"))?;
                let (u, p) = raw.split_once(':').ok_or_else(|| {
                    Status::unauthenticated("authorization: expected user:password")
                })?;
                (u.to_string(), p.to_string())
            }
        };
        self.view
            .current()
            .authenticate(&user, &password)
            .map_err(|e| meta_error_to_status(&e))?;
        Ok(Caller { user })
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
                return Ok(());
            }
        }
        self.view
            .current()
            .check_permission(&caller.user, vhost, perm, resource)
            .map_err(|e| meta_error_to_status(&e))?;
        let mut granted = self.granted.lock().unwrap();
        // Remember the grant only if the metadata did not move on since the version was read.
        if granted.0 == version && self.view.version() == version {
            granted.1.insert(key);
        }
        Ok(())
    }

    pub fn require_admin(&self, caller: &Caller) -> Result<(), Status> {
        match self.view.current().user(&caller.user) {
            Some(u) if u.tags.iter().any(|t| t == "administrator") => Ok(()),
            _ => Err(Status::permission_denied(format!(
                "user '{}' is not an administrator",
                caller.user
            ))),
        }
    }
}
