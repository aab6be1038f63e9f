//! Nothing acknowledged is ever lost (issue 34), tried as a user would with the real binary:
//! two data dirs over one config dir, key rotation and the archive of retired keys, a store an
//! older version made with the key file it shared between data dirs, values near and above the
//! size limit (offline and through the daemon), and what a repair may move into quarantine.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::{run, DaemonEnv, Out, TempHome};
use holdfast::crypto::{keys, KeySource, Keyring};
use holdfast::durable::Faults;
use holdfast::store::identity;
use serde_json::Value;

fn json(o: &Out) -> Value {
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {o}"))
}

#[track_caller]
fn ok(o: Out) -> Out {
    assert_eq!(o.code, 0, "{o}");
    o
}

#[track_caller]
fn code(o: Out, want: i32) -> Out {
    assert_eq!(o.code, want, "{o}");
    o
}

/// `holdfast --data-dir DATA ARGS` in `env`'s HOME, with `stdin`.
fn in_dir(env: &TempHome, data: &Path, args: &[&str], stdin: &[u8]) -> Out {
    let mut c = env.cmd();
    c.arg("--data-dir").arg(data).args(args);
    run(c, stdin)
}

fn keys_dir(env: &TempHome) -> PathBuf {
    env.home.join("config/holdfast/keys")
}

fn store_base(data: &Path) -> PathBuf {
    data.join("stores/default")
}

/// The default store's own key file in data dir `data`.
fn own_key(env: &TempHome, data: &Path) -> PathBuf {
    identity::own_key_file(&keys_dir(env), "default", &store_base(data))
        .unwrap()
        .expect("the store has an identity")
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A daemon environment with `config`, if its streams are sealed with the default store's key
/// (the files backend); on PostgreSQL, `None`, said as skipped.
#[allow(clippy::print_stdout)] // a skipped test says so
fn streams_env(config: &str) -> Option<DaemonEnv> {
    let env = DaemonEnv::new(config);
    if env.on_postgres() {
        println!("streams on PostgreSQL are not sealed with the store's key: skipped");
        return None;
    }
    Some(env)
}

/// `cp -a FROM TO`, which must succeed.
fn cp_a(from: &Path, to: &Path) {
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success(), "cp -a {} {}", from.display(), to.display());
}

/// The keyring of the key file `key` (and its archive).
fn ring_of(key: &Path) -> Keyring {
    let loaded = keys::load(&[KeySource::File(key.to_path_buf())])
        .unwrap()
        .expect("a key");
    Keyring::new(&loaded.primary, &loaded.previous).unwrap()
}

#[test]
fn two_data_dirs_over_one_config_dir_keep_their_own_keys() {
    let env = TempHome::new();
    let (a, b) = (env.root.join("A"), env.root.join("B"));
    let made_a = ok(in_dir(&env, &a, &["init"], b""));
    assert!(made_a.stdout.starts_with("created store"), "{made_a}");
    // A second data dir gets a key of its own: not "already initialized" with A's.
    let made_b = ok(in_dir(&env, &b, &["init"], b""));
    assert!(made_b.stdout.starts_with("created store"), "{made_b}");
    assert_ne!(own_key(&env, &a), own_key(&env, &b));
    let b_key = fs::read(own_key(&env, &b)).unwrap();
    assert_ne!(fs::read(own_key(&env, &a)).unwrap(), b_key);
    // Each init is in its own data dir's audit log: begun, then ok.
    for data in [&a, &b] {
        let log = json(&ok(in_dir(
            &env,
            data,
            &["audit", "--json", "--op", "init"],
            b"",
        )));
        let results: Vec<&str> = log
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["result"].as_str().unwrap())
            .collect();
        assert_eq!(results, ["begun", "ok"], "{log}");
    }

    ok(in_dir(&env, &a, &["cred", "set", "x"], b"in-a\n"));
    ok(in_dir(&env, &b, &["cred", "set", "y"], b"in-b\n"));
    for round in 1..=3 {
        let o = ok(in_dir(&env, &a, &["--json", "key", "rotate"], b""));
        assert_eq!(json(&o)["retired"].as_array().unwrap().len(), round, "{o}");
        // B: its key untouched, its credential readable, after every rotation of A.
        assert_eq!(fs::read(own_key(&env, &b)).unwrap(), b_key, "round {round}");
        assert_eq!(
            ok(in_dir(&env, &b, &["cred", "get", "y"], b"")).stdout,
            "in-b\n"
        );
        assert_eq!(
            ok(in_dir(&env, &a, &["cred", "get", "x"], b"")).stdout,
            "in-a\n"
        );
    }
    // Nothing was deleted: A's key and archive, B's key.
    let a_key = own_key(&env, &a);
    let a_name = a_key.file_name().unwrap().to_str().unwrap().to_owned();
    let b_name = own_key(&env, &b)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    // Each key file with the claim naming its store (`store::claim`).
    let mut want = vec![
        a_name.clone(),
        format!("{a_name}.prev"),
        format!("{a_name}.store"),
        b_name.clone(),
        format!("{b_name}.store"),
    ];
    want.sort();
    assert_eq!(names(&keys_dir(&env)), want);
    let shown = json(&ok(in_dir(&env, &a, &["--json", "key"], b"")));
    let keys = shown["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 4, "{shown}");
    assert_eq!(keys[0]["role"], "primary");
    assert_eq!(keys[0]["files"], serde_json::json!(["x.enc"]));
    assert!(keys[1..].iter().all(|k| k["role"] == "archived"));
    let shown_b = json(&ok(in_dir(&env, &b, &["--json", "key"], b"")));
    assert_eq!(shown_b["keys"].as_array().unwrap().len(), 1, "{shown_b}");
    println!(
        "two data dirs over one config dir: 2 inits made 2 keys; 3 rotations of A; B's key \
         unchanged and its credential readable after each; 0 key files deleted"
    );
}

