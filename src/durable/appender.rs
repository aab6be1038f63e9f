//! An append-only file kept open across appends: the audit log's segments (`src/audit/`).
//!
//! Unlike [`super::append_line`], which opens, appends and `fdatasync`s in one call, an
//! [`Appender`] separates the write from the sync, so that one `fdatasync` can cover the
//! appends of many callers (group commit), and a caller that only needs the bytes handed to the
//! kernel (they survive a crash of this process, not a power loss) pays no sync at all.
//!
//! Every step asks the fault seam first and a failed `fdatasync` poisons (the page cache may
//! have dropped what it could not write: fsyncgate); a failed append is cut back to the length
//! before it, so no caller ever finds half a line it was told failed. Files are opened
//! `O_APPEND|O_NOFOLLOW` and created `O_EXCL`, 0600, with their directory entry fsynced.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{fsync_dir, Faults, IoError, Op, Poison};

/// One append-only file, open. Clones share the open file description (a sync through one
/// covers what was appended through another).
#[derive(Clone, Debug)]
pub struct Appender {
    file: Arc<File>,
    path: PathBuf,
}

/// What `fstat` says of an [`Appender`]'s file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendStat {
    /// Its length in bytes.
    pub len: u64,
    /// Its links: 0 once it was unlinked or replaced (appends would then reach no name).
    pub nlink: u64,
    /// Its inode.
    pub ino: u64,
}

fn open_flags() -> i32 {
    super::atomic::NO_FOLLOW_NO_WAIT
}

impl Appender {
    /// Create `dir/name`, which must not exist (`O_EXCL`), 0600, and make its directory entry
    /// durable.
    pub fn create_new(dir: &Path, name: &str, faults: &Faults) -> Result<Appender, IoError> {
        let path = dir.join(name);
        let file = faults
            .check(Op::Create)
            .and_then(|()| {
                OpenOptions::new()
                    .read(true)
                    .append(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(open_flags())
                    .open(&path)
            })
            .map_err(|e| IoError::new(Op::Create, &path, e))?;
        fsync_dir(dir, faults)?;
        Ok(Appender {
            file: Arc::new(file),
            path,
        })
    }

    /// Open the existing file `dir/name` to append to it (and read it).
    pub fn open(dir: &Path, name: &str) -> Result<Appender, IoError> {
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .custom_flags(open_flags())
            .open(&path)
            .map_err(|e| IoError::new(Op::Open, &path, e))?;
        Ok(Appender {
            file: Arc::new(file),
            path,
        })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Length, links and inode now (one `fstat`).
    pub fn stat(&self) -> Result<AppendStat, IoError> {
        let m = self
            .file
            .metadata()
            .map_err(|e| IoError::new(Op::Read, &self.path, e))?;
        Ok(AppendStat {
            len: m.len(),
            nlink: m.nlink(),
            ino: m.ino(),
        })
    }

    /// Read up to `buf.len()` bytes at `offset` (fewer at the end of the file).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, IoError> {
        let mut n = 0;
        while n < buf.len() {
            match self.file.read_at(&mut buf[n..], offset + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(IoError::new(Op::Read, &self.path, e)),
            }
        }
        Ok(n)
    }

    /// Append `bytes` (not synced). `len_before` is the file's length before it: if the write
    /// fails the file is cut back to it, so a failed append leaves nothing behind; if even the
    /// cut fails, `poison` is set (a partial line could remain for the next reader to cut).
    #[allow(clippy::disallowed_methods)] // durable/ may append and truncate
    pub fn append(
        &self,
        bytes: &[u8],
        len_before: u64,
        faults: &Faults,
        poison: &Poison,
    ) -> Result<(), IoError> {
        poison.check(&self.path)?;
        let written = faults
            .check(Op::Append)
            .and_then(|()| (&*self.file).write_all(bytes))
            .map_err(|e| IoError::new(Op::Append, &self.path, e));
        if let Err(e) = written {
            if !e.is_injected_crash() {
                let cut = self
                    .file
                    .set_len(len_before)
                    .and_then(|()| self.file.sync_data());
                if let Err(cut) = cut {
                    poison.note(&IoError::new(Op::FsyncFile, &self.path, cut));
                }
            }
            return Err(e);
        }
        Ok(())
    }

    /// `fdatasync`: everything appended through any clone before this call is durable once it
    /// returns `Ok`. A failure poisons.
    #[allow(clippy::disallowed_methods)] // durable/ may fsync
    pub fn sync(&self, faults: &Faults, poison: &Poison) -> Result<(), IoError> {
        poison.check(&self.path)?;
        let synced = faults
            .check(Op::FsyncFile)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| IoError::new(Op::FsyncFile, &self.path, e));
        poison.watch(synced)?;
        faults.synced_file(&self.path);
        Ok(())
    }

    /// Cut the file to `len` bytes, durably (a torn last line a writer that died left).
    #[allow(clippy::disallowed_methods)] // durable/ may truncate and fsync
    pub fn cut(&self, len: u64, faults: &Faults, poison: &Poison) -> Result<(), IoError> {
        poison.check(&self.path)?;
        let cut = faults
            .check(Op::Truncate)
            .and_then(|()| self.file.set_len(len))
            .map_err(|e| IoError::new(Op::Truncate, &self.path, e));
        poison.watch(cut)?;
        self.sync(faults, poison)
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build their fixtures directly
mod tests {
    use super::*;
    use crate::durable::FaultMode;

    #[test]
    fn appends_are_cut_back_on_failure_and_a_failed_sync_poisons() {
        let d = tempfile::tempdir().unwrap();
        let poison = Poison::default();
        let a = Appender::create_new(d.path(), "log", &Faults::none()).unwrap();
        assert!(Appender::create_new(d.path(), "log", &Faults::none()).is_err());
        a.append(b"one\n", 0, &Faults::none(), &poison).unwrap();
        let failing = Faults::at_op(Op::Append, 1, FaultMode::FailOnce(28));
        let e = a.append(b"two\n", 4, &failing, &poison).unwrap_err();
        assert!(e.is_disk_full(), "{e}");
        assert_eq!(std::fs::read(d.path().join("log")).unwrap(), b"one\n");
        assert!(poison.reason().is_none());
        let b = Appender::open(d.path(), "log").unwrap();
        b.append(b"two\n", 4, &Faults::none(), &poison).unwrap();
        let s = a.stat().unwrap();
        assert_eq!((s.len, s.nlink), (8, 1));
        let mut buf = [0u8; 16];
        assert_eq!(a.read_at(4, &mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"two\n");
        let failing = Faults::at_op(Op::FsyncFile, 1, FaultMode::FailOnce(5));
        assert!(a.sync(&failing, &poison).unwrap_err().is_fsync());
        assert!(poison.reason().is_some());
        let e = a.append(b"x\n", 8, &Faults::none(), &poison).unwrap_err();
        assert_eq!(e.op, Op::Refused);
        std::fs::remove_file(d.path().join("log")).unwrap();
        assert_eq!(
            b.stat().unwrap().nlink,
            0,
            "an unlinked file shows no links"
        );
    }
}
