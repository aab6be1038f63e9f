//! [`CredentialStore`]: its types, its state and `open`. The operations live beside it, one
//! concern a file: `keyring.rs` (keys: load, reload, seal), `read.rs` (reading and classifying
//! files, get), `write.rs` (set and update with compare-and-swap, delete, batches), `flush.rs`
//! (the index write-behind), `scan.rs` (list, the directory scan and its changes, reconcile,
//! fsck); `../rotate.rs` is key rotation.
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

mod flush;
mod generations;
mod keyring;
mod read;
mod scan;

use read::{swapped_reason, vouched_entry, FileRead};
mod write;

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
use super::identity::{self, StoreId};
use super::index::{write_index, EntryRef, Index, IndexState};
use super::{Error, Result, SealedReason};
use crate::crypto::{keys, DecryptError, KeySource, Keyring, LoadedKeys};
use crate::durable::{self, lock, Faults, FileStamp, IoError, LockGuard, LockMode, Poison};
use crate::limits::{
    LOCK_TIMEOUT, MAX_CREDENTIAL_FILE_BYTES, MAX_INDEX_FILE_BYTES, MAX_SCAN_FILE_BYTES,
};

/// Where a store lives and where its key comes from.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// A name for messages (`default`, or the directory for `--store-dir`).
    pub name: String,
    /// The store's base directory (holding `credentials/` and `metadata/`).
    pub base: PathBuf,
    /// Key sources, tried in order (before the store's own key file, if it has one).
    pub key_sources: Vec<KeySource>,
    /// holdfast's key directory, for a store whose key holdfast keeps (a named store, or a
    /// `[stores.NAME]` entry with no key of its own): its key file is then
    /// `<key_dir>/<name>.<store id>.key`, tried after `key_sources` (`store::identity`).
    /// `None`: the key comes from `key_sources` alone (`--key-file`, `--key-env`, hive's).
    pub key_dir: Option<PathBuf>,
}

impl StoreConfig {
    /// A store named `name` at `base` whose key holdfast keeps in `key_dir`, after systemd's
    /// credential when there is one.
    pub fn owned(name: &str, base: PathBuf, key_dir: PathBuf, first: Vec<KeySource>) -> Self {
        StoreConfig {
            name: name.to_owned(),
            base,
            key_sources: first,
            key_dir: Some(key_dir),
        }
    }
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
    /// itself and wants its report to include everything found, or only reads (a read may
    /// still record a generation: `generations.rs`).
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
    /// Credentials, in the index's order: every readable one, plus those that cannot be read right now
    /// (clock skew, I/O error) but whose metadata is known from the index or an earlier read.
    pub credentials: Vec<CredentialInfo>,
    /// Files that could not be read (see `store fsck`).
    pub unreadable: usize,
    /// Credentials not listed because holdfast does not serve their ids (another program made
    /// them; `store fsck` names their files).
    pub refused_ids: usize,
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
    /// The index has changes not yet written (set through [`Inner::mark_dirty`]).
    dirty: bool,
    /// When the index became dirty and when it last changed (the daemon's flusher waits for
    /// a quiet moment, or for the oldest change to be `INDEX_MAX_LAG` old).
    dirty_since: Option<std::time::Instant>,
    changed_at: Option<std::time::Instant>,
    unreadable: usize,
    /// The file a `delete` is removing: its index entry is dropped before the unlink, so the
    /// directory scan in `refresh` must not put it back while the file still exists.
    deleting: Option<String>,
    /// Changes other processes made, found by a directory scan and not yet reported (kept only
    /// with `IndexFlush::Deferred`, i.e. in the daemon, which drains them into events).
    pending: Vec<Change>,
    /// Each credential's place in the index, by id. hive's `list_all` is the index's key
    /// order: insertion order, an update keeps its place, a deleted and re-made id goes last.
    /// Places come from the index as read, then from writes; a credential no place is known
    /// for (another program made the file, the index was lost) goes after the known ones, by
    /// `created_at`. The index is written, and credentials listed, in this order.
    order: std::collections::HashMap<String, u64>,
    next_place: u64,
}

impl Inner {
    /// Take the order of `index`'s credentials for those that have no place yet.
    fn learn_order(&mut self, index: &Index) {
        for id in index.credentials.keys() {
            self.place(id);
        }
    }

    /// Give `id` the next place if it has none (a new credential goes last).
    fn place(&mut self, id: &str) {
        if !self.order.contains_key(id) {
            self.order.insert(id.to_owned(), self.next_place);
            self.next_place += 1;
        }
    }

