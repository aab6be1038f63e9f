//! A connection's output queue: lines (responses, notifications) waiting for the socket,
//! capped in bytes, written by the connection's writer task or at once by whoever produced them.
//!
//! **Bounded by construction.** Every byte the queue holds is counted by the capacity of the
//! buffer holding it (a line queued with much more capacity than length is copied to an exact
//! buffer first), against the connection's cap and against the daemon-wide [`OutputBudget`]
//! every connection shares. A line over either is refused and the connection closed, saying
//! why in the log. Below the caps, the connection's reader stops reading requests while more
//! than [`OWED_PAUSE`] bytes of answers are owed ([`Outbox::drained`]), so a client that
//! pipelines without reading fills its own socket buffers, not the daemon's memory, and is
//! dropped when it does not read for the read timeout.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use super::conn::Conn;
use zeroize::Zeroizing;

/// Answers owed past which a connection's requests are not read until its client reads.
pub const OWED_PAUSE: usize = 256 * 1024;

/// A line queued with more spare capacity than this is copied to an exact buffer first (the
/// copy is made only when a line must wait; the one sent at once is never copied).
const SPARE: usize = 4096;

/// The bytes every connection's queue holds, against one cap for the daemon.
pub struct OutputBudget {
    held: AtomicUsize,
    max: usize,
}

