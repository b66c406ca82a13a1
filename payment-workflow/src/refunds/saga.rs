//! The refund workflow: its steps and compensations. How a backend runs each phase is its store's business
//! ([`RefundStore::reserve_refund`], [`RefundStore::confirm_refund`]); the channel call and what its answers mean
//! are in `call.rs`.
//!
//! | step | kind | what it does | compensation |
//! |---|---|---|---|
//! | `claim_token` | transactional | token `issued → in_use`, bound to fingerprint and route | `store_response`: the token keeps the answer |
//! | `insert_refund` | transactional | the refund, `processing`; `refund_no` unique per tenant | `fail_refund`: this refund `failed` |
//! | `reserve_amount` | transactional | payment `refund_reserved + amount`, only within its amount | `release_amount`: this refund `failed` and its reservation released, once |
//! | `call_refund` | external | the channel's refund under the stable `merchant_refund_no`; an unknown outcome is the same request again | `settle_refund`: the same request until the channel says; a refund it made is confirmed, never undone |
//! | `confirm_refund` | transactional | refund `succeeded`, reservation moved to refunded, order `paid → refunded` once covered, token `completed` | — |

use std::sync::Arc;
use std::time::Duration;

use onceflow_engine::{BoxFuture, Compensation, Failure, Interrupt, RetryPolicy, Workflow, WorkflowContext, step};

use super::answer::{exceeds, not_refundable, number_in_use, refund_failed};
use super::call::{RefundOutcome, call_refund};
use super::end::end_with_event;
use crate::channel::Channel;
use crate::model::{Problem, RefundInput, RefundRecorded, RefundState, StoredResponse};
use crate::notifications::Words;
use crate::store::{PaymentStore, RefundEnd, RefundReserve, RefundSteps};

/// The refund workflow type.
pub struct RefundSaga {
    channel: Arc<dyn Channel>,
    channel_retry: RetryPolicy,
}

impl RefundSaga {
    /// A saga refunding through `channel`.
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

/// Counts a refund by how it ended, for `/metrics` (`onceflow_refunds_total`).
fn count(outcome: &'static str) {
    metrics::counter!("onceflow_refunds_total", "outcome" => outcome).increment(1);
}

/// Why a refund was refused before the channel was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rejection {
    /// Its `refund_no` is another refund's: nothing of it was recorded.
    NumberInUse,
    /// The payment is not `succeeded`.
    NotRefundable,
    /// More than is left to refund.
    Exceeds,
}

impl<S: PaymentStore> Workflow<S> for RefundSaga {
    const NAME: &'static str = "refund";
    type Input = RefundInput;
    type Output = StoredResponse;

    /// A refund is its tenant's: the tenant's workflow list filters on it.
    fn tenant(input: &RefundInput) -> Option<String> {
        Some(input.tenant.clone())
    }

    async fn run(&self, ctx: &mut WorkflowContext<S>, input: RefundInput) -> Result<StoredResponse, Interrupt> {
        let now = ctx.now_ms();
        let i = &input;
        let call_spec = step("call_refund")
            .retry(self.channel_retry)
            .pending_retry(crate::payments::pending_retry())
            .compensate_with("settle_refund", ());

        // 1–3, one atomic phase: claim the token, record the refund, reserve its amount. A token that cannot be
        // claimed (checked by the service before; only an expiry in between gets here) or a payment the tenant
        // does not have refuses the start: nothing is recorded.
        let steps = RefundSteps {
            claim: step("claim_token").compensate_with("store_response", ()),
            insert: step("insert_refund").compensate_with("fail_refund", ()),
            reserve: step("reserve_amount").compensate_with("release_amount", ()),
            call: call_spec.clone(),
        };
        let refused = Problem::new(404, "token_not_found", "Token not found", "the token is unknown or expired");
        let phase = S::reserve_refund(ctx, i, now, steps, refused.into_failure()).await?;
        let Some(recorded) = phase.recorded else {
            return reject::<S>(ctx, i, Rejection::NumberInUse).await;
        };
        match phase.reserve {
            Some(RefundReserve::Reserved) => {}
            Some(RefundReserve::Exceeds) => return reject::<S>(ctx, i, Rejection::Exceeds).await,
            Some(RefundReserve::NotRefundable) | None => return reject::<S>(ctx, i, Rejection::NotRefundable).await,
        }

        // 4, external: intent committed before, outcome after; an unknown outcome is the same request again
        // (same number, same amount), never a new number.
        let request = i.refund_request();
        let channel = &self.channel;
        let store = ctx.store().clone();
        let words = Words { store: &store, tenant: &i.tenant };
        let outcome =
            ctx.external(call_spec, |attempt| call_refund(channel.as_ref(), &words, &request, attempt)).await?;
        let refund_id = match outcome {
            RefundOutcome::Refunded { refund_id } => refund_id,
            RefundOutcome::Failed { .. } => {
                // Compensations release this refund's reservation: the amount is refundable again.
                count("failed");
                return Err(Interrupt::Failed(refund_failed().into_failure()));
            }
        };

        // 5, one commit with the channel's outcome: refunded, the order perhaps refunded, the answer stored.
        let body = i.body(&recorded, RefundState::Succeeded, Some(&refund_id)).render();
        let response = StoredResponse { status: 201, body };
        let not_processing = Failure::new("refund_not_processing", "the refund left processing");
        count("succeeded");
        S::confirm_refund(ctx, i, now, step("confirm_refund"), refund_id, response, not_processing).await
    }

