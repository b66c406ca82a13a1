//! Orders, tokens and payment records as stored, the request to pay, and stored responses.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Order statuses.
pub mod order_status {
    /// Payable.
    pub const PENDING: &str = "pending";
    /// A payment attempt is in flight.
    pub const PAYING: &str = "paying";
    /// Paid: never payable again.
    pub const PAID: &str = "paid";
}

/// Token states.
pub mod token_state {
    /// Issued, not used yet.
    pub const ISSUED: &str = "issued";
    /// Bound to a request that is being processed.
    pub const IN_USE: &str = "in_use";
    /// Holds the final response, replayed to every repeat.
    pub const COMPLETED: &str = "completed";
    /// Unused past its expiry (reported; stored tokens stay `issued`).
    pub const EXPIRED: &str = "expired";
}

/// Payment record statuses.
pub mod payment_status {
    /// Being charged.
    pub const PROCESSING: &str = "processing";
    /// Charged.
    pub const SUCCEEDED: &str = "succeeded";
    /// Declined by the channel.
    pub const DECLINED: &str = "declined";
    /// Rejected before the channel, or failed and compensated.
    pub const FAILED: &str = "failed";
}

/// An order as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Order {
    /// Owner.
    #[serde(skip)]
    pub tenant: String,
    /// Unique per tenant.
    pub order_no: String,
    /// Minor units, > 0.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// One of [`order_status`]'s constants.
    pub status: String,
    /// Incremented by every status change.
    pub version: i64,
    /// Creation time (ms since the epoch).
    #[serde(skip)]
    pub created_at: i64,
    /// Last change (ms since the epoch).
    pub updated_at: i64,
}

/// An idempotency token as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TokenRecord {
    /// The token itself (≥ 128 random bits).
    pub token: String,
    /// Owner.
    pub tenant: String,
    /// One of [`token_state`]'s constants.
    pub state: String,
    /// SHA-256 of the canonical request fields it was first used with.
    pub fingerprint: Option<String>,
    /// The route it was first used on.
    pub route: Option<String>,
    /// Final response status, once completed.
    pub response_status: Option<i32>,
    /// Final response body, byte for byte, once completed.
    pub response_body: Option<String>,
    /// Issue time (ms).
    pub created_at: i64,
    /// Unused tokens expire then (ms).
    pub expires_at: i64,
    /// Last change (ms).
    pub updated_at: i64,
}

/// A payment record as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct PaymentRecord {
    /// Owner.
    #[serde(skip)]
    pub tenant: String,
    /// Unique per tenant, forever; the channel's `merchant_request_no`.
    pub request_no: String,
    /// The order paid for.
    pub order_no: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// One of [`payment_status`]'s constants.
    pub status: String,
    /// The token of the request that created it.
    #[serde(skip)]
    pub token: String,
    /// The channel's charge id, once charged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charge_id: Option<String>,
    /// Why the channel declined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    /// Creation time (ms).
    #[serde(skip)]
    pub created_at: i64,
    /// Last change (ms).
    #[serde(skip)]
    pub updated_at: i64,
}

/// A request to pay an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayRequest {
    /// The order.
    pub order_no: String,
    /// Minor units; must equal the order's.
    pub amount: i64,
    /// ISO 4217; must equal the order's.
    pub currency: String,
    /// The payment's number; derived from the token when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_no: Option<String>,
}

impl PayRequest {
    /// SHA-256 (hex) of the canonical request fields: what a token is bound to.
    pub fn fingerprint(&self) -> String {
        let canonical = format!(
            "order_no={}\namount={}\ncurrency={}\nrequest_no={}",
            self.order_no,
            self.amount,
            self.currency,
            self.request_no.as_deref().unwrap_or("")
        );
        hex_sha256(canonical.as_bytes())
    }

    /// Checks the fields; the message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        validate_key("order_no", &self.order_no)?;
        if self.amount <= 0 {
            return Err("amount must be a positive integer in minor units".into());
        }
        validate_currency(&self.currency)?;
        if let Some(r) = &self.request_no {
            validate_key("request_no", r)?;
        }
        Ok(())
    }
}

/// Checks an identifier chosen by a client (`order_no`, `request_no`): 1–64 characters of `A-Z a-z 0-9 . _ : -`,
/// and not `.` or `..`, which a URL path (the channel's, this API's) would read as a directory step.
pub fn validate_key(field: &str, value: &str) -> Result<(), String> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value != "."
        && value != ".."
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!("{field} must be 1-64 characters of A-Z a-z 0-9 . _ : -, other than . and .."))
    }
}

/// Checks an ISO 4217 code's shape: three upper-case letters.
pub fn validate_currency(currency: &str) -> Result<(), String> {
    if currency.len() == 3 && currency.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(())
    } else {
        Err("currency must be an ISO 4217 code (three upper-case letters)".into())
    }
}

/// A final response as stored with its token and replayed byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// HTTP status.
    pub status: u16,
    /// JSON body, exactly as first sent.
    pub body: String,
}

/// The body of a payment as every answer shows it (`201`, `202`, a replay): its number, order, amount, currency,
/// status and, once charged, the channel's charge id.
pub(crate) fn payment_body(
    request_no: &str,
    order_no: &str,
    amount: i64,
    currency: &str,
    status: &str,
    charge_id: Option<&str>,
) -> String {
    let mut body = serde_json::json!({
        "request_no": request_no,
        "order_no": order_no,
        "amount": amount,
        "currency": currency,
        "status": status,
    });
    if let Some(id) = charge_id {
        body["charge_id"] = serde_json::json!(id);
    }
    body.to_string()
}

impl PaymentRecord {
    /// This payment's body as answers show it (see [`payment_body`]).
    pub(crate) fn body(&self) -> String {
        let r = self;
        payment_body(&r.request_no, &r.order_no, r.amount, &r.currency, &r.status, r.charge_id.as_deref())
    }
}

/// A problem+json body (RFC 9457) with a stable `code`.
pub fn problem(status: u16, code: &str, title: &str, detail: &str) -> String {
    serde_json::json!({
        "type": format!("urn:onceflow:problem:{code}"),
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    })
    .to_string()
}

pub(crate) fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
