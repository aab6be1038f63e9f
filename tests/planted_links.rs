//! Symlinks planted under the data directory, through the real daemon over its socket: at
//! every path the daemon creates there (`runs/`, `runs/<id>` and each of its files, `streams/`,
//! the journal's lock and segments), pointing at directories and files outside. Each request
//! that meets a link is refused with `forbidden` (`data.reason: "unsafe_path"`) naming the
//! link; nothing outside the data directory is created or changed; an unrelated run's
//! `checkpoint.put`, `stream.*` and `run.*` go through right after (no poisoning); the daemon
//! keeps serving; and once the link is gone the same run's request goes through, with no
//! restart. docs/security.md, checklist rows 30 and 44.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{symlink, DirBuilderExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;
use common::*;

/// What the bait files outside hold: names the daemon writes, a torn last line (a run log's
/// reader would cut it), and old times (so the cut would not wait for a live writer).
const BAIT: [(&str, &[u8]); 8] = [
    ("state", b"bait state"),
    ("checkpoint", b"bait checkpoint"),
    ("details.jsonl", b"{\"node_id\": \"bait\"}\n{\"torn"),
    ("tool_logs.jsonl", b"{\"torn"),
    ("tool_calls.jsonl", b"{\"torn"),
    ("recovery.jsonl", b"{\"torn"),
    ("summary.json", b"{}"),
    ("log.lock", b""),
];

/// Every entry under `dir`: its relative path and what it is (bytes, a link's target, or a
/// directory), and its mtime.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (String, Option<SystemTime>)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let meta = fs::symlink_metadata(&p).unwrap();
            let what = if meta.file_type().is_symlink() {
                format!("link {}", fs::read_link(&p).unwrap().display())
            } else if meta.is_dir() {
                todo.push(p.clone());
                "dir".to_owned()
            } else {
                format!("file {:?}", fs::read(&p).unwrap())
            };
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            out.insert(rel, (what, meta.modified().ok()));
        }
    }
    out
}

