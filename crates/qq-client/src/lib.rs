//! # qq-client: a small Rust client for quorumq
//!
//! quorumq speaks one protocol to the outside world: the `qq.v1.Broker` gRPC service of
//! `docs/api.md`. Any node answers any request (a node that does not lead the queue concerned
//! forwards the work), so a client needs exactly one address. This crate is a thin, typed layer
//! over the generated [`BrokerClient`]; it exists so that `qqctl`, the integration tests and
//! applications do not each re-invent the same four things:
//!
//! 1. **Connecting and authenticating.** [`Client::connect`] accepts `127.0.0.1:7101` or
//!    `http://host:port`, raises tonic's 4 MiB message limit to 64 MiB (the node enforces its
//!    own, configurable, bound), and [`Client::with_credentials`] installs an interceptor that
//!    adds `authorization: Basic base64(user:password)` to every request. Without credentials a
//!    request acts as `guest`, as the contract says.
//! 2. **Publishing with confirms.** [`Client::publish`] is the unary RPC: it returns once every
//!    routed queue has committed the message, with the [`PublishOutcome`]. For throughput,
//!    [`Publisher`] drives `PublishStream`: it numbers messages, keeps at most `window` of them
//!    unconfirmed (waiting for confirms when the window is full), and hands confirms back by
//!    `seq`, in whatever order the server answers.
//! 3. **Consuming.** [`Client::consume`] opens the bidirectional `Consume` stream, subscribes
//!    and waits for `subscribed`; the returned [`Consumer`] yields deliveries with
//!    [`Consumer::next`] and settles them with [`Consumer::ack`], [`Consumer::nack`] and
//!    [`Consumer::reject`]. Dropping a consumer closes the stream, and the server returns its
//!    unsettled deliveries to the queue.
//! 4. **Building values.** Arguments, policy definitions and headers are
//!    `map<string, Value>`; [`ValueExt`] adds `Value::string("x")`, `Value::long(5)`, … and
//!    readers, [`table`] builds a map from pairs, and [`MessageBuilder`] builds a [`Message`].
//!
//! TLS: [`Client::connect_tls`] with a [`TlsOptions`] (the CA that signed the node's
//! certificate, and a client certificate when the node requires one) speaks `https://`.
//!
//! Errors keep the server's [`tonic::Status`] ([`Error::Status`]), so callers can branch on the
//! gRPC code, and [`code_name`] prints it the way the contract spells it (`INVALID_ARGUMENT`).
//!
//! Deliberately left out: retries, leader discovery and reconnection. The server forwards to
//! leaders itself, `UNAVAILABLE` is the caller's to retry (it knows whether a retry is safe),
//! and a tonic `Channel` already reconnects lazily after a broken connection.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

pub use qq_proto::v1;
use qq_proto::v1::broker_client::BrokerClient;
pub use qq_proto::v1::{
    BindingInfo, ClusterStatusResponse, Delivery, EffectiveConfig, ExchangeInfo, Message,
    OverviewResponse, Policy, Properties, PublishOutcome, PublishRequest, PublishResponse,
    QueueInfo, SettleOutcome, Subscribe, Value,
};
use qq_proto::v1::{consume_request, consume_response, value};

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
const REQUEST_CHANNEL_CAPACITY: usize = 1024;

