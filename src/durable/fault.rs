//! The fault-injection seam.
//!
//! Every file-system step that changes a store (create a temp file, write it, fsync it, rename
//! it, fsync the directory, unlink, remove a temp file) asks a [`Faults`] handle first. In
//! production the handle is disarmed and the check is one `Option` test. Tests arm it to make
//! the k-th step fail (once or from then on, with a chosen errno) or to "crash" there: a crash
//! refuses that step and every later one, including the cleanup a live process would do, so the
//! directory is left exactly as a process killed at that instant would leave it. Reopening the
//! store with a fresh handle then plays the part of the restart.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// One step of a durable write that the seam can fail or crash at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `open(O_CREAT|O_EXCL|O_NOFOLLOW)` of a temp file.
    CreateTemp,
    /// Writing the bytes of a temp file.
    WriteTemp,
    /// `fsync` of a file.
    FsyncFile,
    /// `rename` of a temp file over its target, or of a file into quarantine.
    Rename,
    /// `fsync` of a directory, making a rename or unlink durable.
    FsyncDir,
    /// `unlink` of a file (delete, key retirement).
    Unlink,
    /// Removing a leftover or failed temp file.
    RemoveTemp,
    /// Creating a directory.
    CreateDir,
    /// `link` of a file about to be replaced to a spare name (recycling, see `Spares`).
    LinkSpare,
    /// Writing a line at the end of a line log.
    Append,
    /// Cutting a file back (a torn last line).
    Truncate,
    /// Removing a directory and everything in it (pruning a run).
    RemoveTree,
    /// Opening a file (not a fault-seam step).
    Open,
    /// Reading a file (not a fault-seam step).
    Read,
    /// A write refused because the store is poisoned (not a fault-seam step).
    Refused,
    /// Changing a file's mode (not a fault-seam step).
    Chmod,
    /// A path under the data directory refused because a symlink, or something that is not
    /// a directory, is where holdfast keeps a directory or a file (`beneath.rs`; not a
    /// fault-seam step, and never an fsync failure).
    UnsafePath,
    /// Renaming (or creating) an empty marker file whose name records a fact (`markers.rs`).
    Marker,
    /// `open(O_CREAT|O_EXCL|O_NOFOLLOW)` of a file appended to in place (an audit segment).
    Create,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::CreateTemp => "create temp file",
            Op::WriteTemp => "write temp file",
            Op::FsyncFile => "fsync file",
            Op::Rename => "rename",
            Op::FsyncDir => "fsync directory",
            Op::Unlink => "unlink",
            Op::RemoveTemp => "remove temp file",
            Op::CreateDir => "create directory",
            Op::LinkSpare => "keep replaced file as a spare",
            Op::Append => "append to",
            Op::Truncate => "cut",
            Op::RemoveTree => "remove directory",
            Op::Open => "open",
            Op::Read => "read",
            Op::Refused => "write refused",
            Op::Chmod => "chmod",
            Op::UnsafePath => "refused path",
            Op::Marker => "rename marker",
            Op::Create => "create",
        })
    }
}

/// What an armed seam does when its trigger is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultMode {
    /// The triggering step fails with this errno; later steps succeed.
    FailOnce(i32),
    /// The triggering step and every later one fail with this errno.
    FailAlways(i32),
    /// The process "dies" before the triggering step: it and every later step are refused
    /// without touching the file system, cleanup included.
    Crash,
}

#[derive(Debug, Default)]
struct State {
    seen: u64,
    trigger_at: Option<u64>,
    only: Option<Op>,
    mode: Option<FaultMode>,
    failing: Option<i32>,
    crashed: bool,
    injected: u64,
    log: Vec<Op>,
    /// What a power loss would keep, when recorded ([`Faults::record_power`]).
    power: Option<Power>,
}

/// What is on stable storage: each directory's entries as of its last fsync, each file's
/// bytes (by inode) as of its last fsync. Everything else a power loss may take.
#[derive(Debug, Default)]
struct Power {
    /// Directory → name → inode (`None`: a subdirectory, kept by name).
    dirs: std::collections::BTreeMap<PathBuf, std::collections::BTreeMap<String, Option<u64>>>,
    /// Inode → contents.
    files: std::collections::HashMap<u64, Vec<u8>>,
}

