use super::*;

#[test]
fn loopback_addresses() {
    let a = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
    assert!(is_loopback(a("127.0.0.1:1")));
    assert!(is_loopback(a("127.5.0.1:1")));
    assert!(is_loopback(a("[::1]:1")));
    assert!(is_loopback(a("[::ffff:127.0.0.1]:1")));
    assert!(!is_loopback(a("192.0.2.2:1")));
    assert!(!is_loopback(a("[::ffff:192.0.2.2]:1")));
    assert!(!is_loopback(None));
}

/// Checks over a fresh cluster's metadata (guest/guest), stored in `dir`.
pub(super) fn fresh_auth(dir: &std::path::Path) -> Auth {
    let store = qq_raft::store::Store::open(dir).unwrap();
    let (meta, _effects) = crate::groups::meta_sm::MetaMachine::new(store);
    Auth::new(
        MetaView::new(meta),
        watch::channel(true).1,
        AuthSettings {
            loopback_users: vec![],
            allow_plaintext_auth: true,
            client_tls: false,
        },
        Connections::new(16, 16),
        crate::clock::Clock::system(),
    )
}

/// A client certificate (SASL EXTERNAL) naming a loopback-only user logs in only from a
/// loopback address, as a password would; a name that is no user is refused.
#[test]
fn external_logins_keep_the_loopback_rule() {
    let dir = tempfile::tempdir().unwrap();
    let mut auth = fresh_auth(dir.path());
    auth.settings.loopback_users = vec!["guest".into()];
    let remote = Some("192.0.2.2:5000".parse().unwrap());
    let local = Some("127.0.0.1:5000".parse().unwrap());
    let refused = auth
        .login_amqp_external("guest".into(), remote)
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert!(refused.message().contains("only connect via localhost"));
    assert_eq!(
        auth.login_amqp_external("guest".into(), local)
            .unwrap()
            .user,
        "guest"
    );
    let nobody = auth
        .login_amqp_external("mallory".into(), local)
        .unwrap_err();
    assert_eq!(nobody.code(), tonic::Code::Unauthenticated);
}
