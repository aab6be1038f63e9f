//! The audit log through the real daemon binary over its socket and the real CLI: one record
//! per credential operation and per refused call, with who, what and the result; no secret in
//! the log; one valid chain when the daemon and offline CLIs append at once; tampering found by
//! `holdfast audit verify`; and the failure policy on a full or read-only disk
//! (docs/security.md, rows 33, 34 and 48).
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use serde_json::{json, Value};

/// `holdfast audit --json` of `env`'s data dir: every record.
fn records(env: &DaemonEnv) -> Vec<Value> {
    let o = run(env.holdfast(&["audit", "--json"]), b"");
    assert_eq!(o.code, 0, "{o}");
    serde_json::from_str::<Value>(&o.stdout)
        .unwrap_or_else(|e| panic!("audit --json: {e}: {o}"))
        .as_array()
        .cloned()
        .unwrap()
}

/// The records of operations (not the log's own `audit.*` bookkeeping, nor the `init` every
/// `DaemonEnv` starts with: `keys_and_limits` checks that one).
fn ops(recs: &[Value]) -> Vec<Value> {
    recs.iter()
        .filter(|r| {
            let op = r["op"].as_str().unwrap_or("");
            !op.starts_with("audit.") && op != "init"
        })
        .cloned()
        .collect()
}

/// The audit log's newest segment file of `env`'s data dir.
fn newest_segment(env: &DaemonEnv) -> PathBuf {
    fs::read_dir(env.data_dir.join("audit"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with("audit-") && n.ends_with(".jsonl")
        })
        .max()
        .unwrap()
}

/// Cut the newest `n` records from the end of the newest segment (behind any writer's back);
/// the number of the last record there was before the cut.
fn cut_newest_records(env: &DaemonEnv, n: usize) -> u64 {
    let seg = newest_segment(env);
    let text = fs::read_to_string(&seg).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let last = serde_json::from_str::<Value>(lines[lines.len() - 1]).unwrap()["seq"]
        .as_u64()
        .unwrap();
    fs::write(&seg, lines[..lines.len() - n].join("\n") + "\n").unwrap();
    last
}

fn verify(env: &DaemonEnv) -> Out {
    run(env.holdfast(&["audit", "verify"]), b"")
}

/// Every file under `dir`, read whole.
fn all_bytes(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(all_bytes(&p));
        } else if let Ok(b) = fs::read(&p) {
            out.push((p, b));
        }
    }
    out
}

/// No file under `dir` holds any of `needles`.
fn assert_absent(dir: &Path, needles: &[String]) -> usize {
    let files = all_bytes(dir);
    for (p, bytes) in &files {
        for n in needles {
            assert!(
                memchr::memmem::find(bytes, n.as_bytes()).is_none(),
                "{} holds a secret ({} bytes of it)",
                p.display(),
                n.len()
            );
        }
    }
    files.len()
}

/// The secret itself and the encodings a careless record could hold it in.
fn forms(secret: &str) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let url = base64::engine::general_purpose::URL_SAFE;
    let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
    vec![
        secret.to_owned(),
        b64.encode(secret),
        url.encode(secret),
        hex,
    ]
}

/// Field `k` of record `r` as text ("" if absent).
fn s<'a>(r: &'a Value, k: &str) -> &'a str {
    r[k].as_str().unwrap_or("")
}

/// `(op, id, result)` of each operation record, in order.
fn triples(recs: &[Value]) -> Vec<(String, String, String)> {
    recs.iter()
        .map(|r| {
            (
                s(r, "op").to_owned(),
                s(r, "id").to_owned(),
                s(r, "result").to_owned(),
            )
        })
        .collect()
}

/// `holdfast` run as a child whose pid is known: (pid, output).
fn run_with_pid(mut c: Command, stdin: &[u8]) -> (u32, Out) {
    use std::io::Write as _;
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let o = child.wait_with_output().unwrap();
    (
        pid,
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8(o.stdout).unwrap(),
            stderr: String::from_utf8(o.stderr).unwrap(),
        },
    )
}

fn euid() -> u64 {
    u64::from(rustix::process::geteuid().as_raw())
}

