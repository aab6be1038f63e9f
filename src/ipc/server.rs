//! The socket server: bind (singleton lock, stale-socket recovery, 0600 socket in a 0700
//! directory), accept (peer uid checked before a byte is read; a connection cap with a clean
//! refusal), one task per connection (bounded frames, timeouts, a capped output queue,
//! pipelined requests), and graceful shutdown.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use interprocess::local_socket::tokio::{prelude::*, Listener, Stream};
use interprocess::local_socket::{GenericFilePath, ListenerOptions};
use interprocess::os::unix::local_socket::ListenerOptionsExt;
use tokio::io::{AsyncWriteExt, BufReader};

use super::conn::Conn;
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use zeroize::Zeroizing;

use super::frame::{FrameError, FrameReader};
use super::handlers;
use super::lane::{Adopted, Lane};
pub use super::outbox::{Outbox, OutputBudget};
use super::protocol::{self, RpcError};
use super::session::{cork, release_cork, uncork, Session, CORK_MAX};
use crate::config::Limits;
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
    /// The socket file's device and inode, to tell our socket from a replacement; `None` for
    /// a socket passed by systemd (its file is systemd's to manage).
    pub ino: Option<(u64, u64)>,
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

/// The singleton locks, held, and the socket path cleared for binding (or the socket systemd
/// passed).
pub struct Claim {
    path: PathBuf,
    locks: Vec<LockGuard>,
    inherited: Option<std::os::unix::net::UnixListener>,
}

/// Take the data directory's singleton lock for a socket passed by systemd. The socket file
/// and its directory are left alone: they are systemd's (one socket unit, one service: no
/// second daemon can be bound to it), and the service may not even be able to write there
/// (a system unit's `/run/holdfast` is root's, and `ProtectSystem=strict` makes `/run`
/// read-only).
pub fn claim_inherited(
    inherited: super::activation::Inherited,
    data_dir: &Path,
) -> Result<Claim, ServeError> {
    let setup = |e: String| ServeError::Setup(e);
    durable::create_private_dir(data_dir, &Faults::none()).map_err(|e| setup(e.to_string()))?;
    let locks = vec![take_singleton(
        &data_dir.join("daemon.lock"),
        &format!("data directory {}", data_dir.display()),
    )?];
    Ok(Claim {
        path: inherited.path,
        locks,
        inherited: Some(inherited.listener),
    })
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
        inherited: None,
    })
}

