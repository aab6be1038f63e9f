//! The errors of run-log operations, with the protocol's error kind.

use crate::error::ErrorKind;

/// A run-log operation that failed, with the protocol's error kind.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct RunLogError {
    /// The kind (`invalid_params`, `not_found`, `conflict`, `storage`, `busy`).
    pub kind: ErrorKind,
    /// For people.
    pub message: String,
}

pub(super) fn err(kind: ErrorKind, message: impl Into<String>) -> RunLogError {
    RunLogError {
        kind,
        message: message.into(),
    }
}

pub(super) fn invalid(message: impl Into<String>) -> RunLogError {
    err(ErrorKind::InvalidParams, message)
}

pub(super) fn storage(e: impl std::fmt::Display) -> RunLogError {
    err(ErrorKind::Storage, e.to_string())
}
