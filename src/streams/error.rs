//! The errors of stream operations. Each variant is one thing that went wrong, with the data
//! its message needs, and maps to exactly one error kind of the protocol ([`StreamError::kind`]);
//! the message (`Display`) is what the client and the log see. Storage failures carry the
//! durable layer's own error.

use super::accum::{BatchError, EventError};
use super::store::SealError;
use crate::durable::journal::JournalError;
use crate::durable::IoError;
use crate::error::ErrorKind;
use crate::recovery::InputError;

/// A stream operation that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    // ---- the request is wrong (invalid_params) ----
    /// A run id that cannot name a directory.
    #[error("run_id must be 1-{max} characters of A-Z a-z 0-9 - _ . : and not start with a dot")]
    BadRunId {
        /// The longest run id.
        max: usize,
    },
    /// An append without events.
    #[error("events must not be empty")]
    NoEvents,
    /// An append that would take the run's content past what one run can commit.
    #[error("this append would take the run's text and tool-call arguments past {max} bytes (as JSON), the most one run keeps and can commit; commit or abort the run (everything acknowledged so far is kept) and go on in a new one")]
    RunTooLarge {
        /// [`crate::streams::accum::MAX_RUN_CONTENT_BYTES`].
        max: usize,
    },
    /// An append with more events than allowed.
    #[error("at most {max} events per append")]
    TooManyEvents {
        /// The cap (`[streams] max_events_per_append`).
        max: usize,
    },
    /// One event does not parse.
    #[error("events[{index}]: {reason}")]
    BadEvent {
        /// Its index in the request.
        index: usize,
        /// What is wrong with it.
        reason: EventError,
    },
    /// A batch of events that does not fit the run (a tool call ended twice, …).
    #[error(transparent)]
    BadBatch(BatchError),
    /// Seqs start at 1.
    #[error("seq starts at 1")]
    SeqZero,
    /// A batch that would leave a gap.
    #[error("gap: the next seq is {next}, this batch starts at {got}")]
    Gap {
        /// The run's next seq.
        next: u64,
        /// The batch's first.
        got: u64,
    },
    /// A cause object with a field it does not have.
    #[error("cause: unexpected field {0:?} (a cause object has cause and retry_after)")]
    CauseField(String),
    /// A cause of the wrong shape.
    #[error("cause must be a cause name, or {{status, message, retry_after}} of a provider error")]
    CauseShape,
    /// The cause does not read.
    #[error(transparent)]
    BadCause(InputError),
    /// A checkpoint with a field the snapshot contract does not have.
    #[error("unknown snapshot field {field:?}; fields: {fields}")]
    SnapshotField {
        /// The field (at most 40 characters of it).
        field: String,
        /// The fields there are.
        fields: String,
    },
    /// `content_from_stream` with a final message that is not an object.
    #[error("content_from_stream needs final_message to be an object")]
    FinalMessageShape,
    /// `snapshot.run_id` names another run.
    #[error("snapshot.run_id differs from run_id")]
    SnapshotRunId,

    // ---- not there (not_found) ----
    /// No active stream for the run.
    #[error("no active stream for this run_id (never begun, or already committed or aborted)")]
    NotActive,
    /// Nothing to resume.
    #[error("no resumable stream for this run_id (never begun, or committed or aborted)")]
    NotResumable,
    /// The run never existed here (or was pruned).
    #[error("no such run (never begun, or pruned)")]
    NoSuchRun,
    /// No checkpoint for the run.
    #[error("no checkpoint for this run")]
    NoCheckpoint,

    // ---- someone else's turn (conflict) ----
    /// The caller's stream id is not the run's holder: it was taken over.
    #[error(
        "stream_id is not the current holder of this run (epoch {epoch}): another producer took \
         it over; stop producing"
    )]
    NotHolder {
        /// The holder's epoch.
        epoch: u64,
    },
    /// The holder's connection closed without a commit or abort: its stream id was retired.
    #[error(
        "this run's producer was lost (its connection closed without stream.commit or \
         stream.abort): stream.resume the run to go on"
    )]
    ProducerLost,
    /// The run's state file is being written.
    #[error("the run is being committed or aborted right now")]
    Ending,
    /// The run's recovery plan was `fail`.
    #[error("the recovery plan for this run was fail: abort it (stream.abort), or let it expire")]
    Failed,
    /// `stream.begin` on a streaming run without `takeover`.
    #[error(
        "run is already streaming (epoch {epoch}); pass takeover: true to take it over (the \
         current holder's appends then fail), or stream.resume"
    )]
    Streaming {
        /// The holder's epoch.
        epoch: u64,
    },
    /// The run has ended.
    #[error("run already {status}; it cannot stream again")]
    Ended {
        /// How it ended (`committed`, `aborted`, `expired`, or `ended` if unreadable).
        status: String,
    },

    // ---- the daemon is full (busy) ----
    /// Too many active runs.
    #[error("{max} runs are active; commit or abort some first")]
    TooManyRuns {
        /// The cap (`[streams] max_active_runs`).
        max: usize,
    },

    // ---- keys and files ----
    /// There is no default store, whose key seals the streams.
    #[error(
        "streams are sealed with the default store's key, and there is no default store yet: \
         run `holdfast init`"
    )]
    NoKeyStore,
    /// The default store, whose key seals the streams, did not open.
    #[error("the default store (whose key seals streams) did not open: {0}")]
    KeyStoreFailed(#[source] std::sync::Arc<dyn std::error::Error + Send + Sync>),
    /// The default store's key is unavailable.
    #[error("streams are sealed with the default store's key, which is unavailable: {0}")]
    KeySealed(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Sealing a record failed.
    #[error(transparent)]
    Seal(SealError),
    /// A sealed file (`what` names it: a path in the log, a word to a client) did not read.
    #[error("{what}: {source}")]
    Unreadable {
        /// The file.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A sealed file does not decrypt with any of the keys.
    #[error("{what} does not decrypt: {source}")]
    Undecryptable {
        /// The file.
        what: String,
        /// What the sealer said.
        #[source]
        source: SealError,
    },
    /// The journal no longer gives the events memory dropped of an active run (it was damaged
    /// behind the daemon's back).
    #[error(
        "run {run_id:?}: the stream journal no longer holds the events of it that memory dropped"
    )]
    EventsLost {
        /// The run.
        run_id: String,
    },
    /// A run's state (how it ended) decrypts but is not JSON.
    #[error("the run's state (how it ended) is not JSON: {0}")]
    StateNotJson(#[source] serde_json::Error),
    /// A checkpoint decrypts but is not JSON.
    #[error("checkpoint is not JSON: {0}")]
    CheckpointNotJson(#[source] serde_json::Error),
    /// A file-system step failed.
    #[error(transparent)]
    Io(IoError),
    /// A path under the data directory holdfast will not write through: a symlink, or
    /// something that is not a directory, where it keeps a directory or a file. This request
    /// is refused; nothing is poisoned, and other runs are not affected.
    #[error(transparent)]
    UnsafePath(IoError),
    /// The journal refused or failed.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The PostgreSQL backend failed (unreachable, a query refused, a schema it cannot use).
    #[error(transparent)]
    Database(#[from] crate::pg::DbError),
}

impl StreamError {
    /// The protocol's error kind: one per variant, here only.
    pub fn kind(&self) -> ErrorKind {
        use StreamError::*;
        match self {
            BadRunId { .. }
            | NoEvents
            | TooManyEvents { .. }
            | RunTooLarge { .. }
            | BadEvent { .. }
            | BadBatch(_)
            | SeqZero
            | Gap { .. }
            | CauseField(_)
            | CauseShape
            | BadCause(_)
            | SnapshotField { .. }
            | SnapshotRunId
            | FinalMessageShape => ErrorKind::InvalidParams,
            NotActive | NotResumable | NoSuchRun | NoCheckpoint => ErrorKind::NotFound,
            NotHolder { .. } | ProducerLost | Ending | Failed | Streaming { .. } | Ended { .. } => {
                ErrorKind::Conflict
            }
            TooManyRuns { .. } => ErrorKind::Busy,
            KeySealed(_) | Seal(_) => ErrorKind::Sealed,
            UnsafePath(_) => ErrorKind::Forbidden,
            Journal(JournalError::Open { .. }) if self.is_unsafe_path() => ErrorKind::Forbidden,
            Undecryptable { .. } | CheckpointNotJson(_) | StateNotJson(_) | EventsLost { .. } => {
                ErrorKind::Integrity
            }
            NoKeyStore => ErrorKind::Unsupported,
            Journal(JournalError::Fenced) => ErrorKind::Conflict,
            KeyStoreFailed(_) | Unreadable { .. } | Io(_) | Journal(_) | Database(_) => {
                ErrorKind::Storage
            }
        }
    }
}

impl StreamError {
    /// A path under the data directory was refused (a symlink, or something that is not a
    /// directory, where holdfast keeps one of its directories or files): in a run's files, or
    /// in the journal's directory while it opened.
    pub fn is_unsafe_path(&self) -> bool {
        match self {
            StreamError::UnsafePath(_) => true,
            StreamError::Journal(JournalError::Open { source, .. }) => source
                .downcast_ref::<IoError>()
                .is_some_and(IoError::is_unsafe_path),
            _ => false,
        }
    }
}

impl From<IoError> for StreamError {
    /// A refused path is its own variant (`forbidden`); every other step's failure is `Io`.
    fn from(e: IoError) -> Self {
        if e.is_unsafe_path() {
            StreamError::UnsafePath(e)
        } else {
            StreamError::Io(e)
        }
    }
}
