//! Proof under fire for the whole daemon: several client processes doing everything at once
//! against the real daemon, which is SIGKILLed at a random moment of each cycle and restarted;
//! after each restart every acknowledged write is checked (issue 16).
//!
//! - `mixed_load_kill_9_torture`: `HOLDFAST_TORTURE_CYCLES` cycles (default 300). Each cycle
//!   starts [`CLIENTS`] client processes (this test binary re-executed, entry `torture_client`),
//!   each doing a random mix of `cred.set` / `cred.set` with `if_generation` / `cred.delete` on
//!   its own ids, `stream.begin` / `append` / `interrupt` / `resume` / `commit` / `abort` on its
//!   own runs (resuming the runs the previous cycle's kill left open), `run.log_node` and
//!   `run.ensure_node` of the same nodes of one shared run from every client, and
//!   `checkpoint.put`; kills the daemon with SIGKILL 10–100 ms in; restarts it; and checks, from
//!   what each client printed it sent and what was acknowledged:
//!   - every credential holds its last acknowledged value, or the value of the one write that
//!     was in flight (deleted the same way);
//!   - every run touched: ended exactly as acknowledged (or by its in-flight commit/abort), an
//!     ended run is neither listed nor resumable and a committed one's final message is the
//!     streamed text; an active run's events, read by a subscriber from seq 1, are numbered
//!     1, 2, 3… with no gap and no duplicate, and their text is the producer's acknowledged
//!     text (or that plus its in-flight append);
//!   - the shared run log holds each node once, every acknowledged node among them;
//!   - each checkpoint is the last acknowledged snapshot (or the in-flight one);
//!   - `admin.fsck`: no temp file, the index consistent with the files, nothing quarantined;
//!     no temp file anywhere under the data directory (within 10 s: checkpoint temps outside
//!     the active runs are swept in the background).
//!
//!   At the end every credential and every run ever made is checked once more. Prints the
//!   cycles, the operations by kind, the in-flight writes that landed or not, and the
//!   violations (which must be 0).
//!
//!   The long run: `HOLDFAST_TORTURE_CYCLES=10000 cargo test --release --test torture --
//!   --nocapture` (docs/security.md has its figures). `HOLDFAST_TORTURE_SEED` replays a run.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::print_stdout
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use holdfast::client::{Client, ClientError};
use serde_json::{json, Value};

#[allow(dead_code)]
mod common;
use common::*;

/// Client processes per cycle.
const CLIENTS: usize = 4;
/// Credentials each client owns.
const IDS_PER_CLIENT: usize = 3;
/// Nodes of each cycle's shared run log.
const NODES: usize = 8;

/// A small deterministic generator (xorshift64*), seeded per cycle and client.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn env_var<T: std::str::FromStr>(name: &str) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing or bad"))
}

fn cred_id(client: usize, k: usize) -> String {
    format!("t{client}-{k}")
}

fn checkpoint_run(client: usize) -> String {
    format!("ck{client}")
}

fn log_run(cycle: usize) -> String {
    format!("L{cycle}")
}

/// A node's detail: the same for every client (the same node from several paths).
fn node_detail(node: &str) -> Value {
    json!({"node_id": node, "node_name": node, "node_type": "llm", "success": true,
           "attempt": 1, "input_tokens": 10, "output_tokens": 4, "tokens_used": 14})
}

// ---------------------------------------------------------------------------------------------
// The client process

/// What a client process prints, one `T {json}` line each: `send` before a write goes out,
/// then `ack` (with the result), `err` (the daemon refused it: it did nothing) or `lost` (the
/// connection failed: the write is in flight, it may or may not have landed).
fn say(v: Value) {
    println!("T {v}");
}

/// The outcome of one logged call: `None` when the connection is gone (stop).
fn logged(c: &mut Client, op: Value, method: &str, params: Value) -> Option<Result<Value, String>> {
    say(json!({"t": "send", "op": op}));
    match c.call(method, params) {
        Ok(v) => {
            say(json!({"t": "ack", "r": v}));
            Some(Ok(v))
        }
        Err(ClientError::Rpc { kind, message, .. }) => {
            say(json!({"t": "err", "kind": kind.as_str(), "message": message}));
            Some(Err(kind.as_str().to_owned()))
        }
        Err(e) => {
            say(json!({"t": "lost", "why": e.to_string()}));
            None
        }
    }
}

