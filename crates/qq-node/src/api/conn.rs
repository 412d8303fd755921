//! The client port's connections, and what this node counts on them: connections per user and
//! per vhost, consumers per user and per vhost (the limits of `SetVhostLimits` and
//! `SetUserLimits`), streams per connection, and the node's own connection cap.
//!
//! A connection is one TCP connection (HTTP/2), keyed by its peer address, which no two open
//! connections share. The server wraps every accepted socket in a [`Tracked`] stream whose drop
//! forgets the connection and everything counted on it. A connection counts toward a user the
//! first time a request on it authenticates as that user, and toward a vhost the first time a
//! request on it names that vhost; past the limit that request is RESOURCE_EXHAUSTED naming the
//! limit, and the connection stays open for what it already does.
//!
//! Counted per node: connections and consumers live on the node that serves them, not in any
//! log, so a limit of N lets each node take N (queues and exchanges are counted cluster-wide by
//! the metadata machine).
//!
//! Must not: block (one short mutex, never held across an await).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use qq_core::meta::{Counted, Limits, Scope};
use qq_raft::transport::Conn as Accepted;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::Status;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::warn;

use super::convert::meta_error_to_status;

/// Distinct users, and distinct vhosts, one connection may act for (each is a map entry kept
/// while the connection is open). Past it: RESOURCE_EXHAUSTED.
pub const MAX_IDENTITIES_PER_CONNECTION: usize = 64;

#[derive(Default)]
struct Conn {
    users: Vec<String>,
    vhosts: Vec<String>,
    /// Open Consume and PublishStream calls.
    streams: usize,
}

#[derive(Default)]
struct Inner {
    conns: HashMap<SocketAddr, Conn>,
    conns_per_user: HashMap<String, u64>,
    conns_per_vhost: HashMap<String, u64>,
    consumers_per_user: HashMap<String, u64>,
    consumers_per_vhost: HashMap<String, u64>,
    /// Connections closed at accept because the node was at `max_connections`.
    refused: u64,
}

/// The node's connections and counts. One per client server.
pub struct Connections {
    max_connections: usize,
    max_streams_per_connection: usize,
    inner: Mutex<Inner>,
}

