//! An in-memory network: the nodes of one process listen on and dial addresses of this network
//! only, each connection a `tokio::io::duplex` pipe. For tests, and the base a simulator's
//! network (delays, partitions, loss) builds on.
//!
//! A dial names the peer by its URI's authority (`host:port`, as the cluster address is
//! written); it reaches the node that listens at that address (written the same way), or fails
//! as a refused connection does. Nothing here touches a socket: a channel that bypassed the
//! transport would find nobody at these addresses.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::StreamExt;
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codegen::Service;
use tonic::codegen::http::Uri;
use tonic::transport::server::TcpConnectInfo;
use tonic::transport::{Channel, Endpoint};

use super::{Conn, Incoming, Transport};

/// Bytes a pipe holds in each direction before the writer waits.
const PIPE_BYTES: usize = 1024 * 1024;

/// One in-memory network; clones share it. Each node is handed it as its [`Transport`].
#[derive(Clone, Default)]
pub struct MemoryNetwork {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Who listens at each address, and where their connections go.
    listeners: Mutex<HashMap<String, mpsc::UnboundedSender<DuplexStream>>>,
    /// Connections made so far.
    connections: AtomicU64,
}

impl MemoryNetwork {
    pub fn new() -> MemoryNetwork {
        MemoryNetwork::default()
    }

    /// Connections made on this network so far.
    pub fn connections(&self) -> u64 {
        self.inner.connections.load(Ordering::Relaxed)
    }

    fn dial(&self, address: &str) -> io::Result<DuplexStream> {
        let listeners = self.inner.listeners.lock().expect("network lock poisoned");
        let refused = || {
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("nobody listens at {address} on the in-memory network"),
            )
        };
        let listener = listeners.get(address).ok_or_else(refused)?;
        let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
        listener.send(theirs).map_err(|_| refused())?;
        self.inner.connections.fetch_add(1, Ordering::Relaxed);
        Ok(ours)
    }
}

impl Transport for MemoryNetwork {
    fn channel(&self, endpoint: &Endpoint) -> Channel {
        endpoint.connect_with_connector_lazy(Dialer(self.clone()))
    }

    fn listen(&self, address: SocketAddr) -> BoxFuture<'static, io::Result<Incoming>> {
        let (accept, accepted) = mpsc::unbounded_channel();
        let mut listeners = self.inner.listeners.lock().expect("network lock poisoned");
        let taken = listeners
            .get(&address.to_string())
            .is_some_and(|l| !l.is_closed());
        if !taken {
            listeners.insert(address.to_string(), accept);
        }
        Box::pin(async move {
            if taken {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{address} is taken on the in-memory network"),
                ));
            }
            Ok(incoming(address, accepted))
        })
    }
}

/// The connections handed to a listener at `address` through `accepted`, as the stream a
/// server takes. Shared with simulated networks built on these pipes (qq-sim).
///
/// An in-memory pipe has no remote address, but the client port counts its connections by
/// theirs (and lets `guest` in from loopback only), so the n-th connection a listener accepts
/// comes from a loopback address of its own ([`nth_loopback`]): unique per listener, and the
/// same in every run that opens its connections in the same order.
pub fn incoming(address: SocketAddr, accepted: mpsc::UnboundedReceiver<DuplexStream>) -> Incoming {
    let mut accepted_before: u64 = 0;
    UnboundedReceiverStream::new(accepted)
        .map(move |io| {
            accepted_before += 1;
            let remote = nth_loopback(accepted_before);
            let info = TcpConnectInfo {
                local_addr: Some(address),
                remote_addr: Some(remote),
            };
            Ok(Conn::new(io, info))
        })
        .boxed()
}

/// The `n`-th address of 127.0.0.0/8 (its low 24 bits), on port 1 + the rest: distinct for
/// every `n` below 2^24 * 65 535.
fn nth_loopback(n: u64) -> SocketAddr {
    let [_, _, _, _, _, a, b, c] = n.to_be_bytes();
    let port = 1 + (n >> 24) as u16;
    SocketAddr::from(([127, a, b, c], port))
}

/// The connector a channel of the in-memory network dials with.
struct Dialer(MemoryNetwork);

impl Service<Uri> for Dialer {
    type Response = TokioIo<DuplexStream>;
    type Error = io::Error;
    type Future = BoxFuture<'static, io::Result<TokioIo<DuplexStream>>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let dialled = match uri.authority() {
            Some(address) => self.0.dial(address.as_str()).map(TokioIo::new),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{uri}: no address"),
            )),
        };
        Box::pin(async move { dialled })
    }
}
