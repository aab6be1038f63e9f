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
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

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
        key_dir: None,
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
        init_store(&store_config(name, &base, &key), &Faults::none()).expect("init_store");
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

// =============================================================================================
// Daemon harness (used by tests/daemon.rs)
//
// [`DaemonEnv`]: a private HOME with an initialized `default` store, a config file and a 0700
// runtime dir, optionally owned by uid 65534 ([`NOBODY`]). [`DaemonEnv::start`] spawns the real
// `holdfast daemon` (stderr to a log file per start) and waits until the socket answers
// `hello`; [`RunningDaemon::stop`] sends SIGTERM and checks exit code 0. A daemon still running
// when its [`RunningDaemon`] is dropped (a failed test) is SIGKILLed by pid. [`Conn`] speaks
// raw NDJSON JSON-RPC over a `UnixStream`.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// The unprivileged uid/gid "another uid" tests drop to (`nobody`).
pub const NOBODY: u32 = 65534;

/// The setpriv arguments that run a command as [`NOBODY`].
pub const SETPRIV_NOBODY: [&str; 4] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
];

/// A python3 that any uid can run (`python3` on PATH may be a shim under /root).
pub const PYTHON: &str = "/usr/bin/python3";

/// Whether the tests run as root (CI does; "another uid" tests need it).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// One JSON-RPC request line (with its newline).
pub fn req_line(id: impl Into<Value>, method: &str, params: Value) -> Vec<u8> {
    let mut v = serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0", "id": id.into(), "method": method, "params": params,
    }))
    .expect("serialize request");
    v.push(b'\n');
    v
}

/// A field of `/proc/<pid>/status` (e.g. `VmRSS` in kB, `Threads`), first number only.
pub fn proc_status(pid: u32, field: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// Open file descriptors of `pid`.
pub fn fd_count(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|rd| rd.count())
        .unwrap_or(0)
}

/// `text` without ANSI colour escapes (the human log format colours field names).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A temp HOME for a daemon: `<root>/home` with XDG dirs under it (see [`clean_env`]),
/// `<root>/home/run` (0700, the runtime dir, so the socket is `home/run/holdfast/holdfast.sock`),
/// `<root>/config.toml` (passed with `--config`), and a `default` store made by `holdfast init`.
pub struct DaemonEnv {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub home: PathBuf,
    pub socket: PathBuf,
    pub config: PathBuf,
    pub data_dir: PathBuf,
    /// Whether the daemon (and `init`) run as [`NOBODY`].
    pub as_nobody: bool,
    /// The `[backend]` section every config of this environment gets (the test backend).
    pub backend: String,
    starts: usize,
}

/// The backend the suites run against: `HOLDFAST_TEST_BACKEND=postgres` (with
/// `HOLDFAST_TEST_PG`, libpq key=value parameters of a server, set by scripts/test.sh, which
/// starts one) runs them on PostgreSQL; otherwise files.
pub fn test_pg() -> Option<String> {
    if std::env::var("HOLDFAST_TEST_BACKEND").as_deref() != Ok("postgres") {
        return None;
    }
    let base = std::env::var("HOLDFAST_TEST_PG").expect(
        "HOLDFAST_TEST_BACKEND=postgres needs HOLDFAST_TEST_PG (scripts/test.sh sets both)",
    );
    Some(base)
}

/// A new, empty database on the test server; its `[backend]` section.
pub fn fresh_pg_backend(base: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "hf_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    pg_execute(base, &format!("CREATE DATABASE {name}"));
    format!("\n[backend]\nkind = \"postgres\"\nurl = \"{base} dbname={name}\"\n")
}

/// The libpq parameters of a `[backend]` section's database (its `url`).
pub fn pg_url_of(backend: &str) -> String {
    backend
        .lines()
        .find_map(|l| l.strip_prefix("url = \""))
        .map(|u| u.trim_end_matches('"').to_owned())
        .expect("a [backend] section with a url")
}

/// The rows of a query of two columns (text, bigint) on the database at `url`.
pub fn pg_pairs(url: &str, sql: &str) -> Vec<(String, i64)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to the test PostgreSQL");
        let h = tokio::spawn(conn);
        let rows = client.query(sql, &[]).await.expect(sql);
        drop(client);
        let _ = h.await;
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    })
}

