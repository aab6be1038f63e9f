//! Bad input and hostile files: id rules, tampered / truncated / empty / swapped credential
//! files, clock skew, missing / wrong / unsafe keys, unsafe store permissions, and secrets
//! never leaking into output or `Debug` (SECURITY-CHECKLIST items 9, 25-30, 33).
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use common::{clean_env, holdfast_cmd, run, store_cmd, store_config, value_of, Out, TestStore};
use holdfast::crypto::{generate_key, keys, KeySource, Keyring, Secret};
use holdfast::durable::{perms, Faults};
use holdfast::error::ErrorKind;
use holdfast::store::{id, Credential, CredentialStore, Error, SealedReason, StoreOptions};

// ---------------------------------------------------------------------------------------------
// Helpers

const STORE_NAME: &str = "bad-input-test";

impl TestStore {
    /// A store holding `ids`, each with value `value-of-<id>`.
    fn with(ids: &[&str]) -> Self {
        let ts = TestStore::new(STORE_NAME);
        let store = ts.open();
        for id in ids {
            put(&store, id, &value_for(id));
        }
        drop(store);
        ts
    }

    fn enc(&self, id: &str) -> PathBuf {
        self.base.join("credentials").join(id::file_name(id))
    }
}

fn value_for(id: &str) -> String {
    format!("value-of-{id}")
}

