//! The streams of one daemon: runs in memory, each change journaled before it is answered and
//! published, subscribers fed exactly once. This file: opening, tickets and publication,
//! `stream.begin` / `stream.append`, subscriptions and reads. Beside it: `plans.rs` (interrupt
//! and resume: the recovery planner wired in), `ending.rs` (the commit point, commit, abort,
//! expiry), `replay.rs` (replay at open, re-sealing), `checkpoint.rs` (`checkpoint.*`).

mod checkpoint;
mod ending;
mod orphans;
mod plans;
mod replay;
mod shards;
mod shared;
mod transfer;
mod window;

pub use orphans::ABANDONED;
pub use replay::ReplayedRun;
pub use transfer::Export;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

use super::accum::{Event, MAX_RUN_CONTENT_BYTES};
use super::error::StreamError;
use super::feed::{self, Feed};
use super::record::{self, Record};
use super::run::{event_json, new_stream_id, EventJson, Run, Status};
use super::store::{self, FileStore, Out, Sealer, StreamStore};
use super::tool_log::{self, ToolLog};
use super::validate_run_id;
use crate::durable::journal::{Durability, JournalError, Position, Promise, ReplayReport, Stats};
use crate::durable::Faults;
use crate::limits;
use crate::recovery::{self, Input, Policy, Stale};
use crate::timefmt::now_ms;

/// Settings.
#[derive(Clone, Debug)]
pub struct StreamsConfig {
    /// The retry policy of the planner.
    pub policy: Policy,
    /// A checkpoint with no event for this long is stale on resume.
    pub stale_after: Duration,
    /// When appends are acknowledged.
    pub durability: Durability,
    /// Most events one append may carry.
    pub max_events_per_append: usize,
    /// Most runs active at once.
    pub max_active_runs: usize,
    /// A run with no event for this long is ended as `expired`.
    pub expire_after: Duration,
    /// How many of a run's latest published events memory keeps (files; older ones are
    /// derived from the journal when a subscriber asks).
    pub memory_events: usize,
    /// A run no producer holds (its connection closed, or the daemon restarted without it)
    /// for this long ends as `abandoned`.
    pub orphan_timeout: Duration,
}

impl Default for StreamsConfig {
    fn default() -> Self {
        StreamsConfig {
            policy: Policy::default(),
            stale_after: limits::STREAM_STALE_AFTER,
            durability: Durability::Always,
            max_events_per_append: limits::MAX_EVENTS_PER_APPEND,
            max_active_runs: limits::MAX_ACTIVE_RUNS,
            expire_after: limits::STREAM_EXPIRE_AFTER,
            memory_events: limits::STREAM_MEMORY_EVENTS,
            orphan_timeout: limits::STREAM_ORPHAN_TIMEOUT,
        }
    }
}

/// Runs by id: one shard of the daemon's ([`shards::Runs`]), or a scratch map that replay fills.
struct State {
    runs: HashMap<String, Run>,
}

/// The streams of one daemon.
pub struct Streams {
    /// Where the runs are kept (the journal and the runs' files, or a database).
    store: Box<dyn StreamStore>,
    runs: shards::Runs,
    config: StreamsConfig,
    /// The run logs, for the R2 plans' `execution` of each completed tool call.
    tool_log: std::sync::OnceLock<Arc<dyn ToolLog>>,
    /// A shared store's runs this host held before it started are loaded (and their orphan
    /// clocks started) by the first orphan sweep.
    adopted: std::sync::atomic::AtomicBool,
    /// The connections through which each run's holder speaks (`orphans.rs`), beside the runs
    /// rather than in them: a shared store's copy of a run may be dropped and loaded again,
    /// its holder's connections are the same. Taken after a run's lock, never before.
    holders: std::sync::Mutex<HashMap<String, orphans::Holders>>,
    /// Losses that could not be recorded (the store refused or was unreachable): run id ->
    /// the lost stream id, tried again by every orphan sweep until recorded or moot.
    pending_lost: std::sync::Mutex<HashMap<String, String>>,
}

