//! A cap on the connections a replica holds open at once.
//!
//! Every accepted TCP connection takes a permit; one accepted while
//! [`ServerBuilder::max_connections`](crate::ServerBuilder::max_connections)
//! are open is closed at once (the caller sees the connection reset) and
//! logged with its address, at most one line every 10 seconds. A closed
//! connection gives its permit back. So a stranger who opens connections
//! and leaves them idle cannot make the replica hold an unbounded number of
//! them (each costs buffers and HTTP/2 state). Together with the per-
//! connection cap on concurrent HTTP/2 streams
//! ([`MAX_STREAMS_PER_CONNECTION`]) this bounds what one peer or client can
//! make a replica hold.
//!
//! One address may hold at most
//! [`ServerBuilder::max_connections_per_address`](crate::ServerBuilder::max_connections_per_address)
//! of them (default [`DEFAULT_MAX_CONNECTIONS_PER_ADDRESS`], half the total),
//! so a stranger who keeps connections open and talking from one host
//! cannot take every place from the clients of other hosts. More from that
//! address are closed on accept and logged the same way.
//!
//! A connection must also send its first bytes within the handshake timeout
//! ([`DEFAULT_HANDSHAKE_TIMEOUT`]): one that connects and stays silent is
//! closed then, so silent connections cannot hold every place for long.
//! With TLS the rule applies twice: to the ClientHello, and again, once the
//! handshake is done, to the first bytes of the HTTP/2 preface
//! ([`Limited::expect_bytes_within`]).
//!
//! The permit lives in the connection's I/O object ([`Limited`]), so it is
//! returned exactly when the server drops the connection, whatever ended it.
//!
//! Memory comes back too. Each connection the HTTP/2 server holds costs
//! buffers (about 25 KiB), and glibc keeps what thousands of them freed
//! inside its per-thread heaps instead of returning it to the system: a
//! flood of 19,000 idle connections left a replica at 130 MB instead of
//! 23 MB after they closed. So once many connections have closed
//! ([`TRIM_AFTER_CLOSED`]), a background task asks glibc to give its free
//! memory back (`malloc_trim`, [`trim_after_floods`]), at most once every
//! [`TRIM_EVERY`]. It costs a walk over the heaps off the request path,
//! and only after a flood.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Future, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::log_limit::LogLimit;

/// Connections a replica holds open at once by default: far above what
/// peers and the clients of one application need, far below what would
/// exhaust the process's memory or file descriptors.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Connections one IP address may hold open at once by default: half of
/// [`DEFAULT_MAX_CONNECTIONS`], far above what the clients of one host need
/// (a client keeps one connection per replica, or one per task), so one
/// host can never take every place.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = DEFAULT_MAX_CONNECTIONS / 2;

/// How long a new connection has to send its first bytes (the HTTP/2
/// preface, or a TLS ClientHello) before it is closed; with TLS, the whole
/// handshake must finish within it too (`crate::tls_accept`).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Concurrent HTTP/2 streams (calls) one connection may have open. A client
/// pipelines on one `Pipeline.Calls` stream; a unary client opens one per
/// call in flight.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1024;

/// Connections closed since the process started (see the module docs).
static CLOSED: AtomicU64 = AtomicU64::new(0);

/// Connections that must have closed since the last trim for another one.
pub const TRIM_AFTER_CLOSED: u64 = 512;

/// How often the trimmer looks.
pub const TRIM_EVERY: Duration = Duration::from_secs(5);

/// Give freed memory back to the system after floods of connections (see
/// the module docs), until `stop` resolves.
pub async fn trim_after_floods(stop: impl Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let mut trimmed_at = CLOSED.load(Ordering::Relaxed);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(TRIM_EVERY) => {}
        }
        let closed = CLOSED.load(Ordering::Relaxed);
        if closed.saturating_sub(trimmed_at) >= TRIM_AFTER_CLOSED {
            trimmed_at = closed;
            let _ = tokio::task::spawn_blocking(release_free_memory).await;
        }
    }
}

/// Ask the allocator to return free memory to the system.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own heaps, under its
    // locks; it takes no pointers from us.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Open connections per address.
type PerAddress = Arc<Mutex<BTreeMap<IpAddr, usize>>>;

/// An accepted connection holding its permit.
pub struct Limited {
    inner: TcpStream,
    _permit: OwnedSemaphorePermit,
    /// Its address's count, given back on drop.
    address: Option<(IpAddr, PerAddress)>,
    /// Until the first bytes arrive: when the connection is given up.
    handshake: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Drop for Limited {
    fn drop(&mut self) {
        CLOSED.fetch_add(1, Ordering::Relaxed);
        if let Some((ip, counts)) = self.address.take() {
            let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = counts.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(&ip);
                }
            }
        }
    }
}

