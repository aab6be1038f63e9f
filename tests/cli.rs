//! The admin CLI as a user sees it: output text, JSON shapes and exit codes, run as a real
//! process with a temporary HOME (and XDG dirs) and none of holdfast's or hive's variables.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{run, Out, TempHome};
use serde_json::{json, Value};

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self}"))
    }

    #[track_caller]
    fn ok(self) -> Self {
        assert_eq!(self.code, 0, "{self}");
        self
    }

    #[track_caller]
    fn code(self, want: i32) -> Self {
        assert_eq!(self.code, want, "{self}");
        self
    }
}

/// The CLI run in a temporary HOME (XDG_CONFIG_HOME and XDG_STATE_HOME inside it).
impl TempHome {
    fn run(&self, args: &[&str], stdin: &[u8]) -> Out {
        let mut c = self.cmd();
        c.args(args);
        run(c, stdin)
    }

    fn base(&self) -> PathBuf {
        self.home.join("state/holdfast/stores/default")
    }

    /// The default store's own key file (named after its identity).
    fn key(&self) -> PathBuf {
        holdfast::store::identity::own_key_file(
            &self.home.join("config/holdfast/keys"),
            "default",
            &self.base(),
        )
        .expect("store identity")
        .expect("the store has an identity")
    }

    /// `init`, returning the key fingerprint it printed.
    fn init(&self) -> String {
        let o = self.run(&["init"], b"").ok();
        fingerprint_in(&o.stdout)
    }

    fn set(&self, id: &str, value: &str) {
        self.run(&["cred", "set", id], format!("{value}\n").as_bytes())
            .ok();
    }
}

