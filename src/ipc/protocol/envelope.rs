//! The JSON-RPC envelope of a request line: `jsonrpc`, `id`, `method`, and `params` kept as
//! the raw text of its value, borrowed from the line. The params are read once, by
//! [`super::call::Call::parse`], straight into the method's typed params: no
//! `serde_json::Value` tree is built for a request.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::{codes, Id, RpcError};

/// A request line's envelope; `params` is the raw JSON of an object, or `None` when absent or
/// null (which every method reads as `{}`).
#[derive(Debug)]
pub struct Envelope<'a> {
    /// Echoed in the response.
    pub id: Id,
    /// e.g. `cred.get` (the client's text: never echoed unbounded).
    pub method: Cow<'a, str>,
    /// The params object's text.
    pub params: Option<&'a RawValue>,
}

/// A request that could not be parsed: the id (if one could be read) and the error to send.
pub type BadRequest = Box<(Id, RpcError)>;

/// The members of a request object as written, each value's raw text (the last one wins when a
/// member is repeated, as with a parsed object), and whether any other member was present.
#[derive(Default)]
struct Members<'a> {
    jsonrpc: Option<&'a RawValue>,
    id: Option<&'a RawValue>,
    method: Option<&'a RawValue>,
    params: Option<&'a RawValue>,
    unknown: bool,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Member {
    Jsonrpc,
    Id,
    Method,
    Params,
    #[serde(other)]
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Members<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON-RPC request object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Members<'a>, M::Error> {
                let mut out = Members::default();
                while let Some(k) = m.next_key::<Member>()? {
                    let v: &'de RawValue = m.next_value()?;
                    match k {
                        Member::Jsonrpc => out.jsonrpc = Some(v),
                        Member::Id => out.id = Some(v),
                        Member::Method => out.method = Some(v),
                        Member::Params => out.params = Some(v),
                        Member::Other => out.unknown = true,
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// The first byte of a raw JSON value (its text has no leading whitespace).
fn first(v: &RawValue) -> u8 {
    v.get().as_bytes().first().copied().unwrap_or(b' ')
}

/// A raw JSON string's text, unescaped (`None`: not a string).
fn string(v: &RawValue) -> Option<Cow<'_, str>> {
    if first(v) != b'"' {
        return None;
    }
    serde_json::from_str::<crate::streams::Str>(v.get())
        .ok()
        .map(|s| s.0)
}

/// Parse one request line's envelope. On failure, the id (if one could be read) for the error
/// response.
pub fn parse_request(line: &[u8]) -> Result<Envelope<'_>, BadRequest> {
    parse_inner(line).map_err(Box::new)
}

// Private and boxed by its only caller; the unboxed tuple keeps the early returns readable.
#[allow(clippy::result_large_err)]
fn parse_inner(line: &[u8]) -> Result<Envelope<'_>, (Id, RpcError)> {
    // The members are kept as raw text, whose syntax serde_json checks without building
    // anything; what it refuses only when it builds a value (nesting deeper than 128, a number
    // beyond f64, a lone UTF-16 surrogate escape) stays refused as not JSON, as before. One
    // pass over the bytes says whether the line could hold any of them; if so it is built.
    if may_need_a_tree(line) {
        if let Err(e) = serde_json::from_slice::<Value>(line) {
            // Answered with the request's id when its syntax still reads (a lone surrogate in
            // a string, a number beyond f64): the client's call fails at once instead of
            // waiting for an answer it cannot match.
            return Err((id_of(line), RpcError::parse_error(e)));
        }
    }
    let m: Members = match serde_json::from_slice(line) {
        Ok(m) => m,
        Err(e) if e.is_data() => return Err((Value::Null, not_an_object(line))),
        Err(e) => return Err((Value::Null, RpcError::parse_error(e))),
    };
    let id = match m.id {
        None => {
            return Err((
                Value::Null,
                RpcError::invalid_request(
                    "missing \"id\" (notifications from clients are not supported)",
                ),
            ))
        }
        Some(raw) if matches!(first(raw), b'"' | b'-' | b'0'..=b'9' | b'n') => {
            // A string, a number or null: its own text is valid JSON (checked above).
            serde_json::from_str::<Value>(raw.get())
                .map_err(|e| (Value::Null, RpcError::parse_error(e)))?
        }
        Some(_) => {
            return Err((
                Value::Null,
                RpcError::invalid_request("\"id\" must be a number, a string or null"),
            ))
        }
    };
    if m.jsonrpc.and_then(string).as_deref() != Some("2.0") {
        return Err((id, RpcError::invalid_request("\"jsonrpc\" must be \"2.0\"")));
    }
    let Some(method) = m.method.and_then(string) else {
        return Err((id, RpcError::invalid_request("\"method\" must be a string")));
    };
    let params = match m.params {
        None => None,
        Some(p) if p.get() == "null" => None,
        Some(p) if first(p) == b'{' => Some(p),
        Some(_) => return Err((id, RpcError::invalid_params("\"params\" must be an object"))),
    };
    if m.unknown {
        // The member's name is the client's text: not echoed (it could be anything).
        return Err((
            id,
            RpcError::invalid_request(
                "unknown top-level request field (allowed: jsonrpc, id, method, params)",
            ),
        ));
    }
    Ok(Envelope { id, method, params })
}

/// The id of a line whose syntax reads but which is refused as a value (`null` if none reads).
fn id_of(line: &[u8]) -> Id {
    serde_json::from_slice::<Members>(line)
        .ok()
        .and_then(|m| m.id)
        .filter(|raw| matches!(first(raw), b'"' | b'-' | b'0'..=b'9'))
        .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
        .unwrap_or(Value::Null)
}

