use std::collections::BTreeMap;
use std::fs;
use std::fs::OpenOptions;
use std::io::Write;
use std::sync::Barrier;

use super::*;
use crate::durable::fault::{FaultMode, Op};

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object: {v}"),
    }
}

fn detail(node: &str, attempt: i64, tokens: i64) -> Map<String, Value> {
    obj(
        json!({"node_id": node, "node_name": node, "node_type": "llm", "success": true,
               "attempt": attempt, "input_tokens": tokens, "output_tokens": tokens / 2,
               "tokens_used": tokens + tokens / 2, "latency_ms": 12, "total_steps": 1}),
    )
}

fn lines(dir: &Path, run: &str, file: &str) -> Vec<Value> {
    fs::read_to_string(dir.join(run).join(file))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn open(dir: &Path) -> RunLog {
    RunLog::open(dir, Faults::none()).unwrap()
}

/// hive's race: a node's own completion (`log_node`) and the fallback "ensure logged" path
/// (`ensure_node`) for the same node at once. hive writes a duplicate in ~98 % of such rounds;
/// here every round must end with exactly one line, carrying the completion's tokens.
#[test]
fn the_hive_race_leaves_exactly_one_entry_per_node() {
    let tmp = tempfile::tempdir().unwrap();
    let log = Arc::new(open(tmp.path()));
    let (threads, rounds) = (8, 150);
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (log, barrier) = (Arc::clone(&log), Arc::clone(&barrier));
            std::thread::spawn(move || {
                for r in 0..rounds {
                    let node = format!("node-{r}");
                    barrier.wait();
                    if t % 2 == 0 {
                        log.log_node("race", detail(&node, 1, 100)).unwrap();
                    } else {
                        // The fallback knows less: no token counts.
                        let fallback = obj(json!({"success": true, "attempt": 1}));
                        log.ensure_node("race", &node, fallback).unwrap();
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let written = lines(tmp.path(), "race", "details.jsonl");
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for l in &written {
        *per_node
            .entry(l["node_id"].as_str().unwrap().into())
            .or_default() += 1;
    }
    let duplicates: usize = per_node.values().map(|n| n - 1).sum();
    println!(
        "hive race: {threads} threads x {rounds} rounds (log_node vs ensure_node): \
         {} lines for {} nodes, {duplicates} duplicates",
        written.len(),
        per_node.len()
    );
    assert_eq!(per_node.len(), rounds);
    assert_eq!(duplicates, 0);
    assert_eq!(written.len(), rounds);
    // Whoever came first, the completion's detail is the entry: it replaces a fallback, and a
    // fallback after it writes nothing.
    let summary = log.end("race", "success", &EndFields::default()).unwrap()["summary"].clone();
    assert_eq!(summary["total_nodes_executed"], json!(rounds));
    assert_eq!(summary["total_input_tokens"], json!(rounds as i64 * 100));
    assert_eq!(summary["total_output_tokens"], json!(rounds as i64 * 50));
    assert_eq!(summary["needs_attention"], json!(false));
    // Every record carries its own seq.
    let mut seqs: Vec<u64> = written.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), rounds);
}

#[test]
fn a_restart_between_log_node_and_ensure_node_keeps_one_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let first = open(tmp.path());
    assert_eq!(
        first.log_node("r1", detail("plan", 1, 10)).unwrap()["written"],
        json!(true)
    );
    drop(first);
    // A new process: nothing in memory, the file is the truth.
    let second = open(tmp.path());
    let again = second
        .ensure_node("r1", "plan", obj(json!({"attempt": 1})))
        .unwrap();
    assert_eq!(again["written"], json!(false));
    // The same completion logged again after the restart: nothing written either.
    let same = second.log_node("r1", detail("plan", 1, 10)).unwrap();
    assert_eq!(same["written"], json!(false));
    assert_eq!(lines(tmp.path(), "r1", "details.jsonl").len(), 1);
}

#[test]
fn last_wins_rewrites_in_place_and_attempts_are_separate_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    log.log_node("r", detail("a", 1, 10)).unwrap();
    log.log_node("r", detail("b", 1, 20)).unwrap();
    log.log_node("r", detail("a", 2, 30)).unwrap();
    // From a fresh view (the positions come from reading the file), an append and then a
    // replacement: each keeps its own place.
    let log = open(tmp.path());
    log.log_node("r", detail("c", 1, 5)).unwrap();
    let r = log.log_node("r", detail("a", 1, 40)).unwrap();
    assert_eq!(r["replaced"], json!(true));
    let l = lines(tmp.path(), "r", "details.jsonl");
    let got: Vec<(String, i64, i64)> = l
        .iter()
        .map(|v| {
            (
                v["node_id"].as_str().unwrap().into(),
                v["attempt"].as_i64().unwrap(),
                v["input_tokens"].as_i64().unwrap(),
            )
        })
        .collect();
    // One line per (node, attempt), the replacement at the old one's place.
    assert_eq!(
        got,
        [
            ("a".into(), 1, 40),
            ("b".into(), 1, 20),
            ("a".into(), 2, 30),
            ("c".into(), 1, 5)
        ]
    );
    let s = log.end("r", "success", &EndFields::default()).unwrap()["summary"].clone();
    assert_eq!(s["node_path"], json!(["a", "b", "a", "c"]));
    assert_eq!(s["total_input_tokens"], json!(95));
}

#[test]
fn steps_are_idempotent_by_node_and_index() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    let step = |i: i64, text: &str| {
        obj(
            json!({"node_id": "n", "node_type": "llm", "step_index": i, "llm_text": text,
                   "tool_calls": [], "input_tokens": 1, "output_tokens": 1}),
        )
    };
    assert_eq!(
        log.log_step("r", step(0, "a")).unwrap()["written"],
        json!(true)
    );
    assert_eq!(
        log.log_step("r", step(0, "a")).unwrap()["written"],
        json!(false)
    );
    assert_eq!(
        log.log_step("r", step(1, "b")).unwrap()["written"],
        json!(true)
    );
    assert_eq!(
        log.log_step("r", step(0, "c")).unwrap()["replaced"],
        json!(true)
    );
    let l = lines(tmp.path(), "r", "tool_logs.jsonl");
    assert_eq!(l.len(), 2);
    assert_eq!(l[0]["llm_text"], json!("c"));
    let bad = log.log_step("r", obj(json!({"node_id": "n"}))).unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidParams);
    assert!(bad.to_string().contains("step_index"), "{}", bad);
}