/// The 8-hex-digit fingerprint after "fingerprint " in `text`.
fn fingerprint_in(text: &str) -> String {
    let at = text
        .find("fingerprint ")
        .unwrap_or_else(|| panic!("no fingerprint in {text:?}"))
        + "fingerprint ".len();
    let fp: String = text[at..].chars().take(8).collect();
    assert!(
        fp.len() == 8 && fp.chars().all(|c| c.is_ascii_hexdigit()),
        "{fp:?} in {text:?}"
    );
    fp
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn keys_of(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect();
    k.sort_unstable();
    k
}

// ---------------------------------------------------------------------------------------------

#[test]
fn init_output_permissions_and_idempotence() {
    let env = TempHome::new();
    // Before init every command says there is no store, and how to make one.
    let o = env.run(&["cred", "list"], b"").code(3);
    assert!(o.stderr.contains("holdfast init"), "{o}");
    // hive's own store is served by import, never by an init that makes an empty one.
    assert!(o.stderr.contains("holdfast import --from-hive"), "{o}");

    let o = env.run(&["init"], b"").ok();
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{o}");
    assert_eq!(
        lines[0],
        format!("created store \"default\" at {}", env.base().display())
    );
    let fp = fingerprint_in(lines[1]);
    assert_eq!(
        lines[1],
        format!("key: key file {} (fingerprint {fp})", env.key().display())
    );
    assert_eq!(
        lines[2],
        "Back up the key file: without it these credentials cannot be decrypted."
    );
    assert!(o.stderr.is_empty(), "{o}");
    assert_eq!(mode(&env.key()), 0o600);
    assert_eq!(mode(env.key().parent().unwrap()), 0o700);
    for d in ["", "credentials", "metadata"] {
        assert_eq!(mode(&env.base().join(d)), 0o700, "{d}");
    }
    let key_bytes = fs::read(env.key()).unwrap();
    assert_eq!(
        String::from_utf8(key_bytes.clone()).unwrap().trim().len(),
        44
    );

    // Again: nothing changes, the same key is reported.
    let o = env.run(&["init"], b"").ok();
    assert_eq!(
        o.stdout,
        format!(
            "store \"default\" at {} was already initialized: 0 credential file(s); key: key file {} (fingerprint {fp}). Nothing was changed.\n",
            env.base().display(),
            env.key().display()
        )
    );
    assert_eq!(fs::read(env.key()).unwrap(), key_bytes);
    env.set("one", "v");
    let o = env.run(&["--json", "init"], b"").ok();
    assert_eq!(
        o.json(),
        json!({
            "created": false,
            "store": "default",
            "path": env.base(),
            "key_source": format!("key file {}", env.key().display()),
            "key_fingerprint": fp,
            "credentials": 1,
        })
    );
    assert_eq!(fs::read(env.key()).unwrap(), key_bytes);
}

#[test]
fn set_reads_stdin_and_drops_one_trailing_newline() {
    let env = TempHome::new();
    env.init();
    let cases: &[(&[u8], &str)] = &[
        (b"v1\n", "v1"),
        (b"v2\r\n", "v2"),
        (b"v3", "v3"),
        (b"a\nb\n", "a\nb"),
        (b"x\n\n", "x\n"),
        (b" spaced \n", " spaced "),
        (b"tab\t\n", "tab\t"),
        (b"cr\r\r\n", "cr\r"),
        ("ünïcödé ✓\n".as_bytes(), "ünïcödé ✓"),
    ];
    for (i, (stdin, want)) in cases.iter().enumerate() {
        let id = format!("nl{i}");
        let o = env.run(&["cred", "set", &id], stdin).ok();
        assert_eq!(o.stdout, format!("stored {id} (generation 1)\n"));
        let o = env.run(&["cred", "get", &id], b"").ok();
        assert_eq!(o.stdout, format!("{want}\n"), "{stdin:?}");
        let o = env.run(&["--json", "cred", "get", &id], b"").ok();
        assert_eq!(
            o.json()["credential"]["keys"]["api_key"]["value"],
            json!(want)
        );
    }
    for empty in [&b""[..], b"\n", b"\r\n"] {
        let o = env.run(&["cred", "set", "empty"], empty).code(2);
        assert!(o.stderr.contains("empty secret"), "{o}");
    }
    let o = env.run(&["cred", "set", "bin"], b"\xff\xfe\n").code(2);
    assert!(o.stderr.contains("UTF-8"), "{o}");
    env.run(&["cred", "exists", "empty"], b"").code(3);
    env.run(&["cred", "exists", "bin"], b"").code(3);
}

#[test]
fn get_with_several_keys_needs_field() {
    let env = TempHome::new();
    env.init();
    let o = env
        .run(
            &["cred", "set", "db", "--key", "user", "--type", "basic_auth"],
            b"alice\n",
        )
        .ok();
    assert_eq!(o.stdout, "stored db (generation 1)\n");
    let o = env
        .run(&["cred", "set", "db", "--key", "pass"], b"pw-123\n")
        .ok();
    assert_eq!(o.stdout, "stored db (generation 2)\n");
    let o = env.run(&["cred", "get", "db"], b"").code(2);
    assert!(o.stdout.is_empty(), "{o}");
    assert!(
        o.stderr.contains("user") && o.stderr.contains("pass") && o.stderr.contains("--field"),
        "{o}"
    );
    assert!(
        !o.stderr.contains("alice") && !o.stderr.contains("pw-123"),
        "{o}"
    );
    assert_eq!(
        env.run(&["cred", "get", "db", "--field", "pass"], b"")
            .ok()
            .stdout,
        "pw-123\n"
    );
    assert_eq!(
        env.run(&["cred", "get", "--field", "user", "db"], b"")
            .ok()
            .stdout,
        "alice\n"
    );
    let o = env
        .run(&["cred", "get", "db", "--field", "nope"], b"")
        .code(3);
    assert!(
        o.stderr.contains("user") && o.stderr.contains("pass"),
        "{o}"
    );
    let o = env
        .run(&["--json", "cred", "get", "db", "--field", "pass"], b"")
        .ok();
    assert_eq!(
        o.json(),
        json!({"credential": {"id": "db", "field": "pass", "value": "pw-123", "generation": 2}, "generation": 2})
    );
    let o = env.run(&["--json", "cred", "get", "db"], b"").ok();
    assert_eq!(
        o.json()["credential"]["credential_type"],
        json!("basic_auth")
    );
}

#[test]
fn json_shapes() {
    let env = TempHome::new();
    env.init();
    let o = env.run(&["--json", "cred", "set", "j"], b"jv\n").ok();
    assert_eq!(o.json(), json!({"id": "j", "generation": 1}));
    let o = env.run(&["cred", "set", "j", "--json"], b"jv2\n").ok();
    assert_eq!(o.json(), json!({"id": "j", "generation": 2}));

    let v = env.run(&["--json", "cred", "get", "j"], b"").ok().json();
    assert_eq!(keys_of(&v), ["credential", "generation"]);
    assert_eq!(v["generation"], json!(2));
    let c = &v["credential"];
    assert_eq!(c["id"], json!("j"));
    assert_eq!(c["credential_type"], json!("api_key"));
    assert_eq!(c["keys"]["api_key"]["name"], json!("api_key"));
    assert_eq!(c["keys"]["api_key"]["value"], json!("jv2"));
    assert_eq!(c["holdfast_generation"], json!(2));
    for field in [
        "created_at",
        "updated_at",
        "tags",
        "description",
        "auto_refresh",
    ] {
        assert!(c.get(field).is_some(), "{field} missing from {c}");
    }

    env.set("team/k", "kv");
    let v = env.run(&["--json", "cred", "list"], b"").ok().json();
    assert_eq!(keys_of(&v), ["credentials", "refused_ids", "unreadable"]);
    assert_eq!(
        (&v["unreadable"], &v["refused_ids"]),
        (&json!(0), &json!(0))
    );
    let creds = v["credentials"].as_array().unwrap();
    let ids: Vec<&str> = creds.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["j", "team/k"]);
    for c in creds {
        assert_eq!(keys_of(c), ["generation", "id", "metadata"]);
        assert_eq!(c["metadata"]["key_names"], json!(["api_key"]));
        assert_eq!(c["metadata"]["credential_type"], json!("api_key"));
    }
    assert_eq!(creds[0]["generation"], json!(2));
    let text = v.to_string();
    assert!(
        !text.contains("jv2") && !text.contains("kv\""),
        "list shows values: {text}"
    );

    let o = env.run(&["--json", "cred", "exists", "j"], b"").ok();
    assert_eq!(o.json(), json!({"id": "j", "exists": true}));
    let o = env.run(&["--json", "cred", "exists", "nope"], b"").code(3);
    assert_eq!(o.json(), json!({"id": "nope", "exists": false}));
    let o = env.run(&["--json", "cred", "delete", "j"], b"").ok();
    assert_eq!(o.json(), json!({"id": "j", "deleted": true}));
    let o = env.run(&["--json", "store", "fsck"], b"").ok();
    let r = o.json();
    assert_eq!(r["files"], json!(1));
    assert_eq!(r["readable"], json!(1));
    assert_eq!(r["temp_files"], json!([]));
}

