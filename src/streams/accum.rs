//! The accumulator of one run: the text so far across every attempt, the tool calls as
//! streamed, and the overlap trimmer that drops a continuation's repeat of the prefix.
//!
//! It is a deterministic function of the run's events in seq order, so replaying the journal at
//! start-up rebuilds exactly the state (and the trimmed text) that live appends produced.

use std::borrow::Cow;

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Value};

use super::run::EventJson;
use crate::recovery::{Continuation, Plan, PlanKind, ToolCall};

/// Shortest repeat of the prefix's tail that is trimmed (shorter coincidences are left alone).
pub const MIN_OVERLAP_CHARS: usize = 3;
/// How much of the prefix's tail a continuation is compared with.
const TRIM_WINDOW_CHARS: usize = 256;

/// One tool call as streamed so far.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CallAcc {
    /// Call id.
    pub id: String,
    /// Tool name (from the first delta that had one).
    pub name: String,
    /// Argument text so far.
    pub arguments: String,
    /// A `tool_call_end` arrived.
    pub ended: bool,
}

/// A validated producer event.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Assistant text.
    Text(String),
    /// Part of a tool call.
    ToolDelta {
        /// Call id.
        id: String,
        /// Tool name, on the delta that carries it.
        name: Option<String>,
        /// More argument text.
        arguments_delta: String,
    },
    /// A tool call's arguments are complete.
    ToolEnd {
        /// Call id.
        id: String,
    },
}

/// Cap on one event's text (a delta, not a document).
pub const MAX_EVENT_TEXT: usize = 256 * 1024;

/// Most bytes a run's text and tool-call arguments may take as JSON: what a commit writes
/// (the state holds them, and the final message built from the stream a copy of the text,
/// beside up to a frame of the committer's own fields), sealed (4/3), must fit one journal
/// record and one state file ([`crate::limits::MAX_PAYLOAD`], 12 MiB). An append past it is
/// refused, before anything is written: every run the daemon accepted can be committed.
pub const MAX_RUN_CONTENT_BYTES: usize = 3 * 1024 * 1024;

/// `s`'s length as a JSON string's contents (serde_json's escapes: two bytes for `"`, `\\`
/// and the short control escapes, six for other control characters).
pub fn json_len(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

impl Event {
    /// What the event adds to its run's content, as JSON ([`MAX_RUN_CONTENT_BYTES`]).
    pub fn content_len(&self) -> usize {
        match self {
            Event::Text(t) => json_len(t),
            Event::ToolDelta {
                arguments_delta, ..
            } => json_len(arguments_delta),
            Event::ToolEnd { .. } => 0,
        }
    }

    /// Parse a producer event (`{"type": "text", "text"}`, `{"type": "tool_call_delta", "id",
    /// "name"?, "arguments_delta"}`, `{"type": "tool_call_end", "id"}`).
    pub fn parse(v: &Value) -> Result<Event, EventError> {
        // JSON null reads as absent; any other non-string as "present, not a string".
        let field = |k: &str| match v.get(k) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(Ok(Cow::Borrowed(s.as_str()))),
            Some(_) => Some(Err(NotAString)),
        };
        let present: Vec<&str> = v
            .as_object()
            .map(|o| {
                o.keys()
                    .map(String::as_str)
                    .filter(|k| *k != "type")
                    .collect()
            })
            .unwrap_or_default();
        event_from(
            v.get("type").and_then(Value::as_str),
            &present,
            field("text"),
            field("id"),
            field("name"),
            field("arguments_delta"),
        )
    }

    /// The event as published.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl Event {
    /// A text event's published form.
    fn serialize_text<S: Serializer>(t: &str, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("type", "text")?;
        m.serialize_entry("text", t)?;
        m.end()
    }
}

