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
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use serde_json::{Map, Value};

use super::credential::{Credential, SchemaError};
use super::fsck::{Quarantined, Report};
use super::id;
use super::index::{write_index, EntryRef, Index, IndexState};
use super::{Error, Result, SealedReason};
use crate::crypto::{keys, DecryptError, KeySource, Keyring, LoadedKeys};
use crate::durable::{self, lock, Faults, FileStamp, IoError, LockGuard, LockMode, Poison};
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

/// When the index is rewritten after a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexFlush {
    /// By the writer, if no other writer of this process is queued (group commit), after
    /// re-reading the directory so that other processes' files are never dropped from it.
    /// For short-lived processes (the CLI): the index is current when they exit.
    Immediate,
    /// Never by the writer: a background flusher calls [`CredentialStore::flush`] (the daemon,
    /// every few hundred milliseconds while dirty). Writes then cost no O(n) work at all (the
    /// rewrite, O(n), happens at most a few times a second whatever the write rate); hive sees
    /// a new credential in its index within the flush interval.
    Deferred,
}

/// Options for [`CredentialStore::open`].
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Repair or look only.
    pub mode: OpenMode,
    /// When the index is rewritten.
    pub index_flush: IndexFlush,
    /// Fault-injection seam (tests); disarmed by default.
    pub faults: Faults,
    /// How long writers wait for the store lock.
    pub lock_timeout: Duration,
    /// Keep replaced credential files as spares and rewrite them in place for later writes
    /// ([`durable::Spares`]): no blocks freed or allocated per write. For the long-lived
    /// daemon; a short-lived process would leave its spares for the next open to sweep.
    pub recycle_files: bool,
    /// Cache credential files' bytes (ciphertext), vouched for by a `stat` on every read
    /// ([`durable::FileCache`]). For the daemon, which reads the same files over and over.
    pub cache_files: bool,
    /// Tighten a store directory or file of ours that is too open (the default). False: only
    /// report what would be tightened (`fsck` without `--repair`, dry runs), change nothing.
    pub fix_permissions: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            mode: OpenMode::Repair,
            index_flush: IndexFlush::Immediate,
            faults: Faults::none(),
            lock_timeout: LOCK_TIMEOUT,
            recycle_files: false,
            cache_files: false,
            fix_permissions: true,
        }
    }
}

/// One credential as `list` shows it: metadata, never secret values.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CredentialInfo {
    /// The id.
    pub id: String,
    /// Its generation.
    pub generation: u64,
    /// hive's index entry (type, provider, alias, key names, dates, tags).
    pub metadata: Value,
}

/// A credential that changed on disk since the store last looked (`sync`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Change {
    /// The id.
    pub id: String,
    /// Its generation now; `None` if it was deleted.
    pub generation: Option<u64>,
}

/// The result of `list`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Listing {
    /// Credentials, sorted by id: every readable one, plus those that cannot be read right now
    /// (clock skew, I/O error) but whose metadata is known from the index or an earlier read.
    pub credentials: Vec<CredentialInfo>,
    /// Files that could not be read (see `store fsck`).
    pub unreadable: usize,
}

/// One credential file as the store knows it.
#[derive(Clone, Debug)]
struct Entry {
    id: String,
    meta: Value,
    /// The file's stamp when `meta` was derived from it. `None` for an entry kept (from the
    /// index or an earlier scan) for a file that cannot be read right now (clock skew, I/O
    /// error): such an entry stays listed but is never vouched for.
    stamp: Option<FileStamp>,
    generation: u64,
}

enum KeyState {
    Unsealed { ring: Keyring, source: KeySource },
    Sealed(SealedReason),
}

/// The keys in use, and the stamps of every key file they were read from (taken *before*
/// reading, so a rotation landing between the read and the stamp is seen as a change).
struct KeySnapshot {
    state: KeyState,
    stamps: Vec<Option<FileStamp>>,
}

#[derive(Default)]
struct Inner {
    /// By file name.
    entries: BTreeMap<String, Entry>,
    /// Whether `entries` reflects a scan (or the index's vouches) at least once.
    seeded: bool,
    /// Unknown top-level index fields, preserved.
    index_extra: Map<String, Value>,
    /// index.json as we last read or wrote it (another writer changed it if this differs).
    index_stamp: Option<FileStamp>,
    dirty: bool,
    unreadable: usize,
    /// The file a `delete` is removing: its index entry is dropped before the unlink, so the
    /// directory scan in `refresh` must not put it back while the file still exists.
    deleting: Option<String>,
    /// Changes other processes made, found by a directory scan and not yet reported (kept only
    /// with `IndexFlush::Deferred`, i.e. in the daemon, which drains them into events).
    pending: Vec<Change>,
}

use crate::limits::FILE_CACHE_BYTES;

use crate::limits::MAX_PENDING_CHANGES;

