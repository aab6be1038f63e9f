//! Response and notification lines: serialized once, newline-terminated, into zeroizing
//! buffers (a response may carry a secret).

use serde_json::{json, Value};
use zeroize::Zeroizing;

use super::{Id, RpcError};

/// Serialize `v` plus a newline into a zeroizing buffer (responses may carry secrets).
fn line(v: &Value) -> Zeroizing<Vec<u8>> {
    // Sized up front: a response may carry secrets, and a growing Vec would leave copies of
    // them in the memory it frees.
    let bound = crate::store::credential::json_value_size_bound(v) + 1;
    let mut buf = Zeroizing::new(Vec::with_capacity(bound));
    // Serializing a `Value` (or a typed answer: strings, numbers, maps) into a Vec cannot fail.
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
pub fn response_ok_public(id: &Id, result: &impl serde::Serialize) -> Zeroizing<Vec<u8>> {
    let mut buf = Zeroizing::new(Vec::with_capacity(96));
    // Serializing a `Value` (or a typed answer: strings, numbers, maps) into a Vec cannot fail.
    let _ = write_ok(&mut *buf, id, result);
    buf
}

/// [`response_ok_public`] written into `out` (a buffer on the caller's stack, so an append's
/// answer costs no allocation): the line's length, or `None` if it does not fit.
pub fn response_ok_public_into(
    out: &mut [u8],
    id: &Id,
    result: &impl serde::Serialize,
) -> Option<usize> {
    let room = out.len();
    let mut w: &mut [u8] = out;
    write_ok(&mut w, id, result).ok()?;
    Some(room - w.len())
}

/// The success response line of `result`, written to `w`.
fn write_ok(
    mut w: impl std::io::Write,
    id: &Id,
    result: &impl serde::Serialize,
) -> std::io::Result<()> {
    w.write_all(br#"{"jsonrpc":"2.0","id":"#)?;
    serde_json::to_writer(&mut w, id)?;
    w.write_all(br#","result":"#)?;
    serde_json::to_writer(&mut w, result)?;
    w.write_all(b"}\n")
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

/// A server notification line (`"method": "event"`; no id) with typed params, serialized
/// straight into the line. Events carry no secret, so the buffer may grow.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{code_for, codes, kind_for};
    use crate::error::ErrorKind;

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
            // An append's typed answer is the line of the JSON the protocol documents, written
            // into a buffer when it fits (exactly or with room to spare), refused when it does
            // not.
            for (acked_seq, duplicate, value) in [
                (41, false, json!({"acked_seq": 41})),
                (3, true, json!({"acked_seq": 3, "duplicate": true})),
                (u64::MAX, false, json!({ "acked_seq": u64::MAX })),
            ] {
                let typed = crate::streams::Answer::Acked {
                    acked_seq,
                    duplicate,
                };
                assert_eq!(typed.clone().into_value(), value);
                let want = response_ok(&id, value);
                assert_eq!(*response_ok_public(&id, &typed), *want, "{id} {typed:?}");
                let mut buf = [0u8; 256];
                for room in [want.len(), want.len() + 1, 256] {
                    let n = response_ok_public_into(&mut buf[..room], &id, &typed);
                    assert_eq!(n, Some(want.len()), "{id} {typed:?} in {room}");
                    assert_eq!(&buf[..want.len()], &want[..]);
                }
                for room in [0, 10, want.len() - 1] {
                    assert_eq!(response_ok_public_into(&mut buf[..room], &id, &typed), None);
                }
            }
        }
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