/// Run one statement on the test server's `postgres` database.
pub fn pg_execute(base: &str, sql: &str) {
    pg_execute_in(base, "postgres", sql);
}

/// Run statements on database `db` of the test server.
pub fn pg_execute_in(base: &str, db: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) =
            tokio_postgres::connect(&format!("{base} dbname={db}"), tokio_postgres::NoTls)
                .await
                .expect("connect to the test PostgreSQL");
        let h = tokio::spawn(conn);
        client.batch_execute(sql).await.expect(sql);
        drop(client);
        let _ = h.await;
    });
}

/// How to spawn one daemon: extra arguments and environment, and an optional shell prefix run
/// before `exec` (e.g. `umask 000` or `ulimit -c unlimited`).
#[derive(Default, Clone)]
pub struct DaemonOpts {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub shell_prefix: Option<String>,
    pub cwd: Option<PathBuf>,
}

impl DaemonEnv {
    /// A root-owned (test uid) environment with `config_toml` as the config file.
    pub fn new(config_toml: &str) -> Self {
        Self::make(config_toml, false)
    }

    /// The same, owned by uid/gid 65534; `init` and the daemon run under setpriv as 65534.
    pub fn new_as_nobody(config_toml: &str) -> Self {
        Self::make(config_toml, true)
    }

    /// Another "host": its own data directory and socket, the same database as `other` (only
    /// on the PostgreSQL test backend; on files, its own everything).
    pub fn new_sharing(config_toml: &str, other: &DaemonEnv) -> Self {
        Self::make_with(config_toml, false, Some(other.backend.clone()))
    }

    /// Whether this environment's streams are on PostgreSQL.
    pub fn on_postgres(&self) -> bool {
        !self.backend.is_empty()
    }

    fn make(config_toml: &str, as_nobody: bool) -> Self {
        Self::make_with(config_toml, as_nobody, None)
    }

    fn make_with(config_toml: &str, as_nobody: bool, backend: Option<String>) -> Self {
        let backend = match (backend, test_pg()) {
            (Some(b), _) => b,
            (None, Some(base)) if !as_nobody => fresh_pg_backend(&base),
            _ => String::new(),
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        let home = root.join("home");
        fs::create_dir(&home).expect("mkdir home");
        let run_dir = home.join("run");
        fs::create_dir(&run_dir).expect("mkdir run");
        fs::set_permissions(&run_dir, fs::Permissions::from_mode(0o700)).expect("chmod run");
        let config = root.join("config.toml");
        fs::write(&config, format!("{config_toml}{backend}")).expect("write config");
        if as_nobody {
            for p in [&root, &home, &run_dir, &config] {
                std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).expect("chown");
            }
        }
        let env = DaemonEnv {
            _dir: dir,
            socket: run_dir.join("holdfast/holdfast.sock"),
            data_dir: home.join("state/holdfast"),
            root,
            home,
            config,
            as_nobody,
            backend,
            starts: 0,
        };
        let out = run(env.cli(), b"");
        assert_eq!(out.code, 0, "holdfast init:\n{out}");
        env
    }

    /// Rewrite the config file (takes effect at the next start).
    pub fn write_config(&self, config_toml: &str) {
        fs::write(&self.config, format!("{config_toml}{}", self.backend)).expect("write config");
    }

    /// The `default` store's base directory.
    pub fn store_base(&self) -> PathBuf {
        self.data_dir.join("stores/default")
    }

    /// The `default` store's own key file (named after its identity).
    pub fn key_file(&self) -> PathBuf {
        holdfast::store::identity::own_key_file(
            &self.home.join("config/holdfast/keys"),
            "default",
            &self.store_base(),
        )
        .expect("store identity")
        .expect("the default store has an identity")
    }

    /// A `holdfast` command with a clean env around this HOME (as 65534 if the env is), with
    /// `--config`. Without arguments it runs `init`.
    fn cli(&self) -> Command {
        let mut c = self.holdfast(&["init"]);
        c.stdin(Stdio::null());
        c
    }

