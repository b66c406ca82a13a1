//! Step 4, the channel call, and its compensation: one attempt of the charge (after an attempt that may have
//! charged, a query by the same number first), what each answer means for this payment, and how a charge's
//! number is undone (closed first, then refunded under a stable refund number).

use std::time::Duration;

use onceflow_engine::{Attempt, Interrupt, Previous, RetryPolicy, StepError};
use serde::{Deserialize, Serialize};

use crate::channel::{
    Channel, ChannelError, Charge, ChargeRequest, ChargeStatus, Closed, Refund, RefundRequest, RefundStatus,
};
use crate::model::PaymentInput;
use crate::model::Problem;
use crate::notifications::{WordOutcome, Words, word_on_charge, word_on_refund};
use crate::store::ChannelWordStore;

/// What the channel step ended with (a decline is an answer, not an error of the step).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum ChargeOutcome {
    Charged {
        charge_id: String,
    },
    Declined {
        decline_code: Option<String>,
    },
    /// A refusal (`4xx`) of this attempt's request: it charged nothing. The channel's answer is kept here, for
    /// operators. `after_unknown`: an earlier attempt's request may still be in flight (a refusal speaks only
    /// for its own request), so the number must still be closed before anything is undone.
    Refused {
        status: u16,
        body: String,
        #[serde(default)]
        after_unknown: bool,
    },
    /// The channel holds a charge under this number that is not this payment's (another merchant's, or other
    /// fields): someone else's, never success for this payment, never refunded by it.
    NotOurs,
}

impl ChargeOutcome {
    /// The charge id of a payment the channel charged; otherwise the workflow's failure, carrying the client's
    /// answer (a decline, a refusal, a number that is another payment's).
    pub(super) fn charge_id(self, i: &PaymentInput) -> Result<String, Interrupt> {
        let answer = match self {
            Self::Charged { charge_id } => return Ok(charge_id),
            Self::Declined { decline_code } => Problem::declined(decline_code),
            Self::Refused { status, body, .. } => {
                // The channel's answer stays in the step's output and the log, never in the client's problem.
                tracing::warn!(request_no = %i.request_no, status, %body, "the channel refused the charge");
                Problem::channel_refused()
            }
            Self::NotOurs => {
                tracing::warn!(request_no = %i.request_no, "the channel holds another payment's charge under this number");
                Problem::request_no_conflict(&i.request_no)
            }
        };
        Err(Interrupt::Failed(answer.into_failure()))
    }
}

/// What a charge the channel answered with means for the payment that asked for `request`.
fn settle(charge: Charge, request: &ChargeRequest) -> Result<ChargeOutcome, StepError> {
    if !charge.matches(request) {
        return Ok(ChargeOutcome::NotOurs);
    }
    match charge.status {
        ChargeStatus::Succeeded => Ok(ChargeOutcome::Charged { charge_id: charge.charge_id }),
        ChargeStatus::Declined => Ok(ChargeOutcome::Declined { decline_code: charge.decline_code }),
        ChargeStatus::Processing => Err(StepError::Pending(format!(
            "the charge {} is processing at the channel; waiting for it to settle",
            request.merchant_request_no
        ))),
    }
}

/// How often a charge (or refund) the channel holds `processing` is asked about again: soon at first, then less
/// and less often, up to about an hour (40 minutes, plus up to as much again of jitter). The channel's word
/// settles it sooner: its notification wakes the workflow at once, and a day's statement settles what is
/// left.
pub(crate) fn pending_retry() -> RetryPolicy {
    RetryPolicy {
        initial_interval: Duration::from_millis(50),
        multiplier: 2.0,
        max_interval: Duration::from_secs(40 * 60),
        max_attempts: u32::MAX,
        jitter: true,
    }
}

/// Counts a channel call by what came of it, for `/metrics`.
fn count_call(outcome: &Result<ChargeOutcome, StepError>) {
    let label = match outcome {
        Ok(ChargeOutcome::Charged { .. }) => "succeeded",
        Ok(ChargeOutcome::Declined { .. }) => "declined",
        Ok(ChargeOutcome::Refused { .. }) => "refused",
        Ok(ChargeOutcome::NotOurs) => "not_ours",
        Err(StepError::Pending(_)) => "processing",
        Err(_) => "unknown",
    };
    metrics::counter!("onceflow_channel_calls_total", "outcome" => label).increment(1);
}

/// One attempt of the channel call, counted.
pub(super) async fn charge<S: ChannelWordStore>(
    channel: &dyn Channel,
    words: &Words<'_, S>,
    request: &ChargeRequest,
    attempt: Attempt,
) -> Result<ChargeOutcome, StepError> {
    let outcome = charge_attempt(channel, words, request, attempt).await;
    count_call(&outcome);
    outcome
}