impl Power {
    /// Record `dir`'s entries (and, with `files`, every regular file's bytes) as durable.
    fn take_dir(&mut self, dir: &Path, files: bool) {
        use std::os::unix::fs::MetadataExt;
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries = std::collections::BTreeMap::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if meta.is_dir() {
                entries.insert(name, None);
                if files {
                    self.take_dir(&e.path(), true);
                }
            } else {
                entries.insert(name, Some(meta.ino()));
                if files {
                    if let Ok(bytes) = std::fs::read(e.path()) {
                        self.files.insert(meta.ino(), bytes);
                    }
                }
            }
        }
        self.dirs.insert(dir.to_path_buf(), entries);
    }

    /// Make the tree under `dir` what stable storage holds.
    fn restore(&self, dir: &Path) -> io::Result<()> {
        let Some(durable) = self.dirs.get(dir) else {
            // Never durable: its entry in the parent was not either, so it is gone already.
            return Ok(());
        };
        for e in std::fs::read_dir(dir)?.flatten() {
            let meta = std::fs::symlink_metadata(e.path())?;
            if meta.is_dir() {
                if !durable.contains_key(&e.file_name().to_string_lossy().into_owned()) {
                    std::fs::remove_dir_all(e.path())?;
                }
            } else {
                std::fs::remove_file(e.path())?;
            }
        }
        for (name, ino) in durable {
            let path = dir.join(name);
            match ino {
                None => {
                    std::fs::create_dir_all(&path)?;
                    self.restore(&path)?;
                }
                Some(ino) => {
                    // Bytes never fsynced are lost: the file is there, empty.
                    let bytes = self.files.get(ino).map(Vec::as_slice).unwrap_or(&[]);
                    std::fs::write(&path, bytes)?;
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
                }
            }
        }
        Ok(())
    }
}

/// A handle on the fault-injection seam. Cloning shares the same state.
#[derive(Clone, Debug, Default)]
pub struct Faults(Option<Arc<Mutex<State>>>);

/// Marker text of the error returned for a step refused after an injected crash.
pub const CRASH_MARKER: &str = "injected crash";

impl Faults {
    /// The production handle: never fails anything.
    pub fn none() -> Self {
        Faults(None)
    }

    /// A handle that fails nothing but counts and records every step (to learn how many steps
    /// an operation takes before looping over them).
    pub fn recorder() -> Self {
        Faults(Some(Arc::new(Mutex::new(State::default()))))
    }

    /// Trigger `mode` at the `k`-th step (1-based) of any kind.
    pub fn at_step(k: u64, mode: FaultMode) -> Self {
        let state = State {
            trigger_at: Some(k),
            mode: Some(mode),
            ..State::default()
        };
        Faults(Some(Arc::new(Mutex::new(state))))
    }

    /// Trigger `mode` at the `nth` (1-based) occurrence of step `op`.
    pub fn at_op(op: Op, nth: u64, mode: FaultMode) -> Self {
        let state = State {
            trigger_at: Some(nth),
            only: Some(op),
            mode: Some(mode),
            ..State::default()
        };
        Faults(Some(Arc::new(Mutex::new(state))))
    }

    /// Re-arm a handle (made by [`Faults::recorder`]) so that `mode` triggers at the `k`-th
    /// step from now (1-based), of kind `op` if given. Lets a test set a store up with the seam
    /// passive, then fault only the operation under test. No effect on a disarmed handle.
    pub fn arm(&self, op: Option<Op>, k: u64, mode: FaultMode) {
        self.with(|s| {
            s.seen = 0;
            s.trigger_at = Some(k);
            s.only = op;
            s.mode = Some(mode);
            s.failing = None;
        });
    }

    /// Stop injecting (a crash already injected stays: the "process" is dead).
    pub fn disarm(&self) {
        self.with(|s| {
            s.trigger_at = None;
            s.mode = None;
            s.failing = None;
        });
    }

    /// Steps seen so far (of the kind the trigger counts, or all kinds).
    pub fn steps_seen(&self) -> u64 {
        self.with(|s| s.seen).unwrap_or(0)
    }

    /// Every step asked about, in order (recorders and armed handles).
    pub fn log(&self) -> Vec<Op> {
        self.with(|s| s.log.clone()).unwrap_or_default()
    }

    /// Whether an injected crash has happened.
    pub fn crashed(&self) -> bool {
        self.with(|s| s.crashed).unwrap_or(false)
    }

