//! Text a client sends that is stored, searched or shown to people, over HTTP or on the command line: a NUL
//! byte (which no database stores in text, and which PostgreSQL refuses outright) or another control character
//! is the client's mistake (over HTTP `400`, never a server error); and such text printed on a terminal is
//! escaped, so that what it holds cannot move the cursor or recolour what follows.

use crate::error::ApiError;

/// `value` of the field `field` if it holds no control character; `400 invalid_request` otherwise.
pub fn plain<'a>(field: &str, value: &'a str) -> Result<&'a str, ApiError> {
    if value.chars().any(char::is_control) {
        return Err(ApiError::invalid(format!("{field} must not contain control characters")));
    }
    Ok(value)
}

/// As [`plain`] for an optional field.
pub fn plain_opt<'a>(field: &str, value: Option<&'a str>) -> Result<Option<&'a str>, ApiError> {
    value.map(|v| plain(field, v)).transpose()
}

/// A reason an operator gives (several lines are its own): no control character but line breaks and tabs.
pub fn reason(value: &str) -> Result<&str, ApiError> {
    if value.chars().any(|c| c.is_control() && c != '\n' && c != '\t' && c != '\r') {
        return Err(ApiError::invalid("reason must not contain control characters other than line breaks and tabs"));
    }
    Ok(value)
}

/// `text` for a terminal: every control character (line breaks too: one entry, one line) as its escape
/// (`\n`, `\u{1b}`), at most `max` characters of it shown (then `…`).
pub fn printable(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_are_refused() {
        assert!(super::plain("q", "O-1").is_ok());
        for bad in ["\0", "a\u{1}", "\u{7f}", "\u{85}", "a\nb"] {
            assert!(super::plain("q", bad).is_err(), "{bad:?}");
        }
        assert!(super::reason("line\nline\ttab").is_ok());
        assert!(super::reason("nul\0").is_err());
        assert!(super::reason("\u{1b}[31m").is_err());
    }

    #[test]
    fn printed_text_holds_no_control_character() {
        assert_eq!(super::printable("a\nb\u{1b}[2Jc\r", 100), "a\\nb\\u{1b}[2Jc\\r");
        assert_eq!(super::printable("naïve 支付", 100), "naïve 支付");
        assert_eq!(super::printable("abcdef", 3), "abc…");
    }
}
