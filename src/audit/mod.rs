//! The audit log: one record per credential operation and per refused call — who, what, when,
//! with what result, never a value — appended to a hash chain in `<data dir>/audit/`, by the
//! daemon and by the CLI working on a store directly, under one cross-process lock.
//!
//! - [`record`]: a record, its line (JSON, its hash over its bytes, the previous record's
//!   hash), the check of one line.
//! - [`segments`]: the directory's files and reading a segment's ends.
//! - `writer`: appending under the lock — the head, rotation, retention, a torn tail.
//! - [`read`]: reading the chain back, filtering it, and verifying it.
//!
//! **When an operation's answer may leave** ([`Durability`]): with `Always`, only once its
//! record is `fdatasync`ed; with `Batch` (the default), once its record was written to the file
//! (it survives a crash of the process, and a write error refuses the operation), the
//! `fdatasync` following within the interval. A change (set, delete, rotation, import, repair)
//! writes a `begun` record and syncs it *before* it is made, whatever the mode: no change is
//! ever made without a durable record that it was attempted. Concurrent callers share each
//! `fdatasync` (group commit: [`AuditLog::sync_through`]).
//!
//! **When the log cannot be written** (a full disk past the reserve, a read-only file system, a
//! failed fsync): the operation is refused with `storage` and the reason, unless
//! `[audit] on_failure = "serve-reads"` lets reads through (docs/security.md, row 34).

pub mod read;
pub mod record;
pub mod segments;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

pub use record::{Entry, Record, Via, Who, BEGUN, OK};
pub use writer::LOCK_TIMEOUT;

use crate::durable::{Faults, IoError, Poison};
use crate::error::ErrorKind;

/// The audit directory under a data directory.
pub fn dir_of(data_dir: &Path) -> PathBuf {
    data_dir.join("audit")
}

/// When an operation's answer may leave, relative to its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// After the record is `fdatasync`ed (concurrent records share one sync).
    Always,
    /// After the record is written to the file; synced within this interval.
    Batch(Duration),
}

/// What an operation does when its record cannot be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// Refuse it (`storage`, saying why): nothing is served or changed unrecorded.
    Refuse,
    /// Refuse changes, serve reads anyway (each failure logged).
    ServeReads,
}

/// `[audit]`, with defaults (docs/operations.md, "The audit log").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Whether to keep an audit log at all.
    pub enabled: bool,
    /// See [`Durability`].
    pub durability: Durability,
    /// See [`OnFailure`].
    pub on_failure: OnFailure,
    /// A segment is closed and a new one begun once it reaches this size.
    pub segment_bytes: u64,
    /// The oldest closed segments are dropped while all of them together exceed this.
    pub max_bytes: u64,
    /// Closed segments whose last record is older than this are dropped (`None`: by size only).
    pub retention: Option<Duration>,
    /// Space kept in reserve (a file of zeros) and released when the disk fills.
    pub reserve_bytes: u64,
}

/// Default `segment_bytes`: 8 MiB (~30,000 records).
pub const DEFAULT_SEGMENT_BYTES: u64 = 8 << 20;
/// Default `max_bytes`: 256 MiB (~1,000,000 records).
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
/// Default `reserve_bytes`: 1 MiB (~4,000 records).
pub const DEFAULT_RESERVE_BYTES: u64 = 1 << 20;
/// Default sync interval of [`Durability::Batch`].
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_millis(10);

impl Default for Settings {
    fn default() -> Self {
        Settings {
            enabled: true,
            durability: Durability::Batch(DEFAULT_SYNC_INTERVAL),
            on_failure: OnFailure::Refuse,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            max_bytes: DEFAULT_MAX_BYTES,
            retention: None,
            reserve_bytes: DEFAULT_RESERVE_BYTES,
        }
    }
}

