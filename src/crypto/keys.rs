//! Where a store's key comes from, and reading and writing key files safely.
//!
//! Sources are tried in order; the first that is present is used (a present but unsafe or
//! malformed source is an error, never silently skipped: skipping it could fall through to a
//! different key and seal a store that only needs a `chmod`).
//!
//! Key files hold the 44-character url-safe base64 Fernet key (surrounding whitespace ignored,
//! as hive does). A file `<key file>.prev`, when present, holds previous keys, one per line,
//! still accepted for decryption: it exists only between the two halves of a key rotation.

use std::fmt;
use std::path::{Path, PathBuf};

use super::{parse_key, Secret, SecretBytes};
use crate::durable::{self, perms, Faults, IoError, PermError};
use crate::limits::{MAX_KEY_ARCHIVE_BYTES, MAX_KEY_FILE_BYTES};
use zeroize::Zeroizing;

/// One place a key can come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// systemd `LoadCredential=`: `$CREDENTIALS_DIRECTORY/holdfast-<store>.key` (read-only).
    SystemdCredential(PathBuf),
    /// A key file holdfast may write (a store's own `$XDG_CONFIG_HOME/holdfast/keys/<store>.<id>.key`,
    /// `--key-file`, or hive's `$HIVE_HOME/secrets/credential_key`).
    File(PathBuf),
    /// The key file older holdfast versions shared between every data dir's store of one name
    /// (`keys/<store>.key`): read, never written. A store using it gets its own copy on its
    /// next writable open (`store::identity`).
    Shared(PathBuf),
    /// An environment variable (`HIVE_CREDENTIAL_KEY`, `--key-env VAR`); read-only.
    Env(String),
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::SystemdCredential(p) => write!(f, "systemd credential {}", p.display()),
            KeySource::File(p) => write!(f, "key file {}", p.display()),
            KeySource::Shared(p) => write!(f, "shared key file {}", p.display()),
            KeySource::Env(v) => write!(f, "environment variable {v}"),
        }
    }
}

impl KeySource {
    /// The file rotation may rewrite, if this source is one holdfast owns.
    pub fn writable_file(&self) -> Option<&Path> {
        match self {
            KeySource::File(p) => Some(p),
            _ => None,
        }
    }

    /// The file this key is read from, if it is a file.
    pub fn file(&self) -> Option<&Path> {
        match self {
            KeySource::File(p) | KeySource::Shared(p) | KeySource::SystemdCredential(p) => Some(p),
            KeySource::Env(_) => None,
        }
    }
}

/// Path of the previous-keys file beside a key file.
pub fn prev_path(key_file: &Path) -> PathBuf {
    let mut s = key_file.as_os_str().to_owned();
    s.push(".prev");
    PathBuf::from(s)
}

/// A key problem that is not simply "no key".
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key file or its directory is unsafe.
    #[error("refusing the key: {0}")]
    Unsafe(#[from] PermError),
    /// The source holds something that is not a Fernet key.
    #[error("{source_desc} does not hold a Fernet key (expected 44 url-safe base64 characters encoding 32 bytes)")]
    Malformed {
        /// Which source.
        source_desc: String,
    },
    /// The key file could not be read or written.
    #[error("key file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Writing a key file failed.
    #[error("writing key: {0}")]
    Write(#[from] IoError),
    /// The key file already exists.
    #[error("{} already exists; holdfast never overwrites a key (data encrypted with it would be lost)", .0.display())]
    Exists(PathBuf),
    /// The archive of retired keys would grow past what holdfast reads back.
    #[error("the key archive {} would hold {lines} retired key(s), more than the {} bytes holdfast reads back: prune the keys no file needs first (`holdfast key prune`); nothing was changed", path.display(), MAX_KEY_ARCHIVE_BYTES)]
    ArchiveFull {
        /// The archive.
        path: PathBuf,
        /// Lines it would hold.
        lines: usize,
    },
}

/// A key set read from a source: the primary key and any previous keys.
pub struct LoadedKeys {
    /// Where the keys came from.
    pub source: KeySource,
    /// The key new tokens are made with.
    pub primary: Secret,
    /// The archive: retired keys still accepted for decryption, newest first.
    pub previous: Vec<Secret>,
    /// Lines of the archive that are not keys (damaged, even not text): never used, never
    /// dropped — written back byte for byte whenever the archive is rewritten, and no key is
    /// pruned while there are any (one may have been a key a file needs).
    pub unparsed: Vec<SecretBytes>,
}

impl fmt::Debug for LoadedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedKeys")
            .field("source", &self.source)
            .field("previous", &self.previous.len())
            .field("unparsed", &self.unparsed.len())
            .finish_non_exhaustive()
    }
}

