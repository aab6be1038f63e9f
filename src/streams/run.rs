//! One run's state in memory: its holder (epoch, stream id), status, seq counter, events and
//! accumulator, recovery counters and subscribers. No file, no journal, no connection: the
//! service (`service.rs`) applies changes to a run and hands the records that describe them to
//! the store (`store.rs`); replay applies the same records through the same code.

use std::sync::Arc;

use serde_json::{json, Value};

use super::accum::Accumulator;
use super::error::StreamError;
use super::feed;
use super::record::{self, Record};
use super::store::RunTail;
use crate::durable::journal::Promise;
use crate::recovery::{Attempts, Cause, Plan, PlanKind};
use crate::timefmt::now_ms;

pub(super) fn new_stream_id() -> String {
    let mut b = [0u8; 12];
    if getrandom::fill(&mut b).is_err() {
        b[..8].copy_from_slice(&now_ms().to_le_bytes());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A number no other run copy of this process has.
fn next_copy() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The cause an `interrupted` event names when the daemon saw the producer's connection close
/// without a commit or abort (not a planner cause: no plan is made until a producer resumes).
pub const LOST_CAUSE: &str = "producer_lost";

/// Where a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// A producer holds it and may append.
    Streaming,
    /// Interrupted; the plan says what next (the producer continues, or a new one resumes).
    Interrupted,
    /// The recovery plan was `fail`: kept for inspection until aborted or pruned.
    Failed,
}

impl Status {
    /// Its name on the wire and in the PostgreSQL backend's rows.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Streaming => "streaming",
            Status::Interrupted => "interrupted",
            Status::Failed => "failed",
        }
    }
}

/// A published event as its JSON text: serialized once when it joins the run, shared by every
/// subscriber and snapshot (a `Value` per event cost ~10x the text it carried).
pub type EventJson = Arc<serde_json::value::RawValue>;

/// `v` as [`EventJson`].
pub(super) fn event_json(v: &Value) -> EventJson {
    // Serializing a `Value` cannot fail; the fallback is never reached.
    serde_json::value::to_raw_value(v)
        .map(Arc::from)
        .unwrap_or_else(|_| Arc::from(serde_json::value::RawValue::NULL.to_owned()))
}

/// A live subscriber: events (seq, event) until `finish`, bounded ([`feed`]).
pub(super) type Subscriber = feed::FeedTx;

pub(super) struct Run {
    /// Shared with the tickets of its records (no copy of the id per append).
    pub(super) run_id: Arc<str>,
    pub(super) thread_id: Option<String>,
    pub(super) model: Option<String>,
    pub(super) epoch: u64,
    pub(super) stream_id: String,
    pub(super) status: Status,
    /// The next seq the producer must use.
    pub(super) next_seq: u64,
    /// The run's published-or-pending events in seq order, from position `events_base` on.
    /// On files, the latest window of them (`service/window.rs`: older ones are derived from
    /// the journal for a subscriber that asks); on a shared store, whose subscribers read
    /// events from the store, only those not yet handed to it.
    pub(super) events: Vec<(u64, EventJson)>,
    /// The position of `events[0]` among all the run's events; `published` and `queued`
    /// count positions from the run's first event.
    pub(super) events_base: usize,
    /// How many of `events` were handed to the store with a record (a shared store writes
    /// them in the record's transaction).
    pub(super) queued: usize,
    /// Records queued for the run (a shared store's fence: the version the next record
    /// follows).
    pub(super) version: u64,
    /// Which copy of the run this is: a run loaded again (after a failed write dropped it) is
    /// a new copy, whose writes a shared store's committer must not fail for the old one's.
    pub(super) copy: u64,
    /// Whether this daemon gave the run its holder (a begin or resume here), rather than
    /// loading a copy of another's from a shared store.
    pub(super) held_here: bool,
    /// How many of `events` are durable and published. By position, not seq: text the overlap
    /// trimmer held back joins `events` later than its seq became durable.
    pub(super) published: usize,
    /// `end()` is writing the state file: every other operation waits its outcome (refused).
    pub(super) ending: bool,
    /// The promise of the run's last queued record: a replayed append is answered when it is
    /// kept (the original may not be durable yet).
    pub(super) last: Option<Arc<Promise>>,
    pub(super) acc: Accumulator,
    pub(super) attempts: Attempts,
    pub(super) stall_history: Vec<Option<String>>,
    pub(super) last_plan: Option<Value>,
    pub(super) created_at_ms: u64,
    pub(super) updated_at_ms: u64,
    /// The oldest journal segment holding one of its records.
    pub(super) first_segment: u64,
    pub(super) subscribers: Vec<Subscriber>,
    /// Since when no connection holds the run (its producer was lost, or the daemon started
    /// without it): past `[streams] orphan_timeout_s` it ends as `abandoned`. `None` while a
    /// producer holds it, or for a run no connection ever held here (a shared store's copy).
    pub(super) unattached_since: Option<u64>,
}