#[test]
fn tool_calls_say_what_ran() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    log.tool_begin("r", "call_1", "search", json!({"q": "x"}))
        .unwrap();
    log.tool_end("r", "call_1", json!("3 results"), false)
        .unwrap();
    log.tool_begin("r", "call_2", "write_file", json!({"path": "/tmp/x"}))
        .unwrap();
    // Idempotent: a second begin or end writes nothing; the first end stays.
    assert_eq!(
        log.tool_begin("r", "call_1", "search", json!({})).unwrap()["written"],
        json!(false)
    );
    assert_eq!(
        log.tool_end("r", "call_1", json!("other"), true).unwrap()["written"],
        json!(false)
    );
    let ids: Vec<String> = ["call_1", "call_2", "call_3"].map(String::from).into();
    assert_eq!(
        log.executions("r", &ids).unwrap(),
        [
            Execution::Executed,
            Execution::Began,
            Execution::NotExecuted
        ]
    );
    // A run with no log, or one that logs no tool calls: nothing can be said.
    assert_eq!(
        log.executions("never-logged", &ids).unwrap(),
        [Execution::Unknown; 3]
    );
    log.log_node("nodes-only", detail("a", 1, 1)).unwrap();
    assert_eq!(
        log.executions("nodes-only", &ids).unwrap(),
        [Execution::Unknown; 3]
    );
    let l = lines(tmp.path(), "r", "tool_calls.jsonl");
    assert_eq!(l.len(), 3);
    assert_eq!(l[1]["result"], json!("3 results"));
    assert_eq!(l[1]["is_error"], json!(false));
    assert!(l[1]["duration_s"].as_f64().is_some());
    assert!(l[0]["start_timestamp"].as_str().unwrap().ends_with('Z'));
}

#[test]
fn end_is_idempotent_and_final() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    log.log_node("r", detail("a", 1, 10)).unwrap();
    let given = EndFields {
        agent_id: Some("agent-7".into()),
        goal_id: Some("g".into()),
        ..EndFields::default()
    };
    let first = log.end("r", "success", &given).unwrap();
    assert_eq!(first["written"], json!(true));
    let path = tmp.path().join("r/summary.json");
    let bytes = fs::read(&path).unwrap();
    let stamp = fs::metadata(&path).unwrap().modified().unwrap();
    // Again, even with another status and from a fresh process: the same summary, no write.
    let again = open(tmp.path())
        .end("r", "failure", &EndFields::default())
        .unwrap();
    assert_eq!(again["written"], json!(false));
    assert_eq!(again["summary"], first["summary"]);
    assert_eq!(fs::read(&path).unwrap(), bytes);
    assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), stamp);
    assert_eq!(first["summary"]["agent_id"], json!("agent-7"));
    // Fields not given are hive's defaults: strings, never null (hive's RunSummaryLog refuses
    // null there, and hive's tooling must load this file).
    for k in ["execution_quality", "trace_id", "execution_id"] {
        assert_eq!(first["summary"][k], json!(""), "{k}");
    }
    // Final: no more entries; a retry of one already there is still answered.
    let late = log.log_node("r", detail("b", 1, 1)).unwrap_err();
    assert_eq!(late.kind(), ErrorKind::Conflict);
    let retry = log.log_node("r", detail("a", 1, 10)).unwrap();
    assert_eq!(retry["written"], json!(false));
    let bad = log
        .end("r2", "finished", &EndFields::default())
        .unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidParams);
}