/// Through the daemon: every credential operation (each kind, ok and failing), every refusal
/// (a plugin's grant, a store outside it, an unknown plugin), and the CLI going through the
/// daemon, each leave exactly the records expected — who (client, plugin, pid, uid, connection),
/// what (op, store, id), the result, a change's `begun` first — and no secret anywhere in the log.
#[test]
fn daemon_records_every_credential_operation_and_every_refusal() {
    for durability in ["batch", "always"] {
        let mut env = DaemonEnv::new(&format!(
            "[audit]\ndurability = \"{durability}\"\n\
             [plugins.reader]\nstores = [\"default\"]\nmethods = [\"cred.get\", \"cred.list\"]\n"
        ));
        let d = env.start();
        let secret = format!("sk-audit-{durability}-7f3a9c2e51d0");
        let me = u64::from(std::process::id());
        let mut a = Conn::connect(&d.socket);
        let hello = a.ok("hello", json!({"client": "agent-a", "protocol": 1}));
        let conn_a = hello["connection"].as_u64().unwrap();
        a.ok("cred.set", json!({"id": "x", "value": secret}));
        let got = a.ok("cred.get", json!({"id": "x"}));
        assert_eq!(
            got["credential"]["keys"]["api_key"]["value"],
            secret.as_str()
        );
        // Twice: the second is served from the file cache, on the connection's task.
        a.ok("cred.get", json!({"id": "x"}));
        a.ok("cred.exists", json!({"id": "x"}));
        a.ok("cred.list", json!({}));
        a.err("cred.get", json!({"id": "nope"}));
        a.err("cred.get", json!({"id": "../etc/passwd"}));
        a.ok("cred.refresh_lease", json!({"id": "x", "ttl_ms": 5000}));
        a.ok("cred.release_lease", json!({"id": "x"}));
        a.ok("cred.watch", json!({}));
        a.ok("admin.fsck", json!({}));
        a.ok("admin.rotate_key", json!({}));
        a.ok("cred.delete", json!({"id": "x"}));
        let mut b = Conn::connect(&d.socket);
        b.ok("hello", json!({"client": "agent-b", "plugin": "reader"}));
        b.err("cred.get", json!({"id": "x"}));
        b.err("cred.set", json!({"id": "y", "value": secret}));
        b.err("stream.list", json!({}));
        b.err("cred.get", json!({"store": "other", "id": "x"}));
        let mut c = Conn::connect(&d.socket);
        let refused = c.err(
            "hello",
            json!({"client": "agent-c", "plugin": "no-such-plugin"}),
        );
        assert_eq!(refused["data"]["kind"], "forbidden");
        // The CLI through the daemon: recorded by the daemon, with the CLI's pid.
        let (cli_pid, o) = run_with_pid(
            env.holdfast(&["cred", "set", "z"]),
            format!("{secret}-z\n").as_bytes(),
        );
        assert_eq!(o.code, 0, "{o}");
        let log = d.stop();
        assert!(!log.contains(&secret), "the daemon's log holds the secret");

        let recs = records(&env);
        let got = ops(&recs);
        let want: Vec<(&str, &str, &str)> = vec![
            ("cred.set", "x", "begun"),
            ("cred.set", "x", "ok"),
            ("cred.get", "x", "ok"),
            ("cred.get", "x", "ok"),
            ("cred.exists", "x", "ok"),
            ("cred.list", "", "ok"),
            ("cred.get", "nope", "not_found"),
            ("cred.get", "", "invalid_params"),
            ("cred.refresh_lease", "x", "ok"),
            ("cred.release_lease", "x", "ok"),
            ("cred.watch", "", "ok"),
            ("admin.fsck", "", "ok"),
            ("admin.rotate_key", "", "begun"),
            ("admin.rotate_key", "", "ok"),
            ("cred.delete", "x", "begun"),
            ("cred.delete", "x", "ok"),
            ("cred.get", "x", "not_found"),
            ("cred.set", "y", "forbidden"),
            ("stream.list", "", "forbidden"),
            ("cred.get", "x", "forbidden"),
            ("hello", "", "forbidden"),
            ("cred.get", "z", "not_found"),
            ("cred.set", "z", "begun"),
            ("cred.set", "z", "ok"),
        ];
        let want: Vec<(String, String, String)> = want
            .iter()
            .map(|(o, i, r)| ((*o).into(), (*i).into(), (*r).into()))
            .collect();
        assert_eq!(triples(&got), want, "{durability}: {got:#?}");
        // Who: the raw connections are this test process; the CLI's records carry its pid.
        for r in &got[..16] {
            assert_eq!(s(r, "via"), "daemon", "{r}");
            assert_eq!(s(r, "client"), "agent-a", "{r}");
            assert_eq!(r["pid"], me, "{r}");
            assert_eq!(r["uid"], euid(), "{r}");
            assert_eq!(r["conn"], conn_a, "{r}");
            assert_eq!(s(r, "store"), "default", "{r}");
        }
        assert_eq!(
            got[1]["ref"], got[0]["seq"],
            "an outcome names its begun record"
        );
        for r in &got[16..20] {
            assert_eq!(
                (s(r, "client"), s(r, "plugin")),
                ("agent-b", "reader"),
                "{r}"
            );
        }
        assert_eq!(s(&got[19], "store"), "other");
        assert_eq!(s(&got[20], "plugin"), "no-such-plugin");
        for r in &got[21..] {
            assert_eq!(
                (s(r, "client"), r["pid"].as_u64()),
                ("holdfast-cli", Some(u64::from(cli_pid))),
                "{r}"
            );
        }
        let v = verify(&env);
        assert_eq!(v.code, 0, "{v}");
        // No value and no key material anywhere in the audit directory.
        let key = fs::read_to_string(env.key_file()).unwrap();
        let mut needles = forms(&secret);
        needles.extend(forms(&format!("{secret}-z")));
        needles.push(key.trim().to_owned());
        let files = assert_absent(&env.data_dir.join("audit"), &needles);
        println!(
            "daemon ({durability}): {} operations and refusals, {} records in all ({} the log's own); \
             who, what and result as expected; chain verifies; {} secret forms and the key absent from {files} files",
            want.len(),
            recs.len(),
            recs.len() - got.len(),
            needles.len()
        );
    }
}

/// The CLI on the store directly (`--offline`, `--store-dir`): each operation recorded by the
/// CLI itself, with its own pid and uid, `via: cli`, a change's `begun` first.
#[test]
fn the_offline_cli_records_its_own_operations() {
    let env = DaemonEnv::new("");
    let secret = "sk-offline-cli-3e9a61b7";
    let mut pids = Vec::new();
    let mut cli = |args: &[&str], stdin: &[u8], want: i32| {
        let mut full = vec!["--offline"];
        full.extend_from_slice(args);
        let (pid, o) = run_with_pid(env.holdfast(&full), stdin);
        assert_eq!(o.code, want, "{args:?}: {o}");
        pids.push(pid);
    };
    cli(&["cred", "set", "o1"], format!("{secret}\n").as_bytes(), 0);
    cli(&["cred", "get", "o1"], b"", 0);
    cli(&["cred", "exists", "o1"], b"", 0);
    cli(&["cred", "list"], b"", 0);
    cli(&["cred", "get", "missing"], b"", 3);
    cli(&["store", "fsck"], b"", 0);
    cli(&["store", "fsck", "--repair"], b"", 0);
    cli(&["key", "rotate"], b"", 0);
    cli(&["cred", "delete", "o1"], b"", 0);
    let base = env.store_base();
    let key = env.key_file();
    let (dir_pid, o) = run_with_pid(
        env.holdfast(&[
            "--store-dir",
            base.to_str().unwrap(),
            "--key-file",
            key.to_str().unwrap(),
            "cred",
            "list",
        ]),
        b"",
    );
    assert_eq!(o.code, 0, "{o}");
    let got = ops(&records(&env));
    let want = [
        ("cred.set", "o1", "begun", 0),
        ("cred.set", "o1", "ok", 0),
        ("cred.get", "o1", "ok", 1),
        ("cred.exists", "o1", "ok", 2),
        ("cred.list", "", "ok", 3),
        ("cred.get", "missing", "not_found", 4),
        ("admin.fsck", "", "ok", 5),
        ("admin.fsck", "", "begun", 6),
        ("admin.fsck", "", "ok", 6),
        ("admin.rotate_key", "", "begun", 7),
        ("admin.rotate_key", "", "ok", 7),
        ("cred.delete", "o1", "begun", 8),
        ("cred.delete", "o1", "ok", 8),
    ];
    assert_eq!(got.len(), want.len() + 1, "{got:#?}");
    for (r, (op, id, result, who)) in got.iter().zip(want) {
        assert_eq!(
            (s(r, "op"), s(r, "id"), s(r, "result")),
            (op, id, result),
            "{r}"
        );
        assert_eq!(s(r, "via"), "cli", "{r}");
        assert_eq!(s(r, "store"), "default", "{r}");
        assert_eq!(r["pid"].as_u64(), Some(u64::from(pids[who])), "{r}");
        assert_eq!(r["uid"].as_u64(), Some(euid()), "{r}");
    }
    let last = got.last().unwrap();
    assert_eq!(
        s(last, "store"),
        base.to_str().unwrap(),
        "a store opened by directory is named by its path"
    );
    assert_eq!(last["pid"].as_u64(), Some(u64::from(dir_pid)));
    let v = verify(&env);
    assert_eq!(v.code, 0, "{v}");
    assert_absent(&env.data_dir.join("audit"), &forms(secret));
    // The human table names them too.
    let t = run(env.holdfast(&["audit", "--id", "o1"]), b"");
    assert_eq!(t.code, 0, "{t}");
    assert!(t.stdout.starts_with("TIME (UTC)"), "{t}");
    assert_eq!(t.stdout.lines().count(), 1 + 6, "{t}");
    assert!(
        t.stdout.contains("cred.delete") && t.stdout.contains("cli holdfast-cli"),
        "{t}"
    );
    println!(
        "offline CLI: {} operations recorded by the CLI itself (its pid, uid, via cli), a store opened by --store-dir named by its path; chain verifies",
        got.len()
    );
}

