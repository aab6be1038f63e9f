//! The append lane: one thread that serves the connections streaming into the journal the way
//! a single-threaded server does — wait in `epoll`, read every ready connection once, handle
//! each whole line it brought, then commit the turn's appends with one write and one
//! `fdatasync` and answer them, and wait again.
//!
//! **Why a thread of its own.** tokio serves a connection as a task: each request is an epoll
//! event turned into a wake-up, a task polled through its read future, its timer moved, and
//! with two workers the two CPUs both busy with the daemon, so each client woken by its answer
//! preempts one. For the request that dominates a streaming agent — one `stream.append` per
//! delta — that machinery cost more than the append's own work: a daemon append took 14.6 µs
//! of CPU at 256 streams where a single-threaded server doing the same parse, seal and group
//! commit (`bench/src/ceiling.rs`) took 8.0 µs and Redis 12.2 µs (docs/benchmarks.md, "Issue
//! 15, ninth session"). Here the loop is that server's: one `epoll_wait` per turn, one `recv`
//! per ready connection (level-triggered: what a turn leaves unread is reported again), the
//! commit at the end of the turn, the answers sent by the committing thread.
//!
//! **Which connections.** A connection moves here from tokio when it sends its first
//! `stream.append` (`server.rs`): producers stream, credential clients and subscribers never
//! do, and they keep tokio's two workers, so an fsync on this thread never delays a `cred.get`
//! of theirs. A moved connection is served for every request it sends, in order: an append is
//! queued here; a request answered without waiting (`cred.get` from the file cache, a refusal)
//! is answered here; anything else runs as a task on tokio, as before. Its output (the answers
//! of those tasks, subscription events) still goes through its outbox: written by whoever
//! has the line when nothing is queued before it, else by its writer task.
//!
//! **What stays with the connection's task.** Its life: the task that accepted it waits while
//! the lane reads it, then does what it always did when a connection ends (wait for requests in
//! flight, end the session, drain the outbox). The lane tells it when it stopped reading (the
//! client closed, a limit, an error), and the task tells the lane to stop (shutdown, or the
//! outbox closed the connection) with [`Lane::release`], which the lane answers the same way.
//!
//! **Limits are the same as tokio's path.** A line over `max_frame` closes the connection with
//! the same error line; a line started and not finished within the read timeout, likewise; an
//! idle connection (nothing in flight, no subscription, no run it holds) closes after the idle timeout; at the
//! in-flight cap the connection is not read until a request finishes (a tokio task waits for
//! the slot and hands it back). Nothing the lane runs may wait: a request that might is a task.

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{epoll, eventfd, EventfdFlags};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use zeroize::{Zeroize, Zeroizing};

use super::answers::Sender;
use super::handlers::{self, Routed};
use super::protocol::{self, RpcError};
use super::session::{cork, uncork, Session, CORK_MAX};
use crate::config::Limits;
use crate::service::Daemon;

/// A connection's read buffer: what one `recv` may take (Redis reads a client 16 KiB at a
/// time). A line longer than this grows the buffer, up to the line cap, for as long as it is
/// being read.
const READ_BYTES: usize = 16 * 1024;
/// The wake-up eventfd's token in the epoll set (connection tokens are connection numbers,
/// which start at 1).
const WAKE: u64 = 0;
/// The longest the lane sleeps without looking at its connections' timeouts.
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// A connection handed over by its task ([`Lane::adopt`]).
pub struct Adopted {
    /// The connection's number (its token here).
    pub conn: u64,
    /// Its socket, no longer registered with tokio (non-blocking).
    pub sock: UnixStream,
    /// Bytes its task read past the line it handled last: the start of what comes next.
    pub pending: Zeroizing<Vec<u8>>,
    /// Its session (output, grant, subscriptions).
    pub session: Arc<Session>,
    /// Its in-flight slots.
    pub inflight: Arc<Semaphore>,
    /// Told when the lane stops reading it.
    pub done: oneshot::Sender<()>,
}

enum Msg {
    Adopt(Box<Adopted>),
    /// A connection that was waiting may be read again: an in-flight slot freed for it (the
    /// permit), or its client read the answers it owed (none).
    Resume(u64, Option<OwnedSemaphorePermit>),
    /// Stop reading this connection (its task is ending it).
    Release(u64),
}

