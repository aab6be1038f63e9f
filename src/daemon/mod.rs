//! The daemon's life, as a library: [`run`] opens the stores and the streams, binds the
//! socket, starts the watcher and the background jobs ([`jobs`]), tells systemd it is ready
//! ([`systemd`]), serves until a signal (or an idle exit, or its socket is taken away), then
//! stops the jobs and the watcher. `holdfast daemon` (`cli/daemon.rs`) only reads its flags and
//! config and calls [`run`]; tests and embedders can call it the same way.

pub mod jobs;
pub mod systemd;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;

use crate::config::Config;
use crate::ipc::activation::{self, Inherited};
use crate::ipc::server::{self, ServeError};
use crate::service::{watch, Daemon};

/// What the daemon runs with.
pub struct BootOptions {
    /// The socket path (ignored when `inherited` is given: systemd's socket is used).
    pub socket: PathBuf,
    /// The data directory.
    pub data_dir: PathBuf,
    /// The configuration.
    pub config: Config,
    /// A listening socket systemd passed (socket activation).
    pub inherited: Option<Inherited>,
}

/// Why the daemon did not start, or stopped abnormally.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootError {
    /// Another daemon runs, or the socket path is taken.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// Where the stores' keys are could not be worked out.
    #[error(transparent)]
    Paths(#[from] crate::paths::PathError),
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// The socket file was deleted or replaced while serving (a supervisor should start a new
    /// daemon: the exit is non-zero).
    #[error("socket {} was deleted or replaced; stopped", .0.display())]
    SocketLost(PathBuf),
}

/// How long shutdown waits for background jobs in the middle of their work.
const JOBS_GRACE: Duration = Duration::from_secs(5);

/// The tokio runtime's worker threads: the request path (file work runs on the blocking
/// pool). Two, not one, so one slow request or a journal commit (one worker writing, syncing
/// and answering a batch) never holds every connection; not more, as a developer machine's
/// daemon shares its cores with the agents it serves. One worker was measured too
/// (docs/benchmarks.md: lower CPU per append at 256 streams, 35 % fewer no-op requests).
const RUNTIME_WORKERS: usize = 2;

/// Run the daemon until it is told to stop. Returns once it has shut down.
pub fn run(opts: BootOptions) -> Result<(), BootError> {
    let BootOptions {
        socket,
        data_dir,
        config,
        inherited,
    } = opts;
    let limits = config.limits();
    let activated = inherited.is_some();
    let socket = match &inherited {
        Some(i) => i.path.clone(),
        None => socket,
    };
    // Singleton first: a second daemon is refused before it opens (and repairs) any store.
    let claim = match inherited {
        Some(i) => server::claim_inherited(i, &data_dir),
        None => server::claim(&socket, &data_dir),
    }?;
    let daemon =
        Arc::new(Daemon::open(socket.clone(), data_dir.clone(), config).map_err(BootError::Paths)?);
    // Streams replay their journal before the socket serves (a client resuming a run must find
    // it). Without a usable default store they open on first use and say why until then.
    // The runtime's workers commit the stream journal themselves when they run out of work
    // (Daemon::before_park): the worker that read an append writes, syncs and answers it,
    // with no hand-off to the committer thread (docs/design.md, "Group commit").
    daemon.assist_commits(RUNTIME_WORKERS);
    if let Err(e) = daemon.streams() {
        tracing::warn!(error = %e, "streams are not available yet");
    }
    let (parking, unparking) = (Arc::clone(&daemon), Arc::clone(&daemon));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(RUNTIME_WORKERS)
        .thread_name("holdfast-worker")
        .on_thread_park(move || parking.before_park())
        .on_thread_unpark(move || unparking.after_unpark())
        .enable_all()
        .build()
        .map_err(BootError::Runtime)?;
    let result = runtime.block_on(async move {
        let bound = claim.bind()?;
        match watch::start(Arc::clone(&daemon)) {
            Ok(w) => daemon.set_watcher(w),
            Err(e) => tracing::warn!(error = %e, "not watching the stores for outside changes"),
        }
        // Changes made between opening the stores and watching them would otherwise go unseen.
        let d = Arc::clone(&daemon);
        let _ = tokio::task::spawn_blocking(move || watch::sync_stores(&d, None)).await;
        let jobs = jobs::Jobs::start(&daemon);
        let (tx, rx) = tokio::sync::watch::channel(false);
        let idle_tx = tx.clone();
        tokio::spawn(async move {
            let reason = wait_for_signal().await;
            activation::notify(&[
                NotifyState::Stopping,
                NotifyState::Status("stopping: finishing requests in flight"),
            ]);
            tracing::info!(
                signal = reason,
                "shutting down: no new connections; finishing requests in flight (signal again to exit at once)"
            );
            let _ = tx.send(true);
            // A second signal: exit now. Every acknowledged write is already durable; requests
            // still in flight were never acknowledged.
            let again = wait_for_signal().await;
            tracing::warn!(signal = again, "second signal: exiting now without waiting for requests in flight");
            std::process::exit(1);
        });
        tracing::info!(
            socket = %socket.display(),
            data_dir = %data_dir.display(),
            pid = std::process::id(),
            stores = daemon.stores().len(),
            jobs = jobs.len(),
            socket_activated = activated,
            "holdfast daemon listening"
        );
        // Ready: the stores are open and reconciled, the streams replayed, the listener live
        // (connections queue until the loop below accepts them).
        let status = systemd::status_line(&daemon);
        activation::notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
        if let Some(every) = activation::watchdog() {
            tokio::spawn(systemd::watchdog(socket.clone(), every, rx.clone()));
        }
        let idle_minutes = daemon.config().idle_exit_minutes.unwrap_or(0.0);
        if activated && idle_minutes > 0.0 {
            tokio::spawn(systemd::idle_exit(
                Arc::clone(&daemon),
                Duration::from_secs_f64(idle_minutes * 60.0),
                idle_tx,
            ));
        }
        // A socket systemd passed is never unlinked (it stays systemd's).
        let stopped = server::run(bound, Arc::clone(&daemon), limits, rx, !activated).await;
        jobs.stop(JOBS_GRACE).await;
        daemon.stop_watching();
        let d = Arc::clone(&daemon);
        let _ = tokio::task::spawn_blocking(move || d.close_audit()).await;
        tracing::info!("holdfast daemon stopped");
        match stopped {
            server::Stopped::Shutdown => Ok(()),
            server::Stopped::SocketLost => Err(BootError::SocketLost(socket)),
        }
    });
    // Blocking tasks still running (a watchdog probe waiting on a socket) must not hold up the
    // exit: TimeoutStopSec counts.
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the daemon can only be killed; keep serving.
        std::future::pending::<()>().await;
        return "none";
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
