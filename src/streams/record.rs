//! The records of the stream journal: what a run's changes look like at the storage boundary.
//!
//! Each record is one JSON object, sealed (Fernet) into one journal frame. `t` names the kind;
//! every record carries the run it belongs to (`run`). The table in docs/design.md ("Journal
//! records") lists the fields; this module is their one definition, for writing and for
//! reading back. A record is written by serializing [`Record`] (or, on the append path,
//! [`EventsOut`], which borrows the events instead of copying them) and read back with
//! [`Record::decode`], which is strict: a record that lacks a field holdfast always writes, or
//! has one of the wrong type, is an error (replay skips it and counts it) instead of being read
//! with a silent default.
//!
//! The JSON is the same, byte for byte, as what earlier versions wrote (tests below pin it), so
//! journals written before these types existed replay unchanged.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::accum::{Accumulator, Event};
use super::{EventJson, Status};
use crate::recovery::{self, Attempts, Cause, Plan, PlanKind};

/// One journal record.
#[derive(Debug, Serialize)]
#[serde(tag = "t")]
pub enum Record {
    /// A producer took the run (`stream.begin`, a takeover, or `stream.resume`).
    #[serde(rename = "begin")]
    Begin(Begin),
    /// Events appended by the producer (`stream.append`).
    #[serde(rename = "ev")]
    Events(Events),
    /// A recovery plan applied to the run (`stream.interrupt`, `stream.resume`).
    #[serde(rename = "plan")]
    Plan(PlanRecord),
    /// The producer's connection closed without a commit or abort (`interrupted`, cause
    /// `producer_lost`, at the run's next seq; the stream id retired).
    #[serde(rename = "lost")]
    Lost(Lost),
    /// Everything the run is; replaces every earlier record of the run (key rotation).
    #[serde(rename = "snap")]
    Snapshot(Box<Snapshot>),
    /// The run ended (its state file, the commit point, is already written).
    #[serde(rename = "end")]
    End(End),
    /// The first record of the segment a key rotation starts (belongs to no run).
    #[serde(rename = "reseal")]
    Reseal(Reseal),
}

/// `begin`: a new holder (epoch, stream id) of the run.
#[derive(Debug, Serialize, Deserialize)]
pub struct Begin {
    /// The run.
    pub run: String,
    /// The fencing epoch of the new holder.
    pub epoch: u64,
    /// The stream id the holder appends with.
    pub sid: String,
    /// The conversation thread, if the producer gave one.
    pub thread: Option<String>,
    /// The upstream model, if the producer gave one.
    pub model: Option<String>,
    /// When (Unix ms).
    pub at: u64,
}

/// `ev`: events numbered from `seq`, as the producer sent them.
#[derive(Debug, Serialize, Deserialize)]
pub struct Events {
    /// The run.
    pub run: String,
    /// The epoch of the holder that appended them.
    pub epoch: u64,
    /// The seq of the first event.
    pub seq: u64,
    /// The events, each as the producer's JSON (parsed with [`Event::parse`] on replay).
    pub events: Vec<Value>,
    /// When (Unix ms): the run's last activity.
    pub at: u64,
}

/// An `ev` record as written on the append path: the same JSON as [`Events`], with the events
/// borrowed from the request (serialized by [`Event`]'s own `Serialize`).
#[derive(Serialize)]
pub struct EventsOut<'a> {
    /// Always `"ev"`.
    pub t: &'static str,
    /// The run.
    pub run: &'a str,
    /// The holder's epoch.
    pub epoch: u64,
    /// The seq of the first event.
    pub seq: u64,
    /// The events.
    pub events: &'a [Event],
    /// When (Unix ms).
    pub at: u64,
}

/// `plan`: a recovery plan and what it published.
#[derive(Debug, Serialize, Deserialize)]
pub struct PlanRecord {
    /// The run.
    pub run: String,
    /// The holder's epoch.
    pub epoch: u64,
    /// `interrupt` or `resume`.
    pub kind: String,
    /// The plan as answered, without the text so far and the completed calls (a plan of a long
    /// turn must stay far below the frame limit); [`PlanRecord::plan`] reads it back.
    pub plan: Value,
    /// When (Unix ms).
    pub at: u64,
    /// The planner's input that is not in the run: the cause and the HTTP status.
    pub input: PlanInput,
    /// The events the plan published (`stream_reset`, `tool_call_cancel`…, `interrupted`),
    /// with their seqs.
    pub events: Vec<(u64, Value)>,
}

