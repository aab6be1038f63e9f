//! A plugin grant's `runs` (`[plugins.NAME] runs = [...]`) through the real daemon and its
//! socket: a plugin limited to `agent-a-*` can do everything on its runs and nothing on
//! another agent's, whether its connection is served by tokio or by the append lane; listings
//! show it only its runs; a connection naming no plugin still sees all; and patterns that can
//! match no run id stop the daemon at start. Backend-neutral: with
//! `HOLDFAST_TEST_BACKEND=postgres` (scripts/test.sh) the same assertions run on PostgreSQL.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;
use common::*;

use holdfast::api::METHODS;

const GRANTS: &str = r#"
[plugins.agent-a]
stores = ["default"]
methods = ["stream.*", "checkpoint.*", "run.*"]
runs = ["agent-a-*"]

[plugins.watcher]
stores = []
methods = ["stream.subscribe", "stream.get", "stream.list"]
runs = ["agent-b-1"]

[plugins.nothing]
stores = []
methods = ["stream.*", "run.*"]
runs = []
"#;

/// The run another agent owns, and the one of its runs that has only a run log.
const VICTIM: &str = "agent-b-1";
const VICTIM_LOG_ONLY: &str = "agent-b-log";

/// The methods that enumerate runs instead of naming one: checked for what they show.
const LISTINGS: &[&str] = &["stream.list", "run.list", "run.prune"];

/// Every method of the families a grant's `runs` scopes that names a run: taken from the
/// daemon's own method table, so a method added later is tried here without anyone listing
/// it (and fails below until it is refused outside the grant and served inside it).
fn run_methods() -> Vec<&'static str> {
    METHODS
        .iter()
        .copied()
        .filter(|m| {
            matches!(
                m.split_once('.').map(|(f, _)| f),
                Some("stream" | "checkpoint" | "run")
            )
        })
        .filter(|m| !LISTINGS.contains(m))
        .collect()
}

/// Params with which `method` succeeds on a run prepared by [`prepare`] (`stream_id` its
/// holder, `seq` its next seq). A method unknown here gets `{run_id}` alone: if it needs
/// more, the daemon answers `invalid_params` and the test says to add it here.
fn params(method: &str, run: &str, stream_id: &str, seq: u64) -> Value {
    match method {
        "stream.begin" => json!({"run_id": run, "takeover": true}),
        "stream.append" => json!({"run_id": run, "stream_id": stream_id, "seq": seq,
            "events": [{"type": "text", "text": "more"}]}),
        "stream.interrupt" => json!({"run_id": run, "stream_id": stream_id, "cause": "goaway"}),
        "stream.commit" => json!({"run_id": run, "stream_id": stream_id,
            "final_message": {"role": "assistant", "content": "done"}}),
        "stream.abort" => json!({"run_id": run, "stream_id": stream_id, "reason": "test"}),
        "checkpoint.put" => json!({"run_id": run, "snapshot": {"partial_text": "half"}}),
        "run.log_node" => json!({"run_id": run, "detail": {"node_id": "n2"}}),
        "run.ensure_node" => json!({"run_id": run, "node_id": "n3"}),
        "run.log_step" => json!({"run_id": run, "step": {"node_id": "n1", "step_index": 0}}),
        "run.tool_begin" => json!({"run_id": run, "tool_call_id": "t2", "name": "search"}),
        "run.tool_end" => json!({"run_id": run, "tool_call_id": "t1", "result": "ok"}),
        "run.end" => json!({"run_id": run, "status": "success"}),
        _ => json!({"run_id": run}),
    }
}

/// A run with something of every kind on it (an active stream with one event, a checkpoint,
/// a logged node, a begun tool call), made on `c`: its holder's stream id and next seq.
fn prepare(c: &mut Conn, run: &str) -> (String, u64) {
    let sid = c.ok("stream.begin", json!({"run_id": run}))["stream_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let a = c.ok(
        "stream.append",
        json!({"run_id": run, "stream_id": sid, "seq": 1, "events": [{"type": "text", "text": "first"}]}),
    );
    assert_eq!(a, json!({"acked_seq": 1}), "{run}");
    c.ok(
        "checkpoint.put",
        json!({"run_id": run, "snapshot": {"partial_text": "first"}}),
    );
    c.ok(
        "run.log_node",
        json!({"run_id": run, "detail": {"node_id": "n1", "success": true}}),
    );
    c.ok(
        "run.tool_begin",
        json!({"run_id": run, "tool_call_id": "t1", "name": "read_file"}),
    );
    (sid, 2)
}

