//! The wire protocol, v1: newline-delimited JSON-RPC 2.0 over a Unix stream socket.
//!
//! Everything a request and its answer look like on the wire, in one place:
//! - [`envelope`]: a request line's `jsonrpc`, `id`, `method`, with `params` kept as raw text;
//! - [`call`]: every method's params read once from that text into its typed params
//!   ([`Call`]); the method families' params, results and event types in [`creds`], [`admin`],
//!   [`streams`], [`runs`] and [`session`] (`hello`, `unsubscribe`);
//! - [`error`]: [`RpcError`], each error mapped to one code and one stable `data.kind`;
//! - [`lines`]: response and notification lines.
//!
//! The contract both sides share (version, methods, codes) is [`crate::api`]. Handlers stay
//! thin.

pub mod admin;
pub mod call;
pub mod creds;
pub mod envelope;
pub mod error;
pub mod lines;
pub mod runs;
pub mod session;
pub mod streams;

pub use crate::api::{code_for, codes, kind_for, PROTOCOL_VERSION};
pub use call::Call;
pub use envelope::{parse_request, BadRequest, Envelope};
pub use error::{redact_quoted, result, typed, RpcError};
pub use lines::{
    notification_of, response_credential, response_err, response_ok, response_ok_public,
    response_ok_public_into,
};

/// A request id: a number, a string, or null (JSON-RPC allows all three).
pub type Id = serde_json::Value;