/// An accepted change waiting for the journal.
#[must_use = "wait for the journal with Streams::settle"]
pub struct Ticket {
    run_id: Arc<str>,
    /// The run's `events[..upto]` are durable once this record is.
    upto: usize,
    /// The run's version once this record is kept (a failed one drops a shared store's run
    /// from memory if memory has it).
    version: u64,
    durable: Arc<Promise>,
    /// What to answer once durable.
    pub answer: Answer,
}

/// What a [`Ticket`] answers once its record is durable.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// `stream.append`'s `{"acked_seq": N}` (and `"duplicate": true` for a replay): typed, so
    /// the one answer every append gets is written straight into its response line, with no
    /// `serde_json` map built and dropped per append (docs/benchmarks.md, "seventh session").
    Acked {
        /// The last seq of the run now accepted.
        acked_seq: u64,
        /// The append was a replay of one already accepted.
        duplicate: bool,
    },
    /// Any other call's result.
    Value(Value),
}

impl Answer {
    /// The answer as a JSON value.
    pub fn into_value(self) -> Value {
        match self {
            Answer::Value(v) => v,
            // Its `Serialize` is the one definition of its JSON (a map of a number and a bool
            // always converts).
            acked => serde_json::to_value(&acked).unwrap_or(Value::Null),
        }
    }
}

impl serde::Serialize for Answer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            Answer::Acked {
                acked_seq,
                duplicate,
            } => {
                let mut m = s.serialize_map(Some(1 + usize::from(*duplicate)))?;
                m.serialize_entry("acked_seq", acked_seq)?;
                if *duplicate {
                    m.serialize_entry("duplicate", &true)?;
                }
                m.end()
            }
            Answer::Value(v) => v.serialize(s),
        }
    }
}

impl Streams {
    /// Open: the journal under `streams_dir`, run state files under `runs_dir`; replay.
    pub fn open(
        streams_dir: &Path,
        runs_dir: &Path,
        sealer: Arc<dyn Sealer>,
        config: StreamsConfig,
        faults: Faults,
    ) -> Result<Streams, StreamError> {
        let (store, records) =
            FileStore::open(streams_dir, runs_dir, sealer, config.durability, faults)?;
        let streams = Streams {
            store: Box::new(store),
            runs: shards::Runs::new(),
            config,
            tool_log: std::sync::OnceLock::new(),
            adopted: std::sync::atomic::AtomicBool::new(true),
            holders: Default::default(),
            pending_lost: Default::default(),
        };
        {
            // Replayed into one map, then moved into the shards.
            let mut st = State {
                runs: HashMap::new(),
            };
            for r in records {
                Self::replay_record(&mut st, r.record, r.mark);
            }
            // Runs whose state file says they ended (a crash after the commit point, before
            // the end record) are not resumable.
            let ended: Vec<String> = st
                .runs
                .keys()
                .filter(|id| streams.has_ended(id))
                .cloned()
                .collect();
            for id in ended {
                st.runs.remove(&id);
            }
            let active: Vec<&str> = st.runs.keys().map(String::as_str).collect();
            streams.store.after_replay(&active);
            // No connection holds anything yet: each run's producer has the orphan timeout to
            // come back (a restart is not a loss until then).
            let now = now_ms();
            for run in st.runs.values_mut() {
                run.published = run.end_pos();
                run.queued = run.end_pos();
                run.unattached_since.get_or_insert(now);
                streams.trim(run);
            }
            for (id, run) in st.runs {
                streams.runs.lock(&id).runs.insert(id, run);
            }
        }
        streams.release_segments();
        Ok(streams)
    }

