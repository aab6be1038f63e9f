//! The spare-file pool of recycled replacements (see [`Spares`]): files a replacement retired,
//! kept under spare names and rewritten in place by later replacements of the same file.

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::limits::SPARE_CAP;
use crate::limits::SPARE_MIN_AGE;

/// Files that replacements retired, kept for reuse as the temp files of later replacements.
///
/// On a file system that discards (TRIMs) freed blocks at journal commit — ext4 mounted with
/// `discard`, common on cloud disks — replacing a file costs several times more than writing a
/// new one, because the replaced file's blocks are freed and discarded inside the commit that
/// the directory fsync waits for (`holdfast bench` measured 1.14 ms against 0.17 ms here). A
/// recycled replacement keeps the replaced inode under a spare name (a hard link made before
/// the rename) and later rewrites it in place as a temp file, so a steady stream of
/// replacements neither allocates nor frees blocks (PostgreSQL recycles WAL segments for the
/// same reason).
///
/// A spare is reused only after [`SPARE_MIN_AGE`], and only for the file it was retired from:
/// a reader that opened the file before it was replaced must not see it rewritten under its
/// feet, and if one stalls that long anyway it sees a newer version of the same credential or
/// a torn token that fails Fernet's HMAC — never another credential's value. (holdfast's own
/// reads also check the id and read once more.) Spares are named `.hf-spare-<pid>-<hex>`: not
/// temp files, so another process's open does not sweep a live pool; one whose owner is gone,
/// or whose inode has not changed for [`SPARE_ORPHAN_AGE`], is an orphan the sweep removes. The pool lives
/// in memory; spares unused for a minute are unlinked by [`Spares::trim`],
/// [`Spares::purge_from`] drops those of a deleted credential's file, [`Spares::purge`] all.
#[derive(Debug)]
pub struct Spares {
    dir: PathBuf,
    pool: Mutex<Pool>,
    min_age: Duration,
    cap: usize,
}

#[derive(Debug, Default)]
struct Pool {
    /// By the file name they were retired from, oldest first.
    by_file: std::collections::HashMap<String, VecDeque<Spare>>,
    len: usize,
}

#[derive(Debug)]
struct Spare {
    name: String,
    retired: Instant,
}

impl Pool {
    /// Remove and return the names of spares matching `pick` (per file, oldest first, while
    /// `pick` says yes), at most `max`.
    fn drain_where(
        &mut self,
        max: usize,
        mut pick: impl FnMut(&str, &Spare) -> bool,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for (from, q) in self.by_file.iter_mut() {
            while out.len() < max && q.front().is_some_and(|s| pick(from, s)) {
                if let Some(s) = q.pop_front() {
                    out.push(s.name);
                }
            }
        }
        self.by_file.retain(|_, q| !q.is_empty());
        self.len -= out.len();
        out
    }
}

impl Spares {
    /// An empty pool for files of `dir`.
    pub fn new(dir: &Path) -> Self {
        Self::with_limits(dir, SPARE_MIN_AGE, SPARE_CAP)
    }

    /// An empty pool reusing spares after `min_age`, holding at most `cap`.
    pub fn with_limits(dir: &Path, min_age: Duration, cap: usize) -> Self {
        Spares {
            dir: dir.to_path_buf(),
            pool: Mutex::new(Pool::default()),
            min_age,
            cap,
        }
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn unlink_all(&self, names: &[String]) {
        for name in names {
            let _ = fs::remove_file(self.dir.join(name));
        }
    }

    /// The oldest spare retired from `file`, if it is old enough to reuse.
    pub(super) fn take(&self, file: &str) -> Option<String> {
        let mut pool = self.pool();
        let q = pool.by_file.get_mut(file)?;
        if q.front()?.retired.elapsed() < self.min_age {
            return None;
        }
        let spare = q.pop_front()?;
        if q.is_empty() {
            pool.by_file.remove(file);
        }
        pool.len -= 1;
        Some(spare.name)
    }

    pub(super) fn put(&self, name: String, from: &str) {
        let mut pool = self.pool();
        pool.by_file
            .entry(from.to_owned())
            .or_default()
            .push_back(Spare {
                name,
                retired: Instant::now(),
            });
        pool.len += 1;
        // Over the cap (more files rewritten per min_age than the cap): drop the oldest. Its
        // blocks are freed, as a plain replacement would have freed them.
        let mut gone = Vec::new();
        while pool.len > self.cap {
            let oldest = pool
                .by_file
                .iter()
                .filter_map(|(f, q)| q.front().map(|s| (s.retired, f.clone())))
                .min();
            let Some((_, f)) = oldest else { break };
            let pool = &mut *pool;
            if let Some(q) = pool.by_file.get_mut(&f) {
                if let Some(s) = q.pop_front() {
                    gone.push(s.name);
                    pool.len -= 1;
                }
                if q.is_empty() {
                    pool.by_file.remove(&f);
                }
            }
        }
        drop(pool);
        self.unlink_all(&gone);
    }

    /// Spares waiting.
    pub fn len(&self) -> usize {
        self.pool().len
    }

    /// Whether no spare waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Unlink up to `max` spares retired longer than `idle` ago: a pool that is not being used
    /// should not keep old ciphertexts on disk. Returns how many were removed.
    pub fn trim(&self, idle: Duration, max: usize) -> usize {
        let gone = self
            .pool()
            .drain_where(max, |_, s| s.retired.elapsed() >= idle);
        self.unlink_all(&gone);
        gone.len()
    }

    /// Unlink the spares retired from file `from` (its credential was deleted: its old
    /// versions go too). Returns how many.
    pub fn purge_from(&self, from: &str) -> usize {
        let gone = self.pool().drain_where(usize::MAX, |f, _| f == from);
        self.unlink_all(&gone);
        gone.len()
    }

    /// Unlink every spare (after a key rotation: they hold ciphertexts under retired keys).
    pub fn purge(&self) -> usize {
        let gone = self.pool().drain_where(usize::MAX, |_, _| true);
        self.unlink_all(&gone);
        gone.len()
    }
}