/// A run this client holds.
struct Held {
    run: String,
    stream_id: String,
    next_seq: u64,
    appends: usize,
    interrupts: usize,
    /// Taken over from the previous cycle: ended soon, so that runs left open do not pile up
    /// (each keeps its journal segments, which every restart replays).
    resumed: bool,
}

/// The re-executed client. Environment: `HF_T_SOCKET`, `HF_T_CLIENT`, `HF_T_CYCLE`,
/// `HF_T_SEED`, `HF_T_RESUME` (runs to resume first, comma-separated).
#[test]
#[ignore = "child process of mixed_load_kill_9_torture"]
fn torture_client() {
    let socket = PathBuf::from(std::env::var("HF_T_SOCKET").unwrap());
    let me: usize = env_var("HF_T_CLIENT");
    let cycle: usize = env_var("HF_T_CYCLE");
    let mut rng = Rng::new(env_var("HF_T_SEED"));
    let mut to_resume: Vec<String> = std::env::var("HF_T_RESUME")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let mut c = match Client::connect(&socket, "torture", None) {
        Ok(c) => c,
        Err(e) => {
            say(json!({"t": "noconnect", "why": e.to_string()}));
            return;
        }
    };
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // The generations of this client's credentials, for `if_generation`.
    let mut generation: BTreeMap<String, u64> = BTreeMap::new();
    for k in 0..IDS_PER_CLIENT {
        let id = cred_id(me, k);
        match c.call("cred.get", json!({"id": id})) {
            Ok(v) => {
                generation.insert(id, v["generation"].as_u64().unwrap_or(0));
            }
            Err(ClientError::Rpc { .. }) => {
                generation.insert(id, 0);
            }
            Err(_) => return,
        }
    }
    let mut held: Option<Held> = None;
    let mut runs_begun = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        let roll = rng.below(100);
        let step = if roll < 30 {
            // Credentials, this client's own ids.
            let id = cred_id(me, rng.below(IDS_PER_CLIENT as u64) as usize);
            let value = format!("v{me}.{cycle}.{n}.{}", "x".repeat(rng.below(40) as usize));
            match rng.below(3) {
                0 => logged(
                    &mut c,
                    json!({"k": "set", "id": id, "value": value}),
                    "cred.set",
                    json!({"id": id, "value": value}),
                )
                .map(|r| {
                    if let Ok(v) = &r {
                        generation.insert(id.clone(), v["generation"].as_u64().unwrap_or(0));
                    }
                }),
                1 => {
                    let g = generation.get(&id).copied().unwrap_or(0);
                    logged(
                        &mut c,
                        json!({"k": "cas", "id": id, "value": value}),
                        "cred.set",
                        json!({"id": id, "value": value, "if_generation": g}),
                    )
                    .map(|r| {
                        if let Ok(v) = &r {
                            generation.insert(id.clone(), v["generation"].as_u64().unwrap_or(0));
                        }
                    })
                }
                _ => logged(
                    &mut c,
                    json!({"k": "del", "id": id}),
                    "cred.delete",
                    json!({"id": id}),
                )
                .map(|r| {
                    if r.is_ok() {
                        generation.insert(id.clone(), 0);
                    }
                }),
            }
        } else if roll < 75 {
            stream_step(
                &mut c,
                &mut rng,
                &mut held,
                &mut to_resume,
                me,
                cycle,
                &mut runs_begun,
            )
        } else if roll < 90 {
            let node = format!("n{}", rng.below(NODES as u64));
            let run = log_run(cycle);
            if rng.below(2) == 0 {
                logged(
                    &mut c,
                    json!({"k": "log", "run": run, "node": node}),
                    "run.log_node",
                    json!({"run_id": run, "detail": node_detail(&node)}),
                )
                .map(|_| ())
            } else {
                logged(
                    &mut c,
                    json!({"k": "ensure", "run": run, "node": node}),
                    "run.ensure_node",
                    json!({"run_id": run, "node_id": node, "detail": {"success": true}}),
                )
                .map(|_| ())
            }
        } else {
            let run = checkpoint_run(me);
            let text = format!("partial {me}.{cycle}.{n}");
            logged(
                &mut c,
                json!({"k": "ckpt", "run": run, "text": text}),
                "checkpoint.put",
                json!({"run_id": run, "snapshot": {"thread_id": "t", "upstream_model": "m",
                       "partial_text": text, "completed_tool_calls": [], "in_flight_tool": null}}),
            )
            .map(|_| ())
        };
        if step.is_none() {
            return;
        }
    }
}