/// Could `line` hold what serde_json accepts as raw text but refuses as a value: more than
/// 100 brackets outside strings (it refuses nesting deeper than 127), a `\u` escape in a string
/// (a lone surrogate), or outside strings a digit followed by an exponent or a run of more than
/// 300 digits (a number beyond f64)? Strings are tracked, so ids and text (`"3e4f…"`, `"[x]"`)
/// never send a request the slow way; true is only a reason to check.
fn may_need_a_tree(line: &[u8]) -> bool {
    let (mut brackets, mut digits, mut prev) = (0usize, 0usize, 0u8);
    let (mut in_string, mut escaped) = (false, false);
    for &b in line {
        if in_string {
            match (escaped, b) {
                (true, b'u') => return true,
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => brackets += 1,
            b'e' | b'E' if prev.is_ascii_digit() => return true,
            _ => {}
        }
        digits = if b.is_ascii_digit() { digits + 1 } else { 0 };
        if brackets > 100 || digits > 300 {
            return true;
        }
        prev = b;
    }
    false
}

/// The error for a line that is not a request object: `parse error` if it is not JSON at all
/// (nesting deeper than serde_json's limit of 128 included), else `invalid request`.
fn not_an_object(line: &[u8]) -> RpcError {
    match serde_json::from_slice::<Value>(line) {
        Err(e) => RpcError::parse_error(e),
        Ok(_) => RpcError {
            code: codes::INVALID_REQUEST,
            ..RpcError::invalid_request(
                "a request must be a JSON object (batches are not supported)",
            )
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_requests_and_rejects_everything_else() {
        let r =
            parse_request(br#"{"jsonrpc":"2.0","id":7,"method":"cred.get","params":{"id":"x"}}"#)
                .unwrap();
        assert_eq!(r.id, json!(7));
        assert_eq!(r.method, "cred.get");
        let params: Value = serde_json::from_str(r.params.unwrap().get()).unwrap();
        assert_eq!(params["id"], json!("x"));
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
            // Malformed inside a member: still not JSON.
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":}}"#,
                codes::PARSE_ERROR,
            ),
            (b"[1,2", codes::PARSE_ERROR),
        ];
        for (line, code) in bad {
            let (_, e) = *parse_request(line).unwrap_err();
            assert_eq!(e.code, *code, "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn a_line_refused_as_a_value_is_answered_with_its_id() {
        // A lone surrogate (an emoji cut in half by a client's slice) or a number beyond f64:
        // the syntax reads, the value does not; the client's call gets its answer at once.
        for (line, id) in [
            (
                &br#"{"jsonrpc":"2.0","id":7,"method":"cred.set","params":{"id":"x","value":"a\ud83d"}}"#[..],
                json!(7),
            ),
            (
                br#"{"jsonrpc":"2.0","id":"r-1","method":"x","params":{"n":1e999}}"#,
                json!("r-1"),
            ),
            (
                br#"{"jsonrpc":"2.0","id":"\udc00","method":"x"}"#,
                Value::Null,
            ),
        ] {
            let (got, e) = *parse_request(line).unwrap_err();
            assert_eq!(e.code, codes::PARSE_ERROR, "{}", String::from_utf8_lossy(line));
            assert_eq!(got, id, "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn the_envelope_reads_as_a_parsed_object_would() {
        // Escaped member values, null params, a repeated member (the last wins), any order.
        let r = parse_request(
            br#"{"params":null,"method":"cred.\u0067et","id":"a\"b","jsonrpc":"2.\u0030"}"#,
        )
        .unwrap();
        assert_eq!(r.method, "cred.get");
        assert_eq!(r.id, json!("a\"b"));
        assert!(r.params.is_none());
        let r = parse_request(br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"x"}"#).unwrap();
        assert_eq!(r.id, json!(2));
        let r = parse_request(br#"{"jsonrpc":"2.0","id":null,"method":"x","params":{}}"#).unwrap();
        assert_eq!(r.id, Value::Null);
        assert_eq!(r.params.unwrap().get(), "{}");
    }

    #[test]
    fn deep_nesting_is_a_parse_error_not_a_crash() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let (_, e) = *parse_request(deep.as_bytes()).unwrap_err();
        assert_eq!(e.code, codes::PARSE_ERROR);
        // Inside params too, though the envelope keeps them as raw text.
        let nested = |n: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"a":{}{}}}}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        let (_, e) = *parse_request(nested(200).as_bytes()).unwrap_err();
        assert_eq!(e.code, codes::PARSE_ERROR);
        assert!(parse_request(nested(100).as_bytes()).is_ok());
    }

    #[test]
    fn what_serde_json_refuses_to_build_is_not_json_in_any_member() {
        let line =
            |v: &str| format!(r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"a":{v}}}}}"#);
        for v in ["1e400", "-1E400", &"9".repeat(400), r#""\ud800""#] {
            let (_, e) = *parse_request(line(v).as_bytes()).unwrap_err();
            assert_eq!(e.code, codes::PARSE_ERROR, "{v}");
        }
        // Their look-alikes inside strings do not even send the line the slow way.
        for v in [
            r#""3e4f-9E10""#,
            r#""[[[""#,
            r#""a\\u""#,
            &format!("\"{}\"", "9".repeat(400)),
        ] {
            assert!(!may_need_a_tree(line(v).as_bytes()), "{v}");
        }
        for v in ["1e5", r#""\u00e9""#, &"[".repeat(101)] {
            assert!(may_need_a_tree(line(v).as_bytes()), "{v}");
        }
        // Their harmless cousins are requests.
        for v in [
            "1e300",
            r#""\u00e9""#,
            &"9".repeat(300),
            r#""\ud83d\ude00""#,
        ] {
            assert!(parse_request(line(v).as_bytes()).is_ok(), "{v}");
        }
    }
}
