//! Seed inputs for every target, made by the code that writes those bytes for real (a stream
//! run through [`Streams`], a store's index and credentials, a run log), so the corpora start
//! from what the readers meet in practice. `cargo test --test fuzz_targets write_seed_corpora
//! -- --ignored` writes them to `tests/corpus/<target>/seed-*`.

use std::fs;
use std::sync::Arc;

use serde_json::{json, Value};

use super::runlog::Scratch;
use crate::crypto::{generate_key, Keyring, Secret};
use crate::durable::journal::format::{frame_crc, header};
use crate::durable::journal::{scan_segment, Durability};
use crate::durable::Faults;
use crate::runlog::RunLog;
use crate::store::index::Index;
use crate::store::Credential;
use crate::streams::{KeyringSealer, Sealer, Streams, StreamsConfig};

/// One seed: its target, its name, its bytes.
pub type Seed = (&'static str, String, Vec<u8>);

/// Every target's seeds, or what failed while making them.
pub fn all() -> Result<Vec<Seed>, String> {
    let mut out = Vec::new();
    let records = stream_records()?;
    if records.is_empty() {
        return Err("the stream run left no record in its journal".into());
    }
    out.push((
        "journal_replay",
        "whole-run".to_owned(),
        records.join(&b'\n'),
    ));
    for (i, r) in records.iter().enumerate() {
        out.push(("journal_replay", format!("record-{i}"), r.clone()));
    }
    // Segments: the records as frames of segment 7 (the target's), clean, torn, and whole.
    let mut body = Vec::new();
    for r in &records {
        body.extend_from_slice(&(r.len() as u32).to_le_bytes());
        body.extend_from_slice(&frame_crc(7, r).to_le_bytes());
        body.extend_from_slice(r);
    }
    let clean: Vec<u8> = [0u8]
        .iter()
        .chain(&body)
        .chain(&[0u8; 64])
        .copied()
        .collect();
    out.push(("journal_segment", "frames-then-zeros".into(), clean));
    let torn: Vec<u8> = [0u8]
        .iter()
        .chain(&body[..body.len() - 5])
        .chain(&[0u8; 32])
        .copied()
        .collect();
    out.push(("journal_segment", "torn-last-frame".into(), torn));
    let whole: Vec<u8> = [1u8]
        .iter()
        .chain(&header(7))
        .chain(&body)
        .copied()
        .collect();
    out.push(("journal_segment", "with-header".into(), whole));
    out.push(("journal_segment", "empty".into(), vec![0u8; 9]));
    for (name, bytes) in store_files() {
        out.push((name.0, name.1, bytes));
    }
    for (i, input) in recovery_inputs().iter().enumerate() {
        out.push((
            "recovery_input",
            format!("rules-{i}"),
            input.to_string().into_bytes(),
        ));
    }
    out.push(("runlog_lines", "hive-run".into(), run_log_lines()?));
    Ok(out)
}

/// `what` failed, and why.
fn failed<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// A run streamed, interrupted, resumed and committed through real [`Streams`], then its
/// journal's records read back and unsealed: the plaintext replay reads.
fn stream_records() -> Result<Vec<Vec<u8>>, String> {
    let dir = Scratch::new();
    let keys = Keyring::new(&generate_key(), &[]).ok_or("a freshly generated key does not load")?;
    let sealer: Arc<dyn Sealer> = Arc::new(KeyringSealer(keys));
    let (sd, rd) = (dir.0.join("streams"), dir.0.join("runs"));
    let config = StreamsConfig {
        durability: Durability::None,
        ..StreamsConfig::default()
    };
    {
        let s = Streams::open(
            &sd,
            &rd,
            Arc::clone(&sealer),
            config.clone(),
            Faults::none(),
        )
        .map_err(failed("open"))?;
        let begun = s
            .settle_blocking(
                s.begin("seed-run", None, Some("m".into()), false)
                    .map_err(failed("begin"))?,
            )
            .map_err(failed("durable"))?;
        let sid = begun["stream_id"].as_str().unwrap_or_default().to_owned();
        let text = |t: &str| json!({"type": "text", "text": t});
        let events = [
            vec![text("Let me check the "), text("file and fix the bu")],
            vec![
                json!({"type": "tool_call_delta", "id": "call_1", "name": "read_file", "arguments_delta": "{\"path\": "}),
                json!({"type": "tool_call_delta", "id": "call_1", "arguments_delta": "\"src/x\"}"}),
                json!({"type": "tool_call_end", "id": "call_1"}),
                json!({"type": "tool_call_delta", "id": "call_2", "name": "write_file", "arguments_delta": "{\"path\": \"src/x\", \"body\": \"fn ma"}),
            ],
        ];
        let mut seq = 1;
        for batch in &events {
            s.settle_blocking(
                s.append("seed-run", &sid, seq, batch)
                    .map_err(failed("append"))?,
            )
            .map_err(failed("durable"))?;
            seq += batch.len() as u64;
        }
        let cause = json!({"cause": "rate_limited", "retry_after": "3"});
        s.settle_blocking(
            s.interrupt("seed-run", &sid, &cause)
                .map_err(failed("interrupt"))?,
        )
        .map_err(failed("durable"))?;
        let resumed = s
            .settle_blocking(
                s.resume("seed-run", None, None, false)
                    .map_err(failed("resume"))?,
            )
            .map_err(failed("durable"))?;
        let sid = resumed["stream_id"].as_str().unwrap_or_default().to_owned();
        let next = resumed["next_seq"].as_u64().unwrap_or(1);
        s.settle_blocking(
            s.append("seed-run", &sid, next, &[text("g in x.")])
                .map_err(failed("append"))?,
        )
        .map_err(failed("durable"))?;
        s.commit(
            "seed-run",
            &sid,
            json!({"role": "assistant", "content": "done"}),
            false,
        )
        .map_err(failed("commit"))?;
    }
    let mut records = Vec::new();
    let mut names: Vec<_> = fs::read_dir(&sd)
        .map_err(failed("listing the journal"))?
        .flatten()
        .map(|e| e.path())
        .collect();
    names.sort();
    for path in names {
        let n = path
            .file_name()
            .and_then(|f| f.to_str())
            .and_then(|f| f.strip_prefix("journal-"))
            .and_then(|f| f.strip_suffix(".log"))
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        let (Some(n), Ok(bytes)) = (n, fs::read(&path)) else {
            continue;
        };
        if let Some((frames, _)) = scan_segment(n, &bytes) {
            for f in frames {
                if let Ok(plain) = sealer.open(&f.payload) {
                    records.push(plain.to_vec());
                }
            }
        }
    }
    Ok(records)
}

/// An index written by the store's own writer, hive's shape of one, and credential
/// plaintexts as hive and holdfast write them.
fn store_files() -> Vec<((&'static str, String), Vec<u8>)> {
    let mut out = Vec::new();
    let mut full = Credential::new("team/github", "oauth2");
    full.set_key("access_token", Secret::new("seed-token-value".into()));
    full.set_key("refresh_token", Secret::new("seed-refresh".into()));
    full.set_generation(3);
    let api = Credential::api_key("openai", Secret::new("sk-seed".into()));
    for (name, c) in [("holdfast-oauth2", &full), ("holdfast-api-key", &api)] {
        out.push((
            ("credential_plaintext", name.to_owned()),
            c.to_bytes().to_vec(),
        ));
    }
    let hive = json!({
        "id": "github", "credential_type": "api_key",
        "keys": {"api_key": {"name": "api_key", "value": "ghp_seed", "expires_at": null, "metadata": {}}},
        "provider_id": null, "created_at": "2026-01-02T03:04:05.678901",
        "updated_at": "2026-01-02T03:04:05.678901", "last_refreshed": null,
        "auto_refresh": false, "usage_count": 0, "last_used": null, "description": "",
        "tags": []
    });
    out.push((
        ("credential_plaintext", "hive-api-key".into()),
        hive.to_string().into_bytes(),
    ));
    let mut idx = Index::default();
    for c in [&full, &api] {
        idx.credentials.insert(c.id().to_owned(), c.index_entry());
    }
    out.push((
        ("index_json", "holdfast-written".into()),
        idx.to_bytes("/seed/store"),
    ));
    let hive_index = json!({
        "credentials": {"github": {"credential_type": "api_key", "key_count": 1,
            "created_at": "2026-01-02T03:04:05.678901", "updated_at": "2026-01-02T03:04:05.678901",
            "expires_at": null, "tags": []}},
        "last_modified": "2026-01-02T03:04:05.678901", "version": "2.0"
    });
    out.push((
        ("index_json", "hive-written".into()),
        hive_index.to_string().into_bytes(),
    ));
    out.push((
        ("index_json", "hive-v1".into()),
        br#"{"version": "1.0", "credentials": []}"#.to_vec(),
    ));
    out
}

/// The planner's inputs the rules name: text only, completed and unfinished calls, a stalled
/// tool with its history, a permanent cause, a spent budget, a stale checkpoint.
fn recovery_inputs() -> Vec<Value> {
    vec![
        json!({"cause": "connection_reset", "partial_text": "Hello, wor"}),
        json!({"cause": "rate_limited", "partial_text": "", "retry_after": "30",
               "tool_calls": [{"id": "a", "name": "read_file", "arguments": "{\"path\": \"x\"}"},
                              {"id": "b", "name": "write_file", "arguments": "{\"pa"},
                              {"id": "c", "name": "", "arguments": ""},
                              {"id": "d", "name": "grep", "arguments": "null"}]}),
        json!({"cause": "idle_stall", "partial_text": "Writing the file now.",
               "tool_calls": [{"id": "w", "name": "write_file", "arguments": "{\"body\": \"lon"}],
               "stall_history": ["write_file"], "attempt": 1}),
        json!({"error": {"status": 529, "message": "overloaded"},
               "retry_after": "Sun, 06 Nov 1994 08:49:37 GMT"}),
        json!({"error": {"status": 400, "message": "prompt is too long: 210000 tokens"},
               "partial_text": "x"}),
        json!({"error": {"status": 502, "message": "bad gateway", "retry_after": "2"},
               "partial_text": "y", "attempt": 2}),
        json!({"cause": "resumed_from_checkpoint", "partial_text": "z",
               "stale": {"reason": "last event 4000 s ago", "fail": false}}),
    ]
}

/// A run's `details.jsonl` as hive's runtime logger writes it, a duplicate line and a torn
/// last line included.
fn run_log_lines() -> Result<Vec<u8>, String> {
    let dir = Scratch::new();
    let log = RunLog::open(&dir.0, Faults::none()).map_err(failed("opening a run log"))?;
    for (node, attempt) in [("plan", 1), ("act", 1), ("act", 2), ("review", 1)] {
        let Value::Object(detail) = json!({"node_id": node, "node_name": node, "attempt": attempt,
                            "success": node != "act" || attempt == 2, "input_tokens": 120,
                            "output_tokens": 30, "latency_ms": 900})
        else {
            continue;
        };
        log.log_node("seed-run", detail)
            .map_err(failed("logging a node"))?;
    }
    let mut bytes = fs::read(dir.0.join("seed-run").join("details.jsonl"))
        .map_err(failed("reading details.jsonl"))?;
    let first_line = bytes
        .iter()
        .position(|&b| b == b'\n')
        .map_or(Vec::new(), |i| bytes[..=i].to_vec());
    bytes.extend_from_slice(&first_line);
    bytes.extend_from_slice(br#"{"node_id": "tor"#);
    Ok(bytes)
}