#[test]
fn a_store_an_older_version_made_takes_its_own_copy_of_the_shared_key() {
    let env = TempHome::new();
    let (a, b) = (env.root.join("A"), env.root.join("B"));
    ok(in_dir(&env, &a, &["init"], b""));
    ok(in_dir(&env, &a, &["cred", "set", "x"], b"old-x\n"));
    // Make it look as an older holdfast left it: the key under the store's name only, no
    // identity; and a second data dir that (as that version's `init` did) uses the same key.
    let shared = keys_dir(&env).join("default.key");
    fs::rename(own_key(&env, &a), &shared).unwrap();
    fs::remove_file(identity::identity_path(&store_base(&a))).unwrap();
    fs::create_dir_all(b.join("stores")).unwrap();
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(store_base(&a))
        .arg(b.join("stores"))
        .status()
        .unwrap();
    assert!(cp.success());
    let shared_bytes = fs::read(&shared).unwrap();

    // Looking at it (a read-only open) changes nothing.
    let shown = ok(in_dir(&env, &a, &["key"], b""));
    assert!(shown.stdout.contains("shared key file"), "{shown}");
    assert!(!identity::identity_path(&store_base(&a)).exists());
    // The first command that may write (a read may record a generation) gives it its own copy
    // and says so.
    let o = ok(in_dir(&env, &a, &["cred", "get", "x"], b""));
    assert_eq!(o.stdout, "old-x\n");
    assert!(o.stderr.contains("now keeps its own key file"), "{o}");
    let a_key = own_key(&env, &a);
    assert!(o.stderr.contains(&a_key.display().to_string()), "{o}");
    let o = ok(in_dir(&env, &a, &["cred", "set", "x2"], b"new\n"));
    assert!(!o.stderr.contains("now keeps its own key file"), "{o}");
    assert_eq!(fs::read(&a_key).unwrap(), shared_bytes);
    // Rotating A twice leaves the shared file and B alone.
    ok(in_dir(&env, &a, &["key", "rotate"], b""));
    ok(in_dir(&env, &a, &["key", "rotate"], b""));
    assert_eq!(fs::read(&shared).unwrap(), shared_bytes);
    assert!(!identity::identity_path(&store_base(&b)).exists());
    // `init` on the older store reports it as initialized and gives it its own copy too.
    let o = ok(in_dir(&env, &b, &["init"], b""));
    assert!(o.stdout.contains("was already initialized"), "{o}");
    assert!(o.stderr.contains("now keeps its own key file"), "{o}");
    let b_key = own_key(&env, &b);
    assert_ne!(b_key, a_key);
    assert_eq!(fs::read(&b_key).unwrap(), shared_bytes);
    for (data, id, want) in [
        (&a, "x", "old-x\n"),
        (&a, "x2", "new\n"),
        (&b, "x", "old-x\n"),
    ] {
        assert_eq!(
            ok(in_dir(&env, data, &["cred", "get", id], b"")).stdout,
            want
        );
    }
    println!("an older store in 2 data dirs: each took its own copy of the shared key; 2 rotations of one left the shared file and the other store unchanged");
}

/// Set `id` to a value of `len` bytes through `holdfast cred set` in `data`; the outcome.
fn set_sized(env: &TempHome, data: &Path, id: &str, len: usize) -> Out {
    let mut value = "v".repeat(len);
    value.push('\n');
    in_dir(env, data, &["cred", "set", id], value.as_bytes())
}

#[test]
fn values_near_and_above_the_limit_are_refused_before_acknowledgement_or_read_back() {
    let env = TempHome::new();
    let data = env.root.join("data");
    ok(in_dir(&env, &data, &["init"], b""));
    let cred_dir = store_base(&data).join("credentials");
    // Far above: refused, and nothing was written.
    let o = code(set_sized(&env, &data, "big", 1_000_000), 2);
    assert!(
        o.stderr.contains("too large to store") && o.stderr.contains("nothing was written"),
        "{o}"
    );
    assert!(!cred_dir.join("big.enc").exists());
    code(in_dir(&env, &data, &["cred", "get", "big"], b""), 3);
    // The largest value that fits, to within 64 bytes: every accepted one reads back exactly.
    let (mut lo, mut hi) = (700_000usize, 800_000usize);
    let mut tries = 0;
    while hi - lo > 64 {
        let mid = (lo + hi) / 2;
        tries += 1;
        match set_sized(&env, &data, "edge", mid) {
            o if o.code == 0 => {
                let got = ok(in_dir(&env, &data, &["cred", "get", "edge"], b""));
                assert_eq!(got.stdout.len(), mid + 1, "value of {mid} bytes");
                lo = mid;
            }
            o => {
                assert_eq!(o.code, 2, "{o}");
                hi = mid;
            }
        }
    }
    assert!(
        lo > 780_000,
        "the largest value that fits is only {lo} bytes"
    );
    // A rotation (and a prune) keeps the largest one readable.
    let o = ok(set_sized(&env, &data, "edge", lo));
    assert!(o.stdout.contains("stored edge"), "{o}");
    ok(in_dir(&env, &data, &["key", "rotate"], b""));
    ok(in_dir(&env, &data, &["key", "prune"], b""));
    assert_eq!(
        ok(in_dir(&env, &data, &["cred", "get", "edge"], b""))
            .stdout
            .len(),
        lo + 1
    );
    assert!(ok(in_dir(&env, &data, &["store", "fsck"], b""))
        .stdout
        .contains("clean"));
    println!(
        "size limit offline: 1,000,000 bytes refused before writing; largest accepted value \
         {lo} bytes ({tries} tries), read back exactly before and after a rotation and a prune"
    );
}

#[test]
fn values_near_and_above_the_limit_through_the_daemon() {
    let mut env = DaemonEnv::new("");
    let daemon = env.start();
    let cred_dir = env.store_base().join("credentials");
    let set = |len: usize| {
        let mut c = env.holdfast(&["cred", "set", "big"]);
        c.stdin(std::process::Stdio::piped());
        let mut value = "w".repeat(len);
        value.push('\n');
        run(c, value.as_bytes())
    };
    let o = set(900_000);
    assert_eq!(o.code, 2, "{o}");
    assert!(o.stderr.contains("too large to store"), "{o}");
    assert!(
        !o.stderr.contains("(offline)"),
        "went around the daemon: {o}"
    );
    assert!(!cred_dir.join("big.enc").exists());
    // Control characters are escaped six-fold in JSON: the request line would pass the
    // protocol's 1 MiB limit first. The store's message, not the protocol's.
    let mut c = env.holdfast(&["cred", "set", "ctl"]);
    c.stdin(std::process::Stdio::piped());
    let o = run(c, "\u{1}".repeat(300_000).as_bytes());
    assert_eq!(o.code, 2, "{o}");
    assert!(o.stderr.contains("too large to store"), "{o}");
    assert!(!o.stderr.contains("request line"), "{o}");
    let o = set(780_000);
    assert_eq!(o.code, 0, "{o}");
    let get = || run(env.holdfast(&["cred", "get", "big"]), b"");
    let got = get();
    assert_eq!(got.code, 0, "{got}");
    assert_eq!(got.stdout.len(), 780_001);
    let o = run(env.holdfast(&["key", "rotate"]), b"");
    assert_eq!(o.code, 0, "{o}");
    assert_eq!(get().stdout.len(), 780_001);
    let q = env.store_base().join("quarantine");
    assert!(names(&q).is_empty(), "{:?}", names(&q));
    drop(daemon);
    println!("size limit through the daemon: 900,000 bytes refused, 780,000 stored and read back before and after a rotation, 0 files quarantined");
}

