//! The committer: takes every queued append, writes the batch with one `pwrite`,
//! `fdatasync`s it, settles each appender's promise, rolls over to the next segment, and
//! poisons the journal on a failed write or sync. It runs on the committer thread, or on a
//! thread that assists it ([`Journal::assist`]: a runtime's worker about to park commits what
//! it queued itself, with no hand-off); one at a time, under the committer lock.

use super::*;

pub(super) struct Committer {
    /// The segment being appended to; `None` until the first batch creates it.
    pub(super) file: Option<File>,
    pub(super) segment: u64,
    pub(super) offset: u64,
    /// The next segment, being prepared on a helper thread.
    pub(super) next: Option<JoinHandle<Result<(), IoError>>>,
    pub(super) last_sync: Instant,
    pub(super) unsynced: bool,
    /// How many appends the last batch carried: with many appenders at once, the next batch
    /// is gathered up to this many (group commit, [`GATHER_WINDOW`]).
    pub(super) last_batch: usize,
    /// What every batch needs, kept for the next one.
    pub(super) reuse: Reuse,
}

/// A batch's buffers, kept from one batch to the next: the bytes written, the acknowledgements
/// owed, and the vector the batch was taken in. Made and freed per batch (tens of KiB with many
/// streams), they made the committing thread's heap shrink after every batch and grow again,
/// page faults and all, during the next turn (`clear_page_erms` under `malloc` and `memmove`
/// in the append lane's profile: docs/benchmarks.md, "Issue 15, ninth session"). None holds a
/// secret: records are sealed before they are queued. One grown past [`REUSE_MAX_BYTES`] by
/// an unusually large batch is not kept.
#[derive(Default)]
pub(super) struct Reuse {
    buf: Vec<u8>,
    acks: Vec<(Ack, Position)>,
    batch: Vec<Pending>,
}

/// See [`Reuse`].
const REUSE_MAX_BYTES: usize = 1 << 20;

impl Reuse {
    /// Keep `v` (emptied) if it is not too large and larger than what is kept.
    fn keep<T>(kept: &mut Vec<T>, mut v: Vec<T>) {
        v.clear();
        if v.capacity() * std::mem::size_of::<T>().max(1) <= REUSE_MAX_BYTES
            && v.capacity() > kept.capacity()
        {
            *kept = v;
        }
    }
}

/// Group commit: when the last batch carried at least [`GATHER_MIN`] appends (several
/// appenders at once) and fewer are queued now, the committer waits up to this long for as many
/// as it carried before it writes, instead of syncing whoever happened to arrive first.
/// Measured at 256 streams (docs/benchmarks.md, "Group commit"): twice the records per fsync
/// (60-70 -> 128-138), a lower p99 (16-19 ms -> 13 ms) and a little less CPU per append; a
/// lone appender (or two or three) never waits. At 16 streams (~10 per batch -> 15) the A/B
/// was 3 % lower, within this VM's noise; a higher threshold stopped the gathering at 256 too
/// (a short batch ends it), so it stays low.
pub(super) const GATHER_WINDOW: Duration = Duration::from_micros(200);
/// See [`GATHER_WINDOW`].
pub(super) const GATHER_MIN: usize = 4;

