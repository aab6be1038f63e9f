//! A run log's file reader: what a crashed, racy or foreign writer (hive's own logger) may
//! leave in `details.jsonl`.

use super::{OrFault, Outcome};
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::durable::Faults;
use crate::runlog::RunLog;

/// The bytes as a run's `details.jsonl` (written long ago: no writer can still be finishing
/// its last line), read through a real [`RunLog`]. Checked: the read answers (bad lines are
/// skipped and counted, never an error); the file afterwards is the input cut at its last
/// newline, and a torn tail is counted once with its length exactly when there was one;
/// every complete line is counted once — a node, a bad line or a superseded duplicate; a
/// second reader finds the same nodes and nothing more to cut.
pub fn runlog_lines(data: &[u8]) -> Outcome {
    let dir = Scratch::new();
    let run_dir = dir.0.join("fuzz-run");
    let file = run_dir.join("details.jsonl");
    fs::create_dir_all(&run_dir).setup("creating the run's directory")?;
    fs::write(&file, data).setup("writing details.jsonl")?;
    fs::File::options()
        .write(true)
        .open(&file)
        .and_then(|f| f.set_modified(SystemTime::now() - Duration::from_secs(3600)))
        .setup("dating details.jsonl an hour back")?;
    let log = RunLog::open(&dir.0, Faults::none()).setup("opening a run log directory")?;
    let run = log.get("fuzz-run").broken("reading the run failed")?;
    let complete = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let after = fs::read(&file).setup("the file is gone")?;
    check_eq!(
        after,
        data[..complete],
        "the read changed more than a torn tail"
    );
    let report = &run["report"];
    let torn = data.len() - complete;
    check_eq!(
        report["torn_tails_cut"].as_u64(),
        Some(u64::from(torn > 0)),
        "torn tails counted"
    );
    check_eq!(
        report["torn_bytes"].as_u64(),
        Some(torn as u64),
        "torn bytes counted"
    );
    let lines = data[..complete]
        .split(|&b| b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .count() as u64;
    let nodes = run["nodes"].as_u64().broken("a node count")?;
    let bad = report["bad_lines"].as_u64().broken("bad lines")?;
    let duplicates = report["duplicate_lines"].as_u64().broken("duplicates")?;
    check_eq!(
        nodes + bad + duplicates,
        lines,
        "{lines} lines: {nodes} nodes, {bad} bad, {duplicates} duplicates"
    );
    drop(log);
    let again = RunLog::open(&dir.0, Faults::none())
        .setup("reopening")?
        .get("fuzz-run")
        .broken("reading again")?;
    check_eq!(
        again["nodes"],
        run["nodes"],
        "a second reader sees other nodes"
    );
    check_eq!(
        again["report"]["torn_tails_cut"].as_u64(),
        Some(0),
        "cut twice"
    );
    Ok(nodes > 0)
}

/// A directory of its own under the system's temp dir, removed when dropped.
pub(super) struct Scratch(pub(super) PathBuf);

impl Scratch {
    pub(super) fn new() -> Scratch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("holdfast-fuzz-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
