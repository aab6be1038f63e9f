//! Issue 16: the run log's write protocols (file backend) under a fault at each of their
//! file-system steps in turn: `log_node` (append), `ensure_node` of a new node, `end` (the
//! summary's atomic write) and `prune` (an ended run's directory removed). For every step `k`
//! and every mode — a crash after step `k-1`, EIO once at `k`, EIO from `k` on, ENOSPC once at
//! `k` — a fresh log is set up, the write runs with the fault armed, and the log is opened
//! again without faults. At every point the reopened log holds the run as it was before the
//! write or as it is after it (after, whenever the write was acknowledged), never a node twice;
//! a refused write says `storage` and the log that refused it still answers `run.get`; no temp
//! file is left once the run has been read again.

use serde_json::{json, Map, Value};

use super::*;
use crate::durable::fault::FaultMode;
use crate::error::ErrorKind;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Seen {
    Old,
    New,
}

/// A write refused: its error's kind (`None`: prune's per-run failures, reported in its list
/// with their message only) and message.
type Refusal = (Option<ErrorKind>, String);

fn refused(e: RunLogError) -> Refusal {
    (Some(e.kind()), e.to_string())
}

struct Protocol {
    name: &'static str,
    /// Acknowledged before the fault.
    setup: fn(&RunLog),
    op: fn(&RunLog) -> Result<(), Refusal>,
    seen: fn(&RunLog) -> Result<Seen, String>,
}

fn node(id: &str) -> Map<String, Value> {
    json!({"node_id": id, "node_name": id, "node_type": "llm", "success": true})
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// The node ids of run `r`, each at most once.
fn nodes(log: &RunLog, run: &str) -> Result<Vec<String>, String> {
    let g = log.get(run).map_err(|e| format!("get {run}: {e}"))?;
    let ids: Vec<String> = g["details"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| d["node_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    if unique.len() != ids.len() {
        return Err(format!("a node logged twice: {ids:?}"));
    }
    Ok(ids)
}

fn one_node(log: &RunLog) {
    log.log_node("r", node("a"))
        .unwrap_or_else(|e| panic!("setup: {e}"));
}

fn a_or_ab(log: &RunLog) -> Result<Seen, String> {
    match nodes(log, "r")?.join(",").as_str() {
        "a" => Ok(Seen::Old),
        "a,b" => Ok(Seen::New),
        other => Err(format!("nodes {other}")),
    }
}

fn protocols() -> Vec<Protocol> {
    vec![
        Protocol {
            name: "run.log_node",
            setup: one_node,
            op: |log| log.log_node("r", node("b")).map(drop).map_err(refused),
            seen: a_or_ab,
        },
        Protocol {
            name: "run.ensure_node (new node)",
            setup: one_node,
            op: |log| {
                log.ensure_node("r", "b", Map::new())
                    .map(drop)
                    .map_err(refused)
            },
            seen: a_or_ab,
        },
        Protocol {
            name: "run.end (the summary)",
            setup: one_node,
            op: |log| {
                log.end("r", "success", &EndFields::default())
                    .map(drop)
                    .map_err(refused)
            },
            seen: |log| {
                let g = log.get("r").map_err(|e| e.to_string())?;
                if nodes(log, "r")? != ["a"] {
                    return Err(format!("nodes changed: {g}"));
                }
                match (g["ended"].as_bool(), g["status"].as_str()) {
                    (Some(false), _) => Ok(Seen::Old),
                    (Some(true), Some("success")) => Ok(Seen::New),
                    other => Err(format!("ended/status {other:?}")),
                }
            },
        },
        Protocol {
            name: "run prune (an ended run removed)",
            setup: |log| {
                one_node(log);
                log.end("r", "success", &EndFields::default())
                    .unwrap_or_else(|e| panic!("setup: {e}"));
                // Older than the cut-off of "older than 0".
                std::thread::sleep(Duration::from_millis(5));
            },
            // A run prune could not delete is listed with its error (the others go on).
            op: |log| {
                let listed = log
                    .prune(Duration::ZERO, &|_| false, false)
                    .map_err(refused)?;
                match listed.as_slice() {
                    [one] if one.get("error").is_none() => Ok(()),
                    [one] => Err((None, one["error"].to_string())),
                    other => Err((None, format!("listed {other:?}"))),
                }
            },
            seen: |log| match log.get("r") {
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(Seen::New),
                Err(e) => Err(e.to_string()),
                Ok(_) => match (nodes(log, "r")?.join(",").as_str(), log.get("r")) {
                    ("a", Ok(g)) if g["ended"] == true => Ok(Seen::Old),
                    (n, g) => Err(format!("half pruned: nodes {n}, {g:?}")),
                },
            },
        },
    ]
}

fn temps_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e
                .file_name()
                .to_string_lossy()
                .contains(crate::durable::TEMP_MARKER)
            {
                found.push(p.display().to_string());
            }
        }
    }
    found
}

