//! Issue 16: every write protocol of the streams (file backend) under a fault at each of its
//! file-system operations in turn. For a protocol whose operation takes `n` steps, for every
//! `k` in `1..=n` and every mode — a crash after step `k-1` (every later step fails, as in a
//! process that died there), step `k` failing once with EIO, every step from `k` on failing
//! with EIO, step `k` failing once with ENOSPC — a fresh store is set up (acknowledged writes),
//! the operation runs with the fault armed, and the store is opened again without faults.
//!
//! What must hold, at every point:
//! - the reopened store holds the state from before the operation or the state after it,
//!   nothing else, and the state after it whenever the operation was acknowledged;
//! - a stream's events read back from seq 1 with no gap or repeat, and rebuild its text;
//! - a failed operation says `storage`, and the store that failed still serves reads;
//! - after a failed fsync of the journal, later appends are refused (never retried into
//!   success: the kernel may have dropped the pages);
//! - no temp file is left once the store has been opened again.
//!
//! Key rotation (`reseal`) is enumerated the same way in its own test: the store is written
//! under one key and re-sealed under a new one; acknowledged, it must read with the new key
//! alone; otherwise with the new key and the old one.

use std::sync::Arc;

use serde_json::{json, Value};

use super::tests::{begin, drain, ok, text, Env, TestSealer};
use super::*;
use crate::crypto::{generate_key, Keyring};
use crate::durable::fault::{FaultMode, Op};
use crate::durable::Faults;
use crate::error::ErrorKind;

/// Which state a reopened store holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Seen {
    Old,
    New,
}

/// One write protocol: its setup (acknowledged before the fault), the write under test, and
/// how to tell its old state from its new one in a reopened store.
struct Protocol {
    name: &'static str,
    setup: fn(&Streams) -> String,
    op: fn(&Streams, &str) -> Result<(), StreamError>,
    seen: fn(&Streams) -> Result<Seen, String>,
    /// Goes through the journal: a failed fsync there must refuse every later append.
    journal: bool,
}

const EIO: i32 = 5;
const ENOSPC: i32 = 28;

fn mode_name(m: FaultMode) -> &'static str {
    match m {
        FaultMode::Crash => "crash",
        FaultMode::FailOnce(ENOSPC) => "ENOSPC once",
        FaultMode::FailOnce(_) => "EIO once",
        FaultMode::FailAlways(_) => "EIO from then on",
    }
}

/// A run `r` with the text "a", acknowledged.
fn run_with_text(s: &Streams) -> String {
    let sid = begin(s, "r");
    ok(s, s.append("r", &sid, 1, &[text("a")]));
    sid
}

/// The run `r` as a reopened store has it: its text rebuilt from its events (which must run
/// from seq 1 with no gap) and its status.
fn run_text(s: &Streams) -> Result<(String, String), String> {
    let g = s.get("r", true).map_err(|e| format!("get: {e}"))?;
    let status = g["status"].as_str().unwrap_or_default().to_owned();
    if status == "committed" || status == "aborted" {
        let content = g["final_message"]["content"].as_str().unwrap_or_default();
        return Ok((content.to_owned(), status));
    }
    let mut feed = s.subscribe("r", 0).map_err(|e| format!("subscribe: {e}"))?;
    let events = drain(&mut feed);
    let mut rebuilt = String::new();
    for (i, (seq, e)) in events.iter().enumerate() {
        if *seq != i as u64 + 1 {
            return Err(format!("events out of order at {i}: {events:?}"));
        }
        if e["type"] == "text" {
            rebuilt += e["text"].as_str().unwrap_or_default();
        }
    }
    let text = g["checkpoint"]["partial_text"].as_str().unwrap_or_default();
    if rebuilt != text {
        return Err(format!("events rebuild {rebuilt:?}, the run says {text:?}"));
    }
    Ok((rebuilt, status))
}

fn snapshot(text: &str) -> serde_json::Map<String, Value> {
    json!({"partial_text": text})
        .as_object()
        .cloned()
        .unwrap_or_default()
}