/// The history check: the daemon (4 clients) and 3 offline CLI processes at once, with
/// segments rotating every 4 KiB, write one chain: N operations, exactly their records, and
/// the chain verifies; then retention drops the oldest segments and it still verifies.
#[test]
fn the_daemon_and_offline_clis_append_one_chain() {
    for durability in ["batch", "always"] {
        let mut env = DaemonEnv::new(&format!(
            "[audit]\ndurability = \"{durability}\"\nsegment_bytes = 4096\nmax_bytes = 104857600\n"
        ));
        let d = env.start();
        {
            let mut c = Conn::open(&d.socket);
            for i in 0..4 {
                c.ok("cred.set", json!({"id": format!("c{i}"), "value": "v"}));
            }
        }
        let (gets, sets) = (60, 10);
        let (cli_procs, cli_gets, cli_sets) = (3, 4, 2);
        let start = Instant::now();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let sock = d.socket.clone();
                std::thread::spawn(move || {
                    let mut c = Conn::open(&sock);
                    for i in 0..gets + sets {
                        if i % 7 == 0 && i / 7 < sets {
                            c.ok(
                                "cred.set",
                                json!({"id": format!("c{t}"), "value": format!("v{i}")}),
                            );
                        } else {
                            c.ok("cred.get", json!({"id": format!("c{t}")}));
                        }
                    }
                })
            })
            .collect();
        let clis: Vec<_> = (0..cli_procs)
            .map(|p| {
                // Its sets first, then its gets, one process each.
                let cmds: Vec<Command> = (0..cli_gets + cli_sets)
                    .map(|i| {
                        let verb = if i < cli_sets { "set" } else { "get" };
                        env.holdfast(&["--offline", "cred", verb, &format!("cli{p}")])
                    })
                    .collect();
                std::thread::spawn(move || {
                    for c in cmds {
                        let (_, o) = run_with_pid(c, b"cli-value\n");
                        assert_eq!(o.code, 0, "{o}");
                    }
                })
            })
            .collect();
        for h in threads.into_iter().chain(clis) {
            h.join().unwrap();
        }
        let took = start.elapsed();
        let log = d.stop();
        let closed = log
            .lines()
            .find(|l| l.contains("audit log closed"))
            .unwrap_or_else(|| panic!("no audit log summary in the daemon's log:\n{log}"));
        let num = |k: &str| -> u64 {
            closed
                .split(&format!("{k}="))
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        let (daemon_records, daemon_syncs) = (num("records"), num("fdatasyncs"));
        let recs = records(&env);
        let got = ops(&recs);
        let mut by: BTreeMap<(String, String, String), usize> = BTreeMap::new();
        for r in &got {
            *by.entry((s(r, "via").into(), s(r, "op").into(), s(r, "result").into()))
                .or_default() += 1;
        }
        let n = |via: &str, op: &str, result: &str| {
            by.get(&(via.into(), op.into(), result.into()))
                .copied()
                .unwrap_or(0)
        };
        // Through the daemon: 4 setup sets, then per thread `sets` sets and `gets` gets.
        assert_eq!(n("daemon", "cred.set", "begun"), 4 + 4 * sets, "{by:?}");
        assert_eq!(n("daemon", "cred.set", "ok"), 4 + 4 * sets, "{by:?}");
        assert_eq!(n("daemon", "cred.get", "ok"), 4 * gets, "{by:?}");
        // Offline: each set is a get-free update (begun, ok); each get one record.
        assert_eq!(
            n("cli", "cred.set", "begun"),
            cli_procs * cli_sets,
            "{by:?}"
        );
        assert_eq!(n("cli", "cred.set", "ok"), cli_procs * cli_sets, "{by:?}");
        assert_eq!(n("cli", "cred.get", "ok"), cli_procs * cli_gets, "{by:?}");
        let expected =
            2 * (4 + 4 * sets) + 4 * gets + 2 * cli_procs * cli_sets + cli_procs * cli_gets;
        assert_eq!(got.len(), expected, "{by:?}");
        // Numbered 1, 2, 3… with no gap or repeat, whoever wrote them.
        let seqs: Vec<u64> = recs.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "seqs not consecutive"
        );
        let segments = fs::read_dir(env.data_dir.join("audit"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("audit-"))
            .count();
        let v = verify(&env);
        assert_eq!(v.code, 0, "{v}");
        assert!(segments > 3, "segments rotated: {segments}");
        println!(
            "one chain ({durability}): daemon (4 clients) + {cli_procs} offline CLI processes at once in {:.1} s: \
             {expected} operation records expected, {} found, {} records in all over {segments} segments, \
             numbered without a gap; chain verifies; the daemon wrote {daemon_records} of them with {daemon_syncs} fdatasyncs",
            took.as_secs_f64(),
            got.len(),
            recs.len()
        );
        // Retention: a small cap drops the oldest segments on the next rotations; the chain
        // still verifies, vouched for by the audit.drop record.
        env.write_config("[audit]\nsegment_bytes = 4096\nmax_bytes = 16384\n");
        let d = env.start();
        let mut c = Conn::open(&d.socket);
        for _ in 0..40 {
            c.ok("cred.get", json!({"id": "c0"}));
        }
        drop(c);
        d.stop();
        let v = verify(&env);
        assert_eq!(v.code, 0, "{v}");
        assert!(v.stdout.contains("dropped by retention"), "{v}");
        let kept: u64 = fs::read_dir(env.data_dir.join("audit"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("audit-"))
            .map(|e| e.metadata().unwrap().len())
            .sum();
        assert!(kept <= 16384 + 4096 + 2048, "kept {kept} bytes");
        println!(
            "retention ({durability}): max_bytes 16384 → {kept} bytes kept; {}",
            v.stdout.lines().next().unwrap_or("")
        );
    }
}

