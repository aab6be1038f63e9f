//! Interop with hive, both directions, against Python's `cryptography` Fernet (what hive uses).
//!
//! `tests/python/hive_store.py` plays hive's `EncryptedFileStorage` (see HIVE-FORMAT.md): it
//! writes stores, reads and validates every file, lists ids the way hive's `list_all` does (the
//! index's ids) and checks each index entry against hive's derivation, damages indexes the way
//! unpatched hive does, and writes concurrently under hive's patched `flock` protocol.
//!
//! Each test works on a fresh temp dir; child processes get a private HOME/XDG environment with
//! every HIVE_*/HOLDFAST_* variable removed. Secrets never go through argv (keys travel as key
//! files or environment variables, credential values on stdin).
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use common::{clean_env, enc_files, index_json, run, store_cmd, store_config, Out};
use holdfast::crypto::{keys, Keyring, Secret};
use holdfast::durable::Faults;
use holdfast::error::ErrorKind;
use holdfast::store::{
    init_store, Credential, CredentialStore, Error, Report, StoreConfig, StoreOptions,
};
use serde_json::{json, Map, Value};

const FIXTURE: &str = "tests/fixtures/hive_store_v2";
const FIXTURE_KEY: &str = "tests/fixtures/hive_store_v2.key";

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Make sure `python3` can import `cryptography`, installing it through `scripts/test-deps.sh`
/// (idempotent) if not. Runs once per test binary.
fn python_ready() {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| {
        let importable = || {
            Command::new("python3")
                .args(["-c", "import cryptography.fernet"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if importable() {
            return;
        }
        let script = manifest().join("scripts/test-deps.sh");
        eprintln!(
            "hive interop: Python cryptography missing; running {}",
            script.display()
        );
        let status = Command::new("bash")
            .arg(&script)
            .status()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(status.success(), "{} failed: {status}", script.display());
        assert!(
            importable(),
            "python3 still cannot import cryptography after {}",
            script.display()
        );
    });
}

/// One test's world: a temp dir with a private HOME, a key and a store directory.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Self {
        python_ready();
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["home", "home/config", "home/state"] {
            let p = dir.path().join(sub);
            fs::create_dir(&p).expect("mkdir");
            fs::set_permissions(&p, fs::Permissions::from_mode(0o700)).expect("chmod");
        }
        Sandbox { dir }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn home(&self) -> PathBuf {
        self.root().join("home")
    }

    fn store(&self) -> PathBuf {
        self.root().join("store")
    }

    fn key_file(&self) -> PathBuf {
        self.root().join("keys/hive.key")
    }

    fn store_arg(&self) -> String {
        self.store().to_str().expect("utf-8 temp path").to_owned()
    }

    /// Install `key` as this sandbox's key file (0600 in a 0700 directory).
    fn install_key(&self, key: &str) {
        keys::write_key_file(
            &self.key_file(),
            &Secret::new(key.trim().to_owned()),
            &Faults::none(),
        )
        .expect("write key file");
    }

    fn new_key(&self) {
        self.install_key(holdfast::crypto::generate_key().expose());
    }

    fn key_text(&self) -> String {
        fs::read_to_string(self.key_file())
            .expect("key file")
            .trim()
            .to_owned()
    }

    fn config(&self) -> StoreConfig {
        store_config("interop", &self.store(), &self.key_file())
    }

    fn open(&self) -> CredentialStore {
        CredentialStore::open(self.config(), StoreOptions::default()).expect("open store")
    }

    /// A command with a private environment: HOME/XDG in the sandbox, no HIVE_*, HOLDFAST_*,
    /// CREDENTIALS_DIRECTORY, STATE_DIRECTORY or RUST_LOG from the caller.
    fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(program);
        clean_env(&mut c, &self.home()).env("PYTHONDONTWRITEBYTECODE", "1");
        c
    }

    /// The Python stand-in for hive, key given as `--key-file`.
    fn py_command(&self, args: &[&str]) -> Command {
        let mut c = self.command("python3");
        c.arg(manifest().join("tests/python/hive_store.py"))
            .arg("--key-file")
            .arg(self.key_file())
            .args(args);
        c
    }

    fn py(&self, args: &[&str]) -> Value {
        let out = self.py_command(args).output().expect("run python3");
        parse_py(args, &out)
    }

    /// The Python stand-in for hive, key given as hive's `HIVE_CREDENTIAL_KEY`.
    fn py_env_key(&self, args: &[&str]) -> Value {
        let mut c = self.command("python3");
        let out = c
            .arg(manifest().join("tests/python/hive_store.py"))
            .args(args)
            .env("HIVE_CREDENTIAL_KEY", self.key_text())
            .output()
            .expect("run python3");
        parse_py(args, &out)
    }

    /// `holdfast --store-dir STORE --key-file KEY ARGS`, with `stdin` piped in.
    fn holdfast(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let mut c = store_cmd(&self.home(), &self.store(), &self.key_file());
        c.args(args);
        run(c, stdin.unwrap_or("").as_bytes())
    }
}

