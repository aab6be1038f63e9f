use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use zeroize::Zeroizing;

use super::*;
use crate::crypto::{generate_key, Keyring};
use crate::durable::fault::{FaultMode, Op};
use crate::durable::Faults;
use crate::error::ErrorKind;
use crate::recovery::Continuation::Restated;

pub(super) use super::store::KeyringSealer as TestSealer;

pub(super) struct Env {
    _dir: tempfile::TempDir,
    pub(super) streams_dir: PathBuf,
    pub(super) runs_dir: PathBuf,
    pub(super) sealer: Arc<dyn Sealer>,
}

impl Env {
    pub(super) fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let key = generate_key();
        Env {
            streams_dir: dir.path().join("data/streams"),
            runs_dir: dir.path().join("data/runs"),
            _dir: dir,
            sealer: Arc::new(TestSealer(Keyring::new(&key, &[]).unwrap())),
        }
    }

    pub(super) fn open_with(&self, faults: Faults) -> Streams {
        Streams::open(
            &self.streams_dir,
            &self.runs_dir,
            Arc::clone(&self.sealer),
            StreamsConfig::default(),
            faults,
        )
        .expect("open streams")
    }

    pub(super) fn open(&self) -> Streams {
        self.open_with(Faults::none())
    }
}

pub(super) fn ok(s: &Streams, t: Result<Ticket, StreamError>) -> Value {
    s.settle_blocking(t.expect("accepted")).expect("durable")
}

pub(super) fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

fn delta(id: &str, name: Option<&str>, args: &str) -> Value {
    let mut v = json!({"type": "tool_call_delta", "id": id, "arguments_delta": args});
    if let Some(n) = name {
        v["name"] = n.into();
    }
    v
}

pub(super) fn begin(s: &Streams, run: &str) -> String {
    let r = ok(
        s,
        s.begin(run, Some("th-1".into()), Some("model-a".into()), false),
    );
    assert_eq!(r["next_seq"], 1);
    r["stream_id"].as_str().unwrap().to_owned()
}

pub(super) fn drain(rx: &mut Feed) -> Vec<(u64, Value)> {
    let mut v = Vec::new();
    while let Some(Next::Event(seq, e)) = rx.try_next() {
        v.push((seq, serde_json::from_str(e.get()).unwrap()));
    }
    v
}

#[test]
fn appends_survive_a_restart_and_replays_are_dropped() {
    let env = Env::new();
    let s = env.open();
    let sid = begin(&s, "run-1");
    let r = ok(&s, s.append("run-1", &sid, 1, &[text("Hel"), text("lo")]));
    assert_eq!(r["acked_seq"], 2);
    // A producer retrying the same batch: acknowledged, dropped.
    let r = ok(&s, s.append("run-1", &sid, 1, &[text("Hel"), text("lo")]));
    assert_eq!(
        (r["acked_seq"].as_u64(), r["duplicate"].as_bool()),
        (Some(2), Some(true))
    );
    // Overlapping: only the new part is taken.
    let r = ok(&s, s.append("run-1", &sid, 2, &[text("lo"), text(", wor")]));
    assert_eq!(r["acked_seq"], 3);
    // A gap is refused.
    let e = s.append("run-1", &sid, 9, &[text("x")]).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidParams);
    assert!(e.to_string().contains("gap"), "{}", e);
    drop(s);
    let s = env.open();
    let g = s.get("run-1", true).unwrap();
    assert_eq!(g["checkpoint"]["partial_text"], "Hello, wor");
    assert_eq!(g["next_seq"], 4);
    assert_eq!(g["thread_id"], "th-1");
    // The old holder keeps its token across the restart (the daemon died, not the agent).
    let r = ok(&s, s.append("run-1", &sid, 4, &[text("ld")]));
    assert_eq!(r["acked_seq"], 4);
}

#[test]
fn fencing_a_takeover_stops_the_old_holder() {
    let env = Env::new();
    let s = env.open();
    let old = begin(&s, "run-f");
    ok(&s, s.append("run-f", &old, 1, &[text("a")]));
    let e = s.begin("run-f", None, None, false).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Conflict);
    let r = ok(&s, s.begin("run-f", None, None, true));
    assert_eq!(
        (r["epoch"].as_u64(), r["next_seq"].as_u64()),
        (Some(2), Some(2))
    );
    let new = r["stream_id"].as_str().unwrap().to_owned();
    // The zombie can neither append nor commit nor interrupt.
    for e in [
        s.append("run-f", &old, 2, &[text("zombie")]).err(),
        s.interrupt("run-f", &old, &json!("connection_reset")).err(),
        s.end("run-f", &old, "committed", json!({"final_message": "z"}))
            .err(),
    ] {
        let e = e.expect("refused");
        assert_eq!(e.kind(), ErrorKind::Conflict, "{}", e);
    }
    ok(&s, s.append("run-f", &new, 2, &[text("b")]));
    drop(s);
    // Fencing survives a restart.
    let s = env.open();
    assert!(s.append("run-f", &old, 3, &[text("z")]).is_err());
    ok(&s, s.append("run-f", &new, 3, &[text("c")]));
}