fn decrement(map: &mut HashMap<String, u64>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Connections {
    pub fn new(max_connections: usize, max_streams_per_connection: usize) -> Arc<Connections> {
        Arc::new(Connections {
            max_connections,
            max_streams_per_connection,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// Takes an accepted socket, or closes it when the node already holds `max_connections`
    /// (logged, at powers of two of the refusals, so a flood does not flood the log).
    pub fn accept(self: &Arc<Self>, io: Accepted) -> Option<Tracked> {
        let addr = io.connect_info().remote_addr()?;
        let mut inner = self.inner.lock().unwrap();
        if inner.conns.len() >= self.max_connections {
            inner.refused += 1;
            if inner.refused.is_power_of_two() {
                warn!(
                    peer = %addr,
                    max_connections = self.max_connections,
                    refused = inner.refused,
                    "connection refused: the node is at max_connections"
                );
            }
            return None;
        }
        inner.conns.insert(addr, Conn::default());
        drop(inner);
        Some(Tracked {
            io,
            _conn: ConnGuard {
                conns: self.clone(),
                addr,
            },
        })
    }

    /// Open connections.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.inner.lock().unwrap().conns.len()
    }

    /// Counts the connection toward `user` (once), within the user's `max-connections`.
    pub fn admit_user(
        &self,
        peer: Option<SocketAddr>,
        user: &str,
        limits: Limits,
    ) -> Result<(), Status> {
        self.admit(peer, user, limits, Scope::User(user))
    }

    /// Counts the connection toward `vhost` (once), within the vhost's `max-connections`.
    pub fn admit_vhost(
        &self,
        peer: Option<SocketAddr>,
        vhost: &str,
        limits: Limits,
    ) -> Result<(), Status> {
        self.admit(peer, vhost, limits, Scope::Vhost(vhost))
    }

    fn admit(
        &self,
        peer: Option<SocketAddr>,
        key: &str,
        limits: Limits,
        scope: Scope<'_>,
    ) -> Result<(), Status> {
        let mut guard = self.inner.lock().unwrap();
        let inner = &mut *guard;
        // A request without a tracked connection (its connection just closed) adds nothing.
        let Some(conn) = peer.and_then(|p| inner.conns.get_mut(&p)) else {
            return Ok(());
        };
        let (held, counts, what) = match scope {
            Scope::User(_) => (&mut conn.users, &mut inner.conns_per_user, "users"),
            Scope::Vhost(_) => (&mut conn.vhosts, &mut inner.conns_per_vhost, "vhosts"),
        };
        if held.iter().any(|k| k == key) {
            return Ok(());
        }
        if held.len() >= MAX_IDENTITIES_PER_CONNECTION {
            return Err(Status::resource_exhausted(format!(
                "connection: acts for more than {MAX_IDENTITIES_PER_CONNECTION} {what}; open \
                 another connection"
            )));
        }
        let current = counts.get(key).copied().unwrap_or(0);
        limits
            .admit(Counted::Connections, scope, current)
            .map_err(|e| meta_error_to_status(&e))?;
        held.push(key.to_string());
        *counts.entry(key.to_string()).or_insert(0) += 1;
        Ok(())
    }

    /// A Consume or PublishStream call on the connection, within `max_streams_per_connection`;
    /// held until the call ends.
    pub fn open_stream(self: &Arc<Self>, peer: Option<SocketAddr>) -> Result<StreamGuard, Status> {
        let mut inner = self.inner.lock().unwrap();
        let tracked = match peer.and_then(|p| inner.conns.get_mut(&p)) {
            Some(conn) => {
                if conn.streams >= self.max_streams_per_connection {
                    return Err(Status::resource_exhausted(format!(
                        "connection: {} streams open, the node's max_streams_per_connection",
                        self.max_streams_per_connection
                    )));
                }
                conn.streams += 1;
                peer
            }
            None => None,
        };
        Ok(StreamGuard {
            conns: self.clone(),
            addr: tracked,
        })
    }

    /// A consumer of `user` in `vhost`, within both their `max-consumers` on this node; held
    /// until the consumer ends.
    pub fn admit_consumer(
        self: &Arc<Self>,
        user: &str,
        user_limits: Limits,
        vhost: &str,
        vhost_limits: Limits,
    ) -> Result<ConsumerGuard, Status> {
        let mut inner = self.inner.lock().unwrap();
        let count = |m: &HashMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
        vhost_limits
            .admit(
                Counted::Consumers,
                Scope::Vhost(vhost),
                count(&inner.consumers_per_vhost, vhost),
            )
            .and_then(|()| {
                user_limits.admit(
                    Counted::Consumers,
                    Scope::User(user),
                    count(&inner.consumers_per_user, user),
                )
            })
            .map_err(|e| meta_error_to_status(&e))?;
        *inner
            .consumers_per_vhost
            .entry(vhost.to_string())
            .or_insert(0) += 1;
        *inner
            .consumers_per_user
            .entry(user.to_string())
            .or_insert(0) += 1;
        Ok(ConsumerGuard {
            conns: self.clone(),
            user: user.to_string(),
            vhost: vhost.to_string(),
        })
    }
}

/// Forgets its connection, and what was counted on it, when dropped.
struct ConnGuard {
    conns: Arc<Connections>,
    addr: SocketAddr,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let mut guard = self.conns.inner.lock().unwrap();
        let inner = &mut *guard;
        if let Some(conn) = inner.conns.remove(&self.addr) {
            for u in &conn.users {
                decrement(&mut inner.conns_per_user, u);
            }
            for v in &conn.vhosts {
                decrement(&mut inner.conns_per_vhost, v);
            }
        }
    }
}

/// An open stream on a connection; dropping it frees the slot.
pub struct StreamGuard {
    conns: Arc<Connections>,
    addr: Option<SocketAddr>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let Some(addr) = self.addr else { return };
        let mut inner = self.conns.inner.lock().unwrap();
        if let Some(conn) = inner.conns.get_mut(&addr) {
            conn.streams = conn.streams.saturating_sub(1);
        }
    }
}

/// A counted consumer; dropping it frees the count.
pub struct ConsumerGuard {
    conns: Arc<Connections>,
    user: String,
    vhost: String,
}

impl Drop for ConsumerGuard {
    fn drop(&mut self) {
        let mut inner = self.conns.inner.lock().unwrap();
        decrement(&mut inner.consumers_per_user, &self.user);
        decrement(&mut inner.consumers_per_vhost, &self.vhost);
    }
}

/// An accepted connection that stays counted while it is open. Serves as the connection it
/// wraps (same connect info, so `Request::remote_addr` works as before, under TLS too).
pub struct Tracked {
    io: Accepted,
    _conn: ConnGuard,
}

impl Connected for Tracked {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    /// A client socket and the server's side of it, as the client port's transport hands it.
    async fn pair(listener: &TcpListener) -> (TcpStream, Accepted) {
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let info = server.connect_info();
        (client, Accepted::new(server, info))
    }

    #[tokio::test]
    async fn counts_live_connections_and_forgets_closed_ones() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let conns = Connections::new(1, 2);
        let one_each = Limits {
            max_connections: Some(1),
            ..Limits::default()
        };

        let (c1, s1) = pair(&listener).await;
        let peer1 = Some(c1.local_addr().unwrap());
        let t1 = conns.accept(s1).expect("under max_connections");
        assert_eq!(conns.open(), 1);

        // Past max_connections the socket is closed at once: the client reads EOF or a reset.
        let (mut c2, s2) = pair(&listener).await;
        assert!(conns.accept(s2).is_none());
        let mut byte = [0u8; 1];
        assert!(matches!(c2.read(&mut byte).await, Ok(0) | Err(_)));

        // A connection counts once per user and per vhost, within their limits.
        conns.admit_user(peer1, "u", one_each).unwrap();
        conns.admit_user(peer1, "u", one_each).unwrap();
        conns.admit_vhost(peer1, "v", one_each).unwrap();

        // Streams per connection.
        let s_a = conns.open_stream(peer1).unwrap();
        let _s_b = conns.open_stream(peer1).unwrap();
        let e = conns.open_stream(peer1).err().unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("max_streams_per_connection"));
        drop(s_a);
        let _s_c = conns.open_stream(peer1).unwrap();

        // Closing the connection frees its user and vhost counts.
        drop(t1);
        assert_eq!(conns.open(), 0);
        let (c3, s3) = pair(&listener).await;
        let peer3 = Some(c3.local_addr().unwrap());
        let _t3 = conns.accept(s3).expect("a slot is free again");
        conns.admit_user(peer3, "u", one_each).unwrap();
        conns.admit_vhost(peer3, "v", one_each).unwrap();
    }

    #[test]
    fn consumers_count_per_user_and_vhost_until_dropped() {
        let conns = Connections::new(8, 8);
        let two = Limits {
            max_consumers: Some(2),
            ..Limits::default()
        };
        let none = Limits::default();
        let a = conns.admit_consumer("u", none, "v", two).unwrap();
        let _b = conns.admit_consumer("w", none, "v", two).unwrap();
        let e = conns.admit_consumer("x", none, "v", two).err().unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            e.message(),
            "consumer limit (max-consumers) in vhost 'v' (2) is reached"
        );
        // Another vhost is not limited by v's consumers.
        let _c = conns.admit_consumer("x", none, "other", two).unwrap();
        drop(a);
        let _d = conns.admit_consumer("x", none, "v", two).unwrap();
    }
}