    /// The entries in index order (see `order`): places of credentials gone are forgotten
    /// (one made again goes last), credentials without one get theirs.
    fn ordered(&mut self) -> Vec<(&String, &Entry)> {
        let live: std::collections::HashSet<&str> =
            self.entries.values().map(|e| e.id.as_str()).collect();
        self.order.retain(|id, _| live.contains(id.as_str()));
        let mut unplaced: Vec<(&str, &str)> = self
            .entries
            .values()
            .filter(|e| !self.order.contains_key(&e.id))
            .map(|e| {
                let created = e.meta.get("created_at").and_then(Value::as_str);
                (created.unwrap_or(""), e.id.as_str())
            })
            .collect();
        unplaced.sort_unstable();
        let unplaced: Vec<String> = unplaced.into_iter().map(|(_, id)| id.to_owned()).collect();
        for id in &unplaced {
            self.place(id);
        }
        let mut v: Vec<(&String, &Entry)> = self.entries.iter().collect();
        v.sort_by_key(|(_, e)| self.order.get(&e.id).copied().unwrap_or(u64::MAX));
        v
    }

    /// The index no longer matches `entries`.
    fn mark_dirty(&mut self) {
        let now = std::time::Instant::now();
        if !self.dirty {
            self.dirty = true;
            self.dirty_since = Some(now);
        }
        self.changed_at = Some(now);
    }

    /// The index matches `entries` again (or is to be rewritten: `needs`).
    fn set_dirty(&mut self, needs: bool) {
        if needs {
            self.mark_dirty();
        } else {
            self.dirty = false;
            self.dirty_since = None;
        }
    }
}

use crate::limits::FILE_CACHE_BYTES;

use crate::limits::MAX_PENDING_CHANGES;

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
    /// The store's identity, once known (`store::identity`; it changes only when a copy of
    /// a store takes one of its own, at open).
    identity: Mutex<Option<StoreId>>,
    /// What opening did to the store's key file that the user must hear about (a shared key
    /// file copied, a copied store given its own identity).
    key_notice: Option<String>,
    /// The generation markers (`generations.rs`).
    markers: Mutex<generations::Markers>,
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

/// Whether `path` is a regular file (not followed if a symlink).
fn is_regular(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// Which key one file needs (rotation, pruning, `holdfast key`).
pub(super) enum KeyUse {
    /// It authenticates under key `index` of the ring (0: the primary); `skewed`: it is
    /// stamped in the future (it reads again once the clock catches up).
    Key { index: usize, skewed: bool },
    /// Authenticates under no key, or is not a token: no key can help it.
    Undecryptable,
    /// It went away while being looked at.
    Gone,
    /// Could not be read (an I/O error, or too large to look at): it may need any key.
    Unreadable(String),
}

fn lock_guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn is_eloop(e: &io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
}

/// `ENXIO`: what opening a socket (or a FIFO with no writer, for writing) answers — something
/// that is not a file, never an I/O error of a file.
fn is_not_a_file(e: &io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::NXIO.raw_os_error())
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
            identity: Mutex::new(None),
            key_notice: None,
            markers: Mutex::new(generations::Markers::default()),
            config,
            opts,
        };
        if store.config.key_dir.is_some() {
            *lock_guard(&store.identity) = identity::read(&store.config.base)?;
        }
        let snapshot = store.load_keys()?;
        *store.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(snapshot);
        store.load_markers()?;
        if store.sealed_reason().is_some() || store.opts.mode == OpenMode::ReadOnly {
            return Ok(store);
        }
        durable::create_private_dir(&store.cred_dir, &store.opts.faults)?;
        durable::create_private_dir(&store.meta_dir, &store.opts.faults)?;
        store.key_notice = match store.adopt_shared_key()? {
            Some(notice) => Some(notice),
            None => store.settle_key_ownership()?,
        };
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

    /// What opening did to the store's key file, for the caller to tell the user: it gave a
    /// store an older holdfast made its own copy of the key file shared between data dirs, or a
    /// copy of another store an identity and a key file of its own.
    pub fn key_notice(&self) -> Option<&str> {
        self.key_notice.as_deref()
    }

    pub(super) fn faults(&self) -> &Faults {
        &self.opts.faults
    }
}

impl Drop for CredentialStore {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!(store = %self.config.name, error = %e, "index flush at close failed; it will be repaired on the next open");
        }
    }
}

/// What [`init_store`] made.
#[derive(Debug)]
pub struct Initialized {
    /// The key file it created.
    pub key_file: PathBuf,
    /// Permissions it tightened on a base directory that existed (see [`CredentialStore::open`]).
    pub fixes: super::PermFixes,
}

