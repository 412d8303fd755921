//! The simulated network: every node-to-node connection of the cluster runs through it, as a
//! pair of in-memory pipes joined by a pump per direction, and the pumps inject the faults.
//!
//! Each directed link `from -> to` has a [`Link`]:
//! - `blocked`: bytes from `from` to `to` stop moving (the pump stops forwarding and, once its
//!   small buffer is full, stops reading), as a firewall that drops packets does to a TCP
//!   connection: the connection stalls until HTTP/2's keep-alive gives up on it, and a new
//!   connection between the two cannot be opened in either direction (its handshake needs both)
//!   until the link heals, so dials wait (tonic's connect timeout ends them).
//! - `delay_ms` and `jitter_ms`: every chunk arrives that much later (latency, not a smaller
//!   bandwidth: chunks are in flight together); jitter never reorders (a TCP stream does not).
//! - `loss_pct`: a chunk "lost" arrives a retransmission timeout late ([`RETRANSMIT`]), and the
//!   chunks behind it wait for it: what packet loss looks like above TCP.
//!
//! Reordering and duplication happen below TCP and are invisible above it: a stream transport
//! cannot show them to the nodes, so they are not injected. [`SimNet::cut`] resets every
//! connection between two nodes (both ends see the connection end), as a dropped NAT entry or a
//! peer's RST does.
//!
//! A dial to an address nobody listens at fails at once, as a refused TCP connection does (a
//! crashed node).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use qq_raft::transport::{Incoming, Transport};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::codegen::Service;
use tonic::codegen::http::Uri;
use tonic::transport::{Channel, Endpoint};

/// Bytes each pipe holds in one direction before its writer waits.
const PIPE_BYTES: usize = 256 * 1024;
/// Largest chunk a pump moves at once.
const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks in flight on one direction of one connection (with a delay) before the pump stops
/// reading: the bound of what the network holds.
const IN_FLIGHT_CHUNKS: usize = 64;
/// How late a lost chunk arrives: Linux's minimum TCP retransmission timeout.
pub const RETRANSMIT: Duration = Duration::from_millis(200);

/// One direction between two nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Link {
    pub blocked: bool,
    pub delay_ms: u64,
    pub jitter_ms: u64,
    pub loss_pct: u64,
}

/// What the network did in a run, for the report.
#[derive(Debug, Default, Serialize)]
pub struct NetStats {
    pub connections: u64,
    pub refused_dials: u64,
    pub chunks: u64,
    pub delayed_chunks: u64,
    pub lost_chunks: u64,
    pub cut_connections: u64,
    /// Connections whose dialler opened with a TLS handshake record, and those that did not.
    pub tls_connections: u64,
    pub plain_connections: u64,
}

/// The network of one simulated cluster; clones share it.
#[derive(Clone)]
pub struct SimNet {
    inner: Arc<Inner>,
}

struct Inner {
    /// Who listens at each cluster address: the node, and where its connections go.
    listeners: Mutex<HashMap<String, (u64, mpsc::UnboundedSender<DuplexStream>)>>,
    /// Every directed link's faults; a link not named has none.
    links: watch::Sender<HashMap<(u64, u64), Link>>,
    /// The open connections between each pair (ordered), so that they can be cut.
    open: Mutex<Vec<((u64, u64), CancellationToken)>>,
    /// Jitter and loss draws.
    rng: Mutex<StdRng>,
    connections: AtomicU64,
    refused_dials: AtomicU64,
    chunks: AtomicU64,
    delayed_chunks: AtomicU64,
    lost_chunks: AtomicU64,
    cut_connections: AtomicU64,
    tls_connections: AtomicU64,
    plain_connections: AtomicU64,
}

impl SimNet {
    pub fn new(seed: u64) -> SimNet {
        SimNet {
            inner: Arc::new(Inner {
                listeners: Mutex::default(),
                links: watch::Sender::new(HashMap::new()),
                open: Mutex::default(),
                rng: Mutex::new(StdRng::seed_from_u64(seed)),
                connections: AtomicU64::new(0),
                refused_dials: AtomicU64::new(0),
                chunks: AtomicU64::new(0),
                delayed_chunks: AtomicU64::new(0),
                lost_chunks: AtomicU64::new(0),
                cut_connections: AtomicU64::new(0),
                tls_connections: AtomicU64::new(0),
                plain_connections: AtomicU64::new(0),
            }),
        }
    }

