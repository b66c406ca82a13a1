//! A merchant's refund: the request to refund a payment, the refund as stored, and the refund as every answer
//! shows it.

use serde::{Deserialize, Serialize};

use super::{Currency, InvalidField, OrderNo, RefundNo, RefundState, RequestNo, hex_sha256, positive_amount};

/// The longest `reason` a refund may give, in characters.
pub const MAX_REASON_CHARS: usize = 500;

/// A request to refund a payment, all or a part of it: valid by construction ([`NewRefund::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRefund {
    amount: i64,
    refund_no: Option<RefundNo>,
    reason: Option<String>,
}

impl NewRefund {
    /// A refund of `amount` (minor units, > 0) as the refund `refund_no` (derived from the token when `None`),
    /// for `reason` (at most [`MAX_REASON_CHARS`] characters).
    pub fn new(amount: i64, refund_no: Option<RefundNo>, reason: Option<String>) -> Result<Self, InvalidField> {
        if reason.as_ref().is_some_and(|r| r.chars().count() > MAX_REASON_CHARS) {
            return Err(InvalidField { field: "reason", rule: "at most 500 characters" });
        }
        // Text a person wrote: line breaks and tabs, no other control character (a NUL cannot be stored on
        // Postgres; escapes would reach logs and the console).
        if reason.as_ref().is_some_and(|r| r.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))) {
            return Err(InvalidField { field: "reason", rule: "text without control characters" });
        }
        Ok(Self { amount: positive_amount(amount)?, refund_no, reason })
    }

    /// Minor units.
    pub fn amount(&self) -> i64 {
        self.amount
    }

    /// The refund's number, when the client gave one.
    pub fn refund_no(&self) -> Option<&RefundNo> {
        self.refund_no.as_ref()
    }

    /// Why, in the merchant's words.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// SHA-256 (hex) of the canonical fields of a refund of the payment `request_no`: what a token is bound to
    /// (with the route, which names the payment too). A JSON array, so that no reason can pass for other fields.
    pub fn fingerprint(&self, request_no: &RequestNo) -> String {
        let canonical = serde_json::json!(["refund", request_no, self.amount, self.refund_no, self.reason]);
        hex_sha256(canonical.to_string().as_bytes())
    }
}

/// A refund as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RefundRecord {
    /// Owner.
    pub tenant: String,
    /// Unique per tenant, forever.
    pub refund_no: RefundNo,
    /// The payment refunded.
    pub request_no: RequestNo,
    /// The payment's order.
    pub order_no: OrderNo,
    /// Minor units.
    pub amount: i64,
    /// The payment's currency.
    pub currency: Currency,
    /// Where the refund is.
    pub status: RefundState,
    /// Why, in the merchant's words.
    pub reason: Option<String>,
    /// The token of the request that created it.
    pub token: super::Token,
    /// The number the channel knows it by ([`super::merchant_refund_no`]).
    pub merchant_refund_no: String,
    /// The channel's refund id, once refunded.
    pub refund_id: Option<String>,
    /// Creation time (ms).
    pub created_at: i64,
    /// Last change (ms).
    pub updated_at: i64,
}

impl RefundRecord {
    /// This refund as `GET /v1/refunds/{refund_no}` shows it: its body and the workflow that runs it.
    pub fn view(&self) -> RefundBody {
        RefundBody { workflow_id: Some(super::refund_workflow_id(&self.token)), ..self.body() }
    }

    /// This refund's body as refund answers show it.
    pub(crate) fn body(&self) -> RefundBody {
        RefundBody {
            amount: self.amount,
            created_at: rfc3339(self.created_at),
            currency: self.currency.clone(),
            order_no: self.order_no.clone(),
            reason: self.reason.clone(),
            refund_id: self.refund_id.clone(),
            refund_no: self.refund_no.clone(),
            request_no: self.request_no.clone(),
            status: self.status,
            workflow_id: None,
        }
    }
}

/// A refund as every answer shows it (`201`, `202`, a replay, `GET /v1/refunds/{refund_no}`). Fields in
/// alphabetical order, as every body of this API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RefundBody {
    /// Minor units.
    pub amount: i64,
    /// When the refund was recorded (RFC 3339).
    #[schema(format = DateTime)]
    pub created_at: String,
    /// The payment's currency (ISO 4217).
    pub currency: Currency,
    /// The payment's order.
    pub order_no: OrderNo,
    /// Why, in the merchant's words; null when none was given.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// The channel's refund id, once refunded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refund_id: Option<String>,
    /// The refund's number.
    pub refund_no: RefundNo,
    /// The payment refunded.
    pub request_no: RequestNo,
    /// Where the refund is.
    pub status: RefundState,
    /// The workflow that runs the refund (`GET /v1/workflows/{workflow_id}`); on `GET` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
}

impl RefundBody {
    /// The body's JSON text.
    pub fn render(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Milliseconds since the epoch as RFC 3339 (UTC, milliseconds), as every time this API shows.
pub(crate) fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_bounded_and_fingerprints_tell_fields_apart() {
        assert!(NewRefund::new(1, None, Some("é".repeat(500))).is_ok());
        assert_eq!(NewRefund::new(1, None, Some("a".repeat(501))).unwrap_err().field, "reason");
        assert_eq!(NewRefund::new(0, None, None).unwrap_err().field, "amount");
        let r = RequestNo::parse("R-1").unwrap();
        let no = |s: &str| Some(RefundNo::parse(s).unwrap());
        let prints = [
            NewRefund::new(1, None, None).unwrap().fingerprint(&r),
            NewRefund::new(1, None, Some(String::new())).unwrap().fingerprint(&r),
            NewRefund::new(2, None, None).unwrap().fingerprint(&r),
            NewRefund::new(1, no("RF-1"), None).unwrap().fingerprint(&r),
            NewRefund::new(1, None, Some("RF-1".into())).unwrap().fingerprint(&r),
            NewRefund::new(1, None, None).unwrap().fingerprint(&RequestNo::parse("R-2").unwrap()),
        ];
        let distinct: std::collections::HashSet<_> = prints.iter().collect();
        assert_eq!(distinct.len(), prints.len());
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