    /// `holdfast <args…> --config <config>` with a clean env (as 65534 if the env is).
    pub fn holdfast(&self, args: &[&str]) -> Command {
        let bin = env!("CARGO_BIN_EXE_holdfast");
        let mut c = if self.as_nobody {
            let mut c = Command::new(SETPRIV_NOBODY[0]);
            c.args(&SETPRIV_NOBODY[1..]).arg(bin);
            c
        } else {
            Command::new(bin)
        };
        clean_env(&mut c, &self.home);
        c.args(args).arg("--config").arg(&self.config);
        c
    }

    /// Spawn `holdfast daemon` without waiting for it (see [`DaemonEnv::start_with`]).
    pub fn spawn(&mut self, opts: &DaemonOpts) -> RunningDaemon {
        self.starts += 1;
        let log = self.root.join(format!("daemon-{}.log", self.starts));
        let log_file = fs::File::create(&log).expect("create daemon log");
        let mut c = self.holdfast(&["daemon"]);
        c.args(&opts.args);
        for (k, v) in &opts.env {
            c.env(k, v);
        }
        if let Some(prefix) = &opts.shell_prefix {
            let mut sh = Command::new("sh");
            sh.arg("-c")
                .arg(format!("{prefix}; exec \"$0\" \"$@\""))
                .arg(c.get_program())
                .args(c.get_args());
            for (k, v) in c.get_envs() {
                match v {
                    Some(v) => sh.env(k, v),
                    None => sh.env_remove(k),
                };
            }
            c = sh;
        }
        if let Some(cwd) = &opts.cwd {
            c.current_dir(cwd);
        }
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        let child = c.spawn().expect("spawn holdfast daemon");
        let pid = child.id();
        let socket = opts
            .args
            .iter()
            .position(|a| a == "--socket")
            .and_then(|i| opts.args.get(i + 1))
            .map_or_else(|| self.socket.clone(), PathBuf::from);
        RunningDaemon {
            child,
            pid,
            socket,
            log,
            exited: None,
        }
    }

    /// Spawn with `opts` and wait (≤ 15 s) until the socket answers `hello`.
    pub fn start_with(&mut self, opts: &DaemonOpts) -> RunningDaemon {
        let mut d = self.spawn(opts);
        d.wait_ready(Duration::from_secs(15));
        d
    }

    /// Spawn with default options and wait until it serves.
    pub fn start(&mut self) -> RunningDaemon {
        self.start_with(&DaemonOpts::default())
    }

