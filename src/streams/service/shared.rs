//! Streams on a store several daemons share (PostgreSQL): memory is this daemon's cache of the
//! runs it serves and the store is the truth. A run is loaded (its records replayed through
//! the same code as the file journal's) when a request needs it and memory does not have it,
//! or has it from a holder that is no longer the store's; a write memory made on a stale copy
//! fails at the store (fenced) and drops the copy. Subscribers follow the store, so they see
//! what any host commits.

use super::*;
use crate::streams::store::{Loaded, SharedStore};
use crate::streams::PgStore;

impl Streams {
    /// Open on a shared store: nothing is replayed at open (runs load on demand).
    pub fn open_shared(store: PgStore, config: StreamsConfig) -> Streams {
        Streams {
            store: Box::new(store),
            runs: shards::Runs::new(),
            config,
            tool_log: std::sync::OnceLock::new(),
            adopted: std::sync::atomic::AtomicBool::new(false),
            holders: Default::default(),
            pending_lost: Default::default(),
        }
    }

    /// The shared store, if the streams are on one.
    pub(super) fn shared(&self) -> Option<&dyn SharedStore> {
        self.store.shared()
    }

    /// Whether the streams are on a store several daemons share.
    pub fn is_shared(&self) -> bool {
        self.shared().is_some()
    }

    /// Shared store: make memory agree with the store about `run_id` (blocking). A run held
    /// here — this daemon gave it the holder the store names — is kept (memory is ahead of the
    /// store by its records in flight, never behind), and so is a loaded copy the store has
    /// not moved past; anything else (another holder, a newer version, ended, unknown) is
    /// dropped, and an active run loaded again. Returns whether the store says the run ended.
    pub fn refresh(&self, run_id: &str) -> Result<bool, StreamError> {
        let Some(shared) = self.shared() else {
            return Ok(false);
        };
        let head = shared.head(run_id)?;
        {
            let mut st = self.lock(run_id);
            match (&head, st.runs.get(run_id)) {
                (Some(h), Some(run))
                    if !h.ended
                        && h.sid == run.stream_id
                        && (run.version == h.version
                            || (run.held_here && run.version > h.version)) =>
                {
                    return Ok(false)
                }
                // A first begin still in flight: the store has no row yet.
                (None, Some(run)) if run.last.as_ref().is_some_and(|p| !p.is_done()) => {
                    return Ok(false)
                }
                _ => {
                    st.runs.remove(run_id);
                }
            }
        }
        match head {
            Some(h) if !h.ended => self.load(shared, run_id).map(|()| false),
            Some(_) => Ok(true),
            None => Ok(false),
        }
    }

    /// Shared store: load the run if memory does not have it (blocking).
    pub fn load_if_missing(&self, run_id: &str) -> Result<(), StreamError> {
        match self.shared() {
            Some(shared) if !self.lock(run_id).runs.contains_key(run_id) => {
                self.load(shared, run_id)
            }
            _ => Ok(()),
        }
    }

    /// Load an active run into memory. An ended one is an error saying how it ended (a late
    /// write of an old holder gets `conflict`, as on the holder's own host); an unknown one
    /// loads nothing (the caller answers `not_found`).
    fn load(&self, shared: &dyn SharedStore, run_id: &str) -> Result<(), StreamError> {
        let (version, records) = match shared.load(run_id)? {
            Loaded::Active { version, records } => (version, records),
            Loaded::Unknown => return Ok(()),
            Loaded::Ended => {
                let status = self
                    .read_state(run_id)
                    .ok()
                    .flatten()
                    .and_then(|s| s["status"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| "ended".into());
                return Err(StreamError::Ended { status });
            }
        };
        let mut loaded = State {
            runs: HashMap::new(),
        };
        for r in records {
            Self::replay_record(&mut loaded, r, 0);
        }
        let Some(mut run) = loaded.runs.remove(run_id) else {
            return Ok(());
        };
        run.version = version;
        run.queued = run.end_pos();
        run.published = run.end_pos();
        self.trim(&mut run);
        let mut st = self.lock(run_id);
        // Another request may have loaded it meanwhile: the newer copy stays.
        match st.runs.get(run_id) {
            Some(had) if had.version >= version => {}
            _ => {
                if !st.runs.contains_key(run_id) && !st.admit(self.config.max_active_runs) {
                    return Err(StreamError::TooManyRuns {
                        max: self.config.max_active_runs,
                    });
                }
                st.runs.insert(run_id.to_owned(), run);
            }
        }
        Ok(())
    }
}
