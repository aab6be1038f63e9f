//! The optional config file, `$XDG_CONFIG_HOME/holdfast/config.toml`. Defaults work with none.
//!
//! ```toml
//! socket = "/run/user/1000/holdfast/holdfast.sock"   # else $XDG_RUNTIME_DIR/holdfast/holdfast.sock
//! data_dir = "~/.local/state/holdfast"
//! allow_root = true            # root peers may connect to a non-root daemon (ssh-agent's policy)
//! require_plugin = false       # true: every connection must name a plugin in `hello`
//! idle_exit_minutes = 0        # socket-activated only: exit after this long with no client and
//!                              # no active stream (systemd starts it again on the next connect)
//!
//! [limits]                     # each optional; see limits.rs for the defaults and why
//! max_frame_bytes = 1048576
//! max_connections = 1024
//! idle_timeout_ms = 120000
//! read_timeout_ms = 10000
//! max_output_queue_bytes = 8388608
//! max_output_total_bytes = 268435456
//!
//! [stores.hive]                # served as store "hive" beside the data dir's stores
//! path = "~/.hive/credentials"
//! hive = true                  # key from HIVE_CREDENTIAL_KEY / $HIVE_HOME/secrets/credential_key
//! # key_file = "..."  or  key_env = "VAR"
//!
//! [streams]
//! durability = "always"        # "batch" (+ batch_interval_ms) or "none"; see docs/operations.md
//! stale_after_secs = 3600      # resume: older checkpoints are stale (R4, or fail)
//! expire_after_secs = 604800   # runs with no event for this long end as "expired"
//! orphan_timeout_s = 300       # a run no producer holds this long ends as "abandoned"
//! memory_events = 1024         # an active run's latest events kept in memory (files)
//! [streams.retry]              # the planner's policy (docs/recovery.md)
//! transient_budget = 2
//!
//! [runs]
//! retention_days = 30          # run logs idle this long are deleted (0: keep forever)
//!
//! [audit]                     # the audit log, <data_dir>/audit/ (docs/operations.md "The audit log")
//! enabled = true               # false: record nothing (and refuse nothing for it)
//! durability = "batch"         # "always": every answer waits for its record's fdatasync
//! sync_interval_ms = 10        # "batch": records reach the disk within this (crash-safe at once)
//! on_failure = "refuse"        # "serve-reads": serve reads whose record cannot be written
//! segment_bytes = 8388608     # a segment is closed at this size (8 MiB)
//! max_bytes = 268435456        # the oldest segments are dropped past this total (256 MiB)
//! retention_days = 0           # and once older than this (0: by size only)
//! reserve_bytes = 1048576      # space kept back for the records of a full disk (1 MiB)
//!
//! [backend]                   # where streams, checkpoints and run logs live (docs/operations.md)
//! kind = "file"                # or "postgres", with:
//! # url = "postgresql://holdfast@db.internal/holdfast?sslmode=require"
//! # password_file = "pg"        # never the password itself: a file, or $CREDENTIALS_DIRECTORY/pg
//!
//! [plugins.summarizer]         # `hello {plugin: "summarizer"}` binds a connection to this grant
//! stores = ["default"]
//! methods = ["cred.get", "cred.list", "cred.watch"]   # or "cred.*", "*"
//! runs = ["summarizer-*"]      # stream.*, checkpoint.*, run.*: these run ids only (absent: all)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::limits;

