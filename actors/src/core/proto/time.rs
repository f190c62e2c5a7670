//! The two text forms of time the Kubernetes JSON carries: RFC 3339 timestamps (`Time`,
//! `MicroTime`) and Go duration strings (`Duration`), read as protobuf stores them.

/// Seconds since the Unix epoch and nanoseconds of an RFC 3339 timestamp
/// (`2006-01-02T15:04:05Z`, `…05.123456Z`, `…05+02:00`); `None` if it is not one.
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
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || min > 59 || sec > 59 {
        return None;
    }
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        let scale = 10u32.pow(9 - digits as u32);
        nanos = frac[..digits].parse::<u32>().ok()? * scale;
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
    let days = days_from_civil(year, month, day);
    Some((days * 86_400 + hour * 3600 + min * 60 + sec - offset, nanos))
}

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
        ] {
            assert_eq!(parse_rfc3339(s), want, "{s}");
        }
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