/// The published form (`to_json`), written straight into a record without a `Value`.
impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Event::Text(t) => Event::serialize_text(t, s),
            Event::ToolDelta {
                id,
                name,
                arguments_delta,
            } => {
                let mut m = s.serialize_map(Some(3 + usize::from(name.is_some())))?;
                m.serialize_entry("type", "tool_call_delta")?;
                m.serialize_entry("id", id)?;
                m.serialize_entry("arguments_delta", arguments_delta)?;
                if let Some(n) = name {
                    m.serialize_entry("name", n)?;
                }
                m.end()
            }
            Event::ToolEnd { id } => {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("type", "tool_call_end")?;
                m.serialize_entry("id", id)?;
                m.end()
            }
        }
    }
}

/// A JSON string borrowed from the request line where it has no escapes. Unlike
/// `Option<String>`, a `null` is refused rather than read as absent: [`EventIn`] must accept
/// only what [`Event::parse`] accepts, to the byte.
pub struct Str<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

fn present<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Option<Str<'a>>, D::Error> {
    Str::deserialize(d).map(Some)
}

/// An event read straight from a `stream.append` line (no `serde_json::Value` in between):
/// the fast path. It takes only well-formed events, each field a string; anything else
/// (`null`s, unknown fields, bad lengths) goes the slow way, where [`Event::parse`] says
/// precisely what is wrong.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventIn<'a> {
    #[serde(rename = "type", borrow)]
    kind: Str<'a>,
    #[serde(default, borrow, deserialize_with = "present")]
    text: Option<Str<'a>>,
    #[serde(default, borrow, deserialize_with = "present")]
    id: Option<Str<'a>>,
    #[serde(default, borrow, deserialize_with = "present")]
    name: Option<Str<'a>>,
    #[serde(default, borrow, deserialize_with = "present")]
    arguments_delta: Option<Str<'a>>,
}

impl<'a> EventIn<'a> {
    /// The event, if [`Event::parse`] would accept the same JSON: the same rules
    /// ([`event_from`]); a refusal here only sends the line the slow way, for its message.
    pub fn into_event(self) -> Option<Event> {
        // The fields present, on the stack (this runs for every event of every append).
        let mut present = [""; 4];
        let mut n = 0;
        for (k, f) in [
            ("text", &self.text),
            ("id", &self.id),
            ("name", &self.name),
            ("arguments_delta", &self.arguments_delta),
        ] {
            if f.is_some() {
                present[n] = k;
                n += 1;
            }
        }
        let present = &present[..n];
        fn ok(f: Option<Str<'_>>) -> Field<'_> {
            f.map(|s| Ok(s.0))
        }
        event_from(
            Some(&self.kind.0),
            present,
            ok(self.text),
            ok(self.id),
            ok(self.name),
            ok(self.arguments_delta),
        )
        .ok()
    }
}

/// A field present with a value that is neither a string nor null.
struct NotAString;

/// An event field as read: absent (or null), a string, or something else.
type Field<'a> = Option<Result<Cow<'a, str>, NotAString>>;

/// Why a producer event does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// No `type`, or not one of the three.
    #[error("each event needs a type: text, tool_call_delta or tool_call_end")]
    NoType,
    /// A field its type does not have.
    #[error("unknown field {field:?} in a {kind} event")]
    UnknownField {
        /// The field (at most 40 characters of it).
        field: String,
        /// The event's type.
        kind: &'static str,
    },
    /// A text longer than allowed.
    #[error("{field} is over {MAX_EVENT_TEXT} bytes")]
    TooLong {
        /// `text` or `arguments_delta`.
        field: &'static str,
    },
    /// A required text missing, or not a string.
    #[error("{field} (a string) is required")]
    Required {
        /// `text` or `arguments_delta`.
        field: &'static str,
    },
    /// A tool call's id missing, empty, too long or not a string.
    #[error("id (a non-empty string of at most 256 bytes) is required")]
    CallId,
    /// A tool's name too long or not a string.
    #[error("name must be a string of at most 256 bytes")]
    Name,
}

/// A tool-call event that does not fit the calls so far.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// A delta or end for a call that has ended.
    #[error("tool call {id:?} already ended")]
    Ended {
        /// The call.
        id: String,
    },
    /// An end for a call never started.
    #[error("tool_call_end for unknown call {id:?}")]
    Unknown {
        /// The call.
        id: String,
    },
}

