//! Which store a key file belongs to: `<key file>.store`, beside it, names the store
//! directory that owns the key (its canonical path, and its device and inode).
//!
//! Two directories can come to read one key file: a data dir copied with `cp -a` (its identity
//! names the original's key file), a copy whose original was then moved, a second store given
//! the default store's key with `--key-file` or `[stores.NAME] key_file`. A prune in one of them
//! proves only that *its* files no longer need an archived key — and would retire a key the
//! other's files need (an independent tester sealed stores all three ways). So a key file has
//! one owner: the first store to use it for writing claims it, and
//!
//! - the owner is recognised by the inode of its directory, not its path: a store moved with
//!   `mv`, or reached through a bind mount or another path, is still the owner;
//! - a claim whose directory no longer exists at its recorded path with its recorded inode is
//!   stale — but stale is not gone: the owner may have been moved (`mv`, same inode, a path the
//!   claim does not know) with a copy now at its old path or elsewhere. A store whose key
//!   holdfast keeps takes a key file of its own then, as from a live owner (a copy of the key
//!   file is harmless; a prune by the wrong store sealed the moved owner: an independent
//!   tester's `mv d d.old; cp -a d.old d; key rotate; key prune`); a store given the key file
//!   explicitly claims it (it has no other key file to go to);
//! - a store that finds the key file owned by another live store is not its owner: a store whose
//!   key holdfast keeps takes an identity and a key file of its own (a copy: `keyring.rs`); a
//!   store given the key file explicitly keeps using it, but may not prune its archive.
//!
//! hive's own key file (`$HIVE_HOME/secrets/credential_key`) belongs to hive's store
//! directory, claimed or not ([`hive_owner`]).
//!
//! The claim holds no secret. A claim written by two stores at the same instant (their first
//! writable opens racing) ends with one of them: the other sees it on its next open.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::durable::{self, Faults, IoError};

/// Claim files are tiny.
const MAX_CLAIM_BYTES: u64 = 4096;

#[derive(Serialize, Deserialize)]
struct ClaimDoc {
    format: u32,
    path: PathBuf,
    dev: u64,
    ino: u64,
    /// The key file it was written for: a claim copied along with its key file (a key
    /// directory restored elsewhere) names another one, and is stale.
    key: PathBuf,
}

/// Who owns a key file, as seen from one store directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This store.
    Us,
    /// Nobody (no claim, a damaged one, or one written for another key file).
    Nobody,
    /// A store whose directory is no longer at its recorded path with its recorded inode:
    /// deleted, restored, moved across file systems — or moved with `mv` to a path the claim
    /// does not know, alive (its own open finds it `Us` again).
    Stale(PathBuf),
    /// Another store directory, alive at this path.
    Other(PathBuf),
}

/// The claim file beside `key_file`.
pub fn claim_path(key_file: &Path) -> PathBuf {
    let mut s = key_file.as_os_str().to_owned();
    s.push(".store");
    PathBuf::from(s)
}

fn dev_ino(dir: &Path) -> Option<(u64, u64)> {
    let m = std::fs::symlink_metadata(dir).ok()?;
    m.is_dir().then(|| (m.dev(), m.ino()))
}

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

fn read(key_file: &Path) -> Option<ClaimDoc> {
    let bytes = durable::read_capped(&claim_path(key_file), MAX_CLAIM_BYTES).ok()??;
    serde_json::from_slice::<ClaimDoc>(&bytes)
        .ok()
        .filter(|c| c.format == 1 && c.key == canonical(key_file))
}

/// hive's store directory, if `key_file` is hive's key file (`$HIVE_HOME/secrets/
/// credential_key`). That key belongs to hive's store whoever opens it first: hive reads no
/// archive, so only a rotation of hive's own store (which re-encrypts hive's files) may change
/// it. A copy of hive's store opened with `--store-dir` (hive's key by default) claimed it on
/// its first write, rotated it, and hive could no longer read its own credentials (an
/// independent tester's find).
///
/// Recognised by its place in hive's layout, `<hive home>/secrets/credential_key` beside
/// `<hive home>/credentials`, not by this process's `HIVE_HOME`: hive run with another
/// `HIVE_HOME` than holdfast's keeps its key just as much.
/// The path as given is looked at first, then the file it resolves to (a key file linked from
/// elsewhere into hive's layout, or the other way round).
pub fn hive_owner(key_file: &Path) -> Option<PathBuf> {
    // Only where hive's store is there beside it: hive's store kept elsewhere (`import
    // --from-hive DIR`) is known by the claim its first writer made, like any key file.
    let in_layout = |key: &Path| -> Option<PathBuf> {
        if key.file_name()? != "credential_key" {
            return None;
        }
        let secrets = key.parent()?;
        if secrets.file_name()? != "secrets" {
            return None;
        }
        let store = secrets.parent()?.join("credentials");
        store.is_dir().then(|| canonical(&store))
    };
    in_layout(key_file).or_else(|| in_layout(&canonical(key_file)))
}

