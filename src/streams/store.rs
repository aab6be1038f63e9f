//! The storage boundary of streams, and its file implementation.
//!
//! [`StreamStore`] is everything the service (`service.rs`) asks of wherever runs are kept:
//! queue a journal record and learn when it is durable, release what no active run needs, and
//! per run the state file (the commit point) and the checkpoint. It speaks typed records
//! ([`Record`], [`EventsOut`]) and JSON values; sealing, framing, files and fsyncs are the
//! implementation's. [`FileStore`] keeps them in the data directory: the stream journal
//! (`durable::journal`) under `streams/`, and `runs/<run_id>/{state,checkpoint}` written
//! atomically under the poison rule. Both directories, and each run's, are resolved beneath
//! the data directory without following a symlink (`durable::beneath`): a link planted there
//! refuses the request that meets it (`forbidden`) and nothing else. The PostgreSQL backend
//! implements the same trait.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::Value;
use zeroize::Zeroizing;

use super::error::StreamError;
use super::feed::Feed;
use super::record::{EventsOut, Record};
use super::{EventJson, Status};
use crate::durable::journal::{
    Durability, Journal, JournalError, Nudge, Position, Promise, ReplayReport, Stats,
};
use crate::durable::{self, Dir, Faults, IoError, Op, Owned, Poison};
use crate::limits::MAX_PAYLOAD;

/// A record to queue: a typed record, or the append path's borrowed events.
pub enum Out<'a> {
    /// Any record.
    Record(&'a Record),
    /// An `ev` record borrowing the request's events.
    Events(&'a EventsOut<'a>),
}

impl serde::Serialize for Out<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Out::Record(r) => r.serialize(s),
            Out::Events(e) => e.serialize(s),
        }
    }
}

/// A record made ready by [`StreamStore::prepare`] (sealed).
pub struct Prepared(pub(super) Vec<u8>);

/// A record read back at open, with the mark of where it is kept.
pub struct Replayed {
    /// The record.
    pub record: Record,
    /// Its place (a journal segment): a run remembers the oldest mark holding its records.
    pub mark: u64,
}

/// What a run-bound record changes, beside the record itself: the run's head after it, and the
/// events published since the run's previous record (positions `first_pos..`). The file store
/// needs none of it (the journal replays the record); a shared store writes it in the same
/// transaction, fenced by `from_version`.
pub struct RunTail<'a> {
    /// The run.
    pub run: &'a str,
    /// The run's version this record follows (0: the run's first record). The record makes it
    /// `from_version + 1`; a store shared by several daemons refuses it (`Fenced`) if the run's
    /// version there is another.
    pub from_version: u64,
    /// The holder's epoch.
    pub epoch: u64,
    /// The holder's stream id.
    pub sid: &'a str,
    /// The run's status after the record.
    pub status: Status,
    /// The next seq after the record.
    pub next_seq: u64,
    /// The run's thread.
    pub thread: Option<&'a str>,
    /// The run's model.
    pub model: Option<&'a str>,
    /// When the run was created (Unix ms).
    pub created_ms: u64,
    /// Its last activity (Unix ms).
    pub updated_ms: u64,
    /// The position (in publication order) of `events[0]`.
    pub first_pos: u64,
    /// Which in-memory copy of the run queued the record (a number unique in the process): a
    /// shared store fails the records queued behind a failed one of the same copy with the
    /// same error, and serves a copy loaded afresh.
    pub copy: u64,
    /// The events published with this record, with their seqs.
    pub events: &'a [(u64, EventJson)],
}

/// A run as a shared store holds it.
pub enum Loaded {
    /// No such run.
    Unknown,
    /// It ended (its state is the commit point's).
    Ended,
    /// Active: its version and its records in order, to replay.
    Active {
        /// The run's version (records committed).
        version: u64,
        /// The records.
        records: Vec<Record>,
    },
}

