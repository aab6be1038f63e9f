//! Run logs on PostgreSQL (`[backend] kind = "postgres"`), shared by the daemons of several
//! hosts: the same operations, views and rules as on files (`mod.rs`), with the run's lock an
//! advisory transaction lock and its files rows (schema: `pg/schema.rs`, version 2).
//!
//! Every operation is one transaction: `pg_advisory_xact_lock` on the run (what `log.lock` is
//! on files, across hosts), the run's row read — its version says whether this daemon's cached
//! view is current or must be read again from the lines —, the decision on the view, the
//! writes, a version bump, `COMMIT`. The lines keep their file order (`pos`), so a view read
//! from rows is the view read from files; each carries its logical key, unique per run.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::error::RunLogError;
use super::files::RunFiles;
use super::schema::{node_key, step_key, Key};
use super::view::{Entry, Kind, Loaded, KINDS};
use super::writer::Writer;
use crate::pg::{Db, DbError, Param, Session};
use crate::timefmt::now_ms;

/// The run logs in a database.
pub(super) struct PgRuns {
    pub(super) db: Arc<Db>,
}

fn db(e: DbError) -> RunLogError {
    RunLogError::Database(e)
}

fn p<T: tokio_postgres::types::ToSql + Sync + Send + 'static>(v: T) -> Param {
    Box::new(v)
}

/// The lock key of a run's log (another namespace than any other holdfast advisory lock).
fn lock_key(run_id: &str) -> String {
    format!("holdfast run log {run_id}")
}

/// A record's logical key, as stored (unique per run and kind); none for recovery events.
fn key_of(kind: Kind, record: &Map<String, Value>) -> Option<String> {
    let pair = |a: &str, b: Value| serde_json::to_string(&(a, b)).ok();
    // A record without a writer keys as `[node, n]`, as before writers existed.
    let keyed = |k: Key| match k.writer.is_empty() {
        true => pair(&k.node, k.n.into()),
        false => serde_json::to_string(&(&k.node, k.n, &k.writer)).ok(),
    };
    match kind {
        Kind::Details => node_key(record).ok().and_then(keyed),
        Kind::Steps => step_key(record).ok().and_then(keyed),
        Kind::Tools => {
            let id = record.get("tool_use_id").and_then(Value::as_str)?;
            pair(id, record.get("event").cloned().unwrap_or(Value::Null))
        }
        Kind::Recovery => None,
    }
}

impl PgRuns {
    /// Run `f` on the up-to-date view of `run_id` in one transaction under the run's lock.
    /// With `create`, a run with no log gets one; without, it is `not_found`.
    pub(super) fn with_run<T>(
        &self,
        run_id: &str,
        create: bool,
        view: &mut Loaded,
        f: impl FnOnce(&mut dyn Writer, &mut Loaded) -> Result<T, RunLogError>,
    ) -> Result<T, RunLogError> {
        let mut s = Session::open(&self.db).map_err(db)?;
        s.begin().map_err(db)?;
        let out = self.in_tx(&mut s, run_id, create, view, f);
        match out {
            Ok((v, true)) => match s.commit() {
                Ok(()) => Ok(v),
                Err(e) => {
                    *view = Loaded::default();
                    Err(db(e))
                }
            },
            Ok((v, false)) => {
                s.rollback();
                Ok(v)
            }
            Err(e) => {
                s.rollback();
                *view = Loaded::default();
                Err(e)
            }
        }
    }

