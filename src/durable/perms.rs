//! Permission checks for directories and key files holding secrets, and the tightening of a
//! store that is ours but too open.
//!
//! A data directory, store directory or key file must be owned by the user holdfast runs as,
//! must not be a symlink (an attacker-controlled link could redirect writes or reads), and must
//! not be accessible to group or other. The error names the path, what is wrong and the fix.
//!
//! Two policies sit on these checks. Key files (and the data and socket directories holdfast
//! makes itself) are *refused* when too open, as ssh refuses a private key others can read:
//! once a key has been readable, making it private again does not make it secret again. A
//! credential store's directories and files hold only ciphertext, and the tools that make them
//! (hive creates them with a plain `mkdir`, 0755 under umask 022) are not wrong to: those are
//! [`tighten`]ed — group and other bits cleared — and the store is used. Only what is unsafe to
//! touch is refused either way: a symlink, the wrong file type, another owner.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What is unsafe about a path.
#[derive(Debug, thiserror::Error)]
pub enum PermError {
    /// The path is a symlink.
    #[error("{} is a symlink; refusing to follow it (fix: replace it with the real {kind} it points to)", path.display())]
    Symlink {
        /// The path.
        path: PathBuf,
        /// "directory" or "file".
        kind: &'static str,
    },
    /// Not the expected type.
    #[error("{} is not a {kind}", path.display())]
    WrongType {
        /// The path.
        path: PathBuf,
        /// "directory" or "file".
        kind: &'static str,
    },
    /// Group or other have access.
    #[error("{} has mode {mode:04o}, which lets group or other access it (fix: chmod {want:o} {})", path.display(), path.display())]
    Mode {
        /// The path.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// The mode to set.
        want: u32,
    },
    /// Owned by someone else.
    #[error("{} is owned by uid {owner}, not by uid {me} that holdfast runs as (fix: chown {me} {}, or run holdfast as uid {owner})", path.display(), path.display())]
    Owner {
        /// The path.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Our effective uid.
        me: u32,
    },
    /// It was replaced between being checked and being changed (a race with another process).
    #[error("{} changed while its permissions were being tightened; nothing was changed (try again)", path.display())]
    Raced {
        /// The path.
        path: PathBuf,
    },
    /// It could not be inspected or tightened.
    #[error("cannot inspect {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Our effective uid.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A change [`tighten`] made: `path` went from mode `from` to mode `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tightened {
    /// The path.
    pub path: PathBuf,
    /// Its permission bits before.
    pub from: u32,
    /// Its permission bits after (`from` without group and other bits).
    pub to: u32,
    /// Whether it is a directory.
    pub dir: bool,
}

/// The checks every policy shares: `path` exists, is not a symlink, is a directory (or a
/// regular file) and is ours. Returns its metadata.
fn owned(path: &Path, want_dir: bool) -> Result<fs::Metadata, PermError> {
    let kind = if want_dir { "directory" } else { "file" };
    let meta = fs::symlink_metadata(path).map_err(|source| PermError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.file_type().is_symlink() {
        return Err(PermError::Symlink {
            path: path.to_path_buf(),
            kind,
        });
    }
    if (want_dir && !meta.is_dir()) || (!want_dir && !meta.is_file()) {
        return Err(PermError::WrongType {
            path: path.to_path_buf(),
            kind,
        });
    }
    let me = euid();
    if meta.uid() != me {
        return Err(PermError::Owner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            me,
        });
    }
    Ok(meta)
}

fn check(path: &Path, want_dir: bool) -> Result<(), PermError> {
    let meta = owned(path, want_dir)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(PermError::Mode {
            path: path.to_path_buf(),
            mode,
            want: if want_dir { 0o700 } else { 0o600 },
        });
    }
    Ok(())
}

/// Check that `path` is a private directory: ours, not a symlink, no group/other bits.
pub fn check_private_dir(path: &Path) -> Result<(), PermError> {
    check(path, true)
}

/// Check that `path` can hold a private key file: ours, not a symlink, and writable by no one
/// else (ssh's rule for `~/.ssh`). Group and other may list it (0755 passes: hive's
/// `~/.hive/secrets` is often made that way): the key file's own mode keeps its content
/// private, while a directory others could write would let them replace or remove the key.
pub fn check_key_dir(path: &Path) -> Result<(), PermError> {
    let meta = owned(path, true)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(PermError::Mode {
            path: path.to_path_buf(),
            mode,
            want: mode & !0o022,
        });
    }
    Ok(())
}

/// Check that `path` is a private regular file: ours, not a symlink, no group/other bits
/// (0600 and systemd's 0400 both pass).
pub fn check_private_file(path: &Path) -> Result<(), PermError> {
    check(path, false)
}

/// Whether `path` (a directory, or a regular file) is ours but lets group or other in.
/// Refuses, as [`check_private_dir`] does, a symlink, the wrong type or another owner.
pub fn is_too_open(path: &Path, want_dir: bool) -> Result<bool, PermError> {
    Ok(owned(path, want_dir)?.mode() & 0o077 != 0)
}

