//! The payment workflow: its steps and compensations. How a backend runs each phase is its store's business
//! ([`PaymentStore::reserve`], [`PaymentStore::confirm`]); the channel call and what its answers mean are in
//! `charge.rs`.

use std::sync::Arc;
use std::time::Duration;

use crate::channel::Channel;
use crate::model::{OrderStatus, PaymentStatus, Problem, StoredResponse};
use crate::store::{PaymentStore, Reserve, ReserveSteps};
use onceflow_engine::{BoxFuture, Compensation, Failure, Interrupt, RetryPolicy, Workflow, WorkflowContext, step};

use super::charge::{ChargeOutcome, charge, undo_charge};
use crate::model::PaymentInput;

/// The payment workflow type.
pub struct PaymentSaga {
    channel: Arc<dyn Channel>,
    channel_retry: RetryPolicy,
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
        Self { channel, channel_retry }
    }
}

/// The answer to a payment whose workflow failed without one (an engine failure, a compensation's).
pub(crate) fn payment_failed() -> Problem {
    Problem::new(502, "payment_failed", "Payment failed", "the payment could not be completed")
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
        let charge_spec = step("call_channel").retry(self.channel_retry).compensate_with("refund", ());

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
        let outcome = ctx.external(charge_spec, |attempt| charge(channel.as_ref(), &request, attempt)).await?;
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
                    Some(ChargeOutcome::Charged { .. }) => true,
                    // Unknown, or refused while an earlier request may be in flight: close the number first.
                    Some(ChargeOutcome::Refused { after_unknown: true, .. }) | None => false,
                };
                let channel = &self.channel;
                let undo = |_| undo_charge(channel.as_ref(), &i, charged);
                let undone = ctx.external(step("refund").retry(self.channel_retry), undo).await?;
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
                let code = Problem::of_failure(failure).and_then(|answer| answer.decline_code);
                let (tenant, request_no, token) = (i.tenant.clone(), i.request_no.clone(), i.token.clone());
                ctx.transactional("fail_record", move |c| -> BoxFuture<'_, _> {
                    Box::pin(async move {
                        S::fail_payment(c, tenant, request_no, token, status, code, now).await?;
                        Ok(())
                    })
                })
                .await
            }
            "store_response" => {
                if !wrote {
                    return Ok(());
                }
                let response = Problem::of_failure(failure).unwrap_or_else(payment_failed).response();
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

/// The answer to a payment whose order was not reserved (`None`: its `request_no` is another payment's), and
/// whether the payment's record is its own (inserted by it) to mark `failed`.
fn rejection(i: &PaymentInput, reserve: Option<Reserve>) -> (bool, StoredResponse) {
    let answer = |status, code, title, detail: &str| Problem::new(status, code, title, detail).response();
    match reserve {
        None => {
            let detail = format!("request_no {} is already used by another payment", i.request_no);
            (false, answer(409, "request_no_conflict", "Request number in use", &detail))
        }
        Some(Reserve::NotFound) => {
            let detail = format!("order {} does not exist", i.order_no);
            (true, answer(404, "order_not_found", "Order not found", &detail))
        }
        Some(Reserve::Mismatch) => {
            (true, answer(422, "amount_mismatch", "Amount mismatch", "amount or currency differ from the order's"))
        }
        Some(Reserve::NotPayable | Reserve::Reserved) => {
            let detail = format!("order {} is paid or has a payment in flight", i.order_no);
            (true, answer(409, "order_not_payable", "Order not payable", &detail))
        }
    }
}

/// A rejection decided before the channel: stored on the token (and on the record when it is ours), replayed.
async fn reject<S: PaymentStore>(
    ctx: &mut WorkflowContext<S>,
    i: &PaymentInput,
    record_is_ours: bool,
    response: StoredResponse,
) -> Result<StoredResponse, Interrupt> {
    let now = ctx.now_ms();
    let (tenant, request_no, token) = (i.tenant.clone(), i.request_no.clone(), i.token.clone());
    let stored = response.clone();
    ctx.transactional("reject", move |c| -> BoxFuture<'_, _> {
        Box::pin(async move {
            if record_is_ours {
                let (failed, ours) = (PaymentStatus::Failed, token.clone());
                S::fail_payment(&mut *c, tenant, request_no, ours, failed, None, now).await?;
            }
            S::complete_token(&mut *c, token, i32::from(stored.status), stored.body, now).await?;
            Ok(())
        })
    })
    .await?;
    Ok(response)
}
