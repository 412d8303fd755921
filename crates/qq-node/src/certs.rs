//! `qq-node certs`: the cluster CA and node certificates that mutual TLS between nodes (and,
//! optionally, client TLS) uses.
//!
//! A run creates the CA in `--ca-dir` (`ca.pem`, `ca.key`) unless it is already there, then
//! signs a node certificate into `--out` (`node.pem`, `node.key`, and a copy of `ca.pem`, the
//! three files a node's `cluster_ca`/`cluster_cert`/`cluster_key` name). Keys are ECDSA P-256
//! (rcgen on ring), written with mode 0600; keep the CA directory apart from node directories:
//! a node needs `ca.pem`, never `ca.key`. A node certificate carries the SANs 127.0.0.1,
//! localhost, [`CLUSTER_TLS_NAME`] (what peers check; peers may be dialed by any name or
//! address, this is the name they verify) and the names given with `--dns` and `--host`, and the extended key
//! usages ServerAuth and ClientAuth, since a node both serves and dials its peers. Existing
//! node files are kept unless `--force`, so `make cluster` can run it on every start.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use qq_raft::network::CLUSTER_TLS_NAME;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use time::{Duration, OffsetDateTime};

/// Default lifetimes, in days: CA ten years, node certificates five (never past the CA).
pub const DEFAULT_CA_DAYS: u32 = 3650;
pub const DEFAULT_NODE_DAYS: u32 = 1825;

/// `qq-node certs` arguments.
#[derive(Debug, clap::Args)]
pub struct CertsArgs {
    /// Directory of the cluster CA (`ca.pem`, `ca.key`): reused when present, else created.
    #[arg(long)]
    pub ca_dir: PathBuf,
    /// Directory for this node's `node.pem`, `node.key` and a copy of `ca.pem`.
    #[arg(long)]
    pub out: PathBuf,
    /// Common name of the node certificate (e.g. node1).
    #[arg(long, default_value = "qq-node")]
    pub name: String,
    /// An extra SAN: a DNS name clients (or operators) reach this node by, e.g.
    /// `--dns quorumq-0.quorumq-headless --dns quorumq.example.com`; repeatable. Besides
    /// 127.0.0.1, localhost and qq-node (the name peers check, always present).
    #[arg(long = "dns", value_name = "NAME")]
    pub dns: Vec<String>,
    /// An extra SAN: an IP address or host name; repeatable.
    #[arg(long = "host", value_name = "HOST")]
    pub hosts: Vec<String>,
    /// Validity of a new CA, in days.
    #[arg(long, default_value_t = DEFAULT_CA_DAYS)]
    pub ca_days: u32,
    /// Validity of the node certificate, in days.
    #[arg(long, default_value_t = DEFAULT_NODE_DAYS)]
    pub days: u32,
    /// Replace an existing node certificate and key in `--out`.
    #[arg(long)]
    pub force: bool,
}

/// Run `qq-node certs`: prints what it created or reused.
pub fn run(args: &CertsArgs) -> anyhow::Result<()> {
    println!("{}", write(args)?);
    Ok(())
}

/// What `qq-node certs` does, without printing: the CA and the node certificate written (or
/// kept), and a line saying which.
pub fn write(args: &CertsArgs) -> anyhow::Result<String> {
    if args.days == 0 || args.ca_days == 0 {
        bail!("--days and --ca-days: must be >= 1");
    }
    let now = OffsetDateTime::now_utc();
    let ca = load_or_create_ca(&args.ca_dir, args.ca_days, now)?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("create {}", args.out.display()))?;
    let node_pem = args.out.join("node.pem");
    let node_key = args.out.join("node.key");
    write_file(&args.out.join("ca.pem"), ca.pem.as_bytes(), 0o644)?;
    if node_pem.exists() && node_key.exists() && !args.force {
        return Ok(format!(
            "{}\nnode certificate kept: {}",
            ca.said,
            node_pem.display()
        ));
    }
    let mut sans = vec![
        "127.0.0.1".to_string(),
        "localhost".to_string(),
        CLUSTER_TLS_NAME.to_string(),
    ];
    for name in &args.dns {
        check_dns_name(name)?;
    }
    for h in args.dns.iter().chain(&args.hosts) {
        if !sans.contains(h) {
            sans.push(h.clone());
        }
    }
    let mut params = CertificateParams::new(sans.clone()).context("node certificate SANs")?;
    params
        .distinguished_name
        .push(DnType::CommonName, args.name.clone());
    params.is_ca = IsCa::NoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.serial_number = Some(serial());
    // A day back for clock skew between the machine that signs and the nodes.
    params.not_before = now - Duration::days(1);
    let not_after = now + Duration::days(i64::from(args.days));
    params.not_after = ca.not_after.map_or(not_after, |ca| not_after.min(ca));
    let key = KeyPair::generate().context("generate node key")?;
    let cert = params
        .signed_by(&key, &ca.issuer)
        .context("sign node certificate")?;
    write_file(&node_key, key.serialize_pem().as_bytes(), 0o600)?;
    write_file(&node_pem, cert.pem().as_bytes(), 0o644)?;
    Ok(format!(
        "{}\nnode certificate created: {} (SANs {})",
        ca.said,
        node_pem.display(),
        sans.join(", ")
    ))
}

