//! Key rotation with MultiFernet semantics, restartable at any point, and the key archive.
//!
//! A store's key file holds its primary key; `<key>.prev` beside it is the **archive**: every
//! key the store has retired, newest first, still accepted for decryption. A retired key
//! stays in the archive until a scan of *this* store proves no file needs it and the user asks
//! for it to go (`holdfast key prune`): nothing deletes a key as a side effect.
//!
//! Rotation (`holdfast key rotate`), each step durable before the next:
//! 1. Under the store lock: add the current key to the archive (`<key>.prev`), note the new
//!    key's fingerprint in `<key>.rotating`, then write the new key to `<key>`. From here on
//!    the keyring is [new, archive…]: every file decrypts, every new write uses the new key.
//! 2. For every file, one at a time under the lock: if it opens only with an archived key,
//!    re-encrypt it with the new key (atomic replace; the plaintext, generation included, is
//!    unchanged).
//! 3. Under the lock, a full scan at the Fernet layer: a file written meanwhile by a process
//!    that had not reloaded the key is re-encrypted here. Other data sealed with this key
//!    (the daemon's streams) is re-sealed. Then `<key>.rotating` is removed: the rotation is
//!    complete. With `prune`, the archived keys no file needs are removed as
//!    `holdfast key prune` does.
//!
//! A crash anywhere leaves a keyring that opens every file. Running `key rotate` again after
//! a crash resumes when `<key>.rotating` names the current key (no other new key is made);
//! otherwise it starts a rotation of its own — the archive keeps every key either way.
//!
//! Pruning (`holdfast key prune`): steps 2 and 3 without a new key, then every archived key
//! that no credential file, no quarantined file and no other sealed data needs is removed
//! from the archive. A file that cannot be read, or that is stamped in the future under an
//! archived key, keeps every archived key: it might need any of them.

use std::path::Path;

use super::credentials::{CredentialStore, KeyUse};
use super::{Error, Result, SealedReason};
use crate::crypto::{fingerprint, generate_key, keys, SecretBytes};
use crate::durable::{self, TEMP_MARKER};

/// What a rotation or a prune did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RotateReport {
    /// Whether this run resumed an interrupted rotation.
    pub resumed: bool,
    /// Fingerprint of the primary key (the new one, after a rotation).
    pub new_key: String,
    /// Fingerprints of the archived keys after this run, newest first: retired keys kept for
    /// decryption.
    pub retired: Vec<String>,
    /// Archived keys this run removed (it proved no file needs them).
    #[serde(default)]
    pub pruned: Vec<String>,
    /// Archived keys kept because some file still needs them (`fingerprint: why`).
    #[serde(default)]
    pub kept: Vec<String>,
    /// Files re-encrypted.
    pub reencrypted: usize,
    /// Files checked in the final scan.
    pub verified: usize,
    /// Files that decrypt with no key at all (left alone; see `store fsck`).
    pub undecryptable: Vec<String>,
}

/// Which keys a store has and which files each opens (`holdfast key`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct KeyReport {
    /// Where the keys are read from.
    pub source: String,
    /// The archive beside a key file, if there is one (`<key>.prev`).
    pub archive: Option<String>,
    /// Whether a rotation was interrupted (`holdfast key rotate` resumes it).
    pub rotating: bool,
    /// Lines of the archive that are not keys: kept as they are; no key is pruned while any
    /// remain.
    #[serde(default)]
    pub archive_damaged: usize,
    /// The keys, primary first, then the archive newest first.
    pub keys: Vec<KeyInfo>,
    /// Credential files no key opens (see `holdfast store fsck`).
    pub undecryptable: Vec<String>,
    /// Files that could not be read (they may need any key: none is pruned while they exist).
    pub unreadable: Vec<String>,
}

/// One key of a store.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct KeyInfo {
    /// Its fingerprint.
    pub fingerprint: String,
    /// `primary` or `archived`.
    pub role: String,
    /// The credential files it opens.
    pub files: Vec<String>,
    /// The quarantined files it opens.
    pub quarantined: Vec<String>,
}

/// What to do: make a new key (rotate), and whether to prune the archive after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotateOptions {
    /// Make a new primary key (`key rotate`); false: only finish moving files to the
    /// primary (`key prune`).
    pub new_key: bool,
    /// Remove archived keys the final scan proves no file needs.
    pub prune: bool,
}

/// The file beside a key file that marks a rotation in progress: it holds the fingerprint of
/// the key that rotation made (not secret).
fn rotating_path(key_file: &Path) -> std::path::PathBuf {
    let mut s = key_file.as_os_str().to_owned();
    s.push(".rotating");
    std::path::PathBuf::from(s)
}

