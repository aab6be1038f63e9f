//! The stream journal: one framed append-only log shared by every stream, with group commit.
//!
//! **Why one log and not a file per run.** An acknowledged delta must be on disk, so every
//! acknowledgement waits for an fsync. With a file per run, N streams appending at once need N
//! fsyncs (each file its own); with one log, every append that arrived while the previous
//! fsync ran is written with one `write` and covered by one `fdatasync` (group commit), however
//! many streams they came from — the design of every database WAL and of Redis's AOF. Readers
//! do not need per-run files: the daemon keeps each active run's events in memory, rebuilt from
//! the journal at start-up, and deletes a segment once no active run has records in it.
//!
//! **Segments.** `journal-<16 hex>.log`, 16 MiB each, zero-filled and fsynced before first use
//! (prepared ahead on a helper thread), so that an append rewrites allocated blocks in place and
//! its `fdatasync` flushes data only — no block allocation, no size change, no journal commit of
//! the file system. A segment starts with a 16-byte header (`HFJ1`, the segment number, a
//! CRC32C of both).
//!
//! **Frames.** `u32 length · u32 crc32c · payload` (little-endian), the CRC over the segment
//! number and the payload (a frame copied from another segment does not validate). A length of
//! zero with a zero CRC is the end of the written part (zero fill).
//!
//! **Start-up.** Every segment is scanned in order. The last one may end in a torn frame (a crash
//! mid-write): its bytes are zeroed and fsynced before appending resumes there ("cut at the last
//! good frame"). A bad frame followed by data further than one write batch away — or a bad frame
//! in any segment but the last — is corruption: the segment is copied to `quarantine/`, replay
//! of that segment stops there, and the report says so (nothing is silently dropped).
//!
//! **Failures.** A failed write or fsync fails every append of that batch and poisons the
//! journal (every later append fails) until it is reopened: after a failed fsync the kernel may
//! have dropped the dirty pages (fsyncgate), so nothing written since can be vouched for.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

mod committer;
mod promise;
mod segment;

use committer::Committer;
use promise::Ack;
pub use promise::Promise;
use segment::*;

use super::fault::{Faults, Op};
use super::{Dir, IoError, Owned};

pub use crate::limits::SEGMENT_BYTES;
/// The segment header: `HFJ1` · u64 segment number · u32 crc32c.
pub const HEADER_BYTES: u64 = 16;
const MAGIC: &[u8; 4] = b"HFJ1";
use crate::limits::MAX_BATCH_BYTES;
pub use crate::limits::MAX_PAYLOAD;
/// How far past the last good frame one interrupted write can have reached: a batch, or a
/// single frame larger than a batch.
pub const TORN_WINDOW: usize = if MAX_PAYLOAD > MAX_BATCH_BYTES {
    MAX_PAYLOAD
} else {
    MAX_BATCH_BYTES
} + FRAME_HEADER;
/// A frame's header: `u32 length · u32 crc32c`.
pub const FRAME_HEADER: usize = 8;
/// Held (flock) by the journal's one writer.
const LOCK_FILE: &str = "journal.lock";

/// When appends are acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// After the `fdatasync` that covers them (default).
    Always,
    /// After the `write`; an `fdatasync` at most this often (a crash loses at most that much).
    Batch(Duration),
    /// After the `write`, never synced (tests, benchmarks of everything but the disk).
    None,
}

/// Where a frame landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// Segment number.
    pub segment: u64,
    /// Byte offset of the frame in the segment.
    pub offset: u64,
}

/// A frame found at start-up.
#[derive(Debug)]
pub struct Replayed {
    /// Where it is.
    pub pos: Position,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// What start-up found.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ReplayReport {
    /// Segments scanned.
    pub segments: usize,
    /// Good frames.
    pub frames: usize,
    /// A torn tail cut off: (segment, offset, bytes zeroed).
    pub torn_tail: Option<(u64, u64, u64)>,
    /// Corrupt segments, each copied to quarantine: (segment, offset of the bad frame, copy).
    pub corrupt: Vec<(u64, u64, PathBuf)>,
}

/// Called when an append makes the queue non-empty while threads assist the committer: the
/// way to tell the thread that commits (the daemon's append lane) that there is work, when the
/// append came from a thread that will not commit it itself ([`Journal::set_nudge`]).
pub type Nudge = Arc<dyn Fn() + Send + Sync>;

