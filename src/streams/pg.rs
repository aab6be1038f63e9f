//! [`StreamStore`] on PostgreSQL, shared by the daemons of several hosts (schema:
//! `pg/schema.rs`; design: docs/design.md "PostgreSQL backend").
//!
//! - **Group commit.** Records are queued to one committer task with a connection of its own;
//!   it takes everything queued (up to [`PG_BATCH_MAX`]) and writes it in one transaction: the
//!   runs' rows (fenced: `WHERE version = from_version`), their records, their published events,
//!   a `pg_notify` per run. Every promise of the batch settles after the `COMMIT`: an append is
//!   acknowledged only once committed.
//! - **Fencing.** A record names the run version it follows. If the row has another (another
//!   host took the run over, committed, or ended it), the record is not written and its promise
//!   fails with `Fenced` (`conflict` to the client); the daemon then drops the run from memory.
//! - **The commit point** (`end_run`) goes through the same queue, so it follows the run's
//!   appends: one transaction sets `ended` and the state, writes the last events and `finish`,
//!   and deletes the records. If it fails, the run is still resumable.
//! - **Subscribers** ([`SharedStore::follow`]) read events by position from the table, then wait
//!   for a wake-up: a `NOTIFY` from any host (the payload is the run id, never data), the local
//!   committer, or a poll every [`PG_FOLLOW_POLL`] in case a notification was lost.
//!
//! Stream text is stored as JSON text, not sealed: the credential key that seals the file
//! journal never leaves its host, so rows are as confidential as the database (its roles, its
//! disk, TLS to it). docs/operations.md says so.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};

use super::error::StreamError;
use super::feed::{self, Feed, FeedTx};
use super::record::Record;
use super::store::{Head, Loaded, Out, Prepared, RunTail, SharedStore, StreamStore};
use super::EventJson;
use crate::durable::journal::{JournalError, Position, Promise, ReplayReport, Stats};
use crate::limits::{PG_BATCH_MAX, PG_FOLLOW_POLL};
use crate::pg::{Db, DbError};
use crate::timefmt::now_ms;

/// The channel every host's committer notifies and every host listens on.
const CHANNEL: &str = "holdfast_streams";

/// Events read per query by a follower.
const FOLLOW_PAGE: i64 = 512;

/// One queued write: a run's record (and/or its end), fenced by `from`.
struct Op {
    run: String,
    copy: u64,
    from: u64,
    epoch: u64,
    sid: String,
    status: String,
    next_seq: u64,
    thread: Option<String>,
    model: Option<String>,
    created_ms: u64,
    updated_ms: u64,
    /// The record's JSON (none for an end).
    body: Option<String>,
    /// The state of the commit point (an end).
    end_state: Option<String>,
    /// (pos, seq, event): the last of an end's is `finish`.
    events: Vec<(u64, u64, EventJson)>,
    promise: Arc<Promise>,
}

/// Follower wake-ups by run id.
#[derive(Default)]
struct Wakes(Mutex<HashMap<String, Weak<Notify>>>);

impl Wakes {
    fn register(&self, run: &str) -> Arc<Notify> {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = m.get(run).and_then(Weak::upgrade) {
            return n;
        }
        m.retain(|_, w| w.strong_count() > 0);
        let n = Arc::new(Notify::new());
        m.insert(run.to_owned(), Arc::downgrade(&n));
        n
    }

    fn wake(&self, run: &str) {
        let n = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(run)
            .and_then(Weak::upgrade);
        if let Some(n) = n {
            n.notify_waiters();
        }
    }

    fn wake_all(&self) {
        let all: Vec<Arc<Notify>> = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for n in all {
            n.notify_waiters();
        }
    }
}

/// The streams' store on PostgreSQL. Its queue to the committer is not capped itself: what
/// can be in it is capped where requests are admitted (in-flight requests per connection,
/// connections), as for the file journal's queue.
pub struct PgStore {
    db: Arc<Db>,
    ops: mpsc::UnboundedSender<Op>,
    wakes: Arc<Wakes>,
    stats: Arc<Stats>,
    replay: ReplayReport,
}

