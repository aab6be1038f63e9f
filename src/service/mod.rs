//! The daemon's state: the open stores, change events, refresh leases. Transport-free: the IPC
//! handlers call into it, and every blocking store call runs on tokio's blocking pool.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::broadcast;

use crate::config::Config;
use crate::crypto::KeySource;
use crate::store::{Change, CredentialStore, IndexFlush, OpenMode, StoreConfig, StoreOptions};
use crate::streams::{Sealer, StreamError, Streams};

pub mod dirwatch;
mod engines;
mod leases;
pub mod migrate;
pub mod watch;

pub use engines::STREAMS_KEY_STORE;
use leases::Lease;
pub use leases::LeaseAnswer;

use crate::limits::EVENT_BACKLOG;

use crate::limits::{INDEX_MAX_LAG, INDEX_QUIET, SPARE_IDLE};

/// Something a `cred.watch` subscriber hears about.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CredEvent {
    /// `cred.changed` (written or deleted), or `lease.released` (a refresh lease ended without
    /// a write: released, or its holder disconnected — waiters may ask for it now).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Store name.
    pub store: String,
    /// Credential id.
    pub id: String,
    /// Generation now; `None`: deleted (`cred.changed` only).
    pub generation: Option<u64>,
    /// `daemon` (a client wrote through the socket), `external` (another process), or for
    /// `lease.released`: `released` or `holder_disconnected`.
    pub source: &'static str,
}

pub use crate::limits::MAX_LEASES_PER_CONNECTION;

pub use crate::limits::MAX_WRITERS_PER_STORE;

/// One store the daemon serves.
pub struct StoreSlot {
    /// Where it lives and its key sources.
    pub config: StoreConfig,
    /// The open store, or why it could not be opened (unsafe permissions, I/O).
    pub store: Result<Arc<CredentialStore>, Arc<crate::store::Error>>,
    /// Taken (asynchronously) before a write goes to the blocking pool.
    pub writers: Arc<tokio::sync::Semaphore>,
}

/// Whether a run has a live stream (see [`Daemon::live_streams`]).
pub type LiveStreams = Box<dyn Fn(&str) -> bool + Send>;

/// The daemon's shared state.
pub struct Daemon {
    /// When it started (monotonic).
    started: Instant,
    /// The socket it serves.
    socket: PathBuf,
    /// Its data directory.
    data_dir: PathBuf,
    /// The config it runs with.
    config: Config,
    /// Stores by name. A store created after start (`holdfast init` while the daemon runs)
    /// is opened on first use.
    stores: RwLock<BTreeMap<String, Arc<StoreSlot>>>,
    /// The file watcher (stores opened later are added to it).
    watcher: Mutex<Option<watch::Watcher>>,
    /// Serializes opening stores created after start (never held with `stores`).
    opening: Mutex<()>,
    /// Change events for `cred.watch` subscribers.
    events: broadcast::Sender<CredEvent>,
    /// Open connections.
    connections: AtomicUsize,
    /// Of those, the ones the append lane reads (`ipc/lane.rs`).
    lane_connections: AtomicUsize,
    leases: Mutex<HashMap<(String, String), Lease>>,
    next_lease: AtomicU64,
    /// Requests other than `hello` routed so far (the idle-exit check's sign of life).
    requests: AtomicU64,
    /// The streams (opened with the default store's key, on start or on first use).
    streams: Mutex<Option<Arc<Streams>>>,
    /// Whether the runtime's workers commit the stream journal before they park
    /// ([`Daemon::before_park`]).
    assisted: std::sync::atomic::AtomicBool,
    /// The runtime's workers not parked ([`Daemon::before_park`]).
    awake: AtomicUsize,
    /// Set while the append lane commits the journal ([`Daemon::lane_commits`]): how to wake
    /// it for a record queued elsewhere.
    lane_nudge: Mutex<Option<crate::durable::journal::Nudge>>,
    /// Whether `lane_nudge` is set (read by every worker about to park).
    lane_commits: std::sync::atomic::AtomicBool,
    /// The run logs (opened on first use: no key needed, they are not encrypted).
    run_log: Mutex<Option<Arc<crate::runlog::RunLog>>>,
    /// The PostgreSQL backend's database, its schema checked (`[backend] kind = "postgres"`;
    /// made on first use, shared by the streams and the run logs).
    db: Mutex<Option<Arc<crate::pg::Db>>>,
    /// The audit log (`None`: `[audit] enabled = false`).
    audit: Option<crate::audit::AuditLog>,
}

