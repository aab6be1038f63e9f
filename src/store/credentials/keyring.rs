//! The store's keys: loading them (and telling a wrong key from a few damaged files), picking
//! up key files another process rotated, sealing and unsealing, and what a rotation needs to
//! know about each file.

use super::*;
use crate::store::claim;

impl CredentialStore {
    pub(super) fn keys_now(&self) -> Arc<KeySnapshot> {
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

    /// Where this store's keys are read from, in order: the configured sources, then (for a
    /// store whose key holdfast keeps) its own key file — or, for a store an older holdfast
    /// made, the key file it shared between data dirs.
    pub(in crate::store) fn key_sources(&self) -> Vec<KeySource> {
        let mut sources = self.config.key_sources.clone();
        if let Some(dir) = &self.config.key_dir {
            sources.push(match self.identity() {
                Some(id) => KeySource::File(identity::own_key_path(dir, &self.config.name, &id)),
                None => KeySource::Shared(identity::shared_key_path(dir, &self.config.name)),
            });
        }
        sources
    }

    /// The store's identity, if it has one (read until found).
    pub(in crate::store) fn identity(&self) -> Option<StoreId> {
        let mut known = lock_guard(&self.identity);
        if known.is_none() {
            *known = identity::read(&self.config.base).ok().flatten();
        }
        known.clone()
    }

    pub(super) fn key_file_stamps(&self) -> Vec<Option<FileStamp>> {
        self.key_sources()
            .iter()
            .filter_map(KeySource::file)
            .flat_map(|p| [stamp_of(p), stamp_of(&keys::prev_path(p))])
            .collect()
    }

    /// Give a store an older holdfast made its own key file: a copy of the key file it shared
    /// with every other data dir's store of its name (and of the keys being retired beside
    /// it), then an identity naming the copy. The shared file is left as it was: other data
    /// dirs may still use it. Only when the shared key opens this store (it is unsealed with
    /// it); under the store lock, so racing opens adopt once. Returns the shared file and the
    /// copy when it adopted.
    pub(super) fn adopt_shared_key(&self) -> Result<Option<String>> {
        let Some(dir) = self.config.key_dir.clone() else {
            return Ok(None);
        };
        if !matches!(
            &self.keys_now().state,
            KeyState::Unsealed {
                source: KeySource::Shared(_),
                ..
            }
        ) {
            return Ok(None);
        }
        let _guard = lock::lock(&self.lock_path, LockMode::Exclusive, self.opts.lock_timeout)?;
        if let Some(id) = identity::read(&self.config.base)? {
            // Another process adopted it while we waited.
            *lock_guard(&self.identity) = Some(id);
            self.reload_keys();
            return Ok(None);
        }
        let shared = identity::shared_key_path(&dir, &self.config.name);
        let Some(loaded) = keys::load(&[KeySource::Shared(shared.clone())])? else {
            return Ok(None);
        };
        let own = self.take_new_identity(&dir, &loaded, |id| {
            identity::create(&self.config.base, &self.config.name, id, self.faults())
        })?;
        tracing::info!(store = %self.config.name, shared = %shared.display(), own = %own.display(), "the store now keeps its own key file (a copy of the key file older holdfast versions shared between data dirs, which is left in place)");
        Ok(Some(format!(
            "store {:?} now keeps its own key file {} (a copy of {}, which older holdfast \
             versions shared between every data dir's store of this name; that file is left in \
             place for them). Back up the new file.",
            self.config.name,
            own.display(),
            shared.display()
        )))
    }

    /// Settle who owns the key file this store writes (`store::claim`), under the store lock:
    /// claim it if nobody does (or note where the owner is now, if it moved). If another live
    /// store owns it — this store is a copy of it (`cp -a` of a data dir, a restored backup
    /// beside the original), or was given its key file — a store whose key holdfast keeps
    /// takes an identity and a key file of its own, a copy of the keys it used, so that a
    /// rotation and prune of either never touches the other; a store given the key file
    /// explicitly keeps using it, and may not prune its archive. Returns what to tell the user.
    pub(super) fn settle_key_ownership(&self) -> Result<Option<String>> {
        let Some(key_file) = self
            .key_source()
            .and_then(|s| s.writable_file().map(Path::to_path_buf))
        else {
            return Ok(None);
        };
        let base = &self.config.base;
        let _guard = lock::lock(&self.lock_path, LockMode::Exclusive, self.opts.lock_timeout)?;
        let (other, live) = match claim::owner(&key_file, base) {
            // The owner, maybe moved: the claim records where it is now.
            claim::Owner::Us => {
                claim::claim(&key_file, base, self.faults()).map_err(|e| self.io_failed(e))?;
                return Ok(None);
            }
            // A file named like the key older versions shared is claimed only by the `init`
            // that made it: using it proves nothing about who else needs it.
            claim::Owner::Nobody if claim::is_old_shared_key(&key_file) => return Ok(None),
            claim::Owner::Nobody => {
                claim::claim(&key_file, base, self.faults()).map_err(|e| self.io_failed(e))?;
                return Ok(None);
            }
            claim::Owner::Other(other) => (other, true),
            claim::Owner::Stale(was) => (was, false),
        };
        let own = match (&self.config.key_dir, self.identity()) {
            (Some(dir), Some(id))
                if identity::own_key_path(dir, &self.config.name, &id) == key_file =>
            {
                dir.clone()
            }
            // Given the key file explicitly: it has no other to go to, and takes over no claim
            // (a stale one may name an owner moved elsewhere, alive): it may read and write
            // with the key, not rotate or prune it (`rotate.rs` says what to do).
            _ => return Ok(None),
        };
        let Some(loaded) = keys::load(&[KeySource::File(key_file.clone())])? else {
            return Ok(None);
        };
        let new = self.take_new_identity(&own, &loaded, |id| {
            identity::rewrite(base, &self.config.name, id, self.faults()).map(|()| id.clone())
        })?;
        tracing::info!(store = %self.config.name, owner = %other.display(), live, own = %new.display(), "a copy of another store: it now has an identity and a key file of its own");
        let whose = if live {
            format!("the store at {}", other.display())
        } else {
            format!(
                "a store that was at {} (moved, restored or deleted since: if it still lives \
                 elsewhere, it keeps that key file)",
                other.display()
            )
        };
        Ok(Some(format!(
            "store {:?} at {} uses the key file of {whose} (a copy of it, or given its key): it \
             now has an identity and a key file of its own, {} (a copy of {}), so rotating \
             either store no longer touches the other. Back up the new file.",
            self.config.name,
            base.display(),
            new.display(),
            key_file.display()
        )))
    }

    /// Give the store a new identity whose own key file holds a copy of `loaded` (its key and
    /// archive): the copy first, then the identity naming it (`write` makes it, and answers
    /// the identity the store has after), so a crash in between leaves an unnamed copy
    /// (harmless), never an identity naming no key. Caller holds the store lock. Returns the
    /// new key file.
    fn take_new_identity(
        &self,
        dir: &Path,
        loaded: &LoadedKeys,
        write: impl FnOnce(&StoreId) -> std::result::Result<StoreId, identity::IdentityError>,
    ) -> Result<PathBuf> {
        let id = StoreId::generate().map_err(|source| Error::Read {
            path: PathBuf::from("/dev/urandom"),
            source,
        })?;
        let own = identity::own_key_path(dir, &self.config.name, &id);
        keys::create_key_file(&own, &loaded.primary, self.faults())
            .map_err(|e| self.key_write_failed(e))?;
        let archive = loaded.archive_lines();
        if !archive.is_empty() {
            keys::write_previous(&own, &archive, self.faults())
                .map_err(|e| self.key_write_failed(e))?;
        }
        *lock_guard(&self.identity) = Some(write(&id)?);
        claim::claim(&own, &self.config.base, self.faults()).map_err(|e| self.io_failed(e))?;
        self.reload_keys();
        Ok(own)
    }

    /// A failed key-file write; a failed fsync poisons the store like any other write.
    pub(in crate::store) fn key_write_failed(&self, err: crate::crypto::KeyError) -> Error {
        match err {
            crate::crypto::KeyError::Write(io) => self.io_failed(io),
            other => other.into(),
        }
    }

    /// Whether `ring` opens file `name`: `Some(true)` it authenticates (even if stamped in
    /// the future or not a credential), `Some(false)` a well-formed token that does not,
    /// `None` no evidence either way (missing, empty, malformed, unreadable).
    pub(super) fn key_opens(&self, ring: &Keyring, name: &str) -> Option<bool> {
        let bytes = durable::read_capped(&self.cred_dir.join(name), MAX_SCAN_FILE_BYTES).ok()??;
        let token = std::str::from_utf8(&bytes).ok()?;
        match ring.decrypt(token) {
            Ok(_) | Err(DecryptError::ClockSkew { .. }) => Some(true),
            Err(DecryptError::Invalid) => Some(false),
            Err(DecryptError::Malformed) => None,
        }
    }

    /// Load keys and decide sealed/unsealed. Unsafe key permissions are an error (refuse).
    pub(super) fn load_keys(&self) -> Result<KeySnapshot> {
        let stamps = self.key_file_stamps();
        let sealed = |reason| {
            Ok(KeySnapshot {
                state: KeyState::Sealed(reason),
                stamps: stamps.clone(),
            })
        };
        let sources = &self.key_sources();
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
            ..
        }) = loaded
        else {
            // A store of ours with data and no identity: it lost the file that names its key.
            if let (Some(dir), None, false) =
                (&self.config.key_dir, self.identity(), files.is_empty())
            {
                return sealed(SealedReason::NoIdentity {
                    files: files.len(),
                    candidates: identity::key_files_named(dir, &self.config.name),
                });
            }
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
        // Every file is tried until one opens: files another program wrote under a key of its
        // own (hive mints one when its key is missing) must not seal a store whose key opens
        // the rest, whatever their names sort before. A right key stops at its first file; a
        // wrong one costs a failed HMAC per file.
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
    pub(super) fn reload_keys_if_changed(&self) {
        if self.key_file_stamps() != self.keys_now().stamps {
            self.reload_keys();
        }
    }

    /// A sealed store looks at its key files again (a stat each) before answering `sealed`:
    /// a person who restores the key should not have to restart the daemon.
    pub(super) fn unseal_if_key_restored(&self) {
        if matches!(self.keys_now().state, KeyState::Sealed(_)) {
            self.reload_keys_if_changed();
        }
    }

    pub(in crate::store) fn reload_keys(&self) {
        let snapshot = self.load_keys().unwrap_or_else(|e| KeySnapshot {
            state: KeyState::Sealed(SealedReason::BadKey(e.to_string())),
            stamps: self.key_file_stamps(),
        });
        let was_sealed = matches!(self.keys_now().state, KeyState::Sealed(_));
        match &snapshot.state {
            // Said once, when the store goes from open to sealed; a sealed store that looks
            // again and is still sealed says nothing more (its callers answer `sealed`).
            KeyState::Sealed(reason) if was_sealed => {
                tracing::debug!(store = %self.config.name, %reason, "still sealed")
            }
            KeyState::Sealed(reason) => {
                tracing::error!(store = %self.config.name, %reason, "key files changed and no longer open the store")
            }
            KeyState::Unsealed { ring, .. } => {
                tracing::info!(store = %self.config.name, keys = ?ring.fingerprints(), "key files changed; reloaded keys")
            }
        }
        *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(snapshot);
    }

    pub(super) fn sealed_error(&self, reason: SealedReason) -> Error {
        Error::Sealed {
            store: self.config.name.clone(),
            reason,
        }
    }

    /// Run `f` with the keyring, or fail with `sealed`. No lock is held while `f` runs.
    pub(in crate::store) fn with_ring<T>(
        &self,
        f: impl FnOnce(&Keyring) -> Result<T>,
    ) -> Result<T> {
        self.unseal_if_key_restored();
        let keys = self.keys_now();
        match &keys.state {
            KeyState::Unsealed { ring, .. } => f(ring),
            KeyState::Sealed(r) => Err(self.sealed_error(r.clone())),
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

    /// Which key of `ring` opens the file at `path`, at the Fernet layer: a file that
    /// authenticates under a key but is not a valid credential (or is stamped in the future,
    /// or is larger than a credential may be written) still needs that key. Read up to
    /// [`MAX_SCAN_FILE_BYTES`], so a file another program wrote larger than holdfast writes
    /// is looked at too.
    pub(in crate::store) fn key_use_at(&self, ring: &Keyring, path: &Path) -> KeyUse {
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let bytes = match durable::read_capped(path, MAX_SCAN_FILE_BYTES) {
            Ok(Some(b)) => b,
            Ok(None) => return KeyUse::Gone,
            // A link, a FIFO, a socket: not a file any key could be needed for.
            Err(e)
                if is_eloop(&e) || e.kind() == io::ErrorKind::InvalidData || is_not_a_file(&e) =>
            {
                return KeyUse::Undecryptable
            }
            Err(e) => return KeyUse::Unreadable(format!("{name}: {e}")),
        };
        let Ok(token) = std::str::from_utf8(&bytes) else {
            return KeyUse::Undecryptable;
        };
        match ring.decrypt(token) {
            Ok((_, index)) => KeyUse::Key {
                index,
                skewed: false,
            },
            Err(DecryptError::ClockSkew { key_index, .. }) => KeyUse::Key {
                index: key_index,
                skewed: true,
            },
            Err(DecryptError::Invalid | DecryptError::Malformed) => KeyUse::Undecryptable,
        }
    }

    /// Re-encrypt one file with the primary key if it is under a previous key, keeping its
    /// plaintext byte for byte. Caller holds the store lock. Returns whether it was rewritten.
    pub(in crate::store) fn reencrypt_file(&self, name: &str) -> Result<bool> {
        self.fresh_markers()?;
        let mut inner = lock_guard(&self.inner);
        self.with_ring(|ring| {
            let path = self.cred_dir.join(name);
            let Ok(Some(bytes)) = durable::read_capped(&path, MAX_SCAN_FILE_BYTES) else {
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
            // Same plaintext, same generation: the one it has now, recorded or not.
            let doc_gen = Credential::parse(plain.expose()).map_or(1, |c| c.generation());
            let bytes: Arc<[u8]> = Arc::from(bytes);
            let generation = self.resolve_generation(name, &bytes, doc_gen).gen;
            let token = ring.encrypt(plain.expose());
            let stamp = self.write_file(name, token.as_bytes(), generation)?;
            if let Some(e) = inner.entries.get_mut(name) {
                e.stamp = Some(stamp);
                e.generation = generation;
            }
            inner.mark_dirty();
            Ok(true)
        })
    }
}