#[test]
fn list_table() {
    let env = TempHome::new();
    env.init();
    assert_eq!(
        env.run(&["cred", "list"], b"").ok().stdout,
        "no credentials\n"
    );
    env.set("alpha", "secret-alpha");
    env.run(
        &[
            "cred",
            "set",
            "team/beta-long-id",
            "--type",
            "bearer_token",
            "--key",
            "token",
        ],
        b"secret-beta\n",
    )
    .ok();
    env.run(
        &["cred", "set", "team/beta-long-id", "--key", "refresh"],
        b"secret-beta2\n",
    )
    .ok();
    let o = env.run(&["cred", "list"], b"").ok();
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{o}");
    let w = "team/beta-long-id".len();
    assert_eq!(
        lines[0],
        format!(
            "{:<w$}  {:<12}  {:>3}  {:<19}  KEYS",
            "ID", "TYPE", "GEN", "UPDATED"
        )
    );
    let row = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    let a = row(lines[1]);
    assert_eq!(
        (a[0].as_str(), a[1].as_str(), a[2].as_str()),
        ("alpha", "api_key", "1")
    );
    assert_eq!(a[5], "api_key");
    assert!(a[3].len() == 10 && a[4].len() == 8, "date and time: {a:?}");
    let b = row(lines[2]);
    assert_eq!(
        (b[0].as_str(), b[1].as_str(), b[2].as_str(), b[5].as_str()),
        ("team/beta-long-id", "bearer_token", "2", "refresh,token")
    );
    assert!(
        lines[1].starts_with(&format!("{:<w$}  ", "alpha")),
        "aligned: {o}"
    );
    assert!(!o.stdout.contains("secret-"), "{o}");
}

#[test]
fn delete_and_exists_exit_codes() {
    let env = TempHome::new();
    env.init();
    let o = env.run(&["cred", "exists", "x"], b"").code(3);
    assert!(o.stdout.is_empty(), "{o}");
    env.set("x", "xv");
    let o = env.run(&["cred", "exists", "x"], b"").ok();
    // With no daemon, the only thing on stderr is the note that the store was opened directly.
    assert!(o.stdout.is_empty(), "{o}");
    assert_eq!(
        o.stderr,
        format!(
            "holdfast: (offline) no daemon answers on {}; using the store directly\n",
            env.home.join("run/holdfast/holdfast.sock").display()
        ),
        "{o}"
    );
    let o = env.run(&["cred", "delete", "x"], b"").ok();
    assert_eq!(o.stdout, "deleted x\n");
    let o = env.run(&["cred", "delete", "x"], b"").code(3);
    assert!(o.stderr.contains("no credential \"x\""), "{o}");
    env.run(&["cred", "exists", "x"], b"").code(3);
    let o = env.run(&["cred", "get", "x"], b"").code(3);
    assert!(
        o.stdout.is_empty() && o.stderr.contains("no credential"),
        "{o}"
    );
    assert!(!env.base().join("credentials/x.enc").exists());
    // The index (hive lists from it) no longer names x: no ghost entry left behind.
    let index: Value =
        serde_json::from_slice(&fs::read(env.base().join("metadata/index.json")).unwrap()).unwrap();
    assert!(
        index["credentials"].get("x").is_none(),
        "ghost entry: {index}"
    );
    let o = env.run(&["store", "fsck"], b"").ok();
    assert!(o.stdout.contains("clean"), "{o}");
}

#[test]
fn if_generation_compare_and_swap() {
    let env = TempHome::new();
    env.init();
    env.run(&["cred", "set", "c", "--if-generation", "0"], b"first\n")
        .ok();
    let o = env
        .run(&["cred", "set", "c", "--if-generation", "0"], b"again\n")
        .code(4);
    assert!(o.stderr.contains("generation 1"), "{o}");
    let o = env
        .run(&["cred", "set", "c", "--if-generation", "5"], b"stale\n")
        .code(4);
    assert!(o.stderr.contains("generation 1, not 5"), "{o}");
    assert_eq!(env.run(&["cred", "get", "c"], b"").ok().stdout, "first\n");
    let o = env
        .run(&["cred", "set", "c", "--if-generation", "1"], b"second\n")
        .ok();
    assert_eq!(o.stdout, "stored c (generation 2)\n");
    assert_eq!(env.run(&["cred", "get", "c"], b"").ok().stdout, "second\n");
    // --document honours it too.
    let doc = json!({"id": "c", "keys": {"api_key": {"name": "api_key", "value": "doc"}}});
    env.run(
        &["cred", "set", "--document", "c", "--if-generation", "1"],
        doc.to_string().as_bytes(),
    )
    .code(4);
    env.run(
        &["cred", "set", "--document", "c", "--if-generation", "2"],
        doc.to_string().as_bytes(),
    )
    .ok();
    assert_eq!(env.run(&["cred", "get", "c"], b"").ok().stdout, "doc\n");
}

