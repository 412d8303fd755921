//! Connecting to a node: the connection limits and keep-alive, TLS options, the
//! authentication interceptor, and [`Client`] itself with its constructors and accessors.

use std::time::Duration;

use base64::Engine as _;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use qq_proto::v1::broker_client::BrokerClient;

use crate::error::{Error, Result};

/// Largest gRPC message the client sends or accepts (64 MiB). The node's own
/// `max_message_bytes` (16 MiB by default) is the bound that matters; this one only has to be
/// larger so that the node, not tonic, gives the answer.
pub const MAX_GRPC_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// How long [`Client::connect`] waits for the TCP connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an open connection is pinged (HTTP/2 PING), and how long the answer may take
/// before the connection, and every call on it, fails with `UNAVAILABLE`.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Capacity of the request channel feeding a `Consume` or `PublishStream` call.
pub(crate) const REQUEST_CHANNEL_CAPACITY: usize = 1024;

/// Adds the `authorization` metadata to every request (none: the request acts as `guest`).
#[derive(Clone, Default)]
pub struct Auth {
    header: Option<MetadataValue<Ascii>>,
}

impl Auth {
    /// `Basic base64(user:password)`.
    pub fn basic(user: &str, password: &str) -> Result<Auth> {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let header = format!("Basic {token}")
            .parse()
            .map_err(|e| Error::InvalidCredentials(format!("{e}")))?;
        Ok(Auth {
            header: Some(header),
        })
    }
}

impl Interceptor for Auth {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.header {
            request.metadata_mut().insert("authorization", h.clone());
        }
        Ok(request)
    }
}

/// The raw generated client with the authentication interceptor, for RPCs this crate does not
/// wrap.
pub type RawClient = BrokerClient<InterceptedService<Channel, Auth>>;

/// A connection to one node. Cheap to clone (clones share the HTTP/2 connection).
#[derive(Clone)]
pub struct Client {
    channel: Channel,
    address: String,
    pub(crate) vhost: String,
    raw: RawClient,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("address", &self.address)
            .field("vhost", &self.vhost)
            .finish()
    }
}

/// TLS towards a node whose client port serves TLS (`tls_cert`/`tls_key` in its config).
#[derive(Clone, Debug, Default)]
pub struct TlsOptions {
    /// PEM of the CA that signed the node's certificate; `None`: the node's certificate must
    /// chain to the CA given here, so it is required in practice.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM certificate and key presented to the node (required when the node sets
    /// `tls_client_ca`).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Name checked against the node certificate's SANs; default: the address's host.
    pub domain_name: Option<String>,
}

impl TlsOptions {
    /// Reads the CA and, when both are given, the client certificate and key from PEM files.
    pub fn from_files(
        ca: Option<&std::path::Path>,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> Result<TlsOptions> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| Error::Tls(format!("read {}: {e}", p.display())))
        };
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
            (None, None) => None,
            _ => {
                return Err(Error::Tls(
                    "a client certificate needs both --cert and --key".into(),
                ));
            }
        };
        Ok(TlsOptions {
            ca_pem: ca.map(read).transpose()?,
            identity,
            domain_name: None,
        })
    }

    fn client_config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &self.ca_pem {
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.domain_name {
            config = config.domain_name(name.clone());
        }
        config
    }
}

fn endpoint_uri(address: &str, tls: bool) -> String {
    if address.starts_with("http://") || address.starts_with("https://") {
        address.to_string()
    } else if tls {
        format!("https://{address}")
    } else {
        format!("http://{address}")
    }
}

impl Client {
    /// Connects to `address` (`127.0.0.1:7101` or `http://127.0.0.1:7101`) as `guest`.
    pub async fn connect(address: &str) -> Result<Client> {
        Self::connect_with(address, None).await
    }

    /// Connects over TLS (`host:port` means `https://host:port`; `http://` is refused, since
    /// tonic would silently speak plain text).
    pub async fn connect_tls(address: &str, tls: &TlsOptions) -> Result<Client> {
        Self::connect_with(address, Some(tls)).await
    }

    /// [`Client::connect`] or [`Client::connect_tls`].
    pub async fn connect_with(address: &str, tls: Option<&TlsOptions>) -> Result<Client> {
        let endpoint = Self::endpoint(address, tls)?;
        let channel = endpoint.connect().await.map_err(|source| Error::Connect {
            address: address.to_string(),
            source,
        })?;
        Ok(Self::from_channel(channel, address))
    }

