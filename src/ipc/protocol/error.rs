//! Errors on their way to a client: each maps to one JSON-RPC code and one stable `data.kind`
//! ([`crate::api::code_for`]); client text is never echoed in a message.

use serde_json::{json, Map, Value};

use super::codes;
use crate::api::code_for;
use crate::error::ErrorKind;

/// An error on its way to a client.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// JSON-RPC code.
    pub code: i64,
    /// Human-readable; never contains a secret.
    pub message: String,
    /// The stable kind, sent as `data.kind`.
    pub kind: ErrorKind,
    /// Extra `data` fields (e.g. `reason: "clock_skew"`, `generation`).
    pub data: Map<String, Value>,
}

impl RpcError {
    /// An error of `kind` with the kind's code.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        RpcError {
            code: code_for(kind),
            message: message.into(),
            kind,
            data: Map::new(),
        }
    }

    /// Not JSON.
    pub fn parse_error(detail: impl std::fmt::Display) -> Self {
        RpcError {
            code: codes::PARSE_ERROR,
            ..RpcError::new(ErrorKind::InvalidParams, format!("parse error: {detail}"))
        }
    }

    /// JSON, but not a request.
    pub fn invalid_request(detail: impl Into<String>) -> Self {
        RpcError {
            code: codes::INVALID_REQUEST,
            ..RpcError::new(ErrorKind::InvalidParams, detail)
        }
    }

    /// Unknown method.
    pub fn method_not_found(method: &str) -> Self {
        let shown: String = method.chars().take(64).collect();
        RpcError {
            code: codes::METHOD_NOT_FOUND,
            ..RpcError::new(
                ErrorKind::Unsupported,
                format!("unknown method {shown:?}; `hello` lists the methods served"),
            )
        }
    }

    /// Bad params.
    pub fn invalid_params(detail: impl Into<String>) -> Self {
        RpcError::new(ErrorKind::InvalidParams, detail)
    }

    /// Add a `data` field.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.data.insert(key.into(), value.into());
        self
    }

    /// A failed blocking-pool task (it panicked or was cancelled).
    pub fn internal(e: &tokio::task::JoinError) -> Self {
        RpcError::new(ErrorKind::Storage, format!("internal error: {e}"))
    }

    /// A store error, with its kind and, where useful, machine-readable detail.
    pub fn from_store(e: &crate::store::Error) -> Self {
        use crate::store::Error as E;
        let err = RpcError::new(e.kind(), e.to_string());
        match e {
            E::ClockSkew { .. } => err.with("reason", "clock_skew"),
            E::GenerationMismatch {
                expected, actual, ..
            } => err
                .with("reason", "generation_mismatch")
                .with("expected", *expected)
                .with("generation", *actual),
            E::IdCollision { .. } => err.with("reason", "id_collision"),
            E::Poisoned(_) => err.with("reason", "refusing_writes"),
            _ => err,
        }
    }

    pub(super) fn to_value(&self) -> Value {
        let mut data = self.data.clone();
        data.insert("kind".into(), self.kind.as_str().into());
        json!({"code": self.code, "message": self.message, "data": data})
    }
}

impl From<crate::store::Error> for RpcError {
    fn from(e: crate::store::Error) -> Self {
        RpcError::from_store(&e)
    }
}

impl From<crate::runlog::RunLogError> for RpcError {
    fn from(e: crate::runlog::RunLogError) -> Self {
        let err = RpcError::new(e.kind(), e.to_string());
        match e {
            crate::runlog::RunLogError::UnsafePath(_) => err.with("reason", "unsafe_path"),
            _ => err,
        }
    }
}

impl From<crate::streams::StreamError> for RpcError {
    fn from(e: crate::streams::StreamError) -> Self {
        let err = RpcError::new(e.kind(), e.to_string());
        if e.is_unsafe_path() {
            return err.with("reason", "unsafe_path");
        }
        err
    }
}

/// serde's messages quote the offending value (`invalid type: string "sk-…"`) and the offending
/// field name (`` unknown field `sk-…` ``); a client that puts a secret in the wrong place must
/// not get it echoed (or logged). Keep the shape, drop the client's text: every `"…"` span, and
/// the backtick span naming an unknown field or variant. The list of expected fields (ours) stays.
pub fn redact_quoted(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut in_double = false;
    let mut in_tick: Option<bool> = None; // Some(redact?) while inside a backtick span
    for ch in msg.chars() {
        match (ch, in_double, in_tick) {
            ('"', _, None) => {
                if !in_double {
                    out.push_str("\"…\"");
                }
                in_double = !in_double;
            }
            (_, true, _) => {}
            ('`', false, None) => {
                let redact = out.ends_with("unknown field ") || out.ends_with("unknown variant ");
                out.push_str(if redact { "`…" } else { "`" });
                in_tick = Some(redact);
            }
            ('`', false, Some(_)) => {
                out.push('`');
                in_tick = None;
            }
            (_, false, Some(true)) => {}
            (c, false, _) => out.push(c),
        }
    }
    out
}

/// A request's params as `T`, read from their text: the one reader of params for every
/// method; a mismatch is `invalid_params`, "bad params: " and serde's message without the
/// client's text or its position in the line.
pub fn typed<'a, T: serde::Deserialize<'a>>(raw: &'a str) -> Result<T, RpcError> {
    serde_json::from_str(raw).map_err(|e| {
        let msg = e.to_string();
        // serde_json ends a message with " at line L column C": noise to a client.
        let msg = match msg.rfind(" at line ") {
            Some(i) => &msg[..i],
            None => &msg,
        };
        RpcError::invalid_params(format!("bad params: {}", redact_quoted(msg)))
    })
}

/// A handler's typed result as the response's `result`.
pub fn result<T: serde::Serialize>(r: &T) -> Result<Value, RpcError> {
    serde_json::to_value(r)
        .map_err(|e| RpcError::new(ErrorKind::Storage, format!("internal error: {e}")))
}
