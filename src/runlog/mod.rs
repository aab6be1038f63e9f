//! Run logs: idempotent, append-only logs of agent runs, in hive's layout and field names.
//!
//! Per run, under `runs/<run_id>/` (the directory the stream of the same run keeps its `state`
//! in):
//! - `details.jsonl`: one line per node completion (hive's `NodeDetail`), one logical entry per
//!   `(node_id, attempt)`;
//! - `tool_logs.jsonl`: one line per step (hive's `NodeStepLog`), one per `(node_id, step_index)`;
//! - `tool_calls.jsonl`: holdfast's own, `begin`/`end` records per tool call (the names of
//!   hive's `tool_calls[]` entries: `tool_use_id`, `tool_name`, `tool_input`, `result`,
//!   `is_error`, `start_timestamp`, `duration_s`), which the recovery planner reads;
//! - `summary.json`: written once, by `run.end`;
//! - `log.lock`: the run's lock (`flock` plus an in-process gate).
//!
//! Every record carries `seq` (one counter per run, across the three files) and `logged_at_ms`.
//! The files are the truth: every operation takes the run's lock, brings its view of the files
//! up to date (reading only what was appended since it last looked, and reloading if a file was
//! replaced or shrank), decides, writes, `fdatasync`s, and releases. So the daemon, the offline
//! CLI and any other process using the same lock see one log, and a restart forgets nothing:
//! the check of `run.ensure_node` is made against the file, under the lock, every time.
//!
//! A record replacing a logical entry (`run.log_node` of the same `(node_id, attempt)` with
//! different content) rewrites the file atomically (temp file, fsync, rename, fsync of the
//! directory) with the new record at the old one's place, so the file keeps one line per logical
//! entry and hive's own tools, which count lines, count right. Logging the same content again
//! writes nothing.
//!
//! On load, a torn last line (a writer killed mid-append) is cut at the last complete line
//! (under the lock, fsynced); a complete line that is not a valid record is skipped and kept
//! in place; duplicate keys (a log written by hive's racy logger) collapse to the last one.
//! All three are counted in the run's [`Report`].

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::durable::{self, Faults, LineFile, LockMode, Poison};
use crate::error::ErrorKind;

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their fixtures (torn files) directly
mod tests;

/// Largest record accepted: [`crate::limits::MAX_RUN_RECORD_BYTES`].
pub const MAX_RECORD_BYTES: usize = crate::limits::MAX_RUN_RECORD_BYTES;
const LOCK_TIMEOUT: Duration = crate::limits::LOCK_TIMEOUT;
const CACHED_RUNS: usize = crate::limits::RUN_LOG_CACHED_RUNS;
const FRESH_TAIL: Duration = crate::limits::RUN_LOG_FRESH_TAIL;
use crate::limits::MAX_RUN_LOG_KEY_BYTES;
use crate::limits::RUN_LOG_TAIL_BYTES as TAIL_BYTES;

/// hive's thresholds for a node that needs attention.
pub mod attention {
    /// More retries than this.
    pub const RETRY_COUNT: i64 = 3;
    /// More escalations than this.
    pub const ESCALATE_COUNT: i64 = 2;
    /// Slower than this.
    pub const LATENCY_MS: i64 = 60_000;
    /// More tokens than this.
    pub const TOKENS_USED: i64 = 100_000;
    /// More steps than this.
    pub const TOTAL_STEPS: i64 = 20;
}

/// A run-log operation that failed, with the protocol's error kind.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct RunLogError {
    /// The kind (`invalid_params`, `not_found`, `conflict`, `storage`, `busy`).
    pub kind: ErrorKind,
    /// For people.
    pub message: String,
}

fn err(kind: ErrorKind, message: impl Into<String>) -> RunLogError {
    RunLogError {
        kind,
        message: message.into(),
    }
}

fn invalid(message: impl Into<String>) -> RunLogError {
    err(ErrorKind::InvalidParams, message)
}

fn storage(e: impl std::fmt::Display) -> RunLogError {
    err(ErrorKind::Storage, e.to_string())
}

/// The three append-only files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Details,
    Steps,
    Tools,
    Recovery,
}

const KINDS: [Kind; 4] = [Kind::Details, Kind::Steps, Kind::Tools, Kind::Recovery];

impl Kind {
    fn file(self) -> &'static str {
        match self {
            Kind::Details => "details.jsonl",
            Kind::Steps => "tool_logs.jsonl",
            Kind::Tools => "tool_calls.jsonl",
            Kind::Recovery => "recovery.jsonl",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What loading a run's files found and repaired.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Report {
    /// Torn last lines cut (a writer died mid-append).
    pub torn_tails_cut: u64,
    /// Bytes those cuts removed.
    pub torn_bytes: u64,
    /// Complete lines that were not valid records (skipped, left in place).
    pub bad_lines: u64,
    /// Lines superseded by a later line with the same key (a log written by a racy logger).
    pub duplicate_lines: u64,
    /// Log files present but empty.
    pub empty_files: u64,
}

impl Report {
    /// Nothing was repaired or skipped.
    pub fn is_clean(&self) -> bool {
        *self == Report::default()
    }
}

/// One logical entry: its record and where it sits.
#[derive(Clone, Debug)]
struct Entry {
    seq: u64,
    /// Position in its file (line order), kept when the entry is replaced.
    pos: u64,
    record: Map<String, Value>,
}

#[derive(Clone, Debug, Default)]
struct FileView {
    /// Inode, length and mtime when last read or written (an append grows the length; a
    /// replacement changes the inode; a cut shrinks it), and the last bytes read, checked
    /// before reading on: a new file that reused the inode number does not end the same way.
    ino: u64,
    len: u64,
    mtime_ns: i128,
    tail: Vec<u8>,
    exists: bool,
    next_pos: u64,
}

fn mtime_ns(m: &fs::Metadata) -> i128 {
    i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec())
}