impl Run {
    /// A run seen for the first time (its `begin` sets the holder).
    pub(super) fn new(run_id: &str, at: u64, mark: u64) -> Run {
        Run {
            run_id: Arc::from(run_id),
            thread_id: None,
            model: None,
            epoch: 0,
            stream_id: String::new(),
            status: Status::Streaming,
            next_seq: 1,
            events: Vec::new(),
            events_base: 0,
            queued: 0,
            version: 0,
            copy: next_copy(),
            held_here: false,
            published: 0,
            ending: false,
            last: None,
            acc: Accumulator::default(),
            attempts: Attempts::default(),
            stall_history: Vec::new(),
            last_plan: None,
            created_at_ms: at,
            updated_at_ms: at,
            first_segment: mark,
            subscribers: Vec::new(),
            unattached_since: None,
        }
    }

    /// A new holder (a `begin` record, live or replayed): its epoch and stream id; the thread
    /// and model it gave replace the run's.
    pub(super) fn begin(
        &mut self,
        epoch: u64,
        stream_id: &str,
        thread_id: Option<String>,
        model: Option<String>,
        at: u64,
        mark: u64,
    ) {
        self.epoch = epoch;
        self.stream_id = stream_id.to_owned();
        self.status = Status::Streaming;
        // A new holder: the connection that made it attaches next (`Streams::attach`).
        self.unattached_since = None;
        if thread_id.is_some() {
            self.thread_id = thread_id;
        }
        if model.is_some() {
            self.model = model;
        }
        self.updated_at_ms = at;
        self.first_segment = self.first_segment.min(mark);
    }

    /// Fencing: only the current holder (`stream_id`) may change the run, and nobody while it
    /// is ending (its state file being written).
    pub(super) fn check_holder(&self, stream_id: &str) -> Result<(), StreamError> {
        if self.stream_id.is_empty() {
            // A lost producer's stream id was retired (`apply_lost`): nobody holds the run.
            return Err(StreamError::ProducerLost);
        }
        if self.stream_id != stream_id {
            return Err(StreamError::NotHolder { epoch: self.epoch });
        }
        if self.ending {
            return Err(StreamError::Ending);
        }
        Ok(())
    }

    /// The producer was lost (live and on replay of a `lost` record): what the trimmer holds is
    /// decided, `interrupted` (cause `producer_lost`) is published, and the stream id is
    /// retired, so the lost producer's later appends are refused instead of read as replays
    /// of seqs the event took; a `stream.resume` takes the run on. Returns the event.
    pub(super) fn apply_lost(&mut self, at: u64) -> (u64, Value) {
        let held = self.acc.flush_trim();
        self.push_events(held);
        let seq = self.next_seq;
        let ev = json!({"type": "interrupted", "cause": LOST_CAUSE, "plan": null,
                        "wait_ms": null, "hint": null});
        self.next_seq += 1;
        self.events.push((seq, event_json(&ev)));
        self.stream_id.clear();
        self.status = Status::Interrupted;
        self.updated_at_ms = at;
        self.unattached_since = Some(at);
        (seq, ev)
    }

    /// Apply a plan to the run (live and on replay): its events numbered, the accumulator,
    /// counters, stall history and status updated. Returns the events and the plan as answered.
    pub(super) fn apply_plan(
        &mut self,
        plan: &Plan,
        cause: &Cause,
        at: u64,
    ) -> (Vec<(u64, Value)>, Value) {
        let mut events = Vec::new();
        for e in &plan.events {
            events.push((self.next_seq, e.clone()));
            self.next_seq += 1;
        }
        let mut plan_json = plan.to_json();
        events.push((
            self.next_seq,
            json!({"type": "interrupted", "cause": cause.as_str(), "plan": plan.plan.as_str(),
                   "wait_ms": plan.wait_ms, "hint": plan_json["hint"]}),
        ));
        self.next_seq += 1;
        self.acc.apply_plan(plan);
        self.attempts = plan.attempts;
        self.stall_history.push(plan.stalled_tool.clone());
        self.status = if plan.plan == PlanKind::Fail {
            Status::Failed
        } else {
            Status::Interrupted
        };
        self.updated_at_ms = at;
        plan_json["events_published"] = json!(events.iter().map(|(s, _)| s).collect::<Vec<_>>());
        self.last_plan = Some(plan_json.clone());
        self.events
            .extend(events.iter().map(|(s, e)| (*s, event_json(e))));
        (events, plan_json)
    }

    pub(super) fn summary(&self) -> Value {
        json!({
            "run_id": &*self.run_id,
            "thread_id": self.thread_id,
            "model": self.model,
            "status": self.status,
            "epoch": self.epoch,
            "next_seq": self.next_seq,
            "attempts": self.attempts,
            "stall_streak": self.stall_streak(),
            "text_chars": self.acc.text.chars().count(),
            "tool_calls": self.acc.calls.len(),
            "trimmed_chars": self.acc.trimmed_chars,
            "created_at_ms": self.created_at_ms,
            "updated_at_ms": self.updated_at_ms,
            "last_plan": self.last_plan.as_ref().map(|p| json!({
                "plan": p["plan"], "cause": p["cause"], "wait_ms": p["wait_ms"]})),
            // Since when no connection holds it (its producer was lost, or the daemon started
            // without it): it ends as `abandoned` `[streams] orphan_timeout_s` after this.
            "no_producer_since_ms": self.unattached_since,
        })
    }