#[test]
fn a_larger_file_another_program_wrote_keeps_its_key_and_is_never_quarantined() {
    let env = TempHome::new();
    let data = env.root.join("data");
    ok(in_dir(&env, &data, &["init"], b""));
    ok(in_dir(&env, &data, &["cred", "set", "small"], b"s\n"));
    let cred_dir = store_base(&data).join("credentials");
    // hive has no size limit: a 1.2 MB credential sealed with the store's key.
    let ring = ring_of(&own_key(&env, &data));
    let doc = serde_json::json!({
        "id": "huge",
        "credential_type": "api_key",
        "keys": {"api_key": {"name": "api_key", "value": "h".repeat(1_200_000)}},
    });
    let token = ring.encrypt(doc.to_string().as_bytes());
    assert!(token.len() > 1 << 20);
    fs::write(cred_dir.join("huge.enc"), &token).unwrap();
    // And a document a key opens that is not a credential (an authentic file of no use).
    fs::write(cred_dir.join("odd.enc"), ring.encrypt(b"[1, 2, 3]")).unwrap();

    let o = code(in_dir(&env, &data, &["cred", "get", "huge"], b""), 10);
    assert!(o.stderr.contains("larger than the 1048576 bytes"), "{o}");
    let o = code(in_dir(&env, &data, &["store", "fsck", "--repair"], b""), 1);
    assert!(o.stdout.contains("not usable here"), "{o}");
    let quarantine = store_base(&data).join("quarantine");
    assert!(names(&quarantine).is_empty(), "{:?}", names(&quarantine));
    assert_eq!(
        fs::read(cred_dir.join("huge.enc")).unwrap(),
        token.as_bytes()
    );

    // Rotation reads it (it is not "undecryptable") and moves it to the new key; a prune
    // then retires the old key, and the file still opens with what the store keeps.
    let r = json(&ok(in_dir(&env, &data, &["--json", "key", "rotate"], b"")));
    assert_eq!(r["reencrypted"], 3, "{r}");
    assert_eq!(r["undecryptable"], serde_json::json!([]), "{r}");
    let p = json(&ok(in_dir(&env, &data, &["--json", "key", "prune"], b"")));
    assert_eq!(p["pruned"].as_array().unwrap().len(), 1, "{p}");
    let ring = ring_of(&own_key(&env, &data));
    for f in ["huge.enc", "odd.enc", "small.enc"] {
        let t = fs::read_to_string(cred_dir.join(f)).unwrap();
        assert!(ring.decrypt(&t).is_ok(), "{f} no longer opens");
    }
    let shown = json(&ok(in_dir(&env, &data, &["--json", "key"], b"")));
    assert_eq!(
        shown["keys"][0]["files"],
        serde_json::json!(["huge.enc", "odd.enc", "small.enc"])
    );
    assert_eq!(
        ok(in_dir(&env, &data, &["cred", "get", "small"], b"")).stdout,
        "s\n"
    );
    println!("a 1.2 MB file hive wrote and an authentic non-credential: 0 quarantined by a repair, both re-encrypted by a rotation, the old key pruned only after, both open with the kept key");
}

#[test]
fn the_same_store_answers_alike_offline_and_through_the_daemon() {
    let mut env = DaemonEnv::new("");
    let daemon = env.start();
    let cli = |env: &DaemonEnv, args: &[&str], stdin: &[u8]| run(env.holdfast(args), stdin);
    assert_eq!(cli(&env, &["cred", "set", "team/slack"], b"v\n").code, 0);
    // An id whose file holds another id's credential: `conflict` (exit 4) naming it, both
    // ways — not a lost compare-and-swap retried until "busy".
    for offline in [false, true] {
        let mut args = vec!["cred", "set", "team_slack"];
        if offline {
            args.insert(0, "--offline");
        }
        let o = cli(&env, &args, b"w\n");
        assert_eq!(o.code, 4, "offline={offline}: {o}");
        assert!(
            o.stderr.contains("already holds credential \"team/slack\""),
            "{o}"
        );
        assert_eq!(o.stderr.contains("(offline)"), offline, "{o}");
    }
    // Ids that would display as other ids are refused (exit 2), both ways.
    for offline in [false, true] {
        let mut args = vec!["cred", "set", "pay\u{202E}lanigiro"];
        if offline {
            args.insert(0, "--offline");
        }
        let o = cli(&env, &args, b"x\n");
        assert_eq!(o.code, 2, "offline={offline}: {o}");
        assert!(
            o.stderr.contains("invisible or look-alike character"),
            "{o}"
        );
    }
    drop(daemon);
    // A store directory replaced by a symlink: `forbidden` (exit 9) both ways.
    let base = env.store_base();
    let moved = env.root.join("elsewhere");
    fs::rename(&base, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &base).unwrap();
    let daemon = env.start();
    for offline in [false, true] {
        let mut args = vec!["cred", "get", "team/slack"];
        if offline {
            args.insert(0, "--offline");
        }
        let o = cli(&env, &args, b"");
        assert_eq!(o.code, 9, "offline={offline}: {o}");
        assert!(o.stderr.contains("is a symlink"), "{o}");
    }
    drop(daemon);
    println!("offline and through the daemon: id collision exit 4, bidi id exit 2, symlinked store exit 9");
}

/// A FIFO or a socket where a credential, checkpoint or run file belongs never makes a request
/// (or the daemon's start) wait: an independent tester pinned a thread per request in `open()`
/// until the daemon stopped answering everyone.
#[test]
fn fifos_and_sockets_where_files_belong_never_hang_a_request() {
    use common::Conn;
    use serde_json::json;
    let mkfifo = |p: &Path| {
        let st = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap();
        assert!(st.success(), "mkfifo {}", p.display());
    };
    let mut env = DaemonEnv::new("");
    let cred_dir = env.store_base().join("credentials");
    let quarantine = env.store_base().join("quarantine");
    // Before the daemon starts: its open (a repair) meets a FIFO, and moves it aside.
    mkfifo(&cred_dir.join("early.enc"));
    let daemon = env.start();
    assert_eq!(names(&quarantine).len(), 1, "{:?}", names(&quarantine));
    let mut c = Conn::open(&daemon.socket);
    c.set_timeout(std::time::Duration::from_secs(10));
    c.ok("cred.set", json!({"id": "ok", "value": "v"}));
    // While it runs: a FIFO and a socket among the credential files.
    mkfifo(&cred_dir.join("fifo.enc"));
    let _sock = std::os::unix::net::UnixListener::bind(cred_dir.join("sock.enc")).unwrap();
    for id in ["fifo", "sock"] {
        for _ in 0..20 {
            let e = c.err("cred.get", json!({"id": id}));
            assert_eq!(e["data"]["kind"], "integrity", "{id}: {e}");
        }
    }
    // A run's checkpoint replaced by a FIFO.
    let run = "fifo-run";
    c.ok(
        "checkpoint.put",
        json!({"run_id": run, "snapshot": {"partial_text": "p"}}),
    );
    if !env.on_postgres() {
        let ck = env.data_dir.join("runs").join(run).join("checkpoint");
        fs::remove_file(&ck).unwrap();
        mkfifo(&ck);
        for _ in 0..40 {
            let r = c.call("checkpoint.get", json!({"run_id": run}));
            assert!(r.get("error").is_some(), "{r}");
        }
        // A rotation cannot re-seal it, so it keeps the old key (and says why).
        let e = c.err("admin.rotate_key", json!({}));
        assert_eq!(e["data"]["kind"], "integrity", "{e}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("a special file where holdfast keeps a file"),
            "{e}"
        );
        fs::remove_file(&ck).unwrap();
    }
    // The daemon still answers; a repair moves the FIFO and the socket aside; a prune is not
    // blocked by what a key could never be needed for.
    let v = c.ok("cred.get", json!({"id": "ok"}));
    assert_eq!(v["credential"]["keys"]["api_key"]["value"], "v");
    let r = c.ok("admin.fsck", json!({"repair": true}));
    assert_eq!(r["quarantined"].as_array().unwrap().len(), 2, "{r}");
    c.ok("admin.rotate_key", json!({}));
    let p = c.ok("admin.prune_keys", json!({}));
    assert!(!p["pruned"].as_array().unwrap().is_empty(), "{p}");
    assert_eq!(p["retired"], json!([]), "{p}");
    drop(c);
    drop(daemon);
    println!("a FIFO and a socket among credential files, a FIFO at a checkpoint: 40 reads of it answered, the daemon started and served, 2 quarantined, a prune not blocked");
}