/// Everything that can go wrong talking to a node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The address could not be turned into a gRPC endpoint.
    #[error("invalid address '{address}': {source}")]
    InvalidAddress {
        address: String,
        source: tonic::transport::Error,
    },
    /// The TCP/HTTP2 connection could not be established.
    #[error("connect to {address}: {source}")]
    Connect {
        address: String,
        source: tonic::transport::Error,
    },
    /// The TLS options could not be used (unreadable file, bad PEM, `http://` with TLS).
    #[error("tls: {0}")]
    Tls(String),
    /// User name or password cannot travel as gRPC metadata.
    #[error("invalid credentials: {0}")]
    InvalidCredentials(String),
    /// The server answered with a gRPC status (kept whole: branch on `status.code()`).
    #[error("{}: {}", code_name(.0.code()), .0.message())]
    Status(#[from] tonic::Status),
    /// The server broke the stream protocol of docs/api.md (e.g. no `subscribed` first).
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The request half of a stream is gone (the call ended).
    #[error("stream closed: {0}")]
    Closed(&'static str),
}

impl Error {
    /// The gRPC status, if the server answered with one.
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            Error::Status(s) => Some(s),
            _ => None,
        }
    }

    /// The gRPC code (`Unavailable` for connection problems).
    pub fn code(&self) -> tonic::Code {
        match self {
            Error::Status(s) => s.code(),
            Error::InvalidAddress { .. } | Error::InvalidCredentials(_) | Error::Tls(_) => {
                tonic::Code::InvalidArgument
            }
            Error::Connect { .. } | Error::Closed(_) => tonic::Code::Unavailable,
            Error::Protocol(_) => tonic::Code::Internal,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The gRPC code as the contract spells it: `INVALID_ARGUMENT`, `NOT_FOUND`, ….
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

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
    vhost: String,
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

    // ---- topology -------------------------------------------------------------------------

    /// Declares an exchange of `kind` (`direct`, `fanout`, `topic`, `headers`), durable.
    pub async fn declare_exchange(&self, name: &str, kind: &str) -> Result<()> {
        self.declare_exchange_with(v1::DeclareExchangeRequest {
            name: name.into(),
            r#type: kind.into(),
            durable: true,
            ..Default::default()
        })
        .await
    }

    /// Declares an exchange from a full request (the vhost is filled in when empty).
    pub async fn declare_exchange_with(&self, mut req: v1::DeclareExchangeRequest) -> Result<()> {
        self.fill_vhost(&mut req.vhost);
        self.raw().declare_exchange(req).await?;
        Ok(())
    }

    /// Deletes an exchange.
    pub async fn delete_exchange(&self, name: &str, if_unused: bool) -> Result<()> {
        let req = v1::DeleteExchangeRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
            if_unused,
        };
        self.raw().delete_exchange(req).await?;
        Ok(())
    }

    /// Declares a quorum queue with `arguments` (`x-max-length`, `x-message-ttl`, …).
    pub async fn declare_queue(
        &self,
        name: &str,
        arguments: HashMap<String, Value>,
    ) -> Result<v1::DeclareQueueResponse> {
        let req = v1::DeclareQueueRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
            arguments,
            passive: false,
        };
        Ok(self.raw().declare_queue(req).await?.into_inner())
    }

    /// Checks that a queue exists (passive declare) and returns its counts.
    pub async fn declare_queue_passive(&self, name: &str) -> Result<v1::DeclareQueueResponse> {
        let req = v1::DeclareQueueRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
            arguments: HashMap::new(),
            passive: true,
        };
        Ok(self.raw().declare_queue(req).await?.into_inner())
    }

    /// Deletes a queue; returns the number of messages it held.
    pub async fn delete_queue(&self, name: &str, if_unused: bool, if_empty: bool) -> Result<u64> {
        let req = v1::DeleteQueueRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
            if_unused,
            if_empty,
        };
        Ok(self
            .raw()
            .delete_queue(req)
            .await?
            .into_inner()
            .message_count)
    }

    /// Removes every ready message; returns how many.
    pub async fn purge_queue(&self, name: &str) -> Result<u64> {
        let req = v1::PurgeQueueRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
        };
        Ok(self
            .raw()
            .purge_queue(req)
            .await?
            .into_inner()
            .message_count)
    }

    /// Binds `queue` to `exchange` with `routing_key` (and `arguments`, for headers exchanges).
    pub async fn bind(
        &self,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: HashMap<String, Value>,
    ) -> Result<()> {
        let req = self.bind_request(queue, exchange, routing_key, arguments);
        self.raw().bind_queue(req).await?;
        Ok(())
    }

    /// Removes a binding (the same four fields as [`Client::bind`]).
    pub async fn unbind(
        &self,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: HashMap<String, Value>,
    ) -> Result<()> {
        let req = self.bind_request(queue, exchange, routing_key, arguments);
        self.raw().unbind_queue(req).await?;
        Ok(())
    }

    fn bind_request(
        &self,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: HashMap<String, Value>,
    ) -> v1::BindRequest {
        v1::BindRequest {
            vhost: self.vhost.clone(),
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            arguments,
        }
    }

    // ---- publishing -----------------------------------------------------------------------

    /// Publishes one message and waits until every routed queue has committed it.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<Confirm> {
        self.publish_with(PublishRequest {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            message: Some(message),
            ..Default::default()
        })
        .await
    }

    /// Publishes with `mandatory` set: an unroutable message comes back as `UNROUTABLE`.
    pub async fn publish_mandatory(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<Confirm> {
        self.publish_with(PublishRequest {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            mandatory: true,
            message: Some(message),
            ..Default::default()
        })
        .await
    }

    /// Publishes a full request (the vhost is filled in when empty).
    pub async fn publish_with(&self, mut req: PublishRequest) -> Result<Confirm> {
        self.fill_vhost(&mut req.vhost);
        let seq = req.seq;
        let resp = self.raw().publish(req).await?.into_inner();
        Ok(Confirm::from_response(PublishResponse { seq, ..resp }))
    }

    /// Opens a `PublishStream` with at most `window` unconfirmed messages in flight.
    pub async fn publisher(&self, window: usize) -> Result<Publisher> {
        let window = window.max(1);
        let (tx, rx) = mpsc::channel(REQUEST_CHANNEL_CAPACITY.min(window).max(1));
        // The call is opened lazily, on the first confirm we wait for: a server may wait for the
        // first request before answering with response headers, and nothing has been sent yet.
        let mut raw = self.raw();
        let opening: OpeningCall =
            Box::pin(async move { raw.publish_stream(ReceiverStream::new(rx)).await });
        Ok(Publisher {
            vhost: self.vhost.clone(),
            tx,
            responses: Responses::Opening(opening),
            window,
            next_seq: 1,
            in_flight: 0,
            ready: VecDeque::new(),
        })
    }

    // ---- consuming ------------------------------------------------------------------------

    /// Subscribes to `queue` with `prefetch` (manual acknowledgement).
    pub async fn consume(&self, queue: &str, prefetch: u32) -> Result<Consumer> {
        self.consume_with(Subscribe {
            queue: queue.into(),
            prefetch_count: prefetch,
            ..Default::default()
        })
        .await
    }

    /// Subscribes from a full `Subscribe` (auto-ack, consumer tag, arguments).
    pub async fn consume_with(&self, mut subscribe: Subscribe) -> Result<Consumer> {
        self.fill_vhost(&mut subscribe.vhost);
        let (tx, rx) = mpsc::channel(REQUEST_CHANNEL_CAPACITY);
        tx.send(v1::ConsumeRequest {
            request: Some(consume_request::Request::Subscribe(subscribe)),
        })
        .await
        .map_err(|_| Error::Closed("consume request channel"))?;
        let mut responses = self
            .raw()
            .consume(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let first = responses
            .message()
            .await?
            .ok_or_else(|| Error::Protocol("consume stream ended before subscribed".into()))?;
        let consumer_tag = match first.response {
            Some(consume_response::Response::Subscribed(s)) => s.consumer_tag,
            Some(consume_response::Response::Cancelled(c)) => {
                return Err(Error::Protocol(format!(
                    "cancelled at subscribe: {}",
                    c.reason
                )));
            }
            other => {
                return Err(Error::Protocol(format!(
                    "expected subscribed first, got {other:?}"
                )));
            }
        };
        Ok(Consumer {
            tx: Some(tx),
            responses,
            consumer_tag,
            cancel_reason: None,
        })
    }

    /// Takes one message (`auto_ack`: settled at once; otherwise held for `lease_ms`, 0 = the
    /// server's default of 30 s, until [`Client::settle`]).
    pub async fn get(&self, queue: &str, auto_ack: bool, lease_ms: u64) -> Result<v1::GetResponse> {
        let req = v1::GetRequest {
            vhost: self.vhost.clone(),
            queue: queue.into(),
            auto_ack,
            lease_ms,
        };
        Ok(self.raw().get(req).await?.into_inner())
    }

    /// Settles messages taken with [`Client::get`], in the order given.
    pub async fn settle(&self, receipts: Vec<String>, outcome: SettleOutcome) -> Result<()> {
        self.settle_with(receipts, outcome, None, None).await
    }

    /// [`Client::settle`] with its options: `reason_detail` (REJECT only, at most 1 024
    /// bytes) is recorded in the dead letter's `x-death` entry and `x-last-death-detail`;
    /// `delay_ms` (REQUEUE only, at most 7 days) keeps the message from being delivered
    /// before then (without it, the queue's `x-requeue-delays` apply).
    pub async fn settle_with(
        &self,
        receipts: Vec<String>,
        outcome: SettleOutcome,
        reason_detail: Option<String>,
        delay_ms: Option<u64>,
    ) -> Result<()> {
        let req = v1::SettleRequest {
            receipts,
            outcome: outcome as i32,
            reason_detail,
            delay_ms,
        };
        self.raw().settle(req).await?;
        Ok(())
    }

    /// The ready messages at positions `offset..offset + limit` of `queue`, in queue order,
    /// without taking them (`limit` at most 1 000; 0 means 100). Needs read permission.
    pub async fn browse(&self, queue: &str, offset: u64, limit: u32) -> Result<v1::BrowseResponse> {
        let req = v1::BrowseRequest {
            vhost: self.vhost.clone(),
            queue: queue.into(),
            offset,
            limit,
        };
        Ok(self.raw().browse(req).await?.into_inner())
    }

    // ---- move tasks (redrive) ---------------------------------------------------------------

    /// Start moving up to `max_messages` (0: every) ready messages of `source` to
    /// `destination` (empty: each back to its `x-first-death-queue`), at most
    /// `max_per_second` (0: no limit). Returns the task id.
    pub async fn start_move_task(
        &self,
        source: &str,
        destination: &str,
        max_messages: u64,
        max_per_second: u32,
    ) -> Result<String> {
        let req = v1::StartMoveTaskRequest {
            vhost: self.vhost.clone(),
            source: source.into(),
            destination: destination.into(),
            max_messages,
            max_per_second,
        };
        Ok(self.raw().start_move_task(req).await?.into_inner().task_id)
    }

    /// A move task's state, `moved` and `remaining`.
    pub async fn get_move_task(&self, task_id: &str) -> Result<v1::MoveTask> {
        let req = v1::GetMoveTaskRequest {
            task_id: task_id.into(),
        };
        Ok(self.raw().get_move_task(req).await?.into_inner())
    }

    /// The move tasks of the client's vhost (running and recently ended).
    pub async fn list_move_tasks(&self) -> Result<Vec<v1::MoveTask>> {
        let req = v1::ListMoveTasksRequest {
            vhost: self.vhost.clone(),
        };
        Ok(self.raw().list_move_tasks(req).await?.into_inner().tasks)
    }

    /// Cancel a running move task (messages already moved stay moved).
    pub async fn cancel_move_task(&self, task_id: &str) -> Result<()> {
        let req = v1::CancelMoveTaskRequest {
            task_id: task_id.into(),
        };
        self.raw().cancel_move_task(req).await?;
        Ok(())
    }

    // ---- inspection -----------------------------------------------------------------------

    /// Every queue of the vhost.
    pub async fn list_queues(&self) -> Result<Vec<QueueInfo>> {
        let req = v1::ListQueuesRequest {
            vhost: self.vhost.clone(),
        };
        Ok(self.raw().list_queues(req).await?.into_inner().queues)
    }

    /// One queue, answered by (or forwarded to) its leader.
    pub async fn get_queue(&self, name: &str) -> Result<QueueInfo> {
        let req = v1::GetQueueRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
        };
        Ok(self.raw().get_queue(req).await?.into_inner())
    }

    /// Every exchange of the vhost.
    pub async fn list_exchanges(&self) -> Result<Vec<ExchangeInfo>> {
        let req = v1::ListExchangesRequest {
            vhost: self.vhost.clone(),
        };
        Ok(self.raw().list_exchanges(req).await?.into_inner().exchanges)
    }

    /// Every binding of the vhost.
    pub async fn list_bindings(&self) -> Result<Vec<BindingInfo>> {
        let req = v1::ListBindingsRequest {
            vhost: self.vhost.clone(),
        };
        Ok(self.raw().list_bindings(req).await?.into_inner().bindings)
    }

    /// Nodes, their reachability, the metadata leader and every queue's leader, as this node
    /// sees them.
    pub async fn cluster_status(&self) -> Result<ClusterStatusResponse> {
        Ok(self
            .raw()
            .cluster_status(v1::ClusterStatusRequest {})
            .await?
            .into_inner())
    }

    /// Cluster-wide counters.
    pub async fn overview(&self) -> Result<OverviewResponse> {
        Ok(self
            .raw()
            .overview(v1::OverviewRequest {})
            .await?
            .into_inner())
    }

    // ---- policies -------------------------------------------------------------------------

    /// Sets (creates or replaces) a policy.
    pub async fn set_policy(
        &self,
        name: &str,
        pattern: &str,
        apply_to: &str,
        priority: i64,
        definition: HashMap<String, Value>,
    ) -> Result<()> {
        let req = v1::SetPolicyRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
            pattern: pattern.into(),
            apply_to: apply_to.into(),
            priority,
            definition,
        };
        self.raw().set_policy(req).await?;
        Ok(())
    }

    /// Removes a policy.
    pub async fn clear_policy(&self, name: &str) -> Result<()> {
        let req = v1::ClearPolicyRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
        };
        self.raw().clear_policy(req).await?;
        Ok(())
    }

    /// Every policy of the vhost.
    pub async fn list_policies(&self) -> Result<Vec<Policy>> {
        let req = v1::ListPoliciesRequest {
            vhost: self.vhost.clone(),
        };
        Ok(self.raw().list_policies(req).await?.into_inner().policies)
    }

    // ---- users and vhosts -----------------------------------------------------------------

    /// Creates or updates a user.
    pub async fn put_user(&self, name: &str, password: &str, tags: Vec<String>) -> Result<()> {
        let req = v1::PutUserRequest {
            name: name.into(),
            password: password.into(),
            tags,
            password_hash: String::new(),
        };
        self.raw().put_user(req).await?;
        Ok(())
    }

    /// Creates or updates a user with an Argon2id PHC string as `ExportDefinitions` gives it
    /// (the node validates it), instead of a password.
    pub async fn put_user_with_hash(
        &self,
        name: &str,
        password_hash: &str,
        tags: Vec<String>,
    ) -> Result<()> {
        let req = v1::PutUserRequest {
            name: name.into(),
            password: String::new(),
            tags,
            password_hash: password_hash.into(),
        };
        self.raw().put_user(req).await?;
        Ok(())
    }

    /// The cluster's definitions (users, vhosts, permissions, exchanges, queues, bindings,
    /// policies, limits) as one JSON document; administrators only.
    pub async fn export_definitions(&self) -> Result<String> {
        let r = self
            .raw()
            .export_definitions(v1::ExportDefinitionsRequest {})
            .await?;
        Ok(r.into_inner().definitions_json)
    }

    /// Imports a definitions document: all of it is checked first, then what is not already
    /// there is created; per kind, what was created, updated or already there.
    pub async fn import_definitions(&self, json: &str) -> Result<Vec<v1::ImportCount>> {
        let r = self
            .raw()
            .import_definitions(v1::ImportDefinitionsRequest {
                definitions_json: json.into(),
            })
            .await?;
        Ok(r.into_inner().counts)
    }

    /// Deletes a user.
    pub async fn delete_user(&self, name: &str) -> Result<()> {
        self.raw()
            .delete_user(v1::DeleteUserRequest { name: name.into() })
            .await?;
        Ok(())
    }

    /// Sets a user's permissions on a vhost (three regexes).
    pub async fn set_permissions(
        &self,
        user: &str,
        vhost: &str,
        configure: &str,
        write: &str,
        read: &str,
    ) -> Result<()> {
        let req = v1::SetPermissionsRequest {
            user: user.into(),
            vhost: vhost.into(),
            configure: configure.into(),
            write: write.into(),
            read: read.into(),
        };
        self.raw().set_permissions(req).await?;
        Ok(())
    }

    /// Creates a vhost.
    pub async fn put_vhost(&self, name: &str) -> Result<()> {
        self.raw()
            .put_vhost(v1::PutVhostRequest { name: name.into() })
            .await?;
        Ok(())
    }

    /// Deletes a vhost and everything in it.
    pub async fn delete_vhost(&self, name: &str) -> Result<()> {
        self.raw()
            .delete_vhost(v1::DeleteVhostRequest { name: name.into() })
            .await?;
        Ok(())
    }

    /// Replaces a vhost's limits (all `None`: clears them). Administrators only.
    pub async fn set_vhost_limits(&self, vhost: &str, limits: v1::Limits) -> Result<()> {
        self.raw()
            .set_vhost_limits(v1::SetVhostLimitsRequest {
                vhost: vhost.into(),
                limits: Some(limits),
            })
            .await?;
        Ok(())
    }

    /// Replaces a user's limits (all `None`: clears them). Administrators only.
    pub async fn set_user_limits(&self, user: &str, limits: v1::Limits) -> Result<()> {
        self.raw()
            .set_user_limits(v1::SetUserLimitsRequest {
                user: user.into(),
                limits: Some(limits),
            })
            .await?;
        Ok(())
    }

    /// Every vhost and user with limits set. Administrators only.
    pub async fn list_limits(&self) -> Result<v1::ListLimitsResponse> {
        Ok(self
            .raw()
            .list_limits(v1::ListLimitsRequest {})
            .await?
            .into_inner())
    }

    // Membership changes (issue 15). Administrators only.

    /// Adds `node` to the replicas of `queue` (in the client's vhost).
    pub async fn add_member(&self, queue: &str, node: u64) -> Result<v1::MemberChange> {
        let req = v1::MemberRequest {
            vhost: self.vhost.clone(),
            queue: queue.into(),
            node,
        };
        Ok(self.raw().add_member(req).await?.into_inner())
    }

    /// Removes `node` from the replicas of `queue` (in the client's vhost).
    pub async fn delete_member(&self, queue: &str, node: u64) -> Result<v1::MemberChange> {
        let req = v1::MemberRequest {
            vhost: self.vhost.clone(),
            queue: queue.into(),
            node,
        };
        Ok(self.raw().delete_member(req).await?.into_inner())
    }

    /// Adds `node` to every queue whose name matches `pattern` (in `vhost`; empty: every
    /// vhost).
    pub async fn grow_queues(
        &self,
        node: u64,
        pattern: &str,
        vhost: &str,
    ) -> Result<Vec<v1::MemberChange>> {
        let req = v1::GrowQueuesRequest {
            node,
            pattern: pattern.into(),
            vhost: vhost.into(),
        };
        Ok(self.raw().grow_queues(req).await?.into_inner().changes)
    }

    /// Removes `node` from every queue where it is a member and not the last one.
    pub async fn shrink_queues(&self, node: u64) -> Result<Vec<v1::MemberChange>> {
        let req = v1::ShrinkQueuesRequest { node };
        Ok(self.raw().shrink_queues(req).await?.into_inner().changes)
    }

    /// Moves queue leaders so each node leads about as many as the others.
    pub async fn rebalance_leaders(&self) -> Result<v1::RebalanceLeadersResponse> {
        Ok(self
            .raw()
            .rebalance_leaders(v1::RebalanceLeadersRequest {})
            .await?
            .into_inner())
    }

    /// The queues that would lose their majority if `node` stopped now.
    pub async fn quorum_critical(&self, node: u64) -> Result<v1::QuorumCriticalResponse> {
        Ok(self
            .raw()
            .quorum_critical(v1::QuorumCriticalRequest { node })
            .await?
            .into_inner())
    }

    /// Lets node `id` (started, empty, configured with the cluster's peers and itself) join
    /// the running cluster. `address`: its client address; `cluster_address`: its node-to-node
    /// address. Returns why nothing changed, or an empty string.
    pub async fn join_node(&self, id: u64, address: &str, cluster_address: &str) -> Result<String> {
        let req = v1::JoinNodeRequest {
            id,
            address: address.into(),
            cluster_address: cluster_address.into(),
        };
        Ok(self.raw().join_node(req).await?.into_inner().detail)
    }

    /// Forgets the stopped node `id` for good: its queue replicas are deleted first.
    pub async fn forget_node(&self, id: u64) -> Result<Vec<v1::MemberChange>> {
        let req = v1::ForgetNodeRequest { id };
        Ok(self.raw().forget_node(req).await?.into_inner().changes)
    }

    fn fill_vhost(&self, vhost: &mut String) {
        if vhost.is_empty() {
            vhost.clone_from(&self.vhost);
        }
    }
}

