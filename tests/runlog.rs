//! Run logs through the real daemon and across processes: the hive race with threads,
//! connections and processes at once; restart between log_node and ensure_node; every `run.*`
//! method; the R2 annotation driven by tool-call records.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::path::Path;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;
use common::*;

const ROUNDS: u64 = 60;
/// Each round starts at a shared wall-clock instant: a barrier across processes.
const SLOT_MS: u64 = 40;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn wait_until(ms: u64) {
    let now = now_ms();
    if ms > now {
        thread::sleep(Duration::from_millis(ms - now));
    }
}

fn completion(node: &str) -> Value {
    json!({"node_id": node, "node_name": node, "node_type": "llm", "success": true,
           "attempt": 1, "input_tokens": 100, "output_tokens": 40, "tokens_used": 140})
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

/// The child side of the race: log into `HF_RACE_RUNS` directly (no daemon, same locks),
/// one call per round at the shared instants.
#[test]
#[ignore = "run by the_hive_race_with_threads_connections_and_processes"]
fn race_child() {
    let (Ok(runs), Ok(start), Ok(me)) = (
        std::env::var("HF_RACE_RUNS"),
        std::env::var("HF_RACE_START"),
        std::env::var("HF_RACE_ME"),
    ) else {
        return;
    };
    let start: u64 = start.parse().unwrap();
    let me: u64 = me.parse().unwrap();
    // On the PostgreSQL backend the process writes the shared database directly, as the
    // offline CLI does.
    let log = match std::env::var("HF_RACE_PG") {
        Ok(url) => {
            let toml = format!("[backend]\nkind = \"postgres\"\nurl = \"{url}\"\n");
            let config: holdfast::config::Config = toml::from_str(&toml).unwrap();
            let db = holdfast::pg::Db::new(config.postgres().unwrap().unwrap()).unwrap();
            holdfast::runlog::RunLog::open_shared(db)
        }
        Err(_) => holdfast::runlog::RunLog::open(Path::new(&runs), Default::default()).unwrap(),
    };
    for r in 0..ROUNDS {
        wait_until(start + r * SLOT_MS);
        let node = format!("node-{r}");
        if me % 2 == 0 {
            log.log_node("race", obj(completion(&node))).unwrap();
        } else {
            log.ensure_node("race", &node, obj(json!({"success": true})))
                .unwrap();
        }
    }
}

/// hive's race, everywhere at once: per round, 4 connections to the daemon (each its own
/// thread) and 2 processes writing the log directly call `log_node` / `ensure_node` for the
/// same node at the same instant. Exactly one line per node, every round; the summary's tokens
/// are the single entries'. On PostgreSQL: two daemons ("hosts") on one database, 16
/// connections split between them, and the 2 processes on the database directly.
#[test]
fn the_hive_race_with_threads_connections_and_processes() {
    let mut env = DaemonEnv::new("");
    let d = env.start();
    let mut env_b = env.on_postgres().then(|| DaemonEnv::new_sharing("", &env));
    let d_b = env_b.as_mut().map(DaemonEnv::start);
    let racers = if d_b.is_some() { 16 } else { 4 };
    let runs = env.data_dir.join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    let start = now_ms() + 1500;
    let children: Vec<_> = (0..2)
        .map(|me| {
            let mut c = reexec("race_child", &env.home);
            c.env("HF_RACE_RUNS", &runs)
                .env("HF_RACE_START", start.to_string())
                .env("HF_RACE_ME", me.to_string());
            if env.on_postgres() {
                c.env("HF_RACE_PG", pg_url_of(&env.backend));
            }
            c.spawn().unwrap()
        })
        .collect();
    let conns: Vec<_> = (0..racers)
        .map(|t| {
            let socket = match &d_b {
                Some(b) if t % 4 >= 2 => b.socket.clone(),
                _ => d.socket.clone(),
            };
            thread::spawn(move || {
                let mut c = Conn::open(&socket);
                for r in 0..ROUNDS {
                    wait_until(start + r * SLOT_MS);
                    let node = format!("node-{r}");
                    if t % 2 == 0 {
                        c.ok(
                            "run.log_node",
                            json!({"run_id": "race", "detail": completion(&node)}),
                        );
                    } else {
                        c.ok(
                            "run.ensure_node",
                            json!({"run_id": "race", "node_id": node,
                                   "detail": {"success": true}}),
                        );
                    }
                }
            })
        })
        .collect();
    for t in conns {
        t.join().unwrap();
    }
    for mut ch in children {
        assert!(ch.wait().unwrap().success());
    }
    // The lines as stored: the file's, or the database's rows of the run's details.
    let lines: Vec<Value> = if env.on_postgres() {
        pg_pairs(
            &pg_url_of(&env.backend),
            "SELECT body, pos FROM hf_run_log_lines WHERE run_id = 'race' AND kind = 0",
        )
        .into_iter()
        .map(|(body, _)| serde_json::from_str(&body).unwrap())
        .collect()
    } else {
        std::fs::read_to_string(runs.join("race/details.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for v in &lines {
        *per_node
            .entry(v["node_id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let duplicates: usize = per_node.values().map(|n| n - 1).sum();
    println!(
        "hive race: {ROUNDS} rounds x ({racers} connections on {} daemon(s) + 2 processes), \
         log_node vs ensure_node: {} lines for {} nodes, {duplicates} duplicates",
        if d_b.is_some() { 2 } else { 1 },
        lines.len(),
        per_node.len()
    );
    assert_eq!(per_node.len(), ROUNDS as usize);
    assert_eq!(duplicates, 0);
    let mut c = Conn::open(&d.socket);
    let s = c.ok("run.end", json!({"run_id": "race", "status": "success"}));
    assert_eq!(s["summary"]["total_nodes_executed"], json!(ROUNDS));
    assert_eq!(s["summary"]["total_input_tokens"], json!(ROUNDS * 100));
    assert_eq!(s["summary"]["total_output_tokens"], json!(ROUNDS * 40));
    d.stop();
    if let Some(b) = d_b {
        b.stop();
    }
}

/// A daemon restart between `log_node` and a later `ensure_node`: still one entry.
#[test]
fn a_daemon_restart_between_log_node_and_ensure_node_keeps_one_entry() {
    let mut env = DaemonEnv::new("");
    let d = env.start();
    let mut c = Conn::open(&d.socket);
    c.ok(
        "run.log_node",
        json!({"run_id": "rs", "detail": completion("n")}),
    );
    drop(c);
    d.stop();
    let d = env.start();
    let mut c = Conn::open(&d.socket);
    let r = c.ok(
        "run.ensure_node",
        json!({"run_id": "rs", "node_id": "n", "detail": {}}),
    );
    assert_eq!(r["written"], json!(false));
    let g = c.ok("run.get", json!({"run_id": "rs"}));
    assert_eq!(g["nodes"], json!(1));
    d.stop();
}

/// Two loggers of one run naming themselves (`writer`), on either backend, through a daemon
/// restart: each one's visit 1 of a node is an entry, each one's retry writes nothing, and
/// `run.ensure_node` checks the writer's own entries.
#[test]
fn writers_keep_their_entries_apart_on_either_backend() {
    let mut env = DaemonEnv::new("");
    let d = env.start();
    let mut c = Conn::open(&d.socket);
    let by = |w: &str, tokens: i64| {
        let mut d = completion("n");
        d["writer"] = json!(w);
        d["input_tokens"] = json!(tokens);
        d
    };
    for (w, t) in [("a", 1), ("b", 2)] {
        let r = c.ok("run.log_node", json!({"run_id": "w", "detail": by(w, t)}));
        assert_eq!(r["written"], json!(true), "{w}");
    }
    drop(c);
    d.stop();
    let d = env.start();
    let mut c = Conn::open(&d.socket);
    for (w, t) in [("a", 1), ("b", 2)] {
        let r = c.ok("run.log_node", json!({"run_id": "w", "detail": by(w, t)}));
        assert_eq!(r["written"], json!(false), "{w}");
    }
    let ensure = |w: &str| json!({"run_id": "w", "node_id": "n", "detail": {"writer": w}});
    assert_eq!(
        c.ok("run.ensure_node", ensure("a"))["written"],
        json!(false)
    );
    assert_eq!(c.ok("run.ensure_node", ensure("c"))["written"], json!(true));
    let g = c.ok("run.get", json!({"run_id": "w"}));
    let writers: Vec<&Value> = g["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["writer"])
        .collect();
    assert_eq!(writers, [&json!("a"), &json!("b"), &json!("c")], "{g}");
    d.stop();
}

/// Every `run.*` method once, with its result shape and its errors.
#[test]
fn every_run_method_once() {
    let mut env = DaemonEnv::new("");
    let d = env.start();
    let mut c = Conn::open(&d.socket);
    let mut seen = std::collections::BTreeSet::new();
    let mut ok = |c: &mut Conn, m: &'static str, p: Value| {
        seen.insert(m);
        c.ok(m, p)
    };
    let r = ok(
        &mut c,
        "run.log_node",
        json!({"run_id": "m", "detail": completion("plan")}),
    );
    assert_eq!(r["written"], json!(true));
    assert!(r["seq"].as_u64().unwrap() >= 1);
    let r = ok(
        &mut c,
        "run.ensure_node",
        json!({"run_id": "m", "node_id": "act"}),
    );
    assert_eq!(r["written"], json!(true));
    let r = ok(
        &mut c,
        "run.log_step",
        json!({"run_id": "m", "step": {"node_id": "plan", "step_index": 0, "llm_text": "hi"}}),
    );
    assert_eq!(r["written"], json!(true));
    ok(
        &mut c,
        "run.tool_begin",
        json!({"run_id": "m", "tool_call_id": "c1", "name": "search", "input": {"q": 1}}),
    );
    ok(
        &mut c,
        "run.tool_end",
        json!({"run_id": "m", "tool_call_id": "c1", "result": "r", "is_error": false}),
    );
    let g = ok(&mut c, "run.get", json!({"run_id": "m"}));
    assert_eq!(
        (&g["nodes"], &g["steps"], &g["tool_calls"], &g["ended"]),
        (&json!(2), &json!(1), &json!(1), &json!(false)),
        "{g}"
    );
    assert_eq!(g["details"].as_array().unwrap().len(), 2);
    let e = ok(
        &mut c,
        "run.end",
        json!({"run_id": "m", "status": "success", "agent_id": "agent-1"}),
    );
    assert_eq!(e["written"], json!(true));
    assert_eq!(e["summary"]["node_path"], json!(["plan", "act"]));
    let l = ok(&mut c, "run.list", json!({"status": "success"}));
    assert_eq!(l["runs"].as_array().unwrap().len(), 1);
    // Idle for "more than zero days": at least a clock tick after the last write.
    thread::sleep(Duration::from_millis(20));
    let p = ok(
        &mut c,
        "run.prune",
        json!({"older_than_days": 0, "dry_run": true}),
    );
    assert_eq!(p["dry_run"], json!(true));
    assert_eq!(p["pruned"].as_array().unwrap().len(), 1);
    // A dry run deleted nothing.
    assert_eq!(
        ok(&mut c, "run.list", json!({}))["runs"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    if !env.on_postgres() {
        assert!(env.data_dir.join("runs/m").exists());
    }

    // Errors: after the end, unknown run, hostile id, bad params.
    let kind = |r: &Value| r["error"]["data"]["kind"].as_str().unwrap_or("").to_owned();
    let late = c.call(
        "run.log_node",
        json!({"run_id": "m", "detail": completion("x")}),
    );
    assert_eq!(kind(&late), "conflict", "{late}");
    // run.start reopens the ended run (hive's resurrection): the late node is taken, and the
    // next end summarizes all three; on the open run it removes nothing.
    let s = ok(&mut c, "run.start", json!({"run_id": "m"}));
    assert_eq!(s, json!({"reopened": true}));
    assert_eq!(
        c.ok("run.start", json!({"run_id": "m"})),
        json!({"reopened": false})
    );
    c.ok(
        "run.log_node",
        json!({"run_id": "m", "detail": completion("x")}),
    );
    let again = c.ok("run.end", json!({"run_id": "m", "status": "success"}));
    assert_eq!(again["written"], json!(true));
    assert_eq!(
        again["summary"]["total_nodes_executed"],
        json!(3),
        "{again}"
    );
    let missing = c.call("run.get", json!({"run_id": "nope"}));
    assert_eq!(kind(&missing), "not_found", "{missing}");
    let hostile = c.call(
        "run.log_node",
        json!({"run_id": "../../etc", "detail": completion("x")}),
    );
    assert_eq!(kind(&hostile), "invalid_params", "{hostile}");
    let bad = c.call(
        "run.end",
        json!({"run_id": "m", "status": "ok", "extra": 1}),
    );
    assert_eq!(kind(&bad), "invalid_params", "{bad}");

    let all: std::collections::BTreeSet<&str> = holdfast::ipc::handlers::METHODS
        .iter()
        .copied()
        .filter(|m| m.starts_with("run."))
        .collect();
    assert_eq!(seen, all, "run methods not exercised");
    println!("every run method: {}/{} exercised", seen.len(), all.len());
    d.stop();
}

/// A stream interrupted with three completed tool calls: the run log says the first ran, the
/// second began and never ended, the third never started; the R2 plan says so per call.
#[test]
fn tool_call_records_drive_the_r2_annotation() {
    let mut env = DaemonEnv::new("");
    let d = env.start();
    let mut c = Conn::open(&d.socket);
    let b = c.ok("stream.begin", json!({"run_id": "r2", "model": "m"}));
    let sid = b["stream_id"].clone();
    let mut events = Vec::new();
    for (id, name) in [("c1", "search"), ("c2", "write_file"), ("c3", "send_mail")] {
        events.push(json!({"type": "tool_call_delta", "id": id, "name": name,
                           "arguments_delta": "{\"x\": 1}"}));
        events.push(json!({"type": "tool_call_end", "id": id}));
    }
    c.ok(
        "stream.append",
        json!({"run_id": "r2", "stream_id": sid, "seq": 1, "events": events}),
    );
    let before = c.ok(
        "stream.interrupt",
        json!({"run_id": "r2", "stream_id": sid, "cause": "connection_reset"}),
    );
    assert_eq!(before["plan"], json!("R2"), "{before}");
    let exec = |plan: &Value| -> Vec<(String, String)> {
        plan["completed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["id"].as_str().unwrap().to_owned(),
                    c["execution"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    // Before the run logs any tool call: nothing can be said.
    assert!(
        exec(&before).iter().all(|(_, e)| e == "unknown"),
        "{before}"
    );
    c.ok(
        "run.tool_begin",
        json!({"run_id": "r2", "tool_call_id": "c1", "name": "search", "input": {"x": 1}}),
    );
    c.ok(
        "run.tool_end",
        json!({"run_id": "r2", "tool_call_id": "c1", "result": "found", "is_error": false}),
    );
    c.ok(
        "run.tool_begin",
        json!({"run_id": "r2", "tool_call_id": "c2", "name": "write_file", "input": {"x": 1}}),
    );
    // A new process resumes: the plan it gets annotates each call.
    let r = c.ok("stream.resume", json!({"run_id": "r2", "model": "m"}));
    let got = exec(&r["plan"]);
    println!("R2 after resume: {got:?}");
    assert_eq!(
        got,
        [
            ("c1".into(), "executed".into()),
            ("c2".into(), "began".into()),
            ("c3".into(), "not_executed".into())
        ]
    );
    // Both plans are in the run's timeline, with their calls' executions.
    let g = c.ok("run.get", json!({"run_id": "r2"}));
    let rec = g["recovery_log"].as_array().unwrap();
    assert_eq!(rec.len(), 2, "{g}");
    assert_eq!(
        (&rec[0]["event"], &rec[0]["plan"], &rec[0]["cause"]),
        (
            &json!("interrupt"),
            &json!("R2"),
            &json!("connection_reset")
        )
    );
    assert_eq!(rec[1]["event"], json!("resume"));
    assert_eq!(rec[1]["completed"][1]["execution"], json!("began"));
    assert_eq!(g["interruptions"], json!(1));
    let show = run(env.holdfast(&["runs", "show", "r2"]), b"");
    println!("{}", show.stdout);
    assert!(
        show.stdout
            .contains("plan  resume R2 after resumed_from_checkpoint: completed c1 executed, c2 began, c3 not_executed"),
        "{}",
        show.stdout
    );
    d.stop();
}

/// `holdfast runs list | show | summary | prune`, with the daemon running (reading the files
/// it writes, under the same locks) and without it.
#[test]
fn the_runs_cli_with_and_without_the_daemon() {
    let mut env = DaemonEnv::new("");
    let d = env.start();
    let mut c = Conn::open(&d.socket);
    for (run, ok) in [("cli-good", true), ("cli-bad", false)] {
        let mut det = completion("plan");
        det["success"] = json!(ok);
        if !ok {
            det["error"] = json!("search failed");
        }
        c.ok("run.log_node", json!({"run_id": run, "detail": det}));
        c.ok(
            "run.log_step",
            json!({"run_id": run, "step": {"node_id": "plan", "step_index": 0,
                                           "llm_text": "thinking about it"}}),
        );
        c.ok(
            "run.tool_begin",
            json!({"run_id": run, "tool_call_id": "t1", "name": "search"}),
        );
    }
    c.ok(
        "run.end",
        json!({"run_id": "cli-good", "status": "success"}),
    );
    let json_of = |args: &[&str]| -> Value {
        let o = run(env.holdfast(args), b"");
        assert_eq!(o.code, 0, "{args:?}: {}", o.stderr);
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {}", o.stdout))
    };
    let l = json_of(&["runs", "list", "--json"]);
    assert_eq!(l["runs"].as_array().unwrap().len(), 2, "{l}");
    let l = json_of(&["runs", "list", "--status", "running", "--json"]);
    assert_eq!(l["runs"][0]["run_id"], json!("cli-bad"), "{l}");
    let s = json_of(&["runs", "summary", "cli-bad", "--json"]);
    assert_eq!(s["needs_attention"], json!(true), "{s}");
    // hive's words, so hive's tooling shows what hive's own logger would have written.
    assert_eq!(
        s["attention_reasons"],
        json!(["Node plan failed: search failed"]),
        "{s}"
    );
    let table = run(env.holdfast(&["runs", "list"]), b"");
    println!("{}", table.stdout);
    assert!(table.stdout.contains("cli-bad") && table.stdout.contains("yes (1)"));
    let show = run(env.holdfast(&["runs", "show", "cli-good"]), b"");
    println!("{}", show.stdout);
    assert!(
        show.stdout.contains("node  plan (attempt 1) ok"),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains("tool  t1 begin search"),
        "{}",
        show.stdout
    );
    let missing = run(env.holdfast(&["runs", "show", "nope"]), b"");
    assert_eq!(missing.code, 3, "{}", missing.stderr);
    // Prune through the daemon: nothing is a day old.
    let p = json_of(&["runs", "prune", "--older-than", "1", "--json"]);
    assert_eq!(p["pruned"], json!([]), "{p}");
    drop(c);
    d.stop();
    // Offline: the same answers from the files; a prune of everything idle.
    let l = json_of(&["runs", "list", "--json"]);
    assert_eq!(l["runs"].as_array().unwrap().len(), 2, "{l}");
    thread::sleep(Duration::from_millis(20));
    let dry = json_of(&["runs", "prune", "--older-than", "0", "--dry-run", "--json"]);
    assert_eq!(dry["pruned"].as_array().unwrap().len(), 2, "{dry}");
    let p = run(env.holdfast(&["runs", "prune", "--older-than", "0"]), b"");
    assert_eq!(p.code, 0, "{}", p.stderr);
    assert!(p.stdout.contains("deleted 2 run(s)"), "{}", p.stdout);
    let l = json_of(&["runs", "list", "--json"]);
    assert_eq!(l["runs"], json!([]));
}
