//! `stream.*` and `checkpoint.*`: thin handlers over [`crate::streams::Streams`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Value};

use super::protocol::streams::{
    Append, Deleted, EventNote, Events, JournalStats, Listing, StreamCall, Subscribed,
};
use super::protocol::{self, result, RpcError};
use super::reply::{blocking, open_subscription};
use super::session::Session;
use crate::config::PluginGrant;
use crate::limits;
use crate::service::Daemon;
use crate::streams::Next;
use crate::streams::{StreamError, Streams, Ticket};

fn rpc(e: StreamError) -> RpcError {
    e.into()
}

/// A takeover (`stream.begin`, `stream.resume`: `take`, on the blocking pool), settled. On a
/// shared store, one refused because another host wrote the run between its load and the
/// takeover (the old holder's last append) wrote nothing: it is tried again from a fresh load,
/// up to [`limits::SHARED_RETRIES`] times.
async fn taking_over(
    s: &Arc<Streams>,
    take: impl Fn(&Streams) -> Result<Ticket, StreamError> + Send + Sync + 'static,
) -> Result<Value, RpcError> {
    let take = Arc::new(take);
    let mut tries = 0;
    loop {
        let (s2, take2) = (Arc::clone(s), Arc::clone(&take));
        let t = blocking(move || take2(&s2).map_err(rpc)).await?;
        match s.settle(t).await {
            Err(StreamError::Journal(crate::durable::journal::JournalError::Fenced))
                if s.is_shared() && tries < limits::SHARED_RETRIES =>
            {
                tries += 1
            }
            r => return r.map_err(rpc),
        }
    }
}

/// The daemon's streams, opening them on first use (a journal replay: blocking pool).
async fn streams(daemon: &Arc<Daemon>) -> Result<Arc<Streams>, RpcError> {
    if let Some(s) = daemon.streams_if_open() {
        return Ok(s);
    }
    let d = Arc::clone(daemon);
    blocking(move || d.streams()).await
}

/// Run an admitted `stream.*` or `checkpoint.*` call: its run already checked against
/// `grant`'s runs (`run_scope::admit`), its listing kept to them here.
pub async fn dispatch(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    call: StreamCall,
    grant: &PluginGrant,
) -> Result<Value, RpcError> {
    let s = streams(daemon).await?;
    match call {
        // A state-file check (or, on a shared store, a query): blocking pool.
        StreamCall::Begin(p) => {
            let run_id = p.run_id.clone();
            let answer = taking_over(&s, move |s| {
                s.begin(&p.run_id, p.thread_id.clone(), p.model.clone(), p.takeover)
            })
            .await?;
            held_by(&s, session, &run_id, &answer["stream_id"]);
            Ok(answer)
        }
        // The one path of an append, answered from the journal's commit (`route` sends every
        // append to `append` below; here the answer is awaited).
        StreamCall::Append(a) => {
            let t = queue_append(&s, session, a).map_err(rpc)?;
            s.settle(t).await.map_err(rpc)
        }
        // The plan's R2 annotation reads the run log and, once the plan is durable, the plan
        // goes into the run log's timeline: file work, on the blocking pool.
        StreamCall::Interrupt(p) => {
            let (run_id, stream_id) = (p.run_id.clone(), p.stream_id.clone());
            let s2 = Arc::clone(&s);
            let continuation = p.continuation.unwrap_or_default();
            let t = blocking(move || {
                s2.interrupt_as(&p.run_id, &p.stream_id, &p.cause, continuation)
                    .map_err(rpc)
            })
            .await?;
            let plan = s.settle(t).await.map_err(rpc)?;
            held_by(&s, session, &run_id, &Value::String(stream_id));
            let (s2, logged) = (Arc::clone(&s), plan.clone());
            blocking(move || {
                s2.log_plan(&run_id, "interrupt", &logged);
                Ok::<(), RpcError>(())
            })
            .await?;
            Ok(plan)
        }
        StreamCall::Resume(p) => {
            let run_id = p.run_id.clone();
            let answer = taking_over(&s, move |s| {
                s.resume_as(
                    &p.run_id,
                    p.model.clone(),
                    p.thread_id.clone(),
                    p.fail_on_stale,
                    p.continuation.unwrap_or_default(),
                )
            })
            .await?;
            held_by(&s, session, &run_id, &answer["stream_id"]);
            let (s2, logged) = (Arc::clone(&s), answer["plan"].clone());
            blocking(move || {
                s2.log_plan(&run_id, "resume", &logged);
                Ok::<(), RpcError>(())
            })
            .await?;
            Ok(answer)
        }
        // The commit point is an atomic file replacement: blocking pool.
        StreamCall::Commit(p) => {
            if p.final_message.is_null() {
                return Err(RpcError::invalid_params("final_message is required"));
            }
            let (run_id, s2) = (p.run_id.clone(), Arc::clone(&s));
            let ended = blocking(move || {
                s.commit(
                    &p.run_id,
                    &p.stream_id,
                    p.final_message,
                    p.content_from_stream,
                )
            })
            .await;
            if ended.is_ok() {
                session.release_run(&run_id);
                s2.release(&run_id);
            }
            ended
        }
        StreamCall::Abort(p) => {
            let (run_id, detail) = (p.run_id.clone(), json!({"reason": p.reason}));
            let s2 = Arc::clone(&s);
            let ended = blocking(move || s.end(&p.run_id, &p.stream_id, "aborted", detail)).await;
            if ended.is_ok() {
                session.release_run(&run_id);
                s2.release(&run_id);
            }
            ended
        }
        StreamCall::Subscribe(p) => subscribe(&s, session, p.run_id, p.after_seq).await,
        StreamCall::Get(p) => {
            let s2 = Arc::clone(&s);
            blocking(move || s2.get(&p.run_id, p.reveal)).await
        }
        StreamCall::List(_) => {
            let s2 = Arc::clone(&s);
            let mut runs = blocking(move || s2.list().map_err(rpc)).await?;
            super::run_scope::retain(grant, &mut runs);
            // The journal's counters are every run's: shown only to a grant of every run.
            let journal = grant.covers_every_run().then(|| {
                let j = s.journal_stats();
                JournalStats {
                    appends: j.appends.load(Ordering::Relaxed),
                    batches: j.batches.load(Ordering::Relaxed),
                    syncs: j.syncs.load(Ordering::Relaxed),
                    active_segment: s.active_mark(),
                }
            });
            result(&Listing { runs, journal })
        }
        StreamCall::CheckpointPut(p) => {
            blocking(move || s.checkpoint_put(&p.run_id, &p.snapshot).map_err(rpc)).await
        }
        StreamCall::CheckpointGet(p) => {
            blocking(move || s.checkpoint_get(&p.run_id).map_err(rpc)).await
        }
        StreamCall::CheckpointDelete(p) => {
            let deleted = blocking(move || s.checkpoint_delete(&p.run_id).map_err(rpc)).await?;
            result(&Deleted { deleted })
        }
    }
}
/// The connection `session` speaks for `stream_id` of `run_id` (a begin, resume, interrupt or
/// append answered or queued): attached to the run, so its close without a commit or abort is
/// the producer's loss. Remembered by the session only once the run took it.
fn held_by(s: &Streams, session: &Session, run_id: &str, stream_id: &Value) {
    if let Some(sid) = stream_id.as_str() {
        if s.attach(run_id, sid, session.id) {
            session.hold(run_id, sid);
        }
    }
}