fn db_err(e: DbError) -> StreamError {
    StreamError::Database(e)
}

fn ok_pos() -> Result<Position, JournalError> {
    Ok(Position {
        segment: 0,
        offset: 0,
    })
}

impl PgStore {
    /// Start the committer and the listener on the database's runtime. The schema must be
    /// current (`Db::ensure_schema`).
    pub fn open(db: Arc<Db>) -> PgStore {
        let (tx, rx) = mpsc::unbounded_channel();
        let wakes = Arc::new(Wakes::default());
        let stats = Arc::new(Stats::default());
        db.spawn(committer(
            Arc::clone(&db),
            rx,
            Arc::clone(&wakes),
            Arc::clone(&stats),
        ));
        db.spawn(listener(Arc::clone(&db), Arc::clone(&wakes)));
        PgStore {
            db,
            ops: tx,
            wakes,
            stats,
            replay: ReplayReport::default(),
        }
    }

    fn send(&self, op: Op) -> Arc<Promise> {
        let p = Arc::clone(&op.promise);
        if let Err(mpsc::error::SendError(op)) = self.ops.send(op) {
            op.promise.complete(Err(JournalError::Closed));
        }
        p
    }

    fn op(tail: &RunTail<'_>, body: Option<String>, end_state: Option<String>) -> Op {
        let status = tail.status.as_str().to_owned();
        Op {
            run: tail.run.to_owned(),
            copy: tail.copy,
            from: tail.from_version,
            epoch: tail.epoch,
            sid: tail.sid.to_owned(),
            status,
            next_seq: tail.next_seq,
            thread: tail.thread.map(str::to_owned),
            model: tail.model.map(str::to_owned),
            created_ms: tail.created_ms,
            updated_ms: tail.updated_ms,
            body,
            end_state,
            events: tail
                .events
                .iter()
                .enumerate()
                .map(|(i, (seq, e))| (tail.first_pos + i as u64, *seq, Arc::clone(e)))
                .collect(),
            promise: Promise::new(),
        }
    }

    fn query<T: Send + 'static>(
        &self,
        f: impl for<'c> FnOnce(
                &'c deadpool_postgres::Object,
            ) -> std::pin::Pin<
                Box<dyn std::future::Future<Output = Result<T, DbError>> + Send + 'c>,
            > + Send
            + 'static,
    ) -> Result<T, StreamError> {
        let db = Arc::clone(&self.db);
        self.db
            .run(async move {
                let c = db.conn().await?;
                f(&c).await
            })
            .map_err(db_err)?
            .map_err(db_err)
    }
}

impl StreamStore for PgStore {
    fn prepare(&self, rec: Out<'_>) -> Result<Prepared, StreamError> {
        // Serializing a record cannot fail (its maps have string keys).
        Ok(Prepared(serde_json::to_vec(&rec).unwrap_or_default()))
    }

    fn queue(&self, _rec: Prepared) -> Arc<Promise> {
        // A record of no run (the file journal's rotation marker): nothing to keep here.
        Promise::ready(ok_pos())
    }

    fn queue_run(&self, rec: Prepared, tail: RunTail<'_>) -> Arc<Promise> {
        let body = String::from_utf8(rec.0).unwrap_or_default();
        self.stats
            .appends
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.send(Self::op(&tail, Some(body), None))
    }

    fn end_run(&self, state: &Value, tail: RunTail<'_>) -> Result<(), StreamError> {
        let p = self.send(Self::op(&tail, None, Some(state.to_string())));
        super::store::wait(&p)?;
        Ok(())
    }

    fn shared(&self) -> Option<&dyn SharedStore> {
        Some(self)
    }

    fn active_mark(&self) -> u64 {
        0
    }

    fn release_before(&self, _mark: u64) {}

    fn start_new_mark(&self) {}

