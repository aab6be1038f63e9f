//! The socket server: bind (singleton lock, stale-socket recovery, 0600 socket in a 0700
//! directory), accept (peer uid checked before a byte is read; a connection cap with a clean
//! refusal), one task per connection (bounded frames, timeouts, a capped output queue,
//! pipelined requests), and graceful shutdown.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use interprocess::local_socket::tokio::{prelude::*, Listener, Stream};
use interprocess::local_socket::{GenericFilePath, ListenerOptions};
use interprocess::os::unix::local_socket::ListenerOptionsExt;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use zeroize::Zeroizing;

use super::frame::{FrameError, FrameReader};
use super::handlers;
use super::protocol::{self, RpcError};
use crate::config::{Limits, PluginGrant};
use crate::durable::{self, lock, perms, Faults, LockGuard, LockMode};
use crate::error::ErrorKind;
use crate::limits::{SHUTDOWN_GRACE, SOCKET_CHECK_INTERVAL};
use crate::service::Daemon;

/// Why the daemon could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Another daemon holds the singleton lock.
    #[error("holdfast daemon already running (pid {pid}) for {what}; not touching its socket")]
    AlreadyRunning {
        /// The holder's pid, as it recorded it.
        pid: String,
        /// Which lock (socket dir or data dir).
        what: String,
    },
    /// Something else answers on the socket path.
    #[error("{0}")]
    SocketInUse(String),
    /// Directory or socket setup failed.
    #[error("{0}")]
    Setup(String),
}

/// A bound listener and the locks held for the daemon's life.
pub struct Bound {
    /// The listener.
    pub listener: Listener,
    /// Its path.
    pub path: PathBuf,
    /// The socket file's device and inode, to tell our socket from a replacement.
    pub ino: (u64, u64),
    _locks: Vec<LockGuard>,
}

fn take_singleton(path: &Path, what: &str) -> Result<LockGuard, ServeError> {
    match lock::try_lock(path, LockMode::Exclusive) {
        Ok(Some(g)) => {
            let _ = g.record(&std::process::id().to_string());
            Ok(g)
        }
        Ok(None) => Err(ServeError::AlreadyRunning {
            pid: lock::recorded(path).unwrap_or_else(|| "unknown".into()),
            what: what.to_owned(),
        }),
        Err(e) => Err(ServeError::Setup(e.to_string())),
    }
}

/// The singleton locks, held, and the socket path cleared for binding.
pub struct Claim {
    path: PathBuf,
    locks: Vec<LockGuard>,
}