    /// Node `node`'s view of the network: the transport it dials and listens with.
    pub fn transport(&self, node: u64) -> Arc<dyn Transport> {
        Arc::new(NodeTransport {
            net: self.clone(),
            me: node,
        })
    }

    /// Sets the faults of the link `from -> to`.
    pub fn set_link(&self, from: u64, to: u64, link: Link) {
        self.inner.links.send_modify(|links| {
            if link == Link::default() {
                links.remove(&(from, to));
            } else {
                links.insert((from, to), link);
            }
        });
    }

    /// The faults of the link `from -> to` now.
    pub fn link(&self, from: u64, to: u64) -> Link {
        self.inner
            .links
            .borrow()
            .get(&(from, to))
            .copied()
            .unwrap_or_default()
    }

    /// Every link without faults again.
    pub fn heal(&self) {
        self.inner.links.send_modify(|links| links.clear());
    }

    /// Resets every open connection between `a` and `b`; returns how many.
    pub fn cut(&self, a: u64, b: u64) -> usize {
        let pair = (a.min(b), a.max(b));
        let mut open = self.inner.open.lock().expect("net lock");
        open.retain(|(_, token)| !token.is_cancelled());
        let mut n = 0;
        for (p, token) in open.iter() {
            if *p == pair {
                token.cancel();
                n += 1;
            }
        }
        self.inner
            .cut_connections
            .fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    pub fn stats(&self) -> NetStats {
        let i = &self.inner;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NetStats {
            connections: get(&i.connections),
            refused_dials: get(&i.refused_dials),
            chunks: get(&i.chunks),
            delayed_chunks: get(&i.delayed_chunks),
            lost_chunks: get(&i.lost_chunks),
            cut_connections: get(&i.cut_connections),
            tls_connections: get(&i.tls_connections),
            plain_connections: get(&i.plain_connections),
        }
    }

    /// Waits until neither direction between `a` and `b` is blocked.
    async fn wait_open_both(&self, a: u64, b: u64) {
        let mut rx = self.inner.links.subscribe();
        let _ = rx
            .wait_for(|links| {
                let blocked = |k| links.get(&k).is_some_and(|l: &Link| l.blocked);
                !blocked((a, b)) && !blocked((b, a))
            })
            .await;
    }

    /// Waits until `from -> to` is not blocked.
    async fn wait_open(&self, from: u64, to: u64) {
        if !self.link(from, to).blocked {
            return;
        }
        let mut rx = self.inner.links.subscribe();
        let _ = rx
            .wait_for(|links| !links.get(&(from, to)).is_some_and(|l| l.blocked))
            .await;
    }

    /// When a chunk read now from `from` should reach `to`.
    fn due(&self, from: u64, to: u64) -> Instant {
        let link = self.link(from, to);
        let i = &self.inner;
        i.chunks.fetch_add(1, Ordering::Relaxed);
        let mut late = Duration::from_millis(link.delay_ms);
        if link.jitter_ms > 0 || link.loss_pct > 0 {
            let mut rng = i.rng.lock().expect("rng lock");
            if link.jitter_ms > 0 {
                late += Duration::from_millis(rng.random_range(0..=link.jitter_ms));
            }
            if link.loss_pct > 0 && rng.random_range(0..100) < link.loss_pct {
                late += RETRANSMIT;
                i.lost_chunks.fetch_add(1, Ordering::Relaxed);
            }
        }
        if !late.is_zero() {
            i.delayed_chunks.fetch_add(1, Ordering::Relaxed);
        }
        Instant::now() + late
    }

    /// Node `me` opens a connection to `address`: the dialler's end.
    async fn dial(&self, me: u64, address: &str) -> io::Result<DuplexStream> {
        let refused = || {
            self.inner.refused_dials.fetch_add(1, Ordering::Relaxed);
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("nobody listens at {address} on the simulated network"),
            )
        };
        let to = match self.listener(address) {
            Some((to, _)) => to,
            None => return Err(refused()),
        };
        self.wait_open_both(me, to).await;
        // Looked up again: the node may have stopped while the link was down.
        let Some((to, accept)) = self.listener(address) else {
            return Err(refused());
        };
        let (ours, ours_inner) = tokio::io::duplex(PIPE_BYTES);
        let (theirs_inner, theirs) = tokio::io::duplex(PIPE_BYTES);
        accept.send(theirs).map_err(|_| refused())?;
        self.inner.connections.fetch_add(1, Ordering::Relaxed);
        let cut = CancellationToken::new();
        self.inner
            .open
            .lock()
            .expect("net lock")
            .push(((me.min(to), me.max(to)), cut.clone()));
        let (our_rd, our_wr) = tokio::io::split(ours_inner);
        let (their_rd, their_wr) = tokio::io::split(theirs_inner);
        tokio::spawn(pump(
            self.clone(),
            Direction::Dialler,
            me,
            to,
            our_rd,
            their_wr,
            cut.clone(),
        ));
        tokio::spawn(pump(
            self.clone(),
            Direction::Accepter,
            to,
            me,
            their_rd,
            our_wr,
            cut,
        ));
        Ok(ours)
    }