impl CallError {
    /// This error at `index` in a request's events.
    pub fn at(self, index: usize) -> BatchError {
        BatchError { index, error: self }
    }
}

/// A batch of events that does not fit the run: which event, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("events[{index}]: {error}")]
pub struct BatchError {
    /// The event's index in the request.
    pub index: usize,
    /// What is wrong.
    pub error: CallError,
}

/// The rules of a producer event, in one place for both readers ([`Event::parse`] and the
/// socket's fast path, [`EventIn`]): the type, the fields each type takes (`present`: every
/// field given besides `type`), and their bounds.
fn event_from(
    kind: Option<&str>,
    present: &[&str],
    text: Field<'_>,
    id: Field<'_>,
    name: Field<'_>,
    arguments_delta: Field<'_>,
) -> Result<Event, EventError> {
    let allowed: &[&str] = match kind {
        Some("text") => &["text"],
        Some("tool_call_delta") => &["id", "name", "arguments_delta"],
        Some("tool_call_end") => &["id"],
        _ => return Err(EventError::NoType),
    };
    if let Some(k) = present.iter().find(|k| !allowed.contains(k)) {
        return Err(EventError::UnknownField {
            field: k.chars().take(40).collect(),
            kind: match kind {
                Some("text") => "text",
                Some("tool_call_delta") => "tool_call_delta",
                _ => "tool_call_end",
            },
        });
    }
    let bounded = |field: &'static str, f: Field<'_>| match f {
        Some(Ok(s)) if s.len() <= MAX_EVENT_TEXT => Ok(s.into_owned()),
        Some(Ok(_)) => Err(EventError::TooLong { field }),
        _ => Err(EventError::Required { field }),
    };
    let call_id = |f: Field<'_>| match f {
        Some(Ok(s)) if !s.is_empty() && s.len() <= 256 => Ok(s.into_owned()),
        _ => Err(EventError::CallId),
    };
    match kind {
        Some("text") => Ok(Event::Text(bounded("text", text)?)),
        Some("tool_call_delta") => {
            let name = match name {
                None => None,
                Some(Ok(n)) if n.len() <= 256 => Some(n.into_owned()),
                _ => return Err(EventError::Name),
            };
            let arguments_delta = match arguments_delta {
                None => String::new(),
                given => bounded("arguments_delta", given)?,
            };
            Ok(Event::ToolDelta {
                id: call_id(id)?,
                name,
                arguments_delta,
            })
        }
        _ => Ok(Event::ToolEnd { id: call_id(id)? }),
    }
}

/// The trimmer's state after an R1/R3 plan: text held back until it is clear how much of it
/// repeats the prefix's tail.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct Trim {
    tail: String,
    /// Held events: (seq, text).
    held: Vec<(u64, String)>,
}

impl Trim {
    fn held_text(&self) -> String {
        self.held.iter().map(|(_, t)| t.as_str()).collect()
    }
}

/// The run's accumulated state.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Accumulator {
    /// All published assistant text of this turn, across attempts.
    pub text: String,
    /// Tool calls in order of first appearance.
    pub calls: Vec<CallAcc>,
    trim: Option<Trim>,
    /// Characters dropped by overlap trimming so far.
    pub trimmed_chars: usize,
    /// The run's content as JSON bytes ([`MAX_RUN_CONTENT_BYTES`]), counted once when first
    /// needed and then by each append (what trimming or a plan takes away is not taken off:
    /// the count only ever errs high).
    #[serde(skip)]
    content_bytes: Option<usize>,
}

/// Longest k (in chars, ≥ MIN_OVERLAP_CHARS, on char boundaries) with `tail` ending in the first
/// k chars of `cont`; 0 if none.
fn overlap(tail: &str, cont: &str) -> usize {
    let bounds: Vec<usize> = cont
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(cont.len()))
        .collect();
    for (chars, &b) in bounds.iter().enumerate().rev() {
        if chars < MIN_OVERLAP_CHARS {
            break;
        }
        if tail.ends_with(&cont[..b]) {
            return b;
        }
    }
    0
}

/// A text event as published, `{"type":"text","text":…}`, serialized from the borrowed text.
struct TextRef<'a>(&'a str);