/// The parsed config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Socket path.
    pub socket: Option<PathBuf>,
    /// Data directory.
    pub data_dir: Option<PathBuf>,
    /// Whether root peers may connect to a non-root daemon (default true).
    pub allow_root: Option<bool>,
    /// Whether every connection must bind to a plugin.
    #[serde(default)]
    pub require_plugin: bool,
    /// Under socket activation: exit after this many minutes (fractions allowed) with no
    /// client connected, no request, and no active stream. 0 or absent: never.
    pub idle_exit_minutes: Option<f64>,
    /// Limit overrides.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Extra stores, by name.
    #[serde(default)]
    pub stores: BTreeMap<String, StoreEntry>,
    /// Plugin grants, by plugin name.
    #[serde(default)]
    pub plugins: BTreeMap<String, PluginGrant>,
    /// Streams settings.
    #[serde(default)]
    pub streams: StreamsSection,
    /// Run-log settings.
    #[serde(default)]
    pub runs: RunsSection,
    /// Where streams, checkpoints and run logs are kept: files (default) or PostgreSQL.
    #[serde(default)]
    pub backend: BackendSection,
    /// The audit log.
    #[serde(default)]
    pub audit: AuditSection,
}

/// `[audit]`: see [`crate::audit::Settings`] for what each means and its default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    /// Keep an audit log (default true).
    pub enabled: Option<bool>,
    /// `batch` (default) or `always`.
    pub durability: Option<String>,
    /// The sync interval of `batch`, in ms (default 10).
    pub sync_interval_ms: Option<u64>,
    /// `refuse` (default) or `serve-reads`.
    pub on_failure: Option<String>,
    /// Segment size in bytes (default 8 MiB).
    pub segment_bytes: Option<u64>,
    /// Total size kept in bytes (default 256 MiB).
    pub max_bytes: Option<u64>,
    /// Days closed segments are kept at most (default 0: by size only).
    pub retention_days: Option<u64>,
    /// Space reserve in bytes (default 1 MiB; 0: none).
    pub reserve_bytes: Option<u64>,
}

impl Config {
    /// The audit log's settings: the defaults with what `[audit]` says.
    pub fn audit_settings(&self) -> crate::audit::Settings {
        use crate::audit::{Durability, OnFailure, Settings};
        let a = &self.audit;
        let d = Settings::default();
        let interval = a
            .sync_interval_ms
            .map_or(crate::audit::DEFAULT_SYNC_INTERVAL, Duration::from_millis);
        Settings {
            enabled: a.enabled.unwrap_or(d.enabled),
            durability: match a.durability.as_deref() {
                Some("always") => Durability::Always,
                _ => Durability::Batch(interval),
            },
            on_failure: match a.on_failure.as_deref() {
                Some("serve-reads") => OnFailure::ServeReads,
                _ => OnFailure::Refuse,
            },
            segment_bytes: a.segment_bytes.unwrap_or(d.segment_bytes),
            max_bytes: a.max_bytes.unwrap_or(d.max_bytes),
            retention: match a.retention_days {
                None | Some(0) => None,
                Some(days) => Some(Duration::from_secs(days * 86_400)),
            },
            reserve_bytes: a.reserve_bytes.unwrap_or(d.reserve_bytes),
        }
    }
}

pub use crate::pg::BackendSection;

/// `[runs]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunsSection {
    /// Days without activity after which a run's directory is deleted; 0 keeps runs forever.
    pub retention_days: Option<u64>,
}

pub use crate::limits::DEFAULT_RETENTION_DAYS;

impl Config {
    /// How long a run's directory lives after its last activity (`None`: forever).
    pub fn run_retention(&self) -> Option<Duration> {
        match self.runs.retention_days.unwrap_or(DEFAULT_RETENTION_DAYS) {
            0 => None,
            d => Some(Duration::from_secs(d * 86_400)),
        }
    }
}

/// `[streams]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamsSection {
    /// `always` (default: an append is acknowledged after the fsync that covers it), `batch`
    /// (after the write; an fsync every `batch_interval_ms`: a crash loses at most that much
    /// acknowledged data), `none` (never synced: tests and benchmarks only).
    pub durability: Option<String>,
    /// The fsync interval of `durability = "batch"` (default 10 ms).
    pub batch_interval_ms: Option<u64>,
    /// A checkpoint whose last event is older than this is stale on resume (default 3600).
    pub stale_after_secs: Option<u64>,
    /// A run with no event for this long is ended as `expired` (default 7 days): failed and
    /// abandoned runs are kept for inspection until then.
    pub expire_after_secs: Option<u64>,
    /// A run whose producer's connection closed without a commit or abort (or that no
    /// producer spoke for since the daemon started) ends as `abandoned` after this many
    /// seconds, unless a producer resumes it (default 300).
    pub orphan_timeout_s: Option<u64>,
    /// How many of an active run's latest published events memory keeps (default 1024);
    /// older ones are derived from the journal when a subscriber asks for them.
    pub memory_events: Option<usize>,
    /// The recovery planner's retry policy (budgets, backoff; docs/recovery.md "Policy").
    #[serde(default)]
    pub retry: Option<crate::recovery::Policy>,
}