fn kind(e: &Value) -> &str {
    e["data"]["kind"].as_str().unwrap_or("")
}

/// `c` bound to plugin `name`; `hello`'s answer.
fn bound(socket: &Path, name: &str) -> (Conn, Value) {
    let mut c = Conn::connect(socket);
    let h = c.ok("hello", json!({"client": "run-grants", "plugin": name}));
    (c, h)
}

/// `admin.status`'s count of connections the append lane reads.
fn lane_connections(socket: &Path) -> u64 {
    Conn::open(socket).ok("admin.status", json!({}))["lane_connections"]
        .as_u64()
        .expect("admin.status says lane_connections")
}

/// Wait until the append lane reads `n` connections (it adopts one right after its first
/// append; the count follows within a turn).
fn wait_lane(socket: &Path, n: u64) {
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

/// Every run-naming method on the victim's run, from `c` (bound to `agent-a`): each one
/// `forbidden`, saying whose grant and which patterns, never the run id asked for.
fn every_method_is_refused_on_the_victim(c: &mut Conn, victim_sid: &str, path: &str) -> usize {
    let mut refused = 0;
    for m in run_methods() {
        let e = c.err(m, params(m, VICTIM, victim_sid, 2));
        assert_eq!(
            (e["code"].as_i64(), kind(&e)),
            (Some(-32003), "forbidden"),
            "{m} of {VICTIM} ({path}): {e}"
        );
        let msg = e["message"].as_str().unwrap();
        assert!(
            msg.contains("[plugins.agent-a]") && msg.contains(r#"["agent-a-*"]"#),
            "{m}: the refusal names the grant and its patterns: {msg}"
        );
        assert!(
            !msg.contains(VICTIM),
            "{m}: the run id is not echoed: {msg}"
        );
        refused += 1;
    }
    // An append whose events the fast reader does not take goes through the general parse:
    // refused there too, before its events are judged.
    let odd = json!({"run_id": VICTIM, "stream_id": victim_sid, "seq": 2,
        "events": [{"type": "text", "text": "x", "id": null}]});
    let e = c.err("stream.append", odd);
    assert_eq!(kind(&e), "forbidden", "append, general path ({path}): {e}");
    // A run id that does not exist at all is refused the same way: a refusal tells nothing
    // about which runs exist.
    let e = c.err("stream.get", json!({"run_id": "agent-b-never"}));
    assert_eq!(kind(&e), "forbidden", "{e}");
    refused + 2
}

#[test]
fn a_plugin_limited_to_its_runs_can_do_everything_on_them_and_nothing_on_others() {
    let mut env = DaemonEnv::new(GRANTS);
    let d = env.start();

    // The victim: another agent's active run with an event, a checkpoint and a run log, and
    // a run of its with only a log, made by a connection naming no plugin.
    let mut admin = Conn::open(&d.socket);
    let (victim_sid, _) = prepare(&mut admin, VICTIM);
    admin.ok(
        "run.log_node",
        json!({"run_id": VICTIM_LOG_ONLY, "detail": {"node_id": "n1"}}),
    );
    wait_lane(&d.socket, 1);

    // hello says what the grant covers, runs included; an unbound connection has every run.
    let (mut fresh, h) = bound(&d.socket, "agent-a");
    assert_eq!(
        h["grant"],
        json!({"plugin": "agent-a", "stores": ["default"], "runs": ["agent-a-*"]}),
        "{h}"
    );
    let h = Conn::connect(&d.socket).ok("hello", json!({}));
    assert_eq!(h["grant"]["runs"], json!(["*"]), "{h}");

    // On a connection tokio serves (no append of its own yet): every method refused.
    let on_tokio = every_method_is_refused_on_the_victim(&mut fresh, &victim_sid, "tokio");
    assert_eq!(
        lane_connections(&d.socket),
        1,
        "a refused append moves no connection to the lane"
    );

    // The same connection once the append lane reads it (after an append to its own run).
    prepare(&mut fresh, "agent-a-1");
    wait_lane(&d.socket, 2);
    let on_lane = every_method_is_refused_on_the_victim(&mut fresh, &victim_sid, "lane");

    // Each refusal is in the audit log: the plugin, `forbidden`, and the run it named. A
    // refusal's answer does not wait for its record: wait for the records (10 s at most).
    let audited_refusals = || {
        let out = common::run(env.holdfast(&["audit", "--json"]), b"");
        assert_eq!(out.code, 0, "{out}");
        let log: Value = serde_json::from_str(&out.stdout).unwrap();
        let n = log
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["result"] == "forbidden"
                    && r["plugin"] == "agent-a"
                    && r["detail"]["run_id"]
                        .as_str()
                        .is_some_and(|run| run.starts_with("agent-b"))
            })
            .count();
        (n, log)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let (audited, log) = loop {
        let (n, log) = audited_refusals();
        if n >= on_tokio + on_lane || Instant::now() > deadline {
            break (n, log);
        }
        thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(audited, on_tokio + on_lane, "audited refusals: {log}");

    // The victim is as it was: not taken over (its holder still appends), not appended to,
    // not ended, its checkpoint and log unchanged.
    let g = admin.ok("stream.get", json!({"run_id": VICTIM}));
    assert_eq!(
        (g["epoch"].as_u64(), g["next_seq"].as_u64()),
        (Some(1), Some(2)),
        "{g}"
    );
    assert_eq!(
        admin.ok(
            "stream.append",
            json!({"run_id": VICTIM, "stream_id": victim_sid, "seq": 2,
                "events": [{"type": "text", "text": "still mine"}]}),
        ),
        json!({"acked_seq": 2})
    );
    let ck = admin.ok("checkpoint.get", json!({"run_id": VICTIM}));
    assert_eq!(ck["partial_text"], "first", "{ck}");
    let log = admin.ok("run.get", json!({"run_id": VICTIM}));
    assert_eq!(
        (
            log["nodes"].as_u64(),
            log["steps"].as_u64(),
            log["ended"].as_bool()
        ),
        (Some(1), Some(0), Some(false)),
        "{log}"
    );
    assert_eq!(log["tool_log"].as_array().map(Vec::len), Some(1), "{log}");

    // Everything on its own runs: each method on a run of its own, prepared by the plugin.
    let mut served = Vec::new();
    for (i, m) in run_methods().into_iter().enumerate() {
        let run = format!("agent-a-m{i}");
        let (sid, seq) = prepare(&mut fresh, &run);
        let r = fresh.call(m, params(m, &run, &sid, seq));
        assert!(
            r.get("result").is_some(),
            "{m} on the plugin's own run {run} must be served (a method new to this test \
             needs its params in `params`): {r}"
        );
        served.push(m);
    }
    assert_eq!(
        fresh.ok("stream.get", json!({"run_id": "agent-a-1"}))["epoch"],
        1
    );

    // No event of the victim's run reached the plugin's connection (its own subscription's
    // did).
    admin.ok(
        "stream.append",
        json!({"run_id": VICTIM, "stream_id": victim_sid, "seq": 3,
            "events": [{"type": "text", "text": "after"}]}),
    );
    let mut own_events = 0;
    while let Some(ev) = fresh.next_event(Duration::from_millis(300)) {
        assert_ne!(ev["run_id"], VICTIM, "an event of another run: {ev}");
        own_events += 1;
    }
    assert!(own_events > 0, "the plugin's own subscription delivered");

    // Listings: the plugin's show its runs only (so their counts are its runs' counts); the
    // unbound connection's show everything.
    let ids = |v: &Value| -> BTreeSet<String> {
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let mine = |all: &BTreeSet<String>| -> BTreeSet<String> {
        all.iter()
            .filter(|id| id.starts_with("agent-a-"))
            .cloned()
            .collect()
    };
    let all_streams = admin.ok("stream.list", json!({}));
    let plugin_streams = fresh.ok("stream.list", json!({}));
    assert!(ids(&all_streams).contains(VICTIM), "{all_streams}");
    assert!(all_streams["journal"].is_object(), "{all_streams}");
    assert_eq!(
        ids(&plugin_streams),
        mine(&ids(&all_streams)),
        "{plugin_streams}"
    );
    assert!(!ids(&plugin_streams).is_empty());
    assert!(
        plugin_streams["journal"].is_null(),
        "the journal's counters count every run's appends: {plugin_streams}"
    );
    let all_logs = admin.ok("run.list", json!({}));
    let plugin_logs = fresh.ok("run.list", json!({}));
    assert!(
        ids(&all_logs).contains(VICTIM) && ids(&all_logs).contains(VICTIM_LOG_ONLY),
        "{all_logs}"
    );
    assert_eq!(ids(&plugin_logs), mine(&ids(&all_logs)));
    assert!(!ids(&plugin_logs).is_empty());
    let ended = fresh.ok("run.list", json!({"status": "success"}));
    assert!(
        ids(&ended).iter().all(|id| id.starts_with("agent-a-")),
        "{ended}"
    );

    // run.prune: the plugin's prune names and deletes only its own idle runs; the victim's
    // idle log, which an unbound prune would delete, stays.
    thread::sleep(Duration::from_millis(20));
    let pruned_ids = |v: &Value| -> BTreeSet<String> {
        v["pruned"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let would = fresh.ok("run.prune", json!({"older_than_days": 0, "dry_run": true}));
    let would_ids = pruned_ids(&would);
    assert!(
        !would_ids.is_empty() && would_ids.iter().all(|id| id.starts_with("agent-a-")),
        "{would}"
    );
    let gone = fresh.ok("run.prune", json!({"older_than_days": 0}));
    assert_eq!(pruned_ids(&gone), would_ids, "{gone}");
    admin.ok("run.get", json!({"run_id": VICTIM_LOG_ONLY}));
    let unbound = admin.ok("run.prune", json!({"older_than_days": 0, "dry_run": true}));
    assert!(
        pruned_ids(&unbound).contains(VICTIM_LOG_ONLY),
        "the victim's log was prunable, by a grant that covers it: {unbound}"
    );

    // An exact run id grants that run only; `runs = []` grants none.
    let (mut watcher, h) = bound(&d.socket, "watcher");
    assert_eq!(h["grant"]["runs"], json!([VICTIM]), "{h}");
    let sub = watcher.ok("stream.subscribe", json!({"run_id": VICTIM}));
    assert_eq!(sub["run_id"], VICTIM);
    let e = watcher.err("stream.subscribe", json!({"run_id": "agent-a-1"}));
    assert_eq!(kind(&e), "forbidden", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("[plugins.watcher]"),
        "{e}"
    );
    let l = watcher.ok("stream.list", json!({}));
    assert_eq!(ids(&l), BTreeSet::from([VICTIM.to_owned()]), "{l}");
    let (mut nothing, h) = bound(&d.socket, "nothing");
    assert_eq!(h["grant"]["runs"], json!([]), "{h}");
    assert_eq!(nothing.ok("stream.list", json!({}))["runs"], json!([]));
    assert_eq!(nothing.ok("run.list", json!({}))["runs"], json!([]));
    let e = nothing.err("stream.begin", json!({"run_id": "anything"}));
    assert_eq!(kind(&e), "forbidden", "{e}");

    println!(
        "run grants ({}): agent-a-* refused {on_tokio} calls on {VICTIM} from a tokio connection and {on_lane} from the append lane \
         ({} run-naming methods from api::METHODS); served all {} on its own runs; stream.list {} of {} runs, \
         run.list {} of {}, run.prune {} of its own and not {VICTIM_LOG_ONLY}; watcher (exact id) and nothing (runs = []) held",
        if env.on_postgres() { "postgres" } else { "files" },
        run_methods().len(),
        served.len(),
        ids(&plugin_streams).len(),
        ids(&all_streams).len(),
        ids(&plugin_logs).len(),
        ids(&all_logs).len(),
        would_ids.len(),
    );
    drop((admin, fresh, watcher, nothing));
    d.stop();
}

#[test]
fn run_patterns_that_can_match_no_run_id_stop_the_daemon_naming_the_plugin() {
    let mut env = DaemonEnv::new("");
    for (pattern, says) in [
        ("agent-*-1", "has a `*` before its end"),
        ("*agent", "has a `*` before its end"),
        (".agent*", "can match no run id"),
        ("agent/a", "is not a run id"),
        ("", "is not a run id"),
    ] {
        env.write_config(&format!(
            "[plugins.agent-a]\nstores = []\nmethods = [\"stream.*\"]\nruns = [\"agent-a-*\", {pattern:?}]\n"
        ));
        let mut d = env.spawn(&DaemonOpts::default());
        let st = d
            .wait_exit(Duration::from_secs(15))
            .unwrap_or_else(|| panic!("runs = [{pattern:?}] was accepted: the daemon serves"));
        assert!(!st.success(), "{pattern:?}: {st}");
        let log = d.log_text();
        let want = format!("[plugins.agent-a] runs: {pattern:?} {says}");
        assert!(
            log.contains(&want),
            "{pattern:?}: expected {want:?} in:\n{log}"
        );
        println!("runs = [{pattern:?}]: {}", log.trim());
    }
    // The same plugin with good patterns serves.
    env.write_config(
        "[plugins.agent-a]\nstores = []\nmethods = [\"stream.*\"]\nruns = [\"agent-a-*\", \"shared-1\", \"*\"]\n",
    );
    let d = env.start();
    let (_c, h) = bound(&d.socket, "agent-a");
    assert_eq!(h["grant"]["runs"], json!(["agent-a-*", "shared-1", "*"]));
    d.stop();
}