/// The answer to one publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Confirm {
    /// The publisher's sequence number (0 for a unary publish).
    pub seq: u64,
    pub outcome: PublishOutcome,
    /// Why, for `REJECTED` (which queue refused it and why) and `FAILED` (the refusal's message).
    pub detail: String,
    /// For `FAILED`: the status unary `publish` would have answered (e.g. `NotFound` for a
    /// missing exchange); `Ok` otherwise.
    pub code: tonic::Code,
}

impl Confirm {
    fn from_response(r: PublishResponse) -> Confirm {
        Confirm {
            seq: r.seq,
            outcome: r.outcome(),
            code: tonic::Code::from_i32(r.code),
            detail: r.detail,
        }
    }

    /// Every routed queue committed the message.
    pub fn is_confirmed(&self) -> bool {
        self.outcome == PublishOutcome::Confirmed
    }
}

/// A pipelined publisher over `PublishStream`.
///
/// [`Publisher::send`] numbers the message and sends it at once unless `window` messages are
/// unconfirmed; then it first waits for a confirm. Confirms that arrive meanwhile are kept and
/// returned by [`Publisher::take_confirms`], [`Publisher::next_confirm`] or
/// [`Publisher::flush`]. Sequence numbers start at 1.
pub struct Publisher {
    vhost: String,
    tx: mpsc::Sender<PublishRequest>,
    responses: Responses,
    window: usize,
    next_seq: u64,
    in_flight: usize,
    ready: VecDeque<Confirm>,
}