    fn has_ended(&self, run_id: &str) -> bool {
        matches!(self.head(run_id), Ok(Some(Head { ended: true, .. })))
    }

    fn read_state(&self, run_id: &str) -> Result<Option<Value>, StreamError> {
        let run = run_id.to_owned();
        let text: Option<String> = self.query(move |c| {
            Box::pin(async move {
                let row = c
                    .query_opt(
                        "SELECT state FROM hf_stream_runs WHERE run_id = $1 AND ended",
                        &[&run],
                    )
                    .await?;
                Ok(row.and_then(|r| r.get::<_, Option<String>>(0)))
            })
        })?;
        text.map(|t| serde_json::from_str(&t).map_err(StreamError::StateNotJson))
            .transpose()
    }

    fn put_checkpoint(&self, run_id: &str, snapshot: &Value) -> Result<(), StreamError> {
        let (run, body) = (run_id.to_owned(), snapshot.to_string());
        self.query(move |c| {
            Box::pin(async move {
                c.execute(
                    "INSERT INTO hf_checkpoints (run_id, body, updated_ms) VALUES ($1, $2, $3)
                     ON CONFLICT (run_id) DO UPDATE SET body = $2, updated_ms = $3",
                    &[&run, &body, &(now_ms() as i64)],
                )
                .await?;
                Ok(())
            })
        })
    }

    fn get_checkpoint(&self, run_id: &str) -> Result<Option<Value>, StreamError> {
        let run = run_id.to_owned();
        let text: Option<String> = self.query(move |c| {
            Box::pin(async move {
                let row = c
                    .query_opt("SELECT body FROM hf_checkpoints WHERE run_id = $1", &[&run])
                    .await?;
                Ok(row.map(|r| r.get(0)))
            })
        })?;
        text.map(|t| serde_json::from_str(&t).map_err(StreamError::CheckpointNotJson))
            .transpose()
    }

    fn delete_checkpoint(&self, run_id: &str) -> Result<bool, StreamError> {
        let run = run_id.to_owned();
        self.query(move |c| {
            Box::pin(async move {
                let n = c
                    .execute("DELETE FROM hf_checkpoints WHERE run_id = $1", &[&run])
                    .await?;
                Ok(n > 0)
            })
        })
    }

