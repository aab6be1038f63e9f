//! `stream.*` and `checkpoint.*`: thin handlers over [`crate::streams::Streams`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::handlers::{blocking, open_subscription};
use super::protocol::{self, params, Request, RpcError};
use super::server::Session;
use crate::service::Daemon;
use crate::streams::{Event, EventIn, Next, Str};
use crate::streams::{StreamError, Streams, Ticket};

fn rpc(e: StreamError) -> RpcError {
    e.into()
}

/// The daemon's streams, opening them on first use (a journal replay: blocking pool).
async fn streams(daemon: &Arc<Daemon>) -> Result<Arc<Streams>, RpcError> {
    if let Some(s) = daemon.streams_if_open() {
        return Ok(s);
    }
    let d = Arc::clone(daemon);
    blocking(move || d.streams()).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Begin {
    run_id: String,
    #[serde(default)]
    thread_id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    takeover: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Append {
    run_id: String,
    stream_id: String,
    seq: u64,
    events: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Interrupt {
    run_id: String,
    stream_id: String,
    cause: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resume {
    run_id: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    thread_id: Option<String>,
    #[serde(default)]
    fail_on_stale: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Commit {
    run_id: String,
    stream_id: String,
    final_message: Value,
    #[serde(default)]
    content_from_stream: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Abort {
    run_id: String,
    stream_id: String,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Subscribe {
    run_id: String,
    #[serde(default)]
    after_seq: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunOnly {
    run_id: String,
    #[serde(default)]
    reveal: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointPut {
    run_id: String,
    snapshot: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Nothing {}

/// Route a `stream.*` or `checkpoint.*` request (already admitted).
pub async fn dispatch(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    req: Request,
) -> Result<Value, RpcError> {
    let s = streams(daemon).await?;
    match req.method.as_str() {
        "stream.begin" => {
            let p: Begin = params(req.params)?;
            let t = s
                .begin(&p.run_id, p.thread_id, p.model, p.takeover)
                .map_err(rpc)?;
            s.settle(t).await.map_err(rpc)
        }
        // `stream.append` is never routed here: it takes the one path of `append` below.
        // The plan's R2 annotation reads the run log and, once the plan is durable, the plan
        // goes into the run log's timeline: file work, on the blocking pool.
        "stream.interrupt" => {
            let p: Interrupt = params(req.params)?;
            let run_id = p.run_id.clone();
            let s2 = Arc::clone(&s);
            let t = blocking(move || s2.interrupt(&p.run_id, &p.stream_id, &p.cause).map_err(rpc))
                .await?;
            let plan = s.settle(t).await.map_err(rpc)?;
            let (s2, logged) = (Arc::clone(&s), plan.clone());
            blocking(move || {
                s2.log_plan(&run_id, "interrupt", &logged);
                Ok::<(), RpcError>(())
            })
            .await?;
            Ok(plan)
        }
        "stream.resume" => {
            let p: Resume = params(req.params)?;
            let run_id = p.run_id.clone();
            let s2 = Arc::clone(&s);
            let t = blocking(move || {
                s2.resume(&p.run_id, p.model, p.thread_id, p.fail_on_stale)
                    .map_err(rpc)
            })
            .await?;
            let answer = s.settle(t).await.map_err(rpc)?;
            let (s2, logged) = (Arc::clone(&s), answer["plan"].clone());
            blocking(move || {
                s2.log_plan(&run_id, "resume", &logged);
                Ok::<(), RpcError>(())
            })
            .await?;
            Ok(answer)
        }
        // The commit point is an atomic file replacement: blocking pool.
        "stream.commit" => {
            let p: Commit = params(req.params)?;
            if p.final_message.is_null() {
                return Err(RpcError::invalid_params("final_message is required"));
            }
            blocking(move || {
                s.commit(
                    &p.run_id,
                    &p.stream_id,
                    p.final_message,
                    p.content_from_stream,
                )
            })
            .await
        }
        "stream.abort" => {
            let p: Abort = params(req.params)?;
            let detail = json!({"reason": p.reason});
            blocking(move || s.end(&p.run_id, &p.stream_id, "aborted", detail)).await
        }
        "stream.subscribe" => {
            let p: Subscribe = params(req.params)?;
            subscribe(&s, session, &p.run_id, p.after_seq)
        }
        "stream.get" => {
            let p: RunOnly = params(req.params)?;
            let s2 = Arc::clone(&s);
            blocking(move || s2.get(&p.run_id, p.reveal)).await
        }
        "stream.list" => {
            let _: Nothing = params(req.params)?;
            let j = s.journal_stats();
            Ok(json!({
                "runs": s.list(),
                "journal": {
                    "appends": j.appends.load(Ordering::Relaxed),
                    "batches": j.batches.load(Ordering::Relaxed),
                    "syncs": j.syncs.load(Ordering::Relaxed),
                    "active_segment": s.active_mark(),
                },
            }))
        }
        "checkpoint.put" | "checkpoint.get" | "checkpoint.delete" => {
            let method = req.method.clone();
            let s2 = Arc::clone(&s);
            let raw = req.params;
            blocking(move || -> Result<Value, RpcError> {
                match method.as_str() {
                    "checkpoint.put" => {
                        let p: CheckpointPut = params(raw)?;
                        s2.checkpoint_put(&p.run_id, &p.snapshot).map_err(rpc)
                    }
                    "checkpoint.get" => {
                        let p: RunOnly = params(raw)?;
                        s2.checkpoint_get(&p.run_id).map_err(rpc)
                    }
                    _ => {
                        let p: RunOnly = params(raw)?;
                        s2.checkpoint_delete(&p.run_id)
                            .map(|deleted| json!({"deleted": deleted}))
                            .map_err(rpc)
                    }
                }
            })
            .await
        }
        other => Err(RpcError::method_not_found(other)),
    }
}

/// A `stream.append` request: its id and params, read once — straight from the line into
/// typed, mostly borrowed fields when it is well formed ([`read_append_line`]), else from the
/// parsed request when it is executed (with the precise error of whatever is wrong).
pub struct AppendRequest {
    /// The request's id.
    pub id: protocol::Id,
    params: AppendIn,
}

enum AppendIn {
    /// Read from the line by [`read_append_line`].
    Typed {
        run_id: String,
        stream_id: String,
        seq: u64,
        events: Vec<Event>,
    },
    /// A request the typed reader did not take (an error to report, or an odd but valid form).
    Parsed(Map<String, Value>),
}

impl AppendRequest {
    /// An append from a parsed request (its params are read when it runs).
    pub fn from_request(req: Request) -> AppendRequest {
        AppendRequest {
            id: req.id,
            params: AppendIn::Parsed(req.params),
        }
    }
}

/// The one path of `stream.append`, without a task when the streams are open: validated and
/// queued on the connection's task, answered from the journal's commit (the response line is
/// queued by the committer thread once the append is durable). `permit`, the connection's
/// in-flight slot, is held until then. Before the streams are first opened (a journal replay,
/// on the blocking pool) a task opens them, then appends the same way.
pub fn append(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    a: AppendRequest,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    if let Some(s) = daemon.streams_if_open() {
        let ticket = queue_append(&s, a.params);
        answer_on_commit(&s, session, a.id, ticket, permit);
        return;
    }
    let (daemon, session) = (Arc::clone(daemon), Arc::clone(session));
    tokio::spawn(async move {
        match streams(&daemon).await {
            Ok(s) => {
                let ticket = queue_append(&s, a.params);
                answer_on_commit(&s, &session, a.id, ticket, permit);
            }
            Err(e) => {
                session.outbox.send(protocol::response_err(&a.id, &e));
            }
        }
    });
}

fn queue_append(s: &Streams, input: AppendIn) -> Result<Ticket, RpcError> {
    match input {
        AppendIn::Typed {
            run_id,
            stream_id,
            seq,
            events,
        } => s.append_events(&run_id, &stream_id, seq, events),
        AppendIn::Parsed(raw) => {
            let p: Append = params(raw)?;
            s.parse_events(&p.events)
                .and_then(|events| s.append_events(&p.run_id, &p.stream_id, p.seq, events))
        }
    }
    .map_err(rpc)
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
    params: AppendLineParams<'a>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendLineParams<'a> {
    #[serde(borrow)]
    run_id: Str<'a>,
    #[serde(borrow)]
    stream_id: Str<'a>,
    seq: u64,
    #[serde(borrow)]
    events: Vec<EventIn<'a>>,
}

/// The hottest method read straight from its line: a well-formed `stream.append` is
/// deserialized into typed, mostly borrowed fields, with no `serde_json::Value` tree (which cost
/// most of an append's CPU: a map per object, a string per key). `None` for any other line, and
/// for an append this reader does not fully accept: the general parser reads those, and the
/// append then reports exactly what is wrong.
pub fn read_append_line(line: &[u8]) -> Option<AppendRequest> {
    const METHOD: &[u8] = b"\"stream.append\"";
    // Cheap on long lines of other methods: most windows stop at their first byte.
    if !line
        .windows(METHOD.len())
        .any(|w| w[0] == b'"' && w == METHOD)
    {
        return None;
    }
    let l: AppendLine = serde_json::from_slice(line).ok()?;
    if l.jsonrpc.0 != "2.0"
        || l.method.0 != "stream.append"
        || !matches!(l.id, Value::Number(_) | Value::String(_) | Value::Null)
    {
        return None;
    }
    let events = l
        .params
        .events
        .into_iter()
        .map(EventIn::into_event)
        .collect::<Option<Vec<Event>>>()?;
    Some(AppendRequest {
        id: l.id,
        params: AppendIn::Typed {
            run_id: l.params.run_id.0.into_owned(),
            stream_id: l.params.stream_id.0.into_owned(),
            seq: l.params.seq,
            events,
        },
    })
}

fn answer_on_commit(
    s: &Arc<Streams>,
    session: &Arc<Session>,
    id: protocol::Id,
    ticket: Result<Ticket, RpcError>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    match ticket {
        Err(e) => {
            session.outbox.send(protocol::response_err(&id, &e));
        }
        Ok(t) => {
            let session = Arc::clone(session);
            // The answer is known now; build its line here, not on the committer thread, which
            // answers every append of a batch one after the other.
            let ready = protocol::response_ok_public(&id, &t.answer);
            s.settle_then(t, move |res| {
                let line = match res {
                    Ok(_) => ready,
                    Err(e) => protocol::response_err(&id, &rpc(e)),
                };
                // Written from the committer thread when the socket takes it at once: no task
                // is woken to answer an append.
                session.send_now(line);
                drop(permit);
            });
        }
    }
}

/// The params of a `stream.subscribe` event notification.
#[derive(serde::Serialize)]
struct EventParams<'a> {
    subscription: u64,
    run_id: &'a str,
    seq: u64,
    event: &'a serde_json::value::RawValue,
}

/// Forward a run's events to this connection until `finish` (or the connection ends).
fn subscribe(
    s: &Arc<Streams>,
    session: &Arc<Session>,
    run_id: &str,
    after_seq: u64,
) -> Result<Value, RpcError> {
    let (sub, gate) = open_subscription(session)?;
    let mut rx = match s.subscribe(run_id, after_seq) {
        Ok(rx) => rx,
        Err(e) => {
            session.subscriptions.ended(sub);
            return Err(rpc(e));
        }
    };
    let (session_f, run, s_f) = (Arc::clone(session), run_id.to_owned(), Arc::clone(s));
    tokio::spawn(async move {
        let mut last = after_seq;
        loop {
            let next = session_f.unless_ended(gate.until_closed(rx.next())).await;
            let (seq, event) = match next.flatten() {
                Some(Next::Event(seq, event)) => (seq, event),
                Some(Next::Lagged) => {
                    // Fell behind: take the rest from the run's durable backlog, after the
                    // last event sent (no gap, no repeat).
                    match s_f.subscribe(&run, last) {
                        Ok(again) => {
                            rx = again;
                            continue;
                        }
                        Err(_) => break,
                    }
                }
                Some(Next::Closed) | None => break,
            };
            last = seq;
            // The event's JSON is written as stored (serialized once, when it was published);
            // `finish` is followed by `Closed`, which ends the loop.
            let line = protocol::notification_of(&EventParams {
                subscription: sub,
                run_id: &run,
                seq,
                event: &event,
            });
            if !gate.send(&session_f.outbox, line) {
                break;
            }
        }
        session_f.subscriptions.ended(sub);
    });
    Ok(json!({"subscription": sub, "run_id": run_id, "after_seq": after_seq}))
}
