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
use std::time::Duration;

use super::fault::{Faults, Op};
use super::spares::Spares;
use super::IoError;

/// Every temp file holdfast creates contains this marker: `.<name>.hf-tmp-<16 hex>`.
pub const TEMP_MARKER: &str = ".hf-tmp-";

/// The longest file name Linux file systems take (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// `name` shortened so that `extra` more bytes still make a file name within `NAME_MAX`: as
/// it is when it fits, else its first bytes (at a character boundary) and `~<crc32c of the
/// whole name>`, which stays distinct per name. hive's own ids reach 251 bytes (`<id>.enc` is
/// 255) and holdfast reads the files hive wrote under them, so a temp or quarantine name
/// derived from a file name must not simply append to it.
pub fn fit_name(name: &str, extra: usize) -> std::borrow::Cow<'_, str> {
    if name.len() + extra <= NAME_MAX {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut cut = NAME_MAX.saturating_sub(extra + 9).min(name.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}~{:08x}",
        &name[..cut],
        crc32c::crc32c(name.as_bytes())
    ))
}

/// What every temp file of `name` starts with, before [`TEMP_MARKER`]: `.<name>`, shortened by
/// [`fit_name`] when the temp's whole name would pass `NAME_MAX`.
pub fn temp_prefix(name: &str) -> String {
    format!(".{}", fit_name(name, 1 + TEMP_MARKER.len() + 16))
}

/// Whether a directory entry is one of holdfast's temp files (a generation marker, whose
/// name ends with the name of the file it describes, is not, whatever that name holds).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(TEMP_MARKER) && !super::markers::is_gen_marker_name(name)
}

/// Spare files (see [`Spares`]) are named `.hf-spare-<owner pid>-<16 hex>`.
pub const SPARE_MARKER: &str = ".hf-spare-";

pub use crate::limits::SPARE_ORPHAN_AGE;

/// Whether a directory entry is a spare file.
pub fn is_spare_name(name: &str) -> bool {
    name.starts_with(SPARE_MARKER)
}

/// The pid of the process whose pool a spare belongs to.
fn spare_owner(name: &str) -> Option<i32> {
    name.strip_prefix(SPARE_MARKER)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// Whether spare `dir/name` is an orphan: its owner is gone (no such process), or its inode
/// has not changed for [`SPARE_ORPHAN_AGE`].
fn is_orphan_spare(dir: &Path, name: &str) -> bool {
    let owner_gone = spare_owner(name)
        .and_then(rustix::process::Pid::from_raw)
        .is_none_or(|pid| {
            // Signal 0 checks existence; EPERM means it exists under another uid.
            rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH)
        });
    if owner_gone {
        return true;
    }
    let Ok(meta) = fs::symlink_metadata(dir.join(name)) else {
        return false;
    };
    let ctime =
        std::time::UNIX_EPOCH + Duration::from_nanos(u64::try_from(ctime_ns(&meta)).unwrap_or(0));
    ctime.elapsed().is_ok_and(|age| age >= SPARE_ORPHAN_AGE)
}

/// Leftovers in `dir` a repair would remove: temp files, and orphaned spares.
pub fn leftover_names(dir: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_temp_name(n) || (is_spare_name(n) && is_orphan_spare(dir, n)))
        .collect()
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

/// A file's inode change time in nanoseconds since the epoch (no system call can set it).
pub(crate) fn ctime_ns(meta: &fs::Metadata) -> i64 {
    meta.ctime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.ctime_nsec())
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

pub(super) fn random_hex() -> String {
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

/// `O_NOFOLLOW | O_NONBLOCK` for opening an existing file: never through a symlink, and never
/// waiting — a FIFO planted where a file belongs would make a plain `open` wait for a writer
/// forever (holding a thread, and for a write the store lock). The file is then checked to be a
/// regular one; `O_NONBLOCK` changes nothing for regular files.
pub(crate) const NO_FOLLOW_NO_WAIT: i32 =
    (rustix::fs::OFlags::NOFOLLOW.bits() | rustix::fs::OFlags::NONBLOCK.bits()) as i32;

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

/// Replace `dir/name` with `bytes` like [`atomic_write`], but write into a spare from
/// `spares` (a file an earlier replacement retired) when one is old enough, and keep the file
/// being replaced as a new spare instead of freeing it. See [`Spares`] for why.
pub fn atomic_write_recycling(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    faults: &Faults,
    spares: &Spares,
) -> Result<FileStamp, IoError> {
    publish_with(
        dir,
        name,
        bytes,
        faults,
        Publish::Replace,
        Some(spares),
        &mut |_| Ok(()),
    )
}

/// Where a caller's step runs within [`atomic_write_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteStep {
    /// The new bytes are durable in their temp file and about to take the name. A failure
    /// here: nothing was replaced.
    BeforeRename,
    /// They have the name; the directory fsync that makes everything durable comes next. A
    /// failure here reports the write failed, as a failed directory fsync does (the new value
    /// is visible but was not acknowledged).
    BeforeSync,
}

