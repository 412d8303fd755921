//! The transport seam: the one way node-to-node connections are made, handed in when the node
//! starts, so that a simulator can carry the cluster's traffic over its own network.
//!
//! Everything above the connection is shared, whatever the transport: the peer's URI
//! (`https://{cluster_address}`, `http://` with `insecure_cluster`), TLS (mutual, from
//! [`crate::network::PeerTls`] on the dialling side and the cluster server's TLS settings on
//! the accepting side: tonic runs the handshake over whatever connection the transport gives),
//! HTTP/2 windows, keep-alives and timeouts ([`crate::network`]), the protocol header stamped
//! on every request and checked by the receiver ([`crate::protocol`]). A [`Transport`] only
//! opens and accepts connections:
//! - [`Transport::channel`] turns the configured [`Endpoint`] of one peer into a lazy
//!   [`Channel`] (connecting on first use, again after a break);
//! - [`Transport::listen`] accepts the connections peers open to this node's cluster address,
//!   as the stream `tonic::transport::Server::serve_with_incoming` takes.
//!
//! [`TcpTransport`] is production: `Endpoint::connect_lazy` (TCP through hyper's connector,
//! which resolves a host name on every attempt, with the endpoint's connect timeout and
//! TCP_NODELAY) and a TCP listener with TCP_NODELAY on accepted connections.
//! [`memory::MemoryNetwork`] connects nodes of one process through `tokio::io::duplex` pipes
//! (tests; the base of a simulated network).

pub mod memory;

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};
use tonic::transport::{Channel, Endpoint};

/// The connections peers open to this node, for `Server::serve_with_incoming`.
pub type Incoming = BoxStream<'static, io::Result<Conn>>;

/// How this node connects to its peers and accepts their connections.
pub trait Transport: Send + Sync + 'static {
    /// A lazily connected channel to the peer whose address is `endpoint`'s authority, with
    /// `endpoint`'s settings (TLS, windows, keep-alives, timeouts).
    fn channel(&self, endpoint: &Endpoint) -> Channel;

    /// Accepts the connections peers open to `address`, this node's cluster address.
    fn listen(&self, address: SocketAddr) -> BoxFuture<'static, io::Result<Incoming>>;

    /// Opens a connection to `address` and drops it: `Ok` when something accepts there,
    /// `ConnectionRefused` when nothing listens (a node's liveness probe of a peer's client
    /// port). Over TCP unless the transport says otherwise.
    fn probe(&self, address: &str) -> BoxFuture<'static, io::Result<()>> {
        let address = address.to_string();
        Box::pin(async move { tokio::net::TcpStream::connect(address).await.map(drop) })
    }
}

/// Production: TCP, exactly as tonic makes and accepts connections.
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpTransport;

impl Transport for TcpTransport {
    fn channel(&self, endpoint: &Endpoint) -> Channel {
        endpoint.connect_lazy()
    }

    fn listen(&self, address: SocketAddr) -> BoxFuture<'static, io::Result<Incoming>> {
        Box::pin(async move {
            let listener = tokio::net::TcpListener::bind(address).await?;
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
            Ok(incoming
                .map(|accepted| {
                    accepted.map(|stream| {
                        let info = stream.connect_info();
                        Conn::new(stream, info)
                    })
                })
                .boxed())
        })
    }
}

/// Bytes both ways between two nodes.
trait Io: AsyncRead + AsyncWrite + Send {}

impl<T: AsyncRead + AsyncWrite + Send> Io for T {}

/// One accepted connection, whatever the transport, with the addresses a request's
/// `remote_addr` reports (none on a transport without them).
pub struct Conn {
    io: Pin<Box<dyn Io>>,
    info: TcpConnectInfo,
}

impl Conn {
    pub fn new(io: impl AsyncRead + AsyncWrite + Send + 'static, info: TcpConnectInfo) -> Conn {
        Conn {
            io: Box::pin(io),
            info,
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.io.as_mut().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.io.as_mut().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_shutdown(cx)
    }
}