/// `holdfast audit verify` on a tampered log: exit 6, naming the segment and line of the
/// break, for each kind of tampering; a cut of the newest whole records only with `--anchor`.
#[test]
fn audit_verify_names_where_a_tampered_log_breaks() {
    let env = DaemonEnv::new("[audit]\nsegment_bytes = 4096\n");
    for i in 0..12 {
        let o = run(
            env.holdfast(&["--offline", "cred", "exists", &format!("id{i}")]),
            b"",
        );
        assert_eq!(o.code, 3, "{o}");
    }
    let clean = verify(&env);
    assert_eq!(clean.code, 0, "{clean}");
    let head = clean
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("head: "))
        .unwrap()
        .to_owned();
    let audit = env.data_dir.join("audit");
    let first = audit.join("audit-00000000000000000001.jsonl");
    let lines: Vec<Vec<u8>> = fs::read(&first)
        .unwrap()
        .split_inclusive(|&b| b == b'\n')
        .map(<[u8]>::to_vec)
        .collect();
    assert!(lines.len() >= 6);
    let newest = {
        let mut names: Vec<String> = fs::read_dir(&audit)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("audit-"))
            .collect();
        names.sort();
        audit.join(names.last().unwrap())
    };
    let newest_bytes = fs::read(&newest).unwrap();
    type Tamper = Box<dyn Fn()>;
    let (f1, f2, f3, n1, l1, l2, l3) = (
        first.clone(),
        first.clone(),
        first.clone(),
        newest.clone(),
        lines.clone(),
        lines.clone(),
        lines.clone(),
    );
    let nb = newest_bytes.clone();
    let nb2 = newest_bytes.clone();
    let n2 = newest.clone();
    // The first two lines are the env's `init` (begun, ok); the `exists` of id0.. follow.
    assert!(String::from_utf8_lossy(&lines[1]).contains("\"op\":\"init\""));
    let cases: Vec<(&str, Tamper, &str, Vec<String>)> = vec![
        (
            "edit a byte",
            Box::new(move || {
                let mut l = l1.clone();
                let at = l[4].windows(3).position(|w| w == b"id2").unwrap();
                l[4][at + 2] = b'9';
                fs::write(&f1, l.concat()).unwrap();
            }),
            "audit-00000000000000000001.jsonl line 5",
            vec![],
        ),
        (
            "delete a line",
            Box::new(move || {
                let mut l = l2.clone();
                l.remove(3);
                fs::write(&f2, l.concat()).unwrap();
            }),
            "audit-00000000000000000001.jsonl line 4 (seq 5)",
            vec![],
        ),
        (
            "swap two lines",
            Box::new(move || {
                let mut l = l3.clone();
                l.swap(5, 6);
                fs::write(&f3, l.concat()).unwrap();
            }),
            "audit-00000000000000000001.jsonl line 6 (seq 7)",
            vec![],
        ),
        (
            "truncate mid-line",
            Box::new(move || fs::write(&n1, &nb[..nb.len() - 7]).unwrap()),
            "incomplete last line",
            vec![],
        ),
        (
            "truncate the last whole record (with --anchor)",
            Box::new(move || {
                let cut = nb2[..nb2.len() - 1]
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1);
                fs::write(&n2, &nb2[..cut]).unwrap();
            }),
            "(anchor)",
            vec!["--anchor".into(), head.clone()],
        ),
    ];
    let pristine: Vec<(PathBuf, Vec<u8>)> = all_bytes(&audit)
        .into_iter()
        .filter(|(p, _)| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("audit-")
        })
        .collect();
    let mut found = 0;
    for (what, tamper, want, extra) in &cases {
        for (p, b) in &pristine {
            fs::write(p, b).unwrap();
        }
        assert_eq!(verify(&env).code, 0, "restored before {what}");
        tamper();
        let mut args = vec!["audit", "verify"];
        args.extend(extra.iter().map(String::as_str));
        let o = run(env.holdfast(&args), b"");
        assert_eq!(o.code, 6, "{what}: {o}");
        let brk = o
            .stdout
            .lines()
            .find(|l| l.starts_with("BREAK "))
            .unwrap_or_else(|| panic!("{what}: no BREAK line: {o}"));
        assert!(brk.contains(want), "{what}: {brk}");
        assert!(o.stderr.contains("does not verify"), "{what}: {o}");
        found += 1;
        println!("verify after \"{what}\": exit 6, {brk}");
    }
    println!(
        "audit verify: {} tamperings, {found} found with exit 6 and the place named",
        cases.len()
    );
    // Every segment removed looks like a log not written yet: said so, and found against an
    // anchor.
    for (p, _) in &pristine {
        fs::remove_file(p).unwrap();
    }
    let o = verify(&env);
    assert_eq!(o.code, 0, "{o}");
    assert!(o.stdout.contains("every segment was removed"), "{o}");
    let o = run(env.holdfast(&["audit", "verify", "--anchor", &head]), b"");
    assert_eq!(o.code, 6, "every segment removed, with --anchor: {o}");
}

