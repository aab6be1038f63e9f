//! The plugin API's contract, shared by the server (`ipc`), the client (`client`) and the
//! configuration (`config`, which checks grants against the method list): the protocol version,
//! every method's name, and the error codes with the error kind each stands for. It depends on
//! nothing but [`crate::error`], so every side can use it without pulling in the server.
//! docs/protocol.md documents each method.

use crate::error::ErrorKind;

/// The protocol version this server speaks (`hello` answers it; a client checks it).
pub const PROTOCOL_VERSION: u64 = 1;

/// JSON-RPC's standard codes, and holdfast's server codes (one per error kind).
pub mod codes {
    /// Not JSON (or nested deeper than 128 levels).
    pub const PARSE_ERROR: i64 = -32700;
    /// JSON, but not a JSON-RPC 2.0 request.
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Bad parameters (including a bad credential id or document).
    pub const INVALID_PARAMS: i64 = -32602;
    /// A bug in holdfast.
    pub const INTERNAL: i64 = -32603;
    /// `not_found`.
    pub const NOT_FOUND: i64 = -32001;
    /// `conflict`.
    pub const CONFLICT: i64 = -32002;
    /// `forbidden`.
    pub const FORBIDDEN: i64 = -32003;
    /// `sealed`.
    pub const SEALED: i64 = -32004;
    /// `integrity`.
    pub const INTEGRITY: i64 = -32005;
    /// `storage`.
    pub const STORAGE: i64 = -32006;
    /// `busy`.
    pub const BUSY: i64 = -32007;
    /// `unsupported` (a known method this configuration cannot do).
    pub const UNSUPPORTED: i64 = -32008;
}

/// The JSON-RPC code for an error kind.
pub fn code_for(kind: ErrorKind) -> i64 {
    match kind {
        ErrorKind::InvalidParams => codes::INVALID_PARAMS,
        ErrorKind::NotFound => codes::NOT_FOUND,
        ErrorKind::Conflict => codes::CONFLICT,
        ErrorKind::Forbidden => codes::FORBIDDEN,
        ErrorKind::Sealed => codes::SEALED,
        ErrorKind::Integrity => codes::INTEGRITY,
        ErrorKind::Storage => codes::STORAGE,
        ErrorKind::Busy => codes::BUSY,
        ErrorKind::Unsupported => codes::UNSUPPORTED,
    }
}

/// The error kind a code stands for (clients decoding a response).
pub fn kind_for(code: i64) -> Option<ErrorKind> {
    Some(match code {
        codes::PARSE_ERROR | codes::INVALID_REQUEST | codes::INVALID_PARAMS => {
            ErrorKind::InvalidParams
        }
        codes::METHOD_NOT_FOUND | codes::UNSUPPORTED => ErrorKind::Unsupported,
        codes::NOT_FOUND => ErrorKind::NotFound,
        codes::CONFLICT => ErrorKind::Conflict,
        codes::FORBIDDEN => ErrorKind::Forbidden,
        codes::SEALED => ErrorKind::Sealed,
        codes::INTEGRITY => ErrorKind::Integrity,
        codes::STORAGE | codes::INTERNAL => ErrorKind::Storage,
        codes::BUSY => ErrorKind::Busy,
        _ => return None,
    })
}

/// Every method served, in `hello`'s list.
pub const METHODS: &[&str] = &[
    "hello",
    "cred.get",
    "cred.set",
    "cred.delete",
    "cred.list",
    "cred.exists",
    "cred.watch",
    "cred.refresh_lease",
    "cred.release_lease",
    "unsubscribe",
    "admin.status",
    "admin.fsck",
    "admin.reindex",
    "admin.rotate_key",
    "admin.prune_keys",
    "stream.begin",
    "stream.append",
    "stream.interrupt",
    "stream.resume",
    "stream.commit",
    "stream.abort",
    "stream.subscribe",
    "stream.get",
    "stream.list",
    "checkpoint.put",
    "checkpoint.get",
    "checkpoint.delete",
    "run.log_node",
    "run.ensure_node",
    "run.log_step",
    "run.tool_begin",
    "run.tool_end",
    "run.end",
    "run.start",
    "run.get",
    "run.list",
    "run.prune",
];