impl CredentialStore {
    /// Rotate the store's key (or finish an interrupted rotation), keeping the old key in the
    /// archive. `progress(done, total)` is called as files are re-encrypted.
    pub fn rotate_key(&self, progress: impl FnMut(usize, usize)) -> Result<RotateReport> {
        self.rotate_key_with(
            RotateOptions {
                new_key: true,
                prune: false,
            },
            progress,
            || Ok(()),
        )
    }

    /// Move every file to the primary key and remove the archived keys no file needs.
    pub fn prune_keys(&self, progress: impl FnMut(usize, usize)) -> Result<RotateReport> {
        self.rotate_key_with(
            RotateOptions {
                new_key: false,
                prune: true,
            },
            progress,
            || Ok(()),
        )
    }

    /// [`Self::rotate_key`] / [`Self::prune_keys`], with `reseal` run once every credential
    /// file is under the primary key and before the rotation is declared complete: other data
    /// sealed with this store's key (the daemon's streams) is re-sealed there. If it fails,
    /// nothing is pruned and the rotation can be run again.
    pub fn rotate_key_with(
        &self,
        opts: RotateOptions,
        mut progress: impl FnMut(usize, usize),
        mut reseal: impl FnMut() -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>,
    ) -> Result<RotateReport> {
        // A sealed store answers `sealed` to every operation (not `unsupported`).
        if let Some(reason) = self.sealed_reason() {
            return Err(Error::Sealed {
                store: self.config().name.clone(),
                reason,
            });
        }
        let Some(source) = self.key_source() else {
            return Err(Error::Sealed {
                store: self.config().name.clone(),
                reason: self.sealed_reason().unwrap_or(SealedReason::BadKey(
                    "the key went away during the rotation".into(),
                )),
            });
        };
        let Some(key_file) = source.writable_file().map(ToOwned::to_owned) else {
            return Err(Error::Unsupported(match source {
                crate::crypto::KeySource::Shared(_) => format!(
                    "the key comes from {source}, which older holdfast versions shared between data \
                     dirs; open the store once without --offline or read-only (any command that \
                     may write, such as `holdfast store fsck --repair`) to give it its own copy, \
                     then rotate"
                ),
                _ => format!(
                    "the key comes from {source}, which holdfast cannot rewrite; rotate it where it \
                     is managed (for systemd LoadCredential=, replace the credential file and \
                     restart), or use a key file (--key-file)"
                ),
            }));
        };
        // Only the store that owns the key file may rotate or prune it: another store reading
        // it (a copy, or one given this key file) proves nothing about the owner's files — a
        // prune would remove keys they need, and a rotation would change the primary key the
        // owner reads (hive, reading no archive, could no longer open its own files).
        let verb = if opts.new_key { "rotate" } else { "prune" };
        let owner = super::claim::owner(&key_file, &self.config().base);
        if super::claim::is_old_shared_key(&key_file) && owner != super::claim::Owner::Us {
            return Err(Error::Unsupported(format!(
                "the key file {} is the one older holdfast versions shared between every data \
                 dir's store of this name: data dirs not opened since still need it as it is, so \
                 no store may {verb} it. A store of holdfast's own takes a copy on its next write; \
                 a store given this file with --key-file or key_file should get a key of its own.",
                key_file.display()
            )));
        }
        if let super::claim::Owner::Stale(was) = &owner {
            return Err(Error::Unsupported(format!(
                "the key file {} belongs to the store that was at {} (moved, restored or deleted \
                 since): if it lives on elsewhere, its files need this key as it is, so this store \
                 may not {verb} it. If that store is gone for good, remove {} and {verb} again.",
                key_file.display(),
                was.display(),
                super::claim::claim_path(&key_file).display()
            )));
        }
        if let super::claim::Owner::Other(owner) = owner {
            let what = if opts.new_key {
                "a rotation here would change the key it reads (its files not re-encrypted: hive, \
                 which reads no archive, could not open them)"
            } else {
                "its files may need the keys a prune here would remove"
            };
            return Err(Error::Unsupported(format!(
                "the key file {} belongs to the store at {}: {what}. {} it there.",
                key_file.display(),
                owner.display(),
                if opts.new_key { "Rotate" } else { "Prune" },
            )));
        }
        let faults = self.faults().clone();
        let mut report = RotateReport::default();
        let rotating = rotating_path(&key_file);
        let (rot_dir, rot_name) = keys::split(&rotating)?;

        // Step 1: new key first, old key archived.
        {
            let _lock = self.exclusive_lock()?;
            self.sweep_key_temps(&key_file)?;
            let Some(loaded) = keys::load(std::slice::from_ref(&source))? else {
                return Err(Error::Sealed {
                    store: self.config().name.clone(),
                    reason: SealedReason::BadKey(format!("{source} has no key any more")),
                });
            };
            let primary_fp = fingerprint(&loaded.primary);
            let marked = durable::read_capped(&rotating, 256)
                .ok()
                .flatten()
                .map(|b| String::from_utf8_lossy(&b).trim().to_owned());
            report.resumed = marked.as_deref() == Some(primary_fp.as_str());
            if opts.new_key && !report.resumed {
                // The old primary first, then the archive without repeats (a set: an archive
                // may hold tens of thousands of keys).
                let mut seen = std::collections::HashSet::new();
                let archive_keys = std::iter::once(&loaded.primary).chain(&loaded.previous);
                let mut archive: Vec<SecretBytes> = archive_keys
                    .filter(|k| seen.insert(k.expose()))
                    .map(|k| SecretBytes::new(k.expose().as_bytes().to_vec()))
                    .collect();
                drop(seen);
                // Lines that are not keys stay as they are, byte for byte.
                archive.extend(
                    loaded
                        .unparsed
                        .iter()
                        .map(|l| SecretBytes::new(l.expose().to_vec())),
                );
                // An archive too large to read back is refused here, before the new key.
                keys::write_previous(&key_file, &archive, &faults)
                    .map_err(|e| self.key_write_failed(e))?;
                let new = generate_key();
                durable::atomic_write(rot_dir, rot_name, fingerprint(&new).as_bytes(), &faults)
                    .map_err(|e| self.io_failed(e))?;
                keys::write_key_file(&key_file, &new, &faults)
                    .map_err(|e| self.key_write_failed(e))?;
            }
            self.reload_keys();
        }
        report.new_key = self.key_fingerprints().first().cloned().unwrap_or_default();

        // Step 2: re-encrypt, one file per lock hold so other writers keep going.
        let names = self.enc_files()?;
        for (i, name) in names.iter().enumerate() {
            let _lock = self.exclusive_lock()?;
            if self.reencrypt_file(name)? {
                report.reencrypted += 1;
            }
            progress(i + 1, names.len());
        }

        // Step 3: a full scan under the lock: what each archived key still opens.
        let _lock = self.exclusive_lock()?;
        let archived = self.key_fingerprints().len().saturating_sub(1);
        // Per archived key (index 1..), why it is still needed; `None` in `unknown`: some
        // file may need any key.
        let mut needed: Vec<Vec<String>> = vec![Vec::new(); archived + 1];
        let mut unknown: Vec<String> = Vec::new();
        for name in self.enc_files()? {
            report.verified += 1;
            let mut use_ =
                self.with_ring(|ring| Ok(self.key_use_at(ring, &self.cred_path(&name))))?;
            if let KeyUse::Key {
                index,
                skewed: false,
            } = use_
            {
                if index > 0 && self.reencrypt_file(&name)? {
                    report.reencrypted += 1;
                    use_ =
                        self.with_ring(|ring| Ok(self.key_use_at(ring, &self.cred_path(&name))))?;
                }
            }
            match use_ {
                KeyUse::Key { index: 0, .. } | KeyUse::Gone => {}
                KeyUse::Key { index, skewed } => {
                    let why = if skewed {
                        format!("{name} (stamped in the future)")
                    } else {
                        format!("{name} (could not be re-encrypted)")
                    };
                    if let Some(v) = needed.get_mut(index) {
                        v.push(why);
                    }
                }
                KeyUse::Unreadable(why) => unknown.push(why),
                KeyUse::Undecryptable => report.undecryptable.push(name),
            }
        }
        // Quarantined files are never deleted; one a kept key opens keeps that key.
        for path in self.quarantined_files() {
            match self.with_ring(|ring| Ok(self.key_use_at(ring, &path)))? {
                KeyUse::Key { index, .. } if index > 0 => {
                    if let Some(v) = needed.get_mut(index) {
                        v.push(format!("quarantined {}", path.display()));
                    }
                }
                KeyUse::Unreadable(why) => unknown.push(format!("quarantined {why}")),
                _ => {}
            }
        }
        let mut blockers: Vec<String> = needed
            .iter()
            .skip(1)
            .flatten()
            .cloned()
            .chain(unknown.iter().cloned())
            .collect();
        if let Err(why) = reseal() {
            blockers.push(format!("re-sealing other data under the new key: {why}"));
        }
        if opts.prune {
            let damaged =
                keys::load(std::slice::from_ref(&source))?.map_or(0, |l| l.unparsed.len());
            if damaged > 0 {
                blockers.push(format!(
                    "the key archive {} has {damaged} line(s) that are not keys (one may have been \
                     a key a file needs): fix or remove them by hand",
                    keys::prev_path(&key_file).display()
                ));
            }
        }
        let fps = self.key_fingerprints();
        if blockers.is_empty() {
            durable::remove_durably(rot_dir, rot_name, &faults).map_err(|e| self.io_failed(e))?;
            if opts.prune && archived > 0 {
                let loaded =
                    keys::load(std::slice::from_ref(&source))?.ok_or_else(|| Error::Sealed {
                        store: self.config().name.clone(),
                        reason: SealedReason::BadKey(format!("{source} has no key any more")),
                    })?;
                // The keyring is [primary, archive…] in file order: what is kept is what
                // some file still needs (nothing, once every file is re-encrypted).
                let keep: Vec<SecretBytes> = loaded
                    .previous
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| needed.get(i + 1).is_some_and(|v| !v.is_empty()))
                    .map(|(_, k)| SecretBytes::new(k.expose().as_bytes().to_vec()))
                    .collect();
                keys::write_previous(&key_file, &keep, &faults)
                    .map_err(|e| self.key_write_failed(e))?;
                report.pruned = fps
                    .iter()
                    .skip(1)
                    .enumerate()
                    .filter(|(i, _)| needed.get(i + 1).is_none_or(Vec::is_empty))
                    .map(|(_, fp)| fp.clone())
                    .collect();
                self.reload_keys();
                // Spares may hold ciphertexts under a pruned key.
                if let Some(spares) = self.spares() {
                    spares.purge();
                }
            }
        }
        report.retired = self.key_fingerprints().into_iter().skip(1).collect();
        report.kept = fps
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(i, fp)| {
                let v = needed.get(i)?;
                (!v.is_empty()).then(|| format!("{fp}: {}", v.join(", ")))
            })
            .collect();
        self.flush_locked()?;
        if !blockers.is_empty() {
            return Err(Error::RotationBlocked {
                blockers,
                prune_only: !opts.new_key,
            });
        }
        tracing::info!(store = %self.config().name, key = %report.new_key, reencrypted = report.reencrypted, archived = report.retired.len(), pruned = report.pruned.len(), new_key = opts.new_key, "key rotation complete");
        Ok(report)
    }

    /// Which keys the store has and which files each opens: every credential file and every
    /// quarantined file is read and checked at the Fernet layer. Modifies nothing.
    pub fn key_report(&self) -> Result<KeyReport> {
        let source = self.key_source();
        let key_file = source
            .as_ref()
            .and_then(|s| s.file().map(Path::to_path_buf));
        let mut report = KeyReport {
            source: source.as_ref().map(ToString::to_string).unwrap_or_default(),
            archive: key_file
                .as_deref()
                .map(keys::prev_path)
                .filter(|p| p.exists())
                .map(|p| p.display().to_string()),
            rotating: key_file
                .as_deref()
                .is_some_and(|k| rotating_path(k).exists()),
            archive_damaged: match &source {
                Some(s) if s.file().is_some() => {
                    keys::load(std::slice::from_ref(s))?.map_or(0, |l| l.unparsed.len())
                }
                _ => 0,
            },
            keys: self
                .key_fingerprints()
                .into_iter()
                .enumerate()
                .map(|(i, fingerprint)| KeyInfo {
                    fingerprint,
                    role: if i == 0 { "primary" } else { "archived" }.into(),
                    ..KeyInfo::default()
                })
                .collect(),
            ..KeyReport::default()
        };
        let files = self
            .enc_files()?
            .into_iter()
            .map(|n| (false, self.cred_path(&n)))
            .chain(self.quarantined_files().into_iter().map(|p| (true, p)));
        for (quarantined, path) in files {
            let name = path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            match self.with_ring(|ring| Ok(self.key_use_at(ring, &path)))? {
                KeyUse::Key { index, .. } => {
                    if let Some(k) = report.keys.get_mut(index) {
                        match quarantined {
                            true => k.quarantined.push(name),
                            false => k.files.push(name),
                        }
                    }
                }
                KeyUse::Undecryptable if !quarantined => report.undecryptable.push(name),
                KeyUse::Unreadable(why) => report.unreadable.push(why),
                KeyUse::Undecryptable | KeyUse::Gone => {}
            }
        }
        Ok(report)
    }

    /// Remove temp files that an interrupted write of this key file, its archive or its
    /// rotation mark left beside it (they may hold a key). Only names derived from this key
    /// file are touched: a key directory can hold other stores' keys. Caller holds the store
    /// lock, which every writer of these files holds.
    fn sweep_key_temps(&self, key_file: &Path) -> Result<()> {
        let (dir, name) = keys::split(key_file)?;
        let prefixes = [
            format!(".{name}{TEMP_MARKER}"),
            format!(".{name}.prev{TEMP_MARKER}"),
            format!(".{name}.rotating{TEMP_MARKER}"),
        ];
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let n = entry.file_name().to_string_lossy().into_owned();
            if prefixes.iter().any(|p| n.starts_with(p.as_str())) {
                durable::remove_durably(dir, &n, self.faults()).map_err(|e| self.io_failed(e))?;
                tracing::info!(store = %self.config().name, file = %n, "removed a temp file left by an interrupted key write");
            }
        }
        Ok(())
    }
}
