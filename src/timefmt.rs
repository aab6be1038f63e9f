//! Timestamps in the two text forms hive uses, without a date-time dependency.
//!
//! Credential files use pydantic's form, `2026-01-01T00:00:01Z` (six fraction digits only when
//! non-zero: `…01.120000Z`); `index.json` uses Python's `isoformat()`, `…+00:00`.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Microseconds since the Unix epoch, now.
pub fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

// Howard Hinnant's civil-from-days / days-from-civil.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn format(micros: i64, suffix: &str) -> String {
    let secs = micros.div_euclid(1_000_000);
    let frac = micros.rem_euclid(1_000_000);
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let (h, mi, s) = (sod / 3600, (sod % 3600) / 60, sod % 60);
    let mut out = format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}");
    if frac != 0 {
        out.push_str(&format!(".{frac:06}"));
    }
    out.push_str(suffix);
    out
}

/// `2026-01-01T00:00:01Z` / `2026-01-01T00:00:01.120000Z` (credential files).
pub fn format_z(micros: i64) -> String {
    format(micros, "Z")
}

/// `2026-01-01T00:00:01+00:00` (index.json, Python's `isoformat()`).
pub fn format_offset(micros: i64) -> String {
    format(micros, "+00:00")
}

/// Parse an ISO 8601 timestamp as hive writes them (`Z`, `±HH:MM`, or naive = UTC) into
/// microseconds since the epoch. `None` if it is not one.
pub fn parse(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> { text.get(r)?.parse().ok() };
    let (y, mo, d) = (num(0..4)?, num(5..7)? as u32, num(8..10)? as u32);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut rest = text.get(19..)?;
    let mut micros = 0i64;
    if let Some(r) = rest.strip_prefix('.') {
        let digits = r.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let frac = &r[..digits];
        let padded: String = frac.chars().chain(std::iter::repeat('0')).take(6).collect();
        micros = padded.parse().ok()?;
        rest = &r[digits..];
    }
    let offset_secs = match rest {
        "" | "Z" | "z" => 0,
        o if o.len() == 6 && matches!(o.as_bytes()[0], b'+' | b'-') && o.as_bytes()[3] == b':' => {
            let sign = if o.starts_with('-') { -1 } else { 1 };
            let hh: i64 = o.get(1..3)?.parse().ok()?;
            let mm: i64 = o.get(4..6)?.parse().ok()?;
            sign * (hh * 3600 + mm * 60)
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset_secs;
    Some(secs * 1_000_000 + micros)
}

/// Whether hive's model (pydantic 2's datetime parser) certainly accepts `text` as a datetime:
/// `YYYY-MM-DD`, optionally `T`/`t`/space and `HH:MM`, optionally `:SS`, optionally a fraction
/// after `.` or `,`, optionally `Z`/`z`/`±HH:MM`/`±HHMM` — a real calendar date (leap years),
/// year 1–9999, hours < 24, minutes and seconds < 60, offsets under 24 h. Stricter than
/// pydantic where it is lax (numeric strings, leap seconds are refused here): a document is
/// refused rather than written in a form hive's loader rejects.
pub fn hive_accepts(text: &str) -> bool {
    fn digits(b: &[u8], at: usize, n: usize) -> Option<u32> {
        let s = b.get(at..at + n)?;
        s.iter()
            .all(u8::is_ascii_digit)
            .then(|| s.iter().fold(0, |acc, d| acc * 10 + u32::from(d - b'0')))
    }
    let b = text.as_bytes();
    let (Some(y), Some(mo), Some(d)) = (digits(b, 0, 4), digits(b, 5, 2), digits(b, 8, 2)) else {
        return false;
    };
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if b[4] != b'-' || b[7] != b'-' || y == 0 || !(1..=12).contains(&mo) {
        return false;
    }
    if d == 0 || d > month_days[mo as usize - 1] {
        return false;
    }
    let mut i = 10;
    if b.len() == i {
        return true;
    }
    if !matches!(b[i], b'T' | b't' | b' ') {
        return false;
    }
    let (Some(h), Some(mi)) = (digits(b, i + 1, 2), digits(b, i + 4, 2)) else {
        return false;
    };
    if b.get(i + 3) != Some(&b':') || h > 23 || mi > 59 {
        return false;
    }
    i += 6;
    if b.get(i) == Some(&b':') {
        match digits(b, i + 1, 2) {
            Some(s) if s < 60 => i += 3,
            _ => return false,
        }
        if matches!(b.get(i), Some(b'.' | b',')) {
            let n = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            if n == 0 {
                return false;
            }
            i += 1 + n;
        }
    }
    match &b[i..] {
        [] | [b'Z' | b'z'] => true,
        [b'+' | b'-', ..] => {
            let o = &b[i + 1..];
            let (hh, mm) = match o.len() {
                5 if o[2] == b':' => (digits(o, 0, 2), digits(o, 3, 2)),
                4 => (digits(o, 0, 2), digits(o, 2, 2)),
                _ => return false,
            };
            matches!((hh, mm), (Some(hh), Some(mm)) if hh < 24 && mm < 60)
        }
        _ => false,
    }
}

/// Convert a credential-file timestamp to index form: `Z` becomes `+00:00` (other offsets and
/// naive timestamps are already in `isoformat()` form and pass through).
pub fn z_to_offset(text: &str) -> String {
    match text.strip_suffix('Z') {
        Some(base) => format!("{base}+00:00"),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What pydantic 2.13 (hive's model) answered for each of these, probed with
    /// `CredentialKey(expires_at=…)`; `hive_accepts` may refuse what pydantic accepts, never
    /// the reverse (`plugins/python/tests/test_hive.py` checks the same against hive itself).
    #[test]
    fn hive_accepts_only_what_pydantic_does() {
        for ok in [
            "2024-02-29T00:00:00",
            "2026-01-01T00:00:59.999999999",
            "2026-01-01T00:00:00+23:59",
            "2026-01-01T00:00:00-23:59",
            "2026-01-01",
            "2026-01-01T00:00",
            "2026-01-01T00:00:00+0200",
            "9999-12-31T23:59:59",
            "2026-01-01t00:00:00",
            "2026-01-01 00:00:00",
            "2026-01-01T00:00:00.1234567",
            "2026-01-01T00:00:00,5",
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00z",
        ] {
            assert!(hive_accepts(ok), "{ok}");
        }
        for bad in [
            "2026-02-30T00:00:00",
            "2026-02-29T00:00:00",
            "2026-04-31T00:00:00",
            "2026-01-01T00:00:60",
            "2026-01-01T24:00:00",
            "2026-01-01T00:00:00+24:00",
            "2026-01-01T00:00:00+99:00",
            "2026-01-01T00:00:00+00:60",
            "2026-01-01T00:00:00+02",
            "0000-01-01T00:00:00",
            "2026-01-01T00:00:00.",
            "20260101T000000",
            "2026-1-01T00:00:00",
            " 2026-01-01T00:00:00",
            "2026-01-01T00:00:00 ",
            "1e9",
            "2026-13-01T00:00:00",
            "2026-00-01T00:00:00",
            "2026-01-00T00:00:00",
            "+2026-01-01T00:00:00",
            "2026-01-01T00:00:00+٠٢:00",
            "",
        ] {
            assert!(!hive_accepts(bad), "{bad}");
        }
    }

    #[test]
    fn formats_like_hive() {
        assert_eq!(format_z(1_767_225_601_000_000), "2026-01-01T00:00:01Z");
        assert_eq!(
            format_z(1_767_225_601_120_000),
            "2026-01-01T00:00:01.120000Z"
        );
        assert_eq!(format_offset(0), "1970-01-01T00:00:00+00:00");
        assert_eq!(format_z(951_782_400_000_000), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn parses_what_it_formats_and_offsets() {
        for m in [
            0,
            1_767_225_601_120_000,
            951_782_400_000_001,
            4_102_444_800_000_000,
        ] {
            assert_eq!(parse(&format_z(m)), Some(m));
            assert_eq!(parse(&format_offset(m)), Some(m));
        }
        assert_eq!(
            parse("2026-01-01T02:00:01+02:00"),
            parse("2026-01-01T00:00:01Z")
        );
        assert_eq!(parse("2026-01-01T00:00:01"), parse("2026-01-01T00:00:01Z"));
        assert_eq!(parse("garbage"), None);
        // Multi-byte characters where digits or separators belong never panic.
        for hostile in [
            "2026-01-01T00:00:00+0é00",
            "2026-01-01T00:00:00+00é0",
            "2026-01-01T00:00:0é",
            "2026-01-01T00:00:00.é",
            "2026-01-01T00:00:00é+00:00",
            "ééééééééééééééééééé",
            "2026-01-01T00:00:00+é:00",
        ] {
            assert_eq!(parse(hostile), None, "{hostile}");
        }
        assert_eq!(parse("2026-13-01T00:00:00Z"), None);
        assert_eq!(
            z_to_offset("2026-01-01T00:00:01Z"),
            "2026-01-01T00:00:01+00:00"
        );
    }
}
