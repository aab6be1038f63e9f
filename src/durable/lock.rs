//! File locks that serialize threads and processes the same way.
//!
//! Across processes: `flock` through fs4 on a lock file (hive's patched writers take the same
//! `flock` on `metadata/index.lock`). Within a process: a reader/writer gate keyed by the lock
//! file's path, taken first, so threads queue on a condition variable instead of all polling
//! `flock`, and so a thread never relies on the per-open-file-description subtleties of `flock`.
//! `flock` itself has no timed wait, so a timed acquisition blocks in `flock` on a helper thread
//! and gives up at the deadline (see `poll_flock` for why not a `try_lock` poll).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use fs4::FileExt;

/// Shared (readers) or exclusive (one writer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// Many holders at once; excludes exclusive holders.
    Shared,
    /// One holder; excludes everyone else.
    Exclusive,
}

/// Why a lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Someone else held it for the whole timeout.
    #[error("{} is held by another writer (waited {:.1} s); is another holdfast or hive process stuck?", path.display(), waited.as_secs_f64())]
    Timeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot lock {}: {source}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

#[derive(Default)]
struct GateState {
    readers: usize,
    writer: bool,
}

#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
    /// A helper thread is blocked in `flock` for this path. At most one exists per path: if a
    /// holder in another process hangs, waiters that time out must not each leave a thread
    /// (and a file descriptor) behind. The helper keeps the gate alive until it returns, so a
    /// later waiter finds this flag set even if every other user of the gate is gone.
    helper_in_flight: AtomicBool,
}

impl Gate {
    fn acquire(&self, mode: LockMode, deadline: Option<Instant>) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let free = match mode {
                LockMode::Shared => !s.writer,
                LockMode::Exclusive => !s.writer && s.readers == 0,
            };
            if free {
                match mode {
                    LockMode::Shared => s.readers += 1,
                    LockMode::Exclusive => s.writer = true,
                }
                return true;
            }
            match deadline {
                None => return false,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    s = self
                        .cv
                        .wait_timeout(s, d - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }

    fn release(&self, mode: LockMode) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match mode {
            LockMode::Shared => s.readers = s.readers.saturating_sub(1),
            LockMode::Exclusive => s.writer = false,
        }
        self.cv.notify_all();
    }
}

/// The in-process gates: one per lock file while anyone holds or waits for it.
#[derive(Default)]
struct Gates {
    /// Canonical directory joined with the file name → that lock file's gate. Weak: a gate
    /// lives as long as a holder, a waiter or a blocked `flock` helper keeps it, and entries
    /// nobody uses are pruned as the map grows (a run's log has its own lock file, so a gate
    /// per run ever logged would otherwise stay for the daemon's life).
    canonical: HashMap<PathBuf, Weak<Gate>>,
    /// `canonical`'s size after its last pruning; it is pruned again when it has doubled.
    pruned_at: usize,
    /// The paths callers pass (a store passes the same one every time), resolved once, so that
    /// a lock taken per write does not resolve every component of its directory again (a
    /// `readlink` each). Cleared when full: only a cache.
    resolved: HashMap<PathBuf, PathBuf>,
}

impl Gates {
    fn get() -> std::sync::MutexGuard<'static, Gates> {
        static GATES: OnceLock<Mutex<Gates>> = OnceLock::new();
        GATES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The gate of the lock file at canonical path `key`, made if nobody uses one.
    fn gate(
        canonical: &mut HashMap<PathBuf, Weak<Gate>>,
        pruned_at: &mut usize,
        key: &Path,
    ) -> Arc<Gate> {
        let slot = match canonical.get_mut(key) {
            Some(weak) => match weak.upgrade() {
                Some(gate) => return gate,
                // A lock file used before and let go since (a store's, between writes): its
                // entry takes the new gate, with no key made again.
                None => weak,
            },
            None => {
                if canonical.len() >= (2 * *pruned_at).max(MIN_GATES_BEFORE_PRUNING) {
                    canonical.retain(|_, g| g.strong_count() > 0);
                    *pruned_at = canonical.len();
                }
                canonical.entry(key.to_path_buf()).or_default()
            }
        };
        let gate = Arc::new(Gate::default());
        *slot = Arc::downgrade(&gate);
        gate
    }

