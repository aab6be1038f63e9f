//! Runs whose producer is gone, through the real daemon: a producer's connection closing
//! without a commit or abort publishes `interrupted` (cause `producer_lost`) at once; a resume
//! within `[streams] orphan_timeout_s` goes on and commits; past it the run ends as `abandoned`
//! (every viewer gets `finish`) with its text kept for `stream.get`; a daemon restart is no loss
//! (the producer that reconnects goes on with its stream id). On files, and on PostgreSQL when
//! `HOLDFAST_TEST_BACKEND=postgres`.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use rustix::process::Signal;
use serde_json::{json, Value};

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;
use common::*;

const CONFIG: &str = "[streams]\norphan_timeout_s = 2\n";

fn begin(c: &mut Conn, run: &str) -> String {
    c.ok("stream.begin", json!({"run_id": run}))["stream_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn text(c: &mut Conn, run: &str, sid: &str, seq: u64, t: &str) {
    let r = c.ok(
        "stream.append",
        json!({"run_id": run, "stream_id": sid, "seq": seq,
               "events": [{"type": "text", "text": t}]}),
    );
    assert_eq!(r["acked_seq"], seq, "{r}");
}

/// Events of a subscription until `finish` (or `within`), with when each arrived.
fn events_until_finish(c: &mut Conn, within: Duration) -> Vec<(Duration, Value)> {
    let t0 = Instant::now();
    let mut got = Vec::new();
    while t0.elapsed() < within {
        if let Some(ev) = c.next_event(Duration::from_millis(100)) {
            let done = ev["event"]["type"] == "finish";
            got.push((t0.elapsed(), ev["event"].clone()));
            if done {
                break;
            }
        }
    }
    got
}

#[test]
fn a_lost_producer_is_announced_at_once_and_its_run_ends_abandoned_with_its_text() {
    let mut env = DaemonEnv::new(CONFIG);
    let d = env.start();
    let mut producer = Conn::open(&d.socket);
    let sid = begin(&mut producer, "lost-1");
    text(&mut producer, "lost-1", &sid, 1, "Hello, ");
    text(&mut producer, "lost-1", &sid, 2, "wor");
    let mut viewer = Conn::open(&d.socket);
    viewer.ok(
        "stream.subscribe",
        json!({"run_id": "lost-1", "after_seq": 2}),
    );
    drop(producer); // the connection closes: no commit, no abort
    let t0 = Instant::now();
    let lost = viewer
        .next_event(Duration::from_secs(30))
        .expect("an event after the close");
    let lost_at = t0.elapsed();
    assert_eq!(lost["event"]["cause"], "producer_lost", "{lost}");
    // Announced at once: while the run is still there, unheld since the loss (the daemon's
    // clock, not the client's: the machine may be slow).
    let mut c = Conn::open(&d.socket);
    let live = c.ok("stream.get", json!({"run_id": "lost-1"}));
    assert_eq!(live["status"], "interrupted", "{live}");
    let since = live["no_producer_since_ms"].as_u64().expect("unheld since");
    let got = events_until_finish(&mut viewer, Duration::from_secs(30));
    let types: Vec<&str> = got
        .iter()
        .map(|(_, e)| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["finish"], "{got:?}");
    let (end_at, finish) = &got[0];
    let end_at = lost_at + *end_at;
    assert_eq!(finish["status"], "abandoned", "{finish}");
    // Its text is kept, shown with reveal.
    let hidden = c.ok("stream.get", json!({"run_id": "lost-1"}));
    assert_eq!(hidden["status"], "abandoned");
    assert!(hidden["partial_message"]["hidden"].is_string(), "{hidden}");
    let state = c.ok("stream.get", json!({"run_id": "lost-1", "reveal": true}));
    assert_eq!(state["partial_message"]["content"], "Hello, wor", "{state}");
    // Ended the timeout (2 s) after the loss, by the daemon's clock.
    let ended = state["at_ms"].as_u64().unwrap();
    assert!(
        ended >= since + 2000,
        "ended {} ms after the loss",
        ended - since
    );
    assert!(
        state["reason"].as_str().unwrap().contains("producer_lost"),
        "{state}"
    );
    // A late subscriber sees the whole run and its end; a begin is refused (it ended).
    let mut late = Conn::open(&d.socket);
    late.ok("stream.subscribe", json!({"run_id": "lost-1"}));
    let all = events_until_finish(&mut late, Duration::from_secs(10));
    assert_eq!(all.last().unwrap().1["status"], "abandoned", "{all:?}");
    let e = c.err("stream.begin", json!({"run_id": "lost-1"}));
    assert!(e["message"].as_str().unwrap().contains("abandoned"), "{e}");
    println!("lost producer: interrupted after {lost_at:?}, finish (abandoned) after {end_at:?}");
    d.stop();
}

#[test]
fn a_resume_within_the_timeout_goes_on_and_the_lost_stream_id_is_refused() {
    let mut env = DaemonEnv::new(CONFIG);
    let d = env.start();
    let mut producer = Conn::open(&d.socket);
    let sid = begin(&mut producer, "lost-2");
    text(&mut producer, "lost-2", &sid, 1, "Hello, ");
    let mut viewer = Conn::open(&d.socket);
    viewer.ok("stream.subscribe", json!({"run_id": "lost-2"}));
    drop(producer);
    // The loss is published before the resume (the viewer waits for it).
    let t0 = Instant::now();
    loop {
        let ev = viewer.next_event(Duration::from_secs(5)).expect("an event");
        if ev["event"]["type"] == "interrupted" {
            assert_eq!(ev["event"]["cause"], "producer_lost");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
    let mut again = Conn::open(&d.socket);
    let r = again.ok("stream.resume", json!({"run_id": "lost-2"}));
    assert_eq!(r["plan"]["plan"], "R1", "{r}");
    assert_eq!(r["plan"]["continuation"], "exact", "the default: {r}");
    let sid2 = r["stream_id"].as_str().unwrap().to_owned();
    let next = r["next_seq"].as_u64().unwrap();
    // The lost producer's stream id is retired: a late append of it is refused, not taken as
    // a replay of the seq the event used.
    let mut zombie = Conn::open(&d.socket);
    let e = zombie.err(
        "stream.append",
        json!({"run_id": "lost-2", "stream_id": sid, "seq": 2,
               "events": [{"type": "text", "text": "zombie"}]}),
    );
    assert_eq!(e["data"]["kind"], "conflict", "{e}");
    // Past the timeout, the resumed run is still there: it has a producer.
    std::thread::sleep(Duration::from_secs(3));
    text(&mut again, "lost-2", &sid2, next, "world");
    again.ok(
        "stream.commit",
        json!({"run_id": "lost-2", "stream_id": sid2,
               "final_message": {"role": "assistant"}, "content_from_stream": true}),
    );
    let rest = events_until_finish(&mut viewer, Duration::from_secs(10));
    assert_eq!(rest.last().unwrap().1["status"], "committed", "{rest:?}");
    let state = again.ok("stream.get", json!({"run_id": "lost-2", "reveal": true}));
    assert_eq!(state["final_message"]["content"], "Hello, world", "{state}");
    d.stop();
}

#[test]
fn a_daemon_restart_is_no_loss_until_the_timeout() {
    let mut env = DaemonEnv::new(CONFIG);
    let d = env.start();
    let mut producer = Conn::open(&d.socket);
    let sid = begin(&mut producer, "kept");
    text(&mut producer, "kept", &sid, 1, "one ");
    let sid_gone = begin(&mut producer, "gone");
    text(&mut producer, "gone", &sid_gone, 1, "left behind");
    drop(producer);
    // The connection closed: both runs lost (interrupted, seq 2); then the daemon restarts.
    std::thread::sleep(Duration::from_millis(300));
    d.signal(Signal::TERM);
    let mut d = d;
    d.wait_exit(Duration::from_secs(20))
        .expect("the daemon stops");
    let d = env.start();
    // A run lost before the restart is resumed after it and goes on; the other ends.
    let mut p = Conn::open(&d.socket);
    let r = p.ok("stream.resume", json!({"run_id": "kept"}));
    let (sid, next) = (
        r["stream_id"].as_str().unwrap().to_owned(),
        r["next_seq"].as_u64().unwrap(),
    );
    text(&mut p, "kept", &sid, next, "two");
    // The unheld run ends (polled: a slow machine's sweep may come late), the held one not.
    let mut c = Conn::open(&d.socket);
    let t0 = Instant::now();
    let mut gone = c.ok("stream.get", json!({"run_id": "gone", "reveal": true}));
    while gone["status"] != "abandoned" && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
        gone = c.ok("stream.get", json!({"run_id": "gone", "reveal": true}));
    }
    let kept = c.ok("stream.get", json!({"run_id": "kept"}));
    assert_eq!(kept["status"], "streaming", "held by a producer: {kept}");
    assert_eq!(gone["status"], "abandoned", "{gone}");
    assert_eq!(gone["partial_message"]["content"], "left behind", "{gone}");
    p.ok(
        "stream.commit",
        json!({"run_id": "kept", "stream_id": sid, "final_message": {"role": "assistant"},
               "content_from_stream": true}),
    );
    d.stop();
}

#[test]
fn a_producer_reconnecting_after_a_restart_keeps_its_stream_id() {
    let mut env = DaemonEnv::new(CONFIG);
    let d = env.start();
    let mut producer = Conn::open(&d.socket);
    let sid = begin(&mut producer, "again");
    text(&mut producer, "again", &sid, 1, "before ");
    d.signal(Signal::TERM);
    let mut d = d;
    d.wait_exit(Duration::from_secs(20))
        .expect("the daemon stops");
    drop(producer);
    let d = env.start();
    // Reconnected within the timeout, with the same stream id and the next seq: no loss.
    let mut p = Conn::open(&d.socket);
    text(&mut p, "again", &sid, 2, "after");
    std::thread::sleep(Duration::from_secs(4));
    let mut c = Conn::open(&d.socket);
    let state = c.ok("stream.get", json!({"run_id": "again", "reveal": true}));
    assert_eq!(state["status"], "streaming", "{state}");
    assert_eq!(
        state["checkpoint"]["partial_text"], "before after",
        "{state}"
    );
    // Its connection closing now is a loss like any other.
    drop(p);
    let mut viewer = Conn::open(&d.socket);
    viewer.ok(
        "stream.subscribe",
        json!({"run_id": "again", "after_seq": 2}),
    );
    let got = events_until_finish(&mut viewer, Duration::from_secs(30));
    let types: Vec<&str> = got
        .iter()
        .map(|(_, e)| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["interrupted", "finish"], "{got:?}");
    d.stop();
}

#[test]
fn a_second_connection_of_the_producer_keeps_the_run_held() {
    let mut env = DaemonEnv::new(CONFIG);
    let d = env.start();
    let mut a = Conn::open(&d.socket);
    let sid = begin(&mut a, "two-conns");
    let mut b = Conn::open(&d.socket);
    text(&mut b, "two-conns", &sid, 1, "x");
    drop(a); // b still speaks for it
    std::thread::sleep(Duration::from_secs(3));
    text(&mut b, "two-conns", &sid, 2, "y");
    let mut c = Conn::open(&d.socket);
    let state = c.ok("stream.get", json!({"run_id": "two-conns"}));
    assert_eq!(state["status"], "streaming", "{state}");
    // A viewer's connection closing is nothing to the run.
    let mut v = Conn::open(&d.socket);
    v.ok("stream.subscribe", json!({"run_id": "two-conns"}));
    drop(v);
    b.ok(
        "stream.commit",
        json!({"run_id": "two-conns", "stream_id": sid, "final_message": {"role": "assistant"},
               "content_from_stream": true}),
    );
    drop(b); // after the commit: nothing to lose
    let state = c.ok("stream.get", json!({"run_id": "two-conns"}));
    assert_eq!(state["status"], "committed", "{state}");
    d.stop();
}

#[test]
fn a_continuation_of_the_wrong_kind_is_named_in_the_error() {
    let mut env = DaemonEnv::new(CONFIG);
    let d = env.start();
    let mut c = Conn::open(&d.socket);
    let sid = begin(&mut c, "cont");
    text(&mut c, "cont", &sid, 1, "x");
    for bad in [json!(1), json!(true), json!(["exact"]), json!("maybe")] {
        let e = c.err(
            "stream.interrupt",
            json!({"run_id": "cont", "stream_id": sid, "cause": "stalled", "continuation": bad}),
        );
        assert_eq!(e["data"]["kind"], "invalid_params", "{e}");
        let m = e["message"].as_str().unwrap();
        assert!(
            m.contains("continuation") && m.contains("restated"),
            "{bad}: {m}"
        );
    }
    let e = c.err(
        "stream.resume",
        json!({"run_id": "cont", "continuation": 7}),
    );
    assert!(
        e["message"].as_str().unwrap().contains("continuation"),
        "{e}"
    );
    // Nothing changed: the run still streams under its holder.
    text(&mut c, "cont", &sid, 2, "y");
    let r = c.ok(
        "stream.interrupt",
        json!({"run_id": "cont", "stream_id": sid, "cause": "stalled", "continuation": null}),
    );
    assert_eq!(r["continuation"], "exact", "{r}");
    d.stop();
}

/// Regression (second attack round): a connection whose append was refused (a gap) holds
/// nothing: the producer's close is still its loss.
#[test]
fn a_refused_append_does_not_hold_the_run() {
    let mut env = DaemonEnv::new(CONFIG);
    let d = env.start();
    let mut producer = Conn::open(&d.socket);
    let sid = begin(&mut producer, "refused");
    text(&mut producer, "refused", &sid, 1, "x");
    let mut other = Conn::open(&d.socket);
    let e = other.err(
        "stream.append",
        json!({"run_id": "refused", "stream_id": sid, "seq": 9,
               "events": [{"type": "text", "text": "gap"}]}),
    );
    assert_eq!(e["data"]["kind"], "invalid_params", "{e}");
    let mut viewer = Conn::open(&d.socket);
    viewer.ok(
        "stream.subscribe",
        json!({"run_id": "refused", "after_seq": 1}),
    );
    drop(producer);
    let ev = viewer
        .next_event(Duration::from_secs(10))
        .expect("an event");
    assert_eq!(ev["event"]["cause"], "producer_lost", "{ev}");
    drop(other);
    d.stop();
}
