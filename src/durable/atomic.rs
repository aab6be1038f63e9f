//! Atomic replacement of a file: temp file in the same directory (`O_CREAT|O_EXCL|O_NOFOLLOW`,
//! mode 0600) → write → fsync(file) → rename over the target → fsync(dir). Only after the last
//! step is a write acknowledged. `tempfile::NamedTempFile::persist` does neither fsync, which
//! is why this is written out here.
//!
//! What a crash after each step leaves (and how a reader sees it):
//! 1. create temp: an empty `.<name>.hf-tmp-<hex>` file; the target is untouched. Swept on open.
//! 2. write: a partial temp file; target untouched. Swept on open.
//! 3. fsync(file): a complete temp file; target untouched. Swept on open.
//! 4. rename: the target is the new, complete file (rename is atomic); after power loss it may
//!    still be the old file, because the directory entry is not yet durable.
//! 5. fsync(dir): the new file is durable. Acknowledge.
//!
//! An fsync failure is reported as a failed write and never retried: after a failed fsync the
//! kernel may already have dropped the dirty pages, so a second fsync could "succeed" without the
//! data being on disk (PostgreSQL's fsyncgate). Callers poison their store on it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::fault::{Faults, Op};
use super::IoError;

/// Every temp file holdfast creates contains this marker: `.<name>.hf-tmp-<16 hex>`.
pub const TEMP_MARKER: &str = ".hf-tmp-";

/// Whether a directory entry is one of holdfast's temp files.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(TEMP_MARKER)
}

/// Identity of a file version as the file system reports it: enough to tell, without reading
/// the file, whether it changed since holdfast last read or wrote it. Atomic replacement always
/// creates a new inode; an in-place rewrite (as hive does) changes size or mtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileStamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Inode number.
    pub ino: u64,
}

impl FileStamp {
    /// The stamp of file metadata.
    pub fn of(meta: &fs::Metadata) -> Self {
        FileStamp {
            size: meta.size(),
            mtime_ns: meta
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.mtime_nsec()),
            ino: meta.ino(),
        }
    }
}

fn random_hex() -> String {
    let mut b = [0u8; 8];
    // getrandom only fails if the OS has no entropy source at all; a time-and-pid fallback
    // still gives a name that O_EXCL will refuse to reuse.
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b = ((t as u64) ^ u64::from(std::process::id()).rotate_left(40)).to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn open_new_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
}

/// Replace `dir/name` with `bytes` atomically and durably (see the module docs for the steps).
/// Returns the stamp of the new file.
pub fn atomic_write(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    faults: &Faults,
) -> Result<FileStamp, IoError> {
    publish(dir, name, bytes, faults, Publish::Replace)
}

