//! What every handler checks about what a client *names* before it looks anything up: the
//! bound of each name ([`bounded`], the rules of [`qq_core::names`]), and the one visibility
//! rule for things found by id rather than by vhost ([`queue_by_id`]).
//!
//! # Why by id too
//! Receipts (`{queue id}.{message}.{token}`) and move task ids (`{queue id}.{task}`) name a
//! queue by its number, and queue numbers are small integers. A caller who could tell "no such
//! queue" from "a queue in a vhost you may not see" could walk the numbers and learn every
//! vhost's name. So a queue in a vhost the caller may not see answers exactly as a queue that
//! does not exist; in a vhost the caller sees, the usual permission check applies.
//!
//! Must not: show client input in a message other than through [`shown`].

use qq_core::meta::{Perm, QueueMeta};
use tonic::Status;

use super::Api;
use super::auth::Caller;

pub use super::convert::bounded;
pub use qq_core::names::shown;

/// The queue numbered `id`, if it exists in a vhost `caller` may see and `caller` has `perm`
/// on it; `missing()` when it does not exist or its vhost is not visible, alike.
pub fn queue_by_id(
    api: &Api,
    caller: &Caller,
    id: u64,
    perm: Perm,
    missing: impl Fn() -> Status,
) -> Result<QueueMeta, Status> {
    let qm = api.node().view().queue_by_id(id).ok_or_else(&missing)?;
    if !api
        .auth()
        .may_see(&api.node().view().current(), caller, &qm.vhost)
    {
        return Err(missing());
    }
    api.auth().check(caller, &qm.vhost, perm, &qm.name)?;
    Ok(qm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn an_over_long_name_is_refused_naming_its_field_without_echoing_it() {
        let long = "q".repeat(40 * 1024);
        bounded(&[("vhost", "/"), ("name", "q")]).unwrap();
        let e = bounded(&[("vhost", "/"), ("destination", &long)]).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(e.message(), "destination: 40960 bytes, more than 255");
    }
}
