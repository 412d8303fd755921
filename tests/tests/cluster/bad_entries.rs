//! Story: a peer that proposes garbage cannot brick a group.
//!
//! Once, one `Internal/Propose { group: 0, payload: ff ff ff }` committed an entry no replica
//! could decode: the metadata group stopped for good and every node crashed on restart. Here a
//! caller of the node-to-node service (as a buggy or malicious peer would be) proposes bytes
//! that are not a command, to the metadata group and to a queue's group, on every node: each is
//! refused with INVALID_ARGUMENT before it is proposed, and the cluster keeps serving, also after
//! every node is killed and restarted. (What a replica does with such an entry if one is
//! committed anyway is the property test in `qq-node`'s `groups::untrusted_entries`.)

use qq_client::message;
use qq_proto::internal::ProposeRequest;
use qq_tests::{TestCluster, info};
use tonic::Code;

use super::drain_exactly;

const Q: &str = "brick.q";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_proposals_are_refused_and_the_cluster_keeps_serving() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start(3).await?;
    let c = cluster.client(1).await?;
    c.declare_queue(Q, Default::default()).await?;
    for i in 0..5 {
        assert!(
            c.publish("", Q, message(format!("m{i}")))
                .await?
                .is_confirmed()
        );
    }
    let group = c.get_queue(Q).await?.id;

    info!("--- garbage proposals to the metadata group and to {Q}'s group, on every node");
    let garbage: [&[u8]; 4] = [&[0xff, 0xff, 0xff], &[], &[0x00], &[0x01, 0x05, 0xff, 0x00]];
    for id in cluster.ids() {
        let mut internal = cluster.internal_client(id).await?;
        for target in [0, group] {
            for payload in garbage {
                let result = internal
                    .propose(ProposeRequest {
                        group: target,
                        payload: payload.to_vec().into(),
                    })
                    .await;
                let status = result.expect_err("a garbage proposal must be refused");
                assert_eq!(
                    status.code(),
                    Code::InvalidArgument,
                    "node {id}, group {target}, payload {payload:02x?}: {status:?}"
                );
                assert!(status.message().contains("payload"), "{status:?}");
            }
        }
    }

    info!("--- the cluster still serves: declare, publish, consume");
    c.declare_queue("after.q", Default::default()).await?;
    assert!(c.publish("", Q, message("m5")).await?.is_confirmed());
    assert!(c.publish("", "after.q", message("a")).await?.is_confirmed());
    assert_eq!(drain_exactly(&c, "after.q", 1).await?, vec!["a"]);

    info!("--- kill -9 every node, then start them again: nothing to replay that fails");
    for id in cluster.ids() {
        cluster.kill9(id);
    }
    // All together: a node started alone serves nobody until its metadata has caught up
    // with a leader's, and there is no leader before a majority is up.
    cluster.restart_all().await?;
    cluster.leader_of(Q).await?;
    let c = cluster.client(2).await?;
    let want: Vec<String> = (0..6).map(|i| format!("m{i}")).collect();
    assert_eq!(drain_exactly(&c, Q, 6).await?, want);
    c.declare_queue("after.restart.q", Default::default())
        .await?;
    cluster.stop();
    Ok(())
}
