//! The payment channel: the protocol's messages (`contracts/channel.md`), the client trait, an HTTP client and
//! a mock channel with faults.

use serde::{Deserialize, Serialize};

mod http;
mod mock;
mod mock_server;

pub use http::HttpChannel;
pub use mock::{Ledger, LedgerCharge, MockChannel, MockChannelConfig};
pub use mock_server::mock_channel_router;

/// `POST /v1/charges`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeRequest {
    /// The payment's `request_no`, fixed before the first call and never replaced.
    pub merchant_request_no: String,
    /// The order paid for.
    pub order_no: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
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
    /// Why it was declined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
}

/// `POST /v1/refunds`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundRequest {
    /// Stable refund number, derived from the payment.
    pub merchant_refund_no: String,
    /// The charge refunded.
    pub merchant_request_no: String,
    /// Minor units.
    pub amount: i64,
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
    /// Our refund number.
    pub merchant_refund_no: String,
    /// The channel's id.
    pub refund_id: String,
    /// Current status.
    pub status: RefundStatus,
}

/// How a call to the channel failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// `400`/`409`/`422`: refused, nothing charged.
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
    /// The charge with this number; `None` if none was accepted.
    async fn query(&self, merchant_request_no: &str) -> Result<Option<Charge>, ChannelError>;
    /// Creates (or returns) a refund.
    async fn refund(&self, request: &RefundRequest) -> Result<Refund, ChannelError>;
}