/// The failure policy (checklist row 34), on a tmpfs mounted over the audit directory in a
/// mount namespace: full (with and without the space reserve) and read-only. Reads and changes
/// whose record cannot be written are refused with `storage` saying why (exit 7), a refused
/// change changes nothing; with `on_failure = "serve-reads"` reads are served and changes
/// still refused. A full disk first spends the reserve on the records of reads.
#[test]
fn an_unwritable_audit_log_refuses_the_operation_and_says_why() {
    let env = DaemonEnv::new("");
    let probe = Command::new("unshare")
        .args(["-m", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !probe {
        println!("unwritable audit log: SKIPPED (no mount namespace here: unshare -m failed)");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_holdfast");
    let audit = env.data_dir.join("audit");
    fs::create_dir_all(&audit).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&audit, fs::Permissions::from_mode(0o700)).unwrap();
    let cfg = |extra: &str| {
        let p = env.root.join(format!("config-{}.toml", extra.len()));
        fs::write(&p, format!("[audit]\n{extra}")).unwrap();
        p
    };
    let reserve_cfg = cfg("reserve_bytes = 16384\n");
    let none_cfg = cfg("reserve_bytes = 0\n");
    let serve_cfg = cfg("reserve_bytes = 0\non_failure = \"serve-reads\"\n");
    let script = format!(
        r#"
set -u
mount -t tmpfs -o size=64k,mode=0700 tmpfs "{audit}" || exit 90
hf() {{ timeout 30 "{bin}" "$@"; }}
start() {{
  "{bin}" --config "$1" daemon </dev/null >/dev/null 2>>"{root}/daemon-ro.log" &
  daemon=$!
  for i in $(seq 1 200); do hf --config "$1" status 2>/dev/null | grep -q 'daemon: running' && break; sleep 0.05; done
}}
stop() {{ kill -TERM $daemon; wait $daemon; }}
printf 'sk-before\n' | hf --config "{none}" cred set before >/dev/null 2>&1 || exit 91
# 1. A full disk with a reserve: reads go on from the reserve, changes are refused.
start "{reserve}"
dd if=/dev/zero of="{audit}/filler" bs=4k 2>/dev/null
served=0
for i in $(seq 1 400); do
  if hf --config "{reserve}" cred get before >/dev/null 2>"{root}/get.err"; then served=$((served+1)); else break; fi
done
echo "reserve_reads=$served"
echo "reserve_read_exit=$(hf --config "{reserve}" cred get before >/dev/null 2>&1; echo $?)"
printf 'x\n' | hf --config "{reserve}" cred set during-full >/dev/null 2>"{root}/set.err"
echo "full_set=$?"
echo "full_set_err=$(tr '\n' ' ' < "{root}/set.err")"
echo "full_get_err=$(tr '\n' ' ' < "{root}/get.err")"
# The offline CLI too (what is left of a page may fit a few of its shorter records).
for i in $(seq 1 50); do
  hf --config "{reserve}" --offline cred get before >/dev/null 2>"{root}/off.err" || break
done
echo "offline_get=$(hf --config "{reserve}" --offline cred get before >/dev/null 2>&1; echo $?)"
echo "offline_get_err=$(tr '\n' ' ' < "{root}/off.err")"
stop
rm -f "{audit}/filler"
echo "after_free_set=$(hf --config "{none}" cred get during-full >/dev/null 2>&1; echo $?)"
# 2. Read-only.
mount -o remount,ro "{audit}" || exit 92
start "{none}"
hf --config "{none}" cred get before >/dev/null 2>"{root}/ro.err"
echo "ro_get=$?"
echo "ro_get_err=$(tr '\n' ' ' < "{root}/ro.err")"
printf 'x\n' | hf --config "{none}" cred set during-ro >/dev/null 2>&1
echo "ro_set=$?"
stop
# 3. serve-reads: reads served, changes refused.
start "{serve}"
echo "serve_get=$(hf --config "{serve}" cred get before 2>/dev/null)"
printf 'x\n' | hf --config "{serve}" cred set during-serve >/dev/null 2>&1
echo "serve_set=$?"
stop
umount "{audit}"
echo "unchanged=$(hf --config "{none}" --offline cred list --json | tr -d ' \n')"
echo done
"#,
        audit = audit.display(),
        bin = bin,
        root = env.root.display(),
        reserve = reserve_cfg.display(),
        none = none_cfg.display(),
        serve = serve_cfg.display(),
    );
    let mut c = Command::new("unshare");
    c.args(["-m", "sh", "-c", &script]);
    clean_env(&mut c, &env.home);
    let out = run(c, b"");
    assert_eq!(out.code, 0, "{out}");
    let field = |k: &str| -> String {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k}: {out}"))
            .trim()
            .to_owned()
    };
    let served: usize = field("reserve_reads").parse().unwrap();
    assert!(served >= 20, "reads went on from the reserve: {out}");
    assert_eq!(field("reserve_read_exit"), "7", "{out}");
    assert!(
        field("full_get_err").contains("refused: its audit record could not be written"),
        "{out}"
    );
    assert!(
        field("full_get_err").contains("No space left on device"),
        "{out}"
    );
    assert_eq!(field("full_set"), "7", "{out}");
    assert!(
        field("full_set_err").contains("No space left on device"),
        "{out}"
    );
    assert_eq!(field("offline_get"), "7", "{out}");
    assert!(
        field("offline_get_err").contains("refused: its audit record"),
        "{out}"
    );
    assert_eq!(
        field("after_free_set"),
        "3",
        "the refused set changed nothing: {out}"
    );
    assert_eq!(field("ro_get"), "7", "{out}");
    assert!(
        field("ro_get_err").contains("Read-only file system"),
        "{out}"
    );
    assert_eq!(field("ro_set"), "7", "{out}");
    assert_eq!(field("serve_get"), "sk-before", "{out}");
    assert_eq!(field("serve_set"), "7", "{out}");
    let unchanged = field("unchanged");
    for id in ["during-full", "during-ro", "during-serve"] {
        assert!(!unchanged.contains(id), "{id} was stored: {unchanged}");
    }
    println!(
        "unwritable audit log: full 64 KiB tmpfs: {served} reads served from a 16 KiB reserve, then exit 7 ({}); \
         a change refused (exit 7: {}); offline CLI refused (exit 7); read-only: get and set exit 7 ({}); \
         serve-reads: get served, set exit 7; nothing refused was stored",
        field("full_get_err"),
        field("full_set_err"),
        field("ro_get_err")
    );
}

/// A peer of another uid (the socket made 0666 for the test) is closed before a byte is read,
/// and its attempt is recorded: op `connect`, result `forbidden`, its uid and pid.
#[test]
fn a_refused_uid_is_recorded() {
    if !is_root() {
        println!("a_refused_uid_is_recorded: SKIPPED (needs root to drop to uid 65534)");
        return;
    }
    let mut env = DaemonEnv::new("");
    let d = env.start();
    let sock_dir = d.socket.parent().unwrap().to_path_buf();
    use std::os::unix::fs::PermissionsExt;
    for dir in [&env.root, &env.home, &env.home.join("run")] {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o711)).unwrap();
    }
    fs::set_permissions(&sock_dir, fs::Permissions::from_mode(0o777)).unwrap();
    fs::set_permissions(&d.socket, fs::Permissions::from_mode(0o666)).unwrap();
    let script = r#"
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
print("PID", os.getpid(), flush=True)
try:
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"hello","params":{}}\n')
    s.settimeout(5)
    print("GOT", len(s.recv(100)))
