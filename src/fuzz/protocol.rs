//! The request line parser, for AFL++ (`scripts/fuzz.sh protocol`). Its full model, and the
//! daemon's dispatch of every parsed line over a real socket, are in `tests/fuzz_protocol.rs`;
//! this target keeps the checks that need no daemon.

use super::{OrFault, Outcome};
use serde_json::Value;

use crate::ipc::protocol::{self, codes};

/// Each line of the input through the request parser. Checked: a line it accepts is an object
/// serde_json reads too, with `"jsonrpc": "2.0"` and the method it reports; a request rebuilt
/// from what it read parses to the same id, method and params; a line it refuses gets an
/// error line that is one line of JSON with `jsonrpc` "2.0", the id it read (or null), and an
/// error code of JSON-RPC's or holdfast's with a short message.
pub fn protocol_request(data: &[u8]) -> Outcome {
    let mut parsed = false;
    for line in data.split(|&b| b == b'\n') {
        match protocol::parse_request(line) {
            Ok(env) => {
                parsed = true;
                let v: Value = serde_json::from_slice(line).broken("accepted, yet not JSON")?;
                check_eq!(v["jsonrpc"], "2.0", "accepted without jsonrpc 2.0");
                check_eq!(v["method"].as_str(), Some(&*env.method), "the method read");
                let params = env
                    .params
                    .map(|p| serde_json::from_str::<Value>(p.get()))
                    .transpose()
                    .broken("params not JSON")?;
                let rebuilt = serde_json::json!({
                    "jsonrpc": "2.0",
                    "id": env.id,
                    "method": &*env.method,
                    "params": params,
                })
                .to_string();
                let again = match protocol::parse_request(rebuilt.as_bytes()) {
                    Ok(again) => again,
                    Err(e) => {
                        return Err(super::Fault::Broken(format!(
                            "a rebuilt request is refused: {:?}",
                            e.1
                        )))
                    }
                };
                check_eq!(again.id, env.id, "the id changed on a rebuild");
                check_eq!(again.method, env.method, "the method changed on a rebuild");
            }
            Err(bad) => {
                let (id, err) = &*bad;
                let out = protocol::response_err(id, err);
                check_eq!(out.last(), Some(&b'\n'), "the error line has no newline");
                check_eq!(
                    out.iter().filter(|&&b| b == b'\n').count(),
                    1,
                    "the error is more than one line"
                );
                let v: Value = serde_json::from_slice(&out).broken("the error line is not JSON")?;
                check_eq!(v["jsonrpc"], "2.0");
                let code = v["error"]["code"]
                    .as_i64()
                    .broken("an error without a code")?;
                check!(
                    [
                        codes::PARSE_ERROR,
                        codes::INVALID_REQUEST,
                        codes::METHOD_NOT_FOUND,
                        codes::INVALID_PARAMS,
                    ]
                    .contains(&code)
                        || code <= -32000,
                    "unknown code {code}"
                );
                let msg = v["error"]["message"].as_str().unwrap_or_default();
                check!(
                    msg.len() <= 512,
                    "a long error message ({} bytes)",
                    msg.len()
                );
            }
        }
    }
    Ok(parsed)
}