/// [`atomic_write`] (or [`atomic_write_recycling`] with `spares`), with steps of the caller's
/// in the same directory at each [`WriteStep`] (a marker made before the rename and one removed
/// after it: both durable with the one directory fsync).
pub fn atomic_write_with(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    faults: &Faults,
    spares: Option<&Spares>,
    step: &mut dyn FnMut(WriteStep) -> Result<(), IoError>,
) -> Result<FileStamp, IoError> {
    publish_with(dir, name, bytes, faults, Publish::Replace, spares, step)
}

fn publish(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    faults: &Faults,
    how: Publish,
) -> Result<FileStamp, IoError> {
    publish_with(dir, name, bytes, faults, how, None, &mut |_| Ok(()))
}

/// A spare file opened for reuse, with its length: a private regular file of ours with no
/// other name (writing into a file that is also linked elsewhere would change that other
/// name's content; one someone made group- or world-readable must not carry another value).
fn open_spare(path: &Path) -> Option<(File, u64)> {
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(NO_FOLLOW_NO_WAIT)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    (meta.is_file()
        && meta.nlink() == 1
        && meta.uid() == super::perms::euid()
        && meta.mode() & 0o077 == 0)
        .then_some((file, meta.len()))
}

/// Set once a `renameat2(RENAME_EXCHANGE)` was refused as unsupported (an old kernel, a file
/// system without it): recycled writes then link and rename.
static EXCHANGE_UNSUPPORTED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Swap the directory entries `a` and `b` atomically (both must exist).
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).map_err(io::Error::from)
}

/// Whether `renameat2` refused the exchange as unsupported rather than failing it.
fn exchange_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if code == rustix::io::Errno::INVAL.raw_os_error()
            || code == rustix::io::Errno::NOSYS.raw_os_error()
            || code == rustix::io::Errno::OPNOTSUPP.raw_os_error()
    )
}