/// A directory outside the data directory holding the bait files.
fn bait_dir(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    let old = SystemTime::now() - Duration::from_secs(3600);
    for (name, bytes) in BAIT {
        let p = dir.join(name);
        fs::write(&p, bytes).unwrap();
        fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
}

/// The counts the test prints, and what went wrong on the way.
#[derive(Default)]
struct Tally {
    planted: usize,
    paths: BTreeSet<String>,
    refused: usize,
    outside_changes: usize,
    unrelated_refusals: usize,
    bystanders: usize,
}

struct World {
    env: DaemonEnv,
    daemon: Option<RunningDaemon>,
    outside: PathBuf,
    before: BTreeMap<PathBuf, (String, Option<SystemTime>)>,
    t: Tally,
}

impl World {
    fn data(&self) -> &Path {
        &self.env.data_dir
    }

    fn conn(&self) -> Conn {
        Conn::open(&self.daemon.as_ref().unwrap().socket)
    }

    /// Plant a link at `at` (a path under the data directory) to `to` (outside). `label`
    /// names the path in the totals (`runs/<id>/state`).
    fn plant(&mut self, at: &Path, to: &Path, label: &str) {
        symlink(to, at).unwrap();
        self.t.planted += 1;
        self.t.paths.insert(label.to_owned());
    }

    /// `method` must be refused, with the clear error naming `planted`.
    fn refused(&mut self, c: &mut Conn, method: &str, params: Value, planted: &Path) {
        let r = c.call(method, params.clone());
        let Some(err) = r.get("error") else {
            panic!(
                "{method} {params} went through a link at {}: {r}",
                planted.display()
            );
        };
        assert_eq!(err["data"]["kind"], "forbidden", "{method} {params}: {r}");
        assert_eq!(
            err["data"]["reason"], "unsafe_path",
            "{method} {params}: {r}"
        );
        let msg = err["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(&planted.display().to_string()) && msg.contains("a symbolic link"),
            "{method}: the message names the link and what it is: {msg}"
        );
        self.t.refused += 1;
    }

    /// Nothing outside the data directory was created, removed or changed.
    fn outside_untouched(&mut self, case: &str) {
        let now = snapshot(&self.outside);
        if now != self.before {
            self.t.outside_changes += 1;
            let changed: Vec<_> = now
                .iter()
                .filter(|(k, v)| self.before.get(*k) != Some(v))
                .map(|(k, _)| k.display().to_string())
                .chain(
                    self.before
                        .keys()
                        .filter(|k| !now.contains_key(*k))
                        .map(|k| format!("{} (removed)", k.display())),
                )
                .collect();
            panic!("{case}: outside the data directory changed: {changed:?}");
        }
    }

    /// An unrelated run's writes go through (`streams`: the stream ones too), and the daemon
    /// serves a new connection.
    fn bystander(&mut self, case: &str, streams: bool) {
        self.t.bystanders += 1;
        let n = self.t.bystanders;
        let mut c = self.conn();
        let mut calls = vec![
            (
                "checkpoint.put",
                json!({"run_id": format!("by-{n}"), "snapshot": {"partial_text": "p"}}),
            ),
            (
                "run.log_node",
                json!({"run_id": format!("by-{n}"), "detail": {"node_id": "a", "attempt": 1}}),
            ),
            (
                "run.log_step",
                json!({"run_id": format!("by-{n}"), "step": {"node_id": "a", "step_index": 0}}),
            ),
            (
                "run.tool_begin",
                json!({"run_id": format!("by-{n}"), "tool_call_id": "t", "name": "x"}),
            ),
            (
                "run.end",
                json!({"run_id": format!("by-{n}"), "status": "success"}),
            ),
        ];
        if !streams {
            calls.remove(0);
        }
        for (m, p) in calls {
            let r = c.call(m, p.clone());
            if r.get("error").is_some() {
                self.t.unrelated_refusals += 1;
                panic!("{case}: an unrelated {m} {p} was refused: {r}");
            }
        }
        if streams {
            let run = format!("by-s-{n}");
            let r = c.call("stream.begin", json!({"run_id": run}));
            let Some(sid) = r.get("result").map(|b| b["stream_id"].clone()) else {
                self.t.unrelated_refusals += 1;
                panic!("{case}: an unrelated stream.begin was refused: {r}");
            };
            for (m, p) in [
                (
                    "stream.append",
                    json!({"run_id": run, "stream_id": sid, "seq": 1,
                           "events": [{"type": "text", "text": "hi"}]}),
                ),
                (
                    "stream.commit",
                    json!({"run_id": run, "stream_id": sid, "final_message": "hi"}),
                ),
            ] {
                let r = c.call(m, p);
                if r.get("error").is_some() {
                    self.t.unrelated_refusals += 1;
                    panic!("{case}: an unrelated {m} was refused: {r}");
                }
            }
        }
        c.ok("admin.status", json!({}));
    }

    /// A run begun (journal only: nothing under `runs/` yet), with one event; its stream id.
    fn begun(&self, c: &mut Conn, run: &str) -> Value {
        let b = c.ok("stream.begin", json!({"run_id": run}));
        let sid = b["stream_id"].clone();
        c.ok(
            "stream.append",
            json!({"run_id": run, "stream_id": sid, "seq": 1,
                   "events": [{"type": "text", "text": "x"}]}),
        );
        sid
    }

    fn restart(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.stop();
        }
        self.daemon = Some(self.env.start());
    }
}

fn private_dir(p: &Path) {
    fs::DirBuilder::new().mode(0o700).create(p).unwrap();
}