    fn ended_ids(&self) -> Result<Vec<String>, StreamError> {
        self.query(move |c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "SELECT run_id FROM hf_stream_runs WHERE ended ORDER BY run_id",
                        &[],
                    )
                    .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
        })
    }

    fn checkpoint_ids(&self) -> Result<Vec<String>, StreamError> {
        self.query(move |c| {
            Box::pin(async move {
                let rows = c
                    .query("SELECT run_id FROM hf_checkpoints ORDER BY run_id", &[])
                    .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
        })
    }

    fn reseal_files(&self) -> Result<usize, StreamError> {
        // Nothing here is sealed with the host's key (see the module's doc).
        Ok(0)
    }

    fn stats(&self) -> &Stats {
        &self.stats
    }

    fn replay_report(&self) -> &ReplayReport {
        &self.replay
    }
}

impl SharedStore for PgStore {
    fn load(&self, run_id: &str) -> Result<Loaded, StreamError> {
        let run = run_id.to_owned();
        let (head, bodies): (Option<(i64, bool)>, Vec<String>) = self.query(move |c| {
            Box::pin(async move {
                // One snapshot for the row and its records.
                c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await?;
                let res = async {
                    let head = c
                        .query_opt(
                            "SELECT version, ended FROM hf_stream_runs WHERE run_id = $1",
                            &[&run],
                        )
                        .await?
                        .map(|r| (r.get::<_, i64>(0), r.get::<_, bool>(1)));
                    let bodies = c
                        .query(
                            "SELECT body FROM hf_stream_records WHERE run_id = $1 ORDER BY version",
                            &[&run],
                        )
                        .await?
                        .iter()
                        .map(|r| r.get::<_, String>(0))
                        .collect();
                    Ok::<_, DbError>((head, bodies))
                }
                .await;
                c.batch_execute("COMMIT").await?;
                res
            })
        })?;
        Ok(match head {
            None => Loaded::Unknown,
            Some((_, true)) => Loaded::Ended,
            Some((version, false)) => {
                let mut records = Vec::with_capacity(bodies.len());
                for b in bodies {
                    match Record::decode(b.as_bytes()) {
                        Ok(r) => records.push(r),
                        Err(e) => tracing::error!(run = %run_id, kind = ?e.classify(),
                            "stream record in the database does not read; skipped"),
                    }
                }
                Loaded::Active {
                    version: version as u64,
                    records,
                }
            }
        })
    }

    fn head(&self, run_id: &str) -> Result<Option<Head>, StreamError> {
        let run = run_id.to_owned();
        self.query(move |c| {
            Box::pin(async move {
                let row = c
                    .query_opt(
                        "SELECT sid, version, ended, host FROM hf_stream_runs WHERE run_id = $1",
                        &[&run],
                    )
                    .await?;
                Ok(row.map(|r| Head {
                    sid: r.get(0),
                    version: r.get::<_, i64>(1) as u64,
                    ended: r.get(2),
                    host: r.get(3),
                }))
            })
        })
    }

    fn follow(&self, run_id: &str, after_seq: u64) -> Result<Feed, StreamError> {
        let run = run_id.to_owned();
        let state: Option<(bool, Option<String>)> = self.query(move |c| {
            Box::pin(async move {
                let row = c
                    .query_opt(
                        "SELECT ended, state FROM hf_stream_runs WHERE run_id = $1",
                        &[&run],
                    )
                    .await?;
                Ok(row.map(|r| (r.get(0), r.get(1))))
            })
        })?;
        let (tx, rx) = feed::feed();
        match state {
            None => return Err(StreamError::NoSuchRun),
            Some((true, state)) => {
                // Ended: only its finish, as on the file backend (a refreshed page must not
                // replay the answer; it reads the final message), whatever `after_seq` is.
                let state: Value = state
                    .and_then(|s| serde_json::from_str(&s).ok())
                    .unwrap_or(Value::Null);
                let seq = state["finish_seq"].as_u64().unwrap_or(0);
                let finish = json!({"type": "finish", "status": state["status"]});
                tx.push_uncapped(seq, &super::run::event_json(&finish));
            }
            Some((false, _)) => {
                let wake = self.wakes.register(run_id);
                self.db.spawn(follower(
                    Arc::clone(&self.db),
                    run_id.to_owned(),
                    after_seq,
                    tx,
                    wake,
                ));
            }
        }
        Ok(rx)
    }

    fn list(&self) -> Result<Vec<Value>, StreamError> {
        self.query(move |c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "SELECT run_id, thread, model, status, epoch, next_seq, created_ms,
                                updated_ms, host
                         FROM hf_stream_runs WHERE NOT ended ORDER BY run_id",
                        &[],
                    )
                    .await?;
                Ok(rows
                    .iter()
                    .map(|r| {
                        json!({
                            "run_id": r.get::<_, String>(0),
                            "thread_id": r.get::<_, Option<String>>(1),
                            "model": r.get::<_, Option<String>>(2),
                            "status": r.get::<_, String>(3),
                            "epoch": r.get::<_, i64>(4),
                            "next_seq": r.get::<_, i64>(5),
                            "created_at_ms": r.get::<_, i64>(6),
                            "updated_at_ms": r.get::<_, i64>(7),
                            "host": r.get::<_, String>(8),
                        })
                    })
                    .collect())
            })
        })
    }

    fn events(&self, run_id: &str) -> Result<Vec<(u64, EventJson)>, StreamError> {
        let run = run_id.to_owned();
        let rows: Vec<(i64, String)> = self.query(move |c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "SELECT seq, body FROM hf_stream_events WHERE run_id = $1 ORDER BY pos",
                        &[&run],
                    )
                    .await?;
                Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
            })
        })?;
        Ok(rows
            .into_iter()
            .filter_map(|(seq, body)| {
                serde_json::value::RawValue::from_string(body)
                    .ok()
                    .map(|e| (seq as u64, EventJson::from(e)))
            })
            .collect())
    }

    fn sweep(&self, events_before_ms: u64) -> Result<u64, StreamError> {
        self.query(move |c| {
            Box::pin(async move {
                let a = c.execute(SWEEP_SQL[0], &[]).await?;
                let b = c
                    .execute(SWEEP_SQL[1], &[&(events_before_ms as i64)])
                    .await?;
                Ok(a + b)
            })
        })
    }

    fn host(&self) -> String {
        self.db.settings().host_name.clone()
    }

    fn written_here(&self) -> Result<Vec<String>, StreamError> {
        let host = self.db.settings().host_name.clone();
        self.query(move |c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "SELECT run_id FROM hf_stream_runs WHERE NOT ended AND host = $1",
                        &[&host],
                    )
                    .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
        })
    }

    fn interrupted(&self, before_ms: u64) -> Result<Vec<String>, StreamError> {
        self.query(move |c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "SELECT run_id FROM hf_stream_runs WHERE NOT ended \
                         AND status = 'interrupted' AND updated_ms < $1",
                        &[&(before_ms as i64)],
                    )
                    .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
        })
    }

    fn idle(&self, before_ms: u64) -> Result<Vec<String>, StreamError> {
        self.query(move |c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "SELECT run_id FROM hf_stream_runs WHERE NOT ended AND updated_ms < $1",
                        &[&(before_ms as i64)],
                    )
                    .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
        })
    }
}