/// The part of a plan's input a [`PlanRecord`] keeps.
#[derive(Debug, Serialize, Deserialize)]
pub struct PlanInput {
    /// The cause.
    pub cause: Cause,
    /// The provider's HTTP status, if the cause came with one.
    pub status: Option<u16>,
}

/// What replay needs of a recorded plan: its kind, cancelled calls and counters (it is not
/// planned again: jitter and the clock would differ).
#[derive(Debug, Deserialize)]
struct RecordedPlan {
    plan: PlanKind,
    cause: Cause,
    status: Option<u16>,
    reason: String,
    cancelled: Vec<RecordedCancel>,
    events: Vec<Value>,
    wait_ms: u64,
    backoff_ms: u64,
    hints: Vec<Value>,
    attempts: Attempts,
    stall_streak: u32,
    stalled_tool: Option<String>,
    /// Absent from plans written before the producer declared it: those trimmed every R1/R3
    /// continuation (`restated`), and replay must rebuild what they published.
    #[serde(default)]
    continuation: Option<recovery::Continuation>,
}

#[derive(Debug, Deserialize)]
struct RecordedCancel {
    id: String,
    name: String,
    partial_arguments: String,
}

impl PlanRecord {
    /// The recorded plan as a [`Plan`] (for replay), or why it does not read.
    pub fn plan(&self) -> Result<Plan, serde_json::Error> {
        let p = RecordedPlan::deserialize(&self.plan)?;
        Ok(Plan {
            plan: p.plan,
            cause: p.cause,
            status: p.status,
            class: p.cause.class(),
            reason: p.reason,
            assistant_prefix: String::new(),
            completed: Vec::new(),
            cancelled: p
                .cancelled
                .into_iter()
                .map(|c| recovery::Cancelled {
                    id: c.id,
                    name: c.name,
                    partial_arguments: c.partial_arguments,
                })
                .collect(),
            events: p.events,
            wait_ms: p.wait_ms,
            backoff_ms: p.backoff_ms,
            hints: p.hints,
            attempts: p.attempts,
            stall_streak: p.stall_streak,
            stalled_tool: p.stalled_tool,
            continuation: p.continuation.or_else(|| {
                matches!(p.plan, PlanKind::R1 | PlanKind::R3)
                    .then_some(recovery::Continuation::Restated)
            }),
        })
    }
}

/// `lost`: the producer's connection closed without a commit or abort.
#[derive(Debug, Serialize, Deserialize)]
pub struct Lost {
    /// The run.
    pub run: String,
    /// The lost holder's epoch.
    pub epoch: u64,
    /// The seq of the `interrupted` event it published.
    pub seq: u64,
    /// When (Unix ms).
    pub at: u64,
}

/// `snap`: the whole run.
#[derive(Debug, Serialize, Deserialize)]
pub struct Snapshot {
    /// The run.
    pub run: String,
    /// The conversation thread.
    pub thread: Option<String>,
    /// The upstream model.
    pub model: Option<String>,
    /// The holder's epoch.
    pub epoch: u64,
    /// The holder's stream id.
    pub sid: String,
    /// Where the run is.
    pub status: Status,
    /// The next seq the producer must use.
    pub next_seq: u64,
    /// Every event of the run, with its seq, as published.
    pub events: Vec<(u64, EventJson)>,
    /// The accumulator (text, tool calls, the overlap trimmer).
    pub acc: Accumulator,
    /// Recoveries made, per budget class.
    pub attempts: Attempts,
    /// The unfinished tool of each interruption, in order.
    pub stall: Vec<Option<String>>,
    /// The last plan, as answered.
    pub last_plan: Option<Value>,
    /// When the run began (Unix ms).
    pub created: u64,
    /// Its last activity (Unix ms).
    pub updated: u64,
}

/// `end`: the run left memory (committed, aborted or expired).
#[derive(Debug, Serialize, Deserialize)]
pub struct End {
    /// The run.
    pub run: String,
    /// `committed`, `aborted` or `expired`.
    pub status: String,
}

/// `reseal`: a key rotation started a new segment here.
#[derive(Debug, Serialize, Deserialize)]
pub struct Reseal {
    /// Always empty.
    pub run: String,
    /// When (Unix ms).
    pub at: u64,
}