/// Checklist row 44: a symlink planted at every path the daemon creates under its data dir
/// → refused per request, nothing created outside the data dir, no unrelated write refused
/// afterwards.
#[test]
fn a_symlink_at_every_path_under_the_data_dir_is_refused_per_request() {
    let mut env = DaemonEnv::new("");
    if env.on_postgres() {
        println!("skipped: on the PostgreSQL backend streams and run logs keep no files");
        return;
    }
    let outside = env.root.join("outside");
    for case in [
        "run-dir",
        "run-dir-commit",
        "run-dir-abort",
        "runs",
        "streams",
        "streams-live",
    ] {
        bait_dir(&outside.join(case));
    }
    let file = outside.join("file");
    fs::write(&file, b"bait file").unwrap();
    let before = snapshot(&outside);
    let daemon = env.start();
    let mut w = World {
        daemon: Some(daemon),
        env,
        outside: outside.clone(),
        before,
        t: Tally::default(),
    };
    let runs = w.data().join("runs");
    let mut c = w.conn();
    // The run log and the streams have made runs/ and streams/ by now.
    w.bystander("start", true);

    // ---- runs/<id>: a link to a directory outside, for every method that writes there.
    let link = runs.join("v1");
    w.plant(&link, &outside.join("run-dir"), "runs/<id>");
    let detail = json!({"node_id": "a", "attempt": 1});
    for (m, p) in [
        (
            "checkpoint.put",
            json!({"run_id": "v1", "snapshot": {"partial_text": "x"}}),
        ),
        ("checkpoint.get", json!({"run_id": "v1"})),
        ("checkpoint.delete", json!({"run_id": "v1"})),
        ("run.log_node", json!({"run_id": "v1", "detail": detail})),
        ("run.ensure_node", json!({"run_id": "v1", "node_id": "b"})),
        (
            "run.log_step",
            json!({"run_id": "v1", "step": {"node_id": "a", "step_index": 0}}),
        ),
        (
            "run.tool_begin",
            json!({"run_id": "v1", "tool_call_id": "t", "name": "x"}),
        ),
        (
            "run.tool_end",
            json!({"run_id": "v1", "tool_call_id": "t", "result": "r"}),
        ),
        ("run.end", json!({"run_id": "v1", "status": "success"})),
        ("run.get", json!({"run_id": "v1"})),
    ] {
        w.refused(&mut c, m, p, &link);
        w.outside_untouched(m);
        w.bystander(m, true);
    }
    // The prune passes the link by (it is no run's directory): nothing outside removed.
    std::thread::sleep(Duration::from_millis(20));
    c.ok("run.prune", json!({"older_than_days": 0}));
    assert!(
        fs::symlink_metadata(&link).is_ok(),
        "the prune removed the link"
    );
    w.outside_untouched("run.prune");
    // The commit point and the abort, each of a run begun before the link was planted; the
    // same request goes through once the link is gone.
    for (case, end) in [
        ("run-dir-commit", "stream.commit"),
        ("run-dir-abort", "stream.abort"),
    ] {
        let run = format!("v-{case}");
        let sid = w.begun(&mut c, &run);
        let link = runs.join(&run);
        w.plant(&link, &outside.join(case), "runs/<id>");
        let p = json!({"run_id": run, "stream_id": sid, "final_message": "x"});
        let p = if end == "stream.abort" {
            json!({"run_id": run, "stream_id": sid})
        } else {
            p
        };
        w.refused(&mut c, end, p.clone(), &link);
        w.outside_untouched(end);
        w.bystander(end, true);
        fs::remove_file(&link).unwrap();
        c.ok(end, p);
    }

    // ---- runs/<id>/<file>: a link to a file outside, at each file the daemon keeps there.
    let file_cases: [(&str, &str, Value); 7] = [
        (
            "checkpoint",
            "checkpoint.put",
            json!({"snapshot": {"partial_text": "x"}}),
        ),
        ("checkpoint", "checkpoint.get", json!({})),
        ("checkpoint", "checkpoint.delete", json!({})),
        ("details.jsonl", "run.log_node", json!({"detail": detail})),
        (
            "tool_logs.jsonl",
            "run.log_step",
            json!({"step": {"node_id": "a", "step_index": 0}}),
        ),
        (
            "tool_calls.jsonl",
            "run.tool_begin",
            json!({"tool_call_id": "t", "name": "x"}),
        ),
        ("summary.json", "run.end", json!({"status": "success"})),
    ];
    for (i, (name, m, mut p)) in file_cases.into_iter().enumerate() {
        let run = format!("f{i}");
        let dir = runs.join(&run);
        private_dir(&dir);
        let link = dir.join(name);
        w.plant(&link, &file, &format!("runs/<id>/{name}"));
        p["run_id"] = json!(run);
        w.refused(&mut c, m, p.clone(), &link);
        w.outside_untouched(m);
        w.bystander(m, true);
        fs::remove_file(&link).unwrap();
        if m != "checkpoint.get" {
            c.ok(m, p);
        }
    }
    // The run's lock file.
    let dir = runs.join("lk");
    private_dir(&dir);
    let link = dir.join("log.lock");
    w.plant(&link, &file, "runs/<id>/log.lock");
    w.refused(
        &mut c,
        "run.log_node",
        json!({"run_id": "lk", "detail": detail}),
        &link,
    );
    w.outside_untouched("log.lock");
    w.bystander("log.lock", true);
    // The state file, the commit point of a run begun before.
    let sid = w.begun(&mut c, "st");
    private_dir(&runs.join("st"));
    let link = runs.join("st/state");
    w.plant(&link, &file, "runs/<id>/state");
    let commit = json!({"run_id": "st", "stream_id": sid, "final_message": "x"});
    w.refused(&mut c, "stream.commit", commit.clone(), &link);
    w.outside_untouched("state");
    w.bystander("state", true);
    fs::remove_file(&link).unwrap();
    c.ok("stream.commit", commit);

    // ---- runs/ itself, swapped for a link while the daemon runs: every run's files live
    // there, so every run is refused until it is put back — then all go through, no restart.
    let sid = w.begun(&mut c, "rs");
    fs::rename(&runs, w.data().join("runs.real")).unwrap();
    w.plant(&runs, &outside.join("runs"), "runs/");
    for (m, p) in [
        (
            "checkpoint.put",
            json!({"run_id": "r1", "snapshot": {"partial_text": "x"}}),
        ),
        ("run.log_node", json!({"run_id": "r1", "detail": detail})),
        (
            "stream.commit",
            json!({"run_id": "rs", "stream_id": sid, "final_message": "x"}),
        ),
        ("run.prune", json!({"older_than_days": 0})),
    ] {
        w.refused(&mut c, m, p, &runs);
        w.outside_untouched(m);
    }
    fs::remove_file(&runs).unwrap();
    fs::rename(w.data().join("runs.real"), &runs).unwrap();
    w.bystander("runs/ put back", true);
    c.ok(
        "stream.commit",
        json!({"run_id": "rs", "stream_id": sid, "final_message": "x"}),
    );

    // ---- streams/ swapped for a link while the daemon runs: the journal is held by its
    // directory's descriptor, so appends go on into the real directory, none outside.
    let streams = w.data().join("streams");
    fs::rename(&streams, w.data().join("streams.moved")).unwrap();
    w.plant(&streams, &outside.join("streams-live"), "streams/");
    w.bystander("streams/ swapped while running", true);
    w.outside_untouched("streams/ swapped while running");
    fs::remove_file(&streams).unwrap();
    fs::rename(w.data().join("streams.moved"), &streams).unwrap();

    // ---- At start-up: streams/, its lock file, a segment. The streams do not open and say
    // why on every stream request; run logs go on; the fix works without a restart.
    drop(c);
    let segment = fs::read_dir(&streams)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("journal-") && n.ends_with(".log"))
        .expect("a journal segment");
    let saved = w.env.root.join("saved");
    let start_cases: [(PathBuf, PathBuf, &str); 3] = [
        (streams.clone(), outside.join("streams"), "streams/"),
        (
            streams.join("journal.lock"),
            file.clone(),
            "streams/journal.lock",
        ),
        (
            streams.join(&segment),
            file.clone(),
            "streams/journal-<n>.log",
        ),
    ];
    for (at, to, label) in start_cases {
        w.daemon.take().unwrap().stop();
        fs::rename(&at, &saved).unwrap();
        w.plant(&at, &to, label);
        w.restart();
        let mut c = w.conn();
        w.refused(&mut c, "stream.begin", json!({"run_id": "s1"}), &at);
        w.refused(
            &mut c,
            "checkpoint.put",
            json!({"run_id": "s1", "snapshot": {}}),
            &at,
        );
        w.outside_untouched(label);
        w.bystander(label, false);
        fs::remove_file(&at).unwrap();
        fs::rename(&saved, &at).unwrap();
        w.bystander(&format!("{label} put back"), true);
    }
    w.outside_untouched("the end");
    w.daemon.take().unwrap().stop();
    let logs = w.env.all_logs();
    assert!(
        !logs.contains("refusing writes until reopened"),
        "a refused path poisoned a store:\n{logs}"
    );
    let t = &w.t;
    println!(
        "planted {} symlinks at {} paths ({}), {} requests refused, {} files outside, {} \
         unrelated refusals ({} bystander rounds of checkpoint.put, stream.begin/append/commit \
         and run.*)",
        t.planted,
        t.paths.len(),
        t.paths.iter().cloned().collect::<Vec<_>>().join(", "),
        t.refused,
        t.outside_changes,
        t.unrelated_refusals,
        t.bystanders
    );
    assert_eq!(t.paths.len(), 12, "{:?}", t.paths);
    assert_eq!((t.outside_changes, t.unrelated_refusals), (0, 0));
}

