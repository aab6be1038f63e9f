//! A small blocking client for the daemon's socket, used by the CLI and usable by Rust agents.
//!
//! ```no_run
//! use holdfast::client::Client;
//! let mut c = Client::connect(&holdfast::paths::default_socket(), "my-agent", None)?;
//! let v = c.call("cred.get", serde_json::json!({"id": "openai"}))?;
//! # Ok::<(), holdfast::client::ClientError>(())
//! ```

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::api::{kind_for, PROTOCOL_VERSION};
use crate::error::ErrorKind;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No daemon answers on the socket.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The connection failed mid-call.
    #[error("connection to the daemon failed: {0}")]
    Io(#[from] std::io::Error),
    /// The daemon sent something that is not a JSON-RPC response.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The daemon answered with an error.
    #[error("{message}")]
    Rpc {
        /// JSON-RPC code.
        code: i64,
        /// Stable kind.
        kind: ErrorKind,
        /// Message (never contains a secret).
        message: String,
        /// The whole `data` object.
        data: Value,
    },
}

impl ClientError {
    /// The error kind (transport failures count as `storage`).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::Rpc { kind, .. } => *kind,
            _ => ErrorKind::Storage,
        }
    }
}

pub use crate::limits::DEFAULT_TIMEOUT;

/// The socket's read side: each read waits for input with `poll` first (at most the timeout;
/// then `WouldBlock`, as a socket read timeout reports). A thread blocked in `read` on a Unix
/// socket is woken for nothing each time the daemon reads a request from it (the freed buffer
/// space wakes every sleeper on the client's socket, and a sleeping `read` does not look at
/// why): the daemon pays a wake-up and the client a context switch per request. A `poll` for
/// input is not woken by it (docs/benchmarks.md, "Issue 15, third session").
struct Polled {
    stream: UnixStream,
    timeout: Option<Duration>,
}

/// Wait until `fd` has input (or is closed), at most `timeout` (`None`: forever): `false` if
/// the time ran out. See [`Polled`] for why a client should wait here rather than in `read`;
/// the bench's load clients wait with it too.
pub fn wait_readable(
    fd: impl std::os::fd::AsFd,
    timeout: Option<Duration>,
) -> std::io::Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let ts = left.map(|l| Timespec {
            tv_sec: l.as_secs().try_into().unwrap_or(i64::MAX),
            tv_nsec: l.subsec_nanos().into(),
        });
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match poll(&mut fds, ts.as_ref()) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

impl Read for Polled {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !wait_readable(&self.stream, self.timeout)? {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                "no answer from the daemon within the read timeout",
            ));
        }
        self.stream.read(buf)
    }
}

/// A connection that has said hello.
pub struct Client {
    reader: BufReader<Polled>,
    writer: UnixStream,
    next_id: u64,
    events: VecDeque<Value>,
    /// A line being read when a timeout struck: kept so the next read continues it.
    partial: Vec<u8>,
    /// The daemon's answer to `hello`.
    pub hello: Value,
}

impl Client {
    /// Connect, check that the server runs as us (or root), and say hello as `client` (bound
    /// to `plugin`'s grant, if given). Reads time out after [`DEFAULT_TIMEOUT`].
    pub fn connect(path: &Path, client: &str, plugin: Option<&str>) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.display().to_string(),
            source,
        })?;
        // Whoever answers gets our secrets: it must be our own uid (or root, who could read
        // the key file anyway). Without XDG_RUNTIME_DIR the socket lives under /tmp, where
        // another user could have planted a listener.
        let me = crate::durable::perms::euid();
        match rustix::net::sockopt::socket_peercred(&stream) {
            Ok(cred) if cred.uid.as_raw() == me || cred.uid.is_root() => {}
            Ok(cred) => {
                return Err(ClientError::Connect {
                    path: path.display().to_string(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!(
                            "the server on this socket runs as uid {}, not as you (uid {me}); refusing to talk to it",
                            cred.uid.as_raw()
                        ),
                    ),
                })
            }
            Err(e) => {
                return Err(ClientError::Connect {
                    path: path.display().to_string(),
                    source: e.into(),
                })
            }
        }
        stream.set_write_timeout(Some(DEFAULT_TIMEOUT))?;
        let writer = stream.try_clone()?;
        let mut c = Client {
            reader: BufReader::new(Polled {
                stream,
                timeout: Some(DEFAULT_TIMEOUT),
            }),
            writer,
            next_id: 1,
            events: VecDeque::new(),
            partial: Vec::new(),
            hello: Value::Null,
        };
        let mut params = json!({"client": client, "protocol": PROTOCOL_VERSION});
        if let Some(p) = plugin {
            params["plugin"] = p.into();
        }
        c.hello = c.call("hello", params)?;
        Ok(c)
    }

    /// Set a timeout for each read from the daemon (`None`: wait forever).
    pub fn set_read_timeout(&mut self, t: Option<Duration>) -> Result<(), ClientError> {
        self.reader.get_mut().timeout = t;
        Ok(())
    }

    /// Call `method` and wait for its response. Event notifications that arrive meanwhile are
    /// kept for [`Client::next_event`].
    ///
    /// `params` may hold secrets (`cred.set`): it and the request line are zeroized once sent.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut request = json!({
            "jsonrpc": "2.0", "id": id, "method": method, "params": params,
        });
        let mut line = zeroize::Zeroizing::new(Vec::with_capacity(256));
        let written = serde_json::to_writer(&mut *line, &request);
        crate::store::credential::zeroize_json(&mut request);
        written.map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push(b'\n');
        if let Err(e) = self.writer.write_all(&line) {
            // A server that refused us (the connection cap) wrote why and closed; the write can
            // lose the race with that close. Its last line is the better error.
            if let Ok(msg) = self.read_message() {
                if let Some(err) = msg.get("error") {
                    return Err(rpc_error(err));
                }
            }
            return Err(e.into());
        }
        loop {
            let msg = self.read_message()?;
            if msg.get("method").and_then(Value::as_str) == Some("event") {
                self.events.push_back(msg["params"].clone());
                continue;
            }
            if msg.get("id") != Some(&json!(id)) {
                // A response to nothing we asked (e.g. the cap refusal has id null).
                if let Some(err) = msg.get("error") {
                    return Err(rpc_error(err));
                }
                continue;
            }
            if let Some(err) = msg.get("error") {
                return Err(rpc_error(err));
            }
            return msg
                .get("result")
                .cloned()
                .ok_or_else(|| ClientError::Protocol("response without result or error".into()));
        }
    }

    /// The next event notification's `params` (after `cred.watch`), waiting at most `timeout`.
    pub fn next_event(&mut self, timeout: Duration) -> Result<Option<Value>, ClientError> {
        if let Some(ev) = self.events.pop_front() {
            return Ok(Some(ev));
        }
        let saved = self.reader.get_mut().timeout.replace(timeout);
        let read = self.read_message();
        self.reader.get_mut().timeout = saved;
        let got = match read {
            Ok(msg) if msg.get("method").and_then(Value::as_str) == Some("event") => {
                Some(msg["params"].clone())
            }
            Ok(_) => None,
            Err(ClientError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        Ok(got)
    }

    /// Read one line. Bytes read before a timeout stay in `partial`, so a later read picks the
    /// line up where it stopped instead of parsing half of it.
    fn read_message(&mut self) -> Result<Value, ClientError> {
        let n = self.reader.read_until(b'\n', &mut self.partial)?;
        if n == 0 && self.partial.is_empty() {
            return Err(ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the daemon closed the connection",
            )));
        }
        if self.partial.last() != Some(&b'\n') {
            return Err(ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the daemon closed the connection mid-line",
            )));
        }
        let line = std::mem::take(&mut self.partial);
        let line = zeroize::Zeroizing::new(line);
        serde_json::from_slice(&line).map_err(|e| ClientError::Protocol(format!("bad line: {e}")))
    }
}