impl Serialize for TextRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Event::serialize_text(self.0, s)
    }
}

/// An event's published JSON text, serialized straight from its fields: the hot path of an
/// append builds no `Value` per event (with many events per append it was the daemon's top
/// symbol, docs/benchmarks.md).
fn published(ev: &impl Serialize) -> EventJson {
    // Serializing strings and maps into a string cannot fail; the fallback is never reached.
    serde_json::value::to_raw_value(ev)
        .map(std::sync::Arc::from)
        .unwrap_or_else(|_| std::sync::Arc::from(serde_json::value::RawValue::NULL.to_owned()))
}

impl Accumulator {
    /// The run's content as JSON bytes (see `content_bytes`).
    pub fn content_bytes(&mut self) -> usize {
        if let Some(n) = self.content_bytes {
            return n;
        }
        let n = json_len(&self.text)
            + self
                .calls
                .iter()
                .map(|c| json_len(&c.arguments))
                .sum::<usize>();
        self.content_bytes = Some(n);
        n
    }

    /// Count `n` more content bytes (an append accepted).
    pub fn add_content(&mut self, n: usize) {
        let now = self.content_bytes();
        self.content_bytes = Some(now.saturating_add(n));
    }

    /// Apply one accepted event (seq `seq`); returns the events to publish now, in order
    /// (text may be held back by the trimmer and released later, shortened).
    pub fn apply(&mut self, seq: u64, ev: &Event) -> Result<Vec<(u64, EventJson)>, CallError> {
        let mut out = Vec::new();
        self.apply_into(seq, ev, &mut out)?;
        Ok(out)
    }

    /// [`Accumulator::apply`], adding the events to publish to `out` (an append adds them to
    /// its run's events directly: no `Vec` per event). On an error `out` may have grown: the
    /// caller takes it back.
    pub fn apply_into(
        &mut self,
        seq: u64,
        ev: &Event,
        out: &mut Vec<(u64, EventJson)>,
    ) -> Result<(), CallError> {
        match ev {
            Event::Text(t) => {
                self.text_event(seq, t, out);
                Ok(())
            }
            Event::ToolDelta {
                id,
                name,
                arguments_delta,
            } => {
                self.flush_trim_into(out);
                let call = match self.calls.iter_mut().find(|c| c.id == *id) {
                    Some(c) => c,
                    None => {
                        self.calls.push(CallAcc {
                            id: id.clone(),
                            ..CallAcc::default()
                        });
                        self.calls
                            .last_mut()
                            .ok_or_else(|| CallError::Unknown { id: id.clone() })?
                    }
                };
                if call.ended {
                    return Err(CallError::Ended { id: id.clone() });
                }
                if let Some(n) = name {
                    if call.name.is_empty() {
                        call.name = n.clone();
                    }
                }
                call.arguments.push_str(arguments_delta);
                out.push((seq, published(ev)));
                Ok(())
            }
            Event::ToolEnd { id } => {
                self.flush_trim_into(out);
                let call = self
                    .calls
                    .iter_mut()
                    .find(|c| c.id == *id)
                    .ok_or_else(|| CallError::Unknown { id: id.clone() })?;
                call.ended = true;
                out.push((seq, published(ev)));
                Ok(())
            }
        }
    }

    /// Check a batch of events, in order, against the state without applying any: a batch is
    /// taken whole or not at all (a call may start and end within one batch).
    pub fn check_batch(&self, events: &[Event]) -> Result<(), BatchError> {
        // Calls the batch touches: id -> ended (None: unknown before the batch).
        let mut seen: std::collections::HashMap<&str, bool> = std::collections::HashMap::new();
        for (i, ev) in events.iter().enumerate() {
            let state = |id: &str, seen: &std::collections::HashMap<&str, bool>| {
                seen.get(id)
                    .copied()
                    .or_else(|| self.calls.iter().find(|c| c.id == id).map(|c| c.ended))
            };
            match ev {
                Event::Text(_) => {}
                Event::ToolDelta { id, .. } => {
                    if state(id, &seen) == Some(true) {
                        return Err(CallError::Ended { id: id.clone() }.at(i));
                    }
                    seen.insert(id, false);
                }
                Event::ToolEnd { id } => match state(id, &seen) {
                    None => return Err(CallError::Unknown { id: id.clone() }.at(i)),
                    Some(true) => return Err(CallError::Ended { id: id.clone() }.at(i)),
                    Some(false) => {
                        seen.insert(id, true);
                    }
                },
            }
        }
        Ok(())
    }

