//! The stable error kinds every holdfast error maps to: on the wire (`data.kind`) and as the
//! admin CLI's exit code. One mapping, here, so the two never disagree.

use std::fmt;

/// What kind of failure an error is. The strings are a public contract (clients in several
/// languages match on them): never rename one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request itself is wrong (bad id, bad document, bad arguments).
    InvalidParams,
    /// No such credential.
    NotFound,
    /// A compare-and-swap lost, or the id collides with another credential's file.
    Conflict,
    /// Not allowed: unsafe permissions or ownership, a symlink where the daemon keeps a file
    /// or directory under its data directory, or outside a grant.
    Forbidden,
    /// The store has data but no usable key; nothing was modified.
    Sealed,
    /// A file is tampered with, damaged, swapped, or stamped in the future.
    Integrity,
    /// An I/O failure; nothing was changed (or the store refuses writes until reopened).
    Storage,
    /// A lock was held by someone else for the whole timeout.
    Busy,
    /// Not supported in this configuration.
    Unsupported,
}

impl ErrorKind {
    /// Every kind, in the order of the table in docs/protocol.md.
    pub const ALL: [ErrorKind; 9] = [
        ErrorKind::InvalidParams,
        ErrorKind::NotFound,
        ErrorKind::Conflict,
        ErrorKind::Forbidden,
        ErrorKind::Sealed,
        ErrorKind::Integrity,
        ErrorKind::Storage,
        ErrorKind::Busy,
        ErrorKind::Unsupported,
    ];

    /// The kind named by a wire string (`data.kind`).
    pub fn from_wire(s: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidParams => "invalid_params",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::Sealed => "sealed",
            ErrorKind::Integrity => "integrity",
            ErrorKind::Storage => "storage",
            ErrorKind::Busy => "busy",
            ErrorKind::Unsupported => "unsupported",
        }
    }

    /// The admin CLI's exit code for this kind (documented in README and `holdfast --help`).
    /// 0 is success, 1 an unexpected error, 2 a usage error.
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::InvalidParams => 2,
            ErrorKind::NotFound => 3,
            ErrorKind::Conflict => 4,
            ErrorKind::Sealed => 5,
            ErrorKind::Integrity => 6,
            ErrorKind::Storage => 7,
            ErrorKind::Busy => 8,
            ErrorKind::Forbidden => 9,
            ErrorKind::Unsupported => 10,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
