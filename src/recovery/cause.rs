//! Why a stream broke, and what class of budget a recovery from it spends.

use serde::{Deserialize, Serialize};

use super::CauseError;

/// The cause of an interruption.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The connection dropped (reset, EOF mid-stream).
    ConnectionReset,
    /// No bytes within the idle window (the HTTP client's own read timeout).
    IdleStall,
    /// No chunk within the producer's `stall_timeout` (the wrappers' own stall detector).
    Stalled,
    /// HTTP/2 GOAWAY or "connection: close".
    Goaway,
    /// A 500/502 (or other 5xx) from the provider.
    #[serde(rename = "provider_5xx")]
    Provider5xx,
    /// 408/504: the request or a gateway timed out.
    Timeout,
    /// 429.
    RateLimited,
    /// 503/529.
    Overloaded,
    /// A new process found a checkpoint a dead one left.
    ResumedFromCheckpoint,
    /// The prompt does not fit the model's context.
    ContextOverflow,
    /// The request is malformed (400/422).
    InvalidRequest,
    /// 401/403.
    Unauthorized,
    /// 404.
    ModelNotFound,
    /// The provider's content filter stopped the output.
    ContentFiltered,
}

/// Which budget a recovery spends; `Permanent` causes are never retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseClass {
    /// Mid-stream transient interruptions (default budget 2).
    Transient,
    /// Rate limits (default budget 5).
    RateLimited,
    /// Overload (default budget 3).
    Overloaded,
    /// Never retried.
    Permanent,
}

impl CauseClass {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            CauseClass::Transient => "transient",
            CauseClass::RateLimited => "rate_limited",
            CauseClass::Overloaded => "overloaded",
            CauseClass::Permanent => "permanent",
        }
    }
}

/// Every cause's name, in [`ALL`]'s order.
pub fn names() -> Vec<&'static str> {
    ALL.iter().map(|c| c.as_str()).collect()
}

/// Every cause, for messages and tests.
pub const ALL: &[Cause] = &[
    Cause::ConnectionReset,
    Cause::IdleStall,
    Cause::Stalled,
    Cause::Goaway,
    Cause::Provider5xx,
    Cause::Timeout,
    Cause::RateLimited,
    Cause::Overloaded,
    Cause::ResumedFromCheckpoint,
    Cause::ContextOverflow,
    Cause::InvalidRequest,
    Cause::Unauthorized,
    Cause::ModelNotFound,
    Cause::ContentFiltered,
];

impl Cause {
    /// The budget class.
    pub fn class(self) -> CauseClass {
        match self {
            Cause::ConnectionReset
            | Cause::IdleStall
            | Cause::Stalled
            | Cause::Goaway
            | Cause::Provider5xx
            | Cause::Timeout
            | Cause::ResumedFromCheckpoint => CauseClass::Transient,
            Cause::RateLimited => CauseClass::RateLimited,
            Cause::Overloaded => CauseClass::Overloaded,
            Cause::ContextOverflow
            | Cause::InvalidRequest
            | Cause::Unauthorized
            | Cause::ModelNotFound
            | Cause::ContentFiltered => CauseClass::Permanent,
        }
    }

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::ConnectionReset => "connection_reset",
            Cause::IdleStall => "idle_stall",
            Cause::Stalled => "stalled",
            Cause::Goaway => "goaway",
            Cause::Provider5xx => "provider_5xx",
            Cause::Timeout => "timeout",
            Cause::RateLimited => "rate_limited",
            Cause::Overloaded => "overloaded",
            Cause::ResumedFromCheckpoint => "resumed_from_checkpoint",
            Cause::ContextOverflow => "context_overflow",
            Cause::InvalidRequest => "invalid_request",
            Cause::Unauthorized => "unauthorized",
            Cause::ModelNotFound => "model_not_found",
            Cause::ContentFiltered => "content_filtered",
        }
    }

    /// Parse a cause name. `user_cancel` and `clean_end` are not interruptions: the error says
    /// what to do instead.
    pub fn parse(s: &str) -> Result<Cause, CauseError> {
        if let Some(c) = ALL.iter().find(|c| c.as_str() == s) {
            return Ok(*c);
        }
        match s {
            "user_cancel" => Err(CauseError::UserCancel),
            "clean_end" => Err(CauseError::CleanEnd),
            _ => Err(CauseError::Unknown),
        }
    }
}

/// Phrases by which providers say a prompt is too long (matched case-insensitively).
const CONTEXT_OVERFLOW_PHRASES: &[&str] = &[
    "prompt is too long",
    "context_length_exceeded",
    "context length exceeded",
    "maximum context length",
    "context window",
    "too many tokens",
    "request too large",
    "input is too long",
    "reduce the length",
];

/// Phrases by which providers say their content filter stopped the output.
const CONTENT_FILTER_PHRASES: &[&str] = &[
    "content_filter",
    "content filter",
    "content policy",
    "content management policy",
    "blocked by safety",
    "safety system",
];

/// Classify a raw provider error (HTTP status and message).
pub fn classify_status(status: u16, message: &str) -> Cause {
    let m = message.to_ascii_lowercase();
    if CONTENT_FILTER_PHRASES.iter().any(|p| m.contains(p)) {
        return Cause::ContentFiltered;
    }
    match status {
        429 => Cause::RateLimited,
        503 | 529 => Cause::Overloaded,
        408 | 504 => Cause::Timeout,
        413 => Cause::ContextOverflow,
        400 if CONTEXT_OVERFLOW_PHRASES.iter().any(|p| m.contains(p)) => Cause::ContextOverflow,
        400 | 422 => Cause::InvalidRequest,
        401 | 403 => Cause::Unauthorized,
        404 => Cause::ModelNotFound,
        500..=599 => Cause::Provider5xx,
        // Another 4xx: the request is at fault; retrying it unchanged cannot help.
        _ => Cause::InvalidRequest,
    }
}
