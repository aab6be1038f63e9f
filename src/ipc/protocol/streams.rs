//! `stream.*` and `checkpoint.*` on the wire: each method's params, read once from the
//! request's text, the results the handlers build, and the event notification.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::streams::{Event, EventIn, Str};

/// A `stream.*` or `checkpoint.*` call with its typed params.
#[derive(Debug)]
pub enum StreamCall {
    /// `stream.begin`.
    Begin(Begin),
    /// `stream.append`.
    Append(Append<'static>),
    /// `stream.interrupt`.
    Interrupt(Interrupt),
    /// `stream.resume`.
    Resume(Resume),
    /// `stream.commit`.
    Commit(Commit),
    /// `stream.abort`.
    Abort(Abort),
    /// `stream.subscribe`.
    Subscribe(Subscribe),
    /// `stream.get`.
    Get(RunOnly),
    /// `stream.list`.
    List(Nothing),
    /// `checkpoint.put`.
    CheckpointPut(CheckpointPut),
    /// `checkpoint.get`.
    CheckpointGet(RunOnly),
    /// `checkpoint.delete`.
    CheckpointDelete(RunOnly),
}

/// `stream.begin`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Begin {
    /// The run.
    pub run_id: String,
    /// The conversation it belongs to.
    #[serde(default)]
    pub thread_id: Option<String>,
    /// The model producing it.
    #[serde(default)]
    pub model: Option<String>,
    /// Replace a live producer (fencing it).
    #[serde(default)]
    pub takeover: bool,
}

/// `stream.append`: events `seq`, `seq + 1`, … of the holder `stream_id`.
///
/// Read from a request line, its ids borrow the line (no allocation for them per append);
/// [`Append::into_owned`] detaches it.
#[derive(Debug)]
pub struct Append<'a> {
    /// The run.
    pub run_id: Cow<'a, str>,
    /// The producer's holder id (from `stream.begin` or `stream.resume`).
    pub stream_id: Cow<'a, str>,
    /// The first event's sequence number.
    pub seq: u64,
    /// The events.
    pub events: Events,
}

impl Append<'_> {
    /// The same append, owning its ids (to outlive the request line).
    pub fn into_owned(self) -> Append<'static> {
        Append {
            run_id: Cow::Owned(self.run_id.into_owned()),
            stream_id: Cow::Owned(self.stream_id.into_owned()),
            seq: self.seq,
            events: self.events,
        }
    }
}

/// A `stream.append`'s events as read from the request.
#[derive(Debug)]
pub enum Events {
    /// Every event well formed, read straight from the request's text.
    Checked(Vec<Event>),
    /// Events the typed reader did not take: the streams check them and say which one is wrong,
    /// and how.
    Unchecked(Vec<Value>),
}

/// `stream.interrupt`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interrupt {
    /// The run.
    pub run_id: String,
    /// The holder reporting the break.
    pub stream_id: String,
    /// What broke (the recovery planner's input).
    pub cause: Value,
    /// How the producer continues the text after an R1/R3 plan (default `exact`).
    #[serde(default, deserialize_with = "continuation")]
    pub continuation: Option<crate::recovery::Continuation>,
}

/// `stream.resume`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// The run.
    pub run_id: String,
    /// The model that continues it.
    #[serde(default)]
    pub model: Option<String>,
    /// The conversation it belongs to.
    #[serde(default)]
    pub thread_id: Option<String>,
    /// Refuse (rather than plan) when the run's recovery state is stale.
    #[serde(default)]
    pub fail_on_stale: bool,
    /// How the new producer continues the text after an R1/R3 plan (default `exact`).
    #[serde(default, deserialize_with = "continuation")]
    pub continuation: Option<crate::recovery::Continuation>,
}

/// `continuation`: `"exact"`, `"restated"` or null, with a message that names the field and its
/// values for anything else.
fn continuation<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<crate::recovery::Continuation>, D::Error> {
    let v = Value::deserialize(d)?;
    crate::recovery::Continuation::from_json(Some(&v))
        .map(|c| (!v.is_null()).then_some(c))
        .map_err(serde::de::Error::custom)
}

/// `stream.commit`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Commit {
    /// The run.
    pub run_id: String,
    /// The holder committing.
    pub stream_id: String,
    /// The final message (required, not null).
    pub final_message: Value,
    /// Take the message's content from the streamed text.
    #[serde(default)]
    pub content_from_stream: bool,
}

/// `stream.abort`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Abort {
    /// The run.
    pub run_id: String,
    /// The holder aborting.
    pub stream_id: String,
    /// Why, for the log.
    #[serde(default)]
    pub reason: Option<String>,
}

/// `stream.subscribe`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subscribe {
    /// The run.
    pub run_id: String,
    /// Send the events after this seq (0: all).
    #[serde(default)]
    pub after_seq: u64,
}

/// `stream.get`, `checkpoint.get`, `checkpoint.delete`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunOnly {
    /// The run.
    pub run_id: String,
    /// `stream.get`: include the text (otherwise only its length and digest).
    #[serde(default)]
    pub reveal: bool,
}

