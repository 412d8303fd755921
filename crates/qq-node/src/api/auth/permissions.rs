//! Authorization: which vhosts a caller may see and whether it holds a permission, with the
//! grants that passed cached for one metadata version.

use std::collections::HashSet;

use qq_core::meta::{MetaState, Perm};
use qq_core::names::shown;
use tonic::Status;

use super::{Auth, Caller};
use crate::api::convert::{bounded, meta_error_to_status};

/// Cached grants, at most; the cache is emptied when full or when the metadata changes.
const GRANT_CACHE_BOUND: usize = 10_000;
pub(super) type Grant = (String, String, u8, String);

impl Auth {
    /// Whether `user` is tagged `administrator`.
    pub fn is_administrator(&self, state: &MetaState, user: &str) -> bool {
        Self::is_admin(state, user)
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