/// Create `dir/name` with `bytes` durably, only if it does not exist: the same steps as
/// [`atomic_write`], but the complete temp file is published with `link(2)`, which fails with
/// `EEXIST` instead of replacing a file that appeared meanwhile (two `holdfast init`s racing
/// must never replace a key the other already used). The temp name is then unlinked.
pub fn create_exclusive(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    faults: &Faults,
) -> Result<FileStamp, IoError> {
    publish(dir, name, bytes, faults, Publish::NoReplace)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Publish {
    Replace,
    NoReplace,
}

fn publish(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    faults: &Faults,
    how: Publish,
) -> Result<FileStamp, IoError> {
    let tmp = dir.join(format!(".{name}{TEMP_MARKER}{}", random_hex()));
    let target = dir.join(name);

    faults
        .check(Op::CreateTemp)
        .map_err(|e| IoError::new(Op::CreateTemp, &tmp, e))?;
    let mut file = open_new_private(&tmp).map_err(|e| IoError::new(Op::CreateTemp, &tmp, e))?;

    let written = (|| -> Result<FileStamp, IoError> {
        faults
            .check(Op::WriteTemp)
            .and_then(|()| file.write_all(bytes))
            .map_err(|e| IoError::new(Op::WriteTemp, &tmp, e))?;
        faults
            .check(Op::FsyncFile)
            .and_then(|()| file.sync_all())
            .map_err(|e| IoError::new(Op::FsyncFile, &tmp, e))?;
        // fstat, not a write step: a failure here is not an fsync failure and must not poison.
        let stamp = file
            .metadata()
            .map(|m| FileStamp::of(&m))
            .map_err(|e| IoError::new(Op::WriteTemp, &tmp, e))?;
        faults
            .check(Op::Rename)
            .and_then(|()| match how {
                Publish::Replace => fs::rename(&tmp, &target),
                Publish::NoReplace => fs::hard_link(&tmp, &target),
            })
            .map_err(|e| IoError::new(Op::Rename, &target, e))?;
        if how == Publish::NoReplace {
            remove_temp(&tmp, faults)?;
        }
        Ok(stamp)
    })();
    drop(file);
    let stamp = match written {
        Ok(stamp) => stamp,
        Err(err) => {
            // A live process removes its temp file; a crashed one cannot (the seam refuses).
            if !err.is_injected_crash() {
                let _ = remove_temp(&tmp, faults);
            }
            return Err(err);
        }
    };
    fsync_dir(dir, faults)?;
    Ok(stamp)
}

fn remove_temp(path: &Path, faults: &Faults) -> Result<(), IoError> {
    faults
        .check(Op::RemoveTemp)
        .and_then(|()| fs::remove_file(path))
        .map_err(|e| IoError::new(Op::RemoveTemp, path, e))
}

/// fsync a directory, making renames and unlinks in it durable.
pub fn fsync_dir(dir: &Path, faults: &Faults) -> Result<(), IoError> {
    faults
        .check(Op::FsyncDir)
        .and_then(|()| {
            OpenOptions::new()
                .read(true)
                .custom_flags(
                    (rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::NOFOLLOW).bits() as i32,
                )
                .open(dir)?
                .sync_all()
        })
        .map_err(|e| IoError::new(Op::FsyncDir, dir, e))
}

/// Unlink `dir/name` and fsync `dir`. Returns whether the file existed.
pub fn remove_durably(dir: &Path, name: &str, faults: &Faults) -> Result<bool, IoError> {
    let path = dir.join(name);
    let existed = match faults
        .check(Op::Unlink)
        .and_then(|()| fs::remove_file(&path))
    {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(IoError::new(Op::Unlink, path, e)),
    };
    if existed {
        fsync_dir(dir, faults)?;
    }
    Ok(existed)
}

/// Move `from_dir/name` into `to_dir` under a name that never overwrites an earlier file
/// (`<name>.<unix_secs>-<hex>`), fsyncing both directories. Used for quarantine: the file is
/// kept, never deleted. Returns the new path.
pub fn move_aside(
    from_dir: &Path,
    name: &str,
    to_dir: &Path,
    faults: &Faults,
) -> Result<PathBuf, IoError> {
    create_private_dir(to_dir, faults)?;
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let dest = to_dir.join(format!("{name}.{secs}-{}", random_hex()));
    let src = from_dir.join(name);
    faults
        .check(Op::Rename)
        .and_then(|()| fs::rename(&src, &dest))
        .map_err(|e| IoError::new(Op::Rename, &src, e))?;
    fsync_dir(to_dir, faults)?;
    fsync_dir(from_dir, faults)?;
    Ok(dest)
}

/// Create `dir` (mode 0700, parents too) if it is missing, and fsync its parent so the new
/// entry survives a crash. An existing directory is left as it is (callers check permissions).
pub fn create_private_dir(dir: &Path, faults: &Faults) -> Result<(), IoError> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        if !parent.as_os_str().is_empty() && !parent.exists() {
            create_private_dir(parent, faults)?;
        }
    }
    let made = faults.check(Op::CreateDir).and_then(|()| {
        match fs::DirBuilder::new().mode(0o700).create(dir) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
            other => other,
        }
    });
    made.map_err(|e| IoError::new(Op::CreateDir, dir, e))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fsync_dir(parent, faults)?;
    }
    Ok(())
}

use std::os::unix::fs::DirBuilderExt;

