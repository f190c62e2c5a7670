//! Time as the Kubernetes API writes it, in one place for protobuf, tables and audit: RFC
//! 3339 timestamps (`Time`, `MicroTime`) read as Go's `time.Parse(time.RFC3339, …)` reads
//! them and written as Go formats them, and Go duration strings (`Duration`). The
//! calendar is jiff's; the shapes Go accepts are checked here, as jiff accepts more (a
//! space for `T`, `+0200`).

use std::time::{SystemTime, UNIX_EPOCH};

use jiff::civil::DateTime;

/// Seconds since the Unix epoch and nanoseconds of an RFC 3339 timestamp
/// (`2006-01-02T15:04:05Z`, `…05.123456Z`, `…05+02:00`), as Go's parser reads it: fixed
/// positions, a real calendar date, any number of fractional digits (the first nine
/// count); `None` if it is not one.
pub fn parse_rfc3339(s: &str) -> Option<(i64, u32)> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let kept = &frac[..digits.min(9)];
        nanos = kept.parse::<u32>().ok()? * 10u32.pow(9 - kept.len() as u32);
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let r = rest.as_bytes();
            if r.len() != 6 || !matches!(r[0], b'+' | b'-') || r[3] != b':' {
                return None;
            }
            let h: i64 = rest.get(1..3)?.parse().ok()?;
            let m: i64 = rest.get(4..6)?.parse().ok()?;
            if h > 23 || m > 59 {
                return None;
            }
            let o = h * 3600 + m * 60;
            if r[0] == b'-' {
                -o
            } else {
                o
            }
        }
    };
    // jiff refuses what is not a date or a time of day (Feb 30, hour 24, second 60).
    let local = DateTime::new(
        i16::try_from(year).ok()?,
        i8::try_from(month).ok()?,
        i8::try_from(day).ok()?,
        i8::try_from(hour).ok()?,
        i8::try_from(min).ok()?,
        i8::try_from(sec).ok()?,
        0,
    )
    .ok()?;
    // Days from the epoch by jiff's calendar (a Timestamp stops short of 9999-12-31,
    // which Go reads).
    let days = i64::from(
        jiff::civil::date(1970, 1, 1)
            .until((jiff::Unit::Day, local.date()))
            .ok()?
            .get_days(),
    );
    Some((days * 86_400 + hour * 3600 + min * 60 + sec - offset, nanos))
}

/// Go's `t.UTC().Format(time.RFC3339)` of whole seconds since the epoch
/// (`2021-01-13T13:18:24Z`); years 1 to 9999 (else Go's zero time).
pub fn format_rfc3339(secs: i64) -> String {
    civil(secs).map_or_else(
        || "0001-01-01T00:00:00Z".into(),
        |(date, t)| format!("{}T{}Z", ymd(date), hms(t)),
    )
}

/// RFC 3339 UTC with microseconds, as the API server writes audit timestamps
/// (`metav1.MicroTime`): `2026-11-28T12:00:00.000042Z`.
pub fn format_rfc3339_micros(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    civil(secs).map_or_else(
        || "9999-12-31T23:59:59.999999Z".into(),
        |(date, t)| format!("{}T{}.{:06}Z", ymd(date), hms(t), d.subsec_micros()),
    )
}

/// The UTC date of `secs` by jiff's calendar, and the second of that day. (A jiff
/// Timestamp stops short of 9999-12-31, which Go writes.)
fn civil(secs: i64) -> Option<(jiff::civil::Date, i64)> {
    let days = secs.div_euclid(86_400);
    let date = jiff::civil::date(1970, 1, 1)
        .checked_add(jiff::Span::new().try_days(days).ok()?)
        .ok()?;
    (date.year() >= 1).then_some((date, secs.rem_euclid(86_400)))
}

fn ymd(d: jiff::civil::Date) -> String {
    format!("{:04}-{:02}-{:02}", d.year(), d.month(), d.day())
}

