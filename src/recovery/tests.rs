//! Table tests of the planner: every row of RECOVERY-RULES.md.

use super::*;

const NOW: u64 = 784_111_777_000; // Sun, 06 Nov 1994 08:49:37 GMT

fn run(snapshot: Value) -> Plan {
    let input = input_from_json(&snapshot, NOW).unwrap_or_else(|e| panic!("{snapshot}: {e}"));
    plan(&input)
}

fn call(id: &str, name: &str, args: &str) -> Value {
    json!({"id": id, "name": name, "arguments": args})
}

fn ids(v: &[Cancelled]) -> Vec<&str> {
    v.iter().map(|c| c.id.as_str()).collect()
}

fn event_types(p: &Plan) -> Vec<String> {
    p.events
        .iter()
        .map(|e| {
            format!(
                "{}:{}",
                e["type"].as_str().unwrap(),
                e["id"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[test]
fn text_only_continues_and_whitespace_is_text() {
    for text in ["Hello, wor", "   ", "\n"] {
        let p = run(json!({"cause": "connection_reset", "partial_text": text}));
        assert_eq!(p.plan, PlanKind::R1, "{text:?}");
        assert_eq!(p.assistant_prefix, text);
        assert!(p.events.is_empty());
        assert_eq!((p.wait_ms, p.backoff_ms), (500, 500));
        assert_eq!(p.attempts.transient, 1);
    }
}

#[test]
fn nothing_streamed_restarts_with_a_reset() {
    let p = run(json!({"cause": "goaway", "partial_text": ""}));
    assert_eq!(p.plan, PlanKind::R4);
    assert_eq!(p.assistant_prefix, "");
    assert_eq!(event_types(&p), vec!["stream_reset:"]);
    assert_eq!(p.events[0]["reason"], "goaway");
}

#[test]
fn what_counts_as_a_completed_call() {
    for args in ["{}", "123", "\"x\"", "[1]", "true", " {\"path\": \"a\"} "] {
        let p = run(json!({"cause": "connection_reset", "tool_calls": [call("c1", "t", args)]}));
        assert_eq!(p.plan, PlanKind::R2, "{args:?} is complete");
        assert_eq!(p.completed.len(), 1);
        assert_eq!(p.completed[0].execution, "unknown");
    }
    for args in ["", "   ", "null", "{\"a\":", "{} x", "[1,"] {
        let p = run(json!({"cause": "connection_reset", "tool_calls": [call("c1", "t", args)]}));
        assert_eq!(p.plan, PlanKind::R4, "{args:?} is unfinished");
        assert_eq!(ids(&p.cancelled), vec!["c1"]);
        assert_eq!(p.cancelled[0].partial_arguments, args);
    }
    // An empty name is unfinished whatever the arguments.
    let p = run(json!({"cause": "connection_reset", "tool_calls": [call("c1", "", "{}")]}));
    assert_eq!(p.plan, PlanKind::R4);
    assert_eq!(p.completed.len(), 0);
}

#[test]
fn completed_calls_end_the_turn_as_tool_use_and_every_unfinished_one_is_cancelled() {
    let p = run(json!({
        "cause": "connection_reset",
        "partial_text": "Let me look.",
        "tool_calls": [call("a", "read", "{\"p\": 1}"), call("b", "write", "{\"p\":"),
                       call("c", "", ""), call("d", "grep", "{\"q\": \"x\"}")],
    }));
    assert_eq!(p.plan, PlanKind::R2);
    assert_eq!(p.assistant_prefix, "Let me look.");
    let done: Vec<&str> = p.completed.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(done, vec!["a", "d"]);
    assert_eq!(p.completed[0].arguments, json!({"p": 1}));
    // Gap 1: both unfinished calls are cancelled, not only the last.
    assert_eq!(ids(&p.cancelled), vec!["b", "c"]);
    assert_eq!(
        event_types(&p),
        vec!["tool_call_cancel:b", "tool_call_cancel:c"]
    );
    assert_eq!(p.hints[0]["kind"], "cancelled_tool_calls");
    assert_eq!(p.hints[0]["calls"].as_array().unwrap().len(), 2);
    // No new request: no wait, no attempt spent.
    assert_eq!(p.wait_ms, 0);
    assert_eq!(p.attempts, Attempts::default());
}

#[test]
fn text_and_two_unfinished_calls_truncate_before_the_tools() {
    let p = run(json!({
        "cause": "idle_stall",
        "partial_text": "I'll write both files.",
        "tool_calls": [call("w1", "write_file", "{\"path\": \"a\", \"body\": \"…"),
                       call("w2", "write_file", "")],
    }));
    assert_eq!(p.plan, PlanKind::R3);
    assert_eq!(p.assistant_prefix, "I'll write both files.");
    assert_eq!(ids(&p.cancelled), vec!["w1", "w2"]);
    assert_eq!(
        event_types(&p),
        vec!["tool_call_cancel:w1", "tool_call_cancel:w2"]
    );
    assert_eq!(p.events[0]["reason"], "idle_stall");
    assert_eq!(p.wait_ms, 200, "idle stalls retry after 200 ms");
}

#[test]
fn unfinished_calls_without_text_restart_and_cancel_each() {
    let p = run(json!({
        "cause": "provider_5xx",
        "tool_calls": [call("x", "a", "{"), call("y", "b", "")],
    }));
    assert_eq!(p.plan, PlanKind::R4);
    assert_eq!(
        event_types(&p),
        vec!["stream_reset:", "tool_call_cancel:x", "tool_call_cancel:y"]
    );
}

#[test]
fn permanent_causes_fail_and_never_wait() {
    for cause in ALL_CAUSES
        .iter()
        .filter(|c| c.class() == CauseClass::Permanent)
    {
        let p = run(json!({"cause": cause.as_str(), "partial_text": "abc",
                           "tool_calls": [call("u", "t", "{")]}));
        assert_eq!(p.plan, PlanKind::Fail, "{cause:?}");
        assert_eq!(p.wait_ms, 0);
        assert!(p.reason.contains("permanent"), "{}", p.reason);
        // Even a failure cancels what was half-streamed.
        assert_eq!(event_types(&p), vec!["tool_call_cancel:u"]);
    }
}

#[test]
fn each_budget_is_separate_and_checked_before_planning() {
    for (cause, budget) in [
        ("connection_reset", 2),
        ("rate_limited", 5),
        ("overloaded", 3),
    ] {
        for attempt in 0..=budget {
            let p = run(json!({"cause": cause, "partial_text": "t", "attempt": attempt}));
            if attempt < budget {
                assert_eq!(p.plan, PlanKind::R1, "{cause} attempt {attempt}");
            } else {
                assert_eq!(p.plan, PlanKind::Fail, "{cause} attempt {attempt}");
                assert!(p.reason.contains("budget is spent"), "{}", p.reason);
            }
        }
    }
    // Spending the transient budget leaves the rate-limit budget whole.
    let p = run(json!({"cause": "rate_limited", "partial_text": "t",
                       "attempts": {"transient": 2, "rate_limited": 0}}));
    assert_eq!(p.plan, PlanKind::R1);
    assert_eq!(p.attempts.rate_limited, 1);
    assert_eq!(p.attempts.transient, 2);
}

#[test]
fn backoff_doubles_to_the_cap_and_overload_starts_at_two_seconds() {
    let wait = |cause: &str, attempt: u32| {
        run(json!({"cause": cause, "partial_text": "t", "attempt": attempt})).wait_ms
    };
    let rl: Vec<u64> = (0..5).map(|a| wait("rate_limited", a)).collect();
    assert_eq!(rl, vec![500, 1000, 2000, 4000, 8000]);
    let ov: Vec<u64> = (0..3).map(|a| wait("overloaded", a)).collect();
    assert_eq!(ov, vec![2000, 4000, 8000]);
    // Full jitter: a uniform fraction of the backoff.
    let p = run(
        json!({"cause": "rate_limited", "partial_text": "t", "attempt": 2,
                       "jitter": 0.25}),
    );
    assert_eq!((p.wait_ms, p.backoff_ms), (500, 2000));
}

#[test]
fn retry_after_is_honoured_mid_stream_in_seconds_or_as_a_date() {
    // Gap 2: a mid-stream 429 waits for the hint, not 500 ms.
    let p = run(
        json!({"error": {"status": 429, "message": "slow down", "retry_after": "30"},
                       "partial_text": "Half an answ"}),
    );
    assert_eq!(
        (p.plan, p.cause, p.status),
        (PlanKind::R1, Cause::RateLimited, Some(429))
    );
    assert_eq!(p.wait_ms, 30_000);
    let p = run(json!({"cause": "rate_limited", "partial_text": "t", "retry_after": 12.5}));
    assert_eq!(p.wait_ms, 12_500);
    // An HTTP-date 90 s after "now".
    let p = run(json!({"cause": "overloaded", "partial_text": "t",
                       "retry_after": "Sun, 06 Nov 1994 08:51:07 GMT"}));
    assert_eq!(p.wait_ms, 90_000);
    // A date in the past is no hint: the backoff applies.
    let p = run(json!({"cause": "overloaded", "partial_text": "t",
                       "retry_after": "Sun, 06 Nov 1994 08:00:00 GMT"}));
    assert_eq!(p.wait_ms, 2_000);
    // Capped at the policy's maximum (120 s), and never shortened by jitter.
    let p = run(
        json!({"cause": "rate_limited", "partial_text": "t", "retry_after": 600,
                       "jitter": 0.0}),
    );
    assert_eq!(p.wait_ms, 120_000);
    let p = run(
        json!({"cause": "rate_limited", "partial_text": "t", "retry_after": 600,
                       "policy": {"max_retry_after_ms": 300000}}),
    );
    assert_eq!(p.wait_ms, 300_000);
    assert!(input_from_json(
        &json!({"cause": "rate_limited", "retry_after": "soon"}),
        NOW
    )
    .unwrap_err()
    .to_string()
    .contains("HTTP-date"));
    // Seconds with a fraction as a string, as the number; an empty header is no hint.
    let p = run(
        json!({"error": {"status": 429, "message": "x", "retry_after": "1.5"}, "partial_text": "t"}),
    );
    assert_eq!(p.wait_ms, 1_500);
    let p = run(
        json!({"cause": "rate_limited", "partial_text": "t", "retry_after": " ",
                       "jitter": 0.0}),
    );
    assert_eq!(p.wait_ms, 0, "no hint, and full jitter at 0");
    for bad in ["-1", "1e3", "abc"] {
        assert!(
            input_from_json(&json!({"cause": "rate_limited", "retry_after": bad}), NOW).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn a_streak_of_stalls_on_one_tool_asks_to_split_it() {
    let snap = |history: Value| {
        json!({"cause": "idle_stall", "partial_text": "Writing the file now.",
               "tool_calls": [call("w", "write_file", "{\"content\": \"aaaa")],
               "stall_history": history})
    };
    let p = run(snap(json!([])));
    assert_eq!(
        (p.stall_streak, p.stalled_tool.as_deref()),
        (1, Some("write_file"))
    );
    assert!(p.hints.iter().all(|h| h["kind"] != "split_tool_call"));
    let p = run(snap(json!(["write_file"])));
    assert_eq!(p.stall_streak, 2);
    let split = p
        .hints
        .iter()
        .find(|h| h["kind"] == "split_tool_call")
        .unwrap();
    assert_eq!(split["tool"], "write_file");
    // Never reported as a finished text answer: the plan still continues (R3), with the hint.
    assert_eq!(p.plan, PlanKind::R3);
    assert_eq!(p.to_json()["hint"]["kind"], "split_tool_call");
    // The streak is broken by another tool or by an interruption with no unfinished call.
    assert_eq!(run(snap(json!(["write_file", "grep"]))).stall_streak, 1);
    assert_eq!(run(snap(json!(["write_file", null]))).stall_streak, 1);
    assert_eq!(
        run(snap(json!([{"tool": "write_file"}, "write_file"]))).stall_streak,
        3
    );
    let p = run(snap(json!(["write_file"]))
        .as_object()
        .cloned()
        .map(|mut m| {
            m.insert("policy".into(), json!({"stall_threshold": 3}));
            Value::Object(m)
        })
        .unwrap());
    assert!(p.hints.iter().all(|h| h["kind"] != "split_tool_call"));
}

#[test]
fn stale_checkpoints_restart_or_fail() {
    let p = run(
        json!({"cause": "resumed_from_checkpoint", "partial_text": "old text",
                       "tool_calls": [call("a", "read", "{}")],
                       "stale": {"reason": "model changed"}}),
    );
    assert_eq!(
        p.plan,
        PlanKind::R4,
        "a stale checkpoint's calls are not run blindly"
    );
    assert!(p.reason.contains("model changed"));
    assert_eq!(p.assistant_prefix, "");
    let p = run(
        json!({"cause": "resumed_from_checkpoint", "partial_text": "old",
                       "stale": {"reason": "older than 1 h", "fail": true}}),
    );
    assert_eq!(p.plan, PlanKind::Fail);
}

#[test]
fn raw_provider_errors_are_classified() {
    let rows: &[(u16, &str, Cause)] = &[
        (429, "", Cause::RateLimited),
        (503, "", Cause::Overloaded),
        (529, "overloaded_error", Cause::Overloaded),
        (408, "", Cause::Timeout),
        (504, "", Cause::Timeout),
        (500, "", Cause::Provider5xx),
        (502, "bad gateway", Cause::Provider5xx),
        (
            400,
            "prompt is too long: 210000 tokens > 200000",
            Cause::ContextOverflow,
        ),
        (
            400,
            "This model's maximum context length is 8192",
            Cause::ContextOverflow,
        ),
        (
            400,
            "error: context_length_exceeded",
            Cause::ContextOverflow,
        ),
        (400, "Too many tokens in request", Cause::ContextOverflow),
        (400, "Request too large", Cause::ContextOverflow),
        (400, "messages: field required", Cause::InvalidRequest),
        (401, "", Cause::Unauthorized),
        (403, "", Cause::Unauthorized),
        (404, "", Cause::ModelNotFound),
        (413, "", Cause::ContextOverflow),
        (422, "", Cause::InvalidRequest),
        (
            400,
            "output blocked by content_filter",
            Cause::ContentFiltered,
        ),
        (200, "violates our content policy", Cause::ContentFiltered),
        (400, "Blocked by safety settings", Cause::ContentFiltered),
    ];
    for (status, message, want) in rows {
        assert_eq!(
            classify_status(*status, message),
            *want,
            "{status} {message:?}"
        );
    }
    let transient: Vec<&str> = ALL_CAUSES
        .iter()
        .filter(|c| c.class() == CauseClass::Transient)
        .map(|c| c.as_str())
        .collect();
    assert_eq!(
        transient,
        vec![
            "connection_reset",
            "idle_stall",
            "stalled",
            "goaway",
            "provider_5xx",
            "timeout",
            "resumed_from_checkpoint"
        ]
    );
}

#[test]
fn bad_snapshots_get_clear_errors() {
    let err = |v: Value| input_from_json(&v, NOW).unwrap_err().to_string();
    assert!(err(json!({"cause": "user_cancel"})).contains("stream.abort"));
    assert!(err(json!({"cause": "clean_end"})).contains("stream.commit"));
    assert!(err(json!({"cause": "meteor"})).contains("connection_reset"));
    assert!(err(json!({})).contains("a cause is required"));
    assert!(err(json!({"cause": "goaway", "error": {"status": 500}})).contains("not both"));
    assert!(err(json!({"cause": "goaway", "partial_txt": ""})).contains("unknown field"));
    assert!(err(json!({"cause": "goaway", "tool_calls": [{"id": 1}]})).contains("tool_calls"));
    assert!(err(json!({"error": {"status": 99}})).contains("status"));
    assert!(err(json!({"cause": "goaway", "attempt": -1})).contains("attempt"));
    // A huge counter is a number, not a loop: answered at once, budget spent.
    let p = run(json!({"cause": "goaway", "partial_text": "t", "attempt": 4_000_000_000u64}));
    assert_eq!(p.plan, PlanKind::Fail);
    assert_eq!(p.attempts.transient, 4_000_000_000);
    assert!(err(json!({"cause": "goaway", "jitter": 1.5})).contains("jitter"));
    assert!(err(json!({"cause": "goaway", "policy": {"base": 1}})).contains("policy"));
    assert!(err(json!([1])).contains("object"));
}