/// hive's resurrection: `ExecutionManager` runs a failed execution again with the same
/// session id and logger, so the logger writes to a run it has ended and ends it again; hive's
/// second summary counts both attempts. `run.start` of an ended run removes the summary (and
/// only that): the first attempt's entries stay, new ones are taken, and the next `run.end`
/// summarizes all.
#[test]
fn start_reopens_an_ended_run_which_ends_again_over_the_whole_log() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    // A new run: its (empty) log is made, as hive's start_run makes its directory.
    assert_eq!(log.start("r").unwrap(), json!({"reopened": false}));
    assert!(tmp.path().join("r").is_dir(), "start made no run");
    assert_eq!(log.get("r").unwrap()["nodes"], json!(0));
    log.log_node("r", detail("a", 1, 10)).unwrap();
    assert_eq!(log.start("r").unwrap(), json!({"reopened": false}));
    let mut failed = detail("b", 1, 4);
    failed.insert("success".into(), json!(false));
    failed.insert("error".into(), json!("boom"));
    log.log_node("r", failed).unwrap();
    let first = log.end("r", "failure", &EndFields::default()).unwrap();
    assert_eq!(first["summary"]["total_nodes_executed"], json!(2));
    assert_eq!(
        log.log_node("r", detail("b", 2, 6)).unwrap_err().kind(),
        ErrorKind::Conflict
    );
    // Reopened (by another process's view too): the summary is gone, the entries are not.
    assert_eq!(
        open(tmp.path()).start("r").unwrap(),
        json!({"reopened": true})
    );
    assert!(!tmp.path().join("r/summary.json").exists());
    let got = log.get("r").unwrap();
    assert_eq!(
        (got["ended"].clone(), got["nodes"].clone()),
        (json!(false), json!(2))
    );
    assert_eq!(log.start("r").unwrap(), json!({"reopened": false}));
    // The second attempt logs and ends; the summary is of both attempts.
    log.log_node("r", detail("b", 2, 6)).unwrap();
    let second = log.end("r", "success", &EndFields::default()).unwrap();
    assert_eq!(second["written"], json!(true));
    let s = &second["summary"];
    assert_eq!(s["status"], json!("success"));
    assert_eq!(s["total_nodes_executed"], json!(3));
    assert_eq!(s["total_input_tokens"], json!(20));
    assert_eq!(s["needs_attention"], json!(true));
    assert_eq!(s["attention_reasons"], json!(["Node b failed: boom"]));
    assert_eq!(lines(tmp.path(), "r", "details.jsonl").len(), 3);
    let on_disk: Value =
        serde_json::from_slice(&fs::read(tmp.path().join("r/summary.json")).unwrap()).unwrap();
    assert_eq!(&on_disk, s);
    // A hostile id is refused like everywhere else.
    assert_eq!(
        log.start("../x").unwrap_err().kind(),
        ErrorKind::InvalidParams
    );
}

/// hive numbers a node's steps from 0 on each visit: the steps of a node's second visit
/// (`attempt` 2 in the step record) are entries of their own, not replacements of the first
/// visit's; a record without `attempt` keys as before.
#[test]
fn the_steps_of_each_visit_of_a_node_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    let step = |attempt: Option<i64>, index: i64, text: &str| {
        let mut s = obj(json!({"node_id": "plan", "step_index": index, "llm_text": text}));
        if let Some(a) = attempt {
            s.insert("attempt".into(), json!(a));
        }
        s
    };
    for (attempt, text) in [(None, "first"), (Some(2), "second"), (Some(3), "third")] {
        for i in 0..2 {
            let r = log.log_step("v", step(attempt, i, text)).unwrap();
            assert_eq!(r["replaced"], json!(false), "{attempt:?} {i}");
        }
    }
    // attempt 1 is the record without one; a retry of a later visit's step writes nothing.
    let again = log.log_step("v", step(Some(1), 1, "first")).unwrap();
    assert_eq!(
        (again["written"].clone(), again["replaced"].clone()),
        (json!(true), json!(true))
    );
    assert_eq!(
        log.log_step("v", step(Some(2), 0, "second")).unwrap()["written"],
        json!(false)
    );
    let texts: Vec<Value> = open(tmp.path()).get("v").unwrap()["steps_log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["llm_text"].clone())
        .collect();
    assert_eq!(
        texts,
        [
            json!("first"),
            json!("first"),
            json!("second"),
            json!("second"),
            json!("third"),
            json!("third")
        ]
    );
    assert_eq!(lines(tmp.path(), "v", "tool_logs.jsonl").len(), 6);
    // Out of the key's range: refused, nothing written.
    for (attempt, index) in [(2, 1_i64 << 32), (1 + (1_i64 << 31), 0), (-1, 0)] {
        let e = log
            .log_step("v", step(Some(attempt), index, "x"))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidParams, "{attempt} {index}");
    }
    assert_eq!(lines(tmp.path(), "v", "tool_logs.jsonl").len(), 6);
}

