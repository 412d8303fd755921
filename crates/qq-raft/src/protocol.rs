//! The node-to-node protocol's version: which release's `Internal` service a node speaks.
//!
//! Every request one node sends another carries the header [`HEADER`], `<version>;
//! oldest=<oldest>`: the version the sender speaks and the oldest version it still reads. The
//! receiver ([`check`]) serves the request only when each side can read the other: the
//! sender's version is at least the receiver's [`OLDEST_PEER_PROTOCOL`], and the receiver's
//! [`PROTOCOL_VERSION`] at least the sender's oldest. Otherwise it answers FAILED_PRECONDITION
//! naming both versions, before the request reaches any group, so a node too old or too new
//! for its cluster is refused by name instead of misreading or being misread.
//!
//! Release 0.1.0 sent no header: a request without one is version 1, reading version 1.
//!
//! Version 1 is release 0.1.0's protocol. Version 2 (this release) adds fields older nodes
//! skip (WatchEvent machine versions, QueueInfo `version`, the acquired count after a Get
//! reply) and accepts version 1: a cluster upgrades one node at a time. A release that changes
//! a message so that an older release would misread it raises [`PROTOCOL_VERSION`] and its own
//! [`OLDEST_PEER_PROTOCOL`] alike only when that older release can no longer be in the cluster;
//! until then it keeps to what both read, with machine versions ([`crate::types`]' payloads are
//! versioned by the group's log) deciding when a new command may be sent.

use std::sync::atomic::{AtomicU64, Ordering};

use qq_proto::internal::internal_client::InternalClient;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// The protocol this binary speaks.
pub const PROTOCOL_VERSION: u32 = 2;
/// The oldest protocol this binary reads from a peer.
pub const OLDEST_PEER_PROTOCOL: u32 = 1;
/// The request header that carries a sender's versions.
pub const HEADER: &str = "qq-protocol";
/// What this binary puts under [`HEADER`]: `<PROTOCOL_VERSION>; oldest=<OLDEST_PEER_PROTOCOL>`
/// (a test checks that it says so), a static string so that stamping a request allocates
/// nothing.
const STAMP: &str = "2; oldest=1";

/// Requests refused because sender and receiver could not read each other.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Requests this process refused for their protocol version since it started.
pub fn refused() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// A client of a peer's internal service: every request carries this binary's versions.
pub type PeerClient = InternalClient<InterceptedService<Channel, Stamp>>;

/// A [`PeerClient`] over `channel`, with messages bounded by `max_message_bytes`.
pub fn client(channel: Channel, max_message_bytes: usize) -> PeerClient {
    InternalClient::with_interceptor(channel, Stamp)
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes)
}

/// Puts this binary's versions on every request ([`HEADER`]).
#[derive(Clone, Copy, Debug)]
pub struct Stamp;

impl Interceptor for Stamp {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert(HEADER, MetadataValue::from_static(STAMP));
        Ok(request)
    }
}

/// The receiving side's check (an interceptor of the `Internal` server): passes a request
/// whose sender this node and it can read each other, refuses it otherwise.
pub fn check(request: Request<()>) -> Result<Request<()>, Status> {
    let header = request.metadata().get(HEADER).map(|v| v.to_str());
    let header = match header {
        None => None,
        Some(Ok(text)) => Some(text),
        Some(Err(_)) => {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            return Err(Status::invalid_argument(format!(
                "header {HEADER}: not ASCII text"
            )));
        }
    };
    match judge(header, PROTOCOL_VERSION, OLDEST_PEER_PROTOCOL) {
        Ok(()) => Ok(request),
        Err(refusal) => {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            Err(refusal)
        }
    }
}

/// Whether a sender whose [`HEADER`] is `header` (None: it sent none) and a receiver speaking
/// `ours`, reading from `oldest`, can talk.
fn judge(header: Option<&str>, ours: u32, oldest: u32) -> Result<(), Status> {
    let (theirs, their_oldest) = match header {
        None => (1, 1),
        Some(text) => parse(text).ok_or_else(|| {
            Status::invalid_argument(format!(
                "header {HEADER}: '{text}' is not '<version>; oldest=<version>'"
            ))
        })?,
    };
    if theirs < oldest || ours < their_oldest {
        return Err(Status::failed_precondition(format!(
            "node-to-node protocol: the sender speaks version {theirs} and reads from \
             {their_oldest}, this node speaks {ours} and reads from {oldest}; they cannot talk \
             (upgrade one node at a time through releases that read each other)"
        )));
    }
    Ok(())
}

/// `<version>; oldest=<version>`, with the oldest not above the version.
fn parse(text: &str) -> Option<(u32, u32)> {
    let (version, oldest) = text.split_once(';')?;
    let version: u32 = version.trim().parse().ok()?;
    let oldest: u32 = oldest.trim().strip_prefix("oldest=")?.parse().ok()?;
    (oldest <= version).then_some((version, oldest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn code(header: Option<&str>, ours: u32, oldest: u32) -> Option<Code> {
        judge(header, ours, oldest).err().map(|s| s.code())
    }

    #[test]
    fn a_request_without_the_header_is_release_0_1_0s() {
        assert_eq!(code(None, 2, 1), None, "0.1.0 talks to this release");
        assert_eq!(
            code(None, 3, 2),
            Some(Code::FailedPrecondition),
            "a release that no longer reads version 1 refuses 0.1.0"
        );
    }

    #[test]
    fn each_side_must_read_the_others_version() {
        assert_eq!(code(Some("2; oldest=1"), 2, 1), None, "same release");
        assert_eq!(
            code(Some("3; oldest=2"), 2, 1),
            None,
            "a newer node that reads us"
        );
        assert_eq!(
            code(Some("4; oldest=3"), 2, 1),
            Some(Code::FailedPrecondition),
            "a newer node that no longer reads our version"
        );
        assert_eq!(
            code(Some("1; oldest=1"), 3, 2),
            Some(Code::FailedPrecondition),
            "an older node we no longer read"
        );
    }

    #[test]
    fn a_malformed_header_is_refused_by_name() {
        for bad in ["2", "two; oldest=1", "2; newest=1", "1; oldest=2", ""] {
            let status = judge(Some(bad), 2, 1).unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{bad}");
            assert!(status.message().contains(HEADER), "{}", status.message());
        }
    }

    #[test]
    fn the_stamp_is_what_the_check_passes() {
        let stamped = Stamp.call(Request::new(())).unwrap();
        let header = stamped.metadata().get(HEADER).unwrap().to_str().unwrap();
        assert_eq!(
            parse(header),
            Some((PROTOCOL_VERSION, OLDEST_PEER_PROTOCOL))
        );
        assert!(check(stamped).is_ok());
    }
}
