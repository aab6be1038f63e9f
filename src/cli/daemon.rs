//! `holdfast daemon`: serve the stores over the socket until SIGTERM/SIGINT.

use std::sync::Arc;

use clap::Args;

use super::{CliError, CliResult, Global};
use crate::ipc::{activation, server};
use crate::service::{watch, Daemon};
use sd_notify::NotifyState;

/// Arguments of `holdfast daemon`.
#[derive(Args, Debug)]
pub struct DaemonArgs {}

/// Start the daemon; returns when it has shut down.
pub fn run(g: &Global, _args: &DaemonArgs) -> CliResult {
    // First, while this is the only thread: a socket passed by systemd (the LISTEN_* variables
    // are removed from the environment as it is taken).
    let inherited = activation::take_listener().map_err(|e| CliError::with_code(e, 1))?;
    let mut config = g.config()?;
    serve_hive_flag(g, &mut config)?;
    let limits = config.limits();
    let notes =
        crate::process::harden(limits.max_connections).map_err(|e| CliError::with_code(e, 1))?;
    for note in notes.warnings {
        tracing::warn!("{note}");
    }
    for note in notes.info {
        tracing::info!("{note}");
    }
    let data_dir = g.data_dir()?;
    let activated = inherited.is_some();
    let socket = match &inherited {
        Some(i) => i.path.clone(),
        None => g.socket_path()?,
    };
    // Singleton first: a second daemon is refused before it opens (and repairs) any store.
    let claim = match inherited {
        Some(i) => server::claim_inherited(i, &data_dir),
        None => server::claim(&socket, &data_dir),
    }
    .map_err(|e| CliError::with_code(e.to_string(), 1))?;
    let daemon = Daemon::open(socket.clone(), data_dir.clone(), config)
        .map_err(|e| CliError::with_code(e, 1))?;
    let daemon = Arc::new(daemon);
    // Streams replay their journal before the socket serves (a client resuming a run must find
    // it). Without a usable default store they open on first use and say why until then.
    if let Err(e) = daemon.streams() {
        tracing::warn!(error = %e, "streams are not available yet");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("holdfast-worker")
        .enable_all()
        .build()
        .map_err(|e| CliError::with_code(format!("cannot start the async runtime: {e}"), 1))?;
    let result = runtime.block_on(async move {
        let bound = claim
            .bind()
            .map_err(|e| CliError::with_code(e.to_string(), 1))?;
        match watch::start(Arc::clone(&daemon)) {
            Ok(w) => {
                daemon.set_watcher(w)
            }
            Err(e) => tracing::warn!(error = %e, "not watching the stores for outside changes"),
        }
        // Changes made between opening the stores and watching them would otherwise go unseen.
        let d = Arc::clone(&daemon);
        let _ = tokio::task::spawn_blocking(move || watch::sync_stores(&d, None)).await;
        // The background index flusher (stores open with deferred index rewrites), and the
        // safety net under the watcher: every RESCAN_INTERVAL, watch every store directory
        // again (a directory that was replaced lost its inotify watch) and rescan in full.
        let flusher = Arc::clone(&daemon);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::limits::INDEX_FLUSH_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_rescan = tokio::time::Instant::now();
            // The first retention sweep a minute after start, then hourly.
            let mut last_prune = tokio::time::Instant::now() + crate::limits::RUN_PRUNE_INTERVAL
                - std::time::Duration::from_secs(60);
            loop {
                tick.tick().await;
                let d = Arc::clone(&flusher);
                let rescan = last_rescan.elapsed() >= crate::limits::RESCAN_INTERVAL;
                if rescan {
                    last_rescan = tokio::time::Instant::now();
                }
                let prune = last_prune.elapsed() >= crate::limits::RUN_PRUNE_INTERVAL;
                if prune {
                    last_prune = tokio::time::Instant::now();
                }
                let _ = tokio::task::spawn_blocking(move || {
                    if prune {
                        d.prune_runs();
                    }
                    if rescan {
                        d.rewatch();
                        watch::sync_stores(&d, None);
                        // Same cadence: end stream runs idle past their expiry.
                        if let Some(s) = d.streams_if_open() {
                            s.expire_idle();
                        }
                    }
                    d.flush_dirty();
                })
                .await;
            }
        });
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
            socket_activated = activated,
            "holdfast daemon listening"
        );
        // Ready: the stores are open and reconciled, the streams replayed, the listener live
        // (connections queue until the loop below accepts them).
        let status = status_line(&daemon);
        activation::notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
        if let Some(every) = activation::watchdog() {
            tokio::spawn(watchdog(socket.clone(), every, rx.clone()));
        }
        let idle_minutes = daemon.config().idle_exit_minutes.unwrap_or(0.0);
        if activated && idle_minutes > 0.0 {
            tokio::spawn(idle_exit(
                Arc::clone(&daemon),
                std::time::Duration::from_secs_f64(idle_minutes * 60.0),
                idle_tx,
            ));
        }
        // A socket systemd passed is never unlinked (it stays systemd's).
        let stopped = server::run(bound, Arc::clone(&daemon), limits, rx, !activated).await;
        daemon.stop_watching();
        tracing::info!("holdfast daemon stopped");
        match stopped {
            server::Stopped::Shutdown => Ok(()),
            // Non-zero, so that a supervisor (systemd Restart=on-failure) starts a new one.
            server::Stopped::SocketLost => Err(CliError::with_code(
                format!(
                    "socket {} was deleted or replaced; stopped",
                    socket.display()
                ),
                1,
            )),
        }
    });
    // Blocking tasks still running (a watchdog probe waiting on a socket) must not hold up the
    // exit: TimeoutStopSec counts.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
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

