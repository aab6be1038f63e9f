//! A connection's output queue: lines (responses, notifications) waiting for the socket,
//! capped in bytes, written by the connection's writer task or at once by whoever produced them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use super::conn::Conn;
use zeroize::Zeroizing;

/// The output queue of one connection, capped in bytes: a client that stops reading is
/// disconnected instead of making the daemon buffer without bound.
///
/// One line is written at a time, either by the connection's writer task (from the queue) or,
/// when the queue is empty and nothing is being written, directly by the task that produced it
/// ([`Outbox::send_now`]): a response to a request answered inline then costs no task switch.
pub struct Outbox {
    state: Mutex<OutState>,
    max: usize,
    overflowed: AtomicBool,
    /// Wakes the writer task (a line was queued, or the connection is ending).
    wake: Notify,
    /// Notified when the connection must close (overflow, or the peer went away).
    pub closed: Arc<Notify>,
}

/// A line to send: owned, or the caller's (copied only if it must be queued).
enum Line<'a> {
    Owned(Zeroizing<Vec<u8>>),
    Borrowed(&'a [u8]),
}

impl Line<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Line::Owned(v) => v,
            Line::Borrowed(b) => b,
        }
    }

    fn len(&self) -> usize {
        self.bytes().len()
    }

    fn owned(self) -> Zeroizing<Vec<u8>> {
        match self {
            Line::Owned(v) => v,
            Line::Borrowed(b) => Zeroizing::new(b.to_vec()),
        }
    }
}

/// At most this many bytes of queued lines are joined into one write.
const WRITE_BATCH: usize = 64 * 1024;

#[derive(Default)]
struct OutState {
    lines: VecDeque<Zeroizing<Vec<u8>>>,
    /// Bytes queued plus the bytes of the line being written.
    bytes: usize,
    /// A line is being written (by the writer task or `send_now`).
    writing: bool,
    /// No more lines are accepted; the writer drains what is queued and stops.
    finished: bool,
}

impl Outbox {
    pub(super) fn new(max: usize, closed: Arc<Notify>) -> Self {
        Outbox {
            state: Mutex::new(OutState::default()),
            max,
            overflowed: AtomicBool::new(false),
            wake: Notify::new(),
            closed,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, OutState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admit `n` more bytes, or refuse (and start closing the connection). A line is always
    /// admitted when nothing else is pending, so one response larger than the cap (a list of
    /// a very large store) is delivered rather than closing the connection.
    fn admit(&self, st: &mut OutState, n: usize) -> bool {
        if st.finished {
            return false;
        }
        if st.bytes > 0 && st.bytes + n > self.max {
            if !self.overflowed.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    queued = st.bytes,
                    cap = self.max,
                    "client is not reading its responses; closing the connection"
                );
            }
            self.closed.notify_one();
            return false;
        }
        st.bytes += n;
        true
    }

    /// Queue a line for the writer task. `false` if the connection is gone or its queue is
    /// over the cap (it is then being closed).
    pub fn send(&self, line: Zeroizing<Vec<u8>>) -> bool {
        let mut st = self.state();
        if !self.admit(&mut st, line.len()) {
            return false;
        }
        st.lines.push_back(line);
        drop(st);
        self.wake.notify_one();
        true
    }

    /// Send a line, writing it to `stream` right here if the queue is empty and the socket
    /// takes it without waiting; otherwise (or for what it did not take) queue it.
    pub fn send_now(&self, stream: &Conn, line: Zeroizing<Vec<u8>>) -> bool {
        self.send_now_from(stream, Line::Owned(line))
    }

    /// [`Outbox::send_now`] of a line the caller keeps (built on its stack): copied only if it
    /// has to be queued.
    pub fn send_now_bytes(&self, stream: &Conn, line: &[u8]) -> bool {
        self.send_now_from(stream, Line::Borrowed(line))
    }

    fn send_now_from(&self, stream: &Conn, line: Line<'_>) -> bool {
        {
            let mut st = self.state();
            if !st.lines.is_empty() || st.writing {
                drop(st);
                return self.send(line.owned());
            }
            if !self.admit(&mut st, line.len()) {
                return false;
            }
            st.writing = true;
        }
        // One non-blocking attempt; if the socket takes nothing (or not all), the writer task
        // (which waits for writability) takes over.
        self.write_marked(stream, line.bytes())
    }

    /// Write `bytes`, marked as being written (`writing` set, their length counted), as far as
    /// the socket takes them now: what it does not take goes back to the front of the queue,
    /// ahead of anything queued meanwhile, and the writer task is woken if anything is left.
    /// `false`: the socket failed (the connection is then being closed).
    fn write_marked(&self, stream: &Conn, bytes: &[u8]) -> bool {
        let written = match stream.try_send(bytes) {
            Ok(n) => n,
            Err(_) => {
                let mut st = self.state();
                st.writing = false;
                st.bytes -= bytes.len();
                drop(st);
                self.closed.notify_one();
                return false;
            }
        };
        let mut st = self.state();
        st.writing = false;
        st.bytes -= written;
        if written < bytes.len() {
            st.lines
                .push_front(Zeroizing::new(bytes[written..].to_vec()));
        }
        let pending = !st.lines.is_empty();
        drop(st);
        if pending {
            self.wake.notify_one();
        }
        true
    }

