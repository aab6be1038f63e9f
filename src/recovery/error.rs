//! Why a recovery snapshot (the planner's input, `stream.interrupt`'s cause) does not read.
//! Each variant is one kind of mistake with the data its message needs; none echoes the
//! caller's values (a field name is shown cut to 40 characters).

/// A snapshot that does not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// Not a JSON object.
    #[error("the snapshot must be a JSON object")]
    NotAnObject,
    /// A field the snapshot does not have.
    #[error("unknown field {field:?}; fields: {}", KNOWN_FIELDS.join(", "))]
    UnknownField {
        /// The field (at most 40 characters of it).
        field: String,
    },
    /// A field of the wrong shape.
    #[error("{field} must be {expected}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// Two fields that exclude each other.
    #[error("give either {0} or {1}, not both")]
    Both(&'static str, &'static str),
    /// Neither `cause` nor `error`.
    #[error(
        "a cause is required: \"cause\": \"connection_reset\" (or another cause), or \"error\": \
         {{\"status\": 429, \"message\": \"…\", \"retry_after\": 30}}"
    )]
    NoCause,
    /// `policy` does not read.
    #[error("policy: {0}")]
    Policy(#[source] serde_json::Error),
    /// The cause is not one.
    #[error(transparent)]
    Cause(#[from] CauseError),
}

/// A cause name that is not an interruption the planner handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CauseError {
    /// `user_cancel`.
    #[error(
        "user_cancel is not an interruption: abort the stream (stream.abort) instead of \
         recovering it"
    )]
    UserCancel,
    /// `clean_end`.
    #[error("clean_end is not an interruption: commit the stream (stream.commit)")]
    CleanEnd,
    /// Not a cause at all.
    #[error("unknown cause; one of: {}", super::cause::names().join(", "))]
    Unknown,
}

/// The fields of a snapshot.
pub const KNOWN_FIELDS: &[&str] = &[
    "cause",
    "error",
    "partial_text",
    "tool_calls",
    "attempt",
    "attempts",
    "retry_after",
    "stall_history",
    "stale",
    "policy",
    "jitter",
    "now_ms",
    "continuation",
];
