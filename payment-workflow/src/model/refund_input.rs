//! What a refund workflow is started with, and what follows from it: its workflow's id, its channel request,
//! the bodies of its answers.

use serde::{Deserialize, Serialize};

use super::refund::rfc3339;
use super::{Currency, OrderNo, RefundBody, RefundNo, RefundState, RequestNo, Token, hex_sha256, stored};
use crate::channel::RefundRequest;

/// The id of the workflow refunding under `token`: derived from it, so repeats find it, without revealing it.
/// Its own prefix: a token used for a payment and then presented for a refund names another workflow, which
/// cannot claim the token (it is no longer `issued`), and the token's route answers the mismatch.
pub fn refund_workflow_id(token: &Token) -> String {
    format!("refund:{}", &hex_sha256(token.as_str().as_bytes())[..32])
}

/// What a refund workflow is started with: a [`super::NewRefund`] of the payment `request_no`, resolved (its
/// `refund_no` and the channel's number fixed) and bound to its tenant, token and route. Stored as the workflow's
/// input, so its shape is the history's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundInput {
    /// Owner.
    pub tenant: String,
    /// The idempotency token.
    #[serde(deserialize_with = "stored::token")]
    pub token: Token,
    /// The route the token is used on (it names the payment).
    pub route: String,
    /// SHA-256 of the canonical request fields.
    pub fingerprint: String,
    /// The payment refunded.
    #[serde(deserialize_with = "stored::request_no")]
    pub request_no: RequestNo,
    /// The refund's number: given by the client or derived from the token; never replaced.
    #[serde(deserialize_with = "stored::refund_no")]
    pub refund_no: RefundNo,
    /// Minor units.
    pub amount: i64,
    /// Why, in the merchant's words.
    pub reason: Option<String>,
    /// The number the channel knows the refund by, fixed with the input (so that a later version deriving
    /// numbers otherwise still asks the channel about this refund under the number it used).
    pub merchant_refund_no: String,
}

/// What recording a refund fixed besides its input: the payment's order and currency, and the time it was
/// recorded (the output of `insert_refund`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundRecorded {
    /// When the refund was recorded (ms).
    pub created_at: i64,
    /// The payment's currency.
    #[serde(deserialize_with = "stored::currency")]
    pub currency: Currency,
    /// The payment's order.
    #[serde(deserialize_with = "stored::order_no")]
    pub order_no: OrderNo,
}

impl RefundInput {
    /// The refund this input asks the channel for: as the tenant's merchant, of the charge under the payment's
    /// number, under the refund's own channel number.
    pub(crate) fn refund_request(&self) -> RefundRequest {
        RefundRequest {
            merchant_id: self.tenant.clone(),
            merchant_refund_no: self.merchant_refund_no.clone(),
            merchant_request_no: self.request_no.to_string(),
            amount: self.amount,
            notify_url: None,
        }
    }

    /// The refund's body in `status`, as recorded.
    pub(crate) fn body(&self, recorded: &RefundRecorded, status: RefundState, refund_id: Option<&str>) -> RefundBody {
        RefundBody {
            amount: self.amount,
            created_at: rfc3339(recorded.created_at),
            currency: recorded.currency.clone(),
            order_no: recorded.order_no.clone(),
            reason: self.reason.clone(),
            refund_id: refund_id.map(str::to_owned),
            refund_no: self.refund_no.clone(),
            request_no: self.request_no.clone(),
            status,
            workflow_id: None,
        }
    }
}
