//! The streams and the run logs, opened on first use: the streams need the default store's key
//! (its keys seal every journal record: [`StoreSealer`]), the run logs need none. Retention of
//! old runs lives here too.

use super::*;
use crate::streams::SealError;

/// The store whose key seals streams: the default store.
pub const STREAMS_KEY_STORE: &str = crate::paths::DEFAULT_STORE;

/// Seals stream records with a store's keys.
struct StoreSealer(Arc<CredentialStore>);

impl Sealer for StoreSealer {
    fn seal(&self, plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
        self.0
            .seal(plaintext)
            .map(String::into_bytes)
            .map_err(|e| SealError::Seal(e.into()))
    }

    fn open(&self, sealed: &[u8]) -> Result<zeroize::Zeroizing<Vec<u8>>, SealError> {
        let token = std::str::from_utf8(sealed)
            .map_err(|_| SealError::Open("not a Fernet token".into()))?;
        self.0
            .unseal(token)
            .map(|p| zeroize::Zeroizing::new(p.expose().to_vec()))
            .map_err(|e| SealError::Open(e.into()))
    }
}

impl Daemon {
    /// The streams, opening them (replaying the journal: blocking) if they are not yet: they
    /// need the default store's key. Call from the blocking pool, or at start.
    pub fn streams(&self) -> Result<Arc<Streams>, StreamError> {
        let mut guard = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = guard.as_ref() {
            return Ok(Arc::clone(s));
        }
        if let Some(settings) = self.config.postgres()? {
            // Several hosts: the streams on PostgreSQL (no key: rows are not sealed). A server
            // that is down fails this request with `storage`; the next one tries again.
            let db = crate::pg::Db::new(settings)?;
            db.run({
                let db = Arc::clone(&db);
                async move { db.ensure_schema(true).await }
            })??;
            let at = db.settings().at();
            let streams = Streams::open_shared(
                crate::streams::PgStore::open(db),
                self.config.streams_config(),
            );
            tracing::info!(backend = "postgres", at = %at, "streams open");
            if let Ok(log) = self.run_log() {
                streams.attach_tool_log(log);
            }
            let streams = Arc::new(streams);
            *guard = Some(Arc::clone(&streams));
            return Ok(streams);
        }
        let slot = self
            .store(STREAMS_KEY_STORE)
            .ok_or(StreamError::NoKeyStore)?;
        let store = slot
            .store
            .clone()
            .map_err(|e| StreamError::KeyStoreFailed(e))?;
        if let Some(reason) = store.sealed_reason() {
            return Err(StreamError::KeySealed(Box::new(reason)));
        }
        let (streams_dir, runs_dir) = crate::streams::dirs(&self.data_dir);
        // Which data dirs this store's key seals: several can share one default store.
        if let Err(e) = crate::streams::register_sealed_data_dir(&slot.config.base, &self.data_dir)
        {
            tracing::warn!(error = %e, "cannot record this data dir's streams beside the default store (a prune from another data dir sharing that store would not know of them)");
        }
        let streams = Streams::open(
            &streams_dir,
            &runs_dir,
            Arc::new(StoreSealer(store)),
            self.config.streams_config(),
            crate::durable::Faults::none(),
        )?;
        let report = streams.replay_report();
        tracing::info!(
            active_runs = streams.active_runs(),
            frames = report.frames,
            segments = report.segments,
            torn_tail = report.torn_tail.is_some(),
            corrupt = report.corrupt.len(),
            "streams open"
        );
        // The planner's R2 annotation reads the run log (tool begin/end records).
        if let Ok(log) = self.run_log() {
            streams.attach_tool_log(log);
        }
        streams.set_assisted(self.assisted.load(Ordering::SeqCst));
        streams.set_nudge(
            self.lane_nudge
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        );
        let streams = Arc::new(streams);
        *guard = Some(Arc::clone(&streams));
        Ok(streams)
    }

    /// Have the runtime's workers commit the stream journal: the daemon's runtime calls
    /// [`Daemon::before_park`] from each worker about to park. Call before the streams open.
    pub fn assist_commits(&self, workers: usize) {
        self.awake.store(workers, Ordering::SeqCst);
        self.assisted.store(true, Ordering::SeqCst);
        if let Some(s) = self.streams_if_open() {
            s.set_assisted(true);
        }
    }