/// The failure that poisoned the journal: one failed step, shared by every append it failed.
pub type Failure = Arc<IoError>;

/// Why an append or the journal failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// A write or fsync failed; the journal refuses appends until reopened.
    #[error("stream journal refuses writes until the daemon restarts: {0}")]
    Poisoned(Failure),
    /// The journal is shutting down.
    #[error("stream journal is closed")]
    Closed,
    /// A payload over [`MAX_PAYLOAD`].
    #[error("record of {0} bytes is over the {MAX_PAYLOAD}-byte limit")]
    TooLarge(usize),
    /// Opening or replaying failed at one step.
    #[error("stream journal {}: {step}: {source}", dir.display())]
    Open {
        /// The journal's directory.
        dir: PathBuf,
        /// The step (`creating it`, `locking`, `replaying`, …).
        step: &'static str,
        /// What went wrong there.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// Another process holds the journal's lock.
    #[error("stream journal {} is in use by another process (a running daemon?)", .0.display())]
    InUse(PathBuf),
    /// A shared store (PostgreSQL) refused the record: the run changed elsewhere since this
    /// daemon last saw it (another host took it over, or ended it). Nothing was written.
    #[error("the run was changed by another holder (taken over or ended elsewhere); nothing was written")]
    Fenced,
    /// A shared store's transaction failed (the database is down, or refused it): nothing of
    /// the record was written.
    #[error("{0}")]
    Backend(Arc<dyn std::error::Error + Send + Sync>),
}

/// Counters (for status and benchmarks).
#[derive(Debug, Default)]
pub struct Stats {
    /// Frames appended.
    pub appends: AtomicU64,
    /// Batches written (each one `write`).
    pub batches: AtomicU64,
    /// `fdatasync`s.
    pub syncs: AtomicU64,
}

struct Pending {
    payload: Vec<u8>,
    ack: Ack,
}

#[derive(Default)]
struct Queue {
    pending: Vec<Pending>,
    closing: bool,
    poisoned: Option<Failure>,
    /// Start a new segment before the next batch.
    roll: bool,
    /// The committer is waiting for work: only then does an append pay for a wake-up (a
    /// futex syscall each, on every append, while the committer is busy anyway).
    idle: bool,
    /// The committer is gathering a batch (committer.rs, "group commit"): the append that
    /// brings `pending` to this many wakes it; 0 when it is not gathering.
    want: usize,
    /// Batches taken so far (by the committer thread or an assisting thread).
    taken: u64,
    /// [`Journal::set_nudge`].
    nudge: Option<Nudge>,
}

struct Shared {
    /// The journal's directory, resolved beneath the data directory once, at open: segments
    /// are made, opened, renamed and unlinked relative to it.
    dir: Dir,
    /// The segment appends go to now.
    active: AtomicU64,
    queue: Mutex<Queue>,
    wake: Condvar,
    durability: Durability,
    faults: Faults,
    stats: Stats,
    /// The writing end: one committer at a time (the thread, or a thread assisting it).
    /// Lock order: this, then `queue`.
    committer: Mutex<Committer>,
    /// Whether threads assist the committer ([`Journal::set_assisted`]).
    assisted: AtomicBool,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn committer(&self) -> MutexGuard<'_, Committer> {
        self.committer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// How long the committer thread leaves queued appends to the threads assisting it
/// ([`Journal::set_assisted`]) before it commits them itself: the fallback for a runtime whose
/// workers are never idle (busy serving other requests), so no append waits longer than this
/// for its write to start. Long beside a worker's turn (tens of microseconds), short beside an
/// fsync on most disks.
pub const ASSIST_GRACE: Duration = Duration::from_millis(5);

/// The journal: append from any thread; a committer thread writes and syncs.
pub struct Journal {
    shared: Arc<Shared>,
    committer: Option<JoinHandle<()>>,
    _lock: super::LockGuard,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.shared.dir.path())
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Open (or create) the journal in `dir`, replaying every segment. Returns the journal,
    /// the good frames in order, and what was found. `dir`'s parent is taken as it is; `dir`
    /// itself is made or opened beneath it without following a symlink ([`Owned`]).
    pub fn open(
        dir: &Path,
        durability: Durability,
        faults: Faults,
    ) -> Result<(Journal, Vec<Replayed>, ReplayReport), JournalError> {
        let opened = Owned::make(dir, &faults).map(|(_, made)| made);
        let dir = opened.map_err(|e| JournalError::Open {
            dir: dir.to_path_buf(),
            step: "creating it",
            source: Arc::new(e),
        })?;
        Self::open_in(dir, durability, faults)
    }