/// Whether `key_file` is named like the key file older holdfast versions shared between every
/// data dir's store of one name (`<holdfast keys dir>/<store>.key`, no store id in the name).
/// Stores that still read one take their own copy on their first write, and no write claims
/// one (`keyring.rs`): only a store `init` made it for holds its claim, and only that store
/// may rotate or prune it — any data dir not opened since still needs an old one as it is.
pub fn is_old_shared_key(key_file: &Path) -> bool {
    let Ok(keys) = crate::paths::keys_dir() else {
        return false;
    };
    let key = canonical(key_file);
    key.parent() == Some(canonical(&keys).as_path())
        && key
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".key"))
            .is_some_and(|stem| crate::paths::validate_store_name(stem).is_ok())
}

/// Whether `a` and `b` are one directory: the same inode, or (one of them absent) the same
/// canonical path.
fn same_dir(a: &Path, b: &Path) -> bool {
    match (dev_ino(a), dev_ino(b)) {
        (Some(x), Some(y)) => x == y,
        _ => canonical(a) == canonical(b),
    }
}

/// Who owns `key_file`, seen from the store at `base`.
pub fn owner(key_file: &Path, base: &Path) -> Owner {
    if let Some(hive) = hive_owner(key_file) {
        return if same_dir(base, &hive) {
            Owner::Us
        } else {
            Owner::Other(hive)
        };
    }
    let Some(claim) = read(key_file) else {
        return Owner::Nobody;
    };
    if dev_ino(base) == Some((claim.dev, claim.ino)) {
        return Owner::Us;
    }
    if dev_ino(&claim.path) == Some((claim.dev, claim.ino)) {
        return Owner::Other(claim.path);
    }
    Owner::Stale(claim.path)
}

/// The store directory that owns `key_file`, if its claim is live.
pub fn owner_dir(key_file: &Path) -> Option<PathBuf> {
    if let Some(hive) = hive_owner(key_file) {
        return Some(hive);
    }
    let claim = read(key_file)?;
    (dev_ino(&claim.path) == Some((claim.dev, claim.ino))).then_some(claim.path)
}

/// Claim `key_file` for the store at `base` (or record where it is now). Atomic replace.
pub fn claim(key_file: &Path, base: &Path, faults: &Faults) -> Result<(), IoError> {
    let Some((dev, ino)) = dev_ino(base) else {
        return Ok(());
    };
    let doc = ClaimDoc {
        format: 1,
        path: canonical(base),
        dev,
        ino,
        key: canonical(key_file),
    };
    if read(key_file).is_some_and(|c| c.dev == dev && c.ino == ino && c.path == doc.path) {
        return Ok(());
    }
    let path = claim_path(key_file);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Ok(());
    };
    let bytes = serde_json::to_vec(&doc).unwrap_or_default();
    durable::atomic_write(dir, name, &bytes, faults)?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their fixtures directly
mod tests {
    use super::*;

    #[test]
    fn owner_by_inode_moves_copies_and_stale_claims() {
        let d = tempfile::tempdir().unwrap();
        let key = d.path().join("k.key");
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        assert_eq!(owner(&key, &a), Owner::Nobody);
        claim(&key, &a, &Faults::none()).unwrap();
        assert_eq!(owner(&key, &a), Owner::Us);
        let a_was = a.canonicalize().unwrap();
        assert_eq!(owner(&key, &b), Owner::Other(a_was.clone()));
        assert_eq!(owner_dir(&key), Some(a.canonicalize().unwrap()));
        // Moved (same inode): still the owner from its new place.
        let moved = d.path().join("moved");
        std::fs::rename(&a, &moved).unwrap();
        assert_eq!(owner(&key, &moved), Owner::Us);
        // Seen from another store while the claim names a path that is gone: stale (the
        // owner may live on elsewhere, as here).
        assert_eq!(owner(&key, &b), Owner::Stale(a_was.clone()));
        // A copy at the old path (another inode) sees it stale too.
        std::fs::create_dir(&a).unwrap();
        assert_eq!(owner(&key, &a), Owner::Stale(a_was));
        std::fs::remove_dir(&a).unwrap();
        claim(&key, &moved, &Faults::none()).unwrap();
        assert_eq!(owner(&key, &b), Owner::Other(moved.canonicalize().unwrap()));
        // A claim copied along with its key file names the other key file: stale.
        let other_key = d.path().join("copy.key");
        std::fs::copy(claim_path(&key), claim_path(&other_key)).unwrap();
        std::fs::write(&other_key, "k").unwrap();
        assert_eq!(owner(&other_key, &b), Owner::Nobody);
        std::fs::write(claim_path(&key), "garbage").unwrap();
        assert_eq!(owner(&key, &b), Owner::Nobody);
    }
}
