//! The payment channel: the protocol's messages (`contracts/channel.md`), the client trait, an HTTP client and
//! a mock channel with faults.

use serde::{Deserialize, Serialize};

mod http;
mod mock;
mod mock_notify;
mod mock_server;
mod notify_url;
pub mod signature;
mod statement;

pub use http::HttpChannel;
pub use mock::{Ledger, LedgerCharge, MockChannel, MockChannelConfig};
pub use mock_notify::DEFAULT_NOTIFY_SCHEDULE;
pub use notify_url::with_notify_url;
pub use statement::{EntryKind, Notification, Statement, StatementLine, StatementSource};

/// `segment` percent-encoded for a URL path: every byte but the unreserved ones (`A-Z a-z 0-9 - . _ ~`).
pub(crate) fn path_segment(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
pub use mock_server::mock_channel_router;

/// `POST /v1/charges` (`contracts/channel.md`): what the channel is asked to charge for a payment, not the
/// payment request itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeRequest {
    /// The merchant charging: the tenant's channel merchant id (by default the tenant's name).
    pub merchant_id: String,
    /// The payment's `request_no`, fixed before the first call and never replaced; unique within its
    /// merchant.
    pub merchant_request_no: String,
    /// The order paid for.
    pub order_no: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// Where the channel notifies the merchant once the charge is final (`--public-url`); not sent when `None`,
    /// so a request without it is what it always was. Not one of the fields a repeat is compared on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_url: Option<String>,
}

impl ChargeRequest {
    /// Whether `other` asks for the same charge: everything but `notify_url`, which says where to tell, not what.
    pub fn same_charge(&self, other: &Self) -> bool {
        (&self.merchant_id, &self.merchant_request_no, &self.order_no, self.amount, &self.currency)
            == (&other.merchant_id, &other.merchant_request_no, &other.order_no, other.amount, &other.currency)
    }
}

/// A charge's status at the channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeStatus {
    /// Charged.
    Succeeded,
    /// Refused by the payer's side; nothing charged.
    Declined,
    /// Exists and will settle later.
    Processing,
}

/// A charge as the channel reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The merchant it belongs to, when the channel echoes it (the protocol says it does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merchant_id: Option<String>,
    /// The payment's `request_no`.
    pub merchant_request_no: String,
    /// The channel's id.
    pub charge_id: String,
    /// Current status.
    pub status: ChargeStatus,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// The order charged for, when the channel says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_no: Option<String>,
    /// Why it was declined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
}

impl Charge {
    /// Whether this charge is the one `request` asked for: the same merchant (when echoed), number, amount and
    /// currency, and the same order (when the channel says). A charge that is not belongs to someone else:
    /// never success for the payment, never refunded by it.
    pub fn matches(&self, request: &ChargeRequest) -> bool {
        self.merchant_id.as_deref().is_none_or(|m| m == request.merchant_id)
            && self.merchant_request_no == request.merchant_request_no
            && self.amount == request.amount
            && self.currency == request.currency
            && self.order_no.as_deref().is_none_or(|o| o == request.order_no)
    }
}

/// What closing a charge's number came to (`POST /v1/charges/{merchant_request_no}/close`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// No charge had been accepted under the number, and none will be from now on.
    Closed,
    /// A charge exists under the number, in its current status.
    Charged(Charge),
}

/// `POST /v1/refunds`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundRequest {
    /// The merchant refunding.
    pub merchant_id: String,
    /// Stable refund number: a merchant's refund's own, or one derived from the payment for a compensation.
    pub merchant_refund_no: String,
    /// The charge refunded.
    pub merchant_request_no: String,
    /// Minor units: all of the charge or a part of it.
    pub amount: i64,
    /// Where the channel notifies the merchant once the refund is final; not sent when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_url: Option<String>,
}

impl RefundRequest {
    /// Whether `other` asks for the same refund: everything but `notify_url`.
    pub fn same_refund(&self, other: &Self) -> bool {
        (&self.merchant_id, &self.merchant_refund_no, &self.merchant_request_no, self.amount)
            == (&other.merchant_id, &other.merchant_refund_no, &other.merchant_request_no, other.amount)
    }
}

/// A refund's status at the channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    /// Refunded.
    Succeeded,
    /// Will settle later.
    Processing,
    /// Refused.
    Failed,
}

/// A refund as the channel reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    /// The merchant it belongs to, when the channel echoes it (the protocol says it does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merchant_id: Option<String>,
    /// Our refund number.
    pub merchant_refund_no: String,
    /// The charge it refunds.
    pub merchant_request_no: String,
    /// The channel's id.
    pub refund_id: String,
    /// Minor units.
    pub amount: i64,
    /// Current status.
    pub status: RefundStatus,
}

impl Refund {
    /// Whether this refund is the one `request` asked for: the same merchant (when echoed), refund number,
    /// charge and amount. A refund that is not is someone else's answer: never taken as this refund's outcome.
    pub fn matches(&self, request: &RefundRequest) -> bool {
        self.merchant_id.as_deref().is_none_or(|m| m == request.merchant_id)
            && self.merchant_refund_no == request.merchant_refund_no
            && self.merchant_request_no == request.merchant_request_no
            && self.amount == request.amount
    }
}

/// How a call to the channel failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// `400`/`409`/`422`: refused, nothing charged. The body is for logs and operators, never for clients.
    #[error("refused by the channel ({status}): {body}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// What the channel said.
        body: String,
    },
    /// `5xx`, a timeout or a broken connection: the effect may or may not exist.
    #[error("unknown outcome: {0}")]
    Unknown(String),
}

/// A payment channel, as the saga calls it.
#[async_trait::async_trait]
pub trait Channel: Send + Sync + 'static {
    /// Creates (or, for a repeated `merchant_request_no`, returns) a charge.
    async fn charge(&self, request: &ChargeRequest) -> Result<Charge, ChannelError>;
    /// The merchant's charge with this number; `None` if none was accepted (yet: a request may be in flight).
    async fn query(&self, merchant_id: &str, merchant_request_no: &str) -> Result<Option<Charge>, ChannelError>;
    /// Closes the merchant's number: afterwards no charge is accepted under it, or the one that was is returned.
    async fn close(&self, merchant_id: &str, merchant_request_no: &str) -> Result<Closed, ChannelError>;
    /// Creates (or returns) a refund.
    async fn refund(&self, request: &RefundRequest) -> Result<Refund, ChannelError>;
    /// The merchant's refund with this number (`GET /v1/refunds/{merchant_refund_no}`); `None` if the channel
    /// holds none (yet: a request may be in flight). A channel that cannot be asked says so as a refusal.
    async fn query_refund(&self, merchant_id: &str, merchant_refund_no: &str) -> Result<Option<Refund>, ChannelError> {
        let _ = (merchant_id, merchant_refund_no);
        Err(ChannelError::Refused { status: 404, body: "this channel answers no refund queries".into() })
    }
    /// The merchant's statement of a UTC day, as a stream of lines (`GET /v1/statements/{date}`); `None` for a
    /// day the channel has no statement of yet (`404`). A channel that serves none says so as a refusal.
    async fn statement(&self, merchant_id: &str, day: chrono::NaiveDate) -> Result<Option<Statement>, ChannelError> {
        let _ = (merchant_id, day);
        Err(ChannelError::Refused { status: 404, body: "this channel serves no statements".into() })
    }
}