#[test]
fn needs_attention_follows_hives_thresholds_in_hives_words() {
    // (fields, needs attention, reasons): hive's RuntimeLogger.log_node_complete, verbatim.
    let cases: &[(Value, bool, &[&str])] = &[
        (json!({"success": true}), false, &[]),
        // hive flags a failure without an error message but gives no reason for it.
        (json!({"success": false}), true, &[]),
        (
            json!({"success": false, "error": "boom"}),
            true,
            &["Node n failed: boom"],
        ),
        (json!({"retry_count": 3}), false, &[]),
        (json!({"retry_count": 4}), true, &["Excessive retries: 4"]),
        (json!({"escalate_count": 2}), false, &[]),
        (
            json!({"escalate_count": 3}),
            true,
            &["Excessive escalations: 3"],
        ),
        (json!({"latency_ms": 60000}), false, &[]),
        (
            json!({"latency_ms": 60001}),
            true,
            &["High latency: 60001ms"],
        ),
        (json!({"tokens_used": 100000}), false, &[]),
        (
            json!({"tokens_used": 100001}),
            true,
            &["High token usage: 100001"],
        ),
        (json!({"total_steps": 20}), false, &[]),
        (json!({"total_steps": 21}), true, &["Many iterations: 21"]),
        (
            json!({"attention_reasons": ["flagged by node"]}),
            true,
            &["flagged by node"],
        ),
        (json!({"needs_attention": true}), true, &[]),
        // A client that computed hive's reasons itself gets each once, in hive's order.
        (
            json!({"success": false, "error": "x", "retry_count": 5,
                   "attention_reasons": ["Node n failed: x", "Excessive retries: 5"]}),
            true,
            &["Node n failed: x", "Excessive retries: 5"],
        ),
    ];
    for (fields, expect, want) in cases {
        let mut d = obj(json!({"node_id": "n"}));
        d.extend(obj(fields.clone()));
        assert_eq!(attention_reasons(&d), *want, "{fields}");
        assert_eq!(needs_attention(&d), *expect, "{fields}");
    }
}

#[test]
fn end_takes_the_callers_start_duration_and_path() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    log.log_node("r", detail("a", 1, 10)).unwrap();
    log.log_node("r", detail("b", 1, 10)).unwrap();
    let given = EndFields {
        started_at: Some("2026-11-23T06:00:00.000001+00:00".into()),
        duration_ms: Some(1234),
        node_path: Some(vec!["a".into(), "b".into(), "a".into()]),
        execution_quality: Some("clean".into()),
        ..EndFields::default()
    };
    let s = log.end("r", "success", &given).unwrap()["summary"].clone();
    assert_eq!(s["started_at"], json!("2026-11-23T06:00:00.000001+00:00"));
    assert_eq!(s["duration_ms"], json!(1234));
    assert_eq!(s["node_path"], json!(["a", "b", "a"]));
    assert_eq!(s["execution_quality"], json!("clean"));
    assert_eq!(s["total_nodes_executed"], json!(2));
    // Not given: the log's own view.
    log.log_node("r2", detail("x", 1, 1)).unwrap();
    let s = log.end("r2", "success", &EndFields::default()).unwrap()["summary"].clone();
    assert_eq!(s["node_path"], json!(["x"]));
    assert!(s["started_at"].as_str().unwrap().ends_with('Z'), "{s}");
}

