//! The streaming recovery engine's planner: a stream broke after the model had started
//! producing output — what now? A pure function of the snapshot (text so far, tool calls as
//! streamed), the cause, the attempt counters and the stall history: no I/O, no clock unless
//! one is passed in, no randomness unless jitter is asked for. The rules are those of
//! `RECOVERY-RULES.md` (R1–R4 of the runtime *awaken*), with its gaps closed: every unfinished
//! call is cancelled and reported, Retry-After is honoured mid-stream, a streak of stalls on the
//! same tool call gets a `split_tool_call` hint, stale checkpoints are not resumed blindly.
//!
//! The daemon's stream service calls [`plan`] on `stream.interrupt` and `stream.resume`;
//! `holdfast recovery plan` runs it offline on one JSON snapshot (see docs/recovery.md).

mod cause;
mod error;
mod httpdate;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use cause::{classify_status, Cause, CauseClass, ALL as ALL_CAUSES};
pub use error::{CauseError, InputError, KNOWN_FIELDS};

/// One tool call as streamed so far.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct ToolCall {
    /// The call id the model gave (may be empty if it never arrived).
    #[serde(default)]
    pub id: String,
    /// The tool name (empty if it never arrived).
    #[serde(default)]
    pub name: String,
    /// The raw argument text as streamed (possibly truncated).
    #[serde(default)]
    pub arguments: String,
}

impl ToolCall {
    /// The parsed arguments, if the call is complete: a name, and argument text that parses as
    /// JSON and is not `null` (`{}`, `123`, `"x"`, `[1]`, `true` all count).
    pub fn completed_arguments(&self) -> Option<Value> {
        if self.name.is_empty() {
            return None;
        }
        match serde_json::from_str::<Value>(&self.arguments) {
            Ok(Value::Null) | Err(_) => None,
            Ok(v) => Some(v),
        }
    }
}

/// The retry policy. Every field has the default of `RECOVERY-RULES.md`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Recoveries allowed after transient mid-stream interruptions (2: three stream sessions).
    pub transient_budget: u32,
    /// Recoveries allowed after rate limits.
    pub rate_limited_budget: u32,
    /// Recoveries allowed after overload.
    pub overloaded_budget: u32,
    /// Backoff base (transient, rate limited).
    pub base_ms: u64,
    /// Backoff base when the provider is overloaded.
    pub overloaded_base_ms: u64,
    /// Backoff cap.
    pub cap_ms: u64,
    /// Wait after an idle stall.
    pub idle_stall_ms: u64,
    /// The longest Retry-After honoured (a longer hint is capped to this).
    pub max_retry_after_ms: u64,
    /// Interruptions in a row with the same unfinished tool before the `split_tool_call` hint.
    pub stall_threshold: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            transient_budget: 2,
            rate_limited_budget: 5,
            overloaded_budget: 3,
            base_ms: 500,
            overloaded_base_ms: 2_000,
            cap_ms: 8_000,
            idle_stall_ms: 200,
            max_retry_after_ms: 120_000,
            stall_threshold: 2,
        }
    }
}

/// Recoveries already made in this stream, per budget class.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Attempts {
    /// After transient interruptions.
    pub transient: u32,
    /// After rate limits.
    pub rate_limited: u32,
    /// After overload.
    pub overloaded: u32,
}

impl Attempts {
    fn of(&self, class: CauseClass) -> u32 {
        match class {
            CauseClass::Transient => self.transient,
            CauseClass::RateLimited => self.rate_limited,
            CauseClass::Overloaded => self.overloaded,
            CauseClass::Permanent => 0,
        }
    }

    fn bump(&mut self, class: CauseClass) {
        match class {
            CauseClass::Transient => self.transient += 1,
            CauseClass::RateLimited => self.rate_limited += 1,
            CauseClass::Overloaded => self.overloaded += 1,
            CauseClass::Permanent => {}
        }
    }
}

/// Why a checkpoint must not be resumed as it is.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Stale {
    /// What made it stale (age, another model, another thread).
    pub reason: String,
    /// `fail` instead of restarting (R4).
    #[serde(default)]
    pub fail: bool,
}

/// How a resumed stream continues the text so far (docs/recovery.md, "Continuation"). The
/// producer declares it; it is never guessed from the text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Continuation {
    /// The provider continues the given prefix exactly (an assistant prefill): every character
    /// of the continuation is the model's new text, and nothing is removed. The default: a
    /// wrong `exact` shows a restatement the user can see, a wrong `restated` deletes text
    /// nobody can see was lost.
    #[default]
    Exact,
    /// The model may begin by restating the end of the prefix (a "continue" turn): the longest
    /// restatement the continuation's start can be is removed.
    Restated,
}

