//! systemd integration: socket activation (`LISTEN_FDS`) and readiness / watchdog
//! notifications (`NOTIFY_SOCKET`, `WATCHDOG_USEC`).
//!
//! Socket activation is strict, like ssh-agent's: when `LISTEN_FDS` is set, `LISTEN_PID` must
//! be this process, exactly one descriptor must be passed, and it must be a listening Unix
//! stream socket bound to a path. Anything else is refused with a message saying which,
//! rather than served (a socket meant for another process, or the wrong kind, is a
//! misconfiguration to fix, not to guess around). The inherited socket belongs to systemd:
//! holdfast never unlinks it.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::time::Duration;

/// Environment variables that carry an inherited socket.
const LISTEN_FDS: &str = "LISTEN_FDS";
const LISTEN_PID: &str = "LISTEN_PID";

/// A socket passed by the service manager.
#[derive(Debug)]
pub struct Inherited {
    /// The listener (fd 3).
    pub listener: UnixListener,
    /// The path it is bound to.
    pub path: PathBuf,
}

/// Why a socket passed by systemd is refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActivationError {
    /// `LISTEN_PID` names another process.
    #[error(
        "socket activation: LISTEN_PID={listen_pid} is not this process (pid {me}); the socket \
         was passed to another process (is LISTEN_PID inherited through a wrapper?)"
    )]
    OtherPid {
        /// `LISTEN_PID`.
        listen_pid: String,
        /// This process.
        me: u32,
    },
    /// `LISTEN_FDS` without `LISTEN_PID`.
    #[error(
        "socket activation: LISTEN_FDS={fds} without LISTEN_PID; refusing a socket that may be \
         meant for another process"
    )]
    NoPid {
        /// `LISTEN_FDS`.
        fds: String,
    },
    /// `LISTEN_FDS_FIRST_FD` is not 3.
    #[error(
        "socket activation: LISTEN_FDS_FIRST_FD is set to another descriptor than 3; systemd \
         passes sockets from fd 3"
    )]
    FirstFd,
    /// Not exactly one socket.
    #[error(
        "socket activation: LISTEN_FDS={fds}; holdfast takes exactly one socket (one \
         ListenStream= in holdfast.socket)"
    )]
    Count {
        /// `LISTEN_FDS`.
        fds: String,
    },
    /// No descriptor 3.
    #[error("socket activation: LISTEN_FDS=1 but no descriptor 3 was passed")]
    Missing,
    /// Descriptor 3 is something else.
    #[error(
        "socket activation: descriptor 3 is not a Unix stream socket ({0}); holdfast serves a \
         pathname Unix socket (ListenStream=%t/holdfast/holdfast.sock)"
    )]
    NotUnix(#[source] std::io::Error),
    /// A socket that does not listen.
    #[error(
        "socket activation: descriptor 3 is a Unix stream socket that is not listening \
         (ListenStream=, not Accept=yes connections)"
    )]
    NotListening,
    /// An abstract or unnamed socket.
    #[error(
        "socket activation: descriptor 3 is not bound to a path (abstract or unnamed sockets \
         are not served: their access cannot be limited by file permissions)"
    )]
    NoPath,
}

/// Take the socket passed by systemd, if any. Must run before any other thread exists: the
/// `LISTEN_*` variables are removed from the environment (no child inherits them).
pub fn take_listener() -> Result<Option<Inherited>, ActivationError> {
    let Some(fds) = std::env::var_os(LISTEN_FDS) else {
        return Ok(None);
    };
    let fds = fds.to_string_lossy().into_owned();
    let me = std::process::id();
    match std::env::var(LISTEN_PID) {
        Ok(pid) if pid.trim() == me.to_string() => {}
        Ok(listen_pid) => return Err(ActivationError::OtherPid { listen_pid, me }),
        Err(_) => return Err(ActivationError::NoPid { fds }),
    }
    if std::env::var("LISTEN_FDS_FIRST_FD").is_ok_and(|f| f.trim() != "3") {
        return Err(ActivationError::FirstFd);
    }
    if fds.trim() != "1" {
        return Err(ActivationError::Count { fds });
    }
    let mut passed = listenfd::ListenFd::from_env();
    let listener = match passed.take_unix_listener(0) {
        Ok(Some(l)) => l,
        Ok(None) => return Err(ActivationError::Missing),
        Err(e) => return Err(ActivationError::NotUnix(e)),
    };
    if !rustix::net::sockopt::socket_acceptconn(&listener).unwrap_or(false) {
        return Err(ActivationError::NotListening);
    }
    let path = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(PathBuf::from))
        .ok_or(ActivationError::NoPath)?;
    Ok(Some(Inherited { listener, path }))
}

/// Tell the service manager something (`READY=1`, `STATUS=…`, `STOPPING=1`, `WATCHDOG=1`);
/// nothing when not started by one. A failure is logged, never fatal.
pub fn notify(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "could not notify the service manager");
    }
}

/// The watchdog interval systemd expects pings within (`WatchdogSec=`), if enabled for us.
pub fn watchdog() -> Option<Duration> {
    sd_notify::watchdog_enabled().filter(|d| !d.is_zero())
}