    /// The shard `run_id` lives in, locked.
    fn lock(&self, run_id: &str) -> shards::RunsGuard<'_> {
        self.runs.lock(run_id)
    }

    /// What replay found at open.
    pub fn replay_report(&self) -> &ReplayReport {
        self.store.replay_report()
    }

    /// Runs active now.
    pub fn active_runs(&self) -> usize {
        self.runs.len()
    }

    /// Whether `run_id` has a stream that has not ended (its directory must not be pruned).
    pub fn is_active(&self, run_id: &str) -> bool {
        self.lock(run_id).runs.contains_key(run_id)
    }

    /// The next seq memory's copy of the run expects, if memory has it.
    pub fn next_seq(&self, run_id: &str) -> Option<u64> {
        self.lock(run_id).runs.get(run_id).map(|r| r.next_seq)
    }

    /// Queue a record of `run`, making its events so far durable with it.
    fn submit(&self, run: &mut Run, rec: &Record, answer: Value) -> Result<Ticket, StreamError> {
        let prepared = self.store.prepare(Out::Record(rec))?;
        let durable = self.queue_for(run, prepared);
        Ok(Ticket {
            run_id: run.run_id.clone(),
            upto: run.end_pos(),
            version: run.version,
            durable,
            answer: Answer::Value(answer),
        })
    }

    /// Hand a prepared record of `run` to the store with what it changes (the events since the
    /// run's previous record, its head; a shared store fences it by the run's version).
    fn queue_for(&self, run: &mut Run, prepared: store::Prepared) -> Arc<Promise> {
        let p = self.store.queue_run(prepared, run.tail());
        run.version += 1;
        run.queued = run.end_pos();
        run.last = Some(Arc::clone(&p));
        self.trim(run);
        p
    }

    fn channel(t: &Ticket) -> oneshot::Receiver<Result<Position, JournalError>> {
        let (tx, rx) = oneshot::channel();
        t.durable.then(move |res| {
            let _ = tx.send(res);
        });
        rx
    }

    /// Wait until a ticket's record is durable, then publish what it covers. Returns the
    /// answer for the client.
    pub async fn settle(&self, t: Ticket) -> Result<Value, StreamError> {
        let res = Self::channel(&t).await.unwrap_or(Err(JournalError::Closed));
        self.after_durable(&t.run_id, t.upto, t.version, res)?;
        Ok(t.answer.into_value())
    }

    /// [`Streams::settle`], blocking (tests, offline tools; never from an async task).
    pub fn settle_blocking(&self, t: Ticket) -> Result<Value, StreamError> {
        let res = Self::channel(&t)
            .blocking_recv()
            .unwrap_or(Err(JournalError::Closed));
        self.after_durable(&t.run_id, t.upto, t.version, res)?;
        Ok(t.answer.into_value())
    }

    /// [`Streams::settle`] without waiting: `done` gets the answer when the record is durable,
    /// on the thread that commits the journal (so it must not block), or at once if it already
    /// is.
    pub fn settle_then(
        self: &Arc<Self>,
        t: Ticket,
        done: impl FnOnce(Result<Answer, StreamError>) + Send + 'static,
    ) {
        let streams = Arc::clone(self);
        let Ticket {
            run_id,
            upto,
            version,
            durable,
            answer,
        } = t;
        durable.then(move |res| {
            done(
                streams
                    .after_durable(&run_id, upto, version, res)
                    .map(|()| answer),
            );
        });
    }

    fn after_durable(
        &self,
        run_id: &str,
        upto: usize,
        version: u64,
        res: Result<Position, JournalError>,
    ) -> Result<(), StreamError> {
        let pos = match res {
            Ok(pos) => pos,
            Err(e) => {
                if self.store.shared().is_some() {
                    // Memory is ahead of the shared store (or another host's): forget the run;
                    // the next request loads it as the store has it.
                    let mut st = self.lock(run_id);
                    if st.runs.get(run_id).is_some_and(|r| r.version >= version) {
                        st.runs.remove(run_id);
                    }
                }
                return Err(e.into());
            }
        };
        let mut st = self.lock(run_id);
        if let Some(run) = st.runs.get_mut(run_id) {
            run.first_segment = run.first_segment.min(pos.segment);
            if upto > run.published {
                let from = run.published;
                let to = upto.min(run.end_pos());
                run.published = to;
                let fresh = &run.events[run.index_range(from, to)];
                run.subscribers
                    .retain(|tx| fresh.iter().all(|(s, e)| tx.push(*s, e)));
                self.trim(run);
            }
        }
        Ok(())
    }

    /// The run, if `stream_id` holds it and it is not ending (see [`Run::check_holder`]).
    fn run_mut<'a>(
        st: &'a mut State,
        run_id: &str,
        stream_id: &str,
    ) -> Result<&'a mut Run, StreamError> {
        let run = st.runs.get_mut(run_id).ok_or(StreamError::NotActive)?;
        run.check_holder(stream_id)?;
        Ok(run)
    }

    /// Whether the run has a state file (it ended). Its existence decides, not its content:
    /// an unreadable state file must not bring a committed run back.
    fn has_ended(&self, run_id: &str) -> bool {
        self.store.has_ended(run_id)
    }

    /// `stream.begin`.
    pub fn begin(
        &self,
        run_id: &str,
        thread_id: Option<String>,
        model: Option<String>,
        takeover: bool,
    ) -> Result<Ticket, StreamError> {
        validate_run_id(run_id)?;
        self.store.check_run(run_id)?;
        // A shared store is asked first, without the lock (a query must not hold up every
        // append); an end on another host meanwhile makes the begin's write fail (fenced).
        let shared_ended = self.refresh(run_id)?;
        // Under the lock: an end() finishing meanwhile has written its state file before it
        // removes the run, so one of the two checks sees it.
        let mut st = self.lock(run_id);
        if shared_ended || (!self.is_shared() && self.has_ended(run_id)) {
            let status = self
                .read_state(run_id)
                .ok()
                .flatten()
                .and_then(|s| s["status"].as_str().map(str::to_owned))
                .unwrap_or_else(|| "ended".into());
            return Err(StreamError::Ended { status });
        }
        let now = now_ms();
        if let Some(run) = st.runs.get(run_id) {
            if run.ending {
                return Err(StreamError::Ending);
            }
            if run.status == Status::Failed {
                return Err(StreamError::Failed);
            }
        }
        let (epoch, next_seq) = match st.runs.get(run_id) {
            Some(run) if !takeover => return Err(StreamError::Streaming { epoch: run.epoch }),
            Some(run) => (run.epoch + 1, run.next_seq),
            None => {
                if !st.admit(self.config.max_active_runs) {
                    return Err(StreamError::TooManyRuns {
                        max: self.config.max_active_runs,
                    });
                }
                (1, 1)
            }
        };
        let stream_id = new_stream_id();
        let rec = Record::Begin(record::Begin {
            run: run_id.to_owned(),
            epoch,
            sid: stream_id.clone(),
            thread: thread_id.clone(),
            model: model.clone(),
            at: now,
        });
        let answer = json!({"stream_id": stream_id, "epoch": epoch, "next_seq": next_seq});
        let segment = self.store.active_mark();
        // Sealed before the run changes: a refusal changes nothing.
        let prepared = self.store.prepare(Out::Record(&rec))?;
        Self::apply_begin(
            &mut st, run_id, epoch, &stream_id, thread_id, model, now, segment,
        );
        let run = st.runs.get_mut(run_id).ok_or(StreamError::NotActive)?;
        run.held_here = true;
        let durable = self.queue_for(run, prepared);
        Ok(Ticket {
            run_id: Arc::clone(&run.run_id),
            upto: 0,
            version: run.version,
            durable,
            answer: Answer::Value(answer),
        })
    }

    /// `stream.append`: events numbered from `seq`. A replayed seq is acknowledged and
    /// dropped; a gap is refused.
    pub fn append(
        &self,
        run_id: &str,
        stream_id: &str,
        seq: u64,
        events: &[Value],
    ) -> Result<Ticket, StreamError> {
        let parsed = self.parse_events(events)?;
        self.append_events(run_id, stream_id, seq, parsed)
    }

    /// A request's events as [`Event`]s: the count checked, then each event, with the index
    /// of the first that is wrong.
    pub fn parse_events(&self, events: &[Value]) -> Result<Vec<Event>, StreamError> {
        self.check_count(events.len())?;
        events
            .iter()
            .enumerate()
            .map(|(index, e)| {
                Event::parse(e).map_err(|reason| StreamError::BadEvent { index, reason })
            })
            .collect()
    }

    fn check_count(&self, n: usize) -> Result<(), StreamError> {
        if n == 0 {
            return Err(StreamError::NoEvents);
        }
        if n > self.config.max_events_per_append {
            return Err(StreamError::TooManyEvents {
                max: self.config.max_events_per_append,
            });
        }
        Ok(())
    }

    /// [`Self::append`] with the events already parsed (the socket's fast path reads them
    /// straight from the request line).
    pub fn append_events(
        &self,
        run_id: &str,
        stream_id: &str,
        seq: u64,
        parsed: Vec<Event>,
    ) -> Result<Ticket, StreamError> {
        self.check_count(parsed.len())?;
        let mut st = self.lock(run_id);
        let run = Self::run_mut(&mut st, run_id, stream_id)?;
        if run.status == Status::Failed {
            return Err(StreamError::Failed);
        }
        if seq == 0 {
            return Err(StreamError::SeqZero);
        }
        if seq > run.next_seq {
            return Err(StreamError::Gap {
                next: run.next_seq,
                got: seq,
            });
        }
        let skip = (run.next_seq - seq) as usize;
        if skip >= parsed.len() {
            // A replay of appends already accepted: acknowledge, change nothing.
            let acked = run.next_seq - 1;
            // Answered when the original is durable (it may still be in flight).
            let durable = run.last.clone().unwrap_or_else(|| {
                Promise::ready(Ok(Position {
                    segment: u64::MAX,
                    offset: 0,
                }))
            });
            let id = Arc::clone(&run.run_id);
            drop(st);
            return Ok(Ticket {
                run_id: id,
                upto: 0,
                version: 0,
                durable,
                answer: Answer::Acked {
                    acked_seq: acked,
                    duplicate: true,
                },
            });
        }
        let fresh = &parsed[skip..];
        run.acc.check_batch(fresh).map_err(StreamError::BadBatch)?;
        let added: usize = fresh.iter().map(Event::content_len).sum();
        if run.acc.content_bytes().saturating_add(added) > MAX_RUN_CONTENT_BYTES {
            return Err(StreamError::RunTooLarge {
                max: MAX_RUN_CONTENT_BYTES,
            });
        }
        let first = run.next_seq;
        // One clock reading for the record and the run: replay restores exactly this time.
        let at = now_ms();
        // Serialized straight from the events (the same JSON as `Record::Events`), without
        // building a `Value` per append.
        let prepared = self.store.prepare(Out::Events(&record::EventsOut {
            t: "ev",
            run: run_id,
            epoch: run.epoch,
            seq: first,
            events: fresh,
            at,
        }))?;
        // Published straight into the run's events (no `Vec` per append); `check_batch`
        // above makes an error here unreachable, and if one came the events are taken back.
        let before = run.events.len();
        for (i, e) in fresh.iter().enumerate() {
            if let Err(e) = run.acc.apply_into(first + i as u64, e, &mut run.events) {
                run.events.truncate(before);
                return Err(StreamError::BadBatch(e.at(i)));
            }
        }
        run.acc.add_content(added);
        run.next_seq = first + fresh.len() as u64;
        run.updated_at_ms = at;
        run.status = Status::Streaming;
        let upto = run.end_pos();
        let acked = run.next_seq - 1;
        // Queued while the run is locked: the journal keeps each run's records in seq order.
        // The segment is noted now, not when the record is durable: a release in between must
        // not delete the segment that will hold it.
        run.first_segment = run.first_segment.min(self.store.active_mark());
        let durable = self.queue_for(run, prepared);
        let version = run.version;
        // The run's own id, shared: no copy of it per append.
        let id = Arc::clone(&run.run_id);
        drop(st);
        Ok(Ticket {
            run_id: id,
            upto,
            version,
            durable,
            answer: Answer::Acked {
                acked_seq: acked,
                duplicate: false,
            },
        })
    }

    /// Delete journal segments no active run needs.
    fn release_segments(&self) {
        let mut min = u64::MAX;
        self.runs.each(|st| {
            if let Some(m) = st.runs.values().map(|r| r.first_segment).min() {
                min = min.min(m);
            }
        });
        self.store.release_before(min);
    }

    /// `stream.subscribe`: every event with seq > `after_seq` (durable ones at once, later ones
    /// as they become durable), then `finish`. For an ended run: just `finish`.
    /// On a shared store the run's events are read from the store (blocking: call from the
    /// blocking pool), whichever host commits them.
    pub fn subscribe(&self, run_id: &str, after_seq: u64) -> Result<Feed, StreamError> {
        validate_run_id(run_id)?;
        if let Some(shared) = self.shared() {
            return shared.follow(run_id, after_seq);
        }
        let (tx, rx) = feed::feed();
        // Events memory no longer holds, derived from the journal without the lock (at most
        // twice: memory may move on while they are read).
        let mut older: Option<Vec<(u64, EventJson)>> = None;
        for _ in 0..3 {
            let mut st = self.lock(run_id);
            let Some(run) = st.runs.get_mut(run_id) else {
                break;
            };
            let needs_older =
                run.events_base > 0 && run.events.first().is_none_or(|(s, _)| after_seq < *s);
            let covered = older.as_ref().is_some_and(|o| o.len() >= run.events_base);
            if needs_older && !covered {
                let first = run.first_segment;
                drop(st);
                older = Some(self.derive_events(run_id, first)?);
                continue;
            }
            if needs_older {
                if let Some(o) = &older {
                    let before = &o[..run.events_base];
                    let lo = before.partition_point(|(s, _)| *s <= after_seq);
                    for (s, e) in &before[lo..] {
                        tx.push_uncapped(*s, e);
                    }
                }
            }
            let published = run.events_between(run.events_base, run.published);
            let lo = published.partition_point(|(s, _)| *s <= after_seq);
            for (s, e) in &published[lo..] {
                tx.push_uncapped(*s, e);
            }
            run.subscribers.push(tx);
            return Ok(rx);
        }
        // Not active (or it ended while its events were read): its finish, whatever
        // `after_seq` is (a subscription past the end ends at once instead of waiting forever).
        let state = self.read_state(run_id)?.ok_or(StreamError::NoSuchRun)?;
        let seq = state["finish_seq"].as_u64().unwrap_or(0);
        let finish = json!({"type": "finish", "status": state["status"]});
        tx.push_uncapped(seq, &event_json(&finish));
        Ok(rx)
    }

    /// `stream.get`: a run's state (active: summary and checkpoint; ended: its state file,
    /// without the final message unless `reveal`).
    pub fn get(&self, run_id: &str, reveal: bool) -> Result<Value, StreamError> {
        validate_run_id(run_id)?;
        self.refresh(run_id)?;
        if let Some(run) = self.lock(run_id).runs.get(run_id) {
            let mut v = run.summary();
            if reveal {
                v["checkpoint"] = run.checkpoint();
            }
            return Ok(v);
        }
        let mut state = self.read_state(run_id)?.ok_or(StreamError::NoSuchRun)?;
        if !reveal {
            for key in ["final_message", "partial_message"] {
                if let Some(m) = state.get_mut(key) {
                    *m = json!({"hidden": "pass reveal: true"});
                }
            }
        }
        Ok(state)
    }

    /// `stream.list`: the active runs (on a shared store, every host's, with their head
    /// fields and holder host: blocking).
    pub fn list(&self) -> Result<Vec<Value>, StreamError> {
        if let Some(shared) = self.shared() {
            return shared.list();
        }
        let mut v: Vec<Value> = Vec::new();
        self.runs
            .each(|st| v.extend(st.runs.values().map(Run::summary)));
        v.sort_by(|a, b| a["run_id"].as_str().cmp(&b["run_id"].as_str()));
        Ok(v)
    }

    /// The journal's counters.
    pub fn journal_stats(&self) -> &Stats {
        self.store.stats()
    }

    /// Let the threads that queue appends commit them themselves (the daemon's workers,
    /// before they park: see [`Streams::assist`]).
    pub fn set_assisted(&self, on: bool) {
        self.store.set_assisted(on);
    }

    /// Have `nudge` told when a record is queued while threads assist (the append lane, which
    /// commits: docs/design.md, "Who commits"); `None` stops it.
    pub fn set_nudge(&self, nudge: Option<crate::durable::journal::Nudge>) {
        self.store.set_nudge(nudge);
    }

    /// Commit the appends queued so far on this thread, unless another thread is committing:
    /// called by each of the daemon's runtime workers when it runs out of work, so the worker
    /// that read an append writes, syncs and answers it (docs/design.md, "Group commit").
    pub fn assist(&self, yield_to_others: &dyn Fn() -> bool) {
        self.store.assist(yield_to_others);
    }

    /// Where records queued now are kept (the journal's active segment).
    pub fn active_mark(&self) -> u64 {
        self.store.active_mark()
    }
}