/// Who holds a run in a shared store.
pub struct Head {
    /// The holder's stream id.
    pub sid: String,
    /// The run's version.
    pub version: u64,
    /// Whether it ended.
    pub ended: bool,
    /// The host whose daemon wrote it last.
    pub host: String,
}

/// A store several daemons share (PostgreSQL): memory is each daemon's cache of the runs it
/// serves, the store is the truth. Runs are loaded from it on demand, subscribers follow it,
/// and every write is fenced by the run's version. The blocking methods are called from
/// blocking threads only.
pub trait SharedStore: Send + Sync {
    /// The run's records (blocking).
    fn load(&self, run_id: &str) -> Result<Loaded, StreamError>;
    /// The run's holder and version (blocking).
    fn head(&self, run_id: &str) -> Result<Option<Head>, StreamError>;
    /// Every event of the run with seq > `after_seq`, then new ones as they commit on any
    /// host, then `finish`; an ended run gives only its `finish` (blocking: the run is looked
    /// up first, so an unknown one is an error).
    fn follow(&self, run_id: &str, after_seq: u64) -> Result<Feed, StreamError>;
    /// The active runs' head fields (blocking).
    fn list(&self) -> Result<Vec<Value>, StreamError>;
    /// Active runs with no activity since `before_ms` (blocking).
    fn idle(&self, before_ms: u64) -> Result<Vec<String>, StreamError>;
    /// Active runs interrupted with no activity since `before_ms` (blocking): the candidates
    /// for an orphaned run (a `lost` record is an interruption).
    fn interrupted(&self, before_ms: u64) -> Result<Vec<String>, StreamError>;
    /// Active runs this host wrote last (blocking): after a restart, the runs whose producers
    /// spoke through this daemon, which have the orphan timeout to come back.
    fn written_here(&self) -> Result<Vec<String>, StreamError>;
    /// This daemon's host name, as it writes it beside the runs.
    fn host(&self) -> String;
    /// Every event the run published, in order (blocking).
    fn events(&self, run_id: &str) -> Result<Vec<(u64, EventJson)>, StreamError>;
    /// Delete what ended runs no longer need: their records, and their events once they ended
    /// before `events_before_ms` (no follower is still reading them). Returns rows deleted.
    fn sweep(&self, events_before_ms: u64) -> Result<u64, StreamError>;
}