fn parse_py(args: &[&str], out: &Output) -> Value {
    assert!(
        out.status.success(),
        "hive_store.py {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "hive_store.py {args:?} printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn obj(v: &Value) -> &Map<String, Value> {
    v.as_object()
        .unwrap_or_else(|| panic!("not a JSON object: {v}"))
}

fn ids_of(v: &Value) -> BTreeSet<String> {
    obj(v).keys().cloned().collect()
}

fn str_set(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a JSON array: {v}"))
        .iter()
        .map(|s| s.as_str().expect("string").to_owned())
        .collect()
}

fn set_of<'a>(items: impl IntoIterator<Item = &'a String>) -> BTreeSet<String> {
    items.into_iter().cloned().collect()
}

/// hive's file name for an id (HIVE-FORMAT.md: `/` and `\` become `_`, then `..` becomes
/// `_`), computed here rather than taken from holdfast.
fn hive_file_name(id: &str) -> String {
    format!("{}.enc", id.replace(['/', '\\'], "_").replace("..", "_"))
}

fn quarantine_files(store: &Path) -> Vec<PathBuf> {
    match fs::read_dir(store.join("quarantine")) {
        Ok(rd) => {
            let mut v: Vec<PathBuf> = rd.map(|e| e.expect("dir entry").path()).collect();
            v.sort();
            v
        }
        Err(_) => Vec::new(),
    }
}

/// hive's `list_all` as the Python stand-in computes it: the index's ids, and whether the
/// index could be used as is (hive rebuilds a missing, torn or v1 index). Also asserts that
/// every index entry equals hive's derivation from its file and nothing is missing.
fn hive_list_all(sb: &Sandbox, want: &BTreeSet<String>, what: &str) -> usize {
    let list = sb.py(&["list", &sb.store_arg()]);
    assert_eq!(list["index_usable"], json!(true), "{what}: {list}");
    assert_eq!(list["version"], json!("2.0"), "{what}");
    assert_eq!(
        list["problems"],
        json!([]),
        "{what}: index entries differ from hive's"
    );
    let ids = str_set(&list["ids"]);
    assert_eq!(&ids, want, "{what}: hive's list_all");
    ids.len()
}

fn copy_fixture(sb: &Sandbox) {
    let src = manifest().join(FIXTURE);
    let dst = sb.store();
    for d in [dst.clone(), dst.join("credentials"), dst.join("metadata")] {
        fs::create_dir_all(&d).expect("mkdir");
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).expect("chmod dir");
    }
    let mut files: Vec<PathBuf> = fs::read_dir(src.join("credentials"))
        .expect("fixture credentials")
        .map(|e| e.expect("entry").path())
        .collect();
    files.push(src.join("metadata/index.json"));
    for f in files {
        let rel = f.strip_prefix(&src).expect("under fixture");
        let to = dst.join(rel);
        fs::copy(&f, &to).expect("copy fixture file");
        fs::set_permissions(&to, fs::Permissions::from_mode(0o600)).expect("chmod file");
    }
    let key = fs::read_to_string(manifest().join(FIXTURE_KEY)).expect("fixture key");
    sb.install_key(&key);
}

fn assert_clean_open(report: &Report, files: usize, what: &str) {
    assert!(!report.index_rebuilt, "{what}: index rebuilt:\n{report}");
    assert_eq!(report.index, "ok", "{what}");
    assert!(report.orphans.is_empty(), "{what}: orphans:\n{report}");
    assert!(report.ghosts.is_empty(), "{what}: ghosts:\n{report}");
    assert!(
        report.drift.is_empty(),
        "{what}: drift from hive's index:\n{report}"
    );
    assert!(
        report.quarantined.is_empty(),
        "{what}: quarantined:\n{report}"
    );
    assert!(
        report.clock_skew.is_empty(),
        "{what}: clock skew:\n{report}"
    );
    assert!(
        report.temp_files.is_empty(),
        "{what}: temp files:\n{report}"
    );
    assert!(report.is_clean(), "{what}: not clean:\n{report}");
    assert_eq!(report.files, files, "{what}: files");
    assert_eq!(report.readable, files, "{what}: readable");
}

/// Every credential readable through the library and equal to what Python wrote.
fn assert_reads_all(store: &CredentialStore, expected: &Value, what: &str) {
    for (id, doc) in obj(expected) {
        let c = store
            .get(id)
            .unwrap_or_else(|e| panic!("{what}: get {id:?}: {e}"));
        assert_eq!(&c.expose_json(), doc, "{what}: {id:?} differs from hive's");
    }
    let listed: BTreeSet<String> = store
        .list()
        .expect("list")
        .credentials
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(listed, ids_of(expected), "{what}: list");
}

// ---------------------------------------------------------------------------------------------

