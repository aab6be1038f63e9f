//! The wire protocol, v1: newline-delimited JSON-RPC 2.0 over a Unix stream socket.
//!
//! The server's side: requests parsed, response and notification lines built, and every error
//! mapped to exactly one code and one stable `data.kind` string in [`RpcError::from_store`] /
//! [`code_for`]. The contract both sides share (version, methods, codes) is [`crate::api`].
//! Handlers stay thin.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use zeroize::Zeroizing;

use crate::error::ErrorKind;

pub use crate::api::{code_for, codes, kind_for, PROTOCOL_VERSION};

/// A request id: a number, a string, or null (JSON-RPC allows all three).
pub type Id = Value;

/// A parsed request.
#[derive(Debug)]
pub struct Request {
    /// Echoed in the response.
    pub id: Id,
    /// e.g. `cred.get`.
    pub method: String,
    /// An object (absent or null params become `{}`).
    pub params: Map<String, Value>,
}

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

    fn to_value(&self) -> Value {
        let mut data = self.data.clone();
        data.insert("kind".into(), self.kind.as_str().into());
        json!({"code": self.code, "message": self.message, "data": data})
    }
}

/// A request that could not be parsed: the id (if one could be read) and the error to send.
pub type BadRequest = Box<(Id, RpcError)>;

/// Parse one request line. On failure, the id (if one could be read) for the error response.
pub fn parse_request(line: &[u8]) -> Result<Request, BadRequest> {
    parse_inner(line).map_err(Box::new)
}

// Private and boxed by its only caller; the unboxed tuple keeps the early returns readable.
#[allow(clippy::result_large_err)]
fn parse_inner(line: &[u8]) -> Result<Request, (Id, RpcError)> {
    // serde_json refuses nesting deeper than 128 levels (its default; never `unbounded_depth`).
    let value: Value =
        serde_json::from_slice(line).map_err(|e| (Value::Null, RpcError::parse_error(e)))?;
    let Value::Object(mut obj) = value else {
        return Err((
            Value::Null,
            RpcError::invalid_request(
                "a request must be a JSON object (batches are not supported)",
            ),
        ));
    };
    let id = match obj.remove("id") {
        None => {
            return Err((
                Value::Null,
                RpcError::invalid_request(
                    "missing \"id\" (notifications from clients are not supported)",
                ),
            ))
        }
        Some(id @ (Value::Number(_) | Value::String(_) | Value::Null)) => id,
        Some(_) => {
            return Err((
                Value::Null,
                RpcError::invalid_request("\"id\" must be a number, a string or null"),
            ))
        }
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((id, RpcError::invalid_request("\"jsonrpc\" must be \"2.0\"")));
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        _ => return Err((id, RpcError::invalid_request("\"method\" must be a string"))),
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(p)) => p,
        Some(_) => return Err((id, RpcError::invalid_params("\"params\" must be an object"))),
    };
    obj.remove("jsonrpc");
    if !obj.is_empty() {
        // The field's name is the client's text: not echoed (it could be anything).
        return Err((
            id,
            RpcError::invalid_request(
                "unknown top-level request field (allowed: jsonrpc, id, method, params)",
            ),
        ));
    }
    Ok(Request { id, method, params })
}

/// Serialize `v` plus a newline into a zeroizing buffer (responses may carry secrets).
fn line(v: &Value) -> Zeroizing<Vec<u8>> {
    // Sized up front: a response may carry secrets, and a growing Vec would leave copies of
    // them in the memory it frees.
    let bound = crate::store::credential::json_value_size_bound(v) + 1;
    let mut buf = Zeroizing::new(Vec::with_capacity(bound));
    // Serializing a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *buf, v);
    buf.push(b'\n');
    buf
}

/// A success response line.
pub fn response_ok(id: &Id, result: Value) -> Zeroizing<Vec<u8>> {
    let mut v = json!({"jsonrpc": "2.0", "id": id, "result": result});
    let out = line(&v);
    crate::store::credential::zeroize_json(&mut v);
    out
}

