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
//! - `summary.json`: written by `run.end`, removed by `run.start` of an ended run (hive's resurrection);
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

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::durable::{self, Faults, Poison};
use crate::error::ErrorKind;

mod error;
mod files;
mod pg;
mod schema;
mod view;
mod writer;

#[cfg(test)]
mod protocol_faults;
#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their fixtures (torn files) directly
mod tests;

pub use error::RunLogError;
use files::RunFiles;
pub use schema::{attention, attention_reasons, needs_attention, EndFields, Execution, STATUSES};
use schema::{content, iso, key_str, node_key, step_key, summarize, Key};
pub use view::Report;
use view::{Kind, Loaded, ToolCall, KINDS};
use writer::{FileWriter, Writer};

/// Largest record accepted: [`crate::limits::MAX_RUN_RECORD_BYTES`].
pub const MAX_RECORD_BYTES: usize = crate::limits::MAX_RUN_RECORD_BYTES;
const LOCK_TIMEOUT: Duration = crate::limits::LOCK_TIMEOUT;
const CACHED_RUNS: usize = crate::limits::RUN_LOG_CACHED_RUNS;

/// One stored record of a run log: its file (`0` details, `1` steps, `2` tool calls, `3`
/// recovery) and the record.
pub type Line = (u8, Map<String, Value>);

/// The run logs under one `runs/` directory, or in a database several daemons share.
pub struct RunLog {
    store: Store,
    cache: Mutex<HashMap<String, Arc<Mutex<Loaded>>>>,
}

/// Where the logs are kept.
enum Store {
    Files(RunFiles),
    Pg(pg::PgRuns),
}

impl std::fmt::Debug for RunLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.store {
            Store::Files(files) => f
                .debug_struct("RunLog")
                .field("dir", &files.runs.path())
                .finish(),
            Store::Pg(p) => f.debug_struct("RunLog").field("db", &p.db).finish(),
        }
    }
}

/// A run id: the rule the streams use (it names a directory).
pub fn validate_run_id(id: &str) -> Result<(), RunLogError> {
    crate::streams::validate_run_id(id).map_err(|_| RunLogError::BadRunId {
        max: crate::limits::MAX_RUN_ID_BYTES,
    })
}

use crate::timefmt::now_ms;

