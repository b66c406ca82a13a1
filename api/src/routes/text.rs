//! Text a client sends that is stored, searched or shown to people: a NUL byte (which no database stores in
//! text, and which PostgreSQL refuses outright) or another control character is the client's mistake, answered
//! `400`, never a server error.

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
}
