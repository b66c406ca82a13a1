//! A payment's or refund's end as the merchant's event (`contracts/events.md`): the [`NewEvent`] each outcome
//! commit of the sagas writes with the outcome (the outbox), its data the payment or refund exactly as its `GET`
//! answers it once that commit is in — built here from what the commit writes, since a statement phase cannot
//! read its own writes back.

use super::{
    PaymentBody, PaymentInput, PaymentStatus, RefundBody, RefundInput, RefundRecord, StoredResponse,
    payment_workflow_id, refund_workflow_id,
};
use crate::events::{EventType, NewEvent};

/// How a payment ended, as its event tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PaymentEnd {
    /// Charged (`charge_id`) and its order paid; `refunded`: what a compensation's refund gave back of a charge
    /// that was then kept (0 but for a payment rolled forward).
    Succeeded { charge_id: String, refunded: i64 },
    /// The channel declined it, for its reason.
    Declined { decline_code: Option<String> },
    /// Nothing charged, for any other reason.
    Failed,
    /// Its charge given back whole by a compensation (an operator's cancel after the charge was taken).
    Refunded,
}

impl PaymentInput {
    /// The event of this payment's end, at `now`: the payment as `GET /v1/payments/{request_no}` shows it once
    /// `end` is written (for [`PaymentEnd::Refunded`], with `refunded_amount` the charged amount, as the contract
    /// says of `payment.refunded`).
    pub(crate) fn event(&self, end: &PaymentEnd, now: i64) -> NewEvent {
        let (kind, status, charge_id, decline_code, refunded) = match end {
            PaymentEnd::Succeeded { charge_id, refunded } => {
                (EventType::PaymentSucceeded, PaymentStatus::Succeeded, Some(charge_id.as_str()), None, *refunded)
            }
            PaymentEnd::Declined { decline_code } => {
                (EventType::PaymentDeclined, PaymentStatus::Declined, None, decline_code.clone(), 0)
            }
            PaymentEnd::Failed => (EventType::PaymentFailed, PaymentStatus::Failed, None, None, 0),
            PaymentEnd::Refunded => (EventType::PaymentRefunded, PaymentStatus::Failed, None, None, self.amount),
        };
        let view = PaymentBody {
            decline_code,
            refunded_amount: Some(refunded),
            workflow_id: Some(payment_workflow_id(&self.token)),
            ..self.payment_body(status, charge_id)
        };
        traced(NewEvent::payment(&self.tenant, self.request_no.as_str(), kind, view.render(), now))
    }
}

impl RefundInput {
    /// The event of this refund's success, at `now`, from the answer its confirming commit stores (`response`,
    /// the refund's body): the refund as `GET /v1/refunds/{refund_no}` shows it, with its workflow.
    pub(crate) fn succeeded_event(&self, response: &StoredResponse, now: i64) -> NewEvent {
        let data = match serde_json::from_str::<RefundBody>(&response.body) {
            Ok(body) => RefundBody { workflow_id: Some(refund_workflow_id(&self.token)), ..body }.render(),
            Err(_) => response.body.clone(),
        };
        traced(NewEvent::refund(&self.tenant, self.refund_no.as_str(), EventType::RefundSucceeded, data, now))
    }
}

impl RefundRecord {
    /// The event of this refund's end, read back in the commit that ended it, at `now`; `None` while it is
    /// `processing`.
    pub(crate) fn event(&self, now: i64) -> Option<NewEvent> {
        let kind = match self.status {
            super::RefundState::Succeeded => EventType::RefundSucceeded,
            super::RefundState::Failed => EventType::RefundFailed,
            super::RefundState::Processing => return None,
        };
        Some(traced(NewEvent::refund(&self.tenant, self.refund_no.as_str(), kind, self.view().render(), now)))
    }
}

/// `event` with the trace context of the span it is written in (the workflow's run, a child of the trace that
/// started the payment or refund), which its deliveries carry as `traceparent`; none when it is not traced.
fn traced(event: NewEvent) -> NewEvent {
    NewEvent { traceparent: onceflow_engine::trace::current(), ..event }
}
