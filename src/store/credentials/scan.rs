//! Seeing the directory as it is: listing, the directory scan and its change list (what the
//! watcher reports), reconciliation of the index with the files, and fsck.

use super::*;

impl CredentialStore {
    /// Names of the `.enc` files in `credentials/`, sorted.
    pub(in crate::store) fn enc_files(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        let read_err = |source| Error::Read {
            path: self.cred_dir.clone(),
            source,
        };
        let rd = match fs::read_dir(&self.cred_dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(names),
            Err(e) => return Err(read_err(e)),
        };
        for e in rd {
            let e = e.map_err(read_err)?;
            if let Some(name) = e.file_name().to_str() {
                if name.ends_with(".enc") && !durable::is_temp_name(name) {
                    names.push(name.to_owned());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// The path of credential file `name`.
    pub(in crate::store) fn cred_path(&self, name: &str) -> PathBuf {
        self.cred_dir.join(name)
    }

    /// Every regular file in `quarantine/` (never deleted: a key that opens one is kept).
    pub(in crate::store) fn quarantined_files(&self) -> Vec<PathBuf> {
        let Ok(rd) = fs::read_dir(&self.quarantine_dir) else {
            return Vec::new();
        };
        let mut v: Vec<PathBuf> = rd
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.path())
            .collect();
        v.sort();
        v
    }

    /// Metadata of every credential (never secret values), fresh from the directory.
    /// Files that cannot be read are counted in `unreadable` (and listed with their last known
    /// metadata if they had any).
    pub fn list(&self) -> Result<Listing> {
        self.reload_keys_if_changed();
        // Files something else wrote since holdfast last did (or bytes overtaken while they
        // were read): what the files hold now is recorded and listed again, so a generation
        // shown is bound to its content (`generations.rs`).
        let mut listing = self.list_once()?;
        for _ in 0..crate::limits::GENERATION_READ_RETRIES {
            if !self.has_pending_records() || self.check_writable().is_err() {
                break;
            }
            self.record_pending()?;
            listing = self.list_once()?;
        }
        Ok(listing)
    }

    fn list_once(&self) -> Result<Listing> {
        self.with_ring(|ring| {
            let mut inner = lock_guard(&self.inner);
            self.refresh(&mut inner, ring)?;
            let mut refused_ids = 0;
            let credentials: Vec<CredentialInfo> = inner
                .ordered()
                .into_iter()
                .filter(|(_, e)| {
                    let served = id::validate(&e.id).is_ok();
                    refused_ids += usize::from(!served);
                    served
                })
                .map(|(_, e)| CredentialInfo {
                    id: e.id.clone(),
                    generation: e.generation,
                    metadata: e.meta.clone(),
                })
                .collect();
            Ok(Listing {
                credentials,
                refused_ids,
                unreadable: inner.unreadable,
            })
        })
    }

    /// Pick up changes other processes made to the files (hive, an offline CLI, a person
    /// copying files): refresh from the directory, return the credentials that appeared,
    /// changed or disappeared, and rewrite the index if it drifted. Cheap when nothing changed
    /// (one stat per file). Writes made through this handle are already known and are not
    /// reported again.
    pub fn sync(&self) -> Result<Vec<Change>> {
        self.reload_keys_if_changed();
        let mut changes = self.with_ring(|ring| {
            let mut inner = lock_guard(&self.inner);
            let was_seeded = inner.seeded;
            let before = std::mem::take(&mut inner.entries);
            inner.entries = before.clone();
            self.refresh(&mut inner, ring)?;
            let mut changes = std::mem::take(&mut inner.pending);
            if was_seeded && self.opts.index_flush == IndexFlush::Immediate {
                changes = diff_entries(&before, &inner.entries);
            }
            Ok(changes)
        })?;
        if self.record_pending()? > 0 {
            for c in changes.iter_mut().filter(|c| c.generation.is_some()) {
                if let Some(gen) = self.marker_gen(&id::file_name(&c.id)) {
                    c.generation = Some(gen);
                }
            }
        }
        self.flush()?;
        Ok(changes)
    }

    /// Changes other processes made that a directory scan (an index rewrite's) found and
    /// nobody has reported yet. The daemon drains them after each background flush.
    pub fn take_changes(&self) -> Vec<Change> {
        std::mem::take(&mut lock_guard(&self.inner).pending)
    }

    /// Like [`CredentialStore::sync`], but look only at the files named (the file watcher knows
    /// which changed): a stat each, a decryption for those whose stamp differs. Names that are
    /// not credential files are ignored, except `index.json`: if another process rewrote it,
    /// the index is marked dirty so that ours (a full view) replaces it. O(changed files), not
    /// O(store): the daemon's own writes come back as events and cost a stat each.
    pub fn sync_files(&self, names: &[String]) -> Result<Vec<Change>> {
        self.reload_keys_if_changed();
        self.with_ring(|ring| {
            let mut inner = lock_guard(&self.inner);
            if !inner.seeded {
                self.refresh(&mut inner, ring)?;
                return Ok(Vec::new());
            }
            let mut changes = Vec::new();
            for name in names {
                if durable::markers::is_gen_marker_name(name) {
                    self.learn_marker(name);
                    continue;
                }
                if name == INDEX_FILE {
                    if stamp_of(&self.meta_dir.join(INDEX_FILE)) != inner.index_stamp {
                        inner.mark_dirty();
                    }
                    continue;
                }
                if !name.ends_with(".enc") || durable::is_temp_name(name) {
                    continue;
                }
                if inner.deleting.as_deref() == Some(name.as_str()) {
                    continue;
                }
                let stamp = stamp_of(&self.cred_dir.join(name));
                let known = inner.entries.get(name);
                if stamp.is_some() && known.is_some_and(|e| e.stamp == stamp) {
                    continue;
                }
                match (stamp, self.read_file(name, ring)) {
                    (Some(stamp), FileRead::Ok(c, _, _)) if id::file_name(c.id()) == *name => {
                        let entry = Entry {
                            id: c.id().to_owned(),
                            meta: c.index_entry(),
                            stamp: Some(stamp),
                            generation: c.generation(),
                        };
                        changes.push(Change {
                            id: entry.id.clone(),
                            generation: Some(entry.generation),
                        });
                        inner.entries.insert(name.clone(), entry);
                        inner.mark_dirty();
                    }
                    (_, FileRead::Missing) => {
                        if let Some(gone) = inner.entries.remove(name) {
                            changes.push(Change {
                                id: gone.id,
                                generation: None,
                            });
                            inner.mark_dirty();
                        }
                    }
                    // Unreadable or damaged: keep what we knew; fsck reports it.
                    _ => {}
                }
            }
            let mut all = std::mem::take(&mut inner.pending);
            all.extend(changes);
            Ok(all)
        })
    }

    /// Bring the in-memory entries up to date with the directory: stat every file, decrypt
    /// only those whose stamp changed (or, the first time, that the index does not vouch for).
    /// A file that cannot be read keeps its last known entry. Modifies nothing on disk.
    pub(super) fn refresh(&self, inner: &mut Inner, ring: &Keyring) -> Result<()> {
        let seed = if inner.seeded {
            None
        } else {
            let (index, state, stamp) = self.read_index();
            (state == IndexState::Ok).then_some((index, stamp))
        };
        if let Some((index, _)) = &seed {
            inner.learn_order(index);
        }
        let seed_ref = seed.as_ref().map(|(i, s)| (i, *s));
        let scan = self.scan(
            ring,
            &inner.entries,
            seed_ref,
            false,
            inner.deleting.as_deref(),
        )?;
        let mut fresh = scan.entries;
        for (name, _, _) in &scan.bad {
            if let Some(e) = inner.entries.get(name) {
                fresh.insert(
                    name.clone(),
                    Entry {
                        stamp: None,
                        ..e.clone()
                    },
                );
            }
        }
        let changed = fresh.len() != inner.entries.len()
            || fresh
                .iter()
                .zip(&inner.entries)
                .any(|(a, b)| a.0 != b.0 || a.1.stamp != b.1.stamp);
        if changed && inner.seeded {
            inner.mark_dirty();
            if self.opts.index_flush == IndexFlush::Deferred {
                // Whoever scans first (the flusher, a list, the watcher) must not swallow a
                // change that watchers should hear about: keep it for `take_changes`.
                let found = diff_entries(&inner.entries, &fresh);
                inner.pending.extend(found);
                let excess = inner.pending.len().saturating_sub(MAX_PENDING_CHANGES);
                inner.pending.drain(..excess);
            }
        }
        inner.entries = fresh;
        inner.seeded = true;
        inner.unreadable =
            scan.bad.len() + scan.kept.len() + scan.skewed.len() + scan.io_errors.len();
        Ok(())
    }

    /// Read index.json: the parsed index (empty if unusable), its state, and its stamp.
    pub(super) fn read_index(&self) -> (Index, IndexState, Option<FileStamp>) {
        let path = self.meta_dir.join(INDEX_FILE);
        let stamp = stamp_of(&path);
        let (index, state) = match durable::read_capped(&path, MAX_INDEX_FILE_BYTES) {
            Ok(None) => (Index::default(), IndexState::Missing),
            Ok(Some(bytes)) => match Index::parse(&bytes) {
                Ok(idx) => (idx, IndexState::Ok),
                Err(state) => (Index::default(), state),
            },
            Err(e) if e.kind() == io::ErrorKind::FileTooLarge => {
                (Index::default(), IndexState::TooBig)
            }
            Err(_) => (Index::default(), IndexState::Unparseable),
        };
        (index, state, stamp)
    }

    /// Scan `credentials/`: trust files whose stamp matches a known entry or (racily clean)
    /// an index vouch, decrypt the rest (all of them when `full`). Modifies nothing.
    pub(super) fn scan(
        &self,
        ring: &Keyring,
        known: &BTreeMap<String, Entry>,
        index: Option<(&Index, Option<FileStamp>)>,
        full: bool,
        skip: Option<&str>,
    ) -> Result<Scan> {
        let mut scan = Scan::default();
        let names = self.enc_files()?;
        scan.files = names.len();
        for name in names {
            if skip == Some(name.as_str()) {
                continue;
            }
            let Some(stamp) = stamp_of(&self.cred_dir.join(&name)) else {
                continue;
            };
            if !full {
                if let Some(e) = known.get(&name).filter(|e| e.stamp == Some(stamp)) {
                    scan.vouched += 1;
                    scan.entries.insert(name, e.clone());
                    continue;
                }
                if let Some((idx, index_stamp)) = index {
                    // A vouch is trusted only with the generation its marker records: a
                    // vouch written for a state no marker recorded is checked again.
                    if let Some(e) = vouched_entry(idx, index_stamp, &name, stamp)
                        .filter(|e| self.marker_gen(&name) == Some(e.generation))
                    {
                        scan.vouched += 1;
                        scan.entries.insert(name, e);
                        continue;
                    }
                }
            }
            scan.decrypted += 1;
            // What to keep listing if the file cannot be read now.
            let fallback = || {
                known
                    .get(&name)
                    .cloned()
                    .or_else(|| index_entry(index?.0, &name))
            };
            match self.read_file(&name, ring) {
                FileRead::Missing => {}
                FileRead::Ok(c, key_idx, _) => {
                    if id::file_name(c.id()) != name {
                        // A key of ours opens it: never quarantined (see `Scan::kept`).
                        scan.kept
                            .push(format!("{name}: {}", swapped_reason(c.id())));
                        continue;
                    }
                    if key_idx > 0 {
                        scan.old_key.push(name.clone());
                    }
                    let meta = c.index_entry();
                    if let Some((idx, _)) = index {
                        if idx.credentials.get(c.id()).is_some_and(|m| *m != meta) {
                            scan.drift.push(c.id().to_owned());
                        }
                    }
                    let entry = Entry {
                        id: c.id().to_owned(),
                        meta,
                        stamp: Some(stamp),
                        generation: c.generation(),
                    };
                    scan.entries.insert(name, entry);
                }
                // Unreadable right now, not damaged: keep listing what we knew about it.
                FileRead::NotCredential(reason) => scan.kept.push(format!("{name}: {reason}")),
                unreadable @ (FileRead::Skew(_) | FileRead::Io(_) | FileRead::TooLarge) => {
                    match &unreadable {
                        FileRead::Skew(e) => scan.skewed.push(format!("{name}: {e}")),
                        FileRead::Io(e) => scan.io_errors.push(format!("{name}: {e}")),
                        _ => scan.io_errors.push(format!(
                            "{name}: larger than the {MAX_CREDENTIAL_FILE_BYTES} bytes holdfast serves (written by another program)"
                        )),
                    }
                    if let Some(keep) = fallback() {
                        let keep = Entry {
                            stamp: None,
                            ..keep
                        };
                        scan.entries.insert(name, keep);
                    }
                }
                FileRead::WrongKey => {
                    scan.bad
                        .push((name, DecryptError::Invalid.to_string(), stamp))
                }
                FileRead::Damaged(reason) => scan.bad.push((name, reason, stamp)),
            }
        }
        Ok(scan)
    }

    /// Compare the index with the files and (with `repair`) fix every difference. Caller holds
    /// the store lock (exclusive when repairing). `full` decrypts every file; otherwise only
    /// files the index does not vouch for.
    pub(super) fn reconcile(&self, inner: &mut Inner, full: bool, repair: bool) -> Result<Report> {
        let faults = self.faults();
        let mut report = Report {
            repaired: repair,
            full,
            ..Report::default()
        };
        for dir in [&self.cred_dir, &self.meta_dir] {
            if repair {
                let swept =
                    durable::sweep_temp_files(dir, faults).map_err(|e| self.io_failed(e))?;
                // A full batch of orphaned spares: there may be more (see sweep_orphans).
                if swept.iter().filter(|n| durable::is_spare_name(n)).count()
                    >= durable::ORPHAN_SWEEP_BATCH
                {
                    self.orphans_pending.store(true, Ordering::SeqCst);
                }
                report.temp_files.extend(swept);
            } else {
                report.temp_files.extend(durable::leftover_names(dir));
            }
        }
        let (index, state, index_stamp) = self.read_index();
        report.set_index_state(&state);
        if let Ok(rd) = fs::read_dir(&self.cred_dir) {
            report.stray = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    !n.ends_with(".enc")
                        && !durable::is_temp_name(n)
                        && !durable::is_spare_name(n)
                        && !durable::markers::is_gen_marker_name(n)
                })
                .collect();
            report.stray.sort();
        }
        let scan = self.with_ring(|ring| {
            self.scan(
                ring,
                &BTreeMap::new(),
                Some((&index, index_stamp)),
                full,
                None,
            )
        })?;
        if state == IndexState::Missing && scan.files == 0 {
            // A new, empty store: nothing to rebuild; the first write creates the index.
            report.index_rebuilt = false;
        }
        report.files = scan.files;
        report.vouched = scan.vouched;
        report.decrypted = scan.decrypted;
        report.old_key = scan.old_key;
        report.clock_skew = scan.skewed;
        report.io_errors = scan.io_errors;
        report.drift = scan.drift;
        report.kept = scan.kept;
        let mut entries = scan.entries;
        if state == IndexState::Ok {
            let ids: std::collections::HashSet<&str> =
                entries.values().map(|e| e.id.as_str()).collect();
            report.orphans = entries
                .values()
                .filter(|e| !index.credentials.contains_key(&e.id))
                .map(|e| e.id.clone())
                .collect();
            report.ghosts = index
                .credentials
                .keys()
                .filter(|cid| !ids.contains(cid.as_str()))
                .cloned()
                .collect();
        }
        // hive writes its files in place (truncate, then write), so a file the scan read while
        // hive wrote it looks damaged. Before moving anything aside, give such a writer a
        // moment, then quarantine only what is unchanged and still does not read; a file that
        // changed or reads now is left for the next scan (its index entry kept meanwhile).
        if repair && !scan.bad.is_empty() {
            std::thread::sleep(crate::limits::QUARANTINE_SETTLE);
        }
        // Files something else wrote since holdfast last did: their generations recorded now,
        // under the lock the repair holds (one directory fsync for all).
        if repair && self.has_pending_records() {
            let names: Vec<String> = self.markers_pending();
            report.generations_recorded =
                self.with_ring(|ring| self.record_generations(ring, &names))?;
            for name in &names {
                if let (Some(gen), Some(e)) = (self.marker_gen(name), entries.get_mut(name)) {
                    e.generation = gen;
                }
            }
        }
        for (name, reason, seen) in scan.bad {
            // An empty file holds nothing to keep, and a writer in place that truncated it
            // writes next into the same inode: moved aside, that write would leave the store.
            // Not listed meanwhile (nothing to read); the next scan finds it once written.
            // (A FIFO or a socket also has size 0: those are moved aside like any bad file.)
            if seen.size == 0 && is_regular(&self.cred_dir.join(&name)) {
                report.empty.push(name);
                continue;
            }
            if repair {
                let unchanged = stamp_of(&self.cred_dir.join(&name)) == Some(seen);
                let still_bad = unchanged
                    && self.with_ring(|ring| {
                        Ok(match self.read_file(&name, ring) {
                            FileRead::WrongKey | FileRead::Damaged(_) => true,
                            // A key of ours opens these now: not quarantined.
                            FileRead::Ok(..)
                            | FileRead::NotCredential(_)
                            | FileRead::Missing
                            | FileRead::Skew(_)
                            | FileRead::Io(_)
                            | FileRead::TooLarge => false,
                        })
                    })?;
                if !still_bad {
                    tracing::info!(file = %name, "a credential file changed while it was read (a writer in place, as hive's): left for the next scan");
                    if let Some(e) = index_entry(&index, &name) {
                        entries.entry(name.clone()).or_insert(e);
                    }
                    report.unsettled.push(name);
                    continue;
                }
            }
            let moved_to = if repair {
                let to = durable::move_aside(&self.cred_dir, &name, &self.quarantine_dir, faults)
                    .map_err(|e| self.io_failed(e))?;
                tracing::warn!(file = %name, %reason, moved_to = %to.display(), "quarantined credential file");
                Some(to)
            } else {
                None
            };
            report.quarantined.push(Quarantined {
                file: name,
                reason,
                moved_to,
            });
        }
        report.readable = entries.values().filter(|e| e.stamp.is_some()).count();
        report.refused_ids = entries
            .iter()
            .filter_map(|(name, e)| {
                let why = id::validate(&e.id).err()?;
                Some(format!("{name:?}: {why}"))
            })
            .collect();
        let vouched: Vec<(&String, FileStamp)> = entries
            .iter()
            .filter_map(|(n, e)| e.stamp.map(|s| (n, s)))
            .collect();
        let vouches_match = vouched.len() == index.vouches.len()
            && vouched
                .iter()
                .all(|(n, s)| index.vouches.get(*n).is_some_and(|v| v.stamp == *s));
        let needs_rewrite = state != IndexState::Ok
            || !report.orphans.is_empty()
            || !report.ghosts.is_empty()
            || !report.drift.is_empty()
            || !report.quarantined.is_empty()
            || !vouches_match;
        inner.entries = entries;
        inner.seeded = true;
        inner.learn_order(&index);
        inner.index_extra = index.extra;
        inner.index_stamp = index_stamp;
        inner.unreadable = report.clock_skew.len()
            + report.io_errors.len()
            + report.quarantined.len()
            + report.kept.len()
            + report.empty.len();
        inner.set_dirty(needs_rewrite);
        if repair && needs_rewrite {
            self.with_ring(|ring| self.flush_index(inner, ring))?;
            report.index_rewritten = true;
        }
        Ok(report)
    }

    /// Scan the store and report (fsck). With `repair`, fix what is found: remove temp
    /// files, rebuild or correct the index, quarantine damaged files. Every file is decrypted.
    pub fn fsck(&self, repair: bool) -> Result<Report> {
        // Pending index changes are not problems: write them first (no-op when read-only).
        self.flush()?;
        if repair {
            self.check_writable()?;
        } else if let Some(reason) = self.sealed_reason() {
            return Err(self.sealed_error(reason));
        }
        // A read-only look takes the lock shared, but only if the lock file exists: creating
        // it would be a modification.
        let _guard = if repair {
            Some(self.lock_store(LockMode::Exclusive)?)
        } else if self.lock_path.is_file() {
            Some(self.lock_store(LockMode::Shared)?)
        } else {
            None
        };
        let mut inner = lock_guard(&self.inner);
        self.reconcile(&mut inner, true, repair)
    }

    /// Count of credential files on disk (works sealed).
    pub fn file_count(&self) -> Result<usize> {
        Ok(self.enc_files()?.len())
    }
}

/// What a directory scan found.
#[derive(Default)]
pub(super) struct Scan {
    entries: BTreeMap<String, Entry>,
    files: usize,
    vouched: usize,
    decrypted: usize,
    old_key: Vec<String>,
    skewed: Vec<String>,
    io_errors: Vec<String>,
    /// File name, reason and the stamp the scan saw: files no key of the store opens (or
    /// that are not files at all), the only ones a repair quarantines.
    bad: Vec<(String, String, FileStamp)>,
    /// Files a key of the store opens but that are not usable here (another id's file, not a
    /// credential): reported, left in place. A quarantined file would need that key for as
    /// long as it is kept, and the key archive may not know about it.
    kept: Vec<String>,
    drift: Vec<String>,
}

/// What the index says of file `name`, to keep listing while the file cannot be read.
fn index_entry(idx: &Index, name: &str) -> Option<Entry> {
    let (cid, meta) = idx
        .credentials
        .iter()
        .find(|(cid, _)| id::file_name(cid) == name)?;
    Some(Entry {
        id: cid.clone(),
        meta: meta.clone(),
        stamp: None,
        generation: idx
            .vouches
            .get(name)
            .map_or(0, |v| v.generation.min(crate::limits::MAX_GENERATION)),
    })
}

/// What changed between two views of the entries, by id.
pub(super) fn diff_entries(
    before: &BTreeMap<String, Entry>,
    after: &BTreeMap<String, Entry>,
) -> Vec<Change> {
    let old: std::collections::HashMap<&str, (u64, Option<FileStamp>)> = before
        .values()
        .map(|e| (e.id.as_str(), (e.generation, e.stamp)))
        .collect();
    let mut seen = std::collections::HashSet::new();
    let mut changes = Vec::new();
    for e in after.values() {
        seen.insert(e.id.as_str());
        if old.get(e.id.as_str()) != Some(&(e.generation, e.stamp)) {
            changes.push(Change {
                id: e.id.clone(),
                generation: Some(e.generation),
            });
        }
    }
    for id in old.keys().filter(|id| !seen.contains(*id)) {
        changes.push(Change {
            id: (*id).to_owned(),
            generation: None,
        });
    }
    changes
}