/// The last [`TAIL_BYTES`] of `a` followed by `b`.
fn tail_of(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut t: Vec<u8> = a.iter().chain(b).copied().collect();
    let cut = t.len().saturating_sub(TAIL_BYTES);
    t.drain(..cut);
    t
}

/// A tool call as the log knows it.
#[derive(Clone, Debug, Default)]
struct ToolCall {
    begin: Option<Entry>,
    end: Option<Entry>,
}

/// The parsed view of one run's files.
#[derive(Clone, Debug, Default)]
struct Loaded {
    files: [FileView; 4],
    next_seq: u64,
    nodes: BTreeMap<(String, i64), Entry>,
    steps: BTreeMap<(String, i64), Entry>,
    tools: BTreeMap<String, ToolCall>,
    /// The stream's interruptions and resumptions with their plans, in order.
    recovery: Vec<Entry>,
    summary: Option<Value>,
    report: Report,
    /// The files changed behind this view (a writer that does not take the lock): reload.
    stale: bool,
    first_ms: Option<u64>,
    last_ms: Option<u64>,
}

/// What the run log knows about a tool call, for the recovery planner's R2 annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Execution {
    /// `run.tool_end` was logged: it ran; its result is in the log.
    Executed,
    /// `run.tool_begin` without an end: it may have run partly (side effects possible).
    Began,
    /// Neither: it never started (the run logs its tool calls, and not this one).
    NotExecuted,
    /// The run logs no tool calls at all (or has no run log): nothing can be said.
    Unknown,
}

impl Execution {
    /// The plan's wording.
    pub fn as_str(self) -> &'static str {
        match self {
            Execution::Executed => "executed",
            Execution::Began => "began",
            Execution::NotExecuted => "not_executed",
            Execution::Unknown => "unknown",
        }
    }
}

/// The run logs under one `runs/` directory.
pub struct RunLog {
    dir: PathBuf,
    faults: Faults,
    /// After a failed fsync every write is refused until the daemon restarts.
    poison: Poison,
    cache: Mutex<HashMap<String, Arc<Mutex<Loaded>>>>,
}

impl std::fmt::Debug for RunLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunLog").field("dir", &self.dir).finish()
    }
}

/// A run id: the rule the streams use (it names a directory).
pub fn validate_run_id(id: &str) -> Result<(), RunLogError> {
    crate::streams::validate_run_id(id).map_err(|e| invalid(e.to_string()))
}

use crate::timefmt::now_ms;

fn iso(ms: u64) -> String {
    crate::timefmt::format_z(ms as i64 * 1000)
}

/// A string field of at most 256 bytes, non-empty.
fn key_str(o: &Map<String, Value>, field: &str, what: &str) -> Result<String, RunLogError> {
    match o.get(field) {
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_RUN_LOG_KEY_BYTES => Ok(s.clone()),
        _ => Err(invalid(format!(
            "{what}.{field} (a non-empty string of at most {MAX_RUN_LOG_KEY_BYTES} bytes) is required"
        ))),
    }
}

fn key_int(
    o: &Map<String, Value>,
    field: &str,
    what: &str,
    default: Option<i64>,
) -> Result<i64, RunLogError> {
    match o.get(field) {
        None | Some(Value::Null) if default.is_some() => Ok(default.unwrap_or(0)),
        Some(v) => v
            .as_i64()
            .filter(|n| *n >= 0)
            .ok_or_else(|| invalid(format!("{what}.{field} must be a non-negative integer"))),
        None => Err(invalid(format!(
            "{what}.{field} (a non-negative integer) is required"
        ))),
    }
}

/// The key of a node detail: `(node_id, attempt)`; attempt defaults to 1 as in hive.
fn node_key(o: &Map<String, Value>) -> Result<(String, i64), RunLogError> {
    Ok((
        key_str(o, "node_id", "detail")?,
        key_int(o, "attempt", "detail", Some(1))?,
    ))
}

fn step_key(o: &Map<String, Value>) -> Result<(String, i64), RunLogError> {
    Ok((
        key_str(o, "node_id", "step")?,
        key_int(o, "step_index", "step", None)?,
    ))
}

/// The record without the fields holdfast sets (to compare content).
fn content(record: &Map<String, Value>) -> Map<String, Value> {
    let mut m = record.clone();
    m.remove("seq");
    m.remove("logged_at_ms");
    m
}

fn int(v: Option<&Value>) -> i64 {
    v.and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)))
        .unwrap_or(0)
}

/// Why a node needs attention, in hive's own words (`RuntimeLogger.log_node_complete`): a
/// failure with an error, then each threshold passed; then the reasons the detail carries
/// itself that are not among them. A client that computes hive's reasons (hive's logger, the
/// Python drop-in) therefore gets back exactly hive's list, and its summary reads as hive's.
pub fn attention_reasons(detail: &Map<String, Value>) -> Vec<String> {
    let node = detail.get("node_id").and_then(Value::as_str).unwrap_or("?");
    let mut out = Vec::new();
    if detail.get("success") == Some(&Value::Bool(false)) {
        match detail.get("error") {
            Some(Value::String(e)) if !e.is_empty() => {
                out.push(format!("Node {node} failed: {e}"));
            }
            _ => {}
        }
    }
    // (field, threshold, hive's words before and after the number)
    let checks = [
        (
            "retry_count",
            attention::RETRY_COUNT,
            "Excessive retries: ",
            "",
        ),
        (
            "escalate_count",
            attention::ESCALATE_COUNT,
            "Excessive escalations: ",
            "",
        ),
        ("latency_ms", attention::LATENCY_MS, "High latency: ", "ms"),
        (
            "tokens_used",
            attention::TOKENS_USED,
            "High token usage: ",
            "",
        ),
        (
            "total_steps",
            attention::TOTAL_STEPS,
            "Many iterations: ",
            "",
        ),
    ];
    for (field, limit, before, after) in checks {
        let n = int(detail.get(field));
        if n > limit {
            out.push(format!("{before}{n}{after}"));
        }
    }
    if let Some(Value::Array(reasons)) = detail.get("attention_reasons") {
        for r in reasons.iter().filter_map(Value::as_str) {
            if !out.iter().any(|o| o == r) {
                out.push(r.to_owned());
            }
        }
    }
    out
}

