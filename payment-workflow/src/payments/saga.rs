//! The payment workflow: its steps and compensations. How a backend runs each phase is its store's business
//! ([`PaymentStore::reserve`], [`PaymentStore::confirm`]); the channel call and what its answers mean are in
//! `charge.rs`.

use std::sync::Arc;
use std::time::Duration;

use crate::channel::Channel;
use crate::model::{OrderStatus, PaymentEnd, PaymentStatus, Problem, StoredResponse};
use crate::store::{PaymentStore, Reserve, ReserveSteps};
use onceflow_engine::{
    BoxFuture, Compensation, Failure, Interrupt, RetryPolicy, StepError, Workflow, WorkflowContext, step,
};

use super::charge::{ChargeOutcome, Undone, charge, undo_charge};
use crate::model::PaymentInput;
use crate::notifications::Words;

/// The payment workflow type.
pub struct PaymentSaga {
    channel: Arc<dyn Channel>,
    channel_retry: RetryPolicy,
    pending_retry: RetryPolicy,
}

impl PaymentSaga {
    /// A saga charging through `channel`.
    pub fn new(channel: Arc<dyn Channel>) -> Self {
        let channel_retry = RetryPolicy {
            initial_interval: Duration::from_millis(50),
            multiplier: 2.0,
            max_interval: Duration::from_secs(5),
            max_attempts: 20,
            jitter: true,
        };
        Self { channel, channel_retry, pending_retry: super::pending_retry() }
    }
}

impl<S: PaymentStore> Workflow<S> for PaymentSaga {
    const NAME: &'static str = "payment";
    type Input = PaymentInput;
    type Output = StoredResponse;

    /// A payment is its tenant's: the tenant's workflow list filters on it.
    fn tenant(input: &PaymentInput) -> Option<String> {
        Some(input.tenant.clone())
    }

    async fn run(&self, ctx: &mut WorkflowContext<S>, input: PaymentInput) -> Result<StoredResponse, Interrupt> {
        let span = tracing::info_span!("payment", request_no = %input.request_no, tenant = %input.tenant);
        tracing::Instrument::instrument(self.pay(ctx, input), span).await
    }

    async fn compensate(
        &self,
        ctx: &mut WorkflowContext<S>,
        compensation: &Compensation,
        failure: &Failure,
    ) -> Result<(), Interrupt> {
        self.undo(ctx, compensation, failure).await
    }
}

impl PaymentSaga {
    /// The payment's steps (see the table in DESIGN.md), in the span of its `request_no`.
    async fn pay<S: PaymentStore>(
        &self,
        ctx: &mut WorkflowContext<S>,
        input: PaymentInput,
    ) -> Result<StoredResponse, Interrupt> {
        let now = ctx.now_ms();
        let i = &input;
        let charge_spec = step("call_channel")
            .retry(self.channel_retry)
            .pending_retry(self.pending_retry)
            .compensate_with("refund", ());

        // 1–3, one atomic phase: claim the token, insert the record, reserve the order. A token that cannot be
        // claimed (checked by the service before; only an expiry in between gets here) or an unknown order
        // refuses the start: nothing is recorded.
        let steps = ReserveSteps {
            claim: step("claim_token").compensate_with("store_response", ()),
            insert: step("insert_record").compensate_with("fail_record", ()),
            reserve: step("reserve_status").compensate_with("release_order", ()),
            charge: charge_spec.clone(),
        };
        let refused = Problem::new(404, "token_not_found", "Token not found", "the token is unknown or expired");
        let refused = refused.into_failure();
        match S::reserve(ctx, i, now, steps, refused).await? {
            Some(Reserve::Reserved) => {}
            not_reserved => {
                let (record_is_ours, rejection) = rejection(i, not_reserved);
                return reject::<S>(ctx, i, record_is_ours, rejection).await;
            }
        }

        // 4, external: intent committed before, outcome after; an unknown outcome is resolved by the same
        // request_no, never by a new one.
        let request = i.charge_request();
        let channel = &self.channel;
        let store = ctx.store().clone();
        let words = Words { store: &store, tenant: &i.tenant };
        let outcome = ctx.external(charge_spec, |attempt| charge(channel.as_ref(), &words, &request, attempt)).await?;
        let charge_id = outcome.charge_id(i)?;

        // 5, one commit with the channel's outcome: paid, succeeded, the token's response stored.
        let body = i.payment_body(PaymentStatus::Succeeded, Some(&charge_id)).render();
        let response = StoredResponse { status: 201, body };
        let not_paying = Failure::new("order_not_paying", "the order left paying");
        S::confirm(ctx, i, now, step("confirm"), charge_id, response, not_paying).await
    }

