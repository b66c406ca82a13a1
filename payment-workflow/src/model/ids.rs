//! The values a client names a payment by — `order_no`, `request_no`, the idempotency token, the currency —
//! each a type that only a valid value can become: checked once, where it enters (a request body, a header, a
//! queued command), so an invalid one cannot reach the database. Their constraints are also their schemas in the
//! OpenAPI document.

use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};

/// Why a value is not valid: which field, and what it must be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} must be {rule}")]
pub struct InvalidField {
    /// The field, as the request names it.
    pub field: &'static str,
    /// What a valid value is.
    pub rule: &'static str,
}

/// `order_no` and `request_no`: what a valid one is.
const KEY_RULE: &str = "1-64 characters of A-Z a-z 0-9 . _ : -, other than . and ..";

/// [`KEY_RULE`] as a regular expression without look-ahead (which JSON Schema's dialect lacks).
pub const KEY_PATTERN: &str =
    r"^([A-Za-z0-9_:-][A-Za-z0-9._:-]{0,63}|\.[A-Za-z0-9_:-][A-Za-z0-9._:-]{0,62}|\.\.[A-Za-z0-9._:-]{1,62})$";

/// An idempotency token as a client presents it.
const TOKEN_RULE: &str = "1-128 characters of A-Z a-z 0-9 _ -";

/// [`TOKEN_RULE`] as a regular expression.
pub const TOKEN_PATTERN: &str = "^[A-Za-z0-9_-]{1,128}$";

/// 1–64 characters of `A-Z a-z 0-9 . _ : -`, and not `.` or `..`, which a URL path (the channel's, this API's)
/// would read as a directory step.
fn is_key(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 64
        && value != "."
        && value != ".."
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

fn string_schema(pattern: &str, max_length: usize, description: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
        .min_length(Some(1))
        .max_length(Some(max_length))
        .description(Some(description))
        .into()
}

/// An order's number, unique per tenant: [`KEY_RULE`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, sqlx::Type)]
#[serde(try_from = "String", into = "String")]
#[sqlx(transparent)]
pub struct OrderNo(String);

/// A payment's number, unique per tenant forever, and the channel's `merchant_request_no`: [`KEY_RULE`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, sqlx::Type)]
#[serde(try_from = "String", into = "String")]
#[sqlx(transparent)]
pub struct RequestNo(String);

/// A merchant refund's number, unique per tenant forever: [`KEY_RULE`]. The channel knows the refund by a number
/// derived from it (`numbers.rs`), never by this one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, sqlx::Type)]
#[serde(try_from = "String", into = "String")]
#[sqlx(transparent)]
pub struct RefundNo(String);

impl OrderNo {
    /// The order number `value`, if it is one.
    pub fn parse(value: impl Into<String>) -> Result<Self, InvalidField> {
        let value = value.into();
        if is_key(&value) { Ok(Self(value)) } else { Err(InvalidField { field: "order_no", rule: KEY_RULE }) }
    }
}

impl RequestNo {
    /// The request number `value`, if it is one.
    pub fn parse(value: impl Into<String>) -> Result<Self, InvalidField> {
        let value = value.into();
        if is_key(&value) { Ok(Self(value)) } else { Err(InvalidField { field: "request_no", rule: KEY_RULE }) }
    }

    /// The number of a payment whose client gave none: derived from its token, so every repeat has the same.
    pub(crate) fn of_token(token: &Token) -> Self {
        Self(format!("R-{}", &super::hex_sha256(token.as_str().as_bytes())[..24]))
    }

    /// The number of this payment's refund.
    pub(crate) fn refund_no(&self) -> String {
        format!("{}-refund", self.0)
    }
}

impl RefundNo {
    /// The refund number `value`, if it is one.
    pub fn parse(value: impl Into<String>) -> Result<Self, InvalidField> {
        let value = value.into();
        if is_key(&value) { Ok(Self(value)) } else { Err(InvalidField { field: "refund_no", rule: KEY_RULE }) }
    }

    /// The number of a refund whose client gave none: derived from its token, so every repeat has the same.
    pub(crate) fn of_token(token: &Token) -> Self {
        Self(format!("RF-{}", &super::hex_sha256(token.as_str().as_bytes())[..24]))
    }
}

/// An idempotency token: issued by `POST /v1/tokens` (or the client's own key) and presented as
/// `Idempotency-Key` ([`TOKEN_RULE`]), or derived from a queued command's identity (`mq:…`, a form no client can
/// present).
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(try_from = "String", into = "String")]
#[sqlx(transparent)]
pub struct Token(String);