/// The one path of `stream.append`, without a task when the streams are open: validated and
/// queued on the connection's task, answered from the journal's commit (the response line is
/// sent by the committing thread — a runtime worker about to park, or the journal's committer
/// thread — once the append is durable). `permit`, the connection's
/// in-flight slot, is held until then. Before the streams are first opened (a journal replay,
/// on the blocking pool) a task opens them, then appends the same way.
pub fn append(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    id: protocol::Id,
    a: Append<'_>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    if let Some(s) = daemon.streams_if_open() {
        if !s.is_shared() {
            let ticket = queue_append(&s, session, a).map_err(rpc);
            answer_on_commit(&s, session, id, ticket, permit);
            return;
        }
        match s.next_seq(&a.run_id) {
            // A shared store's copy behind the store (another host wrote since): a seq past
            // its end is then no gap. Loaded again first (blocking, on a task), then appended.
            Some(next) if a.seq > next => {
                let (session, a) = (Arc::clone(session), a.into_owned());
                tokio::spawn(async move {
                    let (s2, run) = (Arc::clone(&s), a.run_id.to_string());
                    if let Err(e) = blocking(move || s2.refresh(&run).map_err(rpc)).await {
                        session.outbox.send(protocol::response_err(&id, &e));
                        return;
                    }
                    let ticket = queue_append(&s, &session, a).map_err(rpc);
                    answer_on_commit(&s, &session, id, ticket, permit);
                });
                return;
            }
            Some(_) => {
                let ticket = queue_append(&s, session, a).map_err(rpc);
                answer_on_commit(&s, session, id, ticket, permit);
                return;
            }
            None => {}
        }
    }
    let (daemon, session, a) = (Arc::clone(daemon), Arc::clone(session), a.into_owned());
    tokio::spawn(async move {
        match streams(&daemon).await {
            Ok(s) => {
                if s.is_shared() && !s.is_active(&a.run_id) {
                    // Not in memory: another host's run (or one this daemon dropped): loaded
                    // from the shared store first (blocking), then appended as any other.
                    let (s2, run) = (Arc::clone(&s), a.run_id.to_string());
                    if let Err(e) = blocking(move || s2.load_if_missing(&run).map_err(rpc)).await {
                        session.outbox.send(protocol::response_err(&id, &e));
                        return;
                    }
                }
                let ticket = queue_append(&s, &session, a).map_err(rpc);
                answer_on_commit(&s, &session, id, ticket, permit);
            }
            Err(e) => {
                session.outbox.send(protocol::response_err(&id, &e));
            }
        }
    });
}