impl OutputBudget {
    /// A budget of `max` bytes.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(OutputBudget {
            held: AtomicUsize::new(0),
            max,
        })
    }

    /// Bytes held now, across connections.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Whether more than half the budget is held: connections owing anything stop reading
    /// requests until their clients read.
    pub fn tight(&self) -> bool {
        self.held() > self.max / 2
    }

    fn take(&self, n: usize) -> bool {
        let mut now = self.held.load(Ordering::Relaxed);
        loop {
            if now.saturating_add(n) > self.max {
                return false;
            }
            match self
                .held
                .compare_exchange_weak(now, now + n, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(v) => now = v,
            }
        }
    }

    /// Take `n` bytes whatever the budget holds (see `Outbox::admit`).
    fn force(&self, n: usize) {
        self.held.fetch_add(n, Ordering::AcqRel);
    }

    fn give(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The output queue of one connection, capped in bytes: a client that stops reading is
/// disconnected instead of making the daemon buffer without bound.
///
/// One line is written at a time, either by the connection's writer task (from the queue) or,
/// when the queue is empty and nothing is being written, directly by the task that produced it
/// ([`Outbox::send_now`]): a response to a request answered inline then costs no task switch.
pub struct Outbox {
    state: Mutex<OutState>,
    max: usize,
    budget: Arc<OutputBudget>,
    overflowed: AtomicBool,
    /// Wakes the writer task (a line was queued, or the connection is ending).
    wake: Notify,
    /// Notified whenever queued bytes were written (a paused reader looks again).
    progress: Notify,
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
    /// Bytes held: the capacity of every queued line plus the length of the line being
    /// written (a buffer of ours, exact), all taken from the budget.
    bytes: usize,
    /// A line is being written (by the writer task or `send_now`).
    writing: bool,
    /// No more lines are accepted; the writer drains what is queued and stops.
    finished: bool,
}

impl Outbox {
    pub(super) fn new(max: usize, budget: Arc<OutputBudget>, closed: Arc<Notify>) -> Self {
        Outbox {
            state: Mutex::new(OutState::default()),
            max,
            budget,
            overflowed: AtomicBool::new(false),
            wake: Notify::new(),
            progress: Notify::new(),
            closed,
        }
    }

    /// Bytes of answers and events owed to the client (queued or being written).
    pub fn owed(&self) -> usize {
        self.state().bytes
    }

    /// Whether this connection's requests should wait before being read: more than
    /// [`OWED_PAUSE`] owed, or anything owed while the daemon-wide budget is tight.
    pub fn should_pause(&self) -> bool {
        let owed = self.owed();
        owed > OWED_PAUSE || (owed > 0 && self.budget.tight())
    }

    /// Wait until [`Outbox::should_pause`] no longer holds (or the connection is closing).
    pub async fn drained(&self) {
        loop {
            let progress = self.progress.notified();
            tokio::pin!(progress);
            progress.as_mut().enable();
            if !self.should_pause() || self.is_closed() {
                return;
            }
            progress.await;
        }
    }

    /// Give `n` held bytes back (written, or dropped with the connection).
    fn release(&self, st: &mut OutState, n: usize) {
        st.bytes -= n;
        self.budget.give(n);
        self.progress.notify_waiters();
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
        let over_cap = st.bytes > 0 && st.bytes + n > self.max;
        // The daemon's budget: a connection owing nothing may always take one line up to its
        // cap (an honest client is answered even while others hold the budget: the overshoot
        // is one line per connection); one that owes must fit in the budget.
        let fits = if st.bytes == 0 && n <= self.max {
            self.budget.force(n);
            true
        } else {
            self.budget.take(n)
        };
        if over_cap || !fits {
            if !self.overflowed.swap(true, Ordering::SeqCst) {
                let why = if over_cap {
                    "client is not reading its responses (its queue is at the cap); closing the connection"
                } else {
                    "client is not reading its responses and the daemon's output budget is full; closing the connection"
                };
                tracing::warn!(
                    queued = st.bytes,
                    cap = self.max,
                    budget_held = self.budget.held(),
                    budget = self.budget.max,
                    "{why}"
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
        // Held bytes are counted by capacity: a line with much spare room (an answer buffer
        // sized for many) waits in a copy of its own size; the original is zeroized as it drops.
        let line = if line.capacity() - line.len() > SPARE {
            Zeroizing::new(line.to_vec())
        } else {
            line
        };
        let mut st = self.state();
        if !self.admit(&mut st, line.capacity()) {
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
        // Counted by length while it is written at once (what the socket does not take waits
        // in an exact copy, and the caller's buffer goes as this returns).
        let held = line.bytes().len();
        {
            let mut st = self.state();
            if !st.lines.is_empty() || st.writing {
                drop(st);
                return self.send(line.owned());
            }
            if !self.admit(&mut st, held) {
                return false;
            }
            st.writing = true;
        }
        // One non-blocking attempt; if the socket takes nothing (or not all), the writer task
        // (which waits for writability) takes over.
        self.write_marked(stream, line.bytes(), held)
    }

    /// Write `bytes`, marked as being written (`writing` set, `held` bytes counted for them),
    /// as far as the socket takes them now: what it does not take goes back to the front of
    /// the queue (an exact copy, counted by its length), ahead of anything queued meanwhile,
    /// and the writer task is woken if anything is left. `false`: the socket failed (the
    /// connection is then being closed).
    fn write_marked(&self, stream: &Conn, bytes: &[u8], held: usize) -> bool {
        let written = match stream.try_send(bytes) {
            Ok(n) => n,
            Err(_) => {
                let mut st = self.state();
                st.writing = false;
                self.release(&mut st, held);
                drop(st);
                self.closed.notify_one();
                return false;
            }
        };
        let mut st = self.state();
        st.writing = false;
        let rest = bytes.len() - written;
        self.release(&mut st, held - rest);
        if rest > 0 {
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
        // An exact copy: its length is its capacity.
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
        let (out, held) = {
            let mut st = self.state();
            if st.writing || st.lines.is_empty() {
                return;
            }
            let Some(out) = self.join(&mut st) else {
                return;
            };
            st.writing = true;
            out
        };
        self.write_marked(stream, &out, held);
    }

    /// Take queued lines for one write: every line up to `WRITE_BATCH` bytes (at least one),
    /// joined into an exact buffer, with the bytes it holds; `None` if nothing is queued. The
    /// caller marks the outbox as writing.
    fn join(&self, st: &mut OutState) -> Option<(Zeroizing<Vec<u8>>, usize)> {
        let first = st.lines.pop_front()?;
        let mut len = first.len();
        let n = st
            .lines
            .iter()
            .take_while(|l| {
                len += l.len();
                len <= WRITE_BATCH
            })
            .count();
        if n == 0 {
            let held = first.capacity();
            return Some((first, held));
        }
        let len = first.len() + st.lines.iter().take(n).map(|l| l.len()).sum::<usize>();
        let mut out = Zeroizing::new(Vec::with_capacity(len));
        let mut popped = first.capacity();
        out.extend_from_slice(&first);
        for l in st.lines.drain(..n) {
            popped += l.capacity();
            out.extend_from_slice(&l);
        }
        // The lines' buffers are gone (zeroized); the joined one holds their bytes.
        let held = out.capacity();
        self.release(st, popped - held);
        Some((out, held))
    }

    /// What the writer task sends next, with the bytes it holds (give them back with
    /// [`Outbox::written`]): every queued line (up to `WRITE_BATCH` bytes, at least one line)
    /// joined into one buffer, marked as being written; `None` when the connection has
    /// finished and everything queued was written. Under load a connection's responses then
    /// leave in one `send`, not one each.
    pub(super) async fn next(&self) -> Option<(Zeroizing<Vec<u8>>, usize)> {
        loop {
            {
                let mut st = self.state();
                if !st.writing {
                    if let Some(out) = self.join(&mut st) {
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

    /// The writer task finished writing a line that held `held` bytes.
    pub(super) fn written(&self, held: usize) {
        let mut st = self.state();
        st.writing = false;
        self.release(&mut st, held);
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
        self.progress.notify_waiters();
    }

    /// Whether the connection is closing (overflow, or no more lines accepted).
    pub fn is_closed(&self) -> bool {
        self.overflowed.load(Ordering::SeqCst) || self.state().finished
    }
}

impl Drop for Outbox {
    /// What a connection still held when it went (a client that never read) goes back to the
    /// daemon's budget.
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        self.budget.give(st.bytes);
        st.bytes = 0;
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
        let budget = OutputBudget::new(1 << 20);
        let outbox = Arc::new(Outbox::new(
            1 << 20,
            Arc::clone(&budget),
            Arc::new(Notify::new()),
        ));
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
