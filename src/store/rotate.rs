//! Key rotation with MultiFernet semantics, restartable at any point.
//!
//! Steps (each durable before the next):
//! 1. Under the store lock: write `<key>.prev` = the current key (plus any older previous
//!    keys), then write the new key to `<key>`. From here on the keyring is [new, old…]:
//!    every file decrypts, every new write uses the new key.
//! 2. For every file, one at a time under the lock: if it decrypts only with a previous key,
//!    re-encrypt it with the new key (atomic replace; the plaintext, generation included, is
//!    unchanged).
//! 3. Under the lock, a full scan: every file that decrypts must decrypt with the new key
//!    (stragglers written meanwhile by processes that had not reloaded the key are re-encrypted
//!    here). Only then `<key>.prev` is removed.
//!
//! A crash anywhere leaves a keyring that opens every file: before step 1's second write the
//! old key is still primary (and also in `.prev`); after it, both keys are loaded. Running
//! `key rotate` again resumes: a `.prev` file means "rotation in progress" and no new key is
//! made unless the crash came before the new key was written.

use std::path::Path;

use super::credentials::{CredentialStore, KeyUse};
use super::{Error, Result, SealedReason};
use crate::crypto::{generate_key, keys, KeyError, Secret};
use crate::durable::{self, TEMP_MARKER};

/// What a rotation did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RotateReport {
    /// Whether this run resumed an interrupted rotation.
    pub resumed: bool,
    /// Fingerprint of the new primary key.
    pub new_key: String,
    /// Fingerprints of the retired keys.
    pub retired: Vec<String>,
    /// Files re-encrypted.
    pub reencrypted: usize,
    /// Files checked in the final scan.
    pub verified: usize,
    /// Files that decrypt with no key at all (left alone; see `store fsck`).
    pub undecryptable: Vec<String>,
}

impl CredentialStore {
    /// Rotate the store's key (or finish an interrupted rotation). `progress(done, total)` is
    /// called as files are re-encrypted.
    pub fn rotate_key(&self, progress: impl FnMut(usize, usize)) -> Result<RotateReport> {
        self.rotate_key_with(progress, || Ok(()))
    }

    /// [`Self::rotate_key`], with `before_retire` run once every credential file is under the
    /// new key and before the old key is forgotten: other data sealed with this store's key
    /// (the daemon's streams) is re-sealed there. If it fails, the old key is kept and the
    /// rotation can be run again.
    pub fn rotate_key_with(
        &self,
        mut progress: impl FnMut(usize, usize),
        mut before_retire: impl FnMut() -> std::result::Result<
            (),
            Box<dyn std::error::Error + Send + Sync>,
        >,
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
            return Err(Error::Unsupported(format!(
                "the key comes from {source}, which holdfast cannot rewrite; rotate it where it is \
                 managed (for systemd LoadCredential=, replace the credential file and restart), \
                 or use a key file (--key-file)"
            )));
        };
        let faults = self.faults().clone();
        let mut report = RotateReport::default();

        // Step 1: new key first, old key kept.
        {
            let _lock = self.exclusive_lock()?;
            self.sweep_key_temps(&key_file)?;
            let Some(loaded) = keys::load(std::slice::from_ref(&source))? else {
                return Err(Error::Sealed {
                    store: self.config().name.clone(),
                    reason: SealedReason::BadKey(format!("{source} has no key any more")),
                });
            };
            let in_prev = loaded
                .previous
                .iter()
                .any(|k| k.expose() == loaded.primary.expose());
            report.resumed = !loaded.previous.is_empty();
            if !report.resumed || in_prev {
                if !in_prev {
                    let mut prev = vec![Secret::new(loaded.primary.expose().to_owned())];
                    prev.extend(
                        loaded
                            .previous
                            .iter()
                            .map(|k| Secret::new(k.expose().to_owned())),
                    );
                    keys::write_previous(&key_file, &prev, &faults)
                        .map_err(|e| self.key_write_failed(e))?;
                }
                keys::write_key_file(&key_file, &generate_key(), &faults)
                    .map_err(|e| self.key_write_failed(e))?;
            }
            self.reload_keys();
        }
        report.new_key = self.key_fingerprints().first().cloned().unwrap_or_default();
        report.retired = self.key_fingerprints().into_iter().skip(1).collect();

        // Step 2: re-encrypt, one file per lock hold so other writers keep going.
        let names = self.enc_files()?;
        for (i, name) in names.iter().enumerate() {
            let _lock = self.exclusive_lock()?;
            if self.reencrypt_file(name)? {
                report.reencrypted += 1;
            }
            progress(i + 1, names.len());
        }

        // Step 3: prove nothing needs the old keys, then forget them. A file that might still
        // need one (stamped in the future under an old key, or unreadable right now) keeps the
        // old keys: dropping them could make it undecryptable for good.
        {
            let _lock = self.exclusive_lock()?;
            let mut blockers = Vec::new();
            for name in self.enc_files()? {
                report.verified += 1;
                match self.key_use(&name)? {
                    KeyUse::Primary | KeyUse::Skewed { previous: false } => {}
                    KeyUse::Previous => {
                        if self.reencrypt_file(&name)? {
                            report.reencrypted += 1;
                        }
                    }
                    KeyUse::Skewed { previous: true } => blockers.push(format!(
                        "{name}: stamped in the future and readable only with a previous key"
                    )),
                    KeyUse::Unreadable(why) => blockers.push(why),
                    KeyUse::Undecryptable => report.undecryptable.push(name),
                }
            }
            if let Err(why) = before_retire() {
                blockers.push(format!("re-sealing other data under the new key: {why}"));
            }
            if !blockers.is_empty() {
                self.flush_locked()?;
                return Err(Error::RotationBlocked(blockers));
            }
            keys::write_previous(&key_file, &[], &faults).map_err(|e| self.key_write_failed(e))?;
            self.reload_keys();
            self.flush_locked()?;
            // Spares retired during the rotation may hold ciphertexts under the retired key.
            if let Some(spares) = self.spares() {
                spares.purge();
            }
        }
        tracing::info!(store = %self.config().name, new_key = %report.new_key, reencrypted = report.reencrypted, "key rotated");
        Ok(report)
    }

    /// A failed key-file write; a failed fsync poisons the store like any other write.
    fn key_write_failed(&self, err: KeyError) -> Error {
        match err {
            KeyError::Write(io) => self.io_failed(io),
            other => other.into(),
        }
    }

    /// Remove temp files that an interrupted write of this key file or its `.prev` left beside
    /// it (they may hold the key being retired). Only names derived from this key file are
    /// touched: a key directory can hold other stores' keys. Caller holds the store lock,
    /// which every writer of these files holds.
    fn sweep_key_temps(&self, key_file: &Path) -> Result<()> {
        let (dir, name) = keys::split(key_file)?;
        let prefixes = [
            format!(".{name}{TEMP_MARKER}"),
            format!(".{name}.prev{TEMP_MARKER}"),
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
