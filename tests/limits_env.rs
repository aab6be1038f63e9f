//! The daemon against a hostile environment (SECURITY-CHECKLIST 21 and 35): a real full disk (a
//! 256 KiB tmpfs in a private mount namespace) and a zero RLIMIT_MEMLOCK.

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
