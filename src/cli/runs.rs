//! `holdfast runs list | show RUN | summary RUN | prune`: the run logs.
//!
//! Read straight from `<data_dir>/runs/` under each run's lock, so they work with or without a
//! daemon, while agents keep appending. `prune` goes through the daemon when one answers (it
//! knows which runs have a live stream); `show` adds the stream's state from the daemon too.

use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::{out, out_json, CliError, CliResult, Global};
use crate::runlog::{RunLog, RunLogError};

/// `holdfast runs …`
#[derive(Subcommand, Debug)]
pub enum RunsCommand {
    /// Runs with a run log, newest activity first: run, status (`running` until `run.end`),
    /// nodes, tokens (input + output), attention, age of the last record.
    List(ListArgs),
    /// One run's timeline: node completions, steps and tool calls in the order they were
    /// logged, the summary so far, what loading the log repaired; and, when the daemon answers,
    /// the run's stream (status, attempts, its last recovery plan).
    Show(RunArg),
    /// The run's summary (hive's summary.json fields): final once the run ended, else as it
    /// stands now (status `running`).
    Summary(RunArg),
    /// Delete the directories of runs idle for longer than --older-than (run log, summary,
    /// stream state). Runs with a live stream are kept. Through the daemon when one answers.
    Prune(PruneArgs),
}

/// A run id.
#[derive(Args, Debug)]
pub struct RunArg {
    /// The run id.
    run: String,
}

/// Arguments of `holdfast runs list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only runs with this status: running, success, failure, degraded, cancelled, timeout.
    #[arg(long)]
    status: Option<String>,
    /// Only runs with a record in this recent span: e.g. 90s, 30m, 12h, 7d.
    #[arg(long, value_name = "SPAN", value_parser = parse_span)]
    since: Option<Duration>,
}

/// Arguments of `holdfast runs prune`.
#[derive(Args, Debug)]
pub struct PruneArgs {
    /// Age in days (fractions allowed) past which an idle run is deleted. Default: the config's
    /// `[runs] retention_days` (30 unless set).
    #[arg(long, value_name = "DAYS")]
    older_than: Option<f64>,
    /// Only list what would be deleted.
    #[arg(long)]
    dry_run: bool,
}

/// `90s`, `30m`, `12h`, `7d` (a bare number is seconds).
pub(super) fn parse_span(s: &str) -> Result<Duration, String> {
    // The unit is the trailing letters, so exponents (`1e3d`) stay with the number.
    let num = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &s[num.len()..];
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: a number and a unit, e.g. 30m, 12h, 7d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86_400.0,
        _ => return Err(format!("{s:?}: the unit is one of s, m, h, d")),
    };
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(format!("{s:?}: must be a non-negative span"));
    }
    // User input: a span too long for a Duration is an error, not a panic.
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?}: too long a span"))
}

impl From<RunLogError> for CliError {
    fn from(e: RunLogError) -> Self {
        CliError::with_code(e.to_string(), e.kind().exit_code())
    }
}

use super::age;
use crate::timefmt::now_ms;

/// The run logs where the config keeps them: the data directory's files, or the PostgreSQL
/// backend's database (`[backend] kind = "postgres"`: the schema must be current).
fn open(g: &Global) -> CliResult<RunLog> {
    let config = g.config()?;
    if let Some(settings) = config.postgres().map_err(CliError::usage)? {
        let fail = |e: crate::pg::DbError| CliError::with_code(e, 1);
        let db = crate::pg::Db::new(settings).map_err(fail)?;
        let d = std::sync::Arc::clone(&db);
        db.run(async move { d.ensure_schema(false).await })
            .map_err(fail)?
            .map_err(fail)?;
        return Ok(RunLog::open_shared(db));
    }
    let (_, runs) = crate::streams::dirs(&g.data_dir()?);
    Ok(RunLog::open(&runs, crate::durable::Faults::none())?)
}