#[test]
fn interrupt_cancels_every_unfinished_call_and_the_stall_streak_persists() {
    let env = Env::new();
    let s = env.open();
    let sid = begin(&s, "run-i");
    let mut rx = s.subscribe("run-i", 0).unwrap();
    ok(
        &s,
        s.append(
            "run-i",
            &sid,
            1,
            &[
                text("Writing two files."),
                delta("w1", Some("write_file"), "{\"path\": \"a\", \"body\": \""),
                delta("w2", Some("write_file"), ""),
            ],
        ),
    );
    let plan = ok(&s, s.interrupt("run-i", &sid, &json!("idle_stall")));
    assert_eq!(plan["plan"], "R3");
    assert_eq!(plan["cancelled"].as_array().unwrap().len(), 2);
    assert_eq!(plan["next_seq"], 7, "3 events + 2 cancels + interrupted");
    let got = drain(&mut rx);
    let types: Vec<(u64, &str)> = got
        .iter()
        .map(|(s, e)| (*s, e["type"].as_str().unwrap()))
        .collect();
    assert_eq!(
        types,
        vec![
            (1, "text"),
            (2, "tool_call_delta"),
            (3, "tool_call_delta"),
            (4, "tool_call_cancel"),
            (5, "tool_call_cancel"),
            (6, "interrupted"),
        ]
    );
    // It continues, stalls again on write_file: across a restart the streak is 2, and the
    // plan says to split the call.
    ok(
        &s,
        s.append(
            "run-i",
            &sid,
            7,
            &[delta("w3", Some("write_file"), "{\"body\": \"")],
        ),
    );
    drop(rx);
    drop(s);
    let s = env.open();
    let g = s.get("run-i", true).unwrap();
    assert_eq!(g["attempts"]["transient"], 1);
    assert_eq!(g["checkpoint"]["partial_text"], "Writing two files.");
    assert_eq!(g["checkpoint"]["in_flight_tool"]["id"], "w3");
    let plan = ok(&s, s.interrupt("run-i", &sid, &json!("idle_stall")));
    assert_eq!(plan["stall_streak"], 2);
    assert_eq!(plan["hint"]["kind"], "split_tool_call");
    assert_eq!(plan["attempts"]["transient"], 2);
    // The transient budget (2) is now spent: the next interruption fails.
    let plan = ok(&s, s.interrupt("run-i", &sid, &json!("connection_reset")));
    assert_eq!(plan["plan"], "fail");
    let e = s
        .append(
            "run-i",
            &sid,
            plan["next_seq"].as_u64().unwrap(),
            &[text("x")],
        )
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Conflict);
}

#[test]
fn a_mid_stream_429_waits_for_retry_after() {
    let env = Env::new();
    let s = env.open();
    let sid = begin(&s, "run-r");
    ok(&s, s.append("run-r", &sid, 1, &[text("Half")]));
    let plan = ok(
        &s,
        s.interrupt(
            "run-r",
            &sid,
            &json!({"status": 429, "message": "slow", "retry_after": "20"}),
        ),
    );
    assert_eq!(
        (plan["plan"].as_str(), plan["cause"].as_str()),
        (Some("R1"), Some("rate_limited"))
    );
    assert!(plan["wait_ms"].as_u64().unwrap() >= 20_000, "{plan}");
}