/// One stream operation: resume a run left open (first), begin one, append to it, or now and
/// then interrupt, commit or abort it.
fn stream_step(
    c: &mut Client,
    rng: &mut Rng,
    held: &mut Option<Held>,
    to_resume: &mut Vec<String>,
    me: usize,
    cycle: usize,
    runs_begun: &mut usize,
) -> Option<()> {
    let Some(h) = held.as_mut() else {
        let resumed = !to_resume.is_empty();
        let (op, method, params, run) = match to_resume.pop() {
            Some(run) => (
                json!({"k": "resume", "run": run}),
                "stream.resume",
                json!({"run_id": run, "model": "m"}),
                run,
            ),
            None => {
                *runs_begun += 1;
                let run = format!("s{me}.{cycle}.{runs_begun}");
                (
                    json!({"k": "begin", "run": run}),
                    "stream.begin",
                    json!({"run_id": run, "model": "m"}),
                    run,
                )
            }
        };
        if let Ok(v) = logged(c, op, method, params)? {
            *held = Some(Held {
                run,
                stream_id: v["stream_id"].as_str().unwrap_or_default().to_owned(),
                next_seq: v["next_seq"].as_u64().unwrap_or(1),
                appends: 0,
                interrupts: 0,
                resumed,
            });
        }
        return Some(());
    };
    let roll = rng.below(100);
    let (run, sid) = (h.run.clone(), h.stream_id.clone());
    let end_chance = if h.resumed { 40 } else { 8 };
    if roll < end_chance && h.appends > 0 {
        let commit = rng.below(3) > 0;
        let (op, method, params) = if commit {
            (
                json!({"k": "commit", "run": run}),
                "stream.commit",
                json!({"run_id": run, "stream_id": sid, "content_from_stream": true,
                       "final_message": {"role": "assistant"}}),
            )
        } else {
            (
                json!({"k": "abort", "run": run}),
                "stream.abort",
                json!({"run_id": run, "stream_id": sid, "reason": "torture"}),
            )
        };
        let _ = logged(c, op, method, params)?;
        *held = None;
    } else if roll < end_chance + 4 && h.interrupts < 1 {
        h.interrupts += 1;
        match logged(
            c,
            json!({"k": "interrupt", "run": run}),
            "stream.interrupt",
            json!({"run_id": run, "stream_id": sid, "cause": "connection_reset"}),
        )? {
            Ok(v) => h.next_seq = v["next_seq"].as_u64().unwrap_or(h.next_seq),
            Err(_) => return give_up(c, held),
        }
    } else {
        // Text that never repeats the end of what came before (no continuation overlap).
        let events = 1 + rng.below(3);
        let words: Vec<String> = (0..events)
            .map(|k| format!("w{}.{}. ", h.next_seq + k, rng.below(1000)))
            .collect();
        let evs: Vec<Value> = words
            .iter()
            .map(|w| json!({"type": "text", "text": w}))
            .collect();
        let seq = h.next_seq;
        match logged(
            c,
            json!({"k": "append", "run": run, "text": words.concat()}),
            "stream.append",
            json!({"run_id": run, "stream_id": sid, "seq": seq, "events": evs}),
        )? {
            Ok(_) => {
                h.next_seq += events;
                h.appends += 1;
            }
            Err(_) => return give_up(c, held),
        }
    }
    Some(())
}

/// The daemon refused a write to the held run (its recovery budget is spent, and its plan is
/// `fail`): abort it, as a producer should.
fn give_up(c: &mut Client, held: &mut Option<Held>) -> Option<()> {
    if let Some(h) = held.take() {
        let _ = logged(
            c,
            json!({"k": "abort", "run": h.run}),
            "stream.abort",
            json!({"run_id": h.run, "stream_id": h.stream_id, "reason": "recovery failed"}),
        )?;
    }
    Some(())
}

// ---------------------------------------------------------------------------------------------
// The parent: the model of what was acknowledged, and the checks

/// One write a client sent.
#[derive(Clone, Debug)]
struct Op {
    kind: String,
    id: String,
    value: String,
    client: usize,
}

