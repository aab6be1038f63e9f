//! Framing: one JSON-RPC message per `\n`-terminated line, at most `max` bytes, read with an
//! idle timeout (between messages) and a read timeout (within one message). Memory stays
//! bounded by `max` whatever a client sends: a line that outgrows it is an error *before* more
//! is buffered, and the connection is closed.

use std::pin::Pin;
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt};
use tokio::time::{Instant, Sleep};

use crate::crypto::PlainBuf;

/// Why no frame was read.
#[derive(Debug)]
pub enum FrameError {
    /// The line passed the size cap.
    TooLong {
        /// The cap.
        max: usize,
    },
    /// A started line did not complete within the read timeout (slowloris).
    ReadTimeout,
    /// Nothing arrived within the idle timeout and the caller allowed closing.
    Idle,
    /// The peer closed mid-line.
    Truncated,
    /// The socket failed.
    Io(std::io::Error),
}

/// Reads lines from a buffered stream.
///
/// Each line is read into one buffer reused for the connection's next lines (no allocation per
/// request). Lines may carry secrets (`cred.set`), so it is a [`PlainBuf`]: zeroized before the
/// next line is read into it, grown without leaving a copy behind, zeroized when dropped, and
/// not kept after a line over [`crate::crypto::plain::KEEP_BYTES`].
///
/// Its timeouts share one timer for the connection's life, moved forward for each read: moving
/// a registered tokio timer later is one atomic update, where a timer per read is registered in
/// the runtime's timer wheel and taken out again under its lock (docs/benchmarks.md, "seventh
/// session").
pub struct FrameReader<R> {
    inner: R,
    max: usize,
    buf: PlainBuf,
    /// Made on the first read (it needs the runtime).
    timer: Option<Pin<Box<Sleep>>>,
}

impl<R: AsyncBufRead + Unpin> FrameReader<R> {
    /// A reader of lines up to `max` bytes (the newline excluded).
    pub fn new(inner: R, max: usize) -> Self {
        FrameReader {
            inner,
            max,
            buf: PlainBuf::new(),
            timer: None,
        }
    }

    /// The line the last [`FrameReader::next`] returned `true` for, without its newline.
    pub fn line(&self) -> &[u8] {
        self.buf.as_slice()
    }

    /// Read the next line: `Ok(true)` when one is ready in [`FrameReader::line`] (without its
    /// newline), `Ok(false)` at a clean end of stream.
    ///
    /// Between messages it waits in slices of `idle`; after each slice `may_idle_close()`
    /// decides whether the connection may be closed (it may not while requests are in flight
    /// or a subscription is open). Once a line has started, it must complete within `read`.
    pub async fn next(
        &mut self,
        idle: Duration,
        read: Duration,
        mut may_idle_close: impl FnMut() -> bool,
    ) -> Result<bool, FrameError> {
        self.buf.wipe();
        let mut deadline: Option<Instant> = None;
        loop {
            let until = deadline.unwrap_or_else(|| Instant::now() + idle);
            let timer = match &mut self.timer {
                Some(t) => {
                    t.as_mut().reset(until);
                    t
                }
                None => self.timer.insert(Box::pin(tokio::time::sleep_until(until))),
            };
            let available = tokio::select! {
                biased;
                read = self.inner.fill_buf() => match read {
                    Ok(bytes) => bytes,
                    Err(e) => return Err(FrameError::Io(e)),
                },
                () = timer.as_mut() => {
                    if deadline.is_some() {
                        return Err(FrameError::ReadTimeout);
                    }
                    if may_idle_close() {
                        return Err(FrameError::Idle);
                    }
                    continue;
                }
            };
            if available.is_empty() {
                return if self.buf.is_empty() {
                    Ok(false)
                } else {
                    Err(FrameError::Truncated)
                };
            }
            if deadline.is_none() {
                deadline = Some(Instant::now() + read);
            }
            let (take, done) = match memchr::memchr(b'\n', available) {
                Some(i) => (i, true),
                None => (available.len(), false),
            };
            // The cap is on the line without its terminator, `\n` or `\r\n`: a trailing `\r`
            // may be the first half of one, so it does not count (at most `max + 1` bytes are
            // ever buffered).
            let ends_cr = match take {
                0 => self.buf.as_slice().last() == Some(&b'\r'),
                _ => available[take - 1] == b'\r',
            };
            if self.buf.len() + take - usize::from(ends_cr) > self.max {
                return Err(FrameError::TooLong { max: self.max });
            }
            // A line never holds more than the cap and a `\r`: the buffer grows no further.
            self.buf.extend_within(&available[..take], self.max + 1);
            self.inner.consume(take + usize::from(done));
            if done {
                if self.buf.as_slice().last() == Some(&b'\r') {
                    self.buf.shorten(1);
                }
                return Ok(true);
            }
        }
    }
}

impl<R: tokio::io::AsyncRead> FrameReader<tokio::io::BufReader<R>> {
    /// Whether a whole line is already buffered: the next [`FrameReader::next`] returns it
    /// without waiting for the socket.
    pub fn line_buffered(&self) -> bool {
        memchr::memchr(b'\n', self.inner.buffer()).is_some()
    }

    /// The stream under the buffer.
    pub fn source(&self) -> &R {
        self.inner.get_ref()
    }