/// Why a record was not written (the operation it was for is refused).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// A file-system step failed (its message names the step, the path and the OS error).
    #[error("the audit log cannot be written: {0}")]
    Write(String),
    /// An earlier `fdatasync` of the log failed: nothing is trusted to it until a restart.
    #[error("the audit log refuses writes until holdfast restarts: an earlier fsync failed ({0})")]
    Poisoned(String),
    /// Another process held the log's lock for the whole timeout.
    #[error("the audit log is busy: {0}")]
    Busy(String),
    /// The daemon is shutting down.
    #[error("the audit log is closed: the daemon is shutting down")]
    Closed,
}

impl AuditError {
    /// The wire kind of the refusal.
    pub fn kind(&self) -> ErrorKind {
        match self {
            AuditError::Busy(_) => ErrorKind::Busy,
            _ => ErrorKind::Storage,
        }
    }

    fn from_io(e: &IoError) -> AuditError {
        // Not `IoError`'s own text: its hint speaks of a value left intact.
        let full = if e.is_disk_full() {
            " (the disk or quota is full: free some space)"
        } else {
            ""
        };
        AuditError::Write(format!("{} {}: {}{full}", e.op, e.path.display(), e.source))
    }

    fn read(path: &Path, e: &std::io::Error) -> AuditError {
        AuditError::Write(format!("read {}: {e}", path.display()))
    }

    /// The message an operation refused for this gets.
    pub fn refusal(&self) -> String {
        format!("refused: its audit record could not be written ({self})")
    }
}

/// Called once a record is as durable as its operation needs (or failed).
pub type Completion = Box<dyn FnOnce(Result<u64, AuditError>) + Send>;

/// The audit log of one data directory: shared by every thread of a process; other processes
/// append to the same files under the same lock.
#[derive(Clone)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    settings: Settings,
    faults: Faults,
    poison: Poison,
    writer: Mutex<writer::Writer>,
    /// Set while a holder of `writer` waits for another process's hold on the lock: callers
    /// that must not block hand their record to the committer instead.
    waiting: AtomicBool,
    /// Written records not yet synced, in `Batch` mode (the committer syncs them).
    dirty: AtomicBool,
    /// The space reserve was released on a full disk (for the log's messages).
    low_space: AtomicBool,
    /// Records this process appended (its callers' and the log's own).
    appended: std::sync::atomic::AtomicU64,
    sync: Mutex<SyncState>,
    synced_cv: Condvar,
    queue: Mutex<Queue>,
    queue_cv: Condvar,
}

#[derive(Default)]
struct SyncState {
    /// Every record this process wrote up to this number is durable.
    synced: u64,
    /// A thread is in `fdatasync` now.
    syncing: bool,
    syncs: u64,
}

/// Records for the committer thread.
#[derive(Default)]
struct Queue {
    pending: Vec<Pending>,
    /// When `dirty` was set, for the batch sync's deadline.
    dirty_since: Option<Instant>,
    closing: bool,
    /// A committer thread runs.
    running: bool,
    stopped: bool,
}

struct Pending {
    rec: Record,
    /// Synced before `then` runs.
    sync: bool,
    then: Completion,
}

/// How often the committer looks whether the space reserve needs making again.
const RESERVE_CHECK: Duration = Duration::from_secs(60);