    /// The gate of the lock file the caller calls `path`, if that path was resolved before.
    fn known(&mut self, path: &Path) -> Option<Arc<Gate>> {
        let Gates {
            canonical,
            pruned_at,
            resolved,
        } = self;
        let key = resolved.get(path)?;
        Some(Self::gate(canonical, pruned_at, key))
    }
}

fn gate_for(path: &Path) -> Arc<Gate> {
    if let Some(gate) = Gates::get().known(path) {
        return gate;
    }
    // Key by the canonical directory so `a/../b/x.lock` and `b/x.lock` share a gate. Resolved
    // outside the map's lock: it is file-system work. A directory that moves afterwards keeps
    // the key it had; the `flock` still excludes across file descriptions, so two gates for
    // one file would only queue less fairly, never let two writers in.
    let key = match (path.parent().map(Path::canonicalize), path.file_name()) {
        (Some(Ok(dir)), Some(name)) => dir.join(name),
        _ => path.to_path_buf(),
    };
    let mut gates = Gates::get();
    if gates.resolved.len() >= MAX_REMEMBERED_LOCK_PATHS {
        gates.resolved.clear();
    }
    let Gates {
        canonical,
        pruned_at,
        resolved,
    } = &mut *gates;
    let gate = Gates::gate(canonical, pruned_at, &key);
    resolved.insert(path.to_path_buf(), key);
    gate
}

/// How many lock paths `gate_for` remembers resolved before it starts over.
const MAX_REMEMBERED_LOCK_PATHS: usize = 4096;

/// Gates nobody uses are pruned once there are at least this many (and then each time their
/// number has doubled since the last pruning).
const MIN_GATES_BEFORE_PRUNING: usize = 256;

#[cfg(test)]
fn gates_known() -> usize {
    Gates::get().canonical.len()
}

/// A held lock; released on drop (the in-process gate and the `flock`).
pub struct LockGuard {
    file: File,
    gate: Arc<Gate>,
    mode: LockMode,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("mode", &self.mode)
            .finish()
    }
}

impl LockGuard {
    /// Replace the lock file's contents with `text` (e.g. the holder's pid, for the "already
    /// running (pid N)" message). Informational only: the lock is the flock, not the content.
    pub fn record(&self, text: &str) -> io::Result<()> {
        use std::os::unix::fs::FileExt as _;
        self.file.set_len(0)?;
        self.file.write_all_at(text.as_bytes(), 0)
    }
}

/// What the holder of a lock file recorded in it (see [`LockGuard::record`]).
pub fn recorded(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let t = text.trim();
    (!t.is_empty() && t.len() < crate::limits::MAX_LOCK_HOLDER_BYTES).then(|| t.to_owned())
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Closing the file releases the flock too; unlock first so the gate never opens while
        // the flock is still held.
        let _ = FileExt::unlock(&self.file);
        self.gate.release(self.mode);
    }
}

fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
}

fn try_flock(file: &File, mode: LockMode) -> io::Result<bool> {
    let r = match mode {
        LockMode::Shared => FileExt::try_lock_shared(file),
        LockMode::Exclusive => FileExt::try_lock(file),
    };
    match r {
        Ok(()) => Ok(true),
        Err(fs4::TryLockError::WouldBlock) => Ok(false),
        Err(fs4::TryLockError::Error(e)) => Err(e),
    }
}

/// Take the lock at `path` (created 0600 if missing), waiting at most `timeout`.
pub fn lock(path: &Path, mode: LockMode, timeout: Duration) -> Result<LockGuard, LockError> {
    acquire(path, mode, Some(timeout))?.ok_or_else(|| LockError::Timeout {
        path: path.to_path_buf(),
        waited: timeout,
    })
}

/// Take the lock at `path` if nobody holds it in a conflicting mode; `Ok(None)` otherwise.
pub fn try_lock(path: &Path, mode: LockMode) -> Result<Option<LockGuard>, LockError> {
    acquire(path, mode, None)
}

/// [`lock`] on a lock file already open (one a [`super::Dir`] opened beneath the data
/// directory); `path` names it and keys its in-process gate.
pub fn lock_file(
    file: File,
    path: &Path,
    mode: LockMode,
    timeout: Duration,
) -> Result<LockGuard, LockError> {
    acquire_open(file, path, mode, Some(timeout))?.ok_or_else(|| LockError::Timeout {
        path: path.to_path_buf(),
        waited: timeout,
    })
}