/// What [`SharedStore::sweep`] runs.
const SWEEP_SQL: [&str; 2] = [
    "DELETE FROM hf_stream_records r USING hf_stream_runs s
      WHERE r.run_id = s.run_id AND s.ended",
    "DELETE FROM hf_stream_events e USING hf_stream_runs s
      WHERE e.run_id = s.run_id AND s.ended AND s.ended_ms < $1",
];

/// Follow a run's events into `tx` until its `finish` (or the subscriber leaves or lags).
async fn follower(db: Arc<Db>, run: String, after_seq: u64, tx: FeedTx, wake: Arc<Notify>) {
    // Before the first event: by seq (what the client asked); then by position.
    let mut last_pos: Option<i64> = None;
    let mut failures = 0u32;
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let page = async {
            let c = db.conn().await?;
            let rows = match last_pos {
                None => {
                    c.query(
                        // The finish even at or below `after_seq`: it ends the subscription.
                        "SELECT pos, seq, finish, body FROM hf_stream_events
                         WHERE run_id = $1 AND (seq > $2 OR finish) ORDER BY pos LIMIT $3",
                        &[&run, &(after_seq as i64), &FOLLOW_PAGE],
                    )
                    .await?
                }
                Some(p) => {
                    c.query(
                        "SELECT pos, seq, finish, body FROM hf_stream_events
                         WHERE run_id = $1 AND pos > $2 ORDER BY pos LIMIT $3",
                        &[&run, &p, &FOLLOW_PAGE],
                    )
                    .await?
                }
            };
            Ok::<_, DbError>(rows)
        }
        .await;
        let mut full = false;
        match page {
            Ok(rows) => {
                failures = 0;
                full = rows.len() as i64 == FOLLOW_PAGE;
                for r in &rows {
                    let (pos, seq, finish, body): (i64, i64, bool, String) =
                        (r.get(0), r.get(1), r.get(2), r.get(3));
                    let Ok(event) = serde_json::value::RawValue::from_string(body) else {
                        tracing::error!(run = %run, pos, "stream event in the database is not JSON; skipped");
                        last_pos = Some(pos);
                        continue;
                    };
                    if !tx.push(seq as u64, &EventJson::from(event)) {
                        // The subscriber left, or lags: it subscribes again after its last seq.
                        return;
                    }
                    last_pos = Some(pos);
                    if finish {
                        return;
                    }
                }
            }
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(run = %run, error = %e, "stream follower: reading events failed; retrying");
                }
            }
        }
        if tx.receiver_gone() {
            return;
        }
        if full {
            continue;
        }
        tokio::select! {
            () = &mut woken => {}
            () = tokio::time::sleep(PG_FOLLOW_POLL) => {
                // No wake-up: the run may have been pruned meanwhile (then nothing will come).
                if let Ok(c) = db.conn().await {
                    if let Ok(None) = c.query_opt(
                        "SELECT 1 FROM hf_stream_runs WHERE run_id = $1", &[&run]).await {
                        return;
                    }
                }
            }
        }
    }
}

