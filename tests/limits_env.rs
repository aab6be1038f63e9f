//! The daemon against a hostile environment (SECURITY-CHECKLIST 21, 35 and 36): a real full disk
//! (a 256 KiB tmpfs in a private mount namespace), a zero RLIMIT_MEMLOCK, and a wall clock that
//! jumps an hour either way while a lease runs.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;
use common::*;

/// Item 21: the data directory on a tiny tmpfs, filled through the daemon until a write fails.
/// The failing `set` gets a `storage` error (exit 7) that says the disk is full; every
/// credential stored before it still reads back; the daemon keeps serving; `store fsck` finds
/// every credential readable and nothing wrong but index drift (the index flush met the full
/// disk too; the index is a cache of the files and is rewritten on the next open with space).
/// The audit log (on the same tmpfs) keeps a 32 KiB space reserve — the default 1 MiB would
/// not fit — which takes the records of the reads once the disk is full (docs/security.md,
/// row 34: changes are refused then, reads go on while the reserve lasts).
#[test]
fn a_full_disk_fails_the_write_and_loses_nothing() {
    let env = DaemonEnv::new("[audit]\nreserve_bytes = 32768\n");
    let probe = Command::new("unshare")
        .args(["-m", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !probe {
        println!("full disk: SKIPPED (no mount namespace here: unshare -m failed)");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_holdfast");
    let mnt = env.root.join("tiny");
    std::fs::create_dir(&mnt).unwrap();
    // One shell in its own mount namespace: mount, init, start the daemon, fill, check.
    let script = format!(
        r#"
set -u
mount -t tmpfs -o size=256k,mode=0700 tmpfs "{mnt}" || exit 90
export HOLDFAST_DATA_DIR="{mnt}/data"
hf() {{ timeout 30 "{bin}" --config "{config}" "$@"; }}
hf init >/dev/null 2>&1 || exit 91
"{bin}" --config "{config}" daemon </dev/null >/dev/null 2>"{root}/daemon-tiny.log" &
daemon=$!
for i in $(seq 1 200); do [ -S "$XDG_RUNTIME_DIR/holdfast/holdfast.sock" ] && break; sleep 0.05; done
value=$(head -c 6000 /dev/zero | tr '\0' 'v')
stored=0
failed=""
for i in $(seq 1 1000); do
  if printf '%s-%s\n' "$value" "$i" | hf cred set "cred-$i" >/dev/null 2>"{root}/set.err"; then
    stored=$i
  else
    failed=$?
    break
  fi
done
echo "stored=$stored"
echo "failed=$failed"
echo "error=$(tr '\n' ' ' < "{root}/set.err")"
ok=0
for i in $(seq 1 "$stored"); do
  got=$(hf cred get "cred-$i" 2>/dev/null)
  [ "$got" = "$value-$i" ] && ok=$((ok + 1))
done
echo "readable=$ok"
hf status >/dev/null 2>&1 && echo "serving=yes" || echo "serving=no"
kill -TERM $daemon; wait $daemon
echo "daemon_exit=$?"
echo "killed"
hf --offline store fsck </dev/null >"{root}/fsck.out" 2>&1
echo "fsck=$?"
umount "{mnt}"
echo "done"
"#,
        mnt = mnt.display(),
        bin = bin,
        config = env.config.display(),
        root = env.root.display(),
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
    let stored: usize = field("stored").parse().unwrap();
    let readable: usize = field("readable").parse().unwrap();
    println!(
        "full disk (256 KiB tmpfs): {stored} credentials stored before the write that failed \
         (exit {}: {}); {readable}/{stored} read back; serving={}; fsck exit {}",
        field("failed"),
        field("error"),
        field("serving"),
        field("fsck")
    );
    assert!(stored > 0, "nothing fit: {out}");
    assert_eq!(field("failed"), "7", "the failing set: {out}");
    assert!(
        field("error").contains("No space left on device"),
        "the error says why: {out}"
    );
    assert_eq!(readable, stored, "a stored credential was lost: {out}");
    assert_eq!(field("serving"), "yes", "{out}");
    assert_eq!(field("daemon_exit"), "0", "{out}");
    // fsck: every stored credential decrypts. The only finding allowed is index drift: the
    // daemon's deferred index flush also met the full disk (it says so in its log and the next
    // open with space repairs it; the index is a cache of the files).
    let fsck = std::fs::read_to_string(env.root.join("fsck.out")).unwrap_or_default();
    assert!(
        fsck.contains(&format!("{stored} readable")),
        "fsck after the full disk:\n{fsck}"
    );
    for line in fsck
        .lines()
        .filter(|l| l.starts_with("  ") && l.contains(':'))
    {
        let finding = line.trim();
        assert!(
            finding.starts_with("files:")
                || finding.starts_with("index:")
                || finding.starts_with("missing from index:"),
            "unexpected fsck finding {finding:?}:\n{fsck}"
        );
    }
}

/// Item 35: with RLIMIT_MEMLOCK at 0 the daemon starts, says once that memory is not locked,
/// and works.
#[test]
fn a_zero_memlock_limit_is_logged_not_fatal() {
    let mut env = DaemonEnv::new("");
    let d = env.start_with(&DaemonOpts {
        shell_prefix: Some("ulimit -l 0".into()),
        ..Default::default()
    });
    let mut c = Conn::open(&d.socket);
    let st: Value = c.ok("admin.status", serde_json::json!({}));
    assert_eq!(st["stores"][0]["sealed"], Value::Bool(false), "{st}");
    drop(c);
    let log = d.stop();
    let said = log.matches("memory is not locked").count();
    assert_eq!(said, 1, "{log}");
    assert!(log.contains("RLIMIT_MEMLOCK 0 bytes"), "{log}");
    println!("memlock 0: started, served, said so once");
}

fn libfaketime() -> Option<std::path::PathBuf> {
    let out = Command::new("sh")
        .args([
            "-c",
            "ls /usr/lib/*/faketime/libfaketimeMT.so.1 2>/dev/null | head -1",
        ])
        .output()
        .ok()?;
    let p = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!p.is_empty()).then(|| p.into())
}

/// Item 36: a refresh lease's expiry follows the monotonic clock. The daemon runs under
/// libfaketime with its wall clock read from a file (monotonic left real); while connection A
/// holds a 3 s lease, the daemon's wall clock jumps +1 h (a wall-clock expiry would free the
/// lease at once) and then -1 h (it would hold it an hour): B is refused until 3 real seconds
/// have passed, and granted right after.
#[test]
fn lease_expiry_follows_the_monotonic_clock_when_the_wall_clock_jumps() {
    let Some(lib) = libfaketime() else {
        println!("wall-clock jump: SKIPPED (libfaketime not installed; scripts/test-deps.sh installs it)");
        return;
    };
    let mut env = DaemonEnv::new("");
    let clock = env.root.join("faketime");
    std::fs::write(&clock, "+0\n").unwrap();
    let d = env.start_with(&DaemonOpts {
        env: vec![
            ("LD_PRELOAD".into(), lib.display().to_string()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                clock.display().to_string(),
            ),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ],
        ..Default::default()
    });
    let mut a = Conn::open(&d.socket);
    let mut b = Conn::open(&d.socket);
    a.ok("cred.set", serde_json::json!({"id": "oauth", "value": "v"}));
    let lease = |c: &mut Conn| -> Value {
        c.ok(
            "cred.refresh_lease",
            serde_json::json!({"id": "oauth", "ttl_ms": 3000}),
        )
    };
    let granted_at = std::time::Instant::now();
    assert_eq!(lease(&mut a)["granted"], Value::Bool(true));
    // The daemon's wall clock an hour ahead: the lease is still A's.
    std::fs::write(&clock, "+1h\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Proof the daemon's wall clock really moved: a credential written now is stamped an hour
    // ahead of ours.
    a.ok("cred.set", serde_json::json!({"id": "stamp", "value": "v"}));
    let listed = a.ok("cred.list", serde_json::json!({}));
    let stamp = listed["credentials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "stamp")
        .and_then(|c| c["updated_at"].as_str())
        .and_then(holdfast::timefmt::parse)
        .expect("stamp's updated_at");
    let ahead_s = (stamp - holdfast::timefmt::now_micros()) / 1_000_000;
    assert!(
        (3500..=3700).contains(&ahead_s),
        "the daemon's wall clock is {ahead_s} s off ours, not +1 h: is libfaketime working?"
    );
    let b1 = lease(&mut b);
    assert_eq!(b1["granted"], Value::Bool(false), "after +1 h: {b1}");
    // An hour behind: still A's, and not for an extra hour either.
    std::fs::write(&clock, "-1h\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let b2 = lease(&mut b);
    assert_eq!(b2["granted"], Value::Bool(false), "after -1 h: {b2}");
    let left = b2["expires_in_ms"].as_u64().unwrap();
    assert!(left <= 3000, "the expiry moved with the wall clock: {b2}");
    // Three real seconds after the grant: B gets it.
    std::thread::sleep(std::time::Duration::from_millis(3200).saturating_sub(granted_at.elapsed()));
    let b3 = lease(&mut b);
    assert_eq!(
        b3["granted"],
        Value::Bool(true),
        "3 s after the grant: {b3}"
    );
    println!(
        "wall-clock jump: daemon clock {ahead_s} s ahead, then an hour behind; the 3 s lease held \
         through both and expired after {:.1?} real ({left} ms were left after the jumps)",
        granted_at.elapsed()
    );
    drop((a, b));
    d.stop();
}

/// Item 34: holdfast keeps no audit log; its log is operational and best effort
/// (docs/security.md, docs/operations.md "Logs"). With its log going to a device that refuses
/// every write (`/dev/full`: ENOSPC) at debug level, every kind of write still succeeds and is
/// durable: a failing log never blocks or fails an operation, nor takes the daemon down.
#[test]
fn an_unwritable_log_never_blocks_or_fails_an_operation() {
    for format in ["human", "json"] {
        unwritable_log(format);
        println!("{format} log on /dev/full at debug level: set, get, begin, append, commit, log_node and a refusal all answered; durable across a restart");
    }
}

fn unwritable_log(format: &str) {
    let mut env = DaemonEnv::new("");
    let d = env.start_with(&DaemonOpts {
        shell_prefix: Some("exec 2>/dev/full".into()),
        env: vec![("RUST_LOG".into(), "debug".into())],
        args: vec!["--log-format".into(), format.into()],
        ..Default::default()
    });
    let mut c = Conn::open(&d.socket);
    c.ok("cred.set", json!({"id": "k", "value": "v1"}));
    let g = c.ok("cred.get", json!({"id": "k"}));
    assert_eq!(g["credential"]["keys"]["api_key"]["value"], "v1", "{g}");
    let b = c.ok("stream.begin", json!({"run_id": "r"}));
    let sid = b["stream_id"].clone();
    c.ok(
        "stream.append",
        json!({"run_id": "r", "stream_id": sid, "seq": 1,
               "events": [{"type": "text", "text": "hello"}]}),
    );
    c.ok(
        "stream.commit",
        json!({"run_id": "r", "stream_id": sid, "content_from_stream": true,
               "final_message": {"role": "assistant"}}),
    );
    c.ok(
        "run.log_node",
        json!({"run_id": "r", "detail": {"node_id": "n", "attempt": 1}}),
    );
    // A refused request is still answered.
    let e = c.err("cred.get", json!({"id": "../x"}));
    assert_eq!(e["data"]["kind"], "invalid_params", "{e}");
    drop(c);
    let log = d.stop();
    assert!(log.is_empty(), "the log went somewhere: {log}");
    // What was acknowledged is there for the next daemon (which logs normally).
    let d = env.start();
    let mut c = Conn::open(&d.socket);
    let g = c.ok("cred.get", json!({"id": "k"}));
    assert_eq!(g["credential"]["keys"]["api_key"]["value"], "v1", "{g}");
    let s = c.ok("stream.get", json!({"run_id": "r", "reveal": true}));
    assert_eq!(s["status"], "committed", "{s}");
    assert_eq!(s["final_message"]["content"], "hello", "{s}");
    drop(c);
    d.stop();
}

/// Issue 16: streams and run logs on a full disk. The daemon runs in a private mount namespace
/// with its data directory on a 40 MiB tmpfs (one 16 MiB journal segment fits, a second does
/// not once the disk is filled); a `sleep` holds the namespace so that a restarted daemon
/// (`nsenter`) finds the same files. With the disk filled to the last byte:
/// `run.log_node`, `checkpoint.put` and `stream.commit` fail with a `storage` error that says
/// the disk is full, and so does the append that needs the journal's next segment; every
/// acknowledged write still reads back and the daemon keeps serving reads. Once space is
/// freed, run-log entries, checkpoints and commits work again at once; the journal, which
/// refuses appends after a failed segment start (memory is ahead of the disk until a replay:
/// docs/design.md, the stream journal's "Failures"), takes appends again after a restart, and
/// every append acknowledged before the failure is there.
#[test]
fn a_full_disk_fails_stream_and_run_log_writes_and_loses_nothing() {
    let ok = |prog: &str, args: &[&str]| {
        Command::new(prog)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !ok("unshare", &["-m", "true"]) {
        println!(
            "full disk (streams, run logs): SKIPPED (no mount namespace here: unshare -m failed)"
        );
        return;
    }
    if !ok("nsenter", &["--version"]) {
        println!("full disk (streams, run logs): SKIPPED (nsenter not installed: util-linux)");
        return;
    }
    let env = DaemonEnv::new("");
    let bin = env!("CARGO_BIN_EXE_holdfast");
    let mnt = env.root.join("tiny");
    std::fs::create_dir(&mnt).unwrap();
    let data = mnt.join("data");
    let holder_pid = env.root.join("holder.pid");
    let script = format!(
        r#"
set -u
mount -t tmpfs -o size=40m,mode=0700 tmpfs "{mnt}" || exit 90
"{bin}" --config "{config}" init >/dev/null 2>&1 || exit 91
sleep 100000 </dev/null >/dev/null 2>&1 &
echo $! > "{holder}"
exec "{bin}" --config "{config}" daemon 2>"{root}/daemon-1.log"
"#,
        mnt = mnt.display(),
        config = env.config.display(),
        holder = holder_pid.display(),
        root = env.root.display(),
    );
    let mut c = Command::new("unshare");
    c.args(["-m", "sh", "-c", &script])
        .stdin(std::process::Stdio::null());
    clean_env(&mut c, &env.home).env("HOLDFAST_DATA_DIR", &data);
    let first = c.spawn().unwrap();
    let mut daemon = RunningDaemon::adopt(first, env.socket.clone(), env.root.join("daemon-1.log"));
    daemon.wait_ready(Duration::from_secs(30));
    let holder: u32 = std::fs::read_to_string(&holder_pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The namespace's holder: killed (by its pid) when the test ends, however it ends.
    struct Holder(u32);
    impl Drop for Holder {
        fn drop(&mut self) {
            if let Some(pid) = rustix::process::Pid::from_raw(self.0 as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
    let _holder = Holder(holder);
    // The tmpfs as the test sees it: through the holder's root.
    let inside = PathBuf::from(format!("/proc/{holder}/root")).join(mnt.strip_prefix("/").unwrap());

    let mut c = Conn::open(&env.socket);
    // Acknowledged before the disk fills: a run with text, a run log, a checkpoint.
    let kept = c.ok("stream.begin", json!({"run_id": "kept", "model": "m"}));
    let kept_sid = kept["stream_id"].as_str().unwrap().to_owned();
    let mut kept_text = String::new();
    for seq in 1..=5u64 {
        let t = format!("kept {seq}. ");
        c.ok(
            "stream.append",
            json!({"run_id": "kept", "stream_id": kept_sid, "seq": seq,
                   "events": [{"type": "text", "text": t}]}),
        );
        kept_text += &t;
    }
    for n in 1..=3 {
        c.ok(
            "run.log_node",
            json!({"run_id": "log", "detail": {"node_id": format!("n{n}"), "node_name": "n",
                   "node_type": "llm", "success": true}}),
        );
    }
    let snapshot = |text: &str| {
        json!({"thread_id": "t", "upstream_model": "m", "partial_text": text,
               "completed_tool_calls": [], "in_flight_tool": null})
    };
    c.ok(
        "checkpoint.put",
        json!({"run_id": "ck", "snapshot": snapshot("before")}),
    );
    // Runs whose appends will need the next segment: begun now, while there is space. Each
    // takes 10 appends of 256 KiB (a run keeps at most 3 MiB of text).
    let mut bigs: Vec<(String, String, u64)> = (0..24)
        .map(|i| {
            let run = format!("big{i}");
            let b = c.ok("stream.begin", json!({"run_id": run, "model": "m"}));
            (run, b["stream_id"].as_str().unwrap().to_owned(), 0)
        })
        .collect();

    // Fill the disk to its last byte.
    let filler = inside.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let mut filled = 0u64;
    for chunk in [1 << 20, 4096, 1] {
        let buf = vec![b'f'; chunk];
        while f.write_all(&buf).is_ok() {
            filled += chunk as u64;
        }
    }
    drop(f);

    let storage_full = |e: &Value, what: &str| {
        assert_eq!(e["data"]["kind"], "storage", "{what}: {e}");
        assert!(
            e["message"]
                .as_str()
                .unwrap_or("")
                .contains("No space left on device"),
            "{what}: the error says why: {e}"
        );
    };
    // An entry longer than a page: the file's last page may have room for a short one.
    let e = c.err(
        "run.log_node",
        json!({"run_id": "log", "detail": {"node_id": "n4", "node_name": "n",
               "node_type": "llm", "success": true, "summary": "s".repeat(16 * 1024)}}),
    );
    storage_full(&e, "run.log_node on a full disk");
    let full_error = e["message"].as_str().unwrap_or("").to_owned();
    let e = c.err(
        "checkpoint.put",
        json!({"run_id": "ck", "snapshot": snapshot("during")}),
    );
    storage_full(&e, "checkpoint.put on a full disk");
    let e = c.err(
        "stream.commit",
        json!({"run_id": "kept", "stream_id": kept_sid, "content_from_stream": true,
               "final_message": {"role": "assistant"}}),
    );
    storage_full(&e, "stream.commit on a full disk");
    // Appends of 256 KiB until one needs the next segment, which cannot be made.
    let chunk = "x".repeat(64 * 1024);
    // `seq` is the first event's; an append of 4 events acknowledges up to seq + 3.
    let (mut appends, mut journal_error, mut last) = (0usize, None, 0usize);
    while appends < 240 {
        last = appends / 10;
        let (run, sid, acked) = &mut bigs[last];
        let seq = *acked + 1;
        let r = c.call(
            "stream.append",
            json!({"run_id": run, "stream_id": sid, "seq": seq,
                   "events": [{"type": "text", "text": chunk}, {"type": "text", "text": chunk},
                              {"type": "text", "text": chunk}, {"type": "text", "text": chunk}]}),
        );
        match r.get("error") {
            None => {
                assert_eq!(r["result"]["acked_seq"], seq + 3, "{r}");
                *acked = seq + 3;
                appends += 1;
            }
            Some(e) => {
                journal_error = Some(e.clone());
                break;
            }
        }
    }
    let journal_error = journal_error.expect("240 appends of 256 KiB fit on a full 40 MiB disk");
    let (big, big_sid, big_acked) = bigs[last].clone();
    let big_total: u64 = bigs.iter().map(|b| b.2).sum();
    storage_full(&journal_error, "the append that needed a new segment");
    // Reads still served; nothing acknowledged lost.
    let got = c.ok("stream.get", json!({"run_id": "kept", "reveal": true}));
    assert_eq!(got["status"], "streaming", "{got}");
    assert_eq!(
        got["checkpoint"]["partial_text"],
        kept_text.as_str(),
        "{got}"
    );
    let log = c.ok("run.get", json!({"run_id": "log"}));
    assert_eq!(log["details"].as_array().map(Vec::len), Some(3), "{log}");
    let ck = c.ok("checkpoint.get", json!({"run_id": "ck"}));
    assert_eq!(ck["partial_text"], "before", "{ck}");

    // Space again: run logs, checkpoints and commits work at once.
    std::fs::remove_file(&filler).unwrap();
    c.ok(
        "run.log_node",
        json!({"run_id": "log", "detail": {"node_id": "n4", "node_name": "n",
               "node_type": "llm", "success": true}}),
    );
    c.ok(
        "checkpoint.put",
        json!({"run_id": "ck", "snapshot": snapshot("after")}),
    );
    c.ok(
        "stream.commit",
        json!({"run_id": "kept", "stream_id": kept_sid, "content_from_stream": true,
               "final_message": {"role": "assistant"}}),
    );
    // The journal refuses appends until a restart replays what is on disk.
    let e = c.err(
        "stream.append",
        json!({"run_id": big, "stream_id": big_sid, "seq": big_acked + 1,
               "events": [{"type": "text", "text": "after"}]}),
    );
    assert_eq!(e["data"]["kind"], "storage", "{e}");
    drop(c);
    let log1 = daemon.stop();

    let mut again = Command::new("nsenter");
    again
        .arg(format!("--mount=/proc/{holder}/ns/mnt"))
        .args([bin, "--config"])
        .arg(&env.config)
        .arg("daemon")
        .stdin(std::process::Stdio::null())
        .stderr(std::fs::File::create(env.root.join("daemon-2.log")).unwrap());
    clean_env(&mut again, &env.home).env("HOLDFAST_DATA_DIR", &data);
    let mut daemon = RunningDaemon::adopt(
        again.spawn().unwrap(),
        env.socket.clone(),
        env.root.join("daemon-2.log"),
    );
    daemon.wait_ready(Duration::from_secs(30));
    let mut c = Conn::open(&env.socket);
    let got = c.ok("stream.get", json!({"run_id": "kept", "reveal": true}));
    assert_eq!(got["status"], "committed", "{got}");
    assert_eq!(got["final_message"]["content"], kept_text.as_str(), "{got}");
    for (run, _, acked) in &bigs {
        let got = c.ok("stream.get", json!({"run_id": run, "reveal": false}));
        let next = got["next_seq"].as_u64().unwrap_or(0);
        assert!(
            next > *acked,
            "{run}: acknowledged appends lost: next_seq {next}, {acked} acked"
        );
    }
    let next = c.ok("stream.get", json!({"run_id": big, "reveal": false}))["next_seq"]
        .as_u64()
        .unwrap_or(0);
    let resumed = c.ok("stream.begin", json!({"run_id": big, "takeover": true}));
    c.ok(
        "stream.append",
        json!({"run_id": big, "stream_id": resumed["stream_id"], "seq": next,
               "events": [{"type": "text", "text": "after the restart"}]}),
    );
    let log = c.ok("run.get", json!({"run_id": "log"}));
    assert_eq!(log["details"].as_array().map(Vec::len), Some(4), "{log}");
    let ck = c.ok("checkpoint.get", json!({"run_id": "ck"}));
    assert_eq!(ck["partial_text"], "after", "{ck}");
    drop(c);
    let log2 = daemon.stop();
    println!(
        "full disk (40 MiB tmpfs), streams and run logs: filled {filled} bytes; run.log_node, \
         checkpoint.put and stream.commit refused ({}); {appends} appends of 256 KiB \
         ({big_total} events over {} runs) acknowledged before the journal's next segment could not be made ({}); after freeing \
         the space: log, checkpoint and commit at once, appends after a restart (next_seq \
         {next}); nothing acknowledged lost",
        full_error,
        last + 1,
        journal_error["message"].as_str().unwrap_or(""),
    );
    for l in [&log1, &log2] {
        assert!(!l.contains("panicked"), "{l}");
    }
}