    /// Runs one compensation of the payment.
    async fn undo<S: PaymentStore>(
        &self,
        ctx: &mut WorkflowContext<S>,
        compensation: &Compensation,
        failure: &Failure,
    ) -> Result<(), Interrupt> {
        // Compensations are registered without input: the workflow's own input says everything, and the forward
        // step's output says what it did. Each undoes exactly that, guarded by what it wrote (this payment's
        // token, record and reservation), so it is a no-op on anything another payment owns.
        let i: PaymentInput = ctx.input()?;
        let now = ctx.now_ms();
        let wrote = compensation.forward.as_ref().and_then(serde_json::Value::as_bool) == Some(true);
        match compensation.name.as_str() {
            "refund" => {
                let done: Option<ChargeOutcome> =
                    compensation.forward.clone().and_then(|f| serde_json::from_value(f).ok());
                let charged = match done {
                    // A definite answer that charged nothing of this payment's: nothing to undo.
                    Some(
                        ChargeOutcome::Declined { .. }
                        | ChargeOutcome::NotOurs
                        | ChargeOutcome::Refused { after_unknown: false, .. },
                    ) => return Ok(()),
                    Some(ChargeOutcome::Charged { charge_id }) => Some(charge_id),
                    // Unknown, or refused while an earlier request may be in flight: close the number first.
                    Some(ChargeOutcome::Refused { after_unknown: true, .. }) | None => None,
                };
                let channel = &self.channel;
                let store = ctx.store().clone();
                let words = Words { store: &store, tenant: &i.tenant };
                let undo = |_| undo_charge(channel.as_ref(), &words, &i, charged.clone());
                let spec = step("refund").retry(self.channel_retry).pending_retry(self.pending_retry);
                let undone = ctx.external(spec, undo).await?;
                if let Undone::Kept { charge_id, why, refunded } = undone {
                    return keep_charge(ctx, &i, now, Kept { charge_id, why, refunded }).await;
                }
                tracing::info!(request_no = %i.request_no, ?undone, "charge undone");
                Ok(())
            }
            "release_order" => {
                let reserved: Option<Reserve> =
                    compensation.forward.clone().and_then(|f| serde_json::from_value(f).ok());
                if reserved != Some(Reserve::Reserved) {
                    return Ok(());
                }
                let (tenant, order_no, request_no) = (i.tenant.clone(), i.order_no.clone(), i.request_no.clone());
                ctx.transactional("release_order", move |c| -> BoxFuture<'_, _> {
                    Box::pin(async move {
                        S::move_order(c, tenant, order_no, request_no, OrderStatus::Pending, now).await?;
                        Ok(())
                    })
                })
                .await
            }
            "fail_record" => {
                if !wrote {
                    return Ok(());
                }
                let declined = failure.code == "payment_declined";
                let status = if declined { PaymentStatus::Declined } else { PaymentStatus::Failed };
                // A decline keeps the channel's reason; a failure, the code of its answer (what store_response
                // stores), from which the answer is rebuilt once the token is gone.
                let answer = Problem::of_failure(failure).unwrap_or_else(Problem::payment_failed);
                let code = if declined { answer.decline_code } else { Some(answer.code) };
                // The payment's end, as its event says it: a charge the refund compensation (which ran before
                // this one) gave back whole is `payment.refunded`.
                let end = if declined {
                    PaymentEnd::Declined { decline_code: code.clone() }
                } else if ctx.compensation_output::<Undone>("call_channel", "refund") == Some(Undone::Refunded) {
                    PaymentEnd::Refunded
                } else {
                    PaymentEnd::Failed
                };
                let event = i.event(&end, now);
                let (tenant, request_no, token) = (i.tenant.clone(), i.request_no.clone(), i.token.clone());
                ctx.transactional("fail_record", move |c| -> BoxFuture<'_, _> {
                    Box::pin(async move {
                        if S::fail_payment(&mut *c, tenant, request_no, token, status, code, now).await? {
                            S::write_event(&mut *c, &event).await?;
                        }
                        Ok(())
                    })
                })
                .await
            }
            "store_response" => {
                if !wrote {
                    return Ok(());
                }
                let response = Problem::of_failure(failure).unwrap_or_else(Problem::payment_failed).response();
                let token = i.token.clone();
                ctx.transactional("store_response", move |c| -> BoxFuture<'_, _> {
                    Box::pin(async move {
                        S::complete_token(c, token, i32::from(response.status), response.body, now).await?;
                        Ok(())
                    })
                })
                .await
            }
            other => Err(Interrupt::Failed(Failure::new("unknown_compensation", other.to_owned()))),
        }
    }
}

/// A charge kept ([`Undone::Kept`]): which, why, and what its refund did give back of it.
struct Kept {
    charge_id: String,
    why: String,
    refunded: i64,
}