    fn text_event(&mut self, seq: u64, t: &str, out: &mut Vec<(u64, EventJson)>) {
        let Some(trim) = &mut self.trim else {
            self.text.push_str(t);
            out.push((seq, published(&TextRef(t))));
            return;
        };
        trim.held.push((seq, t.to_owned()));
        let held = trim.held_text();
        // Still possibly a repeat of the tail (a substring of it, shorter than it)? Hold.
        if held.chars().count() < trim.tail.chars().count() && trim.tail.contains(held.as_str()) {
            return;
        }
        self.flush_trim_into(out)
    }

    /// The text subscribers will have been shown once the trimmer decides on what it holds:
    /// `text`, plus the held text less its repeat of the tail — what [`Self::flush_trim`]
    /// publishes — without changing anything (the commit stores it before the decision is made).
    pub fn text_when_flushed(&self) -> String {
        let mut text = self.text.clone();
        if let Some(trim) = &self.trim {
            let held = trim.held_text();
            text.push_str(&held[overlap(&trim.tail, &held)..]);
        }
        text
    }

    /// Decide on held text: drop the longest repeat of the prefix's tail, publish the rest.
    pub fn flush_trim(&mut self) -> Vec<(u64, EventJson)> {
        let mut out = Vec::new();
        self.flush_trim_into(&mut out);
        out
    }

    /// [`Accumulator::flush_trim`], adding to `out`.
    fn flush_trim_into(&mut self, out: &mut Vec<(u64, EventJson)>) {
        let Some(trim) = self.trim.take() else {
            return;
        };
        let held = trim.held_text();
        let mut drop_bytes = overlap(&trim.tail, &held);
        self.trimmed_chars += held[..drop_bytes].chars().count();
        for (seq, t) in trim.held {
            let cut = drop_bytes.min(t.len());
            drop_bytes -= cut;
            let rest = &t[cut..];
            if !rest.is_empty() {
                self.text.push_str(rest);
                out.push((seq, published(&TextRef(rest))));
            }
        }
    }