#[test]
fn torn_tails_garbage_lines_empty_files_and_hive_duplicates_are_recovered_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    log.log_node("r", detail("a", 1, 10)).unwrap();
    log.log_node("r", detail("b", 1, 10)).unwrap();
    drop(log);
    let path = tmp.path().join("r/details.jsonl");
    let good_len = fs::metadata(&path).unwrap().len();
    // A writer killed mid-append: half a line, no newline (some seconds ago).
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(br#"{"node_id":"c","attem"#).unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(10))
        .unwrap();
    drop(f);
    // An empty step log.
    fs::write(tmp.path().join("r/tool_logs.jsonl"), b"").unwrap();
    let log = open(tmp.path());
    let got = log.get("r").unwrap();
    println!("torn tail: report {}", got["report"]);
    assert_eq!(got["report"]["torn_tails_cut"], json!(1));
    assert_eq!(got["report"]["torn_bytes"], json!(21));
    assert_eq!(got["report"]["empty_files"], json!(1));
    assert_eq!(got["nodes"], json!(2));
    assert_eq!(fs::metadata(&path).unwrap().len(), good_len);
    // Appends continue after the cut, as valid JSON lines.
    log.log_node("r", detail("c", 1, 10)).unwrap();
    assert_eq!(lines(tmp.path(), "r", "details.jsonl").len(), 3);

    // A garbage line in the middle and a duplicate as hive's racy logger writes them.
    let mut text = fs::read_to_string(&path).unwrap();
    let first_line = text.lines().next().unwrap().to_owned();
    text.push_str("this is not json\n");
    text.push_str(&first_line);
    text.push('\n');
    fs::write(&path, text).unwrap();
    let log = open(tmp.path());
    let got = log.get("r").unwrap();
    println!("garbage + duplicate: report {}", got["report"]);
    assert_eq!(got["report"]["bad_lines"], json!(1));
    assert_eq!(got["report"]["duplicate_lines"], json!(1));
    assert_eq!(got["nodes"], json!(3));
    // The summary counts logical entries, not lines (hive's doubled tokens).
    assert_eq!(got["summary"]["total_input_tokens"], json!(30));
    // Truncated mid-line (a copy or a disk that lost the end of the file).
    let full = fs::metadata(&path).unwrap().len();
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(full - 10).unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(10))
        .unwrap();
    drop(f);
    let got = open(tmp.path()).get("r").unwrap();
    println!("truncated mid-line: report {}", got["report"]);
    assert_eq!(got["report"]["torn_tails_cut"], json!(1));
    // The last line (the hive-style duplicate) is gone; the three entries are intact.
    assert_eq!(got["nodes"], json!(3));
    assert_eq!(got["report"]["duplicate_lines"], json!(0));

    // A file that is entirely garbage or empty still works.
    fs::write(&path, b"\n\n   \n{]\n").unwrap();
    let got = open(tmp.path()).get("r").unwrap();
    assert_eq!(got["nodes"], json!(0));
    assert_eq!(got["report"]["bad_lines"], json!(1));
}

#[test]
fn another_process_appending_is_seen_and_a_replaced_file_is_reloaded() {
    let tmp = tempfile::tempdir().unwrap();
    let a = open(tmp.path());
    let b = open(tmp.path());
    a.log_node("r", detail("x", 1, 1)).unwrap();
    // b reads x from the file, then logs y: seq continues past a's.
    assert_eq!(
        b.ensure_node("r", "x", Map::new()).unwrap()["written"],
        json!(false)
    );
    b.log_node("r", detail("y", 1, 1)).unwrap();
    // a replaces x (rewrite: a new inode); b must see the new content, not its cached one.
    a.log_node("r", detail("x", 1, 5)).unwrap();
    let got = b.get("r").unwrap();
    assert_eq!(got["summary"]["total_input_tokens"], json!(6));
    let seqs: Vec<u64> = lines(tmp.path(), "r", "details.jsonl")
        .iter()
        .map(|l| l["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs.len(), 2);
    assert_ne!(seqs[0], seqs[1]);
}

#[test]
fn hostile_run_ids_and_bad_details_are_refused_without_touching_the_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    for id in ["", "../x", ".hidden", "a/b", &"x".repeat(129), "a\nb"] {
        let e = log.log_node(id, detail("n", 1, 1)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidParams, "{id:?}");
    }
    for d in [
        json!({}),
        json!({"node_id": ""}),
        json!({"node_id": 5}),
        json!({"node_id": "n", "attempt": -1}),
        json!({"node_id": "n", "attempt": "1"}),
    ] {
        let e = log.log_node("ok", obj(d.clone())).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidParams, "{d}");
    }
    let big = obj(json!({"node_id": "n", "error": "x".repeat(MAX_RECORD_BYTES)}));
    assert_eq!(
        log.log_node("ok", big).unwrap_err().kind(),
        ErrorKind::InvalidParams
    );
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1, "only ok/");
    assert!(lines(tmp.path(), "ok", "details.jsonl").is_empty());
    assert_eq!(log.get("missing").unwrap_err().kind(), ErrorKind::NotFound);
}

