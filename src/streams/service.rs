//! The streams of one daemon: runs in memory, each change journaled before it is answered and
//! published, the recovery planner wired in, subscribers fed exactly once.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

use super::accum::Event;
use super::error::StreamError;
use super::feed::{self, Feed};
use super::record::{self, Record};
use super::run::{event_json, new_stream_id, Run, Status};
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
        }
    }
}

struct State {
    runs: HashMap<String, Run>,
}

/// The streams of one daemon.
pub struct Streams {
    /// Where the runs are kept (the journal and the runs' files, or a database).
    store: Box<dyn StreamStore>,
    state: Mutex<State>,
    config: StreamsConfig,
    /// The run logs, for the R2 plans' `execution` of each completed tool call.
    tool_log: std::sync::OnceLock<Arc<dyn ToolLog>>,
}

/// An accepted change waiting for the journal.
#[must_use = "wait for the journal with Streams::settle"]
pub struct Ticket {
    run_id: String,
    /// The run's `events[..upto]` are durable once this record is.
    upto: usize,
    durable: Arc<Promise>,
    /// What to answer once durable.
    pub answer: Value,
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
            state: Mutex::new(State {
                runs: HashMap::new(),
            }),
            config,
            tool_log: std::sync::OnceLock::new(),
        };
        {
            let mut st = streams.lock();
            for r in records {
                streams.replay_record(&mut st, r.record, r.mark);
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
            for run in st.runs.values_mut() {
                run.published = run.events.len();
            }
        }
        streams.release_segments();
        Ok(streams)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What replay found at open.
    pub fn replay_report(&self) -> &ReplayReport {
        self.store.replay_report()
    }

    /// Runs active now.
    pub fn active_runs(&self) -> usize {
        self.lock().runs.len()
    }

    /// Whether `run_id` has a stream that has not ended (its directory must not be pruned).
    pub fn is_active(&self, run_id: &str) -> bool {
        self.lock().runs.contains_key(run_id)
    }

    /// Queue a record for run `run_id`, making its `events[..upto]` durable with it.
    fn submit(
        &self,
        run_id: &str,
        upto: usize,
        rec: &Record,
        answer: Value,
    ) -> Result<Ticket, StreamError> {
        Ok(Ticket {
            run_id: run_id.to_owned(),
            upto,
            durable: self.store.append(Out::Record(rec))?,
            answer,
        })
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
        self.after_durable(&t.run_id, t.upto, res)?;
        Ok(t.answer)
    }

    /// [`Streams::settle`], blocking (tests, offline tools; never from an async task).
    pub fn settle_blocking(&self, t: Ticket) -> Result<Value, StreamError> {
        let res = Self::channel(&t)
            .blocking_recv()
            .unwrap_or(Err(JournalError::Closed));
        self.after_durable(&t.run_id, t.upto, res)?;
        Ok(t.answer)
    }

    /// [`Streams::settle`] without waiting: `done` gets the answer when the record is durable,
    /// on the journal's committer thread (so it must not block), or at once if it already is.
    pub fn settle_then(
        self: &Arc<Self>,
        t: Ticket,
        done: impl FnOnce(Result<Value, StreamError>) + Send + 'static,
    ) {
        let streams = Arc::clone(self);
        let Ticket {
            run_id,
            upto,
            durable,
            answer,
        } = t;
        durable.then(move |res| {
            done(streams.after_durable(&run_id, upto, res).map(|()| answer));
        });
    }

    fn after_durable(
        &self,
        run_id: &str,
        upto: usize,
        res: Result<Position, JournalError>,
    ) -> Result<(), StreamError> {
        let pos = res?;
        let mut st = self.lock();
        if let Some(run) = st.runs.get_mut(run_id) {
            run.first_segment = run.first_segment.min(pos.segment);
            if upto > run.published {
                let from = run.published;
                let to = upto.min(run.events.len());
                run.published = to;
                let fresh = &run.events[from..to];
                run.subscribers
                    .retain(|tx| fresh.iter().all(|(s, e)| tx.push(*s, e)));
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
        // Under the lock: an end() finishing meanwhile has written its state file before it
        // removes the run, so one of the two checks sees it.
        let mut st = self.lock();
        if self.has_ended(run_id) {
            let status = self
                .read_state(run_id)
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
                if st.runs.len() >= self.config.max_active_runs {
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
        let ticket = self.submit(run_id, 0, &rec, answer)?;
        Self::apply_begin(
            &mut st, run_id, epoch, &stream_id, thread_id, model, now, segment,
        );
        if let Some(run) = st.runs.get_mut(run_id) {
            run.last = Some(Arc::clone(&ticket.durable));
        }
        Ok(ticket)
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_begin(
        st: &mut State,
        run_id: &str,
        epoch: u64,
        stream_id: &str,
        thread_id: Option<String>,
        model: Option<String>,
        at: u64,
        mark: u64,
    ) {
        st.runs
            .entry(run_id.to_owned())
            .or_insert_with(|| Run::new(run_id, at, mark))
            .begin(epoch, stream_id, thread_id, model, at, mark);
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
        let mut st = self.lock();
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
            drop(st);
            return Ok(Ticket {
                run_id: run_id.to_owned(),
                upto: 0,
                durable,
                answer: json!({"acked_seq": acked, "duplicate": true}),
            });
        }
        let fresh = &parsed[skip..];
        run.acc.check_batch(fresh).map_err(StreamError::BadBatch)?;
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
        let mut out = Vec::new();
        for (i, e) in fresh.iter().enumerate() {
            out.extend(
                run.acc
                    .apply(first + i as u64, e)
                    .map_err(StreamError::BadBatch)?,
            );
        }
        run.next_seq = first + fresh.len() as u64;
        run.updated_at_ms = at;
        run.status = Status::Streaming;
        run.push_events(out);
        let upto = run.events.len();
        let acked = run.next_seq - 1;
        // Queued while the run is locked: the journal keeps each run's records in seq order.
        // The segment is noted now, not when the record is durable: a release in between must
        // not delete the segment that will hold it.
        run.first_segment = run.first_segment.min(self.store.active_mark());
        let durable = self.store.queue(prepared);
        run.last = Some(Arc::clone(&durable));
        drop(st);
        Ok(Ticket {
            run_id: run_id.to_owned(),
            upto,
            durable,
            answer: json!({"acked_seq": acked}),
        })
    }

    /// `stream.interrupt`: plan the recovery, publish its events.
    pub fn interrupt(
        &self,
        run_id: &str,
        stream_id: &str,
        cause: &Value,
    ) -> Result<Ticket, StreamError> {
        let mut t = self.interrupt_locked(run_id, stream_id, cause)?;
        self.annotate(run_id, &mut t.answer);
        Ok(t)
    }

    /// Read the run logs for R2 plans (see [`tool_log`](super::tool_log)).
    pub fn attach_tool_log(&self, log: Arc<dyn ToolLog>) {
        let _ = self.tool_log.set(log);
    }

    fn annotate(&self, run_id: &str, plan: &mut Value) {
        if let Some(log) = self.tool_log.get() {
            tool_log::annotate(log.as_ref(), run_id, plan);
        }
    }

    /// Put a plan in the run log's recovery timeline (see [`tool_log::log_plan`]). Called once
    /// the plan's journal record is durable; file work: not on an async task.
    pub fn log_plan(&self, run_id: &str, event: &str, plan: &Value) {
        if let Some(log) = self.tool_log.get() {
            tool_log::log_plan(log.as_ref(), run_id, event, plan);
        }
    }

    fn interrupt_locked(
        &self,
        run_id: &str,
        stream_id: &str,
        cause: &Value,
    ) -> Result<Ticket, StreamError> {
        let mut st = self.lock();
        let run = Self::run_mut(&mut st, run_id, stream_id)?;
        if run.status == Status::Failed {
            return Err(StreamError::Failed);
        }
        // Only the cause (and its Retry-After) comes from the producer; the text, calls,
        // counters and policy are the run's own.
        let snapshot = match cause {
            Value::String(c) => json!({"cause": c}),
            Value::Object(o) if o.contains_key("status") => json!({"error": o}),
            Value::Object(o) if o.contains_key("cause") => {
                if let Some(k) = o
                    .keys()
                    .find(|k| !["cause", "retry_after"].contains(&k.as_str()))
                {
                    return Err(StreamError::CauseField(k.chars().take(40).collect()));
                }
                Value::Object(o.clone())
            }
            _ => return Err(StreamError::CauseShape),
        };
        let input = self.planner_input(run, &snapshot, None)?;
        self.plan_and_record(run, input, "interrupt")
    }

    fn planner_input(
        &self,
        run: &mut Run,
        cause: &Value,
        stale: Option<Stale>,
    ) -> Result<Input, StreamError> {
        // Validate first: a refused cause must change nothing (replay would not see it).
        let mut input =
            recovery::input_from_json(cause, now_ms()).map_err(StreamError::BadCause)?;
        let out = run.acc.flush_trim();
        run.push_events(out);
        input.text = run.acc.text.clone();
        input.tool_calls = run.acc.tool_calls();
        input.attempts = run.attempts;
        input.stall_history = run.stall_history.clone();
        input.stale = stale;
        input.policy = self.config.policy.clone();
        let mut b = [0u8; 8];
        input.jitter = getrandom::fill(&mut b)
            .ok()
            .map(|()| (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64);
        Ok(input)
    }

    /// Plan, apply to the run, and journal it; the ticket's answer is the plan.
    fn plan_and_record(
        &self,
        run: &mut Run,
        input: Input,
        kind: &str,
    ) -> Result<Ticket, StreamError> {
        let plan = recovery::plan(&input);
        let at = now_ms();
        let (events, plan_json) = run.apply_plan(&plan, &input.cause, at);
        // The record carries what replay needs (kind, cancelled calls, counters, events), not
        // the text so far: a plan of a long turn must stay far below the frame limit.
        let mut compact = plan_json.clone();
        if let Value::Object(m) = &mut compact {
            m.remove("assistant_prefix");
            m.remove("completed");
        }
        let rec = Record::Plan(record::PlanRecord {
            run: run.run_id.clone(),
            epoch: run.epoch,
            kind: kind.to_owned(),
            plan: compact,
            at,
            input: record::PlanInput {
                cause: input.cause,
                status: input.status,
            },
            events,
        });
        let mut answer = plan_json;
        answer["next_seq"] = run.next_seq.into();
        let run_id = run.run_id.clone();
        let upto = run.events.len();
        run.first_segment = run.first_segment.min(self.store.active_mark());
        let t = self.submit(&run_id, upto, &rec, answer)?;
        run.last = Some(Arc::clone(&t.durable));
        Ok(t)
    }

    /// `stream.resume`: a new process takes the run over, gets its checkpoint and a plan.
    pub fn resume(
        &self,
        run_id: &str,
        model: Option<String>,
        thread_id: Option<String>,
        fail_on_stale: bool,
    ) -> Result<Ticket, StreamError> {
        let mut t = self.resume_locked(run_id, model, thread_id, fail_on_stale)?;
        if let Some(plan) = t.answer.get_mut("plan") {
            self.annotate(run_id, plan);
        }
        Ok(t)
    }

    fn resume_locked(
        &self,
        run_id: &str,
        model: Option<String>,
        thread_id: Option<String>,
        fail_on_stale: bool,
    ) -> Result<Ticket, StreamError> {
        validate_run_id(run_id)?;
        let mut st = self.lock();
        let run = st.runs.get_mut(run_id).ok_or(StreamError::NotResumable)?;
        let mut why = Vec::new();
        let age = now_ms().saturating_sub(run.updated_at_ms);
        if age > self.config.stale_after.as_millis() as u64 {
            why.push(format!("last event {} s ago", age / 1000));
        }
        if let (Some(want), Some(had)) = (&model, &run.model) {
            if want != had {
                why.push(format!("model {had:?} then, {want:?} now"));
            }
        }
        if let (Some(want), Some(had)) = (&thread_id, &run.thread_id) {
            if want != had {
                why.push("another thread".to_string());
            }
        }
        let stale = (!why.is_empty()).then(|| Stale {
            reason: why.join("; "),
            fail: fail_on_stale,
        });
        if run.ending {
            return Err(StreamError::Ending);
        }
        let checkpoint = run.checkpoint();
        let (epoch, sid) = (run.epoch + 1, new_stream_id());
        let begin = Record::Begin(record::Begin {
            run: run_id.to_owned(),
            epoch,
            sid: sid.clone(),
            thread: thread_id.clone(),
            model: model.clone(),
            at: now_ms(),
        });
        // Sealed before anything changes: a failure here leaves the old holder in place.
        let prepared = self.store.prepare(Out::Record(&begin))?;
        run.epoch = epoch;
        run.stream_id = sid;
        // As replay will (apply_begin): the resumer's model and thread are the run's now.
        if model.is_some() {
            run.model = model;
        }
        if thread_id.is_some() {
            run.thread_id = thread_id;
        }
        run.first_segment = run.first_segment.min(self.store.active_mark());
        // Not awaited on its own: the plan record queued after it settles both.
        drop(self.store.queue(prepared));
        let input = self.planner_input(run, &json!({"cause": "resumed_from_checkpoint"}), stale)?;
        let mut t = self.plan_and_record(run, input, "resume")?;
        t.answer = json!({
            "stream_id": run.stream_id, "epoch": run.epoch, "next_seq": run.next_seq,
            "checkpoint": checkpoint, "plan": t.answer,
        });
        Ok(t)
    }

    /// The commit point: the run's state (sealed, replaced atomically) saying `status`.
    fn write_state(&self, run_id: &str, state: &Value) -> Result<(), StreamError> {
        self.store.write_state(run_id, state)
    }

    /// The run's state file, if it has one (committed or aborted).
    pub fn read_state(&self, run_id: &str) -> Option<Value> {
        self.store.read_state(run_id)
    }

    /// End runs with no event for `expire_after` (failed, or abandoned by their producer) as
    /// `expired`: their state files keep what they were for inspection. Returns how many.
    pub fn expire_idle(&self) -> usize {
        let cutoff = now_ms().saturating_sub(self.config.expire_after.as_millis() as u64);
        let idle: Vec<(String, String, Status)> = self
            .lock()
            .runs
            .values()
            .filter(|r| r.updated_at_ms < cutoff)
            .map(|r| (r.run_id.clone(), r.stream_id.clone(), r.status))
            .collect();
        let mut n = 0;
        for (run_id, sid, status) in idle {
            let detail = json!({"reason": format!("no event for {} s", self.config.expire_after.as_secs()),
                                "was": status});
            match self.end(&run_id, &sid, "expired", detail) {
                Ok(_) => n += 1,
                Err(e) => tracing::warn!(run = %run_id, error = %e, "could not expire an idle run"),
            }
        }
        if n > 0 {
            tracing::info!(expired = n, "ended idle stream runs as expired");
        }
        n
    }

    /// `stream.commit`: the final message durable and the run ended in one step (see
    /// [`Streams::end`]). With `content_from_stream`, the message's `content` is set to the
    /// text the run's subscribers are shown — everything published, plus what the overlap
    /// trimmer still holds as its last decision will publish it — so the stored message and
    /// the streamed text can never differ (a producer composing it itself cannot see that
    /// decision: it is made after the commit point).
    pub fn commit(
        &self,
        run_id: &str,
        stream_id: &str,
        final_message: Value,
        content_from_stream: bool,
    ) -> Result<Value, StreamError> {
        if content_from_stream && !final_message.is_object() {
            return Err(StreamError::FinalMessageShape);
        }
        self.end_with(
            run_id,
            stream_id,
            "committed",
            json!({"final_message": final_message}),
            content_from_stream,
        )
    }

    /// `stream.abort` (and expiry): one atomic step ends the run; then `finish` is published and
    /// the run leaves memory. A failed end leaves it resumable.
    pub fn end(
        &self,
        run_id: &str,
        stream_id: &str,
        status: &str,
        detail: Value,
    ) -> Result<Value, StreamError> {
        self.end_with(run_id, stream_id, status, detail, false)
    }

    fn end_with(
        &self,
        run_id: &str,
        stream_id: &str,
        status: &str,
        mut detail: Value,
        content_from_stream: bool,
    ) -> Result<Value, StreamError> {
        let (finish_seq, events_total) = {
            let mut st = self.lock();
            let run = Self::run_mut(&mut st, run_id, stream_id)?;
            // From here until the state file is written (or not), nothing else touches the run.
            run.ending = true;
            if content_from_stream {
                // The trimmer's decision, foreseen: the real one is made (identically) after the
                // commit point, when the held text is published.
                detail["final_message"]["content"] = Value::String(run.acc.text_when_flushed());
            }
            let summary = run.summary();
            (run.next_seq, (run.events.len(), summary))
        };
        let (events_total, summary) = events_total;
        let mut state = json!({"status": status, "run_id": run_id, "at_ms": now_ms(),
                               "finish_seq": finish_seq, "attempts": summary["attempts"],
                               "last_plan": summary["last_plan"],
                               "text_chars": summary["text_chars"]});
        if let (Value::Object(s), Value::Object(d)) = (&mut state, detail) {
            s.extend(d);
        }
        // The single commit point. Before it: resumable, nothing final on disk. After: ended.
        if let Err(e) = self.write_state(run_id, &state) {
            if let Some(run) = self.lock().runs.get_mut(run_id) {
                run.ending = false;
            }
            return Err(e);
        }
        let finish = event_json(&json!({"type": "finish", "status": status}));
        let mut st = self.lock();
        if let Some(mut run) = st.runs.remove(run_id) {
            let held = run.acc.flush_trim();
            run.push_events(held);
            // Everything before finish went out once durable; finish goes out now (the state
            // file is durable) after whatever is still pending in the journal.
            for (s, e) in &run.events[run.published.min(run.events.len())..] {
                for tx in &run.subscribers {
                    tx.push_uncapped(*s, e);
                }
            }
            for tx in run.subscribers.drain(..) {
                tx.push_uncapped(finish_seq, &finish);
            }
        }
        drop(st);
        let rec = Record::End(record::End {
            run: run_id.to_owned(),
            status: status.to_owned(),
        });
        if let Ok(prepared) = self.store.prepare(Out::Record(&rec)) {
            // Not awaited: the state file already decided; this only spares replay a lookup.
            drop(self.store.queue(prepared));
        }
        self.release_segments();
        Ok(
            json!({"run_id": run_id, "status": status, "finish_seq": finish_seq,
                  "events": events_total}),
        )
    }

    /// Delete journal segments no active run needs.
    fn release_segments(&self) {
        let min = self
            .lock()
            .runs
            .values()
            .map(|r| r.first_segment)
            .min()
            .unwrap_or(u64::MAX);
        self.store.release_before(min);
    }

    /// `stream.subscribe`: every event with seq > `after_seq` (durable ones at once, later ones
    /// as they become durable), then `finish`. For an ended run: just `finish`.
    pub fn subscribe(&self, run_id: &str, after_seq: u64) -> Result<Feed, StreamError> {
        validate_run_id(run_id)?;
        let (tx, rx) = feed::feed();
        let mut st = self.lock();
        match st.runs.get_mut(run_id) {
            Some(run) => {
                let published = &run.events[..run.published.min(run.events.len())];
                let lo = published.partition_point(|(s, _)| *s <= after_seq);
                for (s, e) in &published[lo..] {
                    tx.push_uncapped(*s, e);
                }
                run.subscribers.push(tx);
            }
            None => {
                drop(st);
                let state = self.read_state(run_id).ok_or(StreamError::NoSuchRun)?;
                let seq = state["finish_seq"].as_u64().unwrap_or(0);
                if seq > after_seq {
                    let finish = json!({"type": "finish", "status": state["status"]});
                    tx.push_uncapped(seq, &event_json(&finish));
                }
            }
        }
        Ok(rx)
    }

    /// `stream.get`: a run's state (active: summary and checkpoint; ended: its state file,
    /// without the final message unless `reveal`).
    pub fn get(&self, run_id: &str, reveal: bool) -> Result<Value, StreamError> {
        validate_run_id(run_id)?;
        if let Some(run) = self.lock().runs.get(run_id) {
            let mut v = run.summary();
            if reveal {
                v["checkpoint"] = run.checkpoint();
            }
            return Ok(v);
        }
        let mut state = self.read_state(run_id).ok_or(StreamError::NoSuchRun)?;
        if !reveal {
            if let Some(m) = state.get_mut("final_message") {
                *m = json!({"hidden": "pass reveal: true"});
            }
        }
        Ok(state)
    }

    /// `stream.list`: the active runs.
    pub fn list(&self) -> Vec<Value> {
        let mut v: Vec<Value> = self.lock().runs.values().map(Run::summary).collect();
        v.sort_by(|a, b| a["run_id"].as_str().cmp(&b["run_id"].as_str()));
        v
    }

    /// Apply one journal record at start-up.
    fn replay_record(&self, st: &mut State, rec: Record, segment: u64) {
        match rec {
            Record::Begin(b) => Self::apply_begin(
                st, &b.run, b.epoch, &b.sid, b.thread, b.model, b.at, segment,
            ),
            Record::Events(ev) => {
                let Some(run) = st.runs.get_mut(&ev.run) else {
                    return;
                };
                let first = ev.seq;
                if first != run.next_seq {
                    tracing::warn!(
                        run = %ev.run,
                        "stream journal: a record out of sequence was skipped"
                    );
                    return;
                }
                let mut out = Vec::new();
                for (i, e) in ev.events.iter().enumerate() {
                    let seq = first.saturating_add(i as u64);
                    if let Ok(parsed) = Event::parse(e) {
                        if let Ok(o) = run.acc.apply(seq, &parsed) {
                            out.extend(o);
                        }
                    }
                    run.next_seq = seq.saturating_add(1);
                }
                run.status = Status::Streaming;
                run.updated_at_ms = ev.at;
                run.push_events(out);
            }
            Record::Plan(p) => {
                let Some(run) = st.runs.get_mut(&p.run) else {
                    return;
                };
                let mut out = run.acc.flush_trim();
                run.push_events(std::mem::take(&mut out));
                // Re-plan from the recorded plan's decisions (not re-run: jitter and the clock
                // differ); what matters for the state is the plan kind, its cancelled calls,
                // counters and events.
                match p.plan() {
                    Ok(plan) => {
                        let cause = plan.cause;
                        let _ = run.apply_plan(&plan, &cause, p.at);
                    }
                    Err(e) => tracing::error!(run = %p.run, kind = ?e.classify(),
                        "stream journal: a plan that does not read was skipped"),
                }
            }
            Record::Snapshot(snap) => {
                let run_id = snap.run.clone();
                st.runs.insert(run_id, Run::from_snapshot(*snap, segment));
            }
            Record::End(e) => {
                st.runs.remove(&e.run);
            }
            Record::Reseal(_) => {}
        }
    }

    /// Re-seal everything of the streams under the sealer's current (primary) key: a snapshot
    /// record of every active run (after which the segments holding their older records are
    /// released), and every run's state and checkpoint file. Called during a rotation of the
    /// key, before the old one is forgotten. Returns (runs snapshotted, files re-sealed).
    pub fn reseal(&self) -> Result<(usize, usize), StreamError> {
        let tickets: Vec<(String, Arc<Promise>)> = {
            let st = self.lock();
            // The snapshots open a new segment: everything before them can then go whole.
            self.store.start_new_mark();
            // A marker first, so the new segment starts even with no active run.
            let mark = self
                .store
                .append(Out::Record(&Record::Reseal(record::Reseal {
                    run: String::new(),
                    at: now_ms(),
                })))?;
            let mut v = vec![(String::new(), mark)];
            for run in st.runs.values() {
                let snap = self.store.append(Out::Record(&run.snapshot_record()))?;
                v.push((run.run_id.clone(), snap));
            }
            v
        };
        let runs = tickets.len() - 1;
        for (run_id, p) in tickets {
            let pos = store::wait(&p)?;
            if let Some(run) = self.lock().runs.get_mut(&run_id) {
                // Everything the run needs is in the snapshot now.
                run.first_segment = pos.segment;
            }
        }
        self.release_segments();
        let files = self.store.reseal_files()?;
        tracing::info!(runs, files, "streams re-sealed under the current key");
        Ok((runs, files))
    }

    // ---- checkpoints (the plain snapshot contract) ----

    /// `checkpoint.put`: an idempotent upsert of a runtime's own snapshot.
    pub fn checkpoint_put(
        &self,
        run_id: &str,
        snapshot: &Map<String, Value>,
    ) -> Result<Value, StreamError> {
        validate_run_id(run_id)?;
        const FIELDS: &[&str] = &[
            "run_id",
            "thread_id",
            "upstream_model",
            "partial_text",
            "completed_tool_calls",
            "in_flight_tool",
            "updated_at_ms",
        ];
        if let Some(k) = snapshot.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(StreamError::SnapshotField {
                field: k.chars().take(40).collect(),
                fields: FIELDS.join(", "),
            });
        }
        if snapshot.get("run_id").is_some_and(|r| r != run_id) {
            return Err(StreamError::SnapshotRunId);
        }
        let mut snap = snapshot.clone();
        snap.insert("run_id".into(), run_id.into());
        snap.entry("updated_at_ms")
            .or_insert_with(|| now_ms().into());
        let snap = Value::Object(snap);
        self.store.put_checkpoint(run_id, &snap)?;
        Ok(json!({"run_id": run_id, "updated_at_ms": snap["updated_at_ms"]}))
    }

    /// `checkpoint.get`.
    pub fn checkpoint_get(&self, run_id: &str) -> Result<Value, StreamError> {
        validate_run_id(run_id)?;
        self.store
            .get_checkpoint(run_id)?
            .ok_or(StreamError::NoCheckpoint)
    }

    /// `checkpoint.delete`.
    pub fn checkpoint_delete(&self, run_id: &str) -> Result<bool, StreamError> {
        validate_run_id(run_id)?;
        self.store.delete_checkpoint(run_id)
    }

    /// The journal's counters.
    pub fn journal_stats(&self) -> &Stats {
        self.store.stats()
    }

    /// Where records queued now are kept (the journal's active segment).
    pub fn active_mark(&self) -> u64 {
        self.store.active_mark()
    }
}