type OpeningCall = futures::future::BoxFuture<
    'static,
    Result<tonic::Response<Streaming<PublishResponse>>, tonic::Status>,
>;

/// The response half of a `PublishStream` call: opening until the server answers.
enum Responses {
    Opening(OpeningCall),
    Open(Box<Streaming<PublishResponse>>),
}

impl Publisher {
    /// The response stream, opening the call first if needed.
    async fn responses(&mut self) -> Result<&mut Streaming<PublishResponse>> {
        if let Responses::Opening(call) = &mut self.responses {
            let stream = call.await?.into_inner();
            self.responses = Responses::Open(Box::new(stream));
        }
        match &mut self.responses {
            Responses::Open(stream) => Ok(stream),
            Responses::Opening(_) => unreachable!("the call was just opened"),
        }
    }

    /// Sends one message; returns its `seq`.
    pub async fn send(
        &mut self,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<u64> {
        self.send_request(PublishRequest {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            message: Some(message),
            ..Default::default()
        })
        .await
    }

    /// Sends a full request; its `seq` is replaced by the publisher's next one, returned.
    pub async fn send_request(&mut self, mut req: PublishRequest) -> Result<u64> {
        while self.in_flight >= self.window {
            self.receive_one().await?;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        req.seq = seq;
        if req.vhost.is_empty() {
            req.vhost.clone_from(&self.vhost);
        }
        if self.tx.send(req).await.is_err() {
            // The call ended; its status says why.
            return Err(self.ended_error().await);
        }
        self.in_flight += 1;
        Ok(seq)
    }

    /// Number of sent, unconfirmed messages.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Confirms received so far and not yet taken, without waiting.
    pub fn take_confirms(&mut self) -> Vec<Confirm> {
        self.ready.drain(..).collect()
    }

    /// The next confirm, waiting for one if none is kept; `None` when nothing is in flight.
    pub async fn next_confirm(&mut self) -> Result<Option<Confirm>> {
        if self.ready.is_empty() && self.in_flight > 0 {
            self.receive_one().await?;
        }
        Ok(self.ready.pop_front())
    }

    /// Waits until every sent message is confirmed; returns all confirms not yet taken.
    pub async fn flush(&mut self) -> Result<Vec<Confirm>> {
        while self.in_flight > 0 {
            self.receive_one().await?;
        }
        Ok(self.take_confirms())
    }

    /// Flushes, then closes the request stream and waits for the server to end the call.
    pub async fn close(mut self) -> Result<Vec<Confirm>> {
        let confirms = self.flush().await?;
        let Publisher { tx, responses, .. } = self;
        drop(tx);
        // Still opening after a flush means nothing was ever sent: there is no call to end.
        if let Responses::Open(mut stream) = responses {
            while stream.message().await?.is_some() {}
        }
        Ok(confirms)
    }

    async fn receive_one(&mut self) -> Result<()> {
        match self.responses().await?.message().await? {
            Some(r) => {
                self.in_flight = self.in_flight.saturating_sub(1);
                self.ready.push_back(Confirm::from_response(r));
                Ok(())
            }
            None => Err(Error::Protocol(format!(
                "publish stream ended with {} messages unconfirmed",
                self.in_flight
            ))),
        }
    }

    async fn ended_error(&mut self) -> Error {
        loop {
            let responses = match self.responses().await {
                Ok(r) => r,
                Err(e) => return e,
            };
            match responses.message().await {
                Ok(Some(r)) => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.ready.push_back(Confirm::from_response(r));
                }
                Ok(None) => return Error::Closed("publish stream"),
                Err(status) => return Error::Status(status),
            }
        }
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("window", &self.window)
            .field("next_seq", &self.next_seq)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

/// A subscription on a queue (`Consume` stream).
pub struct Consumer {
    tx: Option<mpsc::Sender<v1::ConsumeRequest>>,
    responses: Streaming<v1::ConsumeResponse>,
    consumer_tag: String,
    cancel_reason: Option<String>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("consumer_tag", &self.consumer_tag)
            .field("cancel_reason", &self.cancel_reason)
            .finish()
    }
}

impl Consumer {
    /// The tag the server confirmed in `subscribed`.
    pub fn consumer_tag(&self) -> &str {
        &self.consumer_tag
    }

    /// Why the server cancelled the subscription (e.g. the queue was deleted), once it has.
    pub fn cancel_reason(&self) -> Option<&str> {
        self.cancel_reason.as_deref()
    }

    /// The next delivery; `None` when the stream ended (cancelled by either side).
    pub async fn next(&mut self) -> Option<Result<Delivery>> {
        loop {
            match self.responses.message().await {
                Ok(Some(r)) => match r.response {
                    Some(consume_response::Response::Delivery(d)) => return Some(Ok(d)),
                    Some(consume_response::Response::Cancelled(c)) => {
                        self.cancel_reason = Some(c.reason);
                        return None;
                    }
                    Some(consume_response::Response::Subscribed(_)) | None => continue,
                },
                Ok(None) => return None,
                Err(status) => return Some(Err(Error::Status(status))),
            }
        }
    }

    /// Like [`Consumer::next`] but gives up after `timeout` (`Ok(None)` then, or when the
    /// stream ended).
    pub async fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Delivery>> {
        match tokio::time::timeout(timeout, self.next()).await {
            Ok(Some(r)) => r.map(Some),
            Ok(None) | Err(_) => Ok(None),
        }
    }

    /// Acknowledges `tag` (with `multiple`, every unsettled tag up to and including it).
    pub async fn ack(&self, tag: u64, multiple: bool) -> Result<()> {
        self.settle(vec![tag], multiple, SettleOutcome::Ack).await
    }

    /// Negative acknowledgement: `requeue` returns the message to the queue (redelivered,
    /// `x-delivery-count` + 1), otherwise it is rejected (dead-lettered with reason `rejected`).
    pub async fn nack(&self, tag: u64, multiple: bool, requeue: bool) -> Result<()> {
        let outcome = if requeue {
            SettleOutcome::Requeue
        } else {
            SettleOutcome::Reject
        };
        self.settle(vec![tag], multiple, outcome).await
    }

    /// Rejects one delivery without requeueing it.
    pub async fn reject(&self, tag: u64) -> Result<()> {
        self.nack(tag, false, false).await
    }

    /// Settles several tags with one outcome.
    pub async fn settle(
        &self,
        delivery_tags: Vec<u64>,
        multiple: bool,
        outcome: SettleOutcome,
    ) -> Result<()> {
        self.settle_with(delivery_tags, multiple, outcome, None, None)
            .await
    }

    /// Rejects one delivery (dead-lettered with reason `rejected`) and says why: `detail`
    /// (at most 1 024 bytes) becomes the `x-death` entry's `reason-detail` and the dead
    /// letter's `x-last-death-detail` header.
    pub async fn reject_with_reason(&self, tag: u64, detail: &str) -> Result<()> {
        self.settle_with(
            vec![tag],
            false,
            SettleOutcome::Reject,
            Some(detail.into()),
            None,
        )
        .await
    }

    /// Requeues one delivery, not to be delivered again before `delay_ms` (at most 7 days;
    /// 0: at once, whatever the queue's `x-requeue-delays`).
    pub async fn requeue_after(&self, tag: u64, delay_ms: u64) -> Result<()> {
        self.settle_with(
            vec![tag],
            false,
            SettleOutcome::Requeue,
            None,
            Some(delay_ms),
        )
        .await
    }

    /// [`Consumer::settle`] with the options of [`Client::settle_with`]. A bad option ends
    /// the stream with INVALID_ARGUMENT.
    pub async fn settle_with(
        &self,
        delivery_tags: Vec<u64>,
        multiple: bool,
        outcome: SettleOutcome,
        reason_detail: Option<String>,
        delay_ms: Option<u64>,
    ) -> Result<()> {
        let req = v1::ConsumeRequest {
            request: Some(consume_request::Request::Settle(v1::ConsumeSettle {
                delivery_tags,
                multiple,
                outcome: outcome as i32,
                reason_detail,
                delay_ms,
            })),
        };
        self.send(req).await
    }

    /// Asks the server to cancel the subscription; unsettled deliveries return to the queue.
    /// Keep calling [`Consumer::next`] to drain until it returns `None`.
    pub async fn cancel(&self) -> Result<()> {
        let req = v1::ConsumeRequest {
            request: Some(consume_request::Request::Cancel(v1::Cancel {})),
        };
        self.send(req).await
    }

    /// Closes the request half of the stream (as dropping the consumer does).
    pub fn close(&mut self) {
        self.tx = None;
    }

    async fn send(&self, req: v1::ConsumeRequest) -> Result<()> {
        let tx = self.tx.as_ref().ok_or(Error::Closed("consumer closed"))?;
        tx.send(req)
            .await
            .map_err(|_| Error::Closed("consume stream"))
    }
}

// ---- values, headers, messages -------------------------------------------------------------

/// Constructors and readers for [`Value`]; bring it into scope to write `Value::string("x")`.
pub trait ValueExt: Sized {
    fn string(s: impl Into<String>) -> Self;
    fn long(n: i64) -> Self;
    fn bool(b: bool) -> Self;
    fn double(d: f64) -> Self;
    fn bytes(b: impl Into<Bytes>) -> Self;
    fn timestamp(seconds: i64) -> Self;
    fn list(values: Vec<Value>) -> Self;
    fn table(fields: HashMap<String, Value>) -> Self;
    fn as_str(&self) -> Option<&str>;
    fn as_long(&self) -> Option<i64>;
    fn as_bool(&self) -> Option<bool>;
    fn as_list(&self) -> Option<&[Value]>;
    fn as_table(&self) -> Option<&HashMap<String, Value>>;
}

impl ValueExt for Value {
    fn string(s: impl Into<String>) -> Self {
        Value {
            kind: Some(value::Kind::StringValue(s.into())),
        }
    }
    fn long(n: i64) -> Self {
        Value {
            kind: Some(value::Kind::LongValue(n)),
        }
    }
    fn bool(b: bool) -> Self {
        Value {
            kind: Some(value::Kind::BoolValue(b)),
        }
    }
    fn double(d: f64) -> Self {
        Value {
            kind: Some(value::Kind::DoubleValue(d)),
        }
    }
    fn bytes(b: impl Into<Bytes>) -> Self {
        Value {
            kind: Some(value::Kind::BytesValue(b.into())),
        }
    }
    fn timestamp(seconds: i64) -> Self {
        Value {
            kind: Some(value::Kind::TimestampValue(seconds)),
        }
    }
    fn list(values: Vec<Value>) -> Self {
        Value {
            kind: Some(value::Kind::ListValue(v1::ValueList { values })),
        }
    }
    fn table(fields: HashMap<String, Value>) -> Self {
        Value {
            kind: Some(value::Kind::TableValue(v1::ValueTable { fields })),
        }
    }
    fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Some(value::Kind::StringValue(s)) => Some(s),
            _ => None,
        }
    }
    fn as_long(&self) -> Option<i64> {
        match &self.kind {
            Some(value::Kind::LongValue(n)) => Some(*n),
            _ => None,
        }
    }
    fn as_bool(&self) -> Option<bool> {
        match &self.kind {
            Some(value::Kind::BoolValue(b)) => Some(*b),
            _ => None,
        }
    }
    fn as_list(&self) -> Option<&[Value]> {
        match &self.kind {
            Some(value::Kind::ListValue(l)) => Some(&l.values),
            _ => None,
        }
    }
    fn as_table(&self) -> Option<&HashMap<String, Value>> {
        match &self.kind {
            Some(value::Kind::TableValue(t)) => Some(&t.fields),
            _ => None,
        }
    }
}

