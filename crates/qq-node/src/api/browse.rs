//! `Browse`: the ready messages of a queue at some positions, in queue order, without taking
//! them.
//!
//! Served by the queue's leader (the proposer's leader-only read, forwarded like queue info),
//! from its applied state: no Raft entry is written, nothing is delivered, no count changes.
//! Needs `read` on the queue, as Get does. A browse is a view at one moment: positions move
//! as messages come and go, so paging with `offset` may skip or repeat a message that moved.
//!
//! Bounds: at most [`MAX_BROWSE_LIMIT`] messages per call (a larger `limit` is
//! INVALID_ARGUMENT); `limit` 0 means [`DEFAULT_BROWSE_LIMIT`]; a page stops early at
//! [`crate::groups::registry::MAX_BROWSE_BYTES`] of messages (continue from the position
//! after the last one returned).

use qq_core::Value;
use qq_core::meta::Perm;
use qq_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::Api;
use super::auth::Caller;
use super::convert::{message_to_pb, vhost};
use crate::groups::registry::BrowseData;
pub use crate::groups::registry::MAX_BROWSE_LIMIT;

/// The number of messages a browse without a limit returns.
pub const DEFAULT_BROWSE_LIMIT: u32 = 100;

pub async fn browse(
    api: &Api,
    request: Request<pb::BrowseRequest>,
) -> Result<Response<pb::BrowseResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    let data = browse_of(api, &caller, &vhost(&r.vhost), &r.queue, r.offset, r.limit).await?;
    let messages = data
        .messages
        .into_iter()
        .map(|(b, mut m)| {
            if b.delivery_count > 0 {
                m.properties.headers.insert(
                    "x-delivery-count".into(),
                    Value::Long(i64::from(b.delivery_count)),
                );
            }
            pb::BrowsedMessage {
                position: b.position,
                redelivered: b.redelivered,
                exchange: std::mem::take(&mut m.exchange),
                routing_key: std::mem::take(&mut m.routing_key),
                message: Some(message_to_pb(m)),
                delivery_count: b.delivery_count,
                enqueued_at_ms: b.enqueued_ms,
            }
        })
        .collect();
    Ok(Response::new(pb::BrowseResponse {
        messages,
        message_count: data.ready,
    }))
}

/// Ready messages of `queue` in vhost `v` from position `offset`, at most `limit` (0: the
/// default), if `caller` may read the queue.
pub(crate) async fn browse_of(
    api: &Api,
    caller: &Caller,
    v: &str,
    queue: &str,
    offset: u64,
    limit: u32,
) -> Result<BrowseData, Status> {
    super::guard::bounded(&[("vhost", v), ("queue", queue)])?;
    api.auth.check(caller, v, Perm::Read, queue)?;
    let qm = api.queue_meta(v, queue)?;
    let limit = match limit {
        0 => DEFAULT_BROWSE_LIMIT,
        n if n > MAX_BROWSE_LIMIT => {
            return Err(Status::invalid_argument(format!(
                "limit: {n} is more than {MAX_BROWSE_LIMIT} messages per browse"
            )));
        }
        n => n,
    };
    Ok(api.node.proposer().browse(qm.id, offset, limit).await?)
}