/// [`try_lock`] on a lock file already open (see [`lock_file`]).
pub fn try_lock_file(
    file: File,
    path: &Path,
    mode: LockMode,
) -> Result<Option<LockGuard>, LockError> {
    acquire_open(file, path, mode, None)
}

fn acquire(
    path: &Path,
    mode: LockMode,
    timeout: Option<Duration>,
) -> Result<Option<LockGuard>, LockError> {
    let file = open_lock_file(path).map_err(|source| LockError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    acquire_open(file, path, mode, timeout)
}

fn acquire_open(
    file: File,
    path: &Path,
    mode: LockMode,
    timeout: Option<Duration>,
) -> Result<Option<LockGuard>, LockError> {
    let io_err = |source| LockError::Io {
        path: path.to_path_buf(),
        source,
    };
    let start = Instant::now();
    let deadline = timeout.map(|t| start + t);
    let gate = gate_for(path);
    if !gate.acquire(mode, deadline) {
        return Ok(None);
    }
    let taken = wait_flock(&file, mode, deadline, &gate);
    match taken {
        Ok(true) => Ok(Some(LockGuard { file, gate, mode })),
        Ok(false) => {
            gate.release(mode);
            Ok(None)
        }
        Err(e) => {
            gate.release(mode);
            Err(io_err(e))
        }
    }
}

/// Take `flock` before `deadline` passes (`None`: one try).
///
/// Waiting is a *blocking* `flock` in a helper thread, not a `try_lock` poll: a poller only
/// gets in if one of its polls lands in the microseconds between a busy writer's release and
/// its next acquisition, so with a few writers in other processes looping on the lock it could
/// starve for the whole timeout (seen with 4 processes writing one store). A blocked `flock`
/// is woken by the kernel at the release. The helper locks through a duplicate of `file` (same
/// open file description, so the same lock); if the caller gave up meanwhile it unlocks again.
/// A holder that never releases leaves the helper blocked (one thread and one descriptor per
/// timed-out wait) until it does or the process exits.
fn wait_flock(
    file: &File,
    mode: LockMode,
    deadline: Option<Instant>,
    gate: &Arc<Gate>,
) -> io::Result<bool> {
    if try_flock(file, mode)? {
        return Ok(true);
    }
    let Some(deadline) = deadline else {
        return Ok(false);
    };
    if Instant::now() >= deadline {
        return Ok(false);
    }
    let waiter = file.try_clone()?;
    if gate.helper_in_flight.swap(true, Ordering::SeqCst) {
        // An earlier waiter's helper is still blocked: the holder has not released for a whole
        // timeout. Poll rather than add another blocked thread.
        return poll_flock(file, mode, deadline);
    }
    let helper_gate = Arc::clone(gate);
    enum Wait {
        Waiting,
        GaveUp,
        Done(io::Result<()>),
    }
    let state = Arc::new((Mutex::new(Wait::Waiting), Condvar::new()));
    let helper_state = Arc::clone(&state);
    let spawned = std::thread::Builder::new()
        .name("holdfast-flock".into())
        .spawn(move || {
            let taken = loop {
                let r = match mode {
                    LockMode::Shared => FileExt::lock_shared(&waiter),
                    LockMode::Exclusive => FileExt::lock(&waiter),
                };
                match r {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    other => break other,
                }
            };
            let (m, cv) = &*helper_state;
            let mut s = m.lock().unwrap_or_else(PoisonError::into_inner);
            helper_gate.helper_in_flight.store(false, Ordering::SeqCst);
            if matches!(*s, Wait::GaveUp) {
                if taken.is_ok() {
                    let _ = FileExt::unlock(&waiter);
                }
                return;
            }
            *s = Wait::Done(taken);
            cv.notify_all();
        });
    if let Err(e) = spawned {
        gate.helper_in_flight.store(false, Ordering::SeqCst);
        return Err(e);
    }
    let (m, cv) = &*state;
    let mut s = m.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        match std::mem::replace(&mut *s, Wait::Waiting) {
            Wait::Done(r) => return r.map(|()| true),
            Wait::Waiting | Wait::GaveUp => {}
        }
        let now = Instant::now();
        if now >= deadline {
            *s = Wait::GaveUp;
            return Ok(false);
        }
        s = cv
            .wait_timeout(s, deadline - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Poll `try_lock` until `deadline` (the fallback while a helper is already blocked).
fn poll_flock(file: &File, mode: LockMode, deadline: Instant) -> io::Result<bool> {
    loop {
        if try_flock(file, mode)? {
            return Ok(true);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        std::thread::sleep(POLL_FALLBACK.min(deadline - now));
    }
}

use crate::limits::POLL_FALLBACK;

/// A lock file kept open, for a caller that takes it exclusively on every append and keeps its
/// own threads in line (the audit log's writer, under its mutex): one `flock` to take, one to
/// release — no `open`/`close` and no in-process gate (whose release wakes a condition variable,
/// a `futex` call each time). Every other holder of the same file — [`lock`], [`try_lock`], or
/// another `LockFile`, in this process or another — is excluded by the `flock` itself, which
/// holds between open file descriptions. The file is opened again after [`LockFile::REOPEN`]:
/// a lock file deleted while held open would exclude nobody who opens the new one.
#[derive(Debug)]
pub struct LockFile {
    file: File,
    path: PathBuf,
    opened: Instant,
    /// Only its `helper_in_flight` is used: one blocked helper at a time (see `wait_flock`).
    helper: Arc<Gate>,
}

/// An exclusive hold on a [`LockFile`]; released on drop.
#[derive(Debug)]
pub struct FileLockGuard<'a> {
    file: &'a File,
}

impl Drop for FileLockGuard<'_> {
    fn drop(&mut self) {
        let _ = FileExt::unlock(self.file);
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gate")
    }
}

impl LockFile {
    /// How long one open file description is used before the path is opened again.
    pub const REOPEN: Duration = Duration::from_secs(1);

    /// Open (creating it 0600 if missing) the lock file at `path`.
    pub fn open(path: &Path) -> Result<LockFile, LockError> {
        let file = open_lock_file(path).map_err(|source| LockError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(LockFile {
            file,
            path: path.to_path_buf(),
            opened: Instant::now(),
            helper: Arc::new(Gate::default()),
        })
    }

    /// Whether it was opened longer ago than [`LockFile::REOPEN`] (the caller opens it again).
    pub fn stale(&self) -> bool {
        self.opened.elapsed() >= Self::REOPEN
    }

    /// Take it exclusively if nobody holds it; `Ok(None)` otherwise.
    pub fn try_exclusive(&self) -> Result<Option<FileLockGuard<'_>>, LockError> {
        match try_flock(&self.file, LockMode::Exclusive) {
            Ok(true) => Ok(Some(FileLockGuard { file: &self.file })),
            Ok(false) => Ok(None),
            Err(source) => Err(LockError::Io {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// Take it exclusively, waiting at most `timeout`.
    pub fn exclusive(&self, timeout: Duration) -> Result<FileLockGuard<'_>, LockError> {
        let deadline = Instant::now() + timeout;
        match wait_flock(
            &self.file,
            LockMode::Exclusive,
            Some(deadline),
            &self.helper,
        ) {
            Ok(true) => Ok(FileLockGuard { file: &self.file }),
            Ok(false) => Err(LockError::Timeout {
                path: self.path.clone(),
                waited: timeout,
            }),
            Err(source) => Err(LockError::Io {
                path: self.path.clone(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn one_gate_per_lock_file_however_its_path_is_spelled() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        std::fs::create_dir(d.path().join("b")).unwrap();
        let direct = d.path().join("b/x.lock");
        let aliased = d.path().join("a/../b/x.lock");
        let first = gate_for(&direct);
        // Remembered: the same gate again, and the alias resolves to it.
        assert!(Arc::ptr_eq(&first, &gate_for(&direct)));
        assert!(Arc::ptr_eq(&first, &gate_for(&aliased)));
        assert!(Arc::ptr_eq(&first, &gate_for(&aliased)));
        assert!(!Arc::ptr_eq(&first, &gate_for(&d.path().join("b/y.lock"))));
        // Held through one spelling, the lock excludes the other within the process.
        let held = try_lock(&aliased, LockMode::Exclusive).unwrap();
        excludes_until_dropped(held.expect("free"), &direct);
    }

    /// `held` keeps a reader out of `path` (the same lock file) until it is dropped.
    fn excludes_until_dropped(held: LockGuard, path: &Path) {
        assert!(try_lock(path, LockMode::Shared).unwrap().is_none());
        drop(held);
        assert!(try_lock(path, LockMode::Shared).unwrap().is_some());
    }

    #[test]
    fn gates_nobody_uses_are_pruned_and_a_held_one_is_kept() {
        let d = tempfile::tempdir().unwrap();
        let held_path = d.path().join("held.lock");
        let held = lock(&held_path, LockMode::Exclusive, Duration::from_secs(5)).unwrap();
        let gate = gate_for(&held_path);
        // A lock file per run directory, each taken and released once (as run logs are).
        let runs = 2000;
        for i in 0..runs {
            let dir = d.path().join(format!("run-{i}"));
            std::fs::create_dir(&dir).unwrap();
            drop(
                lock(
                    &dir.join("log.lock"),
                    LockMode::Exclusive,
                    Duration::from_secs(5),
                )
                .unwrap(),
            );
        }
        let known = gates_known();
        println!("{runs} lock files taken and released: {known} gates known");
        // Other tests of this process may hold a few gates of their own meanwhile.
        assert!(
            known < 2 * MIN_GATES_BEFORE_PRUNING + 64,
            "{known} gates kept"
        );
        // The held gate survived every pruning: a waiter still queues on the same one.
        assert!(Arc::ptr_eq(&gate, &gate_for(&held_path)));
        excludes_until_dropped(held, &held_path);
    }

    #[test]
    fn exclusive_excludes_threads() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("x.lock");
        let inside = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (path, inside, max) = (path.clone(), inside.clone(), max.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let _g = lock(&path, LockMode::Exclusive, Duration::from_secs(30)).unwrap();
                        let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        max.fetch_max(n, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(max.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn shared_allows_readers_and_blocks_writer() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("x.lock");
        let r1 = try_lock(&path, LockMode::Shared).unwrap();
        let r2 = try_lock(&path, LockMode::Shared).unwrap();
        assert!(r1.is_some() && r2.is_some());
        assert!(try_lock(&path, LockMode::Exclusive).unwrap().is_none());
        let err = lock(&path, LockMode::Exclusive, Duration::from_millis(50)).unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err}");
        drop((r1, r2));
        assert!(try_lock(&path, LockMode::Exclusive).unwrap().is_some());
    }

    #[test]
    fn flock_held_by_another_open_file_is_respected() {
        // Simulates another process: a raw flock not known to the in-process gate.
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("x.lock");
        let other = open_lock_file(&path).unwrap();
        FileExt::try_lock(&other).unwrap();
        let err = lock(&path, LockMode::Exclusive, Duration::from_millis(40)).unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }));
        // The gate was released despite the timeout: after the other side lets go we get it.
        FileExt::unlock(&other).unwrap();
        assert!(lock(&path, LockMode::Exclusive, Duration::from_secs(1)).is_ok());
    }
}

#[cfg(test)]
mod lock_file_tests {
    use super::*;

    /// A kept-open lock file and the gated locks exclude each other, within a process too.
    #[test]
    fn a_kept_open_lock_file_excludes_every_other_holder() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("x.lock");
        let a = LockFile::open(&path).unwrap();
        let b = LockFile::open(&path).unwrap();
        let held = a.try_exclusive().unwrap().expect("free");
        assert!(b.try_exclusive().unwrap().is_none());
        assert!(try_lock(&path, LockMode::Shared).unwrap().is_none());
        let e = b.exclusive(Duration::from_millis(50)).unwrap_err();
        assert!(matches!(e, LockError::Timeout { .. }), "{e}");
        let waiter =
            std::thread::spawn(move || b.exclusive(Duration::from_secs(5)).map(|_| ()).is_ok());
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert!(waiter.join().unwrap(), "taken once released");
        let gated = lock(&path, LockMode::Exclusive, Duration::from_secs(1)).unwrap();
        assert!(a.try_exclusive().unwrap().is_none());
        drop(gated);
        assert!(a.try_exclusive().unwrap().is_some());
        assert!(!a.stale());
    }
}