#[test]
fn a_failed_write_or_fsync_is_an_error_and_the_next_call_sees_the_truth() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Faults::none();
    let log = RunLog::open(tmp.path(), faults).unwrap();
    log.log_node("r", detail("a", 1, 1)).unwrap();
    let mut explored = 0;
    for op in [Op::Append, Op::FsyncFile] {
        let faults = Faults::at_op(op, 1, FaultMode::FailOnce(libc_eio()));
        let log = RunLog::open(tmp.path(), faults.clone()).unwrap();
        let node = format!("n-{op:?}");
        let e = log.ensure_node("r", &node, Map::new()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Storage, "{op:?}");
        assert_eq!(faults.injected(), 1);
        // The failed append is not left in the file (a retry must not take an unsynced line
        // for a logged one).
        assert!(
            !lines(tmp.path(), "r", "details.jsonl")
                .iter()
                .any(|l| l["node_id"] == json!(node)),
            "{op:?}"
        );
        // After a failed fsync the log refuses writes until it is reopened (fsyncgate: a
        // later sync that succeeds would vouch for pages the kernel may have dropped).
        let log = if op == Op::FsyncFile {
            let e = log.ensure_node("r", &node, Map::new()).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Storage, "{e}");
            assert!(
                e.to_string()
                    .contains("writes are refused until the daemon restarts"),
                "{e}"
            );
            RunLog::open(tmp.path(), Faults::none()).unwrap()
        } else {
            log
        };
        // Retrying is safe: exactly one entry either way (the failed fsync's line may be in
        // the file; the failed write's is not).
        log.ensure_node("r", &node, Map::new()).unwrap();
        let count = lines(tmp.path(), "r", "details.jsonl")
            .iter()
            .filter(|l| l["node_id"] == json!(node))
            .count();
        assert_eq!(count, 1, "{op:?}");
        explored += 1;
    }
    println!("failed write/fsync: {explored} fault points, 0 duplicates, 0 lost");
}

fn libc_eio() -> i32 {
    5
}

#[test]
fn list_filters_and_prune_deletes_old_runs_but_keeps_active_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    log.log_node("done", detail("a", 1, 1)).unwrap();
    log.end("done", "success", &EndFields::default()).unwrap();
    log.log_node("live", detail("a", 1, 1)).unwrap();
    log.log_node("failed", obj(json!({"node_id": "a", "success": false})))
        .unwrap();
    log.end("failed", "failure", &EndFields::default()).unwrap();
    let all = log.list(None, None, None).unwrap();
    assert_eq!(all.len(), 3);
    let failed = log.list(Some("failure"), None, None).unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["summary"]["needs_attention"], json!(true));
    assert_eq!(log.list(Some("running"), None, None).unwrap().len(), 1);
    assert!(log
        .list(None, Some(now_ms() + 60_000), None)
        .unwrap()
        .is_empty());
    // Nothing is old yet.
    assert!(log
        .prune(Duration::from_secs(3600), &|_| false, false)
        .unwrap()
        .is_empty());
    // Everything is older than zero seconds; "live" is kept (an active stream), a dry run
    // deletes nothing.
    std::thread::sleep(Duration::from_millis(20));
    let keep = |id: &str| id == "live";
    let would = log.prune(Duration::ZERO, &keep, true).unwrap();
    assert_eq!(would.len(), 2);
    assert!(tmp.path().join("done").exists());
    let gone = log.prune(Duration::ZERO, &keep, false).unwrap();
    assert_eq!(gone.len(), 2);
    assert!(!tmp.path().join("done").exists());
    assert!(tmp.path().join("live").exists());
    assert_eq!(log.get("done").unwrap_err().kind(), ErrorKind::NotFound);
}

/// A torn tail written seconds ago is cut; one being written right now (by a process that
/// does not take the lock) is waited for and read whole.
#[test]
fn a_fresh_partial_line_is_waited_for_not_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    log.log_node("r", detail("a", 1, 1)).unwrap();
    let path = tmp.path().join("r/details.jsonl");
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(br#"{"node_id":"slow","attempt":1,"#).unwrap();
    let finisher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        f.write_all(b"\"input_tokens\":7}\n").unwrap();
    });
    let got = open(tmp.path()).get("r").unwrap();
    finisher.join().unwrap();
    assert_eq!(got["nodes"], json!(2), "{got}");
    assert_eq!(got["report"]["torn_tails_cut"], json!(0));
}

/// Another process rewrote the file in place (same inode) with other content: the cached view
/// notices (its remembered end differs) and reloads instead of reading on from the middle.
#[test]
fn a_file_rewritten_in_place_is_reloaded_not_read_from_the_middle() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    log.log_node("r", detail("a", 1, 1)).unwrap();
    log.log_node("r", detail("b", 1, 1)).unwrap();
    let path = tmp.path().join("r/details.jsonl");
    let ino = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&path).unwrap());
    let mut other = String::new();
    for n in ["x", "y", "z"] {
        other.push_str(&serde_json::to_string(&detail(n, 1, 100)).unwrap());
        other.push('\n');
    }
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.write_all(other.as_bytes()).unwrap();
    drop(f);
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&fs::metadata(&path).unwrap()),
        ino
    );
    let got = log.get("r").unwrap();
    let nodes: Vec<&str> = got["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["node_id"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["x", "y", "z"], "{got}");
    assert_eq!(got["summary"]["total_input_tokens"], json!(300));
}