/// A run's `state` file is its commit point: that it exists says the run ended. Something
/// else planted under that name in an active run's directory (a directory, a FIFO, a link)
/// does not end the run at the next start: it stays active with its text (an independent
/// tester's run vanished: neither active nor readable). A state that is a file but does not
/// read is an `integrity` error naming it, never "no such run".
#[test]
fn a_planted_state_that_is_not_a_file_never_ends_an_active_run() {
    let mut env = DaemonEnv::new("");
    if env.on_postgres() {
        println!("skipped: on the PostgreSQL backend a run's state is a row, not a file");
        return;
    }
    let runs = env.data_dir.join("runs");
    let daemon = env.start();
    let mut c = Conn::open(&daemon.socket);
    let kinds = ["dir", "fifo", "link"];
    let mut sids = BTreeMap::new();
    for kind in kinds {
        let run = format!("planted-{kind}");
        let b = c.ok("stream.begin", json!({"run_id": run}));
        c.ok(
            "stream.append",
            json!({"run_id": run, "stream_id": b["stream_id"], "seq": 1,
                   "events": [{"type": "text", "text": "kept text"}]}),
        );
        sids.insert(kind, b["stream_id"].clone());
    }
    let b = c.ok("stream.begin", json!({"run_id": "garbled"}));
    c.ok(
        "stream.commit",
        json!({"run_id": "garbled", "stream_id": b["stream_id"], "final_message": "fin"}),
    );
    daemon.stop();
    for kind in kinds {
        let dir = runs.join(format!("planted-{kind}"));
        if !dir.exists() {
            private_dir(&dir);
        }
        let at = dir.join("state");
        match kind {
            "dir" => private_dir(&at),
            "fifo" => {
                let st = std::process::Command::new("mkfifo")
                    .arg(&at)
                    .status()
                    .unwrap();
                assert!(st.success());
            }
            _ => symlink(env.root.join("nowhere"), &at).unwrap(),
        }
    }
    fs::write(runs.join("garbled").join("state"), b"not a sealed state").unwrap();
    let daemon = env.start();
    let mut c = Conn::open(&daemon.socket);
    for kind in kinds {
        let run = format!("planted-{kind}");
        let g = c.ok("stream.get", json!({"run_id": run}));
        assert_eq!(g["status"], "streaming", "{kind}: {g}");
        assert_eq!(g["text_chars"], 9, "{kind}: {g}");
    }
    let e = c.err("stream.get", json!({"run_id": "garbled"}));
    assert_eq!(e["data"]["kind"], "integrity", "{e}");
    assert!(
        e["message"].as_str().unwrap_or_default().contains("state"),
        "{e}"
    );
    // It ended: it cannot stream again, whatever its state says.
    let e = c.err("stream.begin", json!({"run_id": "garbled"}));
    assert_eq!(e["data"]["kind"], "conflict", "{e}");
    // A commit will not replace what it did not write: refused per request (`forbidden`),
    // and the run stays active, its text kept.
    let mut outcomes = Vec::new();
    for kind in kinds {
        let run = format!("planted-{kind}");
        let r = c.call(
            "stream.commit",
            json!({"run_id": run, "stream_id": sids[kind], "final_message": "fin"}),
        );
        let g = c.call("stream.get", json!({"run_id": run}));
        outcomes.push(format!(
            "{kind}: commit {}, then {}",
            r.get("error")
                .map_or("ok".into(), |e| e["data"]["kind"].to_string()),
            g["result"]["status"]
        ));
        assert_eq!(r["error"]["data"]["kind"], "forbidden", "{kind}: {r}");
        assert_eq!(g["result"]["status"], "streaming", "{kind}: {g}");
    }
    // A run not begun yet whose state is already something else: refused at its begin, not
    // after its text was streamed.
    private_dir(&runs.join("fresh"));
    let st = std::process::Command::new("mkfifo")
        .arg(runs.join("fresh/state"))
        .status()
        .unwrap();
    assert!(st.success());
    let e = c.err("stream.begin", json!({"run_id": "fresh"}));
    assert_eq!(e["data"]["kind"], "forbidden", "{e}");
    assert_eq!(e["data"]["reason"], "unsafe_path", "{e}");
    c.ok("admin.status", json!({}));
    daemon.stop();
    println!(
        "planted states: {}; a fresh run's begin refused",
        outcomes.join("; ")
    );
}

