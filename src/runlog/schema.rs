//! hive's run-log schema, as holdfast keeps it: the keys of node details and steps, the
//! attention rules and reasons (hive's `RuntimeLogger.log_node_complete`), the fields `run.end`
//! takes and the summary it writes (hive's `RunSummaryLog`, field for field). Pure functions of
//! records: no file here.

use serde_json::{json, Map, Value};

use super::error::RunLogError;
use super::view::{Kind, Loaded};
use crate::limits::MAX_RUN_LOG_KEY_BYTES;

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

/// Unix ms as hive's ISO time. `ms` may come from a file (`logged_at_ms` of any line): a value
/// past what microseconds in an `i64` hold (year 294,247) is written as that limit, not
/// wrapped (or, with overflow checks, a panic: found by the `runlog_lines` fuzz target).
pub(super) fn iso(ms: u64) -> String {
    let micros = i64::try_from(ms).map_or(i64::MAX, |ms| ms.saturating_mul(1000));
    crate::timefmt::format_z(micros)
}

/// A string field of at most 256 bytes, non-empty.
pub(super) fn key_str(
    o: &Map<String, Value>,
    field: &str,
    what: &str,
) -> Result<String, RunLogError> {
    match o.get(field) {
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_RUN_LOG_KEY_BYTES => {
            Ok(s.clone())
        }
        _ => Err(RunLogError::MissingString {
            what: what.to_owned(),
            field: field.to_owned(),
            max: MAX_RUN_LOG_KEY_BYTES,
        }),
    }
}

pub(super) fn key_int(
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
            .ok_or_else(|| RunLogError::BadInteger {
                what: what.to_owned(),
                field: field.to_owned(),
            }),
        None => Err(RunLogError::MissingInteger {
            what: what.to_owned(),
            field: field.to_owned(),
        }),
    }
}

/// The logical key of a node detail or a step within a run.
///
/// `writer` is the optional `writer` field of the record (empty when absent): a token a
/// logger picks for itself so that two processes logging the same run, each numbering its
/// visits of a node from its own count, keep their entries apart instead of one's visit 1
/// replacing the other's. Records without one key as they always did. Ordered by node first,
/// so all entries of a node are one range.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    pub(super) node: String,
    pub(super) writer: String,
    /// The attempt (details) or the visit-qualified step index (steps).
    pub(super) n: i64,
}

/// Largest `writer` token accepted (a uuid's 32 hex digits, with room to spare).
pub(super) const MAX_WRITER_BYTES: usize = 64;

fn writer_of(o: &Map<String, Value>, what: &str) -> Result<String, RunLogError> {
    match o.get("writer") {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_WRITER_BYTES => Ok(s.clone()),
        Some(_) => Err(RunLogError::BadString {
            what: what.to_owned(),
            field: "writer".to_owned(),
            max: MAX_WRITER_BYTES,
        }),
    }
}

/// The key of a node detail: `(node_id, writer, attempt)`; attempt defaults to 1 as in hive.
pub(super) fn node_key(o: &Map<String, Value>) -> Result<Key, RunLogError> {
    Ok(Key {
        node: key_str(o, "node_id", "detail")?,
        writer: writer_of(o, "detail")?,
        n: key_int(o, "attempt", "detail", Some(1))?,
    })
}

/// The key of a step: `(node_id, writer, step_index)` within the node's visit. hive numbers a
/// node's steps from 0 on each visit (a retried node, a feedback loop's revisit), so a step
/// record may say which visit it belongs to with `attempt` (the visit's number, as its node
/// detail's; default 1): the steps of a later visit are entries of their own instead of
/// replacing the first visit's. Attempt 1 keys as before (`step_index` itself: the keys of
/// existing logs do not change); attempt `a` > 1 keys as `(a - 1) << 32 | step_index`, so there
/// it needs `step_index < 2^32` and `a <= 2^31`.
pub(super) fn step_key(o: &Map<String, Value>) -> Result<Key, RunLogError> {
    let node = key_str(o, "node_id", "step")?;
    let writer = writer_of(o, "step")?;
    let index = key_int(o, "step_index", "step", None)?;
    let attempt = key_int(o, "attempt", "step", Some(1))?;
    if attempt <= 1 {
        return Ok(Key {
            node,
            writer,
            n: index,
        });
    }
    let bad = |field: &str| RunLogError::BadInteger {
        what: "step".to_owned(),
        field: field.to_owned(),
    };
    if index >= 1 << VISIT_SHIFT {
        return Err(bad("step_index"));
    }
    if attempt > 1 << 31 {
        return Err(bad("attempt"));
    }
    Ok(Key {
        node,
        writer,
        n: ((attempt - 1) << VISIT_SHIFT) | index,
    })
}

/// Where a step key keeps the visit (`step_key`).
const VISIT_SHIFT: u32 = 32;

/// The record without the fields holdfast sets (to compare content).
pub(super) fn content(record: &Map<String, Value>) -> Map<String, Value> {
    let mut m = record.clone();
    m.remove("seq");
    m.remove("logged_at_ms");
    m
}

pub(super) fn int(v: Option<&Value>) -> i64 {
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
pub(super) fn summarize(
    run_id: &str,
    l: &Loaded,
    status: &str,
    given: &EndFields,
    now: u64,
) -> Value {
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
