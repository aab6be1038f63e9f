//! Permission checks for directories and key files holding secrets.
//!
//! A data directory, store directory or key file must be owned by the user holdfast runs as,
//! must not be a symlink (an attacker-controlled link could redirect writes or reads), and must
//! not be accessible to group or other. The error names the path, what is wrong and the fix.

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
    /// It could not be inspected.
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

fn check(path: &Path, want_dir: bool) -> Result<(), PermError> {
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

/// Check that `path` is a private regular file: ours, not a symlink, no group/other bits
/// (0600 and systemd's 0400 both pass).
pub fn check_private_file(path: &Path) -> Result<(), PermError> {
    check(path, false)
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
}
