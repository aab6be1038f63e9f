//! The append lane (`src/ipc/lane.rs`) over the real socket: a connection moves there with its
//! first `stream.append`, and from then on everything it sends is served as before — every
//! kind of request, in one write or a byte at a time — with the same limits (line cap, read and
//! idle timeouts, the in-flight cap, the output queue cap), and nothing acknowledged is lost
//! when the daemon stops while lane connections stream.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;
use common::*;

/// `admin.status`'s count of connections the lane reads, asked on a connection of its own.
fn lane_connections(socket: &std::path::Path) -> u64 {
    let mut c = Conn::open(socket);
    c.ok("admin.status", json!({}))["lane_connections"]
        .as_u64()
        .expect("admin.status says lane_connections")
}

/// Wait until the lane reads `n` connections (it adopts a connection right after its first
/// append is queued; the count follows within a turn).
fn wait_lane(socket: &std::path::Path, n: u64) {
    let t = Instant::now();
    loop {
        let got = lane_connections(socket);
        if got == n {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the lane reads {got} connections, expected {n}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Begin run `run` on `c` and append its first delta (which moves `c` to the lane); the
/// stream id.
fn stream_on_lane(c: &mut Conn, run: &str) -> String {
    let sid = c.ok("stream.begin", json!({"run_id": run}))["stream_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let a = c.ok(
        "stream.append",
        json!({"run_id": run, "stream_id": sid, "seq": 1, "events": [{"type": "text", "text": "<1>"}]}),
    );
    assert_eq!(a, json!({"acked_seq": 1}));
    sid
}

fn append_line(id: impl Into<Value>, run: &str, sid: &str, seq: u64) -> Vec<u8> {
    req_line(
        id,
        "stream.append",
        json!({"run_id": run, "stream_id": sid, "seq": seq,
               "events": [{"type": "text", "text": format!("<{seq}>")}]}),
    )
}

fn text_of(c: &mut Conn, run: &str) -> String {
    c.ok("stream.get", json!({"run_id": run, "reveal": true}))["checkpoint"]["partial_text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn deltas(from: u64, to: u64) -> String {
    (from..=to).map(|s| format!("<{s}>")).collect()
}

/// Everything a client may send, sent on a lane connection in one write and then again a byte
/// at a time: every request answered once, by id, with what tokio's path answers (appends in
/// order, a credential read inline, a stream read as a task, a second hello, malformed JSON and
/// an unknown method refused), and a subscription on the same connection fed exactly once.
#[test]
fn a_streaming_connection_is_served_for_everything_it_sends() {
    let mut env = DaemonEnv::new("");
    let d = env.start();
    let mut other = Conn::open(&d.socket);
    other.ok("cred.set", json!({"id": "lane-cred", "value": "v-lane"}));
    let mut c = Conn::open(&d.socket);
    let sid = stream_on_lane(&mut c, "lane-all");
    wait_lane(&d.socket, 1);
    let mut sub = c.ok(
        "stream.subscribe",
        json!({"run_id": "lane-all", "after_seq": 1}),
    );
    let sub_id = sub["subscription"].clone();
    let mut seq = 1;
    for (round, bytewise) in [(1, false), (2, true)] {
        let mut wire = Vec::new();
        let mut ids: Vec<Value> = Vec::new();
        let mut push = |wire: &mut Vec<u8>, id: Value, line: Vec<u8>| {
            ids.push(id);
            wire.extend_from_slice(&line);
        };
        for _ in 0..3 {
            seq += 1;
            let id = json!(format!("a{round}-{seq}"));
            push(
                &mut wire,
                id.clone(),
                append_line(id, "lane-all", &sid, seq),
            );
        }
        let id = json!(format!("get{round}"));
        push(
            &mut wire,
            id.clone(),
            req_line(id, "cred.get", json!({"id": "lane-cred"})),
        );
        let id = json!(format!("stream{round}"));
        push(
            &mut wire,
            id.clone(),
            req_line(id, "stream.get", json!({"run_id": "lane-all"})),
        );
        let id = json!(format!("hello{round}"));
        push(
            &mut wire,
            id.clone(),
            req_line(id, "hello", json!({"client": "again"})),
        );
        let id = json!(format!("nope{round}"));
        push(
            &mut wire,
            id.clone(),
            req_line(id, "no.such_method", json!({})),
        );
        // Malformed JSON answers with a null id.
        push(
            &mut wire,
            Value::Null,
            b"{\"jsonrpc\": \"2.0\", \"id\": \n".to_vec(),
        );
        seq += 1;
        let id = json!(format!("a{round}-{seq}"));
        push(
            &mut wire,
            id.clone(),
            append_line(id, "lane-all", &sid, seq),
        );
        if bytewise {
            for b in &wire {
                c.send_raw(&[*b]);
            }
        } else {
            c.send_raw(&wire);
        }
        // Event notifications of the subscription arrive among the answers: count them apart.
        let mut got = BTreeMap::new();
        let mut events = Vec::new();
        while got.len() < ids.len() {
            let m = c.read_msg().expect("an answer").expect("closed");
            if m["method"] == "event" {
                assert_eq!(m["params"]["subscription"], sub_id, "{m}");
                events.push(m["params"]["seq"].as_u64().unwrap());
                continue;
            }
            assert!(ids.contains(&m["id"]), "an answer to no request sent: {m}");
            assert!(
                got.insert(m["id"].to_string(), m).is_none(),
                "answered twice"
            );
        }
        let by = |id: &str| got[&json!(id).to_string()].clone();
        let first = seq - 3;
        for s in first..=seq {
            assert_eq!(
                by(&format!("a{round}-{s}"))["result"],
                json!({"acked_seq": s}),
                "round {round}"
            );
        }
        assert_eq!(
            by(&format!("get{round}"))["result"]["credential"]["keys"]["api_key"]["value"],
            "v-lane"
        );
        assert_eq!(
            by(&format!("stream{round}"))["result"]["run_id"],
            "lane-all"
        );
        let again = by(&format!("hello{round}"));
        assert!(
            again["error"]["message"]
                .as_str()
                .unwrap()
                .contains("already sent"),
            "{again}"
        );
        assert_eq!(by(&format!("nope{round}"))["error"]["code"], -32601);
        assert_eq!(got[&Value::Null.to_string()]["error"]["code"], -32700);
        // The subscription's events of this round, each once (some may follow the answers).
        while events.len() < 4 {
            let ev = c.next_event(Duration::from_secs(5)).expect("an event");
            events.push(ev["seq"].as_u64().unwrap());
        }
        assert_eq!(events, (first..=seq).collect::<Vec<u64>>(), "round {round}");
        assert!(
            c.next_event(Duration::from_millis(200)).is_none(),
            "an event twice"
        );
        println!(
            "lane, round {round} ({}): {} requests answered by id, {} events",
            if bytewise {
                "a byte at a time"
            } else {
                "one write"
            },
            got.len(),
            events.len()
        );
    }
    assert_eq!(text_of(&mut other, "lane-all"), deltas(1, seq));
    sub = c.ok("unsubscribe", json!({"subscription": sub_id}));
    assert_eq!(sub["unsubscribed"], true);
    assert_eq!(lane_connections(&d.socket), 1);
    drop(c);
    wait_lane(&d.socket, 0);
    d.stop();
}

/// The limits of tokio's reader hold on the lane: a line over the cap (whole, or still
/// arriving) gets the same error line and a close; a line started and not finished within the
/// read timeout, likewise; a connection with nothing in flight and no subscription is closed
/// after the idle timeout, and one with a subscription is not. Nothing leaks: the daemon's fds
/// go back to where they were, and the lane reads no connection afterwards.
#[test]
fn lane_connections_keep_the_read_limits() {
    const MAX: usize = 64 * 1024;
    let mut env = DaemonEnv::new(&format!(
        "[limits]\nread_timeout_ms = 1000\nidle_timeout_ms = 700\nmax_frame_bytes = {MAX}\n"
    ));
    let d = env.start();
    // A stream so the streams are open before the baselines are taken.
    {
        let mut warm = Conn::open(&d.socket);
        stream_on_lane(&mut warm, "lane-warm");
    }
    wait_lane(&d.socket, 0);
    let settle = || thread::sleep(Duration::from_millis(300));
    settle();
    let base_fds = fd_count(d.pid);
    let run = |n: usize| format!("lane-limits-{n}");

    // Over the cap, in one line and as a line still arriving.
    for (n, whole) in [(1, true), (2, false)] {
        let mut c = Conn::open(&d.socket);
        let sid = stream_on_lane(&mut c, &run(n));
        wait_lane(&d.socket, 1);
        let mut big = br#"{"jsonrpc":"2.0","id":7,"method":"cred.get","params":{"id":""#.to_vec();
        big.resize(big.len() + MAX + 10, b'a');
        if whole {
            big.extend_from_slice(b"\"}}\n");
        }
        let mut w = c.stream.try_clone().unwrap();
        let writer = thread::spawn(move || w.write_all(&big).is_ok());
        let t = Instant::now();
        let (msgs, eof) = c.read_until_eof();
        let _ = writer.join();
        assert!(eof, "not closed");
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        let msg = msgs[0]["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("longer than {MAX}")), "{msg}");
        println!(
            "lane: a line over the {MAX}-byte cap ({}) refused and closed after {:.0} ms",
            if whole { "whole" } else { "still arriving" },
            t.elapsed().as_secs_f64() * 1000.0
        );
        let _ = sid;
    }
    wait_lane(&d.socket, 0);

    // A line started and dribbled: closed after the read timeout with the error line.
    let mut c = Conn::open(&d.socket);
    stream_on_lane(&mut c, &run(3));
    wait_lane(&d.socket, 1);
    let mut w = c.stream.try_clone().unwrap();
    let dribbler = thread::spawn(move || {
        let _ = w.write_all(br#"{"jsonrpc":"2.0","id":1,"method":"admin.status","params":{"#);
        for _ in 0..40 {
            thread::sleep(Duration::from_millis(200));
            if w.write_all(b" ").is_err() {
                break;
            }
        }
    });
    let t = Instant::now();
    let (msgs, eof) = c.read_until_eof();
    let took = t.elapsed();
    dribbler.join().unwrap();
    assert_closed_by_read_timeout(&msgs, eof, took, "slowloris on the lane");
    println!(
        "lane: a line dribbled 1 byte/200 ms closed after {:.0} ms (read timeout 1000 ms)",
        took.as_secs_f64() * 1000.0
    );

    // Every write ends inside the next request (one and a half requests per write) for 2.5 s:
    // each request completes well within the read timeout, so none is closed by it (the
    // timeout runs from each line's first byte, not from the first line left unfinished).
    let mut halves = Conn::open(&d.socket);
    stream_on_lane(&mut halves, &run(6));
    wait_lane(&d.socket, 1);
    let request = |id: u64| req_line(id, "no.such_method", json!({}));
    let first = request(1);
    let cut = first.len() / 2;
    halves.send_raw(&first[..cut]);
    let mut prev = first;
    let t = Instant::now();
    let mut id = 1;
    while t.elapsed() < Duration::from_millis(2500) {
        thread::sleep(Duration::from_millis(150));
        id += 1;
        let next = request(id);
        let mut wire = prev[cut..].to_vec();
        wire.extend_from_slice(&next[..cut]);
        halves.send_raw(&wire);
        let m = halves
            .read_msg()
            .expect("an answer")
            .expect("closed by the read timeout");
        assert_eq!(m["id"], id - 1, "{m}");
        assert_eq!(m["error"]["code"], -32601, "{m}");
        prev = next;
    }
    println!(
        "lane: {} requests each split across two writes 150 ms apart, for {:.1} s: all answered (read timeout 1000 ms)",
        id - 1,
        t.elapsed().as_secs_f64()
    );
    drop(halves);
    wait_lane(&d.socket, 0);

    // Idle: closed with no message after ~0.7 s once it holds no run; with a subscription,
    // or holding a run (a producer waiting on a model that thinks), kept.
    let mut idle = Conn::open(&d.socket);
    let sid4 = stream_on_lane(&mut idle, &run(4));
    idle.ok(
        "stream.commit",
        json!({"run_id": run(4), "stream_id": sid4, "final_message": {"role": "assistant"},
               "content_from_stream": true}),
    );
    let mut holding = Conn::open(&d.socket);
    let sid6 = stream_on_lane(&mut holding, &run(60));
    let mut watching = Conn::open(&d.socket);
    stream_on_lane(&mut watching, &run(5));
    watching.ok(
        "stream.subscribe",
        json!({"run_id": run(5), "after_seq": 1}),
    );
    wait_lane(&d.socket, 3);
    let t = Instant::now();
    let (msgs, eof) = idle.read_until_eof();
    let took = t.elapsed();
    assert!(eof && msgs.is_empty(), "{msgs:?}");
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(4),
        "idle lane connection closed after {took:?} (idle timeout 0.7 s)"
    );
    thread::sleep(Duration::from_millis(1500));
    let s = watching.ok("stream.get", json!({"run_id": run(5)}));
    assert_eq!(s["run_id"], run(5));
    // The holder was idle for twice the timeout: still its run's producer.
    let g = watching.ok("stream.get", json!({"run_id": run(60)}));
    assert_eq!(g["status"], "streaming", "{g}");
    assert!(g["no_producer_since_ms"].is_null(), "{g}");
    let a = holding.ok(
        "stream.append",
        json!({"run_id": run(60), "stream_id": sid6, "seq": 2, "events": [{"type": "text", "text": "<2>"}]}),
    );
    assert_eq!(a, json!({"acked_seq": 2}));
    println!(
        "lane: an idle connection closed after {:.0} ms (idle timeout 700 ms); one with a subscription and one holding a run still served 1.5 s later",
        took.as_secs_f64() * 1000.0
    );
    drop(holding);
    drop(watching);
    wait_lane(&d.socket, 0);
    settle();
    // Every socket the lane was given is closed (the blocking pool's threads come and go on
    // their own timer, so threads are not compared).
    let back = (0..30).any(|_| {
        let ok = fd_count(d.pid) == base_fds;
        if !ok {
            thread::sleep(Duration::from_millis(100));
        }
        ok
    });
    assert!(back, "fds {} (baseline {base_fds})", fd_count(d.pid));
    d.stop();
}

/// More appends in one write than a connection may have in flight (32): the lane stops
/// reading the connection at the cap, takes it up again as commits free slots, and every
/// append is acknowledged once, in order, its delta in the run.
#[test]
fn the_lane_waits_at_the_in_flight_cap_and_loses_nothing() {
    const N: u64 = 300;
    let mut env = DaemonEnv::new("");
    let d = env.start();
    let mut c = Conn::open(&d.socket);
    let sid = stream_on_lane(&mut c, "lane-cap");
    wait_lane(&d.socket, 1);
    let mut wire = Vec::new();
    for seq in 2..=N + 1 {
        wire.extend_from_slice(&append_line(seq, "lane-cap", &sid, seq));
    }
    let mut w = c.stream.try_clone().unwrap();
    let writer = thread::spawn(move || w.write_all(&wire).unwrap());
    let ids: Vec<Value> = (2..=N + 1).map(Value::from).collect();
    let mut order = Vec::new();
    let t = Instant::now();
    while order.len() < ids.len() {
        let m = c.read_msg().expect("an answer").expect("closed");
        assert!(m["result"]["acked_seq"].as_u64().is_some(), "{m}");
        assert_eq!(m["result"]["acked_seq"], m["id"], "{m}");
        order.push(m["id"].as_u64().unwrap());
    }
    writer.join().unwrap();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "an append answered twice");
    assert_eq!(order, sorted, "appends acknowledged out of order");
    let mut other = Conn::open(&d.socket);
    assert_eq!(text_of(&mut other, "lane-cap"), deltas(1, N + 1));
    println!(
        "lane: {N} appends in one write (in-flight cap 32) acknowledged once each, in order, in {:.0} ms",
        t.elapsed().as_secs_f64() * 1000.0
    );
    d.stop();
}

/// A client that closes in the middle of a line, and one that never reads while its
/// subscription fills its output queue, are dropped; the lane goes on serving a producer
/// streaming all the while, and the daemon answers on a fresh connection.
#[test]
fn bad_clients_on_the_lane_do_not_stop_it() {
    const CAP: usize = 64 * 1024;
    let mut env = DaemonEnv::new(&format!("[limits]\nmax_output_queue_bytes = {CAP}\n"));
    let d = env.start();
    let socket = d.socket.clone();
    let producer = thread::spawn(move || {
        let mut p = Conn::open(&socket);
        let sid = stream_on_lane(&mut p, "lane-busy");
        let mut seq = 1;
        let t = Instant::now();
        // For 3 s, within what one run may hold (3 MiB of text: 1,400 appends of 2,000 B).
        while t.elapsed() < Duration::from_secs(3) && seq < 1400 {
            seq += 1;
            let big = "x".repeat(2000);
            let a = p.ok(
                "stream.append",
                json!({"run_id": "lane-busy", "stream_id": sid, "seq": seq,
                       "events": [{"type": "text", "text": big}]}),
            );
            assert_eq!(a["acked_seq"], seq);
        }
        seq
    });
    // Half a line, then gone.
    let mut half = Conn::open(&d.socket);
    stream_on_lane(&mut half, "lane-half");
    half.send_raw(br#"{"jsonrpc":"2.0","id":9,"method":"stream.app"#);
    drop(half);
    // Subscribed to the busy run, reading nothing.
    let mut deaf = Conn::open(&d.socket);
    stream_on_lane(&mut deaf, "lane-deaf");
    thread::sleep(Duration::from_millis(300));
    deaf.send_raw(&req_line(
        1,
        "stream.subscribe",
        json!({"run_id": "lane-busy", "after_seq": 0}),
    ));
    let deaf_stream: UnixStream = deaf.stream.try_clone().unwrap();
    let acked = producer.join().unwrap();
    // The deaf client was cut off at its queue cap: its socket reads to EOF eventually.
    deaf.set_timeout(Duration::from_secs(10));
    let (_, eof) = deaf.read_until_eof();
    assert!(eof, "the client that never read was not disconnected");
    drop(deaf_stream);
    let mut fresh = Conn::open(&d.socket);
    let text = text_of(&mut fresh, "lane-busy");
    assert_eq!(text.len(), 3 + 2000 * (acked as usize - 1), "acked {acked}");
    wait_lane(&d.socket, 0);
    println!(
        "lane: a client gone mid-line and one never reading (queue cap {CAP} B) dropped; the producer beside them had {acked} appends acknowledged, all in the run"
    );
    d.stop();
}

/// SIGTERM while producers stream on the lane: the daemon stops reading, finishes what is in
/// flight and exits 0; after a restart every acknowledged delta is in its run.
#[test]
fn sigterm_while_streaming_on_the_lane_keeps_every_acknowledged_delta() {
    const PRODUCERS: usize = 6;
    let mut env = DaemonEnv::new("");
    let d = env.start();
    let mut handles = Vec::new();
    for i in 0..PRODUCERS {
        let socket = d.socket.clone();
        handles.push(thread::spawn(move || {
            let run = format!("lane-term-{i}");
            let mut p = Conn::open(&socket);
            let sid = stream_on_lane(&mut p, &run);
            let mut acked = 1;
            for seq in 2.. {
                match p.try_call(
                    "stream.append",
                    json!({"run_id": run, "stream_id": sid, "seq": seq,
                           "events": [{"type": "text", "text": format!("<{seq}>")}]}),
                ) {
                    Ok(Some(m)) if m.get("result").is_some() => acked = seq,
                    _ => break,
                }
            }
            (run, acked)
        }));
    }
    wait_lane(&d.socket, PRODUCERS as u64);
    thread::sleep(Duration::from_millis(700));
    let t = Instant::now();
    let log = d.stop();
    let stopped = t.elapsed();
    let acked: Vec<(String, u64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(!log.contains("panicked"), "{log}");
    let d = env.start();
    let mut c = Conn::open(&d.socket);
    let mut total = 0;
    for (run, n) in &acked {
        let text = text_of(&mut c, run);
        assert!(
            text.starts_with(&deltas(1, *n)),
            "{run}: acknowledged up to {n}, the run has {text:?}"
        );
        total += n;
    }
    println!(
        "lane: SIGTERM with {PRODUCERS} producers streaming: exit 0 after {:.0} ms, {total} acknowledged deltas all in their runs after the restart",
        stopped.as_secs_f64() * 1000.0
    );
    d.stop();
}