/// Prepare the socket directory, take the singleton locks (one beside the socket, one in the
/// data directory) and clear a stale socket (only under the lock, only after a refused
/// connect). Done before the stores are opened, so a second daemon is refused before it reads
/// (or repairs) anything.
pub fn claim(socket: &Path, data_dir: &Path) -> Result<Claim, ServeError> {
    let setup = |e: String| ServeError::Setup(e);
    let dir = socket
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| setup(format!("socket path {} has no directory", socket.display())))?;
    durable::create_private_dir(dir, &Faults::none()).map_err(|e| setup(e.to_string()))?;
    perms::check_private_dir(dir).map_err(|e| setup(format!("socket directory: {e}")))?;
    durable::create_private_dir(data_dir, &Faults::none()).map_err(|e| setup(e.to_string()))?;
    let mut locks = vec![take_singleton(
        &dir.join("holdfast.lock"),
        &format!("socket {}", socket.display()),
    )?];
    locks.push(take_singleton(
        &data_dir.join("daemon.lock"),
        &format!("data directory {}", data_dir.display()),
    )?);
    if let Ok(meta) = std::fs::symlink_metadata(socket) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(setup(format!(
                "{} exists and is not a socket; move it away or choose another --socket",
                socket.display()
            )));
        }
        match std::os::unix::net::UnixStream::connect(socket) {
            Ok(_) => {
                return Err(ServeError::SocketInUse(format!(
                    "another server answers on {}; not replacing its socket",
                    socket.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tracing::info!(socket = %socket.display(), "removing stale socket (connect refused, singleton lock held)");
                durable::remove_durably(dir, &file_name(socket)?, &Faults::none())
                    .map_err(|e| setup(e.to_string()))?;
            }
            Err(e) => {
                return Err(setup(format!(
                    "cannot tell whether {} is stale: {e}",
                    socket.display()
                )))
            }
        }
    }
    Ok(Claim {
        path: socket.to_path_buf(),
        locks,
    })
}

impl Claim {
    /// Bind a pathname socket with mode 0600 (set with `fchmod` before `bind`: no umask race).
    /// Needs a tokio runtime.
    pub fn bind(self) -> Result<Bound, ServeError> {
        let setup = ServeError::Setup;
        let socket = self.path.as_path();
        let name = socket
            .to_fs_name::<GenericFilePath>()
            .map_err(|e| setup(format!("socket path {}: {e}", socket.display())))?;
        let listener = ListenerOptions::new()
            .name(name)
            .mode(0o600)
            .reclaim_name(false)
            .create_tokio()
            .map_err(|e| setup(format!("cannot bind {}: {e}", socket.display())))?;
        let ino =
            socket_ino(socket).ok_or_else(|| setup("socket vanished right after bind".into()))?;
        Ok(Bound {
            listener,
            path: self.path,
            ino,
            _locks: self.locks,
        })
    }
}

fn file_name(p: &Path) -> Result<String, ServeError> {
    p.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| ServeError::Setup(format!("bad socket path {}", p.display())))
}