/// `checkpoint.put`. Its `Debug` shows the snapshot's size, not its content.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointPut {
    /// The run.
    pub run_id: String,
    /// The agent's state to keep (sealed at rest).
    pub snapshot: Map<String, Value>,
}

impl std::fmt::Debug for CheckpointPut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointPut")
            .field("run_id", &self.run_id)
            .field("snapshot_fields", &self.snapshot.len())
            .finish()
    }
}

/// Params that must be empty.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nothing {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendValues {
    run_id: String,
    stream_id: String,
    seq: u64,
    events: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendIn<'a> {
    #[serde(borrow)]
    run_id: Str<'a>,
    #[serde(borrow)]
    stream_id: Str<'a>,
    seq: u64,
    events: CheckedEvents,
}

impl<'a> AppendIn<'a> {
    fn into_append(self) -> Append<'a> {
        Append {
            run_id: self.run_id.0,
            stream_id: self.stream_id.0,
            seq: self.seq,
            events: Events::Checked(self.events.0),
        }
    }
}

/// An append's events, each typed and checked as it is read ([`EventIn::into_event`]): one
/// `Vec`, sized for the single event most appends carry. An event that is not well formed fails
/// the whole read, and the caller reads the params the general way for its message.
struct CheckedEvents(Vec<Event>);

impl<'de> Deserialize<'de> for CheckedEvents {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = CheckedEvents;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of events")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<CheckedEvents, A::Error> {
                let mut events = Vec::with_capacity(seq.size_hint().unwrap_or(1).clamp(1, 16));
                while let Some(ev) = seq.next_element::<EventIn<'de>>()? {
                    let ev = ev
                        .into_event()
                        .ok_or_else(|| serde::de::Error::custom("an event is not well formed"))?;
                    events.push(ev);
                }
                Ok(CheckedEvents(events))
            }
        }
        d.deserialize_seq(Visit)
    }
}

/// `stream.append`'s params from their text: the events typed and checked when they are well
/// formed (no `serde_json::Value` per event), else kept as values for the streams to say
/// precisely what is wrong.
pub fn append_params(raw: &str) -> Result<Append<'static>, super::RpcError> {
    if let Ok(a) = serde_json::from_str::<AppendIn>(raw) {
        return Ok(a.into_append().into_owned());
    }
    let p: AppendValues = super::typed(raw)?;
    Ok(Append {
        run_id: Cow::Owned(p.run_id),
        stream_id: Cow::Owned(p.stream_id),
        seq: p.seq,
        events: Events::Unchecked(p.events),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendLine<'a> {
    #[serde(borrow)]
    jsonrpc: Str<'a>,
    id: Value,
    #[serde(borrow)]
    method: Str<'a>,
    #[serde(borrow)]
    params: AppendIn<'a>,
}

/// The hottest request read in one pass over its line: a well-formed `stream.append` (every
/// event well formed) straight into its typed params, without the envelope's pass. `None` for
/// any other line: the envelope reader takes it, and [`append_params`] says what is wrong.
pub fn read_append_line(line: &[u8]) -> Option<(super::Id, Append<'_>)> {
    const METHOD: &[u8] = b"\"stream.append\"";
    // Cheap on long lines of other methods: a SIMD substring search, built once.
    static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(METHOD));
    FINDER.find(line)?;
    let l: AppendLine = serde_json::from_slice(line).ok()?;
    if l.jsonrpc.0 != "2.0"
        || l.method.0 != "stream.append"
        || !matches!(l.id, Value::Number(_) | Value::String(_) | Value::Null)
    {
        return None;
    }
    Some((l.id, l.params.into_append()))
}

/// `stream.subscribe`'s result.
#[derive(Serialize)]
pub struct Subscribed<'a> {
    /// The subscription's number on this connection.
    pub subscription: u64,
    /// The run.
    pub run_id: &'a str,
    /// Events after this seq follow.
    pub after_seq: u64,
}

/// `checkpoint.delete`'s result.
#[derive(Serialize)]
pub struct Deleted {
    /// Whether there was a checkpoint.
    pub deleted: bool,
}

/// `stream.list`'s result.
#[derive(Serialize)]
pub struct Listing {
    /// The active runs (of those, the ones the connection's grant covers).
    pub runs: Vec<Value>,
    /// The journal's counters; `null` for a grant limited to some runs (they count every
    /// run's appends).
    pub journal: Option<JournalStats>,
}

/// The journal's counters in `stream.list`.
#[derive(Serialize)]
pub struct JournalStats {
    /// Appends made durable.
    pub appends: u64,
    /// Group commits (one write each).
    pub batches: u64,
    /// fdatasyncs.
    pub syncs: u64,
    /// The segment being appended to.
    pub active_segment: u64,
}

/// A `stream.subscribe` event notification: one event of the run, as stored.
#[derive(Serialize)]
pub struct EventNote<'a> {
    /// The subscription.
    pub subscription: u64,
    /// The run.
    pub run_id: &'a str,
    /// The event's sequence number.
    pub seq: u64,
    /// The event's JSON, written as stored.
    pub event: &'a RawValue,
}
