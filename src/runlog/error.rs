//! The errors of run-log operations. Each variant is one thing that went wrong, with the data
//! its message needs, and maps to exactly one error kind of the protocol
//! ([`RunLogError::kind`]); storage failures carry the durable layer's own error.

use std::path::PathBuf;

use crate::durable::{IoError, LockError};
use crate::error::ErrorKind;

/// A run-log operation that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunLogError {
    // ---- the request is wrong (invalid_params) ----
    /// A run id that cannot name a directory.
    #[error("run_id must be 1-{max} characters of A-Z a-z 0-9 - _ . : and not start with a dot")]
    BadRunId {
        /// The longest run id.
        max: usize,
    },
    /// A key field that is missing or not a short string.
    #[error("{what}.{field} (a non-empty string of at most {max} bytes) is required")]
    MissingString {
        /// The record (`detail`, `step`, `tool call`).
        what: String,
        /// The field.
        field: String,
        /// The longest accepted.
        max: usize,
    },
    /// An optional key field given, but not a short non-empty string.
    #[error("{what}.{field}, when given, must be a non-empty string of at most {max} bytes")]
    BadString {
        /// The record (`detail`, `step`).
        what: String,
        /// The field.
        field: String,
        /// The longest accepted.
        max: usize,
    },
    /// A key field that is missing and has no default.
    #[error("{what}.{field} (a non-negative integer) is required")]
    MissingInteger {
        /// The record.
        what: String,
        /// The field.
        field: String,
    },
    /// A key field that is not a non-negative integer.
    #[error("{what}.{field} must be a non-negative integer")]
    BadInteger {
        /// The record.
        what: String,
        /// The field.
        field: String,
    },
    /// `detail.node_id` names another node than `node_id`.
    #[error("detail.node_id differs from node_id")]
    NodeIdDiffers,
    /// A status `run.end` does not know.
    #[error("status must be one of {0}")]
    BadStatus(String),
    /// A record over the size cap.
    #[error("a record is at most {max} bytes; this one is {len}")]
    RecordTooLarge {
        /// The cap.
        max: usize,
        /// This one.
        len: usize,
    },
    /// A file too large to rewrite for a replacement.
    #[error("this run's log is too large to rewrite an entry of")]
    TooLargeToRewrite,

    // ---- not there, or final ----
    /// No run log for the run.
    #[error("no run log for run {0:?}")]
    NoRun(String),
    /// A log moved in where the run already has one.
    #[error("run {0:?} already has a run log here: a move goes into an empty backend")]
    NotEmpty(String),
    /// The run has ended: its log is final.
    #[error("run {0:?} has ended (run.end); its log and summary are final")]
    Ended(String),

    // ---- the files ----
    /// The run's lock is held by someone else for the whole timeout.
    #[error(transparent)]
    Busy(#[from] LockError),
    /// A file-system step failed.
    #[error(transparent)]
    Io(IoError),
    /// A path under the data directory holdfast will not write through: a symlink, or
    /// something that is not a directory, where it keeps a directory or a file. This request
    /// is refused; nothing is poisoned, and other runs are not affected.
    #[error(transparent)]
    UnsafePath(IoError),
    /// A path that should be a directory or a file is something else.
    #[error("{} is not a {what}", path.display())]
    NotA {
        /// The path.
        path: PathBuf,
        /// `directory` or `file`.
        what: &'static str,
    },
    /// Reading a path failed.
    #[error("{}: {source}", path.display())]
    Read {
        /// The path.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// `summary.json` is not JSON.
    #[error("{}: not JSON ({reason})", path.display())]
    BadSummary {
        /// The path.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// A file says it wrote the largest seq: no record can follow.
    #[error(
        "this run log's seq counter is at its maximum (a file holds seq 18446744073709551615): \
         start a new run"
    )]
    SeqExhausted,

    // ---- the database (the PostgreSQL backend) ----
    /// The database failed (unreachable, a statement refused).
    #[error(transparent)]
    Database(#[from] crate::pg::DbError),
    /// A stored summary is not JSON.
    #[error("the summary stored for run {run_id:?} is not JSON ({reason})")]
    BadStoredSummary {
        /// The run.
        run_id: String,
        /// The parser's message.
        reason: String,
    },
}

impl RunLogError {
    /// The protocol's error kind: one per variant, here only.
    pub fn kind(&self) -> ErrorKind {
        use RunLogError::*;
        match self {
            BadRunId { .. }
            | MissingString { .. }
            | BadString { .. }
            | MissingInteger { .. }
            | BadInteger { .. }
            | NodeIdDiffers
            | BadStatus(_)
            | RecordTooLarge { .. }
            | TooLargeToRewrite => ErrorKind::InvalidParams,
            NoRun(_) => ErrorKind::NotFound,
            Ended(_) | NotEmpty(_) => ErrorKind::Conflict,
            Busy(_) => ErrorKind::Busy,
            UnsafePath(_) => ErrorKind::Forbidden,
            Io(_) | NotA { .. } | Read { .. } | Database(_) => ErrorKind::Storage,
            BadSummary { .. } | SeqExhausted | BadStoredSummary { .. } => ErrorKind::Integrity,
        }
    }
}

impl From<IoError> for RunLogError {
    /// A refused path is its own variant (`forbidden`); every other step's failure is `Io`.
    fn from(e: IoError) -> Self {
        if e.is_unsafe_path() {
            RunLogError::UnsafePath(e)
        } else {
            RunLogError::Io(e)
        }
    }
}