impl RunLog {
    /// The run logs under `runs_dir` (created 0700 if missing). Its parent (the data
    /// directory) is taken as it is; `runs_dir` and everything below it are resolved beneath
    /// the parent on every use, never through a symlink.
    pub fn open(runs_dir: &Path, faults: Faults) -> Result<RunLog, RunLogError> {
        let (runs, _) = durable::Owned::make(runs_dir, &faults)?;
        Ok(RunLog {
            store: Store::Files(RunFiles {
                runs,
                faults,
                poison: Poison::default(),
            }),
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The run logs in a PostgreSQL database (the schema must be current:
    /// `Db::ensure_schema`).
    pub fn open_shared(db: Arc<crate::pg::Db>) -> RunLog {
        RunLog {
            store: Store::Pg(pg::PgRuns { db }),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the logs are in a shared database.
    pub fn is_shared(&self) -> bool {
        matches!(self.store, Store::Pg(_))
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
    /// log is made if missing; without, a run with no log is `not_found`.
    fn with_run<T>(
        &self,
        run_id: &str,
        create: bool,
        f: impl FnOnce(&mut dyn Writer, &mut Loaded) -> Result<T, RunLogError>,
    ) -> Result<T, RunLogError> {
        validate_run_id(run_id)?;
        let files = match &self.store {
            Store::Files(files) => files,
            Store::Pg(p) => {
                let slot = self.cached(run_id);
                let mut view = slot.lock().unwrap_or_else(PoisonError::into_inner);
                return p.with_run(run_id, create, &mut view, f);
            }
        };
        // Twice at most: a writer that waited for the lock while a prune deleted the run finds
        // the directory gone once it holds the lock, and starts again (creating it anew).
        let mut attempts = 0;
        let (dir, lock) = loop {
            attempts += 1;
            let dir = files.ensure_dir(run_id, create)?;
            let lock = RunFiles::lock(&dir, LOCK_TIMEOUT)?;
            if files.still_there(run_id, &dir) || attempts >= 2 {
                break (dir, lock);
            }
        };
        let slot = self.cached(run_id);
        let mut view = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if !view.swept {
            // Under the run's lock, which every rewrite of its files takes: a temp file of
            // theirs is what a killed rewrite left.
            files.sweep_temps(&dir)?;
            view.swept = true;
        }
        if let Err(e) = files.refresh(&dir, &mut view) {
            // Whatever was half-read is dropped: the next use reloads from the files.
            *view = Loaded::default();
            return Err(e);
        }
        let mut w = FileWriter { files, dir: &dir };
        let out = f(&mut w, &mut view);
        if view.stale
            || out
                .as_ref()
                .is_err_and(|e| matches!(e.kind(), ErrorKind::Storage | ErrorKind::Integrity))
        {
            // After a failed write the view is not trusted: the next use reloads the files.
            *view = Loaded::default();
        }
        drop(view);
        drop(lock);
        out
    }

    fn refuse_if_ended(run_id: &str, view: &Loaded) -> Result<(), RunLogError> {
        if view.ended() {
            return Err(RunLogError::Ended(run_id.to_owned()));
        }
        Ok(())
    }

    /// `run.log_node`: log a node completion; the same `(node_id, writer, attempt)` again keeps one
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
        key: Key,
        record: Map<String, Value>,
    ) -> Result<Value, RunLogError> {
        self.with_run(run_id, true, |w, view| {
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
                    let e = w.replace(view, kind, &old, record)?;
                    Ok(json!({"seq": e.seq, "written": true, "replaced": true}))
                }
                None => {
                    let e = w.append(view, kind, record)?;
                    let seq = e.seq;
                    view.keyed(kind).insert(key, e);
                    Ok(json!({"seq": seq, "written": true, "replaced": false}))
                }
            }
        })
    }

    /// `run.ensure_node`: log `detail` for `node_id` only if the log has no entry for that
    /// node (any attempt; by the detail's `writer` when it names one): one atomic
    /// check-and-write against the file.
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
            Some(_) => return Err(RunLogError::NodeIdDiffers),
        }
        let key = node_key(&detail)?;
        self.with_run(run_id, true, |w, view| {
            // Any attempt of this node by this writer (any writer's when the detail names
            // none): a range of the keys, not a scan.
            let from = Key {
                node: node_id.to_owned(),
                writer: key.writer.clone(),
                n: i64::MIN,
            };
            let mine = |k: &Key| key.writer.is_empty() || k.writer == key.writer;
            let mut found = view
                .nodes
                .range(from..)
                .take_while(|(k, _)| k.node == node_id);
            if let Some((_, e)) = found.find(|(k, _)| mine(k)) {
                return Ok(json!({"seq": e.seq, "written": false}));
            }
            Self::refuse_if_ended(run_id, view)?;
            let e = w.append(view, Kind::Details, detail)?;
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
        self.with_run(run_id, true, |w, view| {
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
            let e = w.append(view, Kind::Tools, rec)?;
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
        self.with_run(run_id, true, |w, view| {
            if view.ended() {
                return Ok(());
            }
            let e = w.append(view, Kind::Recovery, record)?;
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
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(vec![Execution::Unknown; ids.len()]),
            other => other,
        }
    }

    /// `run.end`: write `summary.json` from the logical entries. Idempotent: a second end
    /// returns the same summary and writes nothing.
    pub fn end(&self, run_id: &str, status: &str, given: &EndFields) -> Result<Value, RunLogError> {
        if !STATUSES.contains(&status) {
            return Err(RunLogError::BadStatus(STATUSES.join(", ")));
        }
        self.with_run(run_id, true, |w, view| {
            if let Some(s) = &view.summary {
                return Ok(json!({"summary": s, "written": false}));
            }
            let summary = summarize(run_id, view, status, given, now_ms());
            w.write_summary(&summary)?;
            view.summary = Some(summary.clone());
            Ok(json!({"summary": summary, "written": true}))
        })
    }

    /// `run.start`: the run exists and takes writes. Its log is made if missing (so a reader
    /// sees the run from its start, as hive's `start_run` makes its directory); an ended run
    /// is reopened. hive resurrects a failed execution with the same session id and logger
    /// (`ExecutionManager`, up to 3 times): its logger writes to the same log again and its
    /// next `end_run` summarizes everything, the failed attempts included. So the summary is
    /// removed (durably, under the run's lock); the entries stay, and the next `run.end`
    /// writes a summary of the whole log. `{reopened}`: whether there was a summary to remove.
    pub fn start(&self, run_id: &str) -> Result<Value, RunLogError> {
        self.with_run(run_id, true, |w, view| {
            if view.summary.is_none() {
                return Ok(json!({"reopened": false}));
            }
            w.remove_summary()?;
            view.summary = None;
            Ok(json!({"reopened": true}))
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
        let ids = match &self.store {
            Store::Files(files) => files
                .run_ids()?
                .into_iter()
                // A run directory may hold only a stream's state: no run log.
                .filter(|id| files.has_log(id))
                .collect(),
            Store::Pg(p) => p.run_ids()?,
        };
        for run_id in ids {
            let d = match self.with_run(&run_id, false, |_, view| {
                Ok(Self::describe(&run_id, view, false))
            }) {
                Ok(d) => d,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => json!({"run_id": run_id, "status": "unreadable", "error": e.to_string()}),
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
        let files = match &self.store {
            Store::Files(files) => files,
            Store::Pg(p) => return self.prune_shared(p, cutoff, keep, dry_run),
        };
        let mut out = Vec::new();
        let mut deleted = 0;
        for run_id in files.run_ids()? {
            // A link planted at a run's name is not a run's directory: not listed above.
            let Ok(Some(dir)) = files.runs.open(&[&run_id]) else {
                continue;
            };
            let Some(last) = RunFiles::last_activity_ms(&dir) else {
                continue;
            };
            if last >= cutoff || keep(&run_id) {
                continue;
            }
            if dry_run {
                out.push(json!({"run_id": run_id, "last_activity_ms": last}));
                continue;
            }
            match self.delete_run(files, &run_id, &dir, cutoff) {
                Ok(true) => {
                    deleted += 1;
                    out.push(json!({"run_id": run_id, "last_activity_ms": last}));
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(run_id, error = %e, "prune: could not delete a run");
                    out.push(
                        json!({"run_id": run_id, "last_activity_ms": last, "error": e.to_string()}),
                    );
                }
            }
        }
        if deleted > 0 {
            files.sync_dir()?;
        }
        Ok(out)
    }

    /// [`RunLog::prune`] in a shared database: each idle log deleted in a transaction under
    /// its lock, its age checked again there.
    fn prune_shared(
        &self,
        p: &pg::PgRuns,
        cutoff: u64,
        keep: &dyn Fn(&str) -> bool,
        dry_run: bool,
    ) -> Result<Vec<Value>, RunLogError> {
        let mut out = Vec::new();
        for (run_id, last) in p.idle(cutoff)? {
            if keep(&run_id) {
                continue;
            }
            let entry = json!({"run_id": run_id, "last_activity_ms": last});
            if dry_run {
                out.push(entry);
                continue;
            }
            match p.delete_run(&run_id, cutoff) {
                Ok(true) => {
                    self.forget(&run_id);
                    out.push(entry);
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(run_id, error = %e, "prune: could not delete a run log");
                    out.push(
                        json!({"run_id": run_id, "last_activity_ms": last, "error": e.to_string()}),
                    );
                }
            }
        }
        Ok(out)
    }

    /// Delete one run's directory under its lock if it is still idle since before `cutoff`.
    fn delete_run(
        &self,
        files: &RunFiles,
        run_id: &str,
        dir: &durable::Dir,
        cutoff: u64,
    ) -> Result<bool, RunLogError> {
        let lock = RunFiles::lock(dir, LOCK_TIMEOUT)?;
        // Written to while we waited for the lock: not old any more.
        if RunFiles::last_activity_ms(dir).is_some_and(|l| l >= cutoff) {
            return Ok(false);
        }
        files.remove_run(run_id)?;
        drop(lock);
        self.forget(run_id);
        Ok(true)
    }

    /// Every run with a log (for `holdfast migrate`).
    pub fn run_ids(&self) -> Result<Vec<String>, RunLogError> {
        Ok(self
            .list(None, None, None)?
            .iter()
            .filter_map(|d| d["run_id"].as_str().map(str::to_owned))
            .collect())
    }

    /// A run's log as it is stored: each file's records in order (by kind: `details`,
    /// `steps`, `tools`, `recovery`), and its summary if it ended (for `holdfast migrate`).
    pub fn export(&self, run_id: &str) -> Result<(Vec<Line>, Option<Value>), RunLogError> {
        self.with_run(run_id, false, |_, view| {
            let mut lines = Vec::new();
            for kind in KINDS {
                for e in view.records(kind) {
                    lines.push((kind.index() as u8, e.record.clone()));
                }
            }
            Ok((lines, view.summary.clone()))
        })
    }

    /// Write a run's log as [`RunLog::export`] gave it, into a run that has none: every
    /// record with its own `seq` and time, then the summary.
    pub fn import(
        &self,
        run_id: &str,
        lines: &[Line],
        summary: Option<&Value>,
    ) -> Result<(), RunLogError> {
        self.with_run(run_id, true, |w, view| {
            if view.next_seq > 0 || view.summary.is_some() {
                return Err(RunLogError::NotEmpty(run_id.to_owned()));
            }
            for (k, record) in lines {
                let kind = KINDS[(*k as usize).min(KINDS.len() - 1)];
                w.append_as_is(view, kind, record.clone())?;
            }
            if let Some(s) = summary {
                w.write_summary(s)?;
                view.summary = Some(s.clone());
            }
            Ok(())
        })
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
