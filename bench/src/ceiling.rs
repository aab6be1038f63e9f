//! The durable-append ceiling: the fastest a server answering one durable append per request
//! can be on this machine, measured with the same load clients as the daemon.
//!
//! It is the shape Redis has with `appendfsync always`, with everything else taken out: one
//! thread waits in `epoll`, reads each ready connection once, cuts the requests out of what it
//! read (no JSON parsing, no encryption, no state), appends them to one preallocated file,
//! `fdatasync`s once for all of them and then answers each. Whatever it reaches, no server
//! speaking this protocol over a Unix socket reaches more with these clients here: on 2 cores
//! the clients' own CPU is part of every request (the report prints both sides' CPU).
//!
//! With `work` it also does what holdfast cannot skip for an append and Redis does not do:
//! parse the request into typed fields (as the daemon's protocol layer does, `serde`), and
//! seal the record (its fields serialized as JSON, Fernet-encrypted with a fresh IV, as the
//! journal's records are) before writing it. That ceiling is the most a daemon keeping
//! holdfast's guarantees could reach, whatever its design.
//!
//! It runs as its own process (this binary with `--ceiling-server DIR`), so its CPU is read as
//! the daemon's and Redis's are, from `/proc/<pid>/stat`.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::FileExt as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::event::epoll;
use serde::{Deserialize, Serialize};

use super::{fail, CliResult};
use holdfast::crypto::{generate_key, Keyring};

/// The file the ceiling appends to, preallocated as the journal's segments are; writes wrap.
const FILE_BYTES: u64 = 64 << 20;
/// One read per ready connection per turn, as Redis reads a client (`readQueryFromClient`).
const READ_BYTES: usize = 16 << 10;
/// The listener's token in the epoll set.
const LISTENER: u64 = u64::MAX;

/// A connection: what it sent that is not yet a whole line, and the ids it is owed answers for.
struct Conn {
    s: UnixStream,
    partial: Vec<u8>,
    owed: Vec<u64>,
}

/// The request's `"id"` when it is a number (every request the load sends has one).
fn request_id(line: &[u8]) -> u64 {
    let key = b"\"id\":";
    line.windows(key.len())
        .position(|w| w == key)
        .map(|at| {
            line[at + key.len()..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .fold(0u64, |n, b| n * 10 + u64::from(b - b'0'))
        })
        .unwrap_or(0)
}

/// A request as the daemon's protocol layer reads one: typed, strings borrowed where JSON lets.
#[derive(Deserialize)]
struct Request<'a> {
    id: u64,
    #[serde(borrow)]
    method: &'a str,
    #[serde(default)]
    params: Params,
}

#[derive(Deserialize, Default)]
struct Params {
    #[serde(default)]
    run_id: String,
    #[serde(default)]
    stream_id: Option<String>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    events: Vec<Event>,
}

#[derive(Deserialize, Serialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    text: String,
}

/// The record sealed into the file: what a journal record carries for an append.
#[derive(Serialize)]
struct Record<'a> {
    run_id: &'a str,
    stream_id: Option<&'a str>,
    seq: Option<u64>,
    events: &'a [Event],
}

/// With `work`: the line parsed and its record sealed, appended to `log` (and the id taken
/// from the parse); without: the line itself.
fn take(line: &[u8], keys: Option<&Keyring>, log: &mut Vec<u8>) -> Result<u64, String> {
    let Some(keys) = keys else {
        log.extend_from_slice(line);
        return Ok(request_id(line));
    };
    let r: Request<'_> = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    if r.method != "stream.append" {
        log.extend_from_slice(line);
        return Ok(r.id);
    }
    let rec = Record {
        run_id: &r.params.run_id,
        stream_id: r.params.stream_id.as_deref(),
        seq: r.params.seq,
        events: &r.params.events,
    };
    let plain = serde_json::to_vec(&rec).map_err(|e| e.to_string())?;
    log.extend_from_slice(keys.encrypt(&plain).as_bytes());
    log.push(b'\n');
    Ok(r.id)
}

/// The answer the load clients check for: `acked_seq` equal to the id (they number appends by
/// seq) and a `stream_id` for their `stream.begin`.
fn answer(out: &mut Vec<u8>, id: u64) {
    let _ = writeln!(
        out,
        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"acked_seq":{id},"stream_id":"ceiling"}}}}"#
    );
}

