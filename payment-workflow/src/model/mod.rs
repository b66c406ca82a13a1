//! Orders, tokens and payment records as stored, and the request to pay; the identifiers and statuses they are
//! made of (`ids.rs`, `status.rs`) and the answers a payment gives (`answer.rs`); a merchant's refund
//! (`refund.rs`, `refund_input.rs`), the channel numbers of refunds (`numbers.rs`) and the merchant event each
//! of their ends writes (`outcome.rs`).

use serde::Serialize;
use sha2::{Digest, Sha256};

mod answer;
mod ids;
mod input;
mod numbers;
mod outcome;
mod refund;
mod refund_input;
mod status;

pub(crate) use ids::stored;

pub use answer::{PaymentBody, Problem, StoredResponse, problem};
pub use ids::{
    Currency, InvalidField, KEY_PATTERN, OrderNo, RefundNo, RequestNo, TOKEN_PATTERN, Token, positive_amount,
};
pub use input::{PaymentInput, payment_workflow_id};
pub use numbers::{MERCHANT_REFUND_PREFIX, merchant_refund_no, refund_no_of};
pub(crate) use outcome::PaymentEnd;
pub use refund::{MAX_REASON_CHARS, NewRefund, RefundBody, RefundRecord};
pub use refund_input::{RefundInput, RefundRecorded, refund_workflow_id};
pub use status::{OrderStatus, PaymentStatus, RefundState, TokenState};

/// An order as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Order {
    /// Owner.
    #[serde(skip)]
    pub tenant: String,
    /// Unique per tenant.
    pub order_no: OrderNo,
    /// Minor units, > 0.
    pub amount: i64,
    /// ISO 4217.
    pub currency: Currency,
    /// Where the order is.
    pub status: OrderStatus,
    /// Incremented by every status change.
    pub version: i64,
    /// The `request_no` of the payment that moved it to `paying` (and, once confirmed, `paid`), which alone may
    /// move it on; `None` for an order never reserved.
    #[serde(skip)]
    #[sqlx(default)]
    pub reserved_by: Option<String>,
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
    pub token: Token,
    /// Owner.
    pub tenant: String,
    /// Where the token is.
    pub state: TokenState,
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
    pub request_no: RequestNo,
    /// The order paid for.
    pub order_no: OrderNo,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: Currency,
    /// Where the payment is.
    pub status: PaymentStatus,
    /// The token of the request that created it.
    #[serde(skip)]
    pub token: Token,
    /// The channel's charge id, once charged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charge_id: Option<String>,
    /// Why the channel declined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    /// Of a failed payment: its answer's problem code (`order_not_payable`, `channel_refused`, `payment_failed`,
    /// …), which rebuilds that answer once its token's stored one is gone (migration 0014). `None` for other
    /// payments, and for failed ones recorded before the column existed.
    #[serde(skip)]
    #[sqlx(default)]
    pub failure_code: Option<String>,
    /// Creation time (ms).
    #[serde(skip)]
    pub created_at: i64,
    /// Last change (ms).
    #[serde(skip)]
    pub updated_at: i64,
    /// What the merchant's refunds that succeeded gave back (minor units).
    pub refunded_amount: i64,
    /// What the merchant's refunds in flight hold (minor units): asked of the channel, not settled yet.
    #[serde(skip)]
    pub refund_reserved: i64,
}

/// A request to pay an order: valid by construction ([`PaymentRequest::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentRequest {
    order_no: OrderNo,
    amount: i64,
    currency: Currency,
    request_no: Option<RequestNo>,
}

impl PaymentRequest {
    /// A request to pay `order_no` `amount` (minor units, > 0) in `currency`, as the payment `request_no` (derived
    /// from the token when `None`).
    pub fn new(
        order_no: OrderNo,
        amount: i64,
        currency: Currency,
        request_no: Option<RequestNo>,
    ) -> Result<Self, InvalidField> {
        Ok(Self { order_no, amount: positive_amount(amount)?, currency, request_no })
    }

    /// The order.
    pub fn order_no(&self) -> &OrderNo {
        &self.order_no
    }

    /// Minor units; must equal the order's.
    pub fn amount(&self) -> i64 {
        self.amount
    }

    /// ISO 4217; must equal the order's.
    pub fn currency(&self) -> &Currency {
        &self.currency
    }

    /// The payment's number, when the client gave one.
    pub fn request_no(&self) -> Option<&RequestNo> {
        self.request_no.as_ref()
    }

    /// SHA-256 (hex) of the canonical request fields: what a token is bound to.
    pub fn fingerprint(&self) -> String {
        let canonical = format!(
            "order_no={}\namount={}\ncurrency={}\nrequest_no={}",
            self.order_no,
            self.amount,
            self.currency,
            self.request_no.as_ref().map_or("", RequestNo::as_str)
        );
        hex_sha256(canonical.as_bytes())
    }
}

impl PaymentRecord {
    /// This payment as `GET /v1/payments/{request_no}` shows it: its body, why the channel declined it, and the
    /// workflow that runs it.
    pub fn view(&self) -> PaymentBody {
        let workflow_id = Some(payment_workflow_id(&self.token));
        let refunded_amount = Some(self.refunded_amount);
        PaymentBody { decline_code: self.decline_code.clone(), refunded_amount, workflow_id, ..self.body() }
    }

    /// This payment's body as payment answers show it.
    pub(crate) fn body(&self) -> PaymentBody {
        PaymentBody {
            amount: self.amount,
            charge_id: self.charge_id.clone(),
            currency: self.currency.clone(),
            decline_code: None,
            order_no: self.order_no.clone(),
            refunded_amount: None,
            request_no: self.request_no.clone(),
            status: self.status,
            workflow_id: None,
        }
    }
}

pub(crate) fn hex_sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