    /// The append lane commits the stream journal from now on (`Some`: how to wake it for a
    /// record queued by another thread), or no longer (`None`: the workers do again). While it
    /// does, the runtime's workers leave the journal alone: a worker that assisted whenever it
    /// parked became a second committer beside the lane, taking its batches in the middle of
    /// its turns (docs/benchmarks.md, "Issue 15, ninth session").
    pub fn lane_commits(&self, nudge: Option<crate::durable::journal::Nudge>) {
        let on = nudge.is_some();
        *self
            .lane_nudge
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = nudge.clone();
        self.lane_commits.store(on, Ordering::SeqCst);
        if let Some(s) = self.streams_if_open() {
            s.set_nudge(nudge);
        }
    }

    /// A runtime worker has nothing left to run. The last one awake commits the stream
    /// appends queued so far (unless another thread is committing) before it sleeps, and
    /// stops as soon as another worker is awake again (that one commits when it runs out):
    /// one batch per turn of the whole runtime, as a single-threaded server has. Not while the
    /// append lane commits ([`Daemon::lane_commits`]).
    pub fn before_park(&self) {
        if self.awake.fetch_sub(1, Ordering::SeqCst) == 1
            && !self.lane_commits.load(Ordering::SeqCst)
        {
            if let Some(s) = self.streams_if_open() {
                s.assist(&|| self.awake.load(Ordering::SeqCst) > 0);
            }
        }
    }

    /// A runtime worker woke (the pair of [`Daemon::before_park`]).
    pub fn after_unpark(&self) {
        self.awake.fetch_add(1, Ordering::SeqCst);
    }

    /// The PostgreSQL backend's database when the config names one, its schema migrated
    /// (blocking). A server that is down fails the request that needed it with `storage`; the
    /// next one tries again.
    pub fn db(&self) -> Result<Option<Arc<crate::pg::Db>>, crate::pg::DbError> {
        let mut guard = self.db.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(db) = guard.as_ref() {
            return Ok(Some(Arc::clone(db)));
        }
        let Some(settings) = self.config.postgres()? else {
            return Ok(None);
        };
        let db = crate::pg::Db::new(settings)?;
        db.run({
            let db = Arc::clone(&db);
            async move { db.ensure_schema(true).await }
        })??;
        *guard = Some(Arc::clone(&db));
        Ok(Some(db))
    }

    /// Delete runs idle past `[runs] retention_days` (never one with a live stream).
    pub fn prune_runs(&self) {
        let Some(age) = self.config.run_retention() else {
            return;
        };
        let log = match self.run_log() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "run retention: the run logs did not open");
                return;
            }
        };
        let keep = match self.live_streams() {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "run retention: skipped (which streams are live is unknown)");
                return;
            }
        };
        match log.prune(age, &keep, false) {
            Ok(gone) if !gone.is_empty() => {
                tracing::info!(
                    runs = gone.len(),
                    days = age.as_secs() / 86_400,
                    "run retention: deleted runs idle past retention"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "run retention sweep failed"),
        }
    }

    /// Which runs have a live stream (their directories must not be pruned): the streams are
    /// opened if they are not yet. With no default store there are no streams at all; if the
    /// streams cannot be opened otherwise (sealed), nobody can say: an error.
    pub fn live_streams(&self) -> Result<LiveStreams, StreamError> {
        match self.streams() {
            Ok(s) => Ok(Box::new(move |id: &str| s.is_active(id))),
            Err(e) if e.kind() == crate::error::ErrorKind::Unsupported => {
                Ok(Box::new(|_: &str| false))
            }
            Err(e) => Err(e),
        }
    }

    /// The run logs under `<data_dir>/runs/`.
    pub fn run_log(&self) -> Result<Arc<crate::runlog::RunLog>, crate::runlog::RunLogError> {
        let mut guard = self.run_log.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(l) = guard.as_ref() {
            return Ok(Arc::clone(l));
        }
        let log = match self.db()? {
            Some(db) => Arc::new(crate::runlog::RunLog::open_shared(db)),
            None => {
                let (_, runs_dir) = crate::streams::dirs(&self.data_dir);
                Arc::new(crate::runlog::RunLog::open(
                    &runs_dir,
                    crate::durable::Faults::none(),
                )?)
            }
        };
        *guard = Some(Arc::clone(&log));
        Ok(log)
    }

    /// The streams if they are open (never blocks).
    pub fn streams_if_open(&self) -> Option<Arc<Streams>> {
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
