//! What a payment workflow is started with, and what follows from it alone: its workflow's id, the body of its
//! success, its charge request, its refund number.

use serde::{Deserialize, Serialize};

use super::{Currency, OrderNo, PaymentBody, PaymentStatus, RequestNo, Token, hex_sha256, stored};
use crate::channel::ChargeRequest;

/// The id of the workflow paying under `token`: derived from it, so repeats find it, without revealing it.
pub fn payment_workflow_id(token: &Token) -> String {
    format!("pay:{}", &hex_sha256(token.as_str().as_bytes())[..32])
}

/// What a payment workflow is started with: a [`crate::PaymentRequest`], resolved (its `request_no` fixed) and bound
/// to its tenant, token and route. Stored as the workflow's input, so its shape is the history's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentInput {
    /// Owner.
    pub tenant: String,
    /// The idempotency token.
    #[serde(deserialize_with = "stored::token")]
    pub token: Token,
    /// The route the token is used on.
    pub route: String,
    /// SHA-256 of the canonical request fields.
    pub fingerprint: String,
    /// The order.
    #[serde(deserialize_with = "stored::order_no")]
    pub order_no: OrderNo,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    #[serde(deserialize_with = "stored::currency")]
    pub currency: Currency,
    /// The payment's number: given by the client or derived from the token; never replaced.
    #[serde(deserialize_with = "stored::request_no")]
    pub request_no: RequestNo,
}

impl PaymentInput {
    /// The body of a succeeded payment (`201`), and of `GET /v1/payments/{request_no}` once paid.
    pub(crate) fn payment_body(&self, status: PaymentStatus, charge_id: Option<&str>) -> PaymentBody {
        PaymentBody {
            amount: self.amount,
            charge_id: charge_id.map(str::to_owned),
            currency: self.currency.clone(),
            decline_code: None,
            order_no: self.order_no.clone(),
            refunded_amount: None,
            request_no: self.request_no.clone(),
            status,
            workflow_id: None,
        }
    }

    pub(crate) fn refund_no(&self) -> String {
        self.request_no.refund_no()
    }

    /// The charge this payment asks the channel for: as the tenant's merchant (its merchant id is the tenant's
    /// name), under the payment's own number.
    pub(crate) fn charge_request(&self) -> ChargeRequest {
        ChargeRequest {
            merchant_id: self.tenant.clone(),
            merchant_request_no: self.request_no.to_string(),
            order_no: self.order_no.to_string(),
            amount: self.amount,
            currency: self.currency.to_string(),
            notify_url: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PaymentInput;

    #[test]
    fn inputs_stored_by_earlier_versions_still_read() {
        // Written before `.` and `..` were refused as numbers, and a queued command's token.
        let old = r#"{"tenant":"default","token":"mq:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
            "route":"amqp","fingerprint":"f","order_no":"..","amount":1000,"currency":"CNY","request_no":"."}"#;
        let input: PaymentInput = serde_json::from_str(old).unwrap();
        assert_eq!((input.order_no.as_str(), input.request_no.as_str()), ("..", "."));
        let http = r#"{"tenant":"t","token":"tok_abc","route":"/v1/payments","fingerprint":"f","order_no":"O-1",
            "amount":1,"currency":"CNY","request_no":"R-0123456789abcdef01234567"}"#;
        let input: PaymentInput = serde_json::from_str(http).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&serde_json::to_string(&input).unwrap()).unwrap(),
            serde_json::from_str::<serde_json::Value>(http).unwrap(),
            "written back as read"
        );
    }
}
