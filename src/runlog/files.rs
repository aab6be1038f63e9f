//! A run's files on disk: reading what was appended since the view last looked (and cutting a
//! torn last line), appending a record, rewriting a file to replace an entry, writing the
//! summary, listing and deleting runs. Every write goes through `durable` (the line log, the
//! atomic replacement, the removal of a run's tree) under the run log's poison rule, in
//! directories resolved beneath the data directory without following a symlink
//! (`durable::beneath`): a link planted at `runs/`, a run's directory or one of its files
//! refuses the request that meets it (`forbidden`) and poisons nothing.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use serde_json::{Map, Value};

use super::error::RunLogError;
use super::validate_run_id;
use super::view::{mtime_ns, tail_of, Entry, FileView, Kind, Loaded, KINDS};
use super::MAX_RECORD_BYTES;
use crate::durable::beneath::{EntryKind, Meta};
use crate::durable::{self, Dir, Faults, LineFile, LockGuard, LockMode, Owned, Poison};
use crate::timefmt::now_ms;

const FRESH_TAIL: Duration = crate::limits::RUN_LOG_FRESH_TAIL;

/// A record kept as it is: its line, its own seq and time, the counter after it.
pub(super) fn as_is(
    view: &Loaded,
    record: &Map<String, Value>,
) -> Result<(Vec<u8>, u64, u64, u64), RunLogError> {
    let seq = record.get("seq").and_then(Value::as_u64).unwrap_or(0);
    let at = record
        .get("logged_at_ms")
        .and_then(Value::as_u64)
        .unwrap_or_else(now_ms);
    // A map of JSON values serializes into a Vec without fail.
    let line = serde_json::to_vec(record).unwrap_or_default();
    if line.len() > MAX_RECORD_BYTES {
        return Err(RunLogError::RecordTooLarge {
            max: MAX_RECORD_BYTES,
            len: line.len(),
        });
    }
    Ok((line, seq, view.next_seq.max(seq.saturating_add(1)), at))
}

/// The files of the run logs under one `runs/` directory.
pub(super) struct RunFiles {
    /// `runs/`, resolved beneath the data directory (its parent) on every use.
    pub(super) runs: Owned,
    pub(super) faults: Faults,
    /// After a failed fsync every write is refused until the daemon restarts.
    pub(super) poison: Poison,
}

impl RunFiles {
    /// The run's directory (made now if `create`), or `not_found`. Made under the poison
    /// rule: a failed fsync of `runs/` after the creation poisons; a refused path does not.
    pub(super) fn ensure_dir(&self, run_id: &str, create: bool) -> Result<Dir, RunLogError> {
        if let Some(dir) = self.runs.open(&[run_id])? {
            return Ok(dir);
        }
        if !create {
            return Err(RunLogError::NoRun(run_id.to_owned()));
        }
        self.poison.check(&self.runs.path().join(run_id))?;
        Ok(self
            .poison
            .watch(self.runs.create(&[run_id], &self.faults))?)
    }

    /// Whether `dir` is still what `runs/<run_id>` names (a prune may have removed it while
    /// a writer waited for its lock).
    pub(super) fn still_there(&self, run_id: &str, dir: &Dir) -> bool {
        let now = self.runs.open(&[run_id]).ok().flatten();
        match (now.and_then(|d| d.meta().ok()), dir.meta()) {
            (Some(a), Ok(b)) => a.ino == b.ino && a.dev == b.dev,
            _ => false,
        }
    }

    /// Take the run's lock (`log.lock` in its directory, never through a symlink).
    pub(super) fn lock(dir: &Dir, timeout: Duration) -> Result<LockGuard, RunLogError> {
        let file = dir.open_lock_file("log.lock")?;
        Ok(durable::lock::lock_file(
            file,
            &dir.path().join("log.lock"),
            LockMode::Exclusive,
            timeout,
        )?)
    }

    /// Whether the run's directory holds any of a run log's files (it may hold only a
    /// stream's state).
    pub(super) fn has_log(&self, run_id: &str) -> bool {
        let Ok(Some(dir)) = self.runs.open(&[run_id]) else {
            return false;
        };
        KINDS
            .iter()
            .map(|k| k.file())
            .chain(["summary.json"])
            .any(|f| dir.stat(f).is_ok_and(|m| m.is_some()))
    }

