//! Paths under the data directory, resolved beneath it and never through a symlink.
//!
//! The data directory is the one path holdfast takes as it is configured (it may sit behind a
//! link its user made, `~/.local/state` on another disk). Every directory the daemon makes or
//! writes below it — `runs/`, `runs/<id>/`, `streams/`, `streams/quarantine/` — is reached
//! from a descriptor of the directory above it ([`Dir`]), by
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` where the kernel has it (Linux 5.6), else
//! by `openat(O_NOFOLLOW | O_DIRECTORY)` one component at a time. Files in such a directory are
//! opened and created `O_NOFOLLOW` relative to its descriptor, renamed with `renameat` inside
//! it, and their directory is fsynced through that same descriptor: once a directory is open,
//! no path is resolved again, so a link planted after the check redirects nothing.
//!
//! A symlink, or anything but a directory, where a directory belongs — and a symlink where one
//! of holdfast's files belongs — is refused with an [`IoError`] whose op is
//! [`Op::UnsafePath`], naming the path and what is there. That is an error of the one request
//! that met it: it is not a failed fsync, so it never poisons a store ([`super::Poison`] only
//! counts fsync steps), and the next request — for this run once the link is gone, for any
//! other run at once — goes through.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::atomic::{is_temp_name, random_hex, temp_prefix, FileStamp, TEMP_MARKER};
use super::fault::{Faults, Op};
use super::IoError;

/// How deep [`Dir::remove_tree`] descends: a run's directory is one level deep; anything
/// deeper than this was not made by holdfast and is refused rather than recursed into without
/// bound.
const MAX_TREE_DEPTH: usize = 16;

/// Set once `openat2` answered that it does not exist here (an old kernel, or a sandbox that
/// filters it): directories are then resolved one `openat` per component.
static OPENAT2_MISSING: AtomicBool = AtomicBool::new(false);

#[cfg(test)]
thread_local! {
    /// Tests resolve with the fallback walk on this thread (both resolvers are tested).
    static FORCE_WALK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether `openat2` is to be tried.
fn try_openat2() -> bool {
    #[cfg(test)]
    if FORCE_WALK.with(std::cell::Cell::get) {
        return false;
    }
    !OPENAT2_MISSING.load(Ordering::Relaxed)
}

/// What a directory entry is (as `lstat` says: a symlink is a symlink, never its target).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// Anything else (a socket, a FIFO, a device).
    Other,
}

impl EntryKind {
    fn of(t: FileType) -> Self {
        match t {
            FileType::RegularFile => EntryKind::File,
            FileType::Directory => EntryKind::Dir,
            FileType::Symlink => EntryKind::Symlink,
            _ => EntryKind::Other,
        }
    }

    fn of_std(t: fs::FileType) -> Self {
        if t.is_symlink() {
            EntryKind::Symlink
        } else if t.is_dir() {
            EntryKind::Dir
        } else if t.is_file() {
            EntryKind::File
        } else {
            EntryKind::Other
        }
    }

    /// How a refusal names it.
    fn describe(self) -> &'static str {
        match self {
            EntryKind::File => "a regular file",
            EntryKind::Dir => "a directory",
            EntryKind::Symlink => "a symbolic link",
            EntryKind::Other => "a special file",
        }
    }
}

/// A file's or directory's metadata, as `lstat` or `fstat` gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// What it is.
    pub kind: EntryKind,
    /// Size in bytes.
    pub len: u64,
    /// Inode number.
    pub ino: u64,
    /// Device number.
    pub dev: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
}

impl Meta {
    // The widths of `stat`'s fields differ between architectures; on some these casts are
    // to the same type.
    #[allow(clippy::unnecessary_cast)]
    fn of_stat(s: &rustix::fs::Stat) -> Self {
        Meta {
            kind: EntryKind::of(FileType::from_raw_mode(s.st_mode as _)),
            len: s.st_size.max(0) as u64,
            ino: s.st_ino as u64,
            dev: s.st_dev as u64,
            mtime_ns: i128::from(s.st_mtime as i64) * 1_000_000_000
                + i128::from(s.st_mtime_nsec as i64),
        }
    }

    /// The same from std's metadata (an open file's).
    pub fn of(m: &fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Meta {
            kind: EntryKind::of_std(m.file_type()),
            len: m.len(),
            ino: m.ino(),
            dev: m.dev(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        }
    }
}

/// One entry of a directory listing.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Its name (entries whose name is not UTF-8 are not listed: holdfast makes none).
    pub name: String,
    /// What it is.
    pub kind: EntryKind,
}

/// A directory held open by descriptor, with the path it was reached by (for messages and
/// the fault seam only: nothing is resolved through it). Clones share the descriptor.
#[derive(Clone, Debug)]
pub struct Dir {
    fd: Arc<OwnedFd>,
    path: PathBuf,
}

/// Whether `c` names one entry of a directory (not empty, `.`, `..`, nor with a `/`).
fn is_component(c: &str) -> bool {
    !c.is_empty() && c != "." && c != ".." && !c.contains('/') && !c.contains('\0')
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

fn errno_of(e: &io::Error) -> Option<Errno> {
    e.raw_os_error().map(Errno::from_raw_os_error)
}

impl Dir {
    /// Open the directory `path` as it is configured (the data directory): symlinks in `path`
    /// itself are the user's to make. Everything below it is resolved beneath it.
    pub fn open_root(path: &Path) -> Result<Dir, IoError> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| IoError::new(Op::Open, path, e.into()))?;
        Ok(Dir {
            fd: Arc::new(fd),
            path: path.to_path_buf(),
        })
    }

    /// The path this directory was reached by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn below(&self, rel: &[&str]) -> PathBuf {
        let mut p = self.path.clone();
        p.extend(rel);
        p
    }

    /// The refusal of `name` in this directory: `what` is there, where `want` belongs.
    fn refuse(&self, name: &str, what: &str, want: &str) -> IoError {
        IoError::new(
            Op::UnsafePath,
            self.path.join(name),
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{what} where holdfast keeps {want}; it never follows a link or writes \
                     through one under its data directory (fix: remove it)"
                ),
            ),
        )
    }

    /// What a failed step on `name` means: a symlink or a non-directory in the way (or no
    /// permission to pass) is a refused path; anything else is `op`'s own failure.
    fn step_error(&self, op: Op, name: &str, want: &str, e: io::Error) -> IoError {
        match errno_of(&e) {
            Some(Errno::LOOP | Errno::NOTDIR | Errno::XDEV | Errno::ISDIR) => {
                let what = self
                    .stat(name)
                    .ok()
                    .flatten()
                    .map_or("something else", |m| m.kind.describe());
                self.refuse(name, what, want)
            }
            Some(Errno::ACCESS) => IoError::new(
                Op::UnsafePath,
                self.path.join(name),
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("permission denied where holdfast keeps {want} (fix: chmod u+rwx)"),
                ),
            ),
            _ => IoError::new(op, self.path.join(name), e),
        }
    }

    /// The refusal of entry `name`, found to be `kind` where `want` (`a file`, `a
    /// directory`) belongs.
    pub fn refusal(&self, name: &str, kind: EntryKind, want: &str) -> IoError {
        self.refuse(name, kind.describe(), want)
    }

    /// What a failed step on file `name` means (see [`Dir::open_own_file`]).
    pub(crate) fn file_error(&self, op: Op, name: &str, e: io::Error) -> IoError {
        self.step_error(op, name, "a file", e)
    }

    fn check_components(&self, rel: &[&str]) -> Result<(), IoError> {
        match rel.iter().find(|c| !is_component(c)) {
            None => Ok(()),
            Some(bad) => Err(IoError::new(
                Op::UnsafePath,
                self.below(rel),
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{bad:?} is not a single path component"),
                ),
            )),
        }
    }

    /// The existing directory `rel` (components) beneath this one, reached without following
    /// a symlink; `None` if a component is missing.
    pub fn open_dir(&self, rel: &[&str]) -> Result<Option<Dir>, IoError> {
        self.check_components(rel)?;
        if rel.is_empty() {
            return Ok(Some(self.clone()));
        }
        if try_openat2() {
            let how =
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
            match rustix::fs::openat2(&*self.fd, rel.join("/"), DIR_FLAGS, Mode::empty(), how) {
                Ok(fd) => {
                    return Ok(Some(Dir {
                        fd: Arc::new(fd),
                        path: self.below(rel),
                    }))
                }
                Err(Errno::NOENT) => return Ok(None),
                // Not there (ENOSYS), or filtered by a sandbox (EPERM: openat2 itself has
                // no other reason to give it for a directory opened read-only).
                Err(Errno::NOSYS | Errno::PERM) => OPENAT2_MISSING.store(true, Ordering::Relaxed),
                // Refused, or a rename raced the lookup (EAGAIN): the walk says which
                // component and why.
                Err(_) => {}
            }
        }
        self.walk(rel, None)
    }

    /// The directory `rel` beneath this one, each missing component made (0700, its parent
    /// fsynced after it, as [`super::create_private_dir`] does), none reached through a
    /// symlink.
    pub fn create_dirs(&self, rel: &[&str], faults: &Faults) -> Result<Dir, IoError> {
        if let Some(d) = self.open_dir(rel)? {
            return Ok(d);
        }
        match self.walk(rel, Some(faults))? {
            Some(d) => Ok(d),
            None => Err(IoError::new(
                Op::CreateDir,
                self.below(rel),
                io::Error::from(io::ErrorKind::NotFound),
            )),
        }
    }

    /// Resolve `rel` one `openat(O_NOFOLLOW | O_DIRECTORY)` at a time; with `create`, make
    /// the components that are missing.
    fn walk(&self, rel: &[&str], create: Option<&Faults>) -> Result<Option<Dir>, IoError> {
        let mut cur = self.clone();
        for c in rel {
            let opened = match rustix::fs::openat(&*cur.fd, *c, DIR_FLAGS, Mode::empty()) {
                Err(Errno::NOENT) => match create {
                    None => return Ok(None),
                    Some(faults) => {
                        cur.make_dir(c, faults)?;
                        rustix::fs::openat(&*cur.fd, *c, DIR_FLAGS, Mode::empty())
                    }
                },
                other => other,
            };
            let fd = opened.map_err(|e| cur.step_error(Op::Open, c, "a directory", e.into()))?;
            cur = Dir {
                fd: Arc::new(fd),
                path: cur.path.join(c),
            };
        }
        Ok(Some(cur))
    }

    /// `mkdirat(name, 0700)`, then fsync this directory so the entry survives a crash. One
    /// that appeared meanwhile is left to the caller's `openat` to judge.
    fn make_dir(&self, name: &str, faults: &Faults) -> Result<(), IoError> {
        let made = faults.check(Op::CreateDir).and_then(|()| {
            match rustix::fs::mkdirat(&*self.fd, name, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(Errno::EXIST) => Ok(()),
                Err(e) => Err(e.into()),
            }
        });
        made.map_err(|e| self.step_error(Op::CreateDir, name, "a directory", e))?;
        self.fsync(faults)
    }

    /// fsync this directory (through its descriptor), making creations, renames and unlinks
    /// in it durable. A failure here is a failed fsync: callers poison their store on it.
    pub fn fsync(&self, faults: &Faults) -> Result<(), IoError> {
        faults
            .check(Op::FsyncDir)
            .and_then(|()| rustix::fs::fsync(&*self.fd).map_err(io::Error::from))
            .map_err(|e| IoError::new(Op::FsyncDir, &self.path, e))?;
        faults.synced_dir(&self.path);
        Ok(())
    }

    /// `lstat` of `name` in this directory; `None` if there is no such entry.
    pub fn stat(&self, name: &str) -> io::Result<Option<Meta>> {
        match rustix::fs::statat(&*self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(s) => Ok(Some(Meta::of_stat(&s))),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// `fstat` of this directory.
    pub fn meta(&self) -> io::Result<Meta> {
        rustix::fs::fstat(&*self.fd)
            .map(|s| Meta::of_stat(&s))
            .map_err(io::Error::from)
    }

    /// The entries of this directory (not `.` and `..`), each with what `lstat` says it is.
    pub fn entries(&self) -> io::Result<Vec<Entry>> {
        let mut list = rustix::fs::Dir::read_from(&*self.fd)?;
        let mut out = Vec::new();
        while let Some(e) = list.read() {
            let e = e?;
            let Ok(name) = e.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let kind = match e.file_type() {
                FileType::Unknown => match self.stat(name)? {
                    Some(m) => m.kind,
                    None => continue,
                },
                t => EntryKind::of(t),
            };
            out.push(Entry {
                name: name.to_owned(),
                kind,
            });
        }
        Ok(out)
    }

    /// Open `name` in this directory with `flags` (`O_NOFOLLOW`, `O_CLOEXEC` and `O_NONBLOCK`
    /// added: a FIFO planted where a file belongs never makes the open wait for a peer;
    /// created with `mode` if `flags` has `O_CREAT`).
    pub(crate) fn open_file(&self, name: &str, flags: OFlags, mode: u32) -> io::Result<File> {
        rustix::fs::openat(
            &*self.fd,
            name,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::from_raw_mode(mode),
        )
        .map(File::from)
        .map_err(io::Error::from)
    }

    /// [`Dir::open_file`] for a file holdfast keeps: a symlink (or a directory) there is a
    /// refused path, any other failure `op`'s.
    pub(crate) fn open_own_file(
        &self,
        op: Op,
        name: &str,
        flags: OFlags,
        mode: u32,
    ) -> Result<File, IoError> {
        self.open_file(name, flags, mode)
            .map_err(|e| self.step_error(op, name, "a file", e))
    }

    /// The lock file `name` (created 0600 if missing, never through a symlink), to be locked
    /// with [`super::lock::lock_file`].
    pub fn open_lock_file(&self, name: &str) -> Result<File, IoError> {
        self.open_own_file(Op::Open, name, OFlags::RDWR | OFlags::CREATE, 0o600)
    }

    /// Read regular file `name` (never through a symlink), refusing one larger than `cap`
    /// bytes; `None` if it does not exist.
    pub fn read_capped(&self, name: &str, cap: u64) -> Result<Option<Vec<u8>>, IoError> {
        let file = match self.open_file(name, OFlags::RDONLY, 0) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.step_error(Op::Read, name, "a file", e)),
        };
        // Something other than a file where holdfast keeps one (a FIFO, a socket, a device, a
        // directory) is a refused path, like a link: `forbidden`, this request only.
        match file.metadata() {
            Ok(meta) if !meta.is_file() => {
                let t = meta.file_type();
                let kind = if t.is_dir() {
                    EntryKind::Dir
                } else {
                    EntryKind::Other
                };
                return Err(self.refusal(name, kind, "a file"));
            }
            Ok(_) => {}
            Err(e) => return Err(IoError::new(Op::Read, self.path.join(name), e)),
        }
        let read = |file: File| -> io::Result<Vec<u8>> {
            let meta = file.metadata()?;
            let mut buf = Vec::with_capacity(meta.len().min(cap).min(1 << 24) as usize);
            file.take(cap.saturating_add(1)).read_to_end(&mut buf)?;
            if buf.len() as u64 > cap {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("larger than the {cap}-byte limit"),
                ));
            }
            Ok(buf)
        };
        read(file)
            .map(Some)
            .map_err(|e| IoError::new(Op::Read, self.path.join(name), e))
    }

    /// Replace `name` with `bytes` atomically and durably: temp file (`O_CREAT|O_EXCL|
    /// O_NOFOLLOW`, 0600) → write → fsync → `renameat` over `name` → fsync of this directory,
    /// the steps (and the crash behaviour after each) of [`super::atomic_write`]. A symlink
    /// or directory at `name` is refused before anything is written (a rename would replace a
    /// link, never follow it: the check is for the message, the rename for the safety).
    pub fn atomic_write(
        &self,
        name: &str,
        bytes: &[u8],
        faults: &Faults,
    ) -> Result<FileStamp, IoError> {
        if !is_component(name) {
            return Err(self.refuse(name, "a name that is not one component", "a file"));
        }
        if let Ok(Some(m)) = self.stat(name) {
            if matches!(
                m.kind,
                EntryKind::Symlink | EntryKind::Dir | EntryKind::Other
            ) {
                return Err(self.refuse(name, m.kind.describe(), "a file"));
            }
        }
        let tmp = format!("{}{TEMP_MARKER}{}", temp_prefix(name), random_hex());
        let tmp_path = self.path.join(&tmp);
        faults
            .check(Op::CreateTemp)
            .map_err(|e| IoError::new(Op::CreateTemp, self.path.join(name), e))?;
        let mut file = self.open_own_file(
            Op::CreateTemp,
            &tmp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            0o600,
        )?;
        let written = (|| -> Result<FileStamp, IoError> {
            faults
                .check(Op::WriteTemp)
                .and_then(|()| file.write_all(bytes))
                .map_err(|e| IoError::new(Op::WriteTemp, &tmp_path, e))?;
            faults
                .check(Op::FsyncFile)
                .and_then(|()| file.sync_all())
                .map_err(|e| IoError::new(Op::FsyncFile, &tmp_path, e))?;
            faults.synced_file(&tmp_path);
            // fstat, not a write step: its failure is not an fsync failure.
            let stamp = file
                .metadata()
                .map(|m| FileStamp::of(&m))
                .map_err(|e| IoError::new(Op::WriteTemp, &tmp_path, e))?;
            faults
                .check(Op::Rename)
                .and_then(|()| {
                    rustix::fs::renameat(&*self.fd, tmp.as_str(), &*self.fd, name)
                        .map_err(io::Error::from)
                })
                .map_err(|e| self.step_error(Op::Rename, name, "a file", e))?;
            Ok(stamp)
        })();
        drop(file);
        let stamp = match written {
            Ok(stamp) => stamp,
            Err(err) => {
                // A live process removes its temp file; a crashed one cannot (the seam
                // refuses): the sweep of the next open does.
                if !err.is_injected_crash() {
                    let _ = self.remove_temp(&tmp, faults);
                }
                return Err(err);
            }
        };
        self.fsync(faults)?;
        Ok(stamp)
    }

    fn remove_temp(&self, name: &str, faults: &Faults) -> Result<(), IoError> {
        faults
            .check(Op::RemoveTemp)
            .and_then(|()| {
                rustix::fs::unlinkat(&*self.fd, name, AtFlags::empty()).map_err(io::Error::from)
            })
            .map_err(|e| IoError::new(Op::RemoveTemp, self.path.join(name), e))
    }

    /// Unlink file `name` and fsync this directory; whether it existed. A symlink (or a
    /// directory) at `name` is refused and left as it is: unlinking a link would not follow
    /// it, but what holdfast finds where its file belongs is reported, never acted on.
    pub fn remove_file(&self, name: &str, faults: &Faults) -> Result<bool, IoError> {
        if !is_component(name) {
            return Err(self.refuse(name, "a name that is not one component", "a file"));
        }
        if let Ok(Some(m)) = self.stat(name) {
            if m.kind != EntryKind::File {
                return Err(self.refuse(name, m.kind.describe(), "a file"));
            }
        }
        let existed = match faults.check(Op::Unlink).and_then(|()| {
            rustix::fs::unlinkat(&*self.fd, name, AtFlags::empty()).map_err(io::Error::from)
        }) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(self.step_error(Op::Unlink, name, "a file", e)),
        };
        if existed {
            self.fsync(faults)?;
        }
        Ok(existed)
    }

    /// Remove the directory `name` and everything in it, then fsync this directory; whether
    /// it existed. `name` must be one component (a run id). Nothing outside it can be
    /// touched: each directory below is opened `O_NOFOLLOW` from its parent's descriptor, a
    /// symlink inside is unlinked itself (its target is never visited), and a symlink or
    /// file at `name` is refused, not removed.
    pub fn remove_tree(&self, name: &str, faults: &Faults) -> Result<bool, IoError> {
        if !is_component(name) {
            return Err(self.refuse(name, "a name that is not one component", "a directory"));
        }
        faults
            .check(Op::RemoveTree)
            .map_err(|e| IoError::new(Op::RemoveTree, self.path.join(name), e))?;
        let Some(tree) = self.walk(&[name], None)? else {
            return Ok(false);
        };
        tree.empty_out(0)?;
        match rustix::fs::unlinkat(&*self.fd, name, AtFlags::REMOVEDIR) {
            Ok(()) => {}
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(IoError::new(Op::RemoveTree, self.path.join(name), e.into())),
        }
        self.fsync(faults)?;
        Ok(true)
    }

    /// Remove everything in this directory, depth first, never following a link.
    fn empty_out(&self, depth: usize) -> Result<(), IoError> {
        let fail = |name: &str, e: io::Error| IoError::new(Op::RemoveTree, self.path.join(name), e);
        if depth >= MAX_TREE_DEPTH {
            return Err(fail(
                "",
                io::Error::other(format!("nested deeper than {MAX_TREE_DEPTH} directories")),
            ));
        }
        for e in self.entries().map_err(|e| fail("", e))? {
            if e.kind == EntryKind::Dir {
                // Swapped for a link since the listing: the open refuses it, and the link is
                // unlinked below as a file.
                if let Ok(Some(sub)) = self.walk(&[&e.name], None) {
                    sub.empty_out(depth + 1)?;
                    match rustix::fs::unlinkat(&*self.fd, e.name.as_str(), AtFlags::REMOVEDIR) {
                        Ok(()) | Err(Errno::NOENT) => continue,
                        Err(err) => return Err(fail(&e.name, err.into())),
                    }
                }
            }
            match rustix::fs::unlinkat(&*self.fd, e.name.as_str(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(err) => return Err(fail(&e.name, err.into())),
            }
        }
        Ok(())
    }

    /// Remove the temp files [`Dir::atomic_write`] leaves when it is killed while replacing
    /// one of `names` (`.<name>.hf-tmp-<hex>`), and nothing else; the caller holds the lock
    /// every writer of those names takes. How many it removed.
    pub fn sweep_temps_of(&self, names: &[&str], faults: &Faults) -> Result<usize, IoError> {
        let entries = self
            .entries()
            .map_err(|e| IoError::new(Op::RemoveTemp, &self.path, e))?;
        let mut removed = 0;
        for e in entries {
            let ours = names.iter().any(|n| {
                e.name
                    .strip_prefix(temp_prefix(n).as_str())
                    .is_some_and(|rest| rest.starts_with(TEMP_MARKER))
            });
            if ours {
                self.remove_temp(&e.name, faults)?;
                removed += 1;
            }
        }
        if removed > 0 {
            self.fsync(faults)?;
        }
        Ok(removed)
    }

    /// Remove every temp file (a name with [`TEMP_MARKER`]) in this directory; the caller
    /// holds the lock every writer of it takes. The names removed.
    pub fn sweep_temp_files(&self, faults: &Faults) -> Result<Vec<String>, IoError> {
        let entries = self
            .entries()
            .map_err(|e| IoError::new(Op::RemoveTemp, &self.path, e))?;
        let mut removed = Vec::new();
        for e in entries {
            if is_temp_name(&e.name) {
                self.remove_temp(&e.name, faults)?;
                removed.push(e.name);
            }
        }
        if !removed.is_empty() {
            self.fsync(faults)?;
        }
        Ok(removed)
    }

    /// Create `name` (0600, `O_EXCL`, never through a symlink) holding `bytes`, not synced: a
    /// copy kept for inspection (a quarantined segment), not a write anything depends on.
    pub fn write_new(&self, name: &str, bytes: &[u8]) -> Result<(), IoError> {
        let mut f = self.open_own_file(
            Op::CreateTemp,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            0o600,
        )?;
        f.write_all(bytes)
            .map_err(|e| IoError::new(Op::WriteTemp, self.path.join(name), e))
    }

    /// Rename `from` to `to`, both in this directory (no fault-seam step of its own: callers
    /// ask the seam for [`Op::Rename`] first).
    pub(crate) fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        rustix::fs::renameat(&*self.fd, from, &*self.fd, to).map_err(io::Error::from)
    }

    /// Unlink file `name` in this directory, with no fsync (callers fsync once for many).
    pub(crate) fn unlink(&self, name: &str) -> io::Result<()> {
        rustix::fs::unlinkat(&*self.fd, name, AtFlags::empty()).map_err(io::Error::from)
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A directory holdfast owns below a root it was given: `<root>/<name>` (the data directory's
/// `runs/`, `streams/`). The root is opened as configured; the directory and every path below
/// it are resolved beneath the root on each use, so a link planted at `<root>/<name>` while
/// the daemon runs is refused too.
#[derive(Clone, Debug)]
pub struct Owned {
    root: Dir,
    name: String,
}

impl Owned {
    /// `dir` as `<its parent>/<its last component>`: the parent is the root. A `dir` with no
    /// parent or no plain last component is refused.
    pub fn new(dir: &Path) -> Result<Owned, IoError> {
        let bad = || {
            IoError::new(
                Op::UnsafePath,
                dir,
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "needs a parent directory and a plain last component",
                ),
            )
        };
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| is_component(n))
            .ok_or_else(bad)?;
        let parent = match dir.parent() {
            Some(p) if p.as_os_str().is_empty() => Path::new("."),
            Some(p) => p,
            None => return Err(bad()),
        };
        Ok(Owned {
            root: Dir::open_root(parent)?,
            name: name.to_owned(),
        })
    }

    /// [`Owned::new`], the root made first if it is missing (0700, as configured: with
    /// [`super::create_private_dir`]), then `<root>/<name>` made beneath it; returns both.
    pub fn make(dir: &Path, faults: &Faults) -> Result<(Owned, Dir), IoError> {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            super::create_private_dir(parent, faults)?;
        }
        let owned = Owned::new(dir)?;
        let made = owned.create(&[], faults)?;
        Ok((owned, made))
    }

    /// `<root>/<name>`.
    pub fn path(&self) -> PathBuf {
        self.root.path.join(&self.name)
    }

    /// The directory `<name>/<rel…>`, if it exists (refused if a link or a non-directory is
    /// in the way).
    pub fn open(&self, rel: &[&str]) -> Result<Option<Dir>, IoError> {
        self.root.open_dir(&self.with_name(rel))
    }

    /// The directory `<name>/<rel…>`, made (0700, parents fsynced) where missing.
    pub fn create(&self, rel: &[&str], faults: &Faults) -> Result<Dir, IoError> {
        self.root.create_dirs(&self.with_name(rel), faults)
    }

    fn with_name<'a>(&'a self, rel: &[&'a str]) -> Vec<&'a str> {
        let mut all = Vec::with_capacity(rel.len() + 1);
        all.push(self.name.as_str());
        all.extend_from_slice(rel);
        all
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests build their fixtures directly
mod tests {
    use super::*;
    use crate::durable::{FaultMode, Poison};
    use std::os::unix::fs::symlink;

    /// A data dir with an `outside` sibling that nothing may touch.
    struct Fixture {
        _t: tempfile::TempDir,
        data: PathBuf,
        outside: PathBuf,
    }

    fn fixture() -> Fixture {
        let t = tempfile::tempdir().unwrap();
        let data = t.path().join("data");
        let outside = t.path().join("outside");
        fs::create_dir(&data).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep"), b"untouched").unwrap();
        Fixture {
            data,
            outside,
            _t: t,
        }
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn assert_untouched(f: &Fixture) {
        assert_eq!(listing(&f.outside), vec!["keep"]);
        assert_eq!(fs::read(f.outside.join("keep")).unwrap(), b"untouched");
    }

    /// Both resolvers: `openat2`, and the walk it falls back to.
    fn both(test: impl Fn()) {
        test();
        FORCE_WALK.with(|f| f.set(true));
        test();
        FORCE_WALK.with(|f| f.set(false));
    }

    #[test]
    fn creates_missing_dirs_private_and_reopens_existing_ones() {
        both(|| {
            let f = fixture();
            let runs = Owned::new(&f.data.join("runs")).unwrap();
            let rec = Faults::recorder();
            let d = runs.create(&["r1"], &rec).unwrap();
            assert_eq!(d.path(), f.data.join("runs/r1"));
            assert_eq!(
                rec.log(),
                vec![Op::CreateDir, Op::FsyncDir, Op::CreateDir, Op::FsyncDir]
            );
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(f.data.join("runs/r1"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700);
            let rec = Faults::recorder();
            runs.create(&["r1"], &rec).unwrap();
            assert!(rec.log().is_empty(), "an existing directory costs no step");
            assert!(runs.open(&["r2"]).unwrap().is_none());
            fs::remove_dir_all(f.data.join("runs")).unwrap();
        });
        println!(
            "resolvers tested: {}the per-component openat walk",
            if OPENAT2_MISSING.load(Ordering::Relaxed) {
                "(openat2 unavailable here) "
            } else {
                "openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) and "
            }
        );
    }

    /// A link at every level — the owned directory itself, a directory below it — is refused
    /// by open and by create, naming the path; nothing is made outside.
    #[test]
    fn a_link_at_any_level_is_refused_and_nothing_is_made_outside() {
        both(|| {
            let f = fixture();
            let runs_path = f.data.join("runs");
            symlink(&f.outside, &runs_path).unwrap();
            let runs = Owned::new(&runs_path).unwrap();
            for e in [
                runs.create(&["r1"], &Faults::none()).unwrap_err(),
                runs.open(&["r1"]).unwrap_err(),
            ] {
                assert_eq!(e.op, Op::UnsafePath, "{e}");
                assert!(e.is_unsafe_path() && !e.is_fsync());
                assert_eq!(e.path, runs_path, "{e}");
                assert!(e.to_string().contains("a symbolic link"), "{e}");
            }
            fs::remove_file(&runs_path).unwrap();
            fs::create_dir(&runs_path).unwrap();
            symlink(&f.outside, runs_path.join("r1")).unwrap();
            let e = runs.create(&["r1"], &Faults::none()).unwrap_err();
            assert_eq!(e.path, runs_path.join("r1"), "{e}");
            assert!(e.is_unsafe_path(), "{e}");
            // A file where a directory belongs.
            fs::write(runs_path.join("r2"), b"x").unwrap();
            let e = runs.create(&["r2"], &Faults::none()).unwrap_err();
            assert!(e.to_string().contains("a regular file"), "{e}");
            assert_untouched(&f);
            fs::remove_dir_all(&runs_path).unwrap();
        });
    }

    #[test]
    fn components_that_escape_are_refused() {
        let f = fixture();
        let root = Dir::open_root(&f.data).unwrap();
        for bad in [&[".."][..], &["a/b"], &[""], &["."], &["ok", ".."]] {
            let e = root.create_dirs(bad, &Faults::none()).unwrap_err();
            assert!(e.is_unsafe_path(), "{bad:?}: {e}");
        }
        assert!(listing(&f.data).is_empty());
        assert_untouched(&f);
    }

    /// The replacement never writes through a link at the target, refuses it with a clear
    /// message, and takes the documented steps in order otherwise.
    #[test]
    fn atomic_write_refuses_a_link_at_the_target_and_keeps_the_steps() {
        let f = fixture();
        let d = Dir::open_root(&f.data).unwrap();
        let rec = Faults::recorder();
        d.atomic_write("state", b"one", &rec).unwrap();
        assert_eq!(
            rec.log(),
            vec![
                Op::CreateTemp,
                Op::WriteTemp,
                Op::FsyncFile,
                Op::Rename,
                Op::FsyncDir
            ]
        );
        assert_eq!(fs::read(f.data.join("state")).unwrap(), b"one");
        symlink(f.outside.join("keep"), f.data.join("checkpoint")).unwrap();
        let e = d
            .atomic_write("checkpoint", b"two", &Faults::none())
            .unwrap_err();
        assert!(e.is_unsafe_path(), "{e}");
        assert!(e.to_string().contains("checkpoint: a symbolic link"), "{e}");
        assert_eq!(
            listing(&f.data),
            vec!["checkpoint", "state"],
            "no temp left"
        );
        assert_untouched(&f);
    }

    #[test]
    fn a_failed_step_removes_the_temp_and_only_a_failed_fsync_is_an_fsync() {
        for k in 1..=5 {
            let f = fixture();
            let d = Dir::open_root(&f.data).unwrap();
            d.atomic_write("a", b"old", &Faults::none()).unwrap();
            let e = d
                .atomic_write("a", b"new", &Faults::at_step(k, FaultMode::FailOnce(5)))
                .unwrap_err();
            assert_eq!(e.is_fsync(), k == 3 || k == 5, "step {k}: {e}");
            assert_eq!(listing(&f.data), vec!["a"], "step {k}");
        }
    }

    #[test]
    fn remove_tree_never_leaves_the_tree() {
        both(|| {
            let f = fixture();
            let root = Dir::open_root(&f.data).unwrap();
            let run = root
                .create_dirs(&["runs", "r1", "sub"], &Faults::none())
                .unwrap();
            fs::write(run.path().join("f"), b"1").unwrap();
            fs::write(f.data.join("runs/r1/state"), b"s").unwrap();
            // Links inside the tree, to a directory and to a file outside.
            symlink(&f.outside, f.data.join("runs/r1/to_dir")).unwrap();
            symlink(f.outside.join("keep"), f.data.join("runs/r1/sub/to_file")).unwrap();
            let runs = root.open_dir(&["runs"]).unwrap().unwrap();
            assert!(runs.remove_tree("r1", &Faults::none()).unwrap());
            assert!(listing(&f.data.join("runs")).is_empty());
            assert!(!runs.remove_tree("r1", &Faults::none()).unwrap());
            // A link at the tree's own name is refused, not followed, not removed.
            symlink(&f.outside, f.data.join("runs/r2")).unwrap();
            let e = runs.remove_tree("r2", &Faults::none()).unwrap_err();
            assert!(e.is_unsafe_path(), "{e}");
            assert!(fs::symlink_metadata(f.data.join("runs/r2")).is_ok());
            for bad in ["", ".", "..", "a/b"] {
                assert!(runs.remove_tree(bad, &Faults::none()).is_err(), "{bad:?}");
            }
            assert_untouched(&f);
            fs::remove_dir_all(f.data.join("runs")).unwrap();
        });
    }

    #[test]
    fn reads_and_locks_refuse_links() {
        let f = fixture();
        let d = Dir::open_root(&f.data).unwrap();
        symlink(f.outside.join("keep"), f.data.join("link")).unwrap();
        assert!(d.read_capped("link", 100).unwrap_err().is_unsafe_path());
        assert!(d.open_lock_file("link").unwrap_err().is_unsafe_path());
        assert!(d.read_capped("missing", 100).unwrap().is_none());
        fs::write(f.data.join("big"), [b'x'; 11]).unwrap();
        assert_eq!(d.read_capped("big", 11).unwrap().unwrap().len(), 11);
        assert!(!d.read_capped("big", 10).unwrap_err().is_unsafe_path());
        let kinds: Vec<(String, EntryKind)> = {
            let mut v: Vec<_> = d
                .entries()
                .unwrap()
                .into_iter()
                .map(|e| (e.name, e.kind))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        assert_eq!(
            kinds,
            vec![
                ("big".into(), EntryKind::File),
                ("link".into(), EntryKind::Symlink)
            ]
        );
        assert_untouched(&f);
    }

    /// A refused path is noted by the poison rule and ignored: only a failed fsync poisons.
    #[test]
    fn a_refused_path_does_not_poison() {
        let f = fixture();
        let poison = Poison::default();
        symlink(&f.outside, f.data.join("runs")).unwrap();
        let runs = Owned::new(&f.data.join("runs")).unwrap();
        let e = poison
            .watch(runs.create(&["r"], &Faults::none()))
            .unwrap_err();
        assert!(e.is_unsafe_path());
        assert!(poison.reason().is_none(), "{e}");
        // A path error at an fsync step's open is not an fsync failure either.
        let e = crate::durable::fsync_dir(&f.data.join("runs"), &Faults::none()).unwrap_err();
        poison.note(&e);
        assert!(!e.is_fsync(), "{e}");
        assert!(poison.reason().is_none(), "{e}");
        assert_untouched(&f);
    }
}