/// One attempt of the channel call. After an attempt that may have charged, the channel's word recorded on the
/// number (a notification, a statement's line) is consulted first: one that matches this payment settles it as
/// the channel's answer would, and is marked applied. Otherwise the charge is looked up by the same number; the
/// channel also deduplicates a repeated charge request. Every charge the channel answers with, or its word
/// reports, is checked against this payment: one that does not match is someone else's.
async fn charge_attempt<S: ChannelWordStore>(
    channel: &dyn Channel,
    words: &Words<'_, S>,
    request: &ChargeRequest,
    attempt: Attempt,
) -> Result<ChargeOutcome, StepError> {
    if attempt.previous != Previous::None {
        // A first attempt's number is new to the channel: nothing can have been said of it yet.
        if let Some(word) = word_on_charge(words.store, words.tenant, request).await {
            let outcome = settle(word.answer.clone(), request);
            if outcome.is_ok() {
                word.mark(words.store, WordOutcome::Settled).await;
                tracing::info!(request_no = %request.merchant_request_no, status = ?word.answer.status,
                    "the charge is settled by the channel's word");
                return outcome;
            }
        }
        match channel.query(&request.merchant_id, &request.merchant_request_no).await {
            Ok(Some(found)) => return settle(found, request),
            Ok(None) => {}
            Err(e) => return Err(StepError::UnknownOutcome(e.to_string())),
        }
    }
    match channel.charge(request).await {
        Ok(charge) => settle(charge, request),
        Err(ChannelError::Refused { status, body }) => {
            Ok(ChargeOutcome::Refused { status, body, after_unknown: attempt.previous != Previous::None })
        }
        Err(e) => Err(StepError::UnknownOutcome(e.to_string())),
    }
}

/// How a charge's number was undone at the channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Undone {
    /// Closed before any charge was accepted: none ever will be.
    Closed,
    /// This payment's charge was refunded.
    Refunded,
    /// The charge under the number settled without taking money (declined).
    NothingTaken,
    /// The charge under the number is not this payment's: left alone.
    NotOurs,
    /// This payment's charge `charge_id` was taken and the channel definitively did not give it (all) back: its
    /// refund `failed`, or was refused (`4xx`, nothing refunded under its number), or succeeded for only part of
    /// the amount (`refunded`). The money stays taken, so the payment rolls forward (kept, paid, what came back
    /// recorded as refunded) rather than hold it with the order unpaid; `why` is for operators.
    Kept {
        /// The charge kept.
        charge_id: String,
        /// What the channel answered to the refund.
        why: String,
        /// What the refund did give back (minor units, less than the charge): part of the charge.
        #[serde(default)]
        refunded: i64,
    },
}