/// `" (not ended)"` for a run that has not had its `run.end`.
fn not_ended(r: &Value) -> &'static str {
    if r["ended"] == json!(true) {
        ""
    } else {
        " (not ended)"
    }
}

/// Whether a summary needs attention (hive's flag: a node may need it without a reason, when
/// it failed without an error message) and its reasons.
fn attention(s: &Value) -> (bool, Vec<&str>) {
    let reasons = strings(s, "attention_reasons");
    (
        s["needs_attention"] == Value::Bool(true) || !reasons.is_empty(),
        reasons,
    )
}

/// The strings of a JSON array field.
fn strings<'a>(v: &'a Value, field: &str) -> Vec<&'a str> {
    v[field]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn tokens(s: &Value) -> i64 {
    // The summary is a file anyone (hive) may have written: add without overflowing.
    let count = |f: &str| s[f].as_i64().unwrap_or(0);
    count("total_input_tokens").saturating_add(count("total_output_tokens"))
}

/// Run `holdfast runs …`.
pub fn run(g: &Global, c: &RunsCommand) -> CliResult {
    match c {
        RunsCommand::List(a) => {
            let since = a
                .since
                .map(|d| now_ms().saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
            let runs = open(g)?.list(a.status.as_deref(), since, None)?;
            if g.json {
                out_json(&json!({ "runs": runs }));
                return Ok(());
            }
            if runs.is_empty() {
                out("no runs");
                return Ok(());
            }
            out(format!(
                "{:<36} {:<10} {:>6} {:>10} {:<9} {:>5}",
                "run", "status", "nodes", "tokens", "attention", "age"
            ));
            for r in &runs {
                let s = &r["summary"];
                let (attention, reasons) = attention(s);
                out(format!(
                    "{:<36} {:<10} {:>6} {:>10} {:<9} {:>5}",
                    r["run_id"].as_str().unwrap_or("?"),
                    r["status"].as_str().unwrap_or("?"),
                    r["nodes"],
                    tokens(s),
                    match (attention, reasons.len()) {
                        (false, _) => "-".into(),
                        (true, 0) => "yes".into(),
                        (true, n) => format!("yes ({n})"),
                    },
                    age(r["last_logged_at_ms"].as_u64()),
                ));
            }
            Ok(())
        }
        RunsCommand::Summary(a) => {
            let r = open(g)?.get(&a.run)?;
            let s = &r["summary"];
            if g.json {
                out_json(s);
                return Ok(());
            }
            let path = strings(s, "node_path");
            out(format!("run        {}", a.run));
            out(format!(
                "status     {}{}",
                s["status"].as_str().unwrap_or("?"),
                not_ended(&r)
            ));
            out(format!(
                "nodes      {} ({})",
                s["total_nodes_executed"],
                super::shown(&path.join(" -> "))
            ));
            out(format!(
                "tokens     {} in, {} out",
                s["total_input_tokens"], s["total_output_tokens"]
            ));
            out(format!(
                "started    {}",
                s["started_at"].as_str().unwrap_or("?")
            ));
            out(format!("duration   {} ms", s["duration_ms"]));
            match attention(s) {
                (false, _) => out("attention  no"),
                (true, reasons) if reasons.is_empty() => {
                    out("attention  yes (a node failed without an error message, or said so)")
                }
                (true, reasons) => {
                    out("attention  yes:");
                    for r in reasons {
                        out(format!("  - {}", super::shown(r)));
                    }
                }
            }
            Ok(())
        }
        RunsCommand::Show(a) => show(g, &a.run),
        RunsCommand::Prune(a) => prune(g, a),
    }
}

fn show(g: &Global, run: &str) -> CliResult {
    let mut r = open(g)?.get(run)?;
    // The stream, if the daemon serves one for this run (text withheld: `stream show`).
    if let Ok(Some(mut client)) = g.daemon() {
        if let Ok(s) = client.call("stream.get", json!({"run_id": run})) {
            r["stream"] = s;
        }
    }
    if g.json {
        out_json(&r);
        return Ok(());
    }
    let s = &r["summary"];
    out(format!(
        "run {run}: {}{}, {} nodes, {} steps, {} tool calls, {} interruptions, {} tokens",
        r["status"].as_str().unwrap_or("?"),
        not_ended(&r),
        r["nodes"],
        r["steps"],
        r["tool_calls"],
        r["interruptions"],
        tokens(s)
    ));
    let mut rows: Vec<(u64, u64, String)> = Vec::new();
    let t0 = r["first_logged_at_ms"].as_u64().unwrap_or(0);
    let at = |v: &Value| v["logged_at_ms"].as_u64().unwrap_or(0);
    let seq = |v: &Value| v["seq"].as_u64().unwrap_or(0);
    for d in r["details"].as_array().into_iter().flatten() {
        let ok = match d["success"].as_bool() {
            Some(true) => "ok",
            Some(false) => "FAILED",
            None => "-",
        };
        rows.push((
            at(d),
            seq(d),
            format!(
                "node  {} (attempt {}) {ok}, {} in / {} out tokens, {} ms",
                d["node_id"].as_str().unwrap_or("?"),
                d["attempt"].as_i64().unwrap_or(1),
                d["input_tokens"].as_i64().unwrap_or(0),
                d["output_tokens"].as_i64().unwrap_or(0),
                d["latency_ms"].as_i64().unwrap_or(0)
            ),
        ));
    }
    for st in r["steps_log"].as_array().into_iter().flatten() {
        let text: String = st["llm_text"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(60)
            .collect::<String>()
            .replace('\n', " ");
        rows.push((
            at(st),
            seq(st),
            format!(
                "step  {} #{} {:?}",
                st["node_id"].as_str().unwrap_or("?"),
                st["step_index"],
                text
            ),
        ));
    }
    for t in r["tool_log"].as_array().into_iter().flatten() {
        let what = match t["event"].as_str() {
            Some("begin") => format!("begin {}", t["tool_name"].as_str().unwrap_or("?")),
            _ => format!(
                "end {}{}",
                if t["is_error"] == json!(true) {
                    "error"
                } else {
                    "ok"
                },
                t["duration_s"]
                    .as_f64()
                    .map_or(String::new(), |d| format!(" ({d:.3} s)"))
            ),
        };
        rows.push((
            at(t),
            seq(t),
            format!("tool  {} {what}", t["tool_use_id"].as_str().unwrap_or("?")),
        ));
    }
    for p in r["recovery_log"].as_array().into_iter().flatten() {
        let calls = |k: &str| -> String {
            let v: Vec<String> = p[k]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| match c["execution"].as_str() {
                    Some(e) => format!("{} {e}", c["id"].as_str().unwrap_or("?")),
                    None => c["id"].as_str().unwrap_or("?").to_owned(),
                })
                .collect();
            if v.is_empty() {
                "-".into()
            } else {
                v.join(", ")
            }
        };
        let cause = match p["status"].as_u64() {
            Some(code) => format!("{} ({code})", p["cause"].as_str().unwrap_or("?")),
            None => p["cause"].as_str().unwrap_or("?").to_owned(),
        };
        rows.push((
            at(p),
            seq(p),
            format!(
                "plan  {} {} after {cause}: completed {}; cancelled {}; wait {} ms",
                p["event"].as_str().unwrap_or("?"),
                p["plan"].as_str().unwrap_or("?"),
                calls("completed"),
                calls("cancelled"),
                p["wait_ms"].as_u64().unwrap_or(0)
            ),
        ));
    }
    rows.sort();
    for (ms, seq, text) in rows {
        out(format!(
            "  +{:>8.3}s  #{seq:<5} {}",
            ms.saturating_sub(t0) as f64 / 1000.0,
            super::shown(&text)
        ));
    }
    match attention(s) {
        (true, reasons) if reasons.is_empty() => out("needs attention: yes"),
        (true, reasons) => out(format!(
            "needs attention: {}",
            super::shown(&reasons.join("; "))
        )),
        (false, _) => {}
    }
    if let Some(st) = r.get("stream") {
        let a = &st["attempts"];
        out(format!(
            "stream: {}, epoch {}, attempts transient {} / rate-limited {} / overloaded {}, last plan {}",
            st["status"].as_str().unwrap_or("?"),
            st["epoch"],
            a["transient"].as_u64().unwrap_or(0),
            a["rate_limited"].as_u64().unwrap_or(0),
            a["overloaded"].as_u64().unwrap_or(0),
            st["last_plan"]["plan"].as_str().unwrap_or("-")
        ));
    }
    if r["report"] != json!(crate::runlog::Report::default()) {
        out(format!("log repaired or skipped on load: {}", r["report"]));
    }
    Ok(())
}

fn prune(g: &Global, a: &PruneArgs) -> CliResult {
    let days = match a.older_than {
        Some(d) if Duration::try_from_secs_f64(d * 86_400.0).is_ok() => d,
        Some(_) => {
            return Err(CliError::usage(
                "--older-than takes a non-negative number of days",
            ))
        }
        None => match g.config()?.run_retention() {
            Some(age) => age.as_secs_f64() / 86_400.0,
            None => {
                out("[runs] retention_days = 0: runs are kept forever (pass --older-than to prune anyway)");
                return Ok(());
            }
        },
    };
    let (result, via) = match g.daemon()? {
        Some(mut client) => (
            client.call(
                "run.prune",
                json!({"older_than_days": days, "dry_run": a.dry_run}),
            )?,
            "the daemon",
        ),
        None => {
            // No daemon answers; but one serving this data directory (with --offline, or not
            // answering yet) would know of live streams that the files do not show.
            let data_dir = g.data_dir()?;
            let held = crate::durable::lock::try_lock(
                &data_dir.join("daemon.lock"),
                crate::durable::LockMode::Exclusive,
            )
            .map_err(|e| CliError::with_code(e.to_string(), 7))?;
            if held.is_none() {
                return Err(CliError::with_code(
                    format!(
                        "a daemon holds {}: prune through it (without --offline), so runs with a \
                         live stream are kept",
                        data_dir.join("daemon.lock").display()
                    ),
                    8,
                ));
            }
            let age = Duration::try_from_secs_f64(days * 86_400.0)
                .map_err(|_| CliError::usage("--older-than: out of range"))?;
            // No daemon runs: no stream is live.
            let pruned = open(g)?.prune(age, &|_| false, a.dry_run)?;
            drop(held);
            (
                json!({"pruned": pruned, "dry_run": a.dry_run}),
                "the files (no daemon running)",
            )
        }
    };
    if g.json {
        out_json(&result);
        return Ok(());
    }
    let runs = result["pruned"].as_array().cloned().unwrap_or_default();
    let verb = if a.dry_run { "would delete" } else { "deleted" };
    let (failed, done): (Vec<&Value>, Vec<&Value>) =
        runs.iter().partition(|r| r.get("error").is_some());
    for r in &done {
        out(format!(
            "{verb} {} (idle {})",
            r["run_id"].as_str().unwrap_or("?"),
            age(r["last_activity_ms"].as_u64())
        ));
    }
    out(format!(
        "{verb} {} run(s) idle for more than {days} day(s), via {via}",
        done.len()
    ));
    if !failed.is_empty() {
        let why: Vec<String> = failed
            .iter()
            .map(|r| {
                format!(
                    "{}: {}",
                    r["run_id"].as_str().unwrap_or("?"),
                    r["error"].as_str().unwrap_or("?")
                )
            })
            .collect();
        return Err(CliError::with_code(
            format!(
                "{} run(s) could not be deleted: {}",
                failed.len(),
                why.join("; ")
            ),
            7,
        ));
    }
    Ok(())
}