impl LoadedKeys {
    /// Every line of the archive as it is to be written back: its keys, then the lines that
    /// are not keys (never dropped by a rewrite).
    pub fn archive_lines(&self) -> Vec<SecretBytes> {
        self.previous
            .iter()
            .map(|k| SecretBytes::new(k.expose().as_bytes().to_vec()))
            .chain(
                self.unparsed
                    .iter()
                    .map(|l| SecretBytes::new(l.expose().to_vec())),
            )
            .collect()
    }
}

/// Read a key file's bytes (at most `cap`). `Ok(None)` only if the file does not exist: any
/// other failure to look at it (EACCES, …) is an error, never "no key here".
fn read_key_bytes(
    path: &Path,
    check_dir: bool,
    cap: u64,
) -> Result<Option<Zeroizing<Vec<u8>>>, KeyError> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(KeyError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    }
    perms::check_private_file(path)?;
    if check_dir {
        if let Some(dir) = path.parent() {
            perms::check_key_dir(dir)?;
        }
    }
    let bytes = durable::read_capped(path, cap).map_err(|source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(bytes.map(Zeroizing::new))
}

/// Read a key file's text, trimmed, as a `Secret`. `Ok(None)` only if the file does not exist.
fn read_key_file(path: &Path, check_dir: bool) -> Result<Option<Secret>, KeyError> {
    let Some(bytes) = read_key_bytes(path, check_dir, MAX_KEY_FILE_BYTES)? else {
        return Ok(None);
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| KeyError::Malformed {
        source_desc: format!("key file {}", path.display()),
    })?;
    Ok(Some(Secret::new(text.trim().to_owned())))
}

fn parse_one(text: Secret, source_desc: impl Fn() -> String) -> Result<Secret, KeyError> {
    if parse_key(text.expose()).is_none() {
        return Err(KeyError::Malformed {
            source_desc: source_desc(),
        });
    }
    Ok(text)
}

/// The archive beside `key_file`: its keys, and its lines that are not keys. A damaged line
/// (even one that is not text) does not seal a store its primary key opens: it is kept aside,
/// byte for byte (see [`LoadedKeys::unparsed`]).
#[allow(clippy::type_complexity)]
fn read_previous(
    key_file: &Path,
    check_dir: bool,
) -> Result<(Vec<Secret>, Vec<SecretBytes>), KeyError> {
    let prev = prev_path(key_file);
    let Some(bytes) = read_key_bytes(&prev, check_dir, MAX_KEY_ARCHIVE_BYTES)? else {
        return Ok((Vec::new(), Vec::new()));
    };
    let (mut keys, mut unparsed) = (Vec::new(), Vec::new());
    for line in bytes
        .split(|b| *b == b'\n')
        .map(<[u8]>::trim_ascii)
        .filter(|l| !l.is_empty())
    {
        match std::str::from_utf8(line)
            .ok()
            .filter(|t| parse_key(t).is_some())
        {
            Some(key) => keys.push(Secret::new(key.to_owned())),
            None => unparsed.push(SecretBytes::new(line.to_vec())),
        }
    }
    if !unparsed.is_empty() {
        tracing::warn!(archive = %prev.display(), lines = unparsed.len(), "the key archive has lines that are not keys: kept as they are, and no key is pruned until they are fixed or removed");
    }
    Ok((keys, unparsed))
}

/// The bytes of an archive holding `lines` (one per line).
pub fn archive_bytes(lines: &[SecretBytes]) -> u64 {
    lines.iter().map(|l| l.expose().len() as u64 + 1).sum()
}

/// Load keys from the first present source. `Ok(None)`: no source has a key.
pub fn load(sources: &[KeySource]) -> Result<Option<LoadedKeys>, KeyError> {
    for source in sources {
        let desc = || source.to_string();
        match source {
            KeySource::SystemdCredential(p) | KeySource::File(p) | KeySource::Shared(p) => {
                // systemd owns the credentials directory's mode; a key file's directory must be
                // writable by no one else (it may be listable: ssh's rule).
                let check_dir = !matches!(source, KeySource::SystemdCredential(_));
                let Some(text) = read_key_file(p, check_dir)? else {
                    continue;
                };
                let primary = parse_one(text, desc)?;
                let (previous, unparsed) = read_previous(p, check_dir)?;
                return Ok(Some(LoadedKeys {
                    source: source.clone(),
                    primary,
                    previous,
                    unparsed,
                }));
            }
            KeySource::Env(var) => {
                let Some(value) = std::env::var_os(var) else {
                    continue;
                };
                let text = Secret::new(value.into_string().map_err(|_| KeyError::Malformed {
                    source_desc: desc(),
                })?);
                if text.expose().trim().is_empty() {
                    continue;
                }
                let primary = parse_one(Secret::new(text.expose().trim().to_owned()), desc)?;
                return Ok(Some(LoadedKeys {
                    source: source.clone(),
                    primary,
                    previous: Vec::new(),
                    unparsed: Vec::new(),
                }));
            }
        }
    }
    Ok(None)
}