/// `[limits]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest request line.
    pub max_frame_bytes: Option<usize>,
    /// Connections at once.
    pub max_connections: Option<usize>,
    /// Idle timeout.
    pub idle_timeout_ms: Option<u64>,
    /// Read timeout within a line.
    pub read_timeout_ms: Option<u64>,
    /// Output queue cap per connection.
    pub max_output_queue_bytes: Option<usize>,
    /// `max_output_total_bytes`: output queued across every connection.
    pub max_output_total_bytes: Option<usize>,
}

/// `[stores.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreEntry {
    /// Base directory (holding credentials/ and metadata/).
    pub path: PathBuf,
    /// Key file.
    pub key_file: Option<PathBuf>,
    /// Key environment variable.
    pub key_env: Option<String>,
    /// Use hive's key sources.
    #[serde(default)]
    pub hive: bool,
}

/// `[plugins.NAME]`.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PluginGrant {
    /// Stores it may touch (`"*"`: all).
    pub stores: Vec<String>,
    /// Methods it may call: exact names, `family.*`, or `*`.
    pub methods: Vec<String>,
    /// Runs its `stream.*`, `checkpoint.*` and `run.*` calls may name, and the only runs their
    /// listings show: exact run ids, `prefix*` (the prefix followed by anything, nothing
    /// included), or `*`. `None` (the key absent): every run; `[]`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<Vec<String>>,
    /// The plugin's name, set when a connection binds the grant ([`PluginGrant::bound_as`]);
    /// `None` for a connection that named no plugin. Never read from the file.
    #[serde(skip)]
    pub plugin: Option<String>,
}

impl PluginGrant {
    /// Everything (a connection bound to no plugin).
    pub fn all() -> Self {
        PluginGrant {
            stores: vec!["*".into()],
            methods: vec!["*".into()],
            runs: None,
            plugin: None,
        }
    }

    /// This grant as bound by a connection that named plugin `name` (for refusals to say
    /// whose grant refused).
    pub fn bound_as(&self, name: &str) -> Self {
        PluginGrant {
            plugin: Some(name.to_owned()),
            ..self.clone()
        }
    }

    /// Whether the grant names every run (no `runs` key, or a `*` pattern): run ids need no
    /// check and listings no filter.
    pub fn covers_every_run(&self) -> bool {
        self.runs
            .as_ref()
            .is_none_or(|ps| ps.iter().any(|p| p == "*"))
    }

    /// Whether `run_id` matches one of the grant's run patterns. Patterns are checked when the
    /// config is loaded ([`Config::validate`]); a `*` counts only as the last character, so a
    /// pattern never matches more than the operator wrote.
    pub fn allows_run(&self, run_id: &str) -> bool {
        let Some(patterns) = &self.runs else {
            return true;
        };
        patterns.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => run_id.starts_with(prefix),
            None => p == run_id,
        })
    }

    /// The run patterns as `hello` reports them: `["*"]` for every run.
    pub fn run_patterns(&self) -> Vec<&str> {
        match &self.runs {
            None => vec!["*"],
            Some(ps) => ps.iter().map(String::as_str).collect(),
        }
    }

    /// Whether `method` is granted.
    pub fn allows_method(&self, method: &str) -> bool {
        self.methods.iter().any(|m| {
            m == "*"
                || m == method
                || m.strip_suffix(".*")
                    .is_some_and(|fam| method.split_once('.').is_some_and(|(f, _)| f == fam))
        })
    }

    /// Whether `store` is granted.
    pub fn allows_store(&self, store: &str) -> bool {
        self.stores.iter().any(|s| s == "*" || s == store)
    }
}

