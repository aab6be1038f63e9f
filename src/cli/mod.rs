//! The `holdfast` admin command line. One file per subcommand; this file holds the global
//! options, store selection, output and exit codes.

mod audit;
mod backend;
mod bench;
mod cred;
mod daemon;
mod db;
mod import;
mod init;
mod key;
mod migrate;
mod recovery;
mod runs;
mod status;
mod store;
mod stream;
mod units;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::crypto::KeySource;
use crate::error::ErrorKind;
use crate::paths;
use crate::store::{CredentialStore, OpenMode, StoreConfig, StoreOptions};

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  unexpected error, or `store fsck` found problems it did not repair
  2  usage error or invalid input (bad id, bad document)
  3  not found
  4  conflict (generation mismatch, id collision, key already exists)
  5  sealed: the store has data but no usable key (nothing was modified)
  6  integrity: a file is damaged, swapped, or stamped in the future (clock skew); or
     `audit verify` found the audit chain broken
  7  storage: an I/O error (nothing was changed, or writes are refused until reopened)
  8  busy: the store lock was held by another process for the whole timeout
  9  forbidden: unsafe permissions or ownership on a store directory or key file
  10 unsupported in this configuration

Environment:
  HOLDFAST_DATA_DIR   data directory (default $XDG_STATE_HOME/holdfast, ~/.local/state/holdfast)
  HOLDFAST_STORE      store name (default \"default\")
  CREDENTIALS_DIRECTORY  systemd credentials; holdfast-<store>.key there is used first
  HIVE_HOME, HIVE_CREDENTIAL_KEY  hive's store and key, used with --hive
  HOLDFAST_SOCKET     the daemon's socket (default $XDG_RUNTIME_DIR/holdfast/holdfast.sock)
  HOLDFAST_CONFIG     config file (default $XDG_CONFIG_HOME/holdfast/config.toml)
  RUST_LOG            log filter (e.g. holdfast=debug); logs never contain secrets
  STATE_DIRECTORY     data directory under systemd (StateDirectory=)
  LISTEN_FDS, LISTEN_PID  socket activation: `holdfast daemon` serves the one socket passed
                      (checked strictly; see docs/operations.md)
  NOTIFY_SOCKET, WATCHDOG_USEC  systemd readiness and watchdog (Type=notify, WatchdogSec=)

Commands that read or write credentials go through the daemon when one answers on the
socket (and serves the same data directory); otherwise they open the store directly, with
the same locks, and say \"(offline)\" on stderr. Either way each operation is recorded in the
data directory's audit log (`holdfast audit`); one that cannot be recorded is refused
(exit 7).";

/// holdfast: keeps the state AI-agent processes must not lose or leak.
#[derive(Parser, Debug)]
#[command(name = "holdfast", version, about, long_about = None, after_long_help = EXIT_CODES, after_help = "Run `holdfast --help` for exit codes and environment variables.")]
pub struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options that select the store and shape output; accepted before or after the subcommand.
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Data directory holding stores/<name>/.
    #[arg(long, global = true, env = "HOLDFAST_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Store name under the data directory.
    #[arg(
        long,
        global = true,
        env = "HOLDFAST_STORE",
        default_value = crate::paths::DEFAULT_STORE,
        value_name = "NAME"
    )]
    store: String,
    /// Open any hive-layout directory (holding credentials/ and metadata/) instead of a named
    /// store. Its key: --key-file or --key-env, else hive's HIVE_CREDENTIAL_KEY /
    /// $HIVE_HOME/secrets/credential_key.
    #[arg(long, global = true, value_name = "DIR", conflicts_with = "hive")]
    store_dir: Option<PathBuf>,
    /// Key file for --store-dir or --hive (0600; a .prev file beside it holds keys being retired).
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "key_env")]
    key_file: Option<PathBuf>,
    /// Environment variable holding the key for --store-dir or --hive (read-only: no rotation).
    #[arg(long, global = true, value_name = "VAR")]
    key_env: Option<String>,
    /// Open hive's own store: $HIVE_HOME/credentials (default ~/.hive/credentials).
    #[arg(long, global = true)]
    hive: bool,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,
    /// More log output on stderr (-v info, -vv debug). Secrets are never logged.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "human")]
    log_format: LogFormat,
    /// The daemon's socket (default $XDG_RUNTIME_DIR/holdfast/holdfast.sock, else
    /// /tmp/holdfast-$UID/holdfast.sock; the config file's `socket` if set).
    #[arg(long, global = true, env = "HOLDFAST_SOCKET", value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Config file (default $XDG_CONFIG_HOME/holdfast/config.toml, optional).
    #[arg(long, global = true, env = "HOLDFAST_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Do not talk to a running daemon: open the store directly (with the same locks).
    #[arg(long, global = true)]
    offline: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon: serve the stores over the Unix socket until SIGTERM/SIGINT.
    ///
    /// Serves every store under the data directory (stores created later are picked up on first
    /// use) and the config file's [stores.*], on --socket (default
    /// $XDG_RUNTIME_DIR/holdfast/holdfast.sock, else /tmp/holdfast-$UID/holdfast.sock; the
    /// socket is 0600 in a 0700 directory). One daemon per socket and per data directory: a
    /// second exits 1 with "already running (pid N)". SIGTERM/SIGINT: stop accepting, finish the
    /// requests in flight, flush, exit 0. The protocol is in docs/protocol.md; limits and
    /// plugin grants come from the config file (see --config). With --hive, hive's own store
    /// ($HIVE_HOME/credentials, key from --key-file/--key-env or hive's) is served too, as store
    /// "hive" (a store of yours that is too open is tightened, and the log says so). Logs go to
    /// stderr (info by default; --log-format json; RUST_LOG) and never contain secrets.
    Daemon(daemon::DaemonArgs),
    /// Show the daemon's state (or, with no daemon, the store's).
    Status,
    /// Create a store and its key. Only for an empty store: holdfast never mints a key while
    /// encrypted data exists. Running it again on an initialized store changes nothing.
    Init(init::InitArgs),
    /// Bring hive's credential store to holdfast: serve it in place (a [stores.NAME] entry in
    /// the config file; hive keeps using the same files) or --copy it into a holdfast store.
    Import(import::ImportArgs),
    /// Credentials: set, get, list, delete, exists.
    #[command(subcommand)]
    Cred(cred::CredCommand),
    /// Store maintenance.
    #[command(subcommand)]
    Store(store::StoreCommand),
    /// The store's keys: which it has and which files each opens (no subcommand), rotate,
    /// prune the archive of retired keys.
    Key(key::KeyArgs),
    /// The audit log: who did what to which credential, when, with what result (never a
    /// value). `holdfast audit` lists records (--since, --id, --op, --last; --json);
    /// `holdfast audit verify` checks the hash chain (exit 6 naming each break).
    Audit(audit::AuditArgs),
    /// Measure this machine (runs holdfast-bench, built beside this binary; `holdfast bench
    /// --help` for its options): credentials through a real daemon against the floors, or
    /// --streams (against SQLite and Redis) or --runs.
    Bench(bench::BenchArgs),
    /// The stream recovery planner: what holdfast would do with an interrupted stream.
    #[command(subcommand)]
    Recovery(recovery::RecoveryCommand),
    /// The daemon's streams: list, show one, follow one live.
    #[command(subcommand)]
    Stream(stream::StreamCommand),
    /// Run logs (node completions, steps, tool calls, summaries): list, show one, its summary,
    /// prune old runs. Read from the files with the same locks, daemon or not.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// The PostgreSQL backend's schema: status, migrate (`[backend] kind = "postgres"`).
    #[command(subcommand)]
    Db(db::DbCommand),
    /// Move this data directory's streams, checkpoints and run logs to the [backend] database
    /// (--to postgres) or back (--to file), then read the copy back and compare it with the
    /// source. The target must be empty and no daemon running; credentials stay on files.
    Migrate(migrate::MigrateArgs),
    /// Write the systemd units (socket activation, Type=notify, watchdog, hardening) with
    /// ExecStart= pointing at this binary: user units by default, --system for a dedicated
    /// service user. Prints the systemctl command to run next.
    InstallUnits(units::InstallUnitsArgs),
}