/// The tag, read first.
#[derive(Deserialize)]
struct Tag<'a> {
    #[serde(borrow)]
    t: std::borrow::Cow<'a, str>,
}

impl Record {
    /// Read a record from its JSON. Unknown kinds and missing or mistyped fields are errors.
    pub fn decode(json: &[u8]) -> Result<Record, serde_json::Error> {
        // The tag first, then the record as its own struct: no buffering of the whole record
        // (which serde's internally tagged enums do, and which cannot hold borrowed raw JSON).
        let tag: Tag<'_> = serde_json::from_slice(json)?;
        Ok(match &*tag.t {
            "begin" => Record::Begin(serde_json::from_slice(json)?),
            "ev" => Record::Events(serde_json::from_slice(json)?),
            "plan" => Record::Plan(serde_json::from_slice(json)?),
            "lost" => Record::Lost(serde_json::from_slice(json)?),
            "snap" => Record::Snapshot(Box::new(serde_json::from_slice(json)?)),
            "end" => Record::End(serde_json::from_slice(json)?),
            "reseal" => Record::Reseal(serde_json::from_slice(json)?),
            other => {
                return Err(serde::de::Error::custom(format!(
                    "unknown record kind {other:?}"
                )))
            }
        })
    }

    /// The JSON of the record.
    pub fn encode(&self) -> Vec<u8> {
        // Every field is a plain value or a `Value`: serializing into a Vec cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The run the record belongs to (empty for `reseal`).
    pub fn run(&self) -> &str {
        match self {
            Record::Begin(r) => &r.run,
            Record::Events(r) => &r.run,
            Record::Plan(r) => &r.run,
            Record::Lost(r) => &r.run,
            Record::Snapshot(r) => &r.run,
            Record::End(r) => &r.run,
            Record::Reseal(r) => &r.run,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What the code before these types wrote (`record(kind, run, json!({…}))` with
    /// `preserve_order`), kind by kind: the typed records write the same bytes, and read them.
    #[test]
    fn records_are_byte_compatible_with_the_untyped_writer() {
        fn old(kind: &str, run: &str, fields: Value) -> Vec<u8> {
            let mut r = json!({"t": kind, "run": run});
            if let (Value::Object(r), Value::Object(f)) = (&mut r, fields) {
                r.extend(f);
            }
            serde_json::to_vec(&r).unwrap()
        }
        let begin = Record::Begin(Begin {
            run: "r1".into(),
            epoch: 2,
            sid: "abc".into(),
            thread: Some("th".into()),
            model: None,
            at: 17,
        });
        let want = old(
            "begin",
            "r1",
            json!({"epoch": 2, "sid": "abc", "thread": "th", "model": null, "at": 17}),
        );
        assert_eq!(begin.encode(), want);
        assert!(matches!(Record::decode(&want).unwrap(), Record::Begin(b) if b.epoch == 2));

        let end = Record::End(End {
            run: "r1".into(),
            status: "committed".into(),
        });
        let want = old("end", "r1", json!({"status": "committed"}));
        assert_eq!(end.encode(), want);
        assert_eq!(Record::decode(&want).unwrap().run(), "r1");

        let reseal = Record::Reseal(Reseal {
            run: String::new(),
            at: 5,
        });
        assert_eq!(reseal.encode(), old("reseal", "", json!({"at": 5})));

        let events = [
            Event::parse(&json!({"type": "text", "text": "Hel"})).unwrap(),
            Event::parse(&json!({"type": "text", "text": "lo"})).unwrap(),
        ];
        let ev = EventsOut {
            t: "ev",
            run: "r1",
            epoch: 1,
            seq: 3,
            events: &events,
            at: 9,
        };
        let bytes = serde_json::to_vec(&ev).unwrap();
        let want = old(
            "ev",
            "r1",
            json!({"epoch": 1, "seq": 3, "events": [
                {"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}], "at": 9}),
        );
        assert_eq!(bytes, want);
        match Record::decode(&want).unwrap() {
            Record::Events(e) => assert_eq!((e.seq, e.events.len(), e.at), (3, 2, 9)),
            other => panic!("{other:?}"),
        }
        println!("journal records: begin, ev, end, reseal written byte for byte as before");
    }

    /// `plan` and `snap` records as the untyped writer built them (the compact plan is the
    /// answered plan without the text so far and the completed calls) encode the same, and a
    /// recorded plan reads back with the decisions replay applies.
    #[test]
    fn plan_and_snapshot_records_are_byte_compatible_too() {
        fn old(kind: &str, run: &str, fields: Value) -> Vec<u8> {
            let mut r = json!({"t": kind, "run": run});
            if let (Value::Object(r), Value::Object(f)) = (&mut r, fields) {
                r.extend(f);
            }
            serde_json::to_vec(&r).unwrap()
        }
        let input = recovery::input_from_json(
            &json!({"error": {"status": 429, "message": "slow down"}, "partial_text": "Hi th",
                    "tool_calls": [{"id": "c1", "name": "search", "arguments": "{\"q\": \"ru"}]}),
            1,
        )
        .unwrap();
        let plan = recovery::plan(&input);
        let mut compact = plan.to_json();
        if let Value::Object(m) = &mut compact {
            m.remove("assistant_prefix");
            m.remove("completed");
        }
        compact["events_published"] = json!([4, 5]);
        let events = vec![
            (4, plan.events[0].clone()),
            (5, json!({"type": "interrupted"})),
        ];
        let rec = Record::Plan(PlanRecord {
            run: "r1".into(),
            epoch: 3,
            kind: "interrupt".into(),
            plan: compact.clone(),
            at: 11,
            input: PlanInput {
                cause: input.cause,
                status: input.status,
            },
            events: events.clone(),
        });
        let want = old(
            "plan",
            "r1",
            json!({"epoch": 3, "kind": "interrupt", "plan": compact, "at": 11,
                   "input": {"cause": input.cause, "status": input.status}, "events": events}),
        );
        assert_eq!(rec.encode(), want);
        let Record::Plan(back) = Record::decode(&want).unwrap() else {
            panic!("not a plan")
        };
        let got = back.plan().unwrap();
        assert_eq!(
            (got.plan, got.cause, got.status, &got.cancelled, &got.events),
            (
                plan.plan,
                plan.cause,
                plan.status,
                &plan.cancelled,
                &plan.events
            )
        );
        assert_eq!(
            (
                got.attempts,
                got.wait_ms,
                got.backoff_ms,
                got.stall_streak,
                &got.stalled_tool
            ),
            (
                plan.attempts,
                plan.wait_ms,
                plan.backoff_ms,
                plan.stall_streak,
                &plan.stalled_tool
            )
        );

        let mut acc = Accumulator::default();
        let out = acc
            .apply(
                1,
                &Event::parse(&json!({"type": "text", "text": "Hello"})).unwrap(),
            )
            .unwrap();
        let ev: Vec<(u64, EventJson)> = out.clone();
        let snap = Record::Snapshot(Box::new(Snapshot {
            run: "r1".into(),
            thread: None,
            model: Some("m".into()),
            epoch: 2,
            sid: "s".into(),
            status: Status::Interrupted,
            next_seq: 2,
            events: ev,
            acc: acc.clone(),
            attempts: Attempts::default(),
            stall: vec![None, Some("search".into())],
            last_plan: Some(json!({"plan": "R1"})),
            created: 1,
            updated: 2,
        }));
        let want = old(
            "snap",
            "r1",
            json!({"thread": null, "model": "m", "epoch": 2, "sid": "s", "status": "interrupted",
                   "next_seq": 2, "events": out, "acc": acc, "attempts": Attempts::default(),
                   "stall": [null, "search"], "last_plan": {"plan": "R1"}, "created": 1,
                   "updated": 2}),
        );
        assert_eq!(snap.encode(), want);
        let Record::Snapshot(back) = Record::decode(&want).unwrap() else {
            panic!("not a snapshot")
        };
        assert_eq!(
            (back.next_seq, back.events.len(), back.acc.text.as_str()),
            (2, 1, "Hello")
        );
    }

    /// A record missing a field holdfast always writes is an error, not a default.
    #[test]
    fn decoding_is_strict() {
        for bad in [
            json!({"t": "begin", "run": "r", "sid": "s", "thread": null, "model": null, "at": 1}),
            json!({"t": "ev", "run": "r", "epoch": 1, "seq": "3", "events": [], "at": 1}),
            json!({"t": "end", "run": "r"}),
            json!({"t": "nope", "run": "r"}),
            json!({"run": "r"}),
            json!([1, 2]),
        ] {
            let bytes = serde_json::to_vec(&bad).unwrap();
            assert!(Record::decode(&bytes).is_err(), "{bad}");
        }
    }
}
