//! `holdfast stream list | show RUN | tail RUN`: the daemon's streams.

use std::io::Write;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::json;

use super::{out, out_json, CliError, CliResult, Global};
use crate::client::Client;

/// `holdfast stream …`
#[derive(Subcommand, Debug)]
pub enum StreamCommand {
    /// The active streams: run, status, epoch, next seq, attempts, text so far, age.
    List,
    /// One run: its state, attempts, last recovery plan, and a checkpoint summary (sizes and
    /// tool names; the text itself only with --reveal). For a committed or aborted run, its
    /// state file (the final message only with --reveal).
    Show(ShowArgs),
    /// Follow a run's events live (from --after SEQ): text as it streams, other events on
    /// their own lines, until `finish`. Reconnecting with the last seq shown resumes exactly
    /// where it stopped.
    Tail(TailArgs),
}

/// Arguments of `holdfast stream show`.
#[derive(Args, Debug)]
pub struct ShowArgs {
    /// The run id.
    run: String,
    /// Show the stream's text and tool arguments (or the final message).
    #[arg(long)]
    reveal: bool,
}

/// Arguments of `holdfast stream tail`.
#[derive(Args, Debug)]
pub struct TailArgs {
    /// The run id.
    run: String,
    /// Start after this seq (0: from the beginning).
    #[arg(long, default_value_t = 0, value_name = "SEQ")]
    after: u64,
}

fn client(g: &Global) -> CliResult<Client> {
    g.daemon()?.ok_or_else(|| {
        CliError::with_code(
            "streams are served by the daemon, and none answers: start it with `holdfast daemon` \
             (or `systemctl --user start holdfast`)",
            1,
        )
    })
}

/// Run `holdfast stream …`.
pub fn run(g: &Global, c: &StreamCommand) -> CliResult {
    let mut client = client(g)?;
    match c {
        StreamCommand::List => {
            let r = client.call("stream.list", json!({}))?;
            if g.json {
                out_json(&r);
                return Ok(());
            }
            let runs = r["runs"].as_array().cloned().unwrap_or_default();
            if runs.is_empty() {
                out("no active streams");
                return Ok(());
            }
            out(format!(
                "{:<32} {:<12} {:>5} {:>8} {:>9} {:>8} {:>6}  last plan",
                "run", "status", "epoch", "next_seq", "attempts", "chars", "age"
            ));
            for r in runs {
                let a = &r["attempts"];
                let attempts = a["transient"].as_u64().unwrap_or(0)
                    + a["rate_limited"].as_u64().unwrap_or(0)
                    + a["overloaded"].as_u64().unwrap_or(0);
                out(format!(
                    "{:<32} {:<12} {:>5} {:>8} {:>9} {:>8} {:>6}  {}",
                    r["run_id"].as_str().unwrap_or("?"),
                    r["status"].as_str().unwrap_or("?"),
                    // As strings: a JSON value's Display ignores the column's width; "-"
                    // for what a listing does not carry (PostgreSQL's: head fields only).
                    num(&r["epoch"]),
                    num(&r["next_seq"]),
                    attempts,
                    num(&r["text_chars"]),
                    super::age(r["updated_at_ms"].as_u64()),
                    match r["no_producer_since_ms"].as_u64() {
                        // Ends as abandoned at [streams] orphan_timeout_s unless resumed.
                        Some(t) => format!(
                            "{} (no producer for {})",
                            r["last_plan"]["plan"].as_str().unwrap_or("-"),
                            super::age(Some(t))
                        ),
                        None => r["last_plan"]["plan"].as_str().unwrap_or("-").to_owned(),
                    },
                ));
            }
            Ok(())
        }
        StreamCommand::Show(a) => {
            let mut r = client.call("stream.get", json!({"run_id": a.run, "reveal": true}))?;
            if !a.reveal {
                // Sizes and names only: the text is the user's conversation.
                if let Some(cp) = r.get_mut("checkpoint") {
                    let text = cp["partial_text"].as_str().unwrap_or("").chars().count();
                    cp["partial_text"] = json!(format!("({text} chars; --reveal to show)"));
                    for c in cp["completed_tool_calls"]
                        .as_array_mut()
                        .into_iter()
                        .flatten()
                    {
                        let n = c["arguments"].as_str().map_or(0, str::len);
                        c["arguments"] = json!(format!("({n} bytes)"));
                    }
                    if let Some(t) = cp.get_mut("in_flight_tool").filter(|t| !t.is_null()) {
                        let n = t["partial_args"].as_str().map_or(0, str::len);
                        t["partial_args"] = json!(format!("({n} bytes)"));
                    }
                }
                if r.get("final_message").is_some() {
                    r["final_message"] = json!("(hidden; --reveal to show)");
                }
            }
            out_json(&r);
            Ok(())
        }
        StreamCommand::Tail(a) => {
            client.set_read_timeout(Some(Duration::from_secs(3600)))?;
            client.call(
                "stream.subscribe",
                json!({"run_id": a.run, "after_seq": a.after}),
            )?;
            let mut stdout = std::io::stdout();
            let mut mid_line = false;
            loop {
                let Some(ev) = client.next_event(Duration::from_secs(3600))? else {
                    continue;
                };
                if g.json {
                    out(ev.to_string());
                } else {
                    let e = &ev["event"];
                    match e["type"].as_str() {
                        Some("text") => {
                            let _ = write!(stdout, "{}", e["text"].as_str().unwrap_or(""));
                            let _ = stdout.flush();
                            mid_line = true;
                        }
                        _ => {
                            if mid_line {
                                out("");
                                mid_line = false;
                            }
                            out(format!("[seq {}] {}", ev["seq"], e));
                        }
                    }
                }
                if ev["event"]["type"] == "finish" {
                    return Ok(());
                }
            }
        }
    }
}

/// A count for a column: the number, or "-" when the listing does not carry it.
fn num(v: &serde_json::Value) -> String {
    v.as_u64().map_or_else(|| "-".to_owned(), |n| n.to_string())
}