fn publish_with(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    faults: &Faults,
    how: Publish,
    spares: Option<&Spares>,
    step: &mut dyn FnMut(WriteStep) -> Result<(), IoError>,
) -> Result<FileStamp, IoError> {
    let target = dir.join(name);

    faults
        .check(Op::CreateTemp)
        .map_err(|e| IoError::new(Op::CreateTemp, dir.join(name), e))?;
    // A spare if one is old enough and still ours, else a new temp file. A spare that cannot be
    // used (removed by a sweep in another process, linked elsewhere) is dropped from the pool.
    // `recycled` below: the reused spare's name and length (it was longer: cut it; it can
    // trade places with the target).
    let mut reused = None;
    while let Some(spare) = spares.and_then(|s| s.take(name)) {
        let path = dir.join(&spare);
        if let Some((file, len)) = open_spare(&path) {
            reused = Some((path, file, (spare, len)));
            break;
        }
        let _ = fs::remove_file(&path);
    }
    let (tmp, mut file, recycled) = match reused {
        Some((path, file, spare)) => (path, file, Some(spare)),
        None => {
            let tmp = dir.join(format!(
                "{}{TEMP_MARKER}{}",
                temp_prefix(name),
                random_hex()
            ));
            let file = open_new_private(&tmp).map_err(|e| IoError::new(Op::CreateTemp, &tmp, e))?;
            (tmp, file, None)
        }
    };

    let mut retired: Option<String> = None;
    let written = (|| -> Result<FileStamp, IoError> {
        faults
            .check(Op::WriteTemp)
            .and_then(|()| {
                match recycled {
                    // Over the old bytes, then cut to length if it was longer: the blocks are
                    // reused, not freed and reallocated (a cut within the last block frees
                    // nothing). A credential rewritten usually keeps its length, and then the
                    // cut is skipped: it cost a journal handle and a timestamp update (a
                    // tenth of a set's CPU time in the daemon, docs/benchmarks.md).
                    Some((_, old_len)) => {
                        use std::os::unix::fs::FileExt;
                        file.write_all_at(bytes, 0)?;
                        if old_len > bytes.len() as u64 {
                            file.set_len(bytes.len() as u64)?;
                        }
                        Ok(())
                    }
                    None => file.write_all(bytes),
                }
            })
            .map_err(|e| IoError::new(Op::WriteTemp, &tmp, e))?;
        faults
            .check(Op::FsyncFile)
            .and_then(|()| file.sync_all())
            .map_err(|e| IoError::new(Op::FsyncFile, &tmp, e))?;
        faults.synced_file(&tmp);
        // fstat, not a write step: a failure here is not an fsync failure and must not poison.
        let stamp = file
            .metadata()
            .map(|m| FileStamp::of(&m))
            .map_err(|e| IoError::new(Op::WriteTemp, &tmp, e))?;
        step(WriteStep::BeforeRename)?;
        // A recycled spare trades places with the file it replaces: one `renameat2` with
        // RENAME_EXCHANGE puts the new bytes under the name and the replaced file under the
        // spare's name, where it is the next spare — what a link and a rename below do in two
        // calls (the link cost ~24 µs of a daemon set, docs/benchmarks.md). Nothing to replace
        // (ENOENT): a plain rename. A file system that cannot exchange: the two calls, from
        // then on.
        if let (Some((spare, _)), Publish::Replace, false) = (
            &recycled,
            how,
            EXCHANGE_UNSUPPORTED.load(std::sync::atomic::Ordering::Relaxed),
        ) {
            faults
                .check(Op::Rename)
                .map_err(|e| IoError::new(Op::Rename, &target, e))?;
            match exchange(&tmp, &target) {
                Ok(()) => {
                    retired = Some(spare.clone());
                    return Ok(stamp);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::rename(&tmp, &target).map_err(|e| IoError::new(Op::Rename, &target, e))?;
                    return Ok(stamp);
                }
                Err(e) if exchange_unsupported(&e) => {
                    EXCHANGE_UNSUPPORTED.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => return Err(IoError::new(Op::Rename, &target, e)),
            }
        }
        // Keep the file being replaced (if any) under a spare name, so the rename below frees
        // none of its blocks. Best effort: if the link fails, the replaced file is freed as in
        // a plain atomic_write.
        if spares.is_some() {
            faults
                .check(Op::LinkSpare)
                .map_err(|e| IoError::new(Op::LinkSpare, &target, e))?;
            let spare = format!("{SPARE_MARKER}{}-{}", std::process::id(), random_hex());
            if fs::hard_link(&target, dir.join(&spare)).is_ok() {
                retired = Some(spare);
            }
        }
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
            // A live process removes its temp file (and a spare name it just made); a crashed
            // one cannot (the seam refuses). Leftovers are swept on the next open.
            if !err.is_injected_crash() {
                let _ = remove_temp(&tmp, faults);
                if let Some(spare) = retired.take() {
                    let _ = fs::remove_file(dir.join(spare));
                }
            }
            return Err(err);
        }
    };
    if let Err(e) = step(WriteStep::BeforeSync).and_then(|()| fsync_dir(dir, faults)) {
        // The old value kept under the spare name must not outlive the pool's knowledge of it.
        if let Some(spare) = retired {
            if !e.is_injected_crash() {
                let _ = fs::remove_file(dir.join(spare));
            }
        }
        return Err(e);
    }
    if let (Some(spares), Some(spare)) = (spares, retired) {
        spares.put(spare, name);
    }
    Ok(stamp)
}

fn remove_temp(path: &Path, faults: &Faults) -> Result<(), IoError> {
    faults
        .check(Op::RemoveTemp)
        .and_then(|()| fs::remove_file(path))
        .map_err(|e| IoError::new(Op::RemoveTemp, path, e))
}

/// fsync a directory, making renames and unlinks in it durable. Only the fsync itself is an
/// fsync step: a directory that does not open (a symlink or a file at `dir`: a refused path;
/// anything else: a failed open) is not an fsync failure and must not poison a store.
pub fn fsync_dir(dir: &Path, faults: &Faults) -> Result<(), IoError> {
    faults
        .check(Op::FsyncDir)
        .map_err(|e| IoError::new(Op::FsyncDir, dir, e))?;
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::NOFOLLOW).bits() as i32)
        .open(dir)
        .map_err(|e| {
            let refused = [rustix::io::Errno::NOTDIR, rustix::io::Errno::LOOP];
            match e.raw_os_error().map(rustix::io::Errno::from_raw_os_error) {
                Some(errno) if refused.contains(&errno) => IoError::new(
                    Op::UnsafePath,
                    dir,
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "not a directory (a symbolic link or a file where holdfast keeps a \
                         directory; it never follows one)",
                    ),
                ),
                _ => IoError::new(Op::Open, dir, e),
            }
        })?;
    opened
        .sync_all()
        .map_err(|e| IoError::new(Op::FsyncDir, dir, e))?;
    faults.synced_dir(dir);
    Ok(())
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
    let dest = to_dir.join(format!(
        "{}.{secs}-{}",
        fit_name(name, 1 + 20 + 1 + 16),
        random_hex()
    ));
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