/// Whether a node needs attention (hive's rule): it failed (with or without an error message),
/// passed a threshold, carries a reason, or says so itself.
pub fn needs_attention(detail: &Map<String, Value>) -> bool {
    detail.get("success") == Some(&Value::Bool(false))
        || detail.get("needs_attention") == Some(&Value::Bool(true))
        || !attention_reasons(detail).is_empty()
}

impl Loaded {
    /// The keyed entries of `kind` (details or steps).
    fn keyed(&mut self, kind: Kind) -> &mut BTreeMap<(String, i64), Entry> {
        match kind {
            Kind::Steps => &mut self.steps,
            _ => &mut self.nodes,
        }
    }

    /// Take one complete line of `kind` into the view.
    fn take_line(&mut self, kind: Kind, line: &[u8]) {
        let pos = self.files[kind.index()].next_pos;
        self.files[kind.index()].next_pos += 1;
        let Ok(Value::Object(record)) = serde_json::from_slice::<Value>(line) else {
            self.report.bad_lines += 1;
            return;
        };
        let seq = record.get("seq").and_then(Value::as_u64).unwrap_or(0);
        // A file may say anything: u64::MAX leaves the counter exhausted, not wrapped.
        self.next_seq = self.next_seq.max(seq.saturating_add(1));
        if let Some(ms) = record.get("logged_at_ms").and_then(Value::as_u64) {
            self.first_ms = Some(self.first_ms.map_or(ms, |f| f.min(ms)));
            self.last_ms = Some(self.last_ms.map_or(ms, |l| l.max(ms)));
        }
        let entry = |record| Entry { seq, pos, record };
        let replaced = match kind {
            Kind::Details => match node_key(&record) {
                Ok(k) => self.nodes.insert(k, entry(record)).is_some(),
                Err(_) => {
                    self.report.bad_lines += 1;
                    return;
                }
            },
            Kind::Steps => match step_key(&record) {
                Ok(k) => self.steps.insert(k, entry(record)).is_some(),
                Err(_) => {
                    self.report.bad_lines += 1;
                    return;
                }
            },
            Kind::Recovery => {
                if !record.get("event").is_some_and(Value::is_string) {
                    self.report.bad_lines += 1;
                    return;
                }
                self.recovery.push(entry(record));
                false
            }
            Kind::Tools => {
                let id = key_str(&record, "tool_use_id", "tool call");
                let event = record.get("event").and_then(Value::as_str);
                match (id, event) {
                    (Ok(id), Some("begin")) => {
                        let t = self.tools.entry(id).or_default();
                        t.begin.replace(entry(record)).is_some()
                    }
                    (Ok(id), Some("end")) => {
                        let t = self.tools.entry(id).or_default();
                        t.end.replace(entry(record)).is_some()
                    }
                    _ => {
                        self.report.bad_lines += 1;
                        return;
                    }
                }
            }
        };
        if replaced {
            self.report.duplicate_lines += 1;
        }
    }

    /// The logical records of `kind`, in file order.
    fn records(&self, kind: Kind) -> Vec<&Entry> {
        let mut v: Vec<&Entry> = match kind {
            Kind::Details => self.nodes.values().collect(),
            Kind::Steps => self.steps.values().collect(),
            Kind::Recovery => self.recovery.iter().collect(),
            Kind::Tools => self
                .tools
                .values()
                .flat_map(|t| t.begin.iter().chain(t.end.iter()))
                .collect(),
        };
        v.sort_by_key(|e| e.pos);
        v
    }

    fn ended(&self) -> bool {
        self.summary.is_some()
    }
}

/// What `run.end` may say about the run beyond its status: hive's `RuntimeLogger.end_run`
/// arguments and its own notes. Absent fields take hive's defaults (`""`, or what the log
/// itself shows: the first record's time, the time since, the nodes in order).
#[derive(Clone, Debug, Default)]
pub struct EndFields {
    /// hive's `agent_id`.
    pub agent_id: Option<String>,
    /// hive's `goal_id`.
    pub goal_id: Option<String>,
    /// hive's `execution_quality` (`clean`, `degraded`, `failed`).
    pub execution_quality: Option<String>,
    /// OpenTelemetry trace id.
    pub trace_id: Option<String>,
    /// Session / execution correlation id.
    pub execution_id: Option<String>,
    /// When the run started, as the caller records it (hive: `start_run`'s `isoformat()`).
    pub started_at: Option<String>,
    /// How long the run took, as the caller measured it.
    pub duration_ms: Option<u64>,
    /// The nodes in the order the graph visited them (may repeat a node; hive's executor
    /// passes it). Default: the logged nodes in log order.
    pub node_path: Option<Vec<String>>,
}

