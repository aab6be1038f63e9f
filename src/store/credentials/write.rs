//! Writing credentials: the store lock, the writable check (sealed, read-only, poisoned), set
//! and update with compare-and-swap, delete, batches, and the spare-file pool's upkeep.

use super::*;

impl CredentialStore {
    /// Take the store lock, then pick up key files another process changed while we waited:
    /// every decision made under the lock (quarantine, re-encryption, writes) uses the keys
    /// as they are now.
    pub(super) fn lock_store(&self, mode: LockMode) -> Result<LockGuard> {
        let guard = lock::lock(&self.lock_path, mode, self.opts.lock_timeout)?;
        self.reload_keys_if_changed();
        Ok(guard)
    }

    /// Turn a failed durable step into an error, poisoning the store if it was an fsync.
    pub(in crate::store) fn io_failed(&self, err: IoError) -> Error {
        if err.is_fsync() {
            tracing::error!(store = %self.config.name, "a write of this store failed its fsync");
        }
        self.poisoned.note(&err);
        Error::Io(err)
    }

    pub(super) fn check_writable(&self) -> Result<()> {
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
            self.fresh_markers()?;
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
            // The current generation (0: absent); the file's, recorded or not, so that a
            // compare-and-swap against content hive wrote since any read fails.
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
            new.check_for_hive().map_err(Error::InvalidCredential)?;
            // Above everything this file ever had: a credential deleted and made again
            // continues above the generation its marker kept — unless that is already the
            // largest (only another program's numbers get there): then it starts again at 1,
            // which no reader of the deleted credential holds as current.
            let generation = match current {
                0 => self.marker_gen(&name).map_or(1, |g| {
                    if g >= crate::limits::MAX_GENERATION {
                        1
                    } else {
                        g + 1
                    }
                }),
                n => n.saturating_add(1),
            };
            // Generations are JSON numbers every client reads exactly (JavaScript's safe
            // integers): a document another program wrote with a larger one cannot be moved
            // forward, so it is not written over.
            if generation > crate::limits::MAX_GENERATION {
                return Err(Error::Integrity {
                    what: format!("credential {id:?} (file {name})"),
                    reason: format!(
                        "its generation ({current}) is at the largest a generation may be \
                         ({}); delete it and set it again",
                        crate::limits::MAX_GENERATION
                    ),
                });
            }
            new.stamp_write(created.as_ref());
            new.set_generation(generation);
            let plain = new.to_bytes();
            // Acknowledged means readable: the file this write makes must be one holdfast
            // reads and serves back.
            let bytes = crate::crypto::token_len(plain.len()) as u64;
            if bytes > MAX_CREDENTIAL_FILE_BYTES {
                return Err(Error::ValueTooLarge {
                    id: id.to_owned(),
                    bytes,
                    limit: MAX_CREDENTIAL_FILE_BYTES,
                    max_doc: crate::crypto::max_plaintext_for(MAX_CREDENTIAL_FILE_BYTES as usize)
                        as u64,
                });
            }
            let token = ring.encrypt(&plain);
            let stamp = self.write_file(&name, token.as_bytes(), generation)?;
            inner.place(id);
            inner.entries.insert(
                name,
                Entry {
                    id: id.to_owned(),
                    meta: new.index_entry(),
                    stamp: Some(stamp),
                    generation,
                },
            );
            inner.mark_dirty();
            Ok(generation)
        })
    }

    /// Replace credential file `name` with `token`, giving it generation `generation`
    /// (`generations.rs`): the new content's marker is made once its bytes are durable, the
    /// file replaced, then the old content's marker removed before the directory fsync that
    /// acknowledges all three. At every step a marker names the content the file has.
    /// Caller holds the store lock.
    pub(in crate::store) fn write_file(
        &self,
        name: &str,
        token: &[u8],
        generation: u64,
    ) -> Result<FileStamp> {
        use durable::markers;
        let hash = generations::token_hash(token);
        let old = self.marker_of(name);
        let new = generations::marker_name(name, generation, &hash);
        let (mut marked, mut replaced) = (false, false);
        let written = durable::atomic_write_with(
            &self.cred_dir,
            name,
            token,
            self.faults(),
            self.spares.as_ref(),
            &mut |step| match step {
                // The new content's marker, once its bytes are durable and just before they
                // take the name: a crash before this leaves no marker naming content the file
                // never had.
                durable::WriteStep::BeforeRename => {
                    match old.as_deref().filter(|o| *o != new) {
                        // Another name for the old marker's inode: no inode made or freed.
                        Some(old) => {
                            markers::link_marker(&self.cred_dir, old, &new, self.faults())?
                        }
                        None => markers::set_marker(&self.cred_dir, None, &new, self.faults())?,
                    }
                    marked = true;
                    Ok(())
                }
                // A failure here reports the write failed, as a failed directory fsync does
                // (the new content is in place, named by its marker; the old marker left
                // behind only raises the floor of a later unrecorded state).
                durable::WriteStep::BeforeSync => {
                    replaced = true;
                    match old.as_deref().filter(|o| *o != new) {
                        Some(old) => markers::remove_marker(&self.cred_dir, old, self.faults()),
                        None => Ok(()),
                    }
                }
            },
        );
        let stamp = match written {
            Ok(stamp) => stamp,
            Err(e) => {
                // Not replaced: the new marker names nothing, and goes (a crashed process
                // cannot: the next floor is then one higher, never lower).
                if marked && !replaced && !e.is_injected_crash() {
                    let _ = markers::remove_marker(&self.cred_dir, &new, self.faults());
                }
                return Err(self.io_failed(e));
            }
        };
        self.note_marker(name, generation, hash);
        self.note_markers_seen();
        Ok(stamp)
    }

    /// Delete credential `id`. Returns whether it existed. The index entry goes first, then
    /// the file, so hive never lists an id whose file is gone.
    pub fn delete(&self, id: &str) -> Result<bool> {
        id::validate(id)?;
        self.write_op(|inner, ring| {
            let name = id::file_name(id);
            self.fresh_markers()?;
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
            // The marker stays behind as the generation the credential reached: record it
            // first if something else wrote the file since (one more fsync, only then).
            if self.has_pending_records() {
                self.record_generations(ring, std::slice::from_ref(&name))?;
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
            self.note_markers_seen();
            // Its earlier versions, kept as spares, go with it.
            if let Some(spares) = &self.spares {
                spares.purge_from(&name);
            }
            Ok(existed)
        })
    }

    /// Run a write under the store lock, then rewrite the index if this was the last queued
    /// writer of the process (group commit of index rewrites). The rewrite check runs on every
    /// exit path once the lock is held, so an early error cannot strand an earlier writer's
    /// pending index change.
    pub(super) fn write_op<T>(
        &self,
        f: impl FnOnce(&mut Inner, &Keyring) -> Result<T>,
    ) -> Result<T> {
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

    /// Take the store lock for a writer outside `write_op` (rotation).
    pub(in crate::store) fn exclusive_lock(&self) -> Result<LockGuard> {
        self.check_writable()?;
        self.lock_store(LockMode::Exclusive)
    }
}
