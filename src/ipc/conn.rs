//! A connection's socket as tokio's own `UnixStream`, split into its read and write halves.
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

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use interprocess::local_socket::tokio::Stream;
use tokio::io::{AsyncRead, Interest, ReadBuf};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// The write half of one client connection's socket.
pub struct Conn {
    w: OwnedWriteHalf,
}

impl Conn {
    /// Take over an accepted stream: its read half (for the connection's reader) and the
    /// shared write half.
    pub fn new(stream: Stream) -> (SpeculativeReader, Conn) {
        let Stream::UdSocket(s) = stream;
        let tokio_stream: tokio::net::UnixStream = s.into();
        let (r, w) = tokio_stream.into_split();
        (
            SpeculativeReader {
                half: r,
                drained: false,
            },
            Conn { w },
        )
    }

    /// Send what the socket takes right now, without waiting: `Ok(0)` if it takes nothing.
    pub fn try_send(&self, buf: &[u8]) -> io::Result<usize> {
        match self.w.try_write(buf) {
            Ok(n) => Ok(n),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Send all of `buf`, waiting for the socket to take it.
    pub async fn send_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            self.w.writable().await?;
            match self.w.try_write(buf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => buf = &buf[n..],
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The read half, read speculatively: the socket first, readiness only after `EAGAIN`.
pub struct SpeculativeReader {
    half: OwnedReadHalf,
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
            let _ = self
                .half
                .as_ref()
                .try_io(Interest::READABLE, || -> io::Result<()> {
                    Err(io::ErrorKind::WouldBlock.into())
                });
        }
    }
}

impl AsyncRead for SpeculativeReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let half = &this.half;
        loop {
            let room = buf.remaining();
            match half.try_read_buf(buf) {
                Ok(n) => {
                    this.drained = n > 0 && n < room;
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(half.as_ref().poll_read_ready(cx))?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}