/// Where stream runs are kept. Records of one run are durable in the order they were queued;
/// a record's promise settles once it (and every record queued before it) is durable.
pub trait StreamStore: Send + Sync {
    /// Make a record ready to queue (sealed): the step that can fail, taken before the run
    /// changes, so a refusal changes nothing.
    fn prepare(&self, rec: Out<'_>) -> Result<Prepared, StreamError>;
    /// Queue a prepared record; the promise settles when it is durable (or failed).
    fn queue(&self, rec: Prepared) -> Arc<Promise>;
    /// Queue a prepared record of a run, with what it changes ([`RunTail`]).
    fn queue_run(&self, rec: Prepared, tail: RunTail<'_>) -> Arc<Promise> {
        let _ = tail;
        self.queue(rec)
    }
    /// The commit point: the run's state written and the run ended, atomically, after every
    /// record queued before (`tail` carries the last events, `finish` included).
    fn end_run(&self, state: &Value, tail: RunTail<'_>) -> Result<(), StreamError>;
    /// A store several daemons share, if this is one.
    fn shared(&self) -> Option<&dyn SharedStore> {
        None
    }
    /// [`StreamStore::prepare`] and [`StreamStore::queue`].
    fn append(&self, rec: Out<'_>) -> Result<Arc<Promise>, StreamError> {
        Ok(self.queue(self.prepare(rec)?))
    }
    /// The mark records queued now will have.
    fn active_mark(&self) -> u64;
    /// Forget every record kept before `mark` (no active run has one there).
    fn release_before(&self, mark: u64);
    /// Start a new mark now, so everything before it can be released whole (key rotation).
    fn start_new_mark(&self);
    /// Let the threads that queue records commit them ([`Journal::set_assisted`]).
    fn set_assisted(&self, on: bool) {
        let _ = on;
    }
    /// Commit what is queued on this thread if nothing else is committing
    /// ([`Journal::assist`]).
    fn assist(&self, yield_to_others: &dyn Fn() -> bool) {
        let _ = yield_to_others;
    }
    /// Tell `nudge` when a record is queued for an assisting thread ([`Journal::set_nudge`]).
    fn set_nudge(&self, nudge: Option<Nudge>) {
        let _ = nudge;
    }
    /// Whether the run has a state file: it ended. Its existence decides, not its content (an
    /// unreadable state must not bring a committed run back).
    fn has_ended(&self, run_id: &str) -> bool;
    /// Refuse a run whose files this store could not write: something other than a file
    /// where its state belongs (a FIFO, a directory: its commit would be refused). Asked at
    /// `stream.begin`, so the producer hears it before it streams, not at the commit.
    fn check_run(&self, run_id: &str) -> Result<(), StreamError> {
        let _ = run_id;
        Ok(())
    }
    /// The run's state, if it has one: an error if it has one that does not read (never
    /// taken for "no such run").
    fn read_state(&self, run_id: &str) -> Result<Option<Value>, StreamError>;
    /// Write the run's checkpoint (replacing it).
    fn put_checkpoint(&self, run_id: &str, snapshot: &Value) -> Result<(), StreamError>;
    /// The run's checkpoint, if it has one.
    fn get_checkpoint(&self, run_id: &str) -> Result<Option<Value>, StreamError>;
    /// Delete the run's checkpoint; whether there was one.
    fn delete_checkpoint(&self, run_id: &str) -> Result<bool, StreamError>;
    /// The records kept from `mark` on, in order (blocking): what a run's old events are
    /// derived from when memory no longer holds them. Only a store that keeps records in
    /// marks (the file journal) has any; a shared store serves events itself.
    fn records_from(&self, mark: u64) -> Result<Vec<Replayed>, StreamError> {
        let _ = mark;
        Ok(Vec::new())
    }
    /// The runs that ended (they have a state), for `holdfast migrate` (blocking).
    fn ended_ids(&self) -> Result<Vec<String>, StreamError>;
    /// The runs with a checkpoint, for `holdfast migrate` (blocking).
    fn checkpoint_ids(&self) -> Result<Vec<String>, StreamError>;
    /// Re-seal every state and checkpoint under the current key (key rotation); how many.
    fn reseal_files(&self) -> Result<usize, StreamError>;
    /// The journal's counters.
    fn stats(&self) -> &Stats;
    /// What open found.
    fn replay_report(&self) -> &ReplayReport;
    /// Replay is done and `active` are the runs still streaming: tidy up after a crash (the
    /// file store removes the temp files of `state` and `checkpoint` writes a kill cut off).
    fn after_replay(&self, active: &[&str]) {
        let _ = active;
    }
}

/// [`StreamStore`] on the data directory: the stream journal and the runs' files.
pub struct FileStore {
    journal: Journal,
    /// `runs/`, each run's directory resolved beneath the data directory on every use.
    runs: Owned,
    sealer: Arc<dyn Sealer>,
    faults: Faults,
    /// After a failed fsync of a state or checkpoint file, such writes are refused until the
    /// daemon restarts (the journal poisons itself the same way).
    poison: Poison,
    replay: ReplayReport,
    /// Held (shared) by every `state` / `checkpoint` write from its temp file to its rename,
    /// and (exclusive) by the background sweep while it clears one run directory: the sweep
    /// never removes a live write's temp file.
    writes: Arc<std::sync::RwLock<()>>,
    /// The background sweep of run directories ([`FileStore::after_replay`]), stopped and
    /// joined on drop (before the journal's lock is released).
    sweep: std::sync::Mutex<Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>>,
}

impl Drop for FileStore {
    fn drop(&mut self) {
        let sweep = self
            .sweep
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some((stop, handle)) = sweep {
            stop.store(true, Ordering::SeqCst);
            let _ = handle.join();
        }
    }
}

fn storage(e: durable::IoError) -> StreamError {
    StreamError::from(e)
}

impl FileStore {
    /// Open the journal under `streams_dir` and the runs under `runs_dir`; return the records
    /// to replay, in order. Records that do not decrypt with the current keys or do not read
    /// are skipped and counted in the log (never their content).
    pub fn open(
        streams_dir: &Path,
        runs_dir: &Path,
        sealer: Arc<dyn Sealer>,
        durability: Durability,
        faults: Faults,
    ) -> Result<(FileStore, Vec<Replayed>), StreamError> {
        let (runs, _) = Owned::make(runs_dir, &faults).map_err(storage)?;
        let (_, streams) = Owned::make(streams_dir, &faults).map_err(storage)?;
        let (journal, frames, replay) = Journal::open_in(streams, durability, faults.clone())?;
        let (mut undecryptable, mut unreadable) = (0usize, 0usize);
        let mut records = Vec::with_capacity(frames.len());
        for f in frames {
            let Ok(plain) = sealer.open(&f.payload) else {
                undecryptable += 1;
                continue;
            };
            match Record::decode(&plain) {
                Ok(record) => records.push(Replayed {
                    record,
                    mark: f.pos.segment,
                }),
                Err(e) => {
                    // Only where and what kind: serde's message may quote the record.
                    unreadable += 1;
                    tracing::error!(segment = f.pos.segment, offset = f.pos.offset,
                        kind = ?e.classify(), column = e.column(),
                        "stream journal: a record that does not read was skipped");
                }
            }
        }
        if unreadable > 0 {
            tracing::error!(
                unreadable,
                "stream journal records that do not read were skipped"
            );
        }
        if undecryptable > 0 {
            tracing::error!(
                undecryptable,
                "stream journal records that do not decrypt with the current keys were skipped"
            );
        }
        let store = FileStore {
            journal,
            runs,
            sealer,
            faults,
            poison: Poison::default(),
            replay,
            writes: Arc::default(),
            sweep: std::sync::Mutex::new(None),
        };
        Ok((store, records))
    }

    /// A record's sealed bytes. Its plaintext JSON is written into one of the thread's scratch
    /// buffers ([`crate::crypto::with_scratch`]): no allocation per record, and no copy of the
    /// plaintext left behind by a growing buffer.
    fn seal(&self, rec: &impl serde::Serialize) -> Result<Vec<u8>, StreamError> {
        crate::crypto::with_scratch(|plain| {
            // Serializing the records' types into memory cannot fail.
            let _ = serde_json::to_writer(&mut *plain, rec);
            self.sealer
                .seal(plain.as_slice())
                .map_err(StreamError::Seal)
        })
    }

    /// The directory of `run_id` if it exists (a link or a non-directory in the way is
    /// refused: `forbidden`).
    fn run_dir(&self, run_id: &str) -> Result<Option<Dir>, StreamError> {
        self.runs.open(&[run_id]).map_err(storage)
    }

    /// The plaintext of sealed file `name` of `run_id`, if it exists; `label` names it in
    /// errors (a path in the log, a plain word in an answer to a client).
    fn open_sealed(
        &self,
        run_id: &str,
        name: &str,
        label: &dyn std::fmt::Display,
    ) -> Result<Option<Zeroizing<Vec<u8>>>, StreamError> {
        let Some(dir) = self.run_dir(run_id)? else {
            return Ok(None);
        };
        self.open_sealed_in(&dir, name, label)
    }

    fn open_sealed_in(
        &self,
        dir: &Dir,
        name: &str,
        label: &dyn std::fmt::Display,
    ) -> Result<Option<Zeroizing<Vec<u8>>>, StreamError> {
        let bytes = match dir.read_capped(name, MAX_PAYLOAD as u64) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(None),
            Err(e) if e.is_unsafe_path() => return Err(storage(e)),
            Err(e) => {
                return Err(StreamError::Unreadable {
                    what: label.to_string(),
                    source: e.source,
                })
            }
        };
        self.sealer
            .open(&bytes)
            .map(Some)
            .map_err(|source| StreamError::Undecryptable {
                what: label.to_string(),
                source,
            })
    }

    /// Replace `runs/<run_id>/<name>` with `value`, sealed, under the poison rule. A refused
    /// path (a link at `runs/`, at the run's directory or at the file) fails this request
    /// only; a failed fsync — of the file, of the run's directory, or of `runs/` after making
    /// the run's directory — poisons.
    fn write_sealed(&self, run_id: &str, name: &str, value: &Value) -> Result<(), StreamError> {
        self.poison
            .check(&self.runs.path().join(run_id))
            .map_err(storage)?;
        let dir = self
            .poison
            .watch(self.runs.create(&[run_id], &self.faults))
            .map_err(storage)?;
        let sealed = self.seal(value)?;
        self.write_file(&dir, name, &sealed)
    }

    /// The run ids whose directory holds `name`, sorted.
    fn ids_with(&self, name: &str) -> Result<Vec<String>, StreamError> {
        let Some(runs) = self.runs.open(&[]).map_err(storage)? else {
            return Ok(Vec::new());
        };
        let entries = runs
            .entries()
            .map_err(|e| IoError::new(Op::Read, runs.path(), e))?;
        let mut ids: Vec<String> = entries
            .into_iter()
            .filter(|e| e.kind == durable::beneath::EntryKind::Dir)
            .filter(|e| {
                runs.open_dir(&[&e.name])
                    .ok()
                    .flatten()
                    .is_some_and(|d| has_regular(&d, name))
            })
            .map(|e| e.name)
            .collect();
        ids.sort();
        Ok(ids)
    }

    fn write_file(&self, dir: &Dir, name: &str, sealed: &[u8]) -> Result<(), StreamError> {
        let _writing = self
            .writes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.poison.check(dir.path()).map_err(storage)?;
        self.poison
            .watch(dir.atomic_write(name, sealed, &self.faults))
            .map_err(storage)?;
        Ok(())
    }
}

/// The files a [`FileStore`] writes in a run's directory (the run log's files beside them are
/// the run log's, under its own lock).
const RUN_FILES: [&str; 2] = ["state", "checkpoint"];

/// Whether `dir` holds a regular file `name` (a link is not followed).
fn has_regular(dir: &Dir, name: &str) -> bool {
    dir.stat(name)
        .is_ok_and(|m| m.is_some_and(|m| m.kind == durable::beneath::EntryKind::File))
}

/// Remove the temp files a writer killed in the middle of replacing `dir`'s `state` or
/// `checkpoint` left, with `writes` held exclusively (no write of ours is between its temp file
/// and its rename meanwhile). Only this store writes those names (it holds the journal's lock).
fn sweep_run_dir(
    dir: &Dir,
    writes: &std::sync::RwLock<()>,
    faults: &Faults,
) -> Result<usize, durable::IoError> {
    let _no_writes = writes
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    dir.sweep_temps_of(&RUN_FILES, faults)
}

impl StreamStore for FileStore {
    fn prepare(&self, rec: Out<'_>) -> Result<Prepared, StreamError> {
        self.seal(&rec).map(Prepared)
    }