/// A `map<string, Value>` from pairs: `table([("x-max-length", Value::long(5))])`.
pub fn table<K: Into<String>>(
    pairs: impl IntoIterator<Item = (K, Value)>,
) -> HashMap<String, Value> {
    pairs.into_iter().map(|(k, v)| (k.into(), v)).collect()
}

/// A list of strings as a `Value` (for `CC` / `BCC` headers).
pub fn string_list<S: Into<String>>(items: impl IntoIterator<Item = S>) -> Value {
    Value::list(items.into_iter().map(Value::string).collect())
}

/// A readable rendering of a value: strings quoted, lists in `[..]`, tables in `{..}` with
/// sorted keys, bytes as hex, timestamps as `@seconds`.
pub fn display_value(v: &Value) -> String {
    match &v.kind {
        None => "null".into(),
        Some(value::Kind::StringValue(s)) => format!("{s:?}"),
        Some(value::Kind::LongValue(n)) => n.to_string(),
        Some(value::Kind::BoolValue(b)) => b.to_string(),
        Some(value::Kind::DoubleValue(d)) => d.to_string(),
        Some(value::Kind::BytesValue(b)) => {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            format!("0x{hex}")
        }
        Some(value::Kind::TimestampValue(t)) => format!("@{t}"),
        Some(value::Kind::ListValue(l)) => {
            let items: Vec<String> = l.values.iter().map(display_value).collect();
            format!("[{}]", items.join(", "))
        }
        Some(value::Kind::TableValue(t)) => display_table(&t.fields),
    }
}