/// What changed between two views of the entries, by id.
fn diff_entries(before: &BTreeMap<String, Entry>, after: &BTreeMap<String, Entry>) -> Vec<Change> {
    let old: std::collections::HashMap<&str, (u64, Option<FileStamp>)> = before
        .values()
        .map(|e| (e.id.as_str(), (e.generation, e.stamp)))
        .collect();
    let mut seen = std::collections::HashSet::new();
    let mut changes = Vec::new();
    for e in after.values() {
        seen.insert(e.id.as_str());
        if old.get(e.id.as_str()) != Some(&(e.generation, e.stamp)) {
            changes.push(Change {
                id: e.id.clone(),
                generation: Some(e.generation),
            });
        }
    }
    for id in old.keys().filter(|id| !seen.contains(*id)) {
        changes.push(Change {
            id: (*id).to_owned(),
            generation: None,
        });
    }
    changes
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
    /// Swapped whole on reload; readers clone the `Arc` and hold no guard during I/O.
    keys: RwLock<Arc<KeySnapshot>>,
    inner: Mutex<Inner>,
    /// The poison rule (`durable::Poison`): a failed fsync refuses writes until reopened.
    poisoned: Poison,
    waiting_writers: AtomicUsize,
    batch_depth: AtomicUsize,
    open_report: Report,
    /// Permissions tightened at open (see `private.rs`).
    perm_fixes: super::PermFixes,
    /// Replaced credential files kept for reuse (`StoreOptions::recycle_files`).
    spares: Option<durable::Spares>,
    /// Cached credential files (`StoreOptions::cache_files`).
    file_cache: Option<durable::FileCache>,
    /// The last sweep removed a full batch of orphaned spares: more may be left.
    orphans_pending: std::sync::atomic::AtomicBool,
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

/// How reading one credential file went.
enum FileRead {
    Missing,
    Ok(Credential, usize),
    /// Authentic, but stamped in the future.
    Skew(DecryptError),
    /// A well-formed token that authenticates under none of the keys.
    WrongKey,
    /// Not a usable credential file (empty, torn, not a token, not a credential, a symlink).
    Damaged(String),
    /// The OS failed to read it (EIO, EMFILE, …): says nothing about the file; never
    /// quarantined.
    Io(io::Error),
}

/// What a directory scan found.
#[derive(Default)]
struct Scan {
    entries: BTreeMap<String, Entry>,
    files: usize,
    vouched: usize,
    decrypted: usize,
    old_key: Vec<String>,
    skewed: Vec<String>,
    io_errors: Vec<String>,
    /// File name and reason: files that fail decryption, parsing or id binding.
    bad: Vec<(String, String)>,
    drift: Vec<String>,
}

/// What the rotation needs to know about one file.
pub(super) enum KeyUse {
    Primary,
    Previous,
    /// Stamped in the future; `previous`: it authenticates only under a previous key.
    Skewed {
        previous: bool,
    },
    /// Authenticates under no key, or is not a token: no key can help it.
    Undecryptable,
    /// Could not be read (I/O error).
    Unreadable(String),
}

fn lock_guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn is_eloop(e: &io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
}

impl CredentialStore {
    /// Open a store: make it private (refusing links and other owners, tightening what is ours
    /// but too open: [`CredentialStore::permission_fixes`] says what changed), load the key (or
    /// seal), and reconcile the index with the files. See [`OpenMode`] for what may be
    /// modified; permissions are tightened in every mode, read-only commands included (they
    /// are not the store's data, and leaving a store others can read is the greater harm),
    /// unless [`StoreOptions::fix_permissions`] is false.
    pub fn open(config: StoreConfig, opts: StoreOptions) -> Result<Self> {
        let base = config.base.clone();
        match fs::symlink_metadata(&base) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Error::NoStore(base)),
            Err(source) => return Err(Error::Read { path: base, source }),
        }
        let perm_fixes = super::private::make_private(&base, opts.fix_permissions)?;
        let cred_dir = base.join("credentials");
        let meta_dir = base.join("metadata");
        let mut store = CredentialStore {
            lock_path: meta_dir.join("index.lock"),
            quarantine_dir: base.join("quarantine"),
            cred_dir,
            meta_dir,
            keys: RwLock::new(Arc::new(KeySnapshot {
                state: KeyState::Sealed(SealedReason::BadKey(String::new())),
                stamps: Vec::new(),
            })),
            inner: Mutex::new(Inner::default()),
            poisoned: Poison::default(),
            waiting_writers: AtomicUsize::new(0),
            batch_depth: AtomicUsize::new(0),
            open_report: Report::default(),
            perm_fixes,
            spares: opts
                .recycle_files
                .then(|| durable::Spares::new(&base.join("credentials"))),
            file_cache: opts
                .cache_files
                .then(|| durable::FileCache::new(FILE_CACHE_BYTES)),
            orphans_pending: std::sync::atomic::AtomicBool::new(false),
            config,
            opts,
        };
        let snapshot = store.load_keys()?;
        *store.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(snapshot);
        if store.sealed_reason().is_some() || store.opts.mode == OpenMode::ReadOnly {
            return Ok(store);
        }
        durable::create_private_dir(&store.cred_dir, &store.opts.faults)?;
        durable::create_private_dir(&store.meta_dir, &store.opts.faults)?;
        if store.opts.mode == OpenMode::Deferred {
            return Ok(store);
        }
        let report = {
            let _guard = store.lock_store(LockMode::Exclusive)?;
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

    /// The permissions tightened at open: empty if the store was private already. The caller
    /// tells the user (the CLI on stderr, the daemon in its log).
    pub fn permission_fixes(&self) -> &super::PermFixes {
        &self.perm_fixes
    }

    /// The store's configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    fn keys_now(&self) -> Arc<KeySnapshot> {
        self.keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Why the store is sealed, or `None` if it has a working key.
    pub fn sealed_reason(&self) -> Option<SealedReason> {
        match &self.keys_now().state {
            KeyState::Sealed(r) => Some(r.clone()),
            KeyState::Unsealed { .. } => None,
        }
    }

    /// Fingerprints of the keys in use (primary first), for status output.
    pub fn key_fingerprints(&self) -> Vec<String> {
        match &self.keys_now().state {
            KeyState::Unsealed { ring, .. } => ring.fingerprints().to_vec(),
            KeyState::Sealed(_) => Vec::new(),
        }
    }

    /// Where the key came from, if unsealed.
    pub fn key_source(&self) -> Option<KeySource> {
        match &self.keys_now().state {
            KeyState::Unsealed { source, .. } => Some(source.clone()),
            KeyState::Sealed(_) => None,
        }
    }

    pub(super) fn faults(&self) -> &Faults {
        &self.opts.faults
    }

    /// Names of the `.enc` files in `credentials/`, sorted.
    pub(super) fn enc_files(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        let read_err = |source| Error::Read {
            path: self.cred_dir.clone(),
            source,
        };
        let rd = match fs::read_dir(&self.cred_dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(names),
            Err(e) => return Err(read_err(e)),
        };
        for e in rd {
            let e = e.map_err(read_err)?;
            if let Some(name) = e.file_name().to_str() {
                if name.ends_with(".enc") && !durable::is_temp_name(name) {
                    names.push(name.to_owned());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    fn key_file_stamps(&self) -> Vec<Option<FileStamp>> {
        self.config
            .key_sources
            .iter()
            .flat_map(|s| match s {
                KeySource::File(p) | KeySource::SystemdCredential(p) => {
                    vec![stamp_of(p), stamp_of(&keys::prev_path(p))]
                }
                KeySource::Env(_) => Vec::new(),
            })
            .collect()
    }

    /// Whether `ring` opens file `name`: `Some(true)` it authenticates (even if stamped in
    /// the future or not a credential), `Some(false)` a well-formed token that does not,
    /// `None` no evidence either way (missing, empty, malformed, unreadable).
    fn key_opens(&self, ring: &Keyring, name: &str) -> Option<bool> {
        let bytes =
            durable::read_capped(&self.cred_dir.join(name), MAX_CREDENTIAL_FILE_BYTES).ok()??;
        let token = std::str::from_utf8(&bytes).ok()?;
        match ring.decrypt(token) {
            Ok(_) | Err(DecryptError::ClockSkew { .. }) => Some(true),
            Err(DecryptError::Invalid) => Some(false),
            Err(DecryptError::Malformed) => None,
        }
    }

    /// Load keys and decide sealed/unsealed. Unsafe key permissions are an error (refuse).
    fn load_keys(&self) -> Result<KeySnapshot> {
        let stamps = self.key_file_stamps();
        let sealed = |reason| {
            Ok(KeySnapshot {
                state: KeyState::Sealed(reason),
                stamps: stamps.clone(),
            })
        };
        let sources = &self.config.key_sources;
        let looked_in = sources
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let loaded = match keys::load(sources) {
            Ok(l) => l,
            Err(e @ crate::crypto::KeyError::Malformed { .. }) => {
                return sealed(SealedReason::BadKey(e.to_string()))
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
            return sealed(SealedReason::NoKey {
                files: files.len(),
                looked_in,
            });
        };
        let Some(ring) = Keyring::new(&primary, &previous) else {
            return sealed(SealedReason::BadKey(format!(
                "{source} does not hold a Fernet key"
            )));
        };
        // The key must open at least one existing file; otherwise it is the wrong key and
        // nothing may be written with it (files would end up under two keys) or quarantined.
        // Only authentication failures count: empty or torn files say nothing about the key.
        let mut refused = 0;
        let mut opened = false;
        for name in &files {
            match self.key_opens(&ring, name) {
                Some(true) => {
                    opened = true;
                    break;
                }
                Some(false) => refused += 1,
                None => {}
            }
            if refused >= KEY_CHECK_SAMPLE {
                break;
            }
        }
        if !opened && refused > 0 {
            return sealed(SealedReason::WrongKey {
                tried: refused,
                source: source.to_string(),
            });
        }
        Ok(KeySnapshot {
            state: KeyState::Unsealed { ring, source },
            stamps,
        })
    }

    /// Reload the keys if any key file changed (another process rotated, or a person restored
    /// a key). Never fails: a key that became unusable seals the store, with the reason.
    fn reload_keys_if_changed(&self) {
        if self.key_file_stamps() != self.keys_now().stamps {
            self.reload_keys();
        }
    }

    /// A sealed store looks at its key files again (a stat each) before answering `sealed`:
    /// a person who restores the key should not have to restart the daemon.
    fn unseal_if_key_restored(&self) {
        if matches!(self.keys_now().state, KeyState::Sealed(_)) {
            self.reload_keys_if_changed();
        }
    }

    pub(super) fn reload_keys(&self) {
        let snapshot = self.load_keys().unwrap_or_else(|e| KeySnapshot {
            state: KeyState::Sealed(SealedReason::BadKey(e.to_string())),
            stamps: self.key_file_stamps(),
        });
        match &snapshot.state {
            KeyState::Sealed(reason) => {
                tracing::error!(store = %self.config.name, %reason, "key files changed and no longer open the store")
            }
            KeyState::Unsealed { ring, .. } => {
                tracing::info!(store = %self.config.name, keys = ?ring.fingerprints(), "key files changed; reloaded keys")
            }
        }
        *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(snapshot);
    }

    fn sealed_error(&self, reason: SealedReason) -> Error {
        Error::Sealed {
            store: self.config.name.clone(),
            reason,
        }
    }

    /// Run `f` with the keyring, or fail with `sealed`. No lock is held while `f` runs.
    pub(super) fn with_ring<T>(&self, f: impl FnOnce(&Keyring) -> Result<T>) -> Result<T> {
        self.unseal_if_key_restored();
        let keys = self.keys_now();
        match &keys.state {
            KeyState::Unsealed { ring, .. } => f(ring),
            KeyState::Sealed(r) => Err(self.sealed_error(r.clone())),
        }
    }

    /// Take the store lock, then pick up key files another process changed while we waited:
    /// every decision made under the lock (quarantine, re-encryption, writes) uses the keys
    /// as they are now.
    fn lock_store(&self, mode: LockMode) -> Result<LockGuard> {
        let guard = lock::lock(&self.lock_path, mode, self.opts.lock_timeout)?;
        self.reload_keys_if_changed();
        Ok(guard)
    }

    /// Turn a failed durable step into an error, poisoning the store if it was an fsync.
    pub(super) fn io_failed(&self, err: IoError) -> Error {
        if err.is_fsync() {
            tracing::error!(store = %self.config.name, "a write of this store failed its fsync");
        }
        self.poisoned.note(&err);
        Error::Io(err)
    }

    fn check_writable(&self) -> Result<()> {
        self.unseal_if_key_restored();
        if let Some(reason) = self.sealed_reason() {
            return Err(self.sealed_error(reason));
        }
        if self.opts.mode == OpenMode::ReadOnly {
            return Err(Error::Unsupported(
                "store was opened read-only (fsck without --repair); writes are refused".into(),
            ));
        }
        if let Some(msg) = self.poisoned.reason() {
            return Err(Error::Poisoned(msg));
        }
        Ok(())
    }

    /// Read and decrypt one credential file, classifying the outcome.
    fn read_file(&self, name: &str, ring: &Keyring) -> FileRead {
        self.read_file_via(name, ring, false)
    }

    /// [`Self::read_file`], through the file cache if `cached` and the store has one. Only
    /// plain reads use the cache; read-modify-write (under the lock) reads the file itself.
    fn read_file_via(&self, name: &str, ring: &Keyring, cached: bool) -> FileRead {
        let read = match &self.file_cache {
            Some(cache) if cached => cache.read(&self.cred_dir, name, MAX_CREDENTIAL_FILE_BYTES),
            _ => durable::read_capped(&self.cred_dir.join(name), MAX_CREDENTIAL_FILE_BYTES)
                .map(|b| b.map(Arc::from)),
        };
        let bytes: Arc<[u8]> = match read {
            Ok(Some(b)) => b,
            Ok(None) => return FileRead::Missing,
            Err(e) if is_eloop(&e) => {
                return FileRead::Damaged("is a symlink; refusing to follow it".into())
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return FileRead::Damaged(format!("is unusable: {e}"))
            }
            Err(e) => return FileRead::Io(e),
        };
        decode(&bytes, ring)
    }

    /// Read the credential stored under `id`'s file name: `Ok(None)` if there is no file.
    /// Files that fail are errors (integrity, clock skew, I/O), never silently "missing".
    fn read_for(&self, id: &str, ring: &Keyring) -> Result<Option<Credential>> {
        self.read_for_via(id, ring, false)
    }

    /// [`Self::read_for`], through the file cache if `cached`.
    fn read_for_via(&self, id: &str, ring: &Keyring, cached: bool) -> Result<Option<Credential>> {
        let name = id::file_name(id);
        let integrity = |reason: String| Error::Integrity {
            what: format!("credential {id:?} (file {name})"),
            reason,
        };
        match self.read_file_via(&name, ring, cached) {
            FileRead::Missing => Ok(None),
            FileRead::Ok(c, _) => Ok(Some(c)),
            FileRead::Skew(source) => Err(Error::ClockSkew {
                id: id.to_owned(),
                source,
            }),
            FileRead::WrongKey => Err(integrity(DecryptError::Invalid.to_string())),
            FileRead::Damaged(reason) => Err(integrity(reason)),
            FileRead::Io(source) => Err(Error::Read {
                path: self.cred_dir.join(&name),
                source,
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
                reason: swapped_reason(found.id()),
            })
        }
    }

    /// Read credential `id`. The id inside the file must equal `id`.
    pub fn get(&self, id: &str) -> Result<Credential> {
        id::validate(id)?;
        let found = match self.with_ring(|ring| self.read_for_via(id, ring, true)) {
            // A rotation by another process re-encrypts files under a key we have not loaded.
            Err(Error::Integrity { .. }) => {
                self.reload_keys_if_changed();
                self.with_ring(|ring| self.read_for(id, ring))?
            }
            // Another id's content: a read that raced a replacement sees a whole but foreign
            // value. Read once more before calling it a swapped file.
            Ok(Some(c)) if c.id() != id => self.with_ring(|ring| self.read_for(id, ring))?,
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

    /// [`Self::get`] answered from the file cache alone (one `lstat`, no file opened, no key
    /// reload): `Some` only for a clean success; `None` when anything else would need the full
    /// path (not cached, changed, racy, missing, sealed, an error).
    /// The daemon answers these on the connection's task instead of the blocking pool.
    pub fn get_cached(&self, id: &str) -> Option<Result<Credential>> {
        let cache = self.file_cache.as_ref()?;
        id::validate(id).ok()?;
        let name = id::file_name(id);
        let keys = self.keys_now();
        let KeyState::Unsealed { ring, .. } = &keys.state else {
            return None;
        };
        let bytes = cache.peek(&self.cred_dir, &name)?;
        match decode(&bytes, ring) {
            FileRead::Ok(c, _) if c.id() == id => Some(Ok(c)),
            _ => None,
        }
    }

    /// Encrypt arbitrary bytes with this store's primary key (the stream journal's records and
    /// run state files are sealed with the default store's key).
    pub fn seal(&self, plaintext: &[u8]) -> Result<String> {
        self.with_ring(|ring| Ok(ring.encrypt(plaintext)))
    }

    /// Decrypt what [`Self::seal`] produced, with any key of the ring.
    pub fn unseal(&self, token: &str) -> Result<crate::crypto::SecretBytes> {
        self.with_ring(|ring| {
            ring.decrypt(token)
                .map(|(plain, _)| plain)
                .map_err(|e| Error::Integrity {
                    what: "a sealed stream record".into(),
                    reason: e.to_string(),
                })
        })
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
                return Err(Error::InvalidCredential(SchemaError::IdMismatch));
            }
            new.check().map_err(Error::InvalidCredential)?;
            let generation = current + 1;
            new.stamp_write(created.as_ref());
            new.set_generation(generation);
            let token = ring.encrypt(&new.to_bytes());
            let stamp = match &self.spares {
                Some(spares) => durable::atomic_write_recycling(
                    &self.cred_dir,
                    &name,
                    token.as_bytes(),
                    self.faults(),
                    spares,
                ),
                None => {
                    durable::atomic_write(&self.cred_dir, &name, token.as_bytes(), self.faults())
                }
            }
            .map_err(|e| self.io_failed(e))?;
            inner.entries.insert(
                name,
                Entry {
                    id: id.to_owned(),
                    meta: new.index_entry(),
                    stamp: Some(stamp),
                    generation,
                },
            );
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
            let flushed = self.flush_index(inner, ring);
            inner.deleting = None;
            if let Err(e) = flushed {
                if let Some(entry) = removed {
                    inner.entries.insert(name, entry);
                }
                return Err(e);
            }
            let existed = durable::remove_durably(&self.cred_dir, &name, self.faults())
                .map_err(|e| self.io_failed(e))?;
            // Its earlier versions, kept as spares, go with it.
            if let Some(spares) = &self.spares {
                spares.purge_from(&name);
            }
            Ok(existed)
        })
    }

    /// Remove another batch of orphaned spares (left by a process that died), if the last
    /// sweep left some: a batch at a time, so their discards never stall the file system's
    /// commits for long. The daemon calls it from its flusher. Returns how many went.
    pub fn sweep_orphans(&self) -> Result<usize> {
        if !self.orphans_pending.load(Ordering::SeqCst) || self.check_writable().is_err() {
            return Ok(0);
        }
        let _guard = self.lock_store(LockMode::Exclusive)?;
        let swept = durable::sweep_temp_files(&self.cred_dir, self.faults())
            .map_err(|e| self.io_failed(e))?;
        let orphans = swept.iter().filter(|n| durable::is_spare_name(n)).count();
        self.orphans_pending
            .store(orphans >= durable::ORPHAN_SWEEP_BATCH, Ordering::SeqCst);
        Ok(orphans)
    }

    /// Replaced files kept for reuse, if this store recycles them (`recycle_files`).
    pub fn spares(&self) -> Option<&durable::Spares> {
        self.spares.as_ref()
    }

    /// Metadata of every credential (never secret values), fresh from the directory.
    /// Files that cannot be read are counted in `unreadable` (and listed with their last known
    /// metadata if they had any).
    pub fn list(&self) -> Result<Listing> {
        self.reload_keys_if_changed();
        self.with_ring(|ring| {
            let mut inner = lock_guard(&self.inner);
            self.refresh(&mut inner, ring)?;
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
        })
    }

    /// Pick up changes other processes made to the files (hive, an offline CLI, a person
    /// copying files): refresh from the directory, return the credentials that appeared,
    /// changed or disappeared, and rewrite the index if it drifted. Cheap when nothing changed
    /// (one stat per file). Writes made through this handle are already known and are not
    /// reported again.
    pub fn sync(&self) -> Result<Vec<Change>> {
        self.reload_keys_if_changed();
        let changes = self.with_ring(|ring| {
            let mut inner = lock_guard(&self.inner);
            let was_seeded = inner.seeded;
            let before = std::mem::take(&mut inner.entries);
            inner.entries = before.clone();
            self.refresh(&mut inner, ring)?;
            let mut changes = std::mem::take(&mut inner.pending);
            if was_seeded && self.opts.index_flush == IndexFlush::Immediate {
                changes = diff_entries(&before, &inner.entries);
            }
            Ok(changes)
        })?;
        self.flush()?;
        Ok(changes)
    }

    /// Changes other processes made that a directory scan (an index rewrite's) found and
    /// nobody has reported yet. The daemon drains them after each background flush.
    pub fn take_changes(&self) -> Vec<Change> {
        std::mem::take(&mut lock_guard(&self.inner).pending)
    }

    /// Like [`CredentialStore::sync`], but look only at the files named (the file watcher knows
    /// which changed): a stat each, a decryption for those whose stamp differs. Names that are
    /// not credential files are ignored, except `index.json`: if another process rewrote it,
    /// the index is marked dirty so that ours (a full view) replaces it. O(changed files), not
    /// O(store): the daemon's own writes come back as events and cost a stat each.
    pub fn sync_files(&self, names: &[String]) -> Result<Vec<Change>> {
        self.reload_keys_if_changed();
        self.with_ring(|ring| {
            let mut inner = lock_guard(&self.inner);
            if !inner.seeded {
                self.refresh(&mut inner, ring)?;
                return Ok(Vec::new());
            }
            let mut changes = Vec::new();
            for name in names {
                if name == INDEX_FILE {
                    if stamp_of(&self.meta_dir.join(INDEX_FILE)) != inner.index_stamp {
                        inner.dirty = true;
                    }
                    continue;
                }
                if !name.ends_with(".enc") || durable::is_temp_name(name) {
                    continue;
                }
                if inner.deleting.as_deref() == Some(name.as_str()) {
                    continue;
                }
                let stamp = stamp_of(&self.cred_dir.join(name));
                let known = inner.entries.get(name);
                if stamp.is_some() && known.is_some_and(|e| e.stamp == stamp) {
                    continue;
                }
                match (stamp, self.read_file(name, ring)) {
                    (Some(stamp), FileRead::Ok(c, _)) if id::file_name(c.id()) == *name => {
                        let entry = Entry {
                            id: c.id().to_owned(),
                            meta: c.index_entry(),
                            stamp: Some(stamp),
                            generation: c.generation(),
                        };
                        changes.push(Change {
                            id: entry.id.clone(),
                            generation: Some(entry.generation),
                        });
                        inner.entries.insert(name.clone(), entry);
                        inner.dirty = true;
                    }
                    (_, FileRead::Missing) => {
                        if let Some(gone) = inner.entries.remove(name) {
                            changes.push(Change {
                                id: gone.id,
                                generation: None,
                            });
                            inner.dirty = true;
                        }
                    }
                    // Unreadable or damaged: keep what we knew; fsck reports it.
                    _ => {}
                }
            }
            let mut all = std::mem::take(&mut inner.pending);
            all.extend(changes);
            Ok(all)
        })
    }

    /// Run a write under the store lock, then rewrite the index if this was the last queued
    /// writer of the process (group commit of index rewrites). The rewrite check runs on every
    /// exit path once the lock is held, so an early error cannot strand an earlier writer's
    /// pending index change.
    fn write_op<T>(&self, f: impl FnOnce(&mut Inner, &Keyring) -> Result<T>) -> Result<T> {
        self.check_writable()?;
        self.waiting_writers.fetch_add(1, Ordering::SeqCst);
        let guard = self.lock_store(LockMode::Exclusive);
        self.waiting_writers.fetch_sub(1, Ordering::SeqCst);
        let _guard = guard?;
        let keys = self.keys_now();
        let mut inner = lock_guard(&self.inner);
        // Re-check under the lock: another thread may have poisoned the store meanwhile.
        let result = self.check_writable().and_then(|()| match &keys.state {
            KeyState::Unsealed { ring, .. } => f(&mut inner, ring),
            KeyState::Sealed(r) => Err(self.sealed_error(r.clone())),
        });
        if inner.dirty
            && self.opts.index_flush == IndexFlush::Immediate
            && self.waiting_writers.load(Ordering::SeqCst) == 0
            && self.batch_depth.load(Ordering::SeqCst) == 0
            && self.poisoned.reason().is_none()
        {
            if let KeyState::Unsealed { ring, .. } = &keys.state {
                if let Err(e) = self.flush_index(&mut inner, ring) {
                    // The credential itself is durable; the index is a cache rebuilt on open.
                    tracing::warn!(store = %self.config.name, error = %e, "index rewrite failed; it will be repaired on the next open");
                }
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

    /// Flush pending index changes now (callers that batch writes, and `Drop`). Nothing to do
    /// for a sealed, read-only or poisoned store.
    pub fn flush(&self) -> Result<()> {
        if self.check_writable().is_err() || !lock_guard(&self.inner).dirty {
            return Ok(());
        }
        let _guard = self.lock_store(LockMode::Exclusive)?;
        let mut inner = lock_guard(&self.inner);
        if !inner.dirty {
            return Ok(());
        }
        self.with_ring(|ring| self.flush_index(&mut inner, ring))
    }

    /// Rewrite index.json from the files. Caller holds the store lock. Refreshes from the
    /// directory first (another process may have written files since our last look) and picks
    /// up unknown top-level fields if another writer rewrote the index meanwhile.
    fn flush_index(&self, inner: &mut Inner, ring: &Keyring) -> Result<()> {
        // Always from the directory as it is now (a stat per file), never from a view a missed
        // watcher event could have left stale: an index written by one process must never
        // drop a credential another process added, nor list one it deleted.
        self.refresh(inner, ring)?;
        let index_path = self.meta_dir.join(INDEX_FILE);
        if stamp_of(&index_path) != inner.index_stamp {
            if let (on_disk, IndexState::Ok, _) = self.read_index() {
                inner.index_extra = on_disk.extra;
            }
        }
        let entries: Vec<EntryRef<'_>> = inner
            .entries
            .iter()
            .map(|(name, e)| EntryRef {
                file: name,
                id: &e.id,
                meta: &e.meta,
                vouch: e.stamp.map(|s| (s, e.generation)),
            })
            .collect();
        let bytes = write_index(
            &self.config.base.to_string_lossy(),
            &inner.index_extra,
            &entries,
        );
        drop(entries);
        let stamp = durable::atomic_write(&self.meta_dir, INDEX_FILE, &bytes, self.faults())
            .map_err(|e| self.io_failed(e))?;
        inner.index_stamp = Some(stamp);
        inner.dirty = false;
        Ok(())
    }

    /// Whether the index has changes not yet written (the daemon's flusher polls this).
    pub fn is_dirty(&self) -> bool {
        lock_guard(&self.inner).dirty
    }

    /// Bring the in-memory entries up to date with the directory: stat every file, decrypt
    /// only those whose stamp changed (or, the first time, that the index does not vouch for).
    /// A file that cannot be read keeps its last known entry. Modifies nothing on disk.
    fn refresh(&self, inner: &mut Inner, ring: &Keyring) -> Result<()> {
        let seed = if inner.seeded {
            None
        } else {
            let (index, state, stamp) = self.read_index();
            (state == IndexState::Ok).then_some((index, stamp))
        };
        let seed_ref = seed.as_ref().map(|(i, s)| (i, *s));
        let scan = self.scan(
            ring,
            &inner.entries,
            seed_ref,
            false,
            inner.deleting.as_deref(),
        )?;
        let mut fresh = scan.entries;
        for (name, _) in &scan.bad {
            if let Some(e) = inner.entries.get(name) {
                fresh.insert(
                    name.clone(),
                    Entry {
                        stamp: None,
                        ..e.clone()
                    },
                );
            }
        }
        let changed = fresh.len() != inner.entries.len()
            || fresh
                .iter()
                .zip(&inner.entries)
                .any(|(a, b)| a.0 != b.0 || a.1.stamp != b.1.stamp);
        if changed && inner.seeded {
            inner.dirty = true;
            if self.opts.index_flush == IndexFlush::Deferred {
                // Whoever scans first (the flusher, a list, the watcher) must not swallow a
                // change that watchers should hear about: keep it for `take_changes`.
                let found = diff_entries(&inner.entries, &fresh);
                inner.pending.extend(found);
                let excess = inner.pending.len().saturating_sub(MAX_PENDING_CHANGES);
                inner.pending.drain(..excess);
            }
        }
        inner.entries = fresh;
        inner.seeded = true;
        inner.unreadable = scan.bad.len() + scan.skewed.len() + scan.io_errors.len();
        Ok(())
    }

    /// Read index.json: the parsed index (empty if unusable), its state, and its stamp.
    fn read_index(&self) -> (Index, IndexState, Option<FileStamp>) {
        let path = self.meta_dir.join(INDEX_FILE);
        let stamp = stamp_of(&path);
        let (index, state) = match durable::read_capped(&path, MAX_INDEX_FILE_BYTES) {
            Ok(None) => (Index::default(), IndexState::Missing),
            Ok(Some(bytes)) => match Index::parse(&bytes) {
                Ok(idx) => (idx, IndexState::Ok),
                Err(state) => (Index::default(), state),
            },
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                (Index::default(), IndexState::TooBig)
            }
            Err(_) => (Index::default(), IndexState::Unparseable),
        };
        (index, state, stamp)
    }

    /// Scan `credentials/`: trust files whose stamp matches a known entry or (racily clean)
    /// an index vouch, decrypt the rest (all of them when `full`). Modifies nothing.
    fn scan(
        &self,
        ring: &Keyring,
        known: &BTreeMap<String, Entry>,
        index: Option<(&Index, Option<FileStamp>)>,
        full: bool,
        skip: Option<&str>,
    ) -> Result<Scan> {
        let mut scan = Scan::default();
        let names = self.enc_files()?;
        scan.files = names.len();
        for name in names {
            if skip == Some(name.as_str()) {
                continue;
            }
            let Some(stamp) = stamp_of(&self.cred_dir.join(&name)) else {
                continue;
            };
            if !full {
                if let Some(e) = known.get(&name).filter(|e| e.stamp == Some(stamp)) {
                    scan.vouched += 1;
                    scan.entries.insert(name, e.clone());
                    continue;
                }
                if let Some((idx, index_stamp)) = index {
                    if let Some(e) = vouched_entry(idx, index_stamp, &name, stamp) {
                        scan.vouched += 1;
                        scan.entries.insert(name, e);
                        continue;
                    }
                }
            }
            scan.decrypted += 1;
            // What to keep listing if the file cannot be read now.
            let fallback = || {
                known.get(&name).cloned().or_else(|| {
                    let (idx, _) = index?;
                    let (cid, meta) = idx
                        .credentials
                        .iter()
                        .find(|(cid, _)| id::file_name(cid) == name)?;
                    Some(Entry {
                        id: cid.clone(),
                        meta: meta.clone(),
                        stamp: None,
                        generation: idx.vouches.get(&name).map_or(0, |v| v.generation),
                    })
                })
            };
            match self.read_file(&name, ring) {
                FileRead::Missing => {}
                FileRead::Ok(c, key_idx) => {
                    if id::file_name(c.id()) != name {
                        scan.bad.push((name, swapped_reason(c.id())));
                        continue;
                    }
                    if key_idx > 0 {
                        scan.old_key.push(name.clone());
                    }
                    let meta = c.index_entry();
                    if let Some((idx, _)) = index {
                        if idx.credentials.get(c.id()).is_some_and(|m| *m != meta) {
                            scan.drift.push(c.id().to_owned());
                        }
                    }
                    let entry = Entry {
                        id: c.id().to_owned(),
                        meta,
                        stamp: Some(stamp),
                        generation: c.generation(),
                    };
                    scan.entries.insert(name, entry);
                }
                // Unreadable right now, not damaged: keep listing what we knew about it.
                unreadable @ (FileRead::Skew(_) | FileRead::Io(_)) => {
                    match &unreadable {
                        FileRead::Skew(e) => scan.skewed.push(format!("{name}: {e}")),
                        FileRead::Io(e) => scan.io_errors.push(format!("{name}: {e}")),
                        _ => {}
                    }
                    if let Some(keep) = fallback() {
                        let keep = Entry {
                            stamp: None,
                            ..keep
                        };
                        scan.entries.insert(name, keep);
                    }
                }
                FileRead::WrongKey => scan.bad.push((name, DecryptError::Invalid.to_string())),
                FileRead::Damaged(reason) => scan.bad.push((name, reason)),
            }
        }
        Ok(scan)
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
                // A full batch of orphaned spares: there may be more (see sweep_orphans).
                if swept.iter().filter(|n| durable::is_spare_name(n)).count()
                    >= durable::ORPHAN_SWEEP_BATCH
                {
                    self.orphans_pending.store(true, Ordering::SeqCst);
                }
                report.temp_files.extend(swept);
            } else {
                report.temp_files.extend(durable::leftover_names(dir));
            }
        }
        let (index, state, index_stamp) = self.read_index();
        report.set_index_state(&state);
        if let Ok(rd) = fs::read_dir(&self.cred_dir) {
            report.stray = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    !n.ends_with(".enc") && !durable::is_temp_name(n) && !durable::is_spare_name(n)
                })
                .collect();
            report.stray.sort();
        }
        let scan = self.with_ring(|ring| {
            self.scan(
                ring,
                &BTreeMap::new(),
                Some((&index, index_stamp)),
                full,
                None,
            )
        })?;
        if state == IndexState::Missing && scan.files == 0 {
            // A new, empty store: nothing to rebuild; the first write creates the index.
            report.index_rebuilt = false;
        }
        report.files = scan.files;
        report.vouched = scan.vouched;
        report.decrypted = scan.decrypted;
        report.old_key = scan.old_key;
        report.clock_skew = scan.skewed;
        report.io_errors = scan.io_errors;
        report.drift = scan.drift;
        let entries = scan.entries;
        if state == IndexState::Ok {
            let ids: std::collections::HashSet<&str> =
                entries.values().map(|e| e.id.as_str()).collect();
            report.orphans = entries
                .values()
                .filter(|e| !index.credentials.contains_key(&e.id))
                .map(|e| e.id.clone())
                .collect();
            report.ghosts = index
                .credentials
                .keys()
                .filter(|cid| !ids.contains(cid.as_str()))
                .cloned()
                .collect();
        }
        for (name, reason) in scan.bad {
            let moved_to = if repair {
                let to = durable::move_aside(&self.cred_dir, &name, &self.quarantine_dir, faults)
                    .map_err(|e| self.io_failed(e))?;
                tracing::warn!(file = %name, %reason, moved_to = %to.display(), "quarantined credential file");
                Some(to)
            } else {
                None
            };
            report.quarantined.push(Quarantined {
                file: name,
                reason,
                moved_to,
            });
        }
        report.readable = entries.values().filter(|e| e.stamp.is_some()).count();
        let vouched: Vec<(&String, FileStamp)> = entries
            .iter()
            .filter_map(|(n, e)| e.stamp.map(|s| (n, s)))
            .collect();
        let vouches_match = vouched.len() == index.vouches.len()
            && vouched
                .iter()
                .all(|(n, s)| index.vouches.get(*n).is_some_and(|v| v.stamp == *s));
        let needs_rewrite = state != IndexState::Ok
            || !report.orphans.is_empty()
            || !report.ghosts.is_empty()
            || !report.drift.is_empty()
            || !report.quarantined.is_empty()
            || !vouches_match;
        inner.entries = entries;
        inner.seeded = true;
        inner.index_extra = index.extra;
        inner.index_stamp = index_stamp;
        inner.unreadable =
            report.clock_skew.len() + report.io_errors.len() + report.quarantined.len();
        inner.dirty = needs_rewrite;
        if repair && needs_rewrite {
            self.with_ring(|ring| self.flush_index(inner, ring))?;
            report.index_rewritten = true;
        }
        Ok(report)
    }

    /// Scan the store and report (fsck). With `repair`, fix what is found: remove temp
    /// files, rebuild or correct the index, quarantine damaged files. Every file is decrypted.
    pub fn fsck(&self, repair: bool) -> Result<Report> {
        // Pending index changes are not problems: write them first (no-op when read-only).
        self.flush()?;
        if repair {
            self.check_writable()?;
        } else if let Some(reason) = self.sealed_reason() {
            return Err(self.sealed_error(reason));
        }
        // A read-only look takes the lock shared, but only if the lock file exists: creating
        // it would be a modification.
        let _guard = if repair {
            Some(self.lock_store(LockMode::Exclusive)?)
        } else if self.lock_path.is_file() {
            Some(self.lock_store(LockMode::Shared)?)
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

    /// Which key file `name` needs (rotation). Works on the raw token: a file that
    /// authenticates under an old key but is not a valid credential still needs that key.
    pub(super) fn key_use(&self, name: &str) -> Result<KeyUse> {
        self.with_ring(|ring| {
            let path = self.cred_dir.join(name);
            let bytes = match durable::read_capped(&path, MAX_CREDENTIAL_FILE_BYTES) {
                Ok(Some(b)) => b,
                Ok(None) => return Ok(KeyUse::Primary),
                Err(e) if is_eloop(&e) || e.kind() == io::ErrorKind::InvalidData => {
                    return Ok(KeyUse::Undecryptable)
                }
                Err(e) => return Ok(KeyUse::Unreadable(format!("{name}: {e}"))),
            };
            let Ok(token) = std::str::from_utf8(&bytes) else {
                return Ok(KeyUse::Undecryptable);
            };
            Ok(match ring.decrypt(token) {
                Ok((_, 0)) => KeyUse::Primary,
                Ok(_) => KeyUse::Previous,
                Err(DecryptError::ClockSkew { key_index, .. }) => KeyUse::Skewed {
                    previous: key_index > 0,
                },
                Err(DecryptError::Invalid | DecryptError::Malformed) => KeyUse::Undecryptable,
            })
        })
    }

    /// Re-encrypt one file with the primary key if it is under a previous key, keeping its
    /// plaintext byte for byte. Caller holds the store lock. Returns whether it was rewritten.
    pub(super) fn reencrypt_file(&self, name: &str) -> Result<bool> {
        let mut inner = lock_guard(&self.inner);
        self.with_ring(|ring| {
            let path = self.cred_dir.join(name);
            let Ok(Some(bytes)) = durable::read_capped(&path, MAX_CREDENTIAL_FILE_BYTES) else {
                return Ok(false);
            };
            let Ok(token) = std::str::from_utf8(&bytes) else {
                return Ok(false);
            };
            let Ok((plain, idx)) = ring.decrypt(token) else {
                return Ok(false);
            };
            if idx == 0 {
                return Ok(false);
            }
            let token = ring.encrypt(plain.expose());
            let stamp =
                durable::atomic_write(&self.cred_dir, name, token.as_bytes(), self.faults())
                    .map_err(|e| self.io_failed(e))?;
            if let Some(e) = inner.entries.get_mut(name) {
                e.stamp = Some(stamp);
            }
            inner.dirty = true;
            Ok(true)
        })
    }

    /// Take the store lock for a writer outside `write_op` (rotation).
    pub(super) fn exclusive_lock(&self) -> Result<LockGuard> {
        self.check_writable()?;
        self.lock_store(LockMode::Exclusive)
    }

    /// Rewrite the index now. Caller holds the store lock.
    pub(super) fn flush_locked(&self) -> Result<()> {
        let mut inner = lock_guard(&self.inner);
        self.with_ring(|ring| self.flush_index(&mut inner, ring))
    }
}

/// Decrypt and parse the bytes of a credential file.
fn decode(bytes: &[u8], ring: &Keyring) -> FileRead {
    let Ok(token) = std::str::from_utf8(bytes) else {
        return FileRead::Damaged("is not a Fernet token (not text)".into());
    };
    if token.trim().is_empty() {
        return FileRead::Damaged("is empty".into());
    }
    match ring.decrypt(token) {
        Ok((plain, key_idx)) => match Credential::parse(plain.expose()) {
            Ok(c) => FileRead::Ok(c, key_idx),
            Err(e) => FileRead::Damaged(format!("decrypts, but is not a credential: {e}")),
        },
        Err(e @ DecryptError::ClockSkew { .. }) => FileRead::Skew(e),
        Err(DecryptError::Invalid) => FileRead::WrongKey,
        Err(e @ DecryptError::Malformed) => FileRead::Damaged(e.to_string()),
    }
}

/// An index entry that vouches for file `name` with stamp `stamp`, if it does: the recorded
/// stamp matches, the recorded id maps to this file name and has an entry, and the file is
/// *racily clean* (git's rule): its mtime is strictly older than the index's, so an in-place
/// rewrite in the same timestamp tick as the index write cannot hide behind an equal stamp.
fn vouched_entry(
    index: &Index,
    index_stamp: Option<FileStamp>,
    name: &str,
    stamp: FileStamp,
) -> Option<Entry> {
    let v = index.vouches.get(name)?;
    let racily_clean = index_stamp.is_some_and(|i| stamp.mtime_ns < i.mtime_ns);
    if v.stamp != stamp || !racily_clean || id::file_name(&v.id) != name {
        return None;
    }
    Some(Entry {
        id: v.id.clone(),
        meta: index.credentials.get(&v.id)?.clone(),
        stamp: Some(stamp),
        generation: v.generation,
    })
}

fn swapped_reason(found_id: &str) -> String {
    format!(
        "the file holds credential {found_id:?}, whose file would be {}: files were swapped or renamed",
        id::file_name(found_id)
    )
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
/// encrypted data exists). Runs under the store lock, and the key file is created with a
/// no-replace link, so two racing `init`s cannot both create a key.
///
/// A base directory that exists but is too open (made by hand with `mkdir`) is tightened as
/// [`CredentialStore::open`] does; the changes are returned for the caller to report.
pub fn init_store(
    config: &StoreConfig,
    key_file: &Path,
    faults: &Faults,
) -> Result<super::PermFixes> {
    let cred_dir = config.base.join("credentials");
    let meta_dir = config.base.join("metadata");
    durable::create_private_dir(&config.base, faults)?;
    let fixes = super::private::make_private(&config.base, true)?;
    durable::create_private_dir(&cred_dir, faults)?;
    durable::create_private_dir(&meta_dir, faults)?;
    let _guard = lock::lock(
        &meta_dir.join("index.lock"),
        LockMode::Exclusive,
        LOCK_TIMEOUT,
    )?;
    if let Some(existing) = keys::load(&config.key_sources)? {
        return Err(Error::Key(crate::crypto::KeyError::Exists(
            match existing.source {
                KeySource::File(p) | KeySource::SystemdCredential(p) => p,
                KeySource::Env(v) => PathBuf::from(format!("${v}")),
            },
        )));
    }
    let n = fs::read_dir(&cred_dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".enc"))
                .count()
        })
        .unwrap_or(0);
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
    keys::create_key_file(key_file, &crate::crypto::generate_key(), faults)?;
    Ok(fixes)
}
