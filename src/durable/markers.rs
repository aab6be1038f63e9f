//! Marker files: empty files whose *name* records a fact about another entry of the same
//! directory (a credential's generation and a hash of the file it was given to:
//! `store::credentials::generations`). A marker is created or renamed in the directory whose
//! fsync makes the write it belongs to durable, so it costs one `rename` and no fsync of its
//! own; it has no content that could be torn.
//!
//! Names start with [`GEN_MARKER`] (a dot file, which `ls` does not show) and never end with
//! `.enc` (hive's `*.enc` listing does not see them); nothing sweeps them as temp files or
//! spares.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::fault::{Faults, Op};
use super::IoError;

/// Every generation marker's name starts with this.
pub const GEN_MARKER: &str = ".hf-gen-";

/// Whether a directory entry is a generation marker.
pub fn is_gen_marker_name(name: &str) -> bool {
    name.starts_with(GEN_MARKER)
}

/// Make marker `to` exist in `dir`: rename `from` to it when given (one marker per fact), or
/// create it (mode 0600, `O_EXCL|O_NOFOLLOW`; one that exists already is fine). A `from` that
/// is gone is not an error: `to` is created. Not durable until `dir` is fsynced.
pub fn set_marker(
    dir: &Path,
    from: Option<&str>,
    to: &str,
    faults: &Faults,
) -> Result<(), IoError> {
    let target = dir.join(to);
    faults
        .check(Op::Marker)
        .map_err(|e| IoError::new(Op::Marker, &target, e))?;
    if let Some(from) = from.filter(|f| *f != to) {
        match fs::rename(dir.join(from), &target) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(IoError::new(Op::Marker, &target, e)),
        }
    }
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&target)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(IoError::new(Op::Marker, &target, e)),
    }
}

/// Make marker `to` exist in `dir` as another name of marker `like` (a hard link: markers are
/// empty and only their names mean anything), or, if `like` is gone, create it. A new name for
/// an existing inode allocates none: creating a fresh empty file per write and unlinking the
/// previous one made the file system allocate and free an inode per credential write, which
/// (ext4's search past recently deleted inodes) roughly halved the rate of durable sets. Not
/// durable until `dir` is fsynced.
pub fn link_marker(dir: &Path, like: &str, to: &str, faults: &Faults) -> Result<(), IoError> {
    let target = dir.join(to);
    faults
        .check(Op::Marker)
        .map_err(|e| IoError::new(Op::Marker, &target, e))?;
    // Only a regular file of ours is linked (a link to something planted there would not
    // read as a marker).
    if !marker_exists(dir, like) {
        return set_marker(dir, None, to, &Faults::none());
    }
    match fs::hard_link(dir.join(like), &target) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        // Gone (or not a file we can link): a marker of its own.
        Err(_) => set_marker(dir, None, to, &Faults::none()),
    }
}

/// Remove marker `name` from `dir` (not durable until `dir` is fsynced); gone already is fine,
/// and so is a directory planted at its name (not a marker of ours: left alone).
pub fn remove_marker(dir: &Path, name: &str, faults: &Faults) -> Result<(), IoError> {
    let path = dir.join(name);
    faults
        .check(Op::Marker)
        .and_then(|()| match fs::remove_file(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::ISDIR.raw_os_error()) => Ok(()),
            other => other,
        })
        .map_err(|e| IoError::new(Op::Marker, &path, e))
}

/// Whether marker `name` exists in `dir` (an `lstat`).
pub fn marker_exists(dir: &Path, name: &str) -> bool {
    fs::symlink_metadata(dir.join(name)).is_ok_and(|m| m.is_file())
}

/// The names of every generation marker in `dir` (a directory that does not exist has none).
pub fn gen_markers(dir: &Path) -> io::Result<Vec<String>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for e in rd {
        let e = e?;
        if let Some(n) = e.file_name().to_str() {
            if is_gen_marker_name(n) {
                names.push(n.to_owned());
            }
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_renames_or_creates_and_is_idempotent() {
        let d = tempfile::tempdir().unwrap();
        let f = Faults::none();
        set_marker(d.path(), None, ".hf-gen-1-a-x.enc", &f).unwrap();
        set_marker(d.path(), Some(".hf-gen-1-a-x.enc"), ".hf-gen-2-b-x.enc", &f).unwrap();
        assert_eq!(gen_markers(d.path()).unwrap(), vec![".hf-gen-2-b-x.enc"]);
        // A source that is gone: the target is created; the same name twice: nothing.
        set_marker(d.path(), Some(".hf-gen-9-z-x.enc"), ".hf-gen-3-c-x.enc", &f).unwrap();
        set_marker(d.path(), Some(".hf-gen-3-c-x.enc"), ".hf-gen-3-c-x.enc", &f).unwrap();
        let mut names = gen_markers(d.path()).unwrap();
        names.sort();
        assert_eq!(names, vec![".hf-gen-2-b-x.enc", ".hf-gen-3-c-x.enc"]);
        assert!(marker_exists(d.path(), ".hf-gen-3-c-x.enc"));
        remove_marker(d.path(), ".hf-gen-2-b-x.enc", &f).unwrap();
        remove_marker(d.path(), ".hf-gen-2-b-x.enc", &f).unwrap();
        assert!(!marker_exists(d.path(), ".hf-gen-2-b-x.enc"));
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(d.path().join(".hf-gen-3-c-x.enc"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