    fn queue(&self, rec: Prepared) -> Arc<Promise> {
        self.journal.append_promise(rec.0)
    }

    fn active_mark(&self) -> u64 {
        self.journal.active_segment()
    }

    fn release_before(&self, mark: u64) {
        let _ = self
            .journal
            .release_before(mark.min(self.journal.active_segment()));
    }

    fn start_new_mark(&self) {
        self.journal.start_new_segment();
    }

    fn set_assisted(&self, on: bool) {
        self.journal.set_assisted(on);
    }

    fn assist(&self, yield_to_others: &dyn Fn() -> bool) {
        self.journal.assist(yield_to_others);
    }

    fn set_nudge(&self, nudge: Option<Nudge>) {
        self.journal.set_nudge(nudge);
    }

    /// A run whose directory is refused (a link) has no state this store can vouch for:
    /// not ended; its commit is refused with the path when it writes the state. Only a
    /// regular file is a state (this store writes no other kind): a directory, FIFO or link
    /// named `state` does not end an active run.
    fn has_ended(&self, run_id: &str) -> bool {
        self.run_dir(run_id)
            .ok()
            .flatten()
            .is_some_and(|d| has_regular(&d, "state"))
    }

    fn check_run(&self, run_id: &str) -> Result<(), StreamError> {
        let Some(dir) = self.run_dir(run_id)? else {
            return Ok(());
        };
        match dir.stat("state") {
            Ok(Some(m)) if m.kind != durable::beneath::EntryKind::File => Err(
                StreamError::UnsafePath(dir.refusal("state", m.kind, "a file")),
            ),
            _ => Ok(()),
        }
    }

