//! Helpers shared by the integration tests; each test file has `mod common;`.
//!
//! - [`clean_env`], [`holdfast_cmd`], [`store_cmd`], [`reexec`]: child processes with a private
//!   HOME/XDG environment and none of the caller's holdfast, hive or systemd variables.
//! - [`Out`] and [`run`]: run a child with bytes on stdin, keep its exit code and output.
//! - [`TempHome`]: a temporary HOME for the CLI's default layout.
//! - [`TestStore`]: an initialized store with a key file in a temp dir, opened with the library.
//! - Small readers of a store directory: [`names_in`], [`temps_in`], [`enc_files`],
//!   [`index_json`], and [`value_of`] for a credential's `api_key`.
//!
//! Not every test binary uses every helper: each `mod common;` that leaves some unused carries
//! `#[allow(dead_code)]`.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::io::{ErrorKind as IoErrorKind, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use holdfast::crypto::KeySource;
use holdfast::durable::Faults;
use holdfast::store::{init_store, Credential, CredentialStore, Error, StoreConfig, StoreOptions};
use serde_json::Value;

/// What every temp file holdfast writes has in its name (`.<name>.hf-tmp-<hex>`).
pub const TEMP_MARKER: &str = ".hf-tmp-";

// ---------------------------------------------------------------------------------------------
// Child processes

/// Variables that would point a child at the caller's stores, keys or logging.
const REMOVED_VARS: [&str; 7] = [
    "CREDENTIALS_DIRECTORY",
    "STATE_DIRECTORY",
    "HIVE_HOME",
    "HIVE_CREDENTIAL_KEY",
    "HOLDFAST_DATA_DIR",
    "HOLDFAST_STORE",
    "RUST_LOG",
];

/// A clean environment on `c`: HOME is `home`, XDG_CONFIG_HOME, XDG_STATE_HOME and
/// XDG_RUNTIME_DIR are `home/config`, `home/state` and `home/run` (so the default socket is
/// the test's own, never a daemon running on the machine), and CREDENTIALS_DIRECTORY, STATE_DIRECTORY, RUST_LOG and
/// every HIVE_* and HOLDFAST_* variable (those named above and any the caller has) are removed.
/// Variables set on `c` afterwards win.
pub fn clean_env<'a>(c: &'a mut Command, home: &Path) -> &'a mut Command {
    for var in REMOVED_VARS {
        c.env_remove(var);
    }
    for (k, _) in std::env::vars_os() {
        let name = k.to_string_lossy();
        if name.starts_with("HIVE_") || name.starts_with("HOLDFAST_") {
            c.env_remove(&k);
        }
    }
    c.env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_STATE_HOME", home.join("state"))
        .env("XDG_RUNTIME_DIR", home.join("run"))
}

/// The `holdfast` binary with a [`clean_env`] around `home`.
pub fn holdfast_cmd(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_holdfast"));
    clean_env(&mut c, home);
    c
}

/// `holdfast --store-dir <base> --key-file <key>` with a [`clean_env`] around `home`.
pub fn store_cmd(home: &Path, base: &Path, key: &Path) -> Command {
    let mut c = holdfast_cmd(home);
    c.arg("--store-dir").arg(base).arg("--key-file").arg(key);
    c
}

/// This test binary re-executed to run only the `#[ignore]`d test `child_test` (one thread,
/// terse output, nothing captured), with a [`clean_env`] around `home`. The child entry point
/// must do nothing unless the variables the caller sets on the command are present.
pub fn reexec(child_test: &str, home: &Path) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current_exe"));
    c.args([
        "--exact",
        child_test,
        "--nocapture",
        "--ignored",
        "--test-threads=1",
        "-q",
    ]);
    clean_env(&mut c, home);
    c
}

/// A finished child: exit code (-1 if killed by a signal) and its UTF-8 output.
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Run `c` with `stdin` piped in and its output captured. A child that exits before reading
/// stdin closes the pipe: that (EPIPE) is ignored, any other write error fails. Output that is
/// not UTF-8 fails the test.
pub fn run(mut c: Command, stdin: &[u8]) -> Out {
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {:?}: {e}", c.get_program()));
    if let Err(e) = child.stdin.take().expect("stdin").write_all(stdin) {
        assert_eq!(e.kind(), IoErrorKind::BrokenPipe, "write stdin: {e}");
    }
    let o = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait {:?}: {e}", c.get_program()));
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8(o.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(o.stderr).expect("stderr is UTF-8"),
    }
}