    /// The tool calls as the planner sees them.
    pub fn tool_calls(&self) -> Vec<ToolCall> {
        self.calls
            .iter()
            .map(|c| ToolCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect()
    }

    /// Apply a recovery plan: R4 discards the turn; R2/R3 drop the cancelled calls; an R1/R3
    /// plan whose continuation is `restated` arms the overlap trimmer with the prefix's tail
    /// (an `exact` one continues the text as it comes: nothing is held, nothing removed).
    pub fn apply_plan(&mut self, plan: &Plan) {
        match plan.plan {
            PlanKind::R4 => {
                self.text.clear();
                self.calls.clear();
            }
            PlanKind::R2 | PlanKind::R3 => {
                self.calls
                    .retain(|c| !plan.cancelled.iter().any(|x| x.id == c.id));
            }
            PlanKind::R1 | PlanKind::Fail => {}
        }
        // A plan replaces whatever an earlier one armed (its held text was decided before).
        self.trim = None;
        if matches!(plan.plan, PlanKind::R1 | PlanKind::R3)
            && plan.continuation == Some(Continuation::Restated)
            && !self.text.is_empty()
        {
            let start = self
                .text
                .char_indices()
                .rev()
                .nth(TRIM_WINDOW_CHARS - 1)
                .map_or(0, |(i, _)| i);
            self.trim = Some(Trim {
                tail: self.text[start..].to_owned(),
                held: Vec::new(),
            });
        }
    }

    /// The plain snapshot of RECOVERY-RULES.md / `checkpoint.get`.
    pub fn snapshot(&self) -> Value {
        let completed: Vec<Value> = self
            .tool_calls()
            .iter()
            .filter_map(|c| {
                c.completed_arguments()
                    .map(|_| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
            })
            .collect();
        let in_flight = self
            .tool_calls()
            .into_iter()
            .rfind(|c| c.completed_arguments().is_none())
            .map(|c| json!({"id": c.id, "name": c.name, "partial_args": c.arguments}));
        json!({
            "partial_text": self.text,
            "completed_tool_calls": completed,
            "in_flight_tool": in_flight,
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The fast path accepts a subset of what `Event::parse` accepts and, where it accepts,
    /// gives the same event; the published form is what `to_json` always produced.
    #[test]
    fn fast_event_reading_agrees_with_parse() {
        let long = "x".repeat(MAX_EVENT_TEXT + 1);
        let name_257 = "n".repeat(257);
        let cases = [
            r#"{"type":"text","text":"hello"}"#.to_string(),
            r#"{"type":"text","text":"line\nbreak \u00e9 \"q\""}"#.into(),
            r#"{"type":"text","text":""}"#.into(),
            r#"{"text":"hi","type":"text"}"#.into(),
            r#"{"type":"text"}"#.into(),
            r#"{"type":"text","text":null}"#.into(),
            r#"{"type":"text","text":5}"#.into(),
            r#"{"type":"text","text":"a","name":null}"#.into(),
            r#"{"type":"text","text":"a","extra":1}"#.into(),
            r#"{"type":"text","text":"a","type":"text"}"#.into(),
            format!(r#"{{"type":"text","text":"{long}"}}"#),
            r#"{"type":"tool_call_delta","id":"c1","name":"search","arguments_delta":"{\"q\":"}"#
                .into(),
            r#"{"type":"tool_call_delta","id":"c1","arguments_delta":"1"}"#.into(),
            r#"{"type":"tool_call_delta","id":"c1"}"#.into(),
            r#"{"type":"tool_call_delta","id":"c1","name":null,"arguments_delta":null}"#.into(),
            r#"{"type":"tool_call_delta","id":"","arguments_delta":"1"}"#.into(),
            r#"{"type":"tool_call_delta","arguments_delta":"1"}"#.into(),
            r#"{"type":"tool_call_delta","id":"c1","text":"x"}"#.into(),
            format!(r#"{{"type":"tool_call_delta","id":"c1","name":"{name_257}"}}"#),
            format!(r#"{{"type":"tool_call_delta","id":"{name_257}"}}"#),
            r#"{"type":"tool_call_end","id":"c1"}"#.into(),
            r#"{"type":"tool_call_end","id":"c1","name":"x"}"#.into(),
            r#"{"type":"tool_call_end"}"#.into(),
            r#"{"type":"image","url":"x"}"#.into(),
            r#"{"type":5}"#.into(),
            r#"{}"#.into(),
            r#"[]"#.into(),
            r#""text""#.into(),
        ];
        let (mut fast, mut slow_only, mut refused) = (0, 0, 0);
        for c in &cases {
            let slow = serde_json::from_str::<Value>(c)
                .ok()
                .and_then(|v| Event::parse(&v).ok());
            let quick = serde_json::from_str::<EventIn>(c)
                .ok()
                .and_then(EventIn::into_event);
            match (&quick, &slow) {
                (Some(q), Some(s)) => {
                    assert_eq!(q, s, "{c}");
                    let v: Value = serde_json::from_str(c).unwrap();
                    let mut expected = v.clone();
                    if let Some(o) = expected.as_object_mut() {
                        o.retain(|_, x| !x.is_null());
                        if matches!(s, Event::ToolDelta { .. }) {
                            o.entry("arguments_delta").or_insert("".into());
                        }
                    }
                    assert_eq!(q.to_json(), expected, "{c}");
                    fast += 1;
                }
                (Some(q), None) => panic!("the fast path accepted {c} as {q:?}; parse refuses it"),
                (None, Some(_)) => slow_only += 1,
                (None, None) => refused += 1,
            }
        }
        println!(
            "{} events: {fast} fast, {slow_only} slow path only, {refused} refused",
            cases.len()
        );
        assert!(fast >= 7 && slow_only >= 2 && refused >= 10);
    }

    fn texts(out: &[(u64, EventJson)]) -> Vec<(u64, String)> {
        out.iter()
            .map(|(s, raw)| {
                let v: Value = serde_json::from_str(raw.get()).unwrap();
                (*s, v["text"].as_str().unwrap_or("").to_owned())
            })
            .collect()
    }

    /// Published events are serialized from their fields, not through a `Value`: the text must
    /// be exactly what the `Value` path produced (key order, escaping), since subscribers and
    /// snapshots compare and store it.
    #[test]
    fn published_events_are_the_json_the_value_path_produced() {
        let mut acc = Accumulator::default();
        let hostile = "quote \" back \\ nl \n tab \t nul \u{0} ctl \u{1f} é 😀 </script>";
        let events = [
            Event::Text(hostile.into()),
            Event::ToolDelta {
                id: "c\"1".into(),
                name: Some("t\n".into()),
                arguments_delta: "{\"a\":".into(),
            },
            Event::ToolEnd { id: "c\"1".into() },
        ];
        for (i, ev) in events.iter().enumerate() {
            let out = acc.apply(i as u64 + 1, ev).unwrap();
            assert_eq!(out.len(), 1, "{ev:?}");
            assert_eq!(
                out[0].1.get(),
                serde_json::to_string(&ev.to_json()).unwrap()
            );
        }
        assert_eq!(
            acc.apply(4, &Event::Text("x".into())).unwrap()[0].1.get(),
            r#"{"type":"text","text":"x"}"#
        );
    }

    fn r1(acc: &mut Accumulator) {
        acc.apply_plan(&plan_reset(acc, Continuation::Restated));
    }

    /// The plan of a connection reset of `acc`'s run as it stands (no jitter, the default
    /// policy), continuing as `continuation` says (the property test's too).
    pub(in crate::streams) fn plan_reset(acc: &Accumulator, continuation: Continuation) -> Plan {
        crate::recovery::plan(&crate::recovery::Input {
            cause: crate::recovery::Cause::ConnectionReset,
            status: None,
            text: acc.text.clone(),
            tool_calls: acc.tool_calls(),
            attempts: Default::default(),
            retry_after: None,
            stall_history: vec![],
            stale: None,
            jitter: None,
            policy: Default::default(),
            continuation,
        })
    }

    #[test]
    fn a_continuation_that_repeats_the_tail_is_trimmed_across_deltas() {
        let mut acc = Accumulator::default();
        acc.apply(1, &Event::Text("Hello, wor".into())).unwrap();
        r1(&mut acc);
        // "wor" + "ld!" arrives as "w", "or", "ld!": held until it stops repeating the tail.
        assert!(acc.apply(2, &Event::Text("w".into())).unwrap().is_empty());
        assert!(acc.apply(3, &Event::Text("or".into())).unwrap().is_empty());
        let out = acc.apply(4, &Event::Text("ld!".into())).unwrap();
        assert_eq!(texts(&out), vec![(4, "ld!".to_string())]);
        assert_eq!(acc.text, "Hello, world!");
        assert_eq!(acc.trimmed_chars, 3);
        // Later text is not trimmed again.
        let out = acc.apply(5, &Event::Text("Hello".into())).unwrap();
        assert_eq!(texts(&out), vec![(5, "Hello".to_string())]);
    }

    #[test]
    fn the_text_when_flushed_is_what_the_flush_then_shows() {
        // Held text the flush drops, publishes (a 2-char repeat is below the minimum), partly
        // drops ("abc" repeats the tail's end, "X" does not); and nothing held.
        for (first, held, want) in [
            ("Hello, wor", vec!["wor"], "Hello, wor"),
            ("Hello, wor", vec!["lo, "], "Hello, worlo, "),
            ("Hello, wor", vec!["w", "o"], "Hello, worwo"),
            ("abcXabc", vec!["ab", "cX"], "abcXabcX"),
            ("Hello, wor", vec![], "Hello, wor"),
        ] {
            let mut acc = Accumulator::default();
            acc.apply(1, &Event::Text(first.into())).unwrap();
            r1(&mut acc);
            for (i, t) in held.iter().enumerate() {
                assert!(acc
                    .apply(2 + i as u64, &Event::Text((*t).into()))
                    .unwrap()
                    .is_empty());
            }
            let foreseen = acc.text_when_flushed();
            acc.flush_trim();
            assert_eq!(foreseen, acc.text, "{held:?}");
            assert_eq!(foreseen, want, "{held:?}");
        }
    }

    #[test]
    fn short_coincidences_and_fresh_text_are_left_alone() {
        for (cont, published) in [
            (" and more", " and more"),
            ("rld", "rld"),         // "or" + "rld": no suffix of the tail starts it
            ("d, then", "d, then"), // one char of overlap is below the minimum
        ] {
            let mut acc = Accumulator::default();
            acc.apply(1, &Event::Text("the word".into())).unwrap();
            r1(&mut acc);
            let mut out = acc.apply(2, &Event::Text(cont.into())).unwrap();
            out.extend(acc.flush_trim());
            let got: String = texts(&out).into_iter().map(|(_, t)| t).collect();
            assert_eq!(got, published, "{cont:?}");
        }
        // A whole repeat of the tail, then new text in a later delta.
        let mut acc = Accumulator::default();
        acc.apply(1, &Event::Text("abc def".into())).unwrap();
        r1(&mut acc);
        let mut out = acc.apply(2, &Event::Text("def".into())).unwrap();
        out.extend(acc.apply(3, &Event::Text(" ghi".into())).unwrap());
        assert_eq!(acc.text, "abc def ghi");
        assert_eq!(texts(&out), vec![(3, " ghi".to_string())]);
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        let mut acc = Accumulator::default();
        acc.apply(1, &Event::Text("naïve café".into())).unwrap();
        r1(&mut acc);
        let mut out = acc.apply(2, &Event::Text("café ☕".into())).unwrap();
        out.extend(acc.flush_trim());
        assert_eq!(acc.text, "naïve café ☕");
        assert_eq!(texts(&out), vec![(2, " ☕".to_string())]);
    }

    #[test]
    fn tool_calls_accumulate_and_validate() {
        let mut acc = Accumulator::default();
        let d = |id: &str, name: Option<&str>, a: &str| Event::ToolDelta {
            id: id.into(),
            name: name.map(Into::into),
            arguments_delta: a.into(),
        };
        acc.apply(1, &d("c1", Some("read"), "{\"p\":")).unwrap();
        acc.apply(2, &d("c1", None, " 1}")).unwrap();
        acc.apply(3, &Event::ToolEnd { id: "c1".into() }).unwrap();
        assert!(
            acc.check_batch(&[d("c1", None, "x")]).is_err(),
            "delta after end"
        );
        assert!(acc
            .check_batch(&[Event::ToolEnd { id: "nope".into() }])
            .is_err());
        // Within one batch a call may start and end; ending it twice is refused.
        let start_end = [d("c9", Some("t"), "{}"), Event::ToolEnd { id: "c9".into() }];
        assert!(acc.check_batch(&start_end).is_ok());
        let twice = [
            d("c9", Some("t"), "{}"),
            Event::ToolEnd { id: "c9".into() },
            Event::ToolEnd { id: "c9".into() },
        ];
        assert!(acc
            .check_batch(&twice)
            .unwrap_err()
            .to_string()
            .contains("events[2]"));
        acc.apply(4, &d("c2", Some("write"), "{\"body\": \""))
            .unwrap();
        let snap = acc.snapshot();
        assert_eq!(snap["completed_tool_calls"][0]["arguments"], "{\"p\": 1}");
        assert_eq!(snap["in_flight_tool"]["name"], "write");
        for bad in [
            json!({"type": "text"}),
            json!({"type": "text", "text": 1}),
            json!({"type": "tool_call_delta", "arguments_delta": "x"}),
            json!({"type": "tool_call_end", "id": ""}),
            json!({"type": "finish"}),
            json!({"type": "text", "text": "x", "extra": 1}),
        ] {
            assert!(Event::parse(&bad).is_err(), "{bad}");
        }
    }
}