    fn end_run(&self, state: &Value, tail: RunTail<'_>) -> Result<(), StreamError> {
        self.write_sealed(tail.run, "state", state)
    }

    fn read_state(&self, run_id: &str) -> Result<Option<Value>, StreamError> {
        let path = self.runs.path().join(run_id).join("state");
        let Some(plain) = self.open_sealed(run_id, "state", &path.display())? else {
            return Ok(None);
        };
        serde_json::from_slice(&plain)
            .map(Some)
            .map_err(StreamError::StateNotJson)
    }

    fn put_checkpoint(&self, run_id: &str, snapshot: &Value) -> Result<(), StreamError> {
        self.write_sealed(run_id, "checkpoint", snapshot)
    }

    fn get_checkpoint(&self, run_id: &str) -> Result<Option<Value>, StreamError> {
        let Some(plain) = self.open_sealed(run_id, "checkpoint", &"checkpoint")? else {
            return Ok(None);
        };
        serde_json::from_slice(&plain)
            .map(Some)
            .map_err(StreamError::CheckpointNotJson)
    }

    fn delete_checkpoint(&self, run_id: &str) -> Result<bool, StreamError> {
        let Some(dir) = self.run_dir(run_id)? else {
            return Ok(false);
        };
        self.poison.check(dir.path()).map_err(storage)?;
        self.poison
            .watch(dir.remove_file("checkpoint", &self.faults))
            .map_err(storage)
    }