    fn listener(&self, address: &str) -> Option<(u64, mpsc::UnboundedSender<DuplexStream>)> {
        let listeners = self.inner.listeners.lock().expect("net lock");
        listeners
            .get(address)
            .filter(|(_, tx)| !tx.is_closed())
            .cloned()
    }
}

/// Which end of a connection a pump reads.
#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Dialler,
    Accepter,
}

/// A TLS record's first octet when it carries a handshake message (a ClientHello opens a
/// TLS connection); HTTP/2 in plain text opens with `PRI * HTTP/2.0`.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// One direction of one connection: reads what `from` wrote, delivers it to `to` when due.
/// The dialler's first chunk is looked at once: TLS or not (counted).
async fn pump(
    net: SimNet,
    direction: Direction,
    from: u64,
    to: u64,
    mut rd: ReadHalf<DuplexStream>,
    mut wr: WriteHalf<DuplexStream>,
    cut: CancellationToken,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT_CHUNKS);
    let reader = {
        let net = net.clone();
        async move {
            let mut last_due = Instant::now();
            let mut first = direction == Direction::Dialler;
            loop {
                let mut buf = vec![0u8; CHUNK_BYTES];
                let n = match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                buf.truncate(n);
                if std::mem::take(&mut first) {
                    let counter = if buf[0] == TLS_HANDSHAKE_RECORD {
                        &net.inner.tls_connections
                    } else {
                        &net.inner.plain_connections
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                // Never earlier than the chunk before it: a stream keeps its order.
                last_due = net.due(from, to).max(last_due);
                if tx.send((last_due, buf)).await.is_err() {
                    return;
                }
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            net.wait_open(from, to).await;
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    };
    tokio::select! {
        _ = cut.cancelled() => {}
        _ = async { tokio::join!(reader, writer) } => {}
    }
}

/// One node's side of the network.
struct NodeTransport {
    net: SimNet,
    me: u64,
}

impl Transport for NodeTransport {
    /// A connection opened and dropped, as a TCP probe is: refused at once where nobody
    /// listens, waiting while the link is blocked.
    fn probe(&self, address: &str) -> BoxFuture<'static, io::Result<()>> {
        let (net, me, address) = (self.net.clone(), self.me, address.to_string());
        Box::pin(async move { net.dial(me, &address).await.map(drop) })
    }

    fn channel(&self, endpoint: &Endpoint) -> Channel {
        endpoint.connect_with_connector_lazy(Dialer {
            net: self.net.clone(),
            me: self.me,
        })
    }

    fn listen(&self, address: SocketAddr) -> BoxFuture<'static, io::Result<Incoming>> {
        let (accept, accepted) = mpsc::unbounded_channel();
        let taken = {
            let mut listeners = self.net.inner.listeners.lock().expect("net lock");
            let taken = listeners
                .get(&address.to_string())
                .is_some_and(|(_, l)| !l.is_closed());
            if !taken {
                listeners.insert(address.to_string(), (self.me, accept));
            }
            taken
        };
        Box::pin(async move {
            if taken {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{address} is taken on the simulated network"),
                ));
            }
            Ok(qq_raft::transport::memory::incoming(address, accepted))
        })
    }
}

/// The connector a node's channels dial with.
struct Dialer {
    net: SimNet,
    me: u64,
}

impl Service<Uri> for Dialer {
    type Response = TokioIo<DuplexStream>;
    type Error = io::Error;
    type Future = BoxFuture<'static, io::Result<TokioIo<DuplexStream>>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (net, me) = (self.net.clone(), self.me);
        Box::pin(async move {
            let Some(address) = uri.authority() else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{uri}: no address"),
                ));
            };
            net.dial(me, address.as_str()).await.map(TokioIo::new)
        })
    }
}

#[cfg(test)]
mod tests;