struct Shared {
    inbox: Mutex<Inbox>,
    /// An eventfd: written to wake the lane for its inbox.
    wake: OwnedFd,
}

#[derive(Default)]
struct Inbox {
    msgs: Vec<Msg>,
    stopping: bool,
}

thread_local! {
    /// Set on the lane's thread: its own appends need no nudge (it commits them at the end of
    /// the turn that queued them).
    static ON_LANE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Shared {
    /// Wake the lane for its inbox, or for a record another thread queued (it commits at the
    /// end of every turn it was woken for).
    fn ring(&self) {
        // A counter that cannot overflow in practice (2^64 - 2 wake-ups); a failed write leaves
        // the work for the lane's next turn, at the latest after MAX_SLEEP.
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// Hand the lane a message (`None`: stop). Once it is stopping, a message is dropped here:
    /// an adopted connection's `done` sender with it, so its task, waiting on it, goes on.
    fn post(&self, msg: Option<Msg>) {
        {
            let mut inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
            match msg {
                Some(_) if inbox.stopping => return,
                Some(m) => inbox.msgs.push(m),
                None => inbox.stopping = true,
            }
        }
        self.ring();
    }
}

/// The lane: its thread and the way to reach it.
pub struct Lane {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    daemon: Arc<Daemon>,
}

impl Lane {
    /// Start the lane's thread. `runtime` is where the requests it does not serve itself run
    /// (the thread enters it, so a task spawned from the lane lands there).
    pub fn start(
        daemon: Arc<Daemon>,
        limits: Limits,
        runtime: tokio::runtime::Handle,
    ) -> io::Result<Lane> {
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &ep,
            &wake,
            epoll::EventData::new_u64(WAKE),
            epoll::EventFlags::IN,
        )?;
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox::default()),
            wake,
        });
        let sender = Sender::start()?;
        let thread = {
            let (shared, daemon) = (Arc::clone(&shared), Arc::clone(&daemon));
            std::thread::Builder::new()
                .name("holdfast-lane".into())
                .spawn(move || {
                    ON_LANE.with(|on| on.set(true));
                    let _entered = runtime.enter();
                    Turns {
                        daemon,
                        limits,
                        shared,
                        ep,
                        conns: HashMap::new(),
                        scratch: Input::new(&[], READ_BYTES),
                        next_sweep: Instant::now() + MAX_SLEEP,
                        sender,
                    }
                    .run();
                })?
        };
        // The lane is the journal's committer from now on: a record queued by any other
        // thread wakes it, and it commits at the end of that turn.
        let nudge = {
            let shared = Arc::clone(&shared);
            Arc::new(move || {
                if !ON_LANE.with(std::cell::Cell::get) {
                    shared.ring();
                }
            })
        };
        daemon.lane_commits(Some(nudge));
        Ok(Lane {
            shared,
            thread: Mutex::new(Some(thread)),
            daemon,
        })
    }

    /// Take over reading a connection. Its task waits on `done` (see the module's comment).
    pub fn adopt(&self, a: Adopted) {
        self.shared.post(Some(Msg::Adopt(Box::new(a))));
    }

    /// Stop reading connection `conn`; its `done` is then told (at once if the lane already
    /// stopped reading it).
    pub fn release(&self, conn: u64) {
        self.shared.post(Some(Msg::Release(conn)));
    }

    /// Stop the thread (every connection it still reads is told it ended) and wait for it. The
    /// runtime's workers commit the journal again.
    pub fn stop(&self) {
        self.daemon.lane_commits(None);
        self.shared.post(None);
        super::answers::join_once(&self.thread);
        // Messages that came after the thread's last look (none are taken once it stops).
        let left = std::mem::take(
            &mut self
                .shared
                .inbox
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .msgs,
        );
        drop(left);
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the lane keeps of a connection.
struct LaneConn {
    sock: UnixStream,
    input: Input,
    session: Arc<Session>,
    inflight: Arc<Semaphore>,
    done: Option<oneshot::Sender<()>>,
    /// At the in-flight cap: out of the epoll set until a slot frees ([`Msg::Resume`]).
    paused: bool,
    /// When the line being read started arriving (the read timeout); `None` between lines.
    line_since: Option<Instant>,
    /// When the connection last sent anything (the idle timeout).
    active_at: Instant,
}

/// What handling a connection's buffered lines came to.
enum Flow {
    /// Every whole line handled; read on.
    Read,
    /// At the in-flight cap: wait for a slot.
    Paused,
    /// Not read until its client reads the answers it owes (`Outbox::should_pause`).
    Owed,
    /// Stop reading it: `Some` carries the error line owed to the client first.
    Close(Option<String>),
}

/// The lane's thread state.
struct Turns {
    daemon: Arc<Daemon>,
    limits: Limits,
    shared: Arc<Shared>,
    ep: OwnedFd,
    conns: HashMap<u64, LaneConn>,
    /// What a connection with nothing left over is read into: one buffer for them all, warm in
    /// the cache, where a buffer per connection (256 of them at 256 streams) made each `recv`
    /// copy into cold memory. What a read leaves unhandled (a line not finished, or lines
    /// waiting for an in-flight slot) moves to the connection's own [`Input`].
    scratch: Input,
    /// When the earliest timeout of a connection may have passed.
    next_sweep: Instant,
    /// Sends a turn's answers when there are many (`answers.rs`).
    sender: Sender,
}

impl Turns {
    fn run(mut self) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(1024);
        loop {
            let now = Instant::now();
            let sleep = self
                .next_sweep
                .saturating_duration_since(now)
                .min(MAX_SLEEP);
            let timeout = rustix::event::Timespec {
                tv_sec: sleep.as_secs() as i64,
                tv_nsec: i64::from(sleep.subsec_nanos()),
            };
            events.clear();
            match epoll::wait(
                &self.ep,
                rustix::buffer::spare_capacity(&mut events),
                Some(&timeout),
            ) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    // Nothing the lane does can make epoll_wait fail on a valid epoll fd; if
                    // it does, every connection is handed back as ended rather than hung.
                    tracing::error!(error = %e, "append lane: epoll_wait failed; closing its connections");
                    self.end_all();
                    return;
                }
            }
            let mut appended = false;
            for ev in &events {
                let k = ev.data.u64();
                if k == WAKE {
                    let mut drain = [0u8; 8];
                    let _ = rustix::io::read(&self.shared.wake, &mut drain);
                    // Woken for the inbox, or for a record another thread queued: commit.
                    appended = true;
                    if self.inbox() {
                        self.end_all();
                        return;
                    }
                } else {
                    appended |= self.ready(k);
                }
            }
            // The turn's appends: written, synced and answered on this thread, with one write
            // and one fdatasync (unless another thread is committing: then that one takes them).
            if appended {
                if let Some(s) = self.daemon.streams_if_open() {
                    self.sender.commit(|| s.assist(&|| false));
                }
            }
            if Instant::now() >= self.next_sweep {
                self.sweep();
            }
        }
    }

    /// Handle the inbox; `true` when the lane is to stop. (A turn woken for it commits
    /// whatever it queued.)
    fn inbox(&mut self) -> bool {
        let (msgs, stopping) = {
            let mut inbox = self
                .shared
                .inbox
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            (std::mem::take(&mut inbox.msgs), inbox.stopping)
        };
        for msg in msgs {
            match msg {
                Msg::Adopt(a) => {
                    self.adopt(*a);
                }
                Msg::Resume(k, permit) => {
                    let Some(c) = self.conns.get_mut(&k) else {
                        continue;
                    };
                    c.paused = false;
                    if let Err(e) = epoll::add(
                        &self.ep,
                        &c.sock,
                        epoll::EventData::new_u64(k),
                        epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
                    ) {
                        self.close(k, Some(format!("internal error: {e}")));
                        continue;
                    }
                    self.serve(k, permit, false);
                }
                Msg::Release(k) => self.close(k, None),
            }
        }
        stopping
    }

    /// Register an adopted connection and handle what its task had already read.
    fn adopt(&mut self, a: Adopted) -> bool {
        let Adopted {
            conn,
            sock,
            pending,
            session,
            inflight,
            done,
        } = a;
        if let Err(e) = epoll::add(
            &self.ep,
            &sock,
            epoll::EventData::new_u64(conn),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        ) {
            tracing::warn!(conn, error = %e, "append lane: cannot watch the connection; closing it");
            let _ = done.send(());
            return false;
        }
        let now = Instant::now();
        self.daemon.lane_connection(true);
        self.conns.insert(
            conn,
            LaneConn {
                sock,
                input: Input::new(&pending, 0),
                session,
                inflight,
                done: Some(done),
                paused: false,
                line_since: None,
                active_at: now,
            },
        );
        self.arm(now + self.limits.idle);
        tracing::debug!(conn, "connection moved to the append lane");
        self.serve(conn, None, false)
    }

    /// Connection `k` is readable (or hung up): read it once and handle its whole lines.
    /// Returns whether an append was queued.
    fn ready(&mut self, k: u64) -> bool {
        let max = self.limits.max_frame;
        let Some(c) = self.conns.get_mut(&k) else {
            return false;
        };
        if c.paused {
            return false;
        }
        let shared_buf = c.input.is_empty();
        let input = match shared_buf {
            true => &mut self.scratch,
            false => &mut c.input,
        };
        match input.read_from(&c.sock, max) {
            Ok(0) => {
                // The client closed: a line it had started is dropped, as tokio's reader drops a
                // truncated one.
                self.close(k, None);
                false
            }
            Ok(_) => {
                c.active_at = Instant::now();
                self.serve(k, None, shared_buf)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => false,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                self.close(k, Some(too_long(max)));
                false
            }
            Err(_) => {
                self.close(k, None);
                false
            }
        }
    }

    /// Handle every whole line connection `k` has buffered (the first with `permit`, when it
    /// waited for one), then act on what that came to; `in_scratch`: what it read is in the
    /// lane's shared buffer, and what is left of it afterwards moves to the connection's own.
    /// Returns whether an append was queued.
    fn serve(&mut self, k: u64, permit: Option<OwnedSemaphorePermit>, in_scratch: bool) -> bool {
        let Some(c) = self.conns.get_mut(&k) else {
            return false;
        };
        let (mut appended, mut handled) = (false, false);
        let (daemon, max) = (&self.daemon, self.limits.max_frame);
        let input = match in_scratch {
            true => &mut self.scratch,
            false => &mut c.input,
        };
        // A bug in a handler must not take every lane connection down with this thread: it
        // ends this connection, as a panicking task ends its own under tokio.
        let flow = catch_unwind(AssertUnwindSafe(|| {
            let mut done = Handled {
                appended: &mut appended,
                lines: &mut handled,
            };
            serve_lines(
                daemon,
                &c.session,
                &c.inflight,
                input,
                max,
                permit,
                &mut done,
            )
        }))
        .unwrap_or_else(|_| {
            tracing::error!(
                conn = k,
                "append lane: a request handler panicked; closing the connection"
            );
            Flow::Close(None)
        });
        if in_scratch {
            c.input.take_rest(&mut self.scratch);
        }
        // Answers owed past the pause (or the daemon's budget tight): as tokio's reader, no
        // request is read until the client reads them, for at most the read timeout.
        let flow = match flow {
            Flow::Read if c.session.outbox.should_pause() => Flow::Owed,
            other => other,
        };
        match flow {
            Flow::Owed => {
                c.paused = true;
                let _ = epoll::delete(&self.ep, &c.sock);
                let (session, shared, wait) = (
                    Arc::clone(&c.session),
                    Arc::clone(&self.shared),
                    self.limits.read,
                );
                tokio::spawn(async move {
                    if tokio::time::timeout(wait, session.outbox.drained())
                        .await
                        .is_ok()
                    {
                        shared.post(Some(Msg::Resume(k, None)));
                    } else {
                        tracing::warn!(
                            conn = k,
                            owed = session.outbox.owed(),
                            waited_s = wait.as_secs_f64(),
                            "client is not reading its answers; closing the connection"
                        );
                        shared.post(Some(Msg::Release(k)));
                    }
                });
            }
            Flow::Read => {
                // The read timeout runs from a line's first byte, as tokio's reader's does: a
                // line left unfinished after others were handled is a new one.
                let now = Instant::now();
                if c.input.is_empty() {
                    c.line_since = None;
                } else if c.line_since.is_none() || handled {
                    c.line_since = Some(now);
                    self.next_sweep = self.next_sweep.min(now + self.limits.read);
                }
            }
            Flow::Paused => {
                c.paused = true;
                let _ = epoll::delete(&self.ep, &c.sock);
                let (inflight, shared) = (Arc::clone(&c.inflight), Arc::clone(&self.shared));
                // The slot is awaited on tokio (this thread never waits for one); the request
                // that needs it is handled when it comes back.
                tokio::spawn(async move {
                    if let Ok(p) = inflight.acquire_owned().await {
                        shared.post(Some(Msg::Resume(k, Some(p))));
                    }
                });
            }
            Flow::Close(msg) => self.close(k, msg),
        }
        appended
    }

    /// Stop reading connection `k` (an error line first, if one is owed) and tell its task.
    fn close(&mut self, k: u64, msg: Option<String>) {
        let Some(mut c) = self.conns.remove(&k) else {
            return;
        };
        self.daemon.lane_connection(false);
        if !c.paused {
            let _ = epoll::delete(&self.ep, &c.sock);
        }
        if let Some(msg) = msg {
            tracing::info!(conn = k, reason = %msg, "closing connection");
            c.session.outbox.send(protocol::response_err(
                &serde_json::Value::Null,
                &RpcError::invalid_request(msg),
            ));
        }
        if let Some(done) = c.done.take() {
            let _ = done.send(());
        }
    }

    /// Every connection is told the lane stopped reading it (the lane is stopping).
    fn end_all(&mut self) {
        let keys: Vec<u64> = self.conns.keys().copied().collect();
        for k in keys {
            self.close(k, None);
        }
    }

    /// A timeout may come due at `at`.
    fn arm(&mut self, at: Instant) {
        self.next_sweep = self.next_sweep.min(at);
    }

    /// Close the connections whose read or idle timeout passed; note the next one due.
    fn sweep(&mut self) {
        let now = Instant::now();
        let (read, idle, slots) = (self.limits.read, self.limits.idle, self.limits.max_inflight);
        let mut next = now + MAX_SLEEP;
        let mut expired = Vec::new();
        for (&k, c) in &mut self.conns {
            if c.paused {
                // Waiting for its own requests: neither timeout runs (tokio's reader does not
                // read while it waits for a slot either).
                continue;
            }
            if let Some(since) = c.line_since {
                if now >= since + read {
                    expired.push((
                        k,
                        Some(format!(
                            "request not completed within {} s; closing",
                            read.as_secs_f64()
                        )),
                    ));
                    continue;
                }
                next = next.min(since + read);
            } else if now >= c.active_at + idle {
                if c.inflight.available_permits() == slots
                    && c.session.subscriptions.count() == 0
                    && !c.session.holds_any()
                {
                    expired.push((k, None));
                    continue;
                }
                c.active_at = now;
                next = next.min(now + idle);
            } else {
                next = next.min(c.active_at + idle);
            }
        }
        self.next_sweep = next;
        for (k, msg) in expired {
            self.close(k, msg);
        }
    }
}