    fn ended_ids(&self) -> Result<Vec<String>, StreamError> {
        self.ids_with("state")
    }

    fn records_from(&self, mark: u64) -> Result<Vec<Replayed>, StreamError> {
        let frames = self
            .journal
            .read_from(mark)
            .map_err(|e| StreamError::Unreadable {
                what: "the stream journal".into(),
                source: e,
            })?;
        Ok(frames
            .into_iter()
            .filter_map(|f| {
                let plain = self.sealer.open(&f.payload).ok()?;
                Record::decode(&plain).ok().map(|record| Replayed {
                    record,
                    mark: f.pos.segment,
                })
            })
            .collect())
    }

    fn checkpoint_ids(&self) -> Result<Vec<String>, StreamError> {
        self.ids_with("checkpoint")
    }

    fn reseal_files(&self) -> Result<usize, StreamError> {
        let mut files = 0;
        let Some(runs) = self.runs.open(&[]).map_err(storage)? else {
            return Ok(0);
        };
        let entries = runs
            .entries()
            .map_err(|e| IoError::new(Op::Read, runs.path(), e))?;
        for e in entries {
            if e.kind != durable::beneath::EntryKind::Dir {
                continue;
            }
            let Some(dir) = runs.open_dir(&[&e.name]).map_err(storage)? else {
                continue;
            };
            for name in RUN_FILES {
                let path = dir.path().join(name);
                let Some(plain) = self.open_sealed_in(&dir, name, &path.display())? else {
                    continue;
                };
                let sealed = self.sealer.seal(&plain).map_err(StreamError::Seal)?;
                self.write_file(&dir, name, &sealed)?;
                files += 1;
            }
        }
        Ok(files)
    }