/// `holdfast-bench --ceiling-server DIR [--ceiling-work]`: serve on `DIR/ceiling.sock`,
/// appending to `DIR/ceiling.log`, until killed.
pub fn serve(dir: &Path, work: bool) -> CliResult {
    let io = |what: &'static str| move |e: std::io::Error| fail(what, e);
    let keys = match work {
        true => {
            Some(Keyring::new(&generate_key(), &[]).ok_or_else(|| fail("the ceiling", "no key"))?)
        }
        false => None,
    };
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(dir.join("ceiling.log"))
        .map_err(io("creating the ceiling's file"))?;
    file.write_all_at(&vec![0u8; FILE_BYTES as usize], 0)
        .and_then(|()| file.sync_all())
        .map_err(io("preallocating the ceiling's file"))?;
    let listener = UnixListener::bind(dir.join("ceiling.sock")).map_err(io("binding"))?;
    listener.set_nonblocking(true).map_err(io("binding"))?;
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| fail("epoll", e))?;
    epoll::add(
        &ep,
        &listener,
        epoll::EventData::new_u64(LISTENER),
        epoll::EventFlags::IN,
    )
    .map_err(|e| fail("epoll", e))?;
    let (mut conns, mut next) = (HashMap::<u64, Conn>::new(), 0u64);
    let mut events = Vec::with_capacity(1024);
    let (mut buf, mut log, mut out) = (vec![0u8; READ_BYTES], Vec::new(), Vec::new());
    let (mut owing, mut at) = (Vec::new(), 0u64);
    loop {
        events.clear();
        match epoll::wait(&ep, rustix::buffer::spare_capacity(&mut events), None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(fail("epoll_wait", e)),
        }
        for ev in &events {
            let k = ev.data.u64();
            if k == LISTENER {
                while let Ok((s, _)) = listener.accept() {
                    s.set_nonblocking(true).map_err(io("accepting"))?;
                    epoll::add(
                        &ep,
                        &s,
                        epoll::EventData::new_u64(next),
                        epoll::EventFlags::IN,
                    )
                    .map_err(|e| fail("epoll", e))?;
                    let c = Conn {
                        s,
                        partial: Vec::new(),
                        owed: Vec::new(),
                    };
                    conns.insert(next, c);
                    next += 1;
                }
                continue;
            }
            let Some(c) = conns.get_mut(&k) else { continue };
            let n = match c.s.read(&mut buf) {
                Ok(0) => {
                    conns.remove(&k);
                    continue;
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                Err(_) => {
                    conns.remove(&k);
                    continue;
                }
            };
            c.partial.extend_from_slice(&buf[..n]);
            let mut start = 0;
            while let Some(nl) = c.partial[start..].iter().position(|&b| b == b'\n') {
                let line = &c.partial[start..start + nl + 1];
                let id = take(line, keys.as_ref(), &mut log)
                    .map_err(|e| fail("the ceiling's request", e))?;
                if c.owed.is_empty() {
                    owing.push(k);
                }
                c.owed.push(id);
                start += nl + 1;
            }
            c.partial.drain(..start);
        }
        if log.is_empty() {
            continue;
        }
        // One write and one fdatasync for every request of the turn, then the answers.
        if at + log.len() as u64 > FILE_BYTES {
            at = 0;
        }
        file.write_all_at(&log, at)
            .and_then(|()| file.sync_data())
            .map_err(io("the ceiling's write"))?;
        at += log.len() as u64;
        log.clear();
        for k in owing.drain(..) {
            let Some(c) = conns.get_mut(&k) else { continue };
            out.clear();
            for id in c.owed.drain(..) {
                answer(&mut out, id);
            }
            // One request in flight per client: the answer fits the socket's buffer.
            if c.s.write_all(&out).is_err() {
                conns.remove(&k);
            }
        }
    }
}

/// A running ceiling server, killed when dropped.
pub struct Ceiling {
    child: Child,
    /// Its socket.
    pub socket: PathBuf,
}

impl Ceiling {
    /// Start `--ceiling-server` in `dir` (with `work`: parsing and sealing each append) and
    /// wait for its socket.
    pub fn start(dir: &Path, work: bool) -> CliResult<Ceiling> {
        let exe = std::env::current_exe().map_err(|e| fail("finding this binary", e))?;
        let mut cmd = Command::new(exe);
        cmd.arg("--ceiling-server").arg(dir);
        if work {
            cmd.arg("--ceiling-work");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| fail("starting the ceiling server", e))?;
        let c = Ceiling {
            child,
            socket: dir.join("ceiling.sock"),
        };
        let started = Instant::now();
        while UnixStream::connect(&c.socket).is_err() {
            if started.elapsed() > Duration::from_secs(30) {
                return Err(fail("the ceiling server", "no socket after 30 s"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(c)
    }

    /// Its pid, for its CPU time.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Ceiling {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_read_from_the_request_and_answered_as_the_seq() {
        let line = br#"{"jsonrpc":"2.0","id":417,"method":"stream.append","params":{"seq":417}}"#;
        assert_eq!(request_id(line), 417);
        assert_eq!(request_id(br#"{"method":"x"}"#), 0);
        let mut out = Vec::new();
        answer(&mut out, 417);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(v["id"], 417);
        assert_eq!(v["result"]["acked_seq"], 417);
        assert!(out.ends_with(b"\n"));
    }

    #[test]
    fn with_work_an_append_is_parsed_and_sealed_and_other_lines_kept() {
        let keys = Keyring::new(&generate_key(), &[]).unwrap_or_else(|| panic!("a key"));
        let line = br#"{"jsonrpc":"2.0","id":9,"method":"stream.append","params":{"run_id":"r","stream_id":"s","seq":9,"events":[{"type":"text","text":"delta 9"}]}}"#;
        let mut log = Vec::new();
        assert_eq!(take(line, Some(&keys), &mut log), Ok(9));
        let token = std::str::from_utf8(&log).unwrap_or_default().trim_end();
        let (plain, _) = keys
            .decrypt(token)
            .unwrap_or_else(|e| panic!("sealed with the key: {e}"));
        let rec: serde_json::Value = serde_json::from_slice(plain.expose()).unwrap_or_default();
        assert_eq!(rec["events"][0]["text"], "delta 9");
        assert_eq!(rec["seq"], 9);
        // Not an append (hello, begin): written as read.
        let hello = br#"{"jsonrpc":"2.0","id":0,"method":"hello","params":{"client":"bench"}}"#;
        let mut log = Vec::new();
        assert_eq!(take(hello, Some(&keys), &mut log), Ok(0));
        assert_eq!(log, hello);
        assert!(take(b"not json", Some(&keys), &mut log).is_err());
    }
}