/// A success response whose result carries no secret (`stream.append`'s `acked_seq`),
/// written straight into its line: the same bytes as [`response_ok`], without building the
/// response object around the result or walking it to zeroize.
pub fn response_ok_public(id: &Id, result: &Value) -> Zeroizing<Vec<u8>> {
    let mut buf = Zeroizing::new(Vec::with_capacity(96));
    buf.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    // Serializing a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *buf, id);
    buf.extend_from_slice(br#","result":"#);
    let _ = serde_json::to_writer(&mut *buf, result);
    buf.extend_from_slice(b"}\n");
    buf
}

/// The success response of `cred.get`, serialized straight from the credential (no copy of
/// the document is made) into a buffer sized in advance.
pub fn response_credential(
    id: &Id,
    cred: &crate::store::Credential,
    generation: u64,
) -> Zeroizing<Vec<u8>> {
    let id_json = serde_json::to_string(id).unwrap_or_else(|_| "null".into());
    let mut buf = Zeroizing::new(Vec::with_capacity(
        cred.json_size_bound() + id_json.len() + 96,
    ));
    buf.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    buf.extend_from_slice(id_json.as_bytes());
    buf.extend_from_slice(br#","result":{"credential":"#);
    cred.write_json(&mut buf);
    buf.extend_from_slice(format!(r#","generation":{generation}}}}}"#).as_bytes());
    buf.push(b'\n');
    buf
}

/// An error response line.
pub fn response_err(id: &Id, err: &RpcError) -> Zeroizing<Vec<u8>> {
    line(&json!({"jsonrpc": "2.0", "id": id, "error": err.to_value()}))
}

/// A server notification line (`"method": "event"`; no id).
pub fn notification(params: Value) -> Zeroizing<Vec<u8>> {
    line(&json!({"jsonrpc": "2.0", "method": "event", "params": params}))
}

/// [`notification`] with typed params, serialized straight into the line (stream events,
/// whose JSON is kept serialized). They carry no secret, so the buffer may grow.
pub fn notification_of(params: &impl serde::Serialize) -> Zeroizing<Vec<u8>> {
    #[derive(serde::Serialize)]
    struct Note<'a, P> {
        jsonrpc: &'static str,
        method: &'static str,
        params: &'a P,
    }
    let mut buf = Zeroizing::new(Vec::with_capacity(256));
    // Serializing plain fields and raw JSON into a Vec cannot fail.
    let _ = serde_json::to_writer(
        &mut *buf,
        &Note {
            jsonrpc: "2.0",
            method: "event",
            params,
        },
    );
    buf.push(b'\n');
    buf
}

impl From<crate::store::Error> for RpcError {
    fn from(e: crate::store::Error) -> Self {
        RpcError::from_store(&e)
    }
}

impl From<crate::runlog::RunLogError> for RpcError {
    fn from(e: crate::runlog::RunLogError) -> Self {
        RpcError::new(e.kind(), e.to_string())
    }
}

impl From<crate::streams::StreamError> for RpcError {
    fn from(e: crate::streams::StreamError) -> Self {
        RpcError::new(e.kind(), e.to_string())
    }
}

// ---- Params and error messages ----

/// serde's messages quote the offending value (`invalid type: string "sk-…"`) and the offending
/// field name (`` unknown field `sk-…` ``); a client that puts a secret in the wrong place must
/// not get it echoed (or logged). Keep the shape, drop the client's text: every `"…"` span, and
/// the backtick span naming an unknown field or variant. The list of expected fields (ours) stays.
pub(crate) fn redact_quoted(msg: &str) -> String {
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

/// A request's params as `T`: the one reader of params for every method; a mismatch is
/// `invalid_params`, "bad params: " and serde's message without the client's text.
pub fn params<T: DeserializeOwned>(p: Map<String, Value>) -> Result<T, RpcError> {
    serde_json::from_value(Value::Object(p)).map_err(|e| {
        RpcError::invalid_params(format!("bad params: {}", redact_quoted(&e.to_string())))
    })
}

/// [`params`], borrowing from the params (the inline read path).
pub fn params_ref<'a, T: Deserialize<'a>>(p: &'a Value) -> Result<T, RpcError> {
    T::deserialize(p).map_err(|e| {
        RpcError::invalid_params(format!("bad params: {}", redact_quoted(&e.to_string())))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_response_is_byte_for_byte_the_general_one() {
        for id in [json!(7), json!("req-\"1\""), Value::Null, json!(1.5)] {
            for result in [
                json!({"acked_seq": 41}),
                json!({"acked_seq": 3, "duplicate": true}),
            ] {
                assert_eq!(
                    *response_ok_public(&id, &result),
                    *response_ok(&id, result.clone()),
                    "{id} {result}"
                );
            }
        }
    }

    #[test]
    fn parses_requests_and_rejects_everything_else() {
        let r =
            parse_request(br#"{"jsonrpc":"2.0","id":7,"method":"cred.get","params":{"id":"x"}}"#)
                .unwrap();
        assert_eq!(r.id, json!(7));
        assert_eq!(r.method, "cred.get");
        assert_eq!(r.params["id"], json!("x"));
        let bad: &[(&[u8], i64)] = &[
            (b"not json", codes::PARSE_ERROR),
            (b"[1,2]", codes::INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","method":"x"}"#, codes::INVALID_REQUEST),
            (
                br#"{"jsonrpc":"1.0","id":1,"method":"x"}"#,
                codes::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":5}"#,
                codes::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#,
                codes::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#,
                codes::INVALID_PARAMS,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"x","extra":1}"#,
                codes::INVALID_REQUEST,
            ),
        ];
        for (line, code) in bad {
            let (_, e) = *parse_request(line).unwrap_err();
            assert_eq!(e.code, *code, "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn deep_nesting_is_a_parse_error_not_a_crash() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let (_, e) = *parse_request(deep.as_bytes()).unwrap_err();
        assert_eq!(e.code, codes::PARSE_ERROR);
    }

    #[test]
    fn every_kind_roundtrips_through_its_code() {
        for k in ErrorKind::ALL {
            assert_eq!(kind_for(code_for(k)), Some(k));
        }
        let line = response_err(&json!(1), &RpcError::new(ErrorKind::Sealed, "x"));
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["error"]["data"]["kind"], json!("sealed"));
        assert_eq!(v["error"]["code"], json!(codes::SEALED));
    }
}
