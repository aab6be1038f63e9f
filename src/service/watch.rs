//! Watching the stores' directories for changes made by other processes (a hive process, an
//! offline CLI, a person copying files). A debounced batch of inotify events makes the daemon
//! look at exactly the files named in it (`sync_files`: a stat each, a decryption for those
//! that changed), publish `cred.changed` events for every credential that appeared, changed or
//! disappeared, and mark the index for the background flusher. The daemon's own writes come
//! back as events too and cost a stat each. An inotify queue overflow (or a watched directory
//! gone) makes it rescan every store in full (`sync`). The inotify side, and why it is not
//! `notify`'s, is `dirwatch.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use super::dirwatch::{Batch, DirWatcher, Pace};
use super::Daemon;
use crate::limits::{WATCH_DEBOUNCE, WATCH_MAX_DELAY, WATCH_TICK};

/// The running watcher; dropping it stops watching.
pub struct Watcher {
    dirs: DirWatcher,
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
            if let Err(e) = self.dirs.watch(&dir) {
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
            match self.dirs.watch(&dir) {
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

/// The file watcher did not start (the daemon serves on; foreign writes are then seen by the
/// periodic rescan only).
#[derive(Debug, thiserror::Error)]
#[error("cannot start the file watcher: {0}")]
pub struct WatchError(#[source] std::io::Error);

/// Start watching every open store's `credentials/` and `metadata/` directories. Events are
/// mapped to stores by path at the time they are delivered, so stores added later are covered.
pub fn start(daemon: Arc<Daemon>) -> Result<Watcher, WatchError> {
    let handler_daemon = Arc::clone(&daemon);
    let pace = Pace {
        quiet: WATCH_DEBOUNCE,
        max_delay: WATCH_MAX_DELAY,
        tick: WATCH_TICK,
    };
    let dirs = DirWatcher::start(pace, move |batch: Batch| {
        let touched = if batch.rescan {
            tracing::info!("file watcher missed events (queue overflow, a directory gone): syncing every store");
            None
        } else {
            Some(touched_stores(&handler_daemon, &batch))
        };
        sync_stores(&handler_daemon, touched.as_ref());
    })
    .map_err(WatchError)?;
    let mut watcher = Watcher {
        dirs,
        watched: Vec::new(),
    };
    for (_, slot) in daemon.stores() {
        if slot.store.is_ok() {
            watcher.add(&slot.config.base);
        }
    }
    Ok(watcher)
}

/// The stores whose directories `batch` names, with the file names in each.
fn touched_stores(daemon: &Daemon, batch: &Batch) -> Touched {
    let mut touched = Touched::new();
    for (name, slot) in daemon.stores() {
        for (dir, files) in &batch.files {
            if dir.starts_with(&slot.config.base) {
                if let Some(set) = touched
                    .entry(name.clone())
                    .or_insert_with(|| Some(BTreeSet::new()))
                {
                    set.extend(files.iter().cloned());
                }
            }
        }
    }
    touched
}