fn queue_append(s: &Streams, session: &Session, a: Append<'_>) -> Result<Ticket, StreamError> {
    let events = match a.events {
        Events::Checked(events) => events,
        Events::Unchecked(values) => s.parse_events(&values)?,
    };
    let ticket = s.append_events(&a.run_id, &a.stream_id, a.seq, events)?;
    // The producer's connection, known to its run from its first accepted append (after a
    // restart, or when another connection began it); a refused one holds nothing.
    if !session.holds(&a.run_id, &a.stream_id) && s.attach(&a.run_id, &a.stream_id, session.id) {
        session.hold(&a.run_id, &a.stream_id);
    }
    Ok(ticket)
}

/// Room for an append's answer line on the committing thread's stack: the envelope, an id of
/// up to ~100 bytes and `{"acked_seq":N,"duplicate":true}`.
const ANSWER_ON_STACK: usize = 192;

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
            s.settle_then(t, move |res| {
                // Written by the committing thread when the socket takes it at once: no task is
                // woken to answer an append. The line is made here, on the stack (an append's
                // answer is typed: nothing of it is allocated or freed per append); an answer
                // too long for the buffer (a long string id) is made on the heap.
                match res {
                    Ok(answer) => {
                        let mut line = [0u8; ANSWER_ON_STACK];
                        match protocol::response_ok_public_into(&mut line, &id, &answer) {
                            // The lane, committing, sends it after the commit (answers.rs).
                            Some(n) if super::answers::collect(&session, &line[..n]) => true,
                            Some(n) => session.send_now_bytes(&line[..n]),
                            None => session.send_now(protocol::response_ok_public(&id, &answer)),
                        }
                    }
                    Err(e) => session.send_now(protocol::response_err(&id, &rpc(e))),
                };
                drop(permit);
            });
        }
    }
}

/// A subscription's feed: on the blocking pool (a shared store looks the run up).
async fn feed(
    s: &Arc<Streams>,
    run_id: &str,
    after_seq: u64,
) -> Result<crate::streams::Feed, StreamError> {
    let (s, run) = (Arc::clone(s), run_id.to_owned());
    tokio::task::spawn_blocking(move || s.subscribe(&run, after_seq))
        .await
        .unwrap_or(Err(StreamError::NotActive))
}

/// Whether a stored event is a run's `finish`.
fn is_finish(event: &crate::streams::EventJson) -> bool {
    #[derive(serde::Deserialize)]
    struct Kind<'a> {
        #[serde(borrow, rename = "type")]
        kind: &'a str,
    }
    serde_json::from_str::<Kind>(event.get()).is_ok_and(|k| k.kind == "finish")
}

/// Forward a run's events to this connection until `finish` (or the connection ends).
async fn subscribe(
    s: &Arc<Streams>,
    session: &Arc<Session>,
    run_id: String,
    after_seq: u64,
) -> Result<Value, RpcError> {
    let run_id = run_id.as_str();
    let (sub, gate) = open_subscription(session)?;
    let mut rx = match feed(s, run_id, after_seq).await {
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
            // Nothing more is taken for a client that owes the daemon reading (it is dropped
            // if it reads nothing for the read timeout): its feed lags meanwhile, and is made
            // up from the run's backlog once, when it reads again — never re-derived over and
            // over while it does not read (30 such connections took a daemon to 19 GB).
            if session_f.outbox.should_pause()
                && session_f
                    .unless_ended(gate.until_closed(session_f.outbox.drained()))
                    .await
                    .flatten()
                    .is_none()
            {
                break;
            }
            let next = session_f.unless_ended(gate.until_closed(rx.next())).await;
            let (seq, event) = match next.flatten() {
                Some(Next::Event(seq, event)) => (seq, event),
                Some(Next::Lagged) => {
                    // Fell behind: take the rest from the run's durable backlog, after the
                    // last event sent (no gap, no repeat).
                    match feed(&s_f, &run, last).await {
                        Ok(again) => {
                            rx = again;
                            continue;
                        }
                        Err(_) => break,
                    }
                }
                Some(Next::Closed) | None => break,
            };
            // Only events after the seq the client asked from: a live run subscribed past its
            // end pushes its later events too. Its `finish` always goes out: it is what ends
            // the subscription for the client, whatever seq it carries.
            if seq <= last && !is_finish(&event) {
                continue;
            }
            last = last.max(seq);
            // The event's JSON is written as stored (serialized once, when it was published);
            // `finish` is followed by `Closed`, which ends the loop.
            let line = protocol::notification_of(&EventNote {
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
    result(&Subscribed {
        subscription: sub,
        run_id,
        after_seq,
    })
}
