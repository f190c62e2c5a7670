//! Go's `%q` (`strconv.Quote`) of a string, as the API server prints names, users and
//! values in its messages: a client compares those messages, and kcache's must read the
//! same whatever bytes a name holds (a certificate's CN may carry spaces, NULs or
//! newlines).

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// Go's `unicode.IsPrint`: letters, marks, numbers, punctuation, symbols and the ASCII
/// space; every other space, control, format, surrogate, private-use or unassigned code
/// point is not printable.
pub fn is_print(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    !matches!(
        get_general_category(c),
        G::SpaceSeparator
            | G::LineSeparator
            | G::ParagraphSeparator
            | G::Control
            | G::Format
            | G::Surrogate
            | G::PrivateUse
            | G::Unassigned
    )
}

/// `strconv.Quote(s)`: double-quoted; `"` and `\` escaped; printable runes as they are;
/// `\a \b \f \n \r \t \v`; other runes below a space and DEL as `\xNN`, the rest as
/// `\uNNNN` or `\UNNNNNNNN` (lower-case hex, as Go).
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if is_print(c) => out.push(c),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each line as Go 1.25's `fmt.Sprintf("%q", in)` prints it.
    #[test]
    fn quotes_as_go() {
        let table = [
            ("bob", r#""bob""#),
            ("", r#""""#),
            ("bob ", r#""bob ""#),
            ("a\"b\\c", r#""a\"b\\c""#),
            ("bob\n", r#""bob\n""#),
            ("b\u{0}b", r#""b\x00b""#),
            ("\u{7}\u{8}\u{c}\r\t\u{b}", r#""\a\b\f\r\t\v""#),
            ("\u{1b}\u{7f}", r#""\x1b\x7f""#),
            ("b\u{f8}b \u{263a} \u{e9}", "\"b\u{f8}b \u{263a} \u{e9}\""),
            // Non-ASCII spaces, format characters and C1 controls are not printable.
            ("\u{a0}", r#""\u00a0""#),
            ("\u{ad}", r#""\u00ad""#),
            ("\u{200d}", r#""\u200d""#),
            ("\u{2028}", r#""\u2028""#),
            ("\u{85}", r#""\u0085""#),
            ("\u{feff}", r#""\ufeff""#),
            ("\u{e000}", r#""\ue000""#),
            ("\u{10ffff}", r#""\U0010ffff""#),
            ("\u{1f600}", "\"\u{1f600}\""),
            // Combining marks print.
            ("e\u{301}", "\"e\u{301}\""),
        ];
        for (input, want) in table {
            assert_eq!(go_quote(input), want, "{input:?}");
        }
    }
}