impl Op {
    fn of(v: &Value, client: usize) -> Op {
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        Op {
            kind: s("k"),
            id: if v.get("id").is_some() {
                s("id")
            } else {
                s("run")
            },
            value: if v.get("value").is_some() {
                s("value")
            } else if v.get("text").is_some() {
                s("text")
            } else {
                s("node")
            },
            client,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct RunModel {
    owner: usize,
    /// The text acknowledged so far.
    text: String,
    /// `committed` or `aborted` once acknowledged.
    ended: Option<String>,
    /// What happened to it, for a violation's message.
    history: Vec<String>,
}

#[derive(Default)]
struct Model {
    /// Credential id → its acknowledged value (`None`: absent).
    creds: BTreeMap<String, Option<String>>,
    runs: BTreeMap<String, RunModel>,
    /// Shared run log → the nodes acknowledged.
    logs: BTreeMap<String, BTreeSet<String>>,
    /// Checkpoint run → the acknowledged snapshot's text.
    checkpoints: BTreeMap<String, String>,
}

#[derive(Default)]
struct Totals {
    acked: BTreeMap<String, usize>,
    refused: BTreeMap<String, usize>,
    in_flight_landed: usize,
    in_flight_not_landed: usize,
    no_connect: usize,
    runs_checked: usize,
    events_checked: usize,
    creds_checked: usize,
    violations: Vec<String>,
}

impl Model {
    /// Apply an acknowledged write.
    fn ack(&mut self, op: &Op) {
        if let Some(r) = self.runs.get_mut(&op.id) {
            r.history.push(format!("{} acked", op.kind));
        }
        match op.kind.as_str() {
            "set" | "cas" => {
                self.creds.insert(op.id.clone(), Some(op.value.clone()));
            }
            "del" => {
                self.creds.insert(op.id.clone(), None);
            }
            "begin" => {
                self.runs.insert(
                    op.id.clone(),
                    RunModel {
                        owner: op.client,
                        ..RunModel::default()
                    },
                );
            }
            "append" => {
                if let Some(r) = self.runs.get_mut(&op.id) {
                    r.text.push_str(&op.value);
                }
            }
            "commit" => self.end(&op.id, "committed"),
            "abort" => self.end(&op.id, "aborted"),
            "log" | "ensure" => {
                self.logs
                    .entry(op.id.clone())
                    .or_default()
                    .insert(op.value.clone());
            }
            "ckpt" => {
                self.checkpoints.insert(op.id.clone(), op.value.clone());
            }
            _ => {}
        }
    }

    fn end(&mut self, run: &str, status: &str) {
        if let Some(r) = self.runs.get_mut(run) {
            r.ended = Some(status.to_owned());
        }
    }
}

/// Read one client's printed lines into the model: acknowledged writes applied, the one in
/// flight (sent, never answered) returned.
fn absorb(stdout: &str, client: usize, model: &mut Model, t: &mut Totals) -> Option<Op> {
    let mut pending: Option<Op> = None;
    for line in stdout.lines() {
        let Some(json) = line.strip_prefix("T ") else {
            continue;
        };
        let v: Value = serde_json::from_str(json).unwrap();
        match v["t"].as_str().unwrap_or_default() {
            "send" => pending = Some(Op::of(&v["op"], client)),
            "ack" => {
                let op = pending.take().expect("an ack without a send");
                *t.acked.entry(op.kind.clone()).or_default() += 1;
                model.ack(&op);
            }
            "err" => {
                let op = pending.take().expect("an error without a send");
                let kind = v["kind"].as_str().unwrap_or_default();
                *t.refused
                    .entry(format!("{} ({kind})", op.kind))
                    .or_default() += 1;
                if std::env::var_os("HOLDFAST_TORTURE_VERBOSE").is_some() {
                    println!("refused: {op:?}: {}", v["message"]);
                }
            }
            "noconnect" => t.no_connect += 1,
            // "lost": the pending op stays pending.
            _ => {}
        }
    }
    pending
}

/// A value a credential may hold after a restart: the acknowledged one, or what the write in
/// flight would have made it.
fn check_cred(c: &mut Conn, model: &mut Model, id: &str, pending: &[Op], t: &mut Totals) {
    t.creds_checked += 1;
    let r = c.call("cred.get", json!({"id": id}));
    let got: Option<String> = match (r.get("result"), r.get("error")) {
        (Some(res), _) => Some(
            res["credential"]["keys"]["api_key"]["value"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ),
        (_, Some(e)) if e["data"]["kind"] == "not_found" => None,
        _ => {
            t.violations
                .push(format!("cred {id}: unreadable after restart: {r}"));
            return;
        }
    };
    let acked = model.creds.get(id).cloned().unwrap_or(None);
    let flight = pending
        .iter()
        .find(|p| p.id == id)
        .map(|p| match p.kind.as_str() {
            "del" => None,
            _ => Some(p.value.clone()),
        });
    if got == acked {
        if flight.is_some() && flight != Some(acked.clone()) {
            t.in_flight_not_landed += 1;
        }
    } else if flight.as_ref() == Some(&got) {
        t.in_flight_landed += 1;
    } else {
        t.violations.push(format!(
            "cred {id}: holds {got:?}, acknowledged {acked:?}, in flight {flight:?}"
        ));
    }
    model.creds.insert(id.to_owned(), got);
}

/// Check one run against the model (and the op in flight on it), then make the model what the
/// daemon holds.
fn check_run(
    c: &mut Conn,
    socket: &Path,
    listed: &BTreeSet<String>,
    model: &mut Model,
    run: &str,
    pending: Option<&Op>,
    t: &mut Totals,
) {
    t.runs_checked += 1;
    let expect = model.runs.get(run).cloned();
    let r = c.call("stream.get", json!({"run_id": run, "reveal": true}));
    let Some(got) = r.get("result") else {
        // Never begun: only a begin in flight may have left nothing.
        let begin_in_flight = pending.is_some_and(|p| p.kind == "begin");
        match expect {
            Some(m) => t.violations.push(format!(
                "run {run}: gone after restart: {r}; its history: {:?}",
                m.history
            )),
            None if begin_in_flight => t.in_flight_not_landed += 1,
            // A begin that never landed, checked again at the end.
            None => {}
        }
        return;
    };
    let mut m = match expect {
        Some(m) => m,
        None if pending.is_some_and(|p| p.kind == "begin") => {
            t.in_flight_landed += 1;
            RunModel {
                owner: pending.map_or(0, |p| p.client),
                ..RunModel::default()
            }
        }
        None => {
            t.violations
                .push(format!("run {run}: exists, never acknowledged: {got}"));
            return;
        }
    };
    let status = got["status"].as_str().unwrap_or_default().to_owned();
    m.history.push(format!(
        "after a restart: {status}{}",
        pending.map_or(String::new(), |p| format!(" ({} in flight)", p.kind))
    ));
    let ended = matches!(status.as_str(), "committed" | "aborted");
    let flight_end = pending
        .filter(|p| matches!(p.kind.as_str(), "commit" | "abort"))
        .map(|p| {
            if p.kind == "commit" {
                "committed"
            } else {
                "aborted"
            }
        });
    match (&m.ended, ended) {
        (Some(want), true) if *want == status => {}
        (None, true) if flight_end == Some(status.as_str()) => t.in_flight_landed += 1,
        (None, false) => {
            if flight_end.is_some() {
                t.in_flight_not_landed += 1;
            }
        }
        _ => t.violations.push(format!(
            "run {run}: status {status}, acknowledged end {:?}, in flight {flight_end:?}",
            m.ended
        )),
    }
    if ended {
        // Ended: neither listed nor resumable; a commit's final message is the streamed text.
        if listed.contains(run) {
            t.violations
                .push(format!("run {run}: {status} and still listed as active"));
        }
        let resumed = c.call("stream.resume", json!({"run_id": run}));
        if resumed.get("result").is_some() {
            t.violations
                .push(format!("run {run}: {status} and resumable: {resumed}"));
        }
        if status == "committed" {
            let content = got["final_message"]["content"].as_str().unwrap_or_default();
            if content != m.text {
                t.violations.push(format!(
                    "run {run}: committed with {content:?}, the acknowledged text is {:?}",
                    m.text
                ));
            }
        }
        m.ended = Some(status);
        model.runs.insert(run.to_owned(), m);
        return;
    }
    if !listed.contains(run) {
        t.violations
            .push(format!("run {run}: active ({status}) but not listed"));
    }
    // A subscriber from seq 1: every event once, numbered without a gap, up to next_seq - 1.
    let last = got["next_seq"].as_u64().unwrap_or(1).saturating_sub(1);
    let mut sub = Conn::open(socket);
    sub.ok("stream.subscribe", json!({"run_id": run, "after_seq": 0}));
    let mut text = String::new();
    let mut seen = 0u64;
    while seen < last {
        let Some(ev) = sub.next_event(Duration::from_secs(10)) else {
            t.violations.push(format!(
                "run {run}: a subscriber got events up to {seen}, next_seq says {last}"
            ));
            break;
        };
        let seq = ev["seq"].as_u64().unwrap_or(0);
        if seq != seen + 1 {
            t.violations.push(format!(
                "run {run}: event {seq} after {seen} (a gap or a repeat)"
            ));
            break;
        }
        seen = seq;
        t.events_checked += 1;
        match ev["event"]["type"].as_str() {
            Some("text") => text.push_str(ev["event"]["text"].as_str().unwrap_or_default()),
            Some("stream_reset") => text.clear(),
            _ => {}
        }
    }
    drop(sub);
    let flight_text = pending
        .filter(|p| p.kind == "append")
        .map(|p| format!("{}{}", m.text, p.value));
    if text == m.text {
        if flight_text.is_some() {
            t.in_flight_not_landed += 1;
        }
    } else if flight_text.as_ref() == Some(&text) {
        t.in_flight_landed += 1;
    } else {
        t.violations.push(format!(
            "run {run}: a subscriber rebuilt {text:?}, acknowledged {:?}, in flight {flight_text:?}",
            m.text
        ));
    }
    m.text = text;
    m.ended = None;
    model.runs.insert(run.to_owned(), m);
}

/// Check every credential, the `runs` and `logs` given and every checkpoint, fsck, and no
/// temp file: in the data directory outside `runs/` and in the directories of the runs
/// touched, or (`everywhere`) under the whole data directory.
#[allow(clippy::too_many_arguments)]
fn check_all(
    d: &RunningDaemon,
    data_dir: &Path,
    model: &mut Model,
    pending: &[Op],
    runs: &BTreeSet<String>,
    logs: &BTreeSet<String>,
    everywhere: bool,
    t: &mut Totals,
) {
    let mut c = Conn::open(&d.socket);
    let ids: BTreeSet<String> = (0..CLIENTS)
        .flat_map(|i| (0..IDS_PER_CLIENT).map(move |k| cred_id(i, k)))
        .collect();
    for id in &ids {
        check_cred(&mut c, model, id, pending, t);
    }
    let listed: BTreeSet<String> = c.ok("stream.list", json!({}))["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_owned())
        .collect();
    for run in runs {
        let p = pending.iter().find(|p| &p.id == run);
        check_run(&mut c, &d.socket, &listed, model, run, p, t);
    }
    for run in logs {
        let g = c.call("run.get", json!({"run_id": run}));
        let details: Vec<String> = g["result"]["details"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|d| d["node_id"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        let unique: BTreeSet<String> = details.iter().cloned().collect();
        if unique.len() != details.len() {
            t.violations
                .push(format!("run log {run}: a node logged twice: {details:?}"));
        }
        let acked = model.logs.get(run).cloned().unwrap_or_default();
        let flight: BTreeSet<String> = pending
            .iter()
            .filter(|p| &p.id == run)
            .map(|p| p.value.clone())
            .collect();
        for node in &acked {
            if !unique.contains(node) {
                t.violations
                    .push(format!("run log {run}: acknowledged node {node} missing"));
            }
        }
        for node in &unique {
            if !acked.contains(node) {
                if flight.contains(node) {
                    t.in_flight_landed += 1;
                } else {
                    t.violations
                        .push(format!("run log {run}: node {node} never acknowledged"));
                }
            }
        }
        model.logs.insert(run.clone(), unique);
    }
    for client in 0..CLIENTS {
        let run = checkpoint_run(client);
        let r = c.call("checkpoint.get", json!({"run_id": run}));
        let got = r["result"]["partial_text"].as_str().map(str::to_owned);
        let acked = model.checkpoints.get(&run).cloned();
        let flight = pending
            .iter()
            .find(|p| p.id == run && p.kind == "ckpt")
            .map(|p| p.value.clone());
        if got == acked {
        } else if got.is_some() && got == flight {
            t.in_flight_landed += 1;
        } else {
            t.violations.push(format!(
                "checkpoint {run}: holds {got:?}, acknowledged {acked:?}, in flight {flight:?}"
            ));
        }
        if let Some(g) = got {
            model.checkpoints.insert(run, g);
        }
    }
    let fsck = c.ok("admin.fsck", json!({}));
    let empty = |k: &str| fsck[k].as_array().is_some_and(Vec::is_empty);
    if fsck["index"] != "ok"
        || ![
            "temp_files",
            "orphans",
            "ghosts",
            "drift",
            "quarantined",
            "io_errors",
        ]
        .iter()
        .all(|k| empty(k))
    {
        t.violations.push(format!("fsck after restart: {fsck}"));
    }
    // Temps in the active runs' directories go before the daemon serves; the others (a
    // checkpoint's, in any run's directory) on a background sweep: give it a moment.
    // Only a write to a run puts a temp file in its directory: after a cycle, the directories
    // of the runs it touched (walking all of them each cycle grew with the run count).
    let touched: Option<Vec<String>> = (!everywhere).then(|| {
        runs.iter()
            .chain(logs)
            .cloned()
            .chain((0..CLIENTS).map(checkpoint_run))
            .collect()
    });
    let temps_now = || temp_files_under(data_dir, touched.as_deref());
    let mut temps = temps_now();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !temps.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        temps = temps_now();
    }
    if !temps.is_empty() {
        t.violations
            .push(format!("temp files left after restart: {temps:?}"));
    }
}

/// Every file under `dir` whose name marks it a temp file; with `runs`, only these run
/// directories of `dir/runs`.
fn temp_files_under(dir: &Path, runs: Option<&[String]>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let runs_dir = dir.join("runs");
    let mut stack = vec![dir.to_path_buf()];
    if let Some(runs) = runs {
        stack.extend(runs.iter().map(|r| runs_dir.join(r)));
    }
    while let Some(d) = stack.pop() {
        if runs.is_some() && d == runs_dir {
            // Its own files only; the run directories chosen are on the stack already.
            if let Ok(entries) = std::fs::read_dir(&d) {
                out.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_name().to_string_lossy().contains(TEMP_MARKER))
                        .map(|e| e.path()),
                );
            }
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            } else if e.file_name().to_string_lossy().contains(TEMP_MARKER) {
                out.push(p);
            }
        }
    }
    out
}

fn spawn_client(
    env: &DaemonEnv,
    socket: &Path,
    client: usize,
    cycle: usize,
    seed: u64,
    resume: &[String],
) -> Child {
    let mut c = reexec("torture_client", &env.home);
    c.env("HF_T_SOCKET", socket)
        .env("HF_T_CLIENT", client.to_string())
        .env("HF_T_CYCLE", cycle.to_string())
        .env("HF_T_SEED", seed.to_string())
        .env("HF_T_RESUME", resume.join(","))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().expect("spawn a torture client")
}

#[test]
fn mixed_load_kill_9_torture() {
    let cycles: usize = std::env::var("HOLDFAST_TORTURE_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let seed: u64 = std::env::var("HOLDFAST_TORTURE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("mixed-load kill -9 torture: {cycles} cycles, seed {seed} (HOLDFAST_TORTURE_SEED)");
    let mut rng = Rng::new(seed);
    let mut env = DaemonEnv::new("");
    let data_dir = env.data_dir.clone();
    let mut model = Model::default();
    let mut t = Totals::default();
    let mut every_run: BTreeSet<String> = BTreeSet::new();
    let mut every_log: BTreeSet<String> = BTreeSet::new();
    let started = Instant::now();
    let mut d = env.start();
    for cycle in 0..cycles {
        // Each client resumes the runs it left open.
        let open_runs = |client: usize| -> Vec<String> {
            model
                .runs
                .iter()
                .filter(|(_, r)| r.owner == client && r.ended.is_none())
                .map(|(id, _)| id.clone())
                .collect()
        };
        let children: Vec<Child> = (0..CLIENTS)
            .map(|i| spawn_client(&env, &d.socket, i, cycle, rng.next(), &open_runs(i)))
            .collect();
        std::thread::sleep(Duration::from_millis(10 + rng.below(90)));
        d.signal(rustix::process::Signal::KILL);
        assert!(
            d.wait_exit(Duration::from_secs(10)).is_some(),
            "cycle {cycle}: the daemon outlived SIGKILL by 10 s"
        );
        let mut pending = Vec::new();
        let mut runs: BTreeSet<String> = BTreeSet::new();
        for (i, child) in children.into_iter().enumerate() {
            let out = child.wait_with_output().expect("a torture client");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "cycle {cycle}: client {i} failed: {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            for line in stdout.lines().filter_map(|l| l.strip_prefix("T ")) {
                let v: Value = serde_json::from_str(line).unwrap();
                if let Some(run) = v["op"]["run"].as_str() {
                    if !v["op"]["k"]
                        .as_str()
                        .is_some_and(|k| matches!(k, "log" | "ensure" | "ckpt"))
                    {
                        runs.insert(run.to_owned());
                    }
                }
            }
            if let Some(op) = absorb(&stdout, i, &mut model, &mut t) {
                pending.push(op);
            }
        }
        drop(d);
        let t0 = Instant::now();
        d = env.start();
        let restart = t0.elapsed();
        let logs: BTreeSet<String> = [log_run(cycle)].into();
        every_run.extend(runs.iter().cloned());
        every_log.extend(logs.iter().cloned());
        let t1 = Instant::now();
        check_all(
            &d, &data_dir, &mut model, &pending, &runs, &logs, false, &mut t,
        );
        if std::env::var_os("HOLDFAST_TORTURE_VERBOSE").is_some() {
            println!(
                "cycle {cycle}: restart {:?}, check {:?} ({} runs)",
                restart,
                t1.elapsed(),
                runs.len()
            );
        }
        if !t.violations.is_empty() {
            break;
        }
        if (cycle + 1) % 500 == 0 {
            println!(
                "  … {} cycles in {:.0} s: {} acknowledged writes, {} runs checked, {} violations",
                cycle + 1,
                started.elapsed().as_secs_f64(),
                t.acked.values().sum::<usize>(),
                t.runs_checked,
                t.violations.len()
            );
        }
    }
    // Everything once more, with nothing in flight.
    check_all(
        &d,
        &data_dir,
        &mut model,
        &[],
        &every_run,
        &every_log,
        true,
        &mut t,
    );
    d.stop();
    // The audit log went through every kill too: its chain must verify (a torn last line a
    // kill left is cut, and the cut recorded, by the next append).
    let verified = run(env.holdfast(&["audit", "verify"]), b"");
    assert_eq!(
        verified.code, 0,
        "the audit chain after the torture: {verified}"
    );
    let cuts = run(env.holdfast(&["audit", "--op", "audit.cut", "--json"]), b"");
    let cuts = serde_json::from_str::<Value>(&cuts.stdout)
        .ok()
        .and_then(|v| v.as_array().map(Vec::len))
        .unwrap_or(0);
    println!(
        "audit log after {cycles} kill -9 cycles: {}; {cuts} torn tails cut and recorded; the chain verifies",
        verified.stdout.lines().next().unwrap_or("")
    );
    if std::env::var_os("HOLDFAST_TORTURE_KEEP").is_some() {
        println!("kept: {}", env.root.display());
        std::mem::forget(env);
    }
    let ops: usize = t.acked.values().sum();
    println!(
        "mixed-load kill -9 torture: {cycles} cycles in {:.0} s (seed {seed}), {CLIENTS} client \
         processes per cycle; {ops} acknowledged writes by kind {:?}; refused {:?}; in flight at \
         the kill: {} landed, {} did not; {} clients killed before they connected; checked {} \
         credential reads, {} runs ({} events read back), {} run logs; violations: {}",
        started.elapsed().as_secs_f64(),
        t.acked,
        t.refused,
        t.in_flight_landed,
        t.in_flight_not_landed,
        t.no_connect,
        t.creds_checked,
        t.runs_checked,
        t.events_checked,
        every_log.len(),
        t.violations.len()
    );
    assert!(
        t.violations.is_empty(),
        "violations (seed {seed}):\n{}",
        t.violations
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        t.acked.get("append").copied().unwrap_or(0) > 0
            && t.acked.get("set").copied().unwrap_or(0) > 0,
        "the clients did too little to prove anything: {:?}",
        t.acked
    );
}