pub use crate::limits::ORPHAN_SWEEP_BATCH;

/// Remove leftover temp files (names containing [`TEMP_MARKER`]) and up to
/// [`ORPHAN_SWEEP_BATCH`] orphaned spares from `dir`. Must be called only while holding the
/// lock every writer of `dir` takes, or it could remove a temp file a live writer is about to
/// rename. Returns the names removed.
pub fn sweep_temp_files(dir: &Path, faults: &Faults) -> Result<Vec<String>, IoError> {
    let mut removed = Vec::new();
    let mut orphans = 0;
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(IoError::new(Op::RemoveTemp, dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| IoError::new(Op::RemoveTemp, dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // A live daemon's spares are young; only orphans (a daemon that died) are removed,
        // a batch at a time.
        let orphan =
            is_spare_name(&name) && orphans < ORPHAN_SWEEP_BATCH && is_orphan_spare(dir, &name);
        if is_temp_name(&name) || orphan {
            remove_temp(&entry.path(), faults)?;
            orphans += usize::from(orphan);
            removed.push(name);
        }
    }
    if !removed.is_empty() {
        fsync_dir(dir, faults)?;
    }
    Ok(removed)
}

/// Remove the temp files [`atomic_write`] leaves in `dir` when it is killed while replacing one
/// of `names` (`.<name>.hf-tmp-<hex>`), and nothing else: the caller owns those names (it holds
/// the lock every writer of them takes) but may share the directory with other writers. Returns
/// how many it removed.
pub fn sweep_temps_of(dir: &Path, names: &[&str], faults: &Faults) -> Result<usize, IoError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(IoError::new(Op::RemoveTemp, dir, e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(|e| IoError::new(Op::RemoveTemp, dir, e))?;
        let file = entry.file_name();
        let file = file.to_string_lossy();
        let ours = names.iter().any(|n| {
            file.strip_prefix(temp_prefix(n).as_str())
                .is_some_and(|rest| rest.starts_with(TEMP_MARKER))
        });
        if ours {
            remove_temp(&entry.path(), faults)?;
            removed += 1;
        }
    }
    if removed > 0 {
        fsync_dir(dir, faults)?;
    }
    Ok(removed)
}

/// Read a regular file without following a symlink, refusing files larger than `cap` bytes.
/// `Ok(None)` if the file does not exist.
pub fn read_capped(path: &Path, cap: u64) -> io::Result<Option<Vec<u8>>> {
    Ok(read_capped_stamped(path, cap)?.map(|(bytes, _, _)| bytes))
}

/// [`read_capped`], with the stamp and the ctime (ns) of the file that was read (taken from
/// the open file).
pub fn read_capped_stamped(path: &Path, cap: u64) -> io::Result<Option<(Vec<u8>, FileStamp, i64)>> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(NO_FOLLOW_NO_WAIT)
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
            io::ErrorKind::FileTooLarge,
            format!("larger than the {cap}-byte limit"),
        ));
    }
    Ok(Some((buf, FileStamp::of(&meta), ctime_ns(&meta))))
}