/// A data dir copied with `cp -a` (a test copy, a restored backup beside the original) has the
/// original's identity, so it would share the original's key file: a rotation and a prune in
/// the copy sealed the original (an independent tester's find). The copy takes an identity and
/// a key file of its own on its first writable open.
#[test]
fn a_copied_data_dir_takes_its_own_key_before_it_can_touch_the_originals() {
    let env = TempHome::new();
    let (orig, copy) = (env.root.join("orig"), env.root.join("copy"));
    ok(in_dir(&env, &orig, &["init"], b""));
    ok(in_dir(&env, &orig, &["cred", "set", "prod"], b"p\n"));
    let orig_key = own_key(&env, &orig);
    let orig_bytes = fs::read(&orig_key).unwrap();
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(&orig)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());
    // Reading the copy works (with the key it was copied with) and gives it its own key.
    let o = ok(in_dir(&env, &copy, &["cred", "get", "prod"], b""));
    assert_eq!(o.stdout, "p\n");
    assert!(
        o.stderr.contains("uses the key file of the store at"),
        "{o}"
    );
    let copy_key = own_key(&env, &copy);
    assert_ne!(copy_key, orig_key);
    assert_eq!(fs::read(&copy_key).unwrap(), orig_bytes);
    // Said once: the next open is quiet.
    let o = ok(in_dir(&env, &copy, &["cred", "get", "prod"], b""));
    assert!(!o.stderr.contains("uses the key file"), "{o}");
    // Rotating and pruning the copy leaves the original's key and credential alone.
    for _ in 0..2 {
        ok(in_dir(&env, &copy, &["key", "rotate"], b""));
    }
    ok(in_dir(&env, &copy, &["key", "prune"], b""));
    assert_eq!(fs::read(&orig_key).unwrap(), orig_bytes);
    assert_eq!(
        ok(in_dir(&env, &orig, &["cred", "get", "prod"], b"")).stdout,
        "p\n"
    );
    assert_eq!(
        ok(in_dir(&env, &copy, &["cred", "get", "prod"], b"")).stdout,
        "p\n"
    );
    // A data dir that was moved (the old place gone) keeps its identity and key.
    let moved = env.root.join("moved");
    fs::rename(&orig, &moved).unwrap();
    let o = ok(in_dir(&env, &moved, &["cred", "get", "prod"], b""));
    assert!(!o.stderr.contains("uses the key file"), "{o}");
    assert_eq!(own_key(&env, &moved), orig_key);
    println!("a copied data dir: its own identity and key on first open; 2 rotations and a prune there left the original's key byte for byte; a moved one kept its key");
}

/// A run `kept` with one text event, through a daemon started and stopped here: data sealed
/// with the default store's key.
fn stream_sealed_with_the_default_key(env: &mut DaemonEnv) {
    use common::Conn;
    use serde_json::json;
    let daemon = env.start();
    let mut c = Conn::open(&daemon.socket);
    let b = c.ok("stream.begin", json!({"run_id": "kept"}));
    c.ok(
        "stream.append",
        json!({"run_id": "kept", "stream_id": b["stream_id"], "seq": 1,
               "events": [{"type": "text", "text": "sealed with the default key"}]}),
    );
}

/// The default store's key also seals the daemon's streams. Pruning it offline under another
/// name (`--store-dir` to the default store, or its key file) removed the key the streams
/// needed (an independent tester's find): refused, and `holdfast key` says why.
#[test]
fn the_default_stores_key_is_never_pruned_around_the_daemons_streams() {
    use common::Conn;
    use serde_json::json;
    let Some(mut env) = streams_env("") else {
        return;
    };
    stream_sealed_with_the_default_key(&mut env);
    let key = env.key_file();
    let key_bytes = fs::read(&key).unwrap();
    let base = env.store_base();
    let (b, k) = (base.to_str().unwrap(), key.to_str().unwrap());
    for args in [
        vec![
            "--store-dir",
            b,
            "--key-file",
            k,
            "key",
            "rotate",
            "--prune",
        ],
        vec!["--store-dir", b, "--key-file", k, "key", "prune"],
        vec!["key", "prune"],
    ] {
        let o = run(env.holdfast(&args), b"");
        assert_eq!(o.code, 10, "{args:?}: {o}");
        assert!(o.stderr.contains("also seals the daemon's streams"), "{o}");
    }
    assert_eq!(fs::read(&key).unwrap(), key_bytes, "the key was changed");
    let o = run(env.holdfast(&["key"]), b"");
    assert!(o.stdout.contains("also seals the daemon's streams"), "{o}");
    // With the daemon running, a rotation and a prune re-seal the streams first.
    let daemon = env.start();
    let o = run(env.holdfast(&["key", "rotate", "--prune"]), b"");
    assert_eq!(o.code, 0, "{o}");
    let mut c = Conn::open(&daemon.socket);
    let g = c.ok("stream.get", json!({"run_id": "kept"}));
    assert_eq!(
        (g["status"].as_str(), g["text_chars"].as_u64()),
        (Some("streaming"), Some(27)),
        "{g}"
    );
    drop(c);
    drop(daemon);
    println!("the default store's key: 3 offline prunes under other names refused, the key unchanged; through the daemon rotated and pruned, the stream still reads");
}

/// The default store's key also seals the streams: when the store lost its identity (and
/// so its key) but the streams hold data, `init` refuses to mint a key over them (an
/// independent tester's second round: the new key left every stream unreadable), and putting
/// the identity back makes it all readable again.
#[test]
fn init_never_mints_a_key_over_streams_the_lost_one_sealed() {
    use common::Conn;
    use serde_json::json;
    let Some(mut env) = streams_env("") else {
        return;
    };
    stream_sealed_with_the_default_key(&mut env);
    let key = env.key_file();
    let keys = key.parent().unwrap().to_path_buf();
    let ident = identity::identity_path(&env.store_base());
    let saved = fs::read(&ident).unwrap();
    fs::remove_file(&ident).unwrap();
    let keys_before = names(&keys);
    let o = run(env.holdfast(&["init"]), b"");
    assert_eq!(o.code, 5, "{o}");
    assert!(o.stderr.contains("also seals the streams"), "{o}");
    assert!(
        o.stderr.contains(&key.display().to_string()),
        "the message names the candidate key file: {o}"
    );
    assert_eq!(names(&keys), keys_before, "init made a key");
    fs::write(&ident, saved).unwrap();
    let o = run(env.holdfast(&["init"]), b"");
    assert_eq!(o.code, 0, "{o}");
    assert!(o.stdout.contains("already initialized"), "{o}");
    let daemon = env.start();
    let mut c = Conn::open(&daemon.socket);
    let g = c.ok("stream.get", json!({"run_id": "kept"}));
    assert_eq!(g["text_chars"].as_u64(), Some(27), "{g}");
    drop(c);
    drop(daemon);
    println!("a lost identity over sealed streams: init refused (exit 5) naming the key file, no key made; restored, the stream reads");
}