/// Runtime limits: the defaults of `limits.rs` with the config's overrides.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request line.
    pub max_frame: usize,
    /// Connections at once.
    pub max_connections: usize,
    /// Requests in flight per connection.
    pub max_inflight: usize,
    /// Output queue cap per connection.
    pub max_output: usize,
    /// Output held across every connection.
    pub max_output_total: usize,
    /// Idle timeout.
    pub idle: Duration,
    /// Read timeout within a line.
    pub read: Duration,
}

impl Config {
    /// Runtime limits.
    pub fn limits(&self) -> Limits {
        let l = &self.limits;
        Limits {
            max_frame: l.max_frame_bytes.unwrap_or(limits::MAX_FRAME_BYTES),
            max_connections: l.max_connections.unwrap_or(limits::MAX_CONNECTIONS),
            max_inflight: limits::MAX_INFLIGHT_PER_CONNECTION,
            max_output: l
                .max_output_queue_bytes
                .unwrap_or(limits::MAX_OUTPUT_QUEUE_BYTES),
            max_output_total: l
                .max_output_total_bytes
                .unwrap_or(limits::MAX_OUTPUT_TOTAL_BYTES),
            idle: l
                .idle_timeout_ms
                .map_or(limits::IDLE_TIMEOUT, Duration::from_millis),
            read: l
                .read_timeout_ms
                .map_or(limits::READ_TIMEOUT, Duration::from_millis),
        }
    }

    /// Whether root peers may connect.
    pub fn allow_root(&self) -> bool {
        self.allow_root.unwrap_or(true)
    }
}

/// Expand a leading `~/` with `$HOME`.
pub fn expand_home(p: &Path) -> PathBuf {
    match (p.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => p.to_path_buf(),
    }
}

/// The default config path.
pub fn default_path() -> Option<PathBuf> {
    crate::paths::config_dir()
        .ok()
        .map(|d| d.join("config.toml"))
}

/// The largest config file read: far above any real one, and a bound on what a mistaken path
/// (a log file, a device) costs.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The text of the config file at `path` (a symlink to it is followed: dotfile managers link
/// configs). Opened without blocking; a FIFO or socket is refused (it must not hang the
/// daemon's start), a device is read up to the limit (`--config /dev/null` is an empty
/// config), a regular file only if it is at most [`MAX_CONFIG_BYTES`].
fn read_config_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if kind.is_fifo() || kind.is_socket() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a FIFO or socket, not a file",
        ));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} bytes, larger than the {MAX_CONFIG_BYTES}-byte limit",
                meta.len()
            ),
        ));
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text)?;
    Ok(text)
}

/// Load the config: `explicit` must exist; the default path may be absent (defaults apply).
pub fn load(explicit: Option<&Path>) -> Result<Config, String> {
    let (path, required) = match explicit {
        Some(p) => (p.to_path_buf(), true),
        None => match default_path() {
            Some(p) => (p, false),
            None => return Ok(Config::default()),
        },
    };
    let text = match read_config_file(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
            return Ok(Config::default())
        }
        Err(e) => return Err(format!("cannot read config {}: {e}", path.display())),
    };
    let mut config: Config =
        toml::from_str(&text).map_err(|e| format!("config {}: {e}", path.display()))?;
    config.socket = config.socket.as_deref().map(expand_home);
    config.data_dir = config.data_dir.as_deref().map(expand_home);
    for s in config.stores.values_mut() {
        s.path = expand_home(&s.path);
        s.key_file = s.key_file.as_deref().map(expand_home);
    }
    for name in config.stores.keys() {
        crate::paths::validate_store_name(name).map_err(|e| format!("[stores.{name}]: {e}"))?;
    }
    config
        .validate()
        .map_err(|e| format!("config {}: {e}", path.display()))?;
    Ok(config)
}