#[test]
fn global_flags_work_before_and_after_the_subcommand() {
    let env = TempHome::new();
    let data = env.home.join("elsewhere");
    let d = data.to_str().unwrap();
    env.run(&["init", "--data-dir", d], b"").ok();
    assert!(data.join("stores/default/credentials").is_dir());
    assert!(!env.base().exists(), "--data-dir ignored");
    env.run(&["cred", "set", "g", "--data-dir", d], b"gv\n")
        .ok();
    env.run(&["--data-dir", d, "cred", "set", "h"], b"hv\n")
        .ok();
    let before = env
        .run(&["--data-dir", d, "--json", "cred", "list"], b"")
        .ok();
    let after = env
        .run(&["cred", "list", "--data-dir", d, "--json"], b"")
        .ok();
    let middle = env
        .run(&["cred", "--json", "list", "--data-dir", d], b"")
        .ok();
    let mut c = env.cmd();
    c.env("HOLDFAST_DATA_DIR", &data)
        .args(["cred", "list", "--json"]);
    let from_env = run(c, b"").ok();
    assert_eq!(before.json()["credentials"].as_array().unwrap().len(), 2);
    assert_eq!(before.stdout, after.stdout);
    assert_eq!(before.stdout, middle.stdout);
    assert_eq!(before.stdout, from_env.stdout);
    assert_eq!(
        env.run(&["cred", "get", "g", "--data-dir", d], b"")
            .ok()
            .stdout,
        "gv\n"
    );
    // -v and --store after the subcommand too.
    env.run(&["init", "--store", "other", "-v", "--data-dir", d], b"")
        .ok();
    env.run(
        &["cred", "set", "o", "--store", "other", "--data-dir", d],
        b"ov\n",
    )
    .ok();
    assert_eq!(
        env.run(
            &["--store", "other", "--data-dir", d, "cred", "get", "o"],
            b""
        )
        .ok()
        .stdout,
        "ov\n"
    );
    env.run(&["cred", "get", "o", "--data-dir", d], b"").code(3);
    env.run(
        &["cred", "get", "x", "--store", "../evil", "--data-dir", d],
        b"",
    )
    .code(2);
}

#[test]
fn help_documents_exit_codes() {
    let env = TempHome::new();
    let o = env.run(&["--help"], b"").ok();
    assert!(o.stdout.contains("Exit codes:"), "{o}");
    for line in [
        "0  success",
        "2  usage error",
        "3  not found",
        "4  conflict",
        "5  sealed",
        "6  integrity",
        "7  storage",
        "8  busy",
        "9  forbidden",
    ] {
        assert!(o.stdout.contains(line), "--help lacks {line:?}");
    }
    let o = env.run(&["-h"], b"").ok();
    assert!(o.stdout.contains("holdfast --help"), "{o}");
    env.run(&[], b"").code(2);
    env.run(&["cred", "frobnicate"], b"").code(2);
}

#[test]
fn fsck_reports_temp_files_and_repair_removes_them() {
    let env = TempHome::new();
    env.init();
    env.set("a", "av");
    env.set("b", "bv");
    let o = env.run(&["store", "fsck"], b"").ok();
    assert!(o.stdout.contains("clean: no problems found"), "{o}");
    assert!(o.stdout.contains("files: 2"), "{o}");

    let planted = env
        .base()
        .join("credentials/.a.enc.hf-tmp-0123456789abcdef");
    fs::write(&planted, b"half-written").unwrap();
    let o = env.run(&["store", "fsck"], b"").code(1);
    assert!(o.stdout.contains("temp files: 1"), "{o}");
    assert!(o.stdout.contains(".a.enc.hf-tmp-0123456789abcdef"), "{o}");
    assert!(o.stdout.contains("nothing was modified"), "{o}");
    assert!(
        planted.exists(),
        "fsck without --repair removed the temp file"
    );
    let o = env.run(&["--json", "store", "fsck"], b"").code(1);
    assert_eq!(
        o.json()["temp_files"],
        json!([".a.enc.hf-tmp-0123456789abcdef"])
    );
    assert!(planted.exists());
    // Reads do not repair either.
    assert_eq!(env.run(&["cred", "get", "a"], b"").ok().stdout, "av\n");
    env.run(&["cred", "list"], b"").ok();
    assert!(planted.exists(), "a read command removed the temp file");

    let o = env.run(&["store", "fsck", "--repair"], b"").ok();
    assert!(o.stdout.contains("temp files: 1 (removed)"), "{o}");
    assert!(!planted.exists());
    let o = env.run(&["store", "fsck"], b"").ok();
    assert!(o.stdout.contains("clean"), "{o}");
    assert_eq!(env.run(&["cred", "get", "b"], b"").ok().stdout, "bv\n");
}