impl Continuation {
    /// `exact` or `restated`.
    pub fn as_str(self) -> &'static str {
        match self {
            Continuation::Exact => "exact",
            Continuation::Restated => "restated",
        }
    }

    /// Parse a declared continuation (`null` or absent: the default, `exact`).
    pub fn from_json(v: Option<&Value>) -> Result<Continuation, InputError> {
        match v {
            None | Some(Value::Null) => Ok(Continuation::Exact),
            Some(Value::String(s)) if s == "exact" => Ok(Continuation::Exact),
            Some(Value::String(s)) if s == "restated" => Ok(Continuation::Restated),
            Some(_) => Err(InputError::Invalid {
                field: "continuation",
                expected: "exact or restated (a string; null: exact)",
            }),
        }
    }
}

/// Everything the planner looks at.
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    /// Why the stream broke.
    pub cause: Cause,
    /// The provider's HTTP status, when the cause came from one.
    pub status: Option<u16>,
    /// All assistant text of this turn so far (across attempts).
    pub text: String,
    /// Tool calls as streamed, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Recoveries already made.
    pub attempts: Attempts,
    /// A Retry-After hint, already converted to a duration.
    pub retry_after: Option<Duration>,
    /// The unfinished tool name of each earlier interruption of this run, oldest first (`None`
    /// for an interruption with no unfinished call).
    pub stall_history: Vec<Option<String>>,
    /// The checkpoint being resumed is stale.
    pub stale: Option<Stale>,
    /// A number in [0, 1) for full jitter; `None`: no jitter (wait the whole backoff).
    pub jitter: Option<f64>,
    /// The policy.
    pub policy: Policy,
    /// How the continuation of an R1/R3 plan will continue the text (the producer's word).
    pub continuation: Continuation,
}

/// The plans, first match wins (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlanKind {
    /// Text only: retry with the text as assistant prefix and a continuation prompt.
    R1,
    /// Completed tool calls: no new request; the turn ends as a tool-use turn with them.
    R2,
    /// Text and unfinished calls: cancel the unfinished, continue with the text as prefix.
    R3,
    /// Nothing usable: reset the turn and resend the request.
    R4,
    /// Not recoverable (a permanent cause, an exhausted budget, a stale checkpoint asked to fail).
    #[serde(rename = "fail")]
    Fail,
}

impl PlanKind {
    /// `R1`…`R4` or `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanKind::R1 => "R1",
            PlanKind::R2 => "R2",
            PlanKind::R3 => "R3",
            PlanKind::R4 => "R4",
            PlanKind::Fail => "fail",
        }
    }
}

/// A completed call carried by an R2 plan.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Completed {
    /// Call id.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Parsed arguments.
    pub arguments: Value,
    /// What the run log says about it: `executed`, `began` (possibly half-executed),
    /// `not_executed`, or `unknown` (no run log consulted).
    pub execution: String,
}

/// An unfinished call the plan cancels.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Cancelled {
    /// Call id.
    pub id: String,
    /// Tool name (may be empty).
    pub name: String,
    /// The argument text streamed before the break.
    pub partial_arguments: String,
}

/// The planner's answer.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Plan {
    /// Which plan.
    pub plan: PlanKind,
    /// The cause, classified.
    pub cause: Cause,
    /// The provider's HTTP status, when the cause came from one.
    pub status: Option<u16>,
    /// Its budget class.
    pub class: CauseClass,
    /// Why this plan (one sentence for people and logs).
    pub reason: String,
    /// The assistant text to continue from (R1, R3; R2 keeps it as the turn's text); empty for
    /// R4 and fail.
    pub assistant_prefix: String,
    /// Completed calls (R2).
    pub completed: Vec<Completed>,
    /// Every unfinished call, each with a `tool_call_cancel` event.
    pub cancelled: Vec<Cancelled>,
    /// Events to publish, in order (`stream_reset` for R4, then a `tool_call_cancel` per
    /// unfinished call).
    pub events: Vec<Value>,
    /// How long to wait before the next request (0 when no request follows).
    pub wait_ms: u64,
    /// The backoff before jitter and Retry-After, for transparency.
    pub backoff_ms: u64,
    /// Hints for the next model message (`cancelled_tool_calls`, `split_tool_call`).
    pub hints: Vec<Value>,
    /// The attempt counters after this recovery (unchanged for R2 and fail).
    pub attempts: Attempts,
    /// Interruptions in a row (this one included) with the same unfinished tool.
    pub stall_streak: u32,
    /// The unfinished tool name of this interruption (for the stall history).
    pub stalled_tool: Option<String>,
    /// How the next attempt continues the text: R1 and R3 only (`null` for the others, which
    /// continue nothing).
    pub continuation: Option<Continuation>,
}