/// `[section] name = v` must lie in `lo..=hi` (when set).
fn in_range(section: &str, name: &str, v: Option<u64>, lo: u64, hi: u64) -> Result<(), String> {
    match v {
        Some(v) if v < lo || v > hi => {
            Err(format!("[{section}] {name} = {v} is outside {lo}..={hi}"))
        }
        _ => Ok(()),
    }
}

impl Config {
    /// The PostgreSQL backend's settings when `[backend] kind = "postgres"`, else `None`
    /// (files). Reads the password file: called where the connection is used (the daemon's
    /// start, `holdfast db`), not by every command.
    pub fn postgres(&self) -> Result<Option<crate::pg::PgSettings>, crate::pg::DbError> {
        match self.backend.kind.as_deref() {
            Some("postgres") => crate::pg::PgSettings::from_section(&self.backend).map(Some),
            _ => Ok(None),
        }
    }

    /// The streams' settings, with defaults for what the file does not say.
    pub fn streams_config(&self) -> crate::streams::StreamsConfig {
        use crate::durable::journal::Durability;
        let st = &self.streams;
        let durability = match st.durability.as_deref() {
            Some("batch") => {
                Durability::Batch(Duration::from_millis(st.batch_interval_ms.unwrap_or(10)))
            }
            Some("none") => Durability::None,
            _ => Durability::Always,
        };
        let mut c = crate::streams::StreamsConfig {
            durability,
            ..crate::streams::StreamsConfig::default()
        };
        if let Some(s) = st.stale_after_secs {
            c.stale_after = Duration::from_secs(s);
        }
        if let Some(s) = st.expire_after_secs {
            c.expire_after = Duration::from_secs(s);
        }
        if let Some(s) = st.orphan_timeout_s {
            c.orphan_timeout = Duration::from_secs(s);
        }
        if let Some(p) = &st.retry {
            c.policy = p.clone();
        }
        if let Some(n) = st.memory_events {
            c.memory_events = n;
        }
        c
    }