/// `LISTEN` on a connection of its own; each notification wakes its run's followers. When the
/// connection is lost, every follower is woken (they read again) and it reconnects.
async fn listener(db: Arc<Db>, wakes: Arc<Wakes>) {
    let mut failures = 0u32;
    loop {
        let w = Arc::clone(&wakes);
        let conn = db
            .dedicated(move |m| {
                if let tokio_postgres::AsyncMessage::Notification(n) = m {
                    w.wake(n.payload());
                }
            })
            .await;
        match conn {
            Ok(client) => match client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
                Ok(()) => {
                    failures = 0;
                    // Events committed while no one listened are read now.
                    wakes.wake_all();
                    while !client.is_closed() {
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "PostgreSQL LISTEN failed"),
            },
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(error = %e, "PostgreSQL listener: cannot connect; retrying every second");
                }
            }
        }
        wakes.wake_all();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Run copies whose write failed with the transaction: a later op of the same copy follows a
/// record that was not written, so it fails the same way; a copy loaded afresh (another
/// number) writes from the database's version again.
type Broken = HashMap<String, (u64, Arc<dyn std::error::Error + Send + Sync>)>;

async fn committer(
    db: Arc<Db>,
    mut rx: mpsc::UnboundedReceiver<Op>,
    wakes: Arc<Wakes>,
    stats: Arc<Stats>,
) {
    let mut client: Option<(tokio_postgres::Client, tokio_postgres::Statement)> = None;
    let mut broken: Broken = HashMap::new();
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < PG_BATCH_MAX {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        // Ops following a write that failed fail with it, unsent.
        let mut live = Vec::with_capacity(batch.len());
        for op in batch {
            match broken.get(&op.run) {
                Some((copy, err)) if op.copy == *copy => {
                    op.promise
                        .complete(Err(JournalError::Backend(Arc::clone(err))));
                }
                Some(_) => {
                    broken.remove(&op.run);
                    live.push(op);
                }
                None => live.push(op),
            }
        }
        if live.is_empty() {
            continue;
        }
        if client.as_ref().is_none_or(|(c, _)| c.is_closed()) {
            client = match connect_committer(&db).await {
                Ok(c) => Some(c),
                Err(e) => {
                    fail_all(&live, &mut broken, Arc::new(e));
                    continue;
                }
            };
        }
        let Some((c, stmt)) = client.as_ref() else {
            continue;
        };
        stats
            .batches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match commit(c, stmt, &live, db.settings().host_name.as_str()).await {
            Ok(passed) => {
                stats
                    .syncs
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut woken = HashSet::new();
                for op in &live {
                    if passed.contains(&op.run) {
                        op.promise.complete(ok_pos());
                        if woken.insert(op.run.as_str()) {
                            wakes.wake(&op.run);
                        }
                    } else {
                        op.promise.complete(Err(JournalError::Fenced));
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, ops = live.len(), "PostgreSQL group commit failed; its writes fail with `storage`");
                fail_all(&live, &mut broken, Arc::new(e));
            }
        }
    }
}

fn fail_all(ops: &[Op], broken: &mut Broken, err: Arc<DbError>) {
    let err: Arc<dyn std::error::Error + Send + Sync> = err;
    for op in ops {
        broken.insert(op.run.clone(), (op.copy, Arc::clone(&err)));
        op.promise
            .complete(Err(JournalError::Backend(Arc::clone(&err))));
    }
}

/// One run's share of a batch: its ops coalesced (they follow one another by construction).
struct RunWrite<'a> {
    first: &'a Op,
    last: &'a Op,
    chained: bool,
}