    /// Queue a copy of `line` without waking the writer task: its sending is left to a later
    /// [`Outbox::flush_now`] (the append lane's answers, made while it commits: `answers.rs`).
    /// Anything sent on this connection afterwards, from any thread, queues behind it. `false`
    /// if the connection is gone or its queue is over the cap (it is then being closed).
    pub fn push_quiet(&self, line: &[u8]) -> bool {
        let mut st = self.state();
        if !self.admit(&mut st, line.len()) {
            return false;
        }
        st.lines.push_back(Zeroizing::new(line.to_vec()));
        true
    }

    /// Send what is queued, from this thread, as far as the socket takes it without waiting;
    /// what it does not take is left to the writer task (woken for it). Nothing is done while
    /// another thread is writing: that one sends what is queued after its line.
    pub fn flush_now(&self, stream: &Conn) {
        let out = {
            let mut st = self.state();
            if st.writing || st.lines.is_empty() {
                return;
            }
            let Some(out) = Self::join(&mut st) else {
                return;
            };
            st.writing = true;
            out
        };
        self.write_marked(stream, &out);
    }

    /// Take queued lines for one write: every line up to `WRITE_BATCH` bytes (at least one),
    /// joined; `None` if nothing is queued. The caller marks the outbox as writing.
    fn join(st: &mut OutState) -> Option<Zeroizing<Vec<u8>>> {
        let first = st.lines.pop_front()?;
        if st.lines.is_empty() {
            return Some(first);
        }
        let mut out = Zeroizing::new(Vec::with_capacity(
            st.bytes.min(WRITE_BATCH.max(first.len())),
        ));
        out.extend_from_slice(&first);
        while let Some(next) = st.lines.front() {
            if out.len() + next.len() > WRITE_BATCH {
                break;
            }
            out.extend_from_slice(next);
            st.lines.pop_front();
        }
        Some(out)
    }

    /// What the writer task sends next: every queued line (up to `WRITE_BATCH` bytes, at least
    /// one line) joined into one buffer, marked as being written; `None` when the connection
    /// has finished and everything queued was written. Under load a connection's responses
    /// then leave in one `send`, not one each.
    pub(super) async fn next(&self) -> Option<Zeroizing<Vec<u8>>> {
        loop {
            {
                let mut st = self.state();
                if !st.writing {
                    if let Some(out) = Self::join(&mut st) {
                        st.writing = true;
                        return Some(out);
                    }
                    if st.finished {
                        return None;
                    }
                }
            }
            self.wake.notified().await;
        }
    }

    /// The writer task finished writing a line of `n` bytes.
    pub(super) fn written(&self, n: usize) {
        let mut st = self.state();
        st.writing = false;
        st.bytes -= n;
        let pending = !st.lines.is_empty();
        drop(st);
        if pending {
            self.wake.notify_one();
        }
    }

    /// Accept no more lines; the writer drains the queue and stops.
    pub(super) fn finish(&self) {
        self.state().finished = true;
        self.wake.notify_one();
    }

    /// Whether the connection is closing (overflow, or no more lines accepted).
    pub fn is_closed(&self) -> bool {
        self.overflowed.load(Ordering::SeqCst) || self.state().finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    /// Lines queued quietly (the append lane's answers while it commits) leave before anything
    /// sent on the connection afterwards, whichever thread flushes them and whether the line
    /// after them is sent at once, queued, or flushed by another thread: a connection's answers
    /// go out in the order they were made. 400 lines from three threads, read back in order.
    #[test]
    fn lines_leave_in_the_order_they_were_made_whoever_sends_them() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let conn = Arc::new(Conn::from_std(ours));
        let outbox = Arc::new(Outbox::new(1 << 20, Arc::new(Notify::new())));
        let line = |i: usize| format!("{i:05}\n");
        let mut want = String::new();
        let reader = std::thread::spawn(move || {
            let mut got = String::new();
            while got.len() < 400 * 6 {
                let mut buf = [0u8; 4096];
                let n = theirs.read(&mut buf).unwrap();
                got.push_str(std::str::from_utf8(&buf[..n]).unwrap());
            }
            got
        });
        let mut i = 0;
        while i < 400 {
            // A few answers queued quietly, then one line sent now from this thread; the
            // quiet ones are flushed from another thread, before or after it.
            for _ in 0..3 {
                assert!(outbox.push_quiet(line(i).as_bytes()));
                want.push_str(&line(i));
                i += 1;
            }
            let mut flusher = Some({
                let (outbox, conn) = (Arc::clone(&outbox), Arc::clone(&conn));
                std::thread::spawn(move || outbox.flush_now(&conn))
            });
            if i % 2 == 0 {
                flusher.take().unwrap().join().unwrap();
            }
            assert!(outbox.send_now_bytes(&conn, line(i).as_bytes()));
            want.push_str(&line(i));
            i += 1;
            if let Some(f) = flusher {
                f.join().unwrap();
            }
            outbox.flush_now(&conn);
        }
        outbox.flush_now(&conn);
        let got = reader.join().unwrap();
        assert_eq!(got, want);
        println!("outbox: 400 lines, quiet and sent at once, from 3 threads: in order");
    }
}