    /// Refuse values that would break the daemon rather than tune it (a zero timeout spins, a
    /// huge cap overflows), and plugin grants that name methods or stores that cannot exist (a
    /// typo would silently grant nothing).
    pub fn validate(&self) -> Result<(), String> {
        // The connection itself is checked where it is used (`pg::settings`: the daemon's
        // start, `holdfast db`); here only what the section can be.
        match self.backend.kind.as_deref() {
            None | Some("file") | Some("postgres") => {}
            Some(other) => {
                return Err(format!(
                    "[backend] kind = {other:?}: expected \"file\" or \"postgres\""
                ))
            }
        }
        let l = &self.limits;
        let range = |name: &str, v, lo, hi| in_range("limits", name, v, lo, hi);
        range(
            "max_frame_bytes",
            l.max_frame_bytes.map(|v| v as u64),
            1024,
            64 << 20,
        )?;
        range(
            "max_connections",
            l.max_connections.map(|v| v as u64),
            1,
            65_536,
        )?;
        range("idle_timeout_ms", l.idle_timeout_ms, 100, 86_400_000)?;
        range("read_timeout_ms", l.read_timeout_ms, 100, 3_600_000)?;
        range(
            "max_output_queue_bytes",
            l.max_output_queue_bytes.map(|v| v as u64),
            64 << 10,
            1 << 30,
        )?;
        range(
            "max_output_total_bytes",
            l.max_output_total_bytes.map(|v| v as u64),
            1 << 20,
            16 << 30,
        )?;
        let st = &self.streams;
        match st.durability.as_deref() {
            None | Some("always" | "batch" | "none") => {}
            Some(other) => {
                return Err(format!(
                    "[streams] durability = {other:?}: one of \"always\", \"batch\", \"none\""
                ))
            }
        }
        let srange = |name: &str, v, lo, hi| in_range("streams", name, v, lo, hi);
        srange("batch_interval_ms", st.batch_interval_ms, 1, 60_000)?;
        srange("stale_after_secs", st.stale_after_secs, 1, 365 * 86_400)?;
        srange("expire_after_secs", st.expire_after_secs, 60, 3650 * 86_400)?;
        srange("orphan_timeout_s", st.orphan_timeout_s, 1, 30 * 86_400)?;
        srange(
            "memory_events",
            st.memory_events.map(|n| n as u64),
            1,
            10_000_000,
        )?;
        in_range(
            "runs",
            "retention_days",
            self.runs.retention_days,
            0,
            36_500,
        )?;
        let a = &self.audit;
        match a.durability.as_deref() {
            None | Some("always" | "batch") => {}
            Some(other) => {
                return Err(format!(
                    "[audit] durability = {other:?}: \"always\" or \"batch\""
                ))
            }
        }
        match a.on_failure.as_deref() {
            None | Some("refuse" | "serve-reads") => {}
            Some(other) => {
                return Err(format!(
                    "[audit] on_failure = {other:?}: \"refuse\" or \"serve-reads\""
                ))
            }
        }
        let arange = |name: &str, v, lo, hi| in_range("audit", name, v, lo, hi);
        arange("sync_interval_ms", a.sync_interval_ms, 1, 10_000)?;
        arange("segment_bytes", a.segment_bytes, 4096, 1 << 30)?;
        arange("max_bytes", a.max_bytes, 8192, 1 << 40)?;
        arange("retention_days", a.retention_days, 0, 36_500)?;
        arange("reserve_bytes", a.reserve_bytes, 0, 1 << 30)?;
        let s = self.audit_settings();
        if s.max_bytes < 2 * s.segment_bytes {
            return Err(format!(
                "[audit] max_bytes must be at least twice segment_bytes (the active segment and one closed one): {} < 2 x {}",
                s.max_bytes,
                s.segment_bytes
            ));
        }
        if self
            .idle_exit_minutes
            .is_some_and(|m| !(m.is_finite() && (0.0..=10_080.0).contains(&m)))
        {
            return Err(
                "idle_exit_minutes is a number of minutes from 0 (off) to 10080 (a week)".into(),
            );
        }
        for (name, grant) in &self.plugins {
            for m in &grant.methods {
                let known = m == "*"
                    || crate::api::METHODS.contains(&m.as_str())
                    || m.strip_suffix(".*").is_some_and(|fam| {
                        crate::api::METHODS
                            .iter()
                            .any(|k| k.split_once('.').is_some_and(|(f, _)| f == fam))
                    });
                if !known {
                    return Err(format!(
                        "[plugins.{name}] methods: {m:?} is not a method (see docs/protocol.md), a family like \"cred.*\", or \"*\""
                    ));
                }
            }
            for st in &grant.stores {
                if st != "*" {
                    crate::paths::validate_store_name(st)
                        .map_err(|e| format!("[plugins.{name}] stores: {st:?}: {e}"))?;
                }
            }
            for p in grant.runs.iter().flatten() {
                check_run_pattern(p).map_err(|e| format!("[plugins.{name}] runs: {p:?} {e}"))?;
            }
        }
        Ok(())
    }
}

