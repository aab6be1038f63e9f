//! What the daemon tells systemd and hears from it: readiness and status (`sd_notify`), the
//! watchdog (pinged only after the daemon answered a request through its own socket), and the
//! idle exit of a socket-activated daemon.

use std::sync::Arc;

use sd_notify::NotifyState;

use crate::ipc::activation;
use crate::service::Daemon;

/// `STATUS=` for the service manager: what is being served.
pub fn status_line(daemon: &Daemon) -> String {
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
pub async fn watchdog(
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
pub async fn idle_exit(
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