thread_local! {
    /// Whether this thread is committing a batch now (the committer thread, or a thread
    /// assisting it): a journal dropped from an acknowledgement's callback must not wait for
    /// the committer thread, which may be waiting for this one.
    pub(super) static COMMITTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The committer thread: waits for appends and commits them, batch after batch. When threads
/// assist ([`Journal::assist`]), it leaves a batch to them for [`ASSIST_GRACE`] and commits it
/// only if none did: the fallback for a runtime whose workers never run out of work.
pub(super) fn run(shared: Arc<Shared>) {
    'work: loop {
        // Read without the queue lock (the committer lock is always taken first): only this
        // thread changes them when batches are synced on a timer (no assistance then).
        let (unsynced, last_sync) = {
            let c = shared.committer();
            (c.unsynced, c.last_sync)
        };
        let mut q = shared.queue();
        loop {
            if !q.pending.is_empty() {
                if shared.assisted.load(Ordering::SeqCst) && !q.closing {
                    // A worker about to park takes it (no hand-off): wait, and take it only
                    // if nothing was taken for the whole grace.
                    let seen = q.taken;
                    q = shared
                        .wake
                        .wait_timeout_while(q, ASSIST_GRACE, |q| q.taken == seen && !q.closing)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                    if q.taken != seen || q.pending.is_empty() {
                        continue;
                    }
                }
                break;
            }
            if q.closing {
                drop(q);
                let mut c = shared.committer();
                if let Err(e) = c.sync(&shared, true) {
                    tracing::error!(error = %e, "stream journal: the fsync at close failed");
                }
                return;
            }
            q.idle = true;
            q = match shared.durability {
                // Batch: sync what was written once the interval has passed.
                Durability::Batch(every) if unsynced => {
                    let left = every.saturating_sub(last_sync.elapsed());
                    let (q, waited) = shared
                        .wake
                        .wait_timeout(q, left)
                        .unwrap_or_else(PoisonError::into_inner);
                    if q.pending.is_empty() && waited.timed_out() {
                        // The fsync without the queue lock: appends keep queueing.
                        drop(q);
                        let mut c = shared.committer();
                        if let Err(e) = c.sync(&shared, true) {
                            shared.queue().poisoned = Some(e);
                        }
                        continue 'work;
                    }
                    q
                }
                _ => shared.wake.wait(q).unwrap_or_else(PoisonError::into_inner),
            };
            q.idle = false;
        }
        drop(q);
        let mut c = shared.committer();
        let mut q = shared.queue();
        if q.pending.is_empty() {
            // Taken by an assisting thread meanwhile (or the Batch timer's turn above).
            continue;
        }
        // Group commit: with many appenders, let the rest of them join first.
        let want = c.last_batch;
        if want >= GATHER_MIN && q.pending.len() < want && !q.closing {
            q.want = want;
            q = shared
                .wake
                .wait_timeout_while(q, GATHER_WINDOW, |q| q.pending.len() < want && !q.closing)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            q.want = 0;
        }
        let (roll, batch) = take_batch(&mut q, &mut c);
        drop(q);
        c.process(&shared, roll, batch);
    }
}

/// Commit what is queued on this thread, if no other thread is committing: batch after batch
/// until the queue is empty or `yield_to_others` says another thread will take the rest (see
/// [`Journal::assist`]).
pub(super) fn assist(shared: &Shared, yield_to_others: &dyn Fn() -> bool) {
    loop {
        let mut c = match shared.committer.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::WouldBlock) => return,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        loop {
            let (roll, batch) = {
                let mut q = shared.queue();
                if q.pending.is_empty() || q.closing {
                    break;
                }
                take_batch(&mut q, &mut c)
            };
            c.process(shared, roll, batch);
            if yield_to_others() {
                return;
            }
        }
        drop(c);
        // An append queued by a thread whose own attempt found the lock held (by this one)
        // after the last look above would wait for the committer thread's grace: look again
        // now that the lock is free.
        let q = shared.queue();
        if q.pending.is_empty() || q.closing {
            return;
        }
    }
}

/// Take the next batch: what fits [`MAX_BATCH_BYTES`] (at least one record); the rest waits.
fn take_batch(q: &mut Queue, c: &mut Committer) -> (bool, Vec<Pending>) {
    let mut bytes = 0;
    let take = q
        .pending
        .iter()
        .take_while(|p| {
            bytes += p.payload.len() + FRAME_HEADER;
            bytes <= MAX_BATCH_BYTES
        })
        .count()
        .max(1);
    c.last_batch = take;
    q.taken += 1;
    let roll = std::mem::take(&mut q.roll);
    let batch = if take == q.pending.len() {
        // All of it (the usual case): the queue's vector is the batch, the kept one the queue's.
        std::mem::replace(&mut q.pending, std::mem::take(&mut c.reuse.batch))
    } else {
        let mut batch = std::mem::take(&mut c.reuse.batch);
        batch.extend(q.pending.drain(..take));
        batch
    };
    (roll, batch)
}