impl Claim {
    /// Bind a pathname socket with mode 0600 (set with `fchmod` before `bind`: no umask race).
    /// Needs a tokio runtime.
    pub fn bind(self) -> Result<Bound, ServeError> {
        let setup = ServeError::Setup;
        if let Some(std_listener) = self.inherited {
            // No name reclamation: dropping it never unlinks systemd's socket file.
            let sync = interprocess::os::unix::uds_local_socket::Listener::from(std_listener);
            let tokio_listener =
                interprocess::os::unix::uds_local_socket::tokio::Listener::try_from(sync)
                    .map_err(|e| setup(format!("cannot serve the inherited socket: {e}")))?;
            return Ok(Bound {
                listener: Listener::from(tokio_listener),
                path: self.path,
                ino: None,
                _locks: self.locks,
            });
        }
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
            ino: Some(ino),
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
    // What every connection's output queue holds, against one cap (`[limits]
    // max_output_total_bytes`).
    let budget = OutputBudget::new(limits.max_output_total);
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    let me = perms::euid();
    let allow_root = daemon.config().allow_root();
    let next_conn = AtomicU64::new(1);
    let mut check = tokio::time::interval(SOCKET_CHECK_INTERVAL);
    check.tick().await;
    let mut socket_lost = false;
    // The thread that reads connections once they stream appends (lane.rs).
    let lane = match Lane::start(
        Arc::clone(&daemon),
        limits.clone(),
        tokio::runtime::Handle::current(),
    ) {
        Ok(l) => Some(Arc::new(l)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the append lane; the runtime's workers read every connection");
            None
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = check.tick() => {
                if bound.ino.is_some() && socket_ino(&bound.path) != bound.ino {
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
                let creds = stream.peer_creds().ok();
                let peer = creds.as_ref().and_then(|c| c.euid());
                let peer_pid = creds
                    .as_ref()
                    .and_then(|c| c.pid())
                    .and_then(|p| u32::try_from(p).ok());
                let ok = match peer {
                    Some(uid) => uid == me || (uid == 0 && allow_root),
                    None => false,
                };
                if !ok {
                    // Told before the close: a peer that sees its connection end finds the
                    // reason logged.
                    let due = super::audit::refusal_due(peer);
                    if let Some(since) = due {
                        tracing::warn!(peer_uid = ?peer, daemon_uid = me, refused_since_last_logged = since, "uid mismatch: closing the connection before reading from it");
                    }
                    drop(stream);
                    if let Some(since) = due {
                        super::audit::connection_refused(&daemon, peer, peer_pid, since);
                    }
                    continue;
                }
                let conn = next_conn.fetch_add(1, Ordering::Relaxed);
                match Arc::clone(&permits).try_acquire_owned() {
                    Ok(permit) => {
                        let (daemon, limits, shutdown, done, lane, budget) =
                            (Arc::clone(&daemon), limits.clone(), shutdown.clone(), done_tx.clone(), lane.clone(), Arc::clone(&budget));
                        tokio::spawn(async move {
                            connection(stream, daemon, limits, budget, conn, shutdown, lane, (peer_pid, peer)).await;
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
    if unlink_on_exit && !socket_lost && ino.is_some() && socket_ino(&path) == ino {
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
    if let Some(lane) = lane {
        lane.stop();
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

#[allow(clippy::too_many_arguments)] // the connection's life, set up in one place
async fn connection(
    stream: Stream,
    daemon: Arc<Daemon>,
    limits: Limits,
    budget: Arc<OutputBudget>,
    conn: u64,
    mut shutdown: watch::Receiver<bool>,
    lane: Option<Arc<Lane>>,
    peer: (Option<u32>, Option<u32>),
) {
    let (read_half, stream) = match Conn::new(stream) {
        Ok(halves) => halves,
        Err(e) => {
            tracing::warn!(conn, error = %e, "cannot set up the connection's socket; closing it");
            return;
        }
    };
    let stream = Arc::new(stream);
    daemon.connection_opened();
    let send_stream = Arc::clone(&stream);
    let closed = Arc::new(Notify::new());
    let session = Session::new(
        conn,
        Arc::clone(&stream),
        Outbox::new(limits.max_output, budget, Arc::clone(&closed)),
        peer,
    );
    let writer_session = Arc::clone(&session);
    // A client that reads nothing of what it is owed for the read timeout is dropped.
    let stall = limits.read;
    let writer = tokio::spawn(async move {
        let outbox = &writer_session.outbox;
        while let Some((line, held)) = outbox.next().await {
            if let Err(e) = send_stream.send_all(&line, stall).await {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    tracing::warn!(
                        conn,
                        owed = outbox.owed(),
                        waited_s = stall.as_secs_f64(),
                        "client is not reading its answers; closing the connection"
                    );
                }
                outbox.closed.notify_one();
                break;
            }
            outbox.written(held);
        }
    });
    let inflight = Arc::new(Semaphore::new(limits.max_inflight));
    let mut reader = FrameReader::new(BufReader::new(read_half), limits.max_frame);
    tracing::debug!(conn, "connection open");
    let mut corked = Zeroizing::new(Vec::new());
    // The two reasons to stop, each one future for the connection's life: a `Notified` or a
    // `changed()` made per request was linked into its waiter list and unlinked again, under
    // the list's lock, on every request (the shutdown channel's list is every connection's).
    // Polled first, so a client that never stops sending still sees them.
    let shutting_down = shutdown.clone();
    let stop = shutdown.changed();
    tokio::pin!(stop);
    let ended = closed.notified();
    tokio::pin!(ended);
    // Set when the connection sent its first append: the append lane reads it from then on.
    let mut to_lane = None;
    loop {
        let idle_ok = || {
            inflight.available_permits() == limits.max_inflight
                && session.subscriptions.count() == 0
                && !session.holds_any()
        };
        // Never wait with answers held back, nor with the buffer they were held in.
        if !reader.line_buffered() {
            release_cork(&session, &mut corked);
        } else {
            uncork(&session, &mut corked);
        }
        // Answers owed past the pause (or the daemon's budget tight): no request is read until
        // the client reads them, for at most the read timeout; a client that does not read in
        // that time is dropped, saying so.
        if session.outbox.should_pause() {
            let drained = tokio::select! {
                biased;
                _ = &mut ended => break,
                _ = &mut stop => break,
                r = tokio::time::timeout(limits.read, session.outbox.drained()) => r.is_ok(),
            };
            if !drained {
                tracing::warn!(
                    conn,
                    owed = session.outbox.owed(),
                    waited_s = limits.read.as_secs_f64(),
                    "client is not reading its answers; closing the connection"
                );
                break;
            }
        }
        let frame = tokio::select! {
            biased;
            _ = &mut ended => break,
            _ = &mut stop => break,
            f = reader.next(limits.idle, limits.read, idle_ok) => f,
        };
        let line = match frame {
            Ok(true) => reader.line(),
            Ok(false) => break,
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
        let (id, call, grant) = match handlers::route(&daemon, &session, line) {
            handlers::Routed::Done(reply) => {
                // Pipelined requests answered inline leave in one send: while another whole
                // line is already buffered, the answer waits in `corked`.
                if corked.is_empty() && !reader.line_buffered() {
                    session.outbox.send_now(&stream, reply);
                } else {
                    cork(&session, &mut corked, &reply);
                    if !reader.line_buffered() || corked.len() >= CORK_MAX {
                        uncork(&session, &mut corked);
                    }
                }
                continue;
            }
            handlers::Routed::Async(id, call, grant) => {
                uncork(&session, &mut corked);
                (id, call, grant)
            }
            handlers::Routed::Append(id, a) => {
                uncork(&session, &mut corked);
                let permit = tokio::select! {
                    biased;
                    p = Arc::clone(&inflight).acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                    _ = &mut stop => break,
                };
                super::streams::append(&daemon, &session, id, a, permit);
                if let Some(lane) = &lane {
                    to_lane = Some(Arc::clone(lane));
                    break;
                }
                if !reader.line_buffered() {
                    reader.source().expect_nothing();
                }
                continue;
            }
        };
        // Backpressure: at the in-flight cap, stop reading until a request finishes.
        let permit = tokio::select! {
            biased;
            p = Arc::clone(&inflight).acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = &mut stop => break,
        };
        let (daemon, session) = (Arc::clone(&daemon), Arc::clone(&session));
        tokio::spawn(async move {
            handlers::respond(&daemon, &session, id, call, grant).await;
            drop(permit);
        });
    }
    if let Some(lane) = to_lane {
        // From its first append on, a connection is read by the append lane: its socket and
        // what was read past that append go there, and this task waits until the lane stops
        // reading it (or tells the lane to stop, at shutdown or when the outbox closed it).
        let (read_half, pending) = reader.into_parts();
        let (done, mut lane_ended) = tokio::sync::oneshot::channel();
        lane.adopt(Adopted {
            conn,
            sock: read_half.into_socket(),
            pending,
            session: Arc::clone(&session),
            inflight: Arc::clone(&inflight),
            done,
        });
        let released = tokio::select! {
            biased;
            _ = &mut ended => true,
            _ = &mut stop => true,
            _ = &mut lane_ended => false,
        };
        if released {
            lane.release(conn);
            let _ = lane_ended.await;
        }
    }
    // Let in-flight requests reach their safe point (their store calls always complete), then
    // let the writer drain what is queued.
    let _ = tokio::time::timeout(
        SHUTDOWN_GRACE,
        inflight.acquire_many(limits.max_inflight as u32),
    )
    .await;
    daemon.release_connection(conn);
    // A producer whose connection closed without a commit or abort is lost; at shutdown its
    // runs wait for it (a restart is no loss until `[streams] orphan_timeout_s`).
    let held = session.take_held();
    if !held.is_empty() && !*shutting_down.borrow() {
        if let Some(s) = daemon.streams_if_open() {
            let _ = tokio::task::spawn_blocking(move || s.detach(&held, conn)).await;
        }
    }
    session.end();
    session.outbox.finish();
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
    daemon.connection_closed();
    tracing::debug!(conn, "connection closed");
}