/// `STATUS=` for the service manager: what is being served.
fn status_line(daemon: &Daemon) -> String {
    let stores = daemon.stores();
    let sealed = stores
        .iter()
        .filter(|(_, slot)| {
            slot.store
                .as_ref()
                .map_or(true, |s| s.sealed_reason().is_some())
        })
        .count();
    let streams = daemon
        .streams_if_open()
        .map_or("streams not open".to_owned(), |s| {
            format!("{} active stream(s)", s.active_runs())
        });
    format!(
        "serving {} store(s) ({sealed} sealed or unopened), {streams}",
        stores.len()
    )
}

/// Ping systemd's watchdog at a third of `WatchdogSec=`, each time only after a real request
/// made it through the daemon: connect to its own socket, say `hello`, read the answer (the
/// accept loop, a connection task and the router all working). A daemon that cannot answer
/// itself within the interval stops pinging, and systemd restarts it.
async fn watchdog(
    socket: std::path::PathBuf,
    every: std::time::Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let period = every / 3;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Stopping: no more probes (a connection queued on systemd's socket after the listener
        // is gone would start the service again, and a probe could hold up the exit).
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        let path = socket.clone();
        let probe = tokio::task::spawn_blocking(move || self_probe(&path, period));
        match probe.await {
            Ok(Ok(())) => activation::notify(&[NotifyState::Watchdog]),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::error!(socket = %socket.display(), "watchdog: the socket path is gone (deleted?); not pinging systemd, which will restart the service and recreate it")
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "watchdog: the daemon did not answer itself; not pinging systemd")
            }
            Err(e) => tracing::warn!(error = %e, "watchdog probe panicked"),
        }
    }
}

/// One request through the daemon's own socket, within `limit`.
fn self_probe(socket: &std::path::Path, limit: std::time::Duration) -> std::io::Result<()> {
    use std::io::{BufRead, Write};
    let s = std::os::unix::net::UnixStream::connect(socket)?;
    s.set_read_timeout(Some(limit))?;
    s.set_write_timeout(Some(limit))?;
    let hello = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "hello",
        "params": {"client": crate::limits::WATCHDOG_CLIENT}});
    (&s).write_all(format!("{hello}\n").as_bytes())?;
    let mut line = String::new();
    std::io::BufReader::new(&s).read_line(&mut line)?;
    // Any JSON-RPC answer proves the daemon is serving: an error counts too (with
    // `require_plugin = true` a hello without a plugin is refused; at the connection cap the
    // accept loop refuses with `busy` and id null — busy is not dead).
    let answered = serde_json::from_str::<serde_json::Value>(&line).is_ok_and(|v| {
        v["jsonrpc"] == "2.0" && (v.get("result").is_some() || v.get("error").is_some())
    });
    if answered {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "unexpected answer: {}",
            line.chars().take(120).collect::<String>()
        )))
    }
}

/// Socket-activated idle exit: once no client has been connected (a connection that lasts under
/// a second, like the watchdog's own probe, does not count), no request has come and no stream
/// is active for `after`, stop as on SIGTERM. systemd keeps the socket and starts the daemon
/// again on the next connection.
async fn idle_exit(
    daemon: Arc<Daemon>,
    after: std::time::Duration,
    stop: tokio::sync::watch::Sender<bool>,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    let mut idle_since = tokio::time::Instant::now();
    let mut seen_requests = daemon.requests();
    let mut connected_last_tick = false;
    loop {
        tick.tick().await;
        let requests = daemon.requests();
        let connected = daemon.connections() > 0;
        let streaming = daemon
            .streams_if_open()
            .is_some_and(|s| s.active_runs() > 0);
        if requests != seen_requests || (connected && connected_last_tick) || streaming {
            idle_since = tokio::time::Instant::now();
        }
        seen_requests = requests;
        connected_last_tick = connected;
        // Nobody connected right now either (a client that connected in the last second,
        // before its first request, is not cut off).
        if idle_since.elapsed() >= after && !connected {
            tracing::info!(
                idle_secs = after.as_secs(),
                "idle: no client, request or active stream; exiting (the socket stays with systemd)"
            );
            activation::notify(&[
                NotifyState::Stopping,
                NotifyState::Status(
                    "idle exit: systemd starts holdfast again on the next connection",
                ),
            ]);
            let _ = stop.send(true);
            return;
        }
    }
}

/// `holdfast --hive daemon`: serve hive's store (`$HIVE_HOME/credentials`) as store `hive` too,
/// as a `[stores.hive]` entry would (key: --key-file / --key-env, else hive's own). A directory
/// given with --store-dir has no name to be served under: say how to give it one.
fn serve_hive_flag(g: &Global, config: &mut crate::config::Config) -> CliResult {
    if g.store_dir.is_some() {
        return Err(CliError::usage(
            "the daemon serves named stores: add [stores.NAME] with path = \"DIR\" to the config \
             file (or run `holdfast import --from-hive DIR`), or use --hive for hive's own store",
        ));
    }
    if !g.hive {
        return Ok(());
    }
    let path = crate::paths::hive_store_dir().map_err(CliError::usage)?;
    if let Some(existing) = config.stores.get("hive") {
        if existing.path != path {
            return Err(CliError::with_code(
                format!(
                    "--hive serves {} as store \"hive\", but the config's [stores.hive] is {}",
                    path.display(),
                    existing.path.display()
                ),
                crate::error::ErrorKind::Conflict.exit_code(),
            ));
        }
        return Ok(());
    }
    config.stores.insert(
        "hive".into(),
        crate::config::StoreEntry {
            path,
            key_file: g.key_file.clone(),
            key_env: g.key_env.clone(),
            hive: g.key_file.is_none() && g.key_env.is_none(),
        },
    );
    Ok(())
}