    /// The stream under the buffer, and the bytes the buffer had read past the last line
    /// returned (the start of the next ones), for a reader that takes over.
    pub fn into_parts(self) -> (R, zeroize::Zeroizing<Vec<u8>>) {
        let rest = zeroize::Zeroizing::new(self.inner.buffer().to_vec());
        (self.inner.into_inner(), rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncWriteExt, BufReader};

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn lines_and_caps() {
        rt().block_on(async {
            let data: &[u8] = b"{\"a\":1}\r\nsecond\n0123456789ABCDEF\n";
            let mut r = FrameReader::new(BufReader::with_capacity(4, data), 10);
            let t = Duration::from_secs(1);
            assert!(r.next(t, t, || true).await.unwrap());
            assert_eq!(r.line(), b"{\"a\":1}");
            assert!(r.next(t, t, || true).await.unwrap());
            assert_eq!(r.line(), b"second");
            assert!(matches!(
                r.next(t, t, || true).await,
                Err(FrameError::TooLong { max: 10 })
            ));
        });
    }

    /// One buffer serves every line: each reads back exactly (a shorter line after a longer
    /// one shows nothing of it, `\r\n` ends a line as `\n` does, lines span the reads of a
    /// tiny buffer), and a buffer grown past `crate::crypto::plain::KEEP_BYTES` is not kept.
    #[test]
    fn one_buffer_serves_every_line() {
        let big = "b".repeat(crate::crypto::plain::KEEP_BYTES + 10);
        let lines: Vec<String> = ["short", "a much longer line than the one before", "x", ""]
            .iter()
            .map(|l| l.to_string())
            .chain([big, "after the big one".into(), "é😀\"quoted\"".into()])
            .collect();
        let mut data = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            data.extend_from_slice(l.as_bytes());
            data.extend_from_slice(if i % 2 == 0 { b"\n" } else { b"\r\n" });
        }
        rt().block_on(async {
            let t = Duration::from_secs(1);
            let mut r = FrameReader::new(
                BufReader::with_capacity(7, &data[..]),
                crate::crypto::plain::KEEP_BYTES + 20,
            );
            for l in &lines {
                assert!(r.next(t, t, || true).await.unwrap());
                assert_eq!(r.line(), l.as_bytes());
                if l.len() > crate::crypto::plain::KEEP_BYTES {
                    assert!(r.buf.capacity() > crate::crypto::plain::KEEP_BYTES);
                }
            }
            assert!(!r.next(t, t, || true).await.unwrap());
            assert!(r.line().is_empty());
            assert!(
                r.buf.capacity() <= crate::crypto::plain::KEEP_BYTES,
                "the big line's buffer was kept"
            );
        });
        println!(
            "frame: {} lines through a 7-byte read buffer, one line buffer",
            lines.len()
        );
    }

    /// The one timer moves forward with each read: lines that keep coming, each within the
    /// idle time of the one before, are read however long the connection lives, and the idle
    /// time still ends a connection once they stop.
    #[test]
    fn the_idle_timer_moves_with_each_line() {
        rt().block_on(async {
            let (mut client, server) = tokio::io::duplex(64);
            let mut r = FrameReader::new(BufReader::new(server), 100);
            // Wide margins: a line every 100 ms against an idle time of 300 ms, on a busy
            // 2-core machine.
            let idle = Duration::from_millis(300);
            let started = Instant::now();
            let writer = tokio::spawn(async move {
                for i in 0..6 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    client
                        .write_all(format!("line {i}\n").as_bytes())
                        .await
                        .unwrap();
                }
                client
            });
            for i in 0..6 {
                let got = r.next(idle, Duration::from_secs(5), || true).await;
                assert!(matches!(got, Ok(true)), "line {i}: {got:?}");
                assert_eq!(r.line(), format!("line {i}").as_bytes());
            }
            assert!(
                started.elapsed() > 2 * idle,
                "the lines came faster than the test needs"
            );
            let _client = writer.await.unwrap();
            let quiet = Instant::now();
            assert!(matches!(
                r.next(idle, Duration::from_secs(5), || true).await,
                Err(FrameError::Idle)
            ));
            assert!(quiet.elapsed() >= idle, "closed before the idle time");
        });
    }

    #[test]
    fn eof_clean_and_truncated() {
        rt().block_on(async {
            let t = Duration::from_secs(1);
            let mut r = FrameReader::new(BufReader::new(&b""[..]), 10);
            assert!(!r.next(t, t, || true).await.unwrap());
            let mut r = FrameReader::new(BufReader::new(&b"half"[..]), 10);
            assert!(matches!(
                r.next(t, t, || true).await,
                Err(FrameError::Truncated)
            ));
        });
    }

    #[test]
    fn slowloris_and_idle() {
        rt().block_on(async {
            let (client, server) = tokio::io::duplex(64);
            let mut r = FrameReader::new(BufReader::new(server), 100);
            let mut client = client;
            client.write_all(b"{\"par").await.unwrap();
            let res = r
                .next(Duration::from_secs(5), Duration::from_millis(50), || true)
                .await;
            assert!(matches!(res, Err(FrameError::ReadTimeout)), "{res:?}");
            let (_client2, server2) = tokio::io::duplex(64);
            let mut r = FrameReader::new(BufReader::new(server2), 100);
            let mut slices = 0;
            let res = r
                .next(Duration::from_millis(10), Duration::from_secs(5), || {
                    slices += 1;
                    slices >= 3
                })
                .await;
            assert!(matches!(res, Err(FrameError::Idle)));
            assert_eq!(slices, 3, "idle waits until the caller allows closing");
        });
    }
}