    fn stats(&self) -> &Stats {
        self.journal.stats()
    }

    fn replay_report(&self) -> &ReplayReport {
        &self.replay
    }

    /// The active runs' directories at once (a commit or abort cut off by the kill left its
    /// temp there, and the run is still active), every other run directory (a `checkpoint.put`
    /// may name any run) on a background thread: a store with tens of thousands of run
    /// directories would otherwise read them all before it serves (0.24 s for 21,718 here).
    fn after_replay(&self, active: &[&str]) {
        let mut removed = 0;
        for run in active {
            let swept = match self.runs.open(&[run]) {
                Ok(Some(dir)) => sweep_run_dir(&dir, &self.writes, &self.faults),
                Ok(None) => Ok(0),
                Err(e) => Err(e),
            };
            match swept {
                Ok(n) => removed += n,
                Err(e) => tracing::warn!(error = %e, "could not sweep a run directory"),
            }
        }
        let (runs, writes, faults) = (
            self.runs.clone(),
            Arc::clone(&self.writes),
            self.faults.clone(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let spawned = std::thread::Builder::new()
            .name("holdfast-run-sweep".into())
            .spawn(move || {
                let Some(dir) = runs.open(&[]).ok().flatten() else {
                    return;
                };
                let Ok(entries) = dir.entries() else {
                    return;
                };
                let mut removed = 0;
                for entry in entries {
                    if stopped.load(Ordering::SeqCst) {
                        return;
                    }
                    if entry.kind != durable::beneath::EntryKind::Dir {
                        continue;
                    }
                    let swept = match dir.open_dir(&[&entry.name]) {
                        Ok(Some(run)) => sweep_run_dir(&run, &writes, &faults),
                        Ok(None) => Ok(0),
                        Err(e) => Err(e),
                    };
                    match swept {
                        Ok(n) => removed += n,
                        Err(e) => tracing::warn!(error = %e, "could not sweep a run directory"),
                    }
                }
                if removed > 0 {
                    tracing::info!(
                        removed,
                        "removed temp files of checkpoint writes cut off by a crash"
                    );
                }
            });
        if let Ok(handle) = spawned {
            *self
                .sweep
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((stop, handle));
        }
        if removed > 0 {
            tracing::info!(
                removed,
                "removed temp files of run state writes cut off by a crash"
            );
        }
    }
}

/// Wait for a promise from a blocking thread (key rotation, tests).
pub fn wait(p: &Promise) -> Result<Position, JournalError> {
    let (tx, rx) = std::sync::mpsc::channel();
    p.then(move |res| {
        let _ = tx.send(res);
    });
    rx.recv().unwrap_or(Err(JournalError::Closed))
}

/// Seals and opens records (the default store's Fernet keys in the daemon).
pub trait Sealer: Send + Sync {
    /// Encrypt.
    fn seal(&self, plaintext: &[u8]) -> Result<Vec<u8>, SealError>;
    /// Decrypt (any key of the ring).
    fn open(&self, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, SealError>;
}

/// A [`Sealer`] holding its keys itself, not a store's: for tests and the fuzz targets' seeds,
/// whose streams are sealed with a key made for them.
pub struct KeyringSealer(pub crate::crypto::Keyring);

impl Sealer for KeyringSealer {
    fn seal(&self, plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
        Ok(self.0.encrypt(plaintext).into_bytes())
    }
    fn open(&self, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, SealError> {
        let token = std::str::from_utf8(sealed).map_err(|e| SealError::Open(e.into()))?;
        let (plain, _) = self
            .0
            .decrypt(token)
            .map_err(|e| SealError::Open(e.into()))?;
        Ok(Zeroizing::new(plain.expose().to_vec()))
    }
}

/// Why a [`Sealer`] failed: the cause is the key holder's own error (the store's, the
/// keyring's), kept as its source. Its message never holds the plaintext.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// No usable key (the store is sealed), or encryption failed.
    #[error("{0}")]
    Seal(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Not a token, or no key of the ring authenticates it.
    #[error("{0}")]
    Open(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Whether a data directory holds any streams data (journal segments or run files).
pub fn has_data(data_dir: &Path) -> bool {
    let (streams, runs) = dirs(data_dir);
    let nonempty = |d: &Path, pred: &dyn Fn(&str) -> bool| {
        fs::read_dir(d).is_ok_and(|rd| rd.flatten().any(|e| pred(&e.file_name().to_string_lossy())))
    };
    nonempty(&streams, &|n| n.starts_with("journal-")) || nonempty(&runs, &|_| true)
}

/// The file in a store's `metadata/` naming, one per line, the data directories whose streams
/// that store's key seals (each daemon adds its own when it opens its streams). Several data
/// dirs can share one default store (`[stores.default]` in one config): a prune in one proves
/// nothing about the others' streams.
pub const SEALED_DATA_DIRS: &str = "holdfast-stream-data-dirs";

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

fn sealed_data_dirs(store_base: &Path) -> Vec<PathBuf> {
    crate::durable::read_capped(&store_base.join("metadata").join(SEALED_DATA_DIRS), 1 << 20)
        .ok()
        .flatten()
        .map(|b| {
            String::from_utf8_lossy(&b)
                .lines()
                .filter(|l| !l.is_empty())
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Record that `data_dir`'s streams are sealed with the key of the store at `store_base`
/// (atomically; nothing if it is recorded already).
pub fn register_sealed_data_dir(
    store_base: &Path,
    data_dir: &Path,
) -> Result<(), crate::durable::IoError> {
    let mut dirs = sealed_data_dirs(store_base);
    let ours = canonical(data_dir);
    if dirs.iter().any(|d| canonical(d) == ours) {
        return Ok(());
    }
    dirs.push(ours);
    let mut text = String::new();
    for d in &dirs {
        text.push_str(&d.to_string_lossy());
        text.push('\n');
    }
    crate::durable::atomic_write(
        &store_base.join("metadata"),
        SEALED_DATA_DIRS,
        text.as_bytes(),
        &crate::durable::Faults::none(),
    )
    .map(|_| ())
}

/// The data directories other than `ours` whose streams the key of the store at `store_base`
/// seals and that hold streams data — or are no longer at their recorded path: moved (or
/// restored elsewhere), they still need the key as much (an independent tester moved one and
/// a prune from the other sealed it). A prune of that key must keep its archive for them.
pub fn other_sealed_data_dirs(store_base: &Path, ours: &Path) -> Vec<PathBuf> {
    let ours = canonical(ours);
    sealed_data_dirs(store_base)
        .into_iter()
        .filter(|d| canonical(d) != ours && (!d.exists() || has_data(d)))
        .collect()
}

/// Why a prune of the key of the store at `store_base`, asked from data dir `ours`, must keep
/// the archive: another data dir sharing that store may need it ([`other_sealed_data_dirs`]).
/// `None` when nothing holds it back. (The daemon and the offline CLI say the same.)
pub fn prune_held_back(store_base: &Path, ours: &Path) -> Option<String> {
    let others = other_sealed_data_dirs(store_base, ours);
    if others.is_empty() {
        return None;
    }
    Some(format!(
        "the archived keys are kept: this store's key also seals the streams of {} (a data dir sharing this default store), which may need them; only a daemon there can re-seal them. Prune when those streams are gone, or give each data dir a default store of its own (a data dir that no longer exists anywhere: remove its line from {})",
        others
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        sealed_data_dirs_file(store_base).display()
    ))
}

/// Where [`register_sealed_data_dir`] records the data dirs of the store at `store_base`.
pub fn sealed_data_dirs_file(store_base: &Path) -> PathBuf {
    store_base.join("metadata").join(SEALED_DATA_DIRS)
}

/// Where a data directory keeps streams: (`streams/`, `runs/`).
pub fn dirs(data_dir: &Path) -> (PathBuf, PathBuf) {
    (data_dir.join("streams"), data_dir.join("runs"))
}
