//! What a JSON-RPC round trip costs here without tokio, crypto or files: a thread-per-
//! connection server (blocking reads) answering newline-delimited JSON with serde_json at both
//! ends, for a no-op and for a get-shaped reply carrying a ~600-byte credential document.
//! docs/benchmarks.md uses it to show what part of `cred.get` is the protocol itself.
//!
//! `cargo run --release --example json_rpc_floor`
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]
#![allow(clippy::print_stdout)] // its output is its figures

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const CREDENTIAL: &str = r#"{"id": "cred_00001", "credential_type": "api_key", "keys": {"api_key": {"name": "api_key", "value": "sk-test-00000-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "expires_at": null, "metadata": {}}}, "provider_id": null, "last_refreshed": null, "auto_refresh": false, "last_used": null, "use_count": 0, "description": "", "tags": [], "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z", "holdfast_generation": 3}"#;

fn serve(listener: &UnixListener) -> std::io::Result<()> {
    let (s, _) = listener.accept()?;
    let cred: Value = serde_json::from_str(CREDENTIAL)?;
    let mut buf = vec![0u8; 65536];
    let mut have = 0usize;
    let mut out = &s;
    loop {
        if let Some(pos) = buf[..have].iter().position(|&b| b == b'\n') {
            let req: Value = serde_json::from_slice(&buf[..pos])?;
            let reply = if req["method"] == "noop" {
                json!({"jsonrpc": "2.0", "id": req["id"], "error": {"code": -32601, "message": "no"}})
            } else {
                json!({"jsonrpc": "2.0", "id": req["id"],
                       "result": {"credential": cred.clone(), "generation": 3}})
            };
            let mut line = serde_json::to_vec(&reply)?;
            line.push(b'\n');
            buf.copy_within(pos + 1..have, 0);
            have -= pos + 1;
            out.write_all(&line)?;
            continue;
        }
        match (&s).read(&mut buf[have..])? {
            0 => return Ok(()),
            n => have += n,
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("floor.sock");
    let listener = UnixListener::bind(&path)?;
    let server = std::thread::spawn(move || serve(&listener));
    let s = UnixStream::connect(&path)?;
    let mut reader = BufReader::new(s.try_clone()?);
    let mut writer = s;
    let mut line = Vec::new();
    for method in ["noop", "get"] {
        let mut lat: Vec<Duration> = Vec::new();
        for i in 0..60_000u64 {
            let t = Instant::now();
            let mut req = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": i,
                "method": method, "params": {"id": "cred_00001"}}))?;
            req.push(b'\n');
            writer.write_all(&req)?;
            line.clear();
            reader.read_until(b'\n', &mut line)?;
            let v: Value = serde_json::from_slice(&line)?;
            if v.get("id") != Some(&json!(i)) {
                return Err(format!("bad reply {v}").into());
            }
            if i >= 5_000 {
                lat.push(t.elapsed());
            }
        }
        lat.sort();
        println!(
            "{method:>4}: p50 {:.1} µs, p99 {:.1} µs ({} round trips)",
            lat[lat.len() / 2].as_secs_f64() * 1e6,
            lat[lat.len() * 99 / 100].as_secs_f64() * 1e6,
            lat.len()
        );
    }
    drop(writer);
    drop(reader);
    server.join().map_err(|_| "server panicked")??;
    Ok(())
}
