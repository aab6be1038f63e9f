//! The request line parser, for AFL++ (`scripts/fuzz.sh protocol`). Its full model, and the
//! daemon's dispatch of every parsed line over a real socket, are in `tests/fuzz_protocol.rs`;
//! this target keeps the checks that need no daemon.

use serde_json::Value;

use crate::ipc::protocol::{self, codes};

/// Each line of the input through the request parser. Checked: a line it accepts is an object
/// serde_json reads too, with `"jsonrpc": "2.0"` and the method it reports; a request rebuilt
/// from what it read parses to the same id, method and params; a line it refuses gets an
/// error line that is one line of JSON with `jsonrpc` "2.0", the id it read (or null), and an
/// error code of JSON-RPC's or holdfast's with a short message.
pub fn protocol_request(data: &[u8]) -> bool {
    let mut parsed = false;
    for line in data.split(|&b| b == b'\n') {
        match protocol::parse_request(line) {
            Ok(env) => {
                parsed = true;
                let v: Value = serde_json::from_slice(line).expect("accepted, yet not JSON");
                assert_eq!(v["jsonrpc"], "2.0", "accepted without jsonrpc 2.0");
                assert_eq!(v["method"].as_str(), Some(&*env.method), "the method read");
                let params = env.params.map(|p| p.get().to_owned());
                let rebuilt = serde_json::json!({
                    "jsonrpc": "2.0",
                    "id": env.id,
                    "method": &*env.method,
                    "params": params
                        .as_deref()
                        .map(|p| serde_json::from_str::<Value>(p).expect("params not JSON")),
                })
                .to_string();
                let again = protocol::parse_request(rebuilt.as_bytes())
                    .unwrap_or_else(|e| panic!("a rebuilt request is refused: {:?}", e.1));
                assert_eq!(again.id, env.id, "the id changed on a rebuild");
                assert_eq!(again.method, env.method, "the method changed on a rebuild");
            }
            Err(bad) => {
                let (id, err) = &*bad;
                let out = protocol::response_err(id, err);
                assert_eq!(out.last(), Some(&b'\n'), "the error line has no newline");
                assert_eq!(
                    out.iter().filter(|&&b| b == b'\n').count(),
                    1,
                    "the error is more than one line"
                );
                let v: Value = serde_json::from_slice(&out).expect("the error line is not JSON");
                assert_eq!(v["jsonrpc"], "2.0");
                let code = v["error"]["code"]
                    .as_i64()
                    .expect("an error without a code");
                assert!(
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
                assert!(
                    msg.len() <= 512,
                    "a long error message ({} bytes)",
                    msg.len()
                );
            }
        }
    }
    parsed
}