#[test]
fn key_rotate_changes_fingerprint_and_keeps_every_credential() {
    let env = TempHome::new();
    let fp1 = env.init();
    for i in 0..5 {
        env.set(&format!("r{i}"), &format!("rv{i}"));
    }
    let key1 = fs::read(env.key()).unwrap();
    let o = env.run(&["key", "rotate"], b"").ok();
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert!(lines[0].starts_with("key rotated: new key "), "{o}");
    let fp2 = lines[0]["key rotated: new key ".len()..].to_string();
    assert_eq!(fp2.len(), 8, "{o}");
    assert_ne!(fp1, fp2);
    assert_eq!(
        lines[1],
        "5 file(s) re-encrypted, 5 verified under the primary key"
    );
    // The retired key is archived, not deleted.
    assert_eq!(
        lines[2],
        format!("archive (retired keys, still accepted for decryption): {fp1}")
    );
    assert_ne!(fs::read(env.key()).unwrap(), key1);
    assert_eq!(mode(&env.key()), 0o600);
    let archive = env.key().with_extension("key.prev");
    assert_eq!(mode(&archive), 0o600);
    assert_eq!(
        fs::read_to_string(&archive).unwrap().trim(),
        String::from_utf8(key1.clone()).unwrap().trim()
    );
    for i in 0..5 {
        assert_eq!(
            env.run(&["cred", "get", &format!("r{i}")], b"").ok().stdout,
            format!("rv{i}\n")
        );
    }
    // `holdfast key` shows both keys and what each opens.
    let o = env.run(&["key"], b"").ok();
    assert!(
        o.stdout
            .contains(&format!("{fp2:<10} primary        5            0")),
        "{o}"
    );
    assert!(
        o.stdout
            .contains(&format!("{fp1:<10} archived       0            0")),
        "{o}"
    );
    assert!(
        o.stdout.contains("`holdfast key prune` removes them"),
        "{o}"
    );
    // init reports the new fingerprint; a second rotation in JSON archives both.
    let o = env.run(&["init"], b"").ok();
    assert_eq!(fingerprint_in(&o.stdout), fp2);
    let r = env.run(&["--json", "key", "rotate"], b"").ok().json();
    assert_eq!(r["retired"], json!([fp2, fp1]));
    assert_eq!(r["reencrypted"], json!(5));
    assert_ne!(r["new_key"], json!(fp2));
    let o = env.run(&["store", "fsck"], b"").ok();
    assert!(o.stdout.contains("clean"), "{o}");
    // Pruning removes only what no file needs: here, both archived keys.
    let r = env.run(&["--json", "key", "prune"], b"").ok().json();
    assert_eq!(r["pruned"], json!([fp2, fp1]));
    assert_eq!(r["retired"], json!([]));
    assert!(!archive.exists());
    for i in 0..5 {
        assert_eq!(
            env.run(&["cred", "get", &format!("r{i}")], b"").ok().stdout,
            format!("rv{i}\n")
        );
    }
}

#[test]
fn store_dir_with_key_env_and_key_file() {
    let env = TempHome::new();
    // A hive-style directory whose key comes from an environment variable.
    let dir = env.home.join("hive/credentials");
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let key = holdfast::crypto::generate_key();
    let d = dir.to_str().unwrap();
    let with_key = |args: &[&str], stdin: &[u8], key: Option<&str>| {
        let mut c = env.cmd();
        if let Some(k) = key {
            c.env("HF_TEST_KEY", k);
        }
        c.args(["--store-dir", d, "--key-env", "HF_TEST_KEY"])
            .args(args);
        run(c, stdin)
    };
    let k = Some(key.expose());
    // A key in a variable already exists: init takes it as given (it makes no key).
    let o = with_key(&["init"], b"", k).ok();
    assert!(o.stdout.contains("with the key you gave"), "{o}");
    // With no key in it, there is nothing to make one in.
    let o = with_key(&["init"], b"", None).code(2);
    assert!(o.stderr.contains("--key-file"), "{o}");
    let o = with_key(&["cred", "set", "svc"], b"env-keyed\n", k).ok();
    assert_eq!(o.stdout, "stored svc (generation 1)\n");
    assert!(dir.join("credentials/svc.enc").is_file());
    assert!(dir.join("metadata/index.json").is_file());
    assert_eq!(
        with_key(&["cred", "get", "svc"], b"", k).ok().stdout,
        "env-keyed\n"
    );
    // Without the variable: data but no key -> sealed; a wrong key -> sealed.
    with_key(&["cred", "get", "svc"], b"", None).code(5);
    let wrong = holdfast::crypto::generate_key();
    let o = with_key(&["cred", "get", "svc"], b"", Some(wrong.expose())).code(5);
    assert!(o.stderr.contains("HF_TEST_KEY"), "{o}");
    // An environment key cannot be rotated by holdfast.
    let o = with_key(&["key", "rotate"], b"", k).code(10);
    assert!(o.stderr.contains("HF_TEST_KEY"), "{o}");
    assert_eq!(
        with_key(&["cred", "get", "svc"], b"", k).ok().stdout,
        "env-keyed\n"
    );
    // --key-env belongs with --store-dir / --hive; --key-file and --key-env exclude each other.
    let o = env
        .run(&["--key-env", "HF_TEST_KEY", "cred", "list"], b"")
        .code(2);
    assert!(o.stderr.contains("--store-dir"), "{o}");
    env.run(
        &[
            "--store-dir",
            d,
            "--key-env",
            "X",
            "--key-file",
            "/nonexistent",
            "cred",
            "list",
        ],
        b"",
    )
    .code(2);

    // --store-dir with --key-file: init creates both.
    let dir2 = env.home.join("plain-store");
    let keyf = env.home.join("mykeys/plain.key");
    let (d2, kf) = (dir2.to_str().unwrap(), keyf.to_str().unwrap());
    let o = env
        .run(&["--store-dir", d2, "--key-file", kf, "init"], b"")
        .ok();
    assert!(o.stdout.contains(&format!("key file {kf}")), "{o}");
    assert_eq!(mode(&keyf), 0o600);
    assert_eq!(mode(&dir2), 0o700);
    env.run(
        &["cred", "set", "p", "--store-dir", d2, "--key-file", kf],
        b"pv\n",
    )
    .ok();
    assert_eq!(
        env.run(
            &["cred", "get", "p", "--key-file", kf, "--store-dir", d2],
            b""
        )
        .ok()
        .stdout,
        "pv\n"
    );
    // The default store was never touched, and no key was made in the key directory.
    assert!(!env.base().exists());
    assert!(!env.home.join("config/holdfast/keys").exists());
}

