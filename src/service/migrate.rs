//! `holdfast migrate --to postgres | file`: move a data set's streams, checkpoints and run
//! logs from one backend to the other, then check the copy by reading it back through a fresh
//! open of the target (a file journal replayed, a database loaded) and comparing it with the
//! source, record for record. Credentials stay where they are (per host). The target must be
//! empty; the source is left as it was. No daemon may be running on the data directory (the
//! journal's lock says so).

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::Daemon;
use crate::config::Config;
use crate::pg::DbError;
use crate::runlog::RunLogError;
use crate::streams::{Export, StreamError, Streams};

/// Where the data set goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Into the `[backend]` database.
    Postgres,
    /// Into the data directory's files.
    File,
}

/// What was moved (and verified).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Moved {
    /// Active runs (each whole: events, accumulator, holder).
    pub active_runs: usize,
    /// Their events.
    pub events: usize,
    /// Ended runs (their state).
    pub ended_runs: usize,
    /// Checkpoints.
    pub checkpoints: usize,
    /// Run logs.
    pub run_logs: usize,
    /// Their records.
    pub run_log_records: usize,
}

/// Why a move failed. Nothing in the source is changed by a failed move; what was written to
/// the target may be partial (it was empty: empty it again, or move into a new one).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// No database to move to or from.
    #[error("no PostgreSQL backend configured: set [backend] url in the config file (kind may stay \"file\" until the move is done)")]
    NoDatabase,
    /// The database settings are wrong.
    #[error(transparent)]
    Db(#[from] DbError),
    /// The data directory cannot be opened.
    #[error(transparent)]
    Paths(#[from] crate::paths::PathError),
    /// The streams failed (a daemon holds the journal, a key is missing, the database failed).
    #[error(transparent)]
    Streams(#[from] StreamError),
    /// The run logs failed.
    #[error(transparent)]
    RunLog(#[from] RunLogError),
    /// The target already holds data.
    #[error("the {0} backend already holds streams or run logs: a move goes into an empty one (nothing was written)")]
    NotEmpty(&'static str),
    /// Reading the copy back did not give the source.
    #[error("verification failed: {0} differs between the source and the copy")]
    Mismatch(String),
}

struct Side {
    _daemon: Daemon,
    streams: Arc<Streams>,
    log: Arc<crate::runlog::RunLog>,
}

fn open(data_dir: &Path, config: &Config, kind: &str) -> Result<Side, MigrateError> {
    let mut config = config.clone();
    config.backend.kind = Some(kind.to_owned());
    let daemon = Daemon::open(
        data_dir.join("migrate.sock"),
        data_dir.to_path_buf(),
        config,
    )?;
    let streams = daemon.streams()?;
    let log = daemon.run_log()?;
    Ok(Side {
        _daemon: daemon,
        streams,
        log,
    })
}

type Logs = Vec<(
    String,
    Vec<(u8, serde_json::Map<String, Value>)>,
    Option<Value>,
)>;

fn logs_of(side: &Side) -> Result<Logs, MigrateError> {
    let mut out = Vec::new();
    for id in side.log.run_ids()? {
        let (lines, summary) = side.log.export(&id)?;
        out.push((id, lines, summary));
    }
    Ok(out)
}

fn same(
    what: &str,
    a: &impl serde::Serialize,
    b: &impl serde::Serialize,
) -> Result<(), MigrateError> {
    let (a, b) = (serde_json::to_value(a).ok(), serde_json::to_value(b).ok());
    if a.is_none() || a != b {
        return Err(MigrateError::Mismatch(what.to_owned()));
    }
    Ok(())
}

fn compare(
    src: &Export,
    src_logs: &Logs,
    dst: &Export,
    dst_logs: &Logs,
) -> Result<(), MigrateError> {
    if src.active.len() != dst.active.len() {
        return Err(MigrateError::Mismatch("the number of active runs".into()));
    }
    for (a, b) in src.active.iter().zip(&dst.active) {
        same(&format!("active run {:?}", a.run), a, b)?;
    }
    same("the ended runs' states", &src.ended, &dst.ended)?;
    same("the checkpoints", &src.checkpoints, &dst.checkpoints)?;
    same("the run logs", src_logs, dst_logs)?;
    Ok(())
}

/// Move the data set of `data_dir` to `to`; `progress` hears each step.
pub fn migrate(
    data_dir: &Path,
    config: &Config,
    to: Target,
    progress: &dyn Fn(&str),
) -> Result<Moved, MigrateError> {
    if config.backend.url.is_none() {
        return Err(MigrateError::NoDatabase);
    }
    let (from_kind, to_kind) = match to {
        Target::Postgres => ("file", "postgres"),
        Target::File => ("postgres", "file"),
    };
    progress(&format!(
        "opening the source ({from_kind}) and the target ({to_kind})"
    ));
    let src = open(data_dir, config, from_kind)?;
    let dst = open(data_dir, config, to_kind)?;
    if !dst.streams.is_empty()? || !dst.log.run_ids()?.is_empty() {
        return Err(MigrateError::NotEmpty(to_kind));
    }
    progress("reading the source");
    let data = src.streams.export()?;
    let logs = logs_of(&src)?;
    let moved = Moved {
        active_runs: data.active.len(),
        events: data.active.iter().map(|s| s.events.len()).sum(),
        ended_runs: data.ended.len(),
        checkpoints: data.checkpoints.len(),
        run_logs: logs.len(),
        run_log_records: logs.iter().map(|(_, l, _)| l.len()).sum(),
    };
    progress(&format!(
        "writing {} active runs ({} events), {} ended runs, {} checkpoints",
        moved.active_runs, moved.events, moved.ended_runs, moved.checkpoints
    ));
    dst.streams.import(&data)?;
    progress(&format!(
        "writing {} run logs ({} records)",
        moved.run_logs, moved.run_log_records
    ));
    for (i, (id, lines, summary)) in logs.iter().enumerate() {
        dst.log.import(id, lines, summary.as_ref())?;
        if (i + 1) % 100 == 0 {
            progress(&format!("  {} of {} run logs", i + 1, logs.len()));
        }
    }
    // Read the copy back through a fresh open (the journal replayed, the database loaded).
    drop(dst);
    progress("verifying: the target opened afresh and compared with the source");
    let check = open(data_dir, config, to_kind)?;
    let copy = check.streams.export()?;
    let copy_logs = logs_of(&check)?;
    compare(&data, &logs, &copy, &copy_logs)?;
    Ok(moved)
}
