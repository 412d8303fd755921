//! Story: a node whose node-to-node protocol its peers cannot read is refused by name.
//!
//! Every request between nodes carries the `qq-protocol` header (the version the sender
//! speaks and the oldest it reads); a request without it is release 0.1.0's (version 1, which
//! this release reads: the rolling-upgrade test runs such a node beside today's). Here an
//! authenticated peer sends requests claiming versions the nodes cannot talk with: each is
//! refused with FAILED_PRECONDITION naming the protocol before it reaches a group, the refusal
//! is counted in `quorumq_peer_protocol_refusals_total`, and requests of versions the node reads
//! reach the service as before.

use qq_proto::internal::ProposeRequest;
use qq_tests::{TestCluster, info};
use tonic::Code;
use tonic::metadata::MetadataValue;

/// A garbage proposal to the metadata group, with `header` as the sender's `qq-protocol`
/// (none when None): refused either for its version or, once past the check, for its payload.
fn propose(header: Option<&str>) -> tonic::Request<ProposeRequest> {
    let mut request = tonic::Request::new(ProposeRequest {
        group: 0,
        payload: vec![0xff, 0xff].into(),
    });
    if let Some(value) = header {
        let value = MetadataValue::try_from(value).expect("ASCII");
        request.metadata_mut().insert("qq-protocol", value);
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_of_a_protocol_the_node_cannot_read_are_refused_by_name() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3).await?;
    let mut internal = cluster.internal_client(2).await?;
    let refusals = || async {
        cluster
            .metric(2, "quorumq_peer_protocol_refusals_total")
            .await
    };
    let before = refusals().await?;

    info!("--- a newer node that no longer reads version 2, and a malformed header");
    for (header, code) in [
        ("9; oldest=9", Code::FailedPrecondition),
        ("3; oldest=3", Code::FailedPrecondition),
        ("two", Code::InvalidArgument),
    ] {
        let status = internal.propose(propose(Some(header))).await.unwrap_err();
        assert_eq!(status.code(), code, "{header}: {status:?}");
        assert!(
            status.message().contains("protocol"),
            "{header}: {status:?}"
        );
    }
    assert_eq!(refusals().await? - before, 3.0);

    info!("--- this release, a newer one that reads it, and 0.1.0 (no header) reach the service");
    for header in [Some("2; oldest=1"), Some("3; oldest=2"), None] {
        let status = internal.propose(propose(header)).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{header:?}: {status:?}"
        );
        assert!(
            status.message().contains("payload"),
            "{header:?}: {status:?}"
        );
    }
    assert_eq!(refusals().await? - before, 3.0);

    info!("--- the cluster's own traffic passes the check: it still serves");
    let c = cluster.client(1).await?;
    c.declare_queue("protocol.q", Default::default()).await?;
    assert!(
        c.publish("", "protocol.q", qq_client::message("m"))
            .await?
            .is_confirmed()
    );
    cluster.stop();
    Ok(())
}
