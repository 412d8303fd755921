use openraft::network::{RPCOption, RaftNetworkFactory, v2::RaftNetworkV2};
use openraft::raft::VoteRequest;
use openraft::{BasicNode, alias::VoteOf};
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use tonic::transport::{Identity, ServerTlsConfig};

use super::*;

/// A CA and a node certificate from it (PEM): (ca, cert, key).
pub(super) fn ca_and_node() -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec![CLUSTER_TLS_NAME.to_string()]).unwrap();
    leaf.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

/// The cluster server's side of mutual TLS with `server`'s CA and identity.
pub(super) fn server_tls((ca, cert, key): &(String, String, String)) -> ServerTlsConfig {
    ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .client_ca_root(Certificate::from_pem(ca))
}

/// This node's TLS towards its peers, with `me`'s CA and identity.
pub(super) fn peer_tls((ca, cert, key): &(String, String, String)) -> PeerTls {
    PeerTls {
        ca_pem: ca.clone().into_bytes(),
        cert_pem: cert.clone().into_bytes(),
        key_pem: key.clone().into_bytes(),
    }
}

/// Whether node `target` of `peers` grants a vote (false if no answer came).
pub(super) async fn vote(peers: Peers, target: u64) -> bool {
    let mut raft = GroupNetwork { group: 7, peers }
        .new_client(target, &BasicNode::default())
        .await;
    raft.vote(
        VoteRequest::new(VoteOf::<TypeConfig>::new(3, 2), None),
        RPCOption::new(Duration::from_secs(2)),
    )
    .await
    .is_ok_and(|r| r.vote_granted)
}

/// Peers dial https:// with the node certificate: a peer from the same CA answers; a server
/// whose certificate comes from another CA is refused (and so is this node by it).
#[tokio::test]
async fn peers_speak_mutual_tls_and_refuse_a_foreign_server() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cluster = ca_and_node();
    let me = peer_tls(&cluster);
    let address = tests::serve_peer(Some(server_tls(&cluster))).await;
    assert!(
        vote(tests::peers_at(1, address, Some(&me)), 1).await,
        "same CA: the vote is answered"
    );

    let foreign = ca_and_node();
    let address = tests::serve_peer(Some(server_tls(&foreign))).await;
    assert!(
        !vote(tests::peers_at(1, address, Some(&me)), 1).await,
        "a foreign server must be refused"
    );
}