/// The error line for a request over the line cap (the same as tokio's reader sends).
fn too_long(max: usize) -> String {
    format!("request line longer than {max} bytes; closing")
}

/// What [`serve_lines`] did besides its [`Flow`]: whether it queued an append (the turn then
/// commits), and whether it handled any line (a line still unfinished afterwards is a new one).
struct Handled<'a> {
    appended: &'a mut bool,
    lines: &'a mut bool,
}

/// Handle the whole lines in `input` a connection sent, in order.
fn serve_lines(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    inflight: &Arc<Semaphore>,
    input: &mut Input,
    max: usize,
    mut permit: Option<OwnedSemaphorePermit>,
    done: &mut Handled<'_>,
) -> Flow {
    let mut corked: Zeroizing<Vec<u8>> = Zeroizing::new(Vec::new());
    let flow = loop {
        let Some(line) = input.next_line() else {
            if input.unfinished_len() > max {
                break Flow::Close(Some(too_long(max)));
            }
            break Flow::Read;
        };
        if line.len() > max {
            break Flow::Close(Some(too_long(max)));
        }
        // Every request but an inline answer holds a slot until it is answered; one is taken
        // before the line is looked at, so a line waiting for a slot is read again whole.
        let slot = match permit.take() {
            Some(p) => p,
            None => match Arc::clone(inflight).try_acquire_owned() {
                Ok(p) => p,
                Err(_) => break Flow::Paused,
            },
        };
        match handlers::route(daemon, session, input.line(&line)) {
            Routed::Done(reply) => {
                // Answers to pipelined requests leave in one send.
                cork(session, &mut corked, &reply);
                drop(slot);
            }
            Routed::Append(id, a) => {
                super::streams::append(daemon, session, id, a, slot);
                *done.appended = true;
            }
            Routed::Async(id, call, grant) => {
                let (daemon, session) = (Arc::clone(daemon), Arc::clone(session));
                tokio::spawn(async move {
                    handlers::respond(&daemon, &session, id, call, grant).await;
                    drop(slot);
                });
            }
        }
        input.consume(line.next);
        *done.lines = true;
        if corked.len() >= CORK_MAX {
            uncork(session, &mut corked);
        }
    };
    uncork(session, &mut corked);
    flow
}