// ---------------------------------------------------------------------------------------------
// Temp dirs and stores

/// A temporary HOME (`<tempdir>/home`, created) for the CLI's default layout:
/// `$XDG_CONFIG_HOME` and `$XDG_STATE_HOME` are `home/config` and `home/state`.
pub struct TempHome {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub home: PathBuf,
}

impl TempHome {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        let home = root.join("home");
        fs::create_dir(&home).expect("mkdir home");
        TempHome {
            _dir: dir,
            root,
            home,
        }
    }

    /// `holdfast` with a [`clean_env`] around this HOME.
    pub fn cmd(&self) -> Command {
        holdfast_cmd(&self.home)
    }
}

/// A store configuration keyed by one key file.
pub fn store_config(name: &str, base: &Path, key: &Path) -> StoreConfig {
    StoreConfig {
        name: name.into(),
        base: base.to_path_buf(),
        key_sources: vec![KeySource::File(key.to_path_buf())],
    }
}

/// An initialized, empty store in a temp dir: `<root>/store` (the base), its key
/// `<root>/keys/test.key`, and `<root>/home` (created) as the HOME of CLI children.
pub struct TestStore {
    _dir: tempfile::TempDir,
    pub name: &'static str,
    pub root: PathBuf,
    pub base: PathBuf,
    pub key: PathBuf,
}

impl TestStore {
    pub fn new(name: &'static str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        let base = root.join("store");
        let key = root.join("keys").join("test.key");
        init_store(&store_config(name, &base, &key), &key, &Faults::none()).expect("init_store");
        fs::create_dir_all(root.join("home")).expect("mkdir home");
        TestStore {
            _dir: dir,
            name,
            root,
            base,
            key,
        }
    }

    pub fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    pub fn config(&self) -> StoreConfig {
        store_config(self.name, &self.base, &self.key)
    }

    pub fn try_open(&self) -> Result<CredentialStore, Error> {
        CredentialStore::open(self.config(), StoreOptions::default())
    }

    pub fn open(&self) -> CredentialStore {
        self.try_open().expect("open store")
    }

    /// `holdfast --store-dir <base> --key-file <key>` with a clean environment.
    pub fn cmd(&self) -> Command {
        store_cmd(&self.home(), &self.base, &self.key)
    }

    /// [`TestStore::cmd`] with `args`, run with `stdin`.
    pub fn cli<I, S>(&self, args: I, stdin: &[u8]) -> Out
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.cmd();
        c.args(args);
        run(c, stdin)
    }
}

// ---------------------------------------------------------------------------------------------
// Reading a store directory

/// The `api_key` value of `c`, or a placeholder that no test writes.
pub fn value_of(c: &Credential) -> String {
    c.key_value("api_key").unwrap_or("<no api_key>").to_owned()
}

/// File names in `dir`, sorted; none if `dir` does not exist.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// Temp file names in `dir` (see [`TEMP_MARKER`]), sorted.
pub fn temps_in(dir: &Path) -> Vec<String> {
    names_in(dir)
        .into_iter()
        .filter(|n| n.contains(TEMP_MARKER))
        .collect()
}

/// Every name ending in `.enc` in a credentials directory, which must exist. (A temp file,
/// `.<name>.hf-tmp-<hex>`, never ends in `.enc`; one that did would count here.)
pub fn enc_files(cred_dir: &Path) -> BTreeSet<String> {
    fs::read_dir(cred_dir)
        .unwrap_or_else(|e| panic!("credentials dir {}: {e}", cred_dir.display()))
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".enc"))
        .collect()
}

/// `<base>/metadata/index.json`, which must exist and parse.
pub fn index_json(base: &Path) -> Value {
    let bytes = fs::read(base.join("metadata/index.json")).expect("read index.json");
    serde_json::from_slice(&bytes).expect("index.json is JSON")
}
