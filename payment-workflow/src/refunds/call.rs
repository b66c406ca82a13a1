//! Step 4, the channel call: one attempt of the refund (after an attempt that may have refunded, the same
//! request again: refunds have no close, and the channel answers a repeated number with the refund it holds),
//! and what each answer means for this refund.

use onceflow_engine::{Attempt, Previous, StepError};
use serde::{Deserialize, Serialize};

use crate::channel::{Channel, ChannelError, RefundRequest, RefundStatus};

/// What the channel step ended with (a failed refund is an answer, not an error of the step).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum RefundOutcome {
    /// Refunded.
    Refunded { refund_id: String },
    /// Failed by the channel (`status` none), or refused (its `4xx`, kept with the answer here, for operators,
    /// never for the client): nothing was refunded under this number.
    Failed { status: Option<u16>, body: String },
}

/// Counts an attempt by what came of it, for `/metrics`.
fn count_call(outcome: &Result<RefundOutcome, StepError>) {
    let label = match outcome {
        Ok(RefundOutcome::Refunded { .. }) => "succeeded",
        Ok(RefundOutcome::Failed { status: None, .. }) => "failed",
        Ok(RefundOutcome::Failed { .. }) => "refused",
        Err(StepError::UnknownOutcome(m)) if m.contains("processing") => "processing",
        Err(_) => "unknown",
    };
    metrics::counter!("onceflow_channel_refund_calls_total", "outcome" => label).increment(1);
}

/// One attempt of the refund, counted: the same request every time, under the refund's stable number.
pub(super) async fn call_refund(
    channel: &dyn Channel,
    request: &RefundRequest,
    attempt: Attempt,
) -> Result<RefundOutcome, StepError> {
    let outcome = attempt_refund(channel, request, &attempt).await;
    count_call(&outcome);
    outcome
}

async fn attempt_refund(
    channel: &dyn Channel,
    request: &RefundRequest,
    attempt: &Attempt,
) -> Result<RefundOutcome, StepError> {
    let no = &request.merchant_refund_no;
    match channel.refund(request).await {
        // Someone else's answer is never this refund's outcome: asked again, it is logged for operators (the
        // refund stays unresolved, counted in `/metrics`).
        Ok(refund) if !refund.matches(request) => {
            tracing::warn!(merchant_refund_no = %no, ?refund, "the channel answered with another refund");
            Err(StepError::UnknownOutcome("the channel answered with another refund".into()))
        }
        Ok(refund) => match refund.status {
            RefundStatus::Succeeded => Ok(RefundOutcome::Refunded { refund_id: refund.refund_id }),
            // Asked again until it settles (a notification or the statement may settle it sooner).
            RefundStatus::Processing => Err(StepError::UnknownOutcome("the refund is processing".into())),
            RefundStatus::Failed => Ok(RefundOutcome::Failed { status: None, body: "failed".into() }),
        },
        Err(ChannelError::Refused { status, body }) => {
            // The channel answers a number it holds a refund under with that refund: a refusal says it holds
            // none, even after an attempt whose outcome was unknown.
            if attempt.previous == Previous::Unknown {
                tracing::warn!(merchant_refund_no = %no, status, %body, "refused after an unknown outcome");
            } else {
                tracing::warn!(merchant_refund_no = %no, status, %body, "the channel refused the refund");
            }
            Ok(RefundOutcome::Failed { status: Some(status), body })
        }
        Err(e) => Err(StepError::UnknownOutcome(e.to_string())),
    }
}