/// A readable rendering of a table, keys sorted: `{a: 1, b: "x"}`.
pub fn display_table(t: &HashMap<String, Value>) -> String {
    let mut keys: Vec<&String> = t.keys().collect();
    keys.sort();
    let items: Vec<String> = keys
        .iter()
        .map(|k| format!("{k}: {}", display_value(&t[*k])))
        .collect();
    format!("{{{}}}", items.join(", "))
}

/// Builds a [`Message`]: `MessageBuilder::new("body").header("k", Value::long(1)).build()`.
#[derive(Debug, Clone, Default)]
pub struct MessageBuilder {
    message: Message,
}

impl MessageBuilder {
    pub fn new(body: impl Into<Bytes>) -> Self {
        MessageBuilder {
            message: Message {
                properties: Some(Properties::default()),
                body: body.into(),
            },
        }
    }

    fn props(&mut self) -> &mut Properties {
        self.message
            .properties
            .get_or_insert_with(Properties::default)
    }

    pub fn header(mut self, key: impl Into<String>, value: Value) -> Self {
        self.props().headers.insert(key.into(), value);
        self
    }

    pub fn headers(mut self, headers: HashMap<String, Value>) -> Self {
        self.props().headers.extend(headers);
        self
    }

    /// Per-message TTL: a decimal string of milliseconds (passed through unchecked, so tests can
    /// send malformed ones).
    pub fn expiration(mut self, expiration: impl Into<String>) -> Self {
        self.props().expiration = expiration.into();
        self
    }

    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.props().message_id = id.into();
        self
    }

    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.props().content_type = content_type.into();
        self
    }

    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.props().correlation_id = id.into();
        self
    }

    /// 2 = persistent (every quorumq message is replicated either way).
    pub fn delivery_mode(mut self, mode: u32) -> Self {
        self.props().delivery_mode = mode;
        self
    }

    pub fn priority(mut self, priority: u32) -> Self {
        self.props().priority = priority;
        self
    }

    /// The publishing user; when set, the node requires it to be the authenticated user.
    pub fn user_id(mut self, user: impl Into<String>) -> Self {
        self.props().user_id = user.into();
        self
    }

    pub fn build(self) -> Message {
        self.message
    }
}