/// The committer's connection and its one statement, prepared once.
async fn connect_committer(
    db: &Db,
) -> Result<(tokio_postgres::Client, tokio_postgres::Statement), DbError> {
    let c = db.dedicated(|_| {}).await?;
    let stmt = c.prepare(COMMIT_SQL).await?;
    Ok((c, stmt))
}

/// A whole batch in one statement, so one round trip and one commit (a lone statement is its
/// own transaction): the runs' rows fenced by version (`upd`) or created (`ins`), then only for
/// the runs whose fence held (`ok`) their records and events, and a notification per run
/// (sent by the server at commit). Arrays carry the batch (`unnest`), so the statement is the
/// same whatever the batch size and is prepared once per connection.
const COMMIT_SQL: &str = "
WITH i AS (
  SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[],
                       $6::text[], $7::bigint[], $8::text[], $9::text[], $10::bigint[],
                       $11::bigint[], $12::text[])
    AS t(run_id, v_from, v_to, epoch, sid, status, next_seq, thread, model, created, updated,
         state)
),
upd AS (
  UPDATE hf_stream_runs r
     SET version = i.v_to, epoch = i.epoch, sid = i.sid,
         status = CASE WHEN i.state IS NULL THEN i.status ELSE i.state::jsonb ->> 'status' END,
         next_seq = i.next_seq,
         thread = coalesce(i.thread, r.thread), model = coalesce(i.model, r.model),
         updated_ms = i.updated, host = $13,
         ended = i.state IS NOT NULL,
         ended_ms = CASE WHEN i.state IS NOT NULL THEN i.updated END,
         state = i.state
    FROM i
   WHERE i.v_from > 0 AND r.run_id = i.run_id AND r.version = i.v_from AND NOT r.ended
  RETURNING r.run_id
),
ins AS (
  INSERT INTO hf_stream_runs (run_id, version, epoch, sid, status, next_seq, thread, model, host,
                              created_ms, updated_ms, ended, ended_ms, state)
  SELECT i.run_id, i.v_to, i.epoch, i.sid,
         CASE WHEN i.state IS NULL THEN i.status ELSE i.state::jsonb ->> 'status' END,
         i.next_seq, i.thread, i.model, $13, i.created, i.updated, i.state IS NOT NULL,
         CASE WHEN i.state IS NOT NULL THEN i.updated END, i.state
    FROM i WHERE i.v_from = 0
  ON CONFLICT (run_id) DO NOTHING
  RETURNING run_id
),
ok AS (SELECT run_id FROM upd UNION ALL SELECT run_id FROM ins),
recs AS (
  INSERT INTO hf_stream_records (run_id, version, body)
  SELECT t.run_id, t.version, t.body
    FROM unnest($14::text[], $15::bigint[], $16::text[]) AS t(run_id, version, body)
   WHERE t.run_id IN (SELECT run_id FROM ok)
),
evs AS (
  INSERT INTO hf_stream_events (run_id, pos, seq, finish, body)
  SELECT t.run_id, t.pos, t.seq, t.finish, t.body
    FROM unnest($17::text[], $18::bigint[], $19::bigint[], $20::boolean[], $21::text[])
      AS t(run_id, pos, seq, finish, body)
   WHERE t.run_id IN (SELECT run_id FROM ok)
)
SELECT run_id, pg_notify('holdfast_streams', run_id) FROM ok";