/// Where a whole line lies in an [`Input`]: `start..end` (without its `\n` or `\r\n`), and
/// where the line after it starts.
struct LineAt {
    start: usize,
    end: usize,
    next: usize,
}

impl LineAt {
    fn len(&self) -> usize {
        self.end - self.start
    }
}

/// What a lane connection read and has not handled yet, `buf[start..end]`. Every byte of
/// `buf` is initialized (zero past `end`), and the bytes of a line are zeroized as soon as it
/// is handled: a `cred.set` line carries its secret, and nothing of it stays behind in this
/// buffer (unlike the `BufReader` under a tokio connection; docs/design.md, "Secrets in memory").
struct Input {
    buf: Zeroizing<Vec<u8>>,
    start: usize,
    end: usize,
    /// The buffer kept when it empties: the lane's shared one keeps [`READ_BYTES`], a
    /// connection's keeps nothing (it holds bytes only while a read left some unhandled).
    keep: usize,
}

impl Input {
    /// An input holding `pending`, keeping `keep` bytes of buffer when it empties.
    fn new(pending: &[u8], keep: usize) -> Input {
        let mut input = Input {
            buf: Zeroizing::new(vec![0u8; keep.max(pending.len())]),
            start: 0,
            end: 0,
            keep,
        };
        input.put(pending);
        input
    }