/// The way out of a charge the channel would not give back ([`Undone::Kept`]): the payment rolls forward. In one
/// step — committed with the workflow's end — the order goes `paying → paid` (only under this payment's
/// reservation), the record `succeeded` with the charge, the token `completed` with the charge's `201`; the
/// workflow ends `completed` with that answer, its exception `kept_after_failed_refund` kept for operators (and
/// logged, and counted). What the refund did give back of the charge, if anything, is recorded as refunded with
/// it (the merchant may refund the rest). The compensations after the refund never run. Should the order no
/// longer be this payment's (nothing moves it but this payment's own steps), nothing is written and the workflow
/// ends `compensation_failed` for an operator.
async fn keep_charge<S: PaymentStore>(
    ctx: &mut WorkflowContext<S>,
    i: &PaymentInput,
    now: i64,
    Kept { charge_id, why, refunded }: Kept,
) -> Result<(), Interrupt> {
    let body = i.payment_body(PaymentStatus::Succeeded, Some(&charge_id)).render();
    let response = StoredResponse { status: 201, body: body.clone() };
    let (tenant, order_no, request_no, token) =
        (i.tenant.clone(), i.order_no.clone(), i.request_no.clone(), i.token.clone());
    let charge = charge_id.clone();
    // The outbox: the payment ends `succeeded` after all, and says so (its one event).
    let event = i.event(&PaymentEnd::Succeeded { charge_id: charge_id.clone(), refunded }, now);
    ctx.transactional("keep_charge", move |c| -> BoxFuture<'_, _> {
        Box::pin(async move {
            if !S::move_order(&mut *c, tenant.clone(), order_no, request_no.clone(), OrderStatus::Paid, now).await? {
                return Err(StepError::terminal(
                    "order_not_paying",
                    "the order is no longer paying under this payment: its charge cannot be kept",
                ));
            }
            let ended = S::succeed_payment(&mut *c, tenant.clone(), request_no.clone(), token.clone(), charge, now);
            let ended = ended.await?;
            if ended && refunded > 0 {
                S::add_refunded(&mut *c, tenant, request_no, refunded, now).await?;
            }
            S::complete_token(&mut *c, token, 201, body, now).await?;
            if ended {
                S::write_event(&mut *c, &event).await?;
            }
            Ok(())
        })
    })
    .await?;
    metrics::counter!("onceflow_payments_kept_after_failed_refund_total").increment(1);
    tracing::warn!(tenant = %i.tenant, request_no = %i.request_no, %charge_id, %why,
        "the refund of a cancelled payment failed: the charge is kept and the payment completed (an operator may refund it)");
    let exception = Failure::new(
        "kept_after_failed_refund",
        "the channel did not refund the charge: it is kept, the order paid and the payment succeeded; refund it \
         as a merchant refund if the money must go back",
    )
    .with_details(serde_json::json!({ "charge_id": charge_id, "refund": why, "refunded": refunded }));
    let output = serde_json::to_value(&response).map_err(|e| Interrupt::Engine(e.into()))?;
    Err(Interrupt::RolledForward { output, exception })
}

/// The answer to a payment whose order was not reserved (`None`: its `request_no` is another payment's), and
/// whether the payment's record is its own (inserted by it) to mark `failed`.
fn rejection(i: &PaymentInput, reserve: Option<Reserve>) -> (bool, Problem) {
    match reserve {
        None => (false, Problem::request_no_conflict(&i.request_no)),
        Some(Reserve::NotFound) => (true, Problem::order_not_found(&i.order_no)),
        Some(Reserve::Mismatch) => (true, Problem::amount_mismatch()),
        Some(Reserve::NotPayable | Reserve::Reserved) => (true, Problem::order_not_payable(&i.order_no)),
    }
}

/// A rejection decided before the channel: stored on the token (and on the record when it is ours, with the
/// answer's code, which rebuilds the answer once the token is gone), replayed.
async fn reject<S: PaymentStore>(
    ctx: &mut WorkflowContext<S>,
    i: &PaymentInput,
    record_is_ours: bool,
    answer: Problem,
) -> Result<StoredResponse, Interrupt> {
    let now = ctx.now_ms();
    let (tenant, request_no, token) = (i.tenant.clone(), i.request_no.clone(), i.token.clone());
    let response = answer.response();
    let stored = response.clone();
    let code = answer.code;
    ctx.transactional("reject", move |c| -> BoxFuture<'_, _> {
        Box::pin(async move {
            if record_is_ours {
                let (failed, ours) = (PaymentStatus::Failed, token.clone());
                S::fail_payment(&mut *c, tenant, request_no, ours, failed, Some(code), now).await?;
            }
            S::complete_token(&mut *c, token, i32::from(stored.status), stored.body, now).await?;
            Ok(())
        })
    })
    .await?;
    Ok(response)
}
