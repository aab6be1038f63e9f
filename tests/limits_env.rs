//! The daemon against a hostile environment (SECURITY-CHECKLIST 21, 35 and 36): a real full disk
//! (a 256 KiB tmpfs in a private mount namespace), a zero RLIMIT_MEMLOCK, and a wall clock that
//! jumps an hour either way while a lease runs.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::process::Command;

use serde_json::Value;

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;
use common::*;

/// Item 21: the data directory on a tiny tmpfs, filled through the daemon until a write fails.
/// The failing `set` gets a `storage` error (exit 7) that says the disk is full; every
/// credential stored before it still reads back; the daemon keeps serving; `store fsck` finds
/// every credential readable and nothing wrong but index drift (the index flush met the full
/// disk too; the index is a cache of the files and is rewritten on the next open with space).
#[test]
fn a_full_disk_fails_the_write_and_loses_nothing() {
    let env = DaemonEnv::new("");
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
    use serde_json::json;
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