impl Limited {
    /// Give the connection `within` to send its next bytes, or be closed
    /// (the same rule as for its first bytes). The TLS acceptor calls it once
    /// the handshake is done, so a client that completes a handshake and then
    /// stays silent (no HTTP/2 preface) cannot hold its place either.
    pub(crate) fn expect_bytes_within(&mut self, within: Duration) {
        self.handshake = Some(Box::pin(tokio::time::sleep(within)));
    }
}

impl Connected for Limited {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.connect_info()
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.handshake = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                let expired = self
                    .handshake
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if expired {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the connection sent nothing within the handshake timeout",
                    )));
                }
                Poll::Pending
            }
            other => other,
        }
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// `incoming` with at most `max` connections open at once and at most
/// `per_address` from one IP address, each given `handshake` to send its
/// first bytes (see the module docs); accept errors pass through.
pub fn limit<S>(
    incoming: S,
    max: usize,
    per_address: usize,
    handshake: Duration,
) -> impl Stream<Item = io::Result<Limited>>
where
    S: Stream<Item = io::Result<TcpStream>>,
{
    let permits = Arc::new(Semaphore::new(max.max(1)));
    let per_address = per_address.max(1);
    let counts: PerAddress = Arc::default();
    incoming.filter_map(move |accepted| {
        let permits = Arc::clone(&permits);
        let counts = Arc::clone(&counts);
        async move {
            let stream = match accepted {
                Ok(stream) => stream,
                Err(e) => return Some(Err(e)),
            };
            let Ok(permit) = permits.try_acquire_owned() else {
                log_refusal(&stream, Refusal::Total(max));
                // Dropped here: the connection is closed.
                return None;
            };
            let address = match stream.peer_addr() {
                Ok(peer) => {
                    let ip = peer.ip();
                    let mut held = counts.lock().unwrap_or_else(|p| p.into_inner());
                    let n = held.entry(ip).or_insert(0);
                    if *n >= per_address {
                        drop(held);
                        log_refusal(&stream, Refusal::PerAddress(per_address));
                        return None;
                    }
                    *n += 1;
                    drop(held);
                    Some((ip, Arc::clone(&counts)))
                }
                // Gone already: nothing to count.
                Err(_) => None,
            };
            Some(Ok(Limited {
                inner: stream,
                _permit: permit,
                address,
                handshake: Some(Box::pin(tokio::time::sleep(handshake))),
            }))
        }
    })
}

/// Which cap refused a connection.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// `--max-connections` are open.
    Total(usize),
    /// `--max-connections-per-address` are open from its address.
    PerAddress(usize),
}

/// Refusals are logged at most every 10 s.
static LAST_LOGGED: LogLimit = LogLimit::new();

/// Connections closed on accept by the caps, process-wide.
static CONNECTIONS_REFUSED: AtomicU64 = AtomicU64::new(0);

/// Connections the caps closed on accept since the process started (every
/// listener of the process; `latchkey_connections_refused`).
pub(crate) fn connections_refused() -> u64 {
    CONNECTIONS_REFUSED.load(Ordering::Relaxed)
}

