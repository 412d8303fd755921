//! The operator's HTTP endpoint on `http_addr`: `GET /metrics` (Prometheus / OpenMetrics
//! text) and `GET /healthz` (200 when the node is SERVING, 503 otherwise), both without
//! credentials, and the management page ([`super::page`]: `/`, `/login`, ...), which needs a
//! login.
//!
//! It is an attack surface reachable without credentials, so it is small: read-only routes
//! (any other path is 404, any other method 405; the page's only bodies are its login and
//! logout forms), small request bodies (a request that declares one larger than
//! [`MAX_BODY_BYTES`], or sends a chunked one, is refused with 413 before it is read),
//! at most [`MAX_IN_FLIGHT`] requests at once (more get 503 at once: a scrape of many queues
//! costs CPU), at most [`MAX_CONNECTIONS`] connections (more wait in the kernel's backlog),
//! each closed after [`MAX_CONNECTION_LIFETIME`] (a client that opens connections and says
//! nothing cannot hold them), and scrapes encoded off the async workers. Headers are bounded
//! by hyper's defaults. It stops with the node's shutdown signal.
//!
//! Must not: change any state, or say more than the metrics and health say.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::connect_info::Connected;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Requests served at once; more are answered 503 without waiting.
pub const MAX_IN_FLIGHT: usize = 8;
/// Largest request body accepted: the page's login form (a user name and a password,
/// URL-encoded); the other routes read none.
pub const MAX_BODY_BYTES: usize = 4096;
/// Connections served at once; more are accepted as these close.
pub const MAX_CONNECTIONS: usize = 32;
/// A connection is closed this long after it was accepted, whatever it is doing (Prometheus
/// opens a new one).
pub const MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
struct HttpState {
    registry: Arc<Registry>,
    serving: watch::Receiver<bool>,
    in_flight: Arc<Semaphore>,
}

/// The peer address of a request (`ConnectInfo<Peer>`), for the page's login rules.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl Connected<axum::serve::IncomingStream<'_, BoundedListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, BoundedListener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}

/// Serve until `stop` is cancelled (then finish the requests in flight). `page`: the
/// management page's routes, under the same bounds.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    serving: watch::Receiver<bool>,
    page: Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let state = HttpState {
        registry,
        serving,
        in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
    };
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(state.clone())
        .merge(page)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(state, bounded));
    let listener = BoundedListener {
        inner: listener,
        slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
    };
    axum::serve(listener, app.into_make_service_with_connect_info::<Peer>())
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
}

/// Refuses a declared body over the limit and requests past [`MAX_IN_FLIGHT`].
async fn bounded(State(state): State<HttpState>, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let chunked = request.headers().contains_key(header::TRANSFER_ENCODING);
    if chunked || declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            "request bodies are not accepted\n",
        )
            .into_response();
    }
    let Ok(_permit) = state.in_flight.try_acquire() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests in flight\n",
        )
            .into_response();
    };
    next.run(request).await
}

async fn metrics(State(state): State<HttpState>) -> Response {
    let registry = state.registry.clone();
    // Walking thousands of groups is CPU work: not on an async worker.
    let encoded = qq_raft::lockstep::spawn_blocking(move || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).map(|()| text)
    })
    .await;
    match encoded {
        Ok(Ok(text)) => ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response(),
        Ok(Err(e)) => {
            warn!("metrics: encode: {e}");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response()
        }
        Err(e) => {
            warn!("metrics: scrape task: {e}");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response()
        }
    }
}

async fn healthz(State(state): State<HttpState>) -> Response {
    if *state.serving.borrow() {
        (StatusCode::OK, "SERVING\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "NOT_SERVING\n").into_response()
    }
}

/// The TCP listener with [`MAX_CONNECTIONS`] and [`MAX_CONNECTION_LIFETIME`].
pub struct BoundedListener {
    inner: TcpListener,
    slots: Arc<Semaphore>,
}

impl axum::serve::Listener for BoundedListener {
    type Io = BoundedConnection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (BoundedConnection, SocketAddr) {
        let slot = loop {
            match self.slots.clone().acquire_owned().await {
                Ok(slot) => break slot,
                // Never closed; if it were, waiting a little keeps this from spinning.
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        };
        loop {
            match self.inner.accept().await {
                Ok((stream, address)) => {
                    let connection = BoundedConnection {
                        stream,
                        _slot: slot,
                        deadline: Box::pin(tokio::time::sleep(MAX_CONNECTION_LIFETIME)),
                    };
                    return (connection, address);
                }
                // Out of file descriptors and the like: wait rather than spin.
                Err(e) => {
                    warn!("http_addr: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An accepted connection: holds its slot, and fails every read and write once its lifetime
/// is over (hyper then closes it).
pub struct BoundedConnection {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    deadline: Pin<Box<Sleep>>,
}

impl BoundedConnection {
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

fn lifetime_over() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "http connection reached its lifetime",
    )
}

impl AsyncRead for BoundedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.expired(cx) {
            return Poll::Ready(Err(lifetime_over()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for BoundedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.expired(cx) {
            return Poll::Ready(Err(lifetime_over()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