fn socket_ino(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// What a connection's handlers share.
pub struct Session {
    /// Connection number (for logs and leases).
    pub id: u64,
    /// The grant bound by `hello` (`None` until hello).
    pub grant: Mutex<Option<PluginGrant>>,
    /// Open `cred.watch` subscriptions.
    pub watching: AtomicUsize,
    /// Responses and events to send.
    pub outbox: Outbox,
    next_subscription: AtomicU64,
    ended: AtomicBool,
    /// Notified when the connection ends (subscription forwarders stop).
    pub ended_notify: Notify,
}

impl Session {
    /// The grant, if `hello` was sent.
    pub fn grant(&self) -> Option<PluginGrant> {
        self.grant
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether the connection has ended.
    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        self.ended_notify.notify_waiters();
    }

    /// A new subscription number for this connection.
    pub fn subscription_id(&self) -> u64 {
        self.next_subscription.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// The output queue of one connection, capped in bytes: a client that stops reading is
/// disconnected instead of making the daemon buffer without bound.
pub struct Outbox {
    tx: mpsc::UnboundedSender<Zeroizing<Vec<u8>>>,
    queued: Arc<AtomicUsize>,
    max: usize,
    overflowed: AtomicBool,
    /// Notified when the connection must close (overflow).
    pub closed: Arc<Notify>,
}

impl Outbox {
    /// Queue a line. `false` if the connection is gone or its queue is over the cap (it is
    /// then being closed).
    pub fn send(&self, line: Zeroizing<Vec<u8>>) -> bool {
        let n = line.len();
        // Reserve first, then check: two senders cannot both slip under the cap. A line is
        // always admitted into an empty queue, so one response larger than the cap (a list of
        // a very large store) is delivered rather than closing the connection.
        let before = self.queued.fetch_add(n, Ordering::SeqCst);
        if before > 0 && before + n > self.max {
            self.queued.fetch_sub(n, Ordering::SeqCst);
            if !self.overflowed.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    queued = self.queued.load(Ordering::SeqCst),
                    cap = self.max,
                    "client is not reading its responses; closing the connection"
                );
            }
            self.closed.notify_one();
            return false;
        }
        if self.tx.send(line).is_err() {
            self.queued.fetch_sub(n, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Whether the connection is closing (overflow or writer gone).
    pub fn is_closed(&self) -> bool {
        self.overflowed.load(Ordering::SeqCst) || self.tx.is_closed()
    }
}

/// Why serving stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// `shutdown` was signalled (SIGTERM/SIGINT).
    Shutdown,
    /// The socket file was deleted or replaced: the daemon can no longer be reached.
    SocketLost,
}

/// Serve until `shutdown` turns true, then stop accepting, let in-flight requests finish
/// (up to a grace period) and return. The socket file is removed only if it is still ours.
pub async fn run(
    bound: Bound,
    daemon: Arc<Daemon>,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
    unlink_on_exit: bool,
) -> Stopped {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    let me = perms::euid();
    let allow_root = daemon.config.allow_root();
    let next_conn = AtomicU64::new(1);
    let mut check = tokio::time::interval(SOCKET_CHECK_INTERVAL);
    check.tick().await;
    let mut socket_lost = false;
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = check.tick() => {
                if socket_ino(&bound.path) != Some(bound.ino) {
                    tracing::error!(socket = %bound.path.display(), "our socket file was deleted or replaced; stopping (the new file, if any, is left alone)");
                    socket_lost = true;
                    break;
                }
            }
            accepted = bound.listener.accept() => {
                let stream = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Before reading a single byte: who is on the other end?
                let peer = stream.peer_creds().ok().and_then(|c| c.euid());
                let ok = match peer {
                    Some(uid) => uid == me || (uid == 0 && allow_root),
                    None => false,
                };
                if !ok {
                    tracing::warn!(peer_uid = ?peer, daemon_uid = me, "uid mismatch: closing the connection before reading from it");
                    drop(stream);
                    continue;
                }
                let conn = next_conn.fetch_add(1, Ordering::Relaxed);
                match Arc::clone(&permits).try_acquire_owned() {
                    Ok(permit) => {
                        let (daemon, limits, shutdown, done) =
                            (Arc::clone(&daemon), limits.clone(), shutdown.clone(), done_tx.clone());
                        tokio::spawn(async move {
                            connection(stream, daemon, limits, conn, shutdown).await;
                            drop(permit);
                            drop(done);
                        });
                    }
                    Err(_) => {
                        tracing::warn!(cap = limits.max_connections, "connection cap reached; refusing a client");
                        tokio::spawn(refuse(stream, limits.max_connections));
                    }
                }
            }
        }
    }
    // Stop listening at once: new clients get "connection refused" (and the CLI goes offline)
    // instead of waiting in the backlog for the grace period. The singleton locks stay held
    // until the end, so no second daemon starts while requests are still finishing.
    let Bound {
        listener,
        path,
        ino,
        _locks,
    } = bound;
    drop(listener);
    if unlink_on_exit && !socket_lost && socket_ino(&path) == Some(ino) {
        if let (Some(dir), Ok(name)) = (path.parent(), file_name(&path)) {
            let _ = durable::remove_durably(dir, &name, &Faults::none());
        }
    }
    drop(done_tx);
    if tokio::time::timeout(SHUTDOWN_GRACE, done_rx.recv())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_s = SHUTDOWN_GRACE.as_secs(),
            "connections still open after the grace period; exiting anyway"
        );
    }
    let flush_daemon = Arc::clone(&daemon);
    let _ = tokio::task::spawn_blocking(move || flush_daemon.flush_all()).await;
    drop(_locks);
    if socket_lost {
        Stopped::SocketLost
    } else {
        Stopped::Shutdown
    }
}

/// At the connection cap: one error line, then close.
async fn refuse(mut stream: Stream, cap: usize) {
    let err = RpcError::new(
        ErrorKind::Busy,
        format!("too many connections (the cap is {cap}); retry shortly"),
    );
    let line = protocol::response_err(&serde_json::Value::Null, &err);
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&line)).await;
}