fn log_refusal(stream: &TcpStream, why: Refusal) {
    CONNECTIONS_REFUSED.fetch_add(1, Ordering::Relaxed);
    if LAST_LOGGED.allow() {
        let from = stream
            .peer_addr()
            .map_or_else(|_| "an unknown address".to_string(), |a| a.to_string());
        match why {
            Refusal::Total(max) => tracing::warn!(
                %from,
                max,
                "refused a connection: {max} are open, the limit (--max-connections); \
                 further refusals are logged at most every 10 s"
            ),
            Refusal::PerAddress(max) => tracing::warn!(
                %from,
                max,
                "refused a connection: {max} are open from its address, the limit \
                 (--max-connections-per-address); further refusals are logged at most \
                 every 10 s"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn connections_over_the_cap_are_closed_and_permits_come_back() -> io::Result<()> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let incoming = futures::stream::unfold(listener, |l| async move {
            let accepted = l.accept().await.map(|(s, _)| s);
            Some((accepted, l))
        });
        let mut limited = Box::pin(limit(incoming, 2, 2, Duration::from_secs(60)));
        let a = TcpStream::connect(addr).await?;
        let b = TcpStream::connect(addr).await?;
        let mut c = TcpStream::connect(addr).await?;
        let first = limited.next().await.ok_or(io::ErrorKind::Other)??;
        let second = limited.next().await.ok_or(io::ErrorKind::Other)??;
        // The third is accepted and closed while the stream looks for one it
        // may keep: the client sees end of file.
        let next = tokio::spawn(async move { limited.next().await.map(|r| r.map(|_| ())) });
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), c.read(&mut buf))
            .await
            .map_err(|_| io::Error::other("the refused connection stayed open"))?;
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert!(!next.is_finished(), "no permit is free yet");
        // A closed connection gives its permit back: the next one gets in.
        drop(first);
        let d = TcpStream::connect(addr).await?;
        let fourth = tokio::time::timeout(std::time::Duration::from_secs(10), next)
            .await
            .map_err(|_| io::Error::other("the fourth connection was never accepted"))?
            .map_err(io::Error::other)?;
        assert!(matches!(fourth, Some(Ok(()))), "{fourth:?}");
        drop((a, b, d, second));
        Ok(())
    }

    /// A connection from `from` (a loopback address) to `to`.
    async fn connect_from(from: &str, to: std::net::SocketAddr) -> io::Result<TcpStream> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(format!("{from}:0").parse().map_err(io::Error::other)?)?;
        socket.connect(to).await
    }

    /// Whether the replica closed `stream` (end of file or reset) within
    /// a few seconds.
    async fn closed(stream: &mut TcpStream) -> bool {
        let mut buf = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn one_address_cannot_take_every_place() -> io::Result<()> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let incoming = futures::stream::unfold(listener, |l| async move {
            let accepted = l.accept().await.map(|(s, _)| s);
            Some((accepted, l))
        });
        let (kept_tx, mut kept) = tokio::sync::mpsc::unbounded_channel();
        let limited = limit(incoming, 10, 2, Duration::from_secs(60));
        let server = tokio::spawn(async move {
            let mut limited = Box::pin(limited);
            while let Some(conn) = limited.next().await {
                if kept_tx.send(conn).is_err() {
                    return;
                }
            }
        });
        // Two from 127.0.0.2 are kept, the third from it is closed.
        let _a = connect_from("127.0.0.2", addr).await?;
        let _b = connect_from("127.0.0.2", addr).await?;
        let first = kept.recv().await.ok_or(io::ErrorKind::Other)??;
        let _second = kept.recv().await.ok_or(io::ErrorKind::Other)??;
        let mut c = connect_from("127.0.0.2", addr).await?;
        assert!(closed(&mut c).await, "a third connection from one address");
        // Another address still gets in.
        let mut d = connect_from("127.0.0.3", addr).await?;
        let from_d = kept.recv().await.ok_or(io::ErrorKind::Other)??;
        assert!(!closed(&mut d).await, "another address was refused");
        // A closed connection frees its address's place.
        drop(first);
        let _e = connect_from("127.0.0.2", addr).await?;
        let again = tokio::time::timeout(Duration::from_secs(5), kept.recv())
            .await
            .map_err(|_| io::Error::other("the freed place was not given"))?;
        assert!(matches!(again, Some(Ok(_))));
        drop(from_d);
        server.abort();
        Ok(())
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_at_the_handshake_timeout() -> io::Result<()> {
        let (client, server) = {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let client = TcpStream::connect(listener.local_addr()?).await?;
            let (server, _) = listener.accept().await?;
            (client, server)
        };
        let mut limited = Box::pin(limit(
            futures::stream::iter([Ok(server)]),
            1,
            1,
            Duration::from_millis(100),
        ));
        let mut conn = limited.next().await.ok_or(io::ErrorKind::Other)??;
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .map_err(|_| io::Error::other("a silent connection was never given up"))?;
        assert_eq!(read.map_err(|e| e.kind()), Err(io::ErrorKind::TimedOut));
        drop(client);
        Ok(())
    }

    #[tokio::test]
    async fn a_connection_that_speaks_is_not_timed_out() -> io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let mut client = TcpStream::connect(listener.local_addr()?).await?;
        let (server, _) = listener.accept().await?;
        let mut limited = Box::pin(limit(
            futures::stream::iter([Ok(server)]),
            1,
            1,
            Duration::from_millis(100),
        ));
        let mut conn = limited.next().await.ok_or(io::ErrorKind::Other)??;
        client.write_all(b"x").await?;
        let mut buf = [0u8; 1];
        assert_eq!(conn.read(&mut buf).await?, 1);
        // Past the timeout, the connection still reads (here: the close).
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(client);
        assert_eq!(conn.read(&mut buf).await?, 0);
        Ok(())
    }
}
