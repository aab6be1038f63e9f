//! `holdfast recovery plan`: the recovery planner, offline.

use std::io::Read;

use clap::{Args, Subcommand};

use super::{out, out_json, CliError, CliResult, Global};
use crate::recovery;

use crate::limits::MAX_SNAPSHOT_BYTES;

/// `holdfast recovery …`
#[derive(Subcommand, Debug)]
pub enum RecoveryCommand {
    /// Decide how to recover an interrupted stream, without a daemon: read one JSON snapshot on
    /// stdin, print the plan as JSON.
    ///
    /// Input: {"cause": "connection_reset", "partial_text": "...", "tool_calls": [{"id",
    /// "name", "arguments"}], "attempt": 0, "retry_after": null, "stall_history": []}, where
    /// `arguments` is the raw argument text as streamed and `cause` is one of connection_reset,
    /// idle_stall, goaway, provider_5xx, timeout, rate_limited, overloaded,
    /// resumed_from_checkpoint (transient) or context_overflow, invalid_request, unauthorized,
    /// model_not_found, content_filtered (permanent). Instead of `cause`, a raw provider error
    /// may be given: "error": {"status": 429, "message": "...", "retry_after": "30"} (seconds or
    /// an HTTP-date). Optional: "attempts" {transient, rate_limited, overloaded} instead of
    /// "attempt"; "stale": {"reason", "fail"}; "policy": {...} (see docs/recovery.md);
    /// "now_ms" for HTTP-dates.
    ///
    /// Output: {"plan": "R1"|"R2"|"R3"|"R4"|"fail", "assistant_prefix", "completed",
    /// "cancelled", "events", "wait_ms", "hint", "hints", "attempts", "stall_streak", ...}.
    /// The wait is the whole backoff unless --jitter draws the random fraction the daemon
    /// would. Exit 0 for any plan (fail included), 2 for an invalid snapshot.
    Plan(PlanArgs),
}

/// Arguments of `holdfast recovery plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Apply full jitter to the wait (a random fraction of the backoff), as the daemon does.
    #[arg(long)]
    jitter: bool,
    /// One line of JSON instead of pretty-printed.
    #[arg(long)]
    compact: bool,
}

/// Run `holdfast recovery …`.
pub fn run(_g: &Global, c: &RecoveryCommand) -> CliResult {
    match c {
        RecoveryCommand::Plan(a) => plan(a),
    }
}

fn plan(a: &PlanArgs) -> CliResult {
    let mut raw = Vec::new();
    std::io::stdin()
        .take(MAX_SNAPSHOT_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(|e| CliError::with_code(format!("reading stdin: {e}"), 1))?;
    if raw.len() as u64 > MAX_SNAPSHOT_BYTES {
        return Err(CliError::usage(format!(
            "the snapshot on stdin is larger than {} MiB",
            MAX_SNAPSHOT_BYTES >> 20
        )));
    }
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Err(CliError::usage(
            "no snapshot on stdin; e.g. echo '{\"cause\": \"connection_reset\", \
             \"partial_text\": \"Hello\"}' | holdfast recovery plan",
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&raw)
        .map_err(|e| CliError::usage(format!("the snapshot is not JSON: {e}")))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut input = recovery::input_from_json(&v, now)
        .map_err(|e| CliError::usage(format!("invalid snapshot: {e}")))?;
    if a.jitter && input.jitter.is_none() {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b)
            .map_err(|e| CliError::with_code(format!("no randomness for --jitter: {e}"), 1))?;
        input.jitter = Some((u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64);
    }
    let plan = recovery::plan(&input).to_json();
    if a.compact {
        out(plan);
    } else {
        out_json(&plan);
    }
    Ok(())
}