    /// The transaction's body: (the result, whether to commit).
    fn in_tx<T>(
        &self,
        s: &mut Session,
        run_id: &str,
        create: bool,
        view: &mut Loaded,
        f: impl FnOnce(&mut dyn Writer, &mut Loaded) -> Result<T, RunLogError>,
    ) -> Result<(T, bool), RunLogError> {
        s.query(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            vec![p(lock_key(run_id))],
        )
        .map_err(db)?;
        let row = s
            .query(
                "SELECT version, summary FROM hf_run_logs WHERE run_id = $1",
                vec![p(run_id.to_owned())],
            )
            .map_err(db)?;
        let (version, summary) = match row.first() {
            Some(r) => (r.get::<_, i64>(0) as u64, r.get::<_, Option<String>>(1)),
            None if !create => return Err(RunLogError::NoRun(run_id.to_owned())),
            None => {
                let now = now_ms() as i64;
                s.query(
                    "INSERT INTO hf_run_logs (run_id, version, created_ms, updated_ms)
                     VALUES ($1, 0, $2, $2)",
                    vec![p(run_id.to_owned()), p(now)],
                )
                .map_err(db)?;
                (0, None)
            }
        };
        if view.store_version != Some(version) {
            *view = Loaded::default();
            let lines = s
                .query(
                    "SELECT kind, body FROM hf_run_log_lines WHERE run_id = $1 ORDER BY kind, pos",
                    vec![p(run_id.to_owned())],
                )
                .map_err(db)?;
            for r in &lines {
                let (k, body): (i16, String) = (r.get(0), r.get(1));
                if let Some(kind) = KINDS.get(k as usize) {
                    view.take_line(*kind, body.as_bytes());
                }
            }
            view.store_version = Some(version);
        }
        view.summary =
            match summary {
                Some(text) => Some(serde_json::from_str(&text).map_err(|e| {
                    RunLogError::BadStoredSummary {
                        run_id: run_id.to_owned(),
                        reason: e.to_string(),
                    }
                })?),
                None => None,
            };
        let mut w = PgWriter {
            s,
            run_id,
            wrote: false,
        };
        let out = f(&mut w, view)?;
        if !w.wrote {
            return Ok((out, false));
        }
        let rows = s
            .query(
                "UPDATE hf_run_logs SET version = version + 1, updated_ms = $2
                 WHERE run_id = $1 RETURNING version",
                vec![p(run_id.to_owned()), p(now_ms() as i64)],
            )
            .map_err(db)?;
        // A replacement asked for the view to be read again (`None`): it stays so.
        if view.store_version.is_some() {
            view.store_version = rows.first().map(|r| r.get::<_, i64>(0) as u64);
        }
        Ok((out, true))
    }

    /// Every run with a log.
    pub(super) fn run_ids(&self) -> Result<Vec<String>, RunLogError> {
        let mut s = Session::open(&self.db).map_err(db)?;
        let rows = s
            .query("SELECT run_id FROM hf_run_logs ORDER BY run_id", Vec::new())
            .map_err(db)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Runs whose log has not changed since before `cutoff`, with their last change.
    pub(super) fn idle(&self, cutoff: u64) -> Result<Vec<(String, u64)>, RunLogError> {
        let mut s = Session::open(&self.db).map_err(db)?;
        let rows = s
            .query(
                "SELECT run_id, updated_ms FROM hf_run_logs WHERE updated_ms < $1 ORDER BY run_id",
                vec![p(cutoff as i64)],
            )
            .map_err(db)?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get::<_, i64>(1) as u64))
            .collect())
    }

    /// Delete a run's log under its lock if it is still idle since before `cutoff`.
    pub(super) fn delete_run(&self, run_id: &str, cutoff: u64) -> Result<bool, RunLogError> {
        let mut s = Session::open(&self.db).map_err(db)?;
        s.begin().map_err(db)?;
        let res = (|| {
            s.query(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                vec![p(lock_key(run_id))],
            )?;
            let gone = s.query(
                "DELETE FROM hf_run_logs WHERE run_id = $1 AND updated_ms < $2 RETURNING run_id",
                vec![p(run_id.to_owned()), p(cutoff as i64)],
            )?;
            if gone.is_empty() {
                return Ok(false);
            }
            s.query(
                "DELETE FROM hf_run_log_lines WHERE run_id = $1",
                vec![p(run_id.to_owned())],
            )?;
            Ok(true)
        })();
        match res {
            Ok(deleted) => {
                s.commit().map_err(db)?;
                Ok(deleted)
            }
            Err(e) => {
                s.rollback();
                Err(db(e))
            }
        }
    }
}

