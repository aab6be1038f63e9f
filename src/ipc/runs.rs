//! `run.*`: thin handlers over [`crate::runlog::RunLog`] (file work on the blocking pool).

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::handlers::blocking;
use super::protocol::{params, Request, RpcError};
use crate::service::Daemon;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogNode {
    run_id: String,
    detail: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnsureNode {
    run_id: String,
    node_id: String,
    #[serde(default)]
    detail: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogStep {
    run_id: String,
    step: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolBegin {
    run_id: String,
    tool_call_id: String,
    name: String,
    #[serde(default)]
    input: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolEnd {
    run_id: String,
    tool_call_id: String,
    #[serde(default)]
    result: Value,
    #[serde(default)]
    is_error: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct End {
    run_id: String,
    status: String,
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    goal_id: Option<String>,
    #[serde(default)]
    execution_quality: Option<String>,
    #[serde(default)]
    trace_id: Option<String>,
    #[serde(default)]
    execution_id: Option<String>,
    #[serde(default)]
    started_at: Option<String>,
    #[serde(default)]
    duration_ms: Option<u64>,
    #[serde(default)]
    node_path: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Get {
    run_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct List {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    since_ms: Option<u64>,
    #[serde(default)]
    until_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Prune {
    older_than_days: f64,
    #[serde(default)]
    dry_run: bool,
}

/// Route a `run.*` request (already admitted).
pub async fn dispatch(daemon: &Arc<Daemon>, req: Request) -> Result<Value, RpcError> {
    let log = daemon.run_log().map_err(RpcError::from)?;
    match req.method.as_str() {
        "run.log_node" => {
            let p: LogNode = params(req.params)?;
            blocking(move || log.log_node(&p.run_id, p.detail)).await
        }
        "run.ensure_node" => {
            let p: EnsureNode = params(req.params)?;
            blocking(move || log.ensure_node(&p.run_id, &p.node_id, p.detail)).await
        }
        "run.log_step" => {
            let p: LogStep = params(req.params)?;
            blocking(move || log.log_step(&p.run_id, p.step)).await
        }
        "run.tool_begin" => {
            let p: ToolBegin = params(req.params)?;
            blocking(move || log.tool_begin(&p.run_id, &p.tool_call_id, &p.name, p.input)).await
        }
        "run.tool_end" => {
            let p: ToolEnd = params(req.params)?;
            blocking(move || log.tool_end(&p.run_id, &p.tool_call_id, p.result, p.is_error)).await
        }
        "run.end" => {
            let p: End = params(req.params)?;
            let given = crate::runlog::EndFields {
                agent_id: p.agent_id,
                goal_id: p.goal_id,
                execution_quality: p.execution_quality,
                trace_id: p.trace_id,
                execution_id: p.execution_id,
                started_at: p.started_at,
                duration_ms: p.duration_ms,
                node_path: p.node_path,
            };
            blocking(move || log.end(&p.run_id, &p.status, &given)).await
        }
        "run.get" => {
            let p: Get = params(req.params)?;
            blocking(move || log.get(&p.run_id)).await
        }
        "run.list" => {
            let p: List = params(req.params)?;
            blocking(move || {
                log.list(p.status.as_deref(), p.since_ms, p.until_ms)
                    .map(|runs| json!({"runs": runs}))
            })
            .await
        }
        "run.prune" => {
            let p: Prune = params(req.params)?;
            let age = Duration::try_from_secs_f64(p.older_than_days * 86_400.0).map_err(|_| {
                RpcError::invalid_params(
                    "older_than_days must be a non-negative number of days (at most ~5e14)",
                )
            })?;
            let d = Arc::clone(daemon);
            blocking(move || {
                // Runs with a live stream are never pruned, however old their last event.
                let keep = d.live_streams().map_err(RpcError::from)?;
                log.prune(age, &keep, p.dry_run)
                    .map(|runs| json!({"pruned": runs, "dry_run": p.dry_run}))
                    .map_err(RpcError::from)
            })
            .await
        }
        other => Err(RpcError::method_not_found(other)),
    }
}