#[test]
fn set_document_keeps_unknown_fields() {
    let env = TempHome::new();
    env.init();
    let doc = json!({
        "id": "doc",
        "credential_type": "oauth2",
        "keys": {
            "access_token": {
                "name": "access_token", "value": "at-1", "expires_at": null,
                "metadata": {"scope": "repo"}, "x_key_extra": {"kept": true}
            }
        },
        "provider_id": "github",
        "tags": ["t1"],
        "x_custom": {"nested": [1, 2, {"deep": "yes"}]},
        "x_number": 42
    });
    let o = env
        .run(
            &["cred", "set", "--document", "doc"],
            doc.to_string().as_bytes(),
        )
        .ok();
    assert_eq!(o.stdout, "stored doc (generation 1)\n");
    let check = |gen: u64, value: &str| {
        let c = env.run(&["--json", "cred", "get", "doc"], b"").ok().json()["credential"].clone();
        assert_eq!(c["x_custom"], doc["x_custom"], "{c}");
        assert_eq!(c["x_number"], json!(42));
        assert_eq!(c["provider_id"], json!("github"));
        assert_eq!(c["tags"], json!(["t1"]));
        assert_eq!(c["credential_type"], json!("oauth2"));
        let k = &c["keys"]["access_token"];
        assert_eq!(k["x_key_extra"], json!({"kept": true}), "{c}");
        assert_eq!(k["metadata"], json!({"scope": "repo"}));
        assert_eq!(k["value"], json!(value));
        assert_eq!(c["holdfast_generation"], json!(gen));
    };
    check(1, "at-1");
    // A plain `set` of one key keeps everything else.
    env.run(&["cred", "set", "doc", "--key", "access_token"], b"at-2\n")
        .ok();
    check(2, "at-2");
    assert_eq!(env.run(&["cred", "get", "doc"], b"").ok().stdout, "at-2\n");
    // The document's id must match, and it must be a credential.
    let o = env
        .run(
            &["cred", "set", "--document", "other"],
            doc.to_string().as_bytes(),
        )
        .code(2);
    assert!(o.stderr.contains("\"id\""), "{o}");
    env.run(&["cred", "set", "--document", "doc"], b"not json")
        .code(2);
    env.run(
        &["cred", "set", "--document", "doc"],
        br#"{"id":"doc","keys":[1]}"#,
    )
    .code(2);
    env.run(
        &["cred", "set", "--document", "doc", "--key", "k"],
        doc.to_string().as_bytes(),
    )
    .code(2);
    check(2, "at-2");
}