impl Committer {
    /// Write, sync and acknowledge one batch taken from the queue (starting a new segment
    /// first if asked); a failure poisons the journal and fails everything queued.
    fn process(&mut self, shared: &Shared, roll: bool, batch: Vec<Pending>) {
        COMMITTING.with(|f| f.set(true));
        self.process_batch(shared, roll, batch);
        COMMITTING.with(|f| f.set(false));
    }

    fn process_batch(&mut self, shared: &Shared, roll: bool, batch: Vec<Pending>) {
        if roll {
            if let Err(why) = self.sync(shared, true).and_then(|()| self.roll(shared)) {
                let mut q = shared.queue();
                tracing::error!(error = %why, "stream journal could not start a segment; refusing appends until restart");
                q.poisoned = Some(why.clone());
                // Everything queued fails too: nothing after a failure is vouched for.
                let mut failed: Vec<Pending> = q.pending.drain(..).collect();
                drop(q);
                failed.extend(batch);
                for p in failed {
                    let _ = p.ack.send(Err(JournalError::Poisoned(why.clone())));
                }
                return;
            }
        }
        // A batch taken after a failure (the queue is poisoned) is refused, not written.
        let poisoned = shared.queue().poisoned.clone();
        if let Some(why) = poisoned {
            for p in batch {
                let _ = p.ack.send(Err(JournalError::Poisoned(why.clone())));
            }
            return;
        }
        if let Err(why) = self.commit(shared, batch) {
            let mut q = shared.queue();
            tracing::error!(error = %why, "stream journal write failed; refusing appends until restart");
            q.poisoned = Some(why.clone());
            let failed: Vec<Pending> = q.pending.drain(..).collect();
            drop(q);
            // Outside the lock: a callback may append again (and be refused).
            for p in failed {
                let _ = p.ack.send(Err(JournalError::Poisoned(why.clone())));
            }
        }
    }

    /// Write one batch (rolling over to the next segment where needed), sync it, acknowledge.
    pub(super) fn commit(
        &mut self,
        shared: &Shared,
        mut batch: Vec<Pending>,
    ) -> Result<(), Failure> {
        let mut acks = std::mem::take(&mut self.reuse.acks);
        let mut buf = std::mem::take(&mut self.reuse.buf);
        let mut start = self.offset;
        let mut result = Ok(());
        for p in batch.drain(..) {
            let need = (FRAME_HEADER + p.payload.len()) as u64;
            if result.is_ok() && start + buf.len() as u64 + need > SEGMENT_BYTES {
                result = self
                    .write(shared, &buf, start)
                    .and_then(|()| self.sync(shared, true))
                    .and_then(|()| self.roll(shared));
                buf.clear();
                start = self.offset;
            }
            if let Err(e) = &result {
                let _ = p.ack.send(Err(JournalError::Poisoned(e.clone())));
                continue;
            }
            let pos = Position {
                segment: self.segment,
                offset: start + buf.len() as u64,
            };
            buf.extend_from_slice(&(p.payload.len() as u32).to_le_bytes());
            buf.extend_from_slice(&frame_crc(self.segment, &p.payload).to_le_bytes());
            buf.extend_from_slice(&p.payload);
            acks.push((p.ack, pos));
        }
        let result = result
            .and_then(|()| self.write(shared, &buf, start))
            .and_then(|()| self.sync(shared, false));
        // Counted before anyone is answered: an appender that reads the counters after its
        // answer sees its own append in them.
        let stats = &shared.stats;
        stats
            .appends
            .fetch_add(acks.len() as u64, Ordering::Relaxed);
        stats.batches.fetch_add(1, Ordering::Relaxed);
        for (ack, pos) in acks.drain(..) {
            let _ = ack.send(match &result {
                Ok(()) => Ok(pos),
                Err(e) => Err(JournalError::Poisoned(e.clone())),
            });
        }
        Reuse::keep(&mut self.reuse.acks, acks);
        Reuse::keep(&mut self.reuse.buf, buf);
        Reuse::keep(&mut self.reuse.batch, batch);
        // Past half of this segment, start preparing the next one.
        if self.next.is_none() && self.offset > SEGMENT_BYTES / 2 {
            let (dir, faults, n) = (shared.dir.clone(), shared.faults.clone(), self.segment + 1);
            self.next = Some(std::thread::spawn(move || {
                prepare_segment(&dir, n, &faults, true)
            }));
        }
        result
    }