    /// Every daemon log of this env so far, raw (with any ANSI escapes).
    pub fn all_logs_raw(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                String::from_utf8_lossy(
                    &fs::read(self.root.join(format!("daemon-{n}.log"))).unwrap_or_default(),
                )
                .into_owned()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The text of every daemon log of this env so far (ANSI escapes stripped).
    pub fn all_logs(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                strip_ansi(
                    &fs::read_to_string(self.root.join(format!("daemon-{n}.log")))
                        .unwrap_or_default(),
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A spawned daemon process.
pub struct RunningDaemon {
    pub child: Child,
    pub pid: u32,
    pub socket: PathBuf,
    pub log: PathBuf,
    exited: Option<ExitStatus>,
}

impl RunningDaemon {
    /// A daemon this test spawned itself (`child` is the daemon, whatever wrapper execs it),
    /// serving `socket`, its stderr in `log`.
    pub fn adopt(child: Child, socket: PathBuf, log: PathBuf) -> Self {
        RunningDaemon {
            pid: child.id(),
            child,
            socket,
            log,
            exited: None,
        }
    }

    /// Its stderr so far, raw (with any ANSI escapes).
    pub fn log_raw(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// Its stderr so far, ANSI escapes stripped.
    pub fn log_text(&self) -> String {
        strip_ansi(&self.log_raw())
    }

    /// Wait until `hello` is answered (result or error) on the socket; returns how long that
    /// took. Panics (with the log) if the daemon exits or `timeout` passes.
    pub fn wait_ready(&mut self, timeout: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if let Some(st) = self.try_exit() {
                panic!(
                    "daemon exited before serving ({st}); log:\n{}",
                    self.log_text()
                );
            }
            if let Ok(s) = UnixStream::connect(&self.socket) {
                let mut c = Conn::from_stream(s);
                c.set_timeout(Duration::from_secs(2));
                if let Ok(Some(v)) =
                    c.try_call("hello", serde_json::json!({"client": "ready-probe"}))
                {
                    // Any JSON-RPC answer counts (a daemon with require_plugin=true
                    // answers a plugin-less hello with `forbidden`).
                    if v.get("result").is_some() || v.get("error").is_some() {
                        return start.elapsed();
                    }
                }
            }
            assert!(
                start.elapsed() < timeout,
                "daemon did not answer on {} within {timeout:?}; log:\n{}",
                self.socket.display(),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Send `sig` to the daemon (by its pid).
    pub fn signal(&self, sig: rustix::process::Signal) {
        if self.exited.is_some() {
            return;
        }
        let pid = rustix::process::Pid::from_raw(self.pid as i32).expect("pid");
        let _ = rustix::process::kill_process(pid, sig);
    }

    /// Its exit status, if it has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().expect("try_wait");
        }
        self.exited
    }

    /// Wait up to `timeout` for it to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(st) = self.try_exit() {
                return Some(st);
            }
            if start.elapsed() >= timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, wait (≤ 30 s: the shutdown grace is 20 s) and check exit code 0. Returns the
    /// log text.
    pub fn stop(mut self) -> String {
        self.signal(rustix::process::Signal::TERM);
        let st = self.wait_exit(Duration::from_secs(30));
        let log = self.log_text();
        let st = st.unwrap_or_else(|| panic!("daemon ignored SIGTERM for 30 s; log:\n{log}"));
        assert_eq!(
            st.code(),
            Some(0),
            "daemon exit after SIGTERM: {st}; log:\n{log}"
        );
        log
    }

    /// Resident memory in KiB.
    pub fn rss_kib(&self) -> u64 {
        proc_status(self.pid, "VmRSS").expect("VmRSS")
    }

    /// Thread count.
    pub fn threads(&self) -> u64 {
        proc_status(self.pid, "Threads").expect("Threads")
    }
}

impl Drop for RunningDaemon {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            self.signal(rustix::process::Signal::KILL);
            let _ = self.child.wait();
        }
    }
}

/// A client that dribbled a request was closed by the daemon's read timeout of 1 s: one
/// error line saying the request was not completed, a clean close, after 0.9 to 4 s.
pub fn assert_closed_by_read_timeout(msgs: &[Value], eof: bool, took: Duration, what: &str) {
    assert!(eof, "{what}: not closed after {took:?}");
    assert_eq!(msgs.len(), 1, "{what}: {msgs:?}");
    assert!(
        msgs[0]["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not completed"),
        "{what}: {msgs:?}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{what}: closed after {took:?} (read timeout 1 s)"
    );
}

/// A raw protocol connection: NDJSON lines over a `UnixStream`. Event notifications read
/// while waiting for a response are kept for [`Conn::next_event`].
pub struct Conn {
    pub stream: UnixStream,
    reader: BufReader<UnixStream>,
    next_id: u64,
    events: VecDeque<Value>,
}

impl Conn {
    /// Connect (read timeout 10 s), no hello.
    pub fn connect(path: &Path) -> Self {
        let s =
            UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
        Self::from_stream(s)
    }

    /// Connect and say hello (asserting it succeeds).
    pub fn open(path: &Path) -> Self {
        let mut c = Self::connect(path);
        c.ok(
            "hello",
            serde_json::json!({"client": "daemon-test", "protocol": 1}),
        );
        c
    }

    pub fn from_stream(s: UnixStream) -> Self {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let reader = BufReader::new(s.try_clone().expect("clone stream"));
        Conn {
            stream: s,
            reader,
            next_id: 1000,
            events: VecDeque::new(),
        }
    }

    pub fn set_timeout(&mut self, t: Duration) {
        self.stream.set_read_timeout(Some(t)).expect("read timeout");
    }

    /// Write raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write to daemon");
    }

    /// Read one line: `Ok(None)` at EOF, `Err` on timeout or a reset.
    pub fn read_line_raw(&mut self) -> std::io::Result<Option<String>> {
        let mut line = String::new();
        match self.reader.read_line(&mut line)? {
            0 => Ok(None),
            _ => Ok(Some(line)),
        }
    }

    /// Read one message: `Ok(None)` at EOF.
    pub fn read_msg(&mut self) -> std::io::Result<Option<Value>> {
        Ok(self.read_line_raw()?.map(|l| {
            serde_json::from_str(&l).unwrap_or_else(|e| panic!("daemon sent non-JSON {l:?}: {e}"))
        }))
    }

    /// Read messages until EOF (or a reset/timeout): the messages and whether a clean EOF
    /// ended them.
    pub fn read_until_eof(&mut self) -> (Vec<Value>, bool) {
        let mut msgs = Vec::new();
        loop {
            match self.read_msg() {
                Ok(Some(m)) => msgs.push(m),
                Ok(None) => return (msgs, true),
                Err(e) if e.kind() == IoErrorKind::ConnectionReset => return (msgs, true),
                Err(_) => return (msgs, false),
            }
        }
    }

    /// Send a request and wait for the response with its id (events are queued). `Ok(None)`:
    /// the daemon closed the connection first.
    pub fn try_call(&mut self, method: &str, params: Value) -> std::io::Result<Option<Value>> {
        self.next_id += 1;
        let id = self.next_id;
        self.stream.write_all(&req_line(id, method, params))?;
        loop {
            let Some(msg) = self.read_msg()? else {
                return Ok(None);
            };
            if msg.get("method").and_then(Value::as_str) == Some("event") {
                self.events.push_back(msg["params"].clone());
                continue;
            }
            if msg.get("id") == Some(&Value::from(id)) {
                return Ok(Some(msg));
            }
            // A refusal of the whole connection (the connection cap) answers no request: it
            // is the answer to this one too.
            if msg.get("id") == Some(&Value::Null) && msg.get("error").is_some() {
                return Ok(Some(msg));
            }
            panic!("response to an unknown request while waiting for {id}: {msg}");
        }
    }

    /// The whole response to `method`.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.try_call(method, params.clone())
            .unwrap_or_else(|e| panic!("{method} {params}: {e}"))
            .unwrap_or_else(|| panic!("{method} {params}: the daemon closed the connection"))
    }