impl Plan {
    /// The plan as the JSON object of `RECOVERY-RULES.md` ("plan", "assistant_prefix",
    /// "completed", "cancelled", "events", "wait_ms", "hint", plus the counters).
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or_else(|_| json!({}));
        v["hint"] = self.hints.first().cloned().unwrap_or(Value::Null);
        v
    }
}

/// The JSON snapshot `holdfast recovery plan` reads (and `stream.interrupt` takes as its
/// cause): see docs/recovery.md. `now_unix_ms` converts an HTTP-date Retry-After.
pub fn input_from_json(v: &Value, now_unix_ms: u64) -> Result<Input, InputError> {
    use InputError::{Both, Invalid};
    let invalid = |field, expected| Invalid { field, expected };
    let Value::Object(m) = v else {
        return Err(InputError::NotAnObject);
    };
    if let Some(k) = m.keys().find(|k| !KNOWN_FIELDS.contains(&k.as_str())) {
        return Err(InputError::UnknownField {
            field: k.chars().take(40).collect(),
        });
    }
    let now = m
        .get("now_ms")
        .map(|n| {
            n.as_u64()
                .ok_or(invalid("now_ms", "milliseconds since the epoch"))
        })
        .transpose()?
        .unwrap_or(now_unix_ms);
    let mut retry_after = parse_retry_after(m.get("retry_after").unwrap_or(&Value::Null), now)?;
    let (cause, status) = match (m.get("cause"), m.get("error")) {
        (Some(Value::String(c)), None) => (Cause::parse(c)?, None),
        (None, Some(Value::Object(e))) => {
            let status = e
                .get("status")
                .and_then(Value::as_u64)
                .and_then(|s| u16::try_from(s).ok())
                .filter(|s| (100..=599).contains(s))
                .ok_or(invalid("error.status", "an HTTP status code (100-599)"))?;
            let message = match e.get("message") {
                None | Some(Value::Null) => "",
                Some(Value::String(s)) => s.as_str(),
                Some(_) => return Err(invalid("error.message", "a string")),
            };
            if let Some(ra) = e.get("retry_after") {
                retry_after = parse_retry_after(ra, now)?.or(retry_after);
            }
            (classify_status(status, message), Some(status))
        }
        (Some(_), Some(_)) => return Err(Both("cause", "error")),
        (Some(_), None) => return Err(invalid("cause", "a string")),
        _ => return Err(InputError::NoCause),
    };
    let text = match m.get("partial_text") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(invalid("partial_text", "a string")),
    };
    let tool_calls: Vec<ToolCall> = match m.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
            invalid(
                "tool_calls",
                "a list of {\"id\", \"name\", \"arguments\"} with string values (arguments: \
                 the raw argument text as streamed)",
            )
        })?,
    };
    let attempts = match (m.get("attempt"), m.get("attempts")) {
        (Some(_), Some(_)) => return Err(Both("attempt", "attempts")),
        (Some(a), None) => {
            let n = a
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or(invalid("attempt", "a small non-negative integer"))?;
            let mut at = Attempts::default();
            match cause.class() {
                CauseClass::Transient => at.transient = n,
                CauseClass::RateLimited => at.rate_limited = n,
                CauseClass::Overloaded => at.overloaded = n,
                CauseClass::Permanent => {}
            }
            at
        }
        (None, Some(a)) => serde_json::from_value(a.clone()).map_err(|_| {
            invalid(
                "attempts",
                "{\"transient\", \"rate_limited\", \"overloaded\"} counts",
            )
        })?,
        (None, None) => Attempts::default(),
    };
    let stall_history = match m.get("stall_history") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|e| match e {
                Value::Null => Ok(None),
                Value::String(s) if s.is_empty() => Ok(None),
                Value::String(s) => Ok(Some(s.clone())),
                Value::Object(o) => match o.get("tool") {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    Some(_) => Err(invalid("stall_history[].tool", "a string")),
                },
                _ => Err(invalid("stall_history[]", "a tool name (or null)")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid("stall_history", "a list of tool names (or null)")),
    };
    let stale = match m.get("stale") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            serde_json::from_value(v.clone())
                .map_err(|_| invalid("stale", "{\"reason\": \"…\", \"fail\": false}"))?,
        ),
    };
    let policy = match m.get("policy") {
        None | Some(Value::Null) => Policy::default(),
        Some(v) => serde_json::from_value(v.clone()).map_err(InputError::Policy)?,
    };
    let jitter = match m.get("jitter") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Number(n)) => Some(
            n.as_f64()
                .filter(|r| (0.0..1.0).contains(r))
                .ok_or(invalid("jitter", "a number in [0, 1) or false"))?,
        ),
        Some(_) => return Err(invalid("jitter", "a number in [0, 1) or false")),
    };
    let continuation = Continuation::from_json(m.get("continuation"))?;
    Ok(Input {
        cause,
        status,
        text,
        tool_calls,
        attempts,
        retry_after,
        stall_history,
        stale,
        jitter,
        policy,
        continuation,
    })
}