impl Daemon {
    /// When it started (monotonic).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The socket it serves.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The config it runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Watch the stores for outside changes with `w` (replacing any earlier watcher).
    pub fn set_watcher(&self, w: watch::Watcher) {
        *self.watcher.lock().unwrap_or_else(PoisonError::into_inner) = Some(w);
    }

    /// Stop watching (shutdown).
    pub fn stop_watching(&self) {
        self.watcher
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    /// A receiver of every credential change event (`cred.watch`).
    pub fn subscribe_events(&self) -> broadcast::Receiver<CredEvent> {
        self.events.subscribe()
    }

    /// A connection opened.
    pub fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::SeqCst);
    }

    /// A connection closed.
    pub fn connection_closed(&self) {
        self.connections.fetch_sub(1, Ordering::SeqCst);
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// The append lane took a connection over (`true`) or stopped reading one (`false`).
    pub fn lane_connection(&self, adopted: bool) {
        match adopted {
            true => self.lane_connections.fetch_add(1, Ordering::SeqCst),
            false => self.lane_connections.fetch_sub(1, Ordering::SeqCst),
        };
    }

    /// Connections the append lane reads now.
    pub fn lane_connections(&self) -> usize {
        self.lane_connections.load(Ordering::SeqCst)
    }

    /// A request other than `hello` was routed (the idle exit's sign of life).
    pub fn note_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests other than `hello` routed so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Open every store: `<data>/stores/*` plus the config's `[stores.*]`. A store that fails to
    /// open is kept with its error (status shows it; its operations return it).
    pub fn open(
        socket: PathBuf,
        data_dir: PathBuf,
        config: Config,
    ) -> Result<Self, crate::paths::PathError> {
        let mut configs: BTreeMap<String, StoreConfig> = BTreeMap::new();
        let stores_dir = data_dir.join("stores");
        if let Ok(rd) = std::fs::read_dir(&stores_dir) {
            for e in rd.flatten() {
                let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                if crate::paths::validate_store_name(&name).is_err() || !e.path().is_dir() {
                    continue;
                }
                configs.insert(name.clone(), own_store_config(&name, e.path())?);
            }
        }
        for (name, entry) in &config.stores {
            configs.insert(name.clone(), configured_store(name, entry)?);
        }
        let stores: BTreeMap<String, Arc<StoreSlot>> = configs
            .into_iter()
            .map(|(name, cfg)| (name, Arc::new(open_slot(cfg))))
            .collect();
        let (events, _) = broadcast::channel(EVENT_BACKLOG);
        let audit = open_audit(&data_dir, &config, crate::durable::Faults::none());
        for slot in stores.values() {
            audit_repairs(audit.as_ref(), slot);
        }
        Ok(Daemon {
            started: Instant::now(),
            socket,
            data_dir,
            config,
            stores: RwLock::new(stores),
            watcher: Mutex::new(None),
            opening: Mutex::new(()),
            events,
            connections: AtomicUsize::new(0),
            lane_connections: AtomicUsize::new(0),
            leases: Mutex::new(HashMap::new()),
            next_lease: AtomicU64::new(1),
            requests: AtomicU64::new(0),
            streams: Mutex::new(None),
            assisted: std::sync::atomic::AtomicBool::new(false),
            awake: AtomicUsize::new(0),
            lane_nudge: Mutex::new(None),
            lane_commits: std::sync::atomic::AtomicBool::new(false),
            run_log: Mutex::new(None),
            db: Mutex::new(None),
            audit,
        })
    }

    /// The audit log, if one is kept.
    pub fn audit(&self) -> Option<&crate::audit::AuditLog> {
        self.audit.as_ref()
    }

    /// Replace the audit log with one on `faults` (tests of its failure policy).
    #[doc(hidden)]
    pub fn use_audit_faults(&mut self, faults: crate::durable::Faults) {
        self.audit = open_audit(&self.data_dir, &self.config, faults);
    }

    /// Write the audit records still queued and sync them (shutdown, after the last request).
    pub fn close_audit(&self) {
        if let Some(a) = &self.audit {
            a.close();
        }
    }

    /// Every store, by name.
    pub fn stores(&self) -> Vec<(String, Arc<StoreSlot>)> {
        self.stores
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(n, s)| (n.clone(), Arc::clone(s)))
            .collect()
    }

    /// Store `name` if it is already open (no file-system access: safe on an async thread).
    pub fn open_store(&self, name: &str) -> Option<Arc<StoreSlot>> {
        self.stores
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// Watch every open store's directories again (idempotent for a directory still watched;
    /// re-arms one that was replaced).
    pub fn rewatch(&self) {
        let mut w = self.watcher.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = w.as_mut() {
            for (_, slot) in self.stores() {
                if slot.store.is_ok() {
                    w.rewatch(&slot.config.base);
                }
            }
        }
    }

    /// Rewrite the index of every store with pending changes (the background flusher).
    pub fn flush_dirty(&self) {
        for (name, slot) in self.stores() {
            if let Ok(s) = &slot.store {
                // Files hive (or anything else) wrote, seen by the watcher or a scan: their
                // generations are bound to their content now, not at the next read.
                if let Err(e) = s.record_generations_pending() {
                    tracing::warn!(store = %name, error = %e, "recording generations failed; retrying on the next flush");
                }
                if s.index_due(INDEX_QUIET, INDEX_MAX_LAG) {
                    if let Err(e) = s.flush() {
                        tracing::warn!(store = %name, error = %e, "index rewrite failed; retrying on the next flush");
                    }
                }
                // The rewrite re-read the directory: report what other processes changed.
                for c in s.take_changes() {
                    self.publish(&name, &c, "external");
                }
                // A pool of spare files nobody reuses should not keep old ciphertexts on disk
                // (a few at a time: each unlink frees blocks, which costs a discard).
                if let Some(spares) = s.spares() {
                    spares.trim(SPARE_IDLE, 64);
                }
                // Orphaned spares of a daemon that died, a batch per tick.
                if let Err(e) = s.sweep_orphans() {
                    tracing::warn!(store = %name, error = %e, "sweeping orphaned spare files failed");
                }
            }
        }
    }

    /// Store `name`; a store directory created under the data dir after start is opened now
    /// (blocking: call from the blocking pool) and added to the watcher.
    pub fn store(&self, name: &str) -> Option<Arc<StoreSlot>> {
        if let Some(s) = self
            .stores
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
        {
            return Some(Arc::clone(s));
        }
        crate::paths::validate_store_name(name).ok()?;
        let base = self.data_dir.join("stores").join(name);
        if !base.is_dir() {
            return None;
        }
        let config = own_store_config(name, base).ok()?;
        // One opening at a time, and outside the map's lock: opening reconciles the store and
        // may wait for its file lock, and every request looks the map up.
        let _opening = self.opening.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = self.open_store(name) {
            return Some(s);
        }
        let slot = Arc::new(open_slot(config));
        audit_repairs(self.audit(), &slot);
        self.stores
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned(), Arc::clone(&slot));
        if slot.store.is_ok() {
            if let Some(w) = self
                .watcher
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_mut()
            {
                w.add(&slot.config.base);
            }
            // Changes made between opening and watching would otherwise go unseen.
            if let Ok(store) = &slot.store {
                match store.sync() {
                    Ok(changes) => changes
                        .iter()
                        .for_each(|c| self.publish(name, c, "external")),
                    Err(e) => {
                        tracing::warn!(store = %name, error = %e, "sync after opening failed")
                    }
                }
            }
        }
        Some(slot)
    }

    /// Publish a change to watchers (no receivers is fine).
    pub fn publish(&self, store: &str, change: &Change, source: &'static str) {
        let _ = self.events.send(CredEvent {
            kind: "cred.changed",
            store: store.to_owned(),
            id: change.id.clone(),
            generation: change.generation,
            source,
        });
    }

    /// Flush every store's index (shutdown).
    pub fn flush_all(&self) {
        for (name, slot) in self.stores() {
            if let Ok(s) = &slot.store {
                if let Err(e) = s.flush() {
                    tracing::warn!(store = %name, error = %e, "index flush at shutdown failed; it will be repaired on the next open");
                }
                if let Some(spares) = s.spares() {
                    spares.purge();
                }
            }
        }
    }
}

