//! The runs in memory, in shards: each run lives in one of [`SHARDS`] maps, each behind its
//! own lock, chosen by a hash of the run's id.
//!
//! Runs are independent: nothing an append, interrupt or commit of one run does reads another.
//! One lock over every run serialized the daemon's appends — including sealing each record,
//! done under the lock so records reach the journal in seq order — and made the journal's
//! committer, which publishes every acknowledged append under that lock, wait for the workers
//! and the workers for it (docs/benchmarks.md, "Issue 15, fifth session": 10 % of the
//! daemon's CPU at 256 streams went to that contention). A run's records still reach the
//! journal in order: they are queued under their run's shard lock.
//!
//! Lock order: one shard at a time, except [`Runs::lock_all`] (key rotation's snapshot of
//! every run), which takes them all in index order. No code takes a shard lock while holding
//! another, so the two cannot deadlock.
//!
//! The number of active runs (bounded by `max_active_runs`) is kept in one counter: each
//! guard adds, when dropped, how many runs its shard gained or lost while it was held, and a
//! new run is admitted against the counter before it is inserted ([`RunsGuard::admit`]), so
//! concurrent begins in different shards cannot pass the bound together.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::State;

/// How many shards. Enough that 256 streams on a machine's few cores rarely meet on one lock
/// (the chance two given runs share a shard is 1 in 64); few enough that walking all of them
/// (listing, expiry, segment release) stays cheap.
pub(super) const SHARDS: usize = 64;

/// Every active run, sharded.
pub(super) struct Runs {
    shards: Box<[Mutex<State>]>,
    hasher: RandomState,
    count: AtomicUsize,
}

impl Runs {
    /// No runs.
    pub(super) fn new() -> Runs {
        Runs {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(State {
                        runs: HashMap::new(),
                    })
                })
                .collect(),
            hasher: RandomState::new(),
            count: AtomicUsize::new(0),
        }
    }

    fn guard(&self, i: usize) -> RunsGuard<'_> {
        let guard = self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        RunsGuard {
            before: guard.runs.len(),
            guard,
            admitted: 0,
            count: &self.count,
        }
    }

    /// The shard `run_id` lives in, locked.
    pub(super) fn lock(&self, run_id: &str) -> RunsGuard<'_> {
        self.guard((self.hasher.hash_one(run_id) as usize) % SHARDS)
    }

    /// Every shard, locked in index order (held together: nothing changes anywhere meanwhile).
    pub(super) fn lock_all(&self) -> Vec<RunsGuard<'_>> {
        (0..SHARDS).map(|i| self.guard(i)).collect()
    }

    /// Call `f` with each shard in turn, each locked only while `f` runs on it.
    pub(super) fn each(&self, mut f: impl FnMut(&mut State)) {
        for i in 0..SHARDS {
            f(&mut self.guard(i));
        }
    }

    /// How many runs are active (those being inserted or removed under a held lock included
    /// once it is released).
    pub(super) fn len(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

/// One shard, locked. Dereferences to its [`State`].
pub(super) struct RunsGuard<'a> {
    guard: MutexGuard<'a, State>,
    /// The shard's size when locked.
    before: usize,
    /// Runs admitted ahead of their insertion ([`RunsGuard::admit`]), already counted.
    admitted: usize,
    count: &'a AtomicUsize,
}

impl RunsGuard<'_> {
    /// Count one run about to be inserted into this shard, if fewer than `max` are active;
    /// `false` (nothing counted) at the bound. Counted at once, so a begin in another shard
    /// sees it; if the run is not inserted after all, the drop takes the count back.
    pub(super) fn admit(&mut self, max: usize) -> bool {
        let pending =
            self.guard.runs.len() as isize - self.before as isize - self.admitted as isize;
        let mut now = self.count.load(Ordering::SeqCst);
        loop {
            let active = (now as isize + pending).max(0) as usize;
            if active >= max {
                return false;
            }
            match self
                .count
                .compare_exchange_weak(now, now + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    self.admitted += 1;
                    return true;
                }
                Err(actual) => now = actual,
            }
        }
    }
}

impl Deref for RunsGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl DerefMut for RunsGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.guard
    }
}

impl Drop for RunsGuard<'_> {
    fn drop(&mut self) {
        let change = self.guard.runs.len() as isize - self.before as isize - self.admitted as isize;
        if change > 0 {
            self.count.fetch_add(change as usize, Ordering::SeqCst);
        } else if change < 0 {
            self.count
                .fetch_sub(change.unsigned_abs(), Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::streams::run::Run;

    fn insert(g: &mut RunsGuard<'_>, id: &str) {
        g.runs.insert(id.to_owned(), Run::new(id, 0, 0));
    }

    #[test]
    fn the_count_follows_inserts_removes_and_admissions_in_every_shard() {
        let runs = Runs::new();
        for i in 0..200 {
            let id = format!("run-{i}");
            let mut g = runs.lock(&id);
            assert!(g.admit(1_000));
            insert(&mut g, &id);
        }
        assert_eq!(runs.len(), 200);
        // Admitted but not inserted: the count is taken back.
        {
            let mut g = runs.lock("never");
            assert!(g.admit(1_000));
            assert_eq!(runs.len(), 201);
        }
        assert_eq!(runs.len(), 200);
        // Inserted without an admission (replay, a loaded copy): counted at the drop.
        insert(&mut runs.lock("plain"), "plain");
        assert_eq!(runs.len(), 201);
        for i in (0..200).step_by(2) {
            let id = format!("run-{i}");
            assert!(runs.lock(&id).runs.remove(&id).is_some());
        }
        assert_eq!(runs.len(), 101);
        let mut seen = 0;
        runs.each(|st| seen += st.runs.len());
        assert_eq!(seen, 101);
        let all = runs.lock_all();
        assert_eq!(all.iter().map(|g| g.runs.len()).sum::<usize>(), 101);
        assert!(all.iter().filter(|g| !g.runs.is_empty()).count() > 1);
    }

    #[test]
    fn concurrent_admissions_never_pass_the_bound() {
        let runs = std::sync::Arc::new(Runs::new());
        let max = 100;
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let runs = std::sync::Arc::clone(&runs);
                std::thread::spawn(move || {
                    let mut admitted = 0;
                    for i in 0..50 {
                        let id = format!("t{t}-{i}");
                        let mut g = runs.lock(&id);
                        if g.admit(max) {
                            insert(&mut g, &id);
                            admitted += 1;
                        }
                    }
                    admitted
                })
            })
            .collect();
        let admitted: usize = threads.into_iter().map(|h| h.join().unwrap_or(0)).sum();
        assert_eq!(admitted, max, "400 begins against a bound of {max}");
        assert_eq!(runs.len(), max);
    }
}