#[test]
fn subscribers_get_every_event_once_across_reconnects_and_the_overlap_is_trimmed() {
    let env = Env::new();
    let s = env.open();
    let sid = begin(&s, "run-s");
    ok(
        &s,
        s.append("run-s", &sid, 1, &[text("Hello, "), text("wor")]),
    );
    let plan = ok(
        &s,
        s.interrupt_as("run-s", &sid, &json!("connection_reset"), Restated),
    );
    assert_eq!(plan["plan"], "R1");
    let next = plan["next_seq"].as_u64().unwrap();
    // The continuation repeats "wor": only "ld!" is published.
    ok(&s, s.append("run-s", &sid, next, &[text("world!")]));
    // A subscriber that saw up to seq 2 reconnects: it gets the rest once.
    let mut rx = s.subscribe("run-s", 2).unwrap();
    let got: Vec<(u64, String)> = drain(&mut rx)
        .into_iter()
        .map(|(seq, e)| {
            (
                seq,
                format!(
                    "{}:{}",
                    e["type"].as_str().unwrap(),
                    e["text"].as_str().unwrap_or("")
                ),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![(3, "interrupted:".to_string()), (4, "text:ld!".to_string())]
    );
    let end = s
        .end(
            "run-s",
            &sid,
            "committed",
            json!({"final_message": "Hello, world!"}),
        )
        .unwrap();
    assert_eq!(end["finish_seq"], 5);
    let fin = drain(&mut rx);
    assert_eq!(fin.len(), 1);
    assert_eq!((fin[0].0, fin[0].1["type"].as_str()), (5, Some("finish")));
    // After the commit: a late subscriber gets finish only, resume and begin are refused, and
    // the final message is kept (hidden unless revealed).
    let mut late = s.subscribe("run-s", 0).unwrap();
    assert_eq!(drain(&mut late).len(), 1);
    assert_eq!(
        s.resume("run-s", None, None, false).err().unwrap().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        s.begin("run-s", None, None, true).err().unwrap().kind(),
        ErrorKind::Conflict
    );
    assert_eq!(
        s.get("run-s", true).unwrap()["final_message"],
        "Hello, world!"
    );
    assert!(s.get("run-s", false).unwrap()["final_message"]
        .get("hidden")
        .is_some());
    drop(s);
    let s = env.open();
    assert_eq!(
        s.active_runs(),
        0,
        "a committed run is not resumed after a restart"
    );
}

/// A crash at every step of the commit: afterwards the run is either committed (state file
/// durable, not resumable) or resumable with nothing final on disk — never both, never neither.
#[test]
fn commit_is_atomic_at_every_crash_point() {
    let probe = Env::new();
    let steps = {
        let faults = Faults::recorder();
        let s = probe.open_with(faults.clone());
        let sid = begin(&s, "run-c");
        ok(&s, s.append("run-c", &sid, 1, &[text("answer")]));
        let before = faults.log().len();
        s.end(
            "run-c",
            &sid,
            "committed",
            json!({"final_message": "answer"}),
        )
        .unwrap();
        // The commit's steps (and perhaps the journal's end record, after the commit point).
        faults.log().len() - before
    };
    let (mut committed, mut resumable) = (0, 0);
    for k in 1..=steps as u64 {
        let env = Env::new();
        let faults = Faults::recorder();
        let s = env.open_with(faults.clone());
        let sid = begin(&s, "run-c");
        ok(&s, s.append("run-c", &sid, 1, &[text("answer")]));
        faults.arm(None, k, FaultMode::Crash);
        let res = s.end(
            "run-c",
            &sid,
            "committed",
            json!({"final_message": "answer"}),
        );
        drop(s);
        let s = env.open();
        // What the crash left of the state file's replacement is gone once the store is open
        // again (found by the mixed-load kill -9 torture, tests/torture.rs).
        let temps: Vec<String> = std::fs::read_dir(env.runs_dir.join("run-c"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.contains(crate::durable::TEMP_MARKER))
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            temps.is_empty(),
            "crash at step {k}: temp files left: {temps:?}"
        );
        let state = s.read_state("run-c").unwrap();
        let active = s
            .get("run-c", true)
            .ok()
            .filter(|g| g.get("status").is_some_and(|v| v != "committed"));
        match (state, active) {
            (Some(st), None) => {
                assert_eq!(st["final_message"], "answer");
                assert!(s.resume("run-c", None, None, false).is_err());
                committed += 1;
            }
            (None, Some(g)) => {
                assert!(res.is_err(), "step {k}: acknowledged but not committed");
                assert_eq!(g["checkpoint"]["partial_text"], "answer");
                let r = ok(&s, s.resume("run-c", None, None, false));
                assert_eq!(r["plan"]["plan"], "R1");
                resumable += 1;
            }
            (st, act) => panic!("step {k}: state {st:?}, active {act:?}"),
        }
    }
    println!(
        "commit crash points: {steps} explored, {committed} committed, {resumable} resumable, 0 both, 0 neither"
    );
    assert!(committed > 0 && resumable > 0);
}

#[test]
fn resume_after_a_dead_producer_continues_from_the_whole_prefix() {
    let env = Env::new();
    let s = env.open();
    let sid = begin(&s, "run-x");
    ok(
        &s,
        s.append("run-x", &sid, 1, &[text("First attempt text. ")]),
    );
    drop(s);
    // A new process resumes; the prefix is the whole turn so far.
    let s = env.open();
    let r = ok(&s, s.resume("run-x", Some("model-a".into()), None, false));
    assert_eq!(r["plan"]["plan"], "R1");
    assert_eq!(r["plan"]["cause"], "resumed_from_checkpoint");
    assert_eq!(r["checkpoint"]["partial_text"], "First attempt text. ");
    let sid2 = r["stream_id"].as_str().unwrap().to_owned();
    assert_ne!(sid, sid2);
    ok(
        &s,
        s.append(
            "run-x",
            &sid2,
            r["next_seq"].as_u64().unwrap(),
            &[text("Second.")],
        ),
    );
    drop(s);
    // It dies again: the prefix still holds both attempts (the baseline kept only the last).
    let s = env.open();
    let r = ok(&s, s.resume("run-x", None, None, false));
    assert_eq!(
        r["checkpoint"]["partial_text"],
        "First attempt text. Second."
    );
    assert_eq!(r["plan"]["attempts"]["transient"], 2);
    // A third recovery would pass the transient budget (2): fail, not a silent restart.
    let r = ok(&s, s.resume("run-x", None, None, false));
    assert_eq!(r["plan"]["plan"], "fail");
    assert!(r["plan"]["reason"].as_str().unwrap().contains("budget"));

    // Another model: the checkpoint is stale, so restart (R4) and discard its text; or fail.
    let sid = begin(&s, "run-y");
    ok(&s, s.append("run-y", &sid, 1, &[text("for model a")]));
    let r = ok(&s, s.resume("run-y", Some("model-b".into()), None, false));
    assert_eq!(r["plan"]["plan"], "R4");
    assert!(r["plan"]["reason"].as_str().unwrap().contains("model"));
    assert_eq!(
        s.get("run-y", true).unwrap()["checkpoint"]["partial_text"],
        ""
    );
    let sid = begin(&s, "run-z");
    ok(&s, s.append("run-z", &sid, 1, &[text("t")]));
    let r = ok(
        &s,
        s.resume("run-z", None, Some("other-thread".into()), true),
    );
    assert_eq!(r["plan"]["plan"], "fail");
}

#[test]
fn checkpoints_put_get_delete() {
    let env = Env::new();
    let s = env.open();
    let snap = json!({"partial_text": "abc", "completed_tool_calls": [], "in_flight_tool": null,
                      "upstream_model": "m", "thread_id": "t"});
    s.checkpoint_put("run-k", snap.as_object().unwrap())
        .unwrap();
    s.checkpoint_put("run-k", snap.as_object().unwrap())
        .unwrap();
    let got = s.checkpoint_get("run-k").unwrap();
    assert_eq!(
        (got["partial_text"].as_str(), got["run_id"].as_str()),
        (Some("abc"), Some("run-k"))
    );
    let raw = fs::read(env.runs_dir.join("run-k/checkpoint")).unwrap();
    assert!(
        !String::from_utf8_lossy(&raw).contains("abc"),
        "checkpoint stored in clear"
    );
    let e = s
        .checkpoint_put("run-k", json!({"partial_txt": "x"}).as_object().unwrap())
        .err()
        .unwrap();
    assert!(e.to_string().contains("unknown snapshot field"));
    assert!(s.checkpoint_delete("run-k").unwrap());
    assert_eq!(
        s.checkpoint_get("run-k").err().unwrap().kind(),
        ErrorKind::NotFound
    );
    for bad in ["", "../x", ".hidden", "a/b", &"x".repeat(200)] {
        assert!(s.checkpoint_get(bad).is_err(), "{bad:?}");
        assert!(s.begin(bad, None, None, false).is_err(), "{bad:?}");
    }
}

#[test]
fn idle_runs_expire_and_keep_what_they_were() {
    let env = Env::new();
    let s = Streams::open(
        &env.streams_dir,
        &env.runs_dir,
        Arc::clone(&env.sealer),
        StreamsConfig {
            expire_after: Duration::ZERO,
            ..StreamsConfig::default()
        },
        Faults::none(),
    )
    .unwrap();
    let sid = begin(&s, "run-e");
    ok(&s, s.append("run-e", &sid, 1, &[text("abandoned")]));
    let mut rx = s.subscribe("run-e", 0).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(s.expire_idle(), 1);
    assert_eq!(s.active_runs(), 0);
    let st = s.read_state("run-e").unwrap().unwrap();
    assert_eq!(st["status"], "expired");
    assert_eq!(st["was"], "streaming");
    assert_eq!(st["text_chars"], 9);
    let got = drain(&mut rx);
    assert_eq!(got.last().unwrap().1["status"], "expired");
    // An expired run is over: no resume, no new begin.
    assert_eq!(
        s.resume("run-e", None, None, false).err().unwrap().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        s.begin("run-e", None, None, true).err().unwrap().kind(),
        ErrorKind::Conflict
    );
}

/// A sealer whose keys can be rotated under it: seals with the first, opens with any.
struct RotatingSealer(std::sync::RwLock<Vec<crate::crypto::Secret>>);

impl Sealer for RotatingSealer {
    fn seal(&self, plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
        let keys = self.0.read().unwrap();
        let ring = Keyring::new(&keys[0], &keys[1..]).unwrap();
        Ok(ring.encrypt(plaintext).into_bytes())
    }
    fn open(&self, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, SealError> {
        let keys = self.0.read().unwrap();
        let ring = Keyring::new(&keys[0], &keys[1..]).unwrap();
        let token = std::str::from_utf8(sealed).map_err(|e| SealError::Open(e.into()))?;
        let (plain, _) = ring.decrypt(token).map_err(|e| SealError::Open(e.into()))?;
        Ok(Zeroizing::new(plain.expose().to_vec()))
    }
}

/// A key rotation re-seals the streams before the old key goes: afterwards, with only the new
/// key, a restart restores the active run exactly, and ended runs and checkpoints still read.
#[test]
fn reseal_survives_the_old_key_being_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let (sd, rd) = (dir.path().join("d/streams"), dir.path().join("d/runs"));
    let old = generate_key();
    let new = generate_key();
    let sealer = Arc::new(RotatingSealer(std::sync::RwLock::new(vec![
        crate::crypto::Secret::new(old.expose().to_owned()),
    ])));
    let open = || {
        Streams::open(
            &sd,
            &rd,
            Arc::clone(&sealer) as Arc<dyn Sealer>,
            StreamsConfig::default(),
            Faults::none(),
        )
        .unwrap()
    };
    let s = open();
    let sid = begin(&s, "active");
    ok(
        &s,
        s.append(
            "active",
            &sid,
            1,
            &[text("Hello, wor"), delta("c1", Some("t"), "{\"a\":")],
        ),
    );
    let plan = ok(
        &s,
        s.interrupt_as("active", &sid, &json!("idle_stall"), Restated),
    );
    assert_eq!(plan["plan"], "R3");
    let next = plan["next_seq"].as_u64().unwrap();
    ok(&s, s.append("active", &sid, next, &[text("world")]));
    let done = begin(&s, "done");
    s.end("done", &done, "committed", json!({"final_message": "fin"}))
        .unwrap();
    s.checkpoint_put("cp", json!({"partial_text": "x"}).as_object().unwrap())
        .unwrap();
    let before = s.get("active", true).unwrap();
    // Step 1 of a rotation: the new key is primary, the old one still readable.
    *sealer.0.write().unwrap() = vec![
        crate::crypto::Secret::new(new.expose().to_owned()),
        crate::crypto::Secret::new(old.expose().to_owned()),
    ];
    let (runs, files) = s.reseal().unwrap();
    assert_eq!(
        (runs, files),
        (1, 2),
        "one active run; a state file and a checkpoint"
    );
    drop(s);
    // The segment holding the records under the old key was released whole.
    let segs: Vec<String> = fs::read_dir(&sd)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("journal-"))
        .collect();
    assert_eq!(
        segs,
        vec!["journal-0000000000000002.log".to_string()],
        "{segs:?}"
    );
    // The old key is forgotten.
    *sealer.0.write().unwrap() = vec![crate::crypto::Secret::new(new.expose().to_owned())];
    let s = open();
    let after = s.get("active", true).unwrap();
    for k in ["epoch", "next_seq", "attempts", "stall_streak", "status"] {
        assert_eq!(after[k], before[k], "{k}");
    }
    assert_eq!(after["checkpoint"]["partial_text"], "Hello, world");
    // The producer carries on with its token; the trimmer state came back too.
    ok(&s, s.append("active", &sid, next + 1, &[text("!")]));
    assert_eq!(
        s.get("active", true).unwrap()["checkpoint"]["partial_text"],
        "Hello, world!"
    );
    assert_eq!(
        s.read_state("done").unwrap().unwrap()["final_message"],
        "fin"
    );
    assert_eq!(s.checkpoint_get("cp").unwrap()["partial_text"], "x");
    assert_eq!(
        s.begin("done", None, None, true).err().unwrap().kind(),
        ErrorKind::Conflict
    );
}

/// Review findings, pinned.
#[test]
fn held_text_reaches_live_subscribers_and_replay_keeps_times() {
    let env = Env::new();
    let s = env.open();
    let sid = begin(&s, "run-h");
    ok(&s, s.append("run-h", &sid, 1, &[text("Hello, wor")]));
    let plan = ok(
        &s,
        s.interrupt_as("run-h", &sid, &json!("connection_reset"), Restated),
    );
    let next = plan["next_seq"].as_u64().unwrap();
    let mut rx = s.subscribe("run-h", next - 1).unwrap();
    // "l" could still be a repeat of the tail ("Hello"): held while its record becomes durable.
    ok(&s, s.append("run-h", &sid, next, &[text("l")]));
    assert!(drain(&mut rx).is_empty(), "held text was published early");
    ok(&s, s.append("run-h", &sid, next + 1, &[text("ater")]));
    let got: Vec<(u64, String)> = drain(&mut rx)
        .into_iter()
        .map(|(q, e)| (q, e["text"].as_str().unwrap_or("").to_owned()))
        .collect();
    assert_eq!(
        got,
        vec![(next, "l".to_string()), (next + 1, "ater".to_string())]
    );
    let before = s.get("run-h", false).unwrap()["updated_at_ms"].clone();
    drop(s);
    let s = env.open();
    assert_eq!(
        s.get("run-h", false).unwrap()["updated_at_ms"],
        before,
        "replay moved the clock"
    );
    assert_eq!(
        s.get("run-h", true).unwrap()["checkpoint"]["partial_text"],
        "Hello, worlater"
    );
}

#[test]
fn failed_runs_are_not_restarted_and_unreadable_state_files_count_as_ended() {
    let env = Env::new();
    let s = env.open();
    let sid = begin(&s, "run-f2");
    ok(&s, s.append("run-f2", &sid, 1, &[text("x")]));
    let plan = ok(&s, s.interrupt("run-f2", &sid, &json!("unauthorized")));
    assert_eq!(plan["plan"], "fail");
    for e in [
        s.begin("run-f2", None, None, true).err(),
        s.interrupt("run-f2", &sid, &json!("goaway")).err(),
        s.append(
            "run-f2",
            &sid,
            plan["next_seq"].as_u64().unwrap(),
            &[text("y")],
        )
        .err(),
    ] {
        let e = e.expect("refused");
        assert_eq!(e.kind(), ErrorKind::Conflict, "{}", e);
    }
    s.end("run-f2", &sid, "aborted", json!({"reason": "failed"}))
        .unwrap();
    drop(s);
    // A damaged state file: the run stays ended (fail closed), it is not resurrected.
    fs::write(env.runs_dir.join("run-f2/state"), b"garbage").unwrap();
    let s = env.open();
    assert_eq!(s.active_runs(), 0);
    assert_eq!(
        s.begin("run-f2", None, None, false).err().unwrap().kind(),
        ErrorKind::Conflict
    );
}

/// The overlap trimmer decides on held text after the commit point; a producer composing the
/// final message itself cannot know that decision. `content_from_stream` makes the stored
/// message the text subscribers are shown, in both of the trimmer's outcomes.
#[test]
fn commit_with_content_from_stream_stores_exactly_what_subscribers_saw() {
    let env = Env::new();
    let s = env.open();
    // (continuation after "Hello, wor", what subscribers see in all)
    let cases = [
        // Held ("lo, " occurs in the tail), then published at the commit: not an overlap.
        ("lo, ", "Hello, worlo, "),
        // Held, then dropped at the commit: a repeat of the tail's end.
        ("wor", "Hello, wor"),
    ];
    for (i, (cont, want)) in cases.iter().enumerate() {
        let run = format!("run-c{i}");
        let sid = begin(&s, &run);
        ok(&s, s.append(&run, &sid, 1, &[text("Hello, wor")]));
        let plan = ok(
            &s,
            s.interrupt_as(&run, &sid, &json!("connection_reset"), Restated),
        );
        let next = plan["next_seq"].as_u64().unwrap();
        let mut rx = s.subscribe(&run, 0).unwrap();
        ok(&s, s.append(&run, &sid, next, &[text(cont)]));
        let before_commit = drain(&mut rx);
        let end = s
            .commit(
                &run,
                &sid,
                json!({"role": "assistant", "content": null}),
                true,
            )
            .unwrap();
        assert_eq!(end["status"], "committed");
        let mut seen = String::new();
        for (_, e) in before_commit.iter().chain(drain(&mut rx).iter()) {
            if e["type"] == "text" {
                seen.push_str(e["text"].as_str().unwrap());
            }
        }
        let stored = s.get(&run, true).unwrap()["final_message"].clone();
        println!("continuation {cont:?}: subscribers saw {seen:?}, stored {stored}");
        assert_eq!(seen, *want, "{cont:?}");
        assert_eq!(stored["content"], json!(want), "{cont:?}");
        assert_eq!(stored["role"], "assistant");
    }
    // Only an object can take the content.
    let sid = begin(&s, "run-bad");
    let e = s.commit("run-bad", &sid, json!("text"), true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParams);
    assert!(s.get("run-bad", false).unwrap().get("status").is_some());
}

/// A subscriber that does not read while more than `SUBSCRIBER_QUEUE_EVENTS` events are
/// published is dropped by the run (its queue stops growing), reports `Lagged` after the
/// events it holds, and a new subscription after the last seq it took gives the rest: every
/// event exactly once, in order, then `finish`.
#[test]
fn a_lagging_subscriber_is_bounded_and_catches_up_exactly() {
    let env = Env::new();
    let s = env.open();
    let sid = begin(&s, "run-lag");
    let mut rx = s.subscribe("run-lag", 0).unwrap();
    let cap = crate::limits::SUBSCRIBER_QUEUE_EVENTS as u64;
    let total = cap + 1500;
    let mut seq = 1;
    while seq <= total {
        let batch: Vec<Value> = (0..500.min(total + 1 - seq)).map(|_| text("x")).collect();
        let r = ok(&s, s.append("run-lag", &sid, seq, &batch));
        seq = r["acked_seq"].as_u64().unwrap() + 1;
    }
    let mut got = drain(&mut rx);
    assert_eq!(got.len() as u64, cap, "the queue stopped at the cap");
    assert_eq!(rx.try_next(), Some(Next::Lagged));
    let last = got.last().unwrap().0;
    let mut again = s.subscribe("run-lag", last).unwrap();
    got.extend(drain(&mut again));
    s.end(
        "run-lag",
        &sid,
        "committed",
        json!({"content_from_stream": true}),
    )
    .unwrap();
    got.extend(drain(&mut again));
    let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
    let want: Vec<u64> = (1..=total + 1).collect();
    assert_eq!(seqs, want, "every event once, in order, then finish");
    assert_eq!(got.last().unwrap().1["type"], "finish");
    println!(
        "lagging subscriber: {cap} queued, lagged, caught up from seq {last}: {} events + finish",
        total
    );
}

/// On files memory keeps a window of a run's events (`memory_events`); everything older is
/// derived from the journal when asked for. The same run in a store with a window of 3 and in
/// one with the default window gives every subscriber the same events, seq for seq: from 0,
/// from the middle, after falling behind, after a restart and after a key rotation (whose
/// snapshot must carry the whole run); and memory holds no more than the window.
#[test]
fn a_window_of_events_in_memory_serves_every_subscriber_exactly() {
    let (small, big) = (Env::new(), Env::new());
    let open = |env: &Env, window: usize| {
        Streams::open(
            &env.streams_dir,
            &env.runs_dir,
            Arc::clone(&env.sealer),
            StreamsConfig {
                memory_events: window,
                ..StreamsConfig::default()
            },
            Faults::none(),
        )
        .unwrap()
    };
    let scenario = |s: &Streams| {
        let sid = begin(s, "long");
        let mut seq = 1;
        for i in 0..40 {
            let batch = [text(&format!("w{i:02} ")), text("and ")];
            ok(s, s.append("long", &sid, seq, &batch));
            seq += 2;
        }
        let plan = ok(
            s,
            s.interrupt_as("long", &sid, &json!("connection_reset"), Restated),
        );
        let next = plan["next_seq"].as_u64().unwrap();
        // The continuation repeats the tail: the overlap trimmer drops it.
        ok(
            s,
            s.append("long", &sid, next, &[text("and w40 "), text("done.")]),
        );
    };
    let (s_small, s_big) = (open(&small, 3), open(&big, 1024));
    scenario(&s_small);
    scenario(&s_big);
    let held = s_small.events_in_memory("long").unwrap();
    assert!(
        held <= 6,
        "memory holds {held} events, the window is 3 (trimmed by steps of 3)"
    );
    assert!(s_big.events_in_memory("long").unwrap() > 80);
    // The two stores plan with their own jitter: the wait they chose is not compared (each
    // store's replay keeps its own, which the restart and rotation below check).
    let views = |s: &Streams| -> Vec<Vec<(u64, Value)>> {
        [0, 1, 37, 80, 82]
            .iter()
            .map(|&after| {
                let mut got = drain(&mut s.subscribe("long", after).unwrap());
                for (_, e) in &mut got {
                    if let Some(w) = e.get_mut("wait_ms") {
                        *w = Value::Null;
                    }
                }
                got
            })
            .collect()
    };
    let want = views(&s_big);
    assert!(want[0].len() > 80, "{}", want[0].len());
    assert_eq!(
        views(&s_small),
        want,
        "window 3 vs the whole list in memory"
    );
    let own = drain(&mut s_small.subscribe("long", 0).unwrap());
    // A restart replays the journal, then keeps the window again.
    drop(s_small);
    let s_small = open(&small, 3);
    assert!(s_small.events_in_memory("long").unwrap() <= 6);
    assert_eq!(views(&s_small), want, "after a restart");
    assert_eq!(
        drain(&mut s_small.subscribe("long", 0).unwrap()),
        own,
        "the same events, wait included, before and after the restart"
    );
    // A key rotation's snapshot replaces every earlier record and the old segments go: it must
    // carry the whole run, not the window.
    s_small.reseal().unwrap();
    drop(s_small);
    let s_small = open(&small, 3);
    assert_eq!(views(&s_small), want, "after a rotation and a restart");
    println!(
        "window of 3 events: {} events of one run, subscribers from 5 points, a restart and a \
         rotation: identical to the whole list in memory",
        want[0].len()
    );
}

/// A `checkpoint.put` may name any run, so a kill in the middle of one can leave its temp in a
/// directory no active run has: those are swept on a background thread after open (reading
/// every run directory first would delay serving), and only the stream store's own names —
/// the run log's temp beside them is the run log's to sweep, under its lock. Writes go on
/// while the sweep runs.
#[test]
fn temps_outside_active_runs_are_swept_in_the_background() {
    let env = Env::new();
    drop(env.open());
    let plant = |run: &str, name: &str| {
        let dir = env.runs_dir.join(run);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), b"cut off").unwrap();
        dir.join(name)
    };
    let ours: Vec<_> = (0..200)
        .map(|i| plant(&format!("old-{i}"), ".checkpoint.hf-tmp-00000000000000aa"))
        .collect();
    let theirs = plant("old-0", ".details.jsonl.hf-tmp-00000000000000bb");
    let s = env.open();
    // Checkpoints written meanwhile, into directories being swept.
    for i in 0..50 {
        s.checkpoint_put(
            &format!("old-{i}"),
            json!({"partial_text": format!("p{i}")})
                .as_object()
                .unwrap(),
        )
        .unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ours.iter().any(|p| p.exists()) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let left: Vec<_> = ours.iter().filter(|p| p.exists()).collect();
    assert!(left.is_empty(), "not swept: {left:?}");
    assert!(theirs.exists(), "the run log's temp was removed");
    for i in 0..50 {
        assert_eq!(
            s.checkpoint_get(&format!("old-{i}")).unwrap()["partial_text"],
            format!("p{i}")
        );
    }
    // Closing does not wait for more than the directory being swept.
    drop(s);
}