except OSError as e:
    print("ERR", e)
# A flood: each refused at once; at most one told a second.
t0 = time.monotonic()
for _ in range(300):
    f = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    f.connect(sys.argv[1])
    f.close()
print("FLOOD_S", time.monotonic() - t0)
"#;
    let o = python(true, script, &[d.socket.to_str().unwrap()]);
    let pid: u64 = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("PID "))
        .unwrap_or_else(|| panic!("{o}"))
        .trim()
        .parse()
        .unwrap();
    assert!(o.stdout.contains("FLOOD_S"), "{o}");
    std::thread::sleep(Duration::from_millis(100));
    d.stop();
    // At most one told a second, by the daemon's own clock (not by how fast this machine ran
    // the flood): each told refusal is one log line and one record, the records at least a
    // second apart, and every refusal counted at most once.
    let logged = env.all_logs().matches("uid mismatch").count();
    let told: Vec<Value> = ops(&records(&env))
        .into_iter()
        .filter(|r| s(r, "op") == "connect")
        .collect();
    assert!(
        !told.is_empty() && logged == told.len(),
        "{logged} log lines, {told:#?}"
    );
    let micros: Vec<i64> = told
        .iter()
        .map(|r| holdfast::timefmt::parse(s(r, "ts")).unwrap())
        .collect();
    for w in micros.windows(2) {
        assert!(
            w[1] - w[0] >= 900_000,
            "told twice within a second: {told:#?}"
        );
    }
    let counted: u64 = told.len() as u64
        + told
            .iter()
            .map(|r| r["detail"]["refused_since_last_record"].as_u64().unwrap())
            .sum::<u64>();
    assert!(
        counted <= 301,
        "{counted} refusals counted of 301: {told:#?}"
    );
    println!("refused uid flood: 301 connections, {logged} log lines, {} records (at least a second apart), {counted} refusals counted", told.len());
    let recs = ops(&records(&env));
    let r = recs
        .iter()
        .find(|r| s(r, "op") == "connect")
        .unwrap_or_else(|| panic!("no connect record: {recs:#?}"));
    assert_eq!(s(r, "result"), "forbidden");
    assert_eq!(r["uid"], 65534);
    assert_eq!(r["pid"], pid);
    println!("refused uid: recorded {r}");
}

/// `holdfast import --from-hive`: with `--copy`, each credential read out of hive's store is
/// recorded (`import`, that store's path, the id) besides the writes into the target; serving
/// in place records the config change as a change (`begun`, then its outcome).
#[test]
fn import_records_what_it_reads_and_what_it_changes() {
    let env = DaemonEnv::new("");
    let hive = TestStore::new("hive");
    let secret = "sk-hive-import-51c0de";
    {
        let s = hive.open();
        for id in ["h1", "h2"] {
            s.set(
                holdfast::store::Credential::api_key(
                    id,
                    holdfast::crypto::Secret::new(format!("{secret}-{id}")),
                ),
                None,
            )
            .unwrap();
        }
    }
    let (base, key) = (hive.base.to_str().unwrap(), hive.key.to_str().unwrap());
    let o = run(
        env.holdfast(&[
            "--offline",
            "import",
            "--from-hive",
            base,
            "--key-file",
            key,
            "--copy",
        ]),
        b"",
    );
    assert_eq!(o.code, 0, "{o}");
    let o = run(
        env.holdfast(&[
            "import",
            "--from-hive",
            base,
            "--key-file",
            key,
            "--name",
            "hv",
        ]),
        b"",
    );
    assert_eq!(o.code, 0, "{o}");
    let got = ops(&records(&env));
    let reads: Vec<&Value> = got
        .iter()
        .filter(|r| s(r, "op") == "import" && s(r, "store") == base)
        .collect();
    assert_eq!(reads.len(), 2, "{got:#?}");
    for (r, id) in reads.iter().zip(["h1", "h2"]) {
        assert_eq!(
            (s(r, "id"), s(r, "result"), s(r, "via")),
            (id, "ok", "cli"),
            "{r}"
        );
    }
    let sets = got
        .iter()
        .filter(|r| s(r, "op") == "cred.set" && s(r, "store") == "default")
        .count();
    assert_eq!(sets, 4, "two copies, begun and ok each: {got:#?}");
    let served: Vec<&Value> = got
        .iter()
        .filter(|r| s(r, "op") == "import" && s(r, "store") == "hv")
        .collect();
    assert_eq!(served.len(), 2, "{got:#?}");
    assert_eq!(
        (s(served[0], "result"), s(served[1], "result")),
        ("begun", "ok")
    );
    assert_eq!(served[1]["detail"]["mode"], "serve");
    assert_eq!(verify(&env).code, 0);
    assert_absent(&env.data_dir.join("audit"), &forms(secret));
    println!(
        "import: 2 credentials read out of hive's store recorded as import, 4 copy records, the serve-in-place change begun and ok; no secret in the log"
    );
}

