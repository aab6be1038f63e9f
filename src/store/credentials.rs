//! [`CredentialStore`]: open (with reconciliation), get, set (with compare-and-swap), delete,
//! list, exists, and the index write-behind.
//!
//! Locking: every writer holds `metadata/index.lock` (exclusive) for one credential write and,
//! when it is the last writer in its process's queue, the index rewrite. Readers take no lock:
//! every file is replaced atomically, so a reader sees the old or the new file, never a mix.
//!
//! Index write-behind: a `set` is acknowledged once its `.enc` file is durable; the index is a
//! cache. A writer rewrites the index only if no other writer of this process is queued on the
//! lock, so a burst of N concurrent writes costs one index rewrite, not N, while a lone write
//! still leaves the index current. A `delete` rewrites the index *before* unlinking, so hive
//! never lists a ghost. A crash between a file write and the index rewrite is repaired on the
//! next open (the file is found and added).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use serde_json::{Map, Value};

use super::credential::Credential;
use super::fsck::{Quarantined, Report};
use super::id;
use super::index::{Index, IndexState, Vouch};
use super::{Error, Result, SealedReason};
use crate::crypto::{keys, DecryptError, KeySource, Keyring, LoadedKeys};
use crate::durable::{self, lock, perms, Faults, FileStamp, IoError, LockGuard, LockMode};
use crate::limits::{
    KEY_CHECK_SAMPLE, LOCK_TIMEOUT, MAX_CREDENTIAL_FILE_BYTES, MAX_INDEX_FILE_BYTES,
};

/// Where a store lives and where its key comes from.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// A name for messages (`default`, or the directory for `--store-dir`).
    pub name: String,
    /// The store's base directory (holding `credentials/` and `metadata/`).
    pub base: PathBuf,
    /// Key sources, tried in order.
    pub key_sources: Vec<KeySource>,
}

/// Whether opening may repair the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Reconcile and repair on open (sweep temp files, fix the index, quarantine bad files).
    Repair,
    /// Look only: nothing on disk is modified and every write is refused (fsck without
    /// `--repair`). No reconciliation at open.
    ReadOnly,
    /// No reconciliation at open, writes allowed: the caller runs [`CredentialStore::fsck`]
    /// itself and wants its report to include everything found.
    Deferred,
}

/// Options for [`CredentialStore::open`].
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Repair or look only.
    pub mode: OpenMode,
    /// Fault-injection seam (tests); disarmed by default.
    pub faults: Faults,
    /// How long writers wait for the store lock.
    pub lock_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            mode: OpenMode::Repair,
            faults: Faults::none(),
            lock_timeout: LOCK_TIMEOUT,
        }
    }
}

/// One credential as `list` shows it: metadata, never secret values.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CredentialInfo {
    /// The id.
    pub id: String,
    /// Its generation.
    pub generation: u64,
    /// hive's index entry (type, provider, alias, key names, dates, tags).
    pub metadata: Value,
}

/// The result of `list`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Listing {
    /// Readable credentials, sorted by id.
    pub credentials: Vec<CredentialInfo>,
    /// Files that could not be read (see `store fsck`).
    pub unreadable: usize,
}

#[derive(Clone, Debug)]
struct Entry {
    id: String,
    meta: Value,
    stamp: FileStamp,
    generation: u64,
}

enum KeyState {
    Unsealed {
        ring: Keyring,
        source: KeySource,
        stamp: Option<(Option<FileStamp>, Option<FileStamp>)>,
    },
    Sealed(SealedReason),
}

#[derive(Default)]
struct Inner {
    entries: BTreeMap<String, Entry>,
    /// Index entries kept for files we cannot read right now (clock skew): id → entry.
    kept: Map<String, Value>,
    /// Unknown top-level index fields, preserved.
    index_extra: Map<String, Value>,
    dirty: bool,
    unreadable: usize,
    /// The file a `delete` is removing: its index entry is dropped before the unlink, so the
    /// directory scan in `refresh` must not put it back while the file still exists.
    deleting: Option<String>,
}

/// A hive-layout credential store. Safe to share between threads (`&self` everywhere) and to
/// use beside other processes that take `metadata/index.lock`.
pub struct CredentialStore {
    config: StoreConfig,
    cred_dir: PathBuf,
    meta_dir: PathBuf,
    quarantine_dir: PathBuf,
    lock_path: PathBuf,
    opts: StoreOptions,
    keys: RwLock<KeyState>,
    inner: Mutex<Inner>,
    poisoned: Mutex<Option<String>>,
    waiting_writers: AtomicUsize,
    batch_depth: AtomicUsize,
    open_report: Report,
}

