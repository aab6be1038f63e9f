//! A/B load for `stream.append`: N threads, each its own connection and run, appending one
//! ~20-byte delta per request for a number of seconds; prints the rate. With `noop`, an unknown
//! method instead (the daemon's request-path ceiling). Pair it with
//! `perf stat -e instructions:u,instructions:k -p <daemon pid>` for per-request costs that this
//! VM's noise does not move (docs/benchmarks.md).
//!
//! `cargo run --release --example stream_load -- SOCKET STREAMS SECONDS [noop]`
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]
#![allow(clippy::print_stdout)] // its output is its figures
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "usage: stream_load SOCKET STREAMS SECONDS [noop]";

struct Conn {
    w: UnixStream,
    r: BufReader<UnixStream>,
    line: String,
}

impl Conn {
    fn open(socket: &str) -> Result<Conn, Error> {
        let w = UnixStream::connect(socket).map_err(|e| format!("connect {socket}: {e}"))?;
        let r = BufReader::new(w.try_clone()?);
        Ok(Conn {
            w,
            r,
            line: String::new(),
        })
    }

    fn call(&mut self, req: &str) -> Result<&str, Error> {
        self.w.write_all(req.as_bytes())?;
        self.w.write_all(b"\n")?;
        self.line.clear();
        if self.r.read_line(&mut self.line)? == 0 {
            return Err("the daemon closed the connection".into());
        }
        Ok(&self.line)
    }
}

/// One stream's loop: begin a run, wait for the others, append (or no-op) until `d` is up.
fn stream(
    socket: &str,
    i: usize,
    d: Duration,
    noop: bool,
    go: &Barrier,
    started: &mut bool,
) -> Result<u64, Error> {
    let mut c = Conn::open(socket)?;
    c.call(r#"{"jsonrpc":"2.0","id":0,"method":"hello","params":{"client":"stream_load"}}"#)?;
    let run = format!("load-{}-{i}", std::process::id());
    let begun = c.call(&format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"stream.begin","params":{{"run_id":"{run}","model":"m"}}}}"#
    ))?;
    let v: serde_json::Value = serde_json::from_str(begun)?;
    let sid = v["result"]["stream_id"]
        .as_str()
        .ok_or_else(|| format!("stream.begin answered {v}"))?
        .to_owned();
    go.wait();
    *started = true;
    let start = Instant::now();
    let mut seq = 1u64;
    while start.elapsed() < d {
        let req = if noop {
            format!(r#"{{"jsonrpc":"2.0","id":{seq},"method":"bench.noop","params":{{}}}}"#)
        } else {
            format!(
                r#"{{"jsonrpc":"2.0","id":{seq},"method":"stream.append","params":{{"run_id":"{run}","stream_id":"{sid}","seq":{seq},"events":[{{"type":"text","text":"delta {seq:08} text "}}]}}}}"#
            )
        };
        let answer = c.call(&req)?;
        if !noop && !answer.contains("acked_seq") {
            return Err(format!("unexpected answer: {answer}").into());
        }
        seq += 1;
    }
    Ok(seq - 1)
}

fn main() -> Result<(), Error> {
    let a: Vec<String> = std::env::args().collect();
    let (Some(socket), Some(n), Some(secs)) = (a.get(1), a.get(2), a.get(3)) else {
        return Err(USAGE.into());
    };
    let n: usize = n.parse().map_err(|_| USAGE)?;
    let d = Duration::try_from_secs_f64(secs.parse().map_err(|_| USAGE)?).map_err(|_| USAGE)?;
    let noop = a.get(4).is_some_and(|s| s == "noop");
    let go = Arc::new(Barrier::new(n + 1));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (socket, go) = (socket.clone(), Arc::clone(&go));
            std::thread::spawn(move || {
                let mut started = false;
                let r = stream(&socket, i, d, noop, &go, &mut started);
                if !started {
                    // Failed before the start: still release the others.
                    go.wait();
                }
                r
            })
        })
        .collect();
    go.wait();
    let t = Instant::now();
    let mut total = 0;
    for h in handles {
        total += h.join().map_err(|_| "a load thread panicked")??;
    }
    println!(
        "{n} streams: {:.0}/s",
        total as f64 / t.elapsed().as_secs_f64()
    );
    Ok(())
}