/// Write a batch (one statement: [`COMMIT_SQL`]); the runs whose fence held.
async fn commit(
    c: &tokio_postgres::Client,
    stmt: &tokio_postgres::Statement,
    ops: &[Op],
    host: &str,
) -> Result<HashSet<String>, DbError> {
    let mut runs: Vec<RunWrite<'_>> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for op in ops {
        match index.get(op.run.as_str()) {
            Some(&i) => {
                let w = &mut runs[i];
                w.chained &= op.from == w.last.from + 1 && w.last.end_state.is_none();
                w.last = op;
            }
            None => {
                index.insert(&op.run, runs.len());
                runs.push(RunWrite {
                    first: op,
                    last: op,
                    chained: true,
                });
            }
        }
    }
    // Runs whose ops do not follow one another are not written (fenced).
    let mut cols = Cols::default();
    for w in runs.iter().filter(|w| w.chained) {
        cols.push(w);
    }
    let (mut r_run, mut r_ver, mut r_body) = (Vec::new(), Vec::new(), Vec::new());
    let (mut e_run, mut e_pos, mut e_seq, mut e_fin, mut e_body) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut ended = Vec::new();
    for op in ops {
        if let Some(b) = &op.body {
            r_run.push(op.run.as_str());
            r_ver.push((op.from + 1) as i64);
            r_body.push(b.as_str());
        }
        let n = op.events.len();
        for (i, (pos, seq, e)) in op.events.iter().enumerate() {
            e_run.push(op.run.as_str());
            e_pos.push(*pos as i64);
            e_seq.push(*seq as i64);
            e_fin.push(op.end_state.is_some() && i + 1 == n);
            e_body.push(e.get());
        }
        if op.end_state.is_some() {
            ended.push(op.run.as_str());
        }
    }
    let rows = c
        .query(
            stmt,
            &[
                &cols.run,
                &cols.v_from,
                &cols.v_to,
                &cols.epoch,
                &cols.sid,
                &cols.status,
                &cols.next_seq,
                &cols.thread,
                &cols.model,
                &cols.created,
                &cols.updated,
                &cols.state,
                &host,
                &r_run,
                &r_ver,
                &r_body,
                &e_run,
                &e_pos,
                &e_seq,
                &e_fin,
                &e_body,
            ],
        )
        .await?;
    let passed: HashSet<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
    let ended: Vec<&str> = ended.into_iter().filter(|r| passed.contains(*r)).collect();
    if !ended.is_empty() {
        // An ended run is never loaded again (a load reads `ended` first), so its records are
        // only space: deleted after the commit point, in their own statement. If that fails the
        // expiry job's sweep deletes them later.
        if let Err(e) = c
            .execute(
                "DELETE FROM hf_stream_records WHERE run_id = ANY($1::text[])",
                &[&ended],
            )
            .await
        {
            tracing::warn!(error = %e, "could not delete the records of ended runs (left for the sweep)");
        }
    }
    Ok(passed)
}

/// Column arrays of one statement.
#[derive(Default)]
struct Cols {
    run: Vec<String>,
    v_from: Vec<i64>,
    v_to: Vec<i64>,
    epoch: Vec<i64>,
    sid: Vec<String>,
    status: Vec<String>,
    next_seq: Vec<i64>,
    thread: Vec<Option<String>>,
    model: Vec<Option<String>>,
    created: Vec<i64>,
    updated: Vec<i64>,
    state: Vec<Option<String>>,
}

impl Cols {
    fn push(&mut self, w: &RunWrite<'_>) {
        let (f, l) = (w.first, w.last);
        self.run.push(l.run.clone());
        self.v_from.push(f.from as i64);
        self.v_to.push((l.from + 1) as i64);
        self.epoch.push(l.epoch as i64);
        self.sid.push(l.sid.clone());
        self.status.push(l.status.clone());
        self.next_seq.push(l.next_seq as i64);
        // The thread or model any op of the batch gave (a begin's), the latest first.
        self.thread
            .push(l.thread.clone().or_else(|| f.thread.clone()));
        self.model.push(l.model.clone().or_else(|| f.model.clone()));
        self.created.push(f.created_ms as i64);
        self.updated.push(l.updated_ms as i64);
        self.state.push(l.end_state.clone());
    }
}