    /// The `result` of `method`; panics on an error response.
    pub fn ok(&mut self, method: &str, params: Value) -> Value {
        let r = self.call(method, params.clone());
        match r.get("result") {
            Some(v) => v.clone(),
            None => panic!("{method} {params} failed: {r}"),
        }
    }

    /// The `error` of `method`; panics on success.
    pub fn err(&mut self, method: &str, params: Value) -> Value {
        let r = self.call(method, params.clone());
        match r.get("error") {
            Some(v) => v.clone(),
            None => panic!("{method} {params} succeeded, expected an error: {r}"),
        }
    }

    /// The next event's params, waiting at most `timeout`.
    pub fn next_event(&mut self, timeout: Duration) -> Option<Value> {
        if let Some(ev) = self.events.pop_front() {
            return Some(ev);
        }
        if timeout.is_zero() {
            return None;
        }
        self.set_timeout(timeout);
        let got = self.read_msg();
        self.set_timeout(Duration::from_secs(10));
        match got {
            Ok(Some(msg)) if msg.get("method").and_then(Value::as_str) == Some("event") => {
                Some(msg["params"].clone())
            }
            Ok(Some(msg)) => panic!("unexpected message while waiting for an event: {msg}"),
            Ok(None) | Err(_) => None,
        }
    }
}

/// Run a python3 snippet (as [`NOBODY`] if `nobody`) with `args`; its stdout, stderr, code.
pub fn python(nobody: bool, script: &str, args: &[&str]) -> Out {
    let mut c = if nobody {
        let mut c = Command::new(SETPRIV_NOBODY[0]);
        c.args(&SETPRIV_NOBODY[1..]).arg(PYTHON);
        c
    } else {
        Command::new(PYTHON)
    };
    c.arg("-c").arg(script).args(args);
    run(c, b"")
}

/// Read the rest of `r` into a string, ignoring errors (for children's pipes).
pub fn read_all(mut r: impl Read) -> String {
    let mut s = String::new();
    let _ = r.read_to_string(&mut s);
    s
}