/// A message with just a body.
pub fn message(body: impl Into<Bytes>) -> Message {
    MessageBuilder::new(body).build()
}

/// The headers of a delivery (empty when it has none).
pub fn delivery_headers(d: &Delivery) -> HashMap<String, Value> {
    d.message
        .as_ref()
        .and_then(|m| m.properties.as_ref())
        .map(|p| p.headers.clone())
        .unwrap_or_default()
}

/// One `x-death` entry, as far as people read it: queue, reason, count and the consumer's
/// reason detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeathSummary {
    pub queue: String,
    pub reason: String,
    pub count: i64,
    pub reason_detail: Option<String>,
}

/// The `x-death` history in `headers`, most recent first (empty without one).
pub fn death_summary(headers: &HashMap<String, Value>) -> Vec<DeathSummary> {
    let Some(list) = headers.get("x-death").and_then(|v| match &v.kind {
        Some(value::Kind::ListValue(l)) => Some(&l.values),
        _ => None,
    }) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|entry| match &entry.kind {
            Some(value::Kind::TableValue(t)) => Some(&t.fields),
            _ => None,
        })
        .map(|t| {
            let text = |k: &str| t.get(k).and_then(|v| v.as_str()).map(str::to_string);
            DeathSummary {
                queue: text("queue").unwrap_or_default(),
                reason: text("reason").unwrap_or_default(),
                count: t.get("count").and_then(|v| v.as_long()).unwrap_or(0),
                reason_detail: text("reason-detail"),
            }
        })
        .collect()
}

