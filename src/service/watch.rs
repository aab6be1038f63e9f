//! Watching the stores' directories for changes made by other processes (a hive process, an
//! offline CLI, a person copying files). A debounced batch of inotify events makes the daemon
//! look at exactly the files named in it (`sync_files`: a stat each, a decryption for those
//! that changed), publish `cred.changed` events for every credential that appeared, changed or
//! disappeared, and mark the index for the background flusher. The daemon's own writes come
//! back as events too and cost a stat each. An inotify queue overflow (or any event the
//! debouncer marks "rescan") makes it rescan every store in full (`sync`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use notify::RecursiveMode;
use notify_debouncer_full::{new_debouncer, DebounceEventResult, Debouncer, RecommendedCache};

use super::Daemon;
use crate::limits::WATCH_DEBOUNCE;

/// The running watcher; dropping it stops watching.
pub struct Watcher {
    debouncer: Debouncer<notify::RecommendedWatcher, RecommendedCache>,
    /// Directories watched.
    pub watched: Vec<PathBuf>,
}

impl Watcher {
    /// Watch a store's directories again even if they are listed as watched: `inotify_add_watch`
    /// on a directory still watched changes nothing, and one that was replaced gets a watch on
    /// its new inode.
    pub fn rewatch(&mut self, base: &std::path::Path) {
        for sub in ["credentials", "metadata"] {
            let dir = base.join(sub);
            if !dir.is_dir() {
                continue;
            }
            if let Err(e) = self.debouncer.watch(&dir, RecursiveMode::NonRecursive) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch for outside changes");
            } else if !self.watched.contains(&dir) {
                self.watched.push(dir);
            }
        }
    }

    /// Watch a store's `credentials/` and `metadata/` directories (a store opened after
    /// start). Failures are logged: the store still works, only outside changes go unseen
    /// until the next write through the daemon.
    pub fn add(&mut self, base: &std::path::Path) {
        for sub in ["credentials", "metadata"] {
            let dir = base.join(sub);
            if !dir.is_dir() || self.watched.contains(&dir) {
                continue;
            }
            match self.debouncer.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => self.watched.push(dir),
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot watch for outside changes")
                }
            }
        }
    }
}

/// What changed, per store: the file names seen in events, or `None` for "rescan it all".
type Touched = BTreeMap<String, Option<BTreeSet<String>>>;

/// Sync the stores in `touched` (every store if `None`) and publish what changed.
pub fn sync_stores(daemon: &Daemon, touched: Option<&Touched>) {
    for (name, slot) in daemon.stores() {
        let files = match touched {
            None => None,
            Some(t) => match t.get(&name) {
                None => continue,
                Some(files) => files.as_ref(),
            },
        };
        let Ok(store) = &slot.store else { continue };
        if store.sealed_reason().is_some() {
            continue;
        }
        let result = match files {
            Some(files) => store.sync_files(&files.iter().cloned().collect::<Vec<_>>()),
            None => store.sync(),
        };
        match result {
            Ok(changes) => {
                for c in &changes {
                    tracing::info!(store = %name, id = %c.id, generation = ?c.generation, "credential changed on disk");
                    daemon.publish(&name, c, "external");
                }
            }
            Err(e) => tracing::warn!(store = %name, error = %e, "sync after a file change failed"),
        }
    }
}

/// Start watching every open store's `credentials/` and `metadata/` directories. Events are
/// The file watcher did not start (the daemon serves on; foreign writes are then seen by the
/// periodic rescan only).
#[derive(Debug, thiserror::Error)]
#[error("cannot start the file watcher: {0}")]
pub struct WatchError(#[source] notify::Error);

/// mapped to stores by path at the time they arrive, so stores added later are covered.
pub fn start(daemon: Arc<Daemon>) -> Result<Watcher, WatchError> {
    let handler_daemon = Arc::clone(&daemon);
    let debouncer = new_debouncer(WATCH_DEBOUNCE, None, move |res: DebounceEventResult| {
        let touched = match res {
            Ok(events) => {
                let bases: Vec<(String, PathBuf)> = handler_daemon
                    .stores()
                    .into_iter()
                    .map(|(n, s)| (n, s.config.base.clone()))
                    .collect();
                let mut touched = Touched::new();
                let mut everything = false;
                for ev in &events {
                    if ev.need_rescan() || ev.paths.is_empty() {
                        everything = true;
                    }
                    for p in &ev.paths {
                        for (n, base) in &bases {
                            if !p.starts_with(base) {
                                continue;
                            }
                            let file = p.file_name().and_then(|f| f.to_str());
                            match (touched.entry(n.clone()).or_insert_with(|| Some(BTreeSet::new())), file) {
                                (Some(files), Some(f)) => {
                                    files.insert(f.to_owned());
                                }
                                (slot, _) => *slot = None,
                            }
                        }
                    }
                }
                if everything {
                    tracing::info!("file watcher asked for a rescan (event queue overflow?): syncing every store");
                    None
                } else {
                    Some(touched)
                }
            }
            Err(errors) => {
                for e in errors {
                    tracing::warn!(error = %e, "file watcher error; syncing every store");
                }
                None
            }
        };
        sync_stores(&handler_daemon, touched.as_ref());
    })
    .map_err(WatchError)?;
    let mut watcher = Watcher {
        debouncer,
        watched: Vec::new(),
    };
    for (_, slot) in daemon.stores() {
        if slot.store.is_ok() {
            watcher.add(&slot.config.base);
        }
    }
    Ok(watcher)
}