    /// Append `bytes` after what is buffered, making room (the buffer grows by moving, the
    /// old one zeroized as it is dropped).
    fn put(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let need = self.end + bytes.len();
        if need > self.buf.len() {
            let mut grown = Zeroizing::new(vec![0u8; need.max(READ_BYTES)]);
            grown[..self.end].copy_from_slice(&self.buf[..self.end]);
            self.buf = grown;
        }
        self.buf[self.end..need].copy_from_slice(bytes);
        self.end = need;
    }

    /// Take over what `from` has not handled (a line not finished, lines waiting for a slot),
    /// leaving `from` empty and zeroized.
    fn take_rest(&mut self, from: &mut Input) {
        if !from.is_empty() {
            self.put(&from.buf[from.start..from.end]);
            let end = from.end;
            from.consume(end);
        }
    }

    /// Nothing buffered.
    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The bytes buffered that are not a whole line yet (a trailing `\r` not counted: it may
    /// be the first half of a `\r\n`, and the cap is on the line without its terminator).
    fn unfinished_len(&self) -> usize {
        let n = self.end - self.start;
        n - usize::from(n > 0 && self.buf[self.end - 1] == b'\r')
    }

    /// The next whole line, if one is buffered.
    fn next_line(&self) -> Option<LineAt> {
        let nl = memchr::memchr(b'\n', &self.buf[self.start..self.end])? + self.start;
        let end = if nl > self.start && self.buf[nl - 1] == b'\r' {
            nl - 1
        } else {
            nl
        };
        Some(LineAt {
            start: self.start,
            end,
            next: nl + 1,
        })
    }

    fn line(&self, at: &LineAt) -> &[u8] {
        &self.buf[at.start..at.end]
    }

    /// The bytes before `upto` are handled: zeroize them and move past them.
    fn consume(&mut self, upto: usize) {
        self.buf[self.start..upto].zeroize();
        self.start = upto;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() != self.keep {
                // Grown for a long line, or a connection's: back to what it keeps (the old one
                // is zeroized as it is dropped).
                self.buf = Zeroizing::new(vec![0u8; self.keep]);
            }
        }
    }