fn put(store: &CredentialStore, id: &str, value: &str) -> u64 {
    store
        .set(Credential::api_key(id, Secret::new(value.into())), None)
        .unwrap_or_else(|e| panic!("set {id}: {e}"))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn write_private(p: &Path, bytes: &[u8]) {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(p)
        .unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

/// Everything about a directory tree that a modification would change: type, mode, owner,
/// size, mtime and content of every entry.
type Snapshot = BTreeMap<PathBuf, (String, Vec<u8>)>;

fn snapshot(root: &Path) -> Snapshot {
    fn walk(root: &Path, dir: &Path, out: &mut Snapshot) {
        let mut entries: Vec<_> = fs::read_dir(dir).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let desc = format!(
                "{:?} mode {:o} uid {} size {} mtime {}.{:09}",
                m.file_type(),
                m.mode(),
                m.uid(),
                m.size(),
                m.mtime(),
                m.mtime_nsec()
            );
            if m.file_type().is_symlink() {
                let target = fs::read_link(&p).unwrap();
                out.insert(rel, (desc, target.into_os_string().into_vec()));
            } else if m.is_dir() {
                out.insert(rel, (desc, Vec::new()));
                walk(root, &p, out);
            } else {
                out.insert(rel, (desc, fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Snapshot::new();
    let m = fs::symlink_metadata(root).unwrap();
    out.insert(
        PathBuf::from("."),
        (
            format!(
                "mode {:o} mtime {}.{:09}",
                m.mode(),
                m.mtime(),
                m.mtime_nsec()
            ),
            Vec::new(),
        ),
    );
    walk(root, root, &mut out);
    out
}

fn assert_unchanged(before: &Snapshot, after: &Snapshot, what: &str) {
    if before == after {
        return;
    }
    let mut diffs = Vec::new();
    for (p, v) in before {
        match after.get(p) {
            None => diffs.push(format!("removed {}", p.display())),
            Some(w) if w != v => diffs.push(format!("changed {}: {} -> {}", p.display(), v.0, w.0)),
            _ => {}
        }
    }
    for p in after.keys().filter(|p| !before.contains_key(*p)) {
        diffs.push(format!("created {}", p.display()));
    }
    panic!("{what}: the store was modified:\n  {}", diffs.join("\n  "));
}

fn is_root() -> bool {
    perms::euid() == 0
}

// ---------------------------------------------------------------------------------------------
// Checklist 9: ids

/// Ids that break a rule, with a label for messages.
fn bad_ids() -> Vec<(&'static str, Vec<u8>)> {
    let mut v: Vec<(&'static str, Vec<u8>)> = vec![
        ("../x", b"../x".to_vec()),
        ("/etc/passwd", b"/etc/passwd".to_vec()),
        (".", b".".to_vec()),
        ("..", b"..".to_vec()),
        ("empty", b"".to_vec()),
        ("NUL byte", b"a\0b".to_vec()),
        ("252 bytes", vec![b'a'; 252]),
        ("256 bytes", vec![b'a'; 256]),
        ("4096 bytes", vec![b'a'; 4096]),
        ("leading -", b"-rf".to_vec()),
        ("leading .", b".hidden".to_vec()),
        ("a//b", b"a//b".to_vec()),
        ("a/../b", b"a/../b".to_vec()),
        ("a/./b", b"a/./b".to_vec()),
        ("trailing /", b"a/".to_vec()),
        ("ends in /..", b"a/..".to_vec()),
        ("backslash", b"a\\b".to_vec()),
        ("backslash ..", b"..\\x".to_vec()),
        ("newline", b"a\nb".to_vec()),
        ("tab", b"a\tb".to_vec()),
        ("escape", b"a\x1b[31m".to_vec()),
        (
            "right-to-left override",
            "pay\u{202E}lanigiro".as_bytes().to_vec(),
        ),
        ("bidi isolate", "a\u{2067}b".as_bytes().to_vec()),
        ("zero-width space", "open\u{200B}ai".as_bytes().to_vec()),
        ("byte order mark", "\u{FEFF}openai".as_bytes().to_vec()),
        ("DEL", b"a\x7f".to_vec()),
        ("C1 control", "a\u{85}b".as_bytes().to_vec()),
        ("non-UTF-8 0xff", b"a\xffb".to_vec()),
        ("overlong '/'", b"a\xc0\xafb".to_vec()),
        ("lone surrogate", b"a\xed\xa0\x80".to_vec()),
    ];
    // 200 multi-byte characters: 400 bytes, over the byte limit though 200 chars.
    v.push(("200 chars / 400 bytes", "é".repeat(200).into_bytes()));
    v
}

#[test]
fn every_id_rule_is_enforced_by_the_library_before_any_file_access() {
    let ts = TestStore::with(&["existing"]);
    let store = ts.open();
    let before = snapshot(&ts.base);
    let mut checked = 0;
    for (label, bytes) in bad_ids() {
        let e = id::validate_bytes(&bytes).expect_err(label);
        assert!(e.to_string().contains("invalid id"), "{label}: {e}");
        let Ok(s) = std::str::from_utf8(&bytes) else {
            checked += 1;
            continue; // not UTF-8: cannot even be a &str id
        };
        assert!(id::validate(s).is_err(), "{label}");
        let results: Vec<(&str, Result<(), Error>)> = vec![
            ("get", store.get(s).map(drop)),
            ("exists", store.exists(s).map(drop)),
            ("delete", store.delete(s).map(drop)),
            (
                "set",
                store
                    .set(Credential::api_key(s, Secret::new("x".into())), None)
                    .map(drop),
            ),
            (
                "update",
                store
                    .update(s, None, |_| {
                        Ok(Credential::api_key(s, Secret::new("x".into())))
                    })
                    .map(drop),
            ),
        ];
        for (op, r) in results {
            let e = r.expect_err(&format!("{op} {label} must fail"));
            assert!(matches!(e, Error::InvalidId(_)), "{op} {label}: {e:?}");
            assert_eq!(e.kind(), ErrorKind::InvalidParams, "{op} {label}");
            assert_eq!(e.kind().exit_code(), 2);
            let msg = e.to_string();
            assert!(msg.contains("invalid id"), "{op} {label}: {msg}");
            // The message never echoes a hostile id.
            if s.len() > 2 {
                assert!(
                    !msg.contains(s),
                    "{op} {label}: message echoes the id: {msg}"
                );
            }
            checked += 1;
        }
    }
    drop(store);
    assert_unchanged(&before, &snapshot(&ts.base), "rejected ids");
    assert!(!ts.base.parent().unwrap().join("x").exists());
    println!(
        "id rules (library): {} bad ids, {checked} rejected operations, store tree unchanged",
        bad_ids().len()
    );
    // Allowed shapes still work.
    let store = ts.open();
    for ok in [
        "a/b",
        "team/github/token",
        "a..b.c",
        "x-y",
        "ünï",
        &"a".repeat(251),
        &format!("{}/x", "é".repeat(124)),
    ] {
        assert!(id::validate(ok).is_ok(), "{ok}");
        put(&store, ok, &value_for(ok));
        assert_eq!(value_of(&store.get(ok).unwrap()), value_for(ok));
    }
}

#[test]
fn every_id_rule_is_enforced_by_the_cli() {
    let ts = TestStore::with(&["existing"]);
    let before = snapshot(&ts.base);
    let mut runs = 0;
    let mut skipped = Vec::new();
    for (label, bytes) in bad_ids() {
        if bytes.contains(&0) {
            // argv cannot carry a NUL byte (exec's strings are NUL-terminated).
            skipped.push(label);
            continue;
        }
        let arg = OsString::from_vec(bytes.clone());
        for cmd in ["get", "set", "delete", "exists"] {
            let args: Vec<&OsStr> = vec![
                OsStr::new("cred"),
                OsStr::new(cmd),
                OsStr::new("--"),
                arg.as_os_str(),
            ];
            let o = ts.cli(&args, b"some-value\n");
            assert_eq!(o.code, 2, "cred {cmd} {label}: {o}");
            assert!(o.stderr.contains("invalid id"), "cred {cmd} {label}: {o}");
            assert!(o.stdout.is_empty(), "cred {cmd} {label}: {o}");
            runs += 1;
        }
    }
    assert_unchanged(&before, &snapshot(&ts.base), "CLI with rejected ids");
    println!(
        "id rules (CLI): {runs} invocations exit 2 with \"invalid id\", store tree unchanged \
         (not testable through argv: {skipped:?})"
    );
}

/// Checklist 9 asks that a rejected id causes no file system call at all. strace the CLI.
#[test]
fn rejected_id_makes_no_file_syscall_on_the_store() {
    let ts = TestStore::with(&["existing"]);
    let probe = Command::new("strace").arg("-V").output();
    if !probe.map(|o| o.status.success()).unwrap_or(false) {
        println!("SKIPPED: strace is not available");
        return;
    }
    let trace = ts.root.join("trace.txt");
    let base = ts.base.to_str().unwrap().to_owned();
    let key = ts.key.to_str().unwrap().to_owned();
    let mut total = 0;
    for (cmd, id) in [
        ("get", "../x"),
        ("set", "/etc/passwd"),
        ("delete", ".."),
        ("exists", "a//b"),
    ] {
        let mut c = Command::new("strace");
        clean_env(&mut c, &ts.home());
        c.args(["-f", "-e", "trace=%file,%desc", "-o"])
            .arg(&trace)
            .arg(env!("CARGO_BIN_EXE_holdfast"))
            .arg("--store-dir")
            .arg(&ts.base)
            .arg("--key-file")
            .arg(&ts.key)
            .args(["cred", cmd, "--", id]);
        let o = run(c, b"value\n");
        if o.code != 2 && o.stderr.contains("ptrace") {
            println!("SKIPPED: strace cannot trace here: {}", o.stderr.trim());
            return;
        }
        assert_eq!(o.code, 2, "cred {cmd} {id}: {o}");
        assert!(o.stderr.contains("invalid id"), "{o}");
        let t = fs::read_to_string(&trace).unwrap();
        total += t.lines().count();
        // execve carries the path in argv; every other line naming it is a file syscall.
        let touching: Vec<&str> = t
            .lines()
            .filter(|l| (l.contains(&base) || l.contains(&key)) && !l.contains("execve("))
            .collect();
        assert!(
            touching.is_empty(),
            "cred {cmd} {id:?}: file syscalls on the store or key:\n{}",
            touching.join("\n")
        );
    }
    println!(
        "strace: 4 rejected requests, {total} traced syscalls, 0 touching the store or its key"
    );
}

#[test]
fn slash_is_allowed_and_its_hive_twin_conflicts() {
    let ts = TestStore::with(&["a/b"]);
    assert!(ts.enc("a/b").ends_with("credentials/a_b.enc"));
    assert!(ts.enc("a/b").is_file());
    let store = ts.open();
    let e = store
        .set(
            Credential::api_key("a_b", Secret::new("other".into())),
            None,
        )
        .unwrap_err();
    assert!(matches!(e, Error::IdCollision { .. }), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert!(e.to_string().contains("a_b.enc"), "{e}");
    // The twin id reads as absent; deleting it removes nothing; a/b is untouched.
    assert!(matches!(store.get("a_b"), Err(Error::NotFound { .. })));
    assert!(!store.exists("a_b").unwrap());
    assert!(!store.delete("a_b").unwrap());
    let c = store.get("a/b").unwrap();
    assert_eq!((c.id(), value_of(&c).as_str()), ("a/b", "value-of-a/b"));
    assert_eq!(c.generation(), 1);
    drop(store);
    let o = ts.cli(["cred", "set", "a_b"], b"other\n");
    assert_eq!(o.code, 4, "{o}");
    assert!(o.stderr.contains("a_b.enc"), "{o}");
    let o = ts.cli(["cred", "get", "a/b"], b"");
    assert_eq!((o.code, o.stdout.as_str()), (0, "value-of-a/b\n"), "{o}");
}

// ---------------------------------------------------------------------------------------------
// Checklist 25, 26: tampered and swapped files

#[test]
fn tampered_truncated_and_empty_files_are_integrity_errors_and_quarantined_on_open() {
    let ids = [
        "flip-middle",
        "flip-first",
        "flip-last",
        "truncated-half",
        "truncated-1",
        "empty",
        "garbage",
        "good1",
        "good2",
    ];
    let ts = TestStore::with(&ids);
    type Damage = Box<dyn Fn(Vec<u8>) -> Vec<u8>>;
    let damage: Vec<(&str, Damage)> = vec![
        (
            "flip-middle",
            Box::new(|mut b| {
                let i = b.len() / 2;
                b[i] ^= 0x01;
                b
            }),
        ),
        (
            "flip-first",
            Box::new(|mut b| {
                b[0] ^= 0x01;
                b
            }),
        ),
        (
            "flip-last",
            Box::new(|mut b| {
                let i = b.len() - 1;
                b[i] ^= 0x02;
                b
            }),
        ),
        ("truncated-half", Box::new(|b| b[..b.len() / 2].to_vec())),
        ("truncated-1", Box::new(|b| b[..b.len() - 1].to_vec())),
        ("empty", Box::new(|_| Vec::new())),
        ("garbage", Box::new(|b| vec![0xa5; b.len()])),
    ];
    let mut damaged = BTreeMap::new();
    for (id, f) in &damage {
        let p = ts.enc(id);
        let bytes = f(fs::read(&p).unwrap());
        assert_ne!(bytes, fs::read(&p).unwrap());
        write_private(&p, &bytes);
        damaged.insert(id.to_string(), bytes);
    }

    // Reads on a store opened before the damage (no repair in between).
    let store = ts.open_without_repair();
    for (id, bytes) in &damaged {
        let e = store.get(id).expect_err(id);
        assert_eq!(e.kind(), ErrorKind::Integrity, "{id}: {e}");
        assert!(!e.is_clock_skew(), "{id}: {e}");
        assert!(!e.to_string().contains(&value_for(id)), "{id}: {e}");
        assert_eq!(e.kind().exit_code(), 6);
        // exists does not turn damage into "absent".
        assert_eq!(store.exists(id).unwrap_err().kind(), ErrorKind::Integrity);
        // Never deleted or changed by a read.
        assert_eq!(&fs::read(ts.enc(id)).unwrap(), bytes, "{id} changed by get");
    }
    for good in ["good1", "good2"] {
        assert_eq!(value_of(&store.get(good).unwrap()), value_for(good));
    }
    let listing = store.list().unwrap();
    assert_eq!(listing.unreadable, damaged.len());
    let listed: Vec<&str> = listing.credentials.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(listed, ["good1", "good2"]);
    drop(store);

    // The CLI agrees (exit 6), and fsck without --repair reports and moves nothing.
    let o = ts.cli(["cred", "get", "flip-middle"], b"");
    assert_eq!(o.code, 6, "{o}");
    assert!(o.stdout.is_empty(), "{o}");
    let o = ts.cli(["store", "fsck"], b"");
    assert_eq!(o.code, 1, "{o}");
    assert!(o.stdout.contains("damaged: 6"), "{o}");
    assert!(o.stdout.contains("empty (a writer truncated it"), "{o}");
    for id in damaged.keys() {
        assert!(ts.enc(id).exists(), "fsck without --repair moved {id}");
    }

    // Open (repair) moves them to quarantine/, byte for byte, and reports each; the empty
    // file holds nothing and may be a writer's next write: reported, left in place.
    let store = ts.open();
    let report = store.open_report().clone();
    assert_eq!(report.empty, ["empty.enc"], "{report}");
    assert!(ts.enc("empty").exists());
    damaged.remove("empty");
    assert_eq!(report.quarantined.len(), damaged.len(), "{report}");
    let mut preserved = 0;
    for q in &report.quarantined {
        let id = q.file.trim_end_matches(".enc");
        let to = q.moved_to.as_ref().expect("moved");
        assert!(
            to.starts_with(ts.base.join("quarantine")),
            "{}",
            to.display()
        );
        assert_eq!(
            &fs::read(to).unwrap(),
            &damaged[id],
            "{id} quarantined copy"
        );
        assert!(!ts.enc(id).exists());
        preserved += 1;
        assert!(matches!(store.get(id), Err(Error::NotFound { .. })));
    }
    for good in ["good1", "good2"] {
        assert_eq!(value_of(&store.get(good).unwrap()), value_for(good));
    }
    assert_eq!(store.list().unwrap().unreadable, 1, "the empty file");
    println!(
        "tampered files: {} damaged (flip first/middle/last byte, truncate half/1 byte, empty, \
         garbage): {} integrity errors on get, 0 wrong plaintext, 0 deleted by get, {preserved} \
         quarantined byte-for-byte on open, the empty one reported and left, 2/2 good ids \
         served throughout",
        damaged.len() + 1,
        damaged.len() + 1
    );
}

/// hive rewrites a credential file in place (`open(O_TRUNC)`, then write): a repairing scan
/// that reads the file between the two sees an empty or half-written token. That is a writer
/// at work, not damage: the scan waits a moment, sees the file changed, and leaves it for the
/// next scan instead of moving hive's credential to quarantine. Found by the Python plugin's
/// `test_the_daemon_two_offline_clis_and_hive_write_one_store_at_once`; before the fix the
/// first scan that met the truncated file quarantined it.
#[test]
fn a_file_being_rewritten_in_place_is_left_for_the_next_scan_not_quarantined() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    let ts = TestStore::with(&["busy", "quiet"]);
    let good = fs::read(ts.enc("busy")).unwrap();
    let store = ts.open();
    let stop = Arc::new(AtomicBool::new(false));
    let (path, stop2, bytes) = (ts.enc("busy"), Arc::clone(&stop), good.clone());
    // hive's `_write` in the same steps: truncate, (the caller's work), write the token.
    let writer = std::thread::spawn(move || {
        let mut rewrites = 0u32;
        while !stop2.load(Ordering::SeqCst) {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&path)
                .unwrap();
            std::thread::sleep(Duration::from_millis(15));
            f.write_all(&bytes[..bytes.len() / 2]).unwrap();
            std::thread::sleep(Duration::from_millis(5));
            f.write_all(&bytes[bytes.len() / 2..]).unwrap();
            drop(f);
            rewrites += 1;
            std::thread::sleep(Duration::from_millis(15));
        }
        rewrites
    });
    let (mut scans, mut met_mid_write) = (0, 0);
    while scans < 40 || (met_mid_write == 0 && scans < 400) {
        let report = store.fsck(true).unwrap();
        scans += 1;
        assert!(report.quarantined.is_empty(), "scan {scans}: {report}");
        if !report.unsettled.is_empty() || !report.empty.is_empty() {
            let mut met = report.unsettled.clone();
            met.extend(report.empty.iter().cloned());
            assert_eq!(met, ["busy.enc"], "{report}");
            met_mid_write += 1;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let rewrites = writer.join().unwrap();
    assert!(
        met_mid_write > 0,
        "no scan out of {scans} read the file mid-write: the test explored nothing"
    );
    assert_eq!(fs::read(ts.enc("busy")).unwrap(), good);
    assert_eq!(value_of(&store.get("busy").unwrap()), value_for("busy"));
    assert_eq!(value_of(&store.get("quiet").unwrap()), value_for("quiet"));
    let quarantine = ts.base.join("quarantine");
    assert!(
        !quarantine.exists() || fs::read_dir(&quarantine).unwrap().next().is_none(),
        "something was quarantined"
    );
    // A file that stays damaged is still quarantined after the wait.
    write_private(&ts.enc("quiet"), b"not a token");
    let report = store.fsck(true).unwrap();
    assert_eq!(report.quarantined.len(), 1, "{report}");
    assert!(report.unsettled.is_empty(), "{report}");
    println!(
        "in-place writer: {rewrites} rewrites (truncate, write) during {scans} repairing scans; \
         {met_mid_write} scans read it mid-write and left it for the next scan; 0 quarantined; \
         a file left damaged still quarantined"
    );
}

/// A writer in place that truncates a file and then stalls (hive between its `open(O_TRUNC)`
/// and its write, longer than a repair waits): the empty file is reported and left where it
/// is, so the write still to come lands in the store (an independent tester's second round:
/// it was quarantined, and hive's acknowledged save went with it). A read that meets the file
/// empty waits for a writer that is quick, and says "try again" to one that is not.
#[test]
fn an_empty_file_is_never_quarantined_and_a_read_waits_for_a_quick_writer() {
    use std::time::Duration;
    let ts = TestStore::with(&["slow", "quick"]);
    let store = ts.open();
    let (slow, quick) = (
        fs::read(ts.enc("slow")).unwrap(),
        fs::read(ts.enc("quick")).unwrap(),
    );
    // The slow writer: truncated, then written well after a repair gave up waiting.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(ts.enc("slow"))
        .unwrap();
    let report = store.fsck(true).unwrap();
    assert!(report.quarantined.is_empty(), "{report}");
    assert_eq!(report.empty, ["slow.enc"], "{report}");
    assert!(report.to_string().contains("empty"), "{report}");
    let e = store.get("slow").unwrap_err();
    assert_eq!(e.kind().as_str(), "integrity", "{e}");
    assert!(e.to_string().contains("try again"), "{e}");
    f.write_all(&slow).unwrap();
    drop(f);
    assert_eq!(value_of(&store.get("slow").unwrap()), value_for("slow"));
    let listed = store.list().unwrap().credentials;
    assert!(
        listed.iter().any(|c| c.id == "slow"),
        "once written, the credential is listed again"
    );
    // The quick writer: truncated, written 30 ms later while a read waits.
    let path = ts.enc("quick");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        f.write_all(&quick).unwrap();
    });
    // Read while the writer has not written: the read waits for it (up to 100 ms). On a loaded
    // machine the writer may take longer: then the read says to try again — never a wrong
    // value, never a quarantine — and the next read, once the writer is done, has the value.
    let waited = match store.get("quick") {
        Ok(c) => {
            assert_eq!(value_of(&c), value_for("quick"));
            true
        }
        Err(e) => {
            assert!(e.to_string().contains("try again"), "{e}");
            false
        }
    };
    writer.join().unwrap();
    assert_eq!(value_of(&store.get("quick").unwrap()), value_for("quick"));
    let quarantine = ts.base.join("quarantine");
    assert!(
        !quarantine.exists() || fs::read_dir(&quarantine).unwrap().next().is_none(),
        "something was quarantined"
    );
    println!(
        "a stalled in-place writer: its empty file reported, not quarantined, its write kept; a quick one's value {}",
        if waited {
            "read after the wait"
        } else {
            "not written within the wait (a loaded machine): told to try again, read after"
        }
    );
}

impl TestStore {
    /// Open with no reconciliation (so damaged files are not quarantined at open).
    fn open_without_repair(&self) -> CredentialStore {
        CredentialStore::open(
            self.config(),
            StoreOptions {
                mode: holdfast::store::OpenMode::Deferred,
                ..StoreOptions::default()
            },
        )
        .expect("open deferred")
    }
}

#[test]
fn swapped_files_are_integrity_errors_not_the_other_secret() {
    let ts = TestStore::with(&["alpha", "beta", "gamma", "delta"]);
    // Swap alpha and beta; overwrite gamma with a copy of delta.
    let (a, b) = (ts.enc("alpha"), ts.enc("beta"));
    let tmp = ts.root.join("swap");
    fs::rename(&a, &tmp).unwrap();
    fs::rename(&b, &a).unwrap();
    fs::rename(&tmp, &b).unwrap();
    fs::copy(ts.enc("delta"), ts.enc("gamma")).unwrap();
    let files: BTreeMap<&str, Vec<u8>> = ["alpha", "beta", "gamma"]
        .iter()
        .map(|id| (*id, fs::read(ts.enc(id)).unwrap()))
        .collect();

    let store = ts.open_without_repair();
    for (id, other) in [("alpha", "beta"), ("beta", "alpha"), ("gamma", "delta")] {
        let e = store.get(id).expect_err(id);
        assert_eq!(e.kind(), ErrorKind::Integrity, "{id}: {e}");
        let msg = e.to_string();
        assert!(msg.contains("swapped"), "{id}: {msg}");
        assert!(
            !msg.contains(&value_for(other)),
            "{id}: leaks {other}'s secret: {msg}"
        );
        assert_eq!(fs::read(ts.enc(id)).unwrap(), files[id]);
    }
    assert_eq!(value_of(&store.get("delta").unwrap()), value_for("delta"));
    // Writing through a swapped file is refused too (it would destroy the other's secret).
    let e = store
        .set(
            Credential::api_key("alpha", Secret::new("new".into())),
            None,
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert_eq!(fs::read(ts.enc("alpha")).unwrap(), files["alpha"]);
    drop(store);

    let o = ts.cli(["cred", "get", "alpha"], b"");
    assert_eq!(o.code, 6, "{o}");
    assert!(!o.stdout.contains("value-of-beta") && !o.stderr.contains("value-of-beta"));

    // A repair leaves them where they are: a key of this store opens them, and a quarantined
    // file would need that key for as long as it is kept.
    let store = ts.open();
    let report = store.open_report();
    assert!(report.quarantined.is_empty(), "{report}");
    assert_eq!(report.kept.len(), 3, "{report}");
    for item in &report.kept {
        assert!(item.contains("swapped"), "{item}");
    }
    for id in ["alpha", "beta", "gamma"] {
        assert_eq!(fs::read(ts.enc(id)).unwrap(), files[id], "{id}");
        assert_eq!(store.get(id).unwrap_err().kind(), ErrorKind::Integrity);
    }
    assert!(
        !ts.base.join("quarantine").exists()
            || fs::read_dir(ts.base.join("quarantine")).unwrap().count() == 0
    );
    assert_eq!(value_of(&store.get("delta").unwrap()), value_for("delta"));
    println!("swapped files: 3 ids (a pair swapped, one overwritten by a copy): 3 integrity errors, 0 secrets of the other id returned, 3 reported and left in place on open, 0 quarantined");
}

// ---------------------------------------------------------------------------------------------
// Checklist 27: clock skew

fn keyring(ts: &TestStore) -> Keyring {
    let loaded = keys::load(&[KeySource::File(ts.key.clone())])
        .unwrap()
        .expect("key");
    Keyring::new(&loaded.primary, &loaded.previous).expect("keyring")
}

fn plant_token(ts: &TestStore, id: &str, secret: &str, at: u64) -> Vec<u8> {
    let c = Credential::api_key(id, Secret::new(secret.into()));
    let token = keyring(ts).encrypt_at_time(&c.to_bytes(), at);
    write_private(&ts.enc(id), token.as_bytes());
    token.into_bytes()
}

#[test]
fn token_from_the_future_is_clock_skew_left_alone() {
    let ts = TestStore::with(&["good"]);
    let token = plant_token(&ts, "future", "future-secret", now() + 3600);
    plant_token(&ts, "near", "near-secret", now() + 30);
    let meta = |p: &Path| {
        let m = fs::symlink_metadata(p).unwrap();
        (m.mtime(), m.mtime_nsec(), m.ino())
    };
    let stamp = meta(&ts.enc("future"));

    let store = ts.open();
    assert_eq!(
        store.open_report().clock_skew.len(),
        1,
        "{}",
        store.open_report()
    );
    assert!(store.open_report().quarantined.is_empty());
    let e = store.get("future").unwrap_err();
    assert!(e.is_clock_skew(), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::Integrity);
    assert!(e.to_string().contains("clock"), "{e}");
    assert!(!e.to_string().contains("future-secret"));
    assert_eq!(value_of(&store.get("near").unwrap()), "near-secret");
    assert_eq!(value_of(&store.get("good").unwrap()), value_for("good"));
    let report = store.fsck(true).unwrap();
    assert_eq!(report.clock_skew.len(), 1);
    assert!(report.quarantined.is_empty());
    drop(store);
    let store = ts.open();
    assert!(store.open_report().quarantined.is_empty());
    assert!(store.get("future").unwrap_err().is_clock_skew());
    drop(store);
    assert_eq!(fs::read(ts.enc("future")).unwrap(), token, "file untouched");
    assert_eq!(meta(&ts.enc("future")), stamp, "file untouched");
    assert!(!ts.base.join("quarantine").exists());

    let o = ts.cli(["cred", "get", "future"], b"");
    assert_eq!(o.code, 6, "{o}");
    assert!(o.stderr.contains("clock"), "{o}");
    println!("clock skew: token +3600 s -> clock-skew error on get, open and fsck --repair, file untouched, 0 quarantined; token +30 s reads");
}

// ---------------------------------------------------------------------------------------------
// Checklist 29: keys

/// Every credential operation on a sealed store answers `sealed`; returns how many were tried.
fn assert_all_ops_sealed(store: &CredentialStore) -> usize {
    let results: Vec<(&str, Result<(), Error>)> = vec![
        ("get", store.get("alpha").map(drop)),
        ("get missing", store.get("nope").map(drop)),
        ("exists", store.exists("alpha").map(drop)),
        ("list", store.list().map(drop)),
        (
            "set",
            store
                .set(Credential::api_key("alpha", Secret::new("n".into())), None)
                .map(drop),
        ),
        (
            "set new",
            store
                .set(Credential::api_key("new", Secret::new("n".into())), None)
                .map(drop),
        ),
        (
            "update",
            store
                .update("alpha", Some(1), |_| {
                    Ok(Credential::api_key("alpha", Secret::new("n".into())))
                })
                .map(drop),
        ),
        ("delete", store.delete("alpha").map(drop)),
        ("fsck", store.fsck(false).map(drop)),
        ("fsck --repair", store.fsck(true).map(drop)),
        ("rotate", store.rotate_key(|_, _| {}).map(drop)),
    ];
    let n = results.len();
    for (op, r) in results {
        let e = r.expect_err(op);
        assert_eq!(e.kind(), ErrorKind::Sealed, "{op}: {e}");
        assert!(e.to_string().contains("sealed"), "{op}: {e}");
    }
    n
}

#[test]
fn no_key_with_files_seals_and_modifies_nothing() {
    let ts = TestStore::with(&["alpha", "beta", "gamma"]);
    fs::rename(&ts.key, ts.root.join("key-moved-away")).unwrap();
    let before = snapshot(&ts.base);
    let keys_before = snapshot(&ts.root.join("keys"));

    let store = ts.open();
    match store.sealed_reason() {
        Some(SealedReason::NoKey { files, .. }) => assert_eq!(files, 3),
        other => panic!("want NoKey, got {other:?}"),
    }
    let ops = assert_all_ops_sealed(&store);
    drop(store);

    let mut cli_runs = 0;
    for args in [
        &["cred", "get", "alpha"][..],
        &["cred", "list"],
        &["cred", "exists", "alpha"],
        &["cred", "delete", "alpha"],
        &["store", "fsck"],
        &["store", "fsck", "--repair"],
        &["key", "rotate"],
    ] {
        let o = ts.cli(args, b"");
        assert_eq!(o.code, 5, "{args:?}: {o}");
        assert!(o.stderr.contains("sealed"), "{o}");
        cli_runs += 1;
    }
    let o = ts.cli(["cred", "set", "alpha"], b"new-value\n");
    assert_eq!(o.code, 5, "{o}");
    // init refuses to mint a key for a store that has data.
    let o = ts.cli(["init"], b"");
    assert_eq!(o.code, 5, "{o}");
    assert!(o.stderr.contains("never creates a new key"), "{o}");
    assert!(
        !ts.key.exists(),
        "init created a key file for a store with data"
    );

    assert_unchanged(&before, &snapshot(&ts.base), "sealed (no key)");
    assert_unchanged(&keys_before, &snapshot(&ts.root.join("keys")), "key dir");
    assert!(!ts.base.join("quarantine").exists());
    println!("no key: sealed NoKey(3 files), {ops} library ops and {} CLI runs answered sealed, init refused (exit 5, no key file), store tree byte-identical", cli_runs + 2);
}

#[test]
fn init_refuses_a_named_store_with_data_and_no_key() {
    // The same through the default layout ($XDG_STATE_HOME / $XDG_CONFIG_HOME).
    let home = tempfile::tempdir().unwrap();
    let run_home = |args: &[&str], stdin: &[u8]| {
        let mut c = holdfast_cmd(home.path());
        c.args(args);
        run(c, stdin)
    };
    assert_eq!(run_home(&["init"], b"").code, 0);
    assert_eq!(run_home(&["cred", "set", "x"], b"secret-x\n").code, 0);
    let base = home.path().join("state/holdfast/stores/default");
    let key = holdfast::store::identity::own_key_file(
        &home.path().join("config/holdfast/keys"),
        "default",
        &base,
    )
    .unwrap()
    .unwrap();
    assert!(key.is_file());
    fs::rename(&key, home.path().join("lost.key")).unwrap();
    let before = snapshot(&base);
    let o = run_home(&["init"], b"");
    assert_eq!(o.code, 5, "{o}");
    assert!(
        !key.exists(),
        "init minted a key while encrypted data exists"
    );
    assert_unchanged(&before, &snapshot(&base), "init on sealed store");
}

#[test]
fn wrong_key_seals_and_modifies_nothing() {
    let ts = TestStore::with(&["alpha", "beta"]);
    keys::write_key_file(&ts.key, &generate_key(), &Faults::none()).unwrap();
    let before = snapshot(&ts.base);
    let store = ts.open();
    assert!(
        matches!(
            store.sealed_reason(),
            Some(SealedReason::WrongKey { tried: 2, .. })
        ),
        "{:?}",
        store.sealed_reason()
    );
    let ops = assert_all_ops_sealed(&store);
    drop(store);
    let o = ts.cli(["cred", "get", "alpha"], b"");
    assert_eq!(o.code, 5, "{o}");
    assert!(o.stderr.contains("not the key"), "{o}");
    let o = ts.cli(["init"], b"");
    assert_ne!(o.code, 0, "{o}");
    assert_unchanged(&before, &snapshot(&ts.base), "sealed (wrong key)");
    assert!(!ts.base.join("quarantine").exists());
    println!("wrong key: sealed WrongKey, {ops} ops sealed, nothing modified, nothing quarantined");
}

#[test]
fn malformed_key_seals() {
    let ts = TestStore::with(&["alpha"]);
    for bad in [
        &b"not a key"[..],
        &[b'A'; 44][..], // 44 chars but 33 bytes
        b"",
        b"\xff\xfe binary",
    ] {
        write_private(&ts.key, bad);
        let before = snapshot(&ts.base);
        let store = ts.open();
        assert!(
            matches!(store.sealed_reason(), Some(SealedReason::BadKey(_))),
            "{:?}: {:?}",
            String::from_utf8_lossy(bad),
            store.sealed_reason()
        );
        assert_all_ops_sealed(&store);
        drop(store);
        assert_unchanged(&before, &snapshot(&ts.base), "sealed (malformed key)");
        let o = ts.cli(["cred", "get", "alpha"], b"");
        assert_eq!(o.code, 5, "{o}");
    }
}

#[test]
fn key_file_with_group_or_other_access_is_refused() {
    let ts = TestStore::with(&["alpha"]);
    for mode in [0o644, 0o640, 0o604, 0o660] {
        chmod(&ts.key, mode);
        let before = snapshot(&ts.base);
        let e = ts.try_open().expect_err("open must refuse");
        assert_eq!(e.kind(), ErrorKind::Forbidden, "{e}");
        let msg = e.to_string();
        let path = ts.key.display().to_string();
        assert!(msg.contains(&path), "{msg}");
        assert!(msg.contains(&format!("{mode:04o}")), "{msg}");
        let o = ts.cli(["cred", "get", "alpha"], b"");
        assert_eq!(o.code, 9, "{o}");
        assert!(
            o.stderr.contains(&path) && o.stderr.contains(&format!("{mode:04o}")),
            "{o}"
        );
        assert_unchanged(&before, &snapshot(&ts.base), "refused key");
    }
    // The key directory too, when others may write it (they could replace the key); one
    // they may only list is fine, as ssh accepts for ~/.ssh (hive's ~/.hive/secrets is
    // often 0755).
    chmod(&ts.key, 0o600);
    for mode in [0o775, 0o757, 0o777] {
        chmod(ts.key.parent().unwrap(), mode);
        let e = ts
            .try_open()
            .expect_err("open must refuse a key dir others may write");
        assert_eq!(e.kind(), ErrorKind::Forbidden, "{e}");
        assert!(e.to_string().contains(&format!("{mode:04o}")), "{e}");
    }
    for mode in [0o755, 0o750, 0o711] {
        chmod(ts.key.parent().unwrap(), mode);
        assert_eq!(
            value_of(&ts.open().get("alpha").unwrap()),
            value_for("alpha"),
            "key dir {mode:o}"
        );
    }
    chmod(ts.key.parent().unwrap(), 0o700);
    // 0400 (systemd's mode) is fine.
    chmod(&ts.key, 0o400);
    assert_eq!(
        value_of(&ts.open().get("alpha").unwrap()),
        value_for("alpha")
    );
}

#[test]
fn key_owned_by_another_uid_is_refused() {
    if !is_root() {
        println!(
            "SKIPPED: chown to another uid needs root (euid {})",
            perms::euid()
        );
        return;
    }
    let ts = TestStore::with(&["alpha"]);
    std::os::unix::fs::chown(&ts.key, Some(65534), Some(65534)).unwrap();
    let e = ts.try_open().expect_err("open must refuse");
    assert_eq!(e.kind(), ErrorKind::Forbidden, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("65534"), "{msg}");
    assert!(msg.contains(&ts.key.display().to_string()), "{msg}");
    let o = ts.cli(["cred", "list"], b"");
    assert_eq!(o.code, 9, "{o}");
    assert!(o.stderr.contains("65534"), "{o}");
}

// ---------------------------------------------------------------------------------------------
// Checklist 30: store permissions and symlinks

#[test]
fn open_store_directories_are_tightened_and_unsafe_ones_refused() {
    let ts = TestStore::with(&["alpha"]);
    let path = ts.base.display().to_string();
    let mode_of = |p: &std::path::Path| {
        std::os::unix::fs::MetadataExt::mode(&std::fs::symlink_metadata(p).unwrap()) & 0o7777
    };
    let mut tightened = 0;
    // Ours but too open (hive's mkdir under umask 022 makes 0755): tightened, one notice.
    for mode in [0o777, 0o750, 0o770, 0o701, 0o755] {
        chmod(&ts.base, mode);
        let o = ts.cli(["cred", "get", "alpha"], b"");
        assert_eq!(o.code, 0, "{mode:o}: {o}");
        assert_eq!(o.stdout.trim(), value_for("alpha"), "{o}");
        let notice = format!("directory {mode:04o} → 0700 (.)");
        assert!(
            o.stderr.contains(&path) && o.stderr.contains(&notice),
            "{mode:o}: {o}"
        );
        assert_eq!(o.stderr.matches("tightened").count(), 1, "one notice: {o}");
        assert_eq!(mode_of(&ts.base), 0o700);
        // The library reports it too (the daemon logs it).
        chmod(&ts.base, mode);
        let store = ts.open();
        let fixes = store.permission_fixes();
        assert_eq!(fixes.changes.len(), 1, "{fixes}");
        assert_eq!((fixes.changes[0].from, fixes.changes[0].to), (mode, 0o700));
        drop(store);
        tightened += 1;
    }
    // A group-writable credentials/ inside a good base, and the files it exposed.
    let creds = ts.base.join("credentials");
    chmod(&creds, 0o770);
    let enc = creds.join("alpha.enc");
    chmod(&enc, 0o664);
    let o = ts.cli(["cred", "get", "alpha"], b"");
    assert_eq!(o.code, 0, "{o}");
    assert!(
        o.stderr.contains(
            "directory 0770 → 0700 (credentials); file 0664 → 0600 (credentials/alpha.enc)"
        ),
        "{o}"
    );
    assert_eq!((mode_of(&creds), mode_of(&enc)), (0o700, 0o600));
    tightened += 1;
    // Private now: nothing more is said.
    let o = ts.cli(["cred", "get", "alpha"], b"");
    assert!(!o.stderr.contains("tightened"), "{o}");
    let mut cases = 0;

    // A symlink to a good store directory.
    let link = ts.root.join("link-to-store");
    std::os::unix::fs::symlink(&ts.base, &link).unwrap();
    let e = CredentialStore::open(
        store_config(ts.name, &link, &ts.key),
        StoreOptions::default(),
    )
    .expect_err("open through a symlink must refuse");
    assert_eq!(e.kind(), ErrorKind::Forbidden, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("symlink") && msg.contains(&link.display().to_string()),
        "{msg}"
    );
    let mut c = store_cmd(&ts.home(), &link, &ts.key);
    c.args(["cred", "get", "alpha"]);
    let o = run(c, b"");
    assert_eq!(o.code, 9, "{o}");
    assert!(o.stderr.contains("symlink"), "{o}");
    cases += 1;

    if is_root() {
        std::os::unix::fs::chown(&ts.base, Some(65534), Some(65534)).unwrap();
        let e = ts
            .try_open()
            .expect_err("open must refuse another uid's dir");
        assert_eq!(e.kind(), ErrorKind::Forbidden, "{e}");
        let msg = e.to_string();
        assert!(msg.contains("65534") && msg.contains(&path), "{msg}");
        std::os::unix::fs::chown(&ts.base, Some(0), Some(0)).unwrap();
        cases += 1;
    } else {
        println!("SKIPPED (not root): store dir owned by another uid");
    }
    assert_eq!(
        value_of(&ts.open().get("alpha").unwrap()),
        value_for("alpha")
    );
    println!("store dirs: {tightened} too-open cases tightened with one notice, {cases} unsafe cases refused with kind forbidden / exit 9, path and problem named");
}

#[test]
fn credential_file_replaced_by_a_symlink_is_refused_not_followed() {
    let ts = TestStore::with(&["alpha", "beta"]);
    // 1. A symlink to a valid copy of alpha's own file outside the store: following it would
    //    return alpha's value, so only a no-follow open gives an error here.
    let outside = ts.root.join("outside");
    fs::create_dir(&outside).unwrap();
    let copy = outside.join("alpha.enc");
    fs::copy(ts.enc("alpha"), &copy).unwrap();
    let copy_bytes = fs::read(&copy).unwrap();
    fs::remove_file(ts.enc("alpha")).unwrap();
    std::os::unix::fs::symlink(&copy, ts.enc("alpha")).unwrap();
    // 2. beta.enc -> (relative) alpha's copy is not needed; make gamma a link to beta's file.
    let store = ts.open_without_repair();
    put(&store, "gamma", "value-of-gamma");
    drop(store);
    fs::remove_file(ts.enc("gamma")).unwrap();
    std::os::unix::fs::symlink("beta.enc", ts.enc("gamma")).unwrap();

    let store = ts.open_without_repair();
    for id in ["alpha", "gamma"] {
        let e = store.get(id).expect_err(id);
        assert_eq!(e.kind(), ErrorKind::Integrity, "{id}: {e}");
        assert!(e.to_string().contains("symlink"), "{id}: {e}");
        assert!(fs::symlink_metadata(ts.enc(id))
            .unwrap()
            .file_type()
            .is_symlink());
    }
    // Writing through the link is refused too, and the target is untouched.
    let e = store
        .set(
            Credential::api_key("alpha", Secret::new("new".into())),
            None,
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert_eq!(value_of(&store.get("beta").unwrap()), value_for("beta"));
    drop(store);
    assert_eq!(fs::read(&copy).unwrap(), copy_bytes, "link target modified");
    let o = ts.cli(["cred", "get", "alpha"], b"");
    assert_eq!(o.code, 6, "{o}");
    assert!(!o.stdout.contains("value-of-alpha"), "{o}");

    // Repair moves the links (not their targets) to quarantine.
    let store = ts.open();
    assert_eq!(
        store.open_report().quarantined.len(),
        2,
        "{}",
        store.open_report()
    );
    drop(store);
    assert_eq!(fs::read(&copy).unwrap(), copy_bytes);
    assert_eq!(
        value_of(&ts.open().get("beta").unwrap()),
        value_for("beta"),
        "beta (a link target) must be untouched"
    );
    println!("symlinked credential files: 2 links (outside copy, sibling) refused with integrity, never followed; targets untouched; links quarantined on open");
}

// ---------------------------------------------------------------------------------------------
// Checklist 33: secrets never in output, logs or Debug

/// Every form a secret could leak in: raw, base64 (standard, url-safe, padded or not), hex.
fn forms(label: &str, bytes: &[u8]) -> Vec<(String, String)> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut v = vec![
        (format!("{label} (hex)"), hex.clone()),
        (format!("{label} (HEX)"), hex.to_uppercase()),
        (format!("{label} (base64)"), STANDARD.encode(bytes)),
        (
            format!("{label} (base64, no pad)"),
            STANDARD_NO_PAD.encode(bytes),
        ),
        (format!("{label} (base64url)"), URL_SAFE.encode(bytes)),
        (
            format!("{label} (base64url, no pad)"),
            URL_SAFE_NO_PAD.encode(bytes),
        ),
    ];
    if let Ok(s) = std::str::from_utf8(bytes) {
        v.push((format!("{label} (raw)"), s.to_owned()));
        // Debug-escaped form (as `{:?}` of a String would print it).
        v.push((format!("{label} (debug)"), format!("{s:?}")));
    }
    v
}

/// Forms of a Fernet key: its text, and its 32 bytes and both 16-byte halves (signing and
/// encryption keys) in every encoding.
fn key_forms(label: &str, key_text: &str) -> Vec<(String, String)> {
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(key_text.trim())
        .expect("key decodes");
    let mut v = vec![(format!("{label} (text)"), key_text.trim().to_owned())];
    v.extend(forms(&format!("{label} bytes"), &raw));
    v.extend(forms(&format!("{label} signing half"), &raw[..16]));
    v.extend(forms(&format!("{label} encryption half"), &raw[16..]));
    v
}

#[test]
fn secrets_never_leak_into_cli_output_or_logs() {
    let home = tempfile::tempdir().unwrap();
    let secrets: BTreeMap<&str, &str> = [
        ("alpha", "hfSecretAlpha-1qaz2wsx3edc"),
        ("beta", "hfSecretBeta-4rfv5tgb6yhn"),
        ("gamma-doc", "hfSecretGammaDoc-7ujm8ik9ol"),
        ("gamma-extra", "hfSecretGammaExtra-p0o9i8u7"),
        ("lost", "hfSecretLost-mnbvcxz12345"),
        ("tamper", "hfSecretTamper-lkjhgfdsa987"),
    ]
    .into_iter()
    .collect();
    let base = home.path().join("state/holdfast/stores/default");
    let key_path = || {
        holdfast::store::identity::own_key_file(
            &home.path().join("config/holdfast/keys"),
            "default",
            &base,
        )
        .unwrap()
        .unwrap()
    };
    // (command, stdin, expected exit, secrets its stdout may show)
    struct Ran {
        what: String,
        out: Out,
        allowed: Vec<&'static str>,
    }
    let mut ran: Vec<Ran> = Vec::new();
    let mut key_texts: Vec<(String, String)> = Vec::new();
    let mut exec = |args: &[&str], stdin: &[u8], code: i32, allowed: &[&'static str]| {
        for (fmt, verbose) in [("human", "-vv"), ("json", "-v")] {
            let mut c = holdfast_cmd(home.path());
            c.env("RUST_LOG", "trace")
                .args([verbose, "--log-format", fmt])
                .args(args);
            let o = run(c, stdin);
            assert_eq!(o.code, code, "{args:?} ({fmt} logs): {o}");
            ran.push(Ran {
                what: format!("{} [{fmt} logs]", args.join(" ")),
                out: o,
                allowed: allowed.to_vec(),
            });
            if args.first() == Some(&"init") || args.get(1) == Some(&"set") {
                break; // not idempotent: run once
            }
        }
    };
    let stdin_of = |k: &str| format!("{}\n", secrets[k]).into_bytes();

    exec(&["init"], b"", 0, &[]);
    key_texts.push(("key".into(), fs::read_to_string(key_path()).unwrap()));
    exec(&["cred", "set", "alpha"], &stdin_of("alpha"), 0, &[]);
    exec(
        &[
            "cred",
            "set",
            "beta",
            "--key",
            "password",
            "--type",
            "basic_auth",
        ],
        &stdin_of("beta"),
        0,
        &[],
    );
    let doc = serde_json::json!({
        "id": "gamma", "credential_type": "custom",
        "keys": {"token": {"name": "token", "value": secrets["gamma-doc"], "expires_at": null, "metadata": {}}},
        "x_unknown": {"nested": secrets["gamma-extra"]},
    });
    exec(
        &["cred", "set", "--document", "gamma"],
        doc.to_string().as_bytes(),
        0,
        &[],
    );
    exec(
        &["cred", "set", "--json", "tamper"],
        &stdin_of("tamper"),
        0,
        &[],
    );
    // Error paths that carry a secret on stdin.
    exec(
        &["cred", "set", "alpha", "--if-generation", "99"],
        &stdin_of("lost"),
        4,
        &[],
    );
    exec(&["cred", "set", "../escape"], &stdin_of("lost"), 2, &[]);
    exec(
        &["cred", "set", "--document", "other"],
        doc.to_string().as_bytes(),
        2,
        &[],
    );
    exec(
        &["cred", "set", "--document", "gamma"],
        b"{\"id\": \"gamma\", \"keys\": 5}",
        2,
        &[],
    );
    // Reads.
    exec(&["cred", "get", "alpha"], b"", 0, &["alpha"]);
    exec(&["cred", "get", "--json", "beta"], b"", 0, &["beta"]);
    exec(
        &["cred", "get", "gamma", "--field", "token"],
        b"",
        0,
        &["gamma-doc"],
    );
    exec(
        &["--json", "cred", "get", "gamma"],
        b"",
        0,
        &["gamma-doc", "gamma-extra"],
    );
    exec(&["cred", "get", "alpha", "--field", "nope"], b"", 3, &[]);
    exec(&["cred", "get", "missing"], b"", 3, &[]);
    exec(&["cred", "list"], b"", 0, &[]);
    exec(&["cred", "list", "--json"], b"", 0, &[]);
    exec(&["cred", "exists", "alpha"], b"", 0, &[]);
    exec(&["store", "fsck"], b"", 0, &[]);
    exec(&["store", "fsck", "--json"], b"", 0, &[]);
    // Rotation: both keys are secrets from here on.
    exec(&["key", "rotate"], b"", 0, &[]);
    key_texts.push((
        "rotated key".into(),
        fs::read_to_string(key_path()).unwrap(),
    ));
    exec(&["--json", "key", "rotate"], b"", 0, &[]);
    key_texts.push((
        "twice-rotated key".into(),
        fs::read_to_string(key_path()).unwrap(),
    ));
    exec(&["cred", "get", "alpha"], b"", 0, &["alpha"]);
    // Damage: integrity errors and fsck reports.
    let tampered = base.join("credentials/tamper.enc");
    let mut t = fs::read(&tampered).unwrap();
    let mid = t.len() / 2;
    t[mid] ^= 1;
    write_private(&tampered, &t);
    exec(&["cred", "get", "tamper"], b"", 6, &[]);
    exec(&["store", "fsck"], b"", 1, &[]);
    exec(&["store", "fsck", "--repair"], b"", 0, &[]);
    // Wrong key and malformed key: sealed.
    let good_key = fs::read(key_path()).unwrap();
    let wrong = generate_key();
    key_texts.push(("wrong key".into(), wrong.expose().to_owned()));
    keys::write_key_file(&key_path(), &wrong, &Faults::none()).unwrap();
    exec(&["cred", "get", "alpha"], b"", 5, &[]);
    exec(&["cred", "list"], b"", 5, &[]);
    exec(&["cred", "set", "alpha"], &stdin_of("lost"), 5, &[]);
    exec(&["store", "fsck"], b"", 5, &[]);
    exec(&["init"], b"", 5, &[]);
    // A key file holding 43 characters of a real key (one short): malformed, must not be echoed.
    let near = &key_texts[0].1.trim()[..43];
    write_private(&key_path(), near.as_bytes());
    exec(&["cred", "get", "alpha"], b"", 5, &[]);
    write_private(&key_path(), &good_key);
    exec(&["cred", "get", "alpha"], b"", 0, &["alpha"]);

    let mut forbidden: Vec<(String, String, Option<&str>)> = Vec::new();
    for (name, value) in &secrets {
        for (label, form) in forms(&format!("secret {name}"), value.as_bytes()) {
            forbidden.push((label, form, Some(*name)));
        }
    }
    for (label, text) in &key_texts {
        for (l, form) in key_forms(label, text) {
            forbidden.push((l, form, None));
        }
    }
    forbidden.push(("key prefix (43 chars)".into(), near.to_owned(), None));

    let mut hits = Vec::new();
    let mut log_lines = 0;
    for r in &ran {
        log_lines += r.out.stderr.lines().count();
        for (label, form, owner) in &forbidden {
            let stdout_ok = owner.is_some_and(|o| r.allowed.contains(&o));
            if !stdout_ok && r.out.stdout.contains(form.as_str()) {
                hits.push(format!("{}: stdout has {label}", r.what));
            }
            if r.out.stderr.contains(form.as_str()) {
                hits.push(format!("{}: stderr has {label}", r.what));
            }
        }
        for owner in &r.allowed {
            assert!(
                r.out.stdout.contains(secrets[owner]),
                "{}: expected output missing",
                r.what
            );
        }
    }
    println!(
        "secret leak scan: {} CLI runs (RUST_LOG=trace, -v/-vv, human and json logs), {} log \
         lines, {} secrets + {} keys in {} forms: {} hits",
        ran.len(),
        log_lines,
        secrets.len(),
        key_texts.len(),
        forbidden.len(),
        hits.len()
    );
    assert!(
        log_lines > 0,
        "logging produced nothing; the scan would prove little"
    );
    assert!(hits.is_empty(), "secrets leaked:\n{}", hits.join("\n"));
}

#[test]
fn debug_of_secret_bearing_types_is_redacted() {
    let ts = TestStore::new(STORE_NAME);
    let secret_text = "hfDebugSecret-zaq1xsw2cde3";
    let key_text = fs::read_to_string(&ts.key).unwrap();
    let store = ts.open();
    put(&store, "dbg", secret_text);
    let cred = store.get("dbg").unwrap();
    let loaded = keys::load(&[KeySource::File(ts.key.clone())])
        .unwrap()
        .unwrap();
    let ring = Keyring::new(&loaded.primary, &loaded.previous).unwrap();
    let secret = Secret::new(secret_text.to_owned());
    let key_secret = Secret::new(key_text.trim().to_owned());
    let listing = store.list().unwrap();
    let err = store.get("../x").unwrap_err();
    let debugs = [
        ("Credential", format!("{cred:?}"), format!("{cred:#?}")),
        ("Secret", format!("{secret:?}"), format!("{secret:#?}")),
        (
            "Secret(key)",
            format!("{key_secret:?}"),
            format!("{key_secret:#?}"),
        ),
        ("Keyring", format!("{ring:?}"), format!("{ring:#?}")),
        ("LoadedKeys", format!("{loaded:?}"), format!("{loaded:#?}")),
        (
            "CredentialStore",
            format!("{store:?}"),
            format!("{store:#?}"),
        ),
        ("Listing", format!("{listing:?}"), format!("{listing:#?}")),
        ("Error", format!("{err:?}"), format!("{err:#?}")),
    ];
    let mut forbidden = forms("secret", secret_text.as_bytes());
    forbidden.extend(key_forms("key", &key_text));
    let mut hits = Vec::new();
    for (ty, a, b) in &debugs {
        for (label, form) in &forbidden {
            if a.contains(form.as_str()) || b.contains(form.as_str()) {
                hits.push(format!("{ty}: {label}"));
            }
        }
    }
    // The Debug output is useful, not empty: the credential shows its id.
    assert!(debugs[0].1.contains("dbg"));
    println!(
        "Debug scan: {} types x {} forms: {} hits",
        debugs.len(),
        forbidden.len(),
        hits.len()
    );
    assert!(hits.is_empty(), "{hits:?}");
}
