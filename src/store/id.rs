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
    /// A character that does not show, or shows as something else: a format character
    /// (Unicode category Cf: bidirectional overrides and isolates, zero-width characters, the
    /// soft hyphen, tags, …), a default-ignorable one (variation selectors, Hangul fillers, …),
    /// a line or paragraph separator, or a space other than U+0020. They make one id look like
    /// another in a listing (`cred list` of "pay\u{202E}lanigiro" shows "payoriginal"), so they
    /// are refused, not shown.
    #[error("invalid id: contains an invisible or look-alike character (a format, default-ignorable or non-ASCII space character), which would let it look like another id")]
    Invisible,
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

/// Whether `c` is an invisible formatting character that can make one id display as another
/// (see [`IdError::Invisible`]).
fn is_invisible_format(c: char) -> bool {
    matches!(c,
        // Format characters (Cf).
        '\u{00AD}' | '\u{0600}'..='\u{0605}' | '\u{061C}' | '\u{06DD}' | '\u{070F}'
        | '\u{0890}'..='\u{0891}' | '\u{08E2}' | '\u{180E}' | '\u{200B}'..='\u{200F}'
        | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{206F}'
        | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}' | '\u{110BD}' | '\u{110CD}'
        | '\u{13430}'..='\u{1343F}' | '\u{1BCA0}'..='\u{1BCA3}' | '\u{1D173}'..='\u{1D17A}'
        // Default-ignorable, not Cf: the combining grapheme joiner, Hangul fillers, Khmer
        // inherent vowels, Mongolian selectors, variation selectors, reserved, tags.
        | '\u{034F}' | '\u{115F}'..='\u{1160}' | '\u{17B4}'..='\u{17B5}'
        | '\u{180B}'..='\u{180D}' | '\u{180F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}'
        | '\u{FFA0}' | '\u{FFF0}'..='\u{FFF8}' | '\u{E0000}'..='\u{E0FFF}'
        // Line and paragraph separators, every space but the ASCII one, the braille blank.
        | '\u{2028}' | '\u{2029}' | '\u{00A0}' | '\u{1680}' | '\u{2000}'..='\u{200A}'
        | '\u{202F}' | '\u{205F}' | '\u{3000}' | '\u{2800}'
        // Combining marks: `cafe` + U+0301 lists as `café`, another id than the precomposed
        // one (precomposed letters are accepted).
        | '\u{0300}'..='\u{036F}' | '\u{1AB0}'..='\u{1AFF}' | '\u{1DC0}'..='\u{1DFF}'
        | '\u{20D0}'..='\u{20FF}' | '\u{FE20}'..='\u{FE2F}')
}

/// Check an id against holdfast's rules: non-empty, at most 251 bytes (hive's own limit:
/// `<id>.enc` is a file name), no control characters,
/// no invisible formatting characters (bidirectional or zero-width controls), no `\`, no
/// leading `.`, `-` or `/`, and no empty, `.` or `..` segments between `/`s.
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
    if id.chars().any(is_invisible_format) {
        return Err(IdError::Invisible);
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
            "café",
        ] {
            validate(id).unwrap_or_else(|e| panic!("{id}: {e}"));
        }
    }

    #[test]
    fn rejects_every_rule() {
        let long = "a".repeat(252);
        let cases: &[(&str, IdError)] = &[
            ("", IdError::Empty),
            (&long, IdError::TooLong(252)),
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
            ("pay\u{202E}lanigiro", IdError::Invisible),
            ("a\u{202A}b", IdError::Invisible),
            ("a\u{2066}b", IdError::Invisible),
            ("a\u{2069}", IdError::Invisible),
            ("\u{200F}x", IdError::Invisible),
            ("x\u{200E}", IdError::Invisible),
            ("x\u{061C}", IdError::Invisible),
            ("open\u{200B}ai", IdError::Invisible),
            ("a\u{200D}b", IdError::Invisible),
            ("a\u{2060}b", IdError::Invisible),
            ("a\u{FEFF}", IdError::Invisible),
            // An independent tester's list beyond the first rule.
            ("a\u{00AD}b", IdError::Invisible),
            ("a\u{034F}b", IdError::Invisible),
            ("a\u{115F}b", IdError::Invisible),
            ("a\u{3164}b", IdError::Invisible),
            ("a\u{FFA0}b", IdError::Invisible),
            ("a\u{180E}b", IdError::Invisible),
            ("a\u{2028}b", IdError::Invisible),
            ("a\u{2029}b", IdError::Invisible),
            ("a\u{206A}b", IdError::Invisible),
            ("a\u{206F}b", IdError::Invisible),
            ("a\u{FE0F}b", IdError::Invisible),
            ("a\u{FFF9}b", IdError::Invisible),
            ("a\u{1D173}b", IdError::Invisible),
            ("a\u{13430}b", IdError::Invisible),
            ("openai\u{E0020}", IdError::Invisible),
            ("a\u{E0001}b", IdError::Invisible),
            ("a\u{E0041}b", IdError::Invisible),
            ("a\u{00A0}b", IdError::Invisible),
            ("a\u{3000}b", IdError::Invisible),
            // The second round: a reserved default-ignorable, the braille blank, combining marks.
            ("a\u{2065}b", IdError::Invisible),
            ("open\u{2800}ai", IdError::Invisible),
            ("cafe\u{0301}", IdError::Invisible),
            ("a\u{20E3}", IdError::Invisible),
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