/// Remove leftover temp files (names containing [`TEMP_MARKER`]) from `dir`. Must be called
/// only while holding the lock every writer of `dir` takes, or it could remove a temp file a
/// live writer is about to rename. Returns the names removed.
pub fn sweep_temp_files(dir: &Path, faults: &Faults) -> Result<Vec<String>, IoError> {
    let mut removed = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(IoError::new(Op::RemoveTemp, dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| IoError::new(Op::RemoveTemp, dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_temp_name(&name) {
            remove_temp(&entry.path(), faults)?;
            removed.push(name);
        }
    }
    if !removed.is_empty() {
        fsync_dir(dir, faults)?;
    }
    Ok(removed)
}

/// Read a regular file without following a symlink, refusing files larger than `cap` bytes.
/// `Ok(None)` if the file does not exist.
pub fn read_capped(path: &Path, cap: u64) -> io::Result<Option<Vec<u8>>> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let mut buf = Vec::with_capacity(meta.len().min(cap) as usize);
    file.take(cap + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > cap {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than the {cap}-byte limit"),
        ));
    }
    Ok(Some(buf))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::fault::FaultMode;
    use std::os::unix::fs::PermissionsExt;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn writes_replaces_with_mode_0600_and_no_temp_left() {
        let d = tempfile::tempdir().unwrap();
        atomic_write(d.path(), "a", b"one", &Faults::none()).unwrap();
        let stamp = atomic_write(d.path(), "a", b"two!", &Faults::none()).unwrap();
        assert_eq!(fs::read(d.path().join("a")).unwrap(), b"two!");
        assert_eq!(stamp.size, 4);
        let mode = fs::metadata(d.path().join("a"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(names(d.path()), vec!["a"]);
    }

    #[test]
    fn steps_are_in_the_documented_order() {
        let d = tempfile::tempdir().unwrap();
        let f = Faults::recorder();
        atomic_write(d.path(), "a", b"x", &f).unwrap();
        assert_eq!(
            f.log(),
            vec![
                Op::CreateTemp,
                Op::WriteTemp,
                Op::FsyncFile,
                Op::Rename,
                Op::FsyncDir
            ]
        );
    }

    #[test]
    fn failure_at_each_step_keeps_old_value_and_removes_temp() {
        for k in 1..=5 {
            let d = tempfile::tempdir().unwrap();
            atomic_write(d.path(), "a", b"old", &Faults::none()).unwrap();
            let f = Faults::at_step(k, FaultMode::FailOnce(5));
            let err = atomic_write(d.path(), "a", b"new", &f).unwrap_err();
            let content = fs::read(d.path().join("a")).unwrap();
            if k < 5 {
                assert_eq!(content, b"old", "step {k}: {err}");
            } else {
                // dir fsync failed after the rename: complete new value, write reported failed.
                assert_eq!(content, b"new");
                assert!(err.is_fsync());
            }
            assert_eq!(names(d.path()), vec!["a"], "step {k} left a temp file");
        }
    }

    #[test]
    fn crash_leaves_temp_for_the_sweep() {
        let d = tempfile::tempdir().unwrap();
        atomic_write(d.path(), "a", b"old", &Faults::none()).unwrap();
        let f = Faults::at_op(Op::Rename, 1, FaultMode::Crash);
        assert!(atomic_write(d.path(), "a", b"new", &f)
            .unwrap_err()
            .is_injected_crash());
        assert_eq!(names(d.path()).len(), 2);
        let swept = sweep_temp_files(d.path(), &Faults::none()).unwrap();
        assert_eq!(swept.len(), 1);
        assert_eq!(names(d.path()), vec!["a"]);
        assert_eq!(fs::read(d.path().join("a")).unwrap(), b"old");
    }

    #[test]
    fn create_exclusive_never_replaces() {
        let d = tempfile::tempdir().unwrap();
        create_exclusive(d.path(), "k", b"first", &Faults::none()).unwrap();
        let err = create_exclusive(d.path(), "k", b"second", &Faults::none()).unwrap_err();
        assert_eq!(err.source.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(d.path().join("k")).unwrap(), b"first");
        assert_eq!(names(d.path()), vec!["k"]);
        let mode = fs::metadata(d.path().join("k"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn read_capped_refuses_symlinks_and_big_files() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("big"), vec![b'x'; 100]).unwrap();
        assert!(read_capped(&d.path().join("big"), 10).is_err());
        assert_eq!(
            read_capped(&d.path().join("big"), 100)
                .unwrap()
                .unwrap()
                .len(),
            100
        );
        std::os::unix::fs::symlink(d.path().join("big"), d.path().join("link")).unwrap();
        assert!(read_capped(&d.path().join("link"), 1000).is_err());
        assert!(read_capped(&d.path().join("missing"), 10)
            .unwrap()
            .is_none());
    }

    #[test]
    fn create_new_refuses_a_planted_symlink() {
        let d = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("planted")).unwrap();
        assert!(open_new_private(&d.path().join("planted")).is_err());
    }
}