/// The summary of a run's logical entries: hive's `summary.json`, field for field, every string
/// field a string (hive's `RunSummaryLog` refuses `null` there).
fn summarize(run_id: &str, l: &Loaded, status: &str, given: &EndFields, now: u64) -> Value {
    let nodes = l.records(Kind::Details);
    let mut reasons = Vec::new();
    let mut attention = false;
    let (mut input, mut output) = (0i64, 0i64);
    let mut path = Vec::new();
    for e in &nodes {
        input = input.saturating_add(int(e.record.get("input_tokens")));
        output = output.saturating_add(int(e.record.get("output_tokens")));
        attention |= needs_attention(&e.record);
        reasons.extend(attention_reasons(&e.record));
        path.push(e.record.get("node_id").cloned().unwrap_or(Value::Null));
    }
    let started = l.first_ms.unwrap_or(now);
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    json!({
        "run_id": run_id,
        "agent_id": text(&given.agent_id),
        "goal_id": text(&given.goal_id),
        "status": status,
        "total_nodes_executed": nodes.len(),
        "node_path": given.node_path.as_ref().map_or(Value::Array(path), |p| json!(p)),
        "total_input_tokens": input,
        "total_output_tokens": output,
        "needs_attention": attention,
        "attention_reasons": reasons,
        "started_at": given.started_at.clone().unwrap_or_else(|| iso(started)),
        "duration_ms": given.duration_ms.unwrap_or_else(|| now.saturating_sub(started)),
        "execution_quality": text(&given.execution_quality),
        "trace_id": text(&given.trace_id),
        "execution_id": text(&given.execution_id),
    })
}

/// Statuses `run.end` accepts (hive's).
pub const STATUSES: [&str; 5] = ["success", "failure", "degraded", "cancelled", "timeout"];