impl Token {
    /// A token as a client presents it.
    pub fn parse(value: impl Into<String>) -> Result<Self, InvalidField> {
        let value = value.into();
        let ok = !value.is_empty()
            && value.len() <= 128
            && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if ok { Ok(Self(value)) } else { Err(InvalidField { field: "token", rule: TOKEN_RULE }) }
    }

    /// A newly issued token: `tok_` and 256 bits, hex.
    pub(crate) fn issue() -> Self {
        let random = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        // Two v4 UUIDs carry 244 random bits; hashing keeps the token's form uniform.
        Self(format!("tok_{}", super::hex_sha256(random.as_bytes())))
    }

    /// The token of a queued command: derived from its tenant and `request_no`, so every delivery of the command
    /// meets the same one. It holds a `:`, which a presented token cannot, so no HTTP request can present it.
    pub fn of_command(tenant: &str, request_no: &RequestNo) -> Self {
        // Length-prefixed: no two (tenant, request_no) pairs share an input.
        let identity = format!("{}:{tenant}{request_no}", tenant.len());
        Self(format!("mq:{}", super::hex_sha256(identity.as_bytes())))
    }

    /// Either form, as stored (a workflow's input read back).
    fn stored(value: String) -> Result<Self, InvalidField> {
        match value.strip_prefix("mq:") {
            Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(Self(value)),
            _ => Self::parse(value),
        }
    }
}

/// Never printed: a token is a bearer of the payment's identity.
impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(…)")
    }
}

/// An ISO 4217 currency code's shape: three upper-case letters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(try_from = "String", into = "String")]
#[sqlx(transparent)]
pub struct Currency(String);

impl Currency {
    /// The currency `value`, if it has the shape of one.
    pub fn parse(value: impl Into<String>) -> Result<Self, InvalidField> {
        let value = value.into();
        if value.len() == 3 && value.bytes().all(|b| b.is_ascii_uppercase()) {
            Ok(Self(value))
        } else {
            Err(InvalidField { field: "currency", rule: "an ISO 4217 code (three upper-case letters)" })
        }
    }
}

/// An amount in minor units: a positive integer.
pub fn positive_amount(amount: i64) -> Result<i64, InvalidField> {
    if amount > 0 {
        Ok(amount)
    } else {
        Err(InvalidField { field: "amount", rule: "a positive integer in minor units" })
    }
}

impl TryFrom<String> for OrderNo {
    type Error = InvalidField;
    fn try_from(value: String) -> Result<Self, InvalidField> {
        Self::parse(value)
    }
}

impl TryFrom<String> for RequestNo {
    type Error = InvalidField;
    fn try_from(value: String) -> Result<Self, InvalidField> {
        Self::parse(value)
    }
}

impl TryFrom<String> for RefundNo {
    type Error = InvalidField;
    fn try_from(value: String) -> Result<Self, InvalidField> {
        Self::parse(value)
    }
}

impl TryFrom<String> for Token {
    type Error = InvalidField;
    fn try_from(value: String) -> Result<Self, InvalidField> {
        Self::stored(value)
    }
}

impl TryFrom<String> for Currency {
    type Error = InvalidField;
    fn try_from(value: String) -> Result<Self, InvalidField> {
        Self::parse(value)
    }
}