/// The body of a delivery (empty when it has no message).
pub fn delivery_body(d: &Delivery) -> Bytes {
    d.message
        .as_ref()
        .map(|m| m.body.clone())
        .unwrap_or_default()
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

    #[test]
    fn death_summary_reads_x_death_most_recent_first() {
        let entry = |queue: &str, reason: &str, count: i64, detail: Option<&str>| {
            let mut t = table([
                ("queue", Value::string(queue)),
                ("reason", Value::string(reason)),
                ("count", Value::long(count)),
            ]);
            if let Some(d) = detail {
                t.insert("reason-detail".into(), Value::string(d));
            }
            Value::table(t)
        };
        let headers = table([(
            "x-death",
            Value::list(vec![
                entry("q1", "rejected", 2, Some("bad id")),
                entry("q0", "expired", 1, None),
            ]),
        )]);
        let d = death_summary(&headers);
        assert_eq!(d.len(), 2);
        assert_eq!(
            (d[0].queue.as_str(), d[0].reason.as_str(), d[0].count),
            ("q1", "rejected", 2)
        );
        assert_eq!(d[0].reason_detail.as_deref(), Some("bad id"));
        assert_eq!(d[1].reason_detail, None);
        assert!(death_summary(&HashMap::new()).is_empty());
        assert!(death_summary(&table([("x-death", Value::long(1))])).is_empty());
    }

    #[test]
    fn values_round_trip_and_display() {
        assert_eq!(Value::long(5).as_long(), Some(5));
        assert_eq!(Value::string("x").as_str(), Some("x"));
        let t = table([("b", Value::bool(true)), ("a", string_list(["k1", "k2"]))]);
        assert_eq!(display_table(&t), r#"{a: ["k1", "k2"], b: true}"#);
    }
}