impl AuditLog {
    /// The log in `dir` (nothing is touched until the first record).
    pub fn new(dir: PathBuf, settings: Settings, faults: Faults) -> AuditLog {
        AuditLog {
            inner: Arc::new(Inner {
                dir,
                settings,
                faults,
                poison: Poison::default(),
                writer: Mutex::new(writer::Writer::default()),
                waiting: AtomicBool::new(false),
                dirty: AtomicBool::new(false),
                low_space: AtomicBool::new(false),
                appended: std::sync::atomic::AtomicU64::new(0),
                sync: Mutex::new(SyncState::default()),
                synced_cv: Condvar::new(),
                queue: Mutex::new(Queue::default()),
                queue_cv: Condvar::new(),
            }),
        }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Its settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Whether every answer waits for its record's `fdatasync`.
    pub fn strict(&self) -> bool {
        self.inner.settings.durability == Durability::Always
    }

    /// Why writes are refused, if an fsync failed.
    pub fn poisoned(&self) -> Option<String> {
        self.inner.poison.reason()
    }

    /// How many `fdatasync`s this process made of the log (tests, benchmarks).
    pub fn syncs(&self) -> u64 {
        self.inner.sync_state().syncs
    }

    /// Make the directory (0700) and the space reserve now, rather than at the first record
    /// (the daemon, before it serves).
    pub fn prepare(&self) -> Result<(), AuditError> {
        let cx = self.inner.cx();
        crate::durable::create_private_dir(cx.dir, cx.faults)
            .map_err(|e| AuditError::from_io(&e))?;
        crate::durable::perms::check_private_dir(cx.dir)
            .map_err(|e| AuditError::Write(e.to_string()))?;
        writer::refill_reserve(&cx);
        Ok(())
    }

    /// Start the committer thread (the daemon): it writes records handed to it by callers
    /// that must not block, and syncs `Batch` records within the interval.
    pub fn start_committer(&self) -> std::io::Result<()> {
        self.inner.queue().running = true;
        let inner = Arc::clone(&self.inner);
        let spawned = std::thread::Builder::new()
            .name("holdfast-audit".into())
            .spawn(move || inner.commit_loop());
        if spawned.is_err() {
            self.inner.queue().running = false;
        }
        spawned.map(|_| ())
    }

    /// Record `rec`, waiting for the lock if another process holds it; with `sync` (or in
    /// `Always` mode) return only once it is durable. Its sequence number.
    pub fn record(&self, rec: Record, sync: bool) -> Result<u64, AuditError> {
        // A change needs the space reserve in place: once a full disk took it, its room is
        // kept for the records of reads, and changes wait until it can be made again. (A
        // refused directory is said as such, not as a full disk.)
        if rec.result == BEGUN && self.inner.settings.reserve_bytes > 0 {
            segments::check_dir(&self.inner.dir).map_err(|e| AuditError::Write(e.to_string()))?;
            // Something other than a file at the reserve's name is not a full disk.
            let reserve = self.inner.dir.join(segments::RESERVE_FILE);
            if std::fs::symlink_metadata(&reserve).is_ok_and(|m| !m.is_file()) {
                return Err(AuditError::Write(format!(
                    "{} is not a file where the audit log keeps its space reserve; refusing to use it (fix: remove it; the log makes the reserve again)",
                    reserve.display()
                )));
            }
        }
        if rec.result == BEGUN
            && self.inner.settings.reserve_bytes > 0
            && self.inner.dir.is_dir()
            && !writer::refill_reserve(&self.inner.cx())
        {
            return Err(AuditError::Write(format!(
                "the disk is full (No space left on device for the audit log's {}-byte reserve, kept for the records of reads): changes are refused until space is freed",
                self.inner.settings.reserve_bytes
            )));
        }
        let seq = self
            .inner
            .append_blocking(std::slice::from_ref(&rec))?
            .first()
            .copied()
            .ok_or_else(|| AuditError::Write("the record was given no number".into()))?;
        if sync || self.strict() {
            self.inner.sync_through(seq)?;
        } else {
            self.inner.mark_dirty();
        }
        Ok(seq)
    }

    /// Record `rec` from a thread that must not wait on the disk (an async worker): written
    /// here and now if that needs no waiting (`Batch` mode, nobody else appending), else
    /// `None` — hand it to [`AuditLog::record_then`] instead.
    pub fn try_record_now(&self, rec: &Record) -> Option<Result<u64, AuditError>> {
        if self.strict() {
            return None;
        }
        let inner = &self.inner;
        let mut w = match inner.writer.try_lock() {
            Ok(w) => w,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            // A holder waiting for another process could hold it for long: do not queue
            // behind it. Otherwise it is writing a batch, microseconds.
            Err(std::sync::TryLockError::WouldBlock) if inner.waiting.load(Ordering::SeqCst) => {
                return None
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                inner.writer.lock().unwrap_or_else(PoisonError::into_inner)
            }
        };
        let r = w.append(&inner.cx(), std::slice::from_ref(rec), false);
        drop(w);
        match r {
            Ok(Some(a)) => {
                inner.appended.fetch_add(1, Ordering::Relaxed);
                inner.mark_dirty();
                a.seqs.first().copied().map(Ok)
            }
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Record `rec`, then call `then` once it is as durable as the mode asks (`sync`: always
    /// synced first). Never waits on the disk or the lock in the caller's thread: the record
    /// is written here if that costs no waiting, else by the committer thread. Without a
    /// committer (the CLI) it is written here, waiting.
    pub fn record_then(&self, rec: Record, sync: bool, then: Completion) {
        let sync = sync || self.strict();
        if !sync {
            if let Some(r) = self.try_record_now(&rec) {
                return then(r);
            }
        }
        let mut q = self.inner.queue();
        if !q.running || q.stopped {
            drop(q);
            return then(self.record(rec, sync));
        }
        q.pending.push(Pending { rec, sync, then });
        drop(q);
        self.inner.queue_cv.notify_one();
    }

    /// Record `rec` without waiting for anything (a refused call: its answer does not wait).
    pub fn record_detached(&self, rec: Record) {
        let on_failure = |r: Result<u64, AuditError>| {
            if let Err(e) = r {
                tracing::error!(error = %e, "a refused call could not be recorded in the audit log");
            }
        };
        self.record_then(rec, false, Box::new(on_failure));
    }

    /// Sync everything written so far and stop the committer (shutdown): records handed to
    /// it are written first.
    pub fn close(&self) {
        {
            let mut q = self.inner.queue();
            q.closing = true;
        }
        self.inner.queue_cv.notify_all();
        let mut q = self.inner.queue();
        while q.running && !q.stopped {
            q = self
                .inner
                .queue_cv
                .wait_timeout(q, Duration::from_millis(50))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(q);
        let written = self.inner.writer().written;
        if let Err(e) = self.inner.sync_through(written) {
            tracing::error!(error = %e, "the audit log's last records could not be synced");
        }
        tracing::info!(
            records = self.inner.appended.load(Ordering::Relaxed),
            fdatasyncs = self.syncs(),
            "audit log closed"
        );
    }
}

impl Inner {
    fn cx(&self) -> writer::Ctx<'_> {
        writer::Ctx {
            dir: &self.dir,
            settings: &self.settings,
            faults: &self.faults,
            poison: &self.poison,
            low_space: &self.low_space,
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, writer::Writer> {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sync_state(&self) -> std::sync::MutexGuard<'_, SyncState> {
        self.sync.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Append `recs`, waiting for the lock (flagging the wait, see `waiting`).
    fn append_blocking(&self, recs: &[Record]) -> Result<Vec<u64>, AuditError> {
        let mut w = self.writer();
        let cx = self.cx();
        let a = match w.append(&cx, recs, false)? {
            Some(a) => a,
            None => {
                self.waiting.store(true, Ordering::SeqCst);
                let r = w.append(&cx, recs, true);
                self.waiting.store(false, Ordering::SeqCst);
                r?.ok_or_else(|| AuditError::Busy("the lock was not taken".into()))?
            }
        };
        self.appended
            .fetch_add(recs.len() as u64, Ordering::Relaxed);
        Ok(a.seqs)
    }

    /// Note written, unsynced records: the committer syncs them within the interval.
    fn mark_dirty(&self) {
        if !self.dirty.swap(true, Ordering::SeqCst) {
            let mut q = self.queue();
            q.dirty_since.get_or_insert_with(Instant::now);
            drop(q);
            self.queue_cv.notify_one();
        }
    }

    /// Return once every record this process wrote up to `seq` is durable. One thread syncs
    /// at a time; the others wait for it and find their records covered by it, or by the
    /// next one, which covers everything written meanwhile (group commit).
    fn sync_through(&self, seq: u64) -> Result<(), AuditError> {
        let mut s = self.sync_state();
        loop {
            if let Some(why) = self.poison.reason() {
                return Err(AuditError::Poisoned(why));
            }
            if s.synced >= seq {
                return Ok(());
            }
            if !s.syncing {
                break;
            }
            s = self
                .synced_cv
                .wait(s)
                .unwrap_or_else(PoisonError::into_inner);
        }
        s.syncing = true;
        drop(s);
        // What was written before this point is covered: the file that holds the newest
        // record (a rotation synced every file before it).
        let (upto, file) = {
            let w = self.writer();
            (w.written, w.written_file())
        };
        let r = match &file {
            Some(f) => f.sync(&self.faults, &self.poison),
            None => Ok(()),
        };
        let mut s = self.sync_state();
        s.syncing = false;
        s.syncs += 1;
        if r.is_ok() {
            s.synced = s.synced.max(upto);
        }
        drop(s);
        self.synced_cv.notify_all();
        match r {
            Ok(()) if upto >= seq => Ok(()),
            Ok(()) => self.sync_through(seq),
            Err(e) => Err(AuditError::from_io(&e)),
        }
    }

    fn commit_loop(self: Arc<Self>) {
        let interval = match self.settings.durability {
            Durability::Batch(d) => d,
            Durability::Always => Duration::ZERO,
        };
        let mut reserve_checked: Option<Instant> = None;
        loop {
            if reserve_checked.is_none_or(|t| t.elapsed() >= RESERVE_CHECK) {
                // Only once the directory exists (the first record makes it).
                if self.dir.is_dir() {
                    writer::refill_reserve(&self.cx());
                }
                reserve_checked = Some(Instant::now());
            }
            let mut q = self.queue();
            let (batch, sync_due) = loop {
                let due = q.dirty_since.map(|t| t + interval);
                let now = Instant::now();
                if !q.pending.is_empty() {
                    break (
                        std::mem::take(&mut q.pending),
                        due.is_some_and(|d| d <= now),
                    );
                }
                if due.is_some_and(|d| d <= now) {
                    break (Vec::new(), true);
                }
                if q.closing {
                    q.stopped = true;
                    drop(q);
                    self.queue_cv.notify_all();
                    return;
                }
                let wait = due.map_or(RESERVE_CHECK, |d| d - now);
                q = self
                    .queue_cv
                    .wait_timeout(q, wait)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            };
            if sync_due {
                q.dirty_since = None;
            }
            drop(q);
            if sync_due {
                self.dirty.store(false, Ordering::SeqCst);
                let written = self.writer().written;
                if let Err(e) = self.sync_through(written) {
                    tracing::error!(error = %e, "the audit log's batch sync failed: records written in the last interval may be lost, and every credential operation is refused until the daemon restarts");
                }
            }
            if !batch.is_empty() {
                self.commit(batch);
            }
        }
    }

    /// Write a batch handed over by callers that must not block, sync it if any of them
    /// asks, and call each back.
    fn commit(&self, batch: Vec<Pending>) {
        let recs: Vec<Record> = batch.iter().map(|p| p.rec.clone()).collect();
        let seqs = match self.append_blocking(&recs) {
            Ok(seqs) => seqs,
            Err(e) => {
                for p in batch {
                    (p.then)(Err(e.clone()));
                }
                return;
            }
        };
        let must_sync = batch.iter().any(|p| p.sync);
        let synced = match seqs.last() {
            Some(&last) if must_sync => self.sync_through(last),
            _ => Ok(()),
        };
        let mut any_unsynced = false;
        for (p, seq) in batch.into_iter().zip(seqs) {
            if p.sync {
                (p.then)(synced.clone().map(|()| seq));
            } else {
                any_unsynced = true;
                (p.then)(Ok(seq));
            }
        }
        if any_unsynced && !must_sync {
            self.mark_dirty();
        }
    }
}

#[cfg(test)]
mod tests;