/// The four as text: what they are on the wire and in the database.
macro_rules! text {
    ($($ty:ident),+) => {$(
        impl $ty {
            /// The value as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl From<$ty> for String {
            fn from(value: $ty) -> String {
                value.0
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $ty {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $ty {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    )+};
}
text!(OrderNo, RequestNo, RefundNo, Token, Currency);

/// Shown in messages and logs (never a token: see its `Debug`).
macro_rules! display {
    ($($ty:ident),+) => {$(
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    )+};
}
display!(OrderNo, RequestNo, RefundNo, Currency);

impl utoipa::PartialSchema for OrderNo {
    fn schema() -> RefOr<Schema> {
        string_schema(KEY_PATTERN, 64, "An order's number: 1-64 characters of A-Z a-z 0-9 . _ : -, other than . and ..")
    }
}
impl utoipa::ToSchema for OrderNo {}

impl utoipa::PartialSchema for RequestNo {
    fn schema() -> RefOr<Schema> {
        string_schema(
            KEY_PATTERN,
            64,
            "A payment's number: 1-64 characters of A-Z a-z 0-9 . _ : -, other than . and ..",
        )
    }
}
impl utoipa::ToSchema for RequestNo {}

impl utoipa::PartialSchema for RefundNo {
    fn schema() -> RefOr<Schema> {
        string_schema(KEY_PATTERN, 64, "A refund's number: 1-64 characters of A-Z a-z 0-9 . _ : -, other than . and ..")
    }
}
impl utoipa::ToSchema for RefundNo {}

impl utoipa::PartialSchema for Token {
    fn schema() -> RefOr<Schema> {
        string_schema(TOKEN_PATTERN, 128, "An idempotency token: 1-128 characters of A-Z a-z 0-9 _ -")
    }
}
impl utoipa::ToSchema for Token {}

impl utoipa::PartialSchema for Currency {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[A-Z]{3}$"))
            .description(Some("ISO 4217: three upper-case letters"))
            .into()
    }
}
impl utoipa::ToSchema for Currency {}

/// Reading back what this service stored itself (a workflow's input), without the checks of the edge: a value
/// stored by an earlier version under looser rules (an `order_no` of `..` before that was refused) must still
/// read, or its workflow could neither finish nor compensate. For `#[serde(deserialize_with)]`.
pub(crate) mod stored {
    use serde::{Deserialize, Deserializer};

    use super::{Currency, OrderNo, RefundNo, RequestNo, Token};

    /// An order number as stored.
    pub(crate) fn order_no<'de, D: Deserializer<'de>>(d: D) -> Result<OrderNo, D::Error> {
        String::deserialize(d).map(OrderNo)
    }

    /// A payment number as stored.
    pub(crate) fn request_no<'de, D: Deserializer<'de>>(d: D) -> Result<RequestNo, D::Error> {
        String::deserialize(d).map(RequestNo)
    }

    /// A refund number as stored.
    pub(crate) fn refund_no<'de, D: Deserializer<'de>>(d: D) -> Result<RefundNo, D::Error> {
        String::deserialize(d).map(RefundNo)
    }

    /// A token as stored.
    pub(crate) fn token<'de, D: Deserializer<'de>>(d: D) -> Result<Token, D::Error> {
        String::deserialize(d).map(Token)
    }

    /// A currency as stored.
    pub(crate) fn currency<'de, D: Deserializer<'de>>(d: D) -> Result<Currency, D::Error> {
        String::deserialize(d).map(Currency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_valid_values_become_identifiers() {
        assert!(OrderNo::parse("O-1.a_b:c").is_ok());
        for bad in ["", ".", "..", "a b", "é", &"a".repeat(65)] {
            assert!(OrderNo::parse(bad).is_err(), "{bad:?}");
            assert!(RequestNo::parse(bad).is_err(), "{bad:?}");
            assert!(RefundNo::parse(bad).is_err(), "{bad:?}");
        }
        assert!(OrderNo::parse("...").is_ok());
        assert!(Token::parse("tok_abc-DEF_123").is_ok());
        for bad in ["", "tok abc", "mq:abc", &"a".repeat(129)] {
            assert!(Token::parse(bad).is_err(), "{bad:?}");
        }
        let command = Token::of_command("default", &RequestNo::parse("R-1").unwrap());
        assert!(Token::parse(command.as_str()).is_err(), "no client can present a command's token");
        let back: Token = serde_json::from_value(serde_json::json!(command.as_str())).unwrap();
        assert_eq!(back, command, "a stored command token reads back");
        assert!(Currency::parse("CNY").is_ok());
        assert!(Currency::parse("cny").is_err() && Currency::parse("CNYY").is_err());
        assert!(positive_amount(0).is_err() && positive_amount(1).is_ok());
        let e = serde_json::from_value::<OrderNo>(serde_json::json!("a b")).unwrap_err();
        assert!(e.to_string().contains("order_no must be"), "{e}");
    }

    #[test]
    fn the_pattern_says_what_the_check_does() {
        // The same cases through the regular expression's meaning, by hand: its three alternatives.
        for ok in ["a", ".a", "..a", "...", "a.", &"a".repeat(64)] {
            assert!(is_key(ok), "{ok:?}");
        }
        for bad in [".", ".."] {
            assert!(!is_key(bad));
        }
    }
}
