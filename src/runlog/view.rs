//! The parsed view of one run's files, in memory: its logical entries by key (node details,
//! steps, tool calls, the recovery timeline), the seq counter, and per file what was read
//! (inode, length, mtime, last bytes) so the next look reads only what was appended. No file
//! is opened here: `files.rs` reads and writes, and feeds lines to [`Loaded::take_line`].

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;

use serde::Serialize;
use serde_json::{Map, Value};

use super::schema::{key_str, node_key, step_key, Key};
use crate::limits::RUN_LOG_TAIL_BYTES as TAIL_BYTES;

/// The three append-only files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Details,
    Steps,
    Tools,
    Recovery,
}

pub(super) const KINDS: [Kind; 4] = [Kind::Details, Kind::Steps, Kind::Tools, Kind::Recovery];

impl Kind {
    pub(super) fn file(self) -> &'static str {
        match self {
            Kind::Details => "details.jsonl",
            Kind::Steps => "tool_logs.jsonl",
            Kind::Tools => "tool_calls.jsonl",
            Kind::Recovery => "recovery.jsonl",
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// What loading a run's files found and repaired.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Report {
    /// Torn last lines cut (a writer died mid-append).
    pub torn_tails_cut: u64,
    /// Bytes those cuts removed.
    pub torn_bytes: u64,
    /// Complete lines that were not valid records (skipped, left in place).
    pub bad_lines: u64,
    /// Lines superseded by a later line with the same key (a log written by a racy logger).
    pub duplicate_lines: u64,
    /// Log files present but empty.
    pub empty_files: u64,
}

impl Report {
    /// Nothing was repaired or skipped.
    pub fn is_clean(&self) -> bool {
        *self == Report::default()
    }
}

/// One logical entry: its record and where it sits.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub(super) seq: u64,
    /// Position in its file (line order), kept when the entry is replaced.
    pub(super) pos: u64,
    pub(super) record: Map<String, Value>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct FileView {
    /// Inode, length and mtime when last read or written (an append grows the length; a
    /// replacement changes the inode; a cut shrinks it), and the last bytes read, checked
    /// before reading on: a new file that reused the inode number does not end the same way.
    pub(super) ino: u64,
    pub(super) len: u64,
    pub(super) mtime_ns: i128,
    pub(super) tail: Vec<u8>,
    pub(super) exists: bool,
    pub(super) next_pos: u64,
}

pub(super) fn mtime_ns(m: &fs::Metadata) -> i128 {
    i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec())
}

/// The last [`TAIL_BYTES`] of `a` followed by `b`.
pub(super) fn tail_of(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut t: Vec<u8> = a.iter().chain(b).copied().collect();
    let cut = t.len().saturating_sub(TAIL_BYTES);
    t.drain(..cut);
    t
}

/// A tool call as the log knows it.
#[derive(Clone, Debug, Default)]
pub(super) struct ToolCall {
    pub(super) begin: Option<Entry>,
    pub(super) end: Option<Entry>,
}

/// The parsed view of one run's files.
#[derive(Clone, Debug, Default)]
pub(super) struct Loaded {
    pub(super) files: [FileView; 4],
    pub(super) next_seq: u64,
    pub(super) nodes: BTreeMap<Key, Entry>,
    pub(super) steps: BTreeMap<Key, Entry>,
    pub(super) tools: BTreeMap<String, ToolCall>,
    /// The stream's interruptions and resumptions with their plans, in order.
    pub(super) recovery: Vec<Entry>,
    pub(super) summary: Option<Value>,
    pub(super) report: Report,
    /// The files changed behind this view (a writer that does not take the lock): reload.
    pub(super) stale: bool,
    pub(super) first_ms: Option<u64>,
    pub(super) last_ms: Option<u64>,
    /// A shared store's version of the run this view was read at (`None`: files, or not
    /// read yet).
    pub(super) store_version: Option<u64>,
    /// The run's directory was swept of temp files a killed rewrite left (files: once per
    /// view, under the run's lock).
    pub(super) swept: bool,
}

impl Loaded {
    /// The keyed entries of `kind` (details or steps).
    pub(super) fn keyed(&mut self, kind: Kind) -> &mut BTreeMap<Key, Entry> {
        match kind {
            Kind::Steps => &mut self.steps,
            _ => &mut self.nodes,
        }
    }

    /// Take one complete line of `kind` into the view.
    pub(super) fn take_line(&mut self, kind: Kind, line: &[u8]) {
        let pos = self.files[kind.index()].next_pos;
        self.files[kind.index()].next_pos += 1;
        let Ok(Value::Object(record)) = serde_json::from_slice::<Value>(line) else {
            self.report.bad_lines += 1;
            return;
        };
        let seq = record.get("seq").and_then(Value::as_u64).unwrap_or(0);
        // A file may say anything: u64::MAX leaves the counter exhausted, not wrapped.
        self.next_seq = self.next_seq.max(seq.saturating_add(1));
        if let Some(ms) = record.get("logged_at_ms").and_then(Value::as_u64) {
            self.first_ms = Some(self.first_ms.map_or(ms, |f| f.min(ms)));
            self.last_ms = Some(self.last_ms.map_or(ms, |l| l.max(ms)));
        }
        let entry = |record| Entry { seq, pos, record };
        let replaced = match kind {
            Kind::Details => match node_key(&record) {
                Ok(k) => self.nodes.insert(k, entry(record)).is_some(),
                Err(_) => {
                    self.report.bad_lines += 1;
                    return;
                }
            },
            Kind::Steps => match step_key(&record) {
                Ok(k) => self.steps.insert(k, entry(record)).is_some(),
                Err(_) => {
                    self.report.bad_lines += 1;
                    return;
                }
            },
            Kind::Recovery => {
                if !record.get("event").is_some_and(Value::is_string) {
                    self.report.bad_lines += 1;
                    return;
                }
                self.recovery.push(entry(record));
                false
            }
            Kind::Tools => {
                let id = key_str(&record, "tool_use_id", "tool call");
                let event = record.get("event").and_then(Value::as_str);
                match (id, event) {
                    (Ok(id), Some("begin")) => {
                        let t = self.tools.entry(id).or_default();
                        t.begin.replace(entry(record)).is_some()
                    }
                    (Ok(id), Some("end")) => {
                        let t = self.tools.entry(id).or_default();
                        t.end.replace(entry(record)).is_some()
                    }
                    _ => {
                        self.report.bad_lines += 1;
                        return;
                    }
                }
            }
        };
        if replaced {
            self.report.duplicate_lines += 1;
        }
    }

    /// The logical records of `kind`, in file order.
    pub(super) fn records(&self, kind: Kind) -> Vec<&Entry> {
        let mut v: Vec<&Entry> = match kind {
            Kind::Details => self.nodes.values().collect(),
            Kind::Steps => self.steps.values().collect(),
            Kind::Recovery => self.recovery.iter().collect(),
            Kind::Tools => self
                .tools
                .values()
                .flat_map(|t| t.begin.iter().chain(t.end.iter()))
                .collect(),
        };
        v.sort_by_key(|e| e.pos);
        v
    }

    pub(super) fn ended(&self) -> bool {
        self.summary.is_some()
    }
}