/// A repair no client asked for is still a change to a store: the files opening it moved to
/// quarantine are recorded (`store.repair`, file names and counts, no content), by the daemon
/// at its start and by an offline CLI that opened the store; a clean open records nothing.
#[test]
fn repairs_made_at_open_are_recorded() {
    let mut env = DaemonEnv::new("");
    let cred_dir = env.store_base().join("credentials");
    let o = run(env.holdfast(&["--offline", "cred", "set", "kept"]), b"v\n");
    assert_eq!(o.code, 0, "{o}");
    let repairs = |env: &DaemonEnv| -> Vec<Value> {
        records(env)
            .into_iter()
            .filter(|r| r["op"] == "store.repair")
            .collect()
    };
    assert!(repairs(&env).is_empty(), "{:?}", repairs(&env));
    // Damage found by the daemon's open.
    fs::write(cred_dir.join("torn.enc"), b"gAAAAAtorn").unwrap();
    let daemon = env.start();
    let mut c = Conn::open(&daemon.socket);
    c.ok("cred.get", json!({"id": "kept"}));
    daemon.stop();
    let r = repairs(&env);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["via"], "daemon", "{}", r[0]);
    assert_eq!(r[0]["store"], "default", "{}", r[0]);
    assert_eq!(
        r[0]["detail"]["quarantined"],
        json!(["torn.enc"]),
        "{}",
        r[0]
    );
    assert_eq!(r[0]["result"], "ok", "{}", r[0]);
    // A clean open (the daemon again) records nothing more.
    let daemon = env.start();
    daemon.stop();
    assert_eq!(repairs(&env).len(), 1);
    // Damage found by an offline CLI's open.
    fs::write(cred_dir.join("other.enc"), b"not a token at all").unwrap();
    let o = run(env.holdfast(&["--offline", "cred", "set", "fresh"]), b"v\n");
    assert_eq!(o.code, 0, "{o}");
    let r = repairs(&env);
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(r[1]["via"], "cli", "{}", r[1]);
    assert_eq!(
        r[1]["detail"]["quarantined"],
        json!(["other.enc"]),
        "{}",
        r[1]
    );
    let v = verify(&env);
    assert_eq!(v.code, 0, "{v}");
    println!(
        "repairs at open: {} recorded (daemon, then offline CLI), a clean open none",
        r.len()
    );
}

/// A symlink planted at the audit directory: every use of the log refuses it, saying so (not
/// "the disk is full"), and nothing — lock, space reserve, segment — is created through it, by
/// the offline CLI or the daemon (an independent tester found both wrote there).
#[test]
fn a_symlink_at_the_audit_directory_is_refused_and_nothing_is_made_through_it() {
    let mut env = DaemonEnv::new("");
    let o = run(env.holdfast(&["--offline", "cred", "set", "a"]), b"v\n");
    assert_eq!(o.code, 0, "{o}");
    let audit = env.data_dir.join("audit");
    let outside = env.root.join("outside");
    fs::create_dir(&outside).unwrap();
    fs::rename(&audit, env.root.join("audit.real")).unwrap();
    std::os::unix::fs::symlink(&outside, &audit).unwrap();
    for args in [
        &["--offline", "cred", "set", "a"][..],
        &["--offline", "cred", "get", "a"][..],
        &["audit"][..],
        &["audit", "verify"][..],
    ] {
        let o = run(env.holdfast(args), b"w\n");
        assert_eq!(o.code, 7, "{args:?}: {o}");
        assert!(o.stderr.contains("is a symlink"), "{args:?}: {o}");
        assert!(!o.stderr.contains("disk is full"), "{args:?}: {o}");
    }
    let daemon = env.start();
    let mut c = Conn::open(&daemon.socket);
    let e = c.err("cred.get", json!({"id": "a"}));
    assert_eq!(e["data"]["kind"], "storage", "{e}");
    daemon.stop();
    let made: Vec<_> = fs::read_dir(&outside).unwrap().flatten().collect();
    assert!(made.is_empty(), "created through the link: {made:?}");
    // A directory where the space reserve belongs is said as such, not as a full disk.
    fs::remove_file(&audit).unwrap();
    fs::rename(env.root.join("audit.real"), &audit).unwrap();
    let reserve = audit.join("reserve");
    let _ = fs::remove_file(&reserve);
    fs::create_dir(&reserve).unwrap();
    let o = run(env.holdfast(&["--offline", "cred", "set", "a"]), b"w\n");
    assert_eq!(o.code, 7, "{o}");
    assert!(
        o.stderr
            .contains("is not a file where the audit log keeps its space reserve"),
        "{o}"
    );
    assert!(!o.stderr.contains("disk is full"), "{o}");
    println!("audit directory a symlink: 4 CLI commands and the daemon refused it, 0 files made through it; a directory at the reserve named as such");
}