    /// How many steps were failed or refused by injection.
    pub fn injected(&self) -> u64 {
        self.with(|s| s.injected).unwrap_or(0)
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> Option<T> {
        self.0
            .as_ref()
            .map(|m| f(&mut m.lock().unwrap_or_else(PoisonError::into_inner)))
    }

    /// Record, from now on, what a power loss would keep of the tree under `root`: all of it
    /// as it is now (set up and synced), then each file's bytes at its fsync and each
    /// directory's entries at its fsync ([`Faults::synced_file`], [`Faults::synced_dir`]).
    /// [`Faults::lose_power`] then leaves only that (tests of checklist row 18).
    pub fn record_power(&self, root: &Path) {
        self.with(|s| {
            let mut p = Power::default();
            p.take_dir(root, true);
            s.power = Some(p);
        });
    }

    /// A file's bytes are durable now (its fsync succeeded).
    pub(crate) fn synced_file(&self, path: &Path) {
        use std::os::unix::fs::MetadataExt;
        self.with(|s| {
            if let Some(p) = &mut s.power {
                if let (Ok(meta), Ok(bytes)) = (std::fs::metadata(path), std::fs::read(path)) {
                    p.files.insert(meta.ino(), bytes);
                }
            }
        });
    }

    /// A directory's entries are durable now (its fsync succeeded).
    pub(crate) fn synced_dir(&self, dir: &Path) {
        self.with(|s| {
            if let Some(p) = &mut s.power {
                p.take_dir(dir, false);
            }
        });
    }

    /// The power went out: make the tree under `root` what stable storage held — every
    /// directory's entries as of its last fsync (a create, rename or unlink since is undone),
    /// every file's bytes as of its last fsync (bytes written since are lost; a file never
    /// synced is empty). The harshest a crash-consistent file system may leave; a process
    /// crash (the seam's `Crash`) leaves the other extreme, everything written.
    pub fn lose_power(&self, root: &Path) -> io::Result<()> {
        self.with(|s| match &s.power {
            Some(p) => p.restore(root),
            None => Ok(()),
        })
        .unwrap_or(Ok(()))
    }

    /// Ask permission for one step. `Err` means the caller must not perform it.
    pub(crate) fn check(&self, op: Op) -> io::Result<()> {
        let Some(m) = &self.0 else { return Ok(()) };
        let mut s = m.lock().unwrap_or_else(PoisonError::into_inner);
        s.log.push(op);
        if s.crashed {
            s.injected += 1;
            return Err(io::Error::other(CRASH_MARKER));
        }
        if let Some(errno) = s.failing {
            s.injected += 1;
            return Err(io::Error::from_raw_os_error(errno));
        }
        if s.only.is_none_or(|o| o == op) {
            s.seen += 1;
            if s.trigger_at == Some(s.seen) {
                s.injected += 1;
                match s.mode {
                    Some(FaultMode::FailOnce(errno)) => {
                        return Err(io::Error::from_raw_os_error(errno))
                    }
                    Some(FaultMode::FailAlways(errno)) => {
                        s.failing = Some(errno);
                        return Err(io::Error::from_raw_os_error(errno));
                    }
                    Some(FaultMode::Crash) => {
                        s.crashed = true;
                        return Err(io::Error::other(CRASH_MARKER));
                    }
                    None => {}
                }
            }
        }
        Ok(())
    }
}

/// Whether an I/O error is the seam's simulated crash (callers skip cleanup: a dead process
/// cleans nothing up).
pub fn is_crash(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::Other && err.to_string() == CRASH_MARKER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disarmed_never_fails() {
        let f = Faults::none();
        for _ in 0..100 {
            assert!(f.check(Op::FsyncFile).is_ok());
        }
        assert_eq!(f.steps_seen(), 0);
    }

    #[test]
    fn fail_once_fails_only_the_kth_step() {
        let f = Faults::at_step(3, FaultMode::FailOnce(libc_eio()));
        assert!(f.check(Op::CreateTemp).is_ok());
        assert!(f.check(Op::WriteTemp).is_ok());
        let err = f.check(Op::FsyncFile).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc_eio()));
        assert!(f.check(Op::Rename).is_ok());
        assert_eq!(f.injected(), 1);
    }

    #[test]
    fn crash_refuses_everything_after() {
        let f = Faults::at_op(Op::Rename, 1, FaultMode::Crash);
        assert!(f.check(Op::CreateTemp).is_ok());
        assert!(is_crash(&f.check(Op::Rename).unwrap_err()));
        assert!(is_crash(&f.check(Op::RemoveTemp).unwrap_err()));
        assert!(f.crashed());
        assert_eq!(f.log(), vec![Op::CreateTemp, Op::Rename, Op::RemoveTemp]);
    }

    #[test]
    fn arm_counts_from_now() {
        let f = Faults::recorder();
        for _ in 0..10 {
            f.check(Op::WriteTemp).unwrap();
        }
        f.arm(Some(Op::Rename), 2, FaultMode::FailOnce(5));
        f.check(Op::Rename).unwrap();
        f.check(Op::WriteTemp).unwrap();
        assert!(f.check(Op::Rename).is_err());
        f.check(Op::Rename).unwrap();
        f.arm(None, 1, FaultMode::FailAlways(28));
        f.disarm();
        f.check(Op::Rename).unwrap();
    }

    #[test]
    fn fail_always_sticks() {
        let f = Faults::at_step(1, FaultMode::FailAlways(28));
        for _ in 0..5 {
            assert_eq!(f.check(Op::WriteTemp).unwrap_err().raw_os_error(), Some(28));
        }
    }

    fn libc_eio() -> i32 {
        5
    }
}