const MODES: [(FaultMode, &str); 4] = [
    (FaultMode::Crash, "crash"),
    (FaultMode::FailOnce(5), "EIO once"),
    (FaultMode::FailAlways(5), "EIO from then on"),
    (FaultMode::FailOnce(28), "ENOSPC once"),
];

#[test]
fn every_run_log_write_protocol_holds_at_every_crash_and_io_error_point() {
    let (mut violations, mut total) = (Vec::new(), 0);
    for p in protocols() {
        let steps = {
            let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
            let faults = Faults::recorder();
            let log = RunLog::open(tmp.path(), faults.clone()).unwrap_or_else(|e| panic!("{e}"));
            (p.setup)(&log);
            let before = faults.log().len();
            (p.op)(&log).unwrap_or_else(|e| panic!("{}: {e:?}", p.name));
            faults.log()[before..].to_vec()
        };
        assert!(!steps.is_empty(), "{}: no file-system step", p.name);
        let mut line = Vec::new();
        for (mode, mode_name) in MODES {
            let (mut old, mut new, mut refused) = (0, 0, 0);
            for k in 1..=steps.len() as u64 {
                total += 1;
                let at = format!(
                    "{} at step {k} ({}), {mode_name}",
                    p.name,
                    steps[k as usize - 1]
                );
                let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
                let faults = Faults::recorder();
                let log =
                    RunLog::open(tmp.path(), faults.clone()).unwrap_or_else(|e| panic!("{e}"));
                (p.setup)(&log);
                faults.arm(None, k, mode);
                let res = (p.op)(&log);
                if res.is_err() {
                    refused += 1;
                }
                if let (Err((kind, e)), false) = (&res, mode == FaultMode::Crash) {
                    if kind.is_some_and(|k| k != ErrorKind::Storage) {
                        violations.push(format!("{at}: refused as {kind:?}: {e}"));
                    }
                    // Still answers reads (from what it has loaded), unless the run is gone.
                    faults.disarm();
                    if let Err(e) = log.get("r") {
                        if e.kind() != ErrorKind::NotFound {
                            violations.push(format!("{at}: run.get after the failure: {e}"));
                        }
                    }
                }
                drop(log);
                let log = RunLog::open(tmp.path(), Faults::none())
                    .unwrap_or_else(|e| panic!("{at}: reopen: {e}"));
                match (p.seen)(&log) {
                    Ok(Seen::New) => new += 1,
                    Ok(Seen::Old) if res.is_ok() => {
                        violations.push(format!("{at}: acknowledged, but the old state is back"))
                    }
                    Ok(Seen::Old) => old += 1,
                    Err(e) => violations.push(format!("{at}: after reopening: {e}")),
                }
                for t in temps_under(tmp.path()) {
                    violations.push(format!("{at}: temp file left: {t}"));
                }
            }
            line.push(format!(
                "{mode_name} (old {old}, new {new}, refused {refused})"
            ));
        }
        println!(
            "{}: {} steps x {} modes: {}",
            p.name,
            steps.len(),
            MODES.len(),
            line.join("; ")
        );
    }
    println!(
        "run-log write protocols: {total} fault points explored, {} violations",
        violations.len()
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}