/// Decide how to recover. See the module docs and `RECOVERY-RULES.md`.
pub fn plan(input: &Input) -> Plan {
    let class = input.cause.class();
    let mut completed = Vec::new();
    let mut cancelled = Vec::new();
    for call in &input.tool_calls {
        match call.completed_arguments() {
            Some(arguments) => completed.push(Completed {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments,
                execution: "unknown".into(),
            }),
            None => cancelled.push(Cancelled {
                id: call.id.clone(),
                name: call.name.clone(),
                partial_arguments: call.arguments.clone(),
            }),
        }
    }
    // The stall streak: this interruption's unfinished tool (the last one streamed), and how
    // many interruptions in a row ended on the same name.
    let stalled_tool = cancelled
        .iter()
        .rev()
        .map(|c| c.name.clone())
        .find(|n| !n.is_empty());
    let stall_streak = match &stalled_tool {
        None => 0,
        Some(tool) => {
            1 + input
                .stall_history
                .iter()
                .rev()
                .take_while(|t| t.as_deref() == Some(tool.as_str()))
                .count() as u32
        }
    };
    let mut hints = Vec::new();
    if let Some(tool) = &stalled_tool {
        if stall_streak >= input.policy.stall_threshold {
            hints.push(json!({
                "kind": "split_tool_call",
                "tool": tool,
                "streak": stall_streak,
                "message": format!(
                    "The stream broke {stall_streak} times in a row while the `{tool}` call's \
                     arguments were being written. Split the output into several smaller `{tool}` \
                     calls instead of one large one."
                ),
            }));
        }
    }
    let reason_word = input.cause.as_str().to_owned();
    let mut plan = Plan {
        plan: PlanKind::Fail,
        cause: input.cause,
        status: input.status,
        class,
        reason: String::new(),
        assistant_prefix: String::new(),
        completed: Vec::new(),
        cancelled,
        events: Vec::new(),
        wait_ms: 0,
        backoff_ms: 0,
        hints,
        attempts: input.attempts,
        stall_streak,
        stalled_tool,
        continuation: None,
    };
    // Every unfinished call is cancelled, whatever the plan: no partial delta may linger.
    let cancel_events: Vec<Value> = plan
        .cancelled
        .iter()
        .map(|c| json!({"type": "tool_call_cancel", "id": c.id, "name": c.name, "reason": reason_word}))
        .collect();

    if class == CauseClass::Permanent {
        plan.reason = format!(
            "{} is permanent: the stream fails and the caller gets the error",
            input.cause.as_str()
        );
        plan.events = cancel_events;
        return plan;
    }
    if let Some(stale) = &input.stale {
        if stale.fail {
            plan.reason = format!("the checkpoint is stale ({}); asked to fail", stale.reason);
            plan.events = cancel_events;
            return plan;
        }
    }
    let budget = match class {
        CauseClass::Transient => input.policy.transient_budget,
        CauseClass::RateLimited => input.policy.rate_limited_budget,
        CauseClass::Overloaded => input.policy.overloaded_budget,
        CauseClass::Permanent => 0,
    };
    let used = input.attempts.of(class);
    if used >= budget {
        plan.reason = format!(
            "the {} budget is spent ({used} of {budget} recoveries made)",
            class.as_str()
        );
        plan.events = cancel_events;
        return plan;
    }

    let has_text = !input.text.is_empty();
    let kind = if input.stale.is_some() {
        PlanKind::R4
    } else if !completed.is_empty() {
        PlanKind::R2
    } else if has_text && !plan.cancelled.is_empty() {
        PlanKind::R3
    } else if has_text {
        PlanKind::R1
    } else {
        PlanKind::R4
    };
    plan.plan = kind;
    if matches!(kind, PlanKind::R1 | PlanKind::R3) {
        plan.continuation = Some(input.continuation);
    }
    if !plan.cancelled.is_empty() && matches!(kind, PlanKind::R2 | PlanKind::R3) {
        let calls: Vec<Value> = plan
            .cancelled
            .iter()
            .map(|c| json!({"id": c.id, "name": c.name}))
            .collect();
        plan.hints.push(json!({
            "kind": "cancelled_tool_calls",
            "calls": calls,
            "message": "These tool calls were cut off before their arguments were complete and \
                        were not run; issue them again if they are still needed.",
        }));
    }
    match kind {
        PlanKind::R2 => {
            plan.reason = format!(
                "{} completed tool call(s): the turn ends as a tool-use turn with them",
                completed.len()
            );
            plan.assistant_prefix = input.text.clone();
            plan.completed = completed;
            plan.events = cancel_events;
            // No new request: no wait, no attempt spent.
            return plan;
        }
        PlanKind::R3 => {
            plan.reason =
                "text and unfinished tool call(s): cancel them, continue from the text".into();
            plan.assistant_prefix = input.text.clone();
            plan.events = cancel_events;
        }
        PlanKind::R1 => {
            plan.reason = "text only: continue from it".into();
            plan.assistant_prefix = input.text.clone();
        }
        PlanKind::R4 => {
            plan.reason = match &input.stale {
                Some(s) => format!("the checkpoint is stale ({}): restart the turn", s.reason),
                None => "nothing usable was streamed: restart the turn".into(),
            };
            let mut events = vec![json!({"type": "stream_reset", "reason": reason_word})];
            events.extend(cancel_events);
            plan.events = events;
        }
        PlanKind::Fail => {}
    }
    let (wait, backoff) = wait_for(input, class, used);
    plan.wait_ms = wait;
    plan.backoff_ms = backoff;
    plan.attempts.bump(class);
    plan
}