/// Create a new store at `config.base` with a fresh key. The key file is the store's own
/// (`<key dir>/<name>.<id>.key`, with a new identity) for a store whose key holdfast keeps,
/// else the first key file among `config.key_sources` (`--key-file`, hive's). Refuses with
/// [`KeyError::Exists`](crate::crypto::KeyError::Exists) if the store has a key already —
/// including a store made by an older holdfast that used the key file it shared between data
/// dirs (opening it gives it its own copy) — and with `sealed` if it holds credential files
/// but no key (never mint a key while encrypted data exists). Runs under the store lock, and
/// the key file is created with a no-replace link, so two racing `init`s cannot both create a
/// key. `init` never takes a key it did not make for this store.
///
/// A base directory that exists but is too open (made by hand with `mkdir`) is tightened as
/// [`CredentialStore::open`] does; the changes are returned for the caller to report.
pub fn init_store(config: &StoreConfig, faults: &Faults) -> Result<Initialized> {
    init_store_guarded(config, faults, None)
}

/// [`init_store`] for the store whose key also seals `streams_of`'s streams and run logs: if
/// they hold data, it refuses (`sealed`) to mint a new key rather than leave them unreadable
/// — the store lost its key or identity, it is not new. Checked under the store lock, at the
/// point where a key would be made.
pub fn init_store_guarded(
    config: &StoreConfig,
    faults: &Faults,
    streams_of: Option<&Path>,
) -> Result<Initialized> {
    let cred_dir = config.base.join("credentials");
    let meta_dir = config.base.join("metadata");
    // A store an older holdfast made has a metadata dir but no identity.
    let made_before = meta_dir.is_dir();
    durable::create_private_dir(&config.base, faults)?;
    let fixes = super::private::make_private(&config.base, true)?;
    durable::create_private_dir(&cred_dir, faults)?;
    durable::create_private_dir(&meta_dir, faults)?;
    let _guard = lock::lock(
        &meta_dir.join("index.lock"),
        LockMode::Exclusive,
        LOCK_TIMEOUT,
    )?;
    let exists = |source: &KeySource| {
        Error::Key(crate::crypto::KeyError::Exists(match source {
            KeySource::Env(v) => PathBuf::from(format!("${v}")),
            other => other.file().map(Path::to_path_buf).unwrap_or_default(),
        }))
    };
    if let Some(existing) = keys::load(&config.key_sources)? {
        return Err(exists(&existing.source));
    }
    let (key_file, new_identity) = match &config.key_dir {
        None => match config.key_sources.iter().find_map(KeySource::writable_file) {
            Some(f) => (f.to_path_buf(), None),
            None => {
                return Err(Error::Unsupported(
                    "init needs a key file to create (the key source here is an environment \
                     variable); pass --key-file FILE"
                        .into(),
                ))
            }
        },
        Some(dir) => match identity::read(&config.base)? {
            Some(id) => (identity::own_key_path(dir, &config.name, &id), None),
            None => {
                let shared = KeySource::Shared(identity::shared_key_path(dir, &config.name));
                if made_before && keys::load(std::slice::from_ref(&shared))?.is_some() {
                    return Err(exists(&shared));
                }
                let id = StoreId::generate().map_err(|source| Error::Read {
                    path: PathBuf::from("/dev/urandom"),
                    source,
                })?;
                (identity::own_key_path(dir, &config.name, &id), Some(id))
            }
        },
    };
    if let Some(existing) = keys::load(&[KeySource::File(key_file.clone())])? {
        return Err(exists(&existing.source));
    }
    let n = fs::read_dir(&cred_dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".enc"))
                .count()
        })
        .unwrap_or(0);
    if n > 0 {
        if let (Some(dir), Some(_)) = (&config.key_dir, &new_identity) {
            return Err(Error::Sealed {
                store: config.name.clone(),
                reason: SealedReason::NoIdentity {
                    files: n,
                    candidates: identity::key_files_named(dir, &config.name),
                },
            });
        }
        let mut looked = config.key_sources.clone();
        looked.push(KeySource::File(key_file));
        return Err(Error::Sealed {
            store: config.name.clone(),
            reason: SealedReason::NoKey {
                files: n,
                looked_in: looked
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            },
        });
    }
    if let Some(data_dir) = streams_of.filter(|d| crate::streams::has_data(d)) {
        return Err(Error::Sealed {
            store: config.name.clone(),
            reason: SealedReason::SealsStreams {
                data_dir: data_dir.to_path_buf(),
                candidates: config
                    .key_dir
                    .as_deref()
                    .map(|dir| identity::key_files_named(dir, &config.name))
                    .unwrap_or_default(),
            },
        });
    }
    keys::create_key_file(&key_file, &crate::crypto::generate_key(), faults)?;
    // The store owns the key it made (`store::claim`).
    super::claim::claim(&key_file, &config.base, faults)?;
    // The key first, then the identity that names it: a crash in between leaves a key file
    // nothing names (harmless) rather than an identity naming no key (a sealed store).
    if let Some(id) = new_identity {
        identity::create(&config.base, &config.name, &id, faults)?;
    }
    Ok(Initialized { key_file, fixes })
}
