//! Append-only files of lines (the run logs' `details.jsonl`, `tool_logs.jsonl`,
//! `tool_calls.jsonl`): append with `fdatasync`, read what was appended since an offset, and cut
//! a torn last line — every write step behind the fault seam and the store's [`Poison`].
//!
//! A line is acknowledged once it and its newline are `fdatasync`ed. If the write or the sync
//! fails, the file is cut back to its length before the append (a retry must not find an
//! unsynced line and call it logged); if even that fails, the next reader cuts the partial
//! line as a torn tail. Files are opened relative to their directory's descriptor
//! ([`Dir`]: the run's directory, resolved beneath the data directory), `O_NOFOLLOW`, and
//! created 0600: a symlink at a log's name is a refused path, never written through.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use rustix::fs::OFlags;

use super::{Dir, Faults, IoError, Op, Poison};

/// One line file, open for reading and cutting (see [`LineFile::open`]).
#[derive(Debug)]
pub struct LineFile {
    file: File,
    path: PathBuf,
}

/// What [`append_line`] did.
#[derive(Debug)]
pub struct Appended {
    /// The file's metadata after the append.
    pub meta: fs::Metadata,
    /// The file was created by this append (its directory entry was fsynced).
    pub created: bool,
}

impl LineFile {
    /// Open the existing line file `name` in `dir` to read it and, if its last line is torn,
    /// cut it.
    pub fn open(dir: &Dir, name: &str) -> Result<LineFile, IoError> {
        let file = dir.open_own_file(Op::Open, name, OFlags::RDWR, 0)?;
        Ok(LineFile {
            file,
            path: dir.path().join(name),
        })
    }

    /// Everything from byte `offset` to the end.
    pub fn read_from(&mut self, offset: u64) -> Result<Vec<u8>, IoError> {
        let mut bytes = Vec::new();
        self.file
            .seek(SeekFrom::Start(offset))
            .and_then(|_| self.file.read_to_end(&mut bytes))
            .map_err(|e| IoError::new(Op::Read, &self.path, e))?;
        Ok(bytes)
    }

    /// The file's metadata now.
    pub fn metadata(&self) -> Result<fs::Metadata, IoError> {
        self.file
            .metadata()
            .map_err(|e| IoError::new(Op::Read, &self.path, e))
    }

    /// Cut the file to `len` bytes, durably (a torn last line whose writer died).
    #[allow(clippy::disallowed_methods)] // durable/ may truncate and fsync
    pub fn cut(&mut self, len: u64, faults: &Faults, poison: &Poison) -> Result<(), IoError> {
        poison.check(&self.path)?;
        let cut = faults
            .check(Op::Truncate)
            .and_then(|()| self.file.set_len(len))
            .map_err(|e| IoError::new(Op::Truncate, &self.path, e));
        poison.watch(cut)?;
        let synced = faults
            .check(Op::FsyncFile)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| IoError::new(Op::FsyncFile, &self.path, e));
        poison.watch(synced)
    }
}