/// 1. The committed fixture (written by Python's cryptography Fernet) reads in holdfast: every
///    document equals expected.json from the same Python run, unknown fields included, the
///    index opens clean (no rebuild, no drift from hive's derivation), and the CLI reads it with
///    `--key-file` and `--key-env`.
#[test]
fn fixture_written_by_python_reads_in_holdfast() {
    let sb = Sandbox::new();
    copy_fixture(&sb);
    let expected: Value = serde_json::from_slice(
        &fs::read(manifest().join(FIXTURE).join("expected.json")).expect("expected.json"),
    )
    .expect("expected.json parses");
    let fixture_index = index_json(&sb.store());
    let n = obj(&expected).len();
    assert!(n >= 10, "fixture too small: {n}");
    let files = enc_files(&sb.store().join("credentials"));
    let want_files: BTreeSet<String> = obj(&expected).keys().map(|id| hive_file_name(id)).collect();
    assert_eq!(files, want_files, "fixture files are hive's safe_id names");
    for id in obj(&expected).keys() {
        let token = fs::read_to_string(sb.store().join("credentials").join(hive_file_name(id)))
            .expect("token");
        assert!(
            token.starts_with("gAAAAA") && !token.ends_with('\n'),
            "{id}: not a bare Fernet token"
        );
    }

    let store = sb.open();
    assert_clean_open(store.open_report(), n, "fixture");
    assert_reads_all(&store, &expected, "fixture");
    for (id, doc) in obj(&expected) {
        assert_eq!(
            store.get(id).expect("get").generation(),
            1,
            "{id}: hive files are generation 1"
        );
        assert!(doc.get("holdfast_generation").is_none());
    }
    // Unknown fields, on the credential and on a key, spelled out.
    let db = store.get("db/prod/main").expect("db").expose_json();
    assert_eq!(
        db["hive_future_field"],
        json!({"nested": [1, 2, {"deep": "ü"}]})
    );
    assert_eq!(db["owner_team"], json!("infra"));
    assert_eq!(db["schema_revision"], json!(3));
    assert_eq!(db["keys"]["password"]["scopes"], json!(["read", "write"]));
    assert_eq!(
        db["keys"]["password"]["future_key_field"],
        json!({"nested": [1, 2.5, null, true]})
    );
    assert_eq!(db["keys"]["username"]["rotation_hint"], json!("quarterly"));
    // The BOM file (hive reads utf-8-sig) and the non-ASCII id.
    let ring = Keyring::new(&Secret::new(sb.key_text()), &[]).expect("keyring");
    let raw = fs::read_to_string(sb.store().join("credentials/legacy_bom.enc")).expect("bom");
    let (plain, _) = ring.decrypt(&raw).expect("decrypt the BOM file");
    assert!(
        plain.expose().starts_with(b"\xef\xbb\xbf{"),
        "the fixture's legacy/bom plaintext should start with a UTF-8 BOM"
    );
    assert_eq!(
        store.get("legacy/bom").expect("bom").key_value("api_key"),
        Some("sk-test-bom-0007")
    );
    assert_eq!(
        store
            .get("café/naïve-ключ")
            .expect("unicode")
            .key_value("blob"),
        Some("значение-🔑-0005")
    );
    // holdfast derives the same index entries Python (hive) wrote.
    for info in store.list().expect("list").credentials {
        assert_eq!(
            info.metadata, fixture_index["credentials"][&info.id],
            "{}: index entry differs from hive's",
            info.id
        );
    }
    drop(store);

    // The CLI, with --key-file.
    let cases: &[(&str, Option<&str>)] = &[
        ("openai", None),
        ("team/github", Some("refresh_token")),
        ("db/prod/main", Some("password")),
        ("café/naïve-ключ", Some("blob")),
        ("a..b", None),
    ];
    for (id, field) in cases {
        let mut args = vec!["cred", "get", id];
        if let Some(f) = field {
            args.extend(["--field", f]);
        }
        let out = sb.holdfast(&args, None);
        assert_eq!(out.code, 0, "cred get {id}: {}", out.stderr);
        let key = field.unwrap_or("api_key");
        let want = expected[id]["keys"][key]["value"].as_str().expect("value");
        assert_eq!(
            out.stdout,
            format!("{want}\n"),
            "cred get {id} --field {key}"
        );
    }
    let out = sb.holdfast(&["--json", "cred", "get", "db/prod/main"], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).expect("--json output");
    assert_eq!(v["credential"], expected["db/prod/main"]);

    // The CLI, with --key-env (the key in an environment variable, as HIVE_CREDENTIAL_KEY).
    let mut c = sb.command(env!("CARGO_BIN_EXE_holdfast"));
    c.arg("--store-dir")
        .arg(sb.store())
        .args([
            "--key-env",
            "HF_INTEROP_KEY",
            "cred",
            "get",
            "team/github",
            "--field",
            "access_token",
        ])
        .env("HF_INTEROP_KEY", sb.key_text());
    let out = run(c, b"");
    assert_eq!(out.code, 0, "--key-env: {}", out.stderr);
    assert_eq!(out.stdout, "gho-test-access-0002\n");

    // The store holdfast opened (and re-indexed) still reads in hive, index and all.
    let back = sb.py(&["read", &sb.store_arg()]);
    assert_eq!(back, expected, "hive reads the fixture back unchanged");
    hive_list_all(&sb, &ids_of(&expected), "fixture after holdfast");
    println!("fixture: {n} credentials written by Python read by holdfast (library and CLI), index clean");
}

