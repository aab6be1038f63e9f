//! The durable layer: the only code in holdfast that creates, writes, renames, fsyncs, unlinks
//! or locks files. Everything above it (the stores) says *what* to make durable; this module
//! says *how*, in one place, so the crash behaviour of every write can be read here and in
//! `docs/design.md`. Clippy's `disallowed-methods` (clippy.toml) keeps it so: its modules are
//! the only ones allowed those calls.
#![allow(clippy::disallowed_methods)]

mod appender;
mod atomic;
pub mod beneath;
mod cache;
pub mod fault;
pub mod journal;
pub mod linelog;
pub mod lock;
pub mod markers;
pub mod perms;
mod poison;
mod spares;

pub use appender::{AppendStat, Appender};
pub(crate) use atomic::ctime_ns;
pub use atomic::{
    atomic_write, atomic_write_recycling, atomic_write_with, create_exclusive, create_private_dir,
    create_shared_dirs, fit_name, fsync_dir, is_spare_name, is_temp_name, leftover_names,
    move_aside, read_capped, read_capped_stamped, remove_durably, set_mode, sweep_temp_files,
    sweep_temps_of, temp_prefix, FileStamp, WriteStep, ORPHAN_SWEEP_BATCH, SPARE_MARKER,
    TEMP_MARKER,
};
pub use beneath::{Dir, Owned};
pub use cache::FileCache;
pub use fault::{FaultMode, Faults, Op};
pub use linelog::{append_line, Appended, LineFile};
pub use lock::{FileLockGuard, LockError, LockFile, LockGuard, LockMode};
pub use perms::PermError;
pub use poison::Poison;
pub use spares::Spares;

use std::io;
use std::path::PathBuf;

/// A failed file-system step, with the step and the path it was applied to.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}{}", path.display(), self.hint())]
pub struct IoError {
    /// The step that failed.
    pub op: Op,
    /// The file or directory it was applied to.
    pub path: PathBuf,
    /// What the OS (or the fault seam) said.
    #[source]
    pub source: io::Error,
}

impl IoError {
    pub(crate) fn new(op: Op, path: impl Into<PathBuf>, source: io::Error) -> Self {
        IoError {
            op,
            path: path.into(),
            source,
        }
    }

    /// An fsync failed: the data may or may not be on disk, and the page cache may have dropped
    /// the dirty pages (fsyncgate). The store must stop writing until it is reopened.
    ///
    /// Only the fsync step itself counts. A path step that fails — ENOTDIR, ELOOP, EXDEV,
    /// EACCES: a symlink or a file where a directory belongs, or no permission to pass — says
    /// nothing about the page cache, and is excluded whatever step reported it, so that a
    /// planted link can never make one request poison every other run's writes.
    pub fn is_fsync(&self) -> bool {
        use rustix::io::Errno;
        let path_step = [Errno::NOTDIR, Errno::LOOP, Errno::XDEV, Errno::ACCESS];
        matches!(self.op, Op::FsyncFile | Op::FsyncDir)
            && !self
                .source
                .raw_os_error()
                .is_some_and(|e| path_step.contains(&Errno::from_raw_os_error(e)))
    }

    /// A path under the data directory was refused: a symlink, or something that is not a
    /// directory, where holdfast keeps a directory or file (`beneath.rs`). An error of the
    /// request that met it, never a reason to refuse other writes.
    pub fn is_unsafe_path(&self) -> bool {
        self.op == Op::UnsafePath
    }

    /// The seam simulated a crash at this step.
    pub fn is_injected_crash(&self) -> bool {
        fault::is_crash(&self.source)
    }

    /// The disk (or quota) is full.
    pub fn is_disk_full(&self) -> bool {
        let full = [rustix::io::Errno::NOSPC, rustix::io::Errno::DQUOT];
        self.source
            .raw_os_error()
            .is_some_and(|e| full.contains(&rustix::io::Errno::from_raw_os_error(e)))
    }

    /// What the user can do about it, where that is clear from the error.
    fn hint(&self) -> &'static str {
        if self.is_disk_full() {
            " (the disk or quota is full: free some space and retry; the previous value is intact)"
        } else {
            ""
        }
    }
}