/// Append `line` (ending in `\n`) to `name` in `dir`, creating the file (0600) if it is
/// missing, and `fdatasync` it; a new file's directory entry is fsynced too. `expected_len`
/// is the length the caller believes the file has: on a failed write or sync the file is cut
/// back to it.
#[allow(clippy::disallowed_methods)] // durable/ may append, truncate and fsync
pub fn append_line(
    dir: &Dir,
    name: &str,
    line: &[u8],
    expected_len: u64,
    faults: &Faults,
    poison: &Poison,
) -> Result<Appended, IoError> {
    let path = dir.path().join(name);
    poison.check(&path)?;
    // Opened without O_CREAT first: the usual case (the file exists) costs one open, and a
    // creation is known without a separate stat.
    let open = |create: bool| {
        let flags = OFlags::WRONLY | OFlags::APPEND;
        let flags = if create {
            flags | OFlags::CREATE
        } else {
            flags
        };
        dir.open_file(name, flags, 0o600)
    };
    let (file, existed) = match open(false) {
        Ok(f) => (Ok(f), true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => (open(true), false),
        Err(e) => (Err(e), true),
    };
    let mut file = file.map_err(|e| dir.file_error(Op::Open, name, e))?;
    let written = faults
        .check(Op::Append)
        .and_then(|()| file.write_all(line))
        .map_err(|e| IoError::new(Op::Append, &path, e))
        .and_then(|()| {
            faults
                .check(Op::FsyncFile)
                .and_then(|()| file.sync_data())
                .map_err(|e| IoError::new(Op::FsyncFile, &path, e))
        });
    if let Err(e) = written {
        poison.note(&e);
        // Take the line back out, even after a failed fsync: the cut is a new write whose own
        // sync says whether it held, and it vouches only for the bytes before the line (synced
        // by earlier appends), never for the line. If it fails too, the next reader cuts a
        // partial line; a whole unsynced line could remain, which is why the store is poisoned
        // (refusing writes until reopened) rather than trusted to retry.
        let _ = file.set_len(expected_len).and_then(|()| file.sync_data());
        return Err(e);
    }
    if !existed {
        poison.watch(dir.fsync(faults))?;
    }
    let meta = file
        .metadata()
        .map_err(|e| IoError::new(Op::Read, &path, e))?;
    Ok(Appended {
        meta,
        created: !existed,
    })
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build their fixtures directly
mod tests {
    use super::*;
    use crate::durable::FaultMode;

    fn dir(d: &tempfile::TempDir) -> Dir {
        Dir::open_root(d.path()).unwrap()
    }

    /// A failed fsync poisons: the failed append is refused, and so is every later write —
    /// appends and cuts — until a new `Poison` (the store reopened).
    #[test]
    fn a_failed_fsync_poisons_every_later_write() {
        let d = tempfile::tempdir().unwrap();
        let poison = Poison::default();
        let faults = Faults::none();
        append_line(&dir(&d), "a.jsonl", b"one\n", 0, &faults, &poison).unwrap();
        let failing = Faults::at_op(Op::FsyncFile, 1, FaultMode::FailOnce(5));
        let e = append_line(&dir(&d), "a.jsonl", b"two\n", 4, &failing, &poison).unwrap_err();
        assert!(e.is_fsync(), "{e}");
        assert!(poison.reason().is_some());
        let e = append_line(&dir(&d), "a.jsonl", b"three\n", 8, &faults, &poison).unwrap_err();
        assert_eq!(e.op, Op::Refused, "{e}");
        assert!(e
            .to_string()
            .contains("writes are refused until the daemon restarts"));
        let mut f = LineFile::open(&dir(&d), "a.jsonl").unwrap();
        assert_eq!(f.cut(4, &faults, &poison).unwrap_err().op, Op::Refused);
        // Reopened: writes go through again.
        let fresh = Poison::default();
        append_line(&dir(&d), "b.jsonl", b"x\n", 0, &faults, &fresh).unwrap();
    }

    /// A failed write is taken back out: the file is as before the append, not poisoned.
    #[test]
    fn a_failed_write_leaves_the_file_as_it_was() {
        let d = tempfile::tempdir().unwrap();
        let poison = Poison::default();
        append_line(&dir(&d), "a", b"one\n", 0, &Faults::none(), &poison).unwrap();
        let failing = Faults::at_op(Op::Append, 1, FaultMode::FailOnce(28));
        let e = append_line(&dir(&d), "a", b"two\n", 4, &failing, &poison).unwrap_err();
        assert_eq!(e.op, Op::Append);
        assert!(e.is_disk_full(), "{e}");
        assert!(poison.reason().is_none());
        assert_eq!(fs::read(d.path().join("a")).unwrap(), b"one\n");
    }

    /// A new file's directory entry is made durable; an existing file's appends cost only the
    /// write and its sync (no directory fsync, no extra step).
    #[test]
    fn only_the_append_that_creates_the_file_syncs_the_directory() {
        let d = tempfile::tempdir().unwrap();
        let poison = Poison::default();
        let f = Faults::recorder();
        let a = append_line(&dir(&d), "a", b"one\n", 0, &f, &poison).unwrap();
        assert!(a.created);
        assert_eq!(f.log(), vec![Op::Append, Op::FsyncFile, Op::FsyncDir]);
        let f = Faults::recorder();
        let a = append_line(&dir(&d), "a", b"two\n", 4, &f, &poison).unwrap();
        assert!(!a.created);
        assert_eq!(f.log(), vec![Op::Append, Op::FsyncFile]);
        assert_eq!(fs::read(d.path().join("a")).unwrap(), b"one\ntwo\n");
    }

    /// A symlink at a log's name is refused (never appended through), and refusing it
    /// poisons nothing.
    #[test]
    fn a_link_at_the_log_is_refused_and_poisons_nothing() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("f"), b"keep").unwrap();
        std::os::unix::fs::symlink(outside.path().join("f"), d.path().join("a.jsonl")).unwrap();
        let poison = Poison::default();
        let e = append_line(&dir(&d), "a.jsonl", b"x\n", 0, &Faults::none(), &poison).unwrap_err();
        assert!(e.is_unsafe_path(), "{e}");
        assert!(poison.reason().is_none());
        assert!(LineFile::open(&dir(&d), "a.jsonl")
            .unwrap_err()
            .is_unsafe_path());
        assert_eq!(fs::read(outside.path().join("f")).unwrap(), b"keep");
    }
}
