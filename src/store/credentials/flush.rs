//! The index write-behind: `index.json` rewritten once per burst of writes (or at a batch's
//! end, or by the daemon's flusher), never before the files it lists are durable.

use super::*;

impl CredentialStore {
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
    pub(super) fn flush_index(&self, inner: &mut Inner, ring: &Keyring) -> Result<()> {
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
        let index_extra = std::mem::take(&mut inner.index_extra);
        let entries: Vec<EntryRef<'_>> = inner
            .ordered()
            .into_iter()
            .map(|(name, e)| EntryRef {
                file: name,
                id: &e.id,
                meta: &e.meta,
                vouch: e.stamp.map(|s| (s, e.generation)),
            })
            .collect();
        let bytes = write_index(&self.config.base.to_string_lossy(), &index_extra, &entries);
        drop(entries);
        inner.index_extra = index_extra;
        let stamp = durable::atomic_write(&self.meta_dir, INDEX_FILE, &bytes, self.faults())
            .map_err(|e| self.io_failed(e))?;
        inner.index_stamp = Some(stamp);
        inner.set_dirty(false);
        Ok(())
    }

    /// Whether the index has changes not yet written.
    pub fn is_dirty(&self) -> bool {
        lock_guard(&self.inner).dirty
    }

    /// Whether the daemon's flusher should rewrite the index now: it has changes, and either
    /// nothing changed for `quiet` (a burst of writes ended) or the oldest unwritten change is
    /// `max_lag` old (writes never pause). A burst of any length then costs one rewrite per
    /// `max_lag`, not one per flusher tick: at 10,000 credentials a rewrite is ~4 MB of JSON
    /// and two fsyncs, and at one per tick it halved a lone writer's rate (docs/benchmarks.md).
    pub fn index_due(&self, quiet: std::time::Duration, max_lag: std::time::Duration) -> bool {
        let inner = lock_guard(&self.inner);
        if !inner.dirty {
            return false;
        }
        let old = |t: Option<std::time::Instant>, d| t.is_none_or(|t| t.elapsed() >= d);
        old(inner.changed_at, quiet) || old(inner.dirty_since, max_lag)
    }

    /// Rewrite the index now. Caller holds the store lock.
    pub(in crate::store) fn flush_locked(&self) -> Result<()> {
        let mut inner = lock_guard(&self.inner);
        self.with_ring(|ring| self.flush_index(&mut inner, ring))
    }
}