/// Make `path` private if it is ours but too open: clear its group and other bits (0755 →
/// 0700, 0644 → 0600; the owner's bits are kept). Refuses a symlink, the wrong type or another
/// owner. The change is made with `fchmod` on a descriptor opened with `O_NOFOLLOW` and checked
/// to be the inode inspected, so a path swapped for a link in between cannot redirect it.
/// Returns the change, or `None` if the path was already private. With `apply` false nothing
/// is changed (nothing is even opened): the change it would make is returned.
pub fn tighten(path: &Path, want_dir: bool, apply: bool) -> Result<Option<Tightened>, PermError> {
    use rustix::fs::{Mode, OFlags};
    let meta = owned(path, want_dir)?;
    let from = meta.mode() & 0o7777;
    if from & 0o077 == 0 {
        return Ok(None);
    }
    let change = Tightened {
        path: path.to_path_buf(),
        from,
        to: from & !0o077,
        dir: want_dir,
    };
    if !apply {
        return Ok(Some(change));
    }
    let io = |e: rustix::io::Errno| PermError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    };
    // NONBLOCK: opening cannot hang on a FIFO swapped in; the fstat below then refuses it.
    let mut flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    if want_dir {
        flags |= OFlags::DIRECTORY;
    }
    let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(|e| {
        if e == rustix::io::Errno::LOOP {
            PermError::Raced {
                path: path.to_path_buf(),
            }
        } else {
            io(e)
        }
    })?;
    let st = rustix::fs::fstat(&fd).map_err(io)?;
    if st.st_dev != meta.dev() || st.st_ino != meta.ino() || st.st_uid != meta.uid() {
        return Err(PermError::Raced {
            path: path.to_path_buf(),
        });
    }
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(change.to)).map_err(io)?;
    Ok(Some(change))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn modes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s");
        fs::create_dir(&p).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o700)).unwrap();
        check_private_dir(&p).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o750)).unwrap();
        let msg = check_private_dir(&p).unwrap_err().to_string();
        assert!(
            msg.contains("mode 0750") && msg.contains("chmod 700"),
            "{msg}"
        );
        let f = d.path().join("k");
        fs::write(&f, "x").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        let msg = check_private_file(&f).unwrap_err().to_string();
        assert!(
            msg.contains("mode 0644") && msg.contains("chmod 600"),
            "{msg}"
        );
        fs::set_permissions(&f, fs::Permissions::from_mode(0o400)).unwrap();
        check_private_file(&f).unwrap();
    }

    #[test]
    fn key_dirs_may_be_listed_but_not_written_by_others() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("secrets");
        fs::create_dir(&p).unwrap();
        for ok in [0o700, 0o750, 0o755, 0o711] {
            fs::set_permissions(&p, fs::Permissions::from_mode(ok)).unwrap();
            check_key_dir(&p).unwrap_or_else(|e| panic!("{ok:o}: {e}"));
        }
        for bad in [0o775, 0o757, 0o777, 0o1777] {
            fs::set_permissions(&p, fs::Permissions::from_mode(bad)).unwrap();
            let msg = check_key_dir(&p).unwrap_err().to_string();
            let want = format!("chmod {:o}", bad & !0o022);
            assert!(msg.contains(&want), "{bad:o}: {msg}");
        }
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(matches!(
            check_key_dir(&link),
            Err(PermError::Symlink { .. })
        ));
    }

    #[test]
    fn symlinks_refused() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        fs::create_dir(&real).unwrap();
        fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(
            check_private_dir(&link),
            Err(PermError::Symlink { .. })
        ));
    }

    #[test]
    fn tighten_clears_group_and_other_and_keeps_the_owner_bits() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("s");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let file = dir.join("a.enc");
        fs::write(&file, "x").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();

        assert!(is_too_open(&dir, true).unwrap());
        // Looking only: the change it would make, and nothing changed.
        let would = tighten(&dir, true, false).unwrap().expect("a change");
        assert_eq!((would.from, would.to), (0o755, 0o700));
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o7777, 0o755);
        let t = tighten(&dir, true, true).unwrap().expect("a change");
        assert_eq!(t, would);
        assert_eq!((t.from, t.to), (0o755, 0o700));
        let t = tighten(&file, false, true).unwrap().expect("a change");
        assert_eq!((t.from, t.to), (0o644, 0o600));
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&file), 0o600);
        // Already private: nothing to do.
        assert_eq!(tighten(&dir, true, true).unwrap(), None);
        assert!(!is_too_open(&file, false).unwrap());
        // The owner's bits stay as they were (a read-only file stays read-only).
        fs::set_permissions(&file, fs::Permissions::from_mode(0o444)).unwrap();
        assert_eq!(tighten(&file, false, true).unwrap().unwrap().to, 0o400);
    }

    #[test]
    fn tighten_refuses_links_other_types_and_other_owners() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        fs::create_dir(&real).unwrap();
        fs::set_permissions(&real, fs::Permissions::from_mode(0o755)).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(
            tighten(&link, true, true),
            Err(PermError::Symlink { .. })
        ));
        assert!(matches!(
            is_too_open(&link, true),
            Err(PermError::Symlink { .. })
        ));
        // The link's target was not touched.
        assert_eq!(fs::metadata(&real).unwrap().mode() & 0o777, 0o755);
        let file = d.path().join("f");
        fs::write(&file, "x").unwrap();
        assert!(matches!(
            tighten(&file, true, true),
            Err(PermError::WrongType { .. })
        ));
        if euid() == 0 {
            // Root can make a file another user owns: it must be refused, not chmod-ed.
            rustix::fs::chown(&real, Some(rustix::process::Uid::from_raw(65534)), None).unwrap();
            let msg = tighten(&real, true, true).unwrap_err().to_string();
            assert!(msg.contains("owned by uid 65534"), "{msg}");
            assert_eq!(fs::metadata(&real).unwrap().mode() & 0o777, 0o755);
        } else {
            eprintln!(
                "SKIPPED: the other-owner case needs root to chown (running as uid {})",
                euid()
            );
        }
    }
}
