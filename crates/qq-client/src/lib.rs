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
//!
//! [`BrokerClient`]: v1::broker_client::BrokerClient

mod admin;
mod connection;
mod consume;
mod error;
mod get;
mod messages;
mod publish;
mod topology;
mod values;

pub use qq_proto::v1;
pub use qq_proto::v1::{
    BindingInfo, ClusterStatusResponse, Delivery, EffectiveConfig, ExchangeInfo, Message,
    OverviewResponse, Policy, Properties, PublishOutcome, PublishRequest, PublishResponse,
    QueueInfo, SettleOutcome, Subscribe, Value,
};

pub use connection::{
    Auth, CONNECT_TIMEOUT, Client, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, MAX_GRPC_MESSAGE_BYTES,
    RawClient, TlsOptions,
};
pub use consume::Consumer;
pub use error::{Error, Result, code_name};
pub use messages::{
    DeathSummary, MessageBuilder, death_summary, delivery_body, delivery_headers, message,
};
pub use publish::{Confirm, Publisher};
pub use values::{ValueExt, display_table, display_value, string_list, table};