/// `--dns NAME` must be a DNS name (letters, digits, `-`, dots between labels; a leading
/// `*.` for a wildcard), not an address.
fn check_dns_name(name: &str) -> anyhow::Result<()> {
    let bare = name.strip_prefix("*.").unwrap_or(name);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    let ok = name.len() <= 253
        && bare.split('.').all(label_ok)
        && bare.parse::<std::net::IpAddr>().is_err();
    if !ok {
        bail!("--dns: '{name}' is not a DNS name (use --host for an IP address)");
    }
    Ok(())
}

/// The CA's PEM, its issuer and (when created now) its expiry: loaded from `dir`, or created.
/// The cluster CA, loaded or made, and a line saying which.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
    /// Known only for a CA made now.
    not_after: Option<OffsetDateTime>,
    said: String,
}

fn load_or_create_ca(dir: &Path, days: u32, now: OffsetDateTime) -> anyhow::Result<Ca> {
    let cert_path = dir.join("ca.pem");
    let key_path = dir.join("ca.key");
    if cert_path.exists() || key_path.exists() {
        let pem = std::fs::read_to_string(&cert_path)
            .with_context(|| format!("read {}", cert_path.display()))?;
        let key_pem = std::fs::read_to_string(&key_path)
            .with_context(|| format!("read {}", key_path.display()))?;
        let key =
            KeyPair::from_pem(&key_pem).with_context(|| format!("parse {}", key_path.display()))?;
        let issuer = Issuer::from_ca_cert_pem(&pem, key)
            .with_context(|| format!("parse {}", cert_path.display()))?;
        // rcgen does not expose a loaded CA's expiry: --days is trusted to stay within it.
        return Ok(Ca {
            pem,
            issuer,
            not_after: None,
            said: format!("cluster CA reused: {}", cert_path.display()),
        });
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod {}", dir.display()))?;
    let mut params = CertificateParams::new(Vec::new()).context("CA parameters")?;
    params
        .distinguished_name
        .push(DnType::CommonName, "quorumq cluster CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.serial_number = Some(serial());
    params.not_before = now - Duration::days(1);
    params.not_after = now + Duration::days(i64::from(days));
    let not_after = params.not_after;
    let key = KeyPair::generate().context("generate CA key")?;
    let cert = params.self_signed(&key).context("self-sign CA")?;
    write_file(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
    write_file(&cert_path, cert.pem().as_bytes(), 0o644)?;
    Ok(Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
        not_after: Some(not_after),
        said: format!("cluster CA created: {}", cert_path.display()),
    })
}

/// A random positive 16-byte serial.
fn serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    SerialNumber::from_slice(&bytes)
}

/// Writes `data` to `path` with `mode` (replacing the file; a key is never world-readable,
/// not even for a moment).
fn write_file(path: &Path, data: &[u8], mode: u32) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    f.write_all(data)
        .and_then(|_| f.sync_all())
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_are_checked() {
        for ok in [
            "quorumq-0.quorumq-headless",
            "broker",
            "*.quorumq.example.com",
        ] {
            check_dns_name(ok).unwrap();
        }
        for bad in ["10.0.0.1", "", "a..b", "-a.b", "a_b", "host:7101"] {
            let e = format!("{:#}", check_dns_name(bad).unwrap_err());
            assert!(
                e.starts_with(&format!("--dns: '{bad}' is not a DNS name")),
                "{e}"
            );
        }
    }
}