/// A store whose identity file was lost cannot say which key file is its own: it is sealed,
/// the message names the key files of stores of its name, `init` makes no new key, and putting
/// the identity back opens it.
#[test]
fn a_lost_identity_seals_and_names_the_candidate_key_files() {
    let env = TempHome::new();
    let data = env.root.join("data");
    ok(in_dir(&env, &data, &["init"], b""));
    ok(in_dir(&env, &data, &["cred", "set", "x"], b"v\n"));
    let key = own_key(&env, &data);
    let ident = identity::identity_path(&store_base(&data));
    let saved = fs::read(&ident).unwrap();
    fs::remove_file(&ident).unwrap();
    for args in [&["cred", "get", "x"][..], &["init"][..]] {
        let o = code(in_dir(&env, &data, args, b""), 5);
        assert!(o.stderr.contains("no identity"), "{args:?}: {o}");
        assert!(
            o.stderr.contains(&key.display().to_string()),
            "{args:?}: {o}"
        );
    }
    let keys: Vec<String> = names(&keys_dir(&env))
        .into_iter()
        .filter(|n| n.ends_with(".key"))
        .collect();
    assert_eq!(keys.len(), 1, "init made a key: {keys:?}");
    fs::write(&ident, saved).unwrap();
    assert_eq!(
        ok(in_dir(&env, &data, &["cred", "get", "x"], b"")).stdout,
        "v\n"
    );
    println!("a lost identity: sealed (exit 5) naming the candidate key file, no key made, restored it opens");
}

/// Who owns a key file is decided by the store directory's inode (`store::claim`), so that a
/// copy whose original was then moved, a second store given the default store's key file, and
/// the default store reached as another data dir's --store-dir can never prune a key the owner
/// needs (an independent tester's second round sealed stores these three ways); a store reached
/// through a bind mount is the owner itself.
#[test]
fn only_the_store_that_owns_a_key_file_may_prune_it() {
    let env = TempHome::new();
    let orig = env.root.join("orig");
    ok(in_dir(&env, &orig, &["init"], b""));
    ok(in_dir(&env, &orig, &["cred", "set", "a"], b"v1\n"));
    // Copied, then the original moved: whichever opens first keeps the key file, the other
    // takes its own; a prune in the copy leaves the original readable.
    let (copy, moved) = (env.root.join("copy"), env.root.join("moved"));
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(&orig)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());
    fs::rename(&orig, &moved).unwrap();
    ok(in_dir(&env, &copy, &["cred", "get", "a"], b""));
    ok(in_dir(&env, &moved, &["cred", "get", "a"], b""));
    assert_ne!(own_key(&env, &copy), own_key(&env, &moved));
    ok(in_dir(&env, &copy, &["key", "rotate", "--prune"], b""));
    assert_eq!(
        ok(in_dir(&env, &moved, &["cred", "get", "a"], b"")).stdout,
        "v1\n"
    );
    // Another directory given the owner's key file may not prune it, however it is named.
    let key = own_key(&env, &moved);
    let other = env.root.join("other-store");
    for d in ["credentials", "metadata"] {
        fs::create_dir_all(other.join(d)).unwrap();
    }
    let (o, k) = (other.to_str().unwrap(), key.to_str().unwrap());
    ok(in_dir(
        &env,
        &moved,
        &["--store-dir", o, "--key-file", k, "cred", "set", "b"],
        b"x\n",
    ));
    let refused = code(
        in_dir(
            &env,
            &moved,
            &[
                "--store-dir",
                o,
                "--key-file",
                k,
                "key",
                "rotate",
                "--prune",
            ],
            b"",
        ),
        10,
    );
    assert!(
        refused.stderr.contains("belongs to the store at"),
        "{refused}"
    );
    assert_eq!(
        ok(in_dir(&env, &moved, &["cred", "get", "a"], b"")).stdout,
        "v1\n"
    );
    // The owner reached as another data dir's --store-dir is still the owner (its inode).
    let base = store_base(&moved);
    let b = base.to_str().unwrap();
    ok(in_dir(
        &env,
        &env.root.join("elsewhere"),
        &["--store-dir", b, "--key-file", k, "key", "prune"],
        b"",
    ));
    assert_eq!(
        ok(in_dir(&env, &moved, &["cred", "get", "a"], b"")).stdout,
        "v1\n"
    );
    println!("key-file owners: a copy of a moved original took its own key and pruned without harm; another directory with the owner's key file was refused a prune; the owner reached by another path was not");
}

/// A claim whose directory is not where it says is not proof the owner is gone: moved with
/// `mv`, it lives on under a path the claim does not know. A copy that finds such a claim
/// takes a key file of its own, as from a live owner, so its rotation and prune never touch
/// the moved original's key (an independent tester sealed the original both ways: the copy
/// beside it, and the copy put back in the original's place).
#[test]
fn a_moved_original_keeps_its_key_whatever_a_copy_of_it_does() {
    for variant in [
        "copy beside, original moved away",
        "original moved aside, copy put back",
    ] {
        let env = TempHome::new();
        let orig = env.root.join("orig");
        ok(in_dir(&env, &orig, &["init"], b""));
        ok(in_dir(&env, &orig, &["cred", "set", "prod"], b"p\n"));
        let (moved, copy) = if variant.starts_with("copy beside") {
            let (copy, moved) = (env.root.join("copy"), env.root.join("moved"));
            cp_a(&orig, &copy);
            fs::rename(&orig, &moved).unwrap();
            (moved, copy)
        } else {
            let moved = env.root.join("orig.old");
            fs::rename(&orig, &moved).unwrap();
            cp_a(&moved, &orig);
            (moved, orig.clone())
        };
        let o = ok(in_dir(&env, &copy, &["key", "rotate"], b""));
        assert!(o.stderr.contains("key file of its own"), "{variant}: {o}");
        ok(in_dir(&env, &copy, &["key", "rotate"], b""));
        ok(in_dir(&env, &copy, &["key", "prune"], b""));
        for dir in [&moved, &copy] {
            let o = ok(in_dir(&env, dir, &["cred", "get", "prod"], b""));
            assert_eq!(o.stdout, "p\n", "{variant}: {}", dir.display());
        }
        assert_ne!(own_key(&env, &moved), own_key(&env, &copy), "{variant}");
        // The moved original is still its key's owner: its own rotation and prune work.
        ok(in_dir(&env, &moved, &["key", "rotate"], b""));
        ok(in_dir(&env, &moved, &["key", "prune"], b""));
        let o = ok(in_dir(&env, &moved, &["cred", "get", "prod"], b""));
        assert_eq!(o.stdout, "p\n", "{variant}");
        println!("{variant}: the copy took its own key, rotated twice and pruned; the moved original reads and rotates its own");
    }
}

