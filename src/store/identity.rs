//! A store's identity, and the key file it owns.
//!
//! A store whose key holdfast keeps (a named store under a data dir, or a `[stores.NAME]` entry
//! without a key of its own) has an identity: a random id made when the store is created,
//! kept in `<base>/metadata/holdfast-store.json`. Its key file is named after that id,
//! `<key dir>/<name>.<id>.key`, so two stores of the same name in two data dirs (a test data
//! dir, a second profile, a migration) have two key files: rotating one never touches the
//! other, and `init` on a new data dir makes a new key instead of finding another dir's.
//!
//! Older holdfast versions kept one key file per store *name*, `<key dir>/<name>.key`, shared
//! by every data dir. A store without an identity is such a store: it reads that shared file,
//! and the first open that may write gives it its own copy (see
//! `CredentialStore::adopt_shared_key`). The shared file itself is never changed or removed.
//!
//! The identity moves with the data dir (a restored backup keeps its key), and it holds no
//! secret: it only names the key file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::durable::{self, Faults, IoError};

/// The identity file, in the store's `metadata/` directory (hive ignores files it does not
/// know there).
pub const IDENTITY_FILE: &str = "holdfast-store.json";

/// Identity files are tiny; anything larger is not one.
const MAX_IDENTITY_BYTES: u64 = 4096;

/// A store's id: 16 lowercase hex digits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreId(String);

impl StoreId {
    /// A fresh random id.
    pub fn generate() -> Result<StoreId, std::io::Error> {
        let mut raw = [0u8; 8];
        getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(StoreId(raw.iter().map(|b| format!("{b:02x}")).collect()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn parse(text: &str) -> Option<StoreId> {
        (text.len() == 16
            && text
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
        .then(|| StoreId(text.to_owned()))
    }
}

impl std::fmt::Display for StoreId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Serialize, Deserialize)]
struct IdentityDoc {
    format: u32,
    /// The store's name when it was made (for people reading the file; not checked).
    store: String,
    id: String,
    /// Where the store was when the identity was written (for people reading the file; who
    /// owns a key file is decided by `store::claim`, by inode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path: Option<PathBuf>,
}

/// A store's identity as its file says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The id.
    pub id: StoreId,
    /// Where the store was when the identity was written (absent in early identities).
    pub path: Option<PathBuf>,
}

/// Why an identity file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// It exists but could not be read (permissions, I/O, a symlink, too large).
    #[error("store identity {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Something other than a file is where the identity belongs (a symlink, a FIFO, a
    /// directory): never followed or read.
    #[error("store identity {}: {what} where holdfast keeps a file; it never follows a link or reads a special file under its data directory (fix: put the identity file back)", path.display())]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What is there.
        what: &'static str,
    },
    /// It exists but does not hold an identity.
    #[error("store identity {} is damaged (expected {{\"format\": 1, \"id\": <16 hex digits>}}); restore it from a backup: it names this store's key file", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
    },
    /// Writing it failed.
    #[error("writing the store identity: {0}")]
    Write(#[from] IoError),
}

/// The identity file of the store at `base`.
pub fn identity_path(base: &Path) -> PathBuf {
    base.join("metadata").join(IDENTITY_FILE)
}

/// Read the identity of the store at `base`; `Ok(None)` if it has none (a store made by an
/// older holdfast, or not made yet).
pub fn read(base: &Path) -> Result<Option<StoreId>, IdentityError> {
    Ok(read_full(base)?.map(|i| i.id))
}

/// [`read`], with where the identity says the store was.
pub fn read_full(base: &Path) -> Result<Option<Identity>, IdentityError> {
    let path = identity_path(base);
    if let Ok(m) = std::fs::symlink_metadata(&path) {
        let t = m.file_type();
        let what = if t.is_symlink() {
            Some("a symbolic link")
        } else if t.is_dir() {
            Some("a directory")
        } else if !t.is_file() {
            Some("a special file")
        } else {
            None
        };
        if let Some(what) = what {
            return Err(IdentityError::NotAFile { path, what });
        }
    }
    let bytes = match durable::read_capped(&path, MAX_IDENTITY_BYTES) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(None),
        Err(source) => return Err(IdentityError::Read { path, source }),
    };
    serde_json::from_slice::<IdentityDoc>(&bytes)
        .ok()
        .filter(|d| d.format == 1)
        .and_then(|d| {
            Some(Identity {
                id: StoreId::parse(&d.id)?,
                path: d.path,
            })
        })
        .map(Some)
        .ok_or(IdentityError::Damaged { path })
}

/// Rewrite the identity of the store at `base` as `id`, made here (a copy taking its own
/// identity, or a moved store noting where it is now). Atomic replace.
pub fn rewrite(
    base: &Path,
    name: &str,
    id: &StoreId,
    faults: &Faults,
) -> Result<(), IdentityError> {
    let bytes = doc_bytes(base, name, id);
    durable::atomic_write(&base.join("metadata"), IDENTITY_FILE, &bytes, faults)?;
    Ok(())
}

fn doc_bytes(base: &Path, name: &str, id: &StoreId) -> Vec<u8> {
    let doc = IdentityDoc {
        format: 1,
        store: name.to_owned(),
        id: id.0.clone(),
        path: Some(base.canonicalize().unwrap_or_else(|_| base.to_path_buf())),
    };
    serde_json::to_vec(&doc).unwrap_or_default()
}