/// A run with only a stream's state file is pruned like any other (taking its lock must not
/// make it look active), and the dry run lists exactly what the real prune deletes.
#[test]
fn prune_counts_what_it_says_and_takes_stream_only_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    fs::create_dir(tmp.path().join("stream-only")).unwrap();
    fs::write(tmp.path().join("stream-only/state"), b"sealed").unwrap();
    log.log_node("logged", detail("a", 1, 1)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let would = log.prune(Duration::ZERO, &|_| false, true).unwrap();
    let did = log.prune(Duration::ZERO, &|_| false, false).unwrap();
    assert_eq!(would.len(), 2, "{would:?}");
    assert_eq!(did.len(), 2, "{did:?}");
    assert!(did.iter().all(|r| r.get("error").is_none()), "{did:?}");
    assert!(!tmp.path().join("stream-only").exists());
    // An absurd age is "keep everything", not a wrapped-around cutoff.
    log.log_node("new", detail("a", 1, 1)).unwrap();
    assert!(log
        .prune(Duration::from_secs(u64::MAX), &|_| false, false)
        .unwrap()
        .is_empty());
}

/// A seq read from a file is not trusted to leave room: `u64::MAX` in a line must neither panic
/// (debug) nor wrap to 0 (release); the log still reads, and a new record is refused with a
/// clear error instead of reusing a seq.
#[test]
fn a_file_with_the_largest_seq_reads_and_refuses_new_records() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("maxed");
    fs::create_dir_all(&run).unwrap();
    let mut line = detail("plan", 1, 10);
    line.insert("seq".into(), u64::MAX.into());
    line.insert("logged_at_ms".into(), 1.into());
    fs::write(
        run.join("details.jsonl"),
        format!("{}\n", Value::Object(line)),
    )
    .unwrap();
    let log = open(tmp.path());
    let got = log.get("maxed").unwrap();
    assert_eq!(got["nodes"], json!(1), "{got}");
    let e = log.log_node("maxed", detail("act", 1, 10)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(
        e.to_string().contains("seq counter is at its maximum"),
        "{e}"
    );
    // Nothing was written: the file still holds the one line.
    assert_eq!(lines(tmp.path(), "maxed", "details.jsonl").len(), 1);
}

/// A rewrite of `details.jsonl` (other content for a logged node) killed before its rename
/// leaves a temp file; the next process that touches the run, under its lock, removes it and
/// keeps the old line (found by the mixed-load kill -9 torture, tests/torture.rs).
#[test]
fn a_rewrite_cut_off_by_a_crash_leaves_no_temp_once_the_run_is_touched() {
    let tmp = tempfile::tempdir().unwrap();
    open(tmp.path()).log_node("r", detail("n", 1, 1)).unwrap();
    let crashing =
        RunLog::open(tmp.path(), Faults::at_op(Op::Rename, 1, FaultMode::Crash)).unwrap();
    assert!(crashing.log_node("r", detail("n", 1, 2)).is_err());
    drop(crashing);
    let temps = |dir: &Path| -> Vec<String> {
        fs::read_dir(dir.join("r"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(crate::durable::TEMP_MARKER))
            .collect()
    };
    assert_eq!(temps(tmp.path()).len(), 1, "the crash left its temp file");
    let log = open(tmp.path());
    let g = log.get("r").unwrap();
    assert_eq!(g["details"][0]["input_tokens"], json!(1), "{g}");
    assert_eq!(temps(tmp.path()), Vec::<String>::new());
}

/// A file's `logged_at_ms` past what an `i64` of microseconds holds (a damaged or foreign
/// line) is read as the latest time there is, not wrapped into a date long past — and, with
/// overflow checks on, not a panic of `run.get`. Found by the `runlog_lines` fuzz target
/// (`tests/corpus/runlog_lines/crash-*`).
#[test]
fn a_logged_time_past_the_representable_is_clamped_not_wrapped() {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir_all(d.path().join("far")).unwrap();
    for ms in [u64::MAX, 179_561_060_905_765_804, i64::MAX as u64] {
        let line = format!("{{\"node_id\": \"n\", \"attempt\": 1, \"logged_at_ms\": {ms}}}\n");
        fs::write(d.path().join("far").join("details.jsonl"), line).unwrap();
        let run = open(d.path()).get("far").unwrap();
        let started = run["summary"]["started_at"].as_str().unwrap().to_owned();
        assert_eq!(
            started,
            crate::timefmt::format_z(i64::MAX),
            "logged_at_ms {ms}"
        );
        assert_eq!(run["nodes"], 1);
    }
}

/// A link planted at a run's directory or at one of its files refuses that run's requests
/// (`forbidden`) and touches nothing outside; other runs keep logging. A failed fsync of
/// `runs/` after making a run's directory poisons the run log.
#[test]
fn a_link_at_a_run_is_refused_alone_and_a_failed_directory_fsync_poisons() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let faults = Faults::recorder();
    let log = RunLog::open(&runs, faults.clone()).unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("details.jsonl"), b"{\"torn").unwrap();
    std::os::unix::fs::symlink(outside.path(), runs.join("linked")).unwrap();
    fs::create_dir(runs.join("file-linked")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("details.jsonl"),
        runs.join("file-linked/details.jsonl"),
    )
    .unwrap();
    for run in ["linked", "file-linked"] {
        let e = log.log_node(run, detail("a", 1, 10)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Forbidden, "{run}: {e}");
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        assert_eq!(log.get(run).unwrap_err().kind(), ErrorKind::Forbidden);
    }
    assert_eq!(
        fs::read(outside.path().join("details.jsonl")).unwrap(),
        b"{\"torn"
    );
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 1);
    log.log_node("other", detail("a", 1, 10)).unwrap();
    // The prune passes links by: they are no run's directory.
    std::thread::sleep(Duration::from_millis(20));
    log.prune(Duration::ZERO, &|_: &str| false, false).unwrap();
    assert!(fs::symlink_metadata(runs.join("linked")).is_ok());
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 1);
    faults.arm(Some(Op::FsyncDir), 1, FaultMode::FailOnce(5));
    let e = log.log_node("new-run", detail("a", 1, 10)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Storage, "{e}");
    let e = log.log_node("other", detail("b", 1, 10)).unwrap_err();
    assert!(
        e.to_string()
            .contains("writes are refused until the daemon restarts"),
        "{e}"
    );
}