/// 2. A store Python writes now: holdfast reads it all, updates one key (CLI via stdin, and the
///    library's `update`), and Python sees the new values with every unknown field preserved
///    and holdfast's generation as an extra field; hive's `list_all` lists every id.
#[test]
fn python_store_updated_by_holdfast_reads_back_in_python() {
    let sb = Sandbox::new();
    sb.new_key();
    // hive's own key lookup: HIVE_CREDENTIAL_KEY.
    let expected = sb.py_env_key(&["write", &sb.store_arg(), "--bulk", "20"]);
    let n = obj(&expected).len();
    assert_eq!(enc_files(&sb.store().join("credentials")).len(), n);

    let store = sb.open();
    assert_clean_open(store.open_report(), n, "fresh python store");
    assert_reads_all(&store, &expected, "fresh python store");

    // hive maps `a..b`, `a/b` and `a_b` to one file; holdfast refuses to overwrite another id.
    let before = fs::read(sb.store().join("credentials/a_b.enc")).expect("a_b.enc");
    for other in ["a_b", "a/b"] {
        let err = store
            .set(Credential::api_key(other, Secret::new("x".into())), None)
            .expect_err("collision must be refused");
        assert_eq!(err.kind(), ErrorKind::Conflict, "{other}: {err}");
    }
    assert_eq!(
        fs::read(sb.store().join("credentials/a_b.enc")).expect("a_b.enc"),
        before
    );

    // Library update of one key of the oauth2 credential.
    let generation = store
        .update("team/github", Some(1), |c| {
            let mut c = c.expect("team/github exists");
            c.set_key(
                "access_token",
                Secret::new("gho-rotated-by-holdfast".into()),
            );
            Ok(c)
        })
        .expect("update");
    assert_eq!(generation, 2);
    store.flush().expect("flush");
    drop(store);

    // CLI update of one key, the secret on stdin.
    let new_password = "new-pässword \"q\" ✓";
    let out = sb.holdfast(
        &["cred", "set", "db/prod/main", "--key", "password"],
        Some(&format!("{new_password}\n")),
    );
    assert_eq!(out.code, 0, "cred set: {}", out.stderr);
    assert!(out.stdout.contains("generation 2"), "{}", out.stdout);

    let back = sb.py(&["read", &sb.store_arg()]);
    assert_eq!(ids_of(&back), ids_of(&expected));
    let changed = [
        ("team/github", "access_token", "gho-rotated-by-holdfast"),
        ("db/prod/main", "password", new_password),
    ];
    for (id, doc) in obj(&expected) {
        let got = &back[id];
        match changed.iter().find(|c| c.0 == id) {
            None => assert_eq!(got, doc, "{id}: untouched credential changed"),
            Some((_, key, value)) => {
                assert_eq!(got["keys"][key]["value"], json!(value), "{id}");
                assert_eq!(got["holdfast_generation"], json!(2), "{id}");
                let updated = got["updated_at"].as_str().expect("updated_at");
                assert!(
                    updated.ends_with('Z') && updated != doc["updated_at"],
                    "{id}: {updated}"
                );
                assert_eq!(got["created_at"], doc["created_at"], "{id}");
                // Everything else, unknown fields on the credential and its keys included, is
                // exactly as hive wrote it.
                let mut want = doc.clone();
                want["keys"][key]["value"] = json!(value);
                let mut got = got.clone();
                for f in ["holdfast_generation", "updated_at"] {
                    got.as_object_mut().expect("object").remove(f);
                    want.as_object_mut().expect("object").remove(f);
                }
                assert_eq!(got, want, "{id}: fields lost or changed by the update");
            }
        }
    }
    assert_eq!(back["db/prod/main"]["owner_team"], json!("infra"));
    assert_eq!(
        back["db/prod/main"]["keys"]["password"]["scopes"],
        json!(["read", "write"])
    );
    let listed = hive_list_all(&sb, &ids_of(&expected), "after holdfast updates");
    println!("python store: {n} credentials read by holdfast; 2 updated (CLI, library); hive read {} and list_all {listed}", obj(&back).len());
}

