//! Reading credentials: each file read and classified (missing, good, skewed, wrong key,
//! damaged, unreadable), through the file cache when allowed, and checked against the id it
//! claims.

use super::*;

impl CredentialStore {
    /// Read and decrypt one credential file, classifying the outcome.
    pub(super) fn read_file(&self, name: &str, ring: &Keyring) -> FileRead {
        self.read_file_via(name, ring, false)
    }

    /// [`Self::read_file`], through the file cache if `cached` and the store has one. Only
    /// plain reads use the cache; read-modify-write (under the lock) reads the file itself.
    pub(super) fn read_file_via(&self, name: &str, ring: &Keyring, cached: bool) -> FileRead {
        let read = match &self.file_cache {
            Some(cache) if cached => cache.read(&self.cred_dir, name, MAX_CREDENTIAL_FILE_BYTES),
            _ => durable::read_capped(&self.cred_dir.join(name), MAX_CREDENTIAL_FILE_BYTES)
                .map(|b| b.map(Arc::from)),
        };
        let bytes: Arc<[u8]> = match read {
            Ok(Some(b)) => b,
            Ok(None) => return FileRead::Missing,
            Err(e) if is_eloop(&e) => {
                return FileRead::Damaged("is a symlink; refusing to follow it".into())
            }
            Err(e) if e.kind() == io::ErrorKind::FileTooLarge => return FileRead::TooLarge,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return FileRead::Damaged(format!("is unusable: {e}"))
            }
            Err(e) if is_not_a_file(&e) => {
                return FileRead::Damaged("is not a regular file (a socket)".into())
            }
            Err(e) => return FileRead::Io(e),
        };
        let mut read = decode(&bytes, ring);
        if let FileRead::Ok(c, _, resolved) = &mut read {
            *resolved = self.resolve_generation(name, &bytes, c.generation());
            c.carry_generation(resolved.gen);
        }
        read
    }

    /// [`Self::read_file_via`], giving a writer in place a moment: hive rewrites its files
    /// in place (truncate, then write), so a read between the two sees an empty or torn file
    /// that is no damage. A read that fails its check is tried again every
    /// [`READ_SETTLE_STEP`](crate::limits::READ_SETTLE_STEP), for up to
    /// [`QUARANTINE_SETTLE`](crate::limits::QUARANTINE_SETTLE), while the file is empty or
    /// has changed since the last try; a non-empty file that fails twice unchanged is damage.
    fn read_settled(&self, name: &str, ring: &Keyring, cached: bool) -> FileRead {
        let path = self.cred_dir.join(name);
        let mut read = self.read_file_via(name, ring, cached);
        let mut last = None;
        let deadline = std::time::Instant::now() + crate::limits::QUARANTINE_SETTLE;
        while matches!(
            read,
            FileRead::Damaged(_) | FileRead::WrongKey | FileRead::NotCredential(_)
        ) {
            let now = stamp_of(&path);
            // An empty regular file may be a writer's truncation: wait for it. Anything else
            // (written, or a FIFO or socket, which never fill) is settled once unchanged.
            let settled = now == last && (now.is_some_and(|s| s.size > 0) || !is_regular(&path));
            if settled || std::time::Instant::now() >= deadline {
                break;
            }
            last = now;
            std::thread::sleep(crate::limits::READ_SETTLE_STEP);
            read = self.read_file_via(name, ring, cached);
        }
        if let (FileRead::Damaged(reason), Some(s)) = (&mut read, stamp_of(&path)) {
            if s.size == 0 && is_regular(&path) {
                reason.push_str(
                    " (a writer in place, as hive, may have truncated it and not written yet: try again)",
                );
            }
        }
        read
    }

    /// Read the credential stored under `id`'s file name: `Ok(None)` if there is no file.
    /// Files that fail are errors (integrity, clock skew, I/O), never silently "missing".
    pub(super) fn read_for(&self, id: &str, ring: &Keyring) -> Result<Option<Credential>> {
        self.read_for_via(id, ring, false)
    }

    /// [`Self::read_for`], through the file cache if `cached`.
    pub(super) fn read_for_via(
        &self,
        id: &str,
        ring: &Keyring,
        cached: bool,
    ) -> Result<Option<Credential>> {
        Ok(self.read_for_resolved(id, ring, cached)?.map(|(c, _)| c))
    }

    /// [`Self::read_for_via`], and whether the generation it carries is recorded (bound to
    /// these bytes by a marker) or only what a writer would record.
    pub(super) fn read_for_resolved(
        &self,
        id: &str,
        ring: &Keyring,
        cached: bool,
    ) -> Result<Option<(Credential, bool)>> {
        let name = id::file_name(id);
        let integrity = |reason: String| Error::Integrity {
            what: format!("credential {id:?} (file {name})"),
            reason,
        };
        match self.read_settled(&name, ring, cached) {
            FileRead::Missing => Ok(None),
            FileRead::Ok(c, _, resolved) => Ok(Some((c, resolved.recorded))),
            FileRead::Skew(source) => Err(Error::ClockSkew {
                id: id.to_owned(),
                source,
            }),
            FileRead::WrongKey => Err(integrity(DecryptError::Invalid.to_string())),
            FileRead::Damaged(reason) | FileRead::NotCredential(reason) => Err(integrity(reason)),
            FileRead::TooLarge => Err(Error::FileTooLarge {
                id: id.to_owned(),
                file: name,
                limit: MAX_CREDENTIAL_FILE_BYTES,
            }),
            FileRead::Io(source) => Err(Error::Read {
                path: self.cred_dir.join(&name),
                source,
            }),
        }
    }

    /// The file holds another id. If that id legitimately maps to this file name, it is a
    /// hive name collision; otherwise the file was swapped or renamed.
    pub(super) fn binding_error(&self, id: &str, found: &Credential) -> Option<Error> {
        let name = id::file_name(id);
        if id::file_name(found.id()) == name {
            None
        } else {
            Some(Error::Integrity {
                what: format!("credential {id:?} (file {name})"),
                reason: swapped_reason(found.id()),
            })
        }
    }

    /// Read credential `id`. The id inside the file must equal `id`. Its generation is bound
    /// to its content before it is answered (`generations.rs`): bytes no marker names — written
    /// by something else, or overtaken by this process's own writes while they were read — are
    /// never answered with a generation of their own. What the file holds now is recorded (under
    /// the store lock) and read again; a generation answered is one no other content will get.
    pub fn get(&self, id: &str) -> Result<Credential> {
        id::validate(id)?;
        let mut tries = 0;
        loop {
            let (c, recorded) = self.get_once(id)?;
            if recorded || self.check_writable().is_err() {
                // A store that may not be written answers what a writer would record.
                return Ok(c);
            }
            tries += 1;
            if tries > crate::limits::GENERATION_READ_RETRIES {
                return Err(Error::KeepsChanging { id: id.to_owned() });
            }
            self.record_pending()?;
        }
    }

    fn get_once(&self, id: &str) -> Result<(Credential, bool)> {
        let found = match self.with_ring(|ring| self.read_for_resolved(id, ring, true)) {
            // A rotation by another process re-encrypts files under a key we have not loaded.
            Err(Error::Integrity { .. }) => {
                self.reload_keys_if_changed();
                self.with_ring(|ring| self.read_for_resolved(id, ring, false))?
            }
            // Another id's content: a read that raced a replacement sees a whole but foreign
            // value. Read once more before calling it a swapped file.
            Ok(Some((c, _))) if c.id() != id => {
                self.with_ring(|ring| self.read_for_resolved(id, ring, false))?
            }
            other => other?,
        };
        match found {
            None => Err(Error::NotFound { id: id.to_owned() }),
            Some((c, recorded)) if c.id() == id => Ok((c, recorded)),
            Some((c, _)) => Err(self
                .binding_error(id, &c)
                .unwrap_or_else(|| Error::NotFound { id: id.to_owned() })),
        }
    }

    /// [`Self::get`] answered from the file cache alone (one `lstat`, no file opened, no key
    /// reload): `Some` only for a clean success; `None` when anything else would need the full
    /// path (not cached, changed, racy, missing, sealed, an error).
    /// The daemon answers these on the connection's task instead of the blocking pool.
    pub fn get_cached(&self, id: &str) -> Option<Result<Credential>> {
        let cache = self.file_cache.as_ref()?;
        id::validate(id).ok()?;
        let name = id::file_name(id);
        let keys = self.keys_now();
        let KeyState::Unsealed { ring, .. } = &keys.state else {
            return None;
        };
        let bytes = cache.peek(&self.cred_dir, &name)?;
        match decode(&bytes, ring) {
            FileRead::Ok(mut c, _, _) if c.id() == id => {
                let resolved = self.resolve_generation(&name, &bytes, c.generation());
                if !resolved.recorded {
                    return None;
                }
                c.carry_generation(resolved.gen);
                Some(Ok(c))
            }
            _ => None,
        }
    }

    /// Whether credential `id` exists (and reads).
    pub fn exists(&self, id: &str) -> Result<bool> {
        match self.get(id) {
            Ok(_) => Ok(true),
            Err(Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// How reading one credential file went.
pub(super) enum FileRead {
    Missing,
    /// The credential (its generation the file's, see `generations.rs`), the index of the key
    /// that opened it, and how its generation was resolved.
    Ok(Credential, usize, generations::Resolved),
    /// Authentic, but stamped in the future.
    Skew(DecryptError),
    /// A well-formed token that authenticates under none of the keys.
    WrongKey,
    /// Not a usable credential file that no key opens (empty, torn, not a token, a symlink,
    /// not a regular file): the only kind a repair may quarantine.
    Damaged(String),
    /// A key of the store opens it, but it is not a credential: left where it is (a
    /// quarantined file would need that key forever), reported as damage.
    NotCredential(String),
    /// Larger than holdfast serves ([`MAX_CREDENTIAL_FILE_BYTES`]; another program wrote
    /// it): not damage, never quarantined; key rotation still reads it.
    TooLarge,
    /// The OS failed to read it (EIO, EMFILE, …): says nothing about the file; never
    /// quarantined.
    Io(io::Error),
}

/// Decrypt and parse the bytes of a credential file.
pub(super) fn decode(bytes: &[u8], ring: &Keyring) -> FileRead {
    let Ok(token) = std::str::from_utf8(bytes) else {
        return FileRead::Damaged("is not a Fernet token (not text)".into());
    };
    if token.trim().is_empty() {
        return FileRead::Damaged("is empty".into());
    }
    match ring.decrypt(token) {
        Ok((plain, key_idx)) => match Credential::parse(plain.expose()) {
            Ok(c) => {
                let doc = generations::Resolved {
                    gen: c.generation(),
                    recorded: false,
                };
                FileRead::Ok(c, key_idx, doc)
            }
            Err(e) => FileRead::NotCredential(format!("decrypts, but is not a credential: {e}")),
        },
        Err(e @ DecryptError::ClockSkew { .. }) => FileRead::Skew(e),
        Err(DecryptError::Invalid) => FileRead::WrongKey,
        Err(e @ DecryptError::Malformed) => FileRead::Damaged(e.to_string()),
    }
}

/// An index entry that vouches for file `name` with stamp `stamp`, if it does: the recorded
/// stamp matches, the recorded id maps to this file name and has an entry, and the file is
/// *racily clean* (git's rule): its mtime is strictly older than the index's, so an in-place
/// rewrite in the same timestamp tick as the index write cannot hide behind an equal stamp.
pub(super) fn vouched_entry(
    index: &Index,
    index_stamp: Option<FileStamp>,
    name: &str,
    stamp: FileStamp,
) -> Option<Entry> {
    let v = index.vouches.get(name)?;
    let racily_clean = index_stamp.is_some_and(|i| stamp.mtime_ns < i.mtime_ns);
    if v.stamp != stamp || !racily_clean || id::file_name(&v.id) != name {
        return None;
    }
    Some(Entry {
        id: v.id.clone(),
        meta: index.credentials.get(&v.id)?.clone(),
        stamp: Some(stamp),
        generation: v.generation,
    })
}

pub(super) fn swapped_reason(found_id: &str) -> String {
    format!(
        "the file holds credential {found_id:?}, whose file would be {}: files were swapped or renamed",
        id::file_name(found_id)
    )
}