fn protocols() -> Vec<Protocol> {
    vec![
        Protocol {
            name: "stream.append (journal frame, group commit)",
            setup: run_with_text,
            op: |s, sid| {
                s.settle_blocking(s.append("r", sid, 2, &[text("b")])?)
                    .map(drop)
            },
            seen: |s| match run_text(s)?.0.as_str() {
                "a" => Ok(Seen::Old),
                "ab" => Ok(Seen::New),
                t => Err(format!("text {t:?}")),
            },
            journal: true,
        },
        Protocol {
            name: "stream.interrupt",
            setup: run_with_text,
            op: |s, sid| {
                s.settle_blocking(s.interrupt("r", sid, &json!("idle_stall"))?)
                    .map(drop)
            },
            seen: |s| match run_text(s)? {
                (t, _) if t != "a" => Err(format!("text {t:?}")),
                (_, st) if st == "streaming" => Ok(Seen::Old),
                (_, st) if st == "interrupted" => Ok(Seen::New),
                (_, st) => Err(format!("status {st}")),
            },
            journal: true,
        },
        Protocol {
            name: "a producer lost (its connection closed)",
            setup: run_with_text,
            op: |s, sid| s.settle_blocking(s.producer_lost("r", sid)?).map(drop),
            seen: |s| match run_text(s)? {
                (t, _) if t != "a" => Err(format!("text {t:?}")),
                (_, st) if st == "streaming" => Ok(Seen::Old),
                (_, st) if st == "interrupted" => {
                    // The lost holder's stream id is retired in the reopened store too.
                    let mut feed = s.subscribe("r", 0).map_err(|e| e.to_string())?;
                    let last = drain(&mut feed).pop().map(|(_, e)| e);
                    match last {
                        Some(e) if e["cause"] == "producer_lost" => Ok(Seen::New),
                        e => Err(format!("interrupted, last event {e:?}")),
                    }
                }
                (_, st) => Err(format!("status {st}")),
            },
            journal: true,
        },
        Protocol {
            name: "stream.begin with takeover",
            setup: run_with_text,
            op: |s, _| s.settle_blocking(s.begin("r", None, None, true)?).map(drop),
            seen: |s| {
                let (t, _) = run_text(s)?;
                let g = s.get("r", false).map_err(|e| e.to_string())?;
                match (t.as_str(), g["epoch"].as_u64()) {
                    ("a", Some(1)) => Ok(Seen::Old),
                    ("a", Some(2)) => Ok(Seen::New),
                    (t, e) => Err(format!("text {t:?}, epoch {e:?}")),
                }
            },
            journal: true,
        },
        Protocol {
            name: "stream.commit",
            setup: run_with_text,
            op: |s, sid| {
                s.commit("r", sid, json!({"role": "assistant"}), true)
                    .map(drop)
            },
            seen: |s| match run_text(s)? {
                (t, _) if t != "a" => Err(format!("text {t:?}")),
                (_, st) if st == "streaming" => Ok(Seen::Old),
                (_, st) if st == "committed" => match s.resume("r", None, None, false) {
                    Ok(_) => Err("committed and resumable".into()),
                    Err(_) => Ok(Seen::New),
                },
                (_, st) => Err(format!("status {st}")),
            },
            journal: false,
        },
        Protocol {
            name: "stream.abort",
            setup: run_with_text,
            op: |s, sid| s.end("r", sid, "aborted", json!({"reason": "x"})).map(drop),
            seen: |s| {
                let g = s.get("r", true).map_err(|e| e.to_string())?;
                match g["status"].as_str() {
                    Some("streaming") => run_text(s).and_then(|(t, _)| match t.as_str() {
                        "a" => Ok(Seen::Old),
                        t => Err(format!("text {t:?}")),
                    }),
                    Some("aborted") => match s.resume("r", None, None, false) {
                        Ok(_) => Err("aborted and resumable".into()),
                        Err(_) => Ok(Seen::New),
                    },
                    st => Err(format!("status {st:?}")),
                }
            },
            journal: false,
        },
        Protocol {
            name: "checkpoint.put",
            setup: |s| {
                s.checkpoint_put("c", &snapshot("one")).map(drop).ok();
                String::new()
            },
            op: |s, _| s.checkpoint_put("c", &snapshot("two")).map(drop),
            seen: |s| {
                let c = s.checkpoint_get("c").map_err(|e| e.to_string())?;
                match c["partial_text"].as_str() {
                    Some("one") => Ok(Seen::Old),
                    Some("two") => Ok(Seen::New),
                    t => Err(format!("checkpoint {t:?}")),
                }
            },
            journal: false,
        },
        Protocol {
            name: "checkpoint.delete",
            setup: |s| {
                s.checkpoint_put("c", &snapshot("one")).map(drop).ok();
                String::new()
            },
            op: |s, _| s.checkpoint_delete("c").map(drop),
            seen: |s| match s.checkpoint_get("c") {
                Ok(c) if c["partial_text"] == "one" => Ok(Seen::Old),
                Ok(c) => Err(format!("checkpoint {c}")),
                Err(StreamError::NoCheckpoint) => Ok(Seen::New),
                Err(e) => Err(e.to_string()),
            },
            journal: false,
        },
    ]
}

