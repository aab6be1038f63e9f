//! Watching the stores' directories for changes made by other processes (a hive process, an
//! offline CLI, a person copying files). A debounced batch of inotify events makes the daemon
//! `sync` the affected stores: refresh from the directory (a stat per file; decrypt only what
//! changed), rewrite the index if it drifted, and publish `cred.changed` events for every
//! credential that appeared, changed or disappeared. An inotify queue overflow (or any event
//! the debouncer marks "rescan") syncs every store: sync is always a full directory scan.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use notify::RecursiveMode;
use notify_debouncer_full::{new_debouncer, DebounceEventResult, Debouncer, RecommendedCache};

use super::Daemon;
use crate::limits::WATCH_DEBOUNCE;

/// The running watcher; dropping it stops watching.
pub struct Watcher {
    _debouncer: Debouncer<notify::RecommendedWatcher, RecommendedCache>,
    /// Directories watched.
    pub watched: Vec<PathBuf>,
}

/// Sync `names` (all stores if `None`) and publish what changed.
pub fn sync_stores(daemon: &Daemon, names: Option<&BTreeSet<String>>) {
    for (name, slot) in &daemon.stores {
        if names.is_some_and(|n| !n.contains(name)) {
            continue;
        }
        let Ok(store) = &slot.store else { continue };
        if store.sealed_reason().is_some() {
            continue;
        }
        match store.sync() {
            Ok(changes) => {
                for c in &changes {
                    tracing::info!(store = %name, id = %c.id, generation = ?c.generation, "credential changed on disk");
                    daemon.publish(name, c, "external");
                }
            }
            Err(e) => tracing::warn!(store = %name, error = %e, "sync after a file change failed"),
        }
    }
}

/// Start watching every open store's `credentials/` and `metadata/` directories.
pub fn start(daemon: Arc<Daemon>) -> Result<Watcher, String> {
    let bases: Vec<(String, PathBuf)> = daemon
        .stores
        .iter()
        .filter(|(_, s)| s.store.is_ok())
        .map(|(n, s)| (n.clone(), s.config.base.clone()))
        .collect();
    let handler_bases = bases.clone();
    let handler_daemon = Arc::clone(&daemon);
    let mut debouncer = new_debouncer(WATCH_DEBOUNCE, None, move |res: DebounceEventResult| {
        let names = match res {
            Ok(events) => {
                let mut names = BTreeSet::new();
                let mut everything = false;
                for ev in &events {
                    if ev.need_rescan() || ev.paths.is_empty() {
                        everything = true;
                    }
                    for p in &ev.paths {
                        for (n, base) in &handler_bases {
                            if p.starts_with(base) {
                                names.insert(n.clone());
                            }
                        }
                    }
                }
                if everything {
                    tracing::info!("file watcher asked for a rescan (event queue overflow?): syncing every store");
                    None
                } else {
                    Some(names)
                }
            }
            Err(errors) => {
                for e in errors {
                    tracing::warn!(error = %e, "file watcher error; syncing every store");
                }
                None
            }
        };
        sync_stores(&handler_daemon, names.as_ref());
    })
    .map_err(|e| format!("cannot start the file watcher: {e}"))?;
    let mut watched = Vec::new();
    for (name, base) in &bases {
        for sub in ["credentials", "metadata"] {
            let dir = base.join(sub);
            if !dir.is_dir() {
                continue;
            }
            debouncer
                .watch(&dir, RecursiveMode::NonRecursive)
                .map_err(|e| format!("cannot watch {} (store {name}): {e}", dir.display()))?;
            watched.push(dir);
        }
    }
    Ok(Watcher {
        _debouncer: debouncer,
        watched,
    })
}