    /// [`Journal::open`] in a directory already opened beneath the data directory.
    pub fn open_in(
        dir: Dir,
        durability: Durability,
        faults: Faults,
    ) -> Result<(Journal, Vec<Replayed>, ReplayReport), JournalError> {
        let dir_path = dir.path().to_path_buf();
        let fail =
            |step: &'static str, e: Box<dyn std::error::Error + Send + Sync>| JournalError::Open {
                dir: dir_path.clone(),
                step,
                source: Arc::from(e),
            };
        super::perms::check_private_dir(dir.path()).map_err(|e| fail("permissions", e.into()))?;
        // One writer per journal, for its whole life: a second process would cut the first's
        // in-flight write as a "torn tail" and interleave frames.
        let lock_path = dir.path().join(LOCK_FILE);
        let lock_file = dir
            .open_lock_file(LOCK_FILE)
            .map_err(|e| fail("locking", e.into()))?;
        let lock =
            match super::lock::try_lock_file(lock_file, &lock_path, super::LockMode::Exclusive) {
                Ok(Some(g)) => g,
                Ok(None) => return Err(JournalError::InUse(dir.path().to_path_buf())),
                Err(e) => return Err(fail("locking", e.into())),
            };
        dir.sweep_temp_files(&faults)
            .map_err(|e| fail("sweeping temp files", e.into()))?;
        let mut numbers: Vec<u64> = dir
            .entries()
            .map_err(|e| fail("listing", e.into()))?
            .iter()
            .filter_map(|e| segment_number(&e.name))
            .collect();
        numbers.sort_unstable();
        let mut frames = Vec::new();
        let mut report = ReplayReport {
            segments: numbers.len(),
            ..ReplayReport::default()
        };
        let mut active = None;
        for (i, &n) in numbers.iter().enumerate() {
            let last = i + 1 == numbers.len();
            let bytes = dir
                .read_capped(&segment_name(n), u64::MAX)
                .map_err(|e| fail("reading a segment", e.into()))?
                .unwrap_or_default();
            let tail = scan(n, &bytes, &mut frames).map_err(|e| fail("replaying", e.into()))?;
            match tail {
                Tail::Clean(off) if last => active = Some((n, off)),
                Tail::Clean(_) => {}
                Tail::Torn(off) if last => {
                    // Zero what the torn write left (up to its last non-zero byte), durably,
                    // before appending over it.
                    let window =
                        &bytes[off as usize..(off as usize + TORN_WINDOW).min(bytes.len())];
                    let end =
                        off as usize + window.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
                    let f = open_segment(&dir, n).map_err(|e| fail("opening", e.into()))?;
                    f.write_all_at(&vec![0u8; end - off as usize], off)
                        .and_then(|()| f.sync_data())
                        .map_err(|e| fail("cutting a torn tail", e.into()))?;
                    tracing::warn!(segment = n, offset = off, "stream journal: cut a torn tail (a crash during a write; nothing acknowledged is lost)");
                    report.torn_tail = Some((n, off, (end as u64) - off));
                    active = Some((n, off));
                }
                Tail::Torn(off) | Tail::Corrupt(off) => {
                    let qdir = dir
                        .create_dirs(&["quarantine"], &faults)
                        .map_err(|e| fail("quarantine", e.into()))?;
                    let name = format!(
                        "{}.{}",
                        segment_name(n),
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs())
                    );
                    qdir.write_new(&name, &bytes)
                        .map_err(|e| fail("quarantining", e.into()))?;
                    let copy = qdir.path().join(name);
                    tracing::error!(segment = n, offset = off, copy = %copy.display(), "stream journal: a corrupt frame; the segment was copied to quarantine and its later frames are not replayed");
                    report.corrupt.push((n, off, copy));
                    if last {
                        // Appends go to a fresh segment; the damaged one is kept as it is.
                        active = None;
                    }
                }
            }
        }
        report.frames = frames.len();
        // No segment to append to yet: the first batch creates one (a daemon that never
        // streams never writes 16 MiB of zeros).
        let (segment, offset, file) = match active {
            Some((n, off)) => (
                n,
                off,
                Some(open_segment(&dir, n).map_err(|e| fail("opening", e.into()))?),
            ),
            None => (numbers.last().map_or(1, |n| n + 1), HEADER_BYTES, None),
        };
        let shared = Arc::new(Shared {
            dir,
            active: AtomicU64::new(segment),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            durability,
            faults,
            stats: Stats::default(),
            committer: Mutex::new(Committer {
                file,
                segment,
                offset,
                next: None,
                last_sync: Instant::now(),
                unsynced: false,
                last_batch: 0,
                reuse: committer::Reuse::default(),
            }),
            assisted: AtomicBool::new(false),
        });
        let committer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("holdfast-journal".into())
                .spawn(move || committer::run(shared))
                .map_err(|e| fail("starting the committer thread", e.into()))?
        };
        Ok((
            Journal {
                shared,
                committer: Some(committer),
                _lock: lock,
            },
            frames,
            report,
        ))
    }

    /// Every frame of the segments from `first` on, read while the journal runs (a run's
    /// records, for a subscriber asking for events memory no longer holds). A frame the
    /// committer is still writing ends a segment's frames (it is not durable, so nothing read
    /// here can need it); a segment released meanwhile is skipped.
    pub fn read_from(&self, first: u64) -> io::Result<Vec<Replayed>> {
        let mut numbers: Vec<u64> = self
            .shared
            .dir
            .entries()?
            .iter()
            .filter_map(|e| segment_number(&e.name))
            .filter(|&n| n >= first)
            .collect();
        numbers.sort_unstable();
        let mut frames = Vec::new();
        for n in numbers {
            let bytes = match self.shared.dir.read_capped(&segment_name(n), u64::MAX) {
                Ok(Some(b)) => b,
                Ok(None) => continue,
                Err(e) => return Err(io::Error::other(e)),
            };
            // A header that does not read (a segment being prepared) holds nothing yet.
            let _ = scan(n, &bytes, &mut frames);
        }
        Ok(frames)
    }

    /// Queue `payload`; the receiver answers once it is durable (per the durability policy).
    pub fn append(&self, payload: Vec<u8>) -> oneshot::Receiver<Result<Position, JournalError>> {
        let (tx, rx) = oneshot::channel();
        self.enqueue(payload, Ack::Channel(tx));
        rx
    }

    /// Queue `payload`; the promise is kept once it is durable (per the durability policy).
    pub fn append_promise(&self, payload: Vec<u8>) -> Arc<Promise> {
        let p = Promise::new();
        self.enqueue(payload, Ack::Promise(Arc::clone(&p)));
        p
    }

    fn enqueue(&self, payload: Vec<u8>, ack: Ack) {
        if payload.is_empty() || payload.len() > MAX_PAYLOAD {
            let _ = ack.send(Err(JournalError::TooLarge(payload.len())));
            return;
        }
        let mut q = self
            .shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(why) = &q.poisoned {
            let why = why.clone();
            drop(q);
            let _ = ack.send(Err(JournalError::Poisoned(why)));
            return;
        }
        if q.closing {
            drop(q);
            let _ = ack.send(Err(JournalError::Closed));
            return;
        }
        let nudge = match q.pending.is_empty() && self.shared.assisted.load(Ordering::Relaxed) {
            true => q.nudge.clone(),
            false => None,
        };
        q.pending.push(Pending { payload, ack });
        let idle = q.idle || (q.want > 0 && q.pending.len() == q.want);
        drop(q);
        if idle {
            self.shared.wake.notify_one();
        }
        if let Some(nudge) = nudge {
            nudge();
        }
    }

    /// Call `nudge` whenever an append makes the queue non-empty while threads assist (see
    /// [`Nudge`]); `None` stops it. A thread that commits what it queues itself (the lane, at
    /// the end of its turn) has its nudge ignore its own appends.
    pub fn set_nudge(&self, nudge: Option<Nudge>) {
        self.shared.queue().nudge = nudge;
    }

    /// Let threads that queue appends commit them themselves ([`Journal::assist`]), the
    /// committer thread taking over only what none took within [`ASSIST_GRACE`]. For a
    /// runtime whose workers call `assist` before they park (the daemon's): the appends a
    /// worker read are written, synced and answered by that worker once it has nothing else
    /// to do — one thread from request to answer, as a single-threaded server does, and one
    /// batch per turn with many clients (docs/design.md, "Group commit"). Only with
    /// [`Durability::Always`]; otherwise (timed syncs) the committer thread does everything.
    pub fn set_assisted(&self, on: bool) {
        let on = on && self.shared.durability == Durability::Always;
        self.shared.assisted.store(on, Ordering::SeqCst);
        // A committer thread waiting untimed for work looks again.
        self.shared.wake.notify_all();
    }

    /// Commit everything queued, on this thread, unless another thread is committing (then
    /// return at once: that one, or the committer thread, takes it). After each batch,
    /// `yield_to_others()` is asked whether another thread will commit the rest (a worker
    /// still busy, which assists in turn when it runs out of work): then this one returns.
    /// Appends' callbacks run here. Does nothing unless [`Journal::set_assisted`].
    pub fn assist(&self, yield_to_others: &dyn Fn() -> bool) {
        if self.shared.assisted.load(Ordering::Relaxed) {
            committer::assist(&self.shared, yield_to_others);
        }
    }

    /// Make the next append start a new segment, so that everything before it can be
    /// released as a whole (after a re-seal, the records under the old key).
    pub fn start_new_segment(&self) {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .roll = true;
    }

    /// Append and wait (blocking; not from an async task).
    pub fn append_wait(&self, payload: Vec<u8>) -> Result<Position, JournalError> {
        self.append(payload)
            .blocking_recv()
            .unwrap_or(Err(JournalError::Closed))
    }

    /// Delete every segment numbered below `segment` (no live record is in them any more).
    pub fn release_before(&self, segment: u64) -> io::Result<usize> {
        let segment = segment.min(self.active_segment());
        let mut removed = 0;
        for e in self.shared.dir.entries()? {
            if let Some(n) = segment_number(&e.name) {
                if n < segment {
                    self.shared.faults.check(Op::Unlink)?;
                    self.shared.dir.unlink(&e.name)?;
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            self.shared
                .dir
                .fsync(&self.shared.faults)
                .map_err(|e| e.source)?;
        }
        Ok(removed)
    }

    /// The segment appends go to now (never released).
    pub fn active_segment(&self) -> u64 {
        self.shared.active.load(Ordering::SeqCst)
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Why the journal refuses appends, if it does.
    pub fn poisoned(&self) -> Option<Failure> {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .poisoned
            .clone()
    }
}

impl Drop for Journal {
    /// Appends already queued are written (and synced) before the committer stops.
    fn drop(&mut self) {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closing = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.committer.take() {
            // Dropped from an acknowledgement's callback (on the committer thread, or on a
            // thread assisting it, which holds the committer lock the thread needs to stop):
            // it stops on its own.
            if !committer::COMMITTING.with(std::cell::Cell::get) {
                let _ = t.join();
            }
        }
    }
}

/// How a scanned segment's written part ends ([`scan_segment`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScannedTail {
    /// Zero fill (or the end of the bytes) at this offset.
    Clean(u64),
    /// A torn write at this offset: only zeros past the reach of one write.
    Torn(u64),
    /// A bad frame at this offset with data past that reach.
    Corrupt(u64),
}

/// The segment reader replay uses, on bytes in memory (the fuzz targets,
/// `fuzz::journal_segment`): the good frames of segment `n` in order, and how its
/// written part ends; `None` for a header that is not segment `n`'s.
#[doc(hidden)]
pub fn scan_segment(n: u64, bytes: &[u8]) -> Option<(Vec<Replayed>, ScannedTail)> {
    let mut frames = Vec::new();
    let tail = scan(n, bytes, &mut frames).ok()?;
    Some((
        frames,
        match tail {
            Tail::Clean(o) => ScannedTail::Clean(o),
            Tail::Torn(o) => ScannedTail::Torn(o),
            Tail::Corrupt(o) => ScannedTail::Corrupt(o),
        },
    ))
}

/// The on-disk pieces a reference model needs: segment `n`'s header, a frame's CRC, the
/// header and frame-header sizes, and how far one torn write can reach.
#[doc(hidden)]
pub mod format {
    pub use super::segment::{frame_crc, header};
    pub use super::{FRAME_HEADER, HEADER_BYTES, TORN_WINDOW};
}

#[cfg(test)]
mod tests;
