//! Credential ids: validation (before any file-system call) and hive's id → file-name mapping.

use crate::limits::MAX_ID_BYTES;

/// Why an id was refused. The message never echoes the id (it may be hostile or huge).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Empty id.
    #[error("invalid id: empty")]
    Empty,
    /// Longer than the limit.
    #[error("invalid id: {0} bytes, more than the {MAX_ID_BYTES}-byte limit")]
    TooLong(usize),
    /// A NUL or other control character.
    #[error("invalid id: contains a control character")]
    Control,
    /// A backslash.
    #[error("invalid id: contains '\\'")]
    Backslash,
    /// Starts with `.`, `-` or `/`.
    #[error("invalid id: must not start with '.', '-' or '/'")]
    BadStart,
    /// A `..` or `.` path segment, or an empty segment (`a//b`, trailing `/`).
    #[error("invalid id: contains an empty, '.' or '..' segment")]
    BadSegment,
    /// Not valid UTF-8.
    #[error("invalid id: not valid UTF-8")]
    NotUtf8,
}

/// Check an id against holdfast's rules: non-empty, at most 200 bytes, no control characters,
/// no `\`, no leading `.`, `-` or `/`, and no empty, `.` or `..` segments between `/`s.
/// `/` itself is allowed (hive maps it to `_` in the file name).
pub fn validate(id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty);
    }
    if id.len() > MAX_ID_BYTES {
        return Err(IdError::TooLong(id.len()));
    }
    if id.chars().any(char::is_control) {
        return Err(IdError::Control);
    }
    if id.contains('\\') {
        return Err(IdError::Backslash);
    }
    if id.starts_with(['.', '-', '/']) {
        return Err(IdError::BadStart);
    }
    if id
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err(IdError::BadSegment);
    }
    Ok(())
}

/// Validate an id that arrived as raw bytes (from argv or a socket).
pub fn validate_bytes(id: &[u8]) -> Result<&str, IdError> {
    let s = std::str::from_utf8(id).map_err(|_| IdError::NotUtf8)?;
    validate(s)?;
    Ok(s)
}

/// hive's file stem: `id.replace("/", "_").replace("\\", "_").replace("..", "_")`, in that
/// order. Distinct ids can share a stem (`a/b` and `a_b`); the id inside the file decides.
pub fn safe_stem(id: &str) -> String {
    id.replace(['/', '\\'], "_").replace("..", "_")
}

/// The credential file name for an id: `<safe_stem>.enc`.
pub fn file_name(id: &str) -> String {
    format!("{}.enc", safe_stem(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_ids() {
        for id in [
            "openai",
            "cred_00000",
            "a/b",
            "team/github/token",
            "a..b",
            "x-y",
            "ünï",
        ] {
            validate(id).unwrap_or_else(|e| panic!("{id}: {e}"));
        }
    }

    #[test]
    fn rejects_every_rule() {
        let long = "a".repeat(201);
        let cases: &[(&str, IdError)] = &[
            ("", IdError::Empty),
            (&long, IdError::TooLong(201)),
            ("a\0b", IdError::Control),
            ("a\nb", IdError::Control),
            ("a\u{7f}", IdError::Control),
            ("a\\b", IdError::Backslash),
            (".", IdError::BadStart),
            ("..", IdError::BadStart),
            ("../x", IdError::BadStart),
            (".hidden", IdError::BadStart),
            ("-rf", IdError::BadStart),
            ("/etc/passwd", IdError::BadStart),
            ("a/../b", IdError::BadSegment),
            ("a/./b", IdError::BadSegment),
            ("a//b", IdError::BadSegment),
            ("a/", IdError::BadSegment),
            ("a/..", IdError::BadSegment),
        ];
        for (id, want) in cases {
            assert_eq!(validate(id).as_ref(), Err(want), "{id:?}");
        }
        assert_eq!(validate_bytes(b"\xff\xfe"), Err(IdError::NotUtf8));
        assert!(validate(&"a".repeat(200)).is_ok());
    }

    #[test]
    fn hive_mapping() {
        assert_eq!(file_name("a/b"), "a_b.enc");
        assert_eq!(file_name("a_b"), "a_b.enc");
        assert_eq!(file_name("a..b"), "a_b.enc");
        assert_eq!(file_name("openai"), "openai.enc");
    }

    #[test]
    fn error_messages_do_not_echo_the_id() {
        let e = validate("secret\0stuff").unwrap_err().to_string();
        assert!(!e.contains("secret"));
    }
}