/// A link planted at a run's directory refuses that run's checkpoint (`forbidden`, naming the
/// link) and writes nothing outside; other runs keep writing (nothing is poisoned). A failed
/// fsync of `runs/` after making a run's directory does poison: that creation is under the
/// rule like every other write.
#[test]
fn a_link_at_a_run_is_refused_alone_and_a_failed_directory_fsync_poisons() {
    let env = Env::new();
    let faults = Faults::recorder();
    let s = env.open_with(faults.clone());
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), env.runs_dir.join("linked")).unwrap();
    let snap = json!({"partial_text": "abc"});
    let snap = snap.as_object().unwrap();
    let e = s.checkpoint_put("linked", snap).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Forbidden, "{e}");
    assert!(e.is_unsafe_path(), "{e}");
    assert!(e.to_string().contains("linked: a symbolic link"), "{e}");
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    s.checkpoint_put("other", snap).unwrap();
    faults.arm(Some(Op::FsyncDir), 1, FaultMode::FailOnce(5));
    let e = s.checkpoint_put("new-run", snap).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Storage, "{e}");
    let e = s.checkpoint_put("other", snap).err().unwrap();
    assert!(
        e.to_string()
            .contains("writes are refused until the daemon restarts"),
        "{e}"
    );
}

/// A lost producer through the service: its `lost` record replays to the same run (the event,
/// the retired stream id, the trimmer's held text decided), the lost stream id is refused, a
/// resume goes on; a second connection of the producer keeps the run held, and a run taken
/// over since is not the closing connection's to lose.
#[test]
fn a_lost_producer_replays_alike_and_only_the_last_holder_connection_loses_it() {
    let env = Env::new();
    let s = Arc::new(env.open());
    let sid = begin(&s, "lost");
    ok(&s, s.append("lost", &sid, 1, &[text("Hello, wor")]));
    // Held text of a restated continuation is decided by the loss, before its event.
    ok(
        &s,
        s.interrupt_as("lost", &sid, &json!("connection_reset"), Restated),
    );
    ok(&s, s.append("lost", &sid, 3, &[text("wor")]));
    assert!(s.attach("lost", &sid, 1));
    assert!(s.attach("lost", &sid, 2));
    assert_eq!(
        s.detach(&[("lost".into(), sid.clone())], 1),
        0,
        "conn 2 still holds it"
    );
    assert_eq!(s.detach(&[("lost".into(), sid.clone())], 2), 1);
    let mut rx = s.subscribe("lost", 0).unwrap();
    // Published once durable (settle_then): wait for it.
    let mut events = Vec::new();
    for _ in 0..500 {
        events.extend(drain(&mut rx));
        if events.iter().any(|(_, e)| e["cause"] == "producer_lost") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let last = events.last().unwrap().1.clone();
    assert_eq!(last["cause"], "producer_lost", "{events:?}");
    let text_of = |evs: &[(u64, Value)]| -> String {
        evs.iter()
            .filter(|(_, e)| e["type"] == "text")
            .map(|(_, e)| e["text"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        text_of(&events),
        "Hello, wor",
        "the restatement was removed"
    );
    let e = s.append("lost", &sid, 4, &[text("late")]).err().unwrap();
    assert!(matches!(e, StreamError::ProducerLost), "{e}");
    let before = events.clone();
    drop(rx);
    drop(s);
    // Replay: the same events, the same refusal.
    let s = Arc::new(env.open());
    let mut rx = s.subscribe("lost", 0).unwrap();
    let replayed = drain(&mut rx);
    assert_eq!(replayed, before, "replay rebuilds what was published");
    assert!(matches!(
        s.append("lost", &sid, 4, &[text("late")]).err().unwrap(),
        StreamError::ProducerLost
    ));
    let r = ok(&s, s.resume("lost", None, None, false));
    let sid2 = r["stream_id"].as_str().unwrap().to_owned();
    assert!(s.attach("lost", &sid2, 3));
    // The old holder's connection closing now is nothing to the resumed run.
    assert_eq!(s.detach(&[("lost".into(), sid.clone())], 2), 0);
    let next = r["next_seq"].as_u64().unwrap();
    ok(&s, s.append("lost", &sid2, next, &[text("ld")]));
    let c = s
        .commit("lost", &sid2, json!({"role": "assistant"}), true)
        .unwrap();
    assert_eq!(c["status"], "committed");
    let state = s.get("lost", true).unwrap();
    assert_eq!(state["final_message"]["content"], "Hello, world");
}

/// Regression (attack round, issue 35): a resume while the trimmer holds text answers a
/// checkpoint whose text is the plan's prefix — the held text decided first.
#[test]
fn a_resume_while_text_is_held_checkpoints_what_the_plan_continues() {
    let env = Env::new();
    let s = env.open();
    let sid = begin(&s, "held");
    ok(&s, s.append("held", &sid, 1, &[text("Hello, world")]));
    ok(
        &s,
        s.interrupt_as("held", &sid, &json!("connection_reset"), Restated),
    );
    // "llo" occurs in the tail: held, not yet decided.
    ok(&s, s.append("held", &sid, 3, &[text("llo")]));
    let r = ok(&s, s.resume("held", None, None, false));
    assert_eq!(r["checkpoint"]["partial_text"], "Hello, worldllo", "{r}");
    assert_eq!(r["plan"]["assistant_prefix"], "Hello, worldllo", "{r}");
}