    /// Bring `view` up to date with the files (the caller holds the run's lock).
    pub(super) fn refresh(&self, dir: &Dir, view: &mut Loaded) -> Result<(), RunLogError> {
        let mut metas: Vec<Option<Meta>> = Vec::new();
        let mut reload = false;
        for kind in KINDS {
            let meta = match dir.stat(kind.file()) {
                Ok(Some(m)) if m.kind == EntryKind::File => Some(m),
                Ok(Some(m)) => return Err(dir.refusal(kind.file(), m.kind, "a file").into()),
                Ok(None) => None,
                Err(source) => {
                    return Err(RunLogError::Read {
                        path: dir.path().join(kind.file()),
                        source,
                    })
                }
            };
            let f = &view.files[kind.index()];
            reload |= match &meta {
                Some(m) if f.exists => {
                    m.ino != f.ino || m.len < f.len || (m.len == f.len && m.mtime_ns != f.mtime_ns)
                }
                None => f.exists,
                Some(_) => false,
            };
            metas.push(meta);
        }
        if reload {
            *view = Loaded::default();
        }
        for (kind, meta) in KINDS.into_iter().zip(&metas) {
            let Some(meta) = meta else { continue };
            let f = &view.files[kind.index()];
            if f.exists && meta.len == f.len {
                continue;
            }
            if !self.read_tail(dir, kind, view)? {
                // Not the file this view read (its end changed): read everything again.
                *view = Loaded::default();
                for (kind, meta) in KINDS.into_iter().zip(&metas) {
                    if meta.is_some() {
                        self.read_tail(dir, kind, view)?;
                    }
                }
                break;
            }
        }
        // Re-read each time: small, and a replaced or deleted summary must be seen.
        let summary_path = dir.path().join("summary.json");
        view.summary = match dir.read_capped("summary.json", MAX_RECORD_BYTES as u64) {
            Ok(Some(bytes)) => {
                Some(
                    serde_json::from_slice(&bytes).map_err(|e| RunLogError::BadSummary {
                        path: summary_path.clone(),
                        reason: e.to_string(),
                    })?,
                )
            }
            Ok(None) => None,
            Err(e) if e.is_unsafe_path() => return Err(e.into()),
            Err(e) => {
                return Err(RunLogError::Read {
                    path: summary_path,
                    source: e.source,
                })
            }
        };
        Ok(())
    }