    /// One `recv` into the room after what is buffered, making room first: the unhandled
    /// bytes move to the front, or, when a line longer than the buffer is being read, the
    /// buffer grows (up to the line cap and its terminator: `max + 2`).
    fn read_from(&mut self, sock: &UnixStream, max: usize) -> io::Result<usize> {
        if self.buf.is_empty() {
            self.buf = Zeroizing::new(vec![0u8; READ_BYTES]);
        }
        if self.end == self.buf.len() {
            if self.start > 0 {
                let n = self.end - self.start;
                self.buf.copy_within(self.start..self.end, 0);
                self.buf[n..self.end].zeroize();
                self.start = 0;
                self.end = n;
            } else {
                let cap = max + 2;
                if self.buf.len() >= cap {
                    // Full, and no line end in it: over the cap (the caller closes).
                    return Err(io::ErrorKind::InvalidData.into());
                }
                // Past 64 KiB straight to the cap, one size that glibc serves by mmap and
                // returns whole (crypto::plain::PlainBuf::reserve_within says why).
                let doubled = (2 * self.buf.len()).max(READ_BYTES);
                let size = if doubled > crate::crypto::plain::KEEP_BYTES {
                    cap
                } else {
                    doubled.min(cap)
                };
                let mut grown = Zeroizing::new(vec![0u8; size]);
                grown[..self.end].copy_from_slice(&self.buf[..self.end]);
                self.buf = grown;
            }
        }
        let n = (&*sock).read(&mut self.buf[self.end..])?;
        self.end += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stopping the lane lets every connection's task go: one it was reading is told it
    /// ended, one handed over after the stop (a task past the shutdown grace) is let go at
    /// once rather than waiting on a message nobody reads, and the daemon is released with no
    /// connection counted on the lane.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_lane_lets_every_connection_go() {
        let d = tempfile::tempdir().unwrap();
        let config = crate::config::Config::default();
        let limits = config.limits();
        let daemon =
            Arc::new(Daemon::open(d.path().join("s.sock"), d.path().join("data"), config).unwrap());
        let lane = Lane::start(
            Arc::clone(&daemon),
            limits,
            tokio::runtime::Handle::current(),
        )
        .unwrap();
        let adopt = |conn: u64| {
            let (ours, theirs) = UnixStream::pair().unwrap();
            ours.set_nonblocking(true).unwrap();
            let write_side = Arc::new(super::super::conn::Conn::from_std(
                ours.try_clone().unwrap(),
            ));
            let (done, ended) = oneshot::channel();
            lane.adopt(Adopted {
                conn,
                sock: ours,
                pending: Zeroizing::new(Vec::new()),
                session: Session::for_test(conn, write_side),
                inflight: Arc::new(Semaphore::new(32)),
                done,
            });
            (theirs, ended)
        };
        let (_client, ended) = adopt(1);
        let t = Instant::now();
        while daemon.lane_connections() != 1 {
            assert!(t.elapsed() < Duration::from_secs(10), "never adopted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        lane.stop();
        let told = tokio::time::timeout(Duration::from_secs(10), ended).await;
        assert!(
            matches!(told, Ok(Ok(()))),
            "the adopted connection: {told:?}"
        );
        let (_late, ended) = adopt(2);
        let told = tokio::time::timeout(Duration::from_secs(10), ended).await;
        assert!(
            told.is_ok(),
            "a connection handed over after the stop still waits"
        );
        drop(lane);
        assert_eq!(daemon.lane_connections(), 0);
        assert_eq!(
            Arc::strong_count(&daemon),
            1,
            "the lane still holds the daemon"
        );
        println!("lane stop: the connection it read told, one handed over late let go, the daemon released");
    }

    fn lines_of(input: &mut Input) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(at) = input.next_line() {
            out.push(String::from_utf8_lossy(input.line(&at)).into_owned());
            input.consume(at.next);
        }
        out
    }

    /// Lines come out whole and in order however the bytes arrive (split anywhere, `\r\n` or
    /// `\n`, a line longer than the buffer), every handled byte is zeroized, and a buffer grown
    /// for a long line goes back to its usual size once that line is handled.
    #[test]
    fn lines_arrive_split_anywhere_and_leave_nothing_behind() {
        let long = "L".repeat(3 * READ_BYTES);
        let lines = ["first", "", "second\r", &long, "é😀 \"q\"", "last"];
        let mut wire = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            wire.extend_from_slice(l.as_bytes());
            wire.extend_from_slice(if i % 2 == 0 { b"\n" } else { b"\r\n" });
        }
        let want: Vec<String> = lines
            .iter()
            .map(|l| l.trim_end_matches('\r').to_owned())
            .collect();
        for chunk in [1, 7, 100, READ_BYTES - 3, READ_BYTES, wire.len()] {
            let (a, b) = UnixStream::pair().unwrap();
            b.set_nonblocking(true).unwrap();
            let mut input = Input::new(&[], READ_BYTES);
            let mut got = Vec::new();
            let writer = {
                let wire = wire.clone();
                std::thread::spawn(move || {
                    use std::io::Write;
                    let mut a = a;
                    for piece in wire.chunks(chunk) {
                        a.write_all(piece).unwrap();
                    }
                })
            };
            let mut most = 0;
            while got.len() < want.len() {
                match input.read_from(&b, 4 * READ_BYTES) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    Err(e) => panic!("{e}"),
                }
                most = most.max(input.buf.len());
                got.extend(lines_of(&mut input));
                assert!(
                    input.buf[..input.start].iter().all(|&b| b == 0),
                    "a handled line left bytes behind"
                );
            }
            writer.join().unwrap();
            assert_eq!(got, want, "chunks of {chunk}");
            assert!(most > READ_BYTES, "the long line needed a bigger buffer");
            assert_eq!(
                input.buf.len(),
                READ_BYTES,
                "grown buffer kept (chunks of {chunk})"
            );
            assert!(
                input.buf.iter().all(|&b| b == 0),
                "residue after the last line"
            );
        }
        println!(
            "lane input: {} lines, {} bytes, in chunks of 1 to {} bytes: whole, in order, zeroized",
            lines.len(),
            wire.len(),
            wire.len()
        );
    }

    /// What a read into the lane's shared buffer leaves unhandled (the end of a line, or whole
    /// lines waiting for an in-flight slot) moves to the connection's own buffer whole and in
    /// order; the shared buffer is left empty and zeroized, and a connection's buffer is freed
    /// once it empties.
    #[test]
    fn what_a_read_leaves_moves_to_the_connection_whole() {
        let mut scratch = Input::new(&[], READ_BYTES);
        scratch.put(b"one\ntwo\nthr");
        let first = scratch.next_line().unwrap();
        assert_eq!(scratch.line(&first), b"one");
        scratch.consume(first.next);
        let mut own = Input::new(&[], 0);
        assert!(
            own.buf.is_empty(),
            "a connection's buffer is made only when needed"
        );
        own.take_rest(&mut scratch);
        assert!(scratch.is_empty());
        assert!(
            scratch.buf.iter().all(|&b| b == 0),
            "residue in the shared buffer"
        );
        assert_eq!(scratch.buf.len(), READ_BYTES, "the shared buffer is kept");
        own.put(b"ee\n");
        assert_eq!(lines_of(&mut own), ["two", "three"]);
        assert!(
            own.is_empty() && own.buf.is_empty(),
            "an empty connection buffer is freed"
        );
    }

    /// What counts against the line cap is the line without its terminator, also while it is
    /// still arriving; a buffer at the cap with no line end reads nothing more.
    #[test]
    fn the_cap_counts_the_line_without_its_terminator() {
        let mut input = Input::new(b"0123456789\r", 0);
        assert_eq!(
            input.unfinished_len(),
            10,
            "a trailing \\r may be half of \\r\\n"
        );
        assert!(input.next_line().is_none());
        input = Input::new(b"0123456789\r\nab", 0);
        let at = input.next_line().unwrap();
        assert_eq!(at.len(), 10);
        input.consume(at.next);
        assert_eq!(input.unfinished_len(), 2);
        // At the cap (max + 2 bytes, no newline), nothing more is read: the read is refused
        // as over the cap, with the bytes waiting on the socket left there.
        let max = READ_BYTES - 2;
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        std::io::Write::write_all(&mut a, b"more").unwrap();
        let mut full = Input::new(&vec![b'x'; READ_BYTES], 0);
        let e = full.read_from(&b, max).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(full.unfinished_len() > max);
        assert_eq!(full.end, READ_BYTES, "read past the cap");
    }
}
