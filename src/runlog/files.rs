//! A run's files on disk: reading what was appended since the view last looked (and cutting a
//! torn last line), appending a record, rewriting a file to replace an entry, writing the
//! summary, listing and deleting runs. Every write goes through `durable` (the line log,
//! `atomic_write`, `remove_tree`) under the run log's poison rule.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use super::error::RunLogError;
use super::validate_run_id;
use super::view::{mtime_ns, tail_of, Entry, FileView, Kind, Loaded, KINDS};
use super::MAX_RECORD_BYTES;
use crate::durable::{self, Faults, LineFile, Poison};
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
    pub(super) dir: PathBuf,
    pub(super) faults: Faults,
    /// After a failed fsync every write is refused until the daemon restarts.
    pub(super) poison: Poison,
}

impl RunFiles {
    /// The run's directory exists (made now if `create`), or `not_found`.
    pub(super) fn ensure_dir(
        &self,
        run_id: &str,
        dir: &Path,
        create: bool,
    ) -> Result<(), RunLogError> {
        match fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(RunLogError::NotA {
                    path: dir.to_path_buf(),
                    what: "directory",
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !create {
                    return Err(RunLogError::NoRun(run_id.to_owned()));
                }
                durable::create_private_dir(dir, &self.faults)?;
                durable::fsync_dir(&self.dir, &self.faults)?;
            }
            Err(source) => {
                return Err(RunLogError::Read {
                    path: dir.to_path_buf(),
                    source,
                })
            }
        }
        Ok(())
    }

    /// Bring `view` up to date with the files (the caller holds the run's lock).
    pub(super) fn refresh(&self, dir: &Path, view: &mut Loaded) -> Result<(), RunLogError> {
        let mut metas = Vec::new();
        let mut reload = false;
        for kind in KINDS {
            let path = dir.join(kind.file());
            let meta = match fs::symlink_metadata(&path) {
                Ok(m) if m.is_file() => Some(m),
                Ok(_) => return Err(RunLogError::NotA { path, what: "file" }),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(source) => return Err(RunLogError::Read { path, source }),
            };
            let f = &view.files[kind.index()];
            reload |= match &meta {
                Some(m) if f.exists => {
                    m.ino() != f.ino
                        || m.len() < f.len
                        || (m.len() == f.len && mtime_ns(m) != f.mtime_ns)
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
            if f.exists && meta.len() == f.len {
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
        let summary_path = dir.join("summary.json");
        view.summary = match durable::read_capped(&summary_path, MAX_RECORD_BYTES as u64) {
            Ok(Some(bytes)) => {
                Some(
                    serde_json::from_slice(&bytes).map_err(|e| RunLogError::BadSummary {
                        path: summary_path.clone(),
                        reason: e.to_string(),
                    })?,
                )
            }
            Ok(None) => None,
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(RunLogError::Read {
                    path: summary_path,
                    source,
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
        dir: &Path,
        kind: Kind,
        view: &mut Loaded,
    ) -> Result<bool, RunLogError> {
        let path = dir.join(kind.file());
        let mut file = LineFile::open(&path)?;
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
        dir: &Path,
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
        dir: &Path,
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
        dir: &Path,
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
        dir: &Path,
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
        self.poison.check(dir)?;
        self.poison.watch(durable::atomic_write(
            dir,
            kind.file(),
            &bytes,
            &self.faults,
        ))?;
        // The rewrite drops bad and duplicate lines: reload the view from the new file.
        let mut fresh = Loaded::default();
        self.refresh(dir, &mut fresh)?;
        fresh.report = view.report.clone();
        *view = fresh;
        Ok(new)
    }

    pub(super) fn run_ids(&self) -> Result<Vec<String>, RunLogError> {
        let mut ids = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ids),
            Err(source) => {
                return Err(RunLogError::Read {
                    path: self.dir.clone(),
                    source,
                })
            }
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if validate_run_id(&name).is_ok() && e.file_type().is_ok_and(|t| t.is_dir()) {
                ids.push(name);
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// The newest modification time of the files in a run's directory (ms since the epoch),
    /// not counting `log.lock` (taking the lock creates it) nor the directory itself; the
    /// directory's time only for an empty one.
    pub(super) fn last_activity_ms(dir: &Path) -> Option<u64> {
        let mut newest = None;
        for e in fs::read_dir(dir).ok()?.flatten() {
            if e.file_name() == "log.lock" {
                continue;
            }
            if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
                newest = Some(newest.map_or(t, |n: std::time::SystemTime| n.max(t)));
            }
        }
        let newest = match newest {
            Some(t) => t,
            None => fs::symlink_metadata(dir).ok()?.modified().ok()?,
        };
        newest
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_millis() as u64)
    }

    /// Remove the temp files of the run's own files (`details.jsonl` and the other logs,
    /// `summary.json`) that a rewrite killed midway left; the caller holds the run's lock.
    pub(super) fn sweep_temps(&self, dir: &Path) -> Result<(), RunLogError> {
        let mut names: Vec<&str> = super::view::KINDS.iter().map(|k| k.file()).collect();
        names.push("summary.json");
        let removed = durable::sweep_temps_of(dir, &names, &self.faults)?;
        if removed > 0 {
            tracing::info!(
                removed,
                "run log: removed temp files of a rewrite cut off by a crash"
            );
        }
        Ok(())
    }

    /// Write `summary.json` (atomically, under the poison rule).
    pub(super) fn write_summary(&self, dir: &Path, summary: &Value) -> Result<(), RunLogError> {
        // A JSON value serializes into a Vec without fail.
        let bytes = serde_json::to_vec_pretty(summary).unwrap_or_default();
        self.poison.check(dir)?;
        self.poison.watch(durable::atomic_write(
            dir,
            "summary.json",
            &bytes,
            &self.faults,
        ))?;
        Ok(())
    }

    /// Delete a run's directory (its lock held by the caller), and make it durable.
    pub(super) fn remove_run(&self, run_id: &str) -> Result<(), RunLogError> {
        durable::remove_tree(&self.dir, run_id, &self.faults)?;
        Ok(())
    }

    /// Make deletions in `runs/` durable.
    pub(super) fn sync_dir(&self) -> Result<(), RunLogError> {
        Ok(durable::fsync_dir(&self.dir, &self.faults)?)
    }
}