/// A store of the data dir (or a `[stores.NAME]` entry without a key of its own): holdfast
/// keeps its key, in its own file (`store::identity`), after systemd's credential if any.
/// The store a `[stores.NAME]` entry describes: its path, and the key it names (a file, a
/// variable, hive's) or else the store's own key file. The daemon and the offline CLI both
/// use this, so one name is one directory with or without a daemon.
pub fn configured_store(
    name: &str,
    entry: &crate::config::StoreEntry,
) -> Result<StoreConfig, crate::paths::PathError> {
    let given = match (&entry.key_file, &entry.key_env) {
        (Some(f), _) => Some(vec![KeySource::File(f.clone())]),
        (None, Some(v)) => Some(vec![KeySource::Env(v.clone())]),
        (None, None) if entry.hive => Some(crate::paths::hive_key_sources()?),
        (None, None) => None,
    };
    Ok(match given {
        Some(key_sources) => StoreConfig {
            name: name.to_owned(),
            base: entry.path.clone(),
            key_sources,
            key_dir: None,
        },
        None => own_store_config(name, entry.path.clone())?,
    })
}

fn own_store_config(name: &str, base: PathBuf) -> Result<StoreConfig, crate::paths::PathError> {
    Ok(StoreConfig::owned(
        name,
        base,
        crate::paths::keys_dir()?,
        crate::paths::systemd_key_sources(name),
    ))
}