/// 3. A store only holdfast wrote: Python decrypts and validates every file, and its index is
///    the v2.0 index hive expects (every id, entries equal hive's derivation).
#[test]
fn holdfast_store_reads_in_python() {
    let sb = Sandbox::new();
    init_store(&sb.config(), &Faults::none()).expect("init");
    let store = sb.open();
    // id -> key name -> value, as set.
    let mut want: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut put = |store: &CredentialStore, c: Credential| {
        let id = c.id().to_owned();
        let values = c
            .key_names()
            .into_iter()
            .map(|k| (k.to_owned(), c.key_value(k).expect("value").to_owned()))
            .collect();
        assert_eq!(store.set(c, Some(0)).expect("set"), 1, "{id}");
        want.insert(id, values);
    };
    put(
        &store,
        Credential::api_key("plain", Secret::new("sk-hf-plain".into())),
    );
    put(
        &store,
        Credential::api_key("a..b", Secret::new("sk-hf-dots".into())),
    );
    let mut deploy = Credential::new("team/deploy", "bearer_token");
    deploy.set_key("token", Secret::new("bt-hf-\"quoted\"\nsecond line".into()));
    deploy.set_field("description", json!("Déploiement — ключ 🚀"));
    deploy.set_field("tags", json!(["ci", "déploiement"]));
    put(&store, deploy);
    let mut uni = Credential::new("ünï/ключ", "custom");
    uni.set_key("blob", Secret::new("значение ✓ 🔑".into()));
    put(&store, uni);
    let rich = Credential::from_value(json!({
        "id": "team/gh-app", "credential_type": "oauth2",
        "keys": {
            "access_token": {"name": "access_token", "value": "gho-hf-1",
                             "expires_at": "2026-06-01T00:00:00Z", "metadata": {}},
            "refresh_token": {"name": "refresh_token", "value": "ghr-hf-2",
                              "expires_at": "2026-03-01T10:00:00.250000Z", "metadata": {"k": 1},
                              "extra_on_key": [1, 2]},
            "_alias": {"name": "_alias", "value": "ci", "expires_at": null, "metadata": {}},
            "_integration_type": {"name": "_integration_type", "value": "github",
                                  "expires_at": null, "metadata": {}},
            "_identity_account_id": {"name": "_identity_account_id", "value": "42",
                                     "expires_at": null, "metadata": {}}
        },
        "provider_id": "github", "last_refreshed": "2026-01-10T09:00:00+02:00",
        "auto_refresh": true, "last_used": null, "use_count": 3,
        "description": "app token", "tags": ["gh"], "extra_top": {"x": "ÿ"}
    }))
    .expect("document");
    put(&store, rich);
    for i in 0..20 {
        put(
            &store,
            Credential::api_key(
                &format!("bulk/cred_{i:03}"),
                Secret::new(format!("sk-hf-bulk-{i:03}")),
            ),
        );
    }
    store.flush().expect("flush");
    drop(store);
    let ids: BTreeSet<String> = want.keys().cloned().collect();
    let files = enc_files(&sb.store().join("credentials"));
    assert_eq!(
        files,
        ids.iter().map(|i| hive_file_name(i)).collect(),
        "hive file names"
    );

    // hive decrypts and validates every file (schema, datetime forms, file name = safe_id).
    let back = sb.py(&["read", &sb.store_arg()]);
    assert_eq!(ids_of(&back), ids);
    for (id, values) in &want {
        let doc = &back[id];
        for (k, v) in values {
            assert_eq!(doc["keys"][k]["value"], json!(v), "{id} key {k}");
        }
        assert_eq!(doc["holdfast_generation"], json!(1), "{id}");
        for f in ["created_at", "updated_at"] {
            assert!(
                doc[f].as_str().is_some_and(|s| s.ends_with('Z')),
                "{id}: {f} = {}",
                doc[f]
            );
        }
    }
    assert_eq!(
        back["team/deploy"]["description"],
        json!("Déploiement — ключ 🚀")
    );
    assert_eq!(back["team/gh-app"]["extra_top"], json!({"x": "ÿ"}));
    assert_eq!(
        back["team/gh-app"]["keys"]["refresh_token"]["extra_on_key"],
        json!([1, 2])
    );

    // The index, as hive loads it, and hive's own derivation of each entry.
    let idx = index_json(&sb.store());
    assert_eq!(idx["version"], json!("2.0"));
    let app = &idx["credentials"]["team/gh-app"];
    assert_eq!(app["provider"], json!("github"));
    assert_eq!(app["alias"], json!("ci"));
    assert_eq!(app["identity"], json!({"account_id": "42"}));
    assert_eq!(app["key_names"], json!(["access_token", "refresh_token"]));
    assert_eq!(app["expires_at"], json!("2026-03-01T10:00:00.250000+00:00"));
    assert_eq!(app["last_refreshed"], json!("2026-01-10T09:00:00+02:00"));
    let listed = hive_list_all(&sb, &ids, "holdfast-written store");
    println!("holdfast store: {} credentials written by holdfast; hive decrypted and validated {}, list_all {listed}", ids.len(), obj(&back).len());
}

