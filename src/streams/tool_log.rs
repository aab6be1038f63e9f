//! What the run log knows about a run's tool calls, as the recovery plans need it: whether a
//! completed call of an R2 plan already ran (running it again would repeat its side effect),
//! and the run's recovery timeline. [`ToolLog`] is implemented by `runlog::RunLog`; streams
//! depend on this trait, not on the run log.

use serde_json::{json, Map, Value};

/// A run log, as the streams use it.
pub trait ToolLog: Send + Sync {
    /// For each call id, what the log says: `executed` (its end is logged), `began` (a begin
    /// without an end: it may have half-run), `not_executed` (the run logs its tool calls, and
    /// not this one) or `unknown` (the run logs no tool calls: silence is not evidence).
    fn executions(
        &self,
        run_id: &str,
        ids: &[String],
    ) -> Result<Vec<&'static str>, Box<dyn std::error::Error + Send + Sync>>;

    /// Append one entry to the run's recovery timeline (`recovery.jsonl`).
    fn log_recovery(
        &self,
        run_id: &str,
        entry: Map<String, Value>,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

/// Fill in each completed call's `execution` from the run log. Done after the streams' lock is
/// released (it reads files under the run log's own lock); the journaled plan does not carry
/// the completed calls, so only the answer changes. If the log cannot be read, the calls stay
/// `unknown` and a warning says why.
pub fn annotate(log: &dyn ToolLog, run_id: &str, plan: &mut Value) {
    let Some(calls) = plan.get_mut("completed").and_then(Value::as_array_mut) else {
        return;
    };
    if calls.is_empty() {
        return;
    }
    let ids: Vec<String> = calls
        .iter()
        .map(|c| c["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    match log.executions(run_id, &ids) {
        Ok(found) => {
            for (call, e) in calls.iter_mut().zip(found) {
                call["execution"] = e.into();
            }
        }
        Err(e) => {
            tracing::warn!(run_id, error = %e, "R2 plan: the run log could not be read; executions left unknown")
        }
    }
}

/// Put a plan in the run's recovery timeline (what `holdfast runs show` prints): its kind,
/// cause, wait and the calls it completed or cancelled — never the text.
pub fn log_plan(log: &dyn ToolLog, run_id: &str, event: &str, plan: &Value) {
    let ids = |k: &str, extra: &[&str]| -> Vec<Value> {
        plan[k]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let mut m = Map::new();
                for f in ["id", "name"].iter().chain(extra) {
                    m.insert((*f).into(), c[*f].clone());
                }
                Value::Object(m)
            })
            .collect()
    };
    let rec = json!({
        "event": event,
        "plan": plan["plan"],
        "cause": plan["cause"],
        "status": plan["status"],
        "wait_ms": plan["wait_ms"],
        "attempts": plan["attempts"],
        "completed": ids("completed", &["execution"]),
        "cancelled": ids("cancelled", &[]),
        "hint": plan["hint"],
    });
    if let Value::Object(m) = rec {
        if let Err(e) = log.log_recovery(run_id, m) {
            tracing::warn!(run_id, error = %e, "the run log did not take the recovery plan");
        }
    }
}
