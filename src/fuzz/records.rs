//! The recovery planner's input (`holdfast recovery plan`'s stdin, `stream.interrupt`'s
//! cause) and the planner.

use super::Outcome;
use serde_json::Value;

use crate::recovery::{self, CauseClass, PlanKind};

/// A fixed clock: HTTP-date Retry-After values are read relative to it.
const NOW_MS: u64 = 1_800_000_000_000;

/// The planner's input as JSON, then the planner, checked against RECOVERY-RULES.md written out
/// by hand: every call whose name is empty or whose arguments are not JSON (or `null`) is
/// cancelled, in order, each with its `tool_call_cancel` event, whatever the plan; a permanent
/// cause, a stale checkpoint asked to fail, or a spent budget is `fail`, and nothing else is;
/// otherwise stale → R4, a completed call → R2 (with exactly the completed calls, no wait),
/// text and an unfinished call → R3, text → R1, else R4 (with `stream_reset`); R1 and R3
/// continue from the text; a retry waits at least the Retry-After hint (capped by the
/// policy); the same unfinished tool at the threshold of a streak gets `split_tool_call`; the
/// same input plans the same (jitter fixed by the input).
pub fn recovery_input(data: &[u8]) -> Outcome {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return Ok(false);
    };
    let Ok(input) = recovery::input_from_json(&v, NOW_MS) else {
        return Ok(false);
    };
    let plan = recovery::plan(&input);
    check_eq!(
        recovery::plan(&input).to_json(),
        plan.to_json(),
        "the same input planned twice differently"
    );
    let completed = |c: &recovery::ToolCall| {
        !c.name.is_empty()
            && serde_json::from_str::<Value>(&c.arguments).is_ok_and(|a| !a.is_null())
    };
    let unfinished: Vec<&str> = input
        .tool_calls
        .iter()
        .filter(|c| !completed(c))
        .map(|c| c.id.as_str())
        .collect();
    let done: Vec<&str> = input
        .tool_calls
        .iter()
        .filter(|c| completed(c))
        .map(|c| c.id.as_str())
        .collect();
    let cancelled: Vec<&str> = plan.cancelled.iter().map(|c| c.id.as_str()).collect();
    check_eq!(cancelled, unfinished, "the cancelled calls");
    let cancel_events: Vec<&Value> = plan
        .events
        .iter()
        .filter(|e| e["type"] == "tool_call_cancel")
        .collect();
    check_eq!(
        cancel_events
            .iter()
            .map(|e| e["id"].as_str().unwrap_or("?"))
            .collect::<Vec<_>>(),
        unfinished,
        "a cancelled call without its event, or an event for another"
    );
    let p = &input.policy;
    let (budget, used) = match plan.class {
        CauseClass::Transient => (p.transient_budget, input.attempts.transient),
        CauseClass::RateLimited => (p.rate_limited_budget, input.attempts.rate_limited),
        CauseClass::Overloaded => (p.overloaded_budget, input.attempts.overloaded),
        CauseClass::Permanent => (0, 0),
    };
    let must_fail = plan.class == CauseClass::Permanent
        || input.stale.as_ref().is_some_and(|s| s.fail)
        || used >= budget;
    check_eq!(
        plan.plan == PlanKind::Fail,
        must_fail,
        "fail exactly when the cause is permanent, a stale checkpoint asks it, or the budget is spent"
    );
    if must_fail {
        return Ok(true);
    }
    let has_text = !input.text.is_empty();
    let want = if input.stale.is_some() {
        PlanKind::R4
    } else if !done.is_empty() {
        PlanKind::R2
    } else if has_text && !unfinished.is_empty() {
        PlanKind::R3
    } else if has_text {
        PlanKind::R1
    } else {
        PlanKind::R4
    };
    check_eq!(plan.plan, want, "the plan");
    let hint = input
        .retry_after
        .map_or(0, |d| (d.as_millis() as u64).min(p.max_retry_after_ms));
    match want {
        PlanKind::R2 => {
            let got: Vec<&str> = plan.completed.iter().map(|c| c.id.as_str()).collect();
            check_eq!(got, done, "R2's completed calls");
            check_eq!(plan.wait_ms, 0, "R2 sends no request, so waits for none");
        }
        PlanKind::R1 | PlanKind::R3 => {
            check_eq!(
                plan.assistant_prefix,
                input.text,
                "the prefix is the whole text"
            );
            check!(plan.wait_ms >= hint, "Retry-After not honoured");
        }
        PlanKind::R4 => {
            check!(
                plan.assistant_prefix.is_empty(),
                "R4 continues from nothing"
            );
            check!(
                plan.events.iter().any(|e| e["type"] == "stream_reset"),
                "R4 without stream_reset"
            );
            check!(plan.wait_ms >= hint, "Retry-After not honoured");
        }
        PlanKind::Fail => unreachable!("returned above"),
    }
    let stalled = input
        .tool_calls
        .iter()
        .filter(|c| !completed(c))
        .map(|c| c.name.as_str())
        .rfind(|n| !n.is_empty());
    if let Some(tool) = stalled {
        let streak = 1 + input
            .stall_history
            .iter()
            .rev()
            .take_while(|t| t.as_deref() == Some(tool))
            .count();
        let split = plan.hints.iter().any(|h| h["kind"] == "split_tool_call");
        check_eq!(
            split,
            streak >= p.stall_threshold as usize,
            "the split_tool_call hint at a streak of {streak}"
        );
    }
    Ok(true)
}