/// Create `dir` and its missing parents with the default mode (under the umask): for
/// directories other programs read, such as systemd's unit directories. Not for holdfast's own
/// data, which [`create_private_dir`] makes 0700.
pub fn create_shared_dirs(dir: &Path) -> Result<(), IoError> {
    fs::create_dir_all(dir).map_err(|e| IoError::new(Op::CreateDir, dir, e))
}

/// Set `path`'s mode (a file other programs read, such as a unit file: 0644).
pub fn set_mode(path: &Path, mode: u32) -> Result<(), IoError> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| IoError::new(Op::Chmod, path, e))
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

    /// A writer killed while replacing `state` leaves its temp; the sweep of the names a
    /// caller owns removes that one and leaves every other file (another writer's temp, the
    /// files themselves) alone.
    /// Names at NAME_MAX (hive's ids reach 251 bytes: `<id>.enc` is 255): a write's temp, its
    /// sweep after a crash and a quarantined copy all fit, and two long names that share
    /// their first bytes keep distinct temps.
    #[test]
    fn names_at_name_max_write_sweep_and_move_aside() {
        let d = tempfile::tempdir().unwrap();
        let long = format!("{}.enc", "a".repeat(251));
        let twin = format!("{}b.enc", "a".repeat(250));
        let wide = format!("{}.enc", "é".repeat(125));
        for name in [&long, &twin, &wide] {
            assert!(name.len() <= NAME_MAX, "{}", name.len());
            atomic_write(d.path(), name, b"old", &Faults::none()).unwrap();
            let f = Faults::at_op(Op::Rename, 1, FaultMode::Crash);
            assert!(atomic_write(d.path(), name, b"new", &f)
                .unwrap_err()
                .is_injected_crash());
            assert_eq!(fs::read(d.path().join(name)).unwrap(), b"old");
        }
        assert_ne!(temp_prefix(&long), temp_prefix(&twin));
        let temps = names(d.path())
            .into_iter()
            .filter(|n| is_temp_name(n))
            .collect::<Vec<_>>();
        assert_eq!(temps.len(), 3, "{temps:?}");
        assert!(temps.iter().all(|n| n.len() <= NAME_MAX), "{temps:?}");
        // Each long name's sweep takes its own temp only.
        assert_eq!(
            sweep_temps_of(d.path(), &[&long], &Faults::none()).unwrap(),
            1
        );
        assert_eq!(
            sweep_temps_of(d.path(), &[&twin, &wide], &Faults::none()).unwrap(),
            2
        );
        assert_eq!(names(d.path()).len(), 3);
        let q = d.path().join("quarantine");
        let moved = move_aside(d.path(), &long, &q, &Faults::none()).unwrap();
        let moved_name = moved.file_name().unwrap().to_string_lossy().into_owned();
        assert!(moved_name.len() <= NAME_MAX, "{moved_name}");
        assert_eq!(fs::read(&moved).unwrap(), b"old");
    }

    #[test]
    fn sweep_of_named_temps_removes_only_those() {
        let d = tempfile::tempdir().unwrap();
        atomic_write(d.path(), "state", b"old", &Faults::none()).unwrap();
        let f = Faults::at_op(Op::Rename, 1, FaultMode::Crash);
        assert!(atomic_write(d.path(), "state", b"new", &f)
            .unwrap_err()
            .is_injected_crash());
        let f = Faults::at_op(Op::Rename, 1, FaultMode::Crash);
        assert!(atomic_write(d.path(), "details.jsonl", b"x", &f)
            .unwrap_err()
            .is_injected_crash());
        fs::write(d.path().join("statement"), b"not ours").unwrap();
        assert_eq!(names(d.path()).len(), 4);
        let removed = sweep_temps_of(d.path(), &["state", "checkpoint"], &Faults::none()).unwrap();
        assert_eq!(removed, 1);
        let left = names(d.path());
        assert_eq!(left.len(), 3, "{left:?}");
        assert!(
            left.iter().any(|n| n.starts_with(".details.jsonl.hf-tmp-")),
            "{left:?}"
        );
        assert_eq!(fs::read(d.path().join("state")).unwrap(), b"old");
        assert_eq!(
            sweep_temps_of(&d.path().join("missing"), &["state"], &Faults::none()).unwrap(),
            0
        );
    }

    fn ino(p: &Path) -> u64 {
        fs::metadata(p).unwrap().ino()
    }

    /// A pool whose spares are reusable at once (the real one waits a second).
    fn eager(dir: &Path) -> Spares {
        Spares::with_limits(dir, Duration::ZERO, 8)
    }

    #[test]
    fn recycling_reuses_the_replaced_inode_and_keeps_values_whole() {
        let d = tempfile::tempdir().unwrap();
        let spares = eager(d.path());
        let f = Faults::none();
        atomic_write_recycling(d.path(), "a", b"first value", &f, &spares).unwrap();
        assert!(spares.is_empty(), "nothing was replaced yet");
        let first = ino(&d.path().join("a"));
        atomic_write_recycling(d.path(), "a", b"second", &f, &spares).unwrap();
        assert_eq!(spares.len(), 1, "the replaced file is kept as a spare");
        // The third write goes into the first write's inode, cut to the new length.
        atomic_write_recycling(d.path(), "a", b"3", &f, &spares).unwrap();
        assert_eq!(ino(&d.path().join("a")), first, "spare not reused");
        assert_eq!(fs::read(d.path().join("a")).unwrap(), b"3");
        let mode = fs::metadata(d.path().join("a"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A longer value into a recycled inode.
        atomic_write_recycling(d.path(), "a", &[b'y'; 5000], &f, &spares).unwrap();
        assert_eq!(fs::read(d.path().join("a")).unwrap(), vec![b'y'; 5000]);
        // Spares are dot files: invisible to *.enc listings; a young one is not a leftover (a
        // live pool owns it), so neither fsck nor another process's sweep touches it.
        let listed = names(d.path());
        assert_eq!(
            listed.iter().filter(|n| !is_spare_name(n)).count(),
            1,
            "{listed:?}"
        );
        assert!(leftover_names(d.path()).is_empty());
        assert!(sweep_temp_files(d.path(), &f).unwrap().is_empty());
        assert_eq!(spares.len(), 1);
        assert_eq!(spares.purge(), 1);
        assert_eq!(names(d.path()), vec!["a"]);
    }

    #[test]
    fn spares_wait_their_minimum_age() {
        let d = tempfile::tempdir().unwrap();
        let spares = Spares::with_limits(d.path(), Duration::from_secs(3600), 8);
        let f = Faults::none();
        atomic_write_recycling(d.path(), "a", b"1", &f, &spares).unwrap();
        let first = ino(&d.path().join("a"));
        for v in [b"2", b"3", b"4"] {
            atomic_write_recycling(d.path(), "a", v, &f, &spares).unwrap();
            assert_ne!(
                ino(&d.path().join("a")),
                first,
                "a fresh spare was rewritten"
            );
        }
        assert_eq!(spares.len(), 3);
        assert_eq!(fs::read(d.path().join("a")).unwrap(), b"4");
    }

    #[test]
    fn a_spare_linked_elsewhere_is_never_written_into() {
        let d = tempfile::tempdir().unwrap();
        let spares = eager(d.path());
        let f = Faults::none();
        atomic_write_recycling(d.path(), "a", b"old", &f, &spares).unwrap();
        atomic_write_recycling(d.path(), "a", b"new", &f, &spares).unwrap();
        // Someone hard-links the spare (the old value) under another name.
        let spare = names(d.path())
            .into_iter()
            .find(|n| is_spare_name(n))
            .unwrap();
        fs::hard_link(d.path().join(&spare), d.path().join("keep")).unwrap();
        atomic_write_recycling(d.path(), "a", b"newer", &f, &spares).unwrap();
        assert_eq!(fs::read(d.path().join("keep")).unwrap(), b"old");
        assert_eq!(fs::read(d.path().join("a")).unwrap(), b"newer");
        // A spare removed behind the pool's back (a sweep by another process) is skipped.
        for n in names(d.path()).into_iter().filter(|n| is_spare_name(n)) {
            fs::remove_file(d.path().join(n)).unwrap();
        }
        atomic_write_recycling(d.path(), "a", b"newest", &f, &spares).unwrap();
        assert_eq!(fs::read(d.path().join("a")).unwrap(), b"newest");
    }

    #[test]
    fn purge_from_drops_only_that_files_spares_and_the_cap_holds() {
        let d = tempfile::tempdir().unwrap();
        let spares = Spares::with_limits(d.path(), Duration::from_secs(3600), 3);
        let f = Faults::none();
        for v in 0..3u8 {
            atomic_write_recycling(d.path(), "a", &[v], &f, &spares).unwrap();
            atomic_write_recycling(d.path(), "b", &[v], &f, &spares).unwrap();
        }
        // 4 replacements, cap 3: the oldest spare was unlinked.
        assert_eq!(spares.len(), 3);
        let on_disk = |d: &Path| names(d).into_iter().filter(|n| is_spare_name(n)).count();
        assert_eq!(on_disk(d.path()), 3);
        let gone = spares.purge_from("a");
        assert!(gone >= 1);
        assert_eq!(spares.len(), 3 - gone);
        assert_eq!(on_disk(d.path()), 3 - gone);
        assert_eq!(
            spares.trim(Duration::from_secs(3600), 10),
            0,
            "none idle yet"
        );
        assert_eq!(spares.trim(Duration::ZERO, 10), 3 - gone);
        assert_eq!(names(d.path()), vec!["a", "b"]);
    }

    #[test]
    fn recycled_write_failing_or_crashing_at_each_step_keeps_a_whole_value() {
        let mut explored = 0;
        for crash in [false, true] {
            for k in 1..=6 {
                let d = tempfile::tempdir().unwrap();
                let spares = eager(d.path());
                let none = Faults::none();
                // A spare ready for reuse, so the faulted write recycles.
                atomic_write_recycling(d.path(), "a", b"v1", &none, &spares).unwrap();
                atomic_write_recycling(d.path(), "a", b"old", &none, &spares).unwrap();
                assert_eq!(spares.len(), 1);
                let mode = if crash {
                    FaultMode::Crash
                } else {
                    FaultMode::FailOnce(5)
                };
                let f = Faults::at_step(k, mode);
                let res = atomic_write_recycling(d.path(), "a", b"new value", &f, &spares);
                let content = fs::read(d.path().join("a")).unwrap();
                assert!(
                    content == b"old" || content == b"new value",
                    "step {k}: torn {content:?}"
                );
                if res.is_ok() {
                    assert_eq!(content, b"new value");
                }
                sweep_temp_files(d.path(), &none).unwrap();
                // Left: the target, the pool's spares, and after a crash up to two spare files
                // the pool does not know of (the one being rewritten, and the one just linked):
                // orphans for the sweep of a later open, once old. A failure cleans up.
                let left: Vec<String> = names(d.path())
                    .into_iter()
                    .filter(|n| n != "a" && !is_spare_name(n))
                    .collect();
                assert!(left.is_empty(), "step {k}: sweep left {left:?}");
                let spare_files = names(d.path()).iter().filter(|n| is_spare_name(n)).count();
                assert!(
                    spare_files <= spares.len() + 2 * usize::from(crash),
                    "step {k}: {spare_files} spare files, pool knows {}",
                    spares.len()
                );
                explored += 1;
            }
        }
        println!("recycled write: {explored} fail/crash points explored, 0 torn");
        assert_eq!(explored, 12);
    }

    #[test]
    fn orphaned_spares_are_swept_live_ones_are_not() {
        let d = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let live = format!("{SPARE_MARKER}{me}-0000000000000001");
        fs::write(d.path().join(&live), b"x").unwrap();
        assert!(
            leftover_names(d.path()).is_empty(),
            "a live pool's spare is no leftover"
        );
        assert!(sweep_temp_files(d.path(), &Faults::none())
            .unwrap()
            .is_empty());
        // A spare of a process that is gone (a reaped child's pid), and a malformed name.
        let child = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = child.id();
        let mut child = child;
        child.wait().unwrap();
        let dead = format!("{SPARE_MARKER}{gone_pid}-0000000000000002");
        fs::write(d.path().join(&dead), b"y").unwrap();
        let odd = format!("{SPARE_MARKER}garbage");
        fs::write(d.path().join(&odd), b"z").unwrap();
        let mut left = leftover_names(d.path());
        left.sort();
        let mut want = vec![dead.clone(), odd.clone()];
        want.sort();
        assert_eq!(left, want);
        let mut swept = sweep_temp_files(d.path(), &Faults::none()).unwrap();
        swept.sort();
        assert_eq!(swept, want);
        assert_eq!(names(d.path()), vec![live]);
        let tmp = d.path().join(format!(".x{TEMP_MARKER}0000000000000003"));
        fs::write(tmp, b"t").unwrap();
        assert_eq!(
            leftover_names(d.path()).len(),
            1,
            "a temp file always is a leftover"
        );
    }

    #[test]
    fn recycling_steps_are_in_order() {
        let d = tempfile::tempdir().unwrap();
        let spares = eager(d.path());
        atomic_write_recycling(d.path(), "a", b"x", &Faults::none(), &spares).unwrap();
        // No spare yet: a new temp file, the replaced file linked as a spare, the rename.
        let f = Faults::recorder();
        atomic_write_recycling(d.path(), "a", b"y", &f, &spares).unwrap();
        assert_eq!(
            f.log(),
            vec![
                Op::CreateTemp,
                Op::WriteTemp,
                Op::FsyncFile,
                Op::LinkSpare,
                Op::Rename,
                Op::FsyncDir
            ]
        );
        // A spare recycled: it trades places with the replaced file (the rename step).
        let f = Faults::recorder();
        atomic_write_recycling(d.path(), "a", b"z", &f, &spares).unwrap();
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

    /// Power lost at every step of a recycled write (the exchange of spare and target
    /// included), the tree cut back to what its fsyncs made durable: the name holds the old
    /// value or the new one, whole, and the new one if the write was acknowledged.
    #[test]
    fn power_lost_at_each_step_of_a_recycled_write_leaves_a_whole_value() {
        let none = Faults::none();
        let mut seen = Vec::new();
        for k in 1..=6 {
            let root = tempfile::tempdir().unwrap();
            let d = root.path().join("credentials");
            fs::create_dir(&d).unwrap();
            let spares = eager(&d);
            atomic_write_recycling(&d, "a", b"v1", &none, &spares).unwrap();
            atomic_write_recycling(&d, "a", b"old", &none, &spares).unwrap();
            let f = Faults::at_step(k, FaultMode::Crash);
            f.record_power(root.path());
            let acked = atomic_write_recycling(&d, "a", b"new value", &f, &spares).is_ok();
            f.lose_power(root.path()).unwrap();
            let content = fs::read(d.join("a")).unwrap();
            assert!(
                content == b"old" || content == b"new value",
                "power lost at step {k}: {content:?}"
            );
            if acked {
                assert_eq!(content, b"new value", "step {k}: acknowledged, then lost");
            }
            seen.push(format!("{k}:{}", String::from_utf8_lossy(&content)));
        }
        println!(
            "recycled write, power lost at each of 6 steps: {}",
            seen.join(", ")
        );
    }

    /// A recycled write swaps the spare with the file it replaces: the name gets the new bytes
    /// in the spare's inode, and the replaced inode, with its bytes, is the spare now, under
    /// the same spare name. No inode is created or freed.
    #[test]
    fn a_recycled_write_exchanges_the_spare_with_the_replaced_file() {
        let d = tempfile::tempdir().unwrap();
        let spares = eager(d.path());
        let none = Faults::none();
        atomic_write_recycling(d.path(), "a", b"one", &none, &spares).unwrap();
        atomic_write_recycling(d.path(), "a", b"two", &none, &spares).unwrap();
        let spare_names = |p: &Path| -> Vec<String> {
            names(p).into_iter().filter(|n| is_spare_name(n)).collect()
        };
        let ino = |n: &str| fs::metadata(d.path().join(n)).unwrap().ino();
        let [spare] = spare_names(d.path()).try_into().unwrap();
        let (spare_ino, target_ino) = (ino(&spare), ino("a"));
        assert_eq!(fs::read(d.path().join(&spare)).unwrap(), b"one");
        atomic_write_recycling(d.path(), "a", b"three", &none, &spares).unwrap();
        assert_eq!(fs::read(d.path().join("a")).unwrap(), b"three");
        assert_eq!(ino("a"), spare_ino, "the name now holds the recycled inode");
        assert_eq!(
            spare_names(d.path()),
            vec![spare.clone()],
            "one spare, the same name"
        );
        assert_eq!(ino(&spare), target_ino, "the replaced inode is the spare");
        assert_eq!(fs::read(d.path().join(&spare)).unwrap(), b"two");
        assert_eq!(spares.len(), 1);
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