fn hms(t: i64) -> String {
    format!("{:02}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
}

/// Nanoseconds of a Go duration string (`1h30m`, `1.5s`, `-300ms`, `0`), as Go's
/// `time.ParseDuration` reads it; `None` if it is not one or overflows.
pub fn parse_go_duration(s: &str) -> Option<i64> {
    let (neg, mut rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let int: i128 = if int_len > 0 {
            rest[..int_len].parse().ok()?
        } else {
            0
        };
        rest = &rest[int_len..];
        let (mut frac, mut frac_scale) = (0i128, 1i128);
        let mut frac_len = 0;
        if let Some(r) = rest.strip_prefix('.') {
            frac_len = r.bytes().take_while(u8::is_ascii_digit).count();
            for c in r[..frac_len].bytes().take(18) {
                frac = frac * 10 + i128::from(c - b'0');
                frac_scale *= 10;
            }
            rest = &r[frac_len..];
        }
        if int_len == 0 && frac_len == 0 {
            return None;
        }
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(rest.len(), |(i, _)| i);
        let unit: i128 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += int * unit + frac * unit / frac_scale;
        if total > i128::from(i64::MAX) + 1 {
            return None;
        }
    }
    let v = if neg { -total } else { total };
    i64::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_table() {
        for (s, want) in [
            ("1970-01-01T00:00:00Z", Some((0, 0))),
            ("2021-01-15T10:20:30Z", Some((1_610_706_030, 0))),
            (
                "2021-01-15T10:20:30.123456Z",
                Some((1_610_706_030, 123_456_000)),
            ),
            ("2021-01-15T12:20:30+02:00", Some((1_610_706_030, 0))),
            ("2021-01-15T08:20:30-02:00", Some((1_610_706_030, 0))),
            ("2000-02-29T00:00:00Z", Some((951_782_400, 0))),
            ("1969-12-31T23:59:59Z", Some((-1, 0))),
            ("0001-01-01T00:00:00Z", Some((-62_135_596_800, 0))),
            ("2001-02-29T00:00:00Z", None),
            ("2021-13-01T00:00:00Z", None),
            ("2021-01-15 10:20:30Z", None),
            ("2021-01-15T10:20:30", None),
            ("2021-01-15T10:20:30.Z", None),
            ("2021-01-15T10:20:3xZ", None),
            ("", None),
            ("2021-01-15T10:20:30+0200", None),
            ("2021-01-15T24:00:00Z", None),
            ("2021-01-15T10:60:00Z", None),
            ("2021-01-15T10:20:60Z", None),
            ("2021-01-15T10:20:30+24:00", None),
            ("2021-01-15t10:20:30z", Some((1_610_706_030, 0))),
            // Go keeps the first nine fractional digits.
            (
                "2021-01-15T10:20:30.1234567891Z",
                Some((1_610_706_030, 123_456_789)),
            ),
            ("9999-12-31T23:59:59Z", Some((253_402_300_799, 0))),
        ] {
            assert_eq!(parse_rfc3339(s), want, "{s}");
        }
    }

    #[test]
    fn formats_as_go() {
        for (secs, want) in [
            (0, "1970-01-01T00:00:00Z"),
            (-62_135_596_800, "0001-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_610_706_030, "2021-01-15T10:20:30Z"),
            (253_402_300_799, "9999-12-31T23:59:59Z"),
        ] {
            assert_eq!(format_rfc3339(secs), want);
            assert_eq!(parse_rfc3339(want), Some((secs, 0)));
        }
        let at =
            |secs: u64, micros: u32| UNIX_EPOCH + std::time::Duration::new(secs, micros * 1_000);
        assert_eq!(
            format_rfc3339_micros(UNIX_EPOCH),
            "1970-01-01T00:00:00.000000Z"
        );
        assert_eq!(
            format_rfc3339_micros(at(951_868_801, 42)),
            "2000-03-01T00:00:01.000042Z"
        );
    }

    #[test]
    fn go_duration_table() {
        for (s, want) in [
            ("0", Some(0)),
            ("0s", Some(0)),
            ("1s", Some(1_000_000_000)),
            ("1h30m", Some(5_400_000_000_000)),
            ("1.5s", Some(1_500_000_000)),
            ("-300ms", Some(-300_000_000)),
            ("2us", Some(2_000)),
            ("2µs", Some(2_000)),
            ("1m0.5s", Some(60_500_000_000)),
            (".5s", Some(500_000_000)),
            ("", None),
            ("1", None),
            ("1d", None),
            ("s", None),
            ("99999999999h", None),
        ] {
            assert_eq!(parse_go_duration(s), want, "{s}");
        }
    }
}