fn rpc_error(err: &Value) -> ClientError {
    let code = err.get("code").and_then(Value::as_i64).unwrap_or(0);
    let data = err.get("data").cloned().unwrap_or(Value::Null);
    let kind = data
        .get("kind")
        .and_then(Value::as_str)
        .and_then(ErrorKind::from_wire)
        .or_else(|| kind_for(code))
        .unwrap_or(ErrorKind::Storage);
    ClientError::Rpc {
        code,
        kind,
        message: err
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("error")
            .to_owned(),
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::os::unix::net::UnixListener;

    /// A server on a socket in `dir` that answers `hello`, then runs `then` with the connection.
    fn server(
        dir: &Path,
        then: impl FnOnce(BufReader<UnixStream>, UnixStream) + Send + 'static,
    ) -> (std::path::PathBuf, std::thread::JoinHandle<()>) {
        let path = dir.join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let h = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n")
                .unwrap();
            then(r, w);
        });
        (path, h)
    }

    fn voluntary_switches() -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    #[test]
    fn a_read_gives_up_after_the_timeout_and_keeps_a_half_line() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (path, h) = server(dir.path(), move |_r, mut w| {
            w.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"event\",\"params\":{\"n\"")
                .unwrap();
            rx.recv().unwrap();
            w.write_all(b":1}}\n").unwrap();
            rx.recv().ok();
        });
        let mut c = Client::connect(&path, "t", None).unwrap();
        let t = Instant::now();
        assert_eq!(c.next_event(Duration::from_millis(200)).unwrap(), None);
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_secs(10),
            "waited {waited:?}"
        );
        tx.send(()).unwrap();
        let ev = c.next_event(Duration::from_secs(10)).unwrap();
        assert_eq!(ev, Some(json!({"n": 1})), "the half line was kept");
        // A call with nothing answering fails after the read timeout, as a `WouldBlock`.
        c.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        match c.call("x", json!({})) {
            Err(ClientError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
            other => panic!("expected a timeout, got {other:?}"),
        }
        drop(tx);
        drop(c);
        h.join().unwrap();
    }

    /// The reason reads wait in `poll`: a thread blocked in `read` on a Unix socket is woken
    /// (and goes back to sleep) when the server reads the request, which costs the server a
    /// wake-up per request. Waiting in `poll`, the caller sleeps once per call.
    #[test]
    fn a_caller_waiting_for_its_answer_sleeps_once() {
        let dir = tempfile::tempdir().unwrap();
        let (path, h) = server(dir.path(), |mut r, mut w| {
            // Read the request only once the client is surely waiting for its answer, then
            // answer a while later.
            std::thread::sleep(Duration::from_millis(100));
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"ok\":true}}\n")
                .unwrap();
        });
        let mut c = Client::connect(&path, "t", None).unwrap();
        let before = voluntary_switches();
        let answer = c.call("x", json!({})).unwrap();
        let slept = voluntary_switches() - before;
        assert_eq!(answer, json!({"ok": true}));
        println!("the calling thread slept {slept} time(s) while waiting for its answer");
        assert_eq!(slept, 1, "woken before its answer came");
        h.join().unwrap();
    }
}