/// [`Writer`] inside a run's transaction.
struct PgWriter<'a> {
    s: &'a mut Session,
    run_id: &'a str,
    wrote: bool,
}

impl PgWriter<'_> {
    fn insert(
        &mut self,
        kind: Kind,
        pos: u64,
        record: &Map<String, Value>,
        line: Vec<u8>,
    ) -> Result<(), RunLogError> {
        let body = String::from_utf8(line).unwrap_or_default();
        self.s
            .query(
                "INSERT INTO hf_run_log_lines (run_id, kind, pos, key, body)
                 VALUES ($1, $2, $3, $4, $5)",
                vec![
                    p(self.run_id.to_owned()),
                    p(kind.index() as i16),
                    p(pos as i64),
                    p(key_of(kind, record)),
                    p(body),
                ],
            )
            .map_err(db)?;
        self.wrote = true;
        Ok(())
    }
}

impl PgWriter<'_> {
    /// Insert a new line (line, seq, the counter after it, its time) and note it in the view.
    fn put(
        &mut self,
        view: &mut Loaded,
        kind: Kind,
        record: Map<String, Value>,
        (line, seq, next_seq, at): (Vec<u8>, u64, u64, u64),
    ) -> Result<Entry, RunLogError> {
        let pos = view.files[kind.index()].next_pos;
        self.insert(kind, pos, &record, line)?;
        view.files[kind.index()].next_pos = pos + 1;
        view.next_seq = next_seq;
        view.first_ms = Some(view.first_ms.map_or(at, |f| f.min(at)));
        view.last_ms = Some(view.last_ms.map_or(at, |l| l.max(at)));
        Ok(Entry { seq, pos, record })
    }
}

impl Writer for PgWriter<'_> {
    fn append(
        &mut self,
        view: &mut Loaded,
        kind: Kind,
        mut record: Map<String, Value>,
    ) -> Result<Entry, RunLogError> {
        let stamped = RunFiles::stamp(view, &mut record)?;
        self.put(view, kind, record, stamped)
    }

    fn append_as_is(
        &mut self,
        view: &mut Loaded,
        kind: Kind,
        record: Map<String, Value>,
    ) -> Result<Entry, RunLogError> {
        let stamped = super::files::as_is(view, &record)?;
        self.put(view, kind, record, stamped)
    }

    fn replace(
        &mut self,
        view: &mut Loaded,
        kind: Kind,
        old: &Entry,
        mut record: Map<String, Value>,
    ) -> Result<Entry, RunLogError> {
        let (line, seq, _, _) = RunFiles::stamp(view, &mut record)?;
        let body = String::from_utf8(line).unwrap_or_default();
        self.s
            .query(
                "UPDATE hf_run_log_lines SET body = $4, key = $5
                 WHERE run_id = $1 AND kind = $2 AND pos = $3",
                vec![
                    p(self.run_id.to_owned()),
                    p(kind.index() as i16),
                    p(old.pos as i64),
                    p(body),
                    p(key_of(kind, &record)),
                ],
            )
            .map_err(db)?;
        self.wrote = true;
        // Read the view again from the rows at the next use (as the file backend reloads
        // after a rewrite).
        view.store_version = None;
        Ok(Entry {
            seq,
            pos: old.pos,
            record,
        })
    }

    fn write_summary(&mut self, summary: &Value) -> Result<(), RunLogError> {
        self.s
            .query(
                "UPDATE hf_run_logs SET summary = $2 WHERE run_id = $1",
                vec![p(self.run_id.to_owned()), p(summary.to_string())],
            )
            .map_err(db)?;
        self.wrote = true;
        Ok(())
    }

    fn remove_summary(&mut self) -> Result<(), RunLogError> {
        self.s
            .query(
                "UPDATE hf_run_logs SET summary = NULL WHERE run_id = $1",
                vec![p(self.run_id.to_owned())],
            )
            .map_err(db)?;
        self.wrote = true;
        Ok(())
    }
}
