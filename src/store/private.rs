//! Making a store private: which of a store's paths are checked, which are tightened, and
//! what refuses the store.
//!
//! hive creates `credentials/` and `metadata/` with a plain `mkdir` and writes its files with
//! a plain `open`, so under the usual umask 022 its store is 0755 directories and 0644 files.
//! They hold only ciphertext and the key lives elsewhere, so that is no reason to refuse a
//! user's own store: every directory of the store that is ours but lets group or other in is
//! tightened to owner-only, and so is every regular file of ours in it, under the store lock,
//! and the caller reports the one [`PermFixes`] notice. What is unsafe to touch still refuses
//! the store: a symlink, something that is not a directory, another owner (`forbidden`).
//!
//! Files are looked at only when a directory above them was open: inside an owner-only
//! directory nobody else can reach a file, whatever its mode. So a store that is already
//! private costs one `lstat` per directory at open — not one per credential — and hive's own
//! later writes (new 0644 files inside the now-0700 directories) do not bring the notice back
//! on every open.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use super::{Error, Result};
use crate::durable::lock::{self, LockMode};
use crate::durable::perms::{self, Tightened};
use crate::limits::LOCK_TIMEOUT;

/// The subdirectories of a store, in the order they are checked.
const SUBDIRS: [&str; 3] = ["credentials", "metadata", "quarantine"];

/// How many file names one notice lists before it says "and N more".
const NAMED_FILES: usize = 5;

/// What was tightened when a store was opened (or, looking only, what would be): one notice
/// for the user.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PermFixes {
    /// The store's base directory.
    pub base: PathBuf,
    /// Each change, directories first.
    pub changes: Vec<Tightened>,
    /// Whether the changes were made (false: looking only, nothing was changed).
    pub applied: bool,
}

impl PermFixes {
    /// Whether nothing was changed.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    fn relative(&self, p: &Path) -> String {
        match p.strip_prefix(&self.base) {
            Ok(r) if r.as_os_str().is_empty() => ".".into(),
            Ok(r) => r.display().to_string(),
            Err(_) => p.display().to_string(),
        }
    }
}

impl fmt::Display for PermFixes {
    /// `tightened permissions of /x (group or other could read it): directories 0755 → 0700
    /// (., credentials, metadata); files 0644 → 0600 (credentials/a.enc, metadata/index.json)`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.applied {
            write!(
                f,
                "tightened permissions of {} (group or other could reach it; its files are \
                 ciphertext, the key is kept elsewhere):",
                self.base.display()
            )?;
        } else {
            write!(
                f,
                "{} is open to group or other; nothing was changed (looking only), the next \
                 open that may change the store tightens:",
                self.base.display()
            )?;
        }
        // Group by (is_dir, from, to) in order of first appearance.
        let mut groups: Vec<((bool, u32, u32), Vec<String>)> = Vec::new();
        for c in &self.changes {
            let key = (c.dir, c.from, c.to);
            let name = self.relative(&c.path);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, names)) => names.push(name),
                None => groups.push((key, vec![name])),
            }
        }
        for (i, ((dir, from, to), names)) in groups.iter().enumerate() {
            let what = match (dir, names.len()) {
                (true, 1) => "directory".to_string(),
                (true, n) => format!("{n} directories"),
                (false, 1) => "file".to_string(),
                (false, n) => format!("{n} files"),
            };
            let shown = names
                .iter()
                .take(NAMED_FILES)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            let more = names.len().saturating_sub(NAMED_FILES);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            let sep = if i == 0 { " " } else { "; " };
            write!(f, "{sep}{what} {from:04o} → {to:04o} ({shown}{more})")?;
        }
        Ok(())
    }
}