/// A credential call whose params do not read (an unknown field, a wrong type) is refused
/// before any store is touched, and recorded like a call with a bad id (an independent tester
/// found `cred.release_lease` with a `lease_id` left no record); a run call's is not (no
/// credential was asked for).
#[test]
fn a_credential_call_whose_params_do_not_read_is_recorded() {
    let mut env = DaemonEnv::new("");
    let daemon = env.start();
    let mut c = Conn::open(&daemon.socket);
    for (method, params) in [
        ("cred.release_lease", json!({"id": "q", "lease_id": 1})),
        ("cred.get", json!({"id": 5})),
        ("admin.fsck", json!({"repair": "yes"})),
        ("stream.get", json!({"run": "r"})),
    ] {
        let e = c.err(method, params);
        assert_eq!(e["data"]["kind"], "invalid_params", "{method}: {e}");
    }
    daemon.stop();
    let got: Vec<(String, String, String)> = ops(&records(&env))
        .iter()
        .map(|r| {
            (
                s(r, "op").to_owned(),
                r["id"].as_str().unwrap_or("-").to_owned(),
                s(r, "result").to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String, String)> = [
        ("cred.release_lease", "q", "invalid_params"),
        ("cred.get", "-", "invalid_params"),
        ("admin.fsck", "-", "invalid_params"),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    assert_eq!(got, want);
    println!(
        "unreadable params: {} credential calls recorded, the run call not",
        got.len()
    );
}

/// The newest records cut from the log while the daemon runs: its next append finds the head
/// older than what it wrote, records an `audit.break` saying so, and numbers on after its
/// last number (none used twice); `verify` then fails (an independent tester's cut went
/// unnoticed and its numbers were reused).
#[test]
fn a_cut_of_the_newest_records_under_the_daemon_is_recorded_and_no_number_reused() {
    let mut env = DaemonEnv::new("");
    let daemon = env.start();
    let mut c = Conn::open(&daemon.socket);
    for i in 0..4 {
        c.ok("cred.set", json!({"id": format!("c{i}"), "value": "v"}));
    }
    let written = cut_newest_records(&env, 2);
    c.ok("cred.set", json!({"id": "after", "value": "v"}));
    daemon.stop();
    let recs = records(&env);
    let seqs: Vec<u64> = recs.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    // What is left ends at `written - 2`; everything appended since is numbered past `written`.
    let after: Vec<u64> = seqs.iter().copied().filter(|&q| q > written - 2).collect();
    assert!(!after.is_empty(), "{seqs:?}");
    assert!(
        after.iter().all(|&q| q > written),
        "a number used twice: {seqs:?}"
    );
    let brk = recs
        .iter()
        .find(|r| s(r, "op") == "audit.break")
        .unwrap_or_else(|| panic!("no audit.break: {recs:#?}"));
    assert!(
        brk["detail"]["why"].as_str().unwrap().contains("cut"),
        "{brk}"
    );
    let v = verify(&env);
    assert_eq!(v.code, 6, "{v}");
    println!("newest 2 records cut under the daemon: recorded ({}), numbering on without reuse, verify exit 6", brk["detail"]["why"]);
}

/// The same cut, refilled by another writer before the daemon's next append (offline CLIs
/// numbering on from what was left): the numbers look whole, but the daemon's last record is
/// not where it wrote it — caught by its hash (a fifth independent attack's refill went
/// unnoticed when only numbers were compared).
#[test]
fn a_cut_refilled_by_another_writer_is_caught_by_the_daemons_last_hash() {
    let mut env = DaemonEnv::new("");
    let daemon = env.start();
    let mut c = Conn::open(&daemon.socket);
    for i in 0..4 {
        c.ok("cred.set", json!({"id": format!("c{i}"), "value": "v"}));
    }
    cut_newest_records(&env, 2);
    for id in ["r1", "r2"] {
        let o = run(env.holdfast(&["--offline", "cred", "set", id]), b"v\n");
        assert_eq!(o.code, 0, "{o}");
    }
    c.ok("cred.set", json!({"id": "after", "value": "v"}));
    daemon.stop();
    let recs = records(&env);
    let brk = recs
        .iter()
        .find(|r| s(r, "op") == "audit.break")
        .unwrap_or_else(|| panic!("no audit.break: {recs:#?}"));
    assert!(
        brk["detail"]["why"].as_str().unwrap().contains("is gone"),
        "{brk}"
    );
    assert_eq!(verify(&env).code, 6);
    println!(
        "a cut refilled by offline CLIs: caught ({})",
        brk["detail"]["why"]
    );
}

/// A `cred set` too large to store, refused by the CLI before it reaches the daemon, is
/// recorded as the store records it when it refuses itself offline (`cred.set`,
/// `invalid_params`): a fifth independent attack found only the CLI's preceding read recorded.
#[test]
fn a_set_the_cli_refuses_before_the_daemon_is_recorded() {
    let mut env = DaemonEnv::new("");
    let daemon = env.start();
    let mut value = "w".repeat(900_000);
    value.push('\n');
    let o = run(env.holdfast(&["cred", "set", "big"]), value.as_bytes());
    assert_eq!(o.code, 2, "{o}");
    assert!(!o.stderr.contains("(offline)"), "{o}");
    daemon.stop();
    let recs = ops(&records(&env));
    let r = recs
        .iter()
        .find(|r| s(r, "op") == "cred.set")
        .unwrap_or_else(|| panic!("no cred.set record: {recs:#?}"));
    assert_eq!(
        (s(r, "id"), s(r, "result"), s(r, "via")),
        ("big", "invalid_params", "cli"),
        "{r}"
    );
    println!("a set refused by the CLI before the daemon: recorded {r}");
}

/// Calls the CLI refuses itself before reaching a store or the daemon (a malformed id, input
/// over the limit, a document that does not parse or names another id) are recorded as the
/// daemon records the same refusals (`invalid_params`; a malformed id is not written into the
/// log); a refusal the daemon made is not recorded twice (a sixth independent attack found the
/// CLI's own refusals unrecorded).
#[test]
fn the_clis_own_refusals_are_recorded_once() {
    let mut env = DaemonEnv::new("");
    let big = vec![b'a'; 1_048_577];
    let cases: [(&[&str], &[u8], &str); 4] = [
        (&["cred", "get", "../x"], b"", "cred.get"),
        (&["cred", "set", "big2"], &big, "cred.set"),
        (
            &["cred", "set", "--document", "c2"],
            b"{\"id\":\"c3\"}",
            "cred.set",
        ),
        (
            &["cred", "set", "--document", "c4"],
            b"not json",
            "cred.set",
        ),
    ];
    let daemon = env.start();
    for offline in [true, false] {
        for (args, stdin, _) in &cases {
            let mut full = Vec::new();
            if offline {
                full.push("--offline");
            }
            full.extend_from_slice(args);
            let o = run(env.holdfast(&full), stdin);
            assert_eq!(o.code, 2, "{full:?}: {o}");
        }
    }
    // Refused by the daemon (a time hive cannot read): recorded there, not by the CLI too.
    let o = run(
        env.holdfast(&["cred", "set", "--document", "t"]),
        br#"{"id":"t","keys":{},"created_at":"yesterday"}"#,
    );
    assert_eq!(o.code, 2, "{o}");
    daemon.stop();
    let recs = ops(&records(&env));
    let cli: Vec<(String, String)> = recs
        .iter()
        .filter(|r| s(r, "via") == "cli")
        .map(|r| (s(r, "op").to_owned(), s(r, "result").to_owned()))
        .collect();
    let want: Vec<(String, String)> = cases
        .iter()
        .chain(cases.iter())
        .map(|(_, _, op)| (op.to_string(), "invalid_params".to_string()))
        .collect();
    assert_eq!(cli, want);
    assert!(
        recs.iter().all(|r| r["id"].as_str() != Some("../x")),
        "a malformed id was written into the log"
    );
    let t: Vec<&Value> = recs.iter().filter(|r| r["id"] == "t").collect();
    assert!(t.iter().all(|r| s(r, "via") == "daemon"), "{t:?}");
    println!("the CLI's own refusals: {} recorded (4 offline, 4 beside the daemon), the daemon's refusal once", cli.len());
}
