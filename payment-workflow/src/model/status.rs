//! The states an order, a token, a payment record and a refund go through: one enum each, stored as its text (with the
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
    /// Paid, then given back in full by refunds (`paid → refunded`): never payable again.
    Refunded,
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

/// A merchant refund's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefundState {
    /// Asked of the channel (or about to be): its amount is reserved on the payment.
    Processing,
    /// Refunded: its amount counts in the payment's `refunded_amount`.
    Succeeded,
    /// Refused before the channel, or failed (or refused) by it: nothing was refunded, nothing stays reserved.
    Failed,
}

onceflow_engine::stored_as_text! {
    OrderStatus { Pending = "pending", Paying = "paying", Paid = "paid", Refunded = "refunded" }
    RefundState { Processing = "processing", Succeeded = "succeeded", Failed = "failed" }
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
        assert_eq!(serde_json::to_value(OrderStatus::Refunded).unwrap(), "refunded");
        for s in [RefundState::Processing, RefundState::Succeeded, RefundState::Failed] {
            assert_eq!(serde_json::to_value(s).unwrap(), serde_json::json!(s.as_str()));
            assert_eq!(s.as_str().parse::<RefundState>().unwrap(), s);
        }
        assert!("expired".parse::<TokenState>().is_err());
    }
}
