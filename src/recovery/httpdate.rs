//! HTTP-dates (RFC 9110 §5.6.7) for Retry-After: the preferred IMF-fixdate
//! (`Sun, 06 Nov 1994 08:49:37 GMT`) and the two obsolete forms a recipient must accept
//! (RFC 850 `Sunday, 06-Nov-94 08:49:37 GMT` and asctime `Sun Nov  6 08:49:37 1994`).

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Seconds since the Unix epoch, or `None` if `s` is not an HTTP-date.
pub fn parse(s: &str) -> Option<u64> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let (day, month, year, time) = match parts.as_slice() {
        // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
        [wd, d, mon, y, t, "GMT"] if wd.ends_with(',') => {
            (d.parse().ok()?, month(mon)?, y.parse().ok()?, *t)
        }
        // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
        [wd, dmy, t, "GMT"] if wd.ends_with(',') => {
            let mut it = dmy.split('-');
            let d = it.next()?.parse().ok()?;
            let m = month(it.next()?)?;
            let y2: u64 = it.next()?.parse().ok()?;
            // Two-digit years: RFC 9110 says interpret one more than 50 years ahead as past.
            let y = if y2 < 70 { 2000 + y2 } else { 1900 + y2 };
            (d, m, y, *t)
        }
        // asctime: Sun Nov  6 08:49:37 1994
        [_, mon, d, t, y] => (d.parse().ok()?, month(mon)?, y.parse().ok()?, *t),
        _ => return None,
    };
    let mut hms = time.split(':');
    let h: u64 = hms.next()?.parse().ok()?;
    let mi: u64 = hms.next()?.parse().ok()?;
    let se: u64 = hms.next()?.parse().ok()?;
    if hms.next().is_some() || h > 23 || mi > 59 || se > 60 || !(1..=31).contains(&day) {
        return None;
    }
    // Four-digit years only: a client-supplied date must not overflow the day arithmetic.
    if !(1970..=9999).contains(&year) {
        return None;
    }
    Some(days_from_civil(year, month_num(month), day) * 86_400 + h * 3600 + mi * 60 + se)
}

fn month(s: &str) -> Option<usize> {
    MONTHS.iter().position(|m| *m == s)
}

fn month_num(m: usize) -> u64 {
    m as u64 + 1
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_of_rfc_9110() {
        // 784111777 is the RFC's example instant.
        assert_eq!(parse("Sun, 06 Nov 1994 08:49:37 GMT"), Some(784_111_777));
        assert_eq!(parse("Sunday, 06-Nov-94 08:49:37 GMT"), Some(784_111_777));
        assert_eq!(parse("Sun Nov  6 08:49:37 1994"), Some(784_111_777));
        assert_eq!(parse("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(parse("Sat, 29 Feb 2020 12:00:00 GMT"), Some(1_582_977_600));
        for bad in [
            "",
            "tomorrow",
            "Sun, 06 Nov 1994 08:49:37 PST",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:49:37 GMT",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sun, 06 Nov 18446744073709551615 08:49:37 GMT",
            "Sun, 06 Nov 1969 08:49:37 GMT",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