impl RunLog {
    /// The run logs under `runs_dir` (created 0700 if missing).
    pub fn open(runs_dir: &Path, faults: Faults) -> Result<RunLog, RunLogError> {
        durable::create_private_dir(runs_dir, &faults).map_err(storage)?;
        Ok(RunLog {
            dir: runs_dir.to_path_buf(),
            faults,
            poison: Poison::default(),
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The `runs/` directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn run_dir(&self, run_id: &str) -> PathBuf {
        self.dir.join(run_id)
    }

    fn cached(&self, run_id: &str) -> Arc<Mutex<Loaded>> {
        let mut c = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if c.len() >= CACHED_RUNS && !c.contains_key(run_id) {
            c.clear();
        }
        Arc::clone(c.entry(run_id.to_owned()).or_default())
    }

    fn forget(&self, run_id: &str) {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(run_id);
    }

    /// Run `f` on the up-to-date view of `run_id`, under its lock. With `create`, the run's
    /// directory is made if missing; without, a run with no directory is `not_found`.
    fn with_run<T>(
        &self,
        run_id: &str,
        create: bool,
        f: impl FnOnce(&Path, &mut Loaded) -> Result<T, RunLogError>,
    ) -> Result<T, RunLogError> {
        validate_run_id(run_id)?;
        let dir = self.run_dir(run_id);
        // Twice at most: a writer that waited for the lock while a prune deleted the run finds
        // the directory gone once it holds the lock, and starts again (creating it anew).
        let mut attempts = 0;
        let lock = loop {
            attempts += 1;
            self.ensure_dir(run_id, &dir, create)?;
            let lock =
                durable::lock::lock(&dir.join("log.lock"), LockMode::Exclusive, LOCK_TIMEOUT)
                    .map_err(|e| err(ErrorKind::Busy, e.to_string()))?;
            if dir.is_dir() || attempts >= 2 {
                break lock;
            }
        };
        let slot = self.cached(run_id);
        let mut view = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = self.refresh(&dir, &mut view) {
            // Whatever was half-read is dropped: the next use reloads from the files.
            *view = Loaded::default();
            return Err(e);
        }
        let out = f(&dir, &mut view);
        if view.stale
            || out
                .as_ref()
                .is_err_and(|e| matches!(e.kind, ErrorKind::Storage | ErrorKind::Integrity))
        {
            // After a failed write the view is not trusted: the next use reloads the files.
            *view = Loaded::default();
        }
        drop(view);
        drop(lock);
        out
    }

    /// The run's directory exists (made now if `create`), or `not_found`.
    fn ensure_dir(&self, run_id: &str, dir: &Path, create: bool) -> Result<(), RunLogError> {
        match fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(storage(format!("{} is not a directory", dir.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !create {
                    return Err(err(
                        ErrorKind::NotFound,
                        format!("no run log for run {run_id:?}"),
                    ));
                }
                durable::create_private_dir(dir, &self.faults).map_err(storage)?;
                durable::fsync_dir(&self.dir, &self.faults).map_err(storage)?;
            }
            Err(e) => return Err(storage(format!("{}: {e}", dir.display()))),
        }
        Ok(())
    }

    /// Bring `view` up to date with the files (the caller holds the run's lock).
    fn refresh(&self, dir: &Path, view: &mut Loaded) -> Result<(), RunLogError> {
        let mut metas = Vec::new();
        let mut reload = false;
        for kind in KINDS {
            let path = dir.join(kind.file());
            let meta = match fs::symlink_metadata(&path) {
                Ok(m) if m.is_file() => Some(m),
                Ok(_) => return Err(storage(format!("{} is not a file", path.display()))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(storage(format!("{}: {e}", path.display()))),
            };
            let f = &view.files[kind.index()];
            reload |= match &meta {
                Some(m) if f.exists => {
                    m.ino() != f.ino
                        || m.len() < f.len
                        || (m.len() == f.len && mtime_ns(m) != f.mtime_ns)
                }
                None => f.exists,
                Some(_) => false,
            };
            metas.push(meta);
        }
        if reload {
            *view = Loaded::default();
        }
        for (kind, meta) in KINDS.into_iter().zip(&metas) {
            let Some(meta) = meta else { continue };
            let f = &view.files[kind.index()];
            if f.exists && meta.len() == f.len {
                continue;
            }
            if !self.read_tail(dir, kind, view)? {
                // Not the file this view read (its end changed): read everything again.
                *view = Loaded::default();
                for (kind, meta) in KINDS.into_iter().zip(&metas) {
                    if meta.is_some() {
                        self.read_tail(dir, kind, view)?;
                    }
                }
                break;
            }
        }
        // Re-read each time: small, and a replaced or deleted summary must be seen.
        let summary_path = dir.join("summary.json");
        view.summary = match durable::read_capped(&summary_path, MAX_RECORD_BYTES as u64) {
            Ok(Some(bytes)) => Some(serde_json::from_slice(&bytes).map_err(|e| {
                err(
                    ErrorKind::Integrity,
                    format!("{}: not JSON ({e})", summary_path.display()),
                )
            })?),
            Ok(None) => None,
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(storage(format!("{}: {e}", summary_path.display()))),
        };
        Ok(())
    }

    /// Read what `kind`'s file holds past the view's end, taking its complete lines; cut a torn
    /// last line (once it is not fresh). `false` if the file does not continue what the view
    /// read (its remembered end differs): the caller reloads.
    fn read_tail(&self, dir: &Path, kind: Kind, view: &mut Loaded) -> Result<bool, RunLogError> {
        let path = dir.join(kind.file());
        let mut file = LineFile::open(&path).map_err(storage)?;
        let f = view.files[kind.index()].clone();
        let (from, known) = if f.exists {
            (f.len, f.tail.clone())
        } else {
            (0, Vec::new())
        };
        let waited = std::time::Instant::now();
        let (bytes, complete) = loop {
            let mut bytes = file.read_from(from - known.len() as u64).map_err(storage)?;
            if !bytes.starts_with(&known) {
                return Ok(false);
            }
            bytes.drain(..known.len());
            let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
            let fresh = file
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_none_or(|age| age < FRESH_TAIL);
            if complete < bytes.len() && fresh && waited.elapsed() < FRESH_TAIL {
                // Someone may be writing it right now, without the lock: give them time.
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            break (bytes, complete);
        };
        for line in bytes[..complete].split(|b| *b == b'\n') {
            if !line.iter().all(u8::is_ascii_whitespace) {
                view.take_line(kind, line);
            }
        }
        let len = from + complete as u64;
        if complete < bytes.len() {
            // A torn last line: its writer died before the newline (every writer of ours holds
            // this lock while it writes; others had FRESH_TAIL to finish). Cut it, durably.
            let torn = (bytes.len() - complete) as u64;
            file.cut(len, &self.faults, &self.poison)
                .map_err(|e| storage(format!("cutting the torn tail: {e}")))?;
            tracing::warn!(file = %path.display(), bytes = torn, "run log: cut a torn last line");
            view.report.torn_tails_cut += 1;
            view.report.torn_bytes += torn;
        }
        let meta = file.metadata().map_err(storage)?;
        if len == 0 && !f.exists {
            view.report.empty_files += 1;
        }
        // `take_line` advanced next_pos for each line read: keep that, not the value before.
        let next_pos = view.files[kind.index()].next_pos;
        view.files[kind.index()] = FileView {
            ino: meta.ino(),
            len,
            mtime_ns: mtime_ns(&meta),
            tail: tail_of(&known, &bytes[..complete]),
            exists: true,
            next_pos,
        };
        Ok(true)
    }

    /// The seq of the next record and the counter after it; an exhausted counter (a file that
    /// says it wrote seq `u64::MAX`) refuses further records instead of wrapping to 0.
    fn take_seq(view: &Loaded) -> Result<(u64, u64), RunLogError> {
        let seq = view.next_seq.max(1);
        match seq.checked_add(1) {
            Some(next) => Ok((seq, next)),
            None => Err(err(
                ErrorKind::Integrity,
                "this run log's seq counter is at its maximum (a file holds seq 18446744073709551615): \
                 start a new run",
            )),
        }
    }

    /// Append one record to `kind`'s file, durably; returns its seq.
    fn append(
        &self,
        dir: &Path,
        view: &mut Loaded,
        kind: Kind,
        mut record: Map<String, Value>,
    ) -> Result<Entry, RunLogError> {
        let (seq, next_seq) = Self::take_seq(view)?;
        let at = now_ms();
        record.insert("seq".into(), seq.into());
        record.insert("logged_at_ms".into(), at.into());
        let mut line = serde_json::to_vec(&record).map_err(storage)?;
        if line.len() > MAX_RECORD_BYTES {
            return Err(invalid(format!(
                "a record is at most {MAX_RECORD_BYTES} bytes; this one is {}",
                line.len()
            )));
        }
        line.push(b'\n');
        let old_len = view.files[kind.index()].len;
        let meta =
            durable::append_line(dir, kind.file(), &line, old_len, &self.faults, &self.poison)
                .map_err(storage)?
                .meta;
        if meta.len() != old_len + line.len() as u64 {
            // Someone appended without the lock since the refresh: their lines were not read.
            view.stale = true;
        }
        let f = &mut view.files[kind.index()];
        let pos = f.next_pos;
        *f = FileView {
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: mtime_ns(&meta),
            tail: tail_of(&f.tail, &line),
            exists: true,
            next_pos: pos + 1,
        };
        view.next_seq = next_seq;
        view.first_ms = Some(view.first_ms.map_or(at, |f| f.min(at)));
        view.last_ms = Some(view.last_ms.map_or(at, |l| l.max(at)));
        Ok(Entry { seq, pos, record })
    }

    /// Replace a logical entry of `kind` (at the same place), by rewriting the file atomically.
    fn replace(
        &self,
        dir: &Path,
        view: &mut Loaded,
        kind: Kind,
        old: &Entry,
        mut record: Map<String, Value>,
    ) -> Result<Entry, RunLogError> {
        let (seq, _) = Self::take_seq(view)?;
        let at = now_ms();
        record.insert("seq".into(), seq.into());
        record.insert("logged_at_ms".into(), at.into());
        let new = Entry {
            seq,
            pos: old.pos,
            record,
        };
        let mut bytes = Vec::new();
        for e in view.records(kind) {
            let r = if e.pos == old.pos {
                &new.record
            } else {
                &e.record
            };
            serde_json::to_writer(&mut bytes, r).map_err(storage)?;
            bytes.push(b'\n');
        }
        if bytes.len() > crate::limits::MAX_RUN_LOG_REWRITE_BYTES {
            return Err(invalid(
                "this run's log is too large to rewrite an entry of",
            ));
        }
        self.poison.check(dir).map_err(storage)?;
        self.poison
            .watch(durable::atomic_write(
                dir,
                kind.file(),
                &bytes,
                &self.faults,
            ))
            .map_err(storage)?;
        // The rewrite drops bad and duplicate lines: reload the view from the new file.
        let mut fresh = Loaded::default();
        self.refresh(dir, &mut fresh)?;
        fresh.report = view.report.clone();
        *view = fresh;
        Ok(new)
    }

    fn refuse_if_ended(run_id: &str, view: &Loaded) -> Result<(), RunLogError> {
        if view.ended() {
            return Err(err(
                ErrorKind::Conflict,
                format!("run {run_id:?} has ended (run.end); its log and summary are final"),
            ));
        }
        Ok(())
    }

    /// `run.log_node`: log a node completion; the same `(node_id, attempt)` again keeps one
    /// logical entry (the last content wins; the same content writes nothing).
    pub fn log_node(&self, run_id: &str, detail: Map<String, Value>) -> Result<Value, RunLogError> {
        let key = node_key(&detail)?;
        self.upsert(run_id, Kind::Details, key, detail)
    }

    /// Log a keyed record (a node detail or a step): nothing if the same content is there,
    /// a replacement in place if other content is, else an append.
    fn upsert(
        &self,
        run_id: &str,
        kind: Kind,
        key: (String, i64),
        record: Map<String, Value>,
    ) -> Result<Value, RunLogError> {
        self.with_run(run_id, true, |dir, view| {
            let found = view.keyed(kind).get(&key).cloned();
            if let Some(old) = found
                .as_ref()
                .filter(|o| content(&o.record) == content(&record))
            {
                // Already logged as it is (a retry, even after the end): nothing to write.
                return Ok(json!({"seq": old.seq, "written": false, "replaced": false}));
            }
            Self::refuse_if_ended(run_id, view)?;
            match found {
                Some(old) => {
                    let e = self.replace(dir, view, kind, &old, record)?;
                    Ok(json!({"seq": e.seq, "written": true, "replaced": true}))
                }
                None => {
                    let e = self.append(dir, view, kind, record)?;
                    let seq = e.seq;
                    view.keyed(kind).insert(key, e);
                    Ok(json!({"seq": seq, "written": true, "replaced": false}))
                }
            }
        })
    }

    /// `run.ensure_node`: log `detail` for `node_id` only if the log has no entry for that
    /// node (any attempt): one atomic check-and-write against the file.
    pub fn ensure_node(
        &self,
        run_id: &str,
        node_id: &str,
        mut detail: Map<String, Value>,
    ) -> Result<Value, RunLogError> {
        match detail.get("node_id") {
            None => {
                detail.insert("node_id".into(), node_id.into());
            }
            Some(Value::String(n)) if n == node_id => {}
            Some(_) => return Err(invalid("detail.node_id differs from node_id")),
        }
        let key = node_key(&detail)?;
        self.with_run(run_id, true, |dir, view| {
            // Any attempt of this node: a range of the (node_id, attempt) keys, not a scan.
            let any_attempt = (node_id.to_owned(), i64::MIN)..=(node_id.to_owned(), i64::MAX);
            if let Some(e) = view.nodes.range(any_attempt).next().map(|(_, e)| e) {
                return Ok(json!({"seq": e.seq, "written": false}));
            }
            Self::refuse_if_ended(run_id, view)?;
            let e = self.append(dir, view, Kind::Details, detail)?;
            view.nodes.insert(key, e.clone());
            Ok(json!({"seq": e.seq, "written": true}))
        })
    }

    /// `run.log_step`: idempotent by `(node_id, step_index)` (last content wins).
    pub fn log_step(&self, run_id: &str, step: Map<String, Value>) -> Result<Value, RunLogError> {
        let key = step_key(&step)?;
        self.upsert(run_id, Kind::Steps, key, step)
    }

    /// `run.tool_begin`: a tool call starts. Idempotent by `tool_call_id` (the first begin
    /// stays).
    pub fn tool_begin(
        &self,
        run_id: &str,
        tool_call_id: &str,
        name: &str,
        input: Value,
    ) -> Result<Value, RunLogError> {
        let mut rec = Map::new();
        rec.insert("event".into(), "begin".into());
        rec.insert("tool_use_id".into(), tool_call_id.into());
        rec.insert("tool_name".into(), name.into());
        rec.insert("tool_input".into(), input);
        key_str(&rec, "tool_use_id", "params")?;
        key_str(&rec, "tool_name", "params")?;
        self.tool_event(run_id, tool_call_id, false, rec, |_, rec| {
            rec.insert("start_timestamp".into(), iso(now_ms()).into());
        })
    }

    /// Log a tool call's begin (`end` false) or end, once: an existing one is answered, not
    /// written again. `complete` adds what depends on the call so far.
    fn tool_event(
        &self,
        run_id: &str,
        tool_call_id: &str,
        end: bool,
        mut rec: Map<String, Value>,
        complete: impl FnOnce(Option<&ToolCall>, &mut Map<String, Value>),
    ) -> Result<Value, RunLogError> {
        self.with_run(run_id, true, |dir, view| {
            let call = view.tools.get(tool_call_id);
            let logged = call.and_then(|t| {
                if end {
                    t.end.as_ref()
                } else {
                    t.begin.as_ref()
                }
            });
            if let Some(e) = logged {
                return Ok(json!({"seq": e.seq, "written": false}));
            }
            Self::refuse_if_ended(run_id, view)?;
            complete(call, &mut rec);
            let e = self.append(dir, view, Kind::Tools, rec)?;
            let seq = e.seq;
            let t = view.tools.entry(tool_call_id.to_owned()).or_default();
            *(if end { &mut t.end } else { &mut t.begin }) = Some(e);
            Ok(json!({"seq": seq, "written": true}))
        })
    }

    /// `run.tool_end`: a tool call finished. Idempotent by `tool_call_id` (the first end
    /// stays: a tool's result is a fact, not last-wins).
    pub fn tool_end(
        &self,
        run_id: &str,
        tool_call_id: &str,
        result: Value,
        is_error: bool,
    ) -> Result<Value, RunLogError> {
        let mut rec = Map::new();
        rec.insert("event".into(), "end".into());
        rec.insert("tool_use_id".into(), tool_call_id.into());
        key_str(&rec, "tool_use_id", "params")?;
        rec.insert("result".into(), result);
        rec.insert("is_error".into(), is_error.into());
        self.tool_event(run_id, tool_call_id, true, rec, |call, rec| {
            let begun = call
                .and_then(|t| t.begin.as_ref())
                .and_then(|b| b.record.get("logged_at_ms").and_then(Value::as_u64));
            if let Some(b) = begun {
                let secs = now_ms().saturating_sub(b) as f64 / 1000.0;
                rec.insert("duration_s".into(), json!(secs));
            }
        })
    }

    /// Record a stream's interruption or resumption and its recovery plan (`event`:
    /// `interrupt` or `resume`), for `runs show`'s timeline. Not idempotent: each plan is its own
    /// event. Skipped, not refused, once the run has ended.
    pub fn log_recovery(
        &self,
        run_id: &str,
        record: Map<String, Value>,
    ) -> Result<(), RunLogError> {
        self.with_run(run_id, true, |dir, view| {
            if view.ended() {
                return Ok(());
            }
            let e = self.append(dir, view, Kind::Recovery, record)?;
            view.recovery.push(e);
            Ok(())
        })
    }

    /// What the log says about each tool call id (for the R2 annotation). `not_executed` is
    /// only said of a run that logs its tool calls (at least one begin or end in its log); a
    /// run that logs none, or has no run log, answers `Unknown` for every id — silence is not
    /// evidence that a call never ran.
    pub fn executions(&self, run_id: &str, ids: &[String]) -> Result<Vec<Execution>, RunLogError> {
        let state = |view: &Loaded, id: &String| match view.tools.get(id) {
            Some(ToolCall { end: Some(_), .. }) => Execution::Executed,
            Some(ToolCall { begin: Some(_), .. }) => Execution::Began,
            _ => Execution::NotExecuted,
        };
        match self.with_run(run_id, false, |_, view| {
            Ok(if view.tools.is_empty() {
                vec![Execution::Unknown; ids.len()]
            } else {
                ids.iter().map(|id| state(view, id)).collect()
            })
        }) {
            Err(e) if e.kind == ErrorKind::NotFound => Ok(vec![Execution::Unknown; ids.len()]),
            other => other,
        }
    }

    /// `run.end`: write `summary.json` from the logical entries. Idempotent: a second end
    /// returns the same summary and writes nothing.
    pub fn end(&self, run_id: &str, status: &str, given: &EndFields) -> Result<Value, RunLogError> {
        if !STATUSES.contains(&status) {
            return Err(invalid(format!(
                "status must be one of {}",
                STATUSES.join(", ")
            )));
        }
        self.with_run(run_id, true, |dir, view| {
            if let Some(s) = &view.summary {
                return Ok(json!({"summary": s, "written": false}));
            }
            let summary = summarize(run_id, view, status, given, now_ms());
            let bytes = serde_json::to_vec_pretty(&summary).map_err(storage)?;
            self.poison.check(dir).map_err(storage)?;
            self.poison
                .watch(durable::atomic_write(
                    dir,
                    "summary.json",
                    &bytes,
                    &self.faults,
                ))
                .map_err(storage)?;
            view.summary = Some(summary.clone());
            Ok(json!({"summary": summary, "written": true}))
        })
    }

    /// `run.get`: the run's log: summary (final, or as it would be now), entries, report.
    pub fn get(&self, run_id: &str) -> Result<Value, RunLogError> {
        self.with_run(run_id, false, |_, view| {
            Ok(Self::describe(run_id, view, true))
        })
    }

    fn describe(run_id: &str, view: &Loaded, entries: bool) -> Value {
        let now = now_ms();
        let summary = view.summary.clone().unwrap_or_else(|| {
            summarize(
                run_id,
                view,
                "running",
                &EndFields::default(),
                view.last_ms.unwrap_or(now),
            )
        });
        let mut out = json!({
            "run_id": run_id,
            "status": summary["status"],
            "ended": view.ended(),
            "summary": summary,
            "nodes": view.nodes.len(),
            "steps": view.steps.len(),
            "tool_calls": view.tools.len(),
            "interruptions": view.recovery.iter().filter(|e| e.record.get("event") == Some(&json!("interrupt"))).count(),
            "first_logged_at_ms": view.first_ms,
            "last_logged_at_ms": view.last_ms,
            "report": view.report,
        });
        if entries {
            let list = |kind| {
                view.records(kind)
                    .into_iter()
                    .map(|e| Value::Object(e.record.clone()))
                    .collect::<Vec<_>>()
            };
            out["details"] = list(Kind::Details).into();
            out["steps_log"] = list(Kind::Steps).into();
            out["tool_log"] = list(Kind::Tools).into();
            out["recovery_log"] = list(Kind::Recovery).into();
        }
        out
    }

    /// Every run with a run log, newest activity first; filtered by status and by last
    /// activity within `[since_ms, until_ms]`.
    pub fn list(
        &self,
        status: Option<&str>,
        since_ms: Option<u64>,
        until_ms: Option<u64>,
    ) -> Result<Vec<Value>, RunLogError> {
        let mut out = Vec::new();
        for run_id in self.run_ids()? {
            let has_log = KINDS
                .iter()
                .map(|k| k.file())
                .chain(["summary.json"])
                .any(|f| self.run_dir(&run_id).join(f).exists());
            if !has_log {
                continue;
            }
            let d = match self.with_run(&run_id, false, |_, view| {
                Ok(Self::describe(&run_id, view, false))
            }) {
                Ok(d) => d,
                Err(e) if e.kind == ErrorKind::NotFound => continue,
                Err(e) => json!({"run_id": run_id, "status": "unreadable", "error": e.message}),
            };
            if status.is_some_and(|s| d["status"].as_str() != Some(s)) {
                continue;
            }
            let last = d["last_logged_at_ms"].as_u64().unwrap_or(0);
            if since_ms.is_some_and(|s| last < s) || until_ms.is_some_and(|u| last > u) {
                continue;
            }
            out.push(d);
        }
        out.sort_by_key(|d| std::cmp::Reverse(d["last_logged_at_ms"].as_u64().unwrap_or(0)));
        Ok(out)
    }

    fn run_ids(&self) -> Result<Vec<String>, RunLogError> {
        let mut ids = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ids),
            Err(e) => return Err(storage(format!("{}: {e}", self.dir.display()))),
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if validate_run_id(&name).is_ok() && e.file_type().is_ok_and(|t| t.is_dir()) {
                ids.push(name);
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// The newest modification time of the files in a run's directory (ms since the epoch),
    /// not counting `log.lock` (taking the lock creates it) nor the directory itself; the
    /// directory's time only for an empty one.
    fn last_activity_ms(dir: &Path) -> Option<u64> {
        let mut newest = None;
        for e in fs::read_dir(dir).ok()?.flatten() {
            if e.file_name() == "log.lock" {
                continue;
            }
            if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
                newest = Some(newest.map_or(t, |n: std::time::SystemTime| n.max(t)));
            }
        }
        let newest = match newest {
            Some(t) => t,
            None => fs::symlink_metadata(dir).ok()?.modified().ok()?,
        };
        newest
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_millis() as u64)
    }

    /// Delete the directories of runs with no activity for `older_than` (run log, stream
    /// state, everything under `runs/<id>/`), except those `keep` names (active streams).
    /// With `dry_run`, only say which. Each run is deleted under its lock after its age is
    /// checked again, so a writer that got the lock first keeps the run (one waiting behind
    /// the prune creates it anew). A run that cannot be deleted is reported with its `error`
    /// and the sweep goes on.
    pub fn prune(
        &self,
        older_than: Duration,
        keep: &dyn Fn(&str) -> bool,
        dry_run: bool,
    ) -> Result<Vec<Value>, RunLogError> {
        let age_ms = u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX);
        let cutoff = now_ms().saturating_sub(age_ms);
        let mut out = Vec::new();
        let mut deleted = 0;
        for run_id in self.run_ids()? {
            let dir = self.run_dir(&run_id);
            let Some(last) = Self::last_activity_ms(&dir) else {
                continue;
            };
            if last >= cutoff || keep(&run_id) {
                continue;
            }
            if dry_run {
                out.push(json!({"run_id": run_id, "last_activity_ms": last}));
                continue;
            }
            match self.delete_run(&run_id, &dir, cutoff) {
                Ok(true) => {
                    deleted += 1;
                    out.push(json!({"run_id": run_id, "last_activity_ms": last}));
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(run_id, error = %e, "prune: could not delete a run");
                    out.push(
                        json!({"run_id": run_id, "last_activity_ms": last, "error": e.message}),
                    );
                }
            }
        }
        if deleted > 0 {
            durable::fsync_dir(&self.dir, &self.faults).map_err(storage)?;
        }
        Ok(out)
    }

    /// Delete one run's directory under its lock if it is still idle since before `cutoff`.
    fn delete_run(&self, run_id: &str, dir: &Path, cutoff: u64) -> Result<bool, RunLogError> {
        let lock = durable::lock::lock(&dir.join("log.lock"), LockMode::Exclusive, LOCK_TIMEOUT)
            .map_err(|e| err(ErrorKind::Busy, e.to_string()))?;
        // Written to while we waited for the lock: not old any more.
        if Self::last_activity_ms(dir).is_some_and(|l| l >= cutoff) {
            return Ok(false);
        }
        durable::remove_tree(&self.dir, run_id, &self.faults).map_err(storage)?;
        drop(lock);
        self.forget(run_id);
        Ok(true)
    }

    /// The load report of a run, if its log is clean or not (for `runs show`).
    pub fn report(&self, run_id: &str) -> Result<Report, RunLogError> {
        self.with_run(run_id, false, |_, view| Ok(view.report.clone()))
    }
}

impl crate::streams::ToolLog for RunLog {
    fn executions(
        &self,
        run_id: &str,
        ids: &[String],
    ) -> Result<Vec<&'static str>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(RunLog::executions(self, run_id, ids)?
            .into_iter()
            .map(Execution::as_str)
            .collect())
    }

    fn log_recovery(
        &self,
        run_id: &str,
        entry: Map<String, Value>,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Ok(RunLog::log_recovery(self, run_id, entry)?)
    }
}