/// Write a brand-new key file (0600, in a 0700 directory created if missing). Refuses to
/// replace an existing file, atomically: a file that appears between the check and the write
/// (another `init` racing) is never replaced.
pub fn create_key_file(path: &Path, key: &Secret, faults: &Faults) -> Result<(), KeyError> {
    if std::fs::symlink_metadata(path).is_ok() {
        return Err(KeyError::Exists(path.to_path_buf()));
    }
    let (dir, name) = split(path)?;
    durable::create_private_dir(dir, faults)?;
    perms::check_key_dir(dir)?;
    match durable::create_exclusive(dir, name, key.expose().as_bytes(), faults) {
        Ok(_) => Ok(()),
        Err(e) if e.source.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(KeyError::Exists(path.to_path_buf()))
        }
        Err(e) => Err(e.into()),
    }
}

/// Replace a key file atomically (0600, directory 0700 created if missing).
pub fn write_key_file(path: &Path, key: &Secret, faults: &Faults) -> Result<(), KeyError> {
    let (dir, name) = split(path)?;
    durable::create_private_dir(dir, faults)?;
    perms::check_key_dir(dir)?;
    durable::atomic_write(dir, name, key.expose().as_bytes(), faults)?;
    Ok(())
}

/// Write (or, with no lines, remove) the previous-keys file beside `key_file`: `lines` as they
/// are, one per line (keys, and the lines that are not keys, kept byte for byte). Refuses an
/// archive larger than [`MAX_KEY_ARCHIVE_BYTES`], which could not be read back.
pub fn write_previous(
    key_file: &Path,
    lines: &[SecretBytes],
    faults: &Faults,
) -> Result<(), KeyError> {
    let prev = prev_path(key_file);
    let (dir, name) = split(&prev)?;
    if lines.is_empty() {
        durable::remove_durably(dir, name, faults)?;
        return Ok(());
    }
    let size = archive_bytes(lines);
    if size > MAX_KEY_ARCHIVE_BYTES {
        return Err(KeyError::ArchiveFull {
            path: prev.clone(),
            lines: lines.len(),
        });
    }
    let mut joined = Zeroizing::new(Vec::with_capacity(size as usize));
    for l in lines {
        joined.extend_from_slice(l.expose());
        joined.push(b'\n');
    }
    durable::create_private_dir(dir, faults)?;
    durable::atomic_write(dir, name, &joined, faults)?;
    Ok(())
}

/// A key path's directory and file name.
pub(crate) fn split(path: &Path) -> Result<(&Path, &str), KeyError> {
    match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) => Ok((dir, name)),
        _ => Err(KeyError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"),
        }),
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their fixtures (bad modes, symlinks) directly
mod tests {
    use super::*;
    use crate::crypto::generate_key;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn load_order_and_errors() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("keys");
        let a = dir.join("a.key");
        assert!(load(&[KeySource::File(a.clone())]).unwrap().is_none());
        let key = generate_key();
        create_key_file(&a, &key, &Faults::none()).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let k = load(&[
            KeySource::File(d.path().join("none")),
            KeySource::File(a.clone()),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(k.primary.expose(), key.expose());
        assert!(matches!(
            create_key_file(&a, &key, &Faults::none()),
            Err(KeyError::Exists(_))
        ));
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o644)).unwrap();
        let msg = load(&[KeySource::File(a.clone())]).unwrap_err().to_string();
        assert!(
            msg.contains("0644") && msg.contains(&a.display().to_string()),
            "{msg}"
        );
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&a, "not a key").unwrap();
        assert!(matches!(
            load(&[KeySource::File(a)]),
            Err(KeyError::Malformed { .. })
        ));
    }

    #[test]
    fn previous_keys_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("keys/a.key");
        let (k1, k2) = (generate_key(), generate_key());
        create_key_file(&a, &k2, &Faults::none()).unwrap();
        write_previous(
            &a,
            &[SecretBytes::new(k1.expose().as_bytes().to_vec())],
            &Faults::none(),
        )
        .unwrap();
        let loaded = load(&[KeySource::File(a.clone())]).unwrap().unwrap();
        assert_eq!(loaded.previous.len(), 1);
        assert_eq!(loaded.previous[0].expose(), k1.expose());
        write_previous(&a, &[], &Faults::none()).unwrap();
        assert!(!prev_path(&a).exists());
    }
}