async fn connection(
    stream: Stream,
    daemon: Arc<Daemon>,
    limits: Limits,
    conn: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    daemon.connections.fetch_add(1, Ordering::SeqCst);
    // `&Stream` reads and writes; the writer task holds its own reference.
    let stream = Arc::new(stream);
    let send_stream = Arc::clone(&stream);
    let (tx, mut rx) = mpsc::unbounded_channel::<Zeroizing<Vec<u8>>>();
    let queued = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(Notify::new());
    let session = Arc::new(Session {
        id: conn,
        grant: Mutex::new(None),
        watching: AtomicUsize::new(0),
        outbox: Outbox {
            tx,
            queued: Arc::clone(&queued),
            max: limits.max_output,
            overflowed: AtomicBool::new(false),
            closed: Arc::clone(&closed),
        },
        next_subscription: AtomicU64::new(0),
        ended: AtomicBool::new(false),
        ended_notify: Notify::new(),
    });
    let writer_closed = Arc::clone(&closed);
    let writer = tokio::spawn(async move {
        let mut send = &*send_stream;
        while let Some(line) = rx.recv().await {
            if send.write_all(&line).await.is_err() {
                writer_closed.notify_one();
                break;
            }
            queued.fetch_sub(line.len(), Ordering::SeqCst);
        }
        let _ = send.flush().await;
    });
    let inflight = Arc::new(Semaphore::new(limits.max_inflight));
    let mut reader = FrameReader::new(BufReader::new(&*stream), limits.max_frame);
    tracing::debug!(conn, "connection open");
    loop {
        let idle_ok = || {
            inflight.available_permits() == limits.max_inflight
                && session.watching.load(Ordering::SeqCst) == 0
        };
        let frame = tokio::select! {
            _ = shutdown.changed() => break,
            _ = closed.notified() => break,
            f = reader.next(limits.idle, limits.read, idle_ok) => f,
        };
        let line = match frame {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(e) => {
                let msg = match e {
                    FrameError::TooLong { max } => {
                        Some(format!("request line longer than {max} bytes; closing"))
                    }
                    FrameError::ReadTimeout => Some(format!(
                        "request not completed within {} s; closing",
                        limits.read.as_secs_f64()
                    )),
                    FrameError::Idle | FrameError::Truncated | FrameError::Io(_) => None,
                };
                if let Some(msg) = msg {
                    tracing::info!(conn, reason = %msg, "closing connection");
                    session.outbox.send(protocol::response_err(
                        &serde_json::Value::Null,
                        &RpcError::invalid_request(msg),
                    ));
                }
                break;
            }
        };
        // Backpressure: at the in-flight cap, stop reading until a request finishes.
        let permit = tokio::select! {
            _ = shutdown.changed() => break,
            p = Arc::clone(&inflight).acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let (daemon, session) = (Arc::clone(&daemon), Arc::clone(&session));
        if session.grant().is_none() {
            // Until `hello` has bound a grant, requests are handled in order, here: a client
            // may pipeline `hello` and its first requests, and those must see that grant.
            // (Before hello nothing touches a store, so this never waits on the disk.)
            let reply = handlers::handle_line(&daemon, &session, &line).await;
            session.outbox.send(reply);
            drop(permit);
            continue;
        }
        tokio::spawn(async move {
            let reply = handlers::handle_line(&daemon, &session, &line).await;
            session.outbox.send(reply);
            drop(permit);
        });
    }
    // Let in-flight requests reach their safe point (their store calls always complete), then
    // let the writer drain what is queued.
    let _ = tokio::time::timeout(
        SHUTDOWN_GRACE,
        inflight.acquire_many(limits.max_inflight as u32),
    )
    .await;
    daemon.release_connection(conn);
    session.end();
    drop(session);
    // A client that does not read would keep the writer blocked (and its socket open)
    // forever: after the drain time, abort it.
    let mut writer = writer;
    if tokio::time::timeout(Duration::from_secs(5), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    daemon.connections.fetch_sub(1, Ordering::SeqCst);
    tracing::debug!(conn, "connection closed");
}
