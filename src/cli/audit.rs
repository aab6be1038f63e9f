//! `holdfast audit [--json] [--since …] [--id …] [--op …]` and `holdfast audit verify`: the audit
//! log of the data directory, read from its files (daemon or not); and [`Recorder`], what the
//! CLI records when it works on a store directly.

use std::io::Write;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::json;

use super::{out, out_json, CliError, CliResult, Global};
use crate::audit::read::{self, Verified};
use crate::audit::record::{unhex, Entry};
use crate::audit::{AuditLog, Durability, OnFailure, Record, Via, Who, BEGUN, OK};
use crate::durable::Faults;
use crate::error::ErrorKind;

/// Arguments of `holdfast audit`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AuditArgs {
    #[command(subcommand)]
    command: Option<AuditCommand>,
    /// Only records of this recent span (90s, 30m, 12h, 7d) or since this time
    /// (2026-11-27T10:00:00Z).
    #[arg(long, value_name = "SPAN|TIME")]
    since: Option<String>,
    /// Only records of this credential id.
    #[arg(long, value_name = "ID")]
    id: Option<String>,
    /// Only records of this operation (cred.get, cred.set, admin.rotate_key, connect, …).
    #[arg(long, value_name = "OP")]
    op: Option<String>,
    /// Only the last N records that match.
    #[arg(long, value_name = "N")]
    last: Option<usize>,
}

/// `holdfast audit …`
#[derive(Subcommand, Debug)]
enum AuditCommand {
    /// Check the whole chain: every record's hash, every link, segment boundaries, the start
    /// and the end. Exit 0 if it verifies, 6 (integrity) naming each break. Prints the head
    /// (last record's number and hash): keep it elsewhere and check it later with --anchor,
    /// which also catches a cut of the newest records (no chain can show that by itself).
    Verify {
        /// SEQ:HASH from an earlier `audit verify`: record SEQ must still be there with that
        /// hash.
        #[arg(long, value_name = "SEQ:HASH")]
        anchor: Option<String>,
    },
}

/// Run `holdfast audit`.
pub fn run(g: &Global, a: &AuditArgs) -> CliResult {
    let dir = crate::audit::dir_of(&g.data_dir()?);
    match &a.command {
        Some(AuditCommand::Verify { anchor }) => verify(g, &dir, anchor.as_deref()),
        None => show(g, &dir, a),
    }
}

fn io_error(e: std::io::Error) -> CliError {
    CliError::with_code(
        format!("reading the audit log: {e}"),
        ErrorKind::Storage.exit_code(),
    )
}

/// `--since`: a span back from now, or a time; in microseconds since the epoch.
fn since_micros(s: &str) -> CliResult<i64> {
    if let Some(t) = crate::timefmt::parse(s) {
        return Ok(t);
    }
    let span: Duration = super::runs::parse_span(s).map_err(|e| {
        CliError::usage(format!(
            "--since {e} (or a time such as 2026-11-27T10:00:00Z)"
        ))
    })?;
    let span = i64::try_from(span.as_micros()).unwrap_or(i64::MAX);
    Ok(crate::timefmt::now_micros().saturating_sub(span))
}

fn show(g: &Global, dir: &std::path::Path, a: &AuditArgs) -> CliResult {
    let since = a.since.as_deref().map(since_micros).transpose()?;
    let segs = read::snapshot(dir).map_err(io_error)?;
    let mut rows: Vec<Entry> = Vec::new();
    let mut damaged = 0usize;
    read::walk(dir, &segs, |_, _, line, _| match line {
        Ok(e) => {
            let keep = since.is_none_or(|t| e.micros().is_some_and(|m| m >= t))
                && a.id.as_deref().is_none_or(|id| e.id.as_deref() == Some(id))
                && a.op.as_deref().is_none_or(|op| e.op == op);
            if keep {
                rows.push(e);
            }
        }
        Err(_) => damaged += 1,
    })
    .map_err(io_error)?;
    if let Some(n) = a.last {
        rows.drain(..rows.len().saturating_sub(n));
    }
    if g.json {
        out_json(&serde_json::to_value(&rows).unwrap_or_default());
    } else if segs.is_empty() {
        out(format!("no audit log yet in {}", dir.display()));
    } else if rows.is_empty() {
        out("no records match");
    } else {
        table(&rows);
    }
    if damaged > 0 {
        let _ = writeln!(
            std::io::stderr(),
            "holdfast: warning: {damaged} line(s) of the audit log are not sound records (not shown); run `holdfast audit verify`"
        );
    }
    Ok(())
}