/// How a recovery case damages the store.
#[derive(Clone, Copy)]
enum Damage {
    /// `break-index MODE`.
    Index(&'static str),
    /// hive's truncate-then-write of this id, dying after this many bytes.
    InPlace(&'static str, usize),
}

/// 4. Recovery of what unpatched hive breaks: damaged indexes, ghost entries, and an empty or
///    torn `.enc` left by a truncate-then-write. holdfast's open repairs the store, every intact
///    credential comes back, damaged files go to quarantine (never deleted), the report says what
///    happened, and afterwards hive reads the store and lists every credential.
#[test]
fn holdfast_recovers_stores_hive_broke() {
    let cases: &[(&str, Damage)] = &[
        ("drop-most", Damage::Index("drop-most")),
        ("torn", Damage::Index("torn")),
        ("v1", Damage::Index("v1")),
        ("missing", Damage::Index("missing")),
        ("ghost", Damage::Index("ghost")),
        ("write-inplace (empty)", Damage::InPlace("cred_00007", 0)),
        ("write-inplace (torn)", Damage::InPlace("team/github", 120)),
    ];
    let mut rows = Vec::new();
    let mut violations = 0usize;
    for (label, damage) in cases {
        let sb = Sandbox::new();
        sb.new_key();
        let expected = sb.py(&["write", &sb.store_arg(), "--bulk", "30"]);
        let all = ids_of(&expected);
        let mut intact = all.clone();
        let mut victim_file = None;
        let broke = match damage {
            Damage::Index(mode) => sb.py(&["break-index", &sb.store_arg(), mode]),
            Damage::InPlace(id, keep) => {
                let v = sb.py(&[
                    "write-inplace",
                    &sb.store_arg(),
                    id,
                    "--keep-bytes",
                    &keep.to_string(),
                ]);
                intact.remove(*id);
                let file = hive_file_name(id);
                let len = fs::metadata(sb.store().join("credentials").join(&file))
                    .expect("victim")
                    .len();
                assert_eq!(len, *keep as u64, "{label}: victim size");
                victim_file = Some((id.to_string(), file, len));
                v
            }
        };

        let store = sb.open();
        let rep = store.open_report().clone();
        let listing = store.list().expect("list");
        let listed: BTreeSet<String> = listing.credentials.iter().map(|c| c.id.clone()).collect();
        assert_eq!(listed, intact, "{label}: credentials after repair\n{rep}");
        // An empty file stays where it is (a writer in place may fill it yet): unreadable.
        let left_empty = usize::from(matches!(damage, Damage::InPlace(_, 0)));
        assert_eq!(listing.unreadable, left_empty, "{label}");
        for id in &intact {
            let c = store
                .get(id)
                .unwrap_or_else(|e| panic!("{label}: {id}: {e}"));
            assert_eq!(c.expose_json(), expected[id], "{label}: {id}");
        }
        assert_eq!(rep.files, all.len(), "{label}: files found\n{rep}");
        assert_eq!(rep.readable, intact.len(), "{label}: readable\n{rep}");
        match damage {
            Damage::Index("drop-most") => {
                let dropped = str_set(&broke["dropped"]);
                assert!(
                    dropped.len() * 10 >= all.len() * 8,
                    "{label}: dropped only {}",
                    dropped.len()
                );
                assert!(!rep.index_rebuilt, "{label}\n{rep}");
                assert_eq!(set_of(&rep.orphans), dropped, "{label}: orphans\n{rep}");
                assert!(rep.ghosts.is_empty(), "{label}\n{rep}");
            }
            Damage::Index("torn") => {
                assert!(
                    rep.index_rebuilt && rep.index.starts_with("unparseable"),
                    "{label}\n{rep}"
                );
            }
            Damage::Index("v1") => {
                assert!(
                    rep.index_rebuilt && rep.index.contains("1.0"),
                    "{label}\n{rep}"
                );
            }
            Damage::Index("missing") => {
                assert!(
                    rep.index_rebuilt && rep.index == "missing",
                    "{label}\n{rep}"
                );
            }
            Damage::Index("ghost") => {
                assert!(!rep.index_rebuilt, "{label}\n{rep}");
                let want: BTreeSet<String> = ["ghost/deleted-1", "ghost_deleted_2"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                assert_eq!(set_of(&rep.ghosts), want, "{label}: ghosts\n{rep}");
                assert!(rep.orphans.is_empty(), "{label}\n{rep}");
            }
            Damage::InPlace(id, _) => {
                assert!(!rep.index_rebuilt, "{label}\n{rep}");
                assert_eq!(
                    rep.ghosts,
                    vec![id.to_string()],
                    "{label}: the damaged id leaves the index\n{rep}"
                );
                assert!(rep.orphans.is_empty(), "{label}\n{rep}");
            }
            Damage::Index(other) => panic!("unknown mode {other}"),
        }
        assert!(rep.index_rewritten, "{label}: index not rewritten\n{rep}");
        let q = quarantine_files(&sb.store());
        match &victim_file {
            None => {
                assert!(
                    rep.quarantined.is_empty() && q.is_empty(),
                    "{label}: nothing to quarantine\n{rep}"
                );
            }
            Some((id, file, 0)) => {
                assert!(rep.quarantined.is_empty() && q.is_empty(), "{label}\n{rep}");
                assert_eq!(rep.empty, std::slice::from_ref(file), "{label}\n{rep}");
                assert!(sb.store().join("credentials").join(file).exists());
                let err = store.get(id).expect_err("an empty file");
                assert_eq!(err.kind(), ErrorKind::Integrity, "{label}: {err}");
                assert!(err.to_string().contains("try again"), "{label}: {err}");
            }
            Some((id, file, len)) => {
                assert_eq!(rep.quarantined.len(), 1, "{label}\n{rep}");
                assert_eq!(&rep.quarantined[0].file, file, "{label}");
                assert_eq!(q.len(), 1, "{label}: quarantine holds {q:?}");
                let name = q[0]
                    .file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned();
                assert!(name.starts_with(&format!("{file}.")), "{label}: {name}");
                assert_eq!(
                    fs::metadata(&q[0]).expect("quarantined").len(),
                    *len,
                    "{label}: quarantined bytes"
                );
                assert!(
                    !sb.store().join("credentials").join(file).exists(),
                    "{label}"
                );
                let err = store
                    .get(id)
                    .expect_err("damaged credential is gone from credentials/");
                assert_eq!(err.kind(), ErrorKind::NotFound, "{label}: {err}");
            }
        }
        drop(store);

        // hive reads the repaired store and lists every credential.
        let back = if left_empty > 0 {
            sb.py(&["read", &sb.store_arg(), "--skip-empty"])
        } else {
            sb.py(&["read", &sb.store_arg()])
        };
        assert_eq!(ids_of(&back), intact, "{label}: hive read");
        for id in &intact {
            if back[id] != expected[id] {
                violations += 1;
                eprintln!("{label}: {id} differs after repair");
            }
        }
        hive_list_all(&sb, &intact, label);
        rows.push((
            label.to_string(),
            rep.files,
            intact.len(),
            listed.len(),
            rep.orphans.len(),
            rep.ghosts.len(),
            rep.index_rebuilt,
            rep.quarantined.len(),
        ));
    }
    println!("hive damage recovery:");
    println!(
        "  {:<22} {:>5} {:>6} {:>9} {:>7} {:>6} {:>8} {:>11}",
        "mode", "found", "intact", "recovered", "orphans", "ghosts", "rebuilt", "quarantined"
    );
    for (m, found, intact, rec, orph, gh, rebuilt, q) in &rows {
        println!(
            "  {m:<22} {found:>5} {intact:>6} {rec:>9} {orph:>7} {gh:>6} {rebuilt:>8} {q:>11}"
        );
    }
    let lost: usize = rows.iter().map(|r| r.2 - r.3).sum();
    println!(
        "  totals: {} cases, {lost} intact credentials lost, {violations} changed",
        rows.len()
    );
    assert_eq!(lost + violations, 0);
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// 5. Concurrent writers: two Python processes using hive's patched `flock` protocol and two
///    holdfast threads write distinct ids into one store at once; then the Python writers write
///    a tail of ids alone, so that index.json is last written by hive's read-modify-write (which
///    must keep holdfast's entries, and each other's, because everyone takes index.lock).
///    Afterwards every id reads in holdfast and is in index.json (and in hive's `list_all`).
#[test]
fn concurrent_hive_and_holdfast_writers() {
    const PER_WRITER: usize = 100;
    const TAIL: usize = 25;
    let sb = Sandbox::new();
    init_store(&sb.config(), &Faults::none()).expect("init");
    let store = Arc::new(sb.open());
    let go = sb.root().join("go");
    let tail_go = sb.root().join("tail-go");
    let started = Instant::now();
    let mut pythons = Vec::new();
    for p in 0..2 {
        let mut child = sb
            .py_command(&[
                "lock-writer",
                &sb.store_arg(),
                "--prefix",
                &format!("py{p}"),
                "--count",
                &PER_WRITER.to_string(),
                "--go-file",
                go.to_str().expect("utf-8"),
                "--tail",
                &TAIL.to_string(),
                "--tail-go-file",
                tail_go.to_str().expect("utf-8"),
                "--hold-ms",
                "2",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn python writer");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("ready line");
        assert_eq!(line.trim(), "ready", "python writer {p} did not start");
        pythons.push((child, out));
    }
    fs::write(&go, b"").expect("go");
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let start = unix_now();
                for i in 0..PER_WRITER {
                    let id = format!("hf{t}/cred_{i:04}");
                    let c = Credential::api_key(&id, Secret::new(format!("sk-hf{t}-{i:04}")));
                    store
                        .set(c, None)
                        .unwrap_or_else(|e| panic!("set {id}: {e}"));
                }
                (start, unix_now())
            })
        })
        .collect();
    let hf_times: Vec<(f64, f64)> = threads
        .into_iter()
        .map(|t| t.join().expect("holdfast writer thread"))
        .collect();
    // holdfast's write-behind: make sure its index is current before hive writes the tail.
    store.flush().expect("flush");
    fs::write(&tail_go, b"").expect("tail-go");
    let mut py_written = 0;
    let mut py_head = Vec::new();
    for (p, (mut child, mut out)) in pythons.into_iter().enumerate() {
        let mut rest = String::new();
        out.read_to_string(&mut rest).expect("python output");
        let mut err = String::new();
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut err)
            .expect("stderr");
        let status = child.wait().expect("wait");
        assert!(status.success(), "python writer {p}: {status}\n{err}");
        let v: Value = serde_json::from_str(&rest).expect("python writer JSON");
        py_written += v["written"].as_array().expect("written").len();
        let t = |k: &str| v["times"][k].as_f64().expect("time");
        py_head.push((t("start"), t("head_end")));
    }
    let elapsed = started.elapsed();

    let mut want = BTreeMap::new();
    for w in 0..2 {
        for i in 0..PER_WRITER {
            want.insert(format!("py{w}/cred_{i:04}"), format!("sk-py{w}-{i:04}"));
            want.insert(format!("hf{w}/cred_{i:04}"), format!("sk-hf{w}-{i:04}"));
        }
    }
    let want_ids: BTreeSet<String> = want.keys().cloned().collect();
    // index.json as the last writer (hive's tail) left it, before holdfast looks again.
    let idx = index_json(&sb.store());
    assert_eq!(idx["version"], json!("2.0"));
    let in_index: BTreeSet<String> = obj(&idx["credentials"]).keys().cloned().collect();
    let missing_from_index: Vec<&String> = want_ids.difference(&in_index).collect();

    let mut readable = 0;
    for (id, value) in &want {
        match store.get(id) {
            Ok(c) if c.key_value("api_key") == Some(value.as_str()) => readable += 1,
            Ok(_) => eprintln!("{id}: wrong value"),
            Err(e) => eprintln!("{id}: {e}"),
        }
    }
    let listed = store.list().expect("list").credentials.len();
    store.flush().expect("flush");
    drop(store);

    // How much the head phase really overlapped: the window in which all four writers ran.
    let overlap_start = hf_times
        .iter()
        .chain(&py_head)
        .map(|t| t.0)
        .fold(f64::MIN, f64::max);
    let overlap_end = hf_times
        .iter()
        .chain(&py_head)
        .map(|t| t.1)
        .fold(f64::MAX, f64::min);
    println!(
        "concurrent writers: 2 python (flock) x {PER_WRITER} (last {TAIL} after holdfast) + 2 holdfast threads x {PER_WRITER} \
         = {} ids in {:.1} s, all four writing at once for {:.2} s; python acked {py_written}; \
         holdfast readable {readable}/{n}, listed {listed}/{n}; index.json after the last writer {}/{n} ({} missing)",
        want.len(),
        elapsed.as_secs_f64(),
        (overlap_end - overlap_start).max(0.0),
        want.len() - missing_from_index.len(),
        missing_from_index.len(),
        n = want.len(),
    );
    assert_eq!(py_written, 2 * PER_WRITER);
    assert_eq!(readable, want.len());
    assert_eq!(listed, want.len());
    assert!(
        missing_from_index.is_empty(),
        "index.json lost {} ids, e.g. {:?}",
        missing_from_index.len(),
        &missing_from_index[..missing_from_index.len().min(5)]
    );
    assert_eq!(in_index, want_ids, "index.json ids");
    let hive_listed = hive_list_all(&sb, &want_ids, "after concurrent writers");
    let back = sb.py(&["read", &sb.store_arg()]);
    assert_eq!(ids_of(&back), want_ids, "hive reads every file");
    println!(
        "concurrent writers: hive list_all {hive_listed}/{n}, hive read {}/{n}",
        obj(&back).len(),
        n = want.len()
    );
}

/// The clock-skew rule against Python: a token Python stamps an hour ahead
/// (`encrypt_at_time(now + 3600)`) reads in hive (no TTL) but is a clock-skew error in
/// holdfast, never "corrupt": the file is left exactly as it is, not quarantined, and its index
/// entry is kept.
#[test]
fn future_token_from_python_is_clock_skew() {
    let sb = Sandbox::new();
    sb.new_key();
    let expected = sb.py(&["write", &sb.store_arg()]);
    let id = "future/token";
    sb.py(&["write-future", &sb.store_arg(), id, "--ahead", "3600"]);
    let path = sb.store().join("credentials").join(hive_file_name(id));
    let before = fs::read(&path).expect("future file");
    let meta_before = fs::metadata(&path).expect("meta");

    let store = sb.open();
    let rep = store.open_report().clone();
    assert_eq!(rep.clock_skew.len(), 1, "{rep}");
    assert!(rep.quarantined.is_empty(), "{rep}");
    let err = store.get(id).expect_err("future token must not read");
    assert!(err.is_clock_skew(), "not clock skew: {err}");
    assert!(matches!(err, Error::ClockSkew { .. }));
    assert_eq!(err.kind(), ErrorKind::Integrity);
    // The future-stamped credential stays listed with the metadata hive's index has for it
    // (it exists; it just cannot be read yet), and is counted as unreadable.
    let listing = store.list().expect("list");
    assert_eq!(listing.credentials.len(), obj(&expected).len() + 1);
    assert!(listing.credentials.iter().any(|c| c.id == id));
    assert_eq!(listing.unreadable, 1);
    drop(store);
    let out = sb.holdfast(&["cred", "get", id], None);
    assert_eq!(out.code, 6, "{}", out.stderr);
    assert!(out.stderr.contains("future"), "{}", out.stderr);

    assert_eq!(
        fs::read(&path).expect("future file"),
        before,
        "file modified"
    );
    let meta_after = fs::metadata(&path).expect("meta");
    assert_eq!(
        (meta_after.ino(), meta_after.mtime_nsec()),
        (meta_before.ino(), meta_before.mtime_nsec())
    );
    assert!(quarantine_files(&sb.store()).is_empty());
    // hive (no TTL) still reads it, and its index entry survived holdfast's reindex.
    let back = sb.py(&["read", &sb.store_arg()]);
    assert_eq!(
        back[id]["keys"]["api_key"]["value"],
        json!("sk-test-future")
    );
    let mut all = ids_of(&expected);
    all.insert(id.into());
    hive_list_all(&sb, &all, "clock skew");
    println!("clock skew: Python token stamped +3600 s -> holdfast clock-skew error (exit 6), file untouched, index entry kept");
}