/// Two processes logging one run (two loggers, each numbering its visits of a node from its
/// own count) name themselves with `writer`: their visit 1 of the same node are two entries,
/// not one replacing the other; each one's retry still writes nothing; `ensure_node` checks
/// the writer's own entries (the other process's completion does not stand in for this one's
/// visit), and without a writer any entry of the node does, as before.
#[test]
fn writers_keep_their_visits_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path());
    let by = |writer: &str, attempt: i64, tokens: i64| {
        let mut d = detail("n", attempt, tokens);
        d.insert("writer".into(), json!(writer));
        d
    };
    for (w, tokens) in [("a", 10), ("b", 20)] {
        let r = log.log_node("r", by(w, 1, tokens)).unwrap();
        assert_eq!(
            (r["written"].clone(), r["replaced"].clone()),
            (json!(true), json!(false)),
            "{w}"
        );
    }
    // Retries (even from a fresh view) write nothing.
    let log = open(tmp.path());
    for (w, tokens) in [("a", 10), ("b", 20)] {
        assert_eq!(
            log.log_node("r", by(w, 1, tokens)).unwrap()["written"],
            json!(false)
        );
    }
    // ensure_node: writer c has no entry of n (a's and b's are not c's).
    let mut fallback = obj(json!({"success": true, "attempt": 1, "writer": "c"}));
    assert_eq!(
        log.ensure_node("r", "n", fallback.clone()).unwrap()["written"],
        json!(true)
    );
    assert_eq!(
        log.ensure_node("r", "n", fallback.clone()).unwrap()["written"],
        json!(false)
    );
    // Writer a has one (its completion): nothing written.
    fallback.insert("writer".into(), json!("a"));
    assert_eq!(
        log.ensure_node("r", "n", fallback).unwrap()["written"],
        json!(false)
    );
    // No writer: any entry of the node counts.
    let plain = obj(json!({"success": true}));
    assert_eq!(
        log.ensure_node("r", "n", plain).unwrap()["written"],
        json!(false)
    );
    // Steps: visit 1's step 0 of each writer.
    for w in ["a", "b"] {
        let step = obj(json!({"node_id": "n", "step_index": 0, "writer": w, "llm_text": w}));
        assert_eq!(
            log.log_step("r", step).unwrap()["written"],
            json!(true),
            "{w}"
        );
    }
    assert_eq!(lines(tmp.path(), "r", "details.jsonl").len(), 3);
    assert_eq!(lines(tmp.path(), "r", "tool_logs.jsonl").len(), 2);
    let s = log.end("r", "success", &EndFields::default()).unwrap()["summary"].clone();
    assert_eq!(s["total_input_tokens"], json!(30));
    // A writer must be a short non-empty string.
    for bad in [json!(""), json!(7), json!("x".repeat(65))] {
        let mut d = detail("m", 1, 1);
        d.insert("writer".into(), bad.clone());
        let e = log.log_node("r2", d).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidParams, "{bad}");
        assert!(e.to_string().contains("writer"), "{e}");
    }
}
