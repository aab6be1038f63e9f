//! The errors of stream operations, each with the protocol's error kind.

use crate::durable::journal::JournalError;
use crate::error::ErrorKind;

/// A stream operation that failed, with the protocol's error kind.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct StreamError {
    /// The kind (`invalid_params`, `not_found`, `conflict`, `storage`, …).
    pub kind: ErrorKind,
    /// For people.
    pub message: String,
}

pub(super) fn err(kind: ErrorKind, message: impl Into<String>) -> StreamError {
    StreamError {
        kind,
        message: message.into(),
    }
}

pub(super) fn ending_error() -> StreamError {
    err(
        ErrorKind::Conflict,
        "the run is being committed or aborted right now",
    )
}

pub(super) fn failed_error() -> StreamError {
    err(
        ErrorKind::Conflict,
        "the recovery plan for this run was fail: abort it (stream.abort), or let it expire",
    )
}

pub(super) fn invalid(message: impl Into<String>) -> StreamError {
    err(ErrorKind::InvalidParams, message)
}

impl From<JournalError> for StreamError {
    fn from(e: JournalError) -> Self {
        err(ErrorKind::Storage, e.to_string())
    }
}