/// Undoes whatever this payment's number did at the channel: closes the number first (so that a charge still
/// in flight can no longer land), then refunds this payment's charge if one exists, under a stable refund
/// number, once a `processing` one has settled. `charged`: the charge step already saw this payment's charge
/// `charge_id` succeed, so there is nothing to close and it is refunded at once.
///
/// A refund is believed only when its answer is the refund asked for (merchant, number, charge, amount): any
/// other answer — another number, another charge — is no success, and the same request is sent again (an
/// unknown outcome: the channel is idempotent on the number). A refund the channel failed, or refused while it
/// holds none under the number, is final: the charge is [`Undone::Kept`]. So is one the channel made under this
/// refund's own number, of this charge, for part of the amount: the part is recorded as refunded, never asked
/// again (the number is taken) and never taken for the whole.
pub(super) async fn undo_charge<S: ChannelWordStore>(
    channel: &dyn Channel,
    words: &Words<'_, S>,
    i: &PaymentInput,
    charged: Option<String>,
) -> Result<Undone, StepError> {
    let request = i.charge_request();
    let unknown = |e: ChannelError| StepError::UnknownOutcome(e.to_string());
    let charge_id = match charged {
        Some(charge_id) => charge_id,
        None => {
            let charge = match channel.close(&request.merchant_id, &request.merchant_request_no).await {
                Ok(Closed::Closed) => return Ok(Undone::Closed),
                Ok(Closed::Charged(charge)) => charge,
                // Not an answer to wait out: an operator must look (the workflow ends compensation_failed).
                Err(ChannelError::Refused { status, body }) => {
                    tracing::warn!(request_no = %i.request_no, status, %body, "the channel refused to close the number");
                    return Err(StepError::terminal(
                        "close_refused",
                        "the channel refused to close the charge's number",
                    ));
                }
                Err(e) => return Err(unknown(e)),
            };
            if !charge.matches(&request) {
                tracing::warn!(request_no = %i.request_no, "the charge under this number is another payment's: not refunded");
                return Ok(Undone::NotOurs);
            }
            let charge = match charge.status {
                // The channel's word may have settled it already: it informs the compensation (a charge it says
                // succeeded is refunded below), never the payment, which is being cancelled.
                ChargeStatus::Processing => match word_on_charge(words.store, words.tenant, &request).await {
                    Some(word) => {
                        word.mark(words.store, WordOutcome::Informed).await;
                        tracing::info!(request_no = %i.request_no, status = ?word.answer.status,
                            "the channel's word settles the charge of a payment being cancelled");
                        word.answer
                    }
                    None => return Err(StepError::Pending(processing_charge(i))),
                },
                _ => charge,
            };
            match charge.status {
                ChargeStatus::Declined => return Ok(Undone::NothingTaken),
                ChargeStatus::Processing => return Err(StepError::Pending(processing_charge(i))),
                ChargeStatus::Succeeded => charge.charge_id,
            }
        }
    };
    let refund = RefundRequest {
        merchant_id: request.merchant_id.clone(),
        merchant_refund_no: i.refund_no(),
        merchant_request_no: request.merchant_request_no.clone(),
        amount: i.amount,
        notify_url: None,
    };
    let kept = |why: String| Ok(Undone::Kept { charge_id: charge_id.clone(), why, refunded: 0 });
    let held = match channel.refund(&refund).await {
        Ok(r) => r,
        Err(ChannelError::Refused { status, body }) => {
            // A refusal speaks for this request, not for the number (a channel may check the charge's balance
            // first, or hold another amount under it): what it holds under the number decides.
            tracing::warn!(request_no = %i.request_no, status, %body, "the channel refused the refund");
            match channel.query_refund(&refund.merchant_id, &refund.merchant_refund_no).await {
                Ok(Some(r)) => r,
                Ok(None) => {
                    return kept(format!("the channel refused refund {} ({status})", refund.merchant_refund_no));
                }
                // Not answered (refused too, or unknown): what the number holds is not known, so neither is
                // whether the money came back. Asked again, never taken for "nothing refunded".
                Err(e) => return Err(unknown(e)),
            }
        }
        Err(e) => return Err(unknown(e)),
    };
    if !is_own(&held, &refund) {
        tracing::warn!(request_no = %i.request_no, refund_no = %refund.merchant_refund_no, answered = ?held,
            "the channel answered for another refund than the one asked: not believed, asked again");
        return Err(StepError::UnknownOutcome(format!(
            "the channel's answer to refund {} is not that refund (number, charge or merchant differ); asking again",
            refund.merchant_refund_no
        )));
    }
    let held = match held.status {
        RefundStatus::Processing => match word_on_refund(words.store, words.tenant, &refund).await {
            Some(word) => {
                word.mark(words.store, WordOutcome::Settled).await;
                word.answer
            }
            None => held,
        },
        _ => held,
    };
    match held.status {
        RefundStatus::Succeeded if held.amount == refund.amount => Ok(Undone::Refunded),
        // Made under this refund's own number for part of the charge: the part is recorded as refunded, the rest
        // kept; never taken for the whole, never asked again (the number is taken).
        RefundStatus::Succeeded => {
            let part = held.amount;
            tracing::warn!(request_no = %i.request_no, refund_no = %refund.merchant_refund_no, part,
                asked = refund.amount, "the channel refunded part of the charge under this refund's number: the rest is kept");
            let why =
                format!("the channel refunded {part} of {} under refund {}", refund.amount, refund.merchant_refund_no);
            Ok(Undone::Kept { charge_id: charge_id.clone(), why, refunded: part })
        }
        RefundStatus::Processing => Err(StepError::Pending(format!(
            "refund {} of charge {} is processing at the channel",
            refund.merchant_refund_no, request.merchant_request_no
        ))),
        RefundStatus::Failed => {
            kept(format!("the channel failed refund {} ({})", refund.merchant_refund_no, held.refund_id))
        }
    }
}

/// Whether `held` is `asked`'s own refund, whatever its status: the same merchant (when echoed), number and charge,
/// for at most the amount asked (a channel may make it for less: see [`undo_charge`]).
fn is_own(held: &Refund, asked: &RefundRequest) -> bool {
    held.merchant_id.as_deref().is_none_or(|m| m == asked.merchant_id)
        && held.merchant_refund_no == asked.merchant_refund_no
        && held.merchant_request_no == asked.merchant_request_no
        && held.amount > 0
        && held.amount <= asked.amount
}

/// What a compensation waiting for this payment's `processing` charge waits for.
fn processing_charge(i: &PaymentInput) -> String {
    format!("the charge {} is processing at the channel; waiting for it to settle before it is refunded", i.request_no)
}