/// (wait, backoff) in ms: `min(base · 2^attempt, cap)` with full jitter, 200 ms after an idle
/// stall, and never less than a Retry-After hint (itself capped).
fn wait_for(input: &Input, class: CauseClass, attempt: u32) -> (u64, u64) {
    let p = &input.policy;
    let backoff = if matches!(input.cause, Cause::IdleStall | Cause::Stalled) {
        p.idle_stall_ms
    } else {
        let base = if class == CauseClass::Overloaded {
            p.overloaded_base_ms
        } else {
            p.base_ms
        };
        base.saturating_mul(1u64 << attempt.min(32)).min(p.cap_ms)
    };
    let jittered = match input.jitter {
        Some(r) => (backoff as f64 * r.clamp(0.0, 1.0)) as u64,
        None => backoff,
    };
    let hint = input
        .retry_after
        .map(|d| (d.as_millis() as u64).min(p.max_retry_after_ms))
        .unwrap_or(0);
    (jittered.max(hint), backoff)
}

/// Parse a Retry-After value: delay-seconds (`"120"`, or a JSON number) or an HTTP-date
/// (`"Sun, 06 Nov 1994 08:49:37 GMT"`), relative to `now_unix_ms`. A date in the past is 0.
pub fn parse_retry_after(v: &Value, now_unix_ms: u64) -> Result<Option<Duration>, InputError> {
    let invalid = |expected| InputError::Invalid {
        field: "retry_after",
        expected,
    };
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Some(Duration::from_secs_f64(s.min(1e9))))
            .ok_or(invalid("a non-negative number of seconds")),
        Value::String(s) => {
            let t = s.trim();
            if t.is_empty() {
                // An empty header says nothing: no hint.
                return Ok(None);
            }
            if let Ok(secs) = t.parse::<u64>() {
                return Ok(Some(Duration::from_secs(secs)));
            }
            // "1.5": not delay-seconds by the letter, but plainly seconds; as the number 1.5 is.
            if let Some(secs) = t.parse::<f64>().ok().filter(|s| {
                s.is_finite() && *s >= 0.0 && t.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            }) {
                return Ok(Some(Duration::from_secs_f64(secs.min(1e9))));
            }
            let at = httpdate::parse(t).ok_or(invalid(
                "delay-seconds or an HTTP-date (like \"Sun, 06 Nov 1994 08:49:37 GMT\")",
            ))?;
            Ok(Some(Duration::from_millis(
                (at.saturating_mul(1000)).saturating_sub(now_unix_ms),
            )))
        }
        _ => Err(invalid("a number of seconds or an HTTP-date string")),
    }
}

#[cfg(test)]
mod tests;