    /// The path of segment `n`.
    pub(super) fn path(shared: &Shared, n: u64) -> PathBuf {
        shared.dir.path().join(segment_name(n))
    }

    /// Open segment `n` for writing.
    pub(super) fn open_for_writing(shared: &Shared, n: u64) -> Result<File, Failure> {
        open_segment(&shared.dir, n)
            .map_err(|e| Arc::new(IoError::new(Op::Open, Self::path(shared, n), e)))
    }

    pub(super) fn write(&mut self, shared: &Shared, buf: &[u8], at: u64) -> Result<(), Failure> {
        if buf.is_empty() {
            return Ok(());
        }
        if self.file.is_none() {
            // The first batch of a journal that had no segment.
            let n = self.segment;
            prepare_segment(&shared.dir, n, &shared.faults, false).map_err(Arc::new)?;
            self.file = Some(Self::open_for_writing(shared, n)?);
        }
        shared
            .faults
            .check(Op::Append)
            .and_then(|()| match &self.file {
                Some(f) => f.write_all_at(buf, at),
                None => Err(io::Error::other("no segment open")),
            })
            .map_err(|e| {
                Arc::new(IoError::new(
                    Op::Append,
                    Self::path(shared, self.segment),
                    e,
                ))
            })?;
        self.offset = at + buf.len() as u64;
        self.unsynced = true;
        Ok(())
    }

    /// Sync per the policy (`force`: whatever the policy says, unless `None`).
    pub(super) fn sync(&mut self, shared: &Shared, force: bool) -> Result<(), Failure> {
        let due = match shared.durability {
            Durability::Always => true,
            Durability::Batch(every) => force || self.last_sync.elapsed() >= every,
            Durability::None => false,
        };
        if !due || !self.unsynced {
            return Ok(());
        }
        shared
            .faults
            .check(Op::FsyncFile)
            .and_then(|()| self.file.as_ref().map_or(Ok(()), File::sync_data))
            .map_err(|e| {
                Arc::new(IoError::new(
                    Op::FsyncFile,
                    Self::path(shared, self.segment),
                    e,
                ))
            })?;
        shared.stats.syncs.fetch_add(1, Ordering::Relaxed);
        self.last_sync = Instant::now();
        self.unsynced = false;
        Ok(())
    }

    /// Switch to the next segment (prepared ahead, or now).
    pub(super) fn roll(&mut self, shared: &Shared) -> Result<(), Failure> {
        let n = self.segment + 1;
        let prepared = match self.next.take() {
            Some(h) => h.join().unwrap_or_else(|_| {
                Err(IoError::new(
                    Op::CreateTemp,
                    Self::path(shared, n),
                    io::Error::other("segment preparation panicked"),
                ))
            }),
            None => prepare_segment(&shared.dir, n, &shared.faults, false),
        };
        prepared.map_err(Arc::new)?;
        self.file = Some(Self::open_for_writing(shared, n)?);
        self.segment = n;
        self.offset = HEADER_BYTES;
        shared.active.store(n, Ordering::SeqCst);
        Ok(())
    }
}