/// A `runs` pattern must be able to match some valid run id (1–128 bytes of `A-Z a-z 0-9 - _
/// . :`, not starting with a dot), else it grants nothing and is a typo: `*`; an exact run id;
/// or `prefix*`, whose prefix is a run id's start. A `*` anywhere but at the end is refused
/// rather than read literally (no run id holds one) or as a glob (the grant would match more
/// than a reader of the config expects).
fn check_run_pattern(p: &str) -> Result<(), String> {
    let run_id = format!(
        "run ids are 1-{} characters of A-Z a-z 0-9 - _ . : not starting with a dot",
        limits::MAX_RUN_ID_BYTES
    );
    if p == "*" {
        return Ok(());
    }
    let prefix = p.strip_suffix('*');
    if prefix.unwrap_or(p).contains('*') {
        return Err("has a `*` before its end: write an exact run id, \"prefix*\" or \"*\"".into());
    }
    match prefix {
        // The prefix is itself a run id when the `*` matches nothing: it is valid exactly when
        // some run id starts with it.
        Some(prefix) => crate::streams::validate_run_id(prefix)
            .map_err(|_| format!("can match no run id ({run_id})")),
        None => crate::streams::validate_run_id(p)
            .map_err(|_| format!("is not a run id ({run_id}), \"prefix*\" or \"*\"")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO at the config path is refused at once (an independent tester's daemon hung in
    /// its start reading one); `/dev/null` is an empty config; an oversized file is refused.
    #[test]
    #[allow(clippy::disallowed_methods)] // a fixture written directly
    fn a_fifo_or_a_huge_file_is_not_a_config() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("config.toml");
        let st = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        let e = load(Some(&fifo)).unwrap_err();
        assert!(e.contains("FIFO"), "{e}");
        assert!(load(Some(Path::new("/dev/null"))).is_ok());
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; (MAX_CONFIG_BYTES + 1) as usize]).unwrap();
        let e = load(Some(&big)).unwrap_err();
        assert!(e.contains("limit"), "{e}");
    }

    #[test]
    fn streams_section_sets_durability_expiry_and_policy() {
        let c: Config = toml::from_str(
            "[streams]\ndurability = \"batch\"\nbatch_interval_ms = 5\nstale_after_secs = 60\n\
             expire_after_secs = 3600\n[streams.retry]\ntransient_budget = 4\n",
        )
        .unwrap();
        c.validate().unwrap();
        let s = c.streams_config();
        assert_eq!(
            s.durability,
            crate::durable::journal::Durability::Batch(Duration::from_millis(5))
        );
        assert_eq!(s.stale_after, Duration::from_secs(60));
        assert_eq!(s.expire_after, Duration::from_secs(3600));
        assert_eq!(s.policy.transient_budget, 4);
        assert_eq!(
            s.policy.rate_limited_budget, 5,
            "unset fields keep their defaults"
        );
        let d = Config::default().streams_config();
        assert_eq!(d.durability, crate::durable::journal::Durability::Always);
        for bad in [
            "[streams]\ndurability = \"sometimes\"\n",
            "[streams]\nexpire_after_secs = 1\n",
            "[streams]\nbatch_interval_ms = 0\n",
        ] {
            let c: Config = toml::from_str(bad).unwrap();
            assert!(c.validate().is_err(), "{bad}");
        }
        assert!(toml::from_str::<Config>("[streams.retry]\nbudget = 1\n").is_err());
    }

    #[test]
    fn parses_the_documented_example() {
        let text = r#"
            socket = "/tmp/x.sock"
            allow_root = false
            [limits]
            max_frame_bytes = 2048
            [stores.hive]
            path = "/h/credentials"
            hive = true
            [plugins.summarizer]
            stores = ["default"]
            methods = ["cred.get", "admin.*"]
            runs = ["summarizer-*"]
        "#;
        let c: Config = toml::from_str(text).unwrap();
        assert_eq!(c.limits().max_frame, 2048);
        assert!(!c.allow_root());
        assert!(c.stores["hive"].hive);
        let p = &c.plugins["summarizer"];
        assert!(p.allows_method("cred.get"));
        assert!(!p.allows_method("cred.set"));
        assert!(p.allows_method("admin.status"));
        assert!(!p.allows_method("administrator.x"));
        assert!(p.allows_store("default"));
        assert!(!p.allows_store("hive"));
        assert!(p.allows_run("summarizer-1") && !p.allows_run("other-1"));
        assert!(toml::from_str::<Config>("nonsense = 1").is_err());
        assert!(c.validate().is_ok());
    }

    #[test]
    fn validation_refuses_values_that_break_the_daemon() {
        for bad in [
            "[limits]\nidle_timeout_ms = 0",
            "[limits]\nmax_connections = 100000000",
            "[limits]\nmax_frame_bytes = 10",
            "[plugins.p]\nstores = [\"default\"]\nmethods = [\"cred.gett\"]",
            "[plugins.p]\nstores = [\"../x\"]\nmethods = [\"cred.*\"]",
        ] {
            let c: Config = toml::from_str(bad).unwrap();
            assert!(c.validate().is_err(), "{bad}");
        }
    }

    fn grant_with_runs(runs: &[&str]) -> Result<Config, String> {
        let list: Vec<String> = runs.iter().map(|r| format!("{r:?}")).collect();
        let text = format!(
            "[plugins.agent-a]\nstores = []\nmethods = [\"stream.*\"]\nruns = [{}]\n",
            list.join(", ")
        );
        let c: Config = toml::from_str(&text).map_err(|e| e.to_string())?;
        c.validate().map(|()| c)
    }

    #[test]
    fn run_patterns_match_exact_ids_prefixes_and_everything() {
        let c = grant_with_runs(&["agent-a-*", "shared.run:7"]).unwrap();
        let g = &c.plugins["agent-a"];
        for id in ["agent-a-1", "agent-a-", "agent-a-x.y:z", "shared.run:7"] {
            assert!(g.allows_run(id), "{id}");
        }
        for id in [
            "agent-b-1",
            "agent-a",
            "Agent-a-1",
            "shared.run:70",
            "xagent-a-1",
            "",
        ] {
            assert!(!g.allows_run(id), "{id}");
        }
        assert!(!g.covers_every_run());
        assert_eq!(g.run_patterns(), ["agent-a-*", "shared.run:7"]);

        let star = grant_with_runs(&["agent-a-*", "*"]).unwrap();
        assert!(star.plugins["agent-a"].covers_every_run());
        assert!(star.plugins["agent-a"].allows_run("anything"));

        let none = grant_with_runs(&[]).unwrap();
        assert!(
            !none.plugins["agent-a"].allows_run("agent-a-1"),
            "[] is no run"
        );
        assert!(!none.plugins["agent-a"].covers_every_run());

        // No `runs` key: every run, as before the key existed.
        let absent: Config =
            toml::from_str("[plugins.p]\nstores = []\nmethods = [\"run.*\"]\n").unwrap();
        absent.validate().unwrap();
        assert!(absent.plugins["p"].covers_every_run());
        assert!(absent.plugins["p"].allows_run("agent-b-1"));
        assert_eq!(absent.plugins["p"].run_patterns(), ["*"]);
        assert!(PluginGrant::all().allows_run("x"));
        // The name is never read from the file.
        assert!(toml::from_str::<Config>(
            "[plugins.p]\nstores = []\nmethods = []\nplugin = \"q\"\n"
        )
        .is_err());
        assert_eq!(
            absent.plugins["p"].bound_as("p").plugin.as_deref(),
            Some("p")
        );
    }

    #[test]
    fn run_patterns_that_can_match_no_run_id_are_config_errors_naming_the_plugin() {
        let long = "a".repeat(crate::limits::MAX_RUN_ID_BYTES + 1);
        let long_prefix = format!("{long}*");
        let exactly_max_prefix = format!("{}*", "a".repeat(crate::limits::MAX_RUN_ID_BYTES));
        for bad in [
            "",
            "**",
            "*-a",
            "agent-*-1",
            "agent*a*",
            ".hidden*",
            ".",
            "..",
            "../x",
            "a/b*",
            "a b",
            "ü*",
            long.as_str(),
            long_prefix.as_str(),
        ] {
            let e = grant_with_runs(&["agent-a-*", bad]).unwrap_err();
            assert!(e.starts_with("[plugins.agent-a] runs: "), "{bad:?}: {e}");
            println!("{e}");
        }
        for good in ["*", "a", "a*", "A.b:c_d-e*", exactly_max_prefix.as_str()] {
            grant_with_runs(&[good]).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
    }
}