fn who_of(e: &Entry) -> String {
    let mut w = e.via.clone();
    if let Some(c) = &e.client {
        w.push_str(&format!(" {}", super::shown(c)));
    }
    if let Some(p) = &e.plugin {
        w.push_str(&format!(" plugin={}", super::shown(p)));
    }
    if let Some(p) = e.pid {
        w.push_str(&format!(" pid={p}"));
    }
    if let Some(u) = e.uid {
        w.push_str(&format!(" uid={u}"));
    }
    if let Some(c) = e.conn {
        w.push_str(&format!(" conn={c}"));
    }
    w
}

fn table(rows: &[Entry]) {
    let col = |f: &dyn Fn(&Entry) -> String, min: usize| {
        rows.iter()
            .map(|e| f(e).chars().count())
            .max()
            .unwrap_or(0)
            .max(min)
    };
    let op_of = |e: &Entry| e.op.clone();
    let store_of = |e: &Entry| {
        e.store
            .as_deref()
            .map(super::shown)
            .unwrap_or_else(|| "-".into())
    };
    let id_of = |e: &Entry| {
        e.id.as_deref()
            .map(super::shown)
            .unwrap_or_else(|| "-".into())
    };
    let result_of = |e: &Entry| match e.refers {
        Some(r) => format!("{} (of {r})", e.result),
        None => e.result.clone(),
    };
    let (wo, ws, wi, wr) = (
        col(&op_of, 2),
        col(&store_of, 5),
        col(&id_of, 2),
        col(&result_of, 6),
    );
    out(format!(
        "{:<23}  {:>6}  {:<wo$}  {:<ws$}  {:<wi$}  {:<wr$}  WHO",
        "TIME (UTC)", "SEQ", "OP", "STORE", "ID", "RESULT"
    ));
    for e in rows {
        let time = e.ts.replace('T', " ");
        let time: String = time.trim_end_matches('Z').chars().take(23).collect();
        let mut line = format!(
            "{time:<23}  {:>6}  {:<wo$}  {:<ws$}  {:<wi$}  {:<wr$}  {}",
            e.seq,
            op_of(e),
            store_of(e),
            id_of(e),
            result_of(e),
            who_of(e)
        );
        if let Some(d) = &e.detail {
            line.push_str(&format!("  {}", super::shown(&d.to_string())));
        }
        out(line.trim_end());
    }
}

fn verify(g: &Global, dir: &std::path::Path, anchor: Option<&str>) -> CliResult {
    let anchor = anchor
        .map(|a| {
            a.split_once(':')
                .and_then(|(s, h)| Some((s.parse::<u64>().ok()?, unhex(h)?)))
                .ok_or_else(|| {
                    CliError::usage(
                        "--anchor is SEQ:HASH (64 hex digits), as `audit verify` prints the head",
                    )
                })
        })
        .transpose()?;
    let v = read::verify(dir, anchor).map_err(io_error)?;
    if g.json {
        out_json(&serde_json::to_value(&v).unwrap_or_default());
    } else {
        report(dir, &v);
    }
    if v.ok() {
        Ok(())
    } else {
        Err(CliError::with_code(
            format!(
                "the audit chain does not verify: {} problem(s); the first: {}",
                v.problems.len(),
                v.problems[0]
            ),
            ErrorKind::Integrity.exit_code(),
        ))
    }
}

fn report(dir: &std::path::Path, v: &Verified) {
    if v.segments == 0 {
        out(format!(
            "no audit log in {}: no record was written yet, or every segment was removed (only an --anchor kept elsewhere tells the two apart)",
            dir.display()
        ));
        return;
    }
    out(format!(
        "audit log {}: {} record(s) in {} segment(s), seq {} to {} ({} to {})",
        dir.display(),
        v.records,
        v.segments,
        v.first_seq.map_or("-".into(), |s| s.to_string()),
        v.last_seq.map_or("-".into(), |s| s.to_string()),
        v.first_ts.as_deref().unwrap_or("-"),
        v.last_ts.as_deref().unwrap_or("-"),
    ));
    if let Some(t) = v.dropped_through {
        out(format!(
            "records up to seq {t} were dropped by retention (an audit.drop record vouches for the first one kept)"
        ));
    }
    if let Some(a) = &v.anchor {
        out(format!("anchor: {a}"));
    }
    for p in &v.problems {
        out(format!("BREAK {p}"));
    }
    if let (Some(s), Some(h)) = (v.last_seq, &v.head_hash) {
        out(format!("head: {s}:{h}"));
    }
    if v.ok() {
        out("the chain verifies: no record was edited, removed, inserted or reordered (a cut of the newest records shows only against an --anchor kept elsewhere)");
    }
}

/// What the CLI records when it works on a store directly: each operation's outcome (synced
/// before its result is shown), and a change's durable `begun` record before the change.
pub(super) struct Recorder {
    log: AuditLog,
    store: String,
}