/// `holdfast recovery plan`: a snapshot on stdin, the plan on stdout, no daemon and no store
/// touched; bad snapshots exit 2 with the reason.
#[test]
fn recovery_plan_offline() {
    let home = TempHome::new();
    let plan = |snapshot: &str, extra: &[&str]| {
        let mut c = home.cmd();
        c.args(["recovery", "plan"]).args(extra);
        run(c, snapshot.as_bytes())
    };
    let o = plan(
        r#"{"cause": "connection_reset", "partial_text": "Hello, wor", "tool_calls": [], "attempt": 0, "retry_after": null, "stall_history": []}"#,
        &[],
    );
    assert_eq!(o.code, 0, "{o}");
    let v: Value = serde_json::from_str(&o.stdout).expect("JSON plan");
    assert_eq!(v["plan"], "R1");
    assert_eq!(v["assistant_prefix"], "Hello, wor");
    assert_eq!(v["wait_ms"], 500);
    assert_eq!(v["hint"], Value::Null);
    // A mid-stream 429 with Retry-After, compact output, jitter never below the hint.
    let o = plan(
        r#"{"error": {"status": 429, "message": "rate limited", "retry_after": "7"}, "partial_text": "x"}"#,
        &["--compact", "--jitter"],
    );
    assert_eq!(o.code, 0, "{o}");
    assert_eq!(o.stdout.lines().count(), 1, "{o}");
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(
        (v["cause"].as_str(), v["status"].as_u64()),
        (Some("rate_limited"), Some(429))
    );
    assert!(v["wait_ms"].as_u64().unwrap() >= 7000, "{v}");
    // A permanent cause is a plan too (fail), exit 0.
    let o = plan(r#"{"cause": "context_overflow", "partial_text": "x"}"#, &[]);
    assert_eq!(o.code, 0, "{o}");
    assert!(o.stdout.contains(r#""plan": "fail""#), "{o}");
    // Bad input: exit 2, a reason, nothing on stdout.
    for (snapshot, says) in [
        ("", "no snapshot on stdin"),
        ("{", "not JSON"),
        (r#"{"cause": "clean_end"}"#, "stream.commit"),
        (r#"{"cause": "reset"}"#, "unknown cause"),
        (r#"{"cause": "goaway", "tool_calls": "x"}"#, "tool_calls"),
    ] {
        let o = plan(snapshot, &[]);
        assert_eq!(o.code, 2, "{snapshot:?}: {o}");
        assert!(o.stderr.contains(says), "{snapshot:?}: {o}");
        assert!(o.stdout.is_empty(), "{o}");
    }
    assert!(
        !home.root.join("home/state/holdfast").exists(),
        "the planner touched the data dir"
    );
}

/// `holdfast import --from-hive`: serving in place edits the config once and safely; copying
/// re-encrypts into a holdfast store; dry runs change nothing; bad sources and targets say why.
#[test]
fn import_from_hive_serves_in_place_or_copies() {
    let t = TempHome::new();
    let hive = t.home.join(".hive");
    let base = hive.join("credentials");
    let key = hive.join("secrets/credential_key");
    fs::create_dir_all(key.parent().unwrap()).unwrap();
    fs::set_permissions(key.parent().unwrap(), fs::Permissions::from_mode(0o700)).unwrap();
    let hf = |args: &[&str], stdin: &[u8]| {
        let mut c = t.cmd();
        c.arg("--store-dir").arg(&base).arg("--key-file").arg(&key);
        c.args(args);
        run(c, stdin)
    };
    hf(&["init"], b"").ok();
    for (id, v) in [
        ("openai", "sk-1"),
        ("team/github", "ghp-2"),
        ("slack", "xoxb-3"),
    ] {
        hf(&["cred", "set", id], format!("{v}\n").as_bytes()).ok();
    }
    // Made the way hive makes it: open directories and files.
    for d in ["", "credentials", "metadata"] {
        fs::set_permissions(base.join(d), fs::Permissions::from_mode(0o755)).unwrap();
    }
    let config = t.home.join("config/holdfast/config.toml");
    let modes = || {
        let mut v: Vec<(String, u32)> = walk(&base)
            .into_iter()
            .map(|p| {
                let m = fs::symlink_metadata(&p).unwrap().permissions().mode() & 0o777;
                (p.display().to_string(), m)
            })
            .collect();
        v.sort();
        v
    };

    // A dry run: nothing changes, not even hive's permissions.
    let before = modes();
    let o = t.run(&["import", "--from-hive", "--dry-run"], b"").ok();
    assert!(o.stdout.contains("dry run: would add"), "{o}");
    assert!(
        o.stdout.contains("[stores.hive]") && o.stdout.contains("3 credential(s)"),
        "{o}"
    );
    assert!(
        o.stderr.contains("nothing was changed (looking only)"),
        "{o}"
    );
    assert!(!config.exists());
    assert_eq!(modes(), before);

    // Serve in place: the entry is added, the store tightened, the config private.
    let o = t.run(&["import", "--from-hive"], b"").ok();
    assert!(o.stdout.contains("is now store \"hive\""), "{o}");
    assert!(o.stderr.contains("tightened permissions"), "{o}");
    let text = fs::read_to_string(&config).unwrap();
    let parsed: toml::Table = toml::from_str(&text).unwrap();
    assert_eq!(
        parsed["stores"]["hive"]["path"].as_str(),
        Some(base.to_str().unwrap())
    );
    assert_eq!(parsed["stores"]["hive"]["hive"].as_bool(), Some(true));
    assert_eq!(
        fs::metadata(&config).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        fs::metadata(&base).unwrap().permissions().mode() & 0o777,
        0o700
    );
    // Again: already served, nothing added.
    let o = t.run(&["import", "--from-hive"], b"").ok();
    assert!(o.stdout.contains("already served"), "{o}");
    assert_eq!(fs::read_to_string(&config).unwrap(), text);
    // The same name for another directory: a conflict, the config unchanged.
    let other = t.home.join("other");
    fs::create_dir_all(other.join("credentials")).unwrap();
    fs::set_permissions(&other, fs::Permissions::from_mode(0o700)).unwrap();
    let o = t.run(
        &[
            "--key-file",
            key.to_str().unwrap(),
            "import",
            "--from-hive",
            other.to_str().unwrap(),
        ],
        b"",
    );
    let o = o.code(4);
    assert!(o.stderr.contains("already has [stores.hive]"), "{o}");
    assert_eq!(fs::read_to_string(&config).unwrap(), text);
    // A config that does not parse is refused before anything is written.
    let broken = t.home.join("broken.toml");
    fs::write(&broken, "this is = = not toml\n").unwrap();
    let o = t
        .run(
            &[
                "--config",
                broken.to_str().unwrap(),
                "import",
                "--from-hive",
                "--name",
                "h2",
            ],
            b"",
        )
        .code(2);
    assert!(o.stderr.contains("broken.toml"), "{o}");
    assert_eq!(
        fs::read_to_string(&broken).unwrap(),
        "this is = = not toml\n"
    );
    // Not a hive store at all.
    let o = t
        .run(&["import", "--from-hive", t.home.to_str().unwrap()], b"")
        .code(3);
    assert!(o.stderr.contains("not a hive credential store"), "{o}");

    // Copy: the target must exist first.
    let o = t.run(&["import", "--from-hive", "--copy"], b"").code(3);
    assert!(o.stderr.contains("holdfast --store default init"), "{o}");
    t.init();
    let o = t
        .run(&["import", "--from-hive", "--copy", "--dry-run"], b"")
        .ok();
    assert!(o.stdout.contains("3 would be copied"), "{o}");
    t.run(&["cred", "get", "openai"], b"").code(3);
    // hive's modes again (serving it above tightened them): the copy tightens them and says
    // so instead of calling hive's store unchanged.
    for d in ["", "credentials", "metadata"] {
        fs::set_permissions(base.join(d), fs::Permissions::from_mode(0o755)).unwrap();
    }
    let o = t.run(&["import", "--from-hive", "--copy"], b"").ok();
    assert!(o.stdout.contains("copied 3 (3 new, 0 replaced)"), "{o}");
    assert!(
        o.stderr.contains("note:"),
        "the tightened modes are named: {o}"
    );
    assert!(!o.stdout.contains("hive's store is unchanged"), "{o}");
    assert!(
        o.stdout.contains(
            "hive's credentials are unchanged (only the modes named above were tightened)"
        ),
        "{o}"
    );
    for (id, v) in [
        ("openai", "sk-1"),
        ("team/github", "ghp-2"),
        ("slack", "xoxb-3"),
    ] {
        assert_eq!(t.run(&["cred", "get", id], b"").ok().stdout.trim(), v);
    }
    // The copy is under holdfast's key, not hive's.
    assert_ne!(
        fs::read(t.key()).unwrap(),
        fs::read(&key).unwrap(),
        "the target has its own key"
    );
    // A changed target is kept, then replaced with --overwrite; identical ones are left.
    t.set("slack", "mine");
    let o = t.run(&["import", "--from-hive", "--copy"], b"").ok();
    assert!(o.stdout.contains("differs    slack"), "{o}");
    assert!(o.stdout.contains("hive's store is unchanged"), "{o}");
    assert!(o.stdout.contains("2 identical, 1 kept"), "{o}");
    assert_eq!(
        t.run(&["cred", "get", "slack"], b"").ok().stdout.trim(),
        "mine"
    );
    let j = t
        .run(
            &["import", "--from-hive", "--copy", "--overwrite", "--json"],
            b"",
        )
        .ok()
        .json();
    let outcomes: Vec<(&str, &str)> = j["credentials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].as_str().unwrap(), c["outcome"].as_str().unwrap()))
        .collect();
    // In hive's order (its index's: the order the credentials were made).
    assert_eq!(
        outcomes,
        vec![
            ("openai", "same"),
            ("team/github", "same"),
            ("slack", "replaced")
        ]
    );
    assert_eq!(
        t.run(&["cred", "get", "slack"], b"").ok().stdout.trim(),
        "xoxb-3"
    );
    // A source file that does not decrypt: reported, the others still compared, exit 6.
    fs::write(base.join("credentials/openai.enc"), b"gAAAAAnot-a-token").unwrap();
    let o = t.run(&["import", "--from-hive", "--copy"], b"").code(6);
    assert!(
        o.stdout.contains("unreadable") || o.stdout.contains("could not be read"),
        "{o}"
    );
    assert!(o.stdout.contains("same       team/github"), "{o}");
    println!("import: dry runs, serve in place (added, again, conflict, broken config, not a store), copy (new, same, kept, replaced, unreadable source) checked");
}

/// Every path under `dir`, `dir` included.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Spans and totals a user or a file can make as large as they like are errors or saturate,
/// never a panic (`Duration::from_secs_f64` on `--since 1e300d` used to abort the CLI).
#[test]
fn huge_spans_and_token_totals_do_not_panic() {
    let env = TempHome::new();
    let o = env.run(&["runs", "list", "--since", "1e300d"], b"").code(2);
    assert!(o.stderr.contains("\"1e300d\": too long a span"), "{o}");
    assert!(!o.stderr.contains("panicked"), "{o}");
    let o = env
        .run(
            &["runs", "list", "--since", "100000000000000000000000d"],
            b"",
        )
        .code(2);
    assert!(o.stderr.contains("too long a span"), "{o}");
    env.run(&["runs", "list", "--since", "1e3s"], b"").ok();
    // A span a Duration holds but whose milliseconds do not fit in u64: everything is newer.
    env.run(&["runs", "list", "--since", "1e12d", "--json"], b"")
        .ok();

    // A summary (hive writes these too) whose token totals overflow when added.
    let run_dir = env.home.join("state/holdfast/runs/huge");
    fs::create_dir_all(&run_dir).unwrap();
    let summary = json!({"run_id": "huge", "status": "success",
        "total_input_tokens": i64::MAX, "total_output_tokens": i64::MAX});
    fs::write(run_dir.join("summary.json"), summary.to_string()).unwrap();
    fs::write(run_dir.join("details.jsonl"), "").unwrap();
    let o = env.run(&["runs", "list"], b"").ok();
    assert!(o.stdout.contains("huge"), "{o}");
    assert!(o.stdout.contains(&i64::MAX.to_string()), "{o}");
}
