//! A connection's socket: a plain non-blocking Unix stream for writes, and a duplicate of it
//! registered with tokio for reading only.
//!
//! **Registered for reading only.** tokio's own `UnixStream` registers a socket for both
//! directions (`EPOLLIN | EPOLLOUT`, edge-triggered), and a Unix socket signals `EPOLLOUT` each
//! time the peer consumes something it was sent: every answer a client read queued an event in
//! the daemon's epoll that nothing waited for, and woke a parked worker to deliver it. Here the
//! reader is an [`AsyncFd`] with `Interest::READABLE`, and writes are plain non-blocking sends;
//! only a writer that finds the socket full registers for writability, for as long as it
//! waits ([`Conn::send_all`]). A connection can also leave tokio altogether, for the append
//! lane (`lane.rs`): [`SpeculativeReader::into_socket`].
//!
//! Reads are speculative ([`SpeculativeReader`]): after answering a request the connection's
//! task reads again at once, and waits for readiness only after an `EAGAIN`. Under load the
//! client's next request is usually there already, and reading it costs no trip through the
//! I/O driver; measured against tokio's own read (which clears readiness after a short read,
//! saving the empty `recv` but always waiting for the next epoll edge), the no-op request path
//! lost 7–16 % at 16 and 256 clients (docs/benchmarks.md, "Where a request's CPU goes").
//!
//! One exception, [`SpeculativeReader::expect_nothing`]: after a request whose answer waits for
//! the journal's commit (an append), the client sends nothing more until that answer reaches it,
//! so a read right away only finds `EAGAIN`. That `recv` was one of the two per append at 256
//! streams (`perf trace -s`); after a short read (which drained the socket), the connection
//! forgets the socket's readiness instead and waits for the next epoll edge.
//!
//! Writes: [`Conn::try_send`] from whichever thread produced a response (no task switch when
//! the socket takes it at once), [`Conn::send_all`] for the connection's writer task, which
//! waits for writability when the socket is full.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use interprocess::local_socket::tokio::Stream;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, Interest, ReadBuf};

/// Whether an I/O error only means "not now".
fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// `s` registered with tokio's reactor for `interest` only.
///
/// tokio 1.54 deprecates the safe constructor because an arbitrary `AsRawFd` type could close
/// or swap its descriptor while registered (tokio-rs/tokio#8587); its replacement is `unsafe`,
/// which this crate forbids. A `UnixStream` owns its descriptor and returns the same one until
/// it is dropped, and the `AsyncFd` owns the `UnixStream`: the contract the replacement asks
/// its caller to uphold holds here by construction.
#[allow(deprecated)]
fn register(s: UnixStream, interest: Interest) -> io::Result<AsyncFd<UnixStream>> {
    AsyncFd::with_interest(s, interest)
}

/// The write side of one client connection's socket.
pub struct Conn {
    s: UnixStream,
}

impl Conn {
    /// Take over an accepted stream: a reader registered with tokio for reading only, and the
    /// write side (shared by whoever answers).
    pub fn new(stream: Stream) -> io::Result<(SpeculativeReader, Conn)> {
        let Stream::UdSocket(s) = stream;
        let tokio_stream: tokio::net::UnixStream = s.into();
        // Out of tokio's reactor (it registered both directions); non-blocking still.
        let s = tokio_stream.into_std()?;
        let fd = register(s.try_clone()?, Interest::READABLE)?;
        Ok((SpeculativeReader { fd, drained: false }, Conn { s }))
    }

    /// A write side over a plain socket (tests of what writes to it).
    #[cfg(test)]
    pub(super) fn from_std(s: UnixStream) -> Conn {
        Conn { s }
    }

    /// Send what the socket takes right now, without waiting: `Ok(0)` if it takes nothing.
    pub fn try_send(&self, buf: &[u8]) -> io::Result<usize> {
        match (&self.s).write(buf) {
            Ok(n) => Ok(n),
            Err(e) if would_block(&e) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Send all of `buf`, waiting for the socket to take it. The socket is registered for
    /// writability only while this waits (see the module's comment).
    ///
    /// A client that takes nothing for `stall` while bytes wait (it stopped reading) fails the
    /// send with `TimedOut`: a slow reader that keeps reading is never cut off, one that stopped
    /// is, whatever it sent before.
    pub async fn send_all(&self, mut buf: &[u8], stall: std::time::Duration) -> io::Result<()> {
        let mut waiter: Option<AsyncFd<UnixStream>> = None;
        while !buf.is_empty() {
            let n = match (&self.s).write(buf) {
                Ok(n) => n,
                Err(e) if would_block(&e) => {
                    let w = match &waiter {
                        Some(w) => w,
                        None => waiter.insert(register(self.s.try_clone()?, Interest::WRITABLE)?),
                    };
                    let Ok(ready) = tokio::time::timeout(stall, w.writable()).await else {
                        return Err(io::ErrorKind::TimedOut.into());
                    };
                    let mut ready = ready?;
                    match ready.try_io(|s| s.get_ref().write(buf)) {
                        Ok(Ok(n)) => n,
                        Ok(Err(e)) if would_block(&e) => continue,
                        Ok(Err(e)) => return Err(e),
                        // Still full: readiness cleared, wait again.
                        Err(_) => continue,
                    }
                }
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            buf = &buf[n..];
        }
        Ok(())
    }
}

/// The read side, read speculatively: the socket first, readiness only after `EAGAIN`.
pub struct SpeculativeReader {
    fd: AsyncFd<UnixStream>,
    /// The last read took less than it was offered room for: the socket was empty after it.
    drained: bool,
}

impl SpeculativeReader {
    /// The client will send nothing before it hears from us (its request's answer waits for a
    /// commit): if the last read drained the socket, forget the socket's readiness, so that the
    /// next read waits for epoll instead of trying a `recv` that finds `EAGAIN`. Costs no
    /// system call. Tokio clears the readiness only if no new edge arrived since it was
    /// observed, so bytes that came after the read are never missed.
    pub fn expect_nothing(&self) {
        if self.drained {
            let _ = self.fd.try_io(Interest::READABLE, |_| -> io::Result<()> {
                Err(io::ErrorKind::WouldBlock.into())
            });
        }
    }

    /// Leave tokio: the socket (a duplicate of the connection's), no longer registered with
    /// the runtime, for a reader of its own (the append lane).
    pub fn into_socket(self) -> UnixStream {
        self.fd.into_inner()
    }
}

impl AsyncRead for SpeculativeReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let room = buf.remaining();
            // Without a system call while tokio knows the socket is not readable.
            match this.fd.try_io(Interest::READABLE, |s| {
                (&*s).read(buf.initialize_unfilled())
            }) {
                Ok(n) => {
                    buf.advance(n);
                    this.drained = n > 0 && n < room;
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Wait for the next edge; the guard is dropped without clearing anything.
                    drop(ready!(this.fd.poll_read_ready(cx))?);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}