impl Recorder {
    /// The recorder for store `store` (its name, or its path when opened by directory), in this
    /// invocation's data directory's log; `None` if the config turns the log off.
    pub(super) fn open(g: &Global, store: &str) -> CliResult<Option<Recorder>> {
        let mut settings = g.config()?.audit_settings();
        if !settings.enabled {
            return Ok(None);
        }
        // A CLI process exits right after its operation: its records are synced first.
        settings.durability = Durability::Always;
        let dir = crate::audit::dir_of(&g.data_dir()?);
        Ok(Some(Recorder {
            log: AuditLog::new(dir, settings, Faults::none()),
            store: store.to_owned(),
        }))
    }

    fn record(&self, op: &'static str, id: Option<&str>, result: &'static str) -> Record {
        let who = Who {
            via: Via::Cli,
            client: Some("holdfast-cli".into()),
            plugin: None,
            pid: Some(std::process::id()),
            uid: Some(crate::durable::perms::euid()),
            conn: None,
        };
        let rec = Record::new(op, result, who).store(&self.store);
        match id {
            Some(id) => rec.id(id),
            None => rec,
        }
    }

    fn refusal(e: &crate::audit::AuditError) -> CliError {
        CliError::with_code(e.refusal(), e.kind().exit_code())
    }

    /// Record a read's outcome `r`; its result, or the refusal if the record cannot be written.
    pub(super) fn read<T>(
        &self,
        op: &'static str,
        id: Option<&str>,
        r: Result<T, crate::store::Error>,
    ) -> CliResult<T> {
        let result = r.as_ref().map_or_else(|e| e.kind().as_str(), |_| OK);
        match self.log.record(self.record(op, id, result), true) {
            Ok(_) => {}
            Err(e) if self.log.settings().on_failure == OnFailure::ServeReads => {
                let _ = writeln!(
                    std::io::stderr(),
                    "holdfast: warning: not recorded in the audit log: {e}"
                );
            }
            Err(e) => return Err(Self::refusal(&e)),
        }
        Ok(r?)
    }

    /// Record what opening the store repaired, if anything (the repair is made by then: a
    /// failure to record it is said on stderr).
    pub(super) fn repaired(&self, report: &crate::store::Report) {
        let Some(changes) = report.changes() else {
            return;
        };
        let rec = self.record("store.repair", None, OK).detail(changes);
        if let Err(e) = self.log.record(rec, true) {
            let _ = writeln!(
                std::io::stderr(),
                "holdfast: warning: the repairs made opening the store could not be recorded in the audit log: {e}"
            );
        }
    }

    /// Record a call refused before any store was touched (a failure to record it is said on
    /// stderr: nothing was done either way).
    pub(super) fn refused(&self, op: &'static str, id: Option<&str>, result: &'static str) {
        if let Err(e) = self.log.record(self.record(op, id, result), true) {
            let _ = writeln!(
                std::io::stderr(),
                "holdfast: warning: a refused call could not be recorded in the audit log: {e}"
            );
        }
    }

    /// Record that a change begins (durably): an error means it must not be made.
    pub(super) fn begin(&self, op: &'static str, id: Option<&str>) -> CliResult<u64> {
        self.log
            .record(self.record(op, id, BEGUN), true)
            .map_err(|e| Self::refusal(&e))
    }

    /// Record a change's outcome `r`. The change was attempted whatever the log says now: its
    /// result stands, and a failure to record it is said on stderr.
    pub(super) fn outcome<T>(
        &self,
        op: &'static str,
        id: Option<&str>,
        begun: u64,
        r: Result<T, crate::store::Error>,
    ) -> CliResult<T> {
        let result = r.as_ref().map_or_else(|e| e.kind().as_str(), |_| OK);
        self.done(op, id, begun, result, None);
        Ok(r?)
    }

    /// Record the outcome `result` of the change begun as record `begun` (a failure to record
    /// it is said on stderr: the change was attempted either way).
    pub(super) fn done(
        &self,
        op: &'static str,
        id: Option<&str>,
        begun: u64,
        result: &'static str,
        detail: Option<serde_json::Value>,
    ) {
        let mut rec = self.record(op, id, result);
        rec.refers = Some(begun);
        rec.detail = detail;
        if let Err(e) = self.log.record(rec, true) {
            let _ = writeln!(
                std::io::stderr(),
                "holdfast: warning: the change was attempted, but its outcome could not be recorded in the audit log (its begun record, seq {begun}, is): {e}"
            );
        }
    }

    /// A change: `begun`, then `f`, then its outcome.
    pub(super) fn change<T>(
        &self,
        op: &'static str,
        id: Option<&str>,
        f: impl FnOnce() -> Result<T, crate::store::Error>,
    ) -> CliResult<T> {
        let begun = self.begin(op, id)?;
        self.outcome(op, id, begun, f())
    }
}

/// The detail of a recorded serve-in-place import: which directory, how.
pub(super) fn import_detail(path: &std::path::Path, mode: &str) -> serde_json::Value {
    json!({"path": path, "mode": mode})
}
