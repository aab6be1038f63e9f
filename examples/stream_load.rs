//! Experiment load: N threads, each a stream, appending one ~20-byte delta per request.
//! `cargo run --release --example stream_load -- SOCKET STREAMS SECONDS [noop]`
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let socket = a[1].clone();
    let n: usize = a[2].parse().unwrap();
    let d = Duration::from_secs_f64(a[3].parse().unwrap());
    let noop = a.get(4).is_some_and(|s| s == "noop");
    let barrier = Arc::new(Barrier::new(n + 1));
    let tag = std::process::id();
    let hs: Vec<_> = (0..n)
        .map(|i| {
            let (socket, barrier) = (socket.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let w = UnixStream::connect(&socket).unwrap();
                let mut r = BufReader::new(w.try_clone().unwrap());
                let mut w = w;
                let mut line = String::new();
                let mut rt = |req: String, line: &mut String| {
                    w.write_all(req.as_bytes()).unwrap();
                    w.write_all(b"\n").unwrap();
                    line.clear();
                    r.read_line(line).unwrap();
                };
                rt(r#"{"jsonrpc":"2.0","id":0,"method":"hello","params":{"client":"x"}}"#.into(), &mut line);
                let run = format!("load-{tag}-{i}");
                rt(format!(r#"{{"jsonrpc":"2.0","id":1,"method":"stream.begin","params":{{"run_id":"{run}","model":"m"}}}}"#), &mut line);
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                let sid = v["result"]["stream_id"].as_str().unwrap().to_owned();
                barrier.wait();
                let start = Instant::now();
                let mut seq = 1u64;
                while start.elapsed() < d {
                    let req = if noop {
                        format!(r#"{{"jsonrpc":"2.0","id":{seq},"method":"bench.noop","params":{{}}}}"#)
                    } else {
                        format!(r#"{{"jsonrpc":"2.0","id":{seq},"method":"stream.append","params":{{"run_id":"{run}","stream_id":"{sid}","seq":{seq},"events":[{{"type":"text","text":"delta {seq:08} text "}}]}}}}"#)
                    };
                    rt(req, &mut line);
                    if !noop && !line.contains("acked_seq") {
                        panic!("{line}");
                    }
                    seq += 1;
                }
                seq - 1
            })
        })
        .collect();
    barrier.wait();
    let t = Instant::now();
    let total: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    println!(
        "{n} streams: {:.0}/s",
        total as f64 / t.elapsed().as_secs_f64()
    );
}