/// Temp files anywhere under `dir`.
fn temps_under(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e
                .file_name()
                .to_string_lossy()
                .contains(crate::durable::TEMP_MARKER)
            {
                found.push(p.display().to_string());
            }
        }
    }
    found
}

/// The temp files still under the store's directories once its background sweep (which runs
/// while the store is open: [`FileStore::after_replay`]) has had up to 10 s to clear them.
fn temps_left(env: &Env) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left: Vec<String> = temps_under(&env.streams_dir)
            .into_iter()
            .chain(temps_under(&env.runs_dir))
            .collect();
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

const MODES: [FaultMode; 4] = [
    FaultMode::Crash,
    FaultMode::FailOnce(EIO),
    FaultMode::FailAlways(EIO),
    FaultMode::FailOnce(ENOSPC),
];

#[test]
fn every_stream_write_protocol_holds_at_every_crash_and_io_error_point() {
    let mut violations = Vec::new();
    let mut total = 0;
    for p in protocols() {
        // The steps of the operation, counted once with nothing failing.
        let steps = {
            let env = Env::new();
            let faults = Faults::recorder();
            let s = env.open_with(faults.clone());
            let sid = (p.setup)(&s);
            let before = faults.log().len();
            (p.op)(&s, &sid).unwrap_or_else(|e| panic!("{}: {e}", p.name));
            // A commit's journal record is written after its commit point, by the committer
            // thread: counted too.
            std::thread::sleep(std::time::Duration::from_millis(100));
            faults.log()[before..].to_vec()
        };
        assert!(!steps.is_empty(), "{}: no file-system step", p.name);
        let mut line = Vec::new();
        for mode in MODES {
            let (mut old, mut new, mut refused) = (0, 0, 0);
            for k in 1..=steps.len() as u64 {
                total += 1;
                let at = format!(
                    "{} at step {k} ({}), {}",
                    p.name,
                    steps[k as usize - 1],
                    mode_name(mode)
                );
                let env = Env::new();
                let faults = Faults::recorder();
                let s = env.open_with(faults.clone());
                let sid = (p.setup)(&s);
                faults.arm(None, k, mode);
                let res = (p.op)(&s, &sid);
                if mode != FaultMode::Crash {
                    if let Err(e) = &res {
                        refused += 1;
                        if e.kind() != ErrorKind::Storage {
                            violations.push(format!("{at}: refused as {:?}: {e}", e.kind()));
                        }
                        // The store that failed still serves reads (the run is in memory).
                        if !sid.is_empty() && s.get("r", true).is_err() {
                            violations.push(format!("{at}: reads refused after the failure"));
                        }
                        // A failed fsync of the journal is never retried into success.
                        let failed_fsync = faults.injected() > 0
                            && p.journal
                            && steps[k as usize - 1] == Op::FsyncFile;
                        if failed_fsync {
                            faults.disarm();
                            let later = s
                                .begin("z", None, None, false)
                                .and_then(|t| s.settle_blocking(t));
                            if later.is_ok() {
                                violations.push(format!(
                                    "{at}: an append after the failed fsync was acknowledged"
                                ));
                            }
                        }
                    }
                }
                drop(s);
                let s = env.open();
                match (p.seen)(&s) {
                    Ok(Seen::New) => new += 1,
                    Ok(Seen::Old) if res.is_ok() => {
                        violations.push(format!("{at}: acknowledged, but the old state is back"))
                    }
                    Ok(Seen::Old) => old += 1,
                    Err(e) => violations.push(format!("{at}: after reopening: {e}")),
                }
                for t in temps_left(&env) {
                    violations.push(format!("{at}: temp file left: {t}"));
                }
                drop(s);
            }
            line.push(format!(
                "{} (old {old}, new {new}{})",
                mode_name(mode),
                if mode == FaultMode::Crash {
                    String::new()
                } else {
                    format!(", refused {refused}")
                }
            ));
        }
        println!(
            "{}: {} steps x {} modes: {}",
            p.name,
            steps.len(),
            MODES.len(),
            line.join("; ")
        );
    }
    println!(
        "stream write protocols: {total} fault points explored, {} violations",
        violations.len()
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// A sealer with `keys` (primary first).
fn sealer(keys: &[&crate::crypto::Secret]) -> Arc<dyn Sealer> {
    let previous: Vec<crate::crypto::Secret> = keys[1..]
        .iter()
        .map(|k| crate::crypto::Secret::new(k.expose().to_owned()))
        .collect();
    let ring = Keyring::new(keys[0], &previous).unwrap_or_else(|| panic!("a keyring"));
    Arc::new(TestSealer(ring))
}

#[test]
fn key_rotation_reseals_the_streams_at_every_crash_and_io_error_point() {
    let (old_key, new_key) = (generate_key(), generate_key());
    // Written under the old key: an active run with text, a committed run, a checkpoint.
    let write_old = |env: &mut Env| {
        env.sealer = sealer(&[&old_key]);
        let s = env.open();
        run_with_text(&s);
        let sid = begin(&s, "done");
        ok(&s, s.append("done", &sid, 1, &[text("kept")]));
        s.commit("done", &sid, json!({"role": "assistant"}), true)
            .unwrap_or_else(|e| panic!("commit: {e}"));
        s.checkpoint_put("c", &snapshot("one"))
            .unwrap_or_else(|e| panic!("checkpoint: {e}"));
    };
    // Everything reads back under `keys`.
    let reads = |env: &mut Env, keys: &[&crate::crypto::Secret]| -> Result<(), String> {
        env.sealer = sealer(keys);
        let s = Streams::open(
            &env.streams_dir,
            &env.runs_dir,
            Arc::clone(&env.sealer),
            StreamsConfig::default(),
            Faults::none(),
        )
        .map_err(|e| format!("open: {e}"))?;
        let (t, _) = run_text(&s)?;
        let done = s.get("done", true).map_err(|e| format!("done: {e}"))?;
        let c = s
            .checkpoint_get("c")
            .map_err(|e| format!("checkpoint: {e}"))?;
        match (
            t.as_str(),
            &done["final_message"]["content"],
            &c["partial_text"],
        ) {
            ("a", d, c) if d == "kept" && c == "one" => {}
            other => return Err(format!("read back {other:?}")),
        }
        match temps_left(env).as_slice() {
            [] => Ok(()),
            left => Err(format!("temp files left: {left:?}")),
        }
    };
    let steps = {
        let mut env = Env::new();
        write_old(&mut env);
        env.sealer = sealer(&[&new_key, &old_key]);
        let faults = Faults::recorder();
        let s = env.open_with(faults.clone());
        let before = faults.log().len();
        s.reseal().unwrap_or_else(|e| panic!("reseal: {e}"));
        faults.log()[before..].to_vec()
    };
    assert!(!steps.is_empty());
    let (mut violations, mut acked, mut refused) = (Vec::new(), 0, 0);
    for mode in MODES {
        for k in 1..=steps.len() as u64 {
            let at = format!(
                "reseal at step {k} ({}), {}",
                steps[k as usize - 1],
                mode_name(mode)
            );
            let mut env = Env::new();
            write_old(&mut env);
            env.sealer = sealer(&[&new_key, &old_key]);
            let faults = Faults::recorder();
            let s = env.open_with(faults.clone());
            faults.arm(None, k, mode);
            let res = s.reseal();
            drop(s);
            match res {
                // Acknowledged: the old key may now be forgotten.
                Ok(_) => {
                    acked += 1;
                    if let Err(e) = reads(&mut env, &[&new_key]) {
                        violations.push(format!(
                            "{at}: acknowledged, but with the new key alone: {e}"
                        ));
                    }
                }
                Err(e) => {
                    refused += 1;
                    if mode != FaultMode::Crash && e.kind() != ErrorKind::Storage {
                        violations.push(format!("{at}: refused as {:?}: {e}", e.kind()));
                    }
                    if let Err(e) = reads(&mut env, &[&new_key, &old_key]) {
                        violations.push(format!("{at}: with both keys: {e}"));
                    }
                }
            }
        }
    }
    println!(
        "key rotation (reseal): {} steps x {} modes: {acked} acknowledged, {refused} refused, {} violations",
        steps.len(),
        MODES.len(),
        violations.len()
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}