    /// Like [`Client::connect`] but connects on first use (never fails for an unreachable node).
    pub fn connect_lazy(address: &str) -> Result<Client> {
        Self::connect_lazy_with(address, None)
    }

    /// [`Client::connect_lazy`], over TLS when `tls` is given.
    pub fn connect_lazy_with(address: &str, tls: Option<&TlsOptions>) -> Result<Client> {
        let channel = Self::endpoint(address, tls)?.connect_lazy();
        Ok(Self::from_channel(channel, address))
    }

    /// [`Client::connect_lazy_with`] over a channel `via` makes from the client's endpoint (its
    /// settings: TLS, windows, keep-alives), instead of TCP: a simulator's network.
    pub fn connect_lazy_via(
        address: &str,
        tls: Option<&TlsOptions>,
        via: impl FnOnce(&Endpoint) -> Channel,
    ) -> Result<Client> {
        let channel = via(&Self::endpoint(address, tls)?);
        Ok(Self::from_channel(channel, address))
    }

    fn endpoint(address: &str, tls: Option<&TlsOptions>) -> Result<Endpoint> {
        let uri = endpoint_uri(address, tls.is_some());
        let mut endpoint =
            Endpoint::from_shared(uri.clone()).map_err(|source| Error::InvalidAddress {
                address: address.to_string(),
                source,
            })?;
        if let Some(tls) = tls {
            if !uri.starts_with("https://") {
                return Err(Error::Tls(format!(
                    "address '{address}': TLS needs https:// (http:// would be plain text)"
                )));
            }
            endpoint = endpoint
                .tls_config(tls.client_config())
                .map_err(|e| Error::Tls(format!("{e}")))?;
        }
        Ok(endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            // h2 budgets small DATA frames by connection window; keep it large (see qq-raft network).
            .initial_connection_window_size(32 * 1024 * 1024)
            .initial_stream_window_size(4 * 1024 * 1024)
            // A node that stops answering (paused, cut off) must not hang a consume stream
            // forever: HTTP/2 pings find it and fail the call, so the caller can go elsewhere.
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true))
    }

    fn from_channel(channel: Channel, address: &str) -> Client {
        let raw = Self::raw_client(channel.clone(), Auth::default());
        Client {
            channel,
            address: address.to_string(),
            vhost: String::new(),
            raw,
        }
    }

    fn raw_client(channel: Channel, auth: Auth) -> RawClient {
        BrokerClient::with_interceptor(channel, auth)
            .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES)
    }

    /// The same connection, authenticating every request as `user`.
    pub fn with_credentials(mut self, user: &str, password: &str) -> Result<Client> {
        self.raw = Self::raw_client(self.channel.clone(), Auth::basic(user, password)?);
        Ok(self)
    }

    /// The same connection, naming `vhost` in every request (empty means `/`).
    pub fn with_vhost(mut self, vhost: &str) -> Client {
        self.vhost = vhost.to_string();
        self
    }

    /// The address this client was created with.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The vhost named in requests.
    pub fn vhost(&self) -> &str {
        &self.vhost
    }

    /// The generated client, for RPCs and fields this crate does not wrap.
    pub fn raw(&self) -> RawClient {
        self.raw.clone()
    }

    pub(crate) fn fill_vhost(&self, vhost: &mut String) {
        if vhost.is_empty() {
            vhost.clone_from(&self.vhost);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_gets_a_scheme_only_when_missing() {
        assert_eq!(
            endpoint_uri("127.0.0.1:7101", false),
            "http://127.0.0.1:7101"
        );
        assert_eq!(
            endpoint_uri("127.0.0.1:7101", true),
            "https://127.0.0.1:7101"
        );
        assert_eq!(endpoint_uri("http://h:1", true), "http://h:1");
    }

    #[test]
    fn basic_auth_header_is_base64_of_user_colon_password() {
        let mut auth = Auth::basic("guest", "guest").unwrap();
        let req = auth.call(tonic::Request::new(())).unwrap();
        assert_eq!(
            req.metadata().get("authorization").unwrap(),
            "Basic Z3Vlc3Q6Z3Vlc3Q="
        );
    }
}
