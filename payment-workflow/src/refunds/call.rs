//! Step 4, the channel call: one attempt of the refund (after an attempt that may have refunded, the same
//! request again: refunds have no close, and the channel answers a repeated number with the refund it holds),
//! and what each answer means for this refund.

use onceflow_engine::{Attempt, Previous, StepError};
use serde::{Deserialize, Serialize};

use crate::channel::{Channel, ChannelError, Refund, RefundRequest, RefundStatus};
use crate::notifications::{WordOutcome, Words, word_on_refund};
use crate::store::ChannelWordStore;

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
        Err(StepError::Pending(_)) => "processing",
        Err(_) => "unknown",
    };
    metrics::counter!("onceflow_channel_refund_calls_total", "outcome" => label).increment(1);
}

/// One attempt of the refund, counted: the same request every time, under the refund's stable number.
pub(super) async fn call_refund<S: ChannelWordStore>(
    channel: &dyn Channel,
    words: &Words<'_, S>,
    request: &RefundRequest,
    attempt: Attempt,
) -> Result<RefundOutcome, StepError> {
    let outcome = attempt_refund(channel, words, request, &attempt).await;
    count_call(&outcome);
    outcome
}

/// What this refund's own answer (checked to match) says.
fn settle(refund: Refund) -> Result<RefundOutcome, StepError> {
    match refund.status {
        RefundStatus::Succeeded => Ok(RefundOutcome::Refunded { refund_id: refund.refund_id }),
        // Asked again until it settles (a notification or the statement may settle it sooner).
        RefundStatus::Processing => Err(StepError::Pending("the refund is processing".into())),
        RefundStatus::Failed => Ok(RefundOutcome::Failed { status: None, body: "failed".into() }),
    }
}

/// One attempt. After an attempt that may have refunded, the channel's word recorded on the refund's number (a
/// notification, a statement's line) is consulted first: one that matches this refund settles it as the
/// channel's answer would, and is marked applied.
async fn attempt_refund<S: ChannelWordStore>(
    channel: &dyn Channel,
    words: &Words<'_, S>,
    request: &RefundRequest,
    attempt: &Attempt,
) -> Result<RefundOutcome, StepError> {
    let no = &request.merchant_refund_no;
    if attempt.previous != Previous::None
        && let Some(word) = word_on_refund(words.store, words.tenant, request).await
        && word.answer.status != RefundStatus::Processing
    {
        word.mark(words.store, WordOutcome::Settled).await;
        tracing::info!(merchant_refund_no = %no, status = ?word.answer.status, "the refund is settled by the channel's word");
        return settle(word.answer);
    }
    match channel.refund(request).await {
        // Someone else's answer is never this refund's outcome: asked again, it is logged for operators (the
        // refund stays unresolved, counted in `/metrics`).
        Ok(refund) if !refund.matches(request) => {
            tracing::warn!(merchant_refund_no = %no, ?refund, "the channel answered with another refund");
            Err(StepError::UnknownOutcome("the channel answered with another refund".into()))
        }
        Ok(refund) => settle(refund),
        Err(ChannelError::Refused { status, body }) => {
            // A refusal speaks for this request, not for the number: a channel may check the charge's balance
            // before the number (`409 exceeds_charge` to the repeat of a refund it made, whose answer was lost),
            // or hold another refund under it (`409`). What it holds under the number is asked; only when it
            // holds nothing was nothing refunded.
            tracing::warn!(merchant_refund_no = %no, status, %body, previous = ?attempt.previous, "the channel refused the refund");
            match channel.query_refund(&request.merchant_id, no).await {
                Ok(None) => Ok(RefundOutcome::Failed { status: Some(status), body }),
                Ok(Some(held)) if held.matches(request) => settle(held),
                // Another refund under this refund's number (the contract's `409`: the same number, another
                // charge or amount): not this request's doing — the number is this refund's alone, bound to its
                // fields — so this request was not carried out. Ended, for an operator to look at.
                Ok(Some(held)) => {
                    tracing::warn!(merchant_refund_no = %no, ?held, "the channel holds another refund under this number");
                    Ok(RefundOutcome::Failed { status: Some(status), body })
                }
                // Not asked: as before queries, the refusal of a first request is final; after an attempt whose
                // outcome is unknown, it says nothing of that attempt's request.
                Err(ChannelError::Refused { .. }) if attempt.previous == Previous::None => {
                    Ok(RefundOutcome::Failed { status: Some(status), body })
                }
                Err(e) => Err(StepError::UnknownOutcome(format!("refused ({status}); asked what it holds: {e}"))),
            }
        }
        Err(e) => Err(StepError::UnknownOutcome(e.to_string())),
    }
}