/// `--store-dir NEW init` with no key named would use hive's key (the default for a store
/// directory): refused for a new store, nothing created; naming hive's key shares it
/// deliberately, but only its owner may rotate it — hive reads no archive, so a rotation from
/// elsewhere left hive unable to open its own credential (an independent tester's find).
#[test]
fn a_store_dir_never_takes_or_rotates_hives_key() {
    let env = TempHome::new();
    let hive_key = env.home.join(".hive/secrets/credential_key");
    keys::write_key_file(
        &hive_key,
        &holdfast::crypto::generate_key(),
        &Faults::none(),
    )
    .unwrap();
    let hive_bytes = fs::read(&hive_key).unwrap();
    let run_cli = |args: &[&str], stdin: &[u8]| {
        let mut c = env.cmd();
        c.args(args);
        run(c, stdin)
    };
    ok(run_cli(&["--hive", "init"], b""));
    ok(run_cli(&["--hive", "cred", "set", "hv"], b"hive-secret\n"));
    let new = env.root.join("newstore");
    let o = code(
        run_cli(&["--store-dir", new.to_str().unwrap(), "init"], b""),
        4,
    );
    assert!(o.stderr.contains("refusing to initialize"), "{o}");
    assert!(o.stderr.contains("--key-file"), "{o}");
    assert!(!new.exists(), "{o}");
    // Named explicitly: shared on purpose, said so; but a rotation there is refused.
    let given = [
        "--store-dir",
        new.to_str().unwrap(),
        "--key-file",
        hive_key.to_str().unwrap(),
    ];
    let o = ok(run_cli(&[&given[..], &["init"]].concat(), b""));
    assert!(o.stdout.contains("with the key you gave"), "{o}");
    assert!(o.stdout.contains("belongs to the store at"), "{o}");
    ok(run_cli(
        &[&given[..], &["cred", "set", "n"]].concat(),
        b"new\n",
    ));
    for op in ["rotate", "prune"] {
        let o = code(run_cli(&[&given[..], &["key", op]].concat(), b""), 10);
        assert!(o.stderr.contains("belongs to the store at"), "{op}: {o}");
    }
    assert_eq!(fs::read(&hive_key).unwrap(), hive_bytes);
    assert_eq!(
        ok(run_cli(&["--hive", "cred", "get", "hv"], b"")).stdout,
        "hive-secret\n"
    );
    // A key of its own: fine.
    let own = env.root.join("own.key");
    let o = ok(run_cli(
        &[
            "--store-dir",
            env.root.join("third").to_str().unwrap(),
            "--key-file",
            own.to_str().unwrap(),
            "init",
        ],
        b"",
    ));
    assert!(o.stdout.contains("created store"), "{o}");
    // hive's key file belongs to hive's store even with no claim beside it (a store hive
    // made, never written through holdfast): a copy of hive's store may not rotate or prune
    // it (a fourth independent attack: the copy's first write claimed it, and its rotation
    // left hive unable to read its own credential).
    fs::remove_file(holdfast::store::claim::claim_path(&hive_key)).unwrap();
    let copy = env.root.join("hivecopy");
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(env.home.join(".hive/credentials"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(st.success());
    let c = ["--store-dir", copy.to_str().unwrap()];
    assert_eq!(
        ok(run_cli(&[&c[..], &["cred", "get", "hv"]].concat(), b"")).stdout,
        "hive-secret\n"
    );
    for op in ["rotate", "prune"] {
        let o = code(run_cli(&[&c[..], &["key", op]].concat(), b""), 10);
        assert!(o.stderr.contains(".hive/credentials"), "{op}: {o}");
    }
    assert_eq!(fs::read(&hive_key).unwrap(), hive_bytes);
    assert_eq!(
        ok(run_cli(&["--hive", "cred", "get", "hv"], b"")).stdout,
        "hive-secret\n"
    );
    // hive's own store rotates it (re-encrypting hive's files).
    ok(run_cli(&["--hive", "key", "rotate"], b""));
    assert_eq!(
        ok(run_cli(&["--hive", "cred", "get", "hv"], b"")).stdout,
        "hive-secret\n"
    );
    println!("store dir: init without a key refused (nothing created); hive's key named explicitly, or reached from a copy of hive's store, is not rotated or pruned there; hive's credential reads; hive's store rotates it");
}

/// A `[stores.NAME]` entry is the store's directory for the offline CLI as for the daemon: a
/// credential set offline is the one the daemon serves (the CLI used `stores/NAME` under the
/// data dir, the daemon the configured path: an acknowledged credential went missing).
#[test]
fn a_configured_store_is_one_directory_with_or_without_the_daemon() {
    let mut env = DaemonEnv::new("[stores.foo]\npath = \"~/ext\"\n");
    let o = run(env.holdfast(&["--store", "foo", "init"]), b"");
    assert_eq!(o.code, 0, "{o}");
    assert!(
        o.stdout
            .contains(&env.home.join("ext").display().to_string()),
        "{o}"
    );
    let o = run(
        env.holdfast(&["--offline", "--store", "foo", "cred", "set", "x"]),
        b"configured\n",
    );
    assert_eq!(o.code, 0, "{o}");
    assert!(env.home.join("ext/credentials/x.enc").is_file());
    let daemon = env.start();
    let o = run(env.holdfast(&["--store", "foo", "cred", "get", "x"]), b"");
    assert_eq!((o.code, o.stdout.as_str()), (0, "configured\n"), "{o}");
    // The config edited under the running daemon: the CLI refuses rather than use a store
    // the daemon does not serve under that name (a fourth independent attack's find).
    env.write_config("[stores.foo]\npath = \"~/ext2\"\n");
    let o = run(
        env.holdfast(&["--store", "foo", "cred", "set", "y"]),
        b"v\n",
    );
    assert_eq!(o.code, 4, "{o}");
    assert!(
        o.stderr
            .contains("the config changed since the daemon started"),
        "{o}"
    );
    assert!(!env.home.join("ext/credentials/y.enc").exists());
    drop(daemon);
    println!("[stores.foo]: init, an offline set and a get through the daemon all at ~/ext; the config edited under the daemon is refused");
}

/// A FIFO at the key archive is refused (`forbidden`, exit 9) with one clear error, not with an
/// internal log line beside it ("key files changed…": a sealed store looking again at its
/// keys said so on every look).
#[test]
fn a_fifo_at_the_key_archive_is_one_clear_error() {
    let env = TempHome::new();
    let data = env.root.join("d");
    ok(in_dir(&env, &data, &["init"], b""));
    ok(in_dir(&env, &data, &["cred", "set", "a"], b"v\n"));
    let prev = {
        let mut s = own_key(&env, &data).into_os_string();
        s.push(".prev");
        PathBuf::from(s)
    };
    let st = std::process::Command::new("mkfifo")
        .arg(&prev)
        .status()
        .unwrap();
    assert!(st.success());
    let o = code(in_dir(&env, &data, &["cred", "get", "a"], b""), 9);
    assert!(o.stderr.contains("is not a file"), "{o}");
    assert!(!o.stderr.contains("ERROR"), "{o}");
    assert_eq!(o.stderr.matches("is not a file").count(), 1, "{o}");
    println!("a FIFO at the key archive: exit 9, one error line");
}

/// `[stores.default]` in config.toml moves the daemon's default store — whose key seals the
/// streams — elsewhere: an offline rotation or prune of it must be refused like the stock
/// one's (an independent tester's fifth round: it went through, and after a restart the run
/// answered not_found and its checkpoint integrity).
#[test]
fn a_configured_default_stores_key_is_never_rotated_around_the_streams() {
    use common::Conn;
    use serde_json::json;
    let Some(mut env) = streams_env("[stores.default]\npath = \"~/ext\"\n") else {
        return;
    };
    assert!(
        env.home.join("ext/credentials").is_dir(),
        "init used the configured path"
    );
    stream_sealed_with_the_default_key(&mut env);
    for args in [&["key", "rotate"][..], &["key", "prune"][..]] {
        let o = run(env.holdfast(args), b"");
        assert_eq!(o.code, 10, "{args:?}: {o}");
        assert!(o.stderr.contains("also seals the daemon's streams"), "{o}");
    }
    let daemon = env.start();
    let mut c = Conn::open(&daemon.socket);
    let g = c.ok("stream.get", json!({"run_id": "kept"}));
    assert_eq!(g["text_chars"], 27, "{g}");
    drop(c);
    drop(daemon);
    println!("[stores.default] elsewhere: offline rotate and prune refused, the stream reads");
}

/// Key files given explicitly (`--key-file`, `--key-env`) after the fifth independent attack:
/// a stale claim is never taken over (the copy of a moved original rotated and pruned the
/// original's key), the key file older versions shared is never rotated (data dirs not opened
/// since sealed), a key file in hive's layout belongs to hive's store whatever `HIVE_HOME`
/// says, and `init` names an existing key in a variable the way it can be given.
#[test]
fn explicit_key_files_never_rotate_around_their_owners() {
    let env = TempHome::new();
    let cli = |args: &[&str], stdin: &[u8]| {
        let mut c = env.cmd();
        c.args(args);
        run(c, stdin)
    };
    let p = |p: &Path| p.to_str().unwrap().to_owned();
    // A moved owner of an explicit key file, and a copy of it.
    let k = env.root.join("k.key");
    keys::write_key_file(&k, &holdfast::crypto::generate_key(), &Faults::none()).unwrap();
    let (a, b, a2) = (env.root.join("a"), env.root.join("b"), env.root.join("a2"));
    let with = |dir: &Path, rest: &[&str]| -> Vec<String> {
        let mut v = vec![
            "--store-dir".to_string(),
            p(dir),
            "--key-file".into(),
            p(&k),
        ];
        v.extend(rest.iter().map(|s| s.to_string()));
        v
    };
    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    ok(cli(&args(&with(&a, &["init"])), b""));
    ok(cli(&args(&with(&a, &["cred", "set", "x"])), b"xv\n"));
    cp_a(&a, &b);
    fs::rename(&a, &a2).unwrap();
    for op in ["rotate", "prune"] {
        let o = code(cli(&args(&with(&b, &["key", op])), b""), 10);
        assert!(o.stderr.contains("moved, restored or deleted"), "{op}: {o}");
    }
    assert_eq!(
        ok(cli(&args(&with(&b, &["cred", "get", "x"])), b"")).stdout,
        "xv\n"
    );
    ok(cli(&args(&with(&a2, &["key", "rotate"])), b""));
    assert_eq!(
        ok(cli(&args(&with(&a2, &["cred", "get", "x"])), b"")).stdout,
        "xv\n"
    );
    // The key file older versions shared.
    let shared = env.home.join("config/holdfast/keys/default.key");
    keys::write_key_file(&shared, &holdfast::crypto::generate_key(), &Faults::none()).unwrap();
    let shared_bytes = fs::read(&shared).unwrap();
    let y = env.root.join("y");
    let ys = ["--store-dir", &p(&y), "--key-file", &p(&shared)].map(str::to_owned);
    let with_y = |rest: &[&str]| {
        let mut v = ys.to_vec();
        v.extend(rest.iter().map(|s| s.to_string()));
        v
    };
    ok(cli(&args(&with_y(&["init"])), b""));
    for op in ["rotate", "prune"] {
        let o = code(cli(&args(&with_y(&["key", op])), b""), 10);
        assert!(
            o.stderr.contains("older holdfast versions shared"),
            "{op}: {o}"
        );
    }
    assert_eq!(fs::read(&shared).unwrap(), shared_bytes);
    // hive's layout under another HIVE_HOME than holdfast's.
    let hh = env.root.join("hh");
    let hkey = hh.join("secrets/credential_key");
    keys::write_key_file(&hkey, &holdfast::crypto::generate_key(), &Faults::none()).unwrap();
    let hive_bytes = fs::read(&hkey).unwrap();
    let hs = |dir: &Path, rest: &[&str]| {
        let mut v = vec![
            "--store-dir".to_string(),
            p(dir),
            "--key-file".into(),
            p(&hkey),
        ];
        v.extend(rest.iter().map(|s| s.to_string()));
        v
    };
    let creds = hh.join("credentials");
    ok(cli(&args(&hs(&creds, &["init"])), b""));
    ok(cli(&args(&hs(&creds, &["cred", "set", "h"])), b"hv\n"));
    let copy = env.root.join("hcopy");
    cp_a(&creds, &copy);
    let o = code(cli(&args(&hs(&copy, &["key", "rotate"])), b""), 10);
    assert!(o.stderr.contains("hh/credentials"), "{o}");
    assert_eq!(fs::read(&hkey).unwrap(), hive_bytes);
    // Not false refusals (a sixth attack): a key `init` made in holdfast's keys directory
    // under a store-like name is that store's to rotate and prune; a key in hive's layout with
    // no hive store beside it (hive's store kept elsewhere) is its user's.
    let own = env.home.join("config/holdfast/keys/proj.key");
    let proj = env.root.join("proj");
    let pj = ["--store-dir", &p(&proj), "--key-file", &p(&own)].map(str::to_owned);
    let with_pj = |rest: &[&str]| {
        let mut v = pj.to_vec();
        v.extend(rest.iter().map(|s| s.to_string()));
        v
    };
    let o = ok(cli(&args(&with_pj(&["init"])), b""));
    assert!(o.stdout.contains("created store"), "{o}");
    ok(cli(&args(&with_pj(&["cred", "set", "a"])), b"av\n"));
    ok(cli(&args(&with_pj(&["key", "rotate"])), b""));
    ok(cli(&args(&with_pj(&["key", "prune"])), b""));
    assert_eq!(
        ok(cli(&args(&with_pj(&["cred", "get", "a"])), b"")).stdout,
        "av\n"
    );
    let lone = env.root.join("lonehive/secrets/credential_key");
    keys::write_key_file(&lone, &holdfast::crypto::generate_key(), &Faults::none()).unwrap();
    let elsewhere = env.root.join("agentcreds");
    let le = ["--store-dir", &p(&elsewhere), "--key-file", &p(&lone)].map(str::to_owned);
    let with_le = |rest: &[&str]| {
        let mut v = le.to_vec();
        v.extend(rest.iter().map(|s| s.to_string()));
        v
    };
    ok(cli(&args(&with_le(&["init"])), b""));
    ok(cli(&args(&with_le(&["cred", "set", "a1"])), b"v1\n"));
    ok(cli(&args(&with_le(&["key", "rotate"])), b""));
    assert_eq!(
        ok(cli(&args(&with_le(&["cred", "get", "a1"])), b"")).stdout,
        "v1\n"
    );
    // A key in a variable: init names it as --key-env, and takes it when so named.
    let var_key = String::from_utf8(hive_bytes.clone()).unwrap();
    let n = env.root.join("n");
    let mut c = env.cmd();
    c.env("HIVE_CREDENTIAL_KEY", var_key.trim())
        .args(["--store-dir", &p(&n), "init"]);
    let o = code(run(c, b""), 4);
    assert!(o.stderr.contains("--key-env HIVE_CREDENTIAL_KEY"), "{o}");
    let mut c = env.cmd();
    c.env("HIVE_CREDENTIAL_KEY", var_key.trim()).args([
        "--store-dir",
        &p(&n),
        "--key-env",
        "HIVE_CREDENTIAL_KEY",
        "init",
    ]);
    let o = ok(run(c, b""));
    assert!(o.stdout.contains("with the key you gave"), "{o}");
    println!("explicit keys: a moved owner's copy, the old shared key and hive's key under another HIVE_HOME are refused rotate/prune; init takes a key in a variable named with --key-env");
}

/// `--data-dir` naming the daemon's data dir through a symlink is the daemon's data dir: the
/// CLI goes through the daemon, not around it (it went around, and its open reported the
/// daemon's pending work as problems).
#[test]
fn a_data_dir_named_through_a_link_goes_through_the_daemon() {
    let mut env = DaemonEnv::new("");
    let link = env.root.join("data-link");
    std::os::unix::fs::symlink(&env.data_dir, &link).unwrap();
    let daemon = env.start();
    let set = run(
        env.holdfast(&["--data-dir", link.to_str().unwrap(), "cred", "set", "l"]),
        b"v\n",
    );
    assert_eq!(set.code, 0, "{set}");
    assert!(!set.stderr.contains("(offline)"), "{set}");
    drop(daemon);
    println!("a data dir named through a link: served by the daemon");
}

/// `HIVE_HOME` is read as hive reads it (`Path(HIVE_HOME).expanduser()`): `~/hh` is the home
/// directory's `hh` for holdfast too (it opened `~/.hive` while hive used `~/hh`).
#[test]
fn hive_home_is_expanded_as_hive_expands_it() {
    let env = TempHome::new();
    let mut c = env.cmd();
    c.env("HIVE_HOME", "~/hh").args(["--hive", "init"]);
    let o = ok(run(c, b""));
    assert!(env.home.join("hh/credentials").is_dir(), "{o}");
    assert!(env.home.join("hh/secrets/credential_key").is_file(), "{o}");
    assert!(!env.home.join(".hive").exists(), "{o}");
    println!("HIVE_HOME=~/hh: hive's store and key under ~/hh");
}

/// Two data dirs sharing one default store (`[stores.default]` in their one config): a prune
/// from one keeps the archive while the other's streams, sealed with that key, hold data — a
/// sixth independent attack's prune in data dir A left B's checkpoint undecryptable and B's
/// run gone. A rotation is fine (the old key stays archived).
#[test]
fn a_default_store_shared_by_two_data_dirs_is_never_pruned_around_the_others_streams() {
    use common::{Conn, DaemonOpts};
    use serde_json::json;
    let Some(mut env) = streams_env("[stores.default]\npath = \"~/shared\"\n") else {
        return;
    };
    let b = env.root.join("data-b");
    let in_b = DaemonOpts {
        args: vec!["--data-dir".into(), b.to_str().unwrap().into()],
        ..DaemonOpts::default()
    };
    let d = env.start_with(&in_b);
    let mut c = Conn::open(&d.socket);
    let begun = c.ok("stream.begin", json!({"run_id": "rb"}));
    c.ok(
        "stream.append",
        json!({"run_id": "rb", "stream_id": begun["stream_id"], "seq": 1,
               "events": [{"type": "text", "text": "B-text"}]}),
    );
    c.ok(
        "checkpoint.put",
        json!({"run_id": "rb", "snapshot": {"partial_text": "B-text"}}),
    );
    drop(c);
    d.stop();
    let d = env.start();
    let mut c = Conn::open(&d.socket);
    c.ok("admin.rotate_key", json!({}));
    let e = c.err("admin.prune_keys", json!({}));
    assert_eq!(e["data"]["kind"], "unsupported", "{e}");
    assert!(e["message"].as_str().unwrap().contains("data-b"), "{e}");
    drop(c);
    d.stop();
    let o = run(env.holdfast(&["key", "prune"]), b"");
    assert_eq!(o.code, 10, "{o}");
    assert!(o.stderr.contains("data-b"), "{o}");
    // B moved: still B's streams (a seventh attack's prune went through once B's recorded path
    // was empty, and sealed the moved B).
    let moved = env.root.join("data-b-moved");
    fs::rename(&b, &moved).unwrap();
    let o = run(env.holdfast(&["key", "prune"]), b"");
    assert_eq!(o.code, 10, "{o}");
    assert!(o.stderr.contains("remove its line"), "{o}");
    let in_moved = DaemonOpts {
        args: vec!["--data-dir".into(), moved.to_str().unwrap().into()],
        ..DaemonOpts::default()
    };
    let d = env.start_with(&in_moved);
    let mut c = Conn::open(&d.socket);
    let ck = c.ok("checkpoint.get", json!({"run_id": "rb"}));
    assert_eq!(ck["partial_text"], "B-text", "{ck}");
    let g = c.ok("stream.get", json!({"run_id": "rb"}));
    assert_eq!(g["text_chars"], 6, "{g}");
    drop(c);
    d.stop();
    println!("a default store shared by two data dirs: A rotated, its prunes (daemon and offline) refused naming B, also once B moved; B's run and checkpoint read");
}

/// A backup of the credentials directory copied back over it (`cp -a backup/. credentials/`)
/// brings an older content's generation marker back beside the newer one. The generation
/// must not go back to the old marker's: the restored content is a new state, above every
/// marker, and a compare-and-swap against the old number is refused (a seventh independent
/// attack saw 3 → 1 and a stale `if_generation 1` accepted).
#[test]
fn a_restored_old_marker_never_takes_a_generation_back() {
    let env = TempHome::new();
    let data = env.root.join("d");
    ok(in_dir(&env, &data, &["init"], b""));
    ok(in_dir(&env, &data, &["cred", "set", "c1"], b"one\n"));
    let creds = store_base(&data).join("credentials");
    let bak = env.root.join("bak");
    cp_a(&creds, &bak);
    ok(in_dir(&env, &data, &["cred", "set", "c1"], b"two\n"));
    ok(in_dir(&env, &data, &["cred", "set", "c1"], b"three\n"));
    let gen = |o: &Out| json(o)["generation"].as_u64().unwrap();
    let before = gen(&ok(in_dir(
        &env,
        &data,
        &["--json", "cred", "get", "c1"],
        b"",
    )));
    assert_eq!(before, 3);
    // What `cp -a bak/. credentials/` does: the old file and its old marker back, the newer
    // marker left in place. (Later than the last write by more than a tick of the file
    // system's clock, which is coarse: a restore is never within milliseconds of a write.)
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut dot = bak.clone().into_os_string();
    dot.push("/.");
    cp_a(Path::new(&dot), &creds);
    let o = ok(in_dir(&env, &data, &["--json", "cred", "get", "c1"], b""));
    let restored = gen(&o);
    assert!(
        restored > before,
        "the generation went back: {before} -> {restored}: {o}"
    );
    let o = code(
        in_dir(
            &env,
            &data,
            &["cred", "set", "c1", "--if-generation", "1"],
            b"stale\n",
        ),
        4,
    );
    assert!(o.stderr.contains("generation"), "{o}");
    let o = ok(in_dir(
        &env,
        &data,
        &["--json", "cred", "set", "c1"],
        b"four\n",
    ));
    assert!(gen(&o) > restored, "{o}");
    println!("an old marker restored beside a newer one: generation {before} -> {restored}, a stale CAS refused");
}