/// The audit log of `data_dir` as `config` sets it up, its committer running; `None` if the
/// config turns it off.
fn open_audit(
    data_dir: &Path,
    config: &Config,
    faults: crate::durable::Faults,
) -> Option<crate::audit::AuditLog> {
    let settings = config.audit_settings();
    if !settings.enabled {
        tracing::warn!("[audit] enabled = false: credential operations are not recorded");
        return None;
    }
    let log = crate::audit::AuditLog::new(crate::audit::dir_of(data_dir), settings, faults);
    if let Err(e) = log.prepare() {
        // Every operation will say why when it is refused; the log says it once here.
        tracing::error!(error = %e, "the audit log cannot be set up");
    }
    if let Err(e) = log.start_committer() {
        // Without it every record is written by its caller, waiting (correct, slower).
        tracing::warn!(error = %e, "cannot start the audit log's committer thread");
    }
    Some(log)
}

/// Record in the audit log what opening `slot`'s store repaired (files quarantined, the index
/// rewritten, temp files removed, generations recorded), if anything: a change to a store no
/// client asked for is still a change to it.
fn audit_repairs(audit: Option<&crate::audit::AuditLog>, slot: &StoreSlot) {
    let (Some(log), Ok(store)) = (audit, &slot.store) else {
        return;
    };
    let Some(changes) = store.open_report().changes() else {
        return;
    };
    let who = crate::audit::Who {
        via: crate::audit::Via::Daemon,
        client: Some("holdfast-daemon".into()),
        pid: Some(std::process::id()),
        uid: Some(crate::durable::perms::euid()),
        ..crate::audit::Who::default()
    };
    let rec = crate::audit::Record::new("store.repair", crate::audit::OK, who)
        .store(&slot.config.name)
        .detail(changes);
    if let Err(e) = log.record(rec, true) {
        tracing::warn!(store = %slot.config.name, error = %e, "the repairs made at open could not be recorded in the audit log");
    }
}

/// Open one store for the daemon (repairing on open), logging how it went.
fn open_slot(cfg: StoreConfig) -> StoreSlot {
    let name = cfg.name.clone();
    let store = CredentialStore::open(
        cfg.clone(),
        StoreOptions {
            mode: OpenMode::Repair,
            // The daemon's flusher rewrites indexes in the background; its watcher keeps
            // every store's view current (see `IndexFlush::Deferred`).
            index_flush: IndexFlush::Deferred,
            // Long-lived: replaced files are recycled (no blocks freed per write).
            recycle_files: true,
            // Gets then cost an lstat, not an open (which also wakes the file watcher).
            cache_files: true,
            ..StoreOptions::default()
        },
    )
    .map(Arc::new)
    .map_err(Arc::new);
    if let Ok(s) = &store {
        let fixes = s.permission_fixes();
        if !fixes.is_empty() {
            tracing::warn!(store = %name, "{fixes}");
        }
        if let Some(notice) = s.key_notice() {
            tracing::warn!(store = %name, "{notice}");
        }
    }
    match &store {
        Ok(s) => match s.sealed_reason() {
            Some(reason) => tracing::warn!(store = %name, %reason, "store is sealed"),
            None => tracing::info!(store = %name, path = %cfg.base.display(), "store open"),
        },
        Err(e) => tracing::error!(store = %name, error = %e, "store failed to open"),
    }
    StoreSlot {
        config: cfg,
        store,
        writers: Arc::new(tokio::sync::Semaphore::new(MAX_WRITERS_PER_STORE)),
    }
}