/// Check the store at `base` and make it private (see the module docs). `base` must exist.
/// Refuses (`Error::Unsafe`) a symlink, a non-directory or another owner anywhere in the
/// store's directories; tightens what is ours but too open, holding the store lock
/// (`metadata/index.lock`) while it does when the store has a `metadata/` directory. With
/// `apply` false, changes nothing (takes no lock, creates no lock file) and returns what it
/// would tighten.
pub(super) fn make_private(base: &Path, apply: bool) -> Result<PermFixes> {
    let mut fixes = PermFixes {
        base: base.to_path_buf(),
        changes: Vec::new(),
        applied: apply,
    };
    let mut dirs = vec![base.to_path_buf()];
    dirs.extend(
        SUBDIRS
            .iter()
            .map(|d| base.join(d))
            .filter(|d| fs::symlink_metadata(d).is_ok()),
    );
    let mut open = Vec::new();
    for d in &dirs {
        if perms::is_too_open(d, true)? {
            open.push(d.clone());
        }
    }
    if open.is_empty() {
        return Ok(fixes);
    }
    // The base is ours and not a link (checked above), as is metadata/ if present: taking the
    // lock there creates nothing outside the store. The base goes first so the lock file is
    // never made in a directory others can enter. Looking only takes no lock (and so creates no
    // lock file): it changes nothing a writer could race with.
    if let Some(t) = perms::tighten(base, true, apply)? {
        fixes.changes.push(t);
    }
    let meta = base.join("metadata");
    let _guard = if apply && meta.is_dir() {
        Some(lock::lock(
            &meta.join("index.lock"),
            LockMode::Exclusive,
            LOCK_TIMEOUT,
        )?)
    } else {
        None
    };
    for d in dirs.iter().skip(1) {
        if let Some(t) = perms::tighten(d, true, apply)? {
            fixes.changes.push(t);
        }
    }
    for f in exposed_files(&dirs, &open)? {
        match perms::tighten(&f, false, apply) {
            Ok(Some(t)) => fixes.changes.push(t),
            Ok(None) => {}
            // Gone (a writer replaced or deleted it meanwhile): its replacement is made 0600
            // by holdfast, or is inside a directory that is private now.
            Err(perms::PermError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(perms::PermError::Raced { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(fixes)
}

/// The regular files of ours in every directory that was open (an open base exposed
/// everything below it), sorted. Links and other owners' files are not ours to judge here: the
/// scans deal with them (a link in credentials/ is quarantined there), and they are no reason
/// to refuse the store.
fn exposed_files(dirs: &[PathBuf], open: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let exposed = if open.first() == dirs.first() {
        dirs
    } else {
        open
    };
    let mut files = Vec::new();
    for d in exposed {
        let rd = fs::read_dir(d).map_err(|source| Error::Read {
            path: d.clone(),
            source,
        })?;
        for e in rd.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_file() && std::os::unix::fs::MetadataExt::uid(&m) == perms::euid() {
                files.push(e.path());
            }
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their fixtures (bad modes, symlinks) directly
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    fn hive_like(root: &Path) -> PathBuf {
        let base = root.join("credentials");
        for d in ["", "credentials", "metadata"] {
            let p = base.join(d);
            fs::create_dir_all(&p).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        }
        for f in [
            "credentials/a.enc",
            "credentials/b_c.enc",
            "metadata/index.json",
        ] {
            fs::write(base.join(f), "x").unwrap();
            fs::set_permissions(base.join(f), fs::Permissions::from_mode(0o644)).unwrap();
        }
        base
    }

    #[test]
    fn an_open_store_is_tightened_with_one_notice_naming_every_change() {
        let d = tempfile::tempdir().unwrap();
        let base = hive_like(d.path());
        let fixes = make_private(&base, true).unwrap();
        for p in ["", "credentials", "metadata"] {
            assert_eq!(mode(&base.join(p)), 0o700, "{p}");
        }
        for p in [
            "credentials/a.enc",
            "credentials/b_c.enc",
            "metadata/index.json",
        ] {
            assert_eq!(mode(&base.join(p)), 0o600, "{p}");
        }
        // The lock file was made by the lock, 0600, and is not reported as a change.
        assert_eq!(mode(&base.join("metadata/index.lock")), 0o600);
        let text = fixes.to_string();
        println!("notice: {text}");
        assert!(
            text.contains("3 directories 0755 → 0700 (., credentials, metadata)"),
            "{text}"
        );
        assert!(
            text.contains(
                "3 files 0644 → 0600 (credentials/a.enc, credentials/b_c.enc, metadata/index.json)"
            ),
            "{text}"
        );
        // Private now: the second open changes nothing and says nothing.
        assert!(make_private(&base, true).unwrap().is_empty());
    }

    #[test]
    fn looking_only_changes_nothing_and_says_what_it_would_tighten() {
        let d = tempfile::tempdir().unwrap();
        let base = hive_like(d.path());
        let fixes = make_private(&base, false).unwrap();
        assert!(!fixes.applied);
        assert_eq!(fixes.changes.len(), 6, "{fixes}");
        for p in ["", "credentials", "metadata"] {
            assert_eq!(mode(&base.join(p)), 0o755, "{p}");
        }
        assert_eq!(mode(&base.join("metadata/index.json")), 0o644);
        assert!(
            !base.join("metadata/index.lock").exists(),
            "looking only must not even create the lock file"
        );
        let text = fixes.to_string();
        assert!(text.contains("nothing was changed"), "{text}");
        assert!(text.contains("3 directories 0755 → 0700"), "{text}");
        // Applying afterwards makes exactly the changes announced.
        let applied = make_private(&base, true).unwrap();
        assert_eq!(applied.changes, fixes.changes);
    }

    #[test]
    fn files_inside_private_directories_are_left_alone() {
        let d = tempfile::tempdir().unwrap();
        let base = hive_like(d.path());
        make_private(&base, true).unwrap();
        // hive writes a new credential after the tightening: 0644 inside a 0700 directory.
        fs::write(base.join("credentials/new.enc"), "x").unwrap();
        fs::set_permissions(
            base.join("credentials/new.enc"),
            fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        assert!(make_private(&base, true).unwrap().is_empty());
        // But a directory opened again exposes its files: they are tightened with it.
        fs::set_permissions(base.join("credentials"), fs::Permissions::from_mode(0o750)).unwrap();
        let fixes = make_private(&base, true).unwrap();
        assert_eq!(
            fixes
                .changes
                .iter()
                .map(|t| (fixes.relative(&t.path), t.from, t.to))
                .collect::<Vec<_>>(),
            vec![
                ("credentials".to_string(), 0o750, 0o700),
                ("credentials/new.enc".to_string(), 0o644, 0o600),
            ]
        );
    }

    #[test]
    fn links_and_strangers_refuse_the_store_and_change_nothing() {
        let d = tempfile::tempdir().unwrap();
        let base = hive_like(d.path());
        // credentials/ is a symlink to a directory elsewhere.
        let elsewhere = d.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o755)).unwrap();
        fs::remove_dir_all(base.join("credentials")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, base.join("credentials")).unwrap();
        let err = make_private(&base, true).unwrap_err().to_string();
        assert!(err.contains("is a symlink"), "{err}");
        assert_eq!(mode(&base), 0o755, "nothing is changed before the refusal");
        assert_eq!(mode(&elsewhere), 0o755);

        // A symlinked credential file is not a reason to refuse; it is not followed either.
        fs::remove_file(base.join("credentials")).unwrap();
        fs::create_dir(base.join("credentials")).unwrap();
        let target = d.path().join("target");
        fs::write(&target, "x").unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&target, base.join("credentials/l.enc")).unwrap();
        make_private(&base, true).unwrap();
        assert_eq!(mode(&target), 0o644);

        if perms::euid() == 0 {
            let other = d.path().join("other");
            fs::create_dir(&other).unwrap();
            fs::set_permissions(&other, fs::Permissions::from_mode(0o755)).unwrap();
            rustix::fs::chown(&other, Some(rustix::process::Uid::from_raw(65534)), None).unwrap();
            let err = make_private(&other, true).unwrap_err().to_string();
            assert!(err.contains("owned by uid 65534"), "{err}");
            assert_eq!(fs::metadata(&other).unwrap().mode() & 0o777, 0o755);
        } else {
            eprintln!("SKIPPED: the other-owner case needs root to chown");
        }
    }
}