/// How long ago `ms` (since the epoch) was, for tables: `42s`, `17m`, `5h`, `3d`; `-` if unknown.
fn age(ms: Option<u64>) -> String {
    let Some(ms) = ms else {
        return "-".into();
    };
    match crate::timefmt::now_ms().saturating_sub(ms) / 1000 {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// An error on its way to the user: message plus exit code.
#[derive(Debug)]
pub struct CliError {
    message: String,
    code: u8,
}

impl CliError {
    fn usage(message: impl std::fmt::Display) -> Self {
        CliError {
            message: message.to_string(),
            code: ErrorKind::InvalidParams.exit_code(),
        }
    }

    fn with_code(message: impl std::fmt::Display, code: u8) -> Self {
        CliError {
            message: message.to_string(),
            code,
        }
    }
}

impl From<crate::store::Error> for CliError {
    fn from(e: crate::store::Error) -> Self {
        CliError {
            message: e.to_string(),
            code: e.kind().exit_code(),
        }
    }
}

type CliResult<T = ()> = Result<T, CliError>;

impl Global {
    /// The store this invocation addresses.
    fn store_config(&self) -> CliResult<StoreConfig> {
        let explicit_key = match (&self.key_file, &self.key_env) {
            (Some(f), _) => Some(KeySource::File(f.clone())),
            (None, Some(v)) => Some(KeySource::Env(v.clone())),
            (None, None) => None,
        };
        let foreign_dir = if self.hive {
            Some(paths::hive_store_dir().map_err(CliError::usage)?)
        } else {
            self.store_dir.clone()
        };
        if let Some(base) = foreign_dir {
            let sources = match explicit_key {
                Some(k) => vec![k],
                None => paths::hive_key_sources().map_err(CliError::usage)?,
            };
            let name = base.display().to_string();
            return Ok(StoreConfig {
                name,
                base,
                key_sources: sources,
                key_dir: None,
            });
        }
        if explicit_key.is_some() {
            return Err(CliError::usage(
                "--key-file and --key-env go with --store-dir or --hive; a named store keeps its own \
                 key in $XDG_CONFIG_HOME/holdfast/keys/<store>.<store id>.key",
            ));
        }
        paths::validate_store_name(&self.store).map_err(CliError::usage)?;
        // A `[stores.NAME]` entry names the store's directory and key for the CLI as for the
        // daemon: a credential written offline is the one the daemon serves.
        if let Some(entry) = self.config()?.stores.get(&self.store) {
            return crate::service::configured_store(&self.store, entry).map_err(CliError::usage);
        }
        let data = self.data_dir()?;
        Ok(StoreConfig::owned(
            &self.store,
            data.join("stores").join(&self.store),
            paths::keys_dir().map_err(CliError::usage)?,
            paths::systemd_key_sources(&self.store),
        ))
    }

    /// The config file (defaults if there is none).
    fn config(&self) -> CliResult<crate::config::Config> {
        crate::config::load(self.config.as_deref()).map_err(CliError::usage)
    }

    /// The data directory: flag or env, then the config file, then the XDG default.
    fn data_dir(&self) -> CliResult<PathBuf> {
        if let Some(d) = &self.data_dir {
            return Ok(d.clone());
        }
        if let Some(d) = self.config()?.data_dir {
            return Ok(d);
        }
        paths::default_data_dir().map_err(CliError::usage)
    }

    /// The socket: flag or env, then the config file, then the default.
    fn socket_path(&self) -> CliResult<PathBuf> {
        if let Some(s) = &self.socket {
            return Ok(s.clone());
        }
        Ok(self.config()?.socket.unwrap_or_else(paths::default_socket))
    }

    /// A connection to a daemon serving this invocation's store, or `None` (with the reason
    /// printed as "(offline) …" on stderr) when the store must be opened directly.
    fn daemon(&self) -> CliResult<Option<crate::client::Client>> {
        let why = if self.offline {
            Some("--offline given".to_string())
        } else if self.store_dir.is_some() || self.hive {
            Some("--store-dir/--hive open a directory directly".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            offline_note(&why);
            return Ok(None);
        }
        let socket = self.socket_path()?;
        let client = match crate::client::Client::connect(&socket, "holdfast-cli", None) {
            Ok(c) => c,
            // Nothing there (no socket, or a stale one), or a socket this user may not use
            // (another user's): work on the store directly.
            Err(crate::client::ClientError::Connect { source, .. })
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                offline_note(&format!("no daemon answers on {}", socket.display()));
                return Ok(None);
            }
            Err(crate::client::ClientError::Connect { source, .. })
                if source.raw_os_error() == Some(rustix::io::Errno::ACCESS.raw_os_error()) =>
            {
                offline_note(&format!(
                    "no daemon answers on {} for this user (permission denied: it is not yours)",
                    socket.display()
                ));
                return Ok(None);
            }
            // Something answered and said no (busy, a plugin required, another uid, another
            // protocol): say so rather than quietly going around the daemon.
            Err(e) => {
                return Err(CliError {
                    message: format!(
                        "the daemon on {} refused this client: {e} (use --offline to open the store directly)",
                        socket.display()
                    ),
                    code: e.kind().exit_code(),
                })
            }
        };
        let ours = self.data_dir()?;
        let theirs = client
            .hello
            .get("data_dir")
            .and_then(serde_json::Value::as_str);
        // One directory however it is named (a symlink to the daemon's data dir is its).
        let canon = |p: &std::path::Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        if theirs.map(|t| canon(std::path::Path::new(t))) != Some(canon(&ours)) {
            offline_note(&format!(
                "the daemon on {} serves data dir {}, not {}",
                socket.display(),
                theirs.unwrap_or("?"),
                ours.display()
            ));
            return Ok(None);
        }
        let mut client = client;
        self.same_store_as(&mut client, &socket)?;
        Ok(Some(client))
    }

    /// A store `[stores.NAME]` names in config.toml must be the directory the daemon serves
    /// under that name: the config read at the daemon's start may since have been edited, and
    /// then a credential acknowledged through the daemon would not be where this config (and
    /// an offline command) looks. Refused with what to do, not worked around.
    fn same_store_as(
        &self,
        client: &mut crate::client::Client,
        socket: &std::path::Path,
    ) -> CliResult {
        let Some(entry) = self.config()?.stores.get(&self.store).cloned() else {
            return Ok(());
        };
        let status = client.call("admin.status", serde_json::json!({}))?;
        let theirs = status["stores"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["name"] == self.store.as_str()))
            .and_then(|s| s["path"].as_str())
            .map(PathBuf::from);
        let canon = |p: &std::path::Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        if theirs.as_deref().map(canon) == Some(canon(&entry.path)) {
            return Ok(());
        }
        Err(CliError::with_code(
            format!(
                "config.toml says store {:?} is {}, but the daemon on {} serves {}: the config \
                 changed since the daemon started. Restart the daemon to apply it (systemctl \
                 --user restart holdfast), or use --offline to work on {} directly.",
                self.store,
                entry.path.display(),
                socket.display(),
                theirs.map_or_else(
                    || "no store of that name".to_string(),
                    |p| p.display().to_string()
                ),
                entry.path.display()
            ),
            crate::error::ErrorKind::Conflict.exit_code(),
        ))
    }

    fn open(&self, mode: OpenMode) -> CliResult<CredentialStore> {
        open_store(self.store_config()?, mode, true)
    }
}

/// Open the store at `config` in `mode`, saying on stderr what permissions were tightened (or,
/// with `fix_permissions` false, would be), and refusing a sealed store.
fn open_store(
    config: StoreConfig,
    mode: OpenMode,
    fix_permissions: bool,
) -> CliResult<CredentialStore> {
    let store = CredentialStore::open(
        config,
        StoreOptions {
            mode,
            fix_permissions,
            ..StoreOptions::default()
        },
    )?;
    permission_note(store.permission_fixes());
    adoption_note(&store);
    if let Some(reason) = store.sealed_reason() {
        return Err(crate::store::Error::Sealed {
            store: store.config().name.clone(),
            reason,
        }
        .into());
    }
    Ok(store)
}

fn init_logging(g: &Global, daemon: bool) {
    use tracing_subscriber::EnvFilter;
    let default = match (g.verbose, daemon) {
        (0, false) => "holdfast=warn",
        (0, true) | (1, _) => "holdfast=info",
        _ => "holdfast=debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // The log is operational and best effort (docs/security.md, item 34): a line that cannot
    // be written (a full disk, a journald that went away: EPIPE) is dropped. By default
    // tracing-subscriber reports such a failure with `eprintln!` — to the same stderr, which
    // panics — and the daemon died on its next log line.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    let _ = match g.log_format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Say on stderr which permissions opening a store tightened (nothing if none).
fn permission_note(fixes: &crate::store::PermFixes) {
    if !fixes.is_empty() {
        let _ = writeln!(std::io::stderr(), "holdfast: note: {fixes}");
    }
}

/// Say on stderr that opening the store gave it its own copy of a key file older holdfast
/// versions shared between data dirs (nothing if it did not).
fn adoption_note(store: &CredentialStore) {
    if let Some(notice) = store.key_notice() {
        let _ = writeln!(std::io::stderr(), "holdfast: note: {notice}");
    }
}

/// Say on stderr that this command works on the store directly, not through a daemon.
fn offline_note(why: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "holdfast: (offline) {why}; using the store directly"
    );
}

impl From<crate::client::ClientError> for CliError {
    fn from(e: crate::client::ClientError) -> Self {
        CliError {
            message: e.to_string(),
            code: e.kind().exit_code(),
        }
    }
}

/// Text from a store or a log as a table cell or a line shows it: control characters (a
/// newline that would forge a row, an escape sequence for the terminal) and bidirectional
/// controls written as `\u{…}`. Never for secret values, which are printed as they are.
pub(crate) fn shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}') {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// Print a line to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn out(line: impl std::fmt::Display) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

fn out_json(v: &serde_json::Value) {
    out(serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Print JSON that holds secret values: serialized into a zeroizing buffer, and every string
/// in `v` zeroized afterwards.
fn out_secret_json(mut v: serde_json::Value) {
    let mut buf = zeroize::Zeroizing::new(Vec::new());
    if serde_json::to_writer_pretty(&mut *buf, &v).is_ok() {
        buf.push(b'\n');
        let _ = std::io::stdout().lock().write_all(&buf);
    }
    crate::store::credential::zeroize_json(&mut v);
}

/// Parse arguments, run the command, and turn the outcome into an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.global, matches!(cli.command, Command::Daemon(_)));
    let g = &cli.global;
    let result = match &cli.command {
        Command::Daemon(a) => daemon::run(g, a),
        Command::Status => status::run(g),
        Command::Init(a) => init::run(g, a),
        Command::Import(a) => import::run(g, a),
        Command::Cred(c) => cred::run(g, c),
        Command::Store(c) => store::run(g, c),
        Command::Key(c) => key::run(g, c),
        Command::Audit(a) => audit::run(g, a),
        Command::Bench(a) => bench::run(g, a),
        Command::Recovery(c) => recovery::run(g, c),
        Command::Stream(c) => stream::run(g, c),
        Command::Runs(c) => runs::run(g, c),
        Command::Db(c) => db::run(g, c),
        Command::Migrate(a) => migrate::run(g, a),
        Command::InstallUnits(a) => units::run(g, a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "holdfast: error: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

#[cfg(test)]
mod shown_tests {
    #[test]
    fn control_and_bidi_characters_are_written_out_and_the_rest_kept() {
        assert_eq!(super::shown("a\nb"), "a\\u{a}b");
        assert_eq!(super::shown("\u{1b}[31mred"), "\\u{1b}[31mred");
        assert_eq!(super::shown("x\u{202E}y\u{2066}z"), "x\\u{202e}y\\u{2066}z");
        assert_eq!(super::shown("café → ok"), "café → ok");
    }
}
