//! The states an order, a token and a payment record go through: one enum each, stored as its text (with the
//! engine's [`onceflow_engine::stored_as_text!`], as the engine's own statuses are).

use serde::{Deserialize, Serialize};

/// An order's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    /// Payable.
    Pending,
    /// A payment attempt is in flight.
    Paying,
    /// Paid: never payable again.
    Paid,
}

/// An idempotency token's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenState {
    /// Issued, not used yet.
    Issued,
    /// Bound to a request that is being processed.
    InUse,
    /// Holds the final response, replayed to every repeat.
    Completed,
}

/// A payment record's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    /// Being charged.
    Processing,
    /// Charged.
    Succeeded,
    /// Declined by the channel.
    Declined,
    /// Rejected before the channel, or failed and compensated.
    Failed,
}

onceflow_engine::stored_as_text! {
    OrderStatus { Pending = "pending", Paying = "paying", Paid = "paid" }
    TokenState { Issued = "issued", InUse = "in_use", Completed = "completed" }
    PaymentStatus { Processing = "processing", Succeeded = "succeeded", Declined = "declined", Failed = "failed" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_serde_agree() {
        for s in [TokenState::Issued, TokenState::InUse, TokenState::Completed] {
            assert_eq!(serde_json::to_value(s).unwrap(), serde_json::json!(s.as_str()));
            assert_eq!(s.as_str().parse::<TokenState>().unwrap(), s);
        }
        assert_eq!(serde_json::to_value(PaymentStatus::Succeeded).unwrap(), "succeeded");
        assert_eq!(serde_json::to_value(OrderStatus::Paying).unwrap(), "paying");
        assert!("expired".parse::<TokenState>().is_err());
    }
}
