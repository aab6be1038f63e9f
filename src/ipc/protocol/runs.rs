//! `run.*` on the wire: each method's params, read once from the request's text, and the
//! results the handlers build.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A `run.*` call with its typed params.
#[derive(Debug)]
pub enum RunCall {
    /// `run.log_node`.
    LogNode(LogNode),
    /// `run.ensure_node`.
    EnsureNode(EnsureNode),
    /// `run.log_step`.
    LogStep(LogStep),
    /// `run.tool_begin`.
    ToolBegin(ToolBegin),
    /// `run.tool_end`.
    ToolEnd(ToolEnd),
    /// `run.end`.
    End(End),
    /// `run.start`.
    Start(Start),
    /// `run.get`.
    Get(Get),
    /// `run.list`.
    List(List),
    /// `run.prune`.
    Prune(Prune),
}

/// `run.log_node`: a node's details (hive's `NodeDetail`; its `node_id` inside).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogNode {
    /// The run.
    pub run_id: String,
    /// The node's record.
    pub detail: Map<String, Value>,
}

/// `run.ensure_node`: a node logged once, whoever asks first.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnsureNode {
    /// The run.
    pub run_id: String,
    /// The node.
    pub node_id: String,
    /// Its record, when this call is the one that logs it.
    #[serde(default)]
    pub detail: Map<String, Value>,
}

/// `run.log_step`: one step (hive's `NodeStepLog`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogStep {
    /// The run.
    pub run_id: String,
    /// The step's record.
    pub step: Map<String, Value>,
}

/// `run.tool_begin`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolBegin {
    /// The run.
    pub run_id: String,
    /// The call's id (once per run).
    pub tool_call_id: String,
    /// The tool.
    pub name: String,
    /// Its input.
    #[serde(default)]
    pub input: Value,
}

/// `run.tool_end`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolEnd {
    /// The run.
    pub run_id: String,
    /// The call's id.
    pub tool_call_id: String,
    /// Its result.
    #[serde(default)]
    pub result: Value,
    /// Whether it failed.
    #[serde(default)]
    pub is_error: bool,
}

/// `run.end`: the run's status and the summary fields the caller gives (hive's
/// `RunSummaryLog`; the rest is computed from the log).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct End {
    /// The run.
    pub run_id: String,
    /// `success`, `failure`, …
    pub status: String,
    /// hive's `agent_id`.
    #[serde(default)]
    pub agent_id: Option<String>,
    /// hive's `goal_id`.
    #[serde(default)]
    pub goal_id: Option<String>,
    /// hive's `execution_quality`.
    #[serde(default)]
    pub execution_quality: Option<String>,
    /// OpenTelemetry trace id.
    #[serde(default)]
    pub trace_id: Option<String>,
    /// Session / execution correlation id.
    #[serde(default)]
    pub execution_id: Option<String>,
    /// When the run started, as the caller records it.
    #[serde(default)]
    pub started_at: Option<String>,
    /// How long the run took, as the caller measured it.
    #[serde(default)]
    pub duration_ms: Option<u64>,
    /// The nodes in the order the graph visited them.
    #[serde(default)]
    pub node_path: Option<Vec<String>>,
}

impl End {
    /// The run id, the status and the summary fields given.
    pub fn into_parts(self) -> (String, String, crate::runlog::EndFields) {
        let given = crate::runlog::EndFields {
            agent_id: self.agent_id,
            goal_id: self.goal_id,
            execution_quality: self.execution_quality,
            trace_id: self.trace_id,
            execution_id: self.execution_id,
            started_at: self.started_at,
            duration_ms: self.duration_ms,
            node_path: self.node_path,
        };
        (self.run_id, self.status, given)
    }
}

/// `run.start`: the run's log made if missing, an ended run reopened (its summary removed).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Start {
    /// The run.
    pub run_id: String,
}

/// `run.get`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Get {
    /// The run.
    pub run_id: String,
}

/// `run.list`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct List {
    /// Only runs of this status.
    #[serde(default)]
    pub status: Option<String>,
    /// Only runs started at or after (ms since the epoch).
    #[serde(default)]
    pub since_ms: Option<u64>,
    /// Only runs started before (ms since the epoch).
    #[serde(default)]
    pub until_ms: Option<u64>,
}

/// `run.prune`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prune {
    /// Remove runs whose last record is older than this.
    pub older_than_days: f64,
    /// Say what would be removed, remove nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// `run.list`'s result.
#[derive(Serialize)]
pub struct Listing {
    /// Each run's summary.
    pub runs: Vec<Value>,
}

/// `run.prune`'s result.
#[derive(Serialize)]
pub struct Pruned {
    /// The runs removed (or, with `dry_run`, that would be).
    pub pruned: Vec<Value>,
    /// Whether nothing was removed.
    pub dry_run: bool,
}