/// Write the identity of the store at `base` (its `metadata/` must exist), only if it has
/// none: returns the identity the store has afterwards, `id` or one another process wrote
/// first (the file is published with a no-replace link, so racing writers agree).
pub fn create(
    base: &Path,
    name: &str,
    id: &StoreId,
    faults: &Faults,
) -> Result<StoreId, IdentityError> {
    let bytes = doc_bytes(base, name, id);
    match durable::create_exclusive(&base.join("metadata"), IDENTITY_FILE, &bytes, faults) {
        Ok(_) => Ok(id.clone()),
        Err(e) if e.source.kind() == std::io::ErrorKind::AlreadyExists => {
            read(base)?.ok_or(IdentityError::Damaged {
                path: identity_path(base),
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// The key file a store with identity `id` owns: `<key dir>/<name>.<id>.key` — or, if there
/// is none under that name and exactly one `<other>.<id>.key`, that one: the identity is
/// random and names one store, so a store renamed in the config keeps the key it had under
/// its old name (without it, the renamed store read as one with no key).
pub fn own_key_path(key_dir: &Path, name: &str, id: &StoreId) -> PathBuf {
    let named = key_dir.join(format!("{name}.{id}.key"));
    if std::fs::symlink_metadata(&named).is_ok() {
        return named;
    }
    let suffix = format!(".{id}.key");
    let others: Vec<PathBuf> = std::fs::read_dir(key_dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| {
                    n.strip_suffix(&suffix)
                        .is_some_and(|old| crate::paths::validate_store_name(old).is_ok())
                })
                .map(|n| key_dir.join(n))
                .collect()
        })
        .unwrap_or_default();
    match <[PathBuf; 1]>::try_from(others) {
        Ok([only]) => only,
        Err(_) => named,
    }
}

/// The key file the store `name` at `base` owns in `key_dir`, if it has an identity yet.
pub fn own_key_file(
    key_dir: &Path,
    name: &str,
    base: &Path,
) -> Result<Option<PathBuf>, IdentityError> {
    Ok(read(base)?.map(|id| own_key_path(key_dir, name, &id)))
}

/// Key files in `key_dir` for stores named `name` (`<name>.<id>.key`), sorted: what to offer
/// when a store has lost its identity.
pub fn key_files_named(key_dir: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!("{name}.");
    let mut v: Vec<PathBuf> = std::fs::read_dir(key_dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| {
                    n.strip_prefix(&prefix)
                        .and_then(|rest| rest.strip_suffix(".key"))
                        .is_some_and(|id| StoreId::parse(id).is_some())
                })
                .map(|n| key_dir.join(n))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The key file older holdfast versions shared between every data dir's store of this name.
pub fn shared_key_path(key_dir: &Path, name: &str) -> PathBuf {
    key_dir.join(format!("{name}.key"))
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their fixtures directly
mod tests {
    use super::*;

    /// A renamed store finds its key under its old name; only its own id counts, and two
    /// candidates are not guessed between.
    #[test]
    fn own_key_path_follows_the_id_across_a_rename() {
        let d = tempfile::tempdir().unwrap();
        let id = StoreId::generate().unwrap();
        let other = StoreId::generate().unwrap();
        let named = own_key_path(d.path(), "job", &id);
        assert_eq!(named, d.path().join(format!("job.{id}.key")));
        std::fs::write(d.path().join(format!("work.{other}.key")), b"k").unwrap();
        assert_eq!(own_key_path(d.path(), "job", &id), named);
        std::fs::write(d.path().join(format!("work.{id}.key")), b"k").unwrap();
        assert_eq!(
            own_key_path(d.path(), "job", &id),
            d.path().join(format!("work.{id}.key"))
        );
        std::fs::write(d.path().join(format!("team.{id}.key")), b"k").unwrap();
        assert_eq!(own_key_path(d.path(), "job", &id), named);
        std::fs::write(&named, b"k").unwrap();
        assert_eq!(own_key_path(d.path(), "job", &id), named);
    }

    #[test]
    fn create_read_and_race() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("metadata")).unwrap();
        assert_eq!(read(d.path()).unwrap(), None);
        let a = StoreId::generate().unwrap();
        let b = StoreId::generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(create(d.path(), "default", &a, &Faults::none()).unwrap(), a);
        // A second creator gets the first one's identity, not its own.
        assert_eq!(create(d.path(), "default", &b, &Faults::none()).unwrap(), a);
        assert_eq!(read(d.path()).unwrap(), Some(a.clone()));
        let key = own_key_path(Path::new("/k"), "default", &a);
        assert_eq!(key, PathBuf::from(format!("/k/default.{a}.key")));
        assert_eq!(
            shared_key_path(Path::new("/k"), "x"),
            PathBuf::from("/k/x.key")
        );
    }

    #[test]
    fn damaged_identities_are_errors_not_absent() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("metadata")).unwrap();
        for bad in [
            "",
            "{}",
            "{\"format\":1,\"store\":\"x\",\"id\":\"../../etc\"}",
            "{\"format\":2,\"store\":\"x\",\"id\":\"0123456789abcdef\"}",
            "{\"format\":1,\"store\":\"x\",\"id\":\"0123456789ABCDEF\"}",
        ] {
            std::fs::write(identity_path(d.path()), bad).unwrap();
            assert!(
                matches!(read(d.path()), Err(IdentityError::Damaged { .. })),
                "{bad}"
            );
        }
        std::fs::remove_file(identity_path(d.path())).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", identity_path(d.path())).unwrap();
        let e = read(d.path()).unwrap_err();
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        std::fs::remove_file(identity_path(d.path())).unwrap();
        std::fs::create_dir(identity_path(d.path())).unwrap();
        let e = read(d.path()).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
    }
}