impl std::fmt::Debug for CredentialStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialStore")
            .field("name", &self.config.name)
            .field("base", &self.config.base)
            .field("sealed", &self.sealed_reason())
            .finish_non_exhaustive()
    }
}

const INDEX_FILE: &str = "index.json";

fn stamp_of(path: &Path) -> Option<FileStamp> {
    fs::symlink_metadata(path).ok().map(|m| FileStamp::of(&m))
}

fn key_stamps(source: &KeySource) -> Option<(Option<FileStamp>, Option<FileStamp>)> {
    match source {
        KeySource::File(p) | KeySource::SystemdCredential(p) => {
            Some((stamp_of(p), stamp_of(&keys::prev_path(p))))
        }
        KeySource::Env(_) => None,
    }
}

/// What reading one credential file gave.
enum FileRead {
    Missing,
    Ok(Credential, usize),
    Skew(DecryptError),
    Bad(String),
}

fn lock_guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl CredentialStore {
    /// Open a store: check permissions, load the key (or seal), and reconcile the index with
    /// the files. See [`OpenMode`] for what may be modified.
    pub fn open(config: StoreConfig, opts: StoreOptions) -> Result<Self> {
        let base = config.base.clone();
        if fs::symlink_metadata(&base).is_err() {
            return Err(Error::NoStore(base));
        }
        perms::check_private_dir(&base)?;
        let cred_dir = base.join("credentials");
        let meta_dir = base.join("metadata");
        for d in [&cred_dir, &meta_dir] {
            if fs::symlink_metadata(d).is_ok() {
                perms::check_private_dir(d)?;
            }
        }
        let mut store = CredentialStore {
            lock_path: meta_dir.join("index.lock"),
            quarantine_dir: base.join("quarantine"),
            cred_dir,
            meta_dir,
            keys: RwLock::new(KeyState::Sealed(SealedReason::BadKey(String::new()))),
            inner: Mutex::new(Inner::default()),
            poisoned: Mutex::new(None),
            waiting_writers: AtomicUsize::new(0),
            batch_depth: AtomicUsize::new(0),
            open_report: Report::default(),
            config,
            opts,
        };
        let state = store.load_keys()?;
        *store.keys.write().unwrap_or_else(PoisonError::into_inner) = state;
        if store.sealed_reason().is_some() {
            return Ok(store);
        }
        if store.opts.mode == OpenMode::ReadOnly {
            return Ok(store);
        }
        durable::create_private_dir(&store.cred_dir, &store.opts.faults)?;
        durable::create_private_dir(&store.meta_dir, &store.opts.faults)?;
        if store.opts.mode == OpenMode::Deferred {
            return Ok(store);
        }
        let report = {
            let _guard = store.lock_for(LockMode::Exclusive)?;
            let mut inner = lock_guard(&store.inner);
            store.reconcile(&mut inner, false, true)?
        };
        if report.problems() > 0 {
            tracing::warn!(store = %store.config.name, problems = report.problems(), "reconciled store on open:\n{report}");
        }
        store.open_report = report;
        Ok(store)
    }

    /// The report of the reconciliation done at open.
    pub fn open_report(&self) -> &Report {
        &self.open_report
    }

    /// The store's configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Why the store is sealed, or `None` if it has a working key.
    pub fn sealed_reason(&self) -> Option<SealedReason> {
        match &*self.keys.read().unwrap_or_else(PoisonError::into_inner) {
            KeyState::Sealed(r) => Some(r.clone()),
            KeyState::Unsealed { .. } => None,
        }
    }

    /// Fingerprints of the keys in use (primary first), for status output.
    pub fn key_fingerprints(&self) -> Vec<String> {
        match &*self.keys.read().unwrap_or_else(PoisonError::into_inner) {
            KeyState::Unsealed { ring, .. } => ring.fingerprints().to_vec(),
            KeyState::Sealed(_) => Vec::new(),
        }
    }

    /// Where the key came from, if unsealed.
    pub fn key_source(&self) -> Option<KeySource> {
        match &*self.keys.read().unwrap_or_else(PoisonError::into_inner) {
            KeyState::Unsealed { source, .. } => Some(source.clone()),
            KeyState::Sealed(_) => None,
        }
    }

    pub(super) fn faults(&self) -> &Faults {
        &self.opts.faults
    }

    fn enc_files(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        let rd = match fs::read_dir(&self.cred_dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(names),
            Err(source) => {
                return Err(Error::Read {
                    path: self.cred_dir.clone(),
                    source,
                })
            }
        };
        for e in rd {
            let e = e.map_err(|source| Error::Read {
                path: self.cred_dir.clone(),
                source,
            })?;
            if let Some(name) = e.file_name().to_str() {
                if name.ends_with(".enc") && !name.contains(durable::TEMP_MARKER) {
                    names.push(name.to_owned());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// Load keys and decide sealed/unsealed. Unsafe key permissions are an error (refuse).
    fn load_keys(&self) -> Result<KeyState> {
        let sources = &self.config.key_sources;
        let looked_in = sources
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let loaded = match keys::load(sources) {
            Ok(l) => l,
            Err(e @ crate::crypto::KeyError::Malformed { .. }) => {
                return Ok(KeyState::Sealed(SealedReason::BadKey(e.to_string())))
            }
            Err(e) => return Err(e.into()),
        };
        let files = self.enc_files()?;
        let Some(LoadedKeys {
            source,
            primary,
            previous,
        }) = loaded
        else {
            return Ok(KeyState::Sealed(SealedReason::NoKey {
                files: files.len(),
                looked_in,
            }));
        };
        let Some(ring) = Keyring::new(&primary, &previous) else {
            return Ok(KeyState::Sealed(SealedReason::BadKey(format!(
                "{source} does not hold a Fernet key"
            ))));
        };
        // The key must open at least one existing file; otherwise it is the wrong key and
        // nothing may be written with it (files would end up under two keys) or quarantined.
        let mut tried = 0;
        let mut opened = files.is_empty();
        for name in &files {
            match self.read_file(name, &ring) {
                FileRead::Ok(..) | FileRead::Skew(_) => {
                    opened = true;
                    break;
                }
                FileRead::Bad(_) => tried += 1,
                FileRead::Missing => {}
            }
            if tried >= KEY_CHECK_SAMPLE {
                break;
            }
        }
        if !opened && tried > 0 {
            return Ok(KeyState::Sealed(SealedReason::WrongKey {
                tried,
                source: source.to_string(),
            }));
        }
        let stamp = key_stamps(&source);
        Ok(KeyState::Unsealed {
            ring,
            source,
            stamp,
        })
    }

    /// Reload the keys if their files changed (another process rotated them).
    fn reload_keys_if_changed(&self) -> Result<()> {
        let changed = match &*self.keys.read().unwrap_or_else(PoisonError::into_inner) {
            KeyState::Unsealed { source, stamp, .. } => key_stamps(source) != *stamp,
            KeyState::Sealed(_) => false,
        };
        if changed {
            let state = self.load_keys()?;
            if let KeyState::Sealed(reason) = &state {
                tracing::error!(store = %self.config.name, %reason, "key files changed and no longer open the store");
            } else {
                tracing::info!(store = %self.config.name, "key files changed; reloaded keys");
            }
            *self.keys.write().unwrap_or_else(PoisonError::into_inner) = state;
        }
        Ok(())
    }

    pub(super) fn reload_keys(&self) -> Result<()> {
        let state = self.load_keys()?;
        *self.keys.write().unwrap_or_else(PoisonError::into_inner) = state;
        Ok(())
    }

    fn sealed_error(&self, reason: SealedReason) -> Error {
        Error::Sealed {
            store: self.config.name.clone(),
            reason,
        }
    }

    /// Run `f` with the keyring, or fail with `sealed`.
    pub(super) fn with_ring<T>(&self, f: impl FnOnce(&Keyring) -> Result<T>) -> Result<T> {
        match &*self.keys.read().unwrap_or_else(PoisonError::into_inner) {
            KeyState::Unsealed { ring, .. } => f(ring),
            KeyState::Sealed(r) => Err(self.sealed_error(r.clone())),
        }
    }

    fn lock_for(&self, mode: LockMode) -> Result<LockGuard> {
        Ok(lock::lock(&self.lock_path, mode, self.opts.lock_timeout)?)
    }

    /// Turn a failed durable step into an error, poisoning the store if it was an fsync.
    pub(super) fn io_failed(&self, err: IoError) -> Error {
        if err.is_fsync() {
            let msg = err.to_string();
            tracing::error!(store = %self.config.name, error = %msg, "fsync failed; refusing writes until reopened");
            *lock_guard(&self.poisoned) = Some(msg);
        }
        Error::Io(err)
    }

    fn check_writable(&self) -> Result<()> {
        if let Some(reason) = self.sealed_reason() {
            return Err(self.sealed_error(reason));
        }
        if self.opts.mode == OpenMode::ReadOnly {
            return Err(Error::Unsupported(
                "store was opened read-only (fsck without --repair); writes are refused".into(),
            ));
        }
        if let Some(msg) = lock_guard(&self.poisoned).clone() {
            return Err(Error::Poisoned(msg));
        }
        Ok(())
    }

    /// Read and decrypt one credential file, classifying the outcome.
    fn read_file(&self, name: &str, ring: &Keyring) -> FileRead {
        let path = self.cred_dir.join(name);
        let bytes = match durable::read_capped(&path, MAX_CREDENTIAL_FILE_BYTES) {
            Ok(Some(b)) => b,
            Ok(None) => return FileRead::Missing,
            Err(e) if e.raw_os_error() == Some(40) => {
                return FileRead::Bad("is a symlink; refusing to follow it".into())
            }
            Err(e) => return FileRead::Bad(format!("cannot be read: {e}")),
        };
        let Ok(token) = std::str::from_utf8(&bytes) else {
            return FileRead::Bad("is not a Fernet token (not text)".into());
        };
        if token.trim().is_empty() {
            return FileRead::Bad("is empty".into());
        }
        match ring.decrypt(token) {
            Ok((plain, key_idx)) => match Credential::parse(plain.expose()) {
                Ok(c) => FileRead::Ok(c, key_idx),
                Err(e) => FileRead::Bad(format!("decrypts, but is not a credential: {e}")),
            },
            Err(e @ DecryptError::ClockSkew { .. }) => FileRead::Skew(e),
            Err(DecryptError::Invalid) => FileRead::Bad(DecryptError::Invalid.to_string()),
        }
    }

    /// Read the credential stored under `id`'s file name: `Ok(None)` if there is no file.
    /// Files that fail are errors (integrity or clock skew), never silently "missing".
    fn read_for(&self, id: &str, ring: &Keyring) -> Result<Option<Credential>> {
        let name = id::file_name(id);
        match self.read_file(&name, ring) {
            FileRead::Missing => Ok(None),
            FileRead::Ok(c, _) => Ok(Some(c)),
            FileRead::Skew(source) => Err(Error::ClockSkew {
                id: id.to_owned(),
                source,
            }),
            FileRead::Bad(reason) => Err(Error::Integrity {
                what: format!("credential {id:?} (file {name})"),
                reason,
            }),
        }
    }

    /// The file holds another id. If that id legitimately maps to this file name, it is a
    /// hive name collision; otherwise the file was swapped or renamed.
    fn binding_error(&self, id: &str, found: &Credential) -> Option<Error> {
        let name = id::file_name(id);
        if id::file_name(found.id()) == name {
            None
        } else {
            Some(Error::Integrity {
                what: format!("credential {id:?} (file {name})"),
                reason: format!(
                    "the file holds credential {:?}, whose file would be {}: files were swapped or renamed",
                    found.id(),
                    id::file_name(found.id())
                ),
            })
        }
    }

    /// Read credential `id`. The id inside the file must equal `id`.
    pub fn get(&self, id: &str) -> Result<Credential> {
        id::validate(id)?;
        let first = self.with_ring(|ring| self.read_for(id, ring));
        // A rotation by another process re-encrypts files under a key we have not loaded yet.
        let found = match first {
            Err(Error::Integrity { .. }) => {
                self.reload_keys_if_changed()?;
                self.with_ring(|ring| self.read_for(id, ring))?
            }
            other => other?,
        };
        match found {
            None => Err(Error::NotFound { id: id.to_owned() }),
            Some(c) if c.id() == id => Ok(c),
            Some(c) => Err(self
                .binding_error(id, &c)
                .unwrap_or_else(|| Error::NotFound { id: id.to_owned() })),
        }
    }

    /// Whether credential `id` exists (and reads).
    pub fn exists(&self, id: &str) -> Result<bool> {
        match self.get(id) {
            Ok(_) => Ok(true),
            Err(Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Store `cred` (a full document), replacing any previous version. With `if_generation`,
    /// only if the stored generation equals it (0: only if absent). Returns the new generation.
    pub fn set(&self, cred: Credential, if_generation: Option<u64>) -> Result<u64> {
        let id = cred.id().to_owned();
        let mut cred = Some(cred);
        self.update(&id, if_generation, |_| {
            cred.take()
                .ok_or_else(|| Error::Unsupported("update closure called twice".into()))
        })
    }

    /// Read-modify-write credential `id` under the store lock: `f` gets the current version (or
    /// `None`) and returns the new one. Returns the new generation.
    pub fn update(
        &self,
        id: &str,
        if_generation: Option<u64>,
        f: impl FnOnce(Option<Credential>) -> Result<Credential>,
    ) -> Result<u64> {
        id::validate(id)?;
        self.write_op(|inner, ring| {
            let name = id::file_name(id);
            let existing = match self.read_for(id, ring)? {
                Some(c) if c.id() != id => {
                    return Err(self
                        .binding_error(id, &c)
                        .unwrap_or_else(|| Error::IdCollision {
                            id: id.to_owned(),
                            file: name.clone(),
                            other: c.id().to_owned(),
                        }))
                }
                other => other,
            };
            let current = existing.as_ref().map_or(0, Credential::generation);
            if let Some(expected) = if_generation {
                if expected != current {
                    return Err(Error::GenerationMismatch {
                        id: id.to_owned(),
                        expected,
                        actual: current,
                    });
                }
            }
            let created = existing
                .as_ref()
                .and_then(|c| c.field("created_at").cloned());
            let mut new = f(existing)?;
            if new.id() != id {
                return Err(Error::InvalidCredential(
                    super::credential::SchemaError::NoId,
                ));
            }
            let generation = current + 1;
            new.stamp_write(created.as_ref());
            new.set_generation(generation);
            let token = ring.encrypt(&new.to_bytes());
            let stamp =
                durable::atomic_write(&self.cred_dir, &name, token.as_bytes(), self.faults())
                    .map_err(|e| self.io_failed(e))?;
            inner.entries.insert(
                name,
                Entry {
                    id: id.to_owned(),
                    meta: new.index_entry(),
                    stamp,
                    generation,
                },
            );
            inner.kept.shift_remove(id);
            inner.dirty = true;
            Ok(generation)
        })
    }

    /// Delete credential `id`. Returns whether it existed. The index entry goes first, then
    /// the file, so hive never lists an id whose file is gone.
    pub fn delete(&self, id: &str) -> Result<bool> {
        id::validate(id)?;
        self.write_op(|inner, ring| {
            let name = id::file_name(id);
            match self.read_for(id, ring)? {
                None => return Ok(false),
                Some(c) if c.id() != id => {
                    return match self.binding_error(id, &c) {
                        Some(e) => Err(e),
                        None => Ok(false),
                    }
                }
                Some(_) => {}
            }
            let removed = inner.entries.remove(&name);
            inner.deleting = Some(name.clone());
            let flushed = self.flush_index(inner);
            inner.deleting = None;
            if let Err(e) = flushed {
                if let Some(entry) = removed {
                    inner.entries.insert(name, entry);
                }
                return Err(e);
            }
            durable::remove_durably(&self.cred_dir, &name, self.faults())
                .map_err(|e| self.io_failed(e))
        })
    }

    /// Metadata of every readable credential (never secret values), fresh from the directory.
    pub fn list(&self) -> Result<Listing> {
        self.with_ring(|_| Ok(()))?;
        let mut inner = lock_guard(&self.inner);
        self.refresh(&mut inner)?;
        let mut credentials: Vec<CredentialInfo> = inner
            .entries
            .values()
            .map(|e| CredentialInfo {
                id: e.id.clone(),
                generation: e.generation,
                metadata: e.meta.clone(),
            })
            .collect();
        credentials.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Listing {
            credentials,
            unreadable: inner.unreadable,
        })
    }

    /// Run a write under the store lock, then rewrite the index if this was the last queued
    /// writer of the process (group commit of index rewrites).
    fn write_op<T>(&self, f: impl FnOnce(&mut Inner, &Keyring) -> Result<T>) -> Result<T> {
        self.check_writable()?;
        self.waiting_writers.fetch_add(1, Ordering::SeqCst);
        let guard = self.lock_for(LockMode::Exclusive);
        self.waiting_writers.fetch_sub(1, Ordering::SeqCst);
        let _guard = guard?;
        // Re-check under the lock: another thread may have poisoned the store meanwhile.
        self.check_writable()?;
        self.reload_keys_if_changed()?;
        let mut inner = lock_guard(&self.inner);
        let result = self.with_ring(|ring| f(&mut inner, ring));
        if inner.dirty
            && self.waiting_writers.load(Ordering::SeqCst) == 0
            && self.batch_depth.load(Ordering::SeqCst) == 0
        {
            if let Err(e) = self.flush_index(&mut inner) {
                // The credential itself is durable; the index is a cache rebuilt on open.
                tracing::warn!(store = %self.config.name, error = %e, "index rewrite failed; it will be repaired on the next open");
            }
        }
        result
    }

    /// Run `f` (a sequence of writes from one thread, such as an import) with index rewrites
    /// deferred to its end: N writes cost one index rewrite. Each write is still durable and
    /// acknowledged on its own; a crash inside the batch is repaired on open like any other.
    pub fn batch<T>(&self, f: impl FnOnce(&Self) -> T) -> Result<T> {
        struct Depth<'a>(&'a AtomicUsize);
        impl Drop for Depth<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.batch_depth.fetch_add(1, Ordering::SeqCst);
        let out = {
            let _depth = Depth(&self.batch_depth);
            f(self)
        };
        self.flush()?;
        Ok(out)
    }

    /// Flush pending index changes now (callers that batch writes, and `Drop`).
    pub fn flush(&self) -> Result<()> {
        if self.check_writable().is_err() {
            return Ok(());
        }
        let mut inner = lock_guard(&self.inner);
        if !inner.dirty {
            return Ok(());
        }
        drop(inner);
        let _guard = self.lock_for(LockMode::Exclusive)?;
        inner = lock_guard(&self.inner);
        self.flush_index(&mut inner)
    }

    /// Rewrite index.json from the files. Caller holds the store lock. Refreshes from the
    /// directory first: another process may have written files since our last look.
    fn flush_index(&self, inner: &mut Inner) -> Result<()> {
        self.refresh(inner)?;
        let mut index = Index {
            extra: inner.index_extra.clone(),
            ..Index::default()
        };
        for (id, e) in &inner.kept {
            index.credentials.insert(id.clone(), e.clone());
        }
        for (name, e) in &inner.entries {
            index.credentials.insert(e.id.clone(), e.meta.clone());
            index.vouches.insert(
                name.clone(),
                Vouch {
                    id: e.id.clone(),
                    stamp: e.stamp,
                    generation: e.generation,
                },
            );
        }
        let bytes = index.to_bytes(&self.config.base.to_string_lossy());
        durable::atomic_write(&self.meta_dir, INDEX_FILE, &bytes, self.faults())
            .map_err(|e| self.io_failed(e))?;
        inner.dirty = false;
        Ok(())
    }

    /// Bring the in-memory entries up to date with the directory: stat every file, decrypt
    /// only those whose stamp changed. Modifies nothing on disk.
    fn refresh(&self, inner: &mut Inner) -> Result<()> {
        let names = self.enc_files()?;
        let mut fresh = BTreeMap::new();
        let mut unreadable = 0;
        self.with_ring(|ring| {
            for name in names {
                if inner.deleting.as_deref() == Some(name.as_str()) {
                    continue;
                }
                let Some(stamp) = stamp_of(&self.cred_dir.join(&name)) else {
                    continue;
                };
                if let Some(e) = inner.entries.get(&name).filter(|e| e.stamp == stamp) {
                    fresh.insert(name, e.clone());
                    continue;
                }
                match self.read_file(&name, ring) {
                    FileRead::Ok(c, _) if id::file_name(c.id()) == name => {
                        let entry = Entry {
                            id: c.id().to_owned(),
                            meta: c.index_entry(),
                            stamp,
                            generation: c.generation(),
                        };
                        fresh.insert(name, entry);
                    }
                    FileRead::Missing => {}
                    _ => unreadable += 1,
                }
            }
            Ok(())
        })?;
        if fresh.len() != inner.entries.len()
            || fresh
                .iter()
                .zip(&inner.entries)
                .any(|(a, b)| a.0 != b.0 || a.1.stamp != b.1.stamp)
        {
            inner.dirty = true;
        }
        inner.entries = fresh;
        inner.unreadable = unreadable;
        Ok(())
    }

    fn read_index(&self) -> (Index, IndexState) {
        match durable::read_capped(&self.meta_dir.join(INDEX_FILE), MAX_INDEX_FILE_BYTES) {
            Ok(None) => (Index::default(), IndexState::Missing),
            Ok(Some(bytes)) => match Index::parse(&bytes) {
                Ok(idx) => (idx, IndexState::Ok),
                Err(state) => (Index::default(), state),
            },
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                (Index::default(), IndexState::TooBig)
            }
            Err(_) => (Index::default(), IndexState::Unparseable),
        }
    }

    /// Compare the index with the files and (with `repair`) fix every difference. Caller holds
    /// the store lock (exclusive when repairing). `full` decrypts every file; otherwise only
    /// files the index does not vouch for.
    fn reconcile(&self, inner: &mut Inner, full: bool, repair: bool) -> Result<Report> {
        let faults = self.faults();
        let mut report = Report {
            repaired: repair,
            full,
            ..Report::default()
        };
        for dir in [&self.cred_dir, &self.meta_dir] {
            if repair {
                let swept =
                    durable::sweep_temp_files(dir, faults).map_err(|e| self.io_failed(e))?;
                report.temp_files.extend(swept);
            } else if let Ok(rd) = fs::read_dir(dir) {
                report.temp_files.extend(rd.filter_map(|e| {
                    let n = e.ok()?.file_name().to_string_lossy().into_owned();
                    (n.starts_with('.') && n.contains(durable::TEMP_MARKER)).then_some(n)
                }));
            }
        }
        let (index, state) = self.read_index();
        report.set_index_state(&state);
        // Which index id was recorded for each file name (vouched, or by hive's mapping).
        let mut stray = Vec::new();
        if let Ok(rd) = fs::read_dir(&self.cred_dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if !n.ends_with(".enc") && !n.contains(durable::TEMP_MARKER) {
                    stray.push(n);
                }
            }
        }
        stray.sort();
        report.stray = stray;

        let names = self.enc_files()?;
        report.files = names.len();
        if state == IndexState::Missing && names.is_empty() {
            // A new, empty store: nothing to rebuild, the first write creates the index.
            report.index_rebuilt = false;
        }
        let mut entries = BTreeMap::new();
        let mut kept = Map::new();
        let mut bad: Vec<(String, String)> = Vec::new();
        self.with_ring(|ring| {
            for name in &names {
                let path = self.cred_dir.join(name);
                let Some(stamp) = stamp_of(&path) else { continue };
                let vouch = index.vouches.get(name).filter(|v| {
                    !full
                        && v.stamp == stamp
                        && index.credentials.contains_key(&v.id)
                        && id::file_name(&v.id) == *name
                });
                if let Some(v) = vouch {
                    report.vouched += 1;
                    let meta = index.credentials.get(&v.id).cloned().unwrap_or(Value::Null);
                    entries.insert(
                        name.clone(),
                        Entry {
                            id: v.id.clone(),
                            meta,
                            stamp,
                            generation: v.generation,
                        },
                    );
                    continue;
                }
                report.decrypted += 1;
                match self.read_file(name, ring) {
                    FileRead::Missing => {}
                    FileRead::Ok(c, key_idx) => {
                        if id::file_name(c.id()) != *name {
                            bad.push((
                                name.clone(),
                                format!(
                                    "holds credential {:?}, whose file would be {} (swapped or renamed)",
                                    c.id(),
                                    id::file_name(c.id())
                                ),
                            ));
                            continue;
                        }
                        if key_idx > 0 {
                            report.old_key.push(name.clone());
                        }
                        let meta = c.index_entry();
                        if index.credentials.get(c.id()).is_some_and(|m| *m != meta) {
                            report.drift.push(c.id().to_owned());
                        }
                        entries.insert(
                            name.clone(),
                            Entry {
                                id: c.id().to_owned(),
                                meta,
                                stamp,
                                generation: c.generation(),
                            },
                        );
                    }
                    FileRead::Skew(e) => {
                        report.clock_skew.push(format!("{name}: {e}"));
                        // Keep whatever the index said about this file until it reads again.
                        for (cid, meta) in &index.credentials {
                            if id::file_name(cid) == *name {
                                kept.insert(cid.clone(), meta.clone());
                            }
                        }
                    }
                    FileRead::Bad(reason) => bad.push((name.clone(), reason)),
                }
            }
            Ok(())
        })?;
        for e in entries.values() {
            if !index.credentials.contains_key(&e.id) {
                report.orphans.push(e.id.clone());
            }
        }
        let live: std::collections::HashSet<&str> = entries
            .values()
            .map(|e| e.id.as_str())
            .chain(kept.keys().map(String::as_str))
            .collect();
        if state == IndexState::Ok {
            for cid in index.credentials.keys() {
                if !live.contains(cid.as_str()) {
                    report.ghosts.push(cid.clone());
                }
            }
        } else {
            // A rebuilt index: everything on disk is "added", nothing is a ghost.
            report.orphans.clear();
        }
        for (name, reason) in bad {
            let moved_to = if repair {
                Some(
                    durable::move_aside(&self.cred_dir, &name, &self.quarantine_dir, faults)
                        .map_err(|e| self.io_failed(e))?,
                )
            } else {
                None
            };
            if let Some(to) = &moved_to {
                tracing::warn!(file = %name, %reason, moved_to = %to.display(), "quarantined credential file");
            }
            report.quarantined.push(Quarantined {
                file: name,
                reason,
                moved_to,
            });
        }
        report.readable = entries.len();
        let vouches_match = entries.len() == index.vouches.len()
            && entries
                .iter()
                .all(|(n, e)| index.vouches.get(n).is_some_and(|v| v.stamp == e.stamp));
        let needs_rewrite = state != IndexState::Ok
            || !report.orphans.is_empty()
            || !report.ghosts.is_empty()
            || !report.drift.is_empty()
            || !report.quarantined.is_empty()
            || !vouches_match;
        inner.entries = entries;
        inner.kept = kept;
        inner.index_extra = index.extra;
        inner.unreadable = report.clock_skew.len() + report.quarantined.len();
        inner.dirty = needs_rewrite;
        if repair && needs_rewrite {
            self.flush_index(inner)?;
            report.index_rewritten = true;
        }
        Ok(report)
    }

    /// Scan the store and report (fsck). With `repair`, fix what is found: remove temp
    /// files, rebuild or correct the index, quarantine damaged files. Every file is decrypted.
    pub fn fsck(&self, repair: bool) -> Result<Report> {
        if repair {
            self.check_writable()?;
        } else if let Some(reason) = self.sealed_reason() {
            return Err(self.sealed_error(reason));
        }
        // A read-only look at a store without a metadata/ directory takes no lock (creating
        // the lock file would be a modification).
        let _guard = if repair {
            Some(self.lock_for(LockMode::Exclusive)?)
        } else if self.meta_dir.is_dir() {
            Some(self.lock_for(LockMode::Shared)?)
        } else {
            None
        };
        let mut inner = lock_guard(&self.inner);
        self.reconcile(&mut inner, true, repair)
    }

    /// Count of credential files on disk (works sealed).
    pub fn file_count(&self) -> Result<usize> {
        Ok(self.enc_files()?.len())
    }

    pub(super) fn enc_file_names(&self) -> Result<Vec<String>> {
        self.enc_files()
    }

    /// Re-encrypt one file with the primary key if it is under a previous key. Caller holds
    /// the store lock. Returns whether it was rewritten; files that do not decrypt at all are
    /// left for fsck (no key could help them).
    pub(super) fn reencrypt_file(&self, name: &str) -> Result<bool> {
        let mut inner = lock_guard(&self.inner);
        self.with_ring(|ring| match self.read_file(name, ring) {
            FileRead::Ok(c, idx) if idx > 0 => {
                let token = ring.encrypt(&c.to_bytes());
                let stamp =
                    durable::atomic_write(&self.cred_dir, name, token.as_bytes(), self.faults())
                        .map_err(|e| self.io_failed(e))?;
                if let Some(e) = inner.entries.get_mut(name) {
                    e.stamp = stamp;
                }
                inner.dirty = true;
                Ok(true)
            }
            _ => Ok(false),
        })
    }

    /// Whether a file still needs a previous key (`None`: it does not decrypt at all).
    pub(super) fn needs_old_key(&self, name: &str) -> Result<Option<bool>> {
        self.with_ring(|ring| {
            Ok(match self.read_file(name, ring) {
                FileRead::Ok(_, idx) => Some(idx > 0),
                FileRead::Skew(_) | FileRead::Missing => Some(false),
                FileRead::Bad(_) => None,
            })
        })
    }

    pub(super) fn exclusive_lock(&self) -> Result<LockGuard> {
        self.check_writable()?;
        self.lock_for(LockMode::Exclusive)
    }

    pub(super) fn flush_locked(&self) -> Result<()> {
        let mut inner = lock_guard(&self.inner);
        self.flush_index(&mut inner)
    }
}

impl Drop for CredentialStore {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!(store = %self.config.name, error = %e, "index flush at close failed; it will be repaired on the next open");
        }
    }
}

/// Create a new store at `config.base` with a fresh key written to `key_file`. Refuses if the
/// store already holds credential files or a key already exists (never mint a key while
/// encrypted data exists).
pub fn init_store(config: &StoreConfig, key_file: &Path, faults: &Faults) -> Result<()> {
    if let Some(existing) = keys::load(&config.key_sources)? {
        return Err(Error::Key(crate::crypto::KeyError::Exists(
            match existing.source {
                KeySource::File(p) | KeySource::SystemdCredential(p) => p,
                KeySource::Env(v) => PathBuf::from(format!("${v}")),
            },
        )));
    }
    let cred_dir = config.base.join("credentials");
    if let Ok(rd) = fs::read_dir(&cred_dir) {
        let n = rd
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".enc"))
            .count();
        if n > 0 {
            return Err(Error::Sealed {
                store: config.name.clone(),
                reason: SealedReason::NoKey {
                    files: n,
                    looked_in: config
                        .key_sources
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                },
            });
        }
    }
    durable::create_private_dir(&config.base, faults)?;
    perms::check_private_dir(&config.base)?;
    durable::create_private_dir(&cred_dir, faults)?;
    durable::create_private_dir(&config.base.join("metadata"), faults)?;
    keys::create_key_file(key_file, &crate::crypto::generate_key(), faults)?;
    Ok(())
}