    /// Interruptions in a row that ended on the same unfinished tool.
    pub(super) fn stall_streak(&self) -> usize {
        match self.stall_history.last() {
            Some(Some(tool)) => self
                .stall_history
                .iter()
                .rev()
                .take_while(|t| t.as_deref() == Some(tool.as_str()))
                .count(),
            _ => 0,
        }
    }

    pub(super) fn checkpoint(&self) -> Value {
        let mut snap = self.acc.snapshot();
        snap["run_id"] = self.run_id.as_ref().into();
        snap["thread_id"] = json!(self.thread_id);
        snap["upstream_model"] = json!(self.model);
        snap["updated_at_ms"] = self.updated_at_ms.into();
        snap
    }

    /// Everything the run is, for a `snap` record (which replaces all earlier records of the
    /// run on replay).
    /// A `snap` record carrying `events` as the run's whole event list (memory may hold only
    /// the latest: see `service/window.rs`).
    pub(super) fn snapshot_with(&self, events: Vec<(u64, EventJson)>) -> Record {
        Record::Snapshot(Box::new(record::Snapshot {
            run: self.run_id.to_string(),
            thread: self.thread_id.clone(),
            model: self.model.clone(),
            epoch: self.epoch,
            sid: self.stream_id.clone(),
            status: self.status,
            next_seq: self.next_seq,
            events,
            acc: self.acc.clone(),
            attempts: self.attempts,
            stall: self.stall_history.clone(),
            last_plan: self.last_plan.clone(),
            created: self.created_at_ms,
            updated: self.updated_at_ms,
        }))
    }

    /// A run back from a `snap` record.
    pub(super) fn from_snapshot(r: record::Snapshot, segment: u64) -> Run {
        Run {
            run_id: Arc::from(r.run),
            thread_id: r.thread,
            model: r.model,
            epoch: r.epoch,
            stream_id: r.sid,
            status: r.status,
            next_seq: r.next_seq,
            published: r.events.len(),
            queued: r.events.len(),
            events_base: 0,
            version: 0,
            copy: next_copy(),
            held_here: false,
            events: r.events,
            last: None,
            ending: false,
            acc: r.acc,
            attempts: r.attempts,
            stall_history: r.stall,
            last_plan: r.last_plan,
            created_at_ms: r.created,
            updated_at_ms: r.updated,
            first_segment: segment,
            subscribers: Vec::new(),
            unattached_since: None,
        }
    }

    /// What a record queued now changes beside itself (see [`RunTail`]): `events` are the
    /// run's events not yet handed to the store.
    pub(super) fn tail(&self) -> RunTail<'_> {
        RunTail {
            run: &self.run_id,
            from_version: self.version,
            epoch: self.epoch,
            sid: &self.stream_id,
            status: self.status,
            next_seq: self.next_seq,
            thread: self.thread_id.as_deref(),
            model: self.model.as_deref(),
            created_ms: self.created_at_ms,
            updated_ms: self.updated_at_ms,
            first_pos: self.queued as u64,
            copy: self.copy,
            events: self.events_since(self.queued),
        }
    }

    /// The position after the run's last event.
    pub(super) fn end_pos(&self) -> usize {
        self.events_base + self.events.len()
    }

    /// The events from position `pos` on (those still in memory).
    pub(super) fn events_since(&self, pos: usize) -> &[(u64, EventJson)] {
        let i = pos.saturating_sub(self.events_base).min(self.events.len());
        &self.events[i..]
    }

    /// The events at positions `from..to` (those still in memory).
    pub(super) fn events_between(&self, from: usize, to: usize) -> &[(u64, EventJson)] {
        &self.events[self.index_range(from, to)]
    }

    /// Where positions `from..to` are in `events` (what memory still has of them).
    pub(super) fn index_range(&self, from: usize, to: usize) -> std::ops::Range<usize> {
        let rel = |p: usize| p.saturating_sub(self.events_base).min(self.events.len());
        let (a, b) = (rel(from), rel(to));
        a.min(b)..b
    }

    /// Drop the events before position `pos` from memory (a shared store holds them).
    pub(super) fn forget_events_before(&mut self, pos: usize) {
        let n = pos.saturating_sub(self.events_base).min(self.events.len());
        self.events.drain(..n);
        self.events_base += n;
    }

    /// Add daemon or producer events (already seq-numbered) to the run.
    pub(super) fn push_events(&mut self, out: Vec<(u64, EventJson)>) {
        self.events.extend(out);
    }
}