/// A FIFO or a directory where a run's file belongs is a refused path on read as on write:
/// `forbidden` (`unsafe_path`), never `storage` (which tells a client the daemon refuses
/// stream writes until restarted). Found by an independent tester on `checkpoint.get`,
/// `stream.get` and `run.get`.
#[test]
fn something_else_where_a_run_file_belongs_is_forbidden_on_read() {
    let mut env = DaemonEnv::new("");
    if env.on_postgres() {
        println!("skipped: on the PostgreSQL backend a run's files are rows");
        return;
    }
    let runs = env.data_dir.join("runs");
    let daemon = env.start();
    let mut c = Conn::open(&daemon.socket);
    c.ok(
        "checkpoint.put",
        json!({"run_id": "ck", "snapshot": {"partial_text": "p"}}),
    );
    let b = c.ok("stream.begin", json!({"run_id": "ended"}));
    c.ok(
        "stream.commit",
        json!({"run_id": "ended", "stream_id": b["stream_id"], "final_message": "fin"}),
    );
    c.ok(
        "run.log_node",
        json!({"run_id": "logged", "detail": {"node_id": "n1"}}),
    );
    let mkfifo = |p: &Path| {
        let st = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap();
        assert!(st.success());
    };
    fs::remove_file(runs.join("ck/checkpoint")).unwrap();
    mkfifo(&runs.join("ck/checkpoint"));
    fs::remove_file(runs.join("ended/state")).unwrap();
    mkfifo(&runs.join("ended/state"));
    private_dir(&runs.join("logged/summary.json"));
    let mut seen = Vec::new();
    for (method, params) in [
        ("checkpoint.get", json!({"run_id": "ck"})),
        ("stream.get", json!({"run_id": "ended"})),
        ("run.get", json!({"run_id": "logged"})),
    ] {
        let e = c.err(method, params);
        assert_eq!(e["data"]["kind"], "forbidden", "{method}: {e}");
        assert_eq!(e["data"]["reason"], "unsafe_path", "{method}: {e}");
        seen.push(format!("{method}: {}", e["message"]));
    }
    // Others keep going.
    c.ok("checkpoint.put", json!({"run_id": "other", "snapshot": {}}));
    daemon.stop();
    println!("refused on read: {}", seen.join("; "));
}