    /// Read what `kind`'s file holds past the view's end, taking its complete lines; cut a torn
    /// last line (once it is not fresh). `false` if the file does not continue what the view
    /// read (its remembered end differs): the caller reloads.
    pub(super) fn read_tail(
        &self,
        dir: &Dir,
        kind: Kind,
        view: &mut Loaded,
    ) -> Result<bool, RunLogError> {
        let path = dir.path().join(kind.file());
        let mut file = LineFile::open(dir, kind.file())?;
        let f = view.files[kind.index()].clone();
        let (from, known) = if f.exists {
            (f.len, f.tail.clone())
        } else {
            (0, Vec::new())
        };
        let waited = std::time::Instant::now();
        let (bytes, complete) = loop {
            let mut bytes = file.read_from(from - known.len() as u64)?;
            if !bytes.starts_with(&known) {
                return Ok(false);
            }
            bytes.drain(..known.len());
            let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
            let fresh = file
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_none_or(|age| age < FRESH_TAIL);
            if complete < bytes.len() && fresh && waited.elapsed() < FRESH_TAIL {
                // Someone may be writing it right now, without the lock: give them time.
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            break (bytes, complete);
        };
        for line in bytes[..complete].split(|b| *b == b'\n') {
            if !line.iter().all(u8::is_ascii_whitespace) {
                view.take_line(kind, line);
            }
        }
        let len = from + complete as u64;
        if complete < bytes.len() {
            // A torn last line: its writer died before the newline (every writer of ours holds
            // this lock while it writes; others had FRESH_TAIL to finish). Cut it, durably.
            let torn = (bytes.len() - complete) as u64;
            file.cut(len, &self.faults, &self.poison)?;
            tracing::warn!(file = %path.display(), bytes = torn, "run log: cut a torn last line");
            view.report.torn_tails_cut += 1;
            view.report.torn_bytes += torn;
        }
        let meta = file.metadata()?;
        if len == 0 && !f.exists {
            view.report.empty_files += 1;
        }
        // `take_line` advanced next_pos for each line read: keep that, not the value before.
        let next_pos = view.files[kind.index()].next_pos;
        view.files[kind.index()] = FileView {
            ino: meta.ino(),
            len,
            mtime_ns: mtime_ns(&meta),
            tail: tail_of(&known, &bytes[..complete]),
            exists: true,
            next_pos,
        };
        Ok(true)
    }

    /// The seq of the next record and the counter after it; an exhausted counter (a file that
    /// says it wrote seq `u64::MAX`) refuses further records instead of wrapping to 0.
    pub(super) fn take_seq(view: &Loaded) -> Result<(u64, u64), RunLogError> {
        let seq = view.next_seq.max(1);
        match seq.checked_add(1) {
            Some(next) => Ok((seq, next)),
            None => Err(RunLogError::SeqExhausted),
        }
    }

    /// A new record's line: its `seq` and `logged_at_ms` set, size checked. Returns (line
    /// without its newline, seq, the counter after it, the time).
    pub(super) fn stamp(
        view: &Loaded,
        record: &mut Map<String, Value>,
    ) -> Result<(Vec<u8>, u64, u64, u64), RunLogError> {
        let (seq, next_seq) = Self::take_seq(view)?;
        let at = now_ms();
        record.insert("seq".into(), seq.into());
        record.insert("logged_at_ms".into(), at.into());
        // A map of JSON values serializes into a Vec without fail.
        let line = serde_json::to_vec(&record).unwrap_or_default();
        if line.len() > MAX_RECORD_BYTES {
            return Err(RunLogError::RecordTooLarge {
                max: MAX_RECORD_BYTES,
                len: line.len(),
            });
        }
        Ok((line, seq, next_seq, at))
    }

    /// Append one record to `kind`'s file, durably; returns its seq.
    pub(super) fn append(
        &self,
        dir: &Dir,
        view: &mut Loaded,
        kind: Kind,
        mut record: Map<String, Value>,
    ) -> Result<Entry, RunLogError> {
        let (line, seq, next_seq, at) = Self::stamp(view, &mut record)?;
        self.write_line(dir, view, kind, record, line, seq, next_seq, at)
    }

    /// Append a record as it is, its `seq` and `logged_at_ms` kept (a log moved from another
    /// backend).
    pub(super) fn append_as_is(
        &self,
        dir: &Dir,
        view: &mut Loaded,
        kind: Kind,
        record: Map<String, Value>,
    ) -> Result<Entry, RunLogError> {
        let (line, seq, next_seq, at) = as_is(view, &record)?;
        self.write_line(dir, view, kind, record, line, seq, next_seq, at)
    }

    #[allow(clippy::too_many_arguments)]
    fn write_line(
        &self,
        dir: &Dir,
        view: &mut Loaded,
        kind: Kind,
        record: Map<String, Value>,
        mut line: Vec<u8>,
        seq: u64,
        next_seq: u64,
        at: u64,
    ) -> Result<Entry, RunLogError> {
        line.push(b'\n');
        let old_len = view.files[kind.index()].len;
        let meta =
            durable::append_line(dir, kind.file(), &line, old_len, &self.faults, &self.poison)?
                .meta;
        if meta.len() != old_len + line.len() as u64 {
            // Someone appended without the lock since the refresh: their lines were not read.
            view.stale = true;
        }
        let f = &mut view.files[kind.index()];
        let pos = f.next_pos;
        *f = FileView {
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: mtime_ns(&meta),
            tail: tail_of(&f.tail, &line),
            exists: true,
            next_pos: pos + 1,
        };
        view.next_seq = next_seq;
        view.first_ms = Some(view.first_ms.map_or(at, |f| f.min(at)));
        view.last_ms = Some(view.last_ms.map_or(at, |l| l.max(at)));
        Ok(Entry { seq, pos, record })
    }

    /// Replace a logical entry of `kind` (at the same place), by rewriting the file atomically.
    pub(super) fn replace(
        &self,
        dir: &Dir,
        view: &mut Loaded,
        kind: Kind,
        old: &Entry,
        mut record: Map<String, Value>,
    ) -> Result<Entry, RunLogError> {
        let (seq, _) = Self::take_seq(view)?;
        let at = now_ms();
        record.insert("seq".into(), seq.into());
        record.insert("logged_at_ms".into(), at.into());
        let new = Entry {
            seq,
            pos: old.pos,
            record,
        };
        let mut bytes = Vec::new();
        for e in view.records(kind) {
            let r = if e.pos == old.pos {
                &new.record
            } else {
                &e.record
            };
            // JSON values serialize into a Vec without fail.
            let _ = serde_json::to_writer(&mut bytes, r);
            bytes.push(b'\n');
        }
        if bytes.len() > crate::limits::MAX_RUN_LOG_REWRITE_BYTES {
            return Err(RunLogError::TooLargeToRewrite);
        }
        self.poison.check(dir.path())?;
        self.poison
            .watch(dir.atomic_write(kind.file(), &bytes, &self.faults))?;
        // The rewrite drops bad and duplicate lines: reload the view from the new file.
        let mut fresh = Loaded::default();
        self.refresh(dir, &mut fresh)?;
        fresh.report = view.report.clone();
        *view = fresh;
        Ok(new)
    }

    pub(super) fn run_ids(&self) -> Result<Vec<String>, RunLogError> {
        let mut ids = Vec::new();
        let Some(runs) = self.runs.open(&[])? else {
            return Ok(ids);
        };
        let entries = runs.entries().map_err(|source| RunLogError::Read {
            path: runs.path().to_path_buf(),
            source,
        })?;
        for e in entries {
            if validate_run_id(&e.name).is_ok() && e.kind == EntryKind::Dir {
                ids.push(e.name);
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// The newest modification time of the files in a run's directory (ms since the epoch),
    /// not counting `log.lock` (taking the lock creates it) nor the directory itself; the
    /// directory's time only for an empty one.
    pub(super) fn last_activity_ms(dir: &Dir) -> Option<u64> {
        let mut newest: Option<i128> = None;
        for e in dir.entries().ok()? {
            if e.name == "log.lock" {
                continue;
            }
            if let Ok(Some(m)) = dir.stat(&e.name) {
                newest = Some(newest.map_or(m.mtime_ns, |n| n.max(m.mtime_ns)));
            }
        }
        let newest = match newest {
            Some(t) => t,
            None => dir.meta().ok()?.mtime_ns,
        };
        u64::try_from(newest / 1_000_000).ok()
    }

    /// Remove the temp files of the run's own files (`details.jsonl` and the other logs,
    /// `summary.json`) that a rewrite killed midway left; the caller holds the run's lock.
    pub(super) fn sweep_temps(&self, dir: &Dir) -> Result<(), RunLogError> {
        let mut names: Vec<&str> = super::view::KINDS.iter().map(|k| k.file()).collect();
        names.push("summary.json");
        let removed = dir.sweep_temps_of(&names, &self.faults)?;
        if removed > 0 {
            tracing::info!(
                removed,
                "run log: removed temp files of a rewrite cut off by a crash"
            );
        }
        Ok(())
    }

    /// Write `summary.json` (atomically, under the poison rule).
    pub(super) fn write_summary(&self, dir: &Dir, summary: &Value) -> Result<(), RunLogError> {
        // A JSON value serializes into a Vec without fail.
        let bytes = serde_json::to_vec_pretty(summary).unwrap_or_default();
        self.poison.check(dir.path())?;
        self.poison
            .watch(dir.atomic_write("summary.json", &bytes, &self.faults))?;
        Ok(())
    }

    /// Remove `summary.json` and fsync the run's directory, under the poison rule (`run.start`;
    /// the caller holds the run's lock). A link at its name is refused, never followed.
    pub(super) fn remove_summary(&self, dir: &Dir) -> Result<(), RunLogError> {
        self.poison.check(dir.path())?;
        self.poison
            .watch(dir.remove_file("summary.json", &self.faults))?;
        Ok(())
    }

    /// Delete a run's directory (its lock held by the caller), and make it durable, under the
    /// poison rule. A link at `runs/` or at the run's name is refused, never followed.
    pub(super) fn remove_run(&self, run_id: &str) -> Result<(), RunLogError> {
        self.poison.check(&self.runs.path().join(run_id))?;
        if let Some(runs) = self.runs.open(&[])? {
            self.poison.watch(runs.remove_tree(run_id, &self.faults))?;
        }
        Ok(())
    }

    /// Make deletions in `runs/` durable, under the poison rule.
    pub(super) fn sync_dir(&self) -> Result<(), RunLogError> {
        self.poison.check(&self.runs.path())?;
        if let Some(runs) = self.runs.open(&[])? {
            self.poison.watch(runs.fsync(&self.faults))?;
        }
        Ok(())
    }
}
