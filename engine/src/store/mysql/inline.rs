//! Values written into the SQL text of MySQL's one-call commits (see `commit.rs`). MySQL runs several statements
//! in one call only as text, where a prepared statement's parameters cannot go, so each value is written in as a
//! literal that no value can break out of: text as the hex of its UTF-8 bytes (no quote, no backslash, whatever
//! the `sql_mode`), with the `utf8mb4` introducer and the tables' binary collation (so that it compares as a
//! column's own text, by the column's index, and never mixes collations with the connection's literals);
//! numbers as their digits.

use std::fmt::Write;

use crate::error::{Error, Result};
use crate::phase::SqlArg;

/// Text as a literal.
pub(super) fn text(s: &str) -> String {
    let mut lit = String::with_capacity(s.len() * 2 + 32);
    lit.push_str("_utf8mb4 X'");
    for b in s.bytes() {
        let _ = write!(lit, "{b:02x}");
    }
    lit.push_str("' COLLATE utf8mb4_bin");
    lit
}

/// Text or `NULL`.
pub(super) fn opt_text(s: Option<&str>) -> String {
    s.map_or_else(|| "NULL".to_owned(), text)
}

/// A number or `NULL`.
pub(super) fn opt_int(i: Option<i64>) -> String {
    i.map_or_else(|| "NULL".to_owned(), |i| i.to_string())
}

/// A statement phase's argument.
pub(super) fn arg(a: &SqlArg) -> String {
    match a {
        SqlArg::Text(t) => text(t),
        SqlArg::Int(i) => i.to_string(),
    }
}

/// `sql` with each `?` outside quotes replaced by the next of `values`, in order (MySQL's positional
/// parameters, as the store's statements are written).
pub(super) fn positional(sql: &str, values: &[String]) -> Result<String> {
    let mut values = values.iter();
    let mut out = String::with_capacity(sql.len() + values.len() * 24);
    let mut quoted = false;
    for c in sql.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted => out.push_str(values.next().ok_or_else(|| unbound("?"))?),
            _ => out.push(c),
        }
    }
    if values.next().is_some() {
        return Err(Error::Unsupported("more values than parameters in a one-call commit".into()));
    }
    Ok(out)
}

/// `sql` with each `$n` outside quotes replaced by `values[n - 1]` (a statement phase's numbered parameters).
pub(super) fn numbered(sql: &str, values: &[String]) -> Result<String> {
    let mut out = String::with_capacity(sql.len() + values.len() * 24);
    let mut quoted = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '$' if !quoted && chars.peek().is_some_and(char::is_ascii_digit) => {
                let mut n = 0usize;
                while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                    n = n.saturating_mul(10).saturating_add(d as usize);
                    chars.next();
                }
                let value = n.checked_sub(1).and_then(|i| values.get(i)).ok_or_else(|| unbound(&format!("${n}")))?;
                out.push_str(value);
            }
            _ => out.push(c),
        }
    }
    Ok(out)
}

fn unbound(param: &str) -> Error {
    Error::Unsupported(format!("parameter {param} without a value in a one-call commit"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_hex_whatever_it_holds() {
        assert_eq!(text("a'\\"), "_utf8mb4 X'61275c' COLLATE utf8mb4_bin");
        assert_eq!(text(""), "_utf8mb4 X'' COLLATE utf8mb4_bin");
        assert_eq!(opt_text(None), "NULL");
    }

    #[test]
    fn parameters_outside_quotes_are_replaced() {
        let values = ["1".to_owned(), "2".to_owned()];
        assert_eq!(positional("SELECT ?, '?', ?", &values).unwrap(), "SELECT 1, '?', 2");
        assert!(positional("SELECT ?", &values).is_err());
        assert!(positional("SELECT ?, ?, ?", &values).is_err());
        let mut ten: Vec<String> = (1..=10).map(|i| format!("v{i}")).collect();
        assert_eq!(numbered("$1 '$2' $10 $2", &ten).unwrap(), "v1 '$2' v10 v2");
        ten.truncate(9);
        assert!(numbered("$10", &ten).is_err());
        assert!(numbered("$0", &ten).is_err());
    }
}