    async fn compensate(
        &self,
        ctx: &mut WorkflowContext<S>,
        compensation: &Compensation,
        failure: &Failure,
    ) -> Result<(), Interrupt> {
        // Registered without input, as the payment's: the workflow's input says everything, and the forward
        // step's output says what it did. Each is guarded by what it wrote (this refund's record under its
        // token, while `processing`), so it undoes nothing of another refund's and nothing twice.
        let i: RefundInput = ctx.input()?;
        let now = ctx.now_ms();
        let forward = compensation.forward.clone().unwrap_or(serde_json::Value::Null);
        match compensation.name.as_str() {
            "settle_refund" => {
                let refund_id = match serde_json::from_value::<RefundOutcome>(forward).ok() {
                    // The channel refunded nothing under this number: the reservation is released below.
                    Some(RefundOutcome::Failed { .. }) => return Ok(()),
                    Some(RefundOutcome::Refunded { refund_id }) => refund_id,
                    // Asked, its answer unknown (an operator's cancel came meanwhile, say): refunds have no close,
                    // so the same request again, until the channel says.
                    None => {
                        let request = i.refund_request();
                        let channel = &self.channel;
                        let settle =
                            step("settle").retry(self.channel_retry).pending_retry(crate::payments::pending_retry());
                        let store = ctx.store().clone();
                        let words = Words { store: &store, tenant: &i.tenant };
                        match ctx.external(settle, |a| call_refund(channel.as_ref(), &words, &request, a)).await? {
                            RefundOutcome::Failed { .. } => return Ok(()),
                            RefundOutcome::Refunded { refund_id } => refund_id,
                        }
                    }
                };
                // The money went back, whatever stopped the workflow: the refund is confirmed (its reservation moved
                // to refunded, the answer stored), never released.
                confirm_after_all::<S>(ctx, i, refund_id, now).await
            }
            "release_amount" => {
                if serde_json::from_value::<RefundReserve>(forward).ok() != Some(RefundReserve::Reserved) {
                    return Ok(());
                }
                ctx.transactional("release_amount", move |c| -> BoxFuture<'_, _> {
                    Box::pin(async move {
                        end_with_event::<S>(c, i, RefundEnd::Released, now).await?;
                        Ok(())
                    })
                })
                .await
            }
            "fail_refund" => {
                if serde_json::from_value::<RefundRecorded>(forward).is_err() {
                    return Ok(());
                }
                ctx.transactional("fail_refund", move |c| -> BoxFuture<'_, _> {
                    Box::pin(async move {
                        end_with_event::<S>(c, i, RefundEnd::Rejected, now).await?;
                        Ok(())
                    })
                })
                .await
            }
            "store_response" => {
                if forward.as_bool() != Some(true) {
                    return Ok(());
                }
                let response = Problem::of_failure(failure).unwrap_or_else(refund_failed).response();
                ctx.transactional("store_response", move |c| -> BoxFuture<'_, _> {
                    Box::pin(async move {
                        // A token completed already (the refund confirmed after all) keeps its answer.
                        S::complete_token(c, i.token, i32::from(response.status), response.body, now).await?;
                        Ok(())
                    })
                })
                .await
            }
            other => Err(Interrupt::Failed(Failure::new("unknown_compensation", other.to_owned()))),
        }
    }
}

/// A refund the channel made although the workflow stopped: confirmed as `confirm_refund` would have, its
/// answer (`201`, the refund as recorded) stored with the token, so that every repeat is told what happened.
async fn confirm_after_all<S: PaymentStore>(
    ctx: &mut WorkflowContext<S>,
    i: RefundInput,
    refund_id: String,
    now: i64,
) -> Result<(), Interrupt> {
    count("succeeded");
    ctx.transactional("confirm_refund", move |c| -> BoxFuture<'_, _> {
        Box::pin(async move {
            let (tenant, refund_no, token) = (i.tenant.clone(), i.refund_no.clone(), i.token.clone());
            if !end_with_event::<S>(&mut *c, i, RefundEnd::Succeeded { refund_id }, now).await? {
                return Ok(());
            }
            if let Some(record) = S::refund_in(&mut *c, tenant, refund_no).await? {
                S::complete_token(&mut *c, token, 201, record.body().render(), now).await?;
            }
            Ok(())
        })
    })
    .await
}

/// A refusal decided before the channel: stored on the token (and on the refund when it is this one's), the
/// workflow's output.
async fn reject<S: PaymentStore>(
    ctx: &mut WorkflowContext<S>,
    i: &RefundInput,
    rejection: Rejection,
) -> Result<StoredResponse, Interrupt> {
    count(match rejection {
        Rejection::NumberInUse => "refund_no_conflict",
        Rejection::NotRefundable => "not_refundable",
        Rejection::Exceeds => "exceeds",
    });
    let now = ctx.now_ms();
    let input = i.clone();
    ctx.transactional("reject", move |c| -> BoxFuture<'_, _> {
        Box::pin(async move {
            let token = input.token.clone();
            let answer = match rejection {
                Rejection::NumberInUse => number_in_use(&input.refund_no),
                Rejection::NotRefundable => not_refundable(&input.request_no),
                // What is left, read now, in this transaction: the refusal's own moment.
                Rejection::Exceeds => {
                    exceeds(S::refundable(&mut *c, input.tenant.clone(), input.request_no.clone()).await?)
                }
            };
            if rejection != Rejection::NumberInUse {
                end_with_event::<S>(&mut *c, input, RefundEnd::Rejected, now).await?;
            }
            let response = answer.response();
            S::complete_token(&mut *c, token, i32::from(response.status), response.body.clone(), now).await?;
            Ok(response)
        })
    })
    .await
}
